//! Pass 5 — lowering: turn each kernel group into kernel IR.
//!
//! Takes the [`ViewGraph`], [`FusionPlan`] and [`Schedule`]. Produces the run steps: one
//! [`Kernel`] per group (or a device transfer), with its arguments bound to input slots or
//! planned buffers. Walking down from a group's root, every inlined node becomes IR; every
//! stored node or leaf becomes a load (or a generator) through the single view obtained by
//! composing the movement chains of all edges on the way down. Generators read their
//! numbers from parameter slots, so the IR does not depend on them.
//!
//! The walk uses an explicit stack (a 100,000-op chain needs no deep call stack), and a
//! node's path down from the root keeps only the edges that move data, so with the
//! fusion pass's bound on kernel size the work per node is bounded: lowering is linear.
//!
//! Guarantees: each kernel passes [`Kernel::validate`]; loads never read outside their
//! buffer. If a composed chain cannot be expressed as one view (a reshape after a transpose
//! of an inlined value), the pass returns [`LowerError::Store`] with the inlined node below
//! the failing edge; the planner stores that node and runs fusion again. A value reached
//! through a padding edge is wrapped as `where(valid, value, pad)`; an elementwise value that
//! is constant along the reduce axes is computed once per row (`Row` level).

use super::fusion::{FusionPlan, Placement};
use super::schedule::Schedule;
use super::views::{NodeId, PlanOp, ViewGraph};
use crate::dtype::{DType, Scalar};
use crate::error::KilnError;
use crate::graph::Op;
use crate::kernel::{
    BufferRef, Instr, IrOp, Kernel, KernelArg, Level, MatmulSpec, PlannedKernel, ScatterSpec,
    Special, Step, ValueId,
};
use crate::ops::{Generator, ScatterReduce};
use crate::shape::{Movement, View, numel};
use std::collections::HashMap;
use std::rc::Rc;

/// Why lowering stopped.
#[derive(Debug, Clone)]
pub enum LowerError {
    /// Store this inlined node and plan again.
    Store(NodeId),
    /// Copy input `input` of node `node` into a buffer of its own and plan again (an
    /// in-place write whose value reads the destination through another view).
    CopyInput {
        /// The node whose input is copied.
        node: NodeId,
        /// Position of the input among the node's input edges.
        input: usize,
    },
    /// A real error (a planner bug, reported rather than run).
    Fatal(KilnError),
}

fn fatal(msg: impl Into<String>) -> LowerError {
    LowerError::Fatal(KilnError::internal(msg))
}

/// Runs the pass.
pub fn lower(
    vg: &ViewGraph,
    fusion: &FusionPlan,
    sched: &Schedule,
) -> Result<Vec<Step>, LowerError> {
    let mut steps = Vec::with_capacity(sched.order.len());
    for (step, &g) in sched.order.iter().enumerate() {
        let root = fusion.groups[g].root;
        let node = &vg.nodes[root];
        if let PlanOp::Op(Op::ToDevice(to)) = node.op {
            let e = &node.inputs[0];
            let src = buffer_ref(vg, fusion, e.src)
                .ok_or_else(|| fatal("transfer of an unstored value"))?;
            steps.push(Step::Transfer {
                src,
                out: g,
                to,
                bytes: numel(&node.shape) * node.dtype.size_bytes(),
            });
            continue;
        }
        let (kernel, args) = match node.op {
            PlanOp::Op(Op::Scatter { axis, reduce }) => {
                scatter_kernel(vg, fusion, g, axis, reduce, step)?
            }
            PlanOp::Op(Op::Scan { .. } | Op::ArgSort { .. }) => lanes_kernel(vg, fusion, g, step)?,
            _ => Lowerer::new(vg, fusion, g).run(step)?,
        };
        kernel
            .validate()
            .map_err(|e| fatal(format!("kernel {} is invalid: {e}", kernel.name)))?;
        steps.push(Step::Kernel(Box::new(PlannedKernel {
            kernel,
            args,
            out: g,
            device: node.device,
            compiled: Default::default(),
        })));
    }
    Ok(steps)
}

