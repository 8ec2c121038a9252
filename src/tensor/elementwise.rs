//! Elementwise ops: NumPy broadcasting, PyTorch dtype promotion, explicit casts in the graph.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::graph::{self as graph, BinaryOp, Op, UnaryOp};
use crate::shape::{Movement, broadcast_shapes};
use std::borrow::Cow;

/// The right-hand side of a binary op: a tensor or a plain number.
#[derive(Debug)]
pub enum Operand<'a> {
    /// A borrowed tensor.
    Ref(&'a Tensor),
    /// An owned tensor.
    Owned(Tensor),
    /// A plain number, broadcast to the tensor's shape.
    Scalar(Scalar),
}

impl Operand<'_> {
    /// The same operand, borrowed (an owned tensor lent by reference).
    pub(crate) fn reborrow(&self) -> Operand<'_> {
        match self {
            Operand::Ref(t) => Operand::Ref(t),
            Operand::Owned(t) => Operand::Ref(t),
            Operand::Scalar(s) => Operand::Scalar(*s),
        }
    }
}

impl<'a> From<&'a Tensor> for Operand<'a> {
    fn from(t: &'a Tensor) -> Self {
        Operand::Ref(t)
    }
}
impl From<Tensor> for Operand<'_> {
    fn from(t: Tensor) -> Self {
        Operand::Owned(t)
    }
}
macro_rules! operand_scalar {
    ($($t:ty),*) => {$(
        impl From<$t> for Operand<'_> {
            fn from(v: $t) -> Self {
                Operand::Scalar(Scalar::from(v))
            }
        }
    )*};
}
operand_scalar!(f32, f64, i32, i64, u8, bool);
impl From<Scalar> for Operand<'_> {
    fn from(v: Scalar) -> Self {
        Operand::Scalar(v)
    }
}

impl Operand<'_> {
    fn tensor(&self) -> Option<&Tensor> {
        match self {
            Operand::Ref(t) => Some(t),
            Operand::Owned(t) => Some(t),
            Operand::Scalar(_) => None,
        }
    }
}

/// Two operands made alike: both tensors of one dtype and shape.
type Aligned<'o> = (Cow<'o, Tensor>, Cow<'o, Tensor>, DType, Vec<usize>);

/// Resolves two operands (at least one a tensor) into same-dtype, same-shape tensors
/// (borrowing an operand that already has the dtype and shape).
fn align<'o>(op: &'static str, a: &'o Operand<'_>, b: &'o Operand<'_>) -> Result<Aligned<'o>> {
    let (ta, tb) = (a.tensor(), b.tensor());
    let (dtype, shape, device) = match (ta, tb) {
        (Some(x), Some(y)) => {
            x.require_same_device(op, y)?;
            (
                DType::promote(x.dtype, y.dtype),
                broadcast_shapes(op, &x.shape, &y.shape)?,
                x.device,
            )
        }
        (Some(x), None) => match b {
            Operand::Scalar(s) => (
                DType::promote_scalar(x.dtype, *s),
                x.shape.clone(),
                x.device,
            ),
            _ => return Err(KilnError::internal("operand mismatch")),
        },
        (None, Some(y)) => match a {
            Operand::Scalar(s) => (
                DType::promote_scalar(y.dtype, *s),
                y.shape.clone(),
                y.device,
            ),
            _ => return Err(KilnError::internal("operand mismatch")),
        },
        (None, None) => {
            return Err(KilnError::internal(format!(
                "{op}: at least one operand must be a tensor"
            )));
        }
    };
    // The result's size is checked under this op's name before any operand is broadcast.
    crate::shape::check_shape(op, &shape, dtype)?;
    let lift = |o: &'o Operand<'_>| -> Result<Cow<'o, Tensor>> {
        match o {
            Operand::Scalar(s) => Tensor::try_full_on(&shape, *s, dtype, device).map(Cow::Owned),
            _ => {
                let t = o.tensor().ok_or_else(|| KilnError::internal("operand"))?;
                if t.dtype == dtype && t.shape == shape {
                    Ok(Cow::Borrowed(t))
                } else {
                    t.try_cast(dtype)?.expand_view(&shape).map(Cow::Owned)
                }
            }
        }
    };
    Ok((lift(a)?, lift(b)?, dtype, shape))
}

