//! The ops a graph node can hold. Ops are dtype-homogeneous: the tensor API inserts explicit
//! casts, so a backend never promotes.

use crate::device::Device;
use crate::dtype::Scalar;
use crate::shape::Movement;

/// One-input elementwise ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Recip,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
}

impl UnaryOp {
    /// Ops defined only on floating-point inputs (the API casts integers to f32 first).
    pub fn needs_float(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu)
    }

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
        }
    }
}

/// Two-input elementwise ops. Comparisons produce `bool`; the rest keep the input dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

impl BinaryOp {
    /// Comparison ops (result dtype bool).
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne
        )
    }

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
        }
    }
}

/// Reductions. Sum and prod of integers run in i64 (the API casts); arg-reductions give i64
/// indices into the reduced axes (row-major over those axes), first occurrence on ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    ArgMax,
    ArgMin,
}

impl ReduceOp {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }

    /// True for argmax/argmin.
    pub fn is_arg(self) -> bool {
        matches!(self, ReduceOp::ArgMax | ReduceOp::ArgMin)
    }
}

/// Leaves computed from the element's row-major index, so they cost no memory until used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Generator {
    /// Every element is the value.
    Full(Scalar),
    /// `start + i·step` (1-D).
    Arange { start: Scalar, step: Scalar },
    /// Uniform in `[0, 1)`, a counter-based hash of `(seed, i)`.
    Rand { seed: u64 },
    /// Standard normal, Box–Muller over two hashes of `(seed, i)`.
    Randn { seed: u64 },
}

impl Generator {
    /// Lowercase name.
    pub fn name(&self) -> &'static str {
        match self {
            Generator::Full(_) => "full",
            Generator::Arange { .. } => "arange",
            Generator::Rand { .. } => "rand",
            Generator::Randn { .. } => "randn",
        }
    }
}

/// What a node computes. Inputs are the node's incoming edges, in operand order.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A realized leaf: the node owns a buffer.
    Buffer,
    /// A lazy leaf computed from the element index.
    Generate(Generator),
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `where(cond, a, b)`.
    Where,
    /// Convert to the node's dtype.
    Cast,
    /// Reduce the listed axes; the output keeps them with size 1 (the API reshapes them away
    /// for `keepdim = false`).
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
    },
    /// `[.., m, k] @ [.., k, n]` with equal batch dimensions (the API broadcasts them).
    Matmul,
    /// A zero-copy view change.
    Movement(Movement),
    /// Store the input in a fresh row-major buffer.
    Contiguous,
    /// Move to another device.
    ToDevice(Device),
}

impl Op {
    /// Short name for dumps and errors.
    pub fn name(&self) -> String {
        match self {
            Op::Buffer => "buffer".into(),
            Op::Generate(g) => g.name().into(),
            Op::Unary(u) => u.name().into(),
            Op::Binary(b) => b.name().into(),
            Op::Where => "where".into(),
            Op::Cast => "cast".into(),
            Op::Reduce { op, axes } => format!("{}{:?}", op.name(), axes),
            Op::Matmul => "matmul".into(),
            Op::Movement(m) => m.name().into(),
            Op::Contiguous => "contiguous".into(),
            Op::ToDevice(d) => format!("to({d})"),
        }
    }

    /// Elementwise ops (including casts): the ones fusion chains together.
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast)
    }
}
