//! Runs a [`CpuKernel`]: splits the output rows into items, spreads items over rayon's pool
//! above a size threshold, and evaluates every instruction over runs of up to [`CHUNK`]
//! elements, so each op is one tight loop over a register. The per-task function is
//! compiled three times (AVX-512, AVX2+FMA, baseline) and picked at run time.
//!
//! Soundness of the raw memory access here rests on three checks made before a program
//! runs (see [`super::run_kernel`]): every view's offsets lie inside its buffer
//! ([`crate::kernel::Kernel::validate`]), every buffer is at least as large as its argument,
//! and store views are injective, so items (which partition the output coordinates) never
//! write the same element from two threads. Inputs are never written by the kernel reading
//! them, except a matmul epilogue, which reads each output element only in the item that
//! writes it and never borrows it. An epilogue run by rows ([`RowItems`]) runs while the
//! product is still computing other rows on other threads: its items read and write only
//! rows the product has finished, which no thread writes again.

use super::ops::{self, Acc, CastTo, Src};
use super::prefetch::NextRun;
use super::program::{CHUNK, CpuKernel, PInstr, Strategy, is_scalar};
use super::register::Register;
use crate::dtype::Scalar;
use crate::dtype::{ComputeType, DType};
use crate::kernel::IrOp;
use crate::kernel::Level;
use crate::ops::{GenKind, ReduceOp, UnaryOp, seed_of};
use crate::ops::{Num, Scal};
use crate::random;
use rayon::prelude::*;
use std::cell::RefCell;

/// A kernel argument's memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArgPtr {
    pub ptr: *mut u8,
}

// SAFETY: an ArgPtr is only dereferenced inside a kernel run, under the disjointness and
// bounds guarantees stated at the top of this module.
unsafe impl Send for ArgPtr {}
// SAFETY: as above; shared ArgPtrs are only read from, or written at disjoint elements.
unsafe impl Sync for ArgPtr {}

/// Where an instruction's current value lives.
#[derive(Debug, Clone, Copy)]
enum Val {
    None,
    Reg(usize),
    /// A run read in place from a buffer.
    Ptr(*const u8),
    Scalar(Scal),
}

macro_rules! with_ct {
    ($ct:expr, $T:ident => $body:expr) => {
        match $ct {
            ComputeType::U8 => {
                type $T = u8;
                $body
            }
            ComputeType::I32 => {
                type $T = i32;
                $body
            }
            ComputeType::I64 => {
                type $T = i64;
                $body
            }
            ComputeType::F32 => {
                type $T = f32;
                $body
            }
            ComputeType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

thread_local! {
    static REGS: RefCell<Vec<Register>> = const { RefCell::new(Vec::new()) };
    /// Per-thread buffers for values saved across the passes of a row reduction.
    static SAVED: RefCell<Vec<Register>> = const { RefCell::new(Vec::new()) };
}

/// Work decomposition: an item is a run of up to `item_len` positions along the last output
/// dimension at fixed other output coordinates. Items are numbered row by row, or, when a
/// view walks the run dimension with a large stride (a transpose), tile by tile: `tile`
/// consecutive rows of another output dimension share each column block, so the cache lines
/// and pages a strided read touches are reused across the tile.
struct Items {
    out_dims: Vec<usize>,
    item_len: usize,
    chunks: usize,
    /// `(dimension, tile size)` when tiled.
    tile: Option<(usize, usize)>,
    count: usize,
}

impl Items {
    fn new(prog: &CpuKernel, item_len: usize, tile: Option<(usize, usize)>) -> Items {
        let out_dims = prog.dims[..prog.n_out].to_vec();
        let last = out_dims[prog.n_out - 1];
        let item_len = item_len.clamp(1, last.max(1));
        let chunks = last.div_ceil(item_len).max(1);
        let rows: usize = out_dims[..prog.n_out - 1].iter().product();
        let count = match tile {
            None => rows * chunks,
            Some((d, t)) => (rows / out_dims[d].max(1)) * out_dims[d].div_ceil(t) * t * chunks,
        };
        Items {
            out_dims,
            item_len,
            chunks,
            tile,
            count,
        }
    }

    fn count(&self) -> usize {
        self.count
    }

    /// Sets the output coordinates of `item` (the run dimension to the run start) and returns
    /// the run length, or `None` for a padding slot of a partial tile.
    #[inline(always)]
    fn locate(&self, item: usize, coords: &mut [usize]) -> Option<usize> {
        let run = self.out_dims.len() - 1;
        let last = self.out_dims[run];
        let (mut rest, chunk) = match self.tile {
            None => (item / self.chunks, item % self.chunks),
            Some((d, t)) => {
                let r = item % t;
                let rest = item / t;
                let chunk = rest % self.chunks;
                let rest = rest / self.chunks;
                let tiles = self.out_dims[d].div_ceil(t);
                let c = (rest % tiles) * t + r;
                if c >= self.out_dims[d] {
                    return None;
                }
                coords[d] = c;
                (rest / tiles, chunk)
            }
        };
        for dd in (0..run).rev() {
            if self.tile.is_some_and(|(d, _)| d == dd) {
                continue;
            }
            let n = self.out_dims[dd];
            coords[dd] = rest % n;
            rest /= n;
        }
        let j0 = chunk * self.item_len;
        coords[run] = j0;
        Some(self.item_len.min(last - j0))
    }
}

/// Picks a tiled order for elementwise programs whose loads or stores walk the run
/// dimension with a large stride.
fn tiling(prog: &CpuKernel) -> Option<(usize, usize)> {
    if prog.has_reduce || prog.n_out < 2 || prog.dims[prog.n_out - 1] < 32 {
        return None;
    }
    let run = prog.n_out - 1;
    let mut best: Option<(usize, isize)> = None;
    for p in &prog.instrs {
        let v = match &p.op {
            IrOp::Load { view, .. } | IrOp::Store { view, .. } => view,
            _ => continue,
        };
        if v.strides[run].abs() < 16 {
            continue;
        }
        // The output dimension this view walks most densely.
        for d in 0..run {
            let s = v.strides[d].abs();
            if s != 0
                && s < v.strides[run].abs()
                && prog.dims[d] >= 2
                && best.is_none_or(|b| s < b.1)
            {
                best = Some((d, s));
            }
        }
    }
    // A tile never needs more rows than the dimension has (no padding slots).
    best.map(|(d, _)| (d, TILE_ROWS.min(prog.dims[d])))
}

/// Tiled order: rows of the densely walked dimension that share each column block.
const TILE_ROWS: usize = 64;
/// Tiled order: run length. A strided run touches one cache line per element, which the
/// next `TILE_ROWS - 1` items reuse from L1; longer runs amortize the per-item setup (on a
/// 2-core AVX-512 machine 256 × 64 transposed 4096² f32 in 24 ms, 32 × 32 in 54 ms).
const TILE_RUN: usize = 256;

/// What one run of a kernel binds: buffer pointers and parameter values.
pub(crate) struct Env<'a> {
    pub args: &'a [ArgPtr],
    /// The first out-of-range index a gather met, with its dimension's size (the kernel
    /// reads its fill value instead and the run reports the error).
    pub bad_index: std::sync::Mutex<Option<(i64, usize)>>,
    pub params: &'a [Scalar],
    /// Per instruction: constants' and parameters' values in their compute type.
    pub scals: Vec<Scal>,
}

impl<'a> Env<'a> {
    /// Binds `args` and `params` for `prog`.
    pub(crate) fn new(prog: &CpuKernel, args: &'a [ArgPtr], params: &'a [Scalar]) -> Env<'a> {
        let scals = prog
            .instrs
            .iter()
            .map(|p| match p.op {
                IrOp::Param { slot } => {
                    Scal::from_scalar(params.get(slot).copied().unwrap_or(Scalar::Int(0)), p.dtype)
                }
                _ => p.scal,
            })
            .collect();
        Env {
            args,
            bad_index: std::sync::Mutex::new(None),
            params,
            scals,
        }
    }
}

/// Runs `prog` with `env`.
pub(crate) fn execute(prog: &CpuKernel, env: &Env<'_>) {
    let rows = prog.rows();
    let red = prog.reduce_len().max(1);
    // Nothing to write: no output rows, or a space without elements and no row stores
    // (a layer norm over `[3, 2^40, 0, 2^33]` would otherwise walk its 3·2^40 rows of
    // nothing).
    if rows == 0 || prog.dims.contains(&0) && (!prog.has_reduce || prog.row_stores.is_empty()) {
        return;
    }
    if super::transpose::try_run(prog, env) {
        return;
    }
    let threads = crate::backend::threads().max(1);
    if prog.strategy == Strategy::OutInner
        && !prog.has_reduce
        && prog.pack > 1
        && tiling(prog).is_none()
    {
        return run_packed_rows(prog, env);
    }
    if let Some(blocks) = column_blocks(prog) {
        return run_column_split(prog, env, blocks);
    }
    if prog.strategy == Strategy::ReduceInner
        && splittable(prog)
        && rows < 2 * threads
        && rows * red >= 1 << 16
    {
        return run_split(prog, env, threads);
    }
    let item_len = match prog.strategy {
        Strategy::OutInner => CHUNK,
        Strategy::ReduceInner => {
            // Keep a block's rows cache-resident across passes; leave work for every thread.
            let per_row_bytes = red * 4;
            let by_cache = ((256 << 10) / per_row_bytes.max(1)).max(1);
            let by_threads = rows.div_ceil(threads * 4).max(1);
            by_cache.min(by_threads).min(CHUNK)
        }
    };
    let tile = tiling(prog);
    let item_len = if tile.is_some() { TILE_RUN } else { item_len };
    let items = Items::new(prog, item_len, tile);
    for_each_task(items.count(), items.item_len * red, |lo, hi| {
        run_items(prog, env, &items, lo, hi)
    });
}

/// A matmul epilogue run block by block as its product's rows become final (see
/// [`super::matmul::run_then`]), by the thread that computed them, while they are in its
/// cache. The items are those [`execute`] would run (plain runs, or packed rows), which
/// walk the output in row-major order; a block runs the items lying wholly inside it, and
/// [`RowItems::finish`] runs the few that straddle two blocks once the product is done.
pub(crate) struct RowItems {
    items: RowItemKind,
    /// Elements per product row.
    n: usize,
}

/// The rows where one reported block ended and another began, in one run of a product.
pub(crate) type Boundaries = std::sync::Mutex<Vec<usize>>;

enum RowItemKind {
    /// Runs along the output's last (possibly merged) dimension.
    Plain(Items),
    /// Blocks of `pack` product rows ([`run_packed_rows`]).
    Packed(usize),
}

impl RowItems {
    /// `prog` as the epilogue of an `m × n` product written row-major from offset 0 into
    /// argument `out`, when [`execute`] would run it as plain or packed items in the
    /// output's row-major order (elementwise, no tiles or copy routes), and every view of
    /// `out` is that row-major layout (so an item reads only product elements it writes).
    pub(crate) fn new(prog: &CpuKernel, out: usize, m: usize, n: usize) -> Option<RowItems> {
        let packed = prog.pack > 1 && prog.dims == [m, n];
        let plain = prog.strategy == Strategy::OutInner
            && !prog.has_reduce
            && prog.n_out == prog.dims.len()
            && (prog.pack <= 1 || packed)
            && prog.row_stores.is_empty()
            && prog.rows() == m * n
            && m * n > 0
            && tiling(prog).is_none()
            && column_blocks(prog).is_none()
            && !super::transpose::may_run(prog);
        if !plain {
            return None;
        }
        let row_major = crate::shape::contiguous_strides(&prog.dims);
        let own_layout = prog.instrs.iter().all(|p| match &p.op {
            IrOp::Load { arg, view, .. } | IrOp::Store { arg, view, .. } if *arg == out => {
                view.offset == 0 && view.mask.is_none() && view.strides == row_major
            }
            _ => true,
        });
        if !own_layout {
            return None;
        }
        let items = if packed {
            RowItemKind::Packed(prog.pack)
        } else {
            RowItemKind::Plain(Items::new(prog, CHUNK, None))
        };
        Some(RowItems { items, n })
    }

    /// The item holding product row `r`'s first element, and whether it starts there.
    fn item_at(&self, r: usize) -> (usize, bool) {
        match &self.items {
            RowItemKind::Plain(items) => {
                let pos = r * self.n;
                let last = items.out_dims[items.out_dims.len() - 1];
                let (row, within) = (pos / last, pos % last);
                (
                    row * items.chunks + within / items.item_len,
                    within.is_multiple_of(items.item_len),
                )
            }
            RowItemKind::Packed(pack) => (r / pack, r.is_multiple_of(*pack)),
        }
    }

    /// The first item starting at or after product row `r`.
    fn first_from(&self, r: usize) -> usize {
        let (i, starts) = self.item_at(r);
        if starts { i } else { i + 1 }
    }

    fn run_range(&self, prog: &CpuKernel, env: &Env<'_>, lo: usize, hi: usize) {
        if lo >= hi {
            return;
        }
        match &self.items {
            RowItemKind::Plain(items) => run_items(prog, env, items, lo, hi),
            RowItemKind::Packed(_) => packed_items(prog, env, lo, hi),
        }
    }

    /// Runs, on this thread, the items lying wholly inside product rows `[r0, r1)`, which
    /// are final, and records `r1` in `boundaries`; blocks reported this way in one run
    /// must not overlap.
    pub(crate) fn run(
        &self,
        prog: &CpuKernel,
        env: &Env<'_>,
        boundaries: &Boundaries,
        r0: usize,
        r1: usize,
    ) {
        let lo = self.first_from(r0);
        // The items ending at or before r1: all before the one holding r1 (whether that
        // one starts there or straddles it); all items for the last row.
        let hi = if r1 * self.n >= self.total(prog) {
            self.count(prog)
        } else {
            self.item_at(r1).0
        };
        self.run_range(prog, env, lo, hi);
        boundaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r1);
    }

    fn total(&self, prog: &CpuKernel) -> usize {
        prog.rows()
    }

    fn count(&self, prog: &CpuKernel) -> usize {
        match &self.items {
            RowItemKind::Plain(items) => items.count(),
            RowItemKind::Packed(pack) => prog.dims[0].div_ceil(*pack),
        }
    }

    /// Runs the items no block held wholly (each straddles the end of a reported block), on
    /// this thread, after the product has finished every row.
    pub(crate) fn finish(&self, prog: &CpuKernel, env: &Env<'_>, boundaries: Boundaries) {
        let mut left: Vec<usize> = boundaries
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|&&r| r * self.n < self.total(prog))
            .filter_map(|&r| match self.item_at(r) {
                (i, false) => Some(i),
                (_, true) => None,
            })
            .collect();
        left.sort_unstable();
        left.dedup();
        for i in left {
            self.run_range(prog, env, i, i + 1);
        }
    }
}

