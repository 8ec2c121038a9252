//! Pass 1 — views: collapse movement ops into per-edge view chains.
//!
//! Takes the lazy graph and the targets to realize. Produces a [`ViewGraph`]: only compute
//! nodes and leaves remain, each input edge carries the chain of movement ops between the
//! producer and the consumer, and realized tensors become `Input` slots.
//!
//! Guarantees:
//! * every edge's chain folds into a single [`View`] over the producer's row-major layout
//!   (`View::contiguous(src.shape).apply_all(chain)` succeeds) and holds at most one distinct
//!   pad value. Where a reshape cannot be expressed with strides (or two different pad values
//!   meet, or a pad over a strided view would reach offsets past `isize::MAX` in bytes), the
//!   chain is split and an explicit `Copy` node is inserted — the only copies the planner
//!   makes, visible in the dumps;
//! * matmul operands and device transfers read a buffer through an unmasked view (a padded
//!   or generated operand gets a `Copy`; a generated one read through a broadcast is copied
//!   at its own shape and read through the broadcast);
//! * node ids are topological: inputs before consumers.

use crate::device::Device;
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::graph::{Graph, NodeKey, Op, Sweep};
use crate::shape::{Movement, View};
use std::collections::HashMap;

/// Index of a node in a [`ViewGraph`].
pub type NodeId = usize;

/// What a planned node computes. Movement ops are gone (they live on edges); realized
/// tensors are input slots; the pass may insert copies. Every other op is the graph's own.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanOp {
    /// A realized tensor, bound to input slot `slot` when the plan runs.
    Input {
        /// Index of the input slot.
        slot: usize,
    },
    /// Store the input row-major: `explicit` for `contiguous()`, else inserted by this pass.
    Copy {
        /// True for a user's `contiguous()`, false for a copy this pass inserted.
        explicit: bool,
    },
    /// A graph op (never `Buffer`, `Movement` or `Contiguous`). A generator's numbers here
    /// are the values seen when planning; kernels read them from parameter slots.
    Op(Op),
}

impl PlanOp {
    /// Elementwise ops (fusion chains them).
    pub fn is_elementwise(&self) -> bool {
        matches!(self, PlanOp::Op(op) if op.is_elementwise())
    }

    /// The per-element cost of the op.
    pub fn cost(&self) -> crate::ops::Cost {
        match self {
            PlanOp::Op(op) => op.cost(),
            _ => crate::ops::Cost::Cheap,
        }
    }

    /// True for generators.
    pub fn is_generator(&self) -> bool {
        matches!(self, PlanOp::Op(Op::Generate(_)))
    }

    /// True for device transfers.
    pub fn is_transfer(&self) -> bool {
        matches!(self, PlanOp::Op(Op::ToDevice(_)))
    }

    /// True for matmuls.
    pub fn is_matmul(&self) -> bool {
        matches!(self, PlanOp::Op(Op::Matmul))
    }

    /// True when operand `i` must be read from a buffer.
    pub fn needs_buffer(&self, i: usize) -> bool {
        match self {
            PlanOp::Op(op) => op.needs_buffer(i),
            _ => false,
        }
    }

    /// True for reductions.
    pub fn is_reduce(&self) -> bool {
        matches!(self, PlanOp::Op(Op::Reduce { .. }))
    }

    /// Short name for dumps.
    pub fn name(&self) -> String {
        match self {
            PlanOp::Input { slot } => format!("input{slot}"),
            PlanOp::Copy { explicit: true } => "contiguous".into(),
            PlanOp::Copy { explicit: false } => "copy".into(),
            PlanOp::Op(op) => op.name(),
        }
    }
}

/// An input edge: the producer and the movement ops applied to its output.
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    /// The producer.
    pub src: NodeId,
    /// Movement ops applied to the producer's output, in order (composing into one view).
    pub chain: Vec<Movement>,
}

impl Edge {
    /// The pad value of the chain, if it pads.
    pub fn pad_value(&self) -> Option<Scalar> {
        self.chain.iter().find_map(|m| match m {
            Movement::Pad { value, .. } => Some(*value),
            _ => None,
        })
    }
}

