//! Reductions and the composites built from them (mean, var, softmax, log_softmax,
//! layer_norm). Composites are plain primitive ops, so the planner can fuse each into one
//! kernel.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::graph::{Op, ReduceOp};
use crate::shape::{Axes, axis_list, normalize_axes, normalize_axis, numel};

impl Tensor {
    fn reduce(&self, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let name = op.name();
        if self.ndim() == 0 && !axes.is_empty() {
            // As in PyTorch, a 0-d tensor reduces over "dimension 0 or -1" as if it had one
            // dimension of size 1: the result is the value itself (0-d, keepdim or not).
            normalize_axes(name, axes, &[1])?;
            return self.try_reshape([1])?.reduce(op, &[0], false);
        }
        let axes: Vec<usize> = if axes.is_empty() {
            (0..self.ndim()).collect()
        } else {
            normalize_axes(name, axes, &self.shape)?
        };
        if !op.has_identity()
            && let Some(&d) = axes.iter().find(|&&a| self.shape[a] == 0)
        {
            return Err(KilnError::InvalidArgument {
                op: name,
                shape: self.shape.clone(),
                reason: format!(
                    "dimension {d} has size 0, and {name} of no elements is undefined (it has no identity; sum and prod do)"
                ),
            });
        }
        let x = match op {
            ReduceOp::Sum | ReduceOp::Prod if !self.dtype.is_float() => {
                self.try_cast(DType::I64)?
            }
            _ => self.clone(),
        };
        let out_dtype = if op.is_arg() { DType::I64 } else { x.dtype };
        let mut keep_shape = x.shape.clone();
        for &a in &axes {
            keep_shape[a] = 1;
        }
        let r = if axes.is_empty() {
            if op.is_arg() {
                Tensor::try_full_on(&x.shape, 0, DType::I64, x.device)?
            } else {
                // A reduction over no axes (of a 0-d tensor) is still a new tensor.
                self.unless_self(x)?
            }
        } else {
            Tensor::record(
                Op::Reduce {
                    op,
                    axes: axes.clone(),
                },
                &[&x],
                keep_shape,
                out_dtype,
                x.device,
            )?
        };
        if keepdim {
            return Ok(r);
        }
        let out: Vec<isize> = r
            .shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &n)| n as isize)
            .collect();
        r.try_reshape(&out)
    }

    fn float_only(&self, op: &'static str) -> Result<()> {
        if self.dtype.is_float() {
            Ok(())
        } else {
            Err(KilnError::UnsupportedDType {
                op,
                dtype: self.dtype,
                detail: ": needs a float dtype (cast first)".into(),
            })
        }
    }
}

/// Generates the four public forms of a reduction from `fn(&Tensor, &[isize], keepdim)`:
/// `name(axes)`, `name_keepdim(axes)` and their `try_` forms. `axes` is anything
/// [`Axes`] accepts (`1`, `[0, 2]`, `..` for every axis).
macro_rules! axes_api {
    ($($name:ident, $keep:ident, $try_name:ident, $try_keep:ident, $imp:path, $doc:literal;)*) => {
        impl Tensor {
            $(
                #[doc = $doc]
                #[doc = ""]
                #[doc = concat!("`axes`: one axis, several (negative ones count from the end), or `..` for all. [`Tensor::", stringify!($keep), "`] keeps the reduced axes with size 1.")]
                #[track_caller]
                pub fn $name(&self, axes: impl Axes) -> Tensor {
                    unwrap_or_panic(self.$try_name(axes))
                }

                #[doc = concat!("[`Tensor::", stringify!($name), "`] keeping the reduced axes with size 1.")]
                #[track_caller]
                pub fn $keep(&self, axes: impl Axes) -> Tensor {
                    unwrap_or_panic(self.$try_keep(axes))
                }

                #[doc = concat!("Fallible [`Tensor::", stringify!($name), "`].")]
                pub fn $try_name(&self, axes: impl Axes) -> Result<Tensor> {
                    $imp(self, &axis_list(&axes).unwrap_or_default(), false)
                }

                #[doc = concat!("Fallible [`Tensor::", stringify!($keep), "`].")]
                pub fn $try_keep(&self, axes: impl Axes) -> Result<Tensor> {
                    $imp(self, &axis_list(&axes).unwrap_or_default(), true)
                }
            )*
        }
    };
}

