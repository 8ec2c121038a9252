//! Order statistics from a sort: PyTorch's `median` and `quantile`. Each sorts the lane
//! (one stable `argsort`), then gathers the wanted positions, so the gradient reaches the
//! chosen elements (split between the two neighbours of an interpolated quantile) and the
//! gathers fuse into their consumers. A lane holding a NaN gives NaN, as PyTorch's does.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::shape::normalize_axis;

/// How [`Tensor::quantile`] picks a value when a quantile's rank `q·(n - 1)` falls between
/// two sorted elements `a ≤ b` (PyTorch's `interpolation=` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantileInterpolation {
    /// `a + (b - a)·frac` (PyTorch's default).
    #[default]
    Linear,
    /// `a`.
    Lower,
    /// `b`.
    Higher,
    /// The element at the rank rounded half to even (PyTorch rounds so).
    Nearest,
    /// `(a + b) / 2`.
    Midpoint,
}

impl Tensor {
    /// PyTorch's `median()`: the lower median of all elements (the element at position
    /// `(n - 1) / 2` in sorted order) as a 0-d tensor; NaN if any element is NaN or there
    /// are none.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![4.0f32, 1.0, 3.0, 2.0], &[2, 2]);
    /// assert_eq!(x.median().item::<f32>().unwrap(), 2.0);
    /// ```
    #[track_caller]
    pub fn median(&self) -> Tensor {
        unwrap_or_panic(self.try_median())
    }

    /// Fallible [`Tensor::median`].
    pub fn try_median(&self) -> Result<Tensor> {
        if self.numel() == 0 {
            if !self.dtype.is_float() {
                return Err(KilnError::InvalidArgument {
                    op: "median",
                    shape: self.shape.clone(),
                    reason: "the median of no integers is undefined (PyTorch's is NaN, a float)"
                        .into(),
                });
            }
            return Tensor::try_full_on((), f64::NAN, self.dtype, self.device);
        }
        let (v, _) = self.try_reshape([-1])?.try_median_dim(0, false)?;
        Ok(v)
    }

