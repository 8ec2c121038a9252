//! The binary elementwise ops and their facts: name, result kind, cost, exactness, the
//! scalar definition the CPU loops and the reference evaluator run, and the CUDA C
//! expression. Adding one means a variant, one arm per `match` below, and a `Tensor` method.

use super::{Cost, Map2, Num, One, c_type};
use crate::dtype::{ComputeType, DType};

/// Two-input elementwise ops. Comparisons produce `bool`; the rest keep the input dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `a + b` (integers wrap).
    Add,
    /// `a - b` (integers wrap).
    Sub,
    /// `a * b` (integers wrap).
    Mul,
    /// `a / b`, true division (integer operands are cast to f32 first).
    Div,
    /// `a^b` (PyTorch's `pow`; integers wrap, and a negative exponent gives the
    /// truncated real result).
    Pow,
    /// The larger of `a` and `b`, NaN if either is (PyTorch's `maximum`).
    Max,
    /// The smaller of `a` and `b`, NaN if either is (PyTorch's `minimum`).
    Min,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// PyTorch's `remainder` (Python's `%`): the sign of the divisor.
    Remainder,
    /// PyTorch's `fmod` (C's `fmod`): the sign of the dividend.
    Fmod,
    /// PyTorch's `floor_divide` (Python's `//`).
    FloorDiv,
    /// PyTorch's `atan2(a, b)`: the angle of the point `(b, a)` in `[-π, π]`, with C's
    /// signed zeros and infinities (integer operands are cast to f32 first).
    Atan2,
}

/// What a binary op produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryKind {
    /// A value of the (promoted) input dtype.
    Arithmetic,
    /// A bool.
    Comparison,
}

/// The facts of one binary op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinaryInfo {
    /// Lowercase name (also the `Tensor` method).
    pub name: &'static str,
    /// Whether the result is a value or a bool.
    pub kind: BinaryKind,
    /// Per-element cost class.
    pub cost: Cost,
    /// IEEE-correctly rounded for floats (every backend agrees with the reference).
    pub exact: bool,
    /// Integer operands are cast to f32 first (true division).
    pub int_to_float: bool,
    /// The most the result can change across an arbitrarily short interval of either
    /// operand, relative to the divisor's magnitude: 0 for continuous ops, 1 for `fmod`,
    /// `remainder` (a jump of `|b|`) and `floor_divide` (a jump of 1 where `|b| >= 1`).
    /// The fuzzers widen their tolerance by it where an operand is inexact.
    pub jump: u8,
}

const fn info(
    name: &'static str,
    kind: BinaryKind,
    cost: Cost,
    exact: bool,
    int_to_float: bool,
) -> BinaryInfo {
    BinaryInfo {
        name,
        kind,
        cost,
        exact,
        int_to_float,
        jump: 0,
    }
}

/// A division-like op with a discontinuity wherever `a / b` crosses an integer.
const fn stepped(name: &'static str, exact: bool) -> BinaryInfo {
    BinaryInfo {
        jump: 1,
        ..info(name, BinaryKind::Arithmetic, Cost::Cheap, exact, false)
    }
}

/// The result of [`BinaryOp::apply`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Applied<T> {
    /// An arithmetic op's result.
    Value(T),
    /// A comparison's result.
    Bool(bool),
}

