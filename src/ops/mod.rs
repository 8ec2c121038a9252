//! The op vocabulary, in one place: every op a graph node can hold ([`Op`]) and, for each
//! elementwise op, every fact the rest of kiln needs — name, accepted dtypes, cost class,
//! exactness, domain, the scalar definition (which the CPU backend's vectorized loops, the
//! f64 kernels and the reference evaluator all run) and the CUDA C expression. Every
//! per-op decision elsewhere is an exhaustive `match` or a lookup in these tables, so a
//! forgotten op is a compile error, not a silent default.
//!
//! A leaf of the data path: it depends only on [`crate::dtype`], [`crate::shape`],
//! [`crate::device`] and [`crate::math`]. `CONTRIBUTING.md` lists the files a new op
//! touches.

mod binary;
mod generator;
mod num;
mod reduce;
mod unary;

pub use binary::{Applied, BinaryInfo, BinaryKind, BinaryOp};
pub use generator::{GenKind, Generator, seed_of};
pub use num::{Num, Scal, max_nan, min_nan, relu, sign};
pub use reduce::ReduceOp;
pub use unary::{Accepts, Domain, UnaryInfo, UnaryOp};

use crate::device::Device;
use crate::dtype::{ComputeType, DType};
use crate::shape::Movement;

/// How costly an op is per element. Fused row reductions save `Polynomial` values across
/// passes instead of recomputing them, and the fusion pass weighs kernel size with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cost {
    /// A handful of instructions (arithmetic, comparisons, selects, square roots).
    Cheap,
    /// A polynomial evaluation or more (exp, log, trig, tanh, pow...).
    Polynomial,
}

/// Implemented by whatever applies a unary op: the CPU backend's run loops, [`One`].
pub trait Map<T> {
    /// `out = f(in)` element by element.
    fn map<F: Fn(T) -> T>(&mut self, f: F);

    /// Like [`Map::map`] for an op that also has a whole-run form `run(src, out)`, faster
    /// than `f` per element (sin and cos vectorize their common case and fix up rare
    /// elements after). Implementations use `run` for runs and `f` for single values.
    fn map_runs<F: Fn(T) -> T, R: Fn(&[T], &mut [T])>(&mut self, f: F, run: R) {
        let _ = run;
        self.map(f)
    }
}

/// Implemented by whatever applies a binary op.
pub trait Map2<T> {
    /// `out = f(a, b)` element by element (arithmetic ops).
    fn map2<F: Fn(T, T) -> T>(&mut self, f: F);
    /// `out = f(a, b)` as a bool (comparisons).
    fn compare<F: Fn(T, T) -> bool>(&mut self, f: F);
}

/// Applies an op to one value (or one pair): the scalar form of the tables, used by the
/// reference evaluator and by `apply`.
pub struct One<T> {
    x: T,
    y: T,
    out: Applied<T>,
}

impl<T: Num> One<T> {
    fn new(x: T) -> Self {
        One {
            x,
            y: x,
            out: Applied::Value(x),
        }
    }

    fn new2(x: T, y: T) -> Self {
        One {
            x,
            y,
            out: Applied::Value(x),
        }
    }

    fn value(&self) -> T {
        match self.out {
            Applied::Value(v) => v,
            Applied::Bool(b) => {
                if b {
                    T::ONE
                } else {
                    T::ZERO
                }
            }
        }
    }

    fn applied(&self) -> Applied<T> {
        self.out
    }
}

impl<T: Num> Map<T> for One<T> {
    #[inline(always)]
    fn map<F: Fn(T) -> T>(&mut self, f: F) {
        self.out = Applied::Value(f(self.x));
    }
}

impl<T: Num> Map2<T> for One<T> {
    #[inline(always)]
    fn map2<F: Fn(T, T) -> T>(&mut self, f: F) {
        self.out = Applied::Value(f(self.x, self.y));
    }

    #[inline(always)]
    fn compare<F: Fn(T, T) -> bool>(&mut self, f: F) {
        self.out = Applied::Bool(f(self.x, self.y));
    }
}

/// The C type a compute type is held in by rendered CUDA kernels.
pub fn c_type(ct: ComputeType) -> &'static str {
    match ct {
        ComputeType::U8 => "unsigned char",
        ComputeType::I32 => "int",
        ComputeType::I64 => "long long",
        ComputeType::F32 => "float",
        ComputeType::F64 => "double",
    }
}

