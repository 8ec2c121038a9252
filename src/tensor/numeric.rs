//! Elementwise composites with PyTorch's names and edge cases: `logaddexp`, `hypot`,
//! `lerp`, `nan_to_num`, `isclose` and `allclose`. Each records kiln's primitives (so it
//! fuses, runs on every device and is differentiated as its parts are), arranged so that
//! no branch a `where` discards computes a NaN its gradient would carry.

use super::{Operand, Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};

impl Tensor {
    /// PyTorch's `logaddexp(x, y)`: `log(eˣ + eʸ)` without overflow, as
    /// `max(x, y) + log1p(exp(-|x - y|))`. Equal infinities give themselves
    /// (`logaddexp(-inf, -inf) = -inf`); NaN propagates. The gradient is `sigmoid(x - y)`
    /// for `x` (½ each where they are equal).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1000.0f32, f32::NEG_INFINITY, 0.0], [3]);
    /// let y = Tensor::from_vec(vec![1000.0f32, f32::NEG_INFINITY, 0.0], [3]);
    /// let z = x.logaddexp(&y).to_vec::<f32>().unwrap();
    /// assert_eq!(z[0], 1000.0 + std::f32::consts::LN_2);
    /// assert_eq!(z[1], f32::NEG_INFINITY);
    /// assert_eq!(z[2], std::f32::consts::LN_2);
    /// ```
    #[track_caller]
    pub fn logaddexp(&self, other: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_logaddexp(other))
    }

    /// Fallible [`Tensor::logaddexp`].
    pub fn try_logaddexp(&self, other: &Tensor) -> Result<Tensor> {
        let (x, y) = self.float_pair("logaddexp", other)?;
        // Equal values (equal infinities among them) differ by exactly 0, not inf - inf.
        let d = Tensor::try_where(&x.try_eq(&y)?, 0.0, &x.try_sub(&y)?)?;
        x.try_maximum(&y)?
            .try_add(&d.try_abs()?.try_neg()?.try_exp()?.try_log1p()?)
    }

    /// PyTorch's `hypot(x, y)`: `√(x² + y²)` without overflow or underflow in the squares,
    /// as `m·√(1 + (n/m)²)` with `m = max(|x|, |y|)`, `n` the smaller. An infinite
    /// argument gives `inf` (even with a NaN beside it, as C's `hypot`); `hypot(0, 0) = 0`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, 3e30, 0.0], [3]);
    /// let y = Tensor::from_vec(vec![4.0f32, 4e30, 0.0], [3]);
    /// assert_eq!(x.hypot(&y).to_vec::<f32>().unwrap(), vec![5.0, 5e30, 0.0]);
    /// ```
    #[track_caller]
    pub fn hypot(&self, other: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_hypot(other))
    }

    /// Fallible [`Tensor::hypot`].
    pub fn try_hypot(&self, other: &Tensor) -> Result<Tensor> {
        let (x, y) = self.float_pair("hypot", other)?;
        let (a, b) = (x.try_abs()?, y.try_abs()?);
        let m = a.try_maximum(&b)?;
        let n = a.try_minimum(&b)?;
        // Both zero: divide by 1 instead (the ratio is 0 and so is the result), and an
        // infinite `m` (with n/m NaN when both are) is answered by the `where` below.
        let safe = Tensor::try_where(&m.try_eq(0.0)?, 1.0, &m)?;
        let r = n.try_div(&safe)?;
        let h = m.try_mul(&r.try_mul(&r)?.try_add(1.0)?.try_sqrt()?)?;
        let inf = x.try_isinf()?.try_logical_or(&y.try_isinf()?)?;
        Tensor::try_where(&inf, f64::INFINITY, &h)
    }

    /// PyTorch's `lerp(start, end, weight)`: `start + weight·(end - start)`, evaluated as
    /// PyTorch does (from `end` when `|weight| ≥ ½`, so `weight = 1` gives `end` exactly).
    /// `weight` is a scalar or a tensor (broadcast).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let b = Tensor::from_vec(vec![3.0f32, 10.0], [2]);
    /// assert_eq!(a.lerp(&b, 0.25).to_vec::<f32>().unwrap(), vec![1.5, 4.0]);
    /// assert_eq!(a.lerp(&b, 1.0).to_vec::<f32>().unwrap(), vec![3.0, 10.0]);
    /// ```
    #[track_caller]
    pub fn lerp<'a>(&self, end: &Tensor, weight: impl Into<Operand<'a>>) -> Tensor {
        unwrap_or_panic(self.try_lerp(end, weight))
    }

    /// Fallible [`Tensor::lerp`].
    pub fn try_lerp<'a>(&self, end: &Tensor, weight: impl Into<Operand<'a>>) -> Result<Tensor> {
        let (start, end) = self.float_pair("lerp", end)?;
        let w = match weight.into() {
            Operand::Ref(t) => t.try_cast(start.dtype())?,
            Operand::Owned(t) => t.try_cast(start.dtype())?,
            Operand::Scalar(s) => Tensor::try_full_on((), s, start.dtype(), start.device())?,
        };
        let diff = end.try_sub(&start)?;
        let near_start = start.try_add(&diff.try_mul(&w)?)?;
        let near_end = end.try_sub(&diff.try_mul(&w.try_rsub(1.0)?)?)?;
        Tensor::try_where(&w.try_abs()?.try_lt(0.5)?, &near_start, &near_end)
    }

    /// PyTorch's `nan_to_num(nan=0.0, posinf=None, neginf=None)`: NaN becomes `nan`, and
    /// `±inf` become `posinf`/`neginf`, by default the dtype's largest and smallest finite
    /// values. Integers and bools come back unchanged. The gradient is 1 at finite
    /// elements and 0 at replaced ones.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.5], [4]);
    /// assert_eq!(
    ///     x.nan_to_num(0.0, None, Some(-1.0)).to_vec::<f32>().unwrap(),
    ///     vec![0.0, f32::MAX, -1.0, 1.5]
    /// );
    /// ```
    #[track_caller]
    pub fn nan_to_num(&self, nan: f64, posinf: Option<f64>, neginf: Option<f64>) -> Tensor {
        unwrap_or_panic(self.try_nan_to_num(nan, posinf, neginf))
    }

    /// Fallible [`Tensor::nan_to_num`].
    pub fn try_nan_to_num(
        &self,
        nan: f64,
        posinf: Option<f64>,
        neginf: Option<f64>,
    ) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return self.unchanged();
        }
        let largest = match self.dtype() {
            DType::F16 => f64::from(half::f16::MAX),
            DType::BF16 => f64::from(half::bf16::MAX),
            DType::F32 => f64::from(f32::MAX),
            _ => f64::MAX,
        };
        let x = Tensor::try_where(&self.try_isnan()?, nan, self)?;
        let x = Tensor::try_where(&self.try_eq(f64::INFINITY)?, posinf.unwrap_or(largest), &x)?;
        Tensor::try_where(
            &self.try_eq(f64::NEG_INFINITY)?,
            neginf.unwrap_or(-largest),
            &x,
        )
    }

    /// PyTorch's `isclose(x, y, rtol, atol, equal_nan)`: where `|x - y| ≤ atol + rtol·|y|`
    /// (bool, broadcast), or the two are equal (so equal infinities are close, and an
    /// infinity is close to nothing else); NaNs are close to each other only with
    /// `equal_nan`. PyTorch's defaults are `rtol = 1e-5`, `atol = 1e-8`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 1e-9, f32::INFINITY, f32::NAN], [4]);
    /// let y = Tensor::from_vec(vec![1.000001f32, 0.0, f32::INFINITY, f32::NAN], [4]);
    /// assert_eq!(x.isclose(&y, 1e-5, 1e-8, false).to_vec::<bool>().unwrap(), vec![true, true, true, false]);
    /// assert!(!x.allclose(&y, 1e-5, 1e-8, false));
    /// assert!(x.allclose(&y, 1e-5, 1e-8, true));
    /// ```
    #[track_caller]
    pub fn isclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> Tensor {
        unwrap_or_panic(self.try_isclose(other, rtol, atol, equal_nan))
    }

    /// Fallible [`Tensor::isclose`].
    pub fn try_isclose(
        &self,
        other: &Tensor,
        rtol: f64,
        atol: f64,
        equal_nan: bool,
    ) -> Result<Tensor> {
        if rtol < 0.0 || atol < 0.0 {
            return Err(KilnError::InvalidArgument {
                op: "isclose",
                shape: self.shape().to_vec(),
                reason: format!("rtol ({rtol}) and atol ({atol}) must be at least 0"),
            });
        }
        let equal = self.try_eq(other)?;
        if !self.dtype().is_float() && !other.dtype().is_float() {
            // Integers (and bools): PyTorch compares their exact difference too.
            let (x, y) = (self.try_cast(DType::F64)?, other.try_cast(DType::F64)?);
            let near = x
                .try_sub(&y)?
                .try_abs()?
                .try_le(&y.try_abs()?.try_mul(rtol)?.try_add(atol)?)?;
            return equal.try_logical_or(&near);
        }
        // |x - y| is NaN or inf unless both are finite (and inf ≤ inf would make opposite
        // infinities close): only equality counts there.
        let gap = self.try_sub(other)?.try_abs()?;
        let near = gap
            .try_le(&other.try_abs()?.try_mul(rtol)?.try_add(atol)?)?
            .try_logical_and(&gap.try_isfinite()?)?;
        let mut close = equal.try_logical_or(&near)?;
        if equal_nan {
            close =
                close.try_logical_or(&self.try_isnan()?.try_logical_and(&other.try_isnan()?)?)?;
        }
        Ok(close)
    }

    /// PyTorch's `allclose`: whether [`Tensor::isclose`] holds everywhere. Realizes both
    /// tensors; panics on an error (see [`Tensor::try_allclose`]).
    #[track_caller]
    pub fn allclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> bool {
        unwrap_or_panic(self.try_allclose(other, rtol, atol, equal_nan))
    }

    /// Fallible [`Tensor::allclose`].
    pub fn try_allclose(
        &self,
        other: &Tensor,
        rtol: f64,
        atol: f64,
        equal_nan: bool,
    ) -> Result<bool> {
        self.try_isclose(other, rtol, atol, equal_nan)?
            .try_all(..)?
            .item::<bool>()
    }

    /// `self` and `other` for a float op named `op`: both float, or promoted together.
    fn float_pair(&self, op: &'static str, other: &Tensor) -> Result<(Tensor, Tensor)> {
        self.require_same_device(op, other)?;
        let dtype = DType::promote(self.dtype(), other.dtype());
        let dtype = if dtype.is_float() { dtype } else { DType::F32 };
        Ok((self.try_cast(dtype)?, other.try_cast(dtype)?))
    }
}
