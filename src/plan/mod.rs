//! The planner: turns the lazy graph behind some tensors into an ordered list of kernels
//! with a memory plan. Five passes, one file each, run in this order:
//!
//! 1. [`views`] — movement ops become view chains on edges (copies only where a reshape
//!    cannot be a view);
//! 2. [`fusion`] — which nodes are stored and which are computed inside other kernels;
//! 3. [`schedule`] — kernels in dependency order;
//! 4. [`buffers`] — lifetimes of the stored intermediates (the memory plan);
//! 5. [`lower`] — kernel IR for every kernel.
//!
//! Lowering may find that a view chain does not compose through an inlined node; the node is
//! then stored and passes 2–5 run again (at most once per node).
//!
//! Planning is a pure function of graph structure (ops, shapes, dtypes, views), never of
//! tensor data, so a plan can later be cached and reused for structurally equal graphs.

pub mod buffers;
pub mod cache;
pub mod fusion;
pub mod lower;
pub mod schedule;
pub mod views;

pub use buffers::{BufferPlan, PlannedBuffer};
pub use fusion::{FusionPlan, KernelGroup, Placement};
pub use schedule::Schedule;
pub use views::{Edge, NodeId, PlanNode, PlanOp, ViewGraph};

use crate::dtype::Scalar;
use crate::error::{KilnError, Result};
use crate::graph::{Graph, NodeKey, Sweep};
use crate::kernel::{BufferRef, BufferSpec, PlannedKernel, Program, Step};
use std::collections::HashSet;

thread_local! {
    static WORK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `n` units of planning work (a node, edge, use or view step visited): the passes
/// call this in their loops, so [`Plan::work`] measures how planning scales without timing.
pub(crate) fn tick(n: usize) {
    WORK.with(|w| w.set(w.get().wrapping_add(n as u64)));
}

fn work_so_far() -> u64 {
    WORK.with(|w| w.get())
}

static PLANS_MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many plans this process has made (every run of the passes; cache hits make none).
pub fn plans_made() -> u64 {
    PLANS_MADE.load(std::sync::atomic::Ordering::Relaxed)
}

/// How to realize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RealizeOptions {
    /// Fuse (the default). `false` runs one op per kernel, for comparison.
    pub fuse: bool,
}

impl Default for RealizeOptions {
    fn default() -> Self {
        RealizeOptions { fuse: true }
    }
}

impl RealizeOptions {
    /// One op per kernel.
    pub fn unfused() -> Self {
        RealizeOptions { fuse: false }
    }
}

/// Everything the passes decided, ready to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The options it was planned with.
    pub options: RealizeOptions,
    /// Pass 1: the graph with movement ops folded into views.
    pub view_graph: ViewGraph,
    /// Pass 2: which nodes are stored and which are computed inside their consumers.
    pub fusion: FusionPlan,
    /// Pass 3: the kernels in dependency order.
    pub schedule: Schedule,
    /// Pass 4: the stored intermediates and their lifetimes.
    pub buffers: BufferPlan,
    /// What the backends run.
    pub program: Program,
    /// Nodes the lowering pass sent back to be stored.
    pub stored_by_lowering: Vec<NodeId>,
    /// Units of planning work done (see `tick`): linear in the graph's size.
    pub work: u64,
}

impl Plan {
    /// Number of kernels launched (transfers excluded).
    pub fn kernel_count(&self) -> usize {
        self.program.kernel_count()
    }

    /// Number of kernels that only copy (planner-inserted or `contiguous()` of a view).
    pub fn copy_count(&self) -> usize {
        self.kernels().filter(|k| k.kernel.is_copy()).count()
    }

    /// The kernels in run order.
    pub fn kernels(&self) -> impl Iterator<Item = &PlannedKernel> {
        self.program.kernels()
    }

    /// The steps in run order.
    pub fn steps(&self) -> &[Step] {
        &self.program.steps
    }

    /// Generator parameter values by slot, as seen when planning.
    pub fn params(&self) -> &[Scalar] {
        &self.view_graph.params
    }

    /// Where each target's value will be after the run.
    pub fn target_buffers(&self) -> Vec<(NodeKey, BufferRef)> {
        self.view_graph
            .targets
            .iter()
            .map(|&(key, id)| (key, self.buffer_of(id)))
            .collect()
    }