/// A node of the planned graph.
#[derive(Debug, Clone)]
pub struct PlanNode {
    /// What the node computes.
    pub op: PlanOp,
    /// Its operands, in order.
    pub inputs: Vec<Edge>,
    /// Shape of the result.
    pub shape: Vec<usize>,
    /// Dtype of the result.
    pub dtype: DType,
    /// Device the result lives on.
    pub device: Device,
    /// The lazy-graph node this came from (`None` for inserted copies).
    pub origin: Option<NodeKey>,
    /// A live tensor handle points at `origin`: if this node gets a buffer, keep it.
    pub keep: bool,
    /// Generators: the first of their parameter slots in [`ViewGraph::params`].
    pub param: usize,
    /// `Assign`s: the input slot whose buffer the node writes in place.
    pub writes_input: Option<usize>,
}

/// The graph the later passes work on.
#[derive(Debug, Clone, Default)]
pub struct ViewGraph {
    /// The nodes in topological order (inputs before consumers); a [`NodeId`] indexes this.
    pub nodes: Vec<PlanNode>,
    /// Nodes whose values the caller asked for, with the lazy-graph key they answer.
    pub targets: Vec<(NodeKey, NodeId)>,
    /// Lazy-graph keys of the realized tensors bound to each input slot.
    pub inputs: Vec<NodeKey>,
    /// Live tensors that are a row-major reshape of a node: if that node is stored, they
    /// share its buffer.
    pub aliases: Vec<(NodeKey, NodeId)>,
    /// Generator parameter values, by slot, as seen when planning.
    pub params: Vec<Scalar>,
}

impl ViewGraph {
    /// The view an edge reads, over its producer's row-major layout.
    pub fn edge_view(&self, e: &Edge) -> Option<View> {
        View::contiguous(&self.nodes[e.src].shape).apply_all(&e.chain)
    }

    /// The shape an edge delivers to its consumer.
    pub fn edge_shape(&self, e: &Edge) -> Vec<usize> {
        let mut s = self.nodes[e.src].shape.clone();
        for m in &e.chain {
            s = m.output_shape(&s);
        }
        s
    }

    /// Consumers of every node: `(consumer, operand index)`.
    pub fn consumers(&self) -> Vec<Vec<(NodeId, usize)>> {
        let mut c = vec![vec![]; self.nodes.len()];
        for (id, n) in self.nodes.iter().enumerate() {
            for (i, e) in n.inputs.iter().enumerate() {
                c[e.src].push((id, i));
            }
        }
        c
    }

    /// True if a live tensor shares `id`'s buffer through a reshape.
    pub fn is_aliased(&self, id: NodeId) -> bool {
        self.aliases.iter().any(|a| a.1 == id)
    }

    /// True if `id` is the last in-place write to its input in this plan: the buffer holds
    /// its value after the run, so the node is installed even without a handle (a later
    /// write recorded on top of it, not in this plan, then finds it realized).
    pub fn is_last_write(&self, id: NodeId) -> bool {
        self.nodes[id].writes_input.is_some() && !self.written_after(id)
    }

    /// True if an in-place write after `id` in this plan overwrites `id`'s memory (`id` is
    /// an input, or an earlier write to the same input).
    pub fn written_after(&self, id: NodeId) -> bool {
        let slot = match self.nodes[id].op {
            PlanOp::Input { slot } => Some(slot),
            _ => self.nodes[id].writes_input,
        };
        slot.is_some_and(|s| {
            self.nodes[id + 1..]
                .iter()
                .any(|n| n.writes_input == Some(s))
        })
    }

    /// True if `id` is a target.
    pub fn is_target(&self, id: NodeId) -> bool {
        self.targets.iter().any(|t| t.1 == id)
    }
}

/// Runs the pass over the lazy subgraph of `targets`.
pub fn collapse_views(g: &Graph, targets: &[NodeKey]) -> Result<ViewGraph> {
    collapse_swept(g, &g.sweep(targets)?, targets)
}

