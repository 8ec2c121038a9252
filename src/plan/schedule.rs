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
    let mut ready: BTreeSet<(NodeId, usize)> = (0..ng)
        .filter(|&g| deps[g].is_empty())
        .map(|g| (fusion.groups[g].root, g))
        .collect();
    let mut order = Vec::with_capacity(ng);
    while let Some(first) = ready.pop_first() {
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
