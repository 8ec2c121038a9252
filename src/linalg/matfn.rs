//! Matrix functions composed of lazy matrix products: [`matrix_power`] (binary powering,
//! [`super::inv`] for negative powers) and [`matrix_exp`] (scaling and squaring of a
//! truncated Taylor series). Both are differentiated by autograd through their parts.

use super::decomp::{check, constant, inv};
use super::norm::{NormOrd, matrix_norm};
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// Checks that `a` is a batch of square matrices (any dtype `matmul` takes).
fn check_square(op: &'static str, a: &Tensor) -> Result<usize> {
    if a.ndim() < 2 || a.shape()[a.ndim() - 1] != a.shape()[a.ndim() - 2] {
        return Err(KilnError::InvalidArgument {
            op,
            shape: a.shape().to_vec(),
            reason: "A must be a batch of square matrices (at least 2 dimensions)".into(),
        });
    }
    if a.dtype() == DType::Bool {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: a.dtype(),
            detail: ": expected a numeric tensor".into(),
        });
    }
    Ok(a.shape()[a.ndim() - 1])
}

/// The `n × n` identity of `like`'s dtype and device, broadcast to `like`'s shape.
fn identity_like(like: &Tensor, n: usize) -> Result<Tensor> {
    Tensor::try_eye(n, like.dtype())?
        .try_to(like.device())?
        .try_broadcast_to(like.shape())
}

/// PyTorch's `torch.linalg.matrix_power(A, n)`: `A` (`[..., m, m]`) multiplied by itself
/// `n` times, by repeated squaring (about `2·log₂ n` lazy products). `n = 0` gives identity
/// matrices of `A`'s shape and dtype (with no gradient, as in PyTorch); `n < 0` is
/// `inv(A)^|n|` (float inputs only; a singular matrix is refused by [`super::inv`]).
/// Integer inputs are accepted for `n ≥ 0`, as `matmul` accepts them.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f64, 1.0, 0.0, 1.0], [2, 2]);
/// let p = kiln::linalg::matrix_power(&a, 5)?;
/// assert_eq!(p.to_vec::<f64>()?, vec![1.0, 5.0, 0.0, 1.0]);
/// let q = kiln::linalg::matrix_power(&a, -2)?;
/// assert_eq!(q.to_vec::<f64>()?, vec![1.0, -2.0, 0.0, 1.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn matrix_power(a: &Tensor, n: i64) -> Result<Tensor> {
    const OP: &str = "linalg.matrix_power";
    let size = check_square(OP, a)?;
    if n == 0 {
        return identity_like(a, size)?.try_copy();
    }
    let base = if n < 0 {
        check(OP, a, true)?;
        inv(a)?
    } else {
        a.clone()
    };
    let mut e = n.unsigned_abs();
    if e == 1 {
        // A new tensor, as PyTorch's clone.
        return base.try_copy();
    }
    // Binary powering: `result` collects the squares of the set bits.
    let mut square = base;
    let mut result: Option<Tensor> = None;
    loop {
        if e & 1 == 1 {
            result = Some(match result {
                None => square.clone(),
                Some(r) => r.try_matmul(&square)?,
            });
        }
        e >>= 1;
        if e == 0 {
            break;
        }
        square = square.try_matmul(&square)?;
    }
    result.ok_or_else(|| KilnError::internal("matrix_power: no factor"))
}

/// The Taylor degree used for `dtype` once the 1-norm is at most 1: its remainder
/// (`< e/(d+1)!`) is below the dtype's rounding.
fn taylor_degree(dtype: DType) -> usize {
    if dtype == DType::F64 { 18 } else { 12 }
}

