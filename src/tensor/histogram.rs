//! Counting values into bins: PyTorch's `bincount` and `histc`.
//!
//! Both end in one `scatter_add` of ones (or weights) into a zero tensor of bins, so they
//! run on every device through the existing kernels. `bincount`'s length depends on the
//! largest value, so it realizes its input when called; `histc` realizes only its range,
//! and only when that comes from the data (`min == max`), as PyTorch reads it.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};

impl Tensor {
    /// PyTorch's `bincount(weights, minlength)`: how often each value `0..=max` occurs in
    /// this 1-d tensor of non-negative integers (`out[x[i]] += 1`), or the sum of `weights`
    /// (`out[x[i]] += weights[i]`). The length is `max(x.max() + 1, minlength)`, so the input
    /// is realized when called. PyTorch's dtypes: i64 counts, f32 sums for f32 weights and
    /// f64 sums for any other weights; an empty input gives `minlength` i64 zeros. A
    /// negative value, a bool or float input, or weights of another shape fail, naming
    /// them. Gradients reach `weights` (PyTorch has no derivative for it).
    ///
    /// ```
    /// use kiln::{DType, Tensor};
    /// let x = Tensor::from_vec(vec![4i64, 3, 6, 3, 4], [5]);
    /// assert_eq!(x.bincount(None, 0).to_vec::<i64>().unwrap(), vec![0, 0, 0, 2, 2, 0, 1]);
    /// let w = Tensor::linspace(0.0, 1.0, 5, DType::F32);
    /// assert_eq!(
    ///     x.bincount(Some(&w), 0).to_vec::<f32>().unwrap(),
    ///     vec![0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5]
    /// );
    /// ```
    #[track_caller]
    pub fn bincount(&self, weights: Option<&Tensor>, minlength: usize) -> Tensor {
        unwrap_or_panic(self.try_bincount(weights, minlength))
    }

