//! The binary elementwise ops and their facts: name, result kind, cost, exactness, the
//! scalar definition the CPU loops and the reference evaluator run, and the CUDA C
//! expression. Adding one means a variant, one arm per `match` below, and a `Tensor` method.

use super::{Cost, Map2, Num, One, c_type};
use crate::dtype::{ComputeType, DType};

/// Two-input elementwise ops. Comparisons produce `bool`; the rest keep the input dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
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
    pub kind: BinaryKind,
    pub cost: Cost,
    /// IEEE-correctly rounded for floats (every backend agrees with the reference).
    pub exact: bool,
    /// Integer operands are cast to f32 first (true division).
    pub int_to_float: bool,
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
    }
}

/// The result of [`BinaryOp::apply`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Applied<T> {
    Value(T),
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
        match self {
            BinaryOp::Add => m.map2(T::add),
            BinaryOp::Sub => m.map2(T::sub),
            BinaryOp::Mul => m.map2(T::mul),
            BinaryOp::Div => m.map2(T::div),
            BinaryOp::Pow => m.map2(T::pow),
            BinaryOp::Max => m.map2(super::max_nan),
            BinaryOp::Min => m.map2(super::min_nan),
            BinaryOp::Lt => m.compare(|x: T, y: T| x < y),
            BinaryOp::Le => m.compare(|x: T, y: T| x <= y),
            BinaryOp::Gt => m.compare(|x: T, y: T| x > y),
            BinaryOp::Ge => m.compare(|x: T, y: T| x >= y),
            BinaryOp::Eq => m.compare(|x: T, y: T| x == y),
            BinaryOp::Ne => m.compare(|x: T, y: T| x != y),
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
        }
    }
}
