//! The kernel IR: a small typed, device-neutral description of one fused kernel. The CPU
//! backend executes it; the CUDA backend renders it to CUDA C.
//!
//! A kernel iterates over an index space `shape` (called *S*). Some axes of S may be reduce
//! axes (*A*); the remaining axes form the row space *O* (`row_shape`). Every value has a
//! [`Level`]: `Elem` values vary over all of S, `Row` values only over O (one per output of a
//! reduction). Instructions are in SSA form, each reading earlier ones:
//!
//! * loads and generators read through a [`View`] whose shape is S (`Elem`) or O (`Row`);
//!   coordinates outside the view's mask read `fill`;
//! * elementwise ops combine values; a `Row` operand of an `Elem` op is broadcast along A;
//! * a `Reduce` turns an `Elem` value into a `Row` value; all reduces of a kernel share A,
//!   and later instructions may use earlier reduce results (softmax and layer norm are one
//!   kernel: max, then sum of `exp(x - max)`, then the division);
//! * stores write a value through a view (`Elem` → S-shaped output, `Row` → O-shaped).
//!
//! Matmul kernels carry a [`MatmulSpec`]; their instructions are the elementwise epilogue,
//! where `MatmulResult` is the product at the current coordinate.

mod passes;
mod program;

pub use crate::ops::ScanOp;
pub use passes::{KernelPasses, Pass};
pub use program::{BufferRef, BufferSpec, CompiledSlot, PlannedKernel, Program, Step};

use crate::dtype::{DType, Scalar};
use crate::ops::{BinaryOp, GenKind, ReduceOp, ScatterReduce, UnaryOp};
use crate::shape::View;

/// Index of an instruction in [`Kernel::ops`].
pub type ValueId = usize;

/// Whether a value varies over the whole space or only over its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// Varies over the whole index space S (one value per coordinate).
    Elem,
    /// Varies only over the row space O (one value per output row of the reductions).
    Row,
}

/// One IR instruction's operation. `V` is the view type: [`View`] in the kernel IR; a
/// backend may convert views to its own form (the CPU program does).
#[derive(Debug, Clone, PartialEq)]
pub enum IrOp<V = View> {
    /// Read buffer argument `arg` through `view`; masked-out coordinates give `fill`.
    Load {
        /// Index of the buffer in [`Kernel::args`].
        arg: usize,
        /// How coordinates map to the buffer's elements.
        view: V,
        /// The value read at masked-out coordinates.
        fill: Scalar,
    },
    /// A generator evaluated at the view's buffer offset (the generator's element index).
    /// Its numbers are run-time parameters `params[..kind.param_count()]` (plan-wide slots).
    Generate {
        /// What the generator produces.
        kind: GenKind,
        /// Run-time parameter slots of the plan; the first `kind.param_count()` are used.
        params: [usize; 2],
        /// Maps coordinates to the generator's element index.
        view: V,
        /// The value at masked-out coordinates.
        fill: Scalar,
    },
    /// An indexed load: buffer argument `arg` at `view`'s offset plus `index · stride`,
    /// where `index` is an i64 value of this kernel that must lie in `0..len` (checked when
    /// the kernel runs; an index outside is an error, never a read outside the buffer).
    /// Masked-out coordinates give `fill`.
    Gather {
        /// Index of the gathered buffer in [`Kernel::args`].
        arg: usize,
        /// Each coordinate's base offset in the buffer (the gathered axis has stride 0 here).
        view: V,
        /// Elements between consecutive index values along the gathered dimension.
        stride: isize,
        /// Size of the gathered dimension: valid indices are `0..len`.
        len: usize,
        /// The i64 value that holds the index.
        index: ValueId,
        /// The value read at masked-out coordinates.
        fill: Scalar,
    },
    /// A constant that is part of the plan's structure (a pad value).
    Const(Scalar),
    /// A run-time parameter (a `full` generator's value), converted to the instruction's
    /// dtype: the same plan runs for any value.
    Param {
        /// Index of the plan's run-time parameter.
        slot: usize,
    },
    /// True where the coordinate is inside the view's mask (used for padding of computed
    /// values: `where(valid, value, pad)`).
    Valid {
        /// The view whose mask is tested.
        view: V,
    },
    /// An elementwise op of one operand.
    Unary(UnaryOp, ValueId),
    /// An elementwise op of two operands (`op(lhs, rhs)`).
    Binary(BinaryOp, ValueId, ValueId),
    /// `where(cond, a, b)`.
    Where(ValueId, ValueId, ValueId),
    /// Convert to the instruction's dtype.
    Cast(ValueId),
    /// Reduce an `Elem` value over A into a `Row` value.
    Reduce {
        /// How the values are combined.
        op: ReduceOp,
        /// The `Elem` value reduced.
        src: ValueId,
    },
    /// The matmul product at this coordinate (matmul kernels only).
    MatmulResult,
    /// Write a value to buffer argument `arg` through `view`.
    Store {
        /// Index of the output buffer in [`Kernel::args`].
        arg: usize,
        /// How coordinates map to the buffer's elements.
        view: V,
        /// The value written.
        src: ValueId,
    },
}

