//! Running totals along one axis: `cumsum` and `cumprod`, each one scan kernel (linear
//! work per lane, lanes in parallel); `cummax`, `cummin` and `logcumsumexp` as
//! compositions: a prefix scan in `⌈log₂ n⌉` doubling steps (each element combined with
//! the one `k` before it, `k = 1, 2, 4, …`) of elementwise ops over shifted views, so
//! they fuse, differentiate through their parts and run on every device.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
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

/// Which running extreme [`Tensor::cummax`] / [`Tensor::cummin`] keeps.
#[derive(Clone, Copy)]
enum Extreme {
    Max,
    Min,
}

impl Tensor {
    /// PyTorch's `cummax(dim)` → `(values, indices)`: the running maximum along `dim` and
    /// the i64 index it came from. As PyTorch's kernel: a later element equal to the
    /// running maximum takes over its index, and a NaN takes over and stays (later NaNs
    /// take the index). The gradient goes to the indexed elements.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 2.0, 3.0, 0.0], [5]);
    /// let (v, i) = x.cummax(0);
    /// assert_eq!(v.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 3.0, 3.0, 3.0]);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 1, 1, 3, 3]);
    /// ```
    #[track_caller]
    pub fn cummax(&self, dim: isize) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_cummax(dim))
    }

    /// Fallible [`Tensor::cummax`].
    pub fn try_cummax(&self, dim: isize) -> Result<(Tensor, Tensor)> {
        self.running_extreme("cummax", dim, Extreme::Max)
    }

    /// PyTorch's `cummin(dim)` → `(values, indices)`: as [`Tensor::cummax`] for the
    /// running minimum.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![4i64, 2, 5, 2], [4]);
    /// let (v, i) = x.cummin(0);
    /// assert_eq!(v.to_vec::<i64>().unwrap(), vec![4, 2, 2, 2]);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 1, 1, 3]);
    /// ```
    #[track_caller]
    pub fn cummin(&self, dim: isize) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_cummin(dim))
    }

    /// Fallible [`Tensor::cummin`].
    pub fn try_cummin(&self, dim: isize) -> Result<(Tensor, Tensor)> {
        self.running_extreme("cummin", dim, Extreme::Min)
    }

    /// PyTorch's `logcumsumexp(dim)`: `log Σ_{j ≤ i} exp(x_j)` along `dim`, without overflow
    /// or underflow (each doubling step is a [`Tensor::logaddexp`]), float dtypes.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f64, 0.0, 1000.0, -1000.0], [4]);
    /// let y = x.logcumsumexp(0).to_vec::<f64>().unwrap();
    /// assert_eq!((y[0], y[2], y[3]), (0.0, 1000.0, 1000.0));
    /// assert!((y[1] - std::f64::consts::LN_2).abs() < 1e-15);
    /// ```
    #[track_caller]
    pub fn logcumsumexp(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_logcumsumexp(dim))
    }

    /// Fallible [`Tensor::logcumsumexp`].
    pub fn try_logcumsumexp(&self, dim: isize) -> Result<Tensor> {
        if !self.dtype.is_float() {
            return Err(KilnError::UnsupportedDType {
                op: "logcumsumexp",
                dtype: self.dtype,
                detail: ": logcumsumexp needs a float tensor".into(),
            });
        }
        let Some(d) = self.running_axis("logcumsumexp", dim)? else {
            return self.try_copy();
        };
        let n = self.shape[d];
        let position = self.positions_along(d)?;
        let mut y = self.unchanged()?;
        let mut k = 1;
        while k < n {
            // Positions before k have no partner: logaddexp with -inf leaves them.
            let partner = Tensor::try_where(
                &position.try_lt(k as i64)?,
                f64::NEG_INFINITY,
                &shifted(&y, d, k)?,
            )?;
            y = y.try_logaddexp(&partner)?;
            k *= 2;
        }
        Ok(y)
    }

    /// The dimension a scan runs along; `None` for a 0-d tensor (after checking `dim`),
    /// which is its own running result.
    fn running_axis(&self, op: &'static str, dim: isize) -> Result<Option<usize>> {
        if self.ndim() == 0 {
            normalize_axis(op, dim, &[1])?;
            return Ok(None);
        }
        Ok(Some(normalize_axis(op, dim, &self.shape)?))
    }

    /// `0..n` (i64) laid along dimension `d` of this tensor's rank (size 1 elsewhere).
    fn positions_along(&self, d: usize) -> Result<Tensor> {
        let n = self.shape[d];
        let mut along = vec![1isize; self.ndim()];
        along[d] = n as isize;
        Tensor::try_arange(0, n as i64, 1, DType::I64)?
            .try_to(self.device)?
            .try_reshape(along)
    }

    /// The running maximum or minimum and its index (see [`Tensor::cummax`]).
    fn running_extreme(
        &self,
        op: &'static str,
        dim: isize,
        which: Extreme,
    ) -> Result<(Tensor, Tensor)> {
        if self.dtype == DType::Bool {
            return Err(KilnError::UnsupportedDType {
                op,
                dtype: self.dtype,
                detail: ": cast bools to an integer type first".into(),
            });
        }
        let Some(d) = self.running_axis(op, dim)? else {
            return self.own_pick();
        };
        let n = self.shape[d];
        let x = self.detach();
        let position = self.positions_along(d)?;
        let mut idx = position.try_broadcast_to(x.shape())?;
        let mut val = x.unchanged()?;
        let float = x.dtype.is_float();
        let mut k = 1;
        while k < n {
            let head = position.try_lt(k as i64)?;
            let (prev_val, prev_idx) = (shifted(&val, d, k)?, shifted(&idx, d, k)?);
            // The later summary wins on a NaN, on a tie or a better value, unless the
            // earlier one holds a NaN; positions below k have no earlier partner.
            let better = match which {
                Extreme::Max => val.try_ge(&prev_val)?,
                Extreme::Min => val.try_le(&prev_val)?,
            };
            let later = if float {
                better
                    .try_logical_and(&prev_val.try_isnan()?.try_logical_not()?)?
                    .try_logical_or(&val.try_isnan()?)?
            } else {
                better
            };
            let later = later.try_logical_or(&head)?;
            val = Tensor::try_where(&later, &val, &prev_val)?;
            idx = Tensor::try_where(&later, &idx, &prev_idx)?;
            k *= 2;
        }
        // The values are read back through the indices, so the gradient reaches them.
        Ok((self.try_gather(d as isize, &idx)?, idx))
    }
}

/// `y` shifted `k` places later along `d` for a doubling step (its first `k` positions
/// keep `y`'s own first ones, for the caller to mask out).
fn shifted(y: &Tensor, d: usize, k: usize) -> Result<Tensor> {
    let n = y.shape[d];
    Tensor::try_cat(
        &[
            &y.try_narrow(d as isize, 0, k)?,
            &y.try_narrow(d as isize, 0, n - k)?,
        ],
        d as isize,
    )
}
