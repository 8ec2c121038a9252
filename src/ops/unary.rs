//! The unary elementwise ops and every fact about each: name, accepted dtypes, cost,
//! exactness, domain, the scalar definition every CPU loop and the reference evaluator run,
//! and the CUDA C expression the renderer emits. Adding a unary op means adding a variant
//! and one arm in each `match` below (the compiler lists them), plus a `Tensor` method.

use super::{Cost, Map, Num, One, c_type};
use crate::dtype::{ComputeType, DType};
use crate::math::f32 as m32;
use crate::math::f64 as m64;

/// One-input elementwise ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x` (integers wrap).
    Neg,
    /// `|x|` (integers wrap: `abs(MIN) = MIN`).
    Abs,
    /// `max(x, 0)`, keeping NaN.
    Relu,
    /// `e^x`.
    Exp,
    /// The natural logarithm.
    Log,
    /// The base-2 logarithm.
    Log2,
    /// The square root.
    Sqrt,
    /// `1 / x` (PyTorch's `reciprocal`).
    Recip,
    /// Sine, of radians.
    Sin,
    /// Cosine, of radians.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// The logistic function `1 / (1 + e^-x)`.
    Sigmoid,
    /// Exact GELU, `x·Φ(x)` with `Φ` the standard normal CDF (PyTorch's default).
    Gelu,
    /// The error function.
    Erf,
    /// Rounds toward `-inf` (identity on integers).
    Floor,
    /// Rounds toward `+inf` (identity on integers).
    Ceil,
    /// Rounds to the nearest integer, ties to even (identity on integers).
    Round,
    /// Rounds toward zero (identity on integers).
    Trunc,
    /// `-1`, `0` or `1` as `x` is negative, zero or positive (0 for NaN).
    Sign,
    /// `ln(1 + x)`, accurate near 0.
    Log1p,
    /// `e^x - 1`, accurate near 0.
    Expm1,
    /// `2^x`.
    Exp2,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `x·x` (integers wrap).
    Square,
    /// `ln(1 + e^x)`, and `x` above 20 (PyTorch's `softplus` with `beta = 1`,
    /// `threshold = 20`).
    Softplus,
    /// `x · sigmoid(x)` (PyTorch's `silu`, also called swish).
    Silu,
    /// Tangent, of radians.
    Tan,
    /// Arcsine, in `[-π/2, π/2]` (NaN outside `[-1, 1]`).
    Asin,
    /// Arccosine, in `[0, π]` (NaN outside `[-1, 1]`).
    Acos,
    /// Arctangent, in `(-π/2, π/2)`.
    Atan,
    /// Hyperbolic sine.
    Sinh,
    /// Hyperbolic cosine.
    Cosh,
    /// Inverse hyperbolic sine.
    Asinh,
    /// Inverse hyperbolic cosine (NaN below 1).
    Acosh,
    /// Inverse hyperbolic tangent (`±inf` at `±1`, NaN beyond).
    Atanh,
}

/// Which input dtypes an op takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepts {
    /// Integers and floats keep their dtype; bool is rejected.
    Numeric,
    /// Floats; integer and bool inputs are cast to f32 first (as PyTorch does).
    Float,
}

/// Where an op is defined and well conditioned (the fuzzer draws inputs from here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// Every value.
    All,
    /// `x >= 0`.
    NonNegative,
    /// `x > 0`.
    Positive,
    /// `x != 0`.
    NonZero,
    /// `-1 < x < 1`: asin, acos and atanh are defined there, and tan is well conditioned
    /// (its poles at `±π/2` stay out of reach).
    Unit,
    /// `x >= 1` (acosh).
    AtLeastOne,
}

/// The facts of one unary op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnaryInfo {
    /// Lowercase name (also the `Tensor` method).
    pub name: &'static str,
    /// Which input dtypes the op takes.
    pub accepts: Accepts,
    /// Per-element cost class.
    pub cost: Cost,
    /// IEEE-correctly rounded in f32 and f64 (so every backend and the reference agree to
    /// the bit).
    pub exact: bool,
    /// Where the op is defined and well conditioned.
    pub domain: Domain,
    /// Largest error of the f32 CPU kernel in ulp (see `docs/math.md`).
    pub ulp_f32: f32,
    /// The most the result can change across an arbitrarily short input interval: 0 for
    /// continuous ops, 1 for floor/ceil/round/trunc, 2 for sign (the fuzzers widen their
    /// tolerance by it where the input is inexact).
    pub jump: u8,
}

const fn info(
    name: &'static str,
    accepts: Accepts,
    cost: Cost,
    exact: bool,
    domain: Domain,
    ulp_f32: f32,
) -> UnaryInfo {
    UnaryInfo {
        name,
        accepts,
        cost,
        exact,
        domain,
        ulp_f32,
        jump: 0,
    }
}

