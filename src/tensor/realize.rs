//! `realize()`: plan under the graph lock, run without it, then install the results as
//! buffer-backed leaves.

use super::Tensor;
use crate::backend;
use crate::dump;
use crate::error::{KilnError, Result};
use crate::graph::{self, NodeKey, Op};
use crate::kernel::{BufferRef, Program};
use crate::memory::Buffer;
use crate::memory::buffer::{Access, WriteRefused};
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
/// in-place write in that graph overwrites (through the written tensor, or through another
/// tensor holding the same buffer, such as `x.detach()`): those readers must run in the
/// same plan, before the write, or their input would be gone.
fn sweep_with_readers(g: &graph::Graph, targets: &mut Vec<NodeKey>) -> Result<graph::Sweep> {
    let mut listed: std::collections::HashSet<NodeKey> = targets.iter().copied().collect();
    // Whether any realized value in the graph was overwritten since: usually none, and then
    // no reader can read one (each check would sweep the reader's whole history). Scanned
    // once, and only when a write has a reader to check: most realizes have none.
    let mut any_overwritten: Option<bool> = None;
    loop {
        let sweep = g.sweep(targets)?;
        let mut added = false;
        // Every write's old value (and the other tensors on its buffer), walked in one go.
        let mut writes = vec![];
        for &k in &sweep.order {
            if g.node(k)?.op != Op::Assign {
                continue;
            }
            let old = g.inputs(k)?[0];
            let mut starts = vec![old];
            starts.extend(g.buffer_aliases(old)?);
            writes.push((starts, k));
        }
        if writes.is_empty() {
            return Ok(sweep);
        }
        for readers in g.live_readers_of(&writes)? {
            for r in readers {
                // A reader that already reads an overwritten value cannot run anyway (its
                // own realize reports that): it does not hold this write back.
                if listed.contains(&r) {
                    continue;
                }
                let overwritten = *any_overwritten
                    .get_or_insert_with(|| g.nodes().any(|n| node_version_ok(n).is_err()));
                if overwritten && reads_overwritten(g, r)? {
                    continue;
                }
                listed.insert(r);
                targets.push(r);
                added = true;
            }
        }
        if !added {
            return Ok(sweep);
        }
    }
}

