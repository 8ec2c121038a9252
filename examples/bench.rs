//! kiln's benchmark suite: every workload of the performance issue, fused and unfused, side
//! by side with the memory limits of this machine measured in the same run.
//!
//! ```sh
//! cargo run --release --example bench              # a table
//! cargo run --release --example bench -- --json    # one JSON object per line
//! cargo run --release --example bench -- --runs 15 softmax   # more runs, one filter
//! cargo run --release --example bench -- --profile 5 --dtype f32 chain  # 5 s of fused realizes
//! ```
//!
//! The limits are STREAM-style loops written here in plain Rust and run on rayon's pool
//! (every thread the process has): a copy (`d = s`), a triad (`a = b + 1.5 c`) and a read
//! (a sum), each over 64 MiB arrays. Each workload is timed as a realize of a freshly
//! recorded graph (recording untimed except in the replay workload; the plan comes from
//! the plan cache after the first run), fused and unfused alternating, with the workload's
//! own limit loop run right before each fused run, so a workload and its limit see the same
//! load on a shared machine. Times are the best of `--runs` runs after warm-up (a disturbed
//! run is only ever slower; `--json` also gives the medians). Bytes moved count what the
//! workload must read and write at least (each input once, the output once); GB/s are those
//! bytes over the fused time. Every bar of the issue is checked against the limits measured
//! in this process. The replay workload also reports a plan-cache miss (the cache cleared
//! before each realize: planning, compiling and running).

use kiln::{DType, RealizeOptions, Tensor};
use rayon::prelude::*;
use serde_json::json;
use std::time::Instant;

/// Elements of the streaming workloads (16M).
const N: usize = 1 << 24;
/// Side of the square workloads (4096 × 4096 = 16M).
const S: usize = 4096;

struct Cli {
    json: bool,
    /// Only workloads of this dtype (`f32`, `f16`, `bf16`).
    dtype: Option<String>,
    /// Seconds to spend realizing each selected workload (fused only), for profilers.
    profile: Option<f64>,
    runs: usize,
    filters: Vec<String>,
}

fn parse_cli() -> Cli {
    let mut cli = Cli {
        json: false,
        profile: None,
        dtype: None,
        runs: 11,
        filters: vec![],
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => cli.json = true,
            "--runs" => {
                if let Some(n) = args.next().and_then(|s| s.parse().ok()) {
                    cli.runs = std::cmp::max(n, 1);
                }
            }
            "--dtype" => cli.dtype = args.next(),
            "--profile" => cli.profile = args.next().and_then(|s| s.parse().ok()),
            "--bench" => {} // passed by `cargo bench`-style runners; nothing to do
            f => cli.filters.push(f.to_string()),
        }
    }
    cli
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        0.5 * (v[m - 1] + v[m])
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

// ------------------------------------------------------------------------------ limits

/// Memory bandwidth measured by plain loops, in GB/s (10^9 bytes per second).
#[derive(Clone, Copy)]
struct Limits {
    copy: f64,
    triad: f64,
    read: f64,
}

/// Elements per rayon task of the limit loops (256 KiB of f32).
const LIMIT_BLOCK: usize = 1 << 16;