/// A piecewise-constant op: exact, cheap, defined everywhere, with steps of `jump`.
const fn step(name: &'static str, jump: u8) -> UnaryInfo {
    UnaryInfo {
        jump,
        ..info(name, Accepts::Numeric, Cost::Cheap, true, Domain::All, 0.0)
    }
}

/// The closure `|x: T| x.float(f, g)` for an op defined by an f32 function `f` and an f64
/// function `g`. Every closure is `#[inline(always)]` and calls the function by name: a
/// function item passed as a value is called through a `Fn::call` shim that LLVM may keep
/// out of line, and that shim is compiled without the SIMD features of the loop calling it
/// (each `mul_add` becoming a call to `fmaf`, nothing vectorized).
macro_rules! float_op {
    ($f:path, $g:path) => {
        #[inline(always)]
        |x: T| {
            x.float(
                #[inline(always)]
                |v: f32| $f(v),
                #[inline(always)]
                |v: f64| $g(v),
            )
        }
    };
}

/// The run form of [`float_op!`]: `f` over f32 runs, `g` per element over f64 runs.
macro_rules! float_run_op {
    ($f:path, $g:path) => {
        #[inline(always)]
        |s: &[T], o: &mut [T]| {
            T::float_run(
                s,
                o,
                #[inline(always)]
                |s: &[f32], o: &mut [f32]| $f(s, o),
                f64_run(
                    #[inline(always)]
                    |v: f64| $g(v),
                ),
            )
        }
    };
}

/// `f` applied over an f64 run.
#[inline(always)]
fn f64_run(f: impl Fn(f64) -> f64) -> impl Fn(&[f64], &mut [f64]) {
    move |s, o| {
        for (y, &x) in o.iter_mut().zip(s) {
            *y = f(x);
        }
    }
}