impl<V> IrOp<V> {
    /// The values this op reads.
    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            IrOp::Unary(_, a) | IrOp::Cast(a) => vec![*a],
            IrOp::Reduce { src, .. } | IrOp::Store { src, .. } => vec![*src],
            IrOp::Gather { index, .. } => vec![*index],
            IrOp::Binary(_, a, b) => vec![*a, *b],
            IrOp::Where(c, a, b) => vec![*c, *a, *b],
            IrOp::Load { .. }
            | IrOp::Generate { .. }
            | IrOp::Const(_)
            | IrOp::Param { .. }
            | IrOp::Valid { .. }
            | IrOp::MatmulResult => vec![],
        }
    }

    /// Replaces every value the op reads by `f` of it (renumbering values when a pass
    /// copies ops into a new kernel); the same operands, in the same order, as [`operands`](Self::operands).
    pub fn map_operands(&mut self, mut f: impl FnMut(ValueId) -> ValueId) {
        match self {
            IrOp::Unary(_, a) | IrOp::Cast(a) => *a = f(*a),
            IrOp::Reduce { src, .. } | IrOp::Store { src, .. } => *src = f(*src),
            IrOp::Gather { index, .. } => *index = f(*index),
            IrOp::Binary(_, a, b) => (*a, *b) = (f(*a), f(*b)),
            IrOp::Where(c, a, b) => (*c, *a, *b) = (f(*c), f(*a), f(*b)),
            IrOp::Load { .. }
            | IrOp::Generate { .. }
            | IrOp::Const(_)
            | IrOp::Param { .. }
            | IrOp::Valid { .. }
            | IrOp::MatmulResult => {}
        }
    }

    /// The view an op reads or writes through, if any.
    pub fn view(&self) -> Option<&V> {
        match self {
            IrOp::Load { view, .. }
            | IrOp::Gather { view, .. }
            | IrOp::Generate { view, .. }
            | IrOp::Valid { view }
            | IrOp::Store { view, .. } => Some(view),
            _ => None,
        }
    }

    /// Mutable access to the op's view, if any.
    pub fn view_mut(&mut self) -> Option<&mut V> {
        match self {
            IrOp::Load { view, .. }
            | IrOp::Gather { view, .. }
            | IrOp::Generate { view, .. }
            | IrOp::Valid { view }
            | IrOp::Store { view, .. } => Some(view),
            _ => None,
        }
    }

    /// The same op over another view type.
    pub fn map_view<W>(&self, f: impl FnOnce(&V) -> W) -> IrOp<W> {
        match self {
            IrOp::Load { arg, view, fill } => IrOp::Load {
                arg: *arg,
                view: f(view),
                fill: *fill,
            },
            IrOp::Generate {
                kind,
                params,
                view,
                fill,
            } => IrOp::Generate {
                kind: *kind,
                params: *params,
                view: f(view),
                fill: *fill,
            },
            IrOp::Gather {
                arg,
                view,
                stride,
                len,
                index,
                fill,
            } => IrOp::Gather {
                arg: *arg,
                view: f(view),
                stride: *stride,
                len: *len,
                index: *index,
                fill: *fill,
            },
            IrOp::Const(s) => IrOp::Const(*s),
            IrOp::Param { slot } => IrOp::Param { slot: *slot },
            IrOp::Valid { view } => IrOp::Valid { view: f(view) },
            IrOp::Unary(u, a) => IrOp::Unary(*u, *a),
            IrOp::Binary(b, x, y) => IrOp::Binary(*b, *x, *y),
            IrOp::Where(c, x, y) => IrOp::Where(*c, *x, *y),
            IrOp::Cast(a) => IrOp::Cast(*a),
            IrOp::Reduce { op, src } => IrOp::Reduce { op: *op, src: *src },
            IrOp::MatmulResult => IrOp::MatmulResult,
            IrOp::Store { arg, view, src } => IrOp::Store {
                arg: *arg,
                view: f(view),
                src: *src,
            },
        }
    }
}