impl Tensor {
    fn sum_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }

    fn prod_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Prod, axes, keepdim)
    }

    fn max_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }

    fn min_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim)
    }

    /// `any`: some element is nonzero (NaN counts as nonzero; no elements: false).
    fn any_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.try_ne(0)?
            .try_cast(DType::I64)?
            .sum_impl(axes, keepdim)?
            .try_gt(0)
    }

    /// `nansum`: the sum with NaNs counted as 0 (integers: the plain sum).
    fn nansum_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        if !self.dtype.is_float() {
            return self.sum_impl(axes, keepdim);
        }
        Tensor::try_where(&self.try_isnan()?, 0.0, self)?.sum_impl(axes, keepdim)
    }

    /// `nanmean`: the mean of the elements that are not NaN (NaN where all are).
    fn nanmean_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.float_only("nanmean")?;
        if self.dtype.is_half() {
            // In f32, rounded once (as `mean_impl`).
            return self.back_from_float(self.float_input("nanmean")?.nanmean_impl(axes, keepdim)?);
        }
        let numbers = self
            .try_isnan()?
            .try_logical_not()?
            .try_cast(self.dtype)?
            .sum_impl(axes, keepdim)?;
        self.nansum_impl(axes, keepdim)?.try_div(&numbers)
    }

    /// `count_nonzero`: how many elements are nonzero (i64; NaN counts).
    fn count_nonzero_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.try_ne(0)?
            .try_cast(DType::I64)?
            .sum_impl(axes, keepdim)
    }

    /// `all`: every element is nonzero (no elements: true).
    fn all_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.try_eq(0)?
            .try_cast(DType::I64)?
            .sum_impl(axes, keepdim)?
            .try_eq(0)
    }
}

axes_api! {
    sum, sum_keepdim, try_sum, try_sum_keepdim, Tensor::sum_impl,
        "Sum over `axes` (integers and bools sum as i64).";
    prod, prod_keepdim, try_prod, try_prod_keepdim, Tensor::prod_impl,
        "Product over `axes` (integers and bools multiply as i64).";
    max, max_keepdim, try_max, try_max_keepdim, Tensor::max_impl,
        "Maximum over `axes` (NaN propagates); PyTorch's `amax`. For the index too, see [`Tensor::max_dim`].";
    min, min_keepdim, try_min, try_min_keepdim, Tensor::min_impl,
        "Minimum over `axes` (NaN propagates); PyTorch's `amin`. For the index too, see [`Tensor::min_dim`].";
    mean, mean_keepdim, try_mean, try_mean_keepdim, Tensor::mean_impl,
        "Mean over `axes` (float dtypes; the mean of no elements is NaN).";
    logsumexp, logsumexp_keepdim, try_logsumexp, try_logsumexp_keepdim, Tensor::logsumexp_impl,
        "`log Σ exp(x)` over `axes`, computed stably as `m + log Σ exp(x - m)` with `m` the maximum (an all `-inf` row gives `-inf`, as PyTorch).";
    nansum, nansum_keepdim, try_nansum, try_nansum_keepdim, Tensor::nansum_impl,
        "PyTorch's `nansum`: the sum over `axes` with NaNs counted as zero (all NaN: 0; their gradient is 0).";
    nanmean, nanmean_keepdim, try_nanmean, try_nanmean_keepdim, Tensor::nanmean_impl,
        "PyTorch's `nanmean`: the mean over `axes` of the elements that are not NaN (float dtypes; NaN where every element is).";
    count_nonzero, count_nonzero_keepdim, try_count_nonzero, try_count_nonzero_keepdim, Tensor::count_nonzero_impl,
        "PyTorch's `count_nonzero`: the number of nonzero elements over `axes` (i64; NaN counts as nonzero).";
    any, any_keepdim, try_any, try_any_keepdim, Tensor::any_impl,
        "Whether any element over `axes` is nonzero (bool; NaN counts as nonzero; over no elements, false).";
    all, all_keepdim, try_all, try_all_keepdim, Tensor::all_impl,
        "Whether every element over `axes` is nonzero (bool; over no elements, true).";
}

