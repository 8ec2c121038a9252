//! PyTorch's activation functions that have no kernel of their own: `leaky_relu`, `elu`,
//! `selu`, `celu`, `hardtanh`, `relu6`, `hardsigmoid`, `hardswish`, `mish`, `log_sigmoid`,
//! `softsign`, `softplus_with`, `glu`, `prelu`, `threshold`, `tanhshrink`, `softshrink`
//! and `hardshrink`.
//!
//! Each is recorded as kiln's elementwise primitives (comparisons, `where`, `expm1`,
//! `softplus`, ...), so it fuses with its neighbours, runs on every device and is
//! differentiated through its parts. The pieces are arranged so that:
//!
//! - the branch a `where` keeps at a kink is the one PyTorch differentiates there (the
//!   gradient of `hardtanh` is 0 at exactly `min_val` and `max_val`, that of `leaky_relu`
//!   at 0 is the slope, as PyTorch's backward kernels give);
//! - a branch that `where` discards never computes an infinity (its zero gradient times
//!   an infinite derivative would be NaN): `elu`'s exponential sees only the non-positive
//!   inputs, `softplus_with`'s only those under the threshold;
//! - NaN inputs give NaN, as PyTorch's kernels do.
//!
//! Half types (f16, bf16) are computed in f32 and rounded once, as PyTorch computes them.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::shape::normalize_axis;

/// SELU's `alpha` (Klambauer et al., 2017), PyTorch's constant.
pub const SELU_ALPHA: f64 = 1.673_263_242_354_377_284_817_042_991_671_7;
/// SELU's `scale` (Klambauer et al., 2017), PyTorch's constant.
pub const SELU_SCALE: f64 = 1.050_700_987_355_480_493_419_334_985_294_6;

impl Tensor {
    /// `self`, checked to be a float tensor for the op `op` (PyTorch has these activations
    /// for floating-point dtypes only).
    fn require_float(&self, op: &'static str) -> Result<()> {
        if self.dtype.is_float() {
            Ok(())
        } else {
            Err(KilnError::UnsupportedDType {
                op,
                dtype: self.dtype,
                detail: ": it takes floating-point tensors (cast first)".into(),
            })
        }
    }

    /// Rejects bool inputs for an op that takes any number.
    fn numeric_input(&self, op: &'static str) -> Result<()> {
        if self.dtype == DType::Bool {
            Err(KilnError::UnsupportedDType {
                op,
                dtype: self.dtype,
                detail: ": it takes numbers (cast to an integer or float dtype first)".into(),
            })
        } else {
            Ok(())
        }
    }

    /// `f(self)`, with a half-type `self` computed in f32 and the result rounded back once
    /// (the f32 size checked under `op`'s name before the cast records).
    fn in_working_precision(
        &self,
        op: &'static str,
        f: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        if self.dtype.is_half() {
            crate::shape::check_shape(op, &self.shape, DType::F32)?;
            f(&self.try_cast(DType::F32)?)?.try_cast(self.dtype)
        } else {
            f(self)
        }
    }

    /// `self` where it is positive, else 0: an input for a branch that `where` keeps only
    /// at non-positive elements (NaN stays NaN).
    fn non_positive_part(&self) -> Result<Tensor> {
        Tensor::try_where(&self.try_gt(0.0)?, 0.0, self)
    }