/// One instruction: an op, the dtype of its result and its level.
#[derive(Debug, Clone, PartialEq)]
pub struct Instr {
    /// What the instruction computes.
    pub op: IrOp,
    /// Dtype of the result (for a `Store`, of the value stored).
    pub dtype: DType,
    /// Whether the result varies over S or only over O.
    pub level: Level,
}

impl Instr {
    /// The values this instruction reads.
    pub fn operands(&self) -> Vec<ValueId> {
        self.op.operands()
    }
}

/// A buffer a kernel reads or writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelArg {
    /// Dtype of the buffer's elements.
    pub dtype: DType,
    /// Elements in the buffer.
    pub numel: usize,
    /// True for outputs.
    pub output: bool,
    /// An input that is the output's own memory (an in-place write reading the value it
    /// overwrites): backends must read it element by element before writing, never alias it.
    pub in_place: bool,
}

/// The matrix product a matmul kernel computes before its epilogue. Views have shape
/// `[batch.., m, k]` and `[batch.., k, n]`; the product is written into `out` through
/// `out_view`: row-major `[batch.., m, n]`, or (CPU kernels) the product's axes permuted
/// into the kernel's row-major layout, so that a permute-and-copy after a product (merging
/// attention heads) is the product itself.
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulSpec {
    /// Index of the left matrix's buffer in [`Kernel::args`].
    pub lhs: usize,
    /// View of the left matrix, shape `[batch.., m, k]`.
    pub lhs_view: View,
    /// Index of the right matrix's buffer in [`Kernel::args`].
    pub rhs: usize,
    /// View of the right matrix, shape `[batch.., k, n]`.
    pub rhs_view: View,
    /// Index of the output buffer in [`Kernel::args`].
    pub out: usize,
    /// Where each product element goes in `out`: shape `[batch.., m, n]`, unit stride along
    /// `n`, one element per address (contiguous, or a permutation of the kernel's
    /// row-major layout). The epilogue reads the product at its own output position.
    pub out_view: View,
}

impl MatmulSpec {
    /// The product's shape `[batch.., m, n]`.
    pub fn shape(&self) -> &[usize] {
        &self.out_view.shape
    }
}

/// What a scatter kernel computes: over every position `p` of the index's shape, in
/// row-major order, `out[q] = reduce(out[q], values[p])` with `q = p with p[axis] =
/// index[p]`. The output starts as `init` (read through its view) or, without one, at the
/// reduction's identity. The index and values views have the index's shape, `init`'s the
/// kernel's; the output is `out`, row-major over the kernel's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ScatterSpec {
    /// Index of the i64 index buffer in [`Kernel::args`].
    pub index: usize,
    /// View of the index buffer (the index's shape).
    pub index_view: View,
    /// Index of the values buffer in [`Kernel::args`].
    pub values: usize,
    /// View of the values buffer (the index's shape).
    pub values_view: View,
    /// The output axis the index selects along.
    pub axis: usize,
    /// How values meeting in one place combine.
    pub reduce: ScatterReduce,
    /// Index and view (the kernel's shape) of the buffer the output starts as, if any.
    pub init: Option<(usize, View)>,
    /// Index of the output buffer in [`Kernel::args`].
    pub out: usize,
}

