//! Pass 5 — lowering: turn each kernel group into kernel IR.
//!
//! Takes the [`ViewGraph`], [`FusionPlan`] and [`Schedule`]. Produces the run steps: one
//! [`Kernel`] per group (or a device transfer), with its arguments bound to input slots or
//! planned buffers. Walking down from a group's root, every inlined node becomes IR; every
//! stored node or leaf becomes a load (or a generator) through the single view obtained by
//! composing the movement chains of all edges on the way down.
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
use crate::device::Device;
use crate::dtype::{DType, Scalar};
use crate::error::KilnError;
use crate::graph::Generator;
use crate::kernel::{Instr, IrOp, Kernel, KernelArg, Level, MatmulSpec, ValueId};
use crate::shape::{Movement, View, numel};
use std::collections::HashMap;

/// Where a kernel argument's memory comes from at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferRef {
    /// Input slot (a realized tensor).
    Input(usize),
    /// The buffer planned for kernel group `g`.
    Planned(usize),
}

/// A kernel with its arguments bound.
#[derive(Debug, Clone)]
pub struct PlannedKernel {
    pub kernel: Kernel,
    pub args: Vec<BufferRef>,
    pub group: usize,
}

/// One step of a plan, in run order.
#[derive(Debug, Clone)]
pub enum Step {
    Kernel(Box<PlannedKernel>),
    /// Copy a whole buffer to another device.
    Transfer {
        src: BufferRef,
        group: usize,
        to: Device,
        bytes: usize,
    },
}

/// Why lowering stopped.
#[derive(Debug, Clone)]
pub enum LowerError {
    /// Store this inlined node and plan again.
    Store(NodeId),
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
        if let PlanOp::Transfer(to) = node.op {
            let e = &node.inputs[0];
            let src = buffer_ref(vg, fusion, e.src)
                .ok_or_else(|| fatal("transfer of an unstored value"))?;
            steps.push(Step::Transfer {
                src,
                group: g,
                to,
                bytes: numel(&node.shape) * node.dtype.size_bytes(),
            });
            continue;
        }
        let (kernel, args) = Lowerer::new(vg, fusion, g).run(step)?;
        kernel
            .validate()
            .map_err(|e| fatal(format!("kernel {} is invalid: {e}", kernel.name)))?;
        steps.push(Step::Kernel(Box::new(PlannedKernel {
            kernel,
            args,
            group: g,
        })));
    }
    Ok(steps)
}

fn buffer_ref(vg: &ViewGraph, fusion: &FusionPlan, v: NodeId) -> Option<BufferRef> {
    match (&vg.nodes[v].op, &fusion.placement[v]) {
        (PlanOp::Input { slot }, _) => Some(BufferRef::Input(*slot)),
        (_, Placement::Root { group }) => Some(BufferRef::Planned(*group)),
        _ => None,
    }
}