/// A scatter kernel: its index and values are read from buffers through their edges' views
/// (the views pass made them unmasked), and it writes a fresh buffer.
fn scatter_kernel(
    vg: &ViewGraph,
    fusion: &FusionPlan,
    group: usize,
    axis: usize,
    reduce: ScatterReduce,
    step: usize,
) -> Result<(Kernel, Vec<BufferRef>), LowerError> {
    let root = fusion.groups[group].root;
    let node = &vg.nodes[root];
    let mut args = vec![];
    let mut refs = vec![];
    let mut views = vec![];
    for e in &node.inputs {
        let view = vg
            .edge_view(e)
            .filter(|v| v.mask.is_none())
            .ok_or_else(|| fatal("scatter operand view is masked or does not fold"))?;
        let src = &vg.nodes[e.src];
        refs.push(
            buffer_ref(vg, fusion, e.src).ok_or_else(|| fatal("scatter of an unstored value"))?,
        );
        args.push(KernelArg {
            dtype: src.dtype,
            numel: numel(&src.shape),
            output: false,
            in_place: false,
        });
        views.push(view);
    }
    let init = (views.len() == 3).then(|| views.pop()).flatten();
    let (Some(values_view), Some(index_view)) = (views.pop(), views.pop()) else {
        return Err(fatal("scatter needs an index and values"));
    };
    let out = args.len();
    args.push(KernelArg {
        dtype: node.dtype,
        numel: numel(&node.shape),
        output: true,
        in_place: false,
    });
    refs.push(BufferRef::Planned(group));
    let kernel = Kernel {
        name: format!("k{step}_{}", reduce.tag()),
        shape: node.shape.clone(),
        reduce_axes: vec![],
        args,
        ops: vec![],
        matmul: None,
        special: Some(Special::Scatter(ScatterSpec {
            index: 0,
            index_view,
            values: 1,
            values_view,
            axis,
            reduce,
            init: init.map(|v| (2, v)),
            out,
        })),
        fused_ops: vec![node.op.name()],
    };
    Ok((kernel, refs))
}

/// A scan or sort kernel: its input is read from a buffer through its edge's unmasked view,
/// and it writes a fresh row-major buffer of the node's shape.
fn lanes_kernel(
    vg: &ViewGraph,
    fusion: &FusionPlan,
    group: usize,
    step: usize,
) -> Result<(Kernel, Vec<BufferRef>), LowerError> {
    let root = fusion.groups[group].root;
    let node = &vg.nodes[root];
    let [e] = node.inputs.as_slice() else {
        return Err(fatal("a scan or sort takes one input"));
    };
    let view = vg
        .edge_view(e)
        .filter(|v| v.mask.is_none())
        .ok_or_else(|| fatal("scan or sort operand view is masked or does not fold"))?;
    let src = &vg.nodes[e.src];
    let input_ref =
        buffer_ref(vg, fusion, e.src).ok_or_else(|| fatal("scan or sort of an unstored value"))?;
    let args = vec![
        KernelArg {
            dtype: src.dtype,
            numel: numel(&src.shape),
            output: false,
            in_place: false,
        },
        KernelArg {
            dtype: node.dtype,
            numel: numel(&node.shape),
            output: true,
            in_place: false,
        },
    ];
    let special = match node.op {
        PlanOp::Op(Op::Scan { op, axis }) => Special::Scan {
            input: 0,
            view,
            axis,
            op,
            out: 1,
        },
        PlanOp::Op(Op::ArgSort { axis, descending }) => Special::ArgSort {
            input: 0,
            view,
            axis,
            descending,
            out: 1,
        },
        _ => return Err(fatal("lanes_kernel of another op")),
    };
    let name = match node.op {
        PlanOp::Op(ref op) => op.kind_name(),
        _ => "lanes",
    };
    let kernel = Kernel {
        name: format!("k{step}_{name}"),
        shape: node.shape.clone(),
        reduce_axes: vec![],
        args,
        ops: vec![],
        matmul: None,
        special: Some(special),
        fused_ops: vec![node.op.name()],
    };
    Ok((kernel, vec![input_ref, BufferRef::Planned(group)]))
}