fn limit_copy(dst: &mut [f32], src: &[f32]) {
    dst.par_chunks_mut(LIMIT_BLOCK)
        .zip(src.par_chunks(LIMIT_BLOCK))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

fn limit_triad(a: &mut [f32], b: &[f32], c: &[f32]) {
    a.par_chunks_mut(LIMIT_BLOCK)
        .zip(b.par_chunks(LIMIT_BLOCK).zip(c.par_chunks(LIMIT_BLOCK)))
        .for_each(|(a, (b, c))| {
            for ((x, &y), &z) in a.iter_mut().zip(b).zip(c) {
                *x = y + 1.5 * z;
            }
        });
}

fn limit_read(s: &[f32]) -> f32 {
    s.par_chunks(LIMIT_BLOCK)
        .map(|c| {
            // Sixteen independent sums so the loop vectorizes.
            let mut lanes = [0f32; 16];
            let chunks = c.chunks_exact(16);
            let rest: f32 = chunks.remainder().iter().sum();
            for ch in chunks {
                for i in 0..16 {
                    lanes[i] += ch[i];
                }
            }
            lanes.iter().sum::<f32>() + rest
        })
        .sum()
}

/// The arrays the limit loops run over (64 MiB each), allocated once.
struct LimitBufs {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    sink: f32,
}

impl LimitBufs {
    fn new() -> LimitBufs {
        LimitBufs {
            a: (0..N).map(|i| (i % 7) as f32).collect(),
            b: (0..N).map(|i| (i % 5) as f32).collect(),
            c: vec![0f32; N],
            sink: 0.0,
        }
    }

    /// Runs the loop of `limit` once; returns its GB/s (NaN for `Limit::None`).
    fn run(&mut self, limit: Limit) -> f64 {
        let bytes = (N * 4) as f64;
        let t = Instant::now();
        let moved = match limit {
            Limit::Copy => {
                limit_copy(&mut self.c, &self.a);
                2.0 * bytes
            }
            Limit::Triad => {
                limit_triad(&mut self.c, &self.a, &self.b);
                3.0 * bytes
            }
            Limit::Read => {
                self.sink += limit_read(&self.c);
                bytes
            }
            Limit::None => return f64::NAN,
        };
        moved / ms_since(t) / 1e6
    }
}

/// Best GB/s of `runs` runs of each limit loop after two warm-up runs (a disturbed run is
/// only ever slower, so the best one is the machine's rate).
fn measure_limits(bufs: &mut LimitBufs, runs: usize) -> Limits {
    let mut best = [0f64; 3];
    for r in 0..runs + 2 {
        for (i, l) in [Limit::Copy, Limit::Triad, Limit::Read]
            .into_iter()
            .enumerate()
        {
            let gbs = bufs.run(l);
            if r >= 2 {
                best[i] = best[i].max(gbs);
            }
        }
    }
    std::hint::black_box(bufs.sink);
    Limits {
        copy: best[0],
        triad: best[1],
        read: best[2],
    }
}

// --------------------------------------------------------------------------- workloads

/// Which measured limit a workload is held against.
#[derive(Clone, Copy, PartialEq)]
enum Limit {
    Copy,
    Triad,
    Read,
    /// Compute-bound (matmul) or overhead-bound (replay): no memory limit.
    None,
}

impl Limit {
    fn name(self) -> &'static str {
        match self {
            Limit::Copy => "copy",
            Limit::Triad => "triad",
            Limit::Read => "read",
            Limit::None => "-",
        }
    }
    fn gbs(self, l: &Limits) -> f64 {
        match self {
            Limit::Copy => l.copy,
            Limit::Triad => l.triad,
            Limit::Read => l.read,
            Limit::None => f64::NAN,
        }
    }
}

