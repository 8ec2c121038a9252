//! The complete forms of the factorizations: [`svd_full`] (`full_matrices=True`) and
//! [`qr_mode`] (`'reduced'`, `'complete'`, `'r'`). Each is the reduced factorization (with
//! its backward rule) joined to the completing columns, which are constants.

use super::decomp::{check, constant, mt, qr, read, svd, with_tail};
use super::host::{complete_columns, qr_columns};
use crate::error::Result;
use crate::tensor::Tensor;

/// The `m × m` identities of `a`'s batch, in its dtype, on its device.
fn identities(a: &Tensor, m: usize) -> Result<Tensor> {
    Tensor::try_eye(m, a.dtype())?
        .try_to(a.device())?
        .try_broadcast_to(with_tail(a, &[m, m]).as_slice())?
        .try_copy()
}

/// The columns completing each `[..., m, k]` matrix of orthonormal columns `q` (a constant,
/// `[..., m, m - k]`).
fn completion(q: &Tensor, like: &Tensor, m: usize, k: usize) -> Result<Tensor> {
    let values = if q.numel() == 0 {
        Vec::new()
    } else {
        q.detach().to_vec::<f64>()?
    };
    let count: usize = like.shape()[..like.ndim() - 2].iter().product();
    let mut out = Vec::with_capacity(count * m * (m - k));
    for b in 0..count {
        out.extend(complete_columns(&values[b * m * k..(b + 1) * m * k], m, k));
    }
    constant(out, &with_tail(like, &[m, m - k]), like)
}

/// PyTorch's `torch.linalg.svd(A, full_matrices=True)` (its default): `U` `[..., m, m]` and
/// `Vh` `[..., n, n]` orthogonal, `S` `[..., k]` descending, `k = min(m, n)`, with `A =
/// U[..., :k]·diag(S)·Vh[..., :k, :]`. The first `k` columns of `U` and rows of `Vh` are
/// [`super::svd`]'s; the others complete them to orthonormal bases (not unique: the
/// standard basis vectors orthogonalized in order). Gradients flow through the first `k`
/// columns and rows only, as PyTorch's rule narrows them.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![3.0f64, 0.0, 0.0, 4.0, 0.0, 0.0], [3, 2]);
/// let (u, s, vh) = kiln::linalg::svd_full(&a)?;
/// assert_eq!((u.shape(), vh.shape()), (&[3, 3][..], &[2, 2][..]));
/// assert_eq!(s.to_vec::<f64>()?, vec![4.0, 3.0]);
/// let utu = u.t().matmul(&u).to_vec::<f64>()?;
/// assert!((utu[8] - 1.0).abs() < 1e-12 && utu[2].abs() < 1e-12);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn svd_full(a: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "linalg.svd";
    let (m, n) = check(OP, a, false)?;
    let k = m.min(n);
    if k == 0 {
        let mut s_shape = a.shape()[..a.ndim() - 2].to_vec();
        s_shape.push(0);
        let s = Tensor::try_full_on(s_shape.as_slice(), 0.0, a.dtype(), a.device())?;
        return Ok((identities(a, m)?, s, identities(a, n)?));
    }
    let (u, s, vh) = svd(a)?;
    let u = if m > k {
        Tensor::try_cat(&[&u, &completion(&u, a, m, k)?], -1)?
    } else {
        u
    };
    let vh = if n > k {
        let extra = completion(&mt(&vh)?, a, n, k)?;
        Tensor::try_cat(&[&vh, &mt(&extra)?], -2)?
    } else {
        vh
    };
    Ok((u, s, vh))
}

/// The `mode` of PyTorch's `torch.linalg.qr(A, mode=...)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QrMode {
    /// `'reduced'` (the default): `Q` `[..., m, k]`, `R` `[..., k, n]`, `k = min(m, n)`.
    Reduced,
    /// `'complete'`: `Q` `[..., m, m]` orthogonal, `R` `[..., m, n]`.
    Complete,
    /// `'r'`: `R` only (`[..., k, n]`); `Q` is an empty tensor of shape `[0]`.
    R,
}

/// PyTorch's `torch.linalg.qr(A, mode)`: [`super::qr`] for `Reduced`; for `Complete` the
/// full orthogonal `Q` (LAPACK's `orgqr` applied to the whole identity, so PyTorch's CPU
/// columns) and `R` padded with zero rows when `m > n`; for `R`, `R` alone. Gradients: as
/// [`super::qr`]'s through the reduced parts (the completing columns are constants, where
/// PyTorch refuses the backward of `'complete'` with `m > n` and of `'r'`).
///
/// ```
/// use kiln::{Tensor, linalg::QrMode};
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]);
/// let (q, r) = kiln::linalg::qr_mode(&a, QrMode::Complete)?;
/// assert_eq!((q.shape(), r.shape()), (&[3, 3][..], &[3, 2][..]));
/// let back = q.matmul(&r).to_vec::<f64>()?;
/// assert!((back[5] - 6.0).abs() < 1e-12);
/// let (q0, r0) = kiln::linalg::qr_mode(&a, QrMode::R)?;
/// assert_eq!((q0.shape(), r0.shape()), (&[0][..], &[2, 2][..]));
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn qr_mode(a: &Tensor, mode: QrMode) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.qr";
    let (m, n) = check(OP, a, false)?;
    let (q, r) = qr(a)?;
    match mode {
        QrMode::Reduced => Ok((q, r)),
        QrMode::R => Ok((Tensor::try_full_on([0], 0.0, a.dtype(), a.device())?, r)),
        QrMode::Complete if m <= n => Ok((q, r)),
        QrMode::Complete => {
            let mats = read(OP, a, false)?;
            let mut extra = Vec::with_capacity(mats.count * m * (m - n));
            for b in 0..mats.count {
                let (full, _) = qr_columns(mats.get(b), m, n, m);
                for row in full.chunks(m) {
                    extra.extend_from_slice(&row[n..]);
                }
            }
            let extra = constant(extra, &with_tail(a, &[m, m - n]), a)?;
            let zeros = Tensor::try_full_on(
                with_tail(a, &[m - n, n]).as_slice(),
                0.0,
                a.dtype(),
                a.device(),
            )?;
            Ok((
                Tensor::try_cat(&[&q, &extra], -1)?,
                Tensor::try_cat(&[&r, &zeros], -2)?,
            ))
        }
    }
}
