//! Masks: `tril`, `triu`, `masked_fill`, `one_hot`. Each is a comparison of generated
//! positions and a `where`, so it fuses into the kernel around it (a causal mask costs no
//! memory).

use super::{Tensor, unwrap_or_panic};
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::shape::broadcast_shapes;

impl Tensor {
    /// `col - row` over the last two dimensions, broadcast to this tensor's shape.
    fn diagonal_offsets(&self, op: &'static str) -> Result<Tensor> {
        if self.ndim() < 2 {
            return Err(KilnError::InvalidShape {
                op,
                shape: self.shape().to_vec(),
                requested: vec![-1, -1],
                reason: "needs at least two dimensions".into(),
            });
        }
        let (m, n) = (self.shape()[self.ndim() - 2], self.shape()[self.ndim() - 1]);
        let row = Tensor::try_arange(0, m as i64, 1, DType::I64)?
            .try_to(self.device())?
            .try_reshape([m as isize, 1])?;
        let col = Tensor::try_arange(0, n as i64, 1, DType::I64)?
            .try_to(self.device())?
            .try_reshape([1, n as isize])?;
        col.try_sub(&row)
    }

    /// The lower triangle of the last two dimensions (`col - row <= diagonal`), zeros
    /// elsewhere.
    ///
    /// ```
    /// let x = kiln::Tensor::ones(&[2, 2]);
    /// assert_eq!(x.tril(0).to_vec::<f32>().unwrap(), vec![1.0, 0.0, 1.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn tril(&self, diagonal: i64) -> Tensor {
        unwrap_or_panic(self.try_tril(diagonal))
    }

    /// Fallible [`Tensor::tril`].
    pub fn try_tril(&self, diagonal: i64) -> Result<Tensor> {
        let keep = self.diagonal_offsets("tril")?.try_le(diagonal)?;
        Tensor::try_where(&keep, self, Scalar::Int(0))?.try_cast(self.dtype())
    }

    /// The upper triangle of the last two dimensions (`col - row >= diagonal`), zeros
    /// elsewhere.
    #[track_caller]
    pub fn triu(&self, diagonal: i64) -> Tensor {
        unwrap_or_panic(self.try_triu(diagonal))
    }

    /// Fallible [`Tensor::triu`].
    pub fn try_triu(&self, diagonal: i64) -> Result<Tensor> {
        let keep = self.diagonal_offsets("triu")?.try_ge(diagonal)?;
        Tensor::try_where(&keep, self, Scalar::Int(0))?.try_cast(self.dtype())
    }

    /// `value` (converted to this tensor's dtype) where the bool `mask` is true, this
    /// tensor elsewhere. As PyTorch's out-of-place `masked_fill`, the tensor and the mask
    /// broadcast together: the result has their broadcast shape.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    /// let m = Tensor::from_vec(vec![false, true, false], &[3]);
    /// assert_eq!(x.masked_fill(&m, -1.0).to_vec::<f32>().unwrap(), vec![1.0, -1.0, 3.0]);
    /// let rows = Tensor::from_vec(vec![true, false], &[2, 1]);
    /// assert_eq!(x.masked_fill(&rows, 0.0).shape(), &[2, 3]);
    /// ```
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Tensor {
        unwrap_or_panic(self.try_masked_fill(mask, value))
    }

    /// Fallible [`Tensor::masked_fill`].
    pub fn try_masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        if mask.dtype() != DType::Bool {
            return Err(KilnError::UnsupportedDType {
                op: "masked_fill",
                dtype: mask.dtype(),
                detail: ": the mask must be bool".into(),
            });
        }
        // Checked here so that a mismatch names the op the caller used; `where` then
        // broadcasts the mask and this tensor to that shape.
        broadcast_shapes("masked_fill", self.shape(), mask.shape())?;
        let v = Tensor::try_full_on((), value.into(), self.dtype(), self.device())?;
        Tensor::try_where(mask, &v, self)
    }

    /// One-hot encoding of integer class indices: a new last dimension of `num_classes`,
    /// 1 at the index and 0 elsewhere, as i64 (PyTorch's dtype). `num_classes` must be
    /// given: kiln never reads data to plan (PyTorch's `-1` would). A class outside
    /// `0..num_classes` fails when realized ([`KilnError::IndexOutOfRange`]), as PyTorch
    /// raises.
    ///
    /// ```
    /// let t = kiln::Tensor::from_vec(vec![2i64, 0], &[2]);
    /// assert_eq!(t.one_hot(3).to_vec::<i64>().unwrap(), vec![0, 0, 1, 1, 0, 0]);
    /// ```
    #[track_caller]
    pub fn one_hot(&self, num_classes: usize) -> Tensor {
        unwrap_or_panic(self.try_one_hot(num_classes))
    }

    /// Fallible [`Tensor::one_hot`].
    pub fn try_one_hot(&self, num_classes: usize) -> Result<Tensor> {
        if !self.dtype().is_int() {
            return Err(KilnError::UnsupportedDType {
                op: "one_hot",
                dtype: self.dtype(),
                detail: ": class indices must be integers".into(),
            });
        }
        if num_classes == 0 && self.numel() > 0 {
            // Every class is out of range, and the empty result would run no kernel.
            return Err(KilnError::InvalidArgument {
                op: "one_hot",
                shape: self.shape().to_vec(),
                reason: "num_classes is 0: every class value is out of range".into(),
            });
        }
        let classes =
            Tensor::try_arange(0, num_classes as i64, 1, DType::I64)?.try_to(self.device())?;
        let t = self.try_cast(DType::I64)?.try_unsqueeze(-1)?;
        let hot = t.try_eq(&classes)?.try_cast(DType::I64)?;
        // The range check (PyTorch raises for a class outside `0..num_classes`, where a
        // comparison alone would give a row of zeros).
        hot.try_mul(&super::indexing::range_guard(&t, num_classes, 1)?)
    }
}