/// The bar a workload must meet.
#[derive(Clone, Copy)]
enum Bar {
    /// Fused GB/s at least this fraction of the limit's.
    FracOfLimit(f64),
    /// Fused time at most this many times a copy of the same element count (16M f32 copy
    /// for the 4096² and 16M workloads: read 64 MiB, write 64 MiB).
    TimesCopy(f64),
    /// As `TimesCopy`, and unfused at least `.1` times slower than fused.
    TimesCopyAndSpeedup(f64, f64),
    /// Time per byte moved at most this many times that of the named f32 workload.
    PerByteOfF32(f64, &'static str),
    /// Microseconds per recorded op at most this much.
    UsPerOp(f64),
    /// Fused time at most this many times that of the named f32 workload of the same
    /// shape (an epilogue's cost over the product alone).
    TimesOf(f64, &'static str),
    /// Reported, no bar.
    None,
}

struct Workload {
    name: &'static str,
    shape: Vec<usize>,
    dtype: DType,
    bytes: usize,
    flops: f64,
    limit: Limit,
    bar: Bar,
    /// Kernels the fused plan should have (checked when set).
    one_kernel: bool,
    build: Box<dyn Fn() -> Tensor>,
    /// Ops recorded per build (per-op figures of the replay workload).
    ops: usize,
    /// Builds per timed sample (small workloads repeat to be measurable).
    reps: usize,
    /// Also measure a plan-cache miss (the replay workload).
    miss: bool,
}

fn input(shape: &[usize], seed: u64, dtype: DType) -> kiln::Result<Tensor> {
    let t = Tensor::try_randn(shape, seed, dtype)?;
    t.realize()?;
    Ok(t)
}

/// `tanh(exp(-(a·b + 1))·0.5 + a)·b - 0.25`: the issue's transcendental chain.
fn chain(a: &Tensor, b: &Tensor) -> Tensor {
    ((-(a * b + 1.0)).exp() * 0.5 + a).tanh() * b - 0.25
}

/// 100 binary ops over 16-element tensors (the plan-cache replay workload).
fn small_graph(a: &Tensor, b: &Tensor) -> Tensor {
    let mut x = a.clone();
    for i in 0..100 {
        x = if i % 2 == 0 { &x + b } else { &x * a };
    }
    x
}

/// An f32 product of `m × k` by `k × n` (`shape` is `[m, k, n]`): one kernel, its operands
/// and output as bytes moved.
fn f32_product(
    name: &'static str,
    [m, k, n]: [usize; 3],
    bar: Bar,
    build: Box<dyn Fn() -> Tensor>,
) -> Workload {
    Workload {
        name,
        shape: vec![m, k, n],
        dtype: DType::F32,
        bytes: (m * k + k * n + m * n) * 4,
        flops: 2.0 * (m * n * k) as f64,
        limit: Limit::None,
        bar,
        one_kernel: true,
        build,
        ops: 1,
        reps: 1,
        miss: false,
    }
}

/// The workloads whose names `want` accepts (inputs are made only for those).
fn workloads(want: &dyn Fn(&str) -> bool) -> kiln::Result<Vec<Workload>> {
    let f32_ = DType::F32;
    let vec_inputs = want("a*b+c") || want("chain");
    let (a, b, c) = if vec_inputs {
        (
            input(&[N], 1, f32_)?,
            input(&[N], 2, f32_)?,
            input(&[N], 3, f32_)?,
        )
    } else {
        let z = Tensor::zeros([1]);
        (z.clone(), z.clone(), z)
    };
    let square = [
        "row sum",
        "row max",
        "col sum",
        "transpose",
        "softmax",
        "layer_norm",
    ];
    let x = if square.iter().any(|n| want(n)) {
        input(&[S, S], 4, f32_)?
    } else {
        Tensor::zeros([1])
    };
    let mut w: Vec<Workload> = vec![];
    let elems = |dt: DType| N * dt.size_bytes();
    {
        let (a, b, c) = (a.clone(), b.clone(), c.clone());
        w.push(Workload {
            name: "a*b+c",
            shape: vec![N],
            dtype: f32_,
            bytes: 4 * elems(f32_),
            flops: 2.0 * N as f64,
            limit: Limit::Triad,
            bar: Bar::FracOfLimit(0.85),
            one_kernel: true,
            build: Box::new(move || &a * &b + &c),
            ops: 2,
            reps: 1,
            miss: false,
        });
    }
    for dt in [DType::F32, DType::F16, DType::BF16] {
        if !want("chain") {
            break;
        }
        let (a, b) = if dt == f32_ {
            (a.clone(), b.clone())
        } else {
            (input(&[N], 5, dt)?, input(&[N], 6, dt)?)
        };
        w.push(Workload {
            name: "chain",
            shape: vec![N],
            dtype: dt,
            bytes: 3 * elems(dt),
            flops: 9.0 * N as f64,
            limit: Limit::Copy,
            bar: if dt == f32_ {
                Bar::TimesCopyAndSpeedup(2.0, 5.0)
            } else {
                Bar::PerByteOfF32(1.2, "chain")
            },
            one_kernel: true,
            build: Box::new(move || chain(&a, &b)),
            ops: 9,
            reps: 1,
            miss: false,
        });
    }
    for (name, f) in [
        ("row sum", (|x: &Tensor| x.sum(1)) as fn(&Tensor) -> Tensor),
        ("row max", |x: &Tensor| x.max(1)),
        ("col sum", |x: &Tensor| x.sum(0)),
    ] {
        let x = x.clone();
        w.push(Workload {
            name,
            shape: vec![S, S],
            dtype: f32_,
            bytes: (S * S + S) * 4,
            flops: (S * S) as f64,
            limit: Limit::Read,
            bar: Bar::FracOfLimit(0.95),
            one_kernel: true,
            build: Box::new(move || f(&x)),
            ops: 1,
            reps: 1,
            miss: false,
        });
    }
    for dt in [DType::F16, DType::BF16] {
        if !want("row sum") {
            break;
        }
        let xh = input(&[S, S], 7, dt)?;
        w.push(Workload {
            name: "row sum",
            shape: vec![S, S],
            dtype: dt,
            bytes: (S * S + S) * dt.size_bytes(),
            flops: (S * S) as f64,
            limit: Limit::Read,
            bar: Bar::PerByteOfF32(1.2, "row sum"),
            one_kernel: true,
            build: Box::new(move || xh.sum(1)),
            ops: 1,
            reps: 1,
            miss: false,
        });
    }
    if want("cat") {
        // Three row blocks of widths 1024, 1024 and 2048 joined along the rows' axis.
        let (p, q, r) = (
            input(&[S, S / 4], 9, f32_)?,
            input(&[S, S / 4], 10, f32_)?,
            input(&[S, S / 2], 11, f32_)?,
        );
        w.push(Workload {
            name: "cat",
            shape: vec![S, S],
            dtype: f32_,
            bytes: 2 * S * S * 4,
            flops: 0.0,
            limit: Limit::Copy,
            bar: Bar::None,
            one_kernel: false,
            build: Box::new(move || Tensor::cat(&[&p, &q, &r], 1)),
            ops: 1,
            reps: 1,
            miss: false,
        });
    }
    {
        let x = x.clone();
        w.push(Workload {
            name: "transpose",
            shape: vec![S, S],
            dtype: f32_,
            bytes: 2 * S * S * 4,
            flops: 0.0,
            limit: Limit::Copy,
            bar: Bar::TimesCopy(2.0),
            one_kernel: true,
            build: Box::new(move || x.t().contiguous()),
            ops: 1,
            reps: 1,
            miss: false,
        });
    }
    {
        let x = x.clone();
        w.push(Workload {
            name: "softmax",
            shape: vec![S, S],
            dtype: f32_,
            bytes: 2 * S * S * 4,
            flops: 5.0 * (S * S) as f64,
            limit: Limit::Copy,
            bar: Bar::TimesCopy(1.6),
            one_kernel: true,
            build: Box::new(move || x.softmax(-1)),
            ops: 5,
            reps: 1,
            miss: false,
        });
    }
    {
        let x = x.clone();
        w.push(Workload {
            name: "layer_norm",
            shape: vec![S, S],
            dtype: f32_,
            bytes: 2 * S * S * 4,
            flops: 7.0 * (S * S) as f64,
            limit: Limit::Copy,
            bar: Bar::TimesCopy(1.6),
            one_kernel: true,
            build: Box::new(move || x.layer_norm(&[S], None, None, 1e-5)),
            ops: 8,
            reps: 1,
            miss: false,
        });
    }
    for n in [1024usize, 2048] {
        if !want("matmul") {
            break;
        }
        let (l, r, bias) = (
            input(&[n, n], 10, f32_)?,
            input(&[n, n], 11, f32_)?,
            input(&[n], 12, f32_)?,
        );
        let mm = |name: &'static str, bar: Bar, build: Box<dyn Fn() -> Tensor>| {
            f32_product(name, [n, n, n], bar, build)
        };
        let (l2, r2) = (l.clone(), r.clone());
        w.push(mm("matmul", Bar::None, Box::new(move || l2.matmul(&r2))));
        let (l2, r2) = (l.clone(), r.clone());
        w.push(mm(
            "matmul a@b.t()",
            Bar::None,
            Box::new(move || l2.matmul(&r2.t())),
        ));
        let (l2, r2) = (l.clone(), r.clone());
        w.push(mm(
            "matmul a.t()@b",
            Bar::None,
            Box::new(move || l2.t().matmul(&r2)),
        ));
        let mut epi = mm(
            "matmul+bias+relu",
            Bar::TimesOf(1.05, "matmul"),
            Box::new(move || (l.matmul(&r) + &bias).relu()),
        );
        epi.bytes += n * 4;
        epi.flops += 2.0 * (n * n) as f64;
        epi.ops = 3;
        w.push(epi);
    }
    if want("linear") {
        // A linear layer as char_gpt's MLP runs it: `x @ w.t()` over 2048 tokens, width 128
        // to 512; the epilogue's cost is larger against a product this shallow.
        let (m, k, n) = (2048usize, 128usize, 512usize);
        let (x, wt, bias) = (
            input(&[m, k], 17, f32_)?,
            input(&[n, k], 18, f32_)?,
            input(&[n], 19, f32_)?,
        );
        let lin = |name: &'static str, bar: Bar, build: Box<dyn Fn() -> Tensor>| {
            f32_product(name, [m, k, n], bar, build)
        };
        let (x2, w2) = (x.clone(), wt.clone());
        w.push(lin(
            "linear x@w.t()",
            Bar::None,
            Box::new(move || x2.matmul(&w2.t())),
        ));
        let mut epi = lin(
            "linear+bias+relu",
            Bar::TimesOf(1.05, "linear x@w.t()"),
            Box::new(move || (x.matmul(&wt.t()) + &bias).relu()),
        );
        epi.bytes += n * 4;
        epi.flops += 2.0 * (m * n) as f64;
        epi.ops = 3;
        w.push(epi);
    }
    for dt in [DType::F16, DType::BF16] {
        if !want("matmul") {
            break;
        }
        let n = 1024;
        let (l, r) = (input(&[n, n], 15, dt)?, input(&[n, n], 16, dt)?);
        w.push(Workload {
            name: "matmul",
            shape: vec![n, n, n],
            dtype: dt,
            bytes: 3 * n * n * dt.size_bytes(),
            flops: 2.0 * (n * n * n) as f64,
            limit: Limit::None,
            bar: Bar::None,
            one_kernel: true,
            build: Box::new(move || l.matmul(&r)),
            ops: 1,
            reps: 1,
            miss: false,
        });
    }
    {
        let (sa, sb) = (input(&[16], 13, f32_)?, input(&[16], 14, f32_)?);
        w.push(Workload {
            name: "replay 100 ops",
            shape: vec![16],
            dtype: f32_,
            bytes: 3 * 16 * 4,
            flops: 100.0 * 16.0,
            limit: Limit::None,
            bar: Bar::UsPerOp(0.5),
            one_kernel: true,
            build: Box::new(move || small_graph(&sa, &sb)),
            ops: 100,
            reps: 200,
            miss: true,
        });
    }
    w.retain(|w| want(w.name));
    Ok(w)
}

