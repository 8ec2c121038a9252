//! The plan cache (pass 0): replay a plan for a graph seen before.
//!
//! Takes a [`Sweep`] of the pending graph. Produces its [`Signature`] in one pass over the
//! swept nodes: every node's op without generator values, shape, dtype, device, whether a
//! tensor handle points at it, and its operands as sweep positions; then the targets and
//! the realize options. Two graphs with equal signatures plan identically (planning is a
//! pure function of exactly these facts), so a realize whose signature is in the cache runs
//! the cached [`Program`] — its compiled kernels included — with the new graph's input
//! buffers and generator values bound by sweep position: no planning, no lowering, no
//! compiling.
//!
//! Generator values (a learning rate, a step count, a dropout seed) are parameters, not
//! part of the signature, so a training loop hits every step. Lookups compare whole
//! signatures (the hash only picks the bucket). The cache holds at most
//! [`PlanCache::capacity`] plans and evicts the least recently used.

use super::{Plan, RealizeOptions};
use crate::dtype::{DType, Scalar};
use crate::error::Result;
use crate::graph::{Graph, NodeKey, Op, Sweep};
use crate::kernel::{BufferRef, Program};
use crate::shape::Movement;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The structure of a pending graph, as a list of words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    words: Vec<u64>,
    hash: u64,
}

impl Signature {
    /// The signature's hash.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Number of words (a measure of the graph's size).
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// True for the signature of an empty graph.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// What a sweep binds at run time: input buffers' nodes and generator values, in the order
/// the views pass numbers their slots.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    /// Sweep positions of the realized nodes bound to input slots, by slot.
    pub inputs: Vec<usize>,
    /// Generator parameter values, by slot.
    pub params: Vec<Scalar>,
}

/// Computes the signature and bindings of a sweep.
pub fn signature(
    g: &Graph,
    sweep: &Sweep,
    targets: &[NodeKey],
    options: &RealizeOptions,
) -> Result<(Signature, Bindings)> {
    let mut w: Vec<u64> = Vec::with_capacity(sweep.order.len() * 8 + targets.len() + 2);
    let mut b = Bindings::default();
    for (pos, &key) in sweep.order.iter().enumerate() {
        let node = g.node(key)?;
        let op = node.planned_op();
        encode_op(&op, &mut w);
        if let Op::Generate(gen_) = &*op {
            b.params
                .extend_from_slice(&gen_.params()[..gen_.kind().param_count()]);
        }
        if *op == Op::Buffer {
            b.inputs.push(pos);
        }
        w.push(dtype_code(node.dtype) | (device_code(node.device) << 8));
        w.push(node.handles().min(1) as u64);
        w.push(node.shape.len() as u64);
        w.extend(node.shape.iter().map(|&d| d as u64));
        let ops = sweep.operands_of(pos);
        w.push(ops.len() as u64);
        w.extend(ops.iter().map(|&p| p as u64));
    }
    w.push(u64::MAX);
    for t in targets {
        let pos = sweep
            .order
            .iter()
            .position(|k| k == t)
            .unwrap_or(usize::MAX);
        w.push(pos as u64);
    }
    w.push(options.fuse as u64);
    let hash = hash_words(&w);
    Ok((Signature { words: w, hash }, b))
}

fn dtype_code(d: DType) -> u64 {
    d as u64
}

fn device_code(d: crate::device::Device) -> u64 {
    match d {
        crate::device::Device::Cpu => 0,
        crate::device::Device::Cuda(n) => 1 + n as u64,
    }
}

fn encode_op(op: &Op, w: &mut Vec<u64>) {
    match op {
        Op::Buffer => w.push(1),
        Op::Generate(g) => w.extend([2, g.kind() as u64]),
        Op::Unary(u) => w.extend([3, *u as u64]),
        Op::Binary(b) => w.extend([4, *b as u64]),
        Op::Where => w.push(5),
        Op::Cast => w.push(6),
        Op::Reduce { op, axes } => {
            w.extend([7, *op as u64, axes.len() as u64]);
            w.extend(axes.iter().map(|&a| a as u64));
        }
        Op::Matmul => w.push(8),
        Op::Movement(m) => encode_movement(m, w),
        Op::Contiguous => w.push(10),
        Op::ToDevice(d) => w.extend([11, device_code(*d)]),
        Op::Assign => w.push(12),
        Op::Gather { axis } => w.extend([13, *axis as u64]),
        Op::Scatter { axis, reduce } => w.extend([14, *axis as u64, *reduce as u64]),
        Op::Scan { op, axis } => w.extend([15, *op as u64, *axis as u64]),
        Op::ArgSort { axis, descending } => w.extend([16, *axis as u64, *descending as u64]),
    }
}