/// Whether computing `k` reads a realized value that an in-place write has replaced.
fn reads_overwritten(g: &graph::Graph, k: NodeKey) -> Result<bool> {
    for n in g.sweep(&[k])?.order {
        if check_version(g, n).is_err() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A realized node whose buffer an in-place write has changed since holds a value that no
/// longer exists: reading it is an error.
fn check_version(g: &graph::Graph, k: NodeKey) -> Result<()> {
    node_version_ok(g.node(k)?)
}

/// [`check_version`] of a node.
fn node_version_ok(n: &graph::Node) -> Result<()> {
    match (&n.op, &n.buffer) {
        (Op::Buffer, Some(b)) => super::check_unchanged(&n.shape, n.dtype, b, n.version),
        _ => Ok(()),
    }
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
    /// The input buffers, held for the run.
    holds: Holds,
    params: Vec<crate::dtype::Scalar>,
    /// The swept nodes (installs name them by position).
    order: Vec<NodeKey>,
    /// The nodes the run's results are installed on, marked in the graph while it runs
    /// ([`graph::Graph::mark_installing`]).
    installing: InstallMarks,
    cache_hit: bool,
    /// Time spent planning (zero on a cache hit).
    planning: std::time::Duration,
}

/// Install marks a realize set in the graph ([`graph::Graph::mark_installing`]), taken off
/// by [`InstallMarks::clear`] under the graph lock, or when dropped uncleared (a kernel
/// panicked and the realize unwinds): a mark left behind would make every later in-place
/// update of those tensors wait forever.
struct InstallMarks(Vec<NodeKey>);

impl InstallMarks {
    /// Marks `keys` in `g`.
    fn set(g: &mut graph::Graph, keys: Vec<NodeKey>) -> InstallMarks {
        g.mark_installing(&keys);
        InstallMarks(keys)
    }

    /// Takes the marks off `g` (the caller holds the graph lock).
    fn clear(mut self, g: &mut graph::Graph) {
        g.unmark_installing(&self.0);
        self.0.clear();
    }
}

impl Drop for InstallMarks {
    fn drop(&mut self) {
        // Only an uncleared set reaches here, on an unwind outside the graph lock (the
        // marks are made last under it and cleared first under it).
        if !self.0.is_empty() {
            graph::with_graph(|g| g.unmark_installing(&self.0));
        }
    }
}

/// What preparing a realize under the graph lock found.
enum Preparation {
    /// Every target is realized already.
    Nothing,
    Ready(Box<Prepared>),
    /// Another realize holds a buffer this one writes or reads in place: try again once it
    /// has installed its results (it may have computed these targets too).
    Busy,
}

/// How a realize holds one input buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Not held by this slot: the same buffer is held for writing through another slot.
    Aliased,
    Read,
    Write,
}

/// The input buffers of a realize's program with the hold it took on each: the in-place
/// destinations for writing, every other input for reading ([`Buffer::try_write`],
/// [`Buffer::try_share`]). Taken under the graph lock together with the plan and given back
/// (on drop) only after the results are installed, so two realizes cannot both run one
/// pending in-place update, and no realize writes a buffer that another is reading or that
/// a host slice borrows.
///
/// [`Buffer::try_write`]: crate::memory::Buffer
/// [`Buffer::try_share`]: crate::memory::Buffer
struct Holds {
    inputs: Vec<Arc<Buffer>>,
    kinds: Vec<Hold>,
}

impl Holds {
    /// Holds `inputs` as `program` uses them. `Ok(None)`: another realize holds one of them,
    /// or (when `defer`) waits to write one this program would read (nothing is held then).
    fn take(program: &Program, inputs: Vec<Arc<Buffer>>, defer: bool) -> Result<Option<Holds>> {
        let mut h = Holds {
            kinds: vec![Hold::Aliased; inputs.len()],
            inputs,
        };
        for slot in program.buffers.iter().filter_map(|spec| spec.input) {
            let Some(b) = h.inputs.get(slot) else {
                return Err(KilnError::internal("in-place write to a missing input"));
            };
            if h.writes(b) {
                continue;
            }
            match b.try_write() {
                Ok(()) => h.kinds[slot] = Hold::Write,
                Err(WriteRefused::Borrowed) => {
                    return Err(KilnError::Borrowed {
                        op: "realize",
                        detail: format!(
                            "an in-place update writes a {}-byte buffer that",
                            b.len_bytes()
                        ),
                    });
                }
                Err(WriteRefused::Busy) => return Ok(None),
            }
        }
        for slot in 0..h.inputs.len() {
            if h.kinds[slot] != Hold::Aliased {
                continue;
            }
            let b = &h.inputs[slot];
            if h.writes(b) {
                continue;
            }
            if !b.try_share(Access::Read, defer) {
                return Ok(None);
            }
            h.kinds[slot] = Hold::Read;
        }
        Ok(Some(h))
    }

    /// Whether `b`'s memory is held for writing through some slot (the same buffer, or
    /// another buffer object on the same memory).
    fn writes(&self, b: &Buffer) -> bool {
        self.inputs.iter().zip(&self.kinds).any(|(o, &k)| {
            k == Hold::Write
                && (std::ptr::eq(o.as_ref(), b)
                    || (b.len_bytes() > 0 && o.device() == b.device() && o.addr() == b.addr()))
        })
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        for (b, &k) in self.inputs.iter().zip(&self.kinds) {
            match k {
                Hold::Aliased => {}
                Hold::Read => b.unshare(Access::Read),
                Hold::Write => b.end_write(),
            }
        }
    }
}

/// Sweeps, plans (or finds the plan in the cache) and holds the input buffers of a
/// realize of `keys`, under the graph lock; `defer`: the buffers it reads wait behind a
/// writer that waits for their readers ([`Buffer::try_share`](crate::memory::Buffer)).
fn prepare(
    g: &mut graph::Graph,
    keys: &[NodeKey],
    options: &RealizeOptions,
    defer: bool,
) -> Result<Preparation> {
    let mut pending = vec![];
    for &k in keys {
        if g.node(k)?.op != Op::Buffer {
            if !pending.contains(&k) {
                pending.push(k);
            }
        } else {
            // A realized value that a write through another tensor sharing its buffer has
            // replaced is gone: realizing it is the same error as reading it.
            check_version(g, k)?;
        }
    }
    if pending.is_empty() {
        return Ok(Preparation::Nothing);
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
    let Some(holds) = Holds::take(&plan.program, inputs, defer)? else {
        return Ok(Preparation::Busy);
    };
    // Checked once the buffers are held: a write still running elsewhere has bumped a
    // version without installing its result yet, which is `Busy`, not an error.
    for &k in &sweep.order {
        check_version(g, k)?;
    }
    let installing = InstallMarks::set(
        g,
        plan.installs
            .iter()
            .filter_map(|&(pos, _)| sweep.order.get(pos).copied())
            .collect(),
    );
    Ok(Preparation::Ready(Box::new(Prepared {
        plan,
        holds,
        params: binds.params,
        order: sweep.order,
        installing,
        cache_hit,
        planning,
    })))
}

/// Realizes several tensors in one plan with explicit options.
pub fn realize_all_with(tensors: &[&Tensor], options: &RealizeOptions) -> Result<RealizeReport> {
    let keys: Vec<NodeKey> = tensors.iter().map(|t| t.key).collect();
    let mut tries = 0;
    let p = loop {
        let defer = tries < crate::memory::buffer::DEFER_TRIES;
        match graph::with_graph(|g| prepare(g, &keys, options, defer))? {
            Preparation::Nothing => return Ok(RealizeReport::default()),
            Preparation::Ready(p) => break p,
            Preparation::Busy => crate::memory::buffer::back_off(&mut tries),
        }
    };
    let Prepared {
        plan,
        holds,
        params,
        order,
        installing,
        cache_hit,
        planning,
    } = *p;
    let run_started = std::time::Instant::now();
    let bound = backend::alias_snapshots(&plan.program, &holds.inputs).and_then(|snapshots| {
        let inputs = snapshots.as_deref().unwrap_or(&holds.inputs);
        backend::run_program(&plan.program, inputs, &params).map(|out| (out, snapshots))
    });
    let (outputs, snapshots) = match bound {
        Ok(bound) => bound,
        Err(e) => {
            graph::with_graph(|g| {
                installing.clear(g);
                drop(holds);
            });
            return Err(e);
        }
    };
    if backend::debug_level() >= 1 {
        eprintln!(
            "kiln: realize {} kernels, plan cache {}, planned peak {} (naive {}), planning {:.3} ms, run {:.3} ms",
            plan.kernels,
            if cache_hit { "hit" } else { "miss" },
            crate::dump::fmt_bytes(plan.planned_peak_bytes),
            crate::dump::fmt_bytes(plan.naive_bytes),
            planning.as_secs_f64() * 1e3,
            run_started.elapsed().as_secs_f64() * 1e3
        );
    }
    let installs: Vec<(NodeKey, Arc<crate::memory::Buffer>)> = plan
        .installs
        .iter()
        .filter_map(|&(pos, r)| {
            let buf = match r {
                BufferRef::Planned(g) => outputs.get(g).and_then(|b| b.clone()),
                // A target that reshapes a realized tensor shares its buffer (or the copy
                // of it the run read, when an in-place write in this run overwrote it).
                BufferRef::Input(i) => snapshots.as_ref().unwrap_or(&holds.inputs).get(i).cloned(),
            };
            Some((*order.get(pos)?, buf?))
        })
        .collect();
    drop(outputs);
    graph::with_graph(|g| {
        installing.clear(g);
        // Given back under the lock that installs the results: whoever prepares next finds
        // either these holds or the results, never a pending write with its buffer free
        // (which it would run a second time).
        let _holds = holds;
        for (k, buf) in installs {
            // The node may be gone if every handle was dropped meanwhile.
            if g.node(k).is_ok_and(|n| n.op != Op::Buffer) {
                g.set_realized(k, buf)?;
            }
        }
        Ok::<(), KilnError>(())
    })?;
    Ok(RealizeReport {
        kernels: plan.kernels,
        copies: plan.copies,
        planned_peak_bytes: plan.planned_peak_bytes,
        stored_by_lowering: plan.stored_by_lowering,
        cache_hit,
        naive_bytes: plan.naive_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_marks_come_off_the_graph_when_cleared_and_when_a_realize_unwinds() {
        let t = crate::Tensor::from_vec(vec![1.0f32], [1]);
        let marked = || graph::read_graph(|g| g.is_installing(t.key));
        let marks = graph::with_graph(|g| InstallMarks::set(g, vec![t.key]));
        assert!(marked());
        graph::with_graph(|g| marks.clear(g));
        assert!(!marked());
        // As when a kernel panics: the realize unwinds with its marks uncleared.
        let marks = graph::with_graph(|g| InstallMarks::set(g, vec![t.key]));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _marks = marks;
            std::panic::resume_unwind(Box::new("a kernel panicked"));
        }));
        assert!(unwound.is_err());
        assert!(!marked());
    }
}