// ---------------------------------------------------------------------------- running

struct Measured {
    /// Best of the runs (what the table and the bars use).
    fused_ms: f64,
    unfused_ms: f64,
    /// Medians of the same runs.
    fused_median_ms: f64,
    unfused_median_ms: f64,
    kernels_fused: usize,
    kernels_unfused: usize,
    max_abs_diff: f64,
    /// Best GB/s of the workload's limit loop, run right before each fused sample (NaN
    /// without a limit).
    limit_gbs: f64,
    /// Replay workload: milliseconds per build when the plan cache misses (the cache is
    /// cleared before each realize, so it plans and compiles every kernel again).
    miss_ms: Option<f64>,
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// One timed sample: `reps` builds, each realized with `opts` and dropped; returns the
/// milliseconds per build (recording timed too when `reps > 1`, as the replay workload's
/// per-op figure is meant to include it) and the kernel count.
fn sample(w: &Workload, opts: &RealizeOptions) -> kiln::Result<(f64, usize)> {
    if w.reps > 1 {
        let t = Instant::now();
        let mut kernels = 0;
        for _ in 0..w.reps {
            let y = (w.build)();
            kernels = y.realize_with(opts)?.kernels;
        }
        return Ok((ms_since(t) / w.reps as f64, kernels));
    }
    let y = (w.build)();
    let t = Instant::now();
    let report = y.realize_with(opts)?;
    let ms = ms_since(t);
    drop(y); // back to the allocator cache, as a steady-state loop would
    Ok((ms, report.kernels))
}

fn max_abs_diff(w: &Workload) -> kiln::Result<f64> {
    let f = (w.build)();
    f.realize()?;
    let u = (w.build)();
    u.realize_with(&RealizeOptions::unfused())?;
    let (f, u) = (f.to_vec::<f64>()?, u.to_vec::<f64>()?);
    Ok(f.iter()
        .zip(&u)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max))
}

