//! Pass 3 — schedule: put the kernels in dependency order.
//!
//! Takes the [`ViewGraph`] and the [`FusionPlan`]. Produces a [`Schedule`]: for every kernel
//! group the stored nodes (input slots or other roots) it reads, and an order in which every
//! kernel runs after the kernels whose outputs it reads (Kahn's algorithm; ties go to the
//! group whose root comes first in the graph, so the order is deterministic).

use super::fusion::{FusionPlan, Placement};
use super::views::{NodeId, ViewGraph};
use crate::error::{KilnError, Result};
use std::collections::{BTreeSet, HashSet};

/// Kernel order and data dependencies.
#[derive(Debug, Clone, Default)]
pub struct Schedule {
    /// Group indices in run order.
    pub order: Vec<usize>,
    /// Per group: the stored nodes (leaves that are inputs, or other groups' roots) it reads.
    pub reads: Vec<Vec<NodeId>>,
}

/// Runs the pass.
pub fn schedule(vg: &ViewGraph, fusion: &FusionPlan) -> Result<Schedule> {
    let ng = fusion.groups.len();
    let mut reads = vec![vec![]; ng];
    for (gi, g) in fusion.groups.iter().enumerate() {
        let mut seen = HashSet::new();
        let mut out = BTreeSet::new();
        let mut stack: Vec<NodeId> = vg.nodes[g.root].inputs.iter().map(|e| e.src).collect();
        while let Some(v) = stack.pop() {
            super::tick(1);
            if !seen.insert(v) {
                continue;
            }
            match fusion.placement[v] {
                Placement::Root { .. } => {
                    out.insert(v);
                }
                Placement::Leaf => {
                    if matches!(vg.nodes[v].op, super::views::PlanOp::Input { .. }) {
                        out.insert(v);
                    }
                }
                Placement::Inlined => stack.extend(vg.nodes[v].inputs.iter().map(|e| e.src)),
            }
        }
        reads[gi] = out.into_iter().collect();
    }
    // Kahn's algorithm over group dependencies.
    let mut deps: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); ng];
    let mut users: Vec<Vec<usize>> = vec![vec![]; ng];
    for gi in 0..ng {
        for &v in &reads[gi] {
            if let Some(src) = fusion.group_of_root(v)
                && deps[gi].insert(src)
            {
                users[src].push(gi);
            }
        }
    }
    // In-place writes: an `Assign` overwrites a buffer, so every kernel that reads the value
    // the buffer held before (the input itself, or an earlier assign to it) runs first.
    for (before, writer) in overwrites(vg, fusion) {
        for gi in 0..ng {
            if gi != writer && reads[gi].contains(&before) && deps[writer].insert(gi) {
                users[gi].push(writer);
            }
        }
    }
    let mut ready: BTreeSet<(NodeId, usize)> = (0..ng)
        .filter(|&g| deps[g].is_empty())
        .map(|g| (fusion.groups[g].root, g))
        .collect();
    let mut order = Vec::with_capacity(ng);
    while let Some(first) = ready.pop_first() {
        super::tick(users[first.1].len() + 1);
        let g = first.1;
        order.push(g);
        for &u in &users[g] {
            deps[u].remove(&g);
            if deps[u].is_empty() {
                ready.insert((fusion.groups[u].root, u));
            }
        }
    }
    if order.len() != ng {
        return Err(KilnError::internal(
            "schedule: kernel dependencies form a cycle",
        ));
    }
    Ok(Schedule { order, reads })
}

/// The inlined nodes that read a value an in-place write overwrites, in a kernel other
/// than that write's own. Fused there, they tie their kernel to run before the write, and
/// two such ties can point at each other (`w = z*1; v = x*1; x.add_(w); z.add_(v)`: each
/// write's kernel reads what the other overwrites) — a cycle [`schedule`] refuses. Stored
/// as kernels of their own, they read the old values before either write runs.
pub fn readers_of_overwritten(vg: &ViewGraph, fusion: &FusionPlan) -> Vec<NodeId> {
    let writes = overwrites(vg, fusion);
    let mut found = BTreeSet::new();
    for (gi, g) in fusion.groups.iter().enumerate() {
        let mut seen = HashSet::new();
        let mut stack = vec![g.root];
        while let Some(v) = stack.pop() {
            super::tick(1);
            if !seen.insert(v) {
                continue;
            }
            for e in &vg.nodes[v].inputs {
                let inlined = matches!(fusion.placement[e.src], Placement::Inlined);
                if v != g.root
                    && writes
                        .iter()
                        .any(|&(before, writer)| before == e.src && writer != gi)
                {
                    found.insert(v);
                }
                if inlined {
                    stack.push(e.src);
                }
            }
        }
    }
    found.into_iter().collect()
}

/// The input edges of `readers` (roots of kernels) that read a value an in-place write in
/// another kernel overwrites, as `(node, input)`. When storing readers alone leaves the
/// cycle (a reader that must follow the write: `x.add_(r)` after `x.add_(1)`, with `r` a
/// view of `x` recorded before both), these values are copied, each as a kernel of its
/// own, before the write.
pub fn overwritten_inputs(
    vg: &ViewGraph,
    fusion: &FusionPlan,
    readers: &[NodeId],
) -> Vec<(NodeId, usize)> {
    let writes = overwrites(vg, fusion);
    let mut out = vec![];
    for &v in readers {
        let own = fusion.group_of_root(v);
        for (i, e) in vg.nodes[v].inputs.iter().enumerate() {
            if writes
                .iter()
                .any(|&(before, writer)| before == e.src && Some(writer) != own)
            {
                out.push((v, i));
            }
        }
    }
    out
}

/// `(value, writer group)` pairs: the value a buffer holds right before an in-place write,
/// and the group that overwrites it.
fn overwrites(vg: &ViewGraph, fusion: &FusionPlan) -> Vec<(NodeId, usize)> {
    vg.nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.writes_input.is_some())
        .filter_map(|(id, n)| Some((n.inputs.first()?.src, fusion.group_of_root(id)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::with_graph;
    use crate::plan::fusion::fuse;
    use crate::plan::views::collapse_views;
    use crate::{DType, Tensor};

    #[test]
    fn kernels_run_after_their_producers() {
        let x = Tensor::try_rand([8, 8], 3, DType::F32).unwrap();
        x.realize().unwrap();
        let a = (&x + 1.0).contiguous();
        let b = a.matmul(&a.t()).contiguous();
        let t = (&b * 2.0).sum(1);
        let vg = with_graph(|g| collapse_views(g, &[t.node_key()])).unwrap();
        let f = fuse(&vg, true, &Default::default());
        let s = schedule(&vg, &f).unwrap();
        assert_eq!(s.order.len(), f.groups.len());
        let pos = |g: usize| s.order.iter().position(|&x| x == g).unwrap();
        for (g, reads) in s.reads.iter().enumerate() {
            for &v in reads {
                if let Some(src) = f.group_of_root(v) {
                    assert!(pos(src) < pos(g), "group {g} reads {src} before it runs");
                }
            }
        }
        // The input buffer is read by the first kernel.
        assert!(
            s.reads[s.order[0]]
                .iter()
                .any(|&v| matches!(vg.nodes[v].op, crate::plan::PlanOp::Input { .. }))
        );
    }
}