    /// PyTorch's `median(dim, keepdim)`: the lower median along `dim` and its i64 index.
    /// A lane holding a NaN gives NaN and the index of its first NaN, as PyTorch. Among
    /// equal medians the index is the one a stable sort puts in the middle; PyTorch's CPU
    /// kernel may return another of them (it documents no choice). The gradient goes to
    /// that element.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, f32::NAN, 1.0, 4.0, 1.0, 2.0], &[2, 3]);
    /// let (v, i) = x.median_dim(1, false);
    /// let v = v.to_vec::<f32>().unwrap();
    /// assert!(v[0].is_nan());
    /// assert_eq!(v[1], 2.0);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 2]);
    /// ```
    #[track_caller]
    pub fn median_dim(&self, dim: isize, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_median_dim(dim, keepdim))
    }

    /// Fallible [`Tensor::median_dim`].
    pub fn try_median_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        if self.ndim() == 0 {
            normalize_axis("median", dim, &[1])?;
            let idx = Tensor::try_full_on((), 0, DType::I64, self.device)?;
            return Ok((self.try_copy()?, idx));
        }
        let d = normalize_axis("median", dim, &self.shape)?;
        let n = self.shape[d];
        if n == 0 {
            return Err(KilnError::InvalidArgument {
                op: "median",
                shape: self.shape.clone(),
                reason: format!("dimension {dim} has no elements to take a median of"),
            });
        }
        let (sorted, order) = self.try_sort(dim, false)?;
        let middle = ((n - 1) / 2) as i64;
        // NaN sorts last: a lane with `k` NaNs has its first at position `n - k`.
        let pos = if self.dtype.is_float() {
            let nans = self.try_isnan()?.try_sum_keepdim(dim)?;
            Tensor::try_where(&nans.try_gt(0)?, &nans.try_rsub(n as i64)?, middle)?
        } else {
            let mut shape = self.shape.clone();
            shape[d] = 1;
            Tensor::try_full_on(shape, middle, DType::I64, self.device)?
        };
        let (v, i) = (sorted.try_gather(dim, &pos)?, order.try_gather(dim, &pos)?);
        if keepdim {
            Ok((v, i))
        } else {
            Ok((v.try_squeeze_dim(dim)?, i.try_squeeze_dim(dim)?))
        }
    }

    /// PyTorch's `quantile(input, q, dim, keepdim, interpolation)` for one `q` in
    /// `[0, 1]`: over all elements (a 0-d result) when `dim` is `None`, else along `dim`.
    /// The rank `q·(n - 1)` of the sorted lane picks a value by `interpolation`; a lane
    /// holding a NaN gives NaN. Float input only, lanes not empty (as PyTorch). The
    /// gradient goes to the one or two elements the value is taken from.
    ///
    /// ```
    /// use kiln::{QuantileInterpolation, Tensor};
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 10.0], &[5]);
    /// let q = x.quantile(0.875, None, false, QuantileInterpolation::Linear);
    /// assert_eq!(q.item::<f32>().unwrap(), 6.5);
    /// ```
    #[track_caller]
    pub fn quantile(
        &self,
        q: f64,
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
    ) -> Tensor {
        unwrap_or_panic(self.try_quantile(q, dim, keepdim, interpolation))
    }

    /// Fallible [`Tensor::quantile`].
    pub fn try_quantile(
        &self,
        q: f64,
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
    ) -> Result<Tensor> {
        let all = self.try_quantiles(&[q], dim, keepdim, interpolation)?;
        all.try_squeeze_dim(0)
    }

    /// PyTorch's `quantile` with a 1-D `q`: [`Tensor::quantile`] for each of `qs`, stacked
    /// along a new first dimension.
    ///
    /// ```
    /// use kiln::{QuantileInterpolation, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]);
    /// let q = x.quantiles(&[0.25, 0.5], None, false, QuantileInterpolation::Midpoint);
    /// assert_eq!(q.to_vec::<f32>().unwrap(), vec![1.5, 2.5]);
    /// ```
    #[track_caller]
    pub fn quantiles(
        &self,
        qs: &[f64],
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
    ) -> Tensor {
        unwrap_or_panic(self.try_quantiles(qs, dim, keepdim, interpolation))
    }

    /// Fallible [`Tensor::quantiles`].
    pub fn try_quantiles(
        &self,
        qs: &[f64],
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
    ) -> Result<Tensor> {
        let refuse = |reason: String| KilnError::InvalidArgument {
            op: "quantile",
            shape: self.shape.clone(),
            reason,
        };
        if !self.dtype.is_float() {
            return Err(KilnError::UnsupportedDType {
                op: "quantile",
                dtype: self.dtype,
                detail: ": the input must be float, as PyTorch requires".into(),
            });
        }
        if let Some(&bad) = qs.iter().find(|q| !(0.0..=1.0).contains(*q)) {
            return Err(refuse(format!("q must be in [0, 1], not {bad}")));
        }
        if qs.is_empty() {
            return Err(refuse("no quantiles asked for".into()));
        }
        // The lanes: `dim`, or everything flattened into one.
        let (x, d) = match dim {
            Some(dim) if self.ndim() > 0 => {
                (self.clone(), normalize_axis("quantile", dim, &self.shape)?)
            }
            Some(dim) => {
                normalize_axis("quantile", dim, &[1])?;
                (self.try_reshape([1])?, 0)
            }
            None => (self.try_reshape([-1])?, 0),
        };
        let n = x.shape[d];
        if n == 0 {
            return Err(refuse("the input must not be empty".into()));
        }
        let (sorted, _) = x.try_sort(d as isize, false)?;
        let lane_has_nan = x.try_isnan()?.try_any_keepdim(d as isize)?;
        let at = |pos: usize| sorted.try_narrow(d as isize, pos as isize, 1);
        let mut values = Vec::with_capacity(qs.len());
        for &q in qs {
            let rank = q * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            let v = match interpolation {
                QuantileInterpolation::Lower => at(lo)?,
                QuantileInterpolation::Higher => at(hi)?,
                QuantileInterpolation::Nearest => at(rank.round_ties_even() as usize)?,
                QuantileInterpolation::Linear | QuantileInterpolation::Midpoint => {
                    let w = if interpolation == QuantileInterpolation::Midpoint {
                        0.5
                    } else {
                        rank - lo as f64
                    };
                    let (a, b) = (at(lo)?, at(hi)?);
                    if lo == hi {
                        a
                    } else {
                        a.try_add(&b.try_sub(&a)?.try_mul(w)?)?
                    }
                }
            };
            values.push(Tensor::try_where(&lane_has_nan, f64::NAN, &v)?);
        }
        let refs: Vec<&Tensor> = values.iter().collect();
        let out = Tensor::try_stack(&refs, 0)?;
        // `out` is `[q, ..lanes with dim kept as 1..]`.
        match dim {
            Some(_) if keepdim && self.ndim() > 0 => Ok(out),
            Some(_) if self.ndim() > 0 => out.try_squeeze_dim(d as isize + 1),
            Some(_) => out.try_reshape([qs.len()]),
            None if keepdim => {
                let mut shape = vec![qs.len()];
                shape.extend(std::iter::repeat_n(1, self.ndim()));
                out.try_reshape(shape)
            }
            None => out.try_reshape([qs.len()]),
        }
    }
}