/// What a graph node computes. Inputs are the node's incoming edges, in operand order.
/// Ops are dtype-homogeneous: the tensor API inserts explicit casts, so a backend never
/// promotes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A realized leaf: the node owns a buffer.
    Buffer,
    /// A lazy leaf computed from the element index.
    Generate(Generator),
    /// A one-input elementwise op.
    Unary(UnaryOp),
    /// A two-input elementwise op.
    Binary(BinaryOp),
    /// `where(cond, a, b)`.
    Where,
    /// Convert to the node's dtype.
    Cast,
    /// Reduce the listed axes; the output keeps them with size 1 (the API reshapes them away
    /// for `keepdim = false`).
    Reduce {
        /// How the values are combined.
        op: ReduceOp,
        /// The reduced axes (sorted, distinct).
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
    /// An in-place write: the value of input 1, stored into the buffer that input 0 (a
    /// realized tensor, or an earlier `Assign` to it) holds. The node keeps that buffer in
    /// its `buffer` field as the destination.
    Assign,
    /// An indexed load, PyTorch's `gather`: `out[c] = src[c with c[axis] = index[c]]`.
    /// Inputs `[src, index]` (index i64, the output's shape; `index.shape[d] <= src.shape[d]`
    /// off the axis). Fuses like an elementwise op; `src` is read from a buffer.
    Gather {
        /// The axis of `src` that `index` selects along.
        axis: usize,
    },
    /// Reduces values into their indexed places: `out[c with c[axis] = index[c]] =
    /// reduce(out[..], values[c])` for every position `c` of the index, in row-major order.
    /// Inputs `[index, values]` (same shape; the output starts at the reduction's identity)
    /// or `[index, values, init]` (`init` has the node's shape and dtype and is where the
    /// output starts: PyTorch's `include_self`). `Sum` without `init` is the gradient of
    /// `Gather`. Deterministic on the CPU.
    Scatter {
        /// The axis of the output that `index` selects along.
        axis: usize,
        /// How values meeting in one place combine.
        reduce: ScatterReduce,
    },
    /// Running sums or products along `axis` (PyTorch's `cumsum`, `cumprod`): the output has
    /// the input's shape and dtype. Floats accumulate in f64 and round each output once;
    /// integers wrap. The input is read from a buffer.
    Scan {
        /// Running sum or product.
        op: ScanOp,
        /// The axis scanned along.
        axis: usize,
    },
    /// The i64 permutation that sorts each lane along `axis` (PyTorch's
    /// `argsort(stable=True)`): ties keep their index order and NaN sorts above every
    /// number (last ascending, first descending). The input is read from a buffer.
    ArgSort {
        /// The axis sorted along.
        axis: usize,
        /// Largest first when true.
        descending: bool,
    },
}

/// How a [`Op::Scatter`] combines the values that meet in one place (PyTorch's
/// `scatter_reduce` names; `mean` is a sum divided by a count, composed in the tensor API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScatterReduce {
    /// `sum` (`scatter_add`).
    Sum,
    /// `prod`.
    Prod,
    /// `amax` (NaN wins).
    Amax,
    /// `amin` (NaN wins).
    Amin,
}

impl ScatterReduce {
    /// The PyTorch name (`reduce=` of `scatter_reduce`).
    pub fn name(self) -> &'static str {
        match self {
            ScatterReduce::Sum => "sum",
            ScatterReduce::Prod => "prod",
            ScatterReduce::Amax => "amax",
            ScatterReduce::Amin => "amin",
        }
    }

    /// The tensor op a user called for it (for errors): `scatter_add` for sums, else
    /// `scatter_reduce`.
    pub fn op_name(self) -> &'static str {
        match self {
            ScatterReduce::Sum => "scatter_add",
            _ => "scatter_reduce",
        }
    }

    /// Its node and kernel names: `scatter_add`, `scatter_prod`, `scatter_amax`,
    /// `scatter_amin`.
    pub fn tag(self) -> &'static str {
        match self {
            ScatterReduce::Sum => "scatter_add",
            ScatterReduce::Prod => "scatter_prod",
            ScatterReduce::Amax => "scatter_amax",
            ScatterReduce::Amin => "scatter_amin",
        }
    }

    /// Where a float place starts when nothing is reduced into it: 0, 1, -∞ or +∞.
    pub fn float_identity(self) -> f64 {
        match self {
            ScatterReduce::Sum => 0.0,
            ScatterReduce::Prod => 1.0,
            ScatterReduce::Amax => f64::NEG_INFINITY,
            ScatterReduce::Amin => f64::INFINITY,
        }
    }

    /// Where an integer or bool place of `dtype` starts: 0, 1, or the dtype's lowest or
    /// highest value (false or true for bool).
    pub fn int_identity(self, dtype: DType) -> i64 {
        let (lo, hi) = match dtype {
            DType::Bool => (0, 1),
            DType::U8 => (0, u8::MAX as i64),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            _ => (i64::MIN, i64::MAX),
        };
        match self {
            ScatterReduce::Sum => 0,
            ScatterReduce::Prod => 1,
            ScatterReduce::Amax => lo,
            ScatterReduce::Amin => hi,
        }
    }

    /// `a` combined with `b` in f64 (NaN wins `amax` and `amin`).
    pub fn combine_f64(self, a: f64, b: f64) -> f64 {
        match self {
            ScatterReduce::Sum => a + b,
            ScatterReduce::Prod => a * b,
            ScatterReduce::Amax => max_nan(a, b),
            ScatterReduce::Amin => min_nan(a, b),
        }
    }

    /// `a` combined with `b` as integers (sums and products wrap in i64; the caller wraps
    /// to the dtype).
    pub fn combine_i64(self, a: i64, b: i64) -> i64 {
        match self {
            ScatterReduce::Sum => a.wrapping_add(b),
            ScatterReduce::Prod => a.wrapping_mul(b),
            ScatterReduce::Amax => a.max(b),
            ScatterReduce::Amin => a.min(b),
        }
    }
}