    /// PyTorch's `leaky_relu(x, negative_slope)` (PyTorch's default slope is 0.01):
    /// `x` where `x > 0`, else `negative_slope · x`. The gradient at 0 is the slope, as
    /// PyTorch's. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-2.0f32, 0.0, 3.0], [3]);
    /// assert_eq!(x.leaky_relu(0.1).to_vec::<f32>().unwrap(), vec![-0.2, 0.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn leaky_relu(&self, negative_slope: f64) -> Tensor {
        unwrap_or_panic(self.try_leaky_relu(negative_slope))
    }

    /// Fallible [`Tensor::leaky_relu`].
    pub fn try_leaky_relu(&self, negative_slope: f64) -> Result<Tensor> {
        self.require_float("leaky_relu")?;
        self.in_working_precision("leaky_relu", |x| {
            Tensor::try_where(&x.try_gt(0.0)?, x, &x.try_mul(negative_slope)?)
        })
    }

    /// The exponential linear family, `scale · (x > 0 ? x : alpha · (exp(x · input_scale) -
    /// 1))`, with PyTorch's derivative at 0 (that of the exponential side).
    fn elu_family(
        &self,
        op: &'static str,
        alpha: f64,
        scale: f64,
        input_scale: f64,
    ) -> Result<Tensor> {
        self.require_float(op)?;
        self.in_working_precision(op, |x| {
            let positive = x.try_gt(0.0)?;
            let mut neg = x.non_positive_part()?;
            if input_scale != 1.0 {
                neg = neg.try_mul(input_scale)?;
            }
            let neg = neg.try_expm1()?.try_mul(alpha * scale)?;
            let pos = if scale == 1.0 {
                x.clone()
            } else {
                x.try_mul(scale)?
            };
            Tensor::try_where(&positive, &pos, &neg)
        })
    }

    /// PyTorch's `elu(x, alpha)` (default `alpha = 1`): `x` where `x > 0`, else
    /// `alpha · (eˣ - 1)`. The gradient at 0 is `alpha`, as PyTorch's. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![f32::NEG_INFINITY, 0.0, 2.0], [3]);
    /// assert_eq!(x.elu(1.0).to_vec::<f32>().unwrap(), vec![-1.0, 0.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn elu(&self, alpha: f64) -> Tensor {
        unwrap_or_panic(self.try_elu(alpha))
    }

    /// Fallible [`Tensor::elu`].
    pub fn try_elu(&self, alpha: f64) -> Result<Tensor> {
        self.elu_family("elu", alpha, 1.0, 1.0)
    }

    /// PyTorch's `selu(x)`: `scale · elu(x, alpha)` with the self-normalizing constants
    /// [`SELU_ALPHA`] and [`SELU_SCALE`]. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f64, f64::NEG_INFINITY], [2]);
    /// let y = x.selu().to_vec::<f64>().unwrap();
    /// assert_eq!(y[0], kiln::tensor::SELU_SCALE);
    /// assert!((y[1] + kiln::tensor::SELU_SCALE * kiln::tensor::SELU_ALPHA).abs() < 1e-15);
    /// ```
    #[track_caller]
    pub fn selu(&self) -> Tensor {
        unwrap_or_panic(self.try_selu())
    }

    /// Fallible [`Tensor::selu`].
    pub fn try_selu(&self) -> Result<Tensor> {
        self.elu_family("selu", SELU_ALPHA, SELU_SCALE, 1.0)
    }

    /// PyTorch's `celu(x, alpha)` (default `alpha = 1`): `x` where `x > 0`, else
    /// `alpha · (e^(x/alpha) - 1)`. `alpha = 0` is an error, as in PyTorch. Float dtypes
    /// only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-1000.0f32, 0.5], [2]);
    /// assert_eq!(x.celu(2.0).to_vec::<f32>().unwrap(), vec![-2.0, 0.5]);
    /// ```
    #[track_caller]
    pub fn celu(&self, alpha: f64) -> Tensor {
        unwrap_or_panic(self.try_celu(alpha))
    }

    /// Fallible [`Tensor::celu`].
    pub fn try_celu(&self, alpha: f64) -> Result<Tensor> {
        if alpha == 0.0 {
            return Err(KilnError::InvalidArgument {
                op: "celu",
                shape: self.shape.clone(),
                reason: "alpha cannot be 0 (celu divides by it)".into(),
            });
        }
        self.elu_family("celu", alpha, 1.0, 1.0 / alpha)
    }

    /// PyTorch's `hardtanh(x, min_val, max_val)` (defaults -1 and 1): `x` clamped into
    /// `[min_val, max_val]`, NaN staying NaN. The gradient is 1 strictly inside and 0 at
    /// and beyond the bounds, as PyTorch's. Integer tensors keep their dtype, with the
    /// bounds truncated to integers (as PyTorch); bool is an error. Where `min_val >
    /// max_val` every number becomes `max_val`, as PyTorch's `clamp` gives.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-3.0f32, 0.25, 1.0, 7.0], [4]);
    /// assert_eq!(x.hardtanh(-1.0, 1.0).to_vec::<f32>().unwrap(), vec![-1.0, 0.25, 1.0, 1.0]);
    /// let i = kiln::Tensor::from_vec(vec![-3i64, 0, 8], [3]);
    /// assert_eq!(i.hardtanh(-1.5, 6.9).to_vec::<i64>().unwrap(), vec![-1, 0, 6]);
    /// ```
    #[track_caller]
    pub fn hardtanh(&self, min_val: f64, max_val: f64) -> Tensor {
        unwrap_or_panic(self.try_hardtanh(min_val, max_val))
    }

    /// Fallible [`Tensor::hardtanh`].
    pub fn try_hardtanh(&self, min_val: f64, max_val: f64) -> Result<Tensor> {
        self.clamp_hard("hardtanh", min_val, max_val)
    }

    /// `hardtanh` under the op name `op`.
    fn clamp_hard(&self, op: &'static str, min_val: f64, max_val: f64) -> Result<Tensor> {
        self.numeric_input(op)?;
        let (lo, hi) = (self.scalar_in_dtype(min_val), self.scalar_in_dtype(max_val));
        if self.dtype == DType::U8 && (lo.to_f64() < 0.0 || hi.to_f64() < 0.0) {
            return Err(KilnError::InvalidArgument {
                op,
                shape: self.shape.clone(),
                reason: format!("u8 tensors take no negative bounds ({min_val}, {max_val})"),
            });
        }
        // Below the lower bound the result is the lower bound, unless the bounds cross
        // (then `clamp` answers the upper one everywhere).
        let low_value = if lo.to_f64() > hi.to_f64() { hi } else { lo };
        let inside = Tensor::try_where(&self.try_ge(hi)?, hi, self)?;
        Tensor::try_where(&self.try_le(lo)?, low_value, &inside)
    }

    /// A number as `self`'s dtype takes it: truncated toward zero for integers (as
    /// PyTorch converts a Python float bound for an integer tensor).
    fn scalar_in_dtype(&self, v: f64) -> Scalar {
        if self.dtype.is_float() {
            Scalar::Float(v)
        } else {
            Scalar::Int(v as i64)
        }
    }

    /// PyTorch's `relu6(x)`: [`Tensor::hardtanh`] into `[0, 6]` (so its gradient is 0 at
    /// exactly 0 and 6, as PyTorch's).
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-1.0f32, 3.0, 9.0], [3]);
    /// assert_eq!(x.relu6().to_vec::<f32>().unwrap(), vec![0.0, 3.0, 6.0]);
    /// ```
    #[track_caller]
    pub fn relu6(&self) -> Tensor {
        unwrap_or_panic(self.try_relu6())
    }

    /// Fallible [`Tensor::relu6`].
    pub fn try_relu6(&self) -> Result<Tensor> {
        self.clamp_hard("relu6", 0.0, 6.0)
    }

    /// PyTorch's `hardsigmoid(x)`: `relu6(x + 3) / 6`, 0 at and below -3, 1 at and above 3
    /// (the gradient is 1/6 strictly between, 0 elsewhere, as PyTorch's). Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-4.0f32, 0.0, 1.5, 3.0], [4]);
    /// assert_eq!(x.hardsigmoid().to_vec::<f32>().unwrap(), vec![0.0, 0.5, 0.75, 1.0]);
    /// ```
    #[track_caller]
    pub fn hardsigmoid(&self) -> Tensor {
        unwrap_or_panic(self.try_hardsigmoid())
    }

    /// Fallible [`Tensor::hardsigmoid`].
    pub fn try_hardsigmoid(&self) -> Result<Tensor> {
        self.require_float("hardsigmoid")?;
        self.in_working_precision("hardsigmoid", |x| {
            let mid = x.try_add(3.0)?.try_div(6.0)?;
            let upper = Tensor::try_where(&x.try_ge(3.0)?, 1.0, &mid)?;
            Tensor::try_where(&x.try_le(-3.0)?, 0.0, &upper)
        })
    }

    /// PyTorch's `hardswish(x)`: `x · relu6(x + 3) / 6`: 0 below -3 (NaN at `-inf`, as
    /// PyTorch's product gives), `x` above 3. The gradient is PyTorch's: `x/3 + 1/2` on
    /// `[-3, 3]` (both ends included), 0 below, 1 above. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-4.0f32, 0.0, 1.0, 5.0], [4]);
    /// let y = x.hardswish().to_vec::<f32>().unwrap();
    /// assert_eq!(y, vec![0.0, 0.0, 4.0 / 6.0, 5.0]);
    /// ```
    #[track_caller]
    pub fn hardswish(&self) -> Tensor {
        unwrap_or_panic(self.try_hardswish())
    }

    /// Fallible [`Tensor::hardswish`].
    pub fn try_hardswish(&self) -> Result<Tensor> {
        self.require_float("hardswish")?;
        self.in_working_precision("hardswish", |x| {
            // The middle piece sees 0 outside [-3, 3], where it is discarded (an infinite
            // input would otherwise give it an infinite derivative, times a zero gradient).
            let centre = Tensor::try_where(&x.try_abs()?.try_gt(3.0)?, 0.0, x)?;
            let mid = centre.try_mul(&centre.try_add(3.0)?)?.try_div(6.0)?;
            let upper = Tensor::try_where(&x.try_le(3.0)?, &mid, x)?;
            // `x · 0` below -3, as PyTorch's product gives: -0, and NaN at -inf.
            Tensor::try_where(&x.try_lt(-3.0)?, &x.try_mul(0.0)?, &upper)
        })
    }

    /// PyTorch's `mish(x)`: `x · tanh(softplus(x))` (Misra, 2019), with
    /// [`Tensor::softplus`] so that large inputs do not overflow. `mish(-inf)` is NaN
    /// (`-inf · 0`), as PyTorch's. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![0.0f32, 1000.0], [2]);
    /// assert_eq!(x.mish().to_vec::<f32>().unwrap(), vec![0.0, 1000.0]);
    /// ```
    #[track_caller]
    pub fn mish(&self) -> Tensor {
        unwrap_or_panic(self.try_mish())
    }

    /// Fallible [`Tensor::mish`].
    pub fn try_mish(&self) -> Result<Tensor> {
        self.require_float("mish")?;
        self.in_working_precision("mish", |x| x.try_mul(&x.try_softplus()?.try_tanh()?))
    }

    /// PyTorch's `logsigmoid(x)`: `ln(1 / (1 + e⁻ˣ))`, computed as `-softplus(-x)`, which
    /// neither overflows nor loses the small values: `log_sigmoid(-1000) = -1000`,
    /// `log_sigmoid(50) ≈ -2e-22`. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-1000.0f32, 0.0, f32::INFINITY], [3]);
    /// let y = x.log_sigmoid().to_vec::<f32>().unwrap();
    /// assert_eq!(y, vec![-1000.0, -std::f32::consts::LN_2, 0.0]);
    /// ```
    #[track_caller]
    pub fn log_sigmoid(&self) -> Tensor {
        unwrap_or_panic(self.try_log_sigmoid())
    }

    /// Fallible [`Tensor::log_sigmoid`].
    pub fn try_log_sigmoid(&self) -> Result<Tensor> {
        self.require_float("log_sigmoid")?;
        // `0 - s` rather than `-s`: `log_sigmoid(+inf)` is +0, as PyTorch's.
        self.in_working_precision("log_sigmoid", |x| {
            x.try_neg()?.try_softplus()?.try_rsub(0.0)
        })
    }

    /// PyTorch's `softsign(x)`: `x / (1 + |x|)`, by that formula, so `softsign(±inf)` is
    /// NaN, as PyTorch's. Integers are computed as f32; bool is an error.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-3.0f32, 0.0, 1.0], [3]);
    /// assert_eq!(x.softsign().to_vec::<f32>().unwrap(), vec![-0.75, 0.0, 0.5]);
    /// ```
    #[track_caller]
    pub fn softsign(&self) -> Tensor {
        unwrap_or_panic(self.try_softsign())
    }

    /// Fallible [`Tensor::softsign`].
    pub fn try_softsign(&self) -> Result<Tensor> {
        self.numeric_input("softsign")?;
        let x = self.float_or_default()?;
        x.in_working_precision("softsign", |x| x.try_div(&x.try_abs()?.try_add(1.0)?))
    }

    /// `self`, or `self` cast to the default float dtype where it is an integer tensor.
    fn float_or_default(&self) -> Result<Tensor> {
        if self.dtype.is_float() {
            Ok(self.clone())
        } else {
            self.try_cast(DType::default_float())
        }
    }

    /// PyTorch's `softplus(x, beta, threshold)`: `ln(1 + e^(beta·x)) / beta`, and `x`
    /// itself where `beta · x > threshold` (PyTorch's defaults, `beta = 1`,
    /// `threshold = 20`, are [`Tensor::softplus`], which this calls for them). The
    /// exponential never sees the inputs above the threshold, so their gradient is exactly
    /// 1. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![0.0f32, 2.0, 100.0], [3]);
    /// let y = x.softplus_with(2.0, 3.0).to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], std::f32::consts::LN_2 / 2.0);
    /// assert_eq!(y[1..], [2.0, 100.0]);
    /// ```
    #[track_caller]
    pub fn softplus_with(&self, beta: f64, threshold: f64) -> Tensor {
        unwrap_or_panic(self.try_softplus_with(beta, threshold))
    }

    /// Fallible [`Tensor::softplus_with`].
    pub fn try_softplus_with(&self, beta: f64, threshold: f64) -> Result<Tensor> {
        self.require_float("softplus")?;
        if beta == 1.0 && threshold == 20.0 {
            return self.try_softplus();
        }
        self.in_working_precision("softplus", |x| {
            let scaled = x.try_mul(beta)?;
            let linear = scaled.try_gt(threshold)?;
            let below = Tensor::try_where(&linear, 0.0, &scaled)?;
            let soft = below.try_exp()?.try_log1p()?.try_div(beta)?;
            Tensor::try_where(&linear, x, &soft)
        })
    }

    /// PyTorch's `glu(x, dim)` (default `dim = -1`): the gated linear unit. `x` is cut into
    /// halves `a`, `b` along `dim`, and the result is `a · sigmoid(b)`, half as long along
    /// `dim`. An odd length (or a 0-d tensor) is an error. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, 2.0, 0.0, 1000.0], [1, 4]);
    /// assert_eq!(x.glu(-1).to_vec::<f32>().unwrap(), vec![0.5, 2.0]);
    /// ```
    #[track_caller]
    pub fn glu(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_glu(dim))
    }

    /// Fallible [`Tensor::glu`].
    pub fn try_glu(&self, dim: isize) -> Result<Tensor> {
        self.require_float("glu")?;
        if self.shape.is_empty() {
            return Err(KilnError::InvalidArgument {
                op: "glu",
                shape: self.shape.clone(),
                reason: "a 0-d tensor has no dimension to halve".into(),
            });
        }
        let axis = normalize_axis("glu", dim, &self.shape)?;
        let n = self.shape[axis];
        if !n.is_multiple_of(2) {
            return Err(KilnError::InvalidArgument {
                op: "glu",
                shape: self.shape.clone(),
                reason: format!("dimension {dim} has odd length {n}; glu halves it"),
            });
        }
        let half = n / 2;
        self.in_working_precision("glu", |x| {
            let a = x.try_narrow(axis as isize, 0, half)?;
            let b = x.try_narrow(axis as isize, half as isize, half)?;
            a.try_mul(&b.try_sigmoid()?)
        })
    }

    /// PyTorch's `prelu(x, weight)`: `x` where `x > 0`, else `weight · x`, with `weight`
    /// holding one slope (0-d or 1 element) or one per channel, the channel being
    /// dimension 1 (PyTorch takes a 0-d or 1-d input to have one channel, so it needs a
    /// single slope). `weight` must have `self`'s dtype and at most one dimension, as in
    /// PyTorch. The gradient at 0 is the slope; `weight` gets `x · g` summed over the
    /// non-positive elements. Float dtypes only.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 2.0, -3.0, 4.0], [1, 2, 2]);
    /// let w = Tensor::from_vec(vec![0.5f32, 0.25], [2]);
    /// assert_eq!(x.prelu(&w).to_vec::<f32>().unwrap(), vec![-0.5, 2.0, -0.75, 4.0]);
    /// ```
    #[track_caller]
    pub fn prelu(&self, weight: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_prelu(weight))
    }

    /// Fallible [`Tensor::prelu`].
    pub fn try_prelu(&self, weight: &Tensor) -> Result<Tensor> {
        self.require_float("prelu")?;
        self.require_same_device("prelu", weight)?;
        if weight.dtype != self.dtype {
            return Err(KilnError::DTypeMismatch {
                op: "prelu",
                lhs: self.dtype,
                rhs: weight.dtype,
            });
        }
        if weight.ndim() > 1 {
            return Err(KilnError::InvalidArgument {
                op: "prelu",
                shape: self.shape.clone(),
                reason: format!(
                    "the weight must be 0-d or 1-d, not of shape {:?}",
                    weight.shape
                ),
            });
        }
        let slopes = weight.numel();
        let w = if slopes == 1 {
            weight.try_reshape(Vec::<isize>::new())?
        } else {
            let channels = match self.ndim() {
                0 => {
                    return Err(KilnError::InvalidArgument {
                        op: "prelu",
                        shape: self.shape.clone(),
                        reason: format!(
                            "a 0-d input takes one slope, not {slopes} (weight shape {:?})",
                            weight.shape
                        ),
                    });
                }
                1 => 1,
                _ => self.shape[1],
            };
            if slopes != channels {
                return Err(KilnError::InvalidArgument {
                    op: "prelu",
                    shape: self.shape.clone(),
                    reason: format!(
                        "{slopes} slopes (weight shape {:?}) for {channels} channels (dimension 1)",
                        weight.shape
                    ),
                });
            }
            // [C] → [C, 1, ..., 1], broadcasting along dimension 1.
            let mut shape = vec![slopes as isize];
            shape.extend(std::iter::repeat_n(1, self.ndim() - 2));
            weight.try_reshape(shape)?
        };
        self.in_working_precision("prelu", |x| {
            let w = w.try_cast(x.dtype)?;
            Tensor::try_where(&x.try_gt(0.0)?, x, &x.try_mul(&w)?)
        })
    }

    /// PyTorch's `threshold(x, threshold, value)`: `value` where `x <= threshold`, else `x`
    /// (NaN stays NaN; the gradient is 0 where `value` was taken). Integer tensors keep
    /// their dtype, `threshold` and `value` truncated to integers (as PyTorch); bool is an
    /// error.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![0.5f32, 1.0, 2.0], [3]);
    /// assert_eq!(x.threshold(1.0, -9.0).to_vec::<f32>().unwrap(), vec![-9.0, -9.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn threshold(&self, threshold: f64, value: f64) -> Tensor {
        unwrap_or_panic(self.try_threshold(threshold, value))
    }

    /// Fallible [`Tensor::threshold`].
    pub fn try_threshold(&self, threshold: f64, value: f64) -> Result<Tensor> {
        self.numeric_input("threshold")?;
        let (t, v) = (self.scalar_in_dtype(threshold), self.scalar_in_dtype(value));
        Tensor::try_where(&self.try_le(t)?, v, self)
    }

    /// PyTorch's `tanhshrink(x)`: `x - tanh(x)`. Integers are computed as f32; bool is an
    /// error.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![0.0f32, 100.0], [2]);
    /// assert_eq!(x.tanhshrink().to_vec::<f32>().unwrap(), vec![0.0, 99.0]);
    /// ```
    #[track_caller]
    pub fn tanhshrink(&self) -> Tensor {
        unwrap_or_panic(self.try_tanhshrink())
    }

    /// Fallible [`Tensor::tanhshrink`].
    pub fn try_tanhshrink(&self) -> Result<Tensor> {
        self.numeric_input("tanhshrink")?;
        let x = self.float_or_default()?;
        x.in_working_precision("tanhshrink", |x| x.try_sub(&x.try_tanh()?))
    }

    /// PyTorch's `softshrink(x, lambd)` (default `lambd = 0.5`): `x - lambd` above
    /// `lambd`, `x + lambd` below `-lambd`, 0 between (both ends included, where the
    /// gradient is 0, as PyTorch's); NaN stays NaN. A negative `lambd` is an error, as in
    /// PyTorch. Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-2.0f32, 0.25, 0.5, 3.0], [4]);
    /// assert_eq!(x.softshrink(0.5).to_vec::<f32>().unwrap(), vec![-1.5, 0.0, 0.0, 2.5]);
    /// ```
    #[track_caller]
    pub fn softshrink(&self, lambd: f64) -> Tensor {
        unwrap_or_panic(self.try_softshrink(lambd))
    }

    /// Fallible [`Tensor::softshrink`].
    pub fn try_softshrink(&self, lambd: f64) -> Result<Tensor> {
        self.require_float("softshrink")?;
        if lambd.is_nan() || lambd < 0.0 {
            return Err(KilnError::InvalidArgument {
                op: "softshrink",
                shape: self.shape.clone(),
                reason: format!("lambd must be at least 0, not {lambd}"),
            });
        }
        self.in_working_precision("softshrink", |x| {
            // NaN fails every comparison and reaches `x - lambd`, staying NaN.
            let outside =
                Tensor::try_where(&x.try_lt(-lambd)?, &x.try_add(lambd)?, &x.try_sub(lambd)?)?;
            Tensor::try_where(&x.dead_zone(lambd)?, 0.0, &outside)
        })
    }

    /// True where `-lambd <= self <= lambd` (never at NaN).
    fn dead_zone(&self, lambd: f64) -> Result<Tensor> {
        self.try_ge(-lambd)?.try_logical_and(&self.try_le(lambd)?)
    }

    /// PyTorch's `hardshrink(x, lambd)` (default `lambd = 0.5`): 0 where
    /// `-lambd <= x <= lambd`, else `x` (NaN stays NaN; the gradient is 0 in that band,
    /// its ends included, as PyTorch's). Float dtypes only.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-2.0f32, 0.25, 0.5, 3.0], [4]);
    /// assert_eq!(x.hardshrink(0.5).to_vec::<f32>().unwrap(), vec![-2.0, 0.0, 0.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn hardshrink(&self, lambd: f64) -> Tensor {
        unwrap_or_panic(self.try_hardshrink(lambd))
    }

    /// Fallible [`Tensor::hardshrink`].
    pub fn try_hardshrink(&self, lambd: f64) -> Result<Tensor> {
        self.require_float("hardshrink")?;
        Tensor::try_where(&self.dead_zone(lambd)?, 0.0, self)
    }
}
