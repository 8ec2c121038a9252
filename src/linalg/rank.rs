//! [`matrix_rank`] (counts host singular values) and [`cond`] (composed of [`super::svdvals`],
//! [`super::matrix_norm`] and [`super::inv`], so it is differentiated as they are).

use super::decomp::{check, inv, svdvals_named};
use super::lstsq::{default_rtol, symmetrize_lower};
use super::lu::lu_factor_ex;
use super::norm::{NormOrd, matrix_norm};
use crate::autograd::no_grad;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// PyTorch's `torch.linalg.matrix_rank(A, atol=None, rtol=None, hermitian=False)`: the
/// number of singular values of each matrix (`[..., m, n]` → `[...]`, int64) above
/// `max(atol, rtol·σ_max)`, with [`super::pinv`]'s defaults (`rtol = max(m, n)·eps` of the
/// dtype unless a positive `atol` is given). With `hermitian`, `A` must be square and only
/// its lower triangle is read. No gradient (an integer).
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 2.0, 4.0, 0.0, 1.0], [3, 2]);
/// assert_eq!(kiln::linalg::matrix_rank(&a, None, None, false)?.to_vec::<i64>()?, vec![2]);
/// let b = Tensor::from_vec(vec![1.0f64, 2.0, 2.0, 4.0], [2, 2]);
/// assert_eq!(kiln::linalg::matrix_rank(&b, None, None, false)?.to_vec::<i64>()?, vec![1]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn matrix_rank(
    a: &Tensor,
    atol: Option<f64>,
    rtol: Option<f64>,
    hermitian: bool,
) -> Result<Tensor> {
    const OP: &str = "linalg.matrix_rank";
    let (m, n) = check(OP, a, hermitian)?;
    if atol.is_some_and(f64::is_nan) || rtol.is_some_and(f64::is_nan) {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: a.shape().to_vec(),
            reason: "atol and rtol must not be NaN".into(),
        });
    }
    let rtol = default_rtol(a.dtype(), m, n, atol, rtol);
    let atol = atol.unwrap_or(0.0);
    let batch = &a.shape()[..a.ndim() - 2];
    let k = m.min(n);
    let count: usize = batch.iter().product();
    let ranks: Vec<i64> = if k == 0 || count == 0 {
        vec![0; count]
    } else {
        let a = no_grad(|| {
            let d = a.detach();
            if hermitian {
                symmetrize_lower(&d)
            } else {
                Ok(d)
            }
        })?;
        let s = no_grad(|| svdvals_named(OP, &a))?.to_vec::<f64>()?;
        s.chunks(k)
            .map(|s| {
                let tol = atol.max(rtol * s[0]);
                s.iter().filter(|&&v| v > tol).count() as i64
            })
            .collect()
    };
    Tensor::try_from_vec(ranks, batch)?.try_to(a.device())
}

/// PyTorch's `torch.linalg.cond(A, p=None)`: the condition number of each matrix
/// (`[..., m, n]` → `[...]`). `None` or `P(2.0)`: `σ_max/σ_min` from [`super::svdvals`]
/// (any shape; infinite when `σ_min = 0`); `P(-2.0)`: `σ_min/σ_max`; `Fro`, `Nuc`,
/// `P(±1.0)`, `P(±inf)`: `‖A‖_p·‖A⁻¹‖_p` for square matrices, infinite for a singular one
/// (which is detected by an LU on the host, as PyTorch does, rather than refused). Empty
/// matrices give 0. Differentiable through its parts.
///
/// ```
/// use kiln::{Tensor, linalg::NormOrd};
/// let a = Tensor::from_vec(vec![4.0f64, 0.0, 0.0, 0.5], [2, 2]);
/// assert_eq!(kiln::linalg::cond(&a, None)?.item::<f64>()?, 8.0);
/// assert_eq!(kiln::linalg::cond(&a, Some(NormOrd::P(1.0)))?.item::<f64>()?, 8.0);
/// let singular = Tensor::from_vec(vec![1.0f64, 2.0, 2.0, 4.0], [2, 2]);
/// assert!(kiln::linalg::cond(&singular, Some(NormOrd::Fro))?.item::<f64>()?.is_infinite());
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn cond(a: &Tensor, p: Option<NormOrd>) -> Result<Tensor> {
    const OP: &str = "linalg.cond";
    let p = p.unwrap_or(NormOrd::P(2.0));
    let spectral = matches!(p, NormOrd::P(v) if v.abs() == 2.0);
    let other = matches!(p, NormOrd::Fro | NormOrd::Nuc)
        || matches!(p, NormOrd::P(v) if v.abs() == 1.0 || v.is_infinite());
    if !spectral && !other {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: a.shape().to_vec(),
            reason: format!(
                "order {p:?} is not supported (None, 2, -2, 1, -1, inf, -inf, Fro, Nuc are)"
            ),
        });
    }
    let (m, n) = check(OP, a, other)?;
    let batch = a.shape()[..a.ndim() - 2].to_vec();
    if m.min(n) == 0 {
        return Tensor::try_full_on(batch.as_slice(), 0.0, a.dtype(), a.device());
    }
    if spectral {
        let s = svdvals_named(OP, a)?;
        let k = m.min(n) as isize;
        let first = s.try_slice_dim(-1, 0, 1, 1)?.try_squeeze_dim(-1)?;
        let last = s.try_slice_dim(-1, k - 1, k, 1)?.try_squeeze_dim(-1)?;
        return if matches!(p, NormOrd::P(v) if v > 0.0) {
            first.try_div(&last)
        } else {
            last.try_div(&first)
        };
    }
    // Singular matrices: infinite (their inverses are replaced by identities first).
    let info = no_grad(|| lu_factor_ex(&a.detach()))?.2.to_vec::<i32>()?;
    let singular: Vec<bool> = info.iter().map(|&i| i > 0).collect();
    let norm = |t: &Tensor| matrix_norm(t, p, [-2, -1], false);
    if !singular.iter().any(|&s| s) {
        return norm(a)?.try_mul(&norm(&inv(a)?)?);
    }
    let mask = Tensor::try_from_vec(singular, batch.as_slice())?.try_to(a.device())?;
    let eye = Tensor::try_eye(n, a.dtype())?.try_to(a.device())?;
    let safe = Tensor::try_where(&mask.try_unsqueeze(-1)?.try_unsqueeze(-1)?, &eye, a)?;
    let value = norm(a)?.try_mul(&norm(&inv(&safe)?)?)?;
    Tensor::try_where(&mask, f64::INFINITY, &value)
}
