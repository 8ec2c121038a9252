//! Deep graphs need no deep stack, and planning scales linearly. Runs without the test
//! harness, so the first check happens on the process's main thread; the second repeats it
//! on a thread with a 2 MiB stack (the default of spawned threads and of `cargo test`'s).
//! A counting allocator measures planning memory; the planner's work counter
//! (`Plan::work`) measures planning work, so nothing here depends on timing.

use kiln::{RealizeOptions, Tensor, reference};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers every allocation to the system allocator unchanged; the counters are
// plain atomics updated alongside.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `x` through `n` elementwise ops (a contraction, so values stay bounded).
fn chain(x: &Tensor, n: usize) -> Tensor {
    let mut y = x.clone();
    for i in 0..n {
        y = match i % 4 {
            0 => &y * 0.999,
            1 => &y + 0.001,
            2 => y.tanh(),
            _ => y.abs(),
        };
    }
    y
}

fn input() -> Tensor {
    let x = Tensor::rand_seeded([64], 3);
    x.realize().expect("input");
    x
}

/// A 100,000-op chain records, plans, realizes (matching the reference evaluator) and is
/// dropped.
fn hundred_thousand_op_chain() {
    let x = input();
    let y = chain(&x, 100_000);
    let plan = y.plan(&RealizeOptions::default()).expect("plans");
    assert!(
        plan.kernel_count() > 1,
        "a long chain is split into bounded kernels"
    );
    let want = reference::evaluate(&y).expect("reference").to_f64();
    let got = y.to_vec::<f32>().expect("realizes");
    for (g, w) in got.iter().zip(&want) {
        assert!((*g as f64 - w).abs() <= 1e-4, "{g} vs {w}");
    }
    drop(y);
    assert!(
        kiln::graph::live_nodes() <= 2,
        "the chain is gone after drop"
    );
}

/// Plans a chain of `n` ops; returns (planning work units, peak bytes allocated while
/// planning above what was allocated before).
fn planning_cost(n: usize) -> (u64, usize) {
    let x = input();
    let y = chain(&x, n);
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let plan = y.plan(&RealizeOptions::default()).expect("plans");
    let peak = PEAK.load(Ordering::Relaxed) - base;
    (plan.work, peak)
}

fn linear_planning() {
    let (w1, m1) = planning_cost(1_000);
    let (w10, m10) = planning_cost(10_000);
    let (rw, rm) = (w10 as f64 / w1 as f64, m10 as f64 / m1 as f64);
    println!(
        "planning 1k vs 10k ops: work {w1} -> {w10} ({rw:.2}x), peak memory {m1} -> {m10} bytes ({rm:.2}x)"
    );
    assert!(rw <= 12.0, "planning work grew {rw:.2}x for 10x the ops");
    assert!(rm <= 12.0, "planning memory grew {rm:.2}x for 10x the ops");
}

fn main() {
    let checks: [(&str, fn()); 3] = [
        (
            "100k-op chain on the main thread",
            hundred_thousand_op_chain,
        ),
        ("linear planning", linear_planning),
        ("100k-op chain on a 2 MiB stack", || {
            std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(hundred_thousand_op_chain)
                .expect("spawn")
                .join()
                .expect("the chain on a 2 MiB stack")
        }),
    ];
    for (name, f) in checks {
        f();
        println!("ok: {name}");
    }
    println!("deep_graphs: {} passed, 0 failed", checks.len());
}