/// Runs the pass over a sweep of the lazy subgraph of `targets`.
pub fn collapse_swept(g: &Graph, sweep: &Sweep, targets: &[NodeKey]) -> Result<ViewGraph> {
    let mut vg = ViewGraph::default();
    // Copies already inserted, by what they copy: another edge that needs the same copy
    // reads that one (the forward and the backward of `x.permute(..).reshape(..)` then
    // share one).
    let mut copies: Copies = HashMap::new();
    // Every lazy node (by sweep position) maps to (producer in the view graph, chain from it).
    let mut map: Vec<(NodeId, Vec<Movement>)> = Vec::with_capacity(sweep.order.len());
    let mut by_key: HashMap<NodeKey, usize> = HashMap::new();
    for (pos, &key) in sweep.order.iter().enumerate() {
        super::tick(1);
        let node = g.node(key)?;
        let node_op = node.planned_op();
        let keep = node.handles() > 0;
        let inputs = sweep.operands_of(pos);
        let lookup = |i: &u32| {
            map.get(*i as usize)
                .cloned()
                .ok_or_else(|| KilnError::internal("views pass: input visited out of order"))
        };
        by_key.insert(key, pos);
        let op = match &*node_op {
            Op::Movement(m) => {
                let (src, mut chain) = lookup(&inputs[0])?;
                chain.push(m.clone());
                if keep
                    && View::contiguous(&vg.nodes[src].shape).apply_all(&chain)
                        == Some(View::contiguous(&node.shape))
                {
                    vg.aliases.push((key, src));
                }
                map.push((src, chain));
                continue;
            }
            Op::Buffer => {
                vg.inputs.push(key);
                PlanOp::Input {
                    slot: vg.inputs.len() - 1,
                }
            }
            Op::Contiguous => PlanOp::Copy { explicit: true },
            op => PlanOp::Op(op.clone()),
        };
        let param = match &*node_op {
            Op::Generate(gen_) => {
                let first = vg.params.len();
                vg.params
                    .extend_from_slice(&gen_.params()[..gen_.kind().param_count()]);
                first
            }
            _ => usize::MAX,
        };
        let needs_buffer = |i: usize| node_op.needs_buffer(i);
        let writes_input = match &*node_op {
            // The destination is the buffer of the assigned-to value: an input, or the
            // destination of an earlier assign to it.
            Op::Assign => {
                let (dst, _) = lookup(&inputs[0])?;
                match &vg.nodes[dst].op {
                    PlanOp::Input { slot } => Some(*slot),
                    _ => vg.nodes[dst].writes_input,
                }
                .ok_or_else(|| KilnError::internal("assign without a destination buffer"))
                .map(Some)?
            }
            _ => None,
        };
        let mut edges = Vec::with_capacity(inputs.len());
        for k in inputs {
            let (src, chain) = lookup(k)?;
            let needs = needs_buffer(edges.len());
            edges.push(fold_edge(&mut vg, &mut copies, src, chain, needs));
        }
        vg.nodes.push(PlanNode {
            op,
            inputs: edges,
            shape: node.shape.clone(),
            dtype: node.dtype,
            device: node.device,
            origin: Some(key),
            keep,
            param,
            writes_input,
        });
        map.push((vg.nodes.len() - 1, vec![]));
    }
    // A node whose memory an in-place write later in this plan overwrites cannot lend its
    // buffer to a tensor that must keep its value: such a target is copied, and such a
    // reshape is not installed as an alias.
    let aliases = std::mem::take(&mut vg.aliases);
    vg.aliases = aliases
        .into_iter()
        .filter(|&(_, src)| !vg.written_after(src))
        .collect();
    for &t in targets {
        let (src, chain) = by_key
            .get(&t)
            .and_then(|&p| map.get(p))
            .cloned()
            .ok_or_else(|| KilnError::internal("views pass: target not visited"))?;
        let target_shape = g.node(t)?.shape.clone();
        let aliases = View::contiguous(&vg.nodes[src].shape).apply_all(&chain)
            == Some(View::contiguous(&target_shape));
        let id = if (chain.is_empty() || aliases) && !vg.written_after(src) {
            // A row-major reshape of the producer: the target shares its buffer.
            src
        } else {
            // A view as a target is stored row-major.
            let e = fold_edge(&mut vg, &mut copies, src, chain, false);
            let shape = vg.edge_shape(&e);
            let (dtype, device) = (vg.nodes[src].dtype, vg.nodes[src].device);
            vg.nodes.push(PlanNode {
                op: PlanOp::Copy { explicit: false },
                inputs: vec![e],
                shape,
                dtype,
                device,
                origin: Some(t),
                keep: true,
                param: usize::MAX,
                writes_input: None,
            });
            vg.nodes.len() - 1
        };
        if !vg.targets.iter().any(|x| x.0 == t) {
            vg.targets.push((t, id));
        }
    }
    Ok(vg)
}

/// The copies [`fold_edge`] inserted, keyed by the producer and movements they copy.
type Copies = HashMap<(NodeId, Vec<Movement>), NodeId>;

/// A copy of `chain` over `src`: the one already made for another edge, or a new one.
fn shared_copy(
    vg: &mut ViewGraph,
    copies: &mut Copies,
    src: NodeId,
    chain: Vec<Movement>,
) -> NodeId {
    if let Some(&c) = copies.get(&(src, chain.clone())) {
        return c;
    }
    let c = insert_copy(vg, src, chain.clone());
    copies.insert((src, chain), c);
    c
}