    /// Stored nodes that a live tensor handle points at, directly or through a reshape, and
    /// the last in-place write to each input (kept and installed after the run).
    pub fn kept_buffers(&self) -> Vec<(NodeKey, BufferRef)> {
        let vg = &self.view_graph;
        let mut out: Vec<(NodeKey, BufferRef)> = self
            .fusion
            .groups
            .iter()
            .enumerate()
            .filter(|&(g, grp)| {
                self.buffers.buffers[g].kept
                    && (vg.nodes[grp.root].keep || vg.is_last_write(grp.root))
            })
            .filter_map(|(g, grp)| {
                vg.nodes[grp.root]
                    .origin
                    .map(|k| (k, BufferRef::Planned(g)))
            })
            .collect();
        for &(key, id) in &vg.aliases {
            if let Some(g) = self.fusion.group_of_root(id) {
                out.push((key, BufferRef::Planned(g)));
            }
        }
        out
    }

    fn buffer_of(&self, id: NodeId) -> BufferRef {
        match (&self.view_graph.nodes[id].op, &self.fusion.placement[id]) {
            (PlanOp::Input { slot }, _) => BufferRef::Input(*slot),
            (_, Placement::Root { group }) => BufferRef::Planned(*group),
            // Unreachable for targets: they are always roots or inputs.
            _ => BufferRef::Input(usize::MAX),
        }
    }
}

/// Plans the realization of `targets`.
pub fn plan(g: &Graph, targets: &[NodeKey], options: &RealizeOptions) -> Result<Plan> {
    plan_swept(g, &g.sweep(targets)?, targets, options)
}

/// Plans the realization of `targets` from a sweep of their graph.
pub fn plan_swept(
    g: &Graph,
    sweep: &Sweep,
    targets: &[NodeKey],
    options: &RealizeOptions,
) -> Result<Plan> {
    PLANS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let work0 = work_so_far();
    tick(sweep.order.len());
    let mut view_graph = views::collapse_swept(g, sweep, targets)?;
    let mut copied: HashSet<(NodeId, usize)> = HashSet::new();
    let mut forced: HashSet<NodeId> = HashSet::new();
    let mut stored_by_lowering = vec![];
    loop {
        let fusion = fusion::fuse(&view_graph, options.fuse, &forced);
        let schedule = match schedule::schedule(&view_graph, &fusion) {
            Ok(s) => s,
            Err(e) => {
                // In-place writes whose kernels read each other's old values: store those
                // readers as kernels of their own and plan again. Where that is not
                // enough (a reader that must also follow the write), copy the old values
                // they read before the write.
                let readers = schedule::readers_of_overwritten(&view_graph, &fusion);
                let before = forced.len();
                forced.extend(readers.iter().copied());
                if forced.len() == before {
                    let stored: Vec<NodeId> = fusion.groups.iter().map(|grp| grp.root).collect();
                    let edges = schedule::overwritten_inputs(&view_graph, &fusion, &stored);
                    let mut separated = false;
                    for (node, input) in edges {
                        if copied.insert((node, input)) {
                            views::copy_input(&mut view_graph, node, input);
                            separated = true;
                        }
                    }
                    if !separated {
                        return Err(e);
                    }
                }
                continue;
            }
        };
        let buffers = buffers::plan_buffers(&view_graph, &fusion, &schedule);
        match lower::lower(&view_graph, &fusion, &schedule) {
            Ok(steps) => {
                let program = Program {
                    steps,
                    buffers: fusion
                        .groups
                        .iter()
                        .zip(&buffers.buffers)
                        .map(|(g, b)| BufferSpec {
                            bytes: b.bytes,
                            device: view_graph.nodes[g.root].device,
                            input: view_graph.nodes[g.root].writes_input,
                        })
                        .collect(),
                    release_after: buffers.release_after.clone(),
                    n_inputs: view_graph.inputs.len(),
                    n_params: view_graph.params.len(),
                };
                return Ok(Plan {
                    options: *options,
                    view_graph,
                    fusion,
                    schedule,
                    buffers,
                    program,
                    stored_by_lowering,
                    work: work_so_far().wrapping_sub(work0),
                });
            }
            Err(lower::LowerError::CopyInput { node, input }) => {
                if !copied.insert((node, input)) {
                    return Err(KilnError::internal(
                        "planner: copying an in-place value did not separate it",
                    ));
                }
                views::copy_input(&mut view_graph, node, input);
            }
            Err(lower::LowerError::Store(n)) => {
                if !forced.insert(n) {
                    return Err(KilnError::internal(
                        "planner: storing a node did not make its views compose",
                    ));
                }
                stored_by_lowering.push(n);
            }
            Err(lower::LowerError::Fatal(e)) => return Err(e),
        }
    }
}