fn encode_movement(m: &Movement, w: &mut Vec<u64>) {
    let list = |w: &mut Vec<u64>, tag: u64, xs: &[usize]| {
        w.extend([9, tag, xs.len() as u64]);
        w.extend(xs.iter().map(|&x| x as u64));
    };
    match m {
        Movement::Reshape(s) => list(w, 0, s),
        Movement::Permute(p) => list(w, 1, p),
        Movement::Expand(s) => list(w, 2, s),
        Movement::Flip(a) => list(w, 3, a),
        Movement::Slice(r) => {
            w.extend([9, 4, r.len() as u64]);
            for x in r {
                w.extend([x.start as u64, x.end as u64, x.step as u64]);
            }
        }
        Movement::Pad { pads, value } => {
            w.extend([9, 5, pads.len() as u64]);
            for &(a, b) in pads {
                w.extend([a as u64, b as u64]);
            }
            let (tag, bits) = value.key();
            w.extend([tag as u64, bits]);
        }
    }
}

/// A 64-bit hash of a word list (a multiply-rotate mix; collisions are resolved by
/// comparing whole signatures).
fn hash_words(w: &[u64]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ w.len() as u64;
    for &x in w {
        h = (h.rotate_left(5) ^ x).wrapping_mul(0x517C_C1B7_2722_0A95);
    }
    h ^ (h >> 29)
}

/// A plan kept for replay.
#[derive(Debug)]
pub struct CachedPlan {
    /// What the backends run.
    pub program: Program,
    /// Where each result lives after the run: (sweep position of the node, buffer).
    pub installs: Vec<(usize, BufferRef)>,
    /// Number of kernels in the plan.
    pub kernels: usize,
    /// Number of those kernels that are explicit copies.
    pub copies: usize,
    /// Most planned bytes alive at once (the buffer plan's peak).
    pub planned_peak_bytes: usize,
    /// Number of nodes the lowering pass sent back to be stored.
    pub stored_by_lowering: usize,
    /// Bytes naive allocation would hold (every stored value alive for the whole run).
    pub naive_bytes: usize,
}

impl CachedPlan {
    /// Keeps what replaying `plan` needs; `sweep` is the sweep it was planned from.
    pub fn new(plan: Plan, sweep: &Sweep) -> CachedPlan {
        let position: HashMap<NodeKey, usize> = sweep
            .order
            .iter()
            .enumerate()
            .map(|(i, &k)| (k, i))
            .collect();
        let installs = plan
            .target_buffers()
            .into_iter()
            .chain(plan.kept_buffers())
            .filter_map(|(k, r)| position.get(&k).map(|&p| (p, r)))
            .collect();
        CachedPlan {
            kernels: plan.kernel_count(),
            copies: plan.copy_count(),
            planned_peak_bytes: plan.buffers.peak_bytes,
            stored_by_lowering: plan.stored_by_lowering.len(),
            naive_bytes: plan.buffers.buffers.iter().map(|b| b.bytes).sum(),
            installs,
            program: plan.program,
        }
    }
}

/// Counters of the process-wide plan cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Realizes that replayed a cached plan.
    pub hits: u64,
    /// Realizes that planned (and cached the plan).
    pub misses: u64,
    /// Plans held now.
    pub entries: usize,
    /// Plans dropped to make room.
    pub evictions: u64,
    /// Most plans held at once.
    pub capacity: usize,
}