/// Splits `n_items` items of `work_per_item` positions each into tasks of about 64K
/// positions and runs `f(lo, hi)` for each: across rayon's pool above 32K positions in all,
/// in order on this thread below that.
fn for_each_task(n_items: usize, work_per_item: usize, f: impl Fn(usize, usize) + Sync) {
    let per_task = (65_536 / work_per_item.max(1)).max(1);
    let n_tasks = n_items.div_ceil(per_task);
    let run = |task: usize| f(task * per_task, ((task + 1) * per_task).min(n_items));
    if n_tasks <= 1 || n_items * work_per_item < 1 << 15 {
        (0..n_tasks).for_each(run);
    } else {
        (0..n_tasks).into_par_iter().for_each(run);
    }
}

/// Elementwise kernels with packed rows ([`CpuKernel::pack`]): an item is up to `pack`
/// consecutive rows of the next-to-last dimension, evaluated as one run.
fn run_packed_rows(prog: &CpuKernel, env: &Env<'_>) {
    let (row_ax, ax) = prog.pack_axes();
    let (len, span) = (prog.dims[ax], prog.dims[row_ax]);
    let blocks = span.div_ceil(prog.pack);
    let outer: usize = prog.dims[..row_ax].iter().product();
    for_each_task(outer * blocks, prog.pack * len, |lo, hi| {
        packed_items(prog, env, lo, hi)
    });
}

/// Items `[lo, hi)` of [`run_packed_rows`] on this thread.
fn packed_items(prog: &CpuKernel, env: &Env<'_>, lo: usize, hi: usize) {
    let (row_ax, ax) = prog.pack_axes();
    let (len, span) = (prog.dims[ax], prog.dims[row_ax]);
    let blocks = span.div_ceil(prog.pack);
    REGS.with(|cell| {
        let mut m = new_machine(prog, env, cell.take());
        for item in lo..hi {
            let (mut o, b) = (item / blocks, item % blocks);
            for d in (0..row_ax).rev() {
                m.coords[d] = o % prog.dims[d];
                o /= prog.dims[d];
            }
            let r0 = b * prog.pack;
            m.coords[row_ax] = r0;
            m.coords[ax] = 0;
            m.item_out_packed(prog.pack.min(span - r0), len);
        }
        cell.replace(m.regs);
    });
    if prog.streams {
        super::stream::fence();
    }
}

fn splittable(prog: &CpuKernel) -> bool {
    prog.phases.len() == 2 && prog.phases[1].stores.is_empty() && !prog.phases[0].reduces.is_empty()
}

/// The loop-carrying operations, compiled once per SIMD level.
struct Loops {
    eval: fn(&mut Machine<'_>, usize, usize, usize),
    store: fn(&mut Machine<'_>, usize, usize),
    accumulate: fn(&mut Machine<'_>, usize, i64),
    /// [`Machine::accumulate_rows_impl`] at this SIMD level.
    accumulate_rows: fn(&mut Machine<'_>, usize, &[*const u8; ops::ACC_ROWS]) -> bool,
    reduce_run: fn(&Machine<'_>, usize, &mut AccAny, i64),
    reduce_packed: fn(&mut Machine<'_>, usize, usize, usize),
    expand_row: fn(&mut Machine<'_>, usize, usize, usize, usize),
    /// [`ops::reduce_segments_portable`] at this SIMD level.
    segments_f32: fn(ReduceOp, &[f32], usize, &mut [f32]),
    /// [`ops::reduce_segments_f16_portable`] at this SIMD level.
    segments_f16: fn(ReduceOp, &[u16], usize, &mut [f32]),
}

macro_rules! loops_for {
    ($name:ident, $feat:literal, $segments:path, $segments16:path) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use super::*;
            #[target_feature(enable = $feat)]
            unsafe fn eval(m: &mut Machine<'_>, v: usize, ax: usize, reg: usize) {
                m.eval_impl(v, ax, reg)
            }
            #[target_feature(enable = $feat)]
            unsafe fn store(m: &mut Machine<'_>, s: usize, ax: usize) {
                m.store_impl(s, ax)
            }
            #[target_feature(enable = $feat)]
            unsafe fn accumulate(m: &mut Machine<'_>, r: usize, index: i64) {
                m.accumulate_impl(r, index)
            }
            #[target_feature(enable = $feat)]
            unsafe fn accumulate_rows(
                m: &mut Machine<'_>,
                r: usize,
                rows: &[*const u8; ops::ACC_ROWS],
            ) -> bool {
                m.accumulate_rows_impl(r, rows)
            }
            #[target_feature(enable = $feat)]
            unsafe fn reduce_run(m: &Machine<'_>, r: usize, acc: &mut AccAny, index0: i64) {
                m.reduce_run_impl(r, acc, index0)
            }
            #[target_feature(enable = $feat)]
            unsafe fn reduce_packed(m: &mut Machine<'_>, r: usize, t: usize, segs: usize) {
                m.reduce_packed_impl(r, t, segs)
            }
            #[target_feature(enable = $feat)]
            unsafe fn segments_f32(op: ReduceOp, src: &[f32], len: usize, out: &mut [f32]) {
                $segments(op, src, len, out)
            }
            #[target_feature(enable = $feat)]
            unsafe fn segments_f16(op: ReduceOp, src: &[u16], len: usize, out: &mut [f32]) {
                $segments16(op, src, len, out)
            }
            #[target_feature(enable = $feat)]
            unsafe fn expand_row(m: &mut Machine<'_>, v: usize, t: usize, segs: usize, len: usize) {
                m.expand_row_impl(v, t, segs, len)
            }
            // SAFETY (all nine): these are only installed by `pick_loops` after
            // `is_x86_feature_detected!` confirmed every feature they enable.
            pub(super) static LOOPS: Loops = Loops {
                eval: |m, v, ax, reg| unsafe { eval(m, v, ax, reg) },
                store: |m, s, ax| unsafe { store(m, s, ax) },
                accumulate: |m, r, i| unsafe { accumulate(m, r, i) },
                accumulate_rows: |m, r, rows| unsafe { accumulate_rows(m, r, rows) },
                reduce_run: |m, r, a, i| unsafe { reduce_run(m, r, a, i) },
                reduce_packed: |m, r, t, s| unsafe { reduce_packed(m, r, t, s) },
                expand_row: |m, v, t, s, l| unsafe { expand_row(m, v, t, s, l) },
                segments_f32: |op, x, len, out| unsafe { segments_f32(op, x, len, out) },
                segments_f16: |op, x, len, out| unsafe { segments_f16(op, x, len, out) },
            };
        }
    };
}

loops_for!(
    avx512,
    "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c,bmi1,bmi2,popcnt",
    ops::reduce_segments_f32_avx512,
    ops::reduce_segments_f16_avx512
);
loops_for!(
    avx2,
    "avx2,fma,f16c,bmi1,bmi2,popcnt",
    ops::reduce_segments_f32_avx2,
    ops::reduce_segments_f16_avx2
);

static GENERIC_LOOPS: Loops = Loops {
    eval: |m, v, ax, reg| m.eval_impl(v, ax, reg),
    store: |m, s, ax| m.store_impl(s, ax),
    accumulate: |m, r, i| m.accumulate_impl(r, i),
    accumulate_rows: |m, r, rows| m.accumulate_rows_impl(r, rows),
    reduce_run: |m, r, a, i| m.reduce_run_impl(r, a, i),
    reduce_packed: |m, r, t, s| m.reduce_packed_impl(r, t, s),
    expand_row: |m, v, t, s, l| m.expand_row_impl(v, t, s, l),
    segments_f32: |op, x, len, out| ops::reduce_segments_portable(op, x, len, out),
    segments_f16: |op, x, len, out| ops::reduce_segments_f16_portable(op, x, len, out),
};

fn loops() -> &'static Loops {
    static PICK: std::sync::OnceLock<&'static Loops> = std::sync::OnceLock::new();
    PICK.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // `KILN_SIMD=avx2` caps the level at AVX2 (to run the AVX2 loops on an AVX-512
            // machine); `KILN_SIMD=generic`, like `KILN_NO_SIMD`, turns SIMD off.
            let cap = std::env::var("KILN_SIMD").unwrap_or_default();
            if std::env::var_os("KILN_NO_SIMD").is_none() && cap != "generic" {
                let all = |f: &[bool]| f.iter().all(|&x| x);
                let avx2 = all(&[
                    is_x86_feature_detected!("avx2"),
                    is_x86_feature_detected!("fma"),
                    is_x86_feature_detected!("f16c"),
                    is_x86_feature_detected!("bmi1"),
                    is_x86_feature_detected!("bmi2"),
                    is_x86_feature_detected!("popcnt"),
                ]);
                let avx512 = all(&[
                    is_x86_feature_detected!("avx512f"),
                    is_x86_feature_detected!("avx512vl"),
                    is_x86_feature_detected!("avx512bw"),
                    is_x86_feature_detected!("avx512dq"),
                ]);
                if avx2 && avx512 && cap != "avx2" {
                    return &avx512::LOOPS;
                }
                if avx2 {
                    return &avx2::LOOPS;
                }
            }
        }
        &GENERIC_LOOPS
    })
}

/// The SIMD level the CPU backend runs at (`avx512`, `avx2` or `generic`).
pub fn simd_level() -> &'static str {
    let l = loops() as *const Loops;
    #[cfg(target_arch = "x86_64")]
    {
        if std::ptr::eq(l, &avx512::LOOPS) {
            return "avx512";
        }
        if std::ptr::eq(l, &avx2::LOOPS) {
            return "avx2";
        }
    }
    let _ = l;
    "generic"
}

fn run_items(prog: &CpuKernel, env: &Env<'_>, items: &Items, lo: usize, hi: usize) {
    items_impl(prog, env, items, lo, hi)
}

fn new_machine<'p>(prog: &'p CpuKernel, env: &'p Env<'_>, mut regs: Vec<Register>) -> Machine<'p> {
    if regs.len() < prog.n_regs {
        regs.resize_with(prog.n_regs, || Register::zeroed(CHUNK));
    }
    Machine {
        prog,
        bad_index: &env.bad_index,
        args: env.args,
        params: env.params,
        scals: &env.scals,
        loops: loops(),
        regs,
        vals: vec![Val::None; prog.instrs.len()],
        coords: vec![0; prog.dims.len()],
        n: 0,
        row_t: None,
        pack: None,
        saved: Vec::new(),
        save_to: std::ptr::null_mut(),
        next: NextRun::default(),
        prefetching: false,
        later_pass: false,
        ahead: 0,
    }
}