/// When both operands are pending permutes of same-shaped tensors by one permutation, or
/// one is such a permute and the other a number: the operands un-permuted and the
/// permutation (see [`Tensor::permuted_source`]). `a + b` of two convolution outputs (a
/// residual connection) then runs, and is stored, batch last as both are laid out.
fn permuted_operands<'o>(
    a: &Operand<'_>,
    b: &Operand<'_>,
) -> Result<Option<(Operand<'o>, Operand<'o>, Vec<usize>)>> {
    // An operand un-permuted, with its permutation and its source's shape (empty for a
    // number).
    type Unpermuted<'o> = (Operand<'o>, Vec<usize>, Vec<usize>);
    let source = |o: &Operand<'_>| -> Result<Option<Unpermuted<'o>>> {
        match o {
            Operand::Scalar(s) => Ok(Some((Operand::Scalar(*s), vec![], vec![]))),
            _ => {
                let Some(t) = o.tensor() else {
                    return Ok(None);
                };
                Ok(t.permuted_source()?.map(|(src, perm)| {
                    let shape = src.shape.clone();
                    (Operand::Owned(src), perm, shape)
                }))
            }
        }
    };
    if a.tensor().is_none() && b.tensor().is_none() {
        return Ok(None);
    }
    let (Some((x, pa, sa)), Some((y, pb, sb))) = (source(a)?, source(b)?) else {
        return Ok(None);
    };
    let both = a.tensor().is_some() && b.tensor().is_some();
    if both && (pa != pb || sa != sb) {
        return Ok(None);
    }
    let perm = if pa.is_empty() { pb } else { pa };
    Ok(Some((x, y, perm)))
}

impl Tensor {
    /// Records a binary op on two aligned operands.
    fn binary(a: Operand<'_>, b: Operand<'_>, op: BinaryOp) -> Result<Tensor> {
        if let Some((a, b, perm)) = permuted_operands(&a, &b)? {
            return Tensor::binary(a, b, op)?.record_movement(Movement::Permute(perm));
        }
        let name = op.name();
        let (mut x, mut y, mut dtype, shape) = align(name, &a, &b)?;
        let mut op = op;
        if dtype == DType::Bool {
            op = match op {
                // PyTorch: bool + bool is logical or, bool * bool logical and.
                BinaryOp::Add => BinaryOp::Max,
                BinaryOp::Mul => BinaryOp::Min,
                BinaryOp::Sub
                | BinaryOp::Pow
                | BinaryOp::Remainder
                | BinaryOp::Fmod
                | BinaryOp::FloorDiv => {
                    return Err(KilnError::UnsupportedDType {
                        op: name,
                        dtype,
                        detail: ": use logical ops or cast to an integer dtype".into(),
                    });
                }
                other => other,
            };
        }
        if op.info().int_to_float && !dtype.is_float() {
            dtype = DType::default_float();
            x = Cow::Owned(x.try_cast(dtype)?);
            y = Cow::Owned(y.try_cast(dtype)?);
        }
        let out_dtype = if op.is_comparison() {
            DType::Bool
        } else {
            dtype
        };
        let device = x.device;
        Tensor::record(Op::Binary(op), &[&x, &y], shape, out_dtype, device)
    }

    fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        if self.dtype == DType::Bool {
            match op {
                // PyTorch: the sign of a bool is itself; its square is an i64.
                UnaryOp::Sign => return self.unchanged(),
                UnaryOp::Square => return self.try_cast(DType::I64)?.unary(op),
                _ => {}
            }
        }
        if self.dtype == DType::Bool && !op.needs_float() {
            return Err(KilnError::UnsupportedDType {
                op: op.name(),
                dtype: self.dtype,
                detail: String::new(),
            });
        }
        let x = if op.needs_float() && !self.dtype.is_float() {
            self.try_cast(DType::default_float())?
        } else {
            self.clone()
        };
        if let Some((src, perm)) = x.permuted_source()? {
            return src.unary(op)?.record_movement(Movement::Permute(perm));
        }
        Tensor::record(Op::Unary(op), &[&x], x.shape.clone(), x.dtype, x.device)
    }

    /// Whether this tensor, through any pads, is a value in its own row-major layout (a
    /// realized buffer or a computed value) rather than another view of something (a
    /// permute, an expand). Convolutions use it to copy such an input batch last once
    /// before reading its windows.
    pub(crate) fn is_padded_row_major(&self) -> Result<bool> {
        graph::with_graph(|g| {
            let mut key = self.key;
            loop {
                match &g.node(key)?.op {
                    Op::Movement(Movement::Pad { .. }) => match g.inputs(key)?.first() {
                        Some(&k) => key = k,
                        None => return Ok(false),
                    },
                    Op::Movement(_) => return Ok(false),
                    _ => return Ok(true),
                }
            }
        })
    }

    /// When this tensor is a pending `permute` of another, that tensor and the permutation.
    ///
    /// Elementwise ops over a permuted operand are recorded on the operand's source and
    /// permuted after: the same values, but a result that is stored (an activation kept
    /// for the backward pass, its gradient) is laid out as its source is. A convolution's
    /// output is a batch-first view of batch-last columns; a ReLU recorded on the view
    /// would store its output, and its gradient, batch first, and every kernel around it
    /// would transpose.
    fn permuted_source(&self) -> Result<Option<(Tensor, Vec<usize>)>> {
        graph::with_graph(|g| {
            let n = g.node(self.key)?;
            let Op::Movement(Movement::Permute(perm)) = &n.op else {
                return Ok(None);
            };
            let perm = perm.clone();
            let tracked = n.autograd.is_some();
            let Some(&src) = g.inputs(self.key)?.first() else {
                return Ok(None);
            };
            // A permute recorded without history (under `no_grad`) of a tensor that has it
            // stays as it is: the op over its source would send gradients through.
            if g.node(src)?.autograd.is_some() != tracked {
                return Ok(None);
            }
            Ok(Some((Tensor::retained(g, src)?, perm)))
        })
    }

    /// Applies any unary op of the op table (`x.unary_op(UnaryOp::Exp)` is `x.exp()`): for
    /// code that is generic over ops.
    #[track_caller]
    pub fn unary_op(&self, op: UnaryOp) -> Tensor {
        unwrap_or_panic(self.unary(op))
    }

    /// Fallible [`Tensor::unary_op`].
    pub fn try_unary_op(&self, op: UnaryOp) -> Result<Tensor> {
        self.unary(op)
    }

    /// Applies any binary op of the op table (`x.binary_op(BinaryOp::Add, y)` is `x + y`).
    #[track_caller]
    pub fn binary_op<'a>(&self, op: BinaryOp, rhs: impl Into<Operand<'a>>) -> Tensor {
        unwrap_or_panic(self.try_binary_op(op, rhs))
    }

    /// Fallible [`Tensor::binary_op`].
    pub fn try_binary_op<'a>(&self, op: BinaryOp, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
        match op {
            BinaryOp::Pow => self.try_pow(rhs),
            _ => Tensor::binary(Operand::Ref(self), rhs.into(), op),
        }
    }

    /// Converts to `dtype` (float → int truncates toward zero, saturating; NaN → 0).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        unwrap_or_panic(self.try_cast(dtype))
    }

    /// Fallible [`Tensor::cast`].
    pub fn try_cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        Tensor::record(Op::Cast, &[self], self.shape.clone(), dtype, self.device)
    }

    /// `where(cond, a, b)`: `a` where `cond` is true, else `b`, all broadcast together.
    /// `cond` must be a bool tensor (compare first, e.g. `x.ne(0)`), as in PyTorch.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 2.0, -3.0], &[3]);
    /// let y = Tensor::where_(&x.gt(0.0), &x, 0.0);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 2.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn where_<'a, 'b>(
        cond: &Tensor,
        a: impl Into<Operand<'a>>,
        b: impl Into<Operand<'b>>,
    ) -> Tensor {
        unwrap_or_panic(Self::try_where(cond, a, b))
    }

    /// Fallible [`Tensor::where_`].
    pub fn try_where<'a, 'b>(
        cond: &Tensor,
        a: impl Into<Operand<'a>>,
        b: impl Into<Operand<'b>>,
    ) -> Result<Tensor> {
        let (a, b) = (a.into(), b.into());
        if cond.dtype != DType::Bool {
            return Err(KilnError::UnsupportedDType {
                op: "where",
                dtype: cond.dtype,
                detail: ": the condition must be bool (compare first, e.g. cond.ne(0))".into(),
            });
        }
        let c = cond.clone();
        let (x, y, dtype, shape) = if a.tensor().is_none() && b.tensor().is_none() {
            // Both scalars: take the dtype they promote to and the condition's shape.
            let (sa, sb) = match (&a, &b) {
                (Operand::Scalar(p), Operand::Scalar(q)) => (*p, *q),
                _ => return Err(KilnError::internal("where operands")),
            };
            let dt = DType::promote(sa.natural_dtype(), sb.natural_dtype());
            (
                Cow::Owned(Tensor::try_full_on(&c.shape, sa, dt, c.device)?),
                Cow::Owned(Tensor::try_full_on(&c.shape, sb, dt, c.device)?),
                dt,
                c.shape.clone(),
            )
        } else {
            align("where", &a, &b)?
        };
        c.require_same_device("where", &x)?;
        let shape = broadcast_shapes("where", &c.shape, &shape)?;
        let (c, x, y) = (
            c.expand_view(&shape)?,
            x.expand_view(&shape)?,
            y.expand_view(&shape)?,
        );
        let device = x.device;
        Tensor::record(Op::Where, &[&c, &x, &y], shape, dtype, device)
    }

    /// Clamps into `[min, max]`.
    #[track_caller]
    pub fn clamp(&self, min: impl Into<Scalar>, max: impl Into<Scalar>) -> Tensor {
        unwrap_or_panic(self.try_clamp(min, max))
    }

    /// Fallible [`Tensor::clamp`].
    pub fn try_clamp(&self, min: impl Into<Scalar>, max: impl Into<Scalar>) -> Result<Tensor> {
        self.try_maximum(min.into())?.try_minimum(max.into())
    }

    /// Clamps from below only: PyTorch's `clamp_min` (`clamp(min=m)`), `maximum(self, m)`.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-2.0f32, 0.5], [2]);
    /// assert_eq!(x.clamp_min(0.0).to_vec::<f32>().unwrap(), vec![0.0, 0.5]);
    /// ```
    #[track_caller]
    pub fn clamp_min(&self, min: impl Into<Scalar>) -> Tensor {
        unwrap_or_panic(self.try_clamp_min(min))
    }

    /// Fallible [`Tensor::clamp_min`].
    pub fn try_clamp_min(&self, min: impl Into<Scalar>) -> Result<Tensor> {
        self.try_maximum(min.into())
    }

    /// Clamps from above only: PyTorch's `clamp_max` (`clamp(max=m)`), `minimum(self, m)`.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![-2.0f32, 0.5], [2]);
    /// assert_eq!(x.clamp_max(0.0).to_vec::<f32>().unwrap(), vec![-2.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn clamp_max(&self, max: impl Into<Scalar>) -> Tensor {
        unwrap_or_panic(self.try_clamp_max(max))
    }

    /// Fallible [`Tensor::clamp_max`].
    pub fn try_clamp_max(&self, max: impl Into<Scalar>) -> Result<Tensor> {
        self.try_minimum(max.into())
    }

    /// Clamps into `[min, max]` with bounds that are tensors (or numbers), all three
    /// broadcast together: PyTorch's `clamp(min=Tensor, max=Tensor)`, computed as
    /// `minimum(maximum(self, min), max)`. A NaN in `self` or in either bound gives NaN, and
    /// where `min > max` the result is `max`, as in PyTorch. The dtype is the promotion of
    /// all three. Gradients split evenly at ties (`docs/semantics.md`).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![-2.0f32, 0.5, 9.0], [3]);
    /// let lo = Tensor::from_vec(vec![-1.0f32, 1.0, 0.0], [3]);
    /// let hi = Tensor::from_vec(vec![1.0f32], [1]);
    /// assert_eq!(x.clamp_tensor(&lo, &hi).to_vec::<f32>().unwrap(), vec![-1.0, 1.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn clamp_tensor<'a, 'b>(
        &self,
        min: impl Into<Operand<'a>>,
        max: impl Into<Operand<'b>>,
    ) -> Tensor {
        unwrap_or_panic(self.try_clamp_tensor(min, max))
    }

    /// Fallible [`Tensor::clamp_tensor`].
    pub fn try_clamp_tensor<'a, 'b>(
        &self,
        min: impl Into<Operand<'a>>,
        max: impl Into<Operand<'b>>,
    ) -> Result<Tensor> {
        let (lo, hi) = (min.into(), max.into());
        // Devices and shapes are checked under this op's name first.
        let mut shape = self.shape.clone();
        for t in [lo.tensor(), hi.tensor()].into_iter().flatten() {
            self.require_same_device("clamp", t)?;
            shape = broadcast_shapes("clamp", &shape, &t.shape)?;
        }
        crate::shape::check_shape("clamp", &shape, self.dtype)?;
        self.try_maximum(lo)?.try_minimum(hi)
    }

    /// True where `self` is NaN (PyTorch's `isnan`; never for integers and bool).
    #[track_caller]
    pub fn isnan(&self) -> Tensor {
        unwrap_or_panic(self.try_isnan())
    }

    /// Fallible [`Tensor::isnan`].
    pub fn try_isnan(&self) -> Result<Tensor> {
        if self.dtype.is_float() {
            // NaN is the one value not equal to itself.
            self.try_ne(self)
        } else {
            Tensor::try_full_on(&self.shape, false, DType::Bool, self.device)
        }
    }

    /// True where `self` is `+inf` or `-inf` (PyTorch's `isinf`; never for integers).
    #[track_caller]
    pub fn isinf(&self) -> Tensor {
        unwrap_or_panic(self.try_isinf())
    }

    /// Fallible [`Tensor::isinf`].
    pub fn try_isinf(&self) -> Result<Tensor> {
        if self.dtype.is_float() {
            self.try_abs()?.try_eq(f64::INFINITY)
        } else {
            Tensor::try_full_on(&self.shape, false, DType::Bool, self.device)
        }
    }

    /// True where `self` is neither infinite nor NaN (PyTorch's `isfinite`; always for
    /// integers and bool).
    #[track_caller]
    pub fn isfinite(&self) -> Tensor {
        unwrap_or_panic(self.try_isfinite())
    }

    /// Fallible [`Tensor::isfinite`].
    pub fn try_isfinite(&self) -> Result<Tensor> {
        if self.dtype.is_float() {
            // |NaN| < inf is false, like |±inf| < inf.
            self.try_abs()?.try_lt(f64::INFINITY)
        } else {
            Tensor::try_full_on(&self.shape, true, DType::Bool, self.device)
        }
    }

    /// `self ** exponent`, with an integer-power fast path: `pow(2)` records a multiply,
    /// `pow(0.5)` a square root. An integer tensor raised to a negative integer scalar is an
    /// error, as in PyTorch; with a tensor exponent, negative exponents give the truncated
    /// real result (0 unless the base is ±1; see `docs/semantics.md`).
    #[track_caller]
    pub fn pow<'a>(&self, exponent: impl Into<Operand<'a>>) -> Tensor {
        unwrap_or_panic(self.try_pow(exponent))
    }

    /// Fallible [`Tensor::pow`].
    pub fn try_pow<'a>(&self, exponent: impl Into<Operand<'a>>) -> Result<Tensor> {
        let e = exponent.into();
        if let Operand::Scalar(s) = e {
            let f = s.to_f64();
            if !self.dtype.is_float() && matches!(s, Scalar::Int(i) if i < 0) {
                return Err(KilnError::InvalidArgument {
                    op: "pow",
                    shape: self.shape.clone(),
                    reason: format!(
                        "integers to negative integer powers are not allowed ({} ** {s}); cast to a float dtype first",
                        self.dtype
                    ),
                });
            }
            let base = if DType::promote_scalar(self.dtype, s) != self.dtype {
                self.try_cast(DType::promote_scalar(self.dtype, s))?
            } else {
                self.clone()
            };
            if f == 1.0 {
                // A new tensor even where no cast was needed (PyTorch's `pow` writes one).
                return self.unless_self(base);
            }
            if f == 2.0 && base.dtype != DType::Bool {
                return base.try_mul(&base);
            }
            if f == 0.5 && base.dtype.is_float() {
                return base.try_sqrt();
            }
        }
        Tensor::binary(Operand::Ref(self), e, BinaryOp::Pow)
    }
}

