//! Pass 2 — fusion: decide which nodes get their own buffer (kernel roots) and which are
//! computed inside the kernels that use them.
//!
//! Takes a [`ViewGraph`]. Produces a [`FusionPlan`]: one [`KernelGroup`] per root, and for
//! every node whether it is a leaf, a root, or inlined. Rules, applied consumers-first:
//!
//! * **Roots:** targets, `contiguous()`/copies, transfers, matmul operands, and nodes the
//!   lowering pass sends back (a view chain that does not compose through them). With fusion
//!   off, every non-leaf node is a root: one op per kernel.
//! * **Elementwise chains** inline into their consumer. A value with **several consumers**
//!   (or read through several different views) is *recomputed* in each when it is cheap: its
//!   input cone holds no reduction or matmul, at most 24 elementwise ops and at most 6 leaf
//!   reads. Otherwise it is *stored once* (it becomes a root). `b = (x+1).exp(); b + b.T` is
//!   one kernel; `d = x@y; d + d.T` stores `d`.
//! * **Elementwise work before a reduction** inlines into it (the reduction reads its input
//!   space S directly).
//! * **A reduction inlines into its consumer's kernel** when every use is in that kernel and
//!   sees it canonically: either the consumer works on the reduced shape (elementwise work
//!   after a reduction — `x.sum(1).relu() * 2`, `x.sum(1) + x.max(1)`) or it broadcasts the
//!   kept-dims result back over the same space S with the same axes (`x - x.max(1, keepdim)`,
//!   softmax, layer norm: several reductions over one row in one kernel). All reductions of a
//!   kernel share S and the reduce axes.
//! * **A matmul inlines into its consumer** when that consumer's kernel is elementwise over
//!   exactly the product's shape (bias, activation): the epilogue runs on the product. On
//!   the CPU the consumer may also see the product with its axes permuted, the last axis
//!   kept last (`(att @ v).transpose(1, 2).contiguous()`): the product is then written
//!   straight into the consumer's layout, and the copy disappears.
//! * **Generator-only values read broadcast are stored.** A value computed from generators
//!   alone (a causal mask from two aranges) that a kernel reads over at least
//!   `BROADCAST_FOLD` times its own size, and has at least `MIN_FOLD_NUMEL` elements, is
//!   its own small kernel, loaded by the big one, instead of being recomputed per element
//!   and per pass.
//! * **Expensive values read broadcast are stored.** An elementwise value whose own
//!   elementwise cone does more than 24 ops or more than 6 reads, and that a use reads through a broadcast (an `expand`, stride 0 over
//!   more than one coordinate) is stored once rather than evaluated once per copy. A max
//!   pooling's gradient broadcasts the gradient of its output over the window's taps;
//!   when that gradient is a convolution's nine-tap column sum, inlined it ran four times
//!   per element (2×2 windows).
//! * **Joins are stored before a reduction.** An elementwise value whose input cone reads
//!   more than [`MAX_PADDED_READS_IN_REDUCTION`] padded views (a `cat` or `stack` of many
//!   tensors is a `where` chain over padded inputs; a slice's gradient summed over many
//!   steps is a sum of padded tensors) is not inlined into a reduction: every point of the
//!   reduction would evaluate the whole chain (the count stops at values that several
//!   nodes read: those are stored, or recomputed only when cheap). Stored, it is an
//!   elementwise kernel, which
//!   the CPU backend splits between the masks' edges so that each block reads one input
//!   (`y = stack(256 steps); (y * y).sum()`: 30 ms fused into the sum, 0.8 ms stored, on the
//!   Intel Xeon test machine).
//! * **Kernels are bounded.** Each kernel's inlined ops weigh 1 (`Cost::Cheap`) or 4
//!   (`Cost::Polynomial`); a node that would take a kernel past [`MAX_KERNEL_WEIGHT`] is
//!   stored instead and starts a kernel of its own. A 10,000-op chain becomes about 20
//!   kernels of 512 cheap ops rather than one kernel whose CUDA compile time and register
//!   pressure grow without bound; it also keeps lowering's per-node work bounded, so
//!   planning time is linear in the graph size.
//!
//! Planning reads only structure: ops, shapes, dtypes and views.