fn measure(w: &Workload, runs: usize, bufs: &mut LimitBufs) -> kiln::Result<Measured> {
    let fused = RealizeOptions::default();
    let unfused = RealizeOptions::unfused();
    let diff = max_abs_diff(w)?;
    for _ in 0..2 {
        sample(w, &fused)?;
        sample(w, &unfused)?;
    }
    let (mut tf, mut tu, mut lim) = (vec![], vec![], vec![]);
    let (mut kf, mut ku) = (0, 0);
    for _ in 0..runs {
        // The limit loop, fused and unfused back to back: the three see the same load.
        lim.push(bufs.run(w.limit));
        let (ms, k) = sample(w, &fused)?;
        tf.push(ms);
        kf = k;
        let (ms, k) = sample(w, &unfused)?;
        tu.push(ms);
        ku = k;
    }
    let miss_ms = if w.miss {
        let mut tm = vec![];
        for _ in 0..runs {
            let t = Instant::now();
            for _ in 0..w.reps {
                let y = (w.build)();
                kiln::clear_cache();
                y.realize_with(&fused)?;
            }
            tm.push(ms_since(t) / w.reps as f64);
        }
        Some(best(&tm))
    } else {
        None
    };
    Ok(Measured {
        fused_ms: best(&tf),
        unfused_ms: best(&tu),
        fused_median_ms: median(tf),
        unfused_median_ms: median(tu),
        kernels_fused: kf,
        kernels_unfused: ku,
        max_abs_diff: diff,
        limit_gbs: lim.iter().copied().fold(f64::NAN, f64::max),
        miss_ms,
    })
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F64 => "f64",
        _ => "other",
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// A finished row: the measurement and what the bar makes of it.
struct Row<'a> {
    w: &'a Workload,
    m: Measured,
    /// GB/s of the workload's limit (side by side).
    limit_gbs: f64,
    gbs: f64,
    gflops: f64,
    /// GB/s over the limit's GB/s.
    of_limit: f64,
    /// Fused time over a copy of the same element count.
    x_copy: f64,
    bar: String,
    value: String,
    pass: Option<bool>,
}