macro_rules! binary_methods {
    ($($name:ident, $try_name:ident, $op:ident, $doc:literal;)*) => {
        impl Tensor {
            $(
                #[doc = $doc]
                #[doc = ""]
                #[doc = "Broadcasts both sides; a plain number on the right keeps the tensor's dtype category."]
                #[track_caller]
                pub fn $name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Tensor {
                    unwrap_or_panic(self.$try_name(rhs))
                }

                #[doc = concat!("Fallible form of `", stringify!($name), "`.")]
                pub fn $try_name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
                    Tensor::binary(Operand::Ref(self), rhs.into(), BinaryOp::$op)
                }
            )*
        }
    };
}

binary_methods! {
    add, try_add, Add, "Elementwise sum.";
    sub, try_sub, Sub, "Elementwise difference.";
    mul, try_mul, Mul, "Elementwise product.";
    div, try_div, Div, "Elementwise true division (integers divide as f32).";
    maximum, try_maximum, Max, "Elementwise maximum (NaN propagates).";
    minimum, try_minimum, Min, "Elementwise minimum (NaN propagates).";
    lt, try_lt, Lt, "`self < rhs` as bool.";
    le, try_le, Le, "`self <= rhs` as bool.";
    gt, try_gt, Gt, "`self > rhs` as bool.";
    ge, try_ge, Ge, "`self >= rhs` as bool.";
    eq, try_eq, Eq, "`self == rhs` as bool.";
    ne, try_ne, Ne, "`self != rhs` as bool.";
    remainder, try_remainder, Remainder, "Elementwise remainder with the divisor's sign (PyTorch's `remainder`, Python's `%`; integer division by zero gives 0, see `docs/semantics.md`).";
    atan2, try_atan2, Atan2, "Elementwise `atan2(self, other)`: the angle of the point `(other, self)` in `[-π, π]` (PyTorch's `atan2`; integers are cast to f32 first).";
    fmod, try_fmod, Fmod, "Elementwise remainder with the dividend's sign (PyTorch's `fmod`, C's `fmod`; integer division by zero gives 0).";
    floor_divide, try_floor_divide, FloorDiv, "Elementwise floor division (PyTorch's `floor_divide`, Python's `//`; integers stay integers, integer division by zero gives 0).";
}