/// One edge of the path from a node up to the kernel's coordinates.
#[derive(Clone)]
struct Seg {
    /// The node whose output this chain transforms.
    producer: NodeId,
    chain: Vec<Movement>,
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
    /// Values by (node, level, view, pad value of the edge it is read through): two pads of
    /// one value that differ only in their pad value are different values.
    memo: HashMap<(NodeId, Level, View, Option<Scalar>), ValueId>,
    consts: HashMap<(Scalar, DType, Level), ValueId>,
    args: Vec<KernelArg>,
    refs: Vec<BufferRef>,
    fused: Vec<String>,
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
            consts: HashMap::new(),
            args: vec![],
            refs: vec![],
            fused: vec![],
        }
    }

    fn run(mut self, step: usize) -> Result<(Kernel, Vec<BufferRef>), LowerError> {
        let root = self.root;
        let rnode = &self.vg.nodes[root];
        let row_rooted = self.fusion.groups[self.group].row_rooted(self.vg);
        let (level, segs, store_view) = if row_rooted {
            (
                Level::Row,
                vec![Seg {
                    producer: root,
                    chain: vec![Movement::Reshape(self.row.clone())],
                }],
                View::contiguous(&self.row),
            )
        } else {
            (Level::Elem, vec![], View::contiguous(&self.space))
        };
        if numel(&rnode.shape) != store_view.numel() {
            return Err(fatal("root shape does not match its kernel space"));
        }
        let value = self.emit(root, level, &segs)?;
        let matmul = match self.fusion.groups[self.group].matmul {
            Some(m) => Some(self.matmul_spec(m)?),
            None => None,
        };
        let out = self.args.len();
        self.args.push(KernelArg {
            dtype: rnode.dtype,
            numel: numel(&rnode.shape),
            output: true,
        });
        self.refs.push(BufferRef::Planned(self.group));
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
            fused_ops: self.fused,
        };
        Ok((kernel, self.refs))
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
        Ok(MatmulSpec {
            lhs,
            lhs_view,
            rhs,
            rhs_view,
            out: usize::MAX,
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
        });
        self.refs.push(r);
        Ok(self.refs.len() - 1)
    }

    /// The view of `v`'s row-major layout seen from the kernel through `segs`.
    fn fold(&self, v: NodeId, segs: &[Seg]) -> Result<View, LowerError> {
        let mut view = View::contiguous(&self.vg.nodes[v].shape);
        for seg in segs.iter().rev() {
            view = match view.apply_all(&seg.chain) {
                Some(nv) => nv,
                None if seg.producer != v
                    && seg.producer != self.root
                    && self.fusion.placement[seg.producer] == Placement::Inlined =>
                {
                    return Err(LowerError::Store(seg.producer));
                }
                None => return Err(fatal("an edge's own view chain does not fold")),
            };
        }
        Ok(view)
    }

    fn computed_here(&self, v: NodeId) -> bool {
        v == self.root
            || (self.fusion.placement[v] == Placement::Inlined
                && self.fusion.owner[v].is_none_or(|g| g == self.group))
    }

    fn emit_input(
        &mut self,
        v: NodeId,
        i: usize,
        level: Level,
        segs: &[Seg],
    ) -> Result<ValueId, LowerError> {
        let e = &self.vg.nodes[v].inputs[i];
        let mut s = segs.to_vec();
        s.push(Seg {
            producer: e.src,
            chain: e.chain.clone(),
        });
        self.emit(e.src, level, &s)
    }

    fn emit(&mut self, v: NodeId, level: Level, segs: &[Seg]) -> Result<ValueId, LowerError> {
        let view = self.fold(v, segs)?;
        let key = (
            v,
            level,
            view.clone(),
            segs.last().and_then(|s| pad_of(&s.chain)),
        );
        if let Some(&id) = self.memo.get(&key) {
            return Ok(id);
        }
        let node = &self.vg.nodes[v];
        let here = self.computed_here(v);
        // A value constant along the reduce axes is computed once per row.
        if level == Level::Elem
            && !self.axes.is_empty()
            && here
            && node.op.is_elementwise()
            && numel(&node.shape) == numel(&self.row)
        {
            let lifted = View::contiguous(&node.shape).apply_all(&[
                Movement::Reshape(self.keepdims.clone()),
                Movement::Expand(self.space.clone()),
            ]);
            if lifted.as_ref() == Some(&view) {
                let seg = Seg {
                    producer: v,
                    chain: vec![Movement::Reshape(self.row.clone())],
                };
                let id = self.emit(v, Level::Row, &[seg])?;
                self.memo.insert(key, id);
                return Ok(id);
            }
        }
        let fill = segs
            .last()
            .and_then(|s| pad_of(&s.chain))
            .unwrap_or(Scalar::Int(0))
            .cast(node.dtype);
        let dtype = node.dtype;
        let id = if !here {
            match node.op {
                PlanOp::Generate(g) => self.generate(g, view, fill, dtype, level),
                _ => {
                    let arg = self.arg_for(v)?;
                    self.push(IrOp::Load { arg, view, fill }, dtype, level)
                }
            }
        } else {
            let op = node.op.clone();
            let value = match &op {
                PlanOp::Generate(g) => self.generate(*g, view.clone(), fill, dtype, level),
                PlanOp::Unary(u) => {
                    let a = self.emit_input(v, 0, level, segs)?;
                    self.push(IrOp::Unary(*u, a), dtype, self.ops[a].level)
                }
                PlanOp::Binary(b) => {
                    let x = self.emit_input(v, 0, level, segs)?;
                    let y = self.emit_input(v, 1, level, segs)?;
                    self.push(IrOp::Binary(*b, x, y), dtype, self.join(&[x, y]))
                }
                PlanOp::Where => {
                    let c = self.emit_input(v, 0, level, segs)?;
                    let x = self.emit_input(v, 1, level, segs)?;
                    let y = self.emit_input(v, 2, level, segs)?;
                    self.push(IrOp::Where(c, x, y), dtype, self.join(&[c, x, y]))
                }
                PlanOp::Cast => {
                    let a = self.emit_input(v, 0, level, segs)?;
                    self.push(IrOp::Cast(a), dtype, self.ops[a].level)
                }
                PlanOp::Copy { .. } => self.emit_input(v, 0, level, segs)?,
                PlanOp::Reduce { op, .. } => {
                    let canonical = match level {
                        Level::Row => view == View::contiguous(&self.row),
                        Level::Elem => {
                            Some(&view)
                                == View::contiguous(&node.shape)
                                    .apply(&Movement::Expand(self.space.clone()))
                                    .as_ref()
                        }
                    };
                    if !canonical {
                        return Err(fatal(format!("reduction seen through view {view:?}")));
                    }
                    let e = &node.inputs[0];
                    let seg = Seg {
                        producer: e.src,
                        chain: e.chain.clone(),
                    };
                    let src = self.emit(e.src, Level::Elem, &[seg])?;
                    self.push(IrOp::Reduce { op: *op, src }, dtype, Level::Row)
                }
                PlanOp::Matmul => {
                    if level != Level::Elem || view != View::contiguous(&self.space) {
                        return Err(fatal("matmul product seen through a view"));
                    }
                    self.push(IrOp::MatmulResult, dtype, Level::Elem)
                }
                PlanOp::Input { .. } | PlanOp::Transfer(_) => {
                    return Err(fatal("cannot compute an input or transfer inside a kernel"));
                }
            };
            self.fused.push(op.name());
            match segs.last().and_then(|s| pad_of(&s.chain)) {
                Some(p) if view.mask.is_some() => {
                    let valid = self.push(IrOp::Valid { view }, DType::Bool, level);
                    let c = self.constant(p, dtype, level);
                    self.push(IrOp::Where(valid, value, c), dtype, level)
                }
                _ => value,
            }
        };
        self.memo.insert(key, id);
        Ok(id)
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
        view: View,
        fill: Scalar,
        dtype: DType,
        level: Level,
    ) -> ValueId {
        match g {
            Generator::Full(v) if view.mask.is_none() => self.constant(v, dtype, level),
            _ => self.push(
                IrOp::Generate {
                    gen_: g,
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
    use crate::kernel::{IrOp, Level};
    use crate::plan::{RealizeOptions, Step, plan};
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
        match &p.steps[..] {
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
        let x = input(&[4, 6]);
        let t = (x.t() + 1.0).reshape(&[-1]) * 2.0;
        let p = planned(&t);
        assert_eq!(p.stored_by_lowering.len(), 1, "{}", p.dump_text());
        assert_eq!(p.kernel_count(), 2);
        assert_eq!(p.copy_count(), 0, "storing the add avoids a copy kernel");
    }

    #[test]
    fn loads_are_bounds_checked_views() {
        let x = input(&[5, 7]);
        let t = x.flip(&[1]).slice(&[(1, 5, 2), (0, 7, 3)]).exp();
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
