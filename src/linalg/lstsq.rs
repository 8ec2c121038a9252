//! The pseudoinverse and least squares: [`pinv`] from the host SVD with its own backward
//! rule (defined wherever the rank is locally constant, repeated singular values included),
//! and [`lstsq`] composed as `pinv(A)·B`, so its gradients are those of its parts.

use super::decomp::{check, constant, mt, svd_host, tracking, with_tail};
use crate::autograd::composite;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::shape::broadcast_shapes;
use crate::tensor::Tensor;

/// The machine epsilon of the float `dtype` (f32's or f64's).
pub(super) fn eps(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    }
}

/// PyTorch's default relative tolerance: `rtol` when given; otherwise 0 when `atol > 0`,
/// else `max(m, n)·eps`.
pub(super) fn default_rtol(
    dtype: DType,
    m: usize,
    n: usize,
    atol: Option<f64>,
    rtol: Option<f64>,
) -> f64 {
    match (rtol, atol) {
        (Some(r), _) => r,
        (None, Some(a)) if a > 0.0 => 0.0,
        _ => m.max(n) as f64 * eps(dtype),
    }
}

/// The pseudoinverse of each matrix of `a` with the singular values kept where `s > tol`,
/// `tol = max(atol, rtol·σ_max)`; also the singular values (flattened over the batch) and
/// the number kept per matrix.
pub(super) fn pinv_core(
    op: &'static str,
    a: &Tensor,
    atol: f64,
    rtol: f64,
) -> Result<(Tensor, Vec<f64>, Vec<usize>)> {
    let (m, n) = check(op, a, false)?;
    let k = m.min(n);
    let count: usize = a.shape()[..a.ndim() - 2].iter().product();
    let out_shape = with_tail(a, &[n, m]);
    let (p, ss, ranks) = if k == 0 || count == 0 {
        (vec![0.0; count * n * m], Vec::new(), vec![0; count])
    } else {
        let (us, ss, vs, _, _) = svd_host(op, a)?;
        let mut p = vec![0.0; count * n * m];
        let mut ranks = Vec::with_capacity(count);
        for b in 0..count {
            let (u, s, vt) = (
                &us[b * m * k..(b + 1) * m * k],
                &ss[b * k..(b + 1) * k],
                &vs[b * k * n..(b + 1) * k * n],
            );
            let tol = atol.max(rtol * s[0]);
            let kept: Vec<usize> = (0..k).filter(|&l| s[l] > tol).collect();
            ranks.push(kept.len());
            let pb = &mut p[b * n * m..(b + 1) * n * m];
            for i in 0..n {
                for j in 0..m {
                    pb[i * m + j] = kept
                        .iter()
                        .map(|&l| vt[l * n + i] * u[j * k + l] / s[l])
                        .sum();
                }
            }
        }
        (p, ss, ranks)
    };
    let p = constant(p, &out_shape, a)?;
    if !tracking(&[a]) {
        return Ok((p, ss, ranks));
    }
    // With P = A⁺ (valid while the rank is locally constant):
    // gA = -Pᵀ·G·Pᵀ + (I - A·P)·Gᵀ·P·Pᵀ + Pᵀ·P·Gᵀ·(I - P·A).
    let p = composite(
        &[a],
        move || Ok(p),
        |ins, p, g| {
            let a = &ins[0];
            let (pt, gt) = (mt(p)?, mt(g)?);
            let first = pt.try_matmul(g)?.try_matmul(&pt)?.try_neg()?;
            let gpp = gt.try_matmul(p)?.try_matmul(&pt)?;
            let second = gpp.try_sub(&a.try_matmul(&p.try_matmul(&gpp)?)?)?;
            let ppg = pt.try_matmul(p)?.try_matmul(&gt)?;
            let third = ppg.try_sub(&ppg.try_matmul(p)?.try_matmul(a)?)?;
            Ok(vec![Some(first.try_add(&second)?.try_add(&third)?)])
        },
    )?;
    Ok((p, ss, ranks))
}

/// The symmetric matrices whose lower triangle `a` holds (`tril(A) + tril(A, -1)ᵀ`), lazily.
pub(super) fn symmetrize_lower(a: &Tensor) -> Result<Tensor> {
    a.try_tril(0)?.try_add(&mt(&a.try_tril(-1)?)?)
}