impl Tensor {
    /// `lhs - self` (PyTorch's `rsub`; what `2.0 - &x` computes).
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, 5.0], [2]);
    /// assert_eq!(x.rsub(2.0).to_vec::<f32>().unwrap(), vec![1.0, -3.0]);
    /// ```
    #[track_caller]
    pub fn rsub<'a>(&self, lhs: impl Into<Operand<'a>>) -> Tensor {
        unwrap_or_panic(self.try_rsub(lhs))
    }

    /// Fallible [`Tensor::rsub`].
    pub fn try_rsub<'a>(&self, lhs: impl Into<Operand<'a>>) -> Result<Tensor> {
        Tensor::binary(lhs.into(), Operand::Ref(self), BinaryOp::Sub)
    }

    /// `lhs / self` (what `1.0 / &x` computes).
    #[track_caller]
    pub fn rdiv<'a>(&self, lhs: impl Into<Operand<'a>>) -> Tensor {
        unwrap_or_panic(self.try_rdiv(lhs))
    }

    /// Fallible [`Tensor::rdiv`].
    pub fn try_rdiv<'a>(&self, lhs: impl Into<Operand<'a>>) -> Result<Tensor> {
        Tensor::binary(lhs.into(), Operand::Ref(self), BinaryOp::Div)
    }

    /// `base ** self` (PyTorch's `torch.pow(base, x)`).
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![0.0f32, 3.0], [2]);
    /// assert_eq!(x.rpow(2.0).to_vec::<f32>().unwrap(), vec![1.0, 8.0]);
    /// ```
    #[track_caller]
    pub fn rpow<'a>(&self, base: impl Into<Operand<'a>>) -> Tensor {
        unwrap_or_panic(self.try_rpow(base))
    }

    /// Fallible [`Tensor::rpow`].
    pub fn try_rpow<'a>(&self, base: impl Into<Operand<'a>>) -> Result<Tensor> {
        Tensor::binary(base.into(), Operand::Ref(self), BinaryOp::Pow)
    }
}