/// Pairs of reductions PyTorch returns together.
impl Tensor {
    /// PyTorch's `aminmax(dim=…, keepdim)`: `(min, max)` over `axes` (NaN propagates).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, -1.0, 4.0, 1.0], [2, 2]);
    /// let (lo, hi) = x.aminmax(1, false);
    /// assert_eq!((lo.to_vec::<f32>().unwrap(), hi.to_vec::<f32>().unwrap()), (vec![-1.0, 1.0], vec![3.0, 4.0]));
    /// ```
    #[track_caller]
    pub fn aminmax(&self, axes: impl Axes, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_aminmax(axes, keepdim))
    }

    /// Fallible [`Tensor::aminmax`].
    pub fn try_aminmax(&self, axes: impl Axes, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let axes = axis_list(&axes).unwrap_or_default();
        Ok((
            self.min_impl(&axes, keepdim)?,
            self.max_impl(&axes, keepdim)?,
        ))
    }

    /// PyTorch's `torch.var_mean(x, dim, correction=c, keepdim)`: `(var, mean)` over
    /// `axes`, recorded together (they fuse into one pass where the plan allows).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 5.0, 7.0], [2, 2]);
    /// let (v, m) = x.var_mean(1, 0, false);
    /// assert_eq!((v.to_vec::<f32>().unwrap(), m.to_vec::<f32>().unwrap()), (vec![1.0, 1.0], vec![2.0, 6.0]));
    /// ```
    #[track_caller]
    pub fn var_mean(&self, axes: impl Axes, correction: usize, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_var_mean(axes, correction, keepdim))
    }

    /// Fallible [`Tensor::var_mean`].
    pub fn try_var_mean(
        &self,
        axes: impl Axes,
        correction: usize,
        keepdim: bool,
    ) -> Result<(Tensor, Tensor)> {
        self.spread_and_mean(
            &axis_list(&axes).unwrap_or_default(),
            correction,
            keepdim,
            false,
        )
    }

    /// PyTorch's `torch.std_mean(x, dim, correction=c, keepdim)`: `(std, mean)`.
    #[track_caller]
    pub fn std_mean(&self, axes: impl Axes, correction: usize, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_std_mean(axes, correction, keepdim))
    }

    /// Fallible [`Tensor::std_mean`].
    pub fn try_std_mean(
        &self,
        axes: impl Axes,
        correction: usize,
        keepdim: bool,
    ) -> Result<(Tensor, Tensor)> {
        self.spread_and_mean(
            &axis_list(&axes).unwrap_or_default(),
            correction,
            keepdim,
            true,
        )
    }

    /// `(var or std, mean)` over `axes`.
    fn spread_and_mean(
        &self,
        axes: &[isize],
        correction: usize,
        keepdim: bool,
        std: bool,
    ) -> Result<(Tensor, Tensor)> {
        let spread = if std {
            self.std_impl(axes, keepdim, correction)?
        } else {
            self.var_impl(axes, keepdim, correction)?
        };
        Ok((spread, self.mean_impl(axes, keepdim)?))
    }
}

/// `PyTorch`'s `amax` and `amin` names for [`Tensor::max`] and [`Tensor::min`].
impl Tensor {
    /// The same as [`Tensor::max`] (PyTorch's `amax`).
    #[track_caller]
    pub fn amax(&self, axes: impl Axes) -> Tensor {
        self.max(axes)
    }

    /// The same as [`Tensor::min`] (PyTorch's `amin`).
    #[track_caller]
    pub fn amin(&self, axes: impl Axes) -> Tensor {
        self.min(axes)
    }
}

impl Tensor {
    /// PyTorch's `argmax(dim)`: the i64 index of the largest element along `dim`, or over
    /// the flattened tensor for `..`. Ties go to the first occurrence; NaN counts as the
    /// largest.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 9.0, 9.0, 2.0], [2, 2]);
    /// assert_eq!(x.argmax(1).to_vec::<i64>().unwrap(), vec![1, 0]);
    /// assert_eq!(x.argmax(..).item::<i64>().unwrap(), 1);
    /// ```
    #[track_caller]
    pub fn argmax(&self, dim: impl Axes) -> Tensor {
        unwrap_or_panic(self.try_argmax(dim))
    }

    /// [`Tensor::argmax`] keeping the reduced axis (or every axis, for `..`) with size 1.
    #[track_caller]
    pub fn argmax_keepdim(&self, dim: impl Axes) -> Tensor {
        unwrap_or_panic(self.try_argmax_keepdim(dim))
    }

