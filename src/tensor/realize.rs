//! `realize()`: plan under the graph lock, run without it, then install the results as
//! buffer-backed leaves.

use super::Tensor;
use crate::backend;
use crate::dump;
use crate::error::{KilnError, Result};
use crate::graph::{self, NodeKey, Op};
use crate::kernel::BufferRef;
use crate::plan::cache::{self, CachedPlan};
use crate::plan::{self, Plan, RealizeOptions};
use std::sync::Arc;

/// What a realize did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RealizeReport {
    /// Kernels launched.
    pub kernels: usize,
    /// Of those, kernels that only copy.
    pub copies: usize,
    /// Most planned bytes alive at once (intermediates and outputs, not inputs).
    pub planned_peak_bytes: usize,
    /// Nodes stored because a view chain did not compose through them.
    pub stored_by_lowering: usize,
    /// The plan came from the plan cache (no planning, no compiling).
    pub cache_hit: bool,
    /// Bytes the planned buffers would hold if none were released before the end (what
    /// allocating every intermediate separately would hold at the end of the run).
    pub naive_bytes: usize,
}

impl Tensor {
    /// Computes this tensor (if it is not already) with fusion on.
    ///
    /// ```
    /// let t = kiln::Tensor::ones(&[3]) * 2.0;
    /// t.realize().unwrap();
    /// assert!(t.is_realized());
    /// ```
    pub fn realize(&self) -> Result<()> {
        realize_all_with(&[self], &RealizeOptions::default()).map(|_| ())
    }

    /// Computes this tensor with explicit options and reports what ran.
    pub fn realize_with(&self, options: &RealizeOptions) -> Result<RealizeReport> {
        realize_all_with(&[self], options)
    }

    /// The plan `realize_with(options)` would run, without running it.
    pub fn plan(&self, options: &RealizeOptions) -> Result<Plan> {
        graph::with_graph(|g| plan::plan(g, &[self.key], options))
    }

    /// The lazy graph behind this tensor (before planning), as readable text (the same
    /// names as [`Plan::dump_text`] for the plan after it).
    pub fn dump_text(&self) -> String {
        graph::with_graph(|g| dump::graph_text(g, &[self.key]))
    }

    /// The lazy graph behind this tensor as Graphviz DOT.
    pub fn dump_dot(&self) -> String {
        graph::with_graph(|g| dump::graph_dot(g, &[self.key]))
    }
}

/// The plan realizing several tensors together would run, without running it.
pub fn plan_all(tensors: &[&Tensor], options: &RealizeOptions) -> Result<Plan> {
    let keys: Vec<NodeKey> = tensors.iter().map(|t| t.key).collect();
    graph::with_graph(|g| plan::plan(g, &keys, options))
}

/// Realizes several tensors in one plan (shared work runs once), fused.
pub fn realize_all(tensors: &[&Tensor]) -> Result<()> {
    realize_all_with(tensors, &RealizeOptions::default()).map(|_| ())
}

/// Sweeps the graph of `targets`, adding to them every live tensor that reads a value an
/// in-place write in that graph overwrites: those readers must run in the same plan, before
/// the write, or their input would be gone.
fn sweep_with_readers(g: &graph::Graph, targets: &mut Vec<NodeKey>) -> Result<graph::Sweep> {
    loop {
        let sweep = g.sweep(targets)?;
        let mut added = false;
        for &k in &sweep.order {
            if g.node(k)?.op != Op::Assign {
                continue;
            }
            for r in g.live_readers(g.inputs(k)?[0], k)? {
                if !targets.contains(&r) {
                    targets.push(r);
                    added = true;
                }
            }
        }
        if !added {
            return Ok(sweep);
        }
    }
}

/// A realized node whose buffer an in-place write has changed since holds a value that no
/// longer exists: reading it is an error.
fn check_version(g: &graph::Graph, k: NodeKey) -> Result<()> {
    let n = g.node(k)?;
    if let (Op::Buffer, Some(b)) = (&n.op, &n.buffer)
        && b.version() != n.version
    {
        return Err(KilnError::Overwritten {
            shape: n.shape.clone(),
            dtype: n.dtype,
            recorded: n.version,
            now: b.version(),
        });
    }
    Ok(())
}

/// `KILN_DUMP=dir`: writes every new plan's Graphviz DOT to `dir/kiln-plan-NNNNN.dot`
/// (replayed plans are not written again). A failure to write is reported once on stderr
/// and does not fail the realize.
fn dump_plan(plan: &Plan) {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some(dir) = DIR.get_or_init(|| std::env::var_os("KILN_DUMP").map(Into::into)) else {
        return;
    };
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("kiln-plan-{n:05}.dot"));
    let written = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, plan.dump_dot()));
    if let Err(e) = written
        && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        eprintln!("kiln: KILN_DUMP: cannot write {}: {e}", path.display());
    }
}

