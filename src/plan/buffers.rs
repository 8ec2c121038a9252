//! Pass 4 — memory plan: give every stored intermediate a lifetime.
//!
//! Takes the schedule. Produces a [`BufferPlan`]: one [`PlannedBuffer`] per kernel output,
//! allocated just before the step that writes it and released right after the last step that
//! reads it, so the caching allocator can hand the same memory to a later kernel. Buffers
//! that outlive the plan (targets, and nodes a live tensor handle points at, directly or
//! through a reshape) are
//! `kept` and never released. Input buffers belong to the graph and are not planned.
//!
//! `peak_bytes` is the most planned bytes alive at once (the allocator's measured peak can
//! only be higher by its size-class rounding).

use super::fusion::FusionPlan;
use super::schedule::Schedule;
use super::views::{NodeId, ViewGraph};
use crate::shape::numel;

/// One intermediate or output buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBuffer {
    /// The root node whose value it holds.
    pub node: NodeId,
    /// Size in bytes.
    pub bytes: usize,
    /// Step (position in the schedule) that writes it.
    pub first: usize,
    /// Last step that reads it (`first` if none does).
    pub last: usize,
    /// Outlives the plan.
    pub kept: bool,
}

/// Lifetimes of all planned buffers.
#[derive(Debug, Clone, Default)]
pub struct BufferPlan {
    /// Indexed by the kernel group that writes the buffer.
    pub buffers: Vec<PlannedBuffer>,
    /// Per step: buffers to release after it runs.
    pub release_after: Vec<Vec<usize>>,
    /// Most planned bytes alive at once.
    pub peak_bytes: usize,
}

/// Runs the pass.
pub fn plan_buffers(vg: &ViewGraph, fusion: &FusionPlan, sched: &Schedule) -> BufferPlan {
    let ng = fusion.groups.len();
    let mut step_of = vec![0; ng];
    for (step, &g) in sched.order.iter().enumerate() {
        step_of[g] = step;
    }
    let mut buffers: Vec<PlannedBuffer> = fusion
        .groups
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            let node = &vg.nodes[g.root];
            PlannedBuffer {
                node: g.root,
                // An in-place write uses its input's buffer.
                bytes: if node.writes_input.is_some() {
                    0
                } else {
                    numel(&node.shape) * node.dtype.size_bytes()
                },
                first: step_of[gi],
                last: step_of[gi],
                kept: node.keep
                    || vg.is_target(g.root)
                    || vg.is_aliased(g.root)
                    || vg.is_last_write(g.root),
            }
        })
        .collect();
    for (gi, reads) in sched.reads.iter().enumerate() {
        super::tick(reads.len() + 1);
        for &v in reads {
            if let Some(src) = fusion.group_of_root(v) {
                buffers[src].last = buffers[src].last.max(step_of[gi]);
            }
        }
    }
    let mut release_after = vec![vec![]; ng];
    for (b, buf) in buffers.iter().enumerate() {
        if !buf.kept {
            release_after[buf.last].push(b);
        }
    }
    // Replay the steps to find the planned peak.
    let (mut live, mut peak) = (0usize, 0usize);
    for (step, &g) in sched.order.iter().enumerate() {
        live += buffers[g].bytes;
        peak = peak.max(live);
        for &b in &release_after[step] {
            live -= buffers[b].bytes;
        }
    }
    BufferPlan {
        buffers,
        release_after,
        peak_bytes: peak,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::with_graph;
    use crate::plan::fusion::fuse;
    use crate::plan::schedule::schedule;
    use crate::plan::views::collapse_views;
    use crate::{DType, Tensor};

    #[test]
    fn intermediates_die_after_their_last_reader() {
        let x = Tensor::try_rand([256], 4, DType::F32).unwrap();
        x.realize().unwrap();
        // a feeds b and c (a diamond); unfused: a, b, c, out.
        let t = {
            let a = &x + 1.0;
            (&a * 2.0) + (&a * 3.0)
        };
        let vg = with_graph(|g| collapse_views(g, &[t.node_key()])).unwrap();
        let f = fuse(&vg, false, &Default::default());
        let s = schedule(&vg, &f).unwrap();
        let p = plan_buffers(&vg, &f, &s);
        assert_eq!(p.buffers.len(), 4);
        let bytes = 256 * 4;
        let a_buf = p.buffers.iter().find(|b| b.first == 0).unwrap();
        assert_eq!(a_buf.last, 2, "a is read by the two multiplies");
        assert!(!a_buf.kept);
        let out = p.buffers.iter().find(|b| b.kept).unwrap();
        assert_eq!(out.first, 3);
        // Step 2 holds a, a*2 and a*3; step 3 holds the two products and the output.
        assert_eq!(p.peak_bytes, 3 * bytes);
        let released: usize = p.release_after.iter().map(|r| r.len()).sum();
        assert_eq!(released, 3);
    }
}