fn items_impl(prog: &CpuKernel, env: &Env<'_>, items: &Items, lo: usize, hi: usize) {
    REGS.with(|cell| {
        let mut m = new_machine(prog, env, cell.take());
        m.saved = SAVED.with(|c| c.take());
        for item in lo..hi {
            let Some(n) = items.locate(item, &mut m.coords) else {
                continue;
            };
            let j0 = m.coords[prog.n_out - 1];
            match prog.strategy {
                Strategy::OutInner => m.item_out_inner(n),
                Strategy::ReduceInner => m.item_reduce_inner(j0, n),
            }
        }
        SAVED.with(|c| c.replace(std::mem::take(&mut m.saved)));
        cell.replace(m.regs);
    });
    if prog.streams {
        super::stream::fence();
    }
}

struct Machine<'p> {
    prog: &'p CpuKernel,
    bad_index: &'p std::sync::Mutex<Option<(i64, usize)>>,
    args: &'p [ArgPtr],
    /// The plan's parameter values.
    params: &'p [Scalar],
    /// Per instruction: the value of constants and parameters in their compute type.
    scals: &'p [Scal],
    loops: &'static Loops,
    regs: Vec<Register>,
    vals: Vec<Val>,
    coords: Vec<usize>,
    /// Length of the current run.
    n: usize,
    /// ReduceInner: the row (within the item) whose values are being reduced; `Row` operands
    /// are then read as that row's scalar.
    row_t: Option<usize>,
    /// Packed runs ([`CpuKernel::pack`]): `(t, segs)` while the current run holds rows
    /// `t..t + segs` of the item (`coords` at row `t`), each a segment of the reduce length.
    pack: Option<(usize, usize)>,
    /// ReduceInner: values saved by one pass for a later one, one buffer per reuse slot,
    /// indexed by (row within the item, position in the reduce space).
    saved: Vec<Register>,
    /// While a `save_direct` value is evaluated: where its run goes in its saved buffer.
    save_to: *mut f32,
    /// Prefetches for the next run ([`NextRun`]), while `prefetching`.
    next: NextRun,
    /// Set while a run whose successor usually follows it in memory is evaluated: an
    /// elementwise item along the output's last axis, or one run along a reduced row.
    prefetching: bool,
    /// Set during a row kernel's passes after the first: its loads read the block of rows
    /// from cache, so nothing is hinted.
    later_pass: bool,
    /// Rows between this block and the next one a pass hints (0: none).
    ahead: usize,
}

/// Most words (8 bytes each) a block may use for values saved across passes; larger blocks
/// recompute them instead.
const SAVED_BUDGET_WORDS: usize = 1 << 18;

#[inline(always)]
fn typed<T: bytemuck::Pod>(r: &[u64]) -> &[T] {
    bytemuck::cast_slice(r)
}

#[inline(always)]
fn typed_mut<T: bytemuck::Pod>(r: &mut [u64]) -> &mut [T] {
    bytemuck::cast_slice_mut(r)
}

impl<'p> Machine<'p> {
    #[inline(always)]
    fn set_outer(&mut self, mut outer: usize) {
        for d in (0..self.prog.n_out - 1).rev() {
            let n = self.prog.dims[d];
            self.coords[d] = outer % n;
            outer /= n;
        }
    }

    /// Sets the reduce coordinates from a flat (row-major) reduce index.
    #[inline(always)]
    fn set_reduce_coords(&mut self, mut a: usize) {
        for d in (self.prog.n_out..self.prog.dims.len()).rev() {
            let n = self.prog.dims[d].max(1);
            self.coords[d] = a % n;
            a /= n;
        }
    }

    // ---------------------------------------------------------------- strategies

    #[inline(always)]
    fn item_out_inner(&mut self, n: usize) {
        let prog = self.prog;
        let ax = prog.n_out - 1;
        self.row_t = None;
        self.n = n;
        self.prefetching = !prog.has_reduce && super::prefetch::enabled();
        for &v in &prog.row_first {
            (self.loops.eval)(self, v, ax, usize::MAX);
        }
        let red = prog.reduce_len();
        for ph in &prog.phases {
            for &r in &ph.reduces {
                self.acc_init_vec(r);
            }
            if !ph.elem.is_empty() || !ph.reduces.is_empty() || !ph.stores.is_empty() {
                for a in 0..red {
                    self.set_reduce_coords(a);
                    self.n = n;
                    for &v in &ph.elem {
                        (self.loops.eval)(self, v, ax, ph.regs[v]);
                    }
                    for &r in &ph.reduces {
                        (self.loops.accumulate)(self, r, a as i64);
                    }
                    for &s in &ph.stores {
                        (self.loops.store)(self, s, ax);
                    }
                }
            }
            for &r in &ph.reduces {
                self.acc_finish_vec(r);
            }
            self.n = n;
            for &v in &ph.row_after {
                (self.loops.eval)(self, v, ax, usize::MAX);
            }
        }
        self.store_rows(ax, n);
        if self.prefetching {
            self.next.finish();
            self.prefetching = false;
        }
    }

    /// An elementwise item of `segs` packed rows of `len` (coordinates at its first row).
    #[inline(always)]
    fn item_out_packed(&mut self, segs: usize, len: usize) {
        let prog = self.prog;
        let ax = prog.n_out - 1;
        self.row_t = None;
        self.n = segs * len;
        self.pack = Some((0, segs));
        for ph in &prog.phases {
            for &v in &ph.elem {
                (self.loops.eval)(self, v, ax, ph.regs[v]);
            }
            for &s in &ph.stores {
                (self.loops.store)(self, s, ax);
            }
        }
        self.pack = None;
    }

    /// Writes the `Row` stores of the current run of `n` positions along `ax`.
    #[inline(always)]
    fn store_rows(&mut self, ax: usize, n: usize) {
        self.n = n;
        for &s in &self.prog.row_stores {
            (self.loops.store)(self, s, ax);
        }
    }

    /// Evaluates a pass's `Elem` instructions over the current run: values saved by an
    /// earlier pass are read back first (when `reuse`), and values a later pass needs are
    /// saved at position `at`.
    #[inline(always)]
    fn eval_phase(
        &mut self,
        ph: &super::program::Phase,
        elem: &[usize],
        ax: usize,
        reuse: bool,
        at: usize,
    ) {
        if reuse {
            for &v in &ph.reuses {
                self.use_saved(v, at);
            }
        }
        for &v in elem {
            let saved = reuse && ph.saves.contains(&v);
            if saved && self.prog.instrs[v].save_direct {
                let slot = self.prog.reuse_slot[v];
                let run = &mut typed_mut::<f32>(&mut self.saved[slot])[at..at + self.n];
                self.save_to = run.as_mut_ptr();
                (self.loops.eval)(self, v, ax, ph.regs[v]);
                self.save_to = std::ptr::null_mut();
                continue;
            }
            (self.loops.eval)(self, v, ax, ph.regs[v]);
            if saved {
                self.save(v, at);
            }
        }
    }

    #[inline(always)]
    fn item_reduce_inner(&mut self, j0: usize, rows: usize) {
        let prog = self.prog;
        let row_ax = prog.n_out - 1;
        let ax = prog.dims.len() - 1;
        let run_total = prog.dims[ax];
        // An empty reduce space has no positions at all (the rows keep their identity).
        let outer_red: usize = if run_total == 0 {
            0
        } else {
            prog.dims[prog.n_out..ax].iter().product()
        };
        self.row_t = None;
        self.n = rows;
        for &v in &prog.row_first {
            (self.loops.eval)(self, v, row_ax, usize::MAX);
        }
        let red_total = outer_red * run_total;
        let reuse = prog.n_reuse > 0 && rows * red_total * prog.n_reuse <= SAVED_BUDGET_WORDS;
        if reuse {
            if self.saved.len() < prog.n_reuse {
                self.saved.resize_with(prog.n_reuse, Register::default);
            }
            for b in &mut self.saved[..prog.n_reuse] {
                if b.len() < rows * red_total {
                    // Scratch: every block writes a value's runs before a later pass reads
                    // them.
                    *b = Register::zeroed(rows * red_total);
                }
            }
        }
        for (phase_no, ph) in prog.phases.iter().enumerate() {
            self.later_pass = phase_no > 0;
            // The second pass reads the block from cache: where row reductions hint, it
            // hints the next block's rows (see the `prefetch` module docs).
            self.ahead = if phase_no == 1 && super::prefetch::in_row_reductions() {
                rows
            } else {
                0
            };
            let elem = if reuse { &ph.elem_reusing } else { &ph.elem };
            if prog.pack > 1 && (!ph.reduces.is_empty() || !ph.stores.is_empty()) {
                // One reduce dimension of `run_total` (see `pack_rows`): runs of whole rows.
                let mut t = 0;
                while t < rows {
                    let segs = prog.pack.min(rows - t);
                    self.coords[row_ax] = j0 + t;
                    self.coords[ax] = 0;
                    self.row_t = None;
                    self.n = segs * run_total;
                    for &v in &ph.row_operands {
                        (self.loops.expand_row)(self, v, t, segs, run_total);
                    }
                    self.pack = Some((t, segs));
                    let at = t * red_total;
                    self.eval_phase(ph, elem, ax, reuse, at);
                    for &r in &ph.reduces {
                        (self.loops.reduce_packed)(self, r, t, segs);
                    }
                    for &s in &ph.stores {
                        (self.loops.store)(self, s, ax);
                    }
                    self.pack = None;
                    t += segs;
                }
                self.coords[row_ax] = j0;
            } else if !ph.reduces.is_empty() || !ph.stores.is_empty() {
                for t in 0..rows {
                    self.coords[row_ax] = j0 + t;
                    self.row_t = Some(t);
                    let mut accs: [AccAny; 8] = [AccAny::default(); 8];
                    let mut extra: Vec<AccAny> = vec![];
                    for (i, &r) in ph.reduces.iter().enumerate() {
                        let a = self.acc_init_scalar(r);
                        if i < 8 { accs[i] = a } else { extra.push(a) }
                    }
                    for o in 0..outer_red {
                        self.set_reduce_coords(o * run_total);
                        let mut c0 = 0;
                        while c0 < run_total {
                            let n = CHUNK.min(run_total - c0);
                            self.coords[ax] = c0;
                            self.n = n;
                            let at = t * red_total + o * run_total + c0;
                            self.prefetching = super::prefetch::in_row_reductions();
                            self.eval_phase(ph, elem, ax, reuse, at);
                            let index0 = (o * run_total + c0) as i64;
                            for (i, &r) in ph.reduces.iter().enumerate() {
                                let acc = if i < 8 {
                                    &mut accs[i]
                                } else {
                                    &mut extra[i - 8]
                                };
                                (self.loops.reduce_run)(self, r, acc, index0);
                            }
                            for &s in &ph.stores {
                                (self.loops.store)(self, s, ax);
                            }
                            if self.prefetching {
                                self.next.finish();
                                self.prefetching = false;
                            }
                            c0 += n;
                        }
                    }
                    for (i, &r) in ph.reduces.iter().enumerate() {
                        let acc = if i < 8 { accs[i] } else { extra[i - 8] };
                        self.acc_write_row(r, acc, t);
                    }
                }
                self.row_t = None;
                self.coords[row_ax] = j0;
            }
            self.n = rows;
            for &v in &ph.row_after {
                (self.loops.eval)(self, v, row_ax, usize::MAX);
            }
        }
        self.later_pass = false;
        self.ahead = 0;
        self.coords[row_ax] = j0;
        self.n = rows;
        for &s in &prog.row_stores {
            (self.loops.store)(self, s, row_ax);
        }
    }

    /// Packed runs: fills `v`'s expansion register with row `t + s`'s value across segment
    /// `s`, for each of `segs` segments of `len`.
    #[inline(always)]
    fn expand_row_impl(&mut self, v: usize, t: usize, segs: usize, len: usize) {
        let p = &self.prog.instrs[v];
        let (src, dst) = (p.row_reg, self.prog.exp_reg[v]);
        let mut out = std::mem::take(&mut self.regs[dst]);
        with_ct!(p.ct(), T => {
            let rows = &typed::<T>(&self.regs[src])[t..t + segs];
            let o = &mut typed_mut::<T>(&mut out)[..segs * len];
            for (seg, &x) in o.chunks_exact_mut(len).zip(rows) {
                seg.fill(x);
            }
        });
        self.regs[dst] = out;
    }