/// The cache: signatures to plans, least recently used evicted first.
#[derive(Debug)]
pub struct PlanCache {
    map: HashMap<u64, Vec<(Signature, Arc<CachedPlan>, u64)>>,
    capacity: usize,
    clock: u64,
    entries: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl PlanCache {
    /// An empty cache for at most `capacity` plans (0 disables caching).
    pub fn new(capacity: usize) -> PlanCache {
        PlanCache {
            map: HashMap::new(),
            capacity,
            clock: 0,
            entries: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// Most plans held at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The plan for `sig`, if cached (counts a hit or a miss).
    pub fn get(&mut self, sig: &Signature) -> Option<Arc<CachedPlan>> {
        self.clock += 1;
        let clock = self.clock;
        let found = self.map.get_mut(&sig.hash).and_then(|bucket| {
            bucket.iter_mut().find(|e| e.0 == *sig).map(|e| {
                e.2 = clock;
                Arc::clone(&e.1)
            })
        });
        match found {
            Some(p) => {
                self.hits += 1;
                Some(p)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Caches `plan` under `sig`, evicting the least recently used plan when full.
    pub fn insert(&mut self, sig: Signature, plan: Arc<CachedPlan>) {
        if self.capacity == 0 {
            return;
        }
        if self.entries >= self.capacity {
            self.evict_one();
        }
        self.clock += 1;
        let bucket = self.map.entry(sig.hash).or_default();
        if let Some(e) = bucket.iter_mut().find(|e| e.0 == sig) {
            e.1 = plan;
            e.2 = self.clock;
            return;
        }
        bucket.push((sig, plan, self.clock));
        self.entries += 1;
    }

    fn evict_one(&mut self) {
        let oldest = self
            .map
            .iter()
            .flat_map(|(&h, b)| b.iter().enumerate().map(move |(i, e)| (e.2, h, i)))
            .min();
        if let Some((_, h, i)) = oldest
            && let Some(bucket) = self.map.get_mut(&h)
        {
            bucket.swap_remove(i);
            if bucket.is_empty() {
                self.map.remove(&h);
            }
            self.entries -= 1;
            self.evictions += 1;
        }
    }

    /// Drops every plan (the counters stay).
    pub fn clear(&mut self) {
        self.map.clear();
        self.entries = 0;
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            entries: self.entries,
            evictions: self.evictions,
            capacity: self.capacity,
        }
    }
}

/// Default capacity: `KILN_PLAN_CACHE` (a number of plans; 0 disables) or 512.
fn default_capacity() -> usize {
    std::env::var("KILN_PLAN_CACHE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(512)
}

static CACHE: std::sync::LazyLock<Mutex<PlanCache>> =
    std::sync::LazyLock::new(|| Mutex::new(PlanCache::new(default_capacity())));

/// Runs `f` with the process-wide plan cache.
pub fn with_cache<R>(f: impl FnOnce(&mut PlanCache) -> R) -> R {
    let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut c)
}

/// The process-wide plan cache's counters.
pub fn cache_stats() -> CacheStats {
    with_cache(|c| c.stats())
}

/// Drops every cached plan.
pub fn clear_cache() {
    with_cache(|c| c.clear())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;
    use crate::graph::with_graph;

    fn sig_of(t: &Tensor) -> (Signature, Bindings) {
        with_graph(|g| {
            let sweep = g.sweep(&[t.node_key()]).unwrap();
            signature(g, &sweep, &[t.node_key()], &RealizeOptions::default()).unwrap()
        })
    }

    fn dummy() -> Arc<CachedPlan> {
        Arc::new(CachedPlan {
            program: Program::default(),
            installs: vec![],
            kernels: 0,
            copies: 0,
            planned_peak_bytes: 0,
            stored_by_lowering: 0,
            naive_bytes: 0,
        })
    }

    #[test]
    fn generator_values_are_bindings_not_structure() {
        let x = Tensor::ones([3]);
        let (a, ba) = sig_of(&(&x * 2.0 + Tensor::rand_seeded([3], 1)));
        let (b, bb) = sig_of(&(&x * 5.0 + Tensor::rand_seeded([3], 9)));
        assert_eq!(a, b);
        assert_ne!(ba.params, bb.params);
        let (c, _) = sig_of(&(&x * 2.0 - Tensor::rand_seeded([3], 1)));
        assert_ne!(a, c, "a different op is a different structure");
        let (d, _) = sig_of(&(&x.pad(&[(1, 0)], 2.0) * 2.0));
        let (e, _) = sig_of(&(&x.pad(&[(1, 0)], 3.0) * 2.0));
        assert_ne!(d, e, "pad values are structure");
    }

    #[test]
    fn least_recently_used_plans_are_evicted() {
        let x = Tensor::ones([2]);
        let sigs: Vec<Signature> = [x.exp(), x.log(), x.sin()]
            .iter()
            .map(|t| sig_of(t).0)
            .collect();
        let mut c = PlanCache::new(2);
        c.insert(sigs[0].clone(), dummy());
        c.insert(sigs[1].clone(), dummy());
        assert!(c.get(&sigs[0]).is_some()); // 0 is now more recent than 1
        c.insert(sigs[2].clone(), dummy());
        let s = c.stats();
        assert_eq!((s.entries, s.evictions), (2, 1));
        assert!(c.get(&sigs[1]).is_none());
        assert!(c.get(&sigs[0]).is_some() && c.get(&sigs[2]).is_some());
        assert_eq!(c.stats().misses, 1);
        let mut off = PlanCache::new(0);
        off.insert(sigs[0].clone(), dummy());
        assert!(off.get(&sigs[0]).is_none());
    }
}