impl UnaryOp {
    /// Every unary op (the fuzzer and the docs iterate over this).
    pub const ALL: &'static [UnaryOp] = &[
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Relu,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log2,
        UnaryOp::Sqrt,
        UnaryOp::Recip,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::Erf,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Trunc,
        UnaryOp::Sign,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Exp2,
        UnaryOp::Rsqrt,
        UnaryOp::Square,
        UnaryOp::Softplus,
        UnaryOp::Silu,
        UnaryOp::Tan,
        UnaryOp::Asin,
        UnaryOp::Acos,
        UnaryOp::Atan,
        UnaryOp::Sinh,
        UnaryOp::Cosh,
        UnaryOp::Asinh,
        UnaryOp::Acosh,
        UnaryOp::Atanh,
    ];

    /// The op's facts.
    pub const fn info(self) -> UnaryInfo {
        use Accepts::*;
        use Cost::*;
        use Domain::*;
        match self {
            UnaryOp::Neg => info("neg", Numeric, Cheap, true, All, 0.0),
            UnaryOp::Abs => info("abs", Numeric, Cheap, true, All, 0.0),
            UnaryOp::Relu => info("relu", Numeric, Cheap, true, All, 0.0),
            UnaryOp::Exp => info("exp", Float, Polynomial, false, All, 1.0),
            UnaryOp::Log => info("log", Float, Polynomial, false, Positive, 1.0),
            UnaryOp::Log2 => info("log2", Float, Polynomial, false, Positive, 1.5),
            UnaryOp::Sqrt => info("sqrt", Float, Cheap, true, NonNegative, 0.5),
            UnaryOp::Recip => info("recip", Float, Cheap, true, NonZero, 0.5),
            UnaryOp::Sin => info("sin", Float, Polynomial, false, All, 2.0),
            UnaryOp::Cos => info("cos", Float, Polynomial, false, All, 2.0),
            UnaryOp::Tanh => info("tanh", Float, Polynomial, false, All, 2.0),
            UnaryOp::Sigmoid => info("sigmoid", Float, Polynomial, false, All, 2.0),
            UnaryOp::Gelu => info("gelu", Float, Polynomial, false, All, 5.0),
            UnaryOp::Erf => info("erf", Float, Polynomial, false, All, 1.5),
            UnaryOp::Floor => step("floor", 1),
            UnaryOp::Ceil => step("ceil", 1),
            UnaryOp::Round => step("round", 1),
            UnaryOp::Trunc => step("trunc", 1),
            UnaryOp::Sign => step("sign", 2),
            UnaryOp::Log1p => info("log1p", Float, Polynomial, false, NonNegative, 1.0),
            UnaryOp::Expm1 => info("expm1", Float, Polynomial, false, All, 1.5),
            UnaryOp::Exp2 => info("exp2", Float, Polynomial, false, All, 1.0),
            UnaryOp::Rsqrt => info("rsqrt", Float, Cheap, false, Positive, 1.0),
            UnaryOp::Square => info("square", Numeric, Cheap, true, All, 0.0),
            UnaryOp::Softplus => info("softplus", Float, Polynomial, false, All, 2.0),
            UnaryOp::Silu => info("silu", Float, Polynomial, false, All, 1.0),
            // Computed in f64 and rounded once (`math::f32::tan_f32` and the rest).
            UnaryOp::Tan => info("tan", Float, Polynomial, false, Unit, 1.0),
            UnaryOp::Asin => info("asin", Float, Polynomial, false, Unit, 1.0),
            UnaryOp::Acos => info("acos", Float, Polynomial, false, Unit, 1.0),
            UnaryOp::Atan => info("atan", Float, Polynomial, false, All, 1.0),
            UnaryOp::Sinh => info("sinh", Float, Polynomial, false, All, 1.0),
            UnaryOp::Cosh => info("cosh", Float, Polynomial, false, All, 1.0),
            UnaryOp::Asinh => info("asinh", Float, Polynomial, false, All, 1.0),
            UnaryOp::Acosh => info("acosh", Float, Polynomial, false, AtLeastOne, 1.0),
            UnaryOp::Atanh => info("atanh", Float, Polynomial, false, Unit, 1.0),
        }
    }

    /// Lowercase name.
    pub const fn name(self) -> &'static str {
        self.info().name
    }

    /// True for ops defined only on floats (integer inputs are cast to f32 first).
    pub const fn needs_float(self) -> bool {
        matches!(self.info().accepts, Accepts::Float)
    }

    /// Runs the op over `m`'s operands: each arm hands `m` the op's scalar definition, so
    /// a loop built by `m` is compiled (and vectorized) for this op alone.
    #[inline(always)]
    pub fn map<T: Num, M: Map<T>>(self, m: &mut M) {
        match self {
            UnaryOp::Neg => m.map(T::neg),
            UnaryOp::Abs => m.map(T::abs),
            UnaryOp::Relu => m.map(super::relu),
            UnaryOp::Exp => m.map(float_op!(m32::exp_f32, f64::exp)),
            UnaryOp::Log => m.map(float_op!(m32::log_f32, f64::ln)),
            UnaryOp::Log2 => m.map(float_op!(m32::log2_f32, f64::log2)),
            UnaryOp::Sqrt => m.map(float_op!(f32::sqrt, f64::sqrt)),
            UnaryOp::Recip => m.map(
                #[inline(always)]
                |x: T| x.float(|v| 1.0 / v, |v| 1.0 / v),
            ),
            UnaryOp::Sin => m.map_runs(
                float_op!(m32::sin_f32, f64::sin),
                float_run_op!(m32::sin_f32_run, f64::sin),
            ),
            UnaryOp::Cos => m.map_runs(
                float_op!(m32::cos_f32, f64::cos),
                float_run_op!(m32::cos_f32_run, f64::cos),
            ),
            UnaryOp::Tanh => m.map(float_op!(m32::tanh_f32, f64::tanh)),
            UnaryOp::Sigmoid => m.map(float_op!(m32::sigmoid_f32, m64::sigmoid)),
            UnaryOp::Gelu => m.map(float_op!(m32::gelu_f32, m64::gelu)),
            UnaryOp::Erf => m.map(float_op!(m32::erf_f32, m64::erf)),
            // Identity on integers (`float` leaves them alone), as PyTorch.
            UnaryOp::Floor => m.map(float_op!(m32::floor_f32, f64::floor)),
            UnaryOp::Ceil => m.map(float_op!(m32::ceil_f32, f64::ceil)),
            UnaryOp::Round => m.map(float_op!(m32::round_even_f32, f64::round_ties_even)),
            UnaryOp::Trunc => m.map(float_op!(m32::trunc_f32, f64::trunc)),
            UnaryOp::Sign => m.map(super::sign),
            UnaryOp::Log1p => m.map(float_op!(m32::log1p_f32, f64::ln_1p)),
            UnaryOp::Expm1 => m.map(float_op!(m32::expm1_f32, f64::exp_m1)),
            UnaryOp::Exp2 => m.map(float_op!(m32::exp2_f32, f64::exp2)),
            // Two roundings, as PyTorch's CPU kernel (`1 / sqrt(x)`).
            UnaryOp::Rsqrt => m.map(
                #[inline(always)]
                |x: T| x.float(|v| 1.0 / v.sqrt(), |v| 1.0 / v.sqrt()),
            ),
            UnaryOp::Square => m.map(
                #[inline(always)]
                |x: T| T::mul(x, x),
            ),
            UnaryOp::Softplus => m.map(float_op!(m32::softplus_f32, m64::softplus)),
            UnaryOp::Silu => m.map(float_op!(m32::silu_f32, m64::silu)),
            UnaryOp::Tan => m.map(float_op!(m32::tan_f32, f64::tan)),
            UnaryOp::Asin => m.map(float_op!(m32::asin_f32, f64::asin)),
            UnaryOp::Acos => m.map(float_op!(m32::acos_f32, f64::acos)),
            UnaryOp::Atan => m.map(float_op!(m32::atan_f32, f64::atan)),
            UnaryOp::Sinh => m.map(float_op!(m32::sinh_f32, f64::sinh)),
            UnaryOp::Cosh => m.map(float_op!(m32::cosh_f32, f64::cosh)),
            UnaryOp::Asinh => m.map(float_op!(m32::asinh_f32, m64::asinh)),
            UnaryOp::Acosh => m.map(float_op!(m32::acosh_f32, m64::acosh)),
            UnaryOp::Atanh => m.map(float_op!(m32::atanh_f32, m64::atanh)),
        }
    }

    /// The op on one value (what [`UnaryOp::map`] does per element).
    #[inline(always)]
    pub fn apply<T: Num>(self, x: T) -> T {
        let mut one = One::new(x);
        self.map(&mut one);
        one.value()
    }

    /// The CUDA C expression for this op on `a`, computed in `dtype`'s compute type.
    pub fn cuda(self, dtype: DType, a: &str) -> String {
        let ct = dtype.compute();
        let f32_ = ct == ComputeType::F32;
        let call = |f: &str, d: &str| {
            if f32_ {
                format!("{f}({a})")
            } else {
                format!("{d}({a})")
            }
        };
        let c = c_type(ct);
        match self {
            UnaryOp::Neg if dtype.is_float() => format!("-{a}"),
            UnaryOp::Neg => format!("kiln_sub(({c})0, {a})"),
            UnaryOp::Abs if dtype.is_float() => call("fabsf", "fabs"),
            UnaryOp::Abs if dtype == DType::U8 => a.to_string(),
            UnaryOp::Abs => format!("({a} < 0 ? kiln_sub(({c})0, {a}) : {a})"),
            UnaryOp::Relu => format!("kiln_relu<{c}>({a})"),
            UnaryOp::Exp => call("expf", "exp"),
            UnaryOp::Log => call("logf", "log"),
            UnaryOp::Log2 => call("log2f", "log2"),
            UnaryOp::Sqrt => call("sqrtf", "sqrt"),
            UnaryOp::Recip if f32_ => format!("(1.0f / {a})"),
            UnaryOp::Recip => format!("(1.0 / {a})"),
            UnaryOp::Sin => call("sinf", "sin"),
            UnaryOp::Cos => call("cosf", "cos"),
            UnaryOp::Tanh => call("tanhf", "tanh"),
            UnaryOp::Sigmoid => format!("kiln_sigmoid({a})"),
            UnaryOp::Gelu => format!("kiln_gelu({a})"),
            UnaryOp::Erf => call("erff", "erf"),
            UnaryOp::Floor if dtype.is_float() => call("floorf", "floor"),
            UnaryOp::Ceil if dtype.is_float() => call("ceilf", "ceil"),
            // rint: round half to even in the default rounding mode.
            UnaryOp::Round if dtype.is_float() => call("rintf", "rint"),
            UnaryOp::Trunc if dtype.is_float() => call("truncf", "trunc"),
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => a.to_string(),
            // 0 for NaN and ±0 (+0), as PyTorch.
            UnaryOp::Sign => format!("(({c})(({a} > ({c})0) - ({a} < ({c})0)))"),
            UnaryOp::Log1p => call("log1pf", "log1p"),
            UnaryOp::Expm1 => call("expm1f", "expm1"),
            UnaryOp::Exp2 => call("exp2f", "exp2"),
            UnaryOp::Rsqrt if f32_ => format!("(1.0f / sqrtf({a}))"),
            UnaryOp::Rsqrt => format!("(1.0 / sqrt({a}))"),
            UnaryOp::Square => format!("kiln_mul(({c}){a}, ({c}){a})"),
            UnaryOp::Softplus => format!("kiln_softplus({a})"),
            UnaryOp::Silu => format!("kiln_silu({a})"),
            UnaryOp::Tan => call("tanf", "tan"),
            UnaryOp::Asin => call("asinf", "asin"),
            UnaryOp::Acos => call("acosf", "acos"),
            UnaryOp::Atan => call("atanf", "atan"),
            UnaryOp::Sinh => call("sinhf", "sinh"),
            UnaryOp::Cosh => call("coshf", "cosh"),
            UnaryOp::Asinh => call("asinhf", "asinh"),
            UnaryOp::Acosh => call("acoshf", "acosh"),
            UnaryOp::Atanh => call("atanhf", "atanh"),
        }
    }
}