fn buffer_ref(vg: &ViewGraph, fusion: &FusionPlan, v: NodeId) -> Option<BufferRef> {
    match (&vg.nodes[v].op, &fusion.placement[v]) {
        (PlanOp::Input { slot }, _) => Some(BufferRef::Input(*slot)),
        (_, Placement::Root { group }) => Some(BufferRef::Planned(*group)),
        _ => None,
    }
}

/// One edge with movement ops on the path from a node up to the kernel's coordinates.
struct Seg {
    /// The node whose output this chain transforms.
    producer: NodeId,
    chain: Vec<Movement>,
    /// The next edge towards the kernel root.
    up: Path,
}

/// A node's path to the kernel root, innermost edge first. Edges without movement ops are
/// left out (they change no view).
type Path = Option<Rc<Seg>>;

fn extend(path: &Path, producer: NodeId, chain: &[Movement]) -> Path {
    if chain.is_empty() {
        return path.clone();
    }
    Some(Rc::new(Seg {
        producer,
        chain: chain.to_vec(),
        up: path.clone(),
    }))
}

/// Memo key of a value: the node, its level, the view it is read through and the pad value
/// of the edge it is read through (two pads of one value that differ only in their pad
/// value are different values).
type Key = (NodeId, Level, View, Option<Scalar>);

/// A value to emit: node `v` at `level`, read through `view` (its row-major layout seen
/// from the kernel along `path`), over an edge padding with `pad`.
struct Task {
    v: NodeId,
    level: Level,
    path: Path,
    view: View,
    pad: Option<Scalar>,
}

impl Task {
    fn key(&self) -> Key {
        (self.v, self.level, self.view.clone(), self.pad)
    }
}

enum Frame {
    Enter(Task),
    /// All of `kids` are emitted: emit `task`'s own instruction.
    Exit {
        task: Task,
        kids: Vec<Key>,
    },
    /// `task` is the value of `of` (a row-lifted value).
    Alias {
        task: Task,
        of: Key,
    },
}

struct Lowerer<'a> {
    vg: &'a ViewGraph,
    fusion: &'a FusionPlan,
    group: usize,
    root: NodeId,
    space: Vec<usize>,
    axes: Vec<usize>,
    row: Vec<usize>,
    keepdims: Vec<usize>,
    ops: Vec<Instr>,
    memo: HashMap<Key, ValueId>,
    /// A reduction's row value, however it is seen (its views are all canonical).
    reduced: HashMap<NodeId, ValueId>,
    consts: HashMap<(Scalar, DType, Level), ValueId>,
    args: Vec<KernelArg>,
    refs: Vec<BufferRef>,
    fused: Vec<String>,
    /// Where the matmul product goes in the output (see [`MatmulSpec::out_view`]), set
    /// when the product is emitted.
    product_into: Option<View>,
}