/// `Σ_{j ≤ d} X^j / j!` by Paterson–Stockmeyer with blocks of 4: `X²`, `X³`, `X⁴`, then
/// Horner in `X⁴` over blocks of the form `Σ_{r<4} c_{4i+r} X^r`.
fn taylor(x: &Tensor, eye: &Tensor, degree: usize) -> Result<Tensor> {
    let x2 = x.try_matmul(x)?;
    let x3 = x2.try_matmul(x)?;
    let x4 = x2.try_matmul(&x2)?;
    let powers = [eye, x, &x2, &x3];
    let mut coefficient = vec![1.0f64; degree + 1];
    for j in 1..=degree {
        coefficient[j] = coefficient[j - 1] / j as f64;
    }
    let block = |i: usize| -> Result<Tensor> {
        let mut acc: Option<Tensor> = None;
        for (r, p) in powers.iter().enumerate() {
            let j = 4 * i + r;
            if j > degree {
                break;
            }
            let term = p.try_mul(coefficient[j])?;
            acc = Some(match acc {
                None => term,
                Some(s) => s.try_add(&term)?,
            });
        }
        acc.ok_or_else(|| KilnError::internal("matrix_exp: empty block"))
    };
    let blocks = degree / 4 + 1;
    let mut acc = block(blocks - 1)?;
    for i in (0..blocks - 1).rev() {
        acc = block(i)?.try_add(&x4.try_matmul(&acc)?)?;
    }
    Ok(acc)
}

/// PyTorch's `torch.linalg.matrix_exp(A)`: the matrix exponential `Σ Aᵏ/k!` of each square
/// matrix (`[..., n, n]`, f32 or f64), by scaling and squaring: each matrix is divided by
/// `2^s` so that its 1-norm is at most 1 (`s` chosen per matrix from the norms, which are
/// read back: a synchronization point), a Taylor polynomial of degree 18 (f64) or 12 (f32)
/// is evaluated with 7 (6) lazy products, and the result is squared `s` times. Everything
/// after the norms is lazy tensor ops, so it runs on the input's device and autograd
/// differentiates it (the gradient of the approximant, accurate to the dtype's precision).
/// Non-finite entries give non-finite results (no squaring is attempted).
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![0.0f64, 1.0, 0.0, 0.0], [2, 2]);
/// assert_eq!(kiln::linalg::matrix_exp(&a)?.to_vec::<f64>()?, vec![1.0, 1.0, 0.0, 1.0]);
/// let d = Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 2.0], [2, 2]);
/// let e = kiln::linalg::matrix_exp(&d)?.to_vec::<f64>()?;
/// assert!((e[0] - 1f64.exp()).abs() < 1e-15 && (e[3] - 2f64.exp()).abs() < 1e-14);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn matrix_exp(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.matrix_exp";
    let (n, _) = check(OP, a, true)?;
    if a.numel() == 0 {
        return a.try_copy();
    }
    let norms =
        no_grad(|| matrix_norm(&a.detach(), NormOrd::P(1.0), [-2, -1], false))?.to_vec::<f64>()?;
    // s per matrix: the least s ≥ 0 with ‖A‖₁ / 2^s ≤ 1 (0 for a non-finite norm).
    let steps: Vec<u32> = norms
        .iter()
        .map(|&v| {
            if v.is_finite() && v > 1.0 {
                (v.log2().ceil() as u32).min(1100)
            } else {
                0
            }
        })
        .collect();
    let most = steps.iter().copied().max().unwrap_or(0);
    let batch = &a.shape()[..a.ndim() - 2];
    let mut one_shape = batch.to_vec();
    one_shape.extend([1, 1]);
    let scales: Vec<f64> = steps.iter().map(|&s| 0.5f64.powi(s as i32)).collect();
    let x = if most == 0 {
        a.clone()
    } else {
        a.try_mul(&constant(scales, &one_shape, a)?)?
    };
    let eye = Tensor::try_eye(n, a.dtype())?.try_to(a.device())?;
    let mut y = taylor(&x, &eye, taylor_degree(a.dtype()))?;
    let uniform = steps.iter().all(|&s| s == most);
    for step in 0..most {
        let squared = y.try_matmul(&y)?;
        y = if uniform {
            squared
        } else {
            // Matrix b squares in the last s_b of the `most` steps.
            let left = most - step;
            let mask: Vec<f64> = steps
                .iter()
                .map(|&s| if s >= left { 1.0 } else { 0.0 })
                .collect();
            let mask = constant(mask, &one_shape, a)?.try_gt(0.5)?;
            Tensor::try_where(&mask, &squared, &y)?
        };
    }
    Ok(y)
}
