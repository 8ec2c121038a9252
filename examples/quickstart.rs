//! kiln quickstart: build an 8-op elementwise chain ending in a row reduction over a
//! 16M-element f32 tensor, realize it fused and unfused, print the graph dumps, and compare
//! kernel counts, peak memory, time and results.
//!
//! Run with `cargo run --release --example quickstart`.

use kiln::{DType, Device, RealizeOptions, Tensor, memory};
use std::time::Instant;

const ROWS: usize = 4096;
const COLS: usize = 4096;
const RUNS: usize = 10;

/// Eight elementwise ops (mul, add, tanh, mul, sub, exp, mul, maximum), then a row sum.
fn expression(x: &Tensor) -> Tensor {
    let y = ((x * 1.5 + 0.5).tanh() * x - 0.25).exp();
    (y * 0.5).maximum(x).sum(1)
}

struct Run {
    kernels: usize,
    peak_bytes: usize,
    best_ms: f64,
    values: Vec<f32>,
}

fn run(x: &Tensor, options: &RealizeOptions) -> kiln::Result<Run> {
    let mut best_ms = f64::INFINITY;
    let mut kernels = 0;
    let mut peak_bytes = 0;
    let mut values = vec![];
    for _ in 0..RUNS {
        let y = expression(x);
        memory::reset_peak(Device::Cpu);
        let t = Instant::now();
        let report = y.realize_with(options)?;
        best_ms = best_ms.min(t.elapsed().as_secs_f64() * 1e3);
        kernels = report.kernels;
        peak_bytes = peak_bytes.max(memory::stats(Device::Cpu).peak_bytes);
        values = y.to_vec::<f32>()?;
    }
    Ok(Run {
        kernels,
        peak_bytes,
        best_ms,
        values,
    })
}

fn main() -> kiln::Result<()> {
    let x = Tensor::try_rand([ROWS, COLS], 42, DType::F32)?;
    x.realize()?;
    let y = expression(&x);
    println!("== lazy graph (before planning) ==\n{}", y.dump_text());
    println!(
        "== fused plan ==\n{}",
        y.plan(&RealizeOptions::default())?.dump_text()
    );
    println!(
        "== unfused plan ==\n{}",
        y.plan(&RealizeOptions::unfused())?.dump_text()
    );
    drop(y);

    println!(
        "CPU backend: {} threads, SIMD {}; best of {RUNS} runs each, fused and unfused alternating",
        rayon::current_num_threads(),
        kiln::backend::cpu::simd_level()
    );
    // Warm both paths once (first-touch page faults, allocator cache), then measure.
    run(&x, &RealizeOptions::unfused())?;
    let fused = run(&x, &RealizeOptions::default())?;
    let unfused = run(&x, &RealizeOptions::unfused())?;
    let max_abs_diff = fused
        .values
        .iter()
        .zip(&unfused.values)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);

    println!(
        "kernels: fused={} unfused={}",
        fused.kernels, unfused.kernels
    );
    println!(
        "peak_bytes: fused={} unfused={}",
        fused.peak_bytes, unfused.peak_bytes
    );
    println!(
        "time_ms: fused={:.2} unfused={:.2}",
        fused.best_ms, unfused.best_ms
    );
    println!("max_abs_diff: {max_abs_diff}");
    println!(
        "speedup: fused is {:.1}x faster than unfused, with {} kernels instead of {}",
        unfused.best_ms / fused.best_ms,
        fused.kernels,
        unfused.kernels
    );
    println!(
        "note: peak_bytes is the allocator's high-water mark during the realize, so it counts \
         the {:.0} MiB input too; a plan's \"planned peak\" (in the dumps above) counts only the \
         buffers the plan itself allocates.",
        x.numel() as f64 * 4.0 / (1024.0 * 1024.0)
    );
    Ok(())
}