/// Makes `chain` over `src` foldable, inserting copies where it is not (one per distinct
/// producer and movements: edges needing the same copy share it).
fn fold_edge(
    vg: &mut ViewGraph,
    copies: &mut Copies,
    src: NodeId,
    chain: Vec<Movement>,
    needs_buffer: bool,
) -> Edge {
    let mut base = src;
    let mut view = View::contiguous(&vg.nodes[src].shape);
    let mut start = 0;
    let mut pad: Option<Scalar> = None;
    super::tick(chain.len() + 1);
    // `Kernel::validate` refuses views whose offsets (masked coordinates included) do not
    // fit an `isize` in bytes of the producer's dtype.
    let elem_bytes = vg.nodes[src].dtype.size_bytes();
    for (i, m) in chain.iter().enumerate() {
        let conflict = match m {
            Movement::Pad { value, .. } => pad.is_some_and(|p| p != *value),
            _ => false,
        };
        // A pad over a strided view (a slice with a large step, or a squeeze of an axis
        // the producer's layout strides over) can reach offsets past that limit even though
        // every element read lies inside the producer. Over a fresh row-major copy a pad's
        // offsets stay within its own result's size, so the chain is split there instead.
        let next = if conflict {
            None
        } else {
            view.apply(m)
                .filter(|v| i == start || v.offsets_fit(elem_bytes))
        };
        match next {
            Some(v) => view = v,
            None => {
                base = shared_copy(vg, copies, base, chain[start..i].to_vec());
                start = i;
                pad = None;
                // A fresh row-major buffer takes any single movement.
                view = View::contiguous(&vg.nodes[base].shape)
                    .apply(m)
                    .unwrap_or_else(|| View::contiguous(&m.output_shape(&vg.nodes[base].shape)));
            }
        }
        if let Movement::Pad { value, .. } = m {
            pad = Some(*value);
        }
    }
    let edge = Edge {
        src: base,
        chain: chain[start..].to_vec(),
    };
    let generated = vg.nodes[base].op.is_generator();
    if needs_buffer && (view.mask.is_some() || generated) {
        // A generator read through a broadcast (a `full` weight under a batch of products)
        // is stored at its own, smaller shape, and the copy read through the same chain
        // (it folds over the copy's row-major layout as it did over the generator's).
        let own = crate::shape::numel(&vg.nodes[edge.src].shape);
        if view.mask.is_none() && own < crate::shape::numel(&vg.edge_shape(&edge)) {
            let c = shared_copy(vg, copies, edge.src, vec![]);
            return Edge {
                src: c,
                chain: edge.chain,
            };
        }
        let c = shared_copy(vg, copies, edge.src, edge.chain);
        return Edge {
            src: c,
            chain: vec![],
        };
    }
    edge
}

/// Reads input `input` of `node` through a copy of its own. The copy is appended, so its
/// id comes after its consumer's: that is harmless because a copy is always stored (the
/// fusion pass makes it a root, and the schedule orders kernels by what they read, not by
/// id), and the lowering pass only asks for it for an in-place write's value.
pub fn copy_input(vg: &mut ViewGraph, node: NodeId, input: usize) {
    let e = vg.nodes[node].inputs[input].clone();
    let c = insert_copy(vg, e.src, e.chain);
    vg.nodes[node].inputs[input] = Edge {
        src: c,
        chain: vec![],
    };
}