/// A realize's plan, bound to this graph's inputs and parameters.
struct Prepared {
    plan: Arc<CachedPlan>,
    inputs: Vec<Arc<crate::memory::Buffer>>,
    params: Vec<crate::dtype::Scalar>,
    /// The swept nodes (installs name them by position).
    order: Vec<NodeKey>,
    cache_hit: bool,
    /// Time spent planning (zero on a cache hit).
    planning: std::time::Duration,
}

/// Realizes several tensors in one plan with explicit options.
pub fn realize_all_with(tensors: &[&Tensor], options: &RealizeOptions) -> Result<RealizeReport> {
    let keys: Vec<NodeKey> = tensors.iter().map(|t| t.key).collect();
    let prepared = graph::with_graph(|g| -> Result<Option<Prepared>> {
        let mut pending = vec![];
        for &k in &keys {
            if g.node(k)?.op != Op::Buffer && !pending.contains(&k) {
                pending.push(k);
            }
        }
        if pending.is_empty() {
            return Ok(None);
        }
        let sweep = sweep_with_readers(g, &mut pending)?;
        // A tensor on a device that is not usable fails here, before anything runs.
        let mut devices = vec![crate::Device::Cpu];
        for &k in &sweep.order {
            let n = g.node(k)?;
            if !devices.contains(&n.device) {
                backend::check_device(n.device)?;
                devices.push(n.device);
            }
            check_version(g, k)?;
        }
        let (sig, binds) = cache::signature(g, &sweep, &pending, options)?;
        let started = std::time::Instant::now();
        let (plan, cache_hit) = match cache::with_cache(|c| c.get(&sig)) {
            Some(p) => (p, true),
            None => {
                let plan = plan::plan_swept(g, &sweep, &pending, options)?;
                dump_plan(&plan);
                let cached = Arc::new(CachedPlan::new(plan, &sweep));
                cache::with_cache(|c| c.insert(sig, Arc::clone(&cached)));
                (cached, false)
            }
        };
        let planning = if cache_hit {
            std::time::Duration::ZERO
        } else {
            started.elapsed()
        };
        let inputs = binds
            .inputs
            .iter()
            .map(|&pos| {
                g.node(sweep.order[pos])?
                    .buffer
                    .clone()
                    .ok_or_else(|| KilnError::internal("input node without a buffer"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Prepared {
            plan,
            inputs,
            params: binds.params,
            order: sweep.order,
            cache_hit,
            planning,
        }))
    })?;
    let Some(p) = prepared else {
        return Ok(RealizeReport::default());
    };
    let run_started = std::time::Instant::now();
    let outputs = backend::run_program(&p.plan.program, &p.inputs, &p.params)?;
    if backend::debug_level() >= 1 {
        eprintln!(
            "kiln: realize {} kernels, plan cache {}, planned peak {} (naive {}), planning {:.3} ms, run {:.3} ms",
            p.plan.kernels,
            if p.cache_hit { "hit" } else { "miss" },
            crate::dump::fmt_bytes(p.plan.planned_peak_bytes),
            crate::dump::fmt_bytes(p.plan.naive_bytes),
            p.planning.as_secs_f64() * 1e3,
            run_started.elapsed().as_secs_f64() * 1e3
        );
    }
    let installs: Vec<(NodeKey, Arc<crate::memory::Buffer>)> = p
        .plan
        .installs
        .iter()
        .filter_map(|&(pos, r)| {
            let buf = match r {
                BufferRef::Planned(g) => outputs.get(g).and_then(|b| b.clone()),
                // A target that reshapes a realized tensor shares its buffer.
                BufferRef::Input(i) => p.inputs.get(i).cloned(),
            };
            Some((*p.order.get(pos)?, buf?))
        })
        .collect();
    drop(outputs);
    graph::with_graph(|g| {
        for (k, buf) in installs {
            // The node may be gone if every handle was dropped meanwhile.
            if g.node(k).is_ok_and(|n| n.op != Op::Buffer) {
                g.set_realized(k, buf)?;
            }
        }
        Ok::<(), KilnError>(())
    })?;
    Ok(RealizeReport {
        kernels: p.plan.kernels,
        copies: p.plan.copies,
        planned_peak_bytes: p.plan.planned_peak_bytes,
        stored_by_lowering: p.plan.stored_by_lowering,
        cache_hit: p.cache_hit,
        naive_bytes: p.plan.naive_bytes,
    })
}