/// The running total a [`Op::Scan`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// `cumsum`.
    Sum,
    /// `cumprod`.
    Prod,
}

impl ScanOp {
    /// The PyTorch name.
    pub fn name(self) -> &'static str {
        match self {
            ScanOp::Sum => "cumsum",
            ScanOp::Prod => "cumprod",
        }
    }
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
            Op::Assign => "assign".into(),
            Op::Gather { axis } => format!("gather[{axis}]"),
            Op::Scatter { axis, reduce } => format!("{}[{axis}]", reduce.tag()),
            Op::Scan { op, axis } => format!("{}[{axis}]", op.name()),
            Op::ArgSort { axis, descending } => {
                format!("argsort[{axis}{}]", if *descending { ", desc" } else { "" })
            }
        }
    }

    /// The op's name without arguments (for errors).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Op::Buffer => "buffer",
            Op::Generate(g) => g.name(),
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Cast => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::Matmul => "matmul",
            Op::Movement(m) => m.name(),
            Op::Contiguous => "contiguous",
            Op::ToDevice(_) => "to",
            Op::Assign => "assign",
            Op::Gather { .. } => "gather",
            Op::Scatter { reduce, .. } => reduce.op_name(),
            Op::Scan { op, .. } => op.name(),
            Op::ArgSort { .. } => "argsort",
        }
    }

    /// Ops whose result can carry a gradient back to their inputs.
    pub fn is_differentiable(&self) -> bool {
        match self {
            Op::Binary(b) => !b.is_comparison(),
            Op::Reduce { op, .. } => !op.is_arg(),
            Op::Unary(_)
            | Op::Where
            | Op::Cast
            | Op::Matmul
            | Op::Movement(_)
            | Op::Contiguous
            | Op::ToDevice(_)
            | Op::Gather { .. }
            | Op::Scatter { .. }
            | Op::Scan { .. } => true,
            Op::Buffer | Op::Generate(_) | Op::Assign | Op::ArgSort { .. } => false,
        }
    }

    /// True when operand `i` must be read from a buffer (a matmul's operands, what a
    /// transfer moves, the table a gather indexes, a scatter's inputs, what a scan or sort
    /// reads).
    pub fn needs_buffer(&self, i: usize) -> bool {
        match self {
            Op::Matmul
            | Op::ToDevice(_)
            | Op::Scatter { .. }
            | Op::Scan { .. }
            | Op::ArgSort { .. } => true,
            Op::Gather { .. } => i == 0,
            _ => false,
        }
    }

    /// Elementwise ops (including casts): the ones fusion chains together.
    pub fn is_elementwise(&self) -> bool {
        match self {
            // A gather is elementwise over its output: one indexed load per element.
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast | Op::Gather { .. } => true,
            Op::Buffer
            | Op::Generate(_)
            | Op::Reduce { .. }
            | Op::Matmul
            | Op::Movement(_)
            | Op::Contiguous
            | Op::ToDevice(_)
            | Op::Assign
            | Op::Scatter { .. }
            | Op::Scan { .. }
            | Op::ArgSort { .. } => false,
        }
    }

    /// The per-element cost of an elementwise op (`Cheap` for everything else).
    pub fn cost(&self) -> Cost {
        match self {
            Op::Unary(u) => u.info().cost,
            Op::Binary(b) => b.info().cost,
            _ => Cost::Cheap,
        }
    }
}