fn insert_copy(vg: &mut ViewGraph, src: NodeId, chain: Vec<Movement>) -> NodeId {
    let e = Edge { src, chain };
    let shape = vg.edge_shape(&e);
    let (dtype, device) = (vg.nodes[src].dtype, vg.nodes[src].device);
    vg.nodes.push(PlanNode {
        op: PlanOp::Copy { explicit: false },
        inputs: vec![e],
        shape,
        dtype,
        device,
        origin: None,
        keep: false,
        param: usize::MAX,
        writes_input: None,
    });
    vg.nodes.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::with_graph;
    use crate::{DType, Tensor};

    fn collapse(t: &Tensor) -> ViewGraph {
        with_graph(|g| collapse_views(g, &[t.node_key()])).unwrap()
    }

    fn input(shape: &[usize]) -> Tensor {
        let t = Tensor::try_rand(shape, 1, DType::F32).unwrap();
        t.realize().unwrap();
        t
    }

    #[test]
    fn movement_chain_becomes_one_edge_without_copies() {
        let x = input(&[6, 8]);
        let t = x
            .t()
            .slice(&[(1, 7, 2)])
            .flip([0])
            .pad(&[(1, 1)], 0.0)
            .exp();
        let vg = collapse(&t);
        assert_eq!(vg.nodes.len(), 2, "input and exp only");
        let e = &vg.nodes[1].inputs[0];
        assert_eq!(e.chain.len(), 4);
        let v = vg.edge_view(e).unwrap();
        assert_eq!(v.shape, vec![5, 6]);
        assert!(v.mask.is_some());
        assert_eq!(e.pad_value(), Some(crate::Scalar::Float(0.0)));
    }

    /// The copies the pass inserted (not the user's `contiguous()`).
    fn inserted_copies(vg: &ViewGraph) -> Vec<&PlanNode> {
        vg.nodes
            .iter()
            .filter(|n| n.op == PlanOp::Copy { explicit: false })
            .collect()
    }

    #[test]
    fn unexpressible_reshape_inserts_one_copy() {
        let x = input(&[4, 6]);
        let t = x.t().reshape([-1]).exp();
        let vg = collapse(&t);
        let copies = inserted_copies(&vg);
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].shape, vec![6, 4]);
        for n in &vg.nodes {
            for e in &n.inputs {
                assert!(vg.edge_view(e).is_some(), "every edge folds");
            }
        }
    }

    #[test]
    fn edges_needing_the_same_copy_share_it() {
        // Attention's head merge read by the forward product and, transposed, by the
        // weight gradient's: one copy of the permuted heads, read through both chains.
        let y = (&input(&[2, 3, 4, 5]) + 1.0).permute([0, 2, 1, 3]);
        let merged = y.reshape([2, 4, 15]);
        let w = input(&[15, 6]);
        let fwd = merged.matmul(&w).sum([0, 1, 2]);
        let grad = merged.reshape([8, 15]).t().matmul(&input(&[8, 3]));
        let t = &fwd + &grad.sum([0, 1]);
        let vg = collapse(&t);
        let copies = inserted_copies(&vg);
        assert_eq!(copies.len(), 1, "one copy of the permuted heads");
        assert_eq!(copies[0].shape, vec![2, 4, 3, 5]);
        // A different chain over the same producer gets its own copy.
        let other = (&input(&[2, 3, 4, 5]) + 1.0).permute([0, 2, 1, 3]);
        let t = &other.reshape([2, 4, 15]).sum([0, 1, 2])
            + &other
                .permute([0, 1, 3, 2])
                .reshape([2, 4, 15])
                .sum([0, 1, 2]);
        assert_eq!(inserted_copies(&collapse(&t)).len(), 2);
    }

    #[test]
    fn two_pad_values_on_one_edge_are_split() {
        let x = input(&[3]);
        let t = x.pad(&[(1, 1)], 1.0).pad(&[(1, 1)], 2.0).exp();
        let vg = collapse(&t);
        assert_eq!(
            vg.nodes
                .iter()
                .filter(|n| matches!(n.op, PlanOp::Copy { .. }))
                .count(),
            1
        );
    }

    #[test]
    fn matmul_operands_are_unmasked_buffers() {
        let x = input(&[4, 4]);
        let t = x.pad(&[(0, 0), (0, 1)], 0.0).matmul(&Tensor::ones([5, 2]));
        let vg = collapse(&t);
        let mm = vg.nodes.iter().find(|n| n.op.is_matmul()).unwrap();
        for e in &mm.inputs {
            assert!(matches!(vg.nodes[e.src].op, PlanOp::Copy { .. }));
            assert!(vg.edge_view(e).unwrap().mask.is_none());
        }
    }

    #[test]
    fn reshape_target_aliases_its_producer() {
        let x = input(&[4, 6]);
        let t = (&x + 1.0).reshape([24]);
        let vg = collapse(&t);
        assert!(!vg.nodes.iter().any(|n| matches!(n.op, PlanOp::Copy { .. })));
        assert_eq!(
            vg.nodes[vg.targets[0].1].op,
            PlanOp::Op(Op::Binary(crate::graph::BinaryOp::Add))
        );
        let u = (&x + 1.0).t();
        let vg = collapse(&u);
        assert!(matches!(vg.nodes[vg.targets[0].1].op, PlanOp::Copy { .. }));
    }
}
