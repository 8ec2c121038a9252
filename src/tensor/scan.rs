//! Running totals along one axis: `cumsum` and `cumprod`, each one scan kernel (linear
//! work per lane, lanes in parallel).

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::Op;
use crate::ops::ScanOp;
use crate::shape::normalize_axis;

impl Tensor {
    /// PyTorch's `cumsum`: running sums along `dim`. Integers and bools sum as i64 (wrapping);
    /// floats keep their dtype and accumulate in f64, each output rounded once.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// assert_eq!(x.cumsum(1).to_vec::<f32>().unwrap(), vec![1.0, 3.0, 3.0, 7.0]);
    /// ```
    #[track_caller]
    pub fn cumsum(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_cumsum(dim))
    }

    /// Fallible [`Tensor::cumsum`].
    pub fn try_cumsum(&self, dim: isize) -> Result<Tensor> {
        self.scan(ScanOp::Sum, dim)
    }

    /// PyTorch's `cumprod`: running products along `dim` (integers and bools as i64).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[4]);
    /// assert_eq!(x.cumprod(0).to_vec::<i64>().unwrap(), vec![1, 2, 6, 24]);
    /// ```
    #[track_caller]
    pub fn cumprod(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_cumprod(dim))
    }

    /// Fallible [`Tensor::cumprod`].
    pub fn try_cumprod(&self, dim: isize) -> Result<Tensor> {
        self.scan(ScanOp::Prod, dim)
    }

    fn scan(&self, op: ScanOp, dim: isize) -> Result<Tensor> {
        // A 0-d tensor scans as one element (PyTorch accepts dim 0 and -1).
        if self.ndim() == 0 {
            normalize_axis(op.name(), dim, &[1])?;
            return self.try_reshape([1])?.scan(op, 0)?.try_reshape(());
        }
        let axis = normalize_axis(op.name(), dim, self.shape())?;
        let dtype = if self.dtype().is_float() {
            self.dtype()
        } else {
            DType::I64
        };
        let x = self.try_cast(dtype)?;
        Tensor::record(
            Op::Scan { op, axis },
            &[&x],
            self.shape().to_vec(),
            dtype,
            self.device(),
        )
    }

    /// A scan along an already-normalized axis of a tensor of the result's dtype (autograd).
    pub(crate) fn scan_axis(&self, op: ScanOp, axis: usize) -> Result<Tensor> {
        Tensor::record(
            Op::Scan { op, axis },
            &[self],
            self.shape().to_vec(),
            self.dtype(),
            self.device(),
        )
    }
}