/// What a kernel without instructions computes: work that is not a map over its space.
#[derive(Debug, Clone, PartialEq)]
pub enum Special {
    /// Sums into indexed places.
    Scatter(ScatterSpec),
    /// Running sums or products along `axis`: `out[c] = op(input[c'])` over `c'` equal to `c`
    /// except `c'[axis] <= c[axis]`. `view` has the kernel's shape.
    Scan {
        /// Index of the input buffer in [`Kernel::args`].
        input: usize,
        /// View of the input.
        view: View,
        /// The axis scanned along.
        axis: usize,
        /// Running sum or product.
        op: ScanOp,
        /// Index of the output buffer in [`Kernel::args`].
        out: usize,
    },
    /// The i64 permutation that sorts each lane along `axis`: stable (ties keep index order),
    /// NaN above every number (last ascending, first descending). `view` has the kernel's
    /// shape.
    ArgSort {
        /// Index of the input buffer in [`Kernel::args`].
        input: usize,
        /// View of the input.
        view: View,
        /// The axis sorted along.
        axis: usize,
        /// Largest first when true.
        descending: bool,
        /// Index of the i64 output buffer in [`Kernel::args`].
        out: usize,
    },
}

impl Special {
    /// A scan's or sort's `(input, view, axis, out)`; `None` for a scatter.
    pub fn lanes(&self) -> Option<(usize, &View, usize, usize)> {
        match self {
            Special::Scan {
                input,
                view,
                axis,
                out,
                ..
            }
            | Special::ArgSort {
                input,
                view,
                axis,
                out,
                ..
            } => Some((*input, view, *axis, *out)),
            Special::Scatter(_) => None,
        }
    }

    /// The argument read for its values (a scatter's values) and the output.
    fn io(&self) -> (usize, usize) {
        match self {
            Special::Scatter(s) => (s.values, s.out),
            Special::Scan { input, out, .. } | Special::ArgSort { input, out, .. } => {
                (*input, *out)
            }
        }
    }
}

/// One fused kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    /// Readable name, e.g. `k2_exp_add_sum`.
    pub name: String,
    /// The index space S.
    pub shape: Vec<usize>,
    /// Reduce axes A (sorted; empty for elementwise kernels).
    pub reduce_axes: Vec<usize>,
    /// The buffers the kernel reads and writes; instructions refer to them by index.
    pub args: Vec<KernelArg>,
    /// The instructions, in SSA order; a [`ValueId`] indexes this list.
    pub ops: Vec<Instr>,
    /// The matrix product of a matmul kernel (its `ops` are then the epilogue).
    pub matmul: Option<MatmulSpec>,
    /// Kernels with no instructions: what they compute instead (scatters, scans, sorts).
    pub special: Option<Special>,
    /// The graph ops this kernel computes, in order (for dumps).
    pub fused_ops: Vec<String>,
}

