//! Order statistics from a sort: PyTorch's `median`, `quantile`, `kthvalue` and `mode`. Each sorts the lane
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

/// PyTorch's `lerp(a, b, w)` as its quantile uses it: `a + w·(b - a)` below `w = ½`,
/// `b - (b - a)·(1 - w)` from there (so the same bits as PyTorch, and NaN where `a` and `b`
/// are the same infinity, as PyTorch's `quantile` gives there).
fn lerp(a: &Tensor, b: &Tensor, w: f64) -> Result<Tensor> {
    let d = b.try_sub(a)?;
    if w < 0.5 {
        a.try_add(&d.try_mul(w)?)
    } else {
        b.try_sub(&d.try_mul(1.0 - w)?)
    }
}

/// [`lerp`] with a weight per lane (`w`, of the values' dtype).
fn lerp_tensor(a: &Tensor, b: &Tensor, w: &Tensor) -> Result<Tensor> {
    let d = b.try_sub(a)?;
    let low = a.try_add(&d.try_mul(w)?)?;
    let high = b.try_sub(&d.try_mul(&w.try_rsub(1.0)?)?)?;
    Tensor::try_where(&w.try_lt(0.5)?, &low, &high)
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

    /// The dimension a value-and-index reduction takes `what` along (`None` for a 0-d
    /// tensor, after checking `dim` as PyTorch does: it is its own lane); an empty lane is
    /// an error naming `op`.
    fn value_lane(&self, op: &'static str, dim: isize, what: &str) -> Result<Option<usize>> {
        if self.ndim() == 0 {
            normalize_axis(op, dim, &[1])?;
            return Ok(None);
        }
        let d = normalize_axis(op, dim, &self.shape)?;
        if self.shape[d] == 0 {
            return Err(KilnError::InvalidArgument {
                op,
                shape: self.shape.clone(),
                reason: format!("dimension {dim} has no elements to take {what} of"),
            });
        }
        Ok(Some(d))
    }

    /// A 0-d tensor's value-and-index reduction: a copy of itself at index 0.
    pub(super) fn own_pick(&self) -> Result<(Tensor, Tensor)> {
        let idx = Tensor::try_full_on((), 0, DType::I64, self.device)?;
        Ok((self.try_copy()?, idx))
    }

    /// PyTorch's `mode(dim, keepdim)`: the most frequent value along `dim` and the i64
    /// index of its last occurrence. Where several values are equally frequent, the
    /// smallest wins, as on PyTorch's CPU. Each NaN counts as its own value (as in
    /// [`Tensor::unique`]), so a NaN is the mode only of a lane of NaNs. PyTorch documents
    /// the index only as "the index location" and its CPU kernel does not always return
    /// the last one (its issue 129303); kiln always does. The gradient goes to that
    /// element. Lazy: one stable sort per lane, a scan and a few gathers, no read-back.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 3, 2, 5, 5, 4, 4, 4], [2, 5]);
    /// let (v, i) = x.mode(1, false);
    /// assert_eq!(v.to_vec::<i64>().unwrap(), vec![2, 4]);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![4, 4]);
    /// ```
    #[track_caller]
    pub fn mode(&self, dim: isize, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_mode(dim, keepdim))
    }

    /// Fallible [`Tensor::mode`].
    pub fn try_mode(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let Some(d) = self.value_lane("mode", dim, "a mode")? else {
            return self.own_pick();
        };
        let n = self.shape[d];
        let axis = d as isize;
        let (sorted, order) = self.try_sort(axis, false)?;
        let mut one = self.shape.clone();
        one[d] = 1;
        let edge = Tensor::try_full_on(one.as_slice(), true, DType::Bool, self.device)?;
        // `differs[j]`: sorted elements j and j + 1 differ (NaN differs from everything),
        // so a run of equal values starts after each and ends at each.
        let differs = sorted
            .try_narrow(axis, 1, n - 1)?
            .try_ne(&sorted.try_narrow(axis, 0, n - 1)?)?;
        let starts = Tensor::try_cat(&[&edge, &differs], axis)?;
        let ends = Tensor::try_cat(&[&differs, &edge], axis)?;
        // Each position's run number, each run's length, and that length at the run's last
        // position (0 elsewhere).
        let run = starts.try_cast(DType::I64)?.try_cumsum(axis)?.try_sub(1)?;
        let lengths = Tensor::try_full_on(self.shape.as_slice(), 0i64, DType::I64, self.device)?
            .try_scatter_add(
                axis,
                &run,
                &Tensor::try_full_on(self.shape.as_slice(), 1i64, DType::I64, self.device)?,
            )?;
        let at_ends = Tensor::try_where(&ends, &lengths.try_gather(axis, &run)?, 0i64)?;
        // The first longest run is the smallest value; its last position holds the largest
        // original index (the sort is stable).
        let pos = at_ends.try_argmax_keepdim(axis)?;
        let (v, i) = (
            sorted.try_gather(axis, &pos)?,
            order.try_gather(axis, &pos)?,
        );
        if keepdim {
            Ok((v, i))
        } else {
            Ok((v.try_squeeze_dim(axis)?, i.try_squeeze_dim(axis)?))
        }
    }

    /// PyTorch's `kthvalue(k, dim, keepdim)`: the `k`-th smallest element along `dim`
    /// (`k` from 1) and its i64 index; NaN sorts above every number. Among equal values the
    /// index is the one a stable sort puts at rank `k` (PyTorch documents no choice). The
    /// gradient goes to that element.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, 1.0, 2.0, 9.0, 7.0, 8.0], [2, 3]);
    /// let (v, i) = x.kthvalue(2, 1, false);
    /// assert_eq!(v.to_vec::<f32>().unwrap(), vec![2.0, 8.0]);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![2, 2]);
    /// ```
    #[track_caller]
    pub fn kthvalue(&self, k: usize, dim: isize, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_kthvalue(k, dim, keepdim))
    }

    /// Fallible [`Tensor::kthvalue`].
    pub fn try_kthvalue(&self, k: usize, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let axis = self.value_lane("kthvalue", dim, "a k-th value")?;
        let lane = axis.map_or(1, |d| self.shape[d]);
        if k == 0 || k > lane {
            return Err(KilnError::InvalidArgument {
                op: "kthvalue",
                shape: self.shape.clone(),
                reason: format!("k ({k}) must be in 1..={lane}, the length of dimension {dim}"),
            });
        }
        let Some(d) = axis else {
            return self.own_pick();
        };
        let axis = d as isize;
        let (sorted, order) = self.try_sort(axis, false)?;
        let (v, i) = (
            sorted.try_narrow(axis, k as isize - 1, 1)?,
            order.try_narrow(axis, k as isize - 1, 1)?,
        );
        if keepdim {
            Ok((v, i))
        } else {
            Ok((v.try_squeeze_dim(axis)?, i.try_squeeze_dim(axis)?))
        }
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
        self.lower_median("median", dim, keepdim, false)
    }

    /// The lower median along `dim` and its index: of the whole lane (a NaN in it wins), or
    /// of its numbers alone (`skip_nan`).
    fn lower_median(
        &self,
        op: &'static str,
        dim: isize,
        keepdim: bool,
        skip_nan: bool,
    ) -> Result<(Tensor, Tensor)> {
        let Some(d) = self.value_lane(op, dim, "a median")? else {
            return self.own_pick();
        };
        let n = self.shape[d];
        let (sorted, order) = self.try_sort(dim, false)?;
        let middle = ((n - 1) / 2) as i64;
        let pos = if !self.dtype.is_float() {
            let mut shape = self.shape.clone();
            shape[d] = 1;
            Tensor::try_full_on(shape, middle, DType::I64, self.device)?
        } else if skip_nan {
            // NaN sorts last: the `k` numbers come first, their lower median at
            // `(k - 1) / 2`; a lane of NaNs (k = 0) takes position 0, a NaN.
            let k = self.try_isnan()?.try_logical_not()?.try_sum_keepdim(dim)?;
            k.try_sub(1)?.try_clamp(0, n as i64)?.try_floor_divide(2)?
        } else {
            // A lane with `k` NaNs has its first at position `n - k`.
            let nans = self.try_isnan()?.try_sum_keepdim(dim)?;
            Tensor::try_where(&nans.try_gt(0)?, &nans.try_rsub(n as i64)?, middle)?
        };
        let (v, i) = (sorted.try_gather(dim, &pos)?, order.try_gather(dim, &pos)?);
        if keepdim {
            Ok((v, i))
        } else {
            Ok((v.try_squeeze_dim(dim)?, i.try_squeeze_dim(dim)?))
        }
    }

    /// PyTorch's `nanmedian()`: the lower median of the elements that are not NaN (NaN
    /// when all are, or there are none), as a 0-d tensor.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![4.0f32, f32::NAN, 1.0, 3.0], &[4]);
    /// assert_eq!(x.nanmedian().item::<f32>().unwrap(), 3.0);
    /// ```
    #[track_caller]
    pub fn nanmedian(&self) -> Tensor {
        unwrap_or_panic(self.try_nanmedian())
    }

    /// Fallible [`Tensor::nanmedian`].
    pub fn try_nanmedian(&self) -> Result<Tensor> {
        if !self.dtype.is_float() {
            // No NaN to skip: the median.
            return self.try_median();
        }
        if self.numel() == 0 {
            return Tensor::try_full_on((), f64::NAN, self.dtype, self.device);
        }
        let (v, _) = self.try_reshape([-1])?.try_nanmedian_dim(0, false)?;
        Ok(v)
    }

    /// PyTorch's `nanmedian(dim, keepdim)`: the lower median of each lane's elements that
    /// are not NaN (the element at position `(k - 1) / 2` of the `k` in sorted order) and
    /// its i64 index. A lane of NaNs only gives NaN and the index of one of them (PyTorch
    /// documents none; kiln's is that of its first). Integer lanes have no NaN: the median.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, f32::NAN, 1.0, 4.0, 2.0, 5.0, f32::NAN, f32::NAN], &[2, 4]);
    /// let (v, i) = x.nanmedian_dim(1, false);
    /// assert_eq!(v.to_vec::<f32>().unwrap(), vec![3.0, 2.0]);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 0]);
    /// ```
    #[track_caller]
    pub fn nanmedian_dim(&self, dim: isize, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_nanmedian_dim(dim, keepdim))
    }

    /// Fallible [`Tensor::nanmedian_dim`].
    pub fn try_nanmedian_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.lower_median("nanmedian", dim, keepdim, true)
    }

    /// PyTorch's `nanquantile(input, q, dim, keepdim, interpolation)` for one `q`:
    /// [`Tensor::quantile`] over each lane's elements that are not NaN (NaN for a lane of
    /// NaNs only). The rank `q·(k - 1)` among the `k` others is computed in the values'
    /// dtype, as PyTorch computes it.
    ///
    /// ```
    /// use kiln::{QuantileInterpolation, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, f32::NAN, 7.0], &[4]);
    /// let q = x.nanquantile(0.5, None, false, QuantileInterpolation::Linear);
    /// assert_eq!(q.item::<f32>().unwrap(), 2.0);
    /// ```
    #[track_caller]
    pub fn nanquantile(
        &self,
        q: f64,
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
    ) -> Tensor {
        unwrap_or_panic(self.try_nanquantile(q, dim, keepdim, interpolation))
    }

    /// Fallible [`Tensor::nanquantile`].
    pub fn try_nanquantile(
        &self,
        q: f64,
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
    ) -> Result<Tensor> {
        let all = self.try_nanquantiles(&[q], dim, keepdim, interpolation)?;
        all.try_squeeze_dim(0)
    }

    /// PyTorch's `nanquantile` with a 1-D `q`: [`Tensor::nanquantile`] for each of `qs`,
    /// stacked along a new first dimension.
    #[track_caller]
    pub fn nanquantiles(
        &self,
        qs: &[f64],
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
    ) -> Tensor {
        unwrap_or_panic(self.try_nanquantiles(qs, dim, keepdim, interpolation))
    }

    /// Fallible [`Tensor::nanquantiles`].
    pub fn try_nanquantiles(
        &self,
        qs: &[f64],
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
    ) -> Result<Tensor> {
        self.order_statistics("nanquantile", qs, dim, keepdim, interpolation, true)
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
        self.order_statistics("quantile", qs, dim, keepdim, interpolation, false)
    }

    /// `quantiles` (`skip_nan = false`: a lane holding a NaN gives NaN) or `nanquantiles`
    /// (`skip_nan = true`: the quantiles of the lane's other elements).
    fn order_statistics(
        &self,
        op: &'static str,
        qs: &[f64],
        dim: Option<isize>,
        keepdim: bool,
        interpolation: QuantileInterpolation,
        skip_nan: bool,
    ) -> Result<Tensor> {
        let refuse = |reason: String| KilnError::InvalidArgument {
            op,
            shape: self.shape.clone(),
            reason,
        };
        if !self.dtype.is_float() {
            return Err(KilnError::UnsupportedDType {
                op,
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
            Some(dim) if self.ndim() > 0 => (self.clone(), normalize_axis(op, dim, &self.shape)?),
            Some(dim) => {
                normalize_axis(op, dim, &[1])?;
                (self.try_reshape([1])?, 0)
            }
            None => (self.try_reshape([-1])?, 0),
        };
        let n = x.shape[d];
        if n == 0 {
            return Err(refuse("the input must not be empty".into()));
        }
        let (sorted, _) = x.try_sort(d as isize, false)?;
        let mut values = Vec::with_capacity(qs.len());
        if skip_nan {
            // Ranks per lane among its `k` elements that are not NaN (sorted first), in
            // the values' dtype; positions clamped into the lane, and a lane of NaNs only
            // (k = 0) reads a NaN.
            let rank_dtype = if x.dtype.is_half() {
                DType::F32
            } else {
                x.dtype
            };
            let k = x
                .try_isnan()?
                .try_logical_not()?
                .try_sum_keepdim(d as isize)?
                .try_cast(rank_dtype)?;
            let last = (n - 1) as i64;
            let no_numbers = k.try_eq(0)?;
            let at = |pos: &Tensor| -> Result<Tensor> {
                let p = pos.try_cast(DType::I64)?.try_clamp(0, last)?;
                sorted.try_gather(d as isize, &p)
            };
            for &q in qs {
                let rank = k.try_sub(1.0)?.try_mul(q)?.try_clamp_min(0.0)?;
                let (lo, hi) = (rank.try_floor()?, rank.try_ceil()?);
                let v = match interpolation {
                    QuantileInterpolation::Lower => at(&lo)?,
                    QuantileInterpolation::Higher => at(&hi)?,
                    QuantileInterpolation::Nearest => at(&rank.try_round()?)?,
                    QuantileInterpolation::Linear => {
                        let w = rank.try_sub(&lo)?.try_cast(x.dtype)?;
                        lerp_tensor(&at(&lo)?, &at(&hi)?, &w)?
                    }
                    QuantileInterpolation::Midpoint => lerp(&at(&lo)?, &at(&hi)?, 0.5)?,
                };
                values.push(Tensor::try_where(&no_numbers, f64::NAN, &v)?);
            }
        } else {
            // The same ranks in every lane, known when recorded; a lane holding a NaN
            // gives NaN.
            let lane_has_nan = x.try_isnan()?.try_any_keepdim(d as isize)?;
            let at = |pos: usize| sorted.try_narrow(d as isize, pos as isize, 1);
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
                        lerp(&at(lo)?, &at(hi)?, w)?
                    }
                };
                values.push(Tensor::try_where(&lane_has_nan, f64::NAN, &v)?);
            }
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