macro_rules! unary_methods {
    ($($name:ident, $try_name:ident, $op:ident, $doc:literal;)*) => {
        impl Tensor {
            $(
                #[doc = $doc]
                #[track_caller]
                pub fn $name(&self) -> Tensor {
                    unwrap_or_panic(self.$try_name())
                }

                #[doc = concat!("Fallible form of `", stringify!($name), "`.")]
                pub fn $try_name(&self) -> Result<Tensor> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

unary_methods! {
    neg, try_neg, Neg, "Elementwise negation.";
    abs, try_abs, Abs, "Elementwise absolute value.";
    exp, try_exp, Exp, "Elementwise `e^x` (integers become f32).";
    log, try_log, Log, "Elementwise natural logarithm.";
    log2, try_log2, Log2, "Elementwise base-2 logarithm (exact for powers of two).";
    sqrt, try_sqrt, Sqrt, "Elementwise square root.";
    recip, try_recip, Recip, "Elementwise `1/x`.";
    sin, try_sin, Sin, "Elementwise sine.";
    cos, try_cos, Cos, "Elementwise cosine.";
    tanh, try_tanh, Tanh, "Elementwise hyperbolic tangent.";
    tan, try_tan, Tan, "Elementwise tangent (of radians).";
    asin, try_asin, Asin, "Elementwise arcsine, in `[-π/2, π/2]`; NaN outside `[-1, 1]`.";
    acos, try_acos, Acos, "Elementwise arccosine, in `[0, π]`; NaN outside `[-1, 1]`.";
    atan, try_atan, Atan, "Elementwise arctangent, in `(-π/2, π/2)`.";
    sinh, try_sinh, Sinh, "Elementwise hyperbolic sine.";
    cosh, try_cosh, Cosh, "Elementwise hyperbolic cosine.";
    asinh, try_asinh, Asinh, "Elementwise inverse hyperbolic sine.";
    acosh, try_acosh, Acosh, "Elementwise inverse hyperbolic cosine; NaN below 1.";
    atanh, try_atanh, Atanh, "Elementwise inverse hyperbolic tangent; `±inf` at `±1`, NaN beyond.";
    sigmoid, try_sigmoid, Sigmoid, "Elementwise logistic function `1/(1+e^-x)`.";
    relu, try_relu, Relu, "Elementwise `max(x, 0)` (NaN stays NaN).";
    gelu, try_gelu, Gelu, "Elementwise GELU, the exact erf form `x·Φ(x)`.";
    erf, try_erf, Erf, "Elementwise error function.";
    floor, try_floor, Floor, "Elementwise floor (integers unchanged; bool is an error, as PyTorch).";
    ceil, try_ceil, Ceil, "Elementwise ceiling (integers unchanged).";
    round, try_round, Round, "Elementwise rounding to the nearest integer, ties to even (PyTorch's `round` without `decimals`; integers unchanged).";
    trunc, try_trunc, Trunc, "Elementwise rounding toward zero (integers unchanged).";
    sign, try_sign, Sign, "Elementwise sign: -1, 0 or 1 in the input's dtype (`sign(NaN) = 0`, `sign(-0.0) = +0`, bool unchanged, as PyTorch).";
    log1p, try_log1p, Log1p, "Elementwise `ln(1 + x)`, accurate near 0.";
    expm1, try_expm1, Expm1, "Elementwise `e^x - 1`, accurate near 0.";
    exp2, try_exp2, Exp2, "Elementwise `2^x`.";
    rsqrt, try_rsqrt, Rsqrt, "Elementwise `1 / sqrt(x)`.";
    square, try_square, Square, "Elementwise `x * x` (integers wrap; bool becomes i64, as PyTorch).";
    softplus, try_softplus, Softplus, "Elementwise `ln(1 + e^x)`, `x` itself above 20 (PyTorch's `softplus` with `beta = 1`, `threshold = 20`).";
    silu, try_silu, Silu, "Elementwise SiLU (swish) `x * sigmoid(x)`.";
}

impl Tensor {
    /// GELU's tanh approximation, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`: PyTorch's
    /// `gelu(x, approximate='tanh')` (GPT-2's activation). Recorded as elementwise ops,
    /// which fuse into one kernel and are differentiated op by op; half types compute in
    /// f32 and round once, integers become f32. [`Tensor::gelu`] is the exact form.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![0.0f32, 1.0], [2]);
    /// let y = x.gelu_tanh().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 0.841_192).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn gelu_tanh(&self) -> Tensor {
        unwrap_or_panic(self.try_gelu_tanh())
    }

    /// Fallible [`Tensor::gelu_tanh`].
    pub fn try_gelu_tanh(&self) -> Result<Tensor> {
        const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
        let x = if self.dtype.is_float() && !self.dtype.is_half() {
            self.clone()
        } else {
            self.try_cast(DType::F32)?
        };
        let inner = x
            .try_mul(&x)?
            .try_mul(0.044_715)?
            .try_add(1.0)?
            .try_mul(&x)?
            .try_mul(SQRT_2_OVER_PI)?;
        let y = inner.try_tanh()?.try_add(1.0)?.try_mul(&x)?.try_mul(0.5)?;
        if self.dtype.is_half() {
            y.try_cast(self.dtype)
        } else {
            Ok(y)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;

    /// The op behind `t` and its input keys.
    fn node_of(t: &Tensor) -> (Op, Vec<crate::graph::NodeKey>) {
        graph::with_graph(|g| Ok::<_, KilnError>((g.node(t.key)?.op.clone(), g.inputs(t.key)?)))
            .expect("node")
    }

    #[test]
    fn unary_ops_over_a_permute_are_recorded_on_its_source() {
        // A batch-first view of batch-last data: `relu` runs on the data as laid out and
        // the view comes after, with the same values (through a second permute too).
        let x = Tensor::try_randn([3, 4, 5, 2], 1, DType::F32).expect("randn");
        x.realize().expect("realizes");
        let view = x.try_permute([3, 0, 1, 2]).expect("permute");
        let y = view.try_relu().expect("relu");
        assert_eq!(y.shape(), &[2, 3, 4, 5]);
        let (op, inputs) = node_of(&y);
        assert_eq!(op, Op::Movement(Movement::Permute(vec![3, 0, 1, 2])));
        let (inner, src) = graph::with_graph(|g| {
            Ok::<_, KilnError>((g.node(inputs[0])?.op.clone(), g.inputs(inputs[0])?))
        })
        .expect("node");
        assert_eq!(inner, Op::Unary(UnaryOp::Relu));
        assert_eq!(src, vec![x.key]);
        let want: Vec<f32> = reference::evaluate(&view)
            .expect("reference")
            .to_f64()
            .iter()
            .map(|&v| v.max(0.0) as f32)
            .collect();
        assert_eq!(y.to_vec::<f32>().expect("reads"), want);
        let twice = view
            .try_permute([1, 0, 2, 3])
            .expect("permute")
            .try_exp()
            .expect("exp");
        assert!(matches!(
            node_of(&twice).0,
            Op::Movement(Movement::Permute(_))
        ));
        let want: Vec<f32> = reference::evaluate(&view.try_permute([1, 0, 2, 3]).expect("p"))
            .expect("reference")
            .to_f64()
            .iter()
            .map(|&v| v.exp() as f32)
            .collect();
        let got = twice.to_vec::<f32>().expect("reads");
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{g} vs {w}");
        }
        // Binary ops: two permutes of same-shaped tensors by one permutation, or a permute
        // and a number, run on the sources; a permute beside anything else does not.
        let z = Tensor::try_randn([3, 4, 5, 2], 2, DType::F32).expect("randn");
        z.realize().expect("realizes");
        let zv = z.try_permute([3, 0, 1, 2]).expect("permute");
        let sum = view.try_add(&zv).expect("add");
        let (op, inputs) = node_of(&sum);
        assert_eq!(op, Op::Movement(Movement::Permute(vec![3, 0, 1, 2])));
        let inner = graph::with_graph(|g| g.inputs(inputs[0])).expect("inputs");
        assert_eq!(inner, vec![x.key, z.key]);
        let scaled = view.try_rsub(2.0).expect("rsub");
        assert!(matches!(
            node_of(&scaled).0,
            Op::Movement(Movement::Permute(_))
        ));
        let plain = Tensor::try_randn([2, 3, 4, 5], 3, DType::F32).expect("randn");
        assert_eq!(
            node_of(&view.try_add(&plain).expect("add")).0,
            Op::Binary(BinaryOp::Add)
        );
        let other = zv.try_permute([0, 2, 1, 3]).expect("permute");
        let mixed = view
            .try_permute([0, 2, 1, 3])
            .expect("permute")
            .try_mul(&other)
            .expect("mul");
        assert!(matches!(
            node_of(&mixed).0,
            Op::Movement(Movement::Permute(_))
        ));
        let xs = reference::evaluate(&view).expect("reference").to_f64();
        let zs = reference::evaluate(&zv).expect("reference").to_f64();
        let got = sum.to_vec::<f32>().expect("reads");
        let got_scaled = scaled.to_vec::<f32>().expect("reads");
        for i in 0..xs.len() {
            assert_eq!(got[i], (xs[i] as f32) + (zs[i] as f32));
            assert_eq!(got_scaled[i], 2.0 - xs[i] as f32);
        }
        // A permute recorded under `no_grad` of a tensor that requires grad keeps its op
        // on the view, so no gradient reaches the source.
        let w = Tensor::try_randn([3, 4], 4, DType::F32)
            .expect("randn")
            .requires_grad_(true);
        let frozen = crate::autograd::no_grad(|| w.try_permute([1, 0])).expect("permute");
        let r = frozen.try_exp().expect("exp");
        assert!(!r.requires_grad());
        assert_eq!(node_of(&r).0, Op::Unary(UnaryOp::Exp));
        let both = frozen.try_mul(&frozen).expect("mul");
        assert!(!both.requires_grad());
        // Other views are left as they are.
        let sliced = x
            .try_slice_dim(0, 0, 2, 1)
            .expect("slice")
            .try_relu()
            .expect("relu");
        assert_eq!(node_of(&sliced).0, Op::Unary(UnaryOp::Relu));
    }
}