/// PyTorch's `torch.linalg.pinv(A, atol=None, rtol=None, hermitian=False)`: the
/// Moore–Penrose pseudoinverse of each matrix of `A` (`[..., m, n]` → `[..., n, m]`),
/// `V·diag(1/σ)·Uᵀ` from the SVD, the singular values `σ ≤ max(atol, rtol·σ_max)` treated
/// as zero. As in PyTorch, `atol` defaults to 0 and `rtol` to `max(m, n)·eps` of the dtype
/// (f32's eps for f32), or to 0 when only a positive `atol` is given. With `hermitian`,
/// `A` must be square and only its lower triangle is read (the symmetric matrix it
/// describes is inverted). Gradient (PyTorch's, valid while the rank does not change):
/// `-Pᵀ·G·Pᵀ + (I - A·P)·Gᵀ·P·Pᵀ + Pᵀ·P·Gᵀ·(I - P·A)` with `P = A⁺`.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 0.0, 2.0, 0.0], [2, 3]);
/// let p = kiln::linalg::pinv(&a, None, None, false)?;
/// assert_eq!(p.shape(), &[3, 2]);
/// assert_eq!(p.to_vec::<f64>()?, vec![1.0, 0.0, 0.0, 0.5, 0.0, 0.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn pinv(a: &Tensor, atol: Option<f64>, rtol: Option<f64>, hermitian: bool) -> Result<Tensor> {
    const OP: &str = "linalg.pinv";
    let (m, n) = check(OP, a, hermitian)?;
    for (name, v) in [("atol", atol), ("rtol", rtol)] {
        if v.is_some_and(f64::is_nan) {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: a.shape().to_vec(),
                reason: format!("{name} must not be NaN"),
            });
        }
    }
    let rtol = default_rtol(a.dtype(), m, n, atol, rtol);
    let a = if hermitian {
        symmetrize_lower(a)?
    } else {
        a.clone()
    };
    Ok(pinv_core(OP, &a, atol.unwrap_or(0.0), rtol)?.0)
}

/// The LAPACK driver PyTorch's `torch.linalg.lstsq` is asked for (`driver=`). kiln solves
/// every one the same way (the minimum-norm solution from the SVD); the driver decides
/// which of the extra outputs are filled, as in PyTorch on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LstsqDriver {
    /// `'gels'` (QR; assumes `A` has full rank): `residuals` when `m > n`; no `rank`, no
    /// `singular_values`.
    Gels,
    /// `'gelsy'`, PyTorch's CPU default: `rank` only.
    Gelsy,
    /// `'gelsd'`: `rank`, `singular_values`, and `residuals` when `m > n` and every matrix
    /// has full rank.
    Gelsd,
    /// `'gelss'`: the same outputs as [`LstsqDriver::Gelsd`].
    Gelss,
}

/// The result of [`lstsq`], PyTorch's named tuple. An output the driver does not compute
/// is an empty tensor of shape `[0]`, as in PyTorch.
#[derive(Clone, Debug)]
pub struct Lstsq {
    /// `X` minimizing `‖A·X - B‖_F` (the one of least norm), `[..., n, k]` (`[..., n]`
    /// for a vector `B`).
    pub solution: Tensor,
    /// `‖A·X - B‖²` per column, `[..., k]` (`k = 1` for a vector `B`), in `A`'s dtype.
    pub residuals: Tensor,
    /// The effective rank of each matrix of `A`, `[...]`, int64.
    pub rank: Tensor,
    /// The singular values of each matrix of `A`, `[..., min(m, n)]`, descending.
    pub singular_values: Tensor,
}

