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
    Neg,
    Abs,
    Relu,
    Exp,
    Log,
    Log2,
    Sqrt,
    Recip,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Gelu,
    Erf,
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
}

/// The facts of one unary op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnaryInfo {
    /// Lowercase name (also the `Tensor` method).
    pub name: &'static str,
    pub accepts: Accepts,
    pub cost: Cost,
    /// IEEE-correctly rounded in f32 and f64 (so every backend and the reference agree to
    /// the bit).
    pub exact: bool,
    pub domain: Domain,
    /// Largest error of the f32 CPU kernel in ulp (see `docs/math.md`).
    pub ulp_f32: f32,
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
    }
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
            UnaryOp::Exp => m.map(|x: T| x.float(m32::exp_f32, f64::exp)),
            UnaryOp::Log => m.map(|x: T| x.float(m32::log_f32, f64::ln)),
            UnaryOp::Log2 => m.map(|x: T| x.float(m32::log2_f32, f64::log2)),
            UnaryOp::Sqrt => m.map(|x: T| x.float(f32::sqrt, f64::sqrt)),
            UnaryOp::Recip => m.map(|x: T| x.float(|v| 1.0 / v, |v| 1.0 / v)),
            UnaryOp::Sin => m.map_runs(
                |x: T| x.float(m32::sin_f32, f64::sin),
                |s: &[T], o: &mut [T]| T::float_run(s, o, m32::sin_f32_run, f64_run(f64::sin)),
            ),
            UnaryOp::Cos => m.map_runs(
                |x: T| x.float(m32::cos_f32, f64::cos),
                |s: &[T], o: &mut [T]| T::float_run(s, o, m32::cos_f32_run, f64_run(f64::cos)),
            ),
            UnaryOp::Tanh => m.map(|x: T| x.float(m32::tanh_f32, f64::tanh)),
            UnaryOp::Sigmoid => m.map(|x: T| x.float(m32::sigmoid_f32, m64::sigmoid)),
            UnaryOp::Gelu => m.map(|x: T| x.float(m32::gelu_f32, m64::gelu)),
            UnaryOp::Erf => m.map(|x: T| x.float(m32::erf_f32, m64::erf)),
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
        }
    }
}