use super::views::{NodeId, PlanOp, ViewGraph};
use crate::device::Device;
use crate::graph::Op;
use crate::ops::Cost;
use crate::shape::{Movement, View, numel};
use std::collections::HashSet;

/// Largest elementwise cone that is recomputed rather than stored.
const CHEAP_OPS: usize = 24;
/// Most leaf reads a recomputed cone may have.
const CHEAP_LEAVES: usize = 6;
/// Most distinct (kernel, view) uses a value may be recomputed for.
const MAX_USES: usize = 8;
/// Largest total op weight of one kernel (see the module documentation).
pub const MAX_KERNEL_WEIGHT: usize = 512;
/// Most padded views an elementwise value's input cone may read and still be inlined into
/// a reduction (see the module documentation). A `cat` of `T` tensors reads `2T - 1`: up
/// to eight inputs stay fused, where the chain costs less than storing (measured with
/// `stack` of `[16, 64]` tensors and a sum: even at 8, 2.6× faster stored at 16).
pub const MAX_PADDED_READS_IN_REDUCTION: usize = 16;

fn weight(op: &PlanOp) -> usize {
    match op.cost() {
        Cost::Cheap => 1,
        Cost::Polynomial => 4,
    }
}

/// Where a node is computed.
#[derive(Debug, Clone, PartialEq)]
pub enum Placement {
    /// An input buffer or a generator: read where used.
    Leaf,
    /// Computed by kernel group `group` and stored.
    Root {
        /// Index into [`FusionPlan::groups`].
        group: usize,
    },
    /// Computed inside the kernels that use it.
    Inlined,
}

/// One kernel to be: a root and what its index space is.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelGroup {
    /// The stored node the kernel computes.
    pub root: NodeId,
    /// `(S, reduce axes)` once a reduction belongs to this kernel.
    pub space: Option<(Vec<usize>, Vec<usize>)>,
    /// The matmul whose epilogue this kernel is (or the root itself).
    pub matmul: Option<NodeId>,
}

impl KernelGroup {
    /// True when the root is stored over the reduced shape (a `Row` root).
    pub fn row_rooted(&self, vg: &ViewGraph) -> bool {
        match &self.space {
            Some((s, _)) => vg.nodes[self.root].shape != *s,
            None => false,
        }
    }
}

/// The result of the pass.
#[derive(Debug, Clone, Default)]
pub struct FusionPlan {
    /// Per node of the view graph: where it is computed.
    pub placement: Vec<Placement>,
    /// The kernels to be, one per root.
    pub groups: Vec<KernelGroup>,
    /// For inlined reductions and matmuls: the group they belong to.
    pub owner: Vec<Option<usize>>,
}

impl FusionPlan {
    /// Number of kernels.
    pub fn kernel_count(&self) -> usize {
        self.groups.len()
    }