    /// Fallible [`Tensor::argmax`].
    pub fn try_argmax(&self, dim: impl Axes) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMax, self.one_dim("argmax", &dim)?, false)
    }

    /// Fallible [`Tensor::argmax_keepdim`].
    pub fn try_argmax_keepdim(&self, dim: impl Axes) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMax, self.one_dim("argmax", &dim)?, true)
    }

    /// PyTorch's `argmin(dim)`: the i64 index of the smallest element (see
    /// [`Tensor::argmax`]).
    #[track_caller]
    pub fn argmin(&self, dim: impl Axes) -> Tensor {
        unwrap_or_panic(self.try_argmin(dim))
    }

    /// [`Tensor::argmin`] keeping the reduced axis with size 1.
    #[track_caller]
    pub fn argmin_keepdim(&self, dim: impl Axes) -> Tensor {
        unwrap_or_panic(self.try_argmin_keepdim(dim))
    }

    /// Fallible [`Tensor::argmin`].
    pub fn try_argmin(&self, dim: impl Axes) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMin, self.one_dim("argmin", &dim)?, false)
    }

    /// Fallible [`Tensor::argmin_keepdim`].
    pub fn try_argmin_keepdim(&self, dim: impl Axes) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMin, self.one_dim("argmin", &dim)?, true)
    }

    /// One axis, or `None` for `..`; several axes are an error naming `op`.
    fn one_dim(&self, op: &'static str, dim: &impl Axes) -> Result<Option<isize>> {
        match axis_list(dim) {
            None => Ok(None),
            Some(v) if v.len() == 1 => Ok(Some(v[0])),
            Some(v) => Err(KilnError::InvalidArgument {
                op,
                shape: self.shape.clone(),
                reason: format!("takes one dimension or `..`, not {v:?}"),
            }),
        }
    }

    pub(super) fn arg_reduce(
        &self,
        op: ReduceOp,
        dim: Option<isize>,
        keepdim: bool,
    ) -> Result<Tensor> {
        match dim {
            Some(d) if self.ndim() == 0 => self.reduce(op, &[d], keepdim),
            Some(d) => {
                let d = normalize_axis(op.name(), d, &self.shape)?;
                self.reduce(op, &[d as isize], keepdim)
            }
            None => {
                let flat = self.try_reshape([self.numel() as isize])?;
                let r = flat.reduce(op, &[0], false)?;
                if keepdim {
                    r.try_reshape(vec![1; self.ndim()])
                } else {
                    Ok(r)
                }
            }
        }
    }

    fn mean_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.float_only("mean")?;
        let n = self.reduced_count("mean", axes)?;
        if self.dtype.is_half() {
            // Summed and divided in f32, rounded once (PyTorch's CPU mean of half types):
            // a sum rounded to the half type overflows past 65504.
            return self.back_from_float(self.float_input("mean")?.mean_impl(axes, keepdim)?);
        }
        // The mean of no elements is 0 / 0 = NaN, as in PyTorch.
        self.sum_impl(axes, keepdim)?.try_div(n as f64)
    }

    fn reduced_count(&self, op: &'static str, axes: &[isize]) -> Result<usize> {
        if axes.is_empty() || self.ndim() == 0 {
            return Ok(self.numel());
        }
        let a = normalize_axes(op, axes, &self.shape)?;
        Ok(a.iter().map(|&d| self.shape[d]).product())
    }

    /// Variance over `axes` with `correction` (1: the sample variance, PyTorch's default;
    /// 0: the population variance).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    /// assert_eq!(x.var(.., 1).item::<f32>().unwrap(), 5.0 / 3.0);
    /// ```
    #[track_caller]
    pub fn var(&self, axes: impl Axes, correction: usize) -> Tensor {
        unwrap_or_panic(self.try_var(axes, correction))
    }

    /// [`Tensor::var`] keeping the reduced axes with size 1.
    #[track_caller]
    pub fn var_keepdim(&self, axes: impl Axes, correction: usize) -> Tensor {
        unwrap_or_panic(self.try_var_keepdim(axes, correction))
    }

    /// Fallible [`Tensor::var`].
    pub fn try_var(&self, axes: impl Axes, correction: usize) -> Result<Tensor> {
        self.var_impl(&axis_list(&axes).unwrap_or_default(), false, correction)
    }

    /// Fallible [`Tensor::var_keepdim`].
    pub fn try_var_keepdim(&self, axes: impl Axes, correction: usize) -> Result<Tensor> {
        self.var_impl(&axis_list(&axes).unwrap_or_default(), true, correction)
    }

    /// Standard deviation over `axes` with `correction`: the square root of
    /// [`Tensor::var`] (PyTorch's `std`).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 5.0, 7.0], [2, 2]);
    /// assert_eq!(x.std(1, 0).to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn std(&self, axes: impl Axes, correction: usize) -> Tensor {
        unwrap_or_panic(self.try_std(axes, correction))
    }

    /// [`Tensor::std`] keeping the reduced axes with size 1.
    #[track_caller]
    pub fn std_keepdim(&self, axes: impl Axes, correction: usize) -> Tensor {
        unwrap_or_panic(self.try_std_keepdim(axes, correction))
    }

    /// Fallible [`Tensor::std`].
    pub fn try_std(&self, axes: impl Axes, correction: usize) -> Result<Tensor> {
        self.std_impl(&axis_list(&axes).unwrap_or_default(), false, correction)
    }

    /// Fallible [`Tensor::std_keepdim`].
    pub fn try_std_keepdim(&self, axes: impl Axes, correction: usize) -> Result<Tensor> {
        self.std_impl(&axis_list(&axes).unwrap_or_default(), true, correction)
    }

    fn std_impl(&self, axes: &[isize], keepdim: bool, correction: usize) -> Result<Tensor> {
        self.float_only("std")?;
        if self.dtype.is_half() {
            // In f32, rounded once (as `mean_impl`).
            let x = self.float_input("std")?;
            return self.back_from_float(x.std_impl(axes, keepdim, correction)?);
        }
        self.var_impl(axes, keepdim, correction)?.try_sqrt()
    }

    fn var_impl(&self, axes: &[isize], keepdim: bool, correction: usize) -> Result<Tensor> {
        self.float_only("var")?;
        if self.dtype.is_half() {
            // In f32, rounded once (as `mean_impl`).
            let x = self.float_input("var")?;
            return self.back_from_float(x.var_impl(axes, keepdim, correction)?);
        }
        let n = self.reduced_count("var", axes)?;
        let centered = self.try_sub(&self.mean_impl(axes, true)?)?;
        let denom = n.saturating_sub(correction) as f64;
        centered
            .try_mul(&centered)?
            .sum_impl(axes, keepdim)?
            .try_div(denom)
    }

    /// Softmax along `dim`: `exp(x - max) / Σ exp(x - max)`.
    #[track_caller]
    pub fn softmax(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_softmax(dim))
    }

    /// Fallible [`Tensor::softmax`].
    pub fn try_softmax(&self, dim: isize) -> Result<Tensor> {
        if self.ndim() == 0 {
            normalize_axis("softmax", dim, &[1])?;
            return self.try_reshape([1])?.try_softmax(0)?.try_reshape(());
        }
        let x = self.float_input("softmax")?;
        let d = normalize_axis("softmax", dim, &x.shape)? as isize;
        if x.shape[d as usize] == 0 {
            return self.back_from_float(x);
        }
        // The shift by the row's maximum leaves the value unchanged, so its gradient is
        // zero: detached, the backward does not differentiate through the max.
        let e = x.try_sub(x.try_max_keepdim(d)?.detach())?.try_exp()?;
        let s = e.try_sum_keepdim(d)?;
        // One reciprocal per row and a multiply per element (as PyTorch's CPU kernel): a
        // division per element costs several multiplies; the result stays within an ulp of
        // the quotient.
        self.back_from_float(e.try_mul(&s.try_recip()?)?)
    }

    fn logsumexp_impl(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let x = self.float_input("logsumexp")?;
        if x.numel() == 0 {
            // No maximum to shift by (and nothing to overflow): log Σ exp over no elements
            // is log 0 = -inf, as in PyTorch.
            let lse = x.try_exp()?.sum_impl(axes, keepdim)?.try_log()?;
            return self.back_from_float(lse);
        }
        let m = x.max_impl(axes, true)?;
        // An infinite maximum would make `x - m` NaN: shift by 0 there instead.
        let finite = m.try_abs()?.try_lt(f64::INFINITY)?;
        // The shift cancels out of the value, so its gradient is zero: detached.
        let shift = Tensor::try_where(&finite, &m, 0.0)?.detach();
        let lse = x
            .try_sub(&shift)?
            .try_exp()?
            .sum_impl(axes, true)?
            .try_log()?
            .try_add(&shift)?;
        let lse = if keepdim {
            lse
        } else {
            lse.sum_impl(axes, false)?
        };
        self.back_from_float(lse)
    }

    /// Log-softmax along `dim`: `x - max - log Σ exp(x - max)`.
    #[track_caller]
    pub fn log_softmax(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_log_softmax(dim))
    }

    /// Fallible [`Tensor::log_softmax`].
    pub fn try_log_softmax(&self, dim: isize) -> Result<Tensor> {
        if self.ndim() == 0 {
            normalize_axis("log_softmax", dim, &[1])?;
            return self.try_reshape([1])?.try_log_softmax(0)?.try_reshape(());
        }
        let x = self.float_input("log_softmax")?;
        let d = normalize_axis("log_softmax", dim, &x.shape)? as isize;
        if x.shape[d as usize] == 0 {
            return self.back_from_float(x);
        }
        // (The shift's gradient is zero: detached, as in `softmax`.)
        let shifted = x.try_sub(x.try_max_keepdim(d)?.detach())?;
        let lse = shifted.try_exp()?.try_sum_keepdim(d)?.try_log()?;
        self.back_from_float(shifted.try_sub(&lse)?)
    }

    fn float_input(&self, op: &'static str) -> Result<Tensor> {
        // Half types and integers are computed in f32 inside: check that size under `op`'s
        // name before any cast records.
        let wide = if self.dtype.is_float() && !self.dtype.is_half() {
            self.dtype
        } else {
            DType::F32
        };
        crate::shape::check_shape(op, &self.shape, wide)?;
        if wide == self.dtype {
            Ok(self.clone())
        } else {
            self.try_cast(wide)
        }
    }

    /// The result of an op computed through [`Tensor::float_input`] in this tensor's dtype:
    /// rounded back to it once for half types (as PyTorch's CPU kernels accumulate half
    /// inputs in f32 and round the output), as it is for other dtypes.
    fn back_from_float(&self, r: Tensor) -> Result<Tensor> {
        if self.dtype.is_half() {
            r.try_cast(self.dtype)
        } else {
            Ok(r)
        }
    }

    /// Layer normalization over the trailing dimensions `normalized_shape`, with optional
    /// elementwise `weight` and `bias` of that shape.
    #[track_caller]
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Tensor {
        unwrap_or_panic(self.try_layer_norm(normalized_shape, weight, bias, eps))
    }

    /// Fallible [`Tensor::layer_norm`].
    pub fn try_layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let k = normalized_shape.len();
        if k == 0 || k > self.ndim() || self.shape[self.ndim() - k..] != *normalized_shape {
            return Err(KilnError::ShapeMismatch {
                op: "layer_norm",
                lhs: self.shape.clone(),
                rhs: normalized_shape.to_vec(),
                detail: ": normalized_shape must equal the trailing dimensions".into(),
            });
        }
        for (name, t) in [("weight", weight), ("bias", bias)] {
            if let Some(t) = t
                && t.shape != normalized_shape
            {
                return Err(KilnError::ShapeMismatch {
                    op: "layer_norm",
                    lhs: t.shape.clone(),
                    rhs: normalized_shape.to_vec(),
                    detail: format!(": {name} must have the normalized shape"),
                });
            }
        }
        let x = self.float_input("layer_norm")?;
        let axes: Vec<isize> = ((x.ndim() - k) as isize..x.ndim() as isize).collect();
        let n = numel(normalized_shape) as f64;
        let centered = x.try_sub(&x.try_sum_keepdim(&axes)?.try_mul(1.0 / n)?)?;
        let var = centered
            .try_mul(&centered)?
            .try_sum_keepdim(&axes)?
            .try_mul(1.0 / n)?;
        let inv_std = var.try_add(eps)?.try_sqrt()?.try_recip()?;
        let mut y = centered.try_mul(&inv_std)?;
        if let Some(w) = weight {
            y = y.try_mul(w)?;
        }
        if let Some(b) = bias {
            y = y.try_add(b)?;
        }
        // The dtype the input promotes to with the weight and bias (computed in f32 for a
        // half input, rounded back once where that dtype is a half type).
        let out = [weight, bias]
            .into_iter()
            .flatten()
            .fold(self.dtype, |d, t| DType::promote(d, t.dtype));
        if out.is_half() {
            y = y.try_cast(out)?;
        }
        Ok(y)
    }
}