    /// Packed runs: evaluates a source (`Load`, `Gather`, `Generate`, `Valid`) of the run
    /// `(t, segs)` into `reg`, in one piece when its view walks consecutive rows as one
    /// strided run, else one row segment at a time.
    #[inline(always)]
    fn eval_packed_source(&mut self, v: usize, ax: usize, reg: usize, segs: usize) {
        let prog = self.prog;
        let p: &PInstr = &prog.instrs[v];
        let row_ax = prog.pack_axes().0;
        let len = prog.dims[ax];
        let n = self.n;
        if let IrOp::Load { arg, view, .. } = &p.op
            && view.mask.is_none()
            && view.strides[row_ax] == len as isize * view.strides[ax]
        {
            let a = self.args[*arg];
            let (base, _) = view.base(&self.coords, ax);
            if view.borrow {
                let sz = p.dtype.size_bytes() as isize;
                // SAFETY: the view's offsets are inside the buffer (checked before the run),
                // so the run's first element is too; the run's `n` elements are the `segs`
                // rows' valid coordinates, consecutive in memory (row stride = `len`).
                let ptr = unsafe { a.ptr.offset(base * sz) } as *const u8;
                self.vals[v] = Val::Ptr(ptr);
                return;
            }
            let mut out = std::mem::take(&mut self.regs[reg]);
            let stride = view.strides[ax];
            load_run(a, p.dtype, base, stride, 0, n, p.scal, &mut out, n);
            self.regs[reg] = out;
            self.vals[v] = Val::Reg(reg);
            return;
        }
        let scratch = prog.scratch_reg;
        if let IrOp::Load { arg, view, .. } = &p.op
            && view.mask.is_none()
            && (view.strides[ax] == 0 || view.strides[row_ax] == 0)
        {
            let a = self.args[*arg];
            let (base, _) = view.base(&self.coords, ax);
            let mut out = std::mem::take(&mut self.regs[reg]);
            if view.strides[ax] == 0 {
                // One value per row (a row statistic): read the `segs` values, then fill
                // each row's segment. Their offsets are the view's at valid coordinates.
                let mut tmp = std::mem::take(&mut self.regs[scratch]);
                let rs = view.strides[row_ax];
                load_run(a, p.dtype, base, rs, 0, segs, p.scal, &mut tmp, segs);
                with_ct!(p.ct(), T => {
                    let vals = &typed::<T>(&tmp)[..segs];
                    let o = &mut typed_mut::<T>(&mut out)[..segs * len];
                    for (seg, &x) in o.chunks_exact_mut(len).zip(vals) {
                        seg.fill(x);
                    }
                });
                self.regs[scratch] = tmp;
            } else {
                // The same row repeated (a weight vector): read it once, copy it on.
                load_run(
                    a,
                    p.dtype,
                    base,
                    view.strides[ax],
                    0,
                    len,
                    p.scal,
                    &mut out,
                    len,
                );
                with_ct!(p.ct(), T => {
                    let o = &mut typed_mut::<T>(&mut out)[..segs * len];
                    for s in 1..segs {
                        o.copy_within(0..len, s * len);
                    }
                });
            }
            self.regs[reg] = out;
            self.vals[v] = Val::Reg(reg);
            return;
        }
        let row0 = self.coords[row_ax];
        let mut out = std::mem::take(&mut self.regs[reg]);
        for s in 0..segs {
            self.coords[row_ax] = row0 + s;
            if let IrOp::Gather {
                arg,
                view,
                stride: step,
                len: glen,
                index,
                ..
            } = &p.op
            {
                // The index run is a packed value: take this row's segment of it.
                let a = self.args[*arg];
                let (base, ok) = view.base(&self.coords, ax);
                let (lo, hi) = if ok {
                    view.run_valid(ax, 0, len)
                } else {
                    (0, 0)
                };
                let at = Run {
                    base,
                    stride: view.strides[ax],
                    lo,
                    hi,
                    n: len,
                };
                let mut tmp = std::mem::take(&mut self.regs[scratch]);
                let uniform = self.uniform_along(*index, ax);
                let idx = match self.fetch::<i64>(*index) {
                    Src::Slice(x) if uniform => Src::Scalar(x[s * len]),
                    Src::Slice(x) => Src::Slice(&x[s * len..(s + 1) * len]),
                    Src::Scalar(x) => Src::Scalar(x),
                };
                let bad = gather_run(a, p.dtype, at, idx, *step, *glen, p.scal, &mut tmp);
                if let Some(bad) = bad {
                    let mut first = self.bad_index.lock().unwrap_or_else(|e| e.into_inner());
                    first.get_or_insert((bad, *glen));
                }
                self.regs[scratch] = tmp;
                self.vals[v] = Val::Reg(scratch);
            } else {
                // Sources read no operands: evaluate the segment as a one-row run.
                let pack = self.pack.take();
                self.n = len;
                (self.loops.eval)(self, v, ax, scratch);
                self.pack = pack;
                self.n = n;
            }
            let saved_n = self.n;
            self.n = len;
            with_ct!(p.ct(), T => {
                let dst = &mut typed_mut::<T>(&mut out)[s * len..(s + 1) * len];
                match self.fetch::<T>(v) {
                    Src::Slice(x) => dst.copy_from_slice(x),
                    Src::Scalar(x) => dst.fill(x),
                }
            });
            self.n = saved_n;
        }
        self.coords[row_ax] = row0;
        self.regs[reg] = out;
        self.vals[v] = Val::Reg(reg);
    }

    /// Packed runs: reduces each row segment of the current run of `r`'s source and writes
    /// rows `t..t + segs` of its row register (the same order as one row per run).
    #[inline(always)]
    fn reduce_packed_impl(&mut self, r: usize, t: usize, segs: usize) {
        let (op, src) = self.reduce_parts(r);
        let len = self.n / segs.max(1);
        let p = &self.prog.instrs[r];
        let (rr, dtype) = (p.row_reg, p.dtype);
        let mut row = std::mem::take(&mut self.regs[rr]);
        let ct = self.prog.instrs[src].ct();
        if ct == ComputeType::F32
            && !op.is_arg()
            && let Src::Slice(x) = self.fetch::<f32>(src)
        {
            // Every segment at once at this SIMD level, into the rows' places, then combined
            // with the identity as `acc_combine` does below.
            let vals = &mut typed_mut::<f32>(&mut row)[t..t + segs];
            (self.loops.segments_f32)(op, &x[..segs * len], len, vals);
            let init = ops::acc_init::<f32>(op);
            for v in vals.iter_mut() {
                *v = ops::acc_combine::<f32>(
                    op,
                    init,
                    ops::Acc {
                        value: *v,
                        index: 0,
                    },
                )
                .value;
            }
        } else {
            with_ct!(ct, T => {
                let s = self.fetch::<T>(src);
                for k in 0..segs {
                    let part = ops::reduce_run::<T>(op, s.segment(k, len), len, 0);
                    let acc = ops::acc_combine::<T>(op, ops::acc_init::<T>(op), part);
                    if op.is_arg() {
                        typed_mut::<i64>(&mut row)[t + k] = acc.index.max(0);
                    } else {
                        typed_mut::<T>(&mut row)[t + k] = acc.value;
                    }
                }
            });
        }
        if dtype.is_half() && !op.is_arg() {
            for x in &mut typed_mut::<f32>(&mut row)[t..t + segs] {
                *x = CastTo::<f32>::cast(*x, dtype);
            }
        }
        self.regs[rr] = row;
    }

    /// Copies the current run of `v` into its saved buffer at element `at`.
    fn save(&mut self, v: usize, at: usize) {
        let slot = self.prog.reuse_slot[v];
        let n = self.n;
        let mut buf = std::mem::take(&mut self.saved[slot]);
        with_ct!(self.prog.instrs[v].ct(), T => {
            let dst = &mut typed_mut::<T>(&mut buf)[at..at + n];
            match self.fetch::<T>(v) {
                Src::Slice(src) => dst.copy_from_slice(src),
                Src::Scalar(x) => dst.fill(x),
            }
        });
        self.saved[slot] = buf;
    }

    /// Makes `v` read its current run from its saved buffer at element `at`.
    fn use_saved(&mut self, v: usize, at: usize) {
        let slot = self.prog.reuse_slot[v];
        let n = self.n;
        with_ct!(self.prog.instrs[v].ct(), T => {
            let run = &typed::<T>(&self.saved[slot])[at..at + n];
            self.vals[v] = Val::Ptr(run.as_ptr().cast::<u8>());
        });
    }

    // ---------------------------------------------------------------- operands

    /// Whether instruction `v` has one value along the run dimension `ax`: a load that
    /// does not move along it (an index broadcast across an embedding row).
    #[inline(always)]
    fn uniform_along(&self, v: usize, ax: usize) -> bool {
        match &self.prog.instrs[v].op {
            IrOp::Load { view, .. } => {
                view.strides.get(ax) == Some(&0)
                    && view
                        .mask
                        .as_ref()
                        .is_none_or(|m| m[ax].0 == 0 && m[ax].1 >= self.prog.dims[ax])
            }
            _ => false,
        }
    }