    /// The group a root node leads, if any.
    pub fn group_of_root(&self, id: NodeId) -> Option<usize> {
        match self.placement[id] {
            Placement::Root { group } => Some(group),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Frame {
    /// Coordinates of the kernel root's shape.
    Root,
    /// Coordinates of the kernel's reduction space S.
    Space,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Use {
    group: usize,
    frame: Frame,
    chain: Vec<Movement>,
}

/// Runs the pass. `fuse = false` makes every compute node its own kernel; `forced` are nodes
/// that must be stored (sent back by lowering).
pub fn fuse(vg: &ViewGraph, fuse: bool, forced: &HashSet<NodeId>) -> FusionPlan {
    let n = vg.nodes.len();
    let consumers = vg.consumers();
    let mut plan = FusionPlan {
        placement: vec![Placement::Inlined; n],
        groups: vec![],
        owner: vec![None; n],
    };
    let mut uses: Vec<Vec<Use>> = vec![vec![]; n];
    // Total op weight inlined into each kernel so far.
    let mut size: Vec<usize> = vec![];
    let generated = generator_only(vg);
    let padded = padded_reads(vg, &consumers);
    for v in (0..n).rev() {
        super::tick(1);
        let node = &vg.nodes[v];
        let is_target = vg.is_target(v);
        match node.op {
            PlanOp::Input { .. } => {
                plan.placement[v] = Placement::Leaf;
                continue;
            }
            PlanOp::Op(Op::Generate(_)) if !is_target => {
                plan.placement[v] = Placement::Leaf;
                continue;
            }
            _ => {}
        }
        let operand_of_buffer_op = consumers[v]
            .iter()
            .any(|&(c, i)| vg.nodes[c].op.needs_buffer(i));
        let must_store = is_target
            || forced.contains(&v)
            || !fuse
            || operand_of_buffer_op
            || matches!(node.op, PlanOp::Copy { .. } | PlanOp::Op(Op::Assign))
            || node.op.is_transfer()
            || node.op.is_generator();
        if must_store || consumers[v].is_empty() {
            make_root(vg, &mut plan, v);
            size.push(weight(&node.op));
            continue;
        }
        let u = gather_uses(vg, &plan, &consumers, &uses, v);
        let w = weight(&node.op);
        let too_big = u.iter().any(|x| size[x.group] + w > MAX_KERNEL_WEIGHT);
        // A value made from generators alone (a causal mask from two aranges) that a kernel
        // reads broadcast over many times its size is cheaper stored once than recomputed
        // per element (and per pass).
        let fold_constant = generated[v]
            && numel(&node.shape) >= MIN_FOLD_NUMEL
            && u.iter().any(|x| {
                kernel_numel(vg, &plan.groups[x.group]) >= BROADCAST_FOLD * numel(&node.shape)
            });
        // A long join read point by point by a reduction (see the module documentation).
        let join_in_reduction =
            padded[v] > MAX_PADDED_READS_IN_REDUCTION && u.iter().any(|x| x.frame == Frame::Space);
        // An expensive value read broadcast would be evaluated once per copy (see the
        // module documentation).
        let broadcast_expensive = node.op.is_elementwise()
            && u.iter().any(|x| broadcast_fold(&node.shape, x) >= 2)
            && expensive_cone(vg, forced, v);
        let inlined = match &node.op {
            _ if u.is_empty()
                || u.len() > MAX_USES
                || too_big
                || fold_constant
                || join_in_reduction
                || broadcast_expensive =>
            {
                false
            }
            op if op.is_elementwise() => u.len() == 1 || is_cheap(vg, forced, v),
            PlanOp::Op(Op::Reduce { .. }) => try_inline_reduce(vg, &mut plan, v, &u),
            PlanOp::Op(Op::Matmul) => try_inline_matmul(vg, &mut plan, v, &u),
            _ => false,
        };
        if inlined {
            let mut counted: Vec<usize> = vec![];
            for x in &u {
                if !counted.contains(&x.group) {
                    counted.push(x.group);
                    size[x.group] += w;
                }
            }
            uses[v] = u;
        } else {
            make_root(vg, &mut plan, v);
            size.push(w);
        }
    }
    plan
}

/// How many times a use reads each element of a value of `shape`: the product of the
/// dimensions its view broadcasts (stride 0 over more than one coordinate).
fn broadcast_fold(shape: &[usize], u: &Use) -> usize {
    View::contiguous(shape)
        .apply_all(&u.chain)
        .map_or(1, |view| {
            view.shape
                .iter()
                .zip(&view.strides)
                .filter(|&(_, &s)| s == 0)
                .fold(1usize, |acc, (&d, _)| acc.saturating_mul(d))
        })
}

/// How many times a generator-only value must be broadcast before it is stored.
const BROADCAST_FOLD: usize = 8;

/// Generator-only values smaller than this (a scalar such as `1/n`) are recomputed: a load
/// costs as much as their arithmetic, and storing them would cost a kernel.
const MIN_FOLD_NUMEL: usize = 64;

/// Per node: how many padded views its elementwise input cone reads (through any number of
/// elementwise steps; a value read twice counts twice), saturating; 0 for other nodes. The
/// count does not go through a value that several nodes read: that value is stored, or
/// recomputed only when its cone is cheap (a max pooling's stacked windows, read by its
/// `argmax`, its NaN test and its select, are stored once; what reads them reads a buffer).
fn padded_reads(vg: &ViewGraph, consumers: &[Vec<(NodeId, usize)>]) -> Vec<usize> {
    let shared = |id: NodeId| {
        let first = consumers[id].first().map(|c| c.0);
        consumers[id].iter().any(|c| Some(c.0) != first)
    };
    let mut padded = vec![0usize; vg.nodes.len()];
    for (id, n) in vg.nodes.iter().enumerate() {
        if !n.op.is_elementwise() {
            continue;
        }
        padded[id] = n.inputs.iter().fold(0usize, |acc, e| {
            let pads = e
                .chain
                .iter()
                .filter(|m| matches!(m, Movement::Pad { .. }))
                .count();
            let inner = if shared(e.src) { 0 } else { padded[e.src] };
            acc.saturating_add(pads).saturating_add(inner)
        });
    }
    padded
}

/// Elementwise nodes computed from generators alone (no input buffer, no reduction).
fn generator_only(vg: &ViewGraph) -> Vec<bool> {
    let mut gen_only = vec![false; vg.nodes.len()];
    let mut leafish = vec![false; vg.nodes.len()];
    for (id, n) in vg.nodes.iter().enumerate() {
        leafish[id] = n.op.is_generator();
        if n.op.is_elementwise() && !n.inputs.is_empty() {
            let all = n.inputs.iter().all(|e| leafish[e.src]);
            gen_only[id] = all;
            leafish[id] = all;
        }
    }
    gen_only
}

/// Elements of a kernel's index space.
fn kernel_numel(vg: &ViewGraph, g: &KernelGroup) -> usize {
    match &g.space {
        Some((s, _)) => numel(s),
        None => numel(&vg.nodes[g.root].shape),
    }
}

fn make_root(vg: &ViewGraph, plan: &mut FusionPlan, v: NodeId) {
    let node = &vg.nodes[v];
    let space = match &node.op {
        PlanOp::Op(Op::Reduce { axes, .. }) => Some((vg.edge_shape(&node.inputs[0]), axes.clone())),
        _ => None,
    };
    let matmul = node.op.is_matmul().then_some(v);
    plan.groups.push(KernelGroup {
        root: v,
        space,
        matmul,
    });
    plan.placement[v] = Placement::Root {
        group: plan.groups.len() - 1,
    };
}

/// Every (kernel, frame, view chain) through which `v`'s value is read.
fn gather_uses(
    vg: &ViewGraph,
    plan: &FusionPlan,
    consumers: &[Vec<(NodeId, usize)>],
    uses: &[Vec<Use>],
    v: NodeId,
) -> Vec<Use> {
    let mut out: Vec<Use> = vec![];
    let mut push = |u: Use| {
        // Once a kernel is a persistent reduction over its root's own shape, root
        // coordinates and reduction-space coordinates are the same frame.
        let g = &plan.groups[u.group];
        let u = match (&u.frame, &g.space) {
            (Frame::Root, Some(_)) if !g.row_rooted(vg) => Use {
                frame: Frame::Space,
                ..u
            },
            _ => u,
        };
        if !out.contains(&u) {
            out.push(u);
        }
    };
    for &(c, i) in &consumers[v] {
        super::tick(1);
        let chain = &vg.nodes[c].inputs[i].chain;
        let cnode = &vg.nodes[c];
        let reduce = cnode.op.is_reduce();
        match plan.placement[c] {
            Placement::Root { group } => push(Use {
                group,
                frame: if reduce { Frame::Space } else { Frame::Root },
                chain: chain.clone(),
            }),
            Placement::Inlined if reduce => {
                if let Some(group) = plan.owner[c] {
                    push(Use {
                        group,
                        frame: Frame::Space,
                        chain: chain.clone(),
                    });
                }
            }
            Placement::Inlined => {
                for u in &uses[c] {
                    super::tick(u.chain.len() + 1);
                    let mut ch = chain.clone();
                    ch.extend(u.chain.iter().cloned());
                    push(Use {
                        group: u.group,
                        frame: u.frame.clone(),
                        chain: ch,
                    });
                }
            }
            Placement::Leaf => {}
        }
    }
    out
}

/// Cheap to recompute: no reduction or matmul in the cone down to leaves and stored nodes,
/// few ops, few leaf reads.
fn is_cheap(vg: &ViewGraph, forced: &HashSet<NodeId>, v: NodeId) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![v];
    let (mut ops, mut leaves) = (0, 0);
    while let Some(x) = stack.pop() {
        super::tick(1);
        if !seen.insert(x) {
            continue;
        }
        let node = &vg.nodes[x];
        let stored = x != v
            && (forced.contains(&x)
                || vg.is_target(x)
                || matches!(node.op, PlanOp::Copy { .. } | PlanOp::Op(Op::Assign))
                || node.op.is_transfer());
        if stored || matches!(node.op, PlanOp::Input { .. }) || node.op.is_generator() {
            leaves += 1;
        } else if node.op.is_elementwise() {
            ops += 1;
            stack.extend(node.inputs.iter().map(|e| e.src));
        } else {
            return false;
        }
        if ops > CHEAP_OPS || leaves > CHEAP_LEAVES {
            return false;
        }
    }
    true
}

/// Whether `v`'s elementwise input cone (down to stored values, inputs, reductions and
/// products, which count as reads, and generators, which do not) does more than
/// [`CHEAP_OPS`] ops or more than [`CHEAP_LEAVES`] reads (each read of a value counts: a
/// sum of nine slices of one tensor is nine reads).
fn expensive_cone(vg: &ViewGraph, forced: &HashSet<NodeId>, v: NodeId) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![v];
    let (mut ops, mut reads) = (0usize, 0usize);
    while let Some(x) = stack.pop() {
        super::tick(1);
        if !seen.insert(x) {
            continue;
        }
        ops += 1;
        for e in &vg.nodes[x].inputs {
            let src = &vg.nodes[e.src];
            let stored = forced.contains(&e.src)
                || vg.is_target(e.src)
                || matches!(src.op, PlanOp::Copy { .. } | PlanOp::Op(Op::Assign))
                || src.op.is_transfer();
            if src.op.is_generator() && !stored {
                // Constants and index generators cost no memory traffic.
                continue;
            }
            if stored || !src.op.is_elementwise() {
                reads += 1;
            } else {
                stack.push(e.src);
            }
        }
        if ops > CHEAP_OPS || reads > CHEAP_LEAVES {
            return true;
        }
    }
    false
}

fn squeeze(s: &[usize]) -> Vec<usize> {
    s.iter().copied().filter(|&n| n != 1).collect()
}

fn try_inline_reduce(vg: &ViewGraph, plan: &mut FusionPlan, r: NodeId, uses: &[Use]) -> bool {
    let node = &vg.nodes[r];
    let PlanOp::Op(Op::Reduce { axes, .. }) = &node.op else {
        return false;
    };
    let group = uses[0].group;
    if uses.iter().any(|u| u.group != group) {
        return false;
    }
    let s = vg.edge_shape(&node.inputs[0]);
    let g = &plan.groups[group];
    if g.matmul.is_some() {
        return false;
    }
    let root_shape = &vg.nodes[g.root].shape;
    match &g.space {
        Some((gs, ga)) if (gs, ga) != (&s, axes) => return false,
        Some(_) => {}
        None => {
            let elem_root = *root_shape == s;
            let row_root = squeeze(root_shape) == squeeze(&node.shape);
            if !(elem_root || row_root) {
                return false;
            }
        }
    }
    let row_rooted = *root_shape != s;
    let keep = View::contiguous(&node.shape);
    let Some(broadcast) = keep.apply(&Movement::Expand(s.clone())) else {
        return false;
    };
    for u in uses {
        let Some(seen) = keep.apply_all(&u.chain) else {
            return false;
        };
        let ok = match u.frame {
            Frame::Root if row_rooted => seen == View::contiguous(root_shape),
            _ => seen == broadcast,
        };
        if !ok {
            return false;
        }
    }
    plan.groups[group].space = Some((s, axes.clone()));
    plan.owner[r] = Some(group);
    true
}

fn try_inline_matmul(vg: &ViewGraph, plan: &mut FusionPlan, m: NodeId, uses: &[Use]) -> bool {
    let [u] = uses else {
        return false;
    };
    let g = &plan.groups[u.group];
    let shape = &vg.nodes[m].shape;
    let Some(seen) = View::contiguous(shape).apply_all(&u.chain) else {
        return false;
    };
    // The consumer reads the product as it is, or (CPU) with its axes permuted and the
    // last one kept last: the product is then written straight into the consumer's layout
    // (a merge of attention heads after `att @ v` becomes the product itself).
    let placed = seen == View::contiguous(shape)
        || (vg.nodes[m].device == Device::Cpu && seen.product_placement(shape).is_some());
    // The epilogue runs in place on the product, so it must keep the product's dtype.
    if u.frame != Frame::Root
        || vg.nodes[g.root].dtype != vg.nodes[m].dtype
        || g.matmul.is_some()
        || g.space.is_some()
        || vg.nodes[g.root].shape != seen.shape
        || !placed
        || vg.nodes[g.root].op.is_transfer()
    {
        return false;
    }
    plan.groups[u.group].matmul = Some(m);
    plan.owner[m] = Some(u.group);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::with_graph;
    use crate::plan::views::collapse_views;
    use crate::{DType, Tensor};

    fn plan_of(t: &[&Tensor], fuse_on: bool) -> (ViewGraph, FusionPlan) {
        let keys: Vec<_> = t.iter().map(|t| t.node_key()).collect();
        let vg = with_graph(|g| collapse_views(g, &keys)).unwrap();
        let f = fuse(&vg, fuse_on, &HashSet::new());
        (vg, f)
    }

    fn input(shape: &[usize]) -> Tensor {
        let t = Tensor::try_rand(shape, 2, DType::F32).unwrap();
        t.realize().unwrap();
        t
    }

    #[test]
    fn cheap_multi_consumer_value_is_recomputed() {
        let x = input(&[8, 8]);
        let b = (&x + 1.0).exp();
        let t = &b + b.t();
        let (vg, f) = plan_of(&[&t], true);
        let exp = vg
            .nodes
            .iter()
            .position(|n| n.op == PlanOp::Op(Op::Unary(crate::graph::UnaryOp::Exp)))
            .unwrap();
        assert_eq!(f.placement[exp], Placement::Inlined);
        assert_eq!(f.kernel_count(), 1);
    }

    #[test]
    fn value_with_a_reduction_used_by_two_kernels_is_stored() {
        let x = input(&[8, 8]);
        let c = &x - x.max_keepdim(1);
        let (a, b) = (c.sum(0), c.sum(1));
        let (vg, f) = plan_of(&[&a, &b], true);
        let sub = vg
            .nodes
            .iter()
            .position(|n| n.op == PlanOp::Op(Op::Binary(crate::graph::BinaryOp::Sub)))
            .unwrap();
        assert!(matches!(f.placement[sub], Placement::Root { .. }));
        assert_eq!(f.kernel_count(), 3);
    }

    #[test]
    fn reduction_seen_through_a_transpose_is_stored() {
        let x = input(&[8, 8]);
        let m = x.sum_keepdim(1).expand([8, 8]);
        let t = &x + m.t();
        let (_, f) = plan_of(&[&t], true);
        assert_eq!(f.kernel_count(), 2);
    }

    #[test]
    fn persistent_reduction_sets_the_kernel_space() {
        let x = input(&[4, 16]);
        let t = x.softmax(-1);
        let (_, f) = plan_of(&[&t], true);
        assert_eq!(f.kernel_count(), 1);
        assert_eq!(f.groups[0].space, Some((vec![4, 16], vec![1])));
    }

    #[test]
    fn forced_nodes_and_unfused_mode_store() {
        let x = input(&[4, 4]);
        let t = ((&x + 1.0) * 2.0).exp();
        let keys = [t.node_key()];
        let vg = with_graph(|g| collapse_views(g, &keys)).unwrap();
        assert_eq!(fuse(&vg, false, &HashSet::new()).kernel_count(), 3);
        let add = vg
            .nodes
            .iter()
            .position(|n| n.op == PlanOp::Op(Op::Binary(crate::graph::BinaryOp::Add)))
            .unwrap();
        let forced: HashSet<_> = [add].into_iter().collect();
        let f = fuse(&vg, true, &forced);
        assert_eq!(f.kernel_count(), 2);
        assert!(matches!(f.placement[add], Placement::Root { .. }));
    }
}