impl Kernel {
    /// The row space O: S without the reduce axes.
    pub fn row_shape(&self) -> Vec<usize> {
        self.shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.reduce_axes.contains(i))
            .map(|(_, &n)| n)
            .collect()
    }

    /// Number of reduce instructions.
    pub fn reduce_count(&self) -> usize {
        self.ops
            .iter()
            .filter(|i| matches!(i.op, IrOp::Reduce { .. }))
            .count()
    }

    /// The largest parameter slot this kernel reads, plus one (0 if it reads none).
    pub fn param_bound(&self) -> usize {
        self.ops
            .iter()
            .map(|i| match &i.op {
                IrOp::Param { slot } => slot + 1,
                IrOp::Generate { kind, params, .. } => params[..kind.param_count()]
                    .iter()
                    .map(|p| p + 1)
                    .max()
                    .unwrap_or(0),
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// True for a kernel that only copies one buffer into another (a planner-inserted or
    /// user-requested copy).
    pub fn is_copy(&self) -> bool {
        self.matmul.is_none()
            && self.ops.len() == 2
            && matches!(self.ops[0].op, IrOp::Load { .. })
            && matches!(self.ops[1].op, IrOp::Store { .. })
    }

    /// A scan's or sort's input view has the kernel's shape and lies inside its buffer; the
    /// output is row-major over the kernel's shape.
    fn validate_lanes(
        &self,
        input: usize,
        view: &View,
        axis: usize,
        out: usize,
    ) -> Result<(), String> {
        let a = self.args.get(input).ok_or("lanes: bad input arg")?;
        let o = self.args.get(out).ok_or("lanes: bad output arg")?;
        if view.shape != self.shape
            || axis >= self.shape.len()
            || view.mask.is_some()
            || !o.output
            || Some(o.numel) != crate::shape::checked_numel(&self.shape)
        {
            return Err("lanes: inconsistent shapes".into());
        }
        if let Some((lo, hi)) = view.offset_bounds()
            && (lo < 0 || hi as usize >= a.numel)
        {
            return Err("lanes: the input view reads outside its buffer".into());
        }
        Ok(())
    }

    /// A scatter's views lie inside their buffers, its index is i64, every position's
    /// off-axis coordinates lie inside the output, and its initial value is shaped and
    /// typed as the output.
    fn validate_scatter(&self, s: &ScatterSpec) -> Result<(), String> {
        let arg = |i: usize| self.args.get(i).ok_or(format!("scatter: bad arg {i}"));
        let (ia, va, oa) = (arg(s.index)?, arg(s.values)?, arg(s.out)?);
        let shape = &s.index_view.shape;
        if ia.dtype != DType::I64
            || s.values_view.shape != *shape
            || shape.len() != self.shape.len()
            || s.axis >= shape.len()
            || !oa.output
            || Some(oa.numel) != crate::shape::checked_numel(&self.shape)
            || (0..shape.len()).any(|d| d != s.axis && shape[d] > self.shape[d])
        {
            return Err("scatter: inconsistent shapes or dtypes".into());
        }
        let mut views = vec![(&s.index_view, ia), (&s.values_view, va)];
        if let Some((i, v)) = &s.init {
            let a = arg(*i)?;
            if a.dtype != oa.dtype || v.shape != self.shape {
                return Err(
                    "scatter: the initial value's shape or dtype is not the output's".into(),
                );
            }
            views.push((v, a));
        }
        for (v, a) in views {
            if let Some((lo, hi)) = v.offset_bounds()
                && (lo < 0 || hi as usize >= a.numel || v.mask.is_some())
            {
                return Err("scatter: a view reads outside its buffer".into());
            }
        }
        Ok(())
    }

    /// Checks the IR's internal invariants: operands precede their users, levels and dtypes
    /// are consistent, views have the right shapes, args are in range. Backends call this
    /// before running a kernel; a violation is a planner bug reported as an error.
    pub fn validate(&self) -> Result<(), String> {
        match &self.special {
            Some(Special::Scatter(s)) => self.validate_scatter(s)?,
            Some(sp) => {
                if let Some((input, view, axis, out)) = sp.lanes() {
                    self.validate_lanes(input, view, axis, out)?;
                }
                let (i, o) = (self.args[sp.io().0].dtype, self.args[sp.io().1].dtype);
                match sp {
                    Special::Scan { .. } if i != o => {
                        return Err("scan: the output dtype differs from the input's".into());
                    }
                    Special::ArgSort { .. } if o != DType::I64 => {
                        return Err("argsort: the output is not i64".into());
                    }
                    _ => {}
                }
            }
            None => {}
        }
        let row = self.row_shape();
        for (i, ins) in self.ops.iter().enumerate() {
            for o in ins.operands() {
                if o >= i {
                    return Err(format!("op {i} reads later value {o}"));
                }
                let src = &self.ops[o];
                if matches!(src.op, IrOp::Store { .. }) {
                    return Err(format!("op {i} reads a store"));
                }
                if src.level == Level::Elem
                    && ins.level == Level::Row
                    && !matches!(ins.op, IrOp::Reduce { .. })
                {
                    return Err(format!("row op {i} reads elem value {o}"));
                }
            }
            let want = |v: &View| -> Result<(), String> {
                let s = if ins.level == Level::Elem {
                    &self.shape
                } else {
                    &row
                };
                if &v.shape != s {
                    return Err(format!(
                        "op {i}: view shape {:?}, expected {:?}",
                        v.shape, s
                    ));
                }
                // Every coordinate's offset, in bytes of the value's dtype, must fit an
                // isize, so backends' address arithmetic cannot wrap (masked coordinates
                // included).
                if !v.offsets_fit(ins.dtype.size_bytes()) {
                    let (lo, hi) = v.box_bounds().unwrap_or_default();
                    return Err(format!("op {i}: view offsets {lo}..={hi} are out of range"));
                }
                Ok(())
            };
            match &ins.op {
                IrOp::Load { arg, view, .. } | IrOp::Store { arg, view, .. } => {
                    want(view)?;
                    let a = self
                        .args
                        .get(*arg)
                        .ok_or(format!("op {i}: bad arg {arg}"))?;
                    if a.dtype != ins.dtype {
                        return Err(format!("op {i}: dtype {} vs arg {}", ins.dtype, a.dtype));
                    }
                    if let Some((lo, hi)) = view.offset_bounds()
                        && (lo < 0 || hi as usize >= a.numel)
                    {
                        return Err(format!(
                            "op {i}: view reads offsets {lo}..={hi} of a {}-element buffer",
                            a.numel
                        ));
                    }
                    let broadcast = view
                        .shape
                        .iter()
                        .zip(&view.strides)
                        .any(|(&n, &s)| n > 1 && s == 0);
                    if let IrOp::Store { .. } = ins.op
                        && (!a.output || view.mask.is_some() || broadcast)
                    {
                        return Err(format!(
                            "op {i}: store view must be injective into an output"
                        ));
                    }
                }
                IrOp::Gather {
                    arg,
                    view,
                    stride,
                    len,
                    index,
                    ..
                } => {
                    want(view)?;
                    let a = self
                        .args
                        .get(*arg)
                        .ok_or(format!("op {i}: bad arg {arg}"))?;
                    if a.dtype != ins.dtype || self.ops[*index].dtype != DType::I64 {
                        return Err(format!("op {i}: gather dtypes"));
                    }
                    // Every index in 0..len from every valid coordinate stays in the buffer.
                    if let Some((lo, hi)) = view.offset_bounds() {
                        let span = (*len as i128 - 1).max(0) * *stride as i128;
                        let (lo, hi) = (lo as i128 + span.min(0), hi as i128 + span.max(0));
                        if *len == 0 || lo < 0 || hi >= a.numel as i128 {
                            return Err(format!(
                                "op {i}: gather reads offsets {lo}..={hi} of a {}-element buffer",
                                a.numel
                            ));
                        }
                    }
                }
                IrOp::Generate { view, .. } | IrOp::Valid { view } => want(view)?,
                // A source constant along the reduce axes may already be a Row value.
                IrOp::Reduce { .. } if ins.level != Level::Row => {
                    return Err(format!("reduce {i} must produce a row value"));
                }
                IrOp::MatmulResult if self.matmul.is_none() => {
                    return Err(format!("op {i}: matmul result outside a matmul kernel"));
                }
                _ => {}
            }
        }
        Ok(())
    }
}