    #[inline(always)]
    fn fetch<T: Num>(&self, v: usize) -> Src<'_, T> {
        let p = &self.prog.instrs[v];
        if is_scalar(&p.op) {
            return Src::Scalar(T::get(self.scals[v]));
        }
        if p.level == Level::Row {
            if self.pack.is_some() {
                let e = self.prog.exp_reg[v];
                return Src::Slice(&typed::<T>(&self.regs[e])[..self.n]);
            }
            let r = typed::<T>(&self.regs[p.row_reg]);
            return match self.row_t {
                Some(t) => Src::Scalar(r[t]),
                None => Src::Slice(&r[..self.n]),
            };
        }
        match self.vals[v] {
            Val::Reg(r) => Src::Slice(&typed::<T>(&self.regs[r])[..self.n]),
            Val::Ptr(ptr) => {
                // SAFETY: `ptr` points at `n` initialized, aligned elements of type T, either
                // inside an input buffer (bounds checked before the run; borrowed loads only
                // have unit stride and the storage type equal to T; nothing writes that
                // buffer during this kernel) or inside this machine's saved buffer of `v`
                // (`use_saved` took a `[at..at + n]` sub-slice of T; that buffer is written
                // only by the earlier pass that computes `v`, never while a later pass reads
                // it).
                Src::Slice(unsafe { std::slice::from_raw_parts(ptr as *const T, self.n) })
            }
            Val::Scalar(s) => Src::Scalar(T::get(s)),
            Val::None => Src::Scalar(T::ZERO),
        }
    }

    // ---------------------------------------------------------------- evaluation

    /// Evaluates instruction `v` for the current run along `ax`, into `reg` (or its row
    /// register for `Row` values).
    #[inline(always)]
    fn eval_impl(&mut self, v: usize, ax: usize, reg: usize) {
        if self.prefetching {
            self.next.step();
        }
        let p: &PInstr = &self.prog.instrs[v];
        let reg = if p.level == Level::Row {
            p.row_reg
        } else {
            reg
        };
        let n = self.n;
        let dtype = p.dtype;
        if let Some((_, segs)) = self.pack
            && matches!(
                p.op,
                IrOp::Load { .. }
                    | IrOp::Gather { .. }
                    | IrOp::Generate { .. }
                    | IrOp::Valid { .. }
            )
        {
            return self.eval_packed_source(v, ax, reg, segs);
        }
        // Where an f32 unary/binary/pair value goes instead of its register: the output
        // buffer (`direct`) or its saved buffer (`save_direct`). Each op's loop is then
        // still compiled once, writing wherever `out_slice!` points.
        let dst: Option<*mut f32> = if let Some(s) = p.direct {
            self.store_ptr(s, ax)
        } else if p.save_direct && !self.save_to.is_null() {
            Some(self.save_to)
        } else {
            None
        };
        // The output run of an op of compute type `$T` whose register buffer is `$out`.
        macro_rules! out_slice {
            ($T:ty, $out:expr) => {
                match dst {
                    // SAFETY: `dst` is only set for f32 values (`plan_direct_stores`,
                    // `save_direct`), so `$T` is f32 here; it points at this run's `n`
                    // elements of the output buffer (see `store_ptr`) or of `v`'s saved
                    // buffer (set by `eval_phase` from this machine's own f32 buffer, which
                    // nothing resizes or reads while `v` is evaluated). Neither aliases an
                    // operand: the kernel reads its direct-store buffer only as register
                    // copies of this run made earlier in the pass (`plan_direct_stores`),
                    // and no operand of `v` lives in `v`'s saved run.
                    Some(ptr) if std::any::TypeId::of::<$T>() == std::any::TypeId::of::<f32>() => unsafe {
                        std::slice::from_raw_parts_mut(ptr as *mut $T, n)
                    },
                    _ => &mut typed_mut::<$T>($out)[..n],
                }
            };
        }
        let done = |m: &mut Self, out: Register| {
            m.regs[reg] = out;
            m.vals[v] = match dst {
                Some(ptr) => Val::Ptr(ptr as *const u8),
                None => Val::Reg(reg),
            };
        };
        match &p.op {
            IrOp::Const(_) | IrOp::Param { .. } => self.vals[v] = Val::Scalar(self.scals[v]),
            IrOp::Load { arg, view, .. } => {
                let a = self.args[*arg];
                let (base, ok) = view.base(&self.coords, ax);
                let stride = view.strides[ax];
                if view.borrow && ok {
                    let sz = dtype.size_bytes() as isize;
                    // SAFETY: the view's offsets are inside the buffer (checked before the
                    // run), so the run's first element is too.
                    let ptr = unsafe { a.ptr.offset(base * sz) } as *const u8;
                    if self.prefetching {
                        if !self.later_pass {
                            self.next.read_after(ptr, n * sz as usize);
                        } else if self.ahead > 0 && stride == 1 {
                            // The same run `ahead` rows on (a guess past the buffer's end
                            // costs only the hint: prefetches never fault).
                            let row = view.strides[self.prog.n_out - 1];
                            let step = (self.ahead as isize).wrapping_mul(row).wrapping_mul(sz);
                            self.next
                                .read_at(ptr.wrapping_offset(step), n * sz as usize);
                        }
                    }
                    self.vals[v] = Val::Ptr(ptr);
                    return;
                }
                let (lo, hi) = if ok {
                    view.run_valid(ax, self.coords[ax], n)
                } else {
                    (0, 0)
                };
                if self.prefetching && !self.later_pass && stride == 1 && hi > lo {
                    let sz = dtype.size_bytes();
                    let first = a.ptr.wrapping_offset((base + lo as isize) * sz as isize);
                    self.next.read_after(first, (hi - lo) * sz);
                }
                let mut out = std::mem::take(&mut self.regs[reg]);
                load_run(a, dtype, base, stride, lo, hi, p.scal, &mut out, n);
                self.regs[reg] = out;
                self.vals[v] = Val::Reg(reg);
            }
            IrOp::Gather {
                arg,
                view,
                stride: step,
                len,
                index,
                ..
            } => {
                let a = self.args[*arg];
                let (base, ok) = view.base(&self.coords, ax);
                let stride = view.strides[ax];
                let (lo, hi) = if ok {
                    view.run_valid(ax, self.coords[ax], n)
                } else {
                    (0, 0)
                };
                let (step, len, index) = (*step, *len, *index);
                let mut out = std::mem::take(&mut self.regs[reg]);
                let uniform = self.uniform_along(index, ax);
                let idx = match self.fetch::<i64>(index) {
                    Src::Slice(x) if uniform && n > 0 => Src::Scalar(x[0]),
                    idx => idx,
                };
                let at = Run {
                    base,
                    stride,
                    lo,
                    hi,
                    n,
                };
                if let Some(bad) = gather_run(a, dtype, at, idx, step, len, p.scal, &mut out) {
                    let mut first = self.bad_index.lock().unwrap_or_else(|e| e.into_inner());
                    first.get_or_insert((bad, len));
                }
                self.regs[reg] = out;
                self.vals[v] = Val::Reg(reg);
            }
            IrOp::Generate {
                kind, params, view, ..
            } => {
                let (base, ok) = view.base(&self.coords, ax);
                let stride = view.strides[ax];
                let (lo, hi) = if ok {
                    view.run_valid(ax, self.coords[ax], n)
                } else {
                    (0, 0)
                };
                let mut out = std::mem::take(&mut self.regs[reg]);
                let p_at = |i: usize| self.params.get(i).copied().unwrap_or(Scalar::Int(0));
                let args = [p_at(params[0]), p_at(params[1])];
                gen_run(
                    *kind, args, dtype, base, stride, lo, hi, p.scal, &mut out, n,
                );
                self.regs[reg] = out;
                self.vals[v] = Val::Reg(reg);
            }
            IrOp::Valid { view } => {
                let (_, ok) = view.base(&self.coords, ax);
                let (lo, hi) = if ok {
                    view.run_valid(ax, self.coords[ax], n)
                } else {
                    (0, 0)
                };
                let mut out = std::mem::take(&mut self.regs[reg]);
                let o = &mut typed_mut::<u8>(&mut out)[..n];
                o[..lo].fill(0);
                o[lo..hi].fill(1);
                o[hi..].fill(0);
                self.regs[reg] = out;
                self.vals[v] = Val::Reg(reg);
            }
            IrOp::Unary(op, _) if p.pair.is_some() => {
                let Some(pr) = p.pair else { return };
                let mut out = std::mem::take(&mut self.regs[reg]);
                let (x, y) = (self.fetch::<f32>(pr.x), self.fetch::<f32>(pr.y));
                let o = out_slice!(f32, &mut out);
                if pr.negate {
                    if !(*op == UnaryOp::Exp && super::vexp::exp_of_neg(x, o)) {
                        ops::unary_of_neg(*op, x, o);
                    }
                } else if !(*op == UnaryOp::Exp && super::vexp::exp_of_pair(pr.inner, x, y, o)) {
                    ops::unary_of_pair(*op, pr.inner, x, y, o);
                }
                done(self, out);
            }
            IrOp::Unary(op, a) => {
                let (op, a) = (*op, *a);
                let mut out = std::mem::take(&mut self.regs[reg]);
                // f32 `exp` at AVX-512: `vscalefps` (the same bits, fewer instructions).
                let fast_exp = op == UnaryOp::Exp
                    && p.ct() == ComputeType::F32
                    && super::vexp::exp_run(self.fetch::<f32>(a), out_slice!(f32, &mut out));
                if !fast_exp {
                    with_ct!(p.ct(), T => {
                        let src = self.fetch::<T>(a);
                        ops::unary::<T>(op, src, out_slice!(T, &mut out));
                    });
                }
                round_half(dtype, &mut out, n);
                done(self, out);
            }
            IrOp::Binary(..) if p.pair.is_some() => {
                let Some(pr) = p.pair else { return };
                let mut out = std::mem::take(&mut self.regs[reg]);
                let (x, y, z) = (
                    self.fetch::<f32>(pr.x),
                    self.fetch::<f32>(pr.y),
                    self.fetch::<f32>(pr.z),
                );
                let o = out_slice!(f32, &mut out);
                ops::pair_f32(pr.inner, pr.outer, pr.z_left, x, y, z, o);
                done(self, out);
            }
            IrOp::Binary(op, a, b) => {
                let (op, a, b) = (*op, *a, *b);
                let mut out = std::mem::take(&mut self.regs[reg]);
                let in_ct = self.prog.instrs[a].ct();
                if op.is_comparison() {
                    with_ct!(in_ct, T => {
                        let (x, y) = (self.fetch::<T>(a), self.fetch::<T>(b));
                        ops::compare::<T>(op, x, y, &mut typed_mut::<u8>(&mut out)[..n]);
                    });
                } else {
                    with_ct!(in_ct, T => {
                        let (x, y) = (self.fetch::<T>(a), self.fetch::<T>(b));
                        ops::binary::<T>(op, x, y, out_slice!(T, &mut out));
                    });
                    round_half(dtype, &mut out, n);
                }
                done(self, out);
            }
            IrOp::Where(c, a, b) => {
                let (c, a, b) = (*c, *a, *b);
                let mut out = std::mem::take(&mut self.regs[reg]);
                with_ct!(p.ct(), T => {
                    let cond = self.fetch::<u8>(c);
                    let (x, y) = (self.fetch::<T>(a), self.fetch::<T>(b));
                    ops::select::<T>(cond, x, y, &mut typed_mut::<T>(&mut out)[..n]);
                });
                self.regs[reg] = out;
                self.vals[v] = Val::Reg(reg);
            }
            IrOp::Cast(a) => {
                let a = *a;
                let from = self.prog.instrs[a].ct();
                let mut out = std::mem::take(&mut self.regs[reg]);
                with_ct!(from, S => {
                    let src = self.fetch::<S>(a);
                    match p.ct() {
                        ComputeType::U8 => ops::cast::<S, u8>(src, dtype, &mut typed_mut::<u8>(&mut out)[..n]),
                        ComputeType::I32 => ops::cast::<S, i32>(src, dtype, &mut typed_mut::<i32>(&mut out)[..n]),
                        ComputeType::I64 => ops::cast::<S, i64>(src, dtype, &mut typed_mut::<i64>(&mut out)[..n]),
                        ComputeType::F32 => ops::cast::<S, f32>(src, dtype, &mut typed_mut::<f32>(&mut out)[..n]),
                        ComputeType::F64 => ops::cast::<S, f64>(src, dtype, &mut typed_mut::<f64>(&mut out)[..n]),
                    }
                });
                self.regs[reg] = out;
                self.vals[v] = Val::Reg(reg);
            }
            IrOp::Reduce { .. } | IrOp::Store { .. } | IrOp::MatmulResult => {}
        }
    }

    /// The output address of the current run of `Store` instruction `s` (an unmasked f32
    /// store with unit stride along `ax`, see `plan_direct_stores`). Its `n` elements from
    /// there are inside the buffer (the view's offsets were validated before the run), the
    /// store view is injective and items partition the output, so no other thread touches
    /// them, and the kernel reads them only before this write, as copies (a matmul
    /// epilogue's product, an in-place update's old value; see `plan_direct_stores`).
    #[inline(always)]
    fn store_ptr(&self, s: usize, ax: usize) -> Option<*mut f32> {
        let IrOp::Store { arg, view, .. } = &self.prog.instrs[s].op else {
            return None;
        };
        let (base, _) = view.base(&self.coords, ax);
        Some(self.args[*arg].ptr.wrapping_offset(base * 4) as *mut f32)
    }

    /// Writes the run of `Store` instruction `s` along `ax`.
    #[inline(always)]
    fn store_impl(&mut self, s: usize, ax: usize) {
        let p = &self.prog.instrs[s];
        if p.stored_by_src {
            return;
        }
        let IrOp::Store { arg, view, src } = &p.op else {
            return;
        };
        let a = self.args[*arg];
        let (base, _) = view.base(&self.coords, ax);
        let stride = view.strides[ax];
        let n = self.n;
        let dtype = p.dtype;
        if p.stream
            && stride == 1
            && let Src::Slice(v) = self.fetch::<f32>(*src)
        {
            // A streaming store (`plan_streams`): f32, unit stride, no mask; in a packed run
            // the rows follow each other, so the run is one contiguous stretch.
            let dst = a.ptr.wrapping_offset(base * 4) as *mut f32;
            // SAFETY: the store view is injective and inside the buffer (checked before
            // the run), the run's `n` elements are contiguous there, and this item is
            // their only writer; no reference to them exists.
            unsafe { super::stream::store_f32(dst, &v[..n]) };
            return;
        }
        if let Some((_, segs)) = self.pack {
            // Packed run: one strided store if consecutive rows follow each other, else one
            // per row segment.
            let row_ax = self.prog.pack_axes().0;
            let len = n / segs.max(1);
            if view.strides[row_ax] == len as isize * stride {
                with_ct!(dtype.compute(), T => {
                    let v = self.fetch::<T>(*src);
                    store_run::<T>(a, dtype, base, stride, v, n);
                });
            } else {
                let row_stride = view.strides[row_ax];
                with_ct!(dtype.compute(), T => {
                    let v = self.fetch::<T>(*src);
                    for k in 0..segs {
                        let seg = v.segment(k, len);
                        store_run::<T>(a, dtype, base + k as isize * row_stride, stride, seg, len);
                    }
                });
            }
            return;
        }
        with_ct!(dtype.compute(), T => {
            let v = self.fetch::<T>(*src);
            store_run::<T>(a, dtype, base, stride, v, n);
        });
    }

    // ---------------------------------------------------------------- reductions

    #[inline(always)]
    fn reduce_parts(&self, r: usize) -> (ReduceOp, usize) {
        match self.prog.instrs[r].op {
            IrOp::Reduce { op, src } => (op, src),
            _ => (ReduceOp::Sum, r),
        }
    }

    /// OutInner: fill the accumulator registers with the identity.
    #[inline(always)]
    fn acc_init_vec(&mut self, r: usize) {
        let (op, src) = self.reduce_parts(r);
        let p = &self.prog.instrs[r];
        let n = self.n;
        let src_ct = self.prog.instrs[src].ct();
        if op.is_arg() {
            let (vr, ir) = (p.aux_reg, p.row_reg);
            with_ct!(src_ct, T => {
                typed_mut::<T>(&mut self.regs[vr])[..n].fill(ops::acc_init::<T>(op).value);
            });
            typed_mut::<i64>(&mut self.regs[ir])[..n].fill(-1);
        } else {
            let rr = p.row_reg;
            with_ct!(src_ct, T => {
                typed_mut::<T>(&mut self.regs[rr])[..n].fill(ops::acc_init::<T>(op).value);
            });
        }
    }

    #[inline(always)]
    fn accumulate_impl(&mut self, r: usize, index: i64) {
        let (op, src) = self.reduce_parts(r);
        let p = &self.prog.instrs[r];
        let n = self.n;
        let src_ct = self.prog.instrs[src].ct();
        let (vr, ir) = if op.is_arg() {
            (p.aux_reg, p.row_reg)
        } else {
            (p.row_reg, usize::MAX)
        };
        let mut acc = std::mem::take(&mut self.regs[vr]);
        let mut idx = if ir != usize::MAX {
            std::mem::take(&mut self.regs[ir])
        } else {
            Register::default()
        };
        // A packed run (column reductions, see `pack_rows`) holds `segs` reduce positions,
        // each a segment of the output run: accumulated one after the other, in order.
        let segs = self.pack.map_or(1, |(_, s)| s.max(1));
        let len = n / segs;
        with_ct!(src_ct, T => {
            let s = self.fetch::<T>(src);
            for k in 0..segs {
                let idx_slice: &mut [i64] = if idx.is_empty() { &mut [] } else { &mut typed_mut::<i64>(&mut idx)[..len] };
                ops::accumulate::<T>(op, s.segment(k, len), &mut typed_mut::<T>(&mut acc)[..len], idx_slice, index + k as i64);
            }
        });
        self.regs[vr] = acc;
        if ir != usize::MAX {
            self.regs[ir] = idx;
        }
    }

    /// [`ops::accumulate_rows`] for reduce `r` over the current run of [`ops::ACC_ROWS`]
    /// consecutive reduce positions whose source runs start at `rows` (borrowed loads:
    /// `Val::Ptr` values of the reduce's source, one per position, in order). Returns
    /// `false`, having done nothing, for an arg-reduction.
    #[inline(always)]
    fn accumulate_rows_impl(&mut self, r: usize, rows: &[*const u8; ops::ACC_ROWS]) -> bool {
        let (op, src) = self.reduce_parts(r);
        let vr = self.prog.instrs[r].row_reg;
        let n = self.n;
        let src_ct = self.prog.instrs[src].ct();
        let mut acc = std::mem::take(&mut self.regs[vr]);
        let done = with_ct!(src_ct, T => {
            // SAFETY: each pointer is a `Val::Ptr` the source's load produced for one of the
            // positions over this run, so, as in `fetch`, it points at `n` initialized,
            // aligned elements of T inside an input buffer (bounds checked before the run;
            // borrowed loads have unit stride and storage type T) that nothing writes
            // during this kernel.
            let s = rows.map(|p| unsafe { std::slice::from_raw_parts(p as *const T, n) });
            ops::accumulate_rows::<T>(op, s, &mut typed_mut::<T>(&mut acc)[..n])
        });
        self.regs[vr] = acc;
        done
    }

    #[inline(always)]
    fn acc_finish_vec(&mut self, r: usize) {
        let p = &self.prog.instrs[r];
        let n = self.n;
        if !matches!(p.op, IrOp::Reduce { op, .. } if op.is_arg()) {
            let rr = p.row_reg;
            round_half(p.dtype, &mut self.regs[rr], n);
        }
    }

    #[inline(always)]
    fn acc_init_scalar(&self, r: usize) -> AccAny {
        let (op, src) = self.reduce_parts(r);
        with_ct!(self.prog.instrs[src].ct(), T => AccAny::from_acc::<T>(ops::acc_init::<T>(op)))
    }

    #[inline(always)]
    fn reduce_run_impl(&self, r: usize, acc: &mut AccAny, index0: i64) {
        let (op, src) = self.reduce_parts(r);
        if self.prog.instrs[r].half_src {
            let p = &self.prog.instrs[src];
            let IrOp::Load { arg, view, .. } = &p.op else {
                return;
            };
            let ax = self.prog.dims.len() - 1;
            let (base, _) = view.base(&self.coords, ax);
            let ptr = self.args[*arg].ptr.wrapping_offset(base * 2) as *const u16;
            // SAFETY: the load's view is unmasked with unit stride along the run dimension
            // and its offsets are inside the 16-bit buffer (validated before the run), so
            // the run's `n` stored values from `base` are too; nothing writes that buffer
            // during this kernel (it is an input).
            let raw = unsafe { std::slice::from_raw_parts(ptr, self.n) };
            let part = if p.dtype == DType::F16 {
                let mut one = [0f32];
                (self.loops.segments_f16)(op, raw, raw.len(), &mut one);
                one[0]
            } else {
                ops::reduce_run_16(op, raw, |b: u16| f32::from_bits((b as u32) << 16))
            };
            let part = Acc {
                value: part,
                index: 0,
            };
            *acc = AccAny::from_acc::<f32>(ops::acc_combine::<f32>(op, acc.to_acc::<f32>(), part));
            return;
        }
        with_ct!(self.prog.instrs[src].ct(), T => {
            let s = self.fetch::<T>(src);
            let part = ops::reduce_run::<T>(op, s, self.n, index0);
            *acc = AccAny::from_acc::<T>(ops::acc_combine::<T>(op, acc.to_acc::<T>(), part));
        });
    }

    /// ReduceInner: store row `t`'s finished accumulator in the reduce's row register.
    #[inline(always)]
    fn acc_write_row(&mut self, r: usize, acc: AccAny, t: usize) {
        let (op, src) = self.reduce_parts(r);
        let p = &self.prog.instrs[r];
        let rr = p.row_reg;
        let dtype = p.dtype;
        if op.is_arg() {
            typed_mut::<i64>(&mut self.regs[rr])[t] = acc.index.max(0);
        } else {
            with_ct!(self.prog.instrs[src].ct(), T => {
                let v: T = acc.to_acc::<T>().value;
                typed_mut::<T>(&mut self.regs[rr])[t] = v;
            });
            if dtype.is_half() {
                let x = &mut typed_mut::<f32>(&mut self.regs[rr])[t];
                *x = CastTo::<f32>::cast(*x, dtype);
            }
        }
    }
}