fn judge<'a>(w: &'a Workload, m: Measured, lim: &Limits, done: &[Row<'_>]) -> Row<'a> {
    let s = m.fused_ms / 1e3;
    let gbs = w.bytes as f64 / s / 1e9;
    let gflops = w.flops / s / 1e9;
    // The limit measured side by side with this workload (the process-wide one for a
    // workload without a limit of its own).
    let limit_gbs = if m.limit_gbs.is_finite() {
        m.limit_gbs
    } else {
        w.limit.gbs(lim)
    };
    let of_limit = gbs / limit_gbs;
    // A copy of 16M f32 (64 MiB read and 64 MiB written) at the measured copy rate.
    let copy_gbs = if w.limit == Limit::Copy {
        limit_gbs
    } else {
        lim.copy
    };
    let copy_ms = 2.0 * (N * 4) as f64 / (copy_gbs * 1e9) * 1e3;
    let x_copy = m.fused_ms / copy_ms;
    let speedup = m.unfused_ms / m.fused_ms;
    let (bar, value, pass) = match w.bar {
        Bar::FracOfLimit(f) => (
            format!(">= {:.0}% of {}", f * 100.0, w.limit.name()),
            format!("{:.0}%", of_limit * 100.0),
            Some(of_limit >= f),
        ),
        Bar::TimesCopy(k) => (
            format!("<= {k}x copy"),
            format!("{x_copy:.2}x"),
            Some(x_copy <= k),
        ),
        Bar::TimesCopyAndSpeedup(k, sp) => (
            format!("<= {k}x copy, >= {sp}x unfused"),
            format!("{x_copy:.2}x, {speedup:.1}x"),
            Some(x_copy <= k && speedup >= sp),
        ),
        Bar::PerByteOfF32(k, base) => {
            let f32_row = done
                .iter()
                .find(|r| r.w.name == base && r.w.dtype == DType::F32);
            match f32_row {
                Some(r) => {
                    let per_byte = |row_ms: f64, bytes: usize| row_ms / bytes as f64;
                    let ratio = per_byte(m.fused_ms, w.bytes) / per_byte(r.m.fused_ms, r.w.bytes);
                    (
                        format!("<= {k}x f32 per byte"),
                        format!("{ratio:.2}x"),
                        Some(ratio <= k),
                    )
                }
                None => (format!("<= {k}x f32 per byte"), "no f32 row".into(), None),
            }
        }
        Bar::UsPerOp(us) => {
            let per_op = m.fused_ms * 1e3 / w.ops as f64;
            (
                format!("<= {us} us/op"),
                format!("{per_op:.3} us/op"),
                Some(per_op <= us),
            )
        }
        Bar::TimesOf(k, base) => {
            let base_row = done
                .iter()
                .find(|r| r.w.name == base && r.w.dtype == w.dtype && r.w.shape == w.shape);
            match base_row {
                Some(r) => {
                    let ratio = m.fused_ms / r.m.fused_ms;
                    (
                        format!("<= {k}x {base}"),
                        format!("{ratio:.3}x"),
                        Some(ratio <= k),
                    )
                }
                None => (format!("<= {k}x {base}"), format!("no {base} row"), None),
            }
        }
        Bar::None if w.flops == 0.0 => ("-".into(), format!("{x_copy:.2}x copy"), None),
        Bar::None => ("-".into(), format!("{gflops:.0} GFLOP/s"), None),
    };
    let one_kernel_ok = !w.one_kernel || m.kernels_fused == 1;
    let pass = pass.map(|p| p && one_kernel_ok);
    Row {
        w,
        m,
        limit_gbs,
        gbs,
        gflops,
        of_limit,
        x_copy,
        bar,
        value,
        pass,
    }
}

fn shape_text(s: &[usize]) -> String {
    s.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

fn main() -> kiln::Result<()> {
    let cli = parse_cli();
    let want = |name: &str| {
        cli.filters.is_empty() || cli.filters.iter().any(|f| name.contains(f.as_str()))
    };
    let all: Vec<Workload> = workloads(&want)?
        .into_iter()
        .filter(|w| {
            cli.dtype
                .as_deref()
                .is_none_or(|d| d == dtype_name(w.dtype))
        })
        .collect();
    if let Some(secs) = cli.profile {
        // For `perf record`: only fused realizes of the selected workloads.
        for w in &all {
            let t = Instant::now();
            let mut n = 0usize;
            while t.elapsed().as_secs_f64() < secs {
                sample(w, &RealizeOptions::default())?;
                n += 1;
            }
            let ms = ms_since(t) / n as f64;
            println!(
                "{} {}: {n} realizes, {ms:.3} ms each",
                w.name,
                dtype_name(w.dtype)
            );
        }
        return Ok(());
    }
    let threads = rayon::current_num_threads();
    let load_start = load_average();
    let mut bufs = LimitBufs::new();
    let before = measure_limits(&mut bufs, cli.runs);
    let mut measured = vec![];
    for w in &all {
        measured.push((w, measure(w, cli.runs, &mut bufs)?));
    }
    // Limits again at the end; the process-wide figures are the better of the two (a
    // disturbed measurement only ever lowers a rate). The bars use each workload's own
    // side-by-side limit.
    let after = measure_limits(&mut bufs, cli.runs);
    let lim = Limits {
        copy: before.copy.max(after.copy),
        triad: before.triad.max(after.triad),
        read: before.read.max(after.read),
    };
    let mut rows: Vec<Row<'_>> = vec![];
    for (w, m) in measured {
        let row = judge(w, m, &lim, &rows);
        rows.push(row);
    }
    let load_end = load_average();
    let cpu = cpu_model();
    let simd = kiln::backend::cpu::simd_level();

    if cli.json {
        println!(
            "{}",
            json!({
                "kind": "meta",
                "cpu": cpu,
                "threads": threads,
                "simd": simd,
                "runs": cli.runs,
                "load_start": load_start,
                "load_end": load_end,
            })
        );
        for (name, gbs, b, a) in [
            ("copy", lim.copy, before.copy, after.copy),
            ("triad", lim.triad, before.triad, after.triad),
            ("read", lim.read, before.read, after.read),
        ] {
            println!(
                "{}",
                json!({"kind": "limit", "name": name, "gbs": gbs, "gbs_start": b, "gbs_end": a,
                       "bytes_per_elem": match name { "copy" => 8, "triad" => 12, _ => 4 },
                       "elements": N})
            );
        }
        for r in &rows {
            println!(
                "{}",
                json!({
                    "kind": "workload",
                    "name": r.w.name,
                    "shape": r.w.shape,
                    "dtype": dtype_name(r.w.dtype),
                    "fused_ms": r.m.fused_ms,
                    "unfused_ms": r.m.unfused_ms,
                    "fused_median_ms": r.m.fused_median_ms,
                    "unfused_median_ms": r.m.unfused_median_ms,
                    "limit_gbs": if r.limit_gbs.is_finite() { json!(r.limit_gbs) } else { json!(null) },
                    "miss_ms": r.m.miss_ms,
                    "miss_us_per_op": r.m.miss_ms.map(|ms| ms * 1e3 / r.w.ops as f64),
                    "kernels_fused": r.m.kernels_fused,
                    "kernels_unfused": r.m.kernels_unfused,
                    "bytes": r.w.bytes,
                    "gbs": r.gbs,
                    "gflops": r.gflops,
                    "limit": r.w.limit.name(),
                    "of_limit": if r.of_limit.is_finite() { json!(r.of_limit) } else { json!(null) },
                    "x_copy": r.x_copy,
                    "us_per_op": r.m.fused_ms * 1e3 / r.w.ops as f64,
                    "unfused_us_per_op": r.m.unfused_ms * 1e3 / r.w.ops as f64,
                    "bar": r.bar,
                    "value": r.value,
                    "pass": r.pass,
                    "max_abs_diff": r.m.max_abs_diff,
                })
            );
        }
        return Ok(());
    }

    println!("kiln bench: {cpu}, {threads} threads, SIMD {simd}; load {load_start} -> {load_end}");
    println!(
        "limits (GB/s, 64 MiB arrays, best of {} runs, start / end): copy {:.1} / {:.1}, triad {:.1} / {:.1}, read {:.1} / {:.1}",
        cli.runs, before.copy, after.copy, before.triad, after.triad, before.read, after.read
    );
    println!(
        "{:<17} {:<5} {:<14} {:>9} {:>9} {:>5} {:>7} {:>7} {:>16} {:>6}  {:<30} {:<16} ok",
        "workload",
        "dtype",
        "shape",
        "fused ms",
        "unfus ms",
        "kern",
        "GB/s",
        "GFLOP/s",
        "of limit (GB/s)",
        "xcopy",
        "bar",
        "measured"
    );
    for r in &rows {
        let lim_txt = if r.of_limit.is_finite() {
            format!(
                "{:.0}% {} {:.1}",
                r.of_limit * 100.0,
                r.w.limit.name(),
                r.limit_gbs
            )
        } else {
            "-".into()
        };
        println!(
            "{:<17} {:<5} {:<14} {:>9.3} {:>9.3} {:>5} {:>7.1} {:>7.1} {:>16} {:>6.2}  {:<30} {:<16} {}",
            r.w.name,
            dtype_name(r.w.dtype),
            shape_text(&r.w.shape),
            r.m.fused_ms,
            r.m.unfused_ms,
            format!("{}/{}", r.m.kernels_fused, r.m.kernels_unfused),
            r.gbs,
            r.gflops,
            lim_txt,
            r.x_copy,
            r.bar,
            r.value,
            match r.pass {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            }
        );
    }
    for r in &rows {
        if let Some(miss) = r.m.miss_ms {
            println!(
                "{}: plan-cache hit {:.3} us/op, miss (plan + compile + run) {:.3} us/op ({:.1} us per realize)",
                r.w.name,
                r.m.fused_ms * 1e3 / r.w.ops as f64,
                miss * 1e3 / r.w.ops as f64,
                miss * 1e3
            );
        }
    }
    println!("times: best of {} runs (medians in --json)", cli.runs);
    let worst = rows.iter().map(|r| r.m.max_abs_diff).fold(0.0f64, f64::max);
    println!("largest |fused - unfused| over all workloads: {worst:.3e}");
    Ok(())
}