impl<T> Applied<T> {
    /// Converts a value result, keeping a bool one.
    pub fn map_value<U>(self, f: impl FnOnce(T) -> U) -> Applied<U> {
        match self {
            Applied::Value(v) => Applied::Value(f(v)),
            Applied::Bool(b) => Applied::Bool(b),
        }
    }
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: &'static [BinaryOp] = &[
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Remainder,
        BinaryOp::Fmod,
        BinaryOp::FloorDiv,
        BinaryOp::Atan2,
    ];

    /// The op's facts.
    pub const fn info(self) -> BinaryInfo {
        use BinaryKind::*;
        use Cost::*;
        match self {
            BinaryOp::Add => info("add", Arithmetic, Cheap, true, false),
            BinaryOp::Sub => info("sub", Arithmetic, Cheap, true, false),
            BinaryOp::Mul => info("mul", Arithmetic, Cheap, true, false),
            BinaryOp::Div => info("div", Arithmetic, Cheap, true, true),
            BinaryOp::Pow => info("pow", Arithmetic, Polynomial, false, false),
            BinaryOp::Max => info("maximum", Arithmetic, Cheap, true, false),
            BinaryOp::Min => info("minimum", Arithmetic, Cheap, true, false),
            BinaryOp::Lt => info("lt", Comparison, Cheap, true, false),
            BinaryOp::Le => info("le", Comparison, Cheap, true, false),
            BinaryOp::Gt => info("gt", Comparison, Cheap, true, false),
            BinaryOp::Ge => info("ge", Comparison, Cheap, true, false),
            BinaryOp::Eq => info("eq", Comparison, Cheap, true, false),
            BinaryOp::Ne => info("ne", Comparison, Cheap, true, false),
            // fmod is exact in IEEE arithmetic; remainder adds `b` (one rounding);
            // floor_divide rounds a quotient.
            BinaryOp::Remainder => stepped("remainder", false),
            BinaryOp::Fmod => stepped("fmod", true),
            BinaryOp::FloorDiv => stepped("floor_divide", false),
            // Continuous except across the negative `b` axis, which the fuzzers' positive
            // operand box never crosses.
            BinaryOp::Atan2 => info("atan2", Arithmetic, Polynomial, false, true),
        }
    }

    /// Lowercase name.
    pub const fn name(self) -> &'static str {
        self.info().name
    }

    /// Comparison ops (result dtype bool).
    pub const fn is_comparison(self) -> bool {
        matches!(self.info().kind, BinaryKind::Comparison)
    }

    /// Runs the op over `m`'s operands with the op's scalar definition (one arm per op, so
    /// every loop `m` builds is compiled for one op).
    #[inline(always)]
    pub fn map<T: Num, M: Map2<T>>(self, m: &mut M) {
        // Multi-line definitions go through an always-inlined closure: a function passed by
        // path is called through a shim compiled without the loop's SIMD features (see
        // `float_op!` in `unary.rs`).
        macro_rules! inlined {
            ($f:path) => {
                #[inline(always)]
                |x: T, y: T| $f(x, y)
            };
        }
        match self {
            BinaryOp::Add => m.map2(T::add),
            BinaryOp::Sub => m.map2(T::sub),
            BinaryOp::Mul => m.map2(T::mul),
            BinaryOp::Div => m.map2(T::div),
            BinaryOp::Pow => m.map2(inlined!(T::pow)),
            BinaryOp::Max => m.map2(super::max_nan),
            BinaryOp::Min => m.map2(super::min_nan),
            BinaryOp::Lt => m.compare(|x: T, y: T| x < y),
            BinaryOp::Le => m.compare(|x: T, y: T| x <= y),
            BinaryOp::Gt => m.compare(|x: T, y: T| x > y),
            BinaryOp::Ge => m.compare(|x: T, y: T| x >= y),
            BinaryOp::Eq => m.compare(|x: T, y: T| x == y),
            BinaryOp::Ne => m.compare(|x: T, y: T| x != y),
            BinaryOp::Remainder => m.map2(inlined!(T::remainder)),
            BinaryOp::Fmod => m.map2(inlined!(T::fmod)),
            BinaryOp::FloorDiv => m.map2(inlined!(T::floor_divide)),
            BinaryOp::Atan2 => m.map2(
                #[inline(always)]
                |y: T, x: T| T::float2(y, x, crate::math::f32::atan2_f32, f64::atan2),
            ),
        }
    }

    /// The op on one pair of values.
    #[inline(always)]
    pub fn apply<T: Num>(self, x: T, y: T) -> Applied<T> {
        let mut one = One::new2(x, y);
        self.map(&mut one);
        one.applied()
    }

    /// The CUDA C expression for `x op y`, operands in `in_dtype`'s compute type.
    pub fn cuda(self, in_dtype: DType, x: &str, y: &str) -> String {
        let ct = in_dtype.compute();
        let c = c_type(ct);
        let f32_ = ct == ComputeType::F32;
        match self {
            BinaryOp::Add => format!("kiln_add(({c}){x}, ({c}){y})"),
            BinaryOp::Sub => format!("kiln_sub(({c}){x}, ({c}){y})"),
            BinaryOp::Mul => format!("kiln_mul(({c}){x}, ({c}){y})"),
            BinaryOp::Div => format!("({x} / {y})"),
            BinaryOp::Pow if !in_dtype.is_float() => {
                format!("({c})kiln_ipow((long long){x}, (long long){y})")
            }
            BinaryOp::Pow if f32_ => format!("powf({x}, {y})"),
            BinaryOp::Pow => format!("pow({x}, {y})"),
            BinaryOp::Max => format!("kiln_max<{c}>({x}, {y})"),
            BinaryOp::Min => format!("kiln_min<{c}>({x}, {y})"),
            BinaryOp::Lt => format!("(unsigned char)({x} < {y})"),
            BinaryOp::Le => format!("(unsigned char)({x} <= {y})"),
            BinaryOp::Gt => format!("(unsigned char)({x} > {y})"),
            BinaryOp::Ge => format!("(unsigned char)({x} >= {y})"),
            BinaryOp::Eq => format!("(unsigned char)({x} == {y})"),
            BinaryOp::Ne => format!("(unsigned char)({x} != {y})"),
            BinaryOp::Remainder if in_dtype.is_float() => {
                format!("kiln_fremainder(({c}){x}, ({c}){y})")
            }
            BinaryOp::Remainder => format!("kiln_iremainder<{c}>({x}, {y})"),
            BinaryOp::Fmod if f32_ => format!("fmodf({x}, {y})"),
            BinaryOp::Fmod if in_dtype.is_float() => format!("fmod({x}, {y})"),
            BinaryOp::Fmod => format!("kiln_ifmod<{c}>({x}, {y})"),
            BinaryOp::FloorDiv if in_dtype.is_float() => {
                format!("kiln_ffloor_divide(({c}){x}, ({c}){y})")
            }
            BinaryOp::FloorDiv => format!("kiln_ifloor_divide<{c}>({x}, {y})"),
            BinaryOp::Atan2 if f32_ => format!("atan2f({x}, {y})"),
            BinaryOp::Atan2 => format!("atan2(({c}){x}, ({c}){y})"),
        }
    }
}