/// A type-erased accumulator (value bits + index).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AccAny {
    bits: u64,
    index: i64,
}

impl AccAny {
    #[inline(always)]
    fn from_acc<T: Num>(a: Acc<T>) -> AccAny {
        let mut bits = 0u64;
        bytemuck::bytes_of_mut(&mut bits)[..std::mem::size_of::<T>()]
            .copy_from_slice(bytemuck::bytes_of(&a.value));
        AccAny {
            bits,
            index: a.index,
        }
    }
    #[inline(always)]
    fn to_acc<T: Num>(self) -> Acc<T> {
        let value: T = bytemuck::pod_read_unaligned(
            &bytemuck::bytes_of(&self.bits)[..std::mem::size_of::<T>()],
        );
        Acc {
            value,
            index: self.index,
        }
    }
}

#[inline(always)]
fn round_half(dtype: DType, reg: &mut [u64], n: usize) {
    if dtype.is_half() {
        ops::round_to(dtype, &mut typed_mut::<f32>(reg)[..n]);
    }
}

/// An f16 bit pattern as f32, exactly as `half::f16::to_f32` converts it (a NaN keeps its
/// payload and gets its quiet bit set). Branch-free, so loops over it vectorize; `half`'s
/// own conversion checks for F16C at run time on every call.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    // Normal and subnormal values: the bits shifted into place read as the value times
    // 2^-112, and multiplying by 2^112 is exact.
    let finite = (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits();
    let quiet = if em > 0x7c00 { 0x0040_0000 } else { 0 };
    let special = (em << 13) | 0x7f80_0000 | quiet;
    f32::from_bits(if em >= 0x7c00 { special } else { finite } | sign)
}

/// `x` rounded to the nearest f16 (ties to even), as bits: the same bits as
/// `half::f16::from_f32` for every input. Branch-free (see [`f16_to_f32`]).
#[inline(always)]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    // On the f16 grid (or ±inf, or a NaN with its quiet bit set) after this.
    let b = crate::math::f32::round_f16(x).to_bits();
    let sign = (b >> 16) & 0x8000;
    let a = b & 0x7fff_ffff;
    // Normal: rebias the exponent (127 → 15); the low 13 mantissa bits are zero.
    let normal = (a >> 13).wrapping_sub(112 << 10);
    // Subnormal: a multiple of 2^-24 below 2^-14, so the scaled value is an exact integer.
    let sub = (f32::from_bits(a) * 16_777_216.0) as i32 as u32;
    let special = 0x7c00 | ((a >> 13) & 0x3ff);
    let h = if a >= 0x7f80_0000 {
        special
    } else if a >= 0x3880_0000 {
        normal
    } else {
        sub
    };
    (h | sign) as u16
}

/// `x` rounded to the nearest bf16 (ties to even), as bits: the same bits as
/// `half::bf16::from_f32`. Branch-free.
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    (crate::math::f32::round_bf16(x).to_bits() >> 16) as u16
}

/// Reads `n` elements (`[lo, hi)` from memory, the rest `fill`) into a register.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn load_run(
    a: ArgPtr,
    dtype: DType,
    base: isize,
    stride: isize,
    lo: usize,
    hi: usize,
    fill: Scal,
    out: &mut [u64],
    n: usize,
) {
    macro_rules! go {
        ($S:ty, $T:ty, $conv:expr) => {{
            let o = &mut typed_mut::<$T>(out)[..n];
            let f = <$T as Num>::get(fill);
            o[..lo].fill(f);
            o[hi..].fill(f);
            let p = a.ptr as *const $S;
            let conv = $conv;
            if stride == 1 && hi > lo {
                // SAFETY: elements base+lo .. base+hi lie inside the buffer (bounds checked
                // before the run) and are initialized; the type matches the buffer's dtype.
                // (A run with no element inside the mask is skipped: its `base + lo` may lie
                // outside the buffer.)
                let src =
                    unsafe { std::slice::from_raw_parts(p.offset(base + lo as isize), hi - lo) };
                for (d, &s) in o[lo..hi].iter_mut().zip(src) {
                    *d = conv(s);
                }
            } else if stride == 0 && hi > lo {
                // SAFETY: as above (a single in-bounds element).
                let s = unsafe { *p.offset(base) };
                o[lo..hi].fill(conv(s));
            } else {
                for i in lo..hi {
                    // SAFETY: every valid coordinate's offset is inside the buffer.
                    let s = unsafe { *p.offset(base + i as isize * stride) };
                    o[i] = conv(s);
                }
            }
        }};
    }
    if dtype == DType::F16 && stride == 1 && hi > lo {
        let o = &mut typed_mut::<f32>(out)[..n];
        let f = <f32 as Num>::get(fill);
        o[..lo].fill(f);
        o[hi..].fill(f);
        // SAFETY: elements base+lo .. base+hi lie inside the buffer (bounds checked before
        // the run) and are initialized f16 bits.
        let src = unsafe {
            std::slice::from_raw_parts((a.ptr as *const u16).offset(base + lo as isize), hi - lo)
        };
        super::f16c::widen_f16_slice(src, &mut o[lo..hi]);
        return;
    }
    match dtype {
        DType::Bool | DType::U8 => go!(u8, u8, |s: u8| s),
        DType::I32 => go!(i32, i32, |s: i32| s),
        DType::I64 => go!(i64, i64, |s: i64| s),
        DType::F32 => go!(f32, f32, |s: f32| s),
        DType::F64 => go!(f64, f64, |s: f64| s),
        DType::F16 => go!(u16, f32, f16_to_f32),
        DType::BF16 => go!(u16, f32, |s: u16| f32::from_bits((s as u32) << 16)),
    }
}

/// Where a run reads: the run's first element at `base`, then every `stride`; elements
/// `lo..hi` are valid, the rest padding; `n` elements in all.
#[derive(Clone, Copy)]
struct Run {
    base: isize,
    stride: isize,
    lo: usize,
    hi: usize,
    n: usize,
}