/// PyTorch's `torch.linalg.lstsq(A, B, rcond=None, driver=None)`: the least-squares
/// solution of `A·X = B` for `A` `[..., m, n]` and `B` `[..., m, k]` (or a batch of vectors
/// `[..., m]`, as [`super::solve`] decides), batch dimensions broadcast (`B` may not have
/// more dimensions than `A`, as in PyTorch). The solution is `pinv(A)·B` with singular
/// values `σ ≤ rcond·σ_max` dropped (`rcond` defaults to `max(m, n)·eps` of the dtype): the
/// minimum-norm least-squares solution, which is what LAPACK's `gelsy` (PyTorch's CPU
/// default) returns for the same effective rank. Which of `residuals`, `rank` and
/// `singular_values` are filled follows the driver ([`LstsqDriver`]); with the default
/// `'gelsy'` only `rank` is, as PyTorch's CPU results (its residuals are empty too). The
/// rank is the number of singular values above the tolerance (`gelsy` estimates it from a
/// pivoted QR; the two agree unless a singular value sits at the threshold). Gradients
/// flow to `A` and `B` through `pinv` and the product (and through `residuals` when it is
/// filled).
///
/// ```
/// use kiln::Tensor;
/// // Fit y = c0 + c1·x through (0, 1), (1, 3), (2, 5).
/// let a = Tensor::from_vec(vec![1.0f64, 0.0, 1.0, 1.0, 1.0, 2.0], [3, 2]);
/// let b = Tensor::from_vec(vec![1.0f64, 3.0, 5.0], [3]);
/// let fit = kiln::linalg::lstsq(&a, &b, None, None)?;
/// let c = fit.solution.to_vec::<f64>()?;
/// assert!((c[0] - 1.0).abs() < 1e-12 && (c[1] - 2.0).abs() < 1e-12);
/// assert_eq!(fit.rank.to_vec::<i64>()?, vec![2]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn lstsq(
    a: &Tensor,
    b: &Tensor,
    rcond: Option<f64>,
    driver: Option<LstsqDriver>,
) -> Result<Lstsq> {
    const OP: &str = "linalg.lstsq";
    let driver = driver.unwrap_or(LstsqDriver::Gelsy);
    a.require_same_dtype_and_device(OP, b)?;
    let (m, n) = check(OP, a, false)?;
    let vector = b.ndim() == 1 || (b.ndim() + 1 == a.ndim() && b.shape() == &a.shape()[..b.ndim()]);
    let b2 = if vector {
        b.try_unsqueeze(-1)?
    } else {
        b.clone()
    };
    if b.ndim() > a.ndim() || b2.ndim() < 2 || b2.shape()[b2.ndim() - 2] != m {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
            detail:
                ": B must be [..., m, k] or [..., m] with A's m rows and no more dimensions than A"
                    .into(),
        });
    }
    let k = b2.shape()[b2.ndim() - 1];
    let batch = broadcast_shapes(OP, &a.shape()[..a.ndim() - 2], &b2.shape()[..b2.ndim() - 2])?;
    let shape_of = |tail: [usize; 2]| {
        let mut s = batch.clone();
        s.extend(tail);
        s
    };
    let ab = a.try_broadcast_to(shape_of([m, n]).as_slice())?;
    let bb = b2.try_broadcast_to(shape_of([m, k]).as_slice())?;
    let rtol = rcond.map_or(m.max(n) as f64 * eps(a.dtype()), |r| {
        if r.is_nan() { 0.0 } else { r.max(0.0) }
    });
    let (p, ss, ranks) = pinv_core(OP, &ab, 0.0, rtol)?;
    let x = p.try_matmul(&bb)?;
    let empty = || {
        Tensor::try_zeros([0])?
            .try_cast(a.dtype())?
            .try_to(a.device())
    };
    let with_values = matches!(driver, LstsqDriver::Gelsd | LstsqDriver::Gelss);
    let full_rank = ranks.iter().all(|&r| r == n);
    let residuals = if m > n
        && match driver {
            LstsqDriver::Gels => true,
            LstsqDriver::Gelsy => false,
            LstsqDriver::Gelsd | LstsqDriver::Gelss => full_rank,
        } {
        let r = ab.try_matmul(&x)?.try_sub(&bb)?;
        r.try_mul(&r)?.try_sum(-2)?
    } else {
        empty()?
    };
    let rank = if driver == LstsqDriver::Gels {
        Tensor::try_zeros([0])?.try_cast(DType::I64)?
    } else {
        let r: Vec<i64> = ranks.iter().map(|&r| r as i64).collect();
        Tensor::try_from_vec(r, batch.as_slice())?
    }
    .try_to(a.device())?;
    let singular_values = if with_values {
        let mut s_shape = batch.clone();
        s_shape.push(m.min(n));
        let count: usize = batch.iter().product();
        let values = if ss.is_empty() {
            vec![0.0; count * m.min(n)]
        } else {
            ss
        };
        constant(values, &s_shape, a)?
    } else {
        empty()?
    };
    let solution = if vector { x.try_squeeze_dim(-1)? } else { x };
    Ok(Lstsq {
        solution,
        residuals,
        rank,
        singular_values,
    })
}