impl<'a> Lowerer<'a> {
    fn new(vg: &'a ViewGraph, fusion: &'a FusionPlan, group: usize) -> Self {
        let g = &fusion.groups[group];
        let root = g.root;
        let (space, axes) = g
            .space
            .clone()
            .unwrap_or_else(|| (vg.nodes[root].shape.clone(), vec![]));
        let row: Vec<usize> = space
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &n)| n)
            .collect();
        let keepdims: Vec<usize> = space
            .iter()
            .enumerate()
            .map(|(i, &n)| if axes.contains(&i) { 1 } else { n })
            .collect();
        Lowerer {
            vg,
            fusion,
            group,
            root,
            space,
            axes,
            row,
            keepdims,
            ops: vec![],
            memo: HashMap::new(),
            reduced: HashMap::new(),
            consts: HashMap::new(),
            args: vec![],
            refs: vec![],
            fused: vec![],
            product_into: None,
        }
    }

    fn run(mut self, step: usize) -> Result<(Kernel, Vec<BufferRef>), LowerError> {
        let root = self.root;
        let rnode = &self.vg.nodes[root];
        let row_rooted = self.fusion.groups[self.group].row_rooted(self.vg);
        let (level, path, store_view) = if row_rooted {
            (
                Level::Row,
                extend(&None, root, &[Movement::Reshape(self.row.clone())]),
                View::contiguous(&self.row),
            )
        } else {
            (Level::Elem, None, View::contiguous(&self.space))
        };
        if numel(&rnode.shape) != store_view.numel() {
            return Err(fatal("root shape does not match its kernel space"));
        }
        let task = self.task(root, level, path, None)?;
        let value = self.emit(task)?;
        let matmul = match self.fusion.groups[self.group].matmul {
            Some(m) => Some(self.matmul_spec(m)?),
            None => None,
        };
        let out = self.args.len();
        self.args.push(KernelArg {
            dtype: rnode.dtype,
            numel: numel(&rnode.shape),
            output: true,
            in_place: false,
        });
        let dest = match rnode.writes_input {
            Some(slot) => {
                self.check_in_place(slot, &store_view)?;
                for i in 0..self.refs.len() {
                    self.args[i].in_place = self.aliases(slot, self.refs[i]);
                }
                BufferRef::Input(slot)
            }
            None => BufferRef::Planned(self.group),
        };
        self.refs.push(dest);
        let matmul = matmul.map(|mut m: MatmulSpec| {
            m.out = out;
            m
        });
        self.ops.push(Instr {
            op: IrOp::Store {
                arg: out,
                view: store_view,
                src: value,
            },
            dtype: rnode.dtype,
            level,
        });
        let mut name = format!("k{step}");
        for f in &self.fused {
            if name.len() > 40 {
                name.push_str("_etc");
                break;
            }
            name.push('_');
            name.extend(f.chars().filter(|c| c.is_ascii_alphanumeric()));
        }
        let kernel = Kernel {
            name,
            shape: self.space,
            reduce_axes: self.axes,
            args: self.args,
            ops: self.ops,
            matmul,
            special: None,
            fused_ops: self.fused,
        };
        Ok((kernel, self.refs))
    }

    /// An in-place write may read its destination only at the element it writes (a load
    /// through the store's own view, in an elementwise kernel): each element is then read
    /// before it is overwritten. Otherwise the value is computed into a buffer of its own
    /// first.
    fn check_in_place(&self, slot: usize, store_view: &View) -> Result<(), LowerError> {
        let aliases = |r: BufferRef| self.aliases(slot, r);
        let bad = !self.axes.is_empty()
            || self.fusion.groups[self.group].matmul.is_some()
            || self.ops.iter().any(|i| match &i.op {
                IrOp::Load { arg, view, .. } => aliases(self.refs[*arg]) && view != store_view,
                _ => false,
            });
        if !bad {
            return Ok(());
        }
        let e = &self.vg.nodes[self.root].inputs[1];
        if self.fusion.placement[e.src] == Placement::Inlined {
            Err(LowerError::Store(e.src))
        } else {
            Err(LowerError::CopyInput {
                node: self.root,
                input: 1,
            })
        }
    }

    /// True when `r` is the memory of input slot `slot` (the slot itself, or an earlier
    /// in-place write to it).
    fn aliases(&self, slot: usize, r: BufferRef) -> bool {
        match r {
            BufferRef::Input(s) => s == slot,
            BufferRef::Planned(g) => {
                self.vg.nodes[self.fusion.groups[g].root].writes_input == Some(slot)
            }
        }
    }

    fn matmul_spec(&mut self, m: NodeId) -> Result<MatmulSpec, LowerError> {
        let node = &self.vg.nodes[m];
        let mut operand = |i: usize| -> Result<(usize, View), LowerError> {
            let e = &node.inputs[i];
            let view = self
                .vg
                .edge_view(e)
                .filter(|v| v.mask.is_none())
                .ok_or_else(|| fatal("matmul operand view is masked or does not fold"))?;
            Ok((self.arg_for(e.src)?, view))
        };
        let (lhs, lhs_view) = operand(0)?;
        let (rhs, rhs_view) = operand(1)?;
        let out_view = self
            .product_into
            .clone()
            .ok_or_else(|| fatal("matmul kernel without its product"))?;
        Ok(MatmulSpec {
            lhs,
            lhs_view,
            rhs,
            rhs_view,
            out: usize::MAX,
            out_view,
        })
    }

    fn push(&mut self, op: IrOp, dtype: DType, level: Level) -> ValueId {
        self.ops.push(Instr { op, dtype, level });
        self.ops.len() - 1
    }

    fn constant(&mut self, s: Scalar, dtype: DType, level: Level) -> ValueId {
        let s = s.cast(dtype);
        if let Some(&id) = self.consts.get(&(s, dtype, level)) {
            return id;
        }
        let id = self.push(IrOp::Const(s), dtype, level);
        self.consts.insert((s, dtype, level), id);
        id
    }

    fn arg_for(&mut self, v: NodeId) -> Result<usize, LowerError> {
        let r = buffer_ref(self.vg, self.fusion, v)
            .ok_or_else(|| fatal("load of an unstored value"))?;
        if let Some(i) = self.refs.iter().position(|&x| x == r) {
            return Ok(i);
        }
        let n = &self.vg.nodes[v];
        self.args.push(KernelArg {
            dtype: n.dtype,
            numel: numel(&n.shape),
            output: false,
            in_place: false,
        });
        self.refs.push(r);
        Ok(self.refs.len() - 1)
    }

    /// The view of `v`'s row-major layout seen from the kernel along `path`.
    fn fold(&self, v: NodeId, path: &Path) -> Result<View, LowerError> {
        self.fold_from(View::contiguous(&self.vg.nodes[v].shape), v, path)
    }

    /// `view` (a view over `v`'s shape) seen from the kernel along `path`.
    ///
    /// The views pass guarantees that `v`'s own edge chain folds over `v`'s row-major
    /// layout, so when `start` is row-major a failure on that first segment is a planner
    /// bug. Any other `start` (a gather's table read over the gather's coordinates, which
    /// has stride 0 along the gathered axis) may legitimately fail to fold there — a
    /// reshape merging that axis with its neighbours — and then `v` itself, if inlined, is
    /// stored, like any inlined node below a failing edge.
    fn fold_from(&self, start: View, v: NodeId, path: &Path) -> Result<View, LowerError> {
        let row_major = start == View::contiguous(&self.vg.nodes[v].shape);
        let mut view = start;
        let mut seg = path.as_deref();
        while let Some(s) = seg {
            super::tick(s.chain.len());
            view = match view.apply_all(&s.chain) {
                Some(nv) => nv,
                None if (s.producer != v || !row_major)
                    && s.producer != self.root
                    && self.fusion.placement[s.producer] == Placement::Inlined =>
                {
                    return Err(LowerError::Store(s.producer));
                }
                None => return Err(fatal("an edge's own view chain does not fold")),
            };
            seg = s.up.as_deref();
        }
        // Views recorded over a narrow dtype and pushed through inlined elementwise ops onto
        // a wider one (a bool padded by 2^61 elements, computed from f64) can reach element
        // offsets whose byte offsets no longer fit an `isize`, which `Kernel::validate`
        // refuses. Storing the inlined node nearest the load keeps the view over its own
        // (narrower) values, which its shape's size check already bounds.
        if !view.offsets_fit(self.vg.nodes[v].dtype.size_bytes()) {
            let mut seg = path.as_deref();
            while let Some(s) = seg {
                if s.producer != v
                    && s.producer != self.root
                    && self.fusion.placement[s.producer] == Placement::Inlined
                {
                    return Err(LowerError::Store(s.producer));
                }
                seg = s.up.as_deref();
            }
        }
        Ok(view)
    }

    fn task(
        &self,
        v: NodeId,
        level: Level,
        path: Path,
        pad: Option<Scalar>,
    ) -> Result<Task, LowerError> {
        let view = self.fold(v, &path)?;
        Ok(Task {
            v,
            level,
            path,
            view,
            pad,
        })
    }

    /// The task for operand `i` of `t`'s node.
    fn input_task(&self, t: &Task, i: usize, level: Level) -> Result<Task, LowerError> {
        let e = &self.vg.nodes[t.v].inputs[i];
        self.task(
            e.src,
            level,
            extend(&t.path, e.src, &e.chain),
            pad_of(&e.chain),
        )
    }

    fn computed_here(&self, v: NodeId) -> bool {
        v == self.root
            || (self.fusion.placement[v] == Placement::Inlined
                && self.fusion.owner[v].is_none_or(|g| g == self.group))
    }

    /// Emits `root` and everything it needs (depth-first, operands in order, with an
    /// explicit stack); returns the value.
    fn emit(&mut self, root: Task) -> Result<ValueId, LowerError> {
        let root_key = root.key();
        let mut stack = vec![Frame::Enter(root)];
        while let Some(frame) = stack.pop() {
            super::tick(1);
            match frame {
                Frame::Enter(t) => self.enter(t, &mut stack)?,
                Frame::Exit { task, kids } => {
                    let vals = kids
                        .iter()
                        .map(|k| self.memo.get(k).copied())
                        .collect::<Option<Vec<ValueId>>>()
                        .ok_or_else(|| fatal("lowering: operand not emitted"))?;
                    let id = self.compute(&task, &vals)?;
                    self.memo.insert(task.key(), id);
                }
                Frame::Alias { task, of } => {
                    let id = *self
                        .memo
                        .get(&of)
                        .ok_or_else(|| fatal("lowering: row value not emitted"))?;
                    self.memo.insert(task.key(), id);
                }
            }
        }
        self.memo
            .get(&root_key)
            .copied()
            .ok_or_else(|| fatal("lowering: root not emitted"))
    }

    /// Starts a task: leaves are emitted at once; computed values push their operands.
    fn enter(&mut self, t: Task, stack: &mut Vec<Frame>) -> Result<(), LowerError> {
        if self.memo.contains_key(&t.key()) {
            return Ok(());
        }
        let v = t.v;
        let node = &self.vg.nodes[v];
        let here = self.computed_here(v);
        let padded = t.pad.is_some() && t.view.mask.is_some();
        if let Some(&id) = self.reduced.get(&v).filter(|_| !padded) {
            self.memo.insert(t.key(), id);
            return Ok(());
        }
        // A value constant along the reduce axes is computed once per row.
        if t.level == Level::Elem
            && !self.axes.is_empty()
            && here
            && node.op.is_elementwise()
            && numel(&node.shape) == numel(&self.row)
        {
            let lifted = View::contiguous(&node.shape).apply_all(&[
                Movement::Reshape(self.keepdims.clone()),
                Movement::Expand(self.space.clone()),
            ]);
            if lifted.as_ref() == Some(&t.view) {
                let path = extend(&None, v, &[Movement::Reshape(self.row.clone())]);
                let row = self.task(v, Level::Row, path, None)?;
                let of = row.key();
                stack.push(Frame::Alias { task: t, of });
                stack.push(Frame::Enter(row));
                return Ok(());
            }
        }
        let fill = t.pad.unwrap_or(Scalar::Int(0)).cast(node.dtype);
        if !here {
            let id = match &node.op {
                PlanOp::Op(Op::Generate(g)) => {
                    self.generate(*g, node.param, t.view.clone(), fill, node.dtype, t.level)
                }
                _ => {
                    let arg = self.arg_for(v)?;
                    let view = t.view.clone();
                    self.push(IrOp::Load { arg, view, fill }, node.dtype, t.level)
                }
            };
            self.memo.insert(t.key(), id);
            return Ok(());
        }
        let kids: Vec<Task> = match &node.op {
            PlanOp::Op(Op::Generate(_) | Op::Matmul) => vec![],
            PlanOp::Op(Op::Reduce { .. }) => {
                let canonical = match t.level {
                    Level::Row => t.view == View::contiguous(&self.row),
                    Level::Elem => {
                        Some(&t.view)
                            == View::contiguous(&node.shape)
                                .apply(&Movement::Expand(self.space.clone()))
                                .as_ref()
                    }
                };
                if !canonical {
                    return Err(fatal(format!("reduction seen through view {:?}", t.view)));
                }
                let e = &node.inputs[0];
                let path = extend(&None, e.src, &e.chain);
                vec![self.task(e.src, Level::Elem, path, pad_of(&e.chain))?]
            }
            PlanOp::Op(Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast)
            | PlanOp::Copy { .. } => (0..node.inputs.len())
                .map(|i| self.input_task(&t, i, t.level))
                .collect::<Result<_, _>>()?,
            // The written value (input 0 only names the destination).
            PlanOp::Op(Op::Assign) => vec![self.input_task(&t, 1, t.level)?],
            // The index; the table is read from its buffer when the gather is emitted.
            PlanOp::Op(Op::Gather { .. }) => vec![self.input_task(&t, 1, t.level)?],
            PlanOp::Input { .. }
            | PlanOp::Op(
                Op::Buffer
                | Op::ToDevice(_)
                | Op::Movement(_)
                | Op::Contiguous
                | Op::Scatter { .. }
                | Op::Scan { .. }
                | Op::ArgSort { .. },
            ) => {
                return Err(fatal(format!(
                    "cannot compute {} inside a kernel",
                    node.op.name()
                )));
            }
        };
        let keys = kids.iter().map(Task::key).collect();
        stack.push(Frame::Exit {
            task: t,
            kids: keys,
        });
        for k in kids.into_iter().rev() {
            stack.push(Frame::Enter(k));
        }
        Ok(())
    }

    /// Emits the instruction of computed task `t` from its operands' values.
    fn compute(&mut self, t: &Task, vals: &[ValueId]) -> Result<ValueId, LowerError> {
        let node = &self.vg.nodes[t.v];
        let dtype = node.dtype;
        let level = t.level;
        let fill = t.pad.unwrap_or(Scalar::Int(0)).cast(dtype);
        let value = match (&node.op, vals) {
            (PlanOp::Op(Op::Generate(g)), []) => {
                self.generate(*g, node.param, t.view.clone(), fill, dtype, level)
            }
            (PlanOp::Op(Op::Unary(u)), &[a]) => {
                self.push(IrOp::Unary(*u, a), dtype, self.ops[a].level)
            }
            (PlanOp::Op(Op::Binary(b)), &[x, y]) => {
                self.push(IrOp::Binary(*b, x, y), dtype, self.join(&[x, y]))
            }
            (PlanOp::Op(Op::Where), &[c, x, y]) => {
                self.push(IrOp::Where(c, x, y), dtype, self.join(&[c, x, y]))
            }
            (PlanOp::Op(Op::Cast), &[a]) => self.push(IrOp::Cast(a), dtype, self.ops[a].level),
            (PlanOp::Copy { .. } | PlanOp::Op(Op::Assign), &[a]) => a,
            (PlanOp::Op(Op::Gather { axis }), &[index]) => {
                let e = &node.inputs[0];
                let table = self
                    .vg
                    .edge_view(e)
                    .filter(|v| v.mask.is_none())
                    .ok_or_else(|| fatal("gather table view is masked or does not fold"))?;
                // The table over the gather's coordinates: the axis contributes only through
                // the index (stride 0 here, `stride` per index unit).
                let mut strides = table.strides.clone();
                strides[*axis] = 0;
                let over_out = View {
                    shape: node.shape.clone(),
                    strides,
                    offset: table.offset,
                    mask: None,
                };
                let view = self.fold_from(over_out, t.v, &t.path)?;
                let arg = self.arg_for(e.src)?;
                let op = IrOp::Gather {
                    arg,
                    view,
                    stride: table.strides[*axis],
                    len: table.shape[*axis],
                    index,
                    fill,
                };
                self.push(op, dtype, level)
            }
            (PlanOp::Op(Op::Reduce { op, .. }), &[src]) => {
                let id = self.push(IrOp::Reduce { op: *op, src }, dtype, Level::Row);
                self.reduced.insert(t.v, id);
                id
            }
            (PlanOp::Op(Op::Matmul), []) => {
                // Read as it is, or with its axes permuted (fusion checked which): the
                // product is then written in the kernel's layout, and read back at each
                // output position.
                let into = t
                    .view
                    .product_placement(&node.shape)
                    .filter(|_| t.view.shape == self.space);
                if level != Level::Elem || into.is_none() || self.product_into.is_some() {
                    return Err(fatal("matmul product seen through a view"));
                }
                self.product_into = into;
                self.push(IrOp::MatmulResult, dtype, Level::Elem)
            }
            _ => {
                return Err(fatal(format!(
                    "lowering: bad operands for {}",
                    node.op.name()
                )));
            }
        };
        self.fused.push(node.op.name());
        Ok(match t.pad {
            Some(p) if t.view.mask.is_some() => {
                let valid = self.push(
                    IrOp::Valid {
                        view: t.view.clone(),
                    },
                    DType::Bool,
                    level,
                );
                let c = self.constant(p, dtype, level);
                self.push(IrOp::Where(valid, value, c), dtype, level)
            }
            _ => value,
        })
    }

    /// The level of an op: `Elem` if any operand is.
    fn join(&self, xs: &[ValueId]) -> Level {
        if xs.iter().any(|&x| self.ops[x].level == Level::Elem) {
            Level::Elem
        } else {
            Level::Row
        }
    }

    fn generate(
        &mut self,
        g: Generator,
        param: usize,
        view: View,
        fill: Scalar,
        dtype: DType,
        level: Level,
    ) -> ValueId {
        match g {
            Generator::Full(_) if view.mask.is_none() => {
                self.push(IrOp::Param { slot: param }, dtype, level)
            }
            _ => self.push(
                IrOp::Generate {
                    kind: g.kind(),
                    params: [param, param + 1],
                    view,
                    fill,
                },
                dtype,
                level,
            ),
        }
    }
}