/// An indexed load of a run: element `i` reads `base + i·stride + index[i]·step`, for
/// `index[i]` in `0..len` (an index outside reads `fill` and is returned, for the error).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gather_run(
    a: ArgPtr,
    dtype: DType,
    at: Run,
    index: Src<'_, i64>,
    step: isize,
    len: usize,
    fill: Scal,
    out: &mut [u64],
) -> Option<i64> {
    let mut bad = None;
    macro_rules! go {
        ($S:ty, $T:ty, $conv:expr) => {{
            let o = &mut typed_mut::<$T>(out)[..at.n];
            let f = <$T as Num>::get(fill);
            o[..at.lo].fill(f);
            o[at.hi..].fill(f);
            let p = a.ptr as *const $S;
            let conv = $conv;
            // One index for the whole run (an embedding row): check it once and copy.
            let uniform = match index {
                Src::Scalar(x) => Some(x),
                Src::Slice(s) => {
                    let r = &s[at.lo..at.hi];
                    r.first().copied().filter(|&x0| r.iter().all(|&x| x == x0))
                }
            };
            if let Some(j) = uniform
                && j >= 0
                && (j as u64) < len as u64
            {
                let row = at.base + j as isize * step;
                for i in at.lo..at.hi {
                    // SAFETY: as below, with the one index `j` checked to be in 0..len.
                    o[i] = conv(unsafe { *p.offset(row + i as isize * at.stride) });
                }
                return None;
            }
            for i in at.lo..at.hi {
                let j = match index {
                    Src::Slice(s) => s[i],
                    Src::Scalar(x) => x,
                };
                if j < 0 || j as u64 >= len as u64 {
                    bad.get_or_insert(j);
                    o[i] = f;
                    continue;
                }
                // SAFETY: the validator checked that every valid coordinate's offset plus
                // any index in 0..len times `step` lies inside the buffer, and `j` was just
                // checked to be in 0..len.
                let s = unsafe { *p.offset(at.base + i as isize * at.stride + j as isize * step) };
                o[i] = conv(s);
            }
        }};
    }
    match dtype {
        DType::Bool | DType::U8 => go!(u8, u8, |s: u8| s),
        DType::I32 => go!(i32, i32, |s: i32| s),
        DType::I64 => go!(i64, i64, |s: i64| s),
        DType::F32 => go!(f32, f32, |s: f32| s),
        DType::F64 => go!(f64, f64, |s: f64| s),
        DType::F16 => go!(u16, f32, f16_to_f32),
        DType::BF16 => go!(u16, f32, |s: u16| f32::from_bits((s as u32) << 16)),
    }
    bad
}

/// Writes a run to a buffer, converting to the storage type.
#[inline(always)]
fn store_run<T: Num>(a: ArgPtr, dtype: DType, base: isize, stride: isize, v: Src<'_, T>, n: usize) {
    macro_rules! go {
        ($S:ty, $conv:expr) => {{
            let p = a.ptr as *mut $S;
            let conv = $conv;
            let get = |i: usize| -> T {
                match v {
                    Src::Slice(s) => s[i],
                    Src::Scalar(x) => x,
                }
            };
            if stride == 1 {
                // SAFETY: the store view is injective and inside the buffer, and this item
                // is the only writer of these elements; no shared reference to them exists.
                let dst = unsafe { std::slice::from_raw_parts_mut(p.offset(base), n) };
                match v {
                    Src::Slice(s) => {
                        for (d, &x) in dst.iter_mut().zip(&s[..n]) {
                            *d = conv(x);
                        }
                    }
                    Src::Scalar(x) => dst.fill(conv(x)),
                }
            } else {
                for i in 0..n {
                    // SAFETY: as above, element by element.
                    unsafe { *p.offset(base + i as isize * stride) = conv(get(i)) };
                }
            }
        }};
    }
    let as_f32 = |x: T| -> f32 { bytemuck::cast::<T, f32>(x) };
    if let (DType::F16, 1, Src::Slice(s)) = (dtype, stride, v)
        && let Ok(s) = bytemuck::try_cast_slice::<T, f32>(&s[..n])
    {
        // SAFETY: as for `go!` below: the run's `n` elements are inside the buffer and this
        // item is their only writer.
        let dst = unsafe { std::slice::from_raw_parts_mut((a.ptr as *mut u16).offset(base), n) };
        super::f16c::narrow_f16_slice(s, dst);
        return;
    }
    match dtype {
        DType::Bool | DType::U8 => go!(u8, |x: T| bytemuck::cast::<T, u8>(x)),
        DType::I32 => go!(i32, |x: T| bytemuck::cast::<T, i32>(x)),
        DType::I64 => go!(i64, |x: T| bytemuck::cast::<T, i64>(x)),
        DType::F32 => go!(f32, as_f32),
        DType::F64 => go!(f64, |x: T| bytemuck::cast::<T, f64>(x)),
        DType::F16 => go!(u16, |x: T| f32_to_f16(as_f32(x))),
        DType::BF16 => go!(u16, |x: T| f32_to_bf16(as_f32(x))),
    }
}

/// Evaluates a generator over a run: element `i` has generator index `base + i·stride`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gen_run(
    g: GenKind,
    args: [Scalar; 2],
    dtype: DType,
    base: isize,
    stride: isize,
    lo: usize,
    hi: usize,
    fill: Scal,
    out: &mut [u64],
    n: usize,
) {
    let idx = |i: usize| (base + i as isize * stride) as u64;
    with_ct!(dtype.compute(), T => {
        let o = &mut typed_mut::<T>(out)[..n];
        let f = T::get(fill);
        o[..lo].fill(f);
        o[hi..].fill(f);
        gen_values::<T>(g, args, dtype, &mut o[lo..hi], |i| idx(i + lo));
    });
    if dtype.is_half() {
        ops::round_to(dtype, &mut typed_mut::<f32>(out)[lo..hi]);
    }
}

#[inline(always)]
fn gen_values<T: Num>(
    g: GenKind,
    [p0, p1]: [Scalar; 2],
    dtype: DType,
    o: &mut [T],
    idx: impl Fn(usize) -> u64,
) {
    match g {
        GenKind::Full => o.fill(T::get(Scal::from_scalar(p0, dtype))),
        GenKind::Arange => {
            let (start, step) = (p0, p1);
            if dtype.is_float() {
                // Computed in f64, rounded once (to f32 for f32 and the half types, which
                // round again to their own precision after this).
                let (s, st) = (start.to_f64(), step.to_f64());
                let wide = dtype == DType::F64;
                for (i, x) in o.iter_mut().enumerate() {
                    let val = s + idx(i) as f64 * st;
                    *x = T::from_f64(if wide { val } else { val as f32 as f64 });
                }
            } else {
                let (s, st) = (start.to_i64(), step.to_i64());
                let bool_ = dtype == DType::Bool;
                for (i, x) in o.iter_mut().enumerate() {
                    let val = s.wrapping_add((idx(i) as i64).wrapping_mul(st));
                    *x = T::from_i64(if bool_ { (val != 0) as i64 } else { val });
                }
            }
        }
        GenKind::Rand => {
            let seed = seed_of(p0);
            if dtype == DType::F64 {
                for (i, x) in o.iter_mut().enumerate() {
                    *x = T::from_f64(random::uniform_f64(seed, idx(i)));
                }
            } else {
                for (i, x) in o.iter_mut().enumerate() {
                    *x = T::from_f64(random::uniform_f32(seed, idx(i)) as f64);
                }
            }
        }
        GenKind::Randn => {
            let seed = seed_of(p0);
            if dtype == DType::F64 {
                for (i, x) in o.iter_mut().enumerate() {
                    *x = T::from_f64(random::normal_f64(seed, idx(i)));
                }
            } else {
                for (i, x) in o.iter_mut().enumerate() {
                    *x = T::from_f64(random::normal_f32(seed, idx(i)) as f64);
                }
            }
        }
    }
}

// -------------------------------------------------------------------- split reductions

/// Few rows, long reductions: each task reduces a slice of the reduce space of one row;
/// the partial results are combined in order, then the row work runs once.
fn run_split(prog: &CpuKernel, env: &Env<'_>, threads: usize) {
    let rows = prog.rows();
    let red = prog.reduce_len();
    let ax = prog.dims.len() - 1;
    let run_total = prog.dims[ax];
    let outer_red = red / run_total.max(1);
    // Split along whole runs when there are several, else inside the one run.
    let parts = (threads * 4).min(outer_red.max(red / CHUNK).max(1)).max(1);
    let ph = &prog.phases[0];
    let n_red = ph.reduces.len();
    let partials: Vec<Vec<AccAny>> = (0..rows * parts)
        .into_par_iter()
        .map(|task| {
            let (row, part) = (task / parts, task % parts);
            let lo = red * part / parts;
            let hi = red * (part + 1) / parts;
            split_task(prog, env, row, lo, hi)
        })
        .collect();
    // Combine and finish on this thread.
    let items = Items::new(prog, CHUNK, None);
    let last = prog.dims[prog.n_out - 1];
    REGS.with(|cell| {
        let mut m = new_machine(prog, env, cell.take());
        for item in 0..items.count() {
            let Some(n) = items.locate(item, &mut m.coords) else {
                continue;
            };
            let row_ax = prog.n_out - 1;
            let j0 = m.coords[row_ax];
            let outer = item / items.chunks;
            m.n = n;
            m.row_t = None;
            for &v in &prog.row_first {
                (m.loops.eval)(&mut m, v, row_ax, usize::MAX);
            }
            for t in 0..n {
                let row = outer * last + j0 + t;
                for (i, &r) in ph.reduces.iter().enumerate() {
                    let (op, src) = m.reduce_parts(r);
                    let mut acc = m.acc_init_scalar(r);
                    for part in 0..parts {
                        let b = partials[row * parts + part][i];
                        with_ct!(prog.instrs[src].ct(), T => {
                            acc = AccAny::from_acc::<T>(ops::acc_combine::<T>(op, acc.to_acc::<T>(), b.to_acc::<T>()));
                        });
                    }
                    m.acc_write_row(r, acc, t);
                }
            }
            let _ = n_red;
            m.coords[row_ax] = j0;
            m.n = n;
            for &v in &ph.row_after {
                (m.loops.eval)(&mut m, v, row_ax, usize::MAX);
            }
            for &v in &prog.phases[1].row_after {
                (m.loops.eval)(&mut m, v, row_ax, usize::MAX);
            }
            for &s in &prog.row_stores {
                (m.loops.store)(&mut m, s, row_ax);
            }
        }
        cell.replace(m.regs);
    });
}

fn split_task(prog: &CpuKernel, env: &Env<'_>, row: usize, lo: usize, hi: usize) -> Vec<AccAny> {
    REGS.with(|cell| {
        let mut m = new_machine(prog, env, cell.take());
        let out = split_body(&mut m, row, lo, hi);
        cell.replace(m.regs);
        out
    })
}

fn split_body(m: &mut Machine<'_>, row: usize, lo: usize, hi: usize) -> Vec<AccAny> {
    let prog = m.prog;
    let ph = &prog.phases[0];
    let ax = prog.dims.len() - 1;
    let run_total = prog.dims[ax];
    let last = prog.dims[prog.n_out - 1];
    m.set_outer(row / last);
    m.coords[prog.n_out - 1] = row % last;
    // The row values this pass reads, for this one row.
    m.row_t = None;
    m.n = 1;
    for &v in &prog.row_first {
        (m.loops.eval)(m, v, prog.n_out - 1, usize::MAX);
    }
    m.row_t = Some(0);
    let mut accs: Vec<AccAny> = ph.reduces.iter().map(|&r| m.acc_init_scalar(r)).collect();
    let mut a = lo;
    while a < hi {
        let o = a / run_total;
        let c0 = a % run_total;
        let n = CHUNK.min(run_total - c0).min(hi - a);
        m.set_reduce_coords(o * run_total);
        m.coords[ax] = c0;
        m.n = n;
        for &v in &ph.elem {
            (m.loops.eval)(m, v, ax, ph.regs[v]);
        }
        for (i, &r) in ph.reduces.iter().enumerate() {
            (m.loops.reduce_run)(m, r, &mut accs[i], a as i64);
        }
        a += n;
    }
    accs
}

// ------------------------------------------------------------ split column reductions

/// Output positions whose accumulators one column-split task keeps (32 KiB of f32).
const COLUMN_GROUP: usize = 8192;
/// Reduce positions per block of a column split, at least.
const COLUMN_BLOCK: usize = 128;
/// Most blocks a column reduction is split into.
const COLUMN_MAX_BLOCKS: usize = 16;

/// Column reductions (runs along the output, one reduction pass, no elementwise output):
/// how many blocks of the reduce space to split into, or `None` to run items as usual.
/// The count depends only on the shapes, so results do not depend on the thread count.
fn column_blocks(prog: &CpuKernel) -> Option<usize> {
    if prog.strategy != Strategy::OutInner
        || prog.phases.len() != 2
        || prog.phases[0].reduces.is_empty()
        || !prog.phases[0].stores.is_empty()
        || !prog.phases[1].elem.is_empty()
        || !prog.phases[1].reduces.is_empty()
        || !prog.phases[1].stores.is_empty()
    {
        return None;
    }
    let red = prog.reduce_len();
    if prog.rows() * red < 1 << 16 {
        return None;
    }
    let blocks = (red / COLUMN_BLOCK).min(COLUMN_MAX_BLOCKS);
    (blocks >= 2).then_some(blocks)
}

