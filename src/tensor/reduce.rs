//! Reductions and the composites built from them (mean, var, softmax, log_softmax,
//! layer_norm). Composites are plain primitive ops, so the planner can fuse each into one
//! kernel.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::graph::{Op, ReduceOp};
use crate::shape::{normalize_axes, normalize_axis, numel};

impl Tensor {
    fn reduce(&self, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let name = op.name();
        if self.ndim() == 0 && !axes.is_empty() {
            // As in PyTorch, a 0-d tensor reduces over "dimension 0 or -1" as if it had one
            // dimension of size 1: the result is the value itself (0-d, keepdim or not).
            normalize_axes(name, axes, &[1])?;
            return self.try_reshape(&[1])?.reduce(op, &[0], false);
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
                x
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

macro_rules! reductions {
    ($($name:ident, $try_name:ident, $op:ident, $doc:literal;)*) => {
        impl Tensor {
            $(
                #[doc = $doc]
                #[doc = ""]
                #[doc = "`axes` may be negative; an empty list reduces over every axis. With `keepdim` the reduced axes stay with size 1."]
                #[track_caller]
                pub fn $name(&self, axes: &[isize], keepdim: bool) -> Tensor {
                    unwrap_or_panic(self.$try_name(axes, keepdim))
                }

                #[doc = concat!("Fallible form of `", stringify!($name), "`.")]
                pub fn $try_name(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
                    self.reduce(ReduceOp::$op, axes, keepdim)
                }
            )*
        }
    };
}

reductions! {
    sum, try_sum, Sum, "Sum over `axes` (integers and bools sum as i64).";
    prod, try_prod, Prod, "Product over `axes` (integers and bools multiply as i64).";
    max, try_max, Max, "Maximum over `axes` (NaN propagates).";
    min, try_min, Min, "Minimum over `axes` (NaN propagates).";
}

impl Tensor {
    /// Index (i64) of the largest element along `dim`, or over the flattened tensor when
    /// `dim` is `None`. Ties go to the first occurrence; a NaN counts as the largest.
    #[track_caller]
    pub fn argmax(&self, dim: Option<isize>, keepdim: bool) -> Tensor {
        unwrap_or_panic(self.try_argmax(dim, keepdim))
    }

    /// Fallible [`Tensor::argmax`].
    pub fn try_argmax(&self, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMax, dim, keepdim)
    }

    /// Index (i64) of the smallest element along `dim` (or overall for `None`).
    #[track_caller]
    pub fn argmin(&self, dim: Option<isize>, keepdim: bool) -> Tensor {
        unwrap_or_panic(self.try_argmin(dim, keepdim))
    }

    /// Fallible [`Tensor::argmin`].
    pub fn try_argmin(&self, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMin, dim, keepdim)
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
                let flat = self.try_reshape(&[self.numel() as isize])?;
                let r = flat.reduce(op, &[0], false)?;
                if keepdim {
                    r.try_reshape(&vec![1; self.ndim()])
                } else {
                    Ok(r)
                }
            }
        }
    }

    /// Mean over `axes` (float dtypes only).
    #[track_caller]
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Tensor {
        unwrap_or_panic(self.try_mean(axes, keepdim))
    }

    /// Fallible [`Tensor::mean`].
    pub fn try_mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.float_only("mean")?;
        let n = self.reduced_count("mean", axes)?;
        // The mean of no elements is 0 / 0 = NaN, as in PyTorch.
        self.try_sum(axes, keepdim)?.try_div(n as f64)
    }

    fn reduced_count(&self, op: &'static str, axes: &[isize]) -> Result<usize> {
        if axes.is_empty() || self.ndim() == 0 {
            return Ok(self.numel());
        }
        let a = normalize_axes(op, axes, &self.shape)?;
        Ok(a.iter().map(|&d| self.shape[d]).product())
    }

    /// Variance over `axes` with `correction` (1 = sample variance, 0 = population).
    #[track_caller]
    pub fn var(&self, axes: &[isize], keepdim: bool, correction: usize) -> Tensor {
        unwrap_or_panic(self.try_var(axes, keepdim, correction))
    }

    /// Fallible [`Tensor::var`].
    pub fn try_var(&self, axes: &[isize], keepdim: bool, correction: usize) -> Result<Tensor> {
        self.float_only("var")?;
        let n = self.reduced_count("var", axes)?;
        let centered = self.try_sub(&self.try_mean(axes, true)?)?;
        let denom = n.saturating_sub(correction) as f64;
        centered
            .try_mul(&centered)?
            .try_sum(axes, keepdim)?
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
            return self.try_reshape(&[1])?.try_softmax(0)?.try_reshape(&[]);
        }
        let x = self.float_input("softmax")?;
        let d = normalize_axis("softmax", dim, &x.shape)? as isize;
        if x.shape[d as usize] == 0 {
            return Ok(x);
        }
        let e = x.try_sub(&x.try_max(&[d], true)?)?.try_exp()?;
        e.try_div(&e.try_sum(&[d], true)?)
    }

    /// `log Σ exp(x)` over `axes`, computed stably as `m + log Σ exp(x - m)` with `m` the
    /// maximum (an all `-inf` row gives `-inf`, as PyTorch).
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![0.0f32, 0.0], &[2]);
    /// assert!((x.logsumexp(&[0], false).item::<f32>().unwrap() - 2f32.ln()).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn logsumexp(&self, axes: &[isize], keepdim: bool) -> Tensor {
        unwrap_or_panic(self.try_logsumexp(axes, keepdim))
    }

    /// Fallible [`Tensor::logsumexp`].
    pub fn try_logsumexp(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let x = self.float_input("logsumexp")?;
        let m = x.try_max(axes, true)?;
        // An infinite maximum would make `x - m` NaN: shift by 0 there instead.
        let finite = m.try_abs()?.try_lt(f64::INFINITY)?;
        let shift = Tensor::try_where(&finite, &m, 0.0)?;
        let lse = x
            .try_sub(&shift)?
            .try_exp()?
            .try_sum(axes, true)?
            .try_log()?
            .try_add(&shift)?;
        if keepdim {
            return Ok(lse);
        }
        lse.try_sum(axes, false)
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
            return self.try_reshape(&[1])?.try_log_softmax(0)?.try_reshape(&[]);
        }
        let x = self.float_input("log_softmax")?;
        let d = normalize_axis("log_softmax", dim, &x.shape)? as isize;
        if x.shape[d as usize] == 0 {
            return Ok(x);
        }
        let shifted = x.try_sub(&x.try_max(&[d], true)?)?;
        let lse = shifted.try_exp()?.try_sum(&[d], true)?.try_log()?;
        shifted.try_sub(&lse)
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
        if self.dtype.is_float() {
            Ok(self.clone())
        } else {
            self.try_cast(DType::default_float())
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
        let centered = x.try_sub(&x.try_sum(&axes, true)?.try_mul(1.0 / n)?)?;
        let var = centered
            .try_mul(&centered)?
            .try_sum(&axes, true)?
            .try_mul(1.0 / n)?;
        let inv_std = var.try_add(eps)?.try_sqrt()?.try_recip()?;
        let mut y = centered.try_mul(&inv_std)?;
        if let Some(w) = weight {
            y = y.try_mul(w)?;
        }
        if let Some(b) = bias {
            y = y.try_add(b)?;
        }
        Ok(y)
    }
}
