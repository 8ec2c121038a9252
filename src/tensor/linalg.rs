//! Small linear-algebra composites with PyTorch's names: `outer`, `trace`, `cross` and
//! `addmm`. Each records views, elementwise ops, reductions or a product, so it fuses,
//! runs on every device and is differentiated as its parts are.

use super::{Tensor, unwrap_or_panic};
use crate::error::{KilnError, Result};
use crate::shape::normalize_axis;

impl Tensor {
    /// PyTorch's `outer(v, w)`: the `[n, m]` matrix `v[i]·w[j]` of two 1-D tensors (a
    /// broadcast product, no matmul).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let w = Tensor::from_vec(vec![3.0f32, 4.0, 5.0], [3]);
    /// assert_eq!(v.outer(&w).to_vec::<f32>().unwrap(), vec![3.0, 4.0, 5.0, 6.0, 8.0, 10.0]);
    /// ```
    #[track_caller]
    pub fn outer(&self, other: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_outer(other))
    }

    /// Fallible [`Tensor::outer`].
    pub fn try_outer(&self, other: &Tensor) -> Result<Tensor> {
        if self.ndim() != 1 || other.ndim() != 1 {
            return Err(KilnError::ShapeMismatch {
                op: "outer",
                lhs: self.shape().to_vec(),
                rhs: other.shape().to_vec(),
                detail: ": both operands must be 1-D".into(),
            });
        }
        self.try_unsqueeze(1)?.try_mul(&other.try_unsqueeze(0)?)
    }

    /// PyTorch's `trace()`: the sum of a 2-D tensor's main diagonal (integers sum as i64).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::arange(0.0, 6.0, 1.0).reshape([2, 3]);
    /// assert_eq!(x.trace().item::<f32>().unwrap(), 4.0);
    /// ```
    #[track_caller]
    pub fn trace(&self) -> Tensor {
        unwrap_or_panic(self.try_trace())
    }

    /// Fallible [`Tensor::trace`].
    pub fn try_trace(&self) -> Result<Tensor> {
        if self.ndim() != 2 {
            return Err(KilnError::InvalidArgument {
                op: "trace",
                shape: self.shape().to_vec(),
                reason: "expected a 2-D tensor".into(),
            });
        }
        self.try_diagonal(0, 0, 1)?.try_sum(..)
    }

    /// PyTorch's `torch.linalg.cross(a, b, dim)`: the cross product of 3-vectors along
    /// `dim` (which must have size 3 in both), the other dimensions broadcast.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0, 0.0], [3]);
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0, 0.0], [3]);
    /// assert_eq!(x.cross(&y, -1).to_vec::<f32>().unwrap(), vec![0.0, 0.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn cross(&self, other: &Tensor, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_cross(other, dim))
    }

    /// Fallible [`Tensor::cross`].
    pub fn try_cross(&self, other: &Tensor, dim: isize) -> Result<Tensor> {
        let (da, db) = (
            normalize_axis("cross", dim, self.shape())?,
            normalize_axis("cross", dim, other.shape())?,
        );
        if self.shape()[da] != 3 || other.shape()[db] != 3 {
            return Err(KilnError::ShapeMismatch {
                op: "cross",
                lhs: self.shape().to_vec(),
                rhs: other.shape().to_vec(),
                detail: format!(": dimension {dim} must have size 3 in both"),
            });
        }
        // c[i] = a[i+1]·b[i+2] - a[i+2]·b[i+1], indices mod 3: rolls by -1 and -2.
        let roll = |t: &Tensor, s: i64| t.try_roll(&[s], &[dim]);
        roll(self, -1)?
            .try_mul(&roll(other, -2)?)?
            .try_sub(&roll(self, -2)?.try_mul(&roll(other, -1)?)?)
    }

    /// PyTorch's `addmm(input, m1, m2, beta, alpha)`: `beta·input + alpha·(m1 @ m2)`, with
    /// `input` broadcast to the product's shape; `beta = 0` ignores `input` (its NaNs too),
    /// as PyTorch does.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let bias = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let m1 = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2]);
    /// let m2 = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], [2, 2]);
    /// assert_eq!(bias.addmm(&m1, &m2, 1.0, 2.0).to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
    /// ```
    #[track_caller]
    pub fn addmm(&self, m1: &Tensor, m2: &Tensor, beta: f64, alpha: f64) -> Tensor {
        unwrap_or_panic(self.try_addmm(m1, m2, beta, alpha))
    }

    /// Fallible [`Tensor::addmm`].
    pub fn try_addmm(&self, m1: &Tensor, m2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        if m1.ndim() != 2 || m2.ndim() != 2 {
            return Err(KilnError::ShapeMismatch {
                op: "addmm",
                lhs: m1.shape().to_vec(),
                rhs: m2.shape().to_vec(),
                detail: ": both matrices must be 2-D".into(),
            });
        }
        let product = m1.try_matmul(m2)?;
        let scaled = if alpha == 1.0 {
            product
        } else {
            product.try_mul(alpha)?
        };
        let input = self.try_broadcast_to(scaled.shape())?;
        if beta == 0.0 {
            return Ok(scaled);
        }
        let input = if beta == 1.0 {
            input
        } else {
            input.try_mul(beta)?
        };
        input.try_add(&scaled)
    }
}