    /// Fallible [`Tensor::bincount`].
    pub fn try_bincount(&self, weights: Option<&Tensor>, minlength: usize) -> Result<Tensor> {
        const OP: &str = "bincount";
        if !self.dtype.is_int() || self.dtype == DType::Bool {
            return Err(KilnError::UnsupportedDType {
                op: OP,
                dtype: self.dtype,
                detail: ": it counts integers".into(),
            });
        }
        if self.ndim() != 1 {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: self.shape.to_vec(),
                reason: "bincount only supports 1-d non-negative integral inputs".into(),
            });
        }
        let out = match weights {
            None => DType::I64,
            Some(w) => {
                if w.shape() != self.shape() {
                    return Err(KilnError::ShapeMismatch {
                        op: OP,
                        lhs: self.shape.to_vec(),
                        rhs: w.shape().to_vec(),
                        detail: ": weights must be 1-d and as long as the input".into(),
                    });
                }
                if w.device() != self.device() {
                    return Err(KilnError::DeviceMismatch {
                        op: OP,
                        lhs: self.device(),
                        rhs: w.device(),
                    });
                }
                if w.dtype() == DType::F32 {
                    DType::F32
                } else {
                    DType::F64
                }
            }
        };
        if self.numel() == 0 {
            return Tensor::try_full_on([minlength], 0i64, DType::I64, self.device());
        }
        let x = self.try_cast(DType::I64)?;
        x.realize()?;
        let (lo, hi) = x.try_aminmax(.., false)?;
        let (lo, hi) = (lo.item::<i64>()?, hi.item::<i64>()?);
        if lo < 0 {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: self.shape.to_vec(),
                reason: format!(
                    "bincount only supports 1-d non-negative integral inputs; found {lo}"
                ),
            });
        }
        let len = (hi as usize + 1).max(minlength);
        let src = match weights {
            Some(w) => w.try_cast(out)?,
            None => Tensor::try_full_on(self.shape(), 1i64, DType::I64, self.device())?,
        };
        Tensor::try_full_on([len], 0i64, out, self.device())?.try_scatter_add(0, &x, &src)
    }

    /// PyTorch's `histc(bins, min, max)`: a histogram of this float tensor's elements in
    /// `bins` equal bins from `min` to `max`, of this tensor's dtype and shape `[bins]`.
    /// Elements outside `[min, max]` (and NaN) are not counted; the last bin includes `max`.
    /// When `min == max` the range is the data's own (realized when called), widened by 1
    /// on each side if that is a single value. A bin is found as PyTorch's does: estimated
    /// from `(x - min)·bins / (max - min)`, then settled against the bin edges
    /// (`linspace(min, max, bins + 1)` in the dtype), so an element on an edge goes to the
    /// bin that edge starts. f16/bf16 are counted in f32. A non-finite range, `min > max`
    /// or `bins = 0` fail, as in PyTorch.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 1.0], [3]);
    /// assert_eq!(x.histc(4, 0.0, 3.0).to_vec::<f32>().unwrap(), vec![0.0, 2.0, 1.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn histc(&self, bins: usize, min: f64, max: f64) -> Tensor {
        unwrap_or_panic(self.try_histc(bins, min, max))
    }

    /// Fallible [`Tensor::histc`].
    pub fn try_histc(&self, bins: usize, min: f64, max: f64) -> Result<Tensor> {
        const OP: &str = "histc";
        if !self.dtype.is_float() {
            return Err(KilnError::UnsupportedDType {
                op: OP,
                dtype: self.dtype,
                detail: ": it takes float tensors, as PyTorch's does".into(),
            });
        }
        let refuse = |reason: String| KilnError::InvalidArgument {
            op: OP,
            shape: self.shape.to_vec(),
            reason,
        };
        if bins == 0 {
            return Err(refuse("bins must be > 0".into()));
        }
        let (mut lo, mut hi) = (min, max);
        if lo == hi && self.numel() > 0 {
            let (a, b) = self.try_aminmax(.., false)?;
            (lo, hi) = (a.item::<f64>()?, b.item::<f64>()?);
        }
        if lo == hi {
            (lo, hi) = (lo - 1.0, hi + 1.0);
        }
        if !lo.is_finite() || !hi.is_finite() {
            return Err(refuse(format!("range of [{lo}, {hi}] is not finite")));
        }
        if lo >= hi {
            return Err(refuse(format!(
                "max must be larger than min (min {lo}, max {hi})"
            )));
        }
        let c = if self.dtype.is_half() {
            DType::F32
        } else {
            self.dtype
        };
        // The edges in the compute dtype, on the host: the first and last bound the range.
        let edges = Tensor::try_linspace(lo, hi, bins + 1, c)?;
        let values = edges.try_cast(DType::F64)?.to_vec::<f64>()?;
        let (left, right) = (values[0], values[bins]);
        let edges = edges.try_to(self.device())?;
        let x = self.try_reshape([-1])?.try_cast(c)?;
        let inside = x.try_ge(left)?.try_logical_and(&x.try_le(right)?)?;
        let x = Tensor::try_where(&inside, &x, left)?;
        // The estimate is within one bin; count the edges at or below x among the three
        // around it (PyTorch's local search), so an element on an edge starts that bin.
        let guess = x
            .try_sub(left)?
            .try_mul(bins as f64)?
            .try_div(right - left)?
            .try_cast(DType::I64)?;
        let mut pos = guess
            .try_sub(1i64)?
            .try_clamp(0i64, i64::MAX)?
            .try_sub(1i64)?;
        for step in [-1i64, 0, 1] {
            let k = guess.try_add(step)?;
            let real = k.try_ge(0i64)?.try_logical_and(&k.try_le(bins as i64)?)?;
            let edge = edges.try_gather(0, &k.try_clamp(0i64, bins as i64)?)?;
            let below = real.try_logical_and(&edge.try_le(&x)?)?;
            pos = pos.try_add(&below.try_cast(DType::I64)?)?;
        }
        // The last bin includes its right edge.
        let pos = pos.try_clamp(0i64, bins as i64 - 1)?;
        Tensor::try_full_on([bins], 0.0, c, self.device())?
            .try_scatter_add(0, &pos, &inside.try_cast(c)?)?
            .try_cast(self.dtype)
    }
}