fn pad_of(chain: &[Movement]) -> Option<Scalar> {
    chain.iter().find_map(|m| match m {
        Movement::Pad { value, .. } => Some(*value),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use crate::kernel::Step;
    use crate::kernel::{IrOp, Level};
    use crate::plan::{RealizeOptions, plan};
    use crate::{DType, Tensor};

    fn input(shape: &[usize]) -> Tensor {
        let t = Tensor::try_rand(shape, 5, DType::F32).unwrap();
        t.realize().unwrap();
        t
    }

    fn planned(t: &Tensor) -> crate::plan::Plan {
        crate::graph::with_graph(|g| plan(g, &[t.node_key()], &RealizeOptions::default())).unwrap()
    }

    fn only_kernel(p: &crate::plan::Plan) -> crate::kernel::Kernel {
        match &p.program.steps[..] {
            [Step::Kernel(k)] => k.kernel.clone(),
            _ => panic!("expected one kernel:\n{}", p.dump_text()),
        }
    }

    #[test]
    fn padded_computed_value_is_wrapped_in_where() {
        let x = input(&[4]);
        let k = only_kernel(&planned(&x.exp().pad(&[(1, 1)], 7.0)));
        assert!(k.ops.iter().any(|i| matches!(i.op, IrOp::Valid { .. })));
        assert!(k.ops.iter().any(|i| matches!(i.op, IrOp::Where(..))));
    }

    #[test]
    fn row_constant_values_are_computed_per_row() {
        let x = input(&[4, 32]);
        let k = only_kernel(&planned(&x.layer_norm(&[32], None, None, 1e-5)));
        // sqrt and recip of the variance run once per row.
        for i in &k.ops {
            if let IrOp::Unary(u, _) = i.op {
                assert_eq!(i.level, Level::Row, "{u:?} should be a row op");
            }
        }
        assert_eq!(k.reduce_count(), 2);
        k.validate().unwrap();
    }

    #[test]
    fn view_that_does_not_compose_stores_the_inlined_value() {
        // `x.t() + 1.0` would be recorded as `(x + 1.0).t()` (elementwise ops over a permute
        // run on its source); a second operand that is not a permute keeps the view here.
        let (x, y) = (input(&[4, 6]), input(&[6, 4]));
        let t = (x.t() + &y).reshape([-1]) * 2.0;
        let p = planned(&t);
        assert_eq!(p.stored_by_lowering.len(), 1, "{}", p.dump_text());
        assert_eq!(p.kernel_count(), 2);
        assert_eq!(p.copy_count(), 0, "storing the add avoids a copy kernel");
    }

    #[test]
    fn loads_are_bounds_checked_views() {
        let x = input(&[5, 7]);
        let t = x.flip([1]).slice(&[(1, 5, 2), (0, 7, 3)]).exp();
        let k = only_kernel(&planned(&t));
        let load = k.ops.iter().find_map(|i| match &i.op {
            IrOp::Load { view, .. } => Some(view.clone()),
            _ => None,
        });
        let v = load.unwrap();
        assert_eq!(v.shape, vec![2, 3]);
        assert_eq!(v.strides, vec![14, -3]);
        let (lo, hi) = v.offset_bounds().unwrap();
        assert!(lo >= 0 && hi < 35);
    }
}