/// Registers private to one item of a column split: every `Row` value's (reduce
/// accumulators and values computed before the pass, all vectors over the item's run).
fn column_private_regs(prog: &CpuKernel) -> Vec<usize> {
    let mut regs = vec![];
    for p in &prog.instrs {
        if p.level == Level::Row && p.row_reg != usize::MAX {
            regs.push(p.row_reg);
            if p.aux_reg != usize::MAX {
                regs.push(p.aux_reg);
            }
        }
    }
    regs
}

/// Column reductions: each task reduces one block of the reduce space for a group of items
/// (up to [`COLUMN_GROUP`] output positions), walking the block position by position and,
/// at each, every item of the group, so the reads go through memory in order (a whole row
/// of a column sum) instead of one run per row of every item. The blocks' partial
/// accumulators are combined in block order, then each item's row work and stores run.
fn run_column_split(prog: &CpuKernel, env: &Env<'_>, blocks: usize) {
    let items = Items::new(prog, CHUNK, None);
    let n_items = items.count();
    let per_group = (COLUMN_GROUP / items.item_len.max(1)).max(1);
    let groups = n_items.div_ceil(per_group);
    let red = prog.reduce_len();
    let private = column_private_regs(prog);
    let task = |t: usize| -> Vec<Vec<Register>> {
        let (g, b) = (t / blocks, t % blocks);
        let lo = g * per_group;
        let hi = (lo + per_group).min(n_items);
        let (a_lo, a_hi) = (red * b / blocks, red * (b + 1) / blocks);
        REGS.with(|cell| {
            let mut m = new_machine(prog, env, cell.take());
            let out = m.column_block(&items, lo, hi, a_lo, a_hi, &private);
            cell.replace(m.regs);
            out
        })
    };
    let n_tasks = groups * blocks;
    let partials: Vec<Vec<Vec<Register>>> = if n_tasks > 1 {
        (0..n_tasks).into_par_iter().map(task).collect()
    } else {
        (0..n_tasks).map(task).collect()
    };
    REGS.with(|cell| {
        let mut m = new_machine(prog, env, cell.take());
        let mut partials = partials;
        for g in 0..groups {
            let lo = g * per_group;
            let hi = (lo + per_group).min(n_items);
            for (k, item) in (lo..hi).enumerate() {
                let Some(n) = items.locate(item, &mut m.coords) else {
                    continue;
                };
                m.n = n;
                let mut acc = std::mem::take(&mut partials[g * blocks][k]);
                for b in 1..blocks {
                    let part = std::mem::take(&mut partials[g * blocks + b][k]);
                    m.combine_partial(&private, &mut acc, &part);
                }
                for (slot, &r) in private.iter().enumerate() {
                    std::mem::swap(&mut m.regs[r], &mut acc[slot]);
                }
                m.finish_column_item();
            }
        }
        cell.replace(m.regs);
    });
}

impl Machine<'_> {
    /// One column-split task: reduce positions `a_lo..a_hi` for items `lo..hi`; returns each
    /// item's private registers (its partial accumulators).
    fn column_block(
        &mut self,
        items: &Items,
        lo: usize,
        hi: usize,
        a_lo: usize,
        a_hi: usize,
        private: &[usize],
    ) -> Vec<Vec<Register>> {
        let prog = self.prog;
        let ax = prog.n_out - 1;
        let ph = &prog.phases[0];
        let mut at: Vec<(Vec<usize>, usize)> = Vec::with_capacity(hi - lo);
        let mut store: Vec<Vec<Register>> = Vec::with_capacity(hi - lo);
        self.row_t = None;
        for item in lo..hi {
            let n = items.locate(item, &mut self.coords).unwrap_or(0);
            self.n = n;
            for &v in &prog.row_first {
                (self.loops.eval)(self, v, ax, usize::MAX);
            }
            for &r in &ph.reduces {
                self.acc_init_vec(r);
            }
            at.push((self.coords[..prog.n_out].to_vec(), n));
            store.push(
                private
                    .iter()
                    .map(|&r| std::mem::replace(&mut self.regs[r], Register::zeroed(CHUNK)))
                    .collect(),
            );
        }
        let swap = |m: &mut Self, regs: &mut Vec<Register>| {
            for (slot, &r) in private.iter().enumerate() {
                std::mem::swap(&mut m.regs[r], &mut regs[slot]);
            }
        };
        let single = store.len() == 1;
        if single {
            swap(self, &mut store[0]);
        }
        if single && prog.pack > 1 && at[0].1 == prog.dims[ax] {
            // Packed (see `pack_rows`): up to `pack` reduce positions of one span of the
            // last reduce dimension per run, accumulated segment by segment in order.
            let last = prog.dims.len() - 1;
            let (coords, n) = (&at[0].0, at[0].1);
            let mut a = a_lo;
            while a < a_hi {
                self.coords[..prog.n_out].copy_from_slice(coords);
                self.set_reduce_coords(a);
                let segs = prog
                    .pack
                    .min(a_hi - a)
                    .min(prog.dims[last] - self.coords[last]);
                self.n = n * segs;
                self.pack = Some((0, segs));
                for &v in &ph.elem {
                    (self.loops.eval)(self, v, ax, ph.regs[v]);
                }
                for &r in &ph.reduces {
                    (self.loops.accumulate)(self, r, a as i64);
                }
                self.pack = None;
                a += segs;
            }
            self.n = n;
            swap(self, &mut store[0]);
            return store;
        }
        // With several items, reductions of plain loads take `ACC_ROWS` positions at a
        // time: each accumulator is loaded and stored once per group instead of once per
        // position, in the same order, so the same bits. On Zen 4 (eighteenth session,
        // alternating builds) a column sum of 4096² f32 went from 3.2 to 2.5 ms and of
        // 1024×16384 from 3.5–4.4 to 2.7–3.2 ms; a single item (16384×1024, its reads one
        // stream) was no faster and at 2 or 4 positions per group slower, so it is left as
        // it was.
        let by_rows = !single
            && !ph.reduces.is_empty()
            && ph
                .elem
                .iter()
                .all(|&v| matches!(&prog.instrs[v].op, IrOp::Load { view, .. } if view.borrow))
            && ph.reduces.iter().all(|&r| {
                let (op, src) = self.reduce_parts(r);
                !op.is_arg() && ph.elem.contains(&src)
            });
        let mut rows = vec![[std::ptr::null::<u8>(); ops::ACC_ROWS]; ph.reduces.len()];
        let mut a = a_lo;
        while a < a_hi {
            let group = if by_rows && a + ops::ACC_ROWS <= a_hi {
                ops::ACC_ROWS
            } else {
                1
            };
            for (k, (coords, n)) in at.iter().enumerate() {
                if *n == 0 {
                    continue;
                }
                if !single {
                    swap(self, &mut store[k]);
                }
                self.coords[..prog.n_out].copy_from_slice(coords);
                self.n = *n;
                if group == 1 || !self.accumulate_group(a, ax, &mut rows) {
                    for a in a..a + group {
                        self.set_reduce_coords(a);
                        for &v in &ph.elem {
                            (self.loops.eval)(self, v, ax, ph.regs[v]);
                        }
                        for &r in &ph.reduces {
                            (self.loops.accumulate)(self, r, a as i64);
                        }
                    }
                }
                if !single {
                    swap(self, &mut store[k]);
                }
            }
            a += group;
        }
        if single {
            swap(self, &mut store[0]);
        }
        store
    }

    /// For a column block whose pass only loads and has no arg-reduction (`by_rows` in
    /// `column_block`): loads the [`ops::ACC_ROWS`] reduce positions from `a` over the
    /// current run and accumulates them together. Returns `false`, having accumulated
    /// nothing, where a load is not a borrowed run at one of the positions (masked there),
    /// so the caller takes the positions one at a time. `rows` is scratch, one entry per
    /// reduce.
    fn accumulate_group(
        &mut self,
        a: usize,
        ax: usize,
        rows: &mut [[*const u8; ops::ACC_ROWS]],
    ) -> bool {
        let ph = &self.prog.phases[0];
        for (i, pos) in (a..a + ops::ACC_ROWS).enumerate() {
            self.set_reduce_coords(pos);
            for &v in &ph.elem {
                (self.loops.eval)(self, v, ax, ph.regs[v]);
            }
            for (row, &r) in rows.iter_mut().zip(&ph.reduces) {
                let (_, src) = self.reduce_parts(r);
                match self.vals[src] {
                    Val::Ptr(p) => row[i] = p,
                    _ => return false,
                }
            }
        }
        for (slot, &r) in ph.reduces.iter().enumerate() {
            // Only arg-reductions refuse, and `by_rows` admits none.
            let grouped = (self.loops.accumulate_rows)(self, r, &rows[slot]);
            debug_assert!(grouped);
        }
        true
    }

    /// Folds a later block's partial accumulators (`part`) into `acc` (both laid out as
    /// [`column_private_regs`]) over the current run of `self.n` positions.
    fn combine_partial(&self, private: &[usize], acc: &mut [Register], part: &[Register]) {
        let n = self.n;
        let slot_of = |reg: usize| private.iter().position(|&r| r == reg);
        for &r in &self.prog.phases[0].reduces {
            let (op, src) = self.reduce_parts(r);
            let p = &self.prog.instrs[r];
            let src_ct = self.prog.instrs[src].ct();
            let (Some(vs), is) = (
                slot_of(if op.is_arg() { p.aux_reg } else { p.row_reg }),
                if op.is_arg() {
                    slot_of(p.row_reg)
                } else {
                    None
                },
            ) else {
                continue;
            };
            // Arg-reductions: the indices travel with the values (taken out while the
            // values are borrowed).
            let mut idx = is.map(|i| std::mem::take(&mut acc[i]));
            let part_idx = is.map(|i| typed::<i64>(&part[i]));
            with_ct!(src_ct, T => {
                let x = &mut typed_mut::<T>(&mut acc[vs])[..n];
                let y = &typed::<T>(&part[vs])[..n];
                for j in 0..n {
                    let (ia, ib) = match (&idx, part_idx) {
                        (Some(a), Some(b)) => (typed::<i64>(a)[j], b[j]),
                        _ => (0, 0),
                    };
                    let c = ops::acc_combine::<T>(
                        op,
                        Acc { value: x[j], index: ia },
                        Acc { value: y[j], index: ib },
                    );
                    x[j] = c.value;
                    if let Some(a) = &mut idx {
                        typed_mut::<i64>(a)[j] = c.index;
                    }
                }
            });
            if let (Some(i), Some(v)) = (is, idx) {
                acc[i] = v;
            }
        }
    }

    /// Finishes one item of a column split whose combined accumulators are in their
    /// registers (coordinates and run length set): rounding, the row work, the stores.
    fn finish_column_item(&mut self) {
        let prog = self.prog;
        let ax = prog.n_out - 1;
        let n = self.n;
        self.row_t = None;
        for &r in &prog.phases[0].reduces {
            self.acc_finish_vec(r);
        }
        for ph in &prog.phases {
            self.n = n;
            for &v in &ph.row_after {
                (self.loops.eval)(self, v, ax, usize::MAX);
            }
        }
        self.store_rows(ax, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn f16_to_f32_matches_half_for_every_pattern() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32().to_bits();
            assert_eq!(f16_to_f32(h).to_bits(), want, "f16 bits {h:#06x}");
        }
    }

    #[test]
    fn f32_to_half_matches_half() {
        // Every f16 value and its neighbours in f32 (ties and near-ties), then a dense
        // stride over all f32 patterns.
        let mut xs: Vec<u32> = vec![];
        for h in 0..=u16::MAX {
            let b = f16::from_bits(h).to_f32().to_bits();
            xs.extend([
                b,
                b.wrapping_add(1),
                b.wrapping_sub(1),
                b.wrapping_add(0x1000),
            ]);
            xs.extend([b.wrapping_add(0xfff), b.wrapping_sub(0x1000)]);
        }
        xs.extend((0..=u32::MAX).step_by(997));
        for b in xs {
            let x = f32::from_bits(b);
            assert_eq!(
                f32_to_f16(x),
                f16::from_f32(x).to_bits(),
                "f32 bits {b:#010x}"
            );
            assert_eq!(
                f32_to_bf16(x),
                bf16::from_f32(x).to_bits(),
                "f32 bits {b:#010x}"
            );
        }
    }
}
