//! A short GPU benchmark for `benches/gpu-check.sh`: fused against unfused elementwise work
//! as achieved GB/s next to a device-to-device copy measured in the same run, softmax, row,
//! column and full reductions, the cost of a realize that replays a cached plan (per launch),
//! and cuBLAS GEMM TFLOP/s. Prints why and exits when no GPU is usable.

use kiln::{DType, Device, RealizeOptions, Tensor, backend::cuda};
use std::time::Instant;

/// Records a workload's graph.
type Build = Box<dyn Fn() -> Tensor>;

fn time_ms(dev: usize, iters: usize, mut f: impl FnMut() -> kiln::Result<()>) -> kiln::Result<f64> {
    f()?;
    cuda::synchronize(dev)?;
    let mut best = f64::INFINITY;
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        cuda::synchronize(dev)?;
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(best)
}

fn main() -> kiln::Result<()> {
    if let Err(why) = cuda::availability() {
        println!("gpu_bench: no usable GPU ({why}); nothing to measure");
        return Ok(());
    }
    let d = Device::Cuda(0);
    let n: usize = 1 << 28; // 256M f32 = 1 GiB
    let bytes = n * 4;
    let copy = cuda::copy_bandwidth_gbps(0, bytes, 10)?;
    println!("device-to-device copy: {copy:.0} GB/s (read + write)");

    let x = Tensor::try_randn([n], 1, DType::F32)?.to(d);
    x.realize()?;
    // Two cheap ops: bound by memory, so this is the renderer's bandwidth efficiency.
    for (label, opts) in [
        ("fused", RealizeOptions::default()),
        ("unfused", RealizeOptions::unfused()),
    ] {
        let ms = time_ms(0, 5, || (&x * 1.5 + 0.5).realize_with(&opts).map(|_| ()))?;
        let gbs = 2.0 * bytes as f64 / (ms / 1e3) / 1e9;
        println!(
            "x * 1.5 + 0.5 over {n} f32, {label}: {ms:.2} ms, {gbs:.0} GB/s effective ({:.0}% of copy)",
            100.0 * gbs / copy
        );
    }
    let chain = |x: &Tensor| {
        ((x * 1.5 + 0.5).tanh() * x - 0.25)
            .exp()
            .mul(0.5)
            .maximum(x)
    };
    for (label, opts) in [
        ("fused", RealizeOptions::default()),
        ("unfused", RealizeOptions::unfused()),
    ] {
        let ms = time_ms(0, 5, || chain(&x).realize_with(&opts).map(|_| ()))?;
        // The fused kernel reads x once and writes the result once.
        let gbs = 2.0 * bytes as f64 / (ms / 1e3) / 1e9;
        println!(
            "8-op chain over {n} f32, {label}: {ms:.2} ms, {gbs:.0} GB/s effective ({:.0}% of copy)",
            100.0 * gbs / copy
        );
    }
    let s = Tensor::try_randn([16384, 4096], 2, DType::F32)?.to(d);
    s.realize()?;
    for (label, opts) in [
        ("fused", RealizeOptions::default()),
        ("unfused", RealizeOptions::unfused()),
    ] {
        let ms = time_ms(0, 5, || s.softmax(-1).realize_with(&opts).map(|_| ()))?;
        let gbs = 2.0 * (16384.0 * 4096.0 * 4.0) / (ms / 1e3) / 1e9;
        println!(
            "softmax 16384x4096 f32, {label}: {ms:.2} ms, {gbs:.0} GB/s effective ({:.0}% of copy)",
            100.0 * gbs / copy
        );
    }
    // Reductions read their input once and write little: GB/s counts the bytes read.
    let read_gbs = |ms: f64, elems: usize| elems as f64 * 4.0 / (ms / 1e3) / 1e9;
    let reductions: Vec<(&str, Build, usize)> = vec![
        (
            "row sum 16384x4096 (one block per row)",
            Box::new({
                let s = s.clone();
                move || s.sum(1)
            }),
            16384 * 4096,
        ),
        (
            "column sum 16384x4096 (32 columns per block)",
            Box::new({
                let s = s.clone();
                move || s.sum(0)
            }),
            16384 * 4096,
        ),
        (
            "column sum 1048576x64 (split and laned)",
            Box::new({
                let s = s.clone();
                move || s.reshape([1 << 20, 64]).sum(0)
            }),
            16384 * 4096,
        ),
        (
            "full sum 256M (split over blocks)",
            Box::new({
                let x = x.clone();
                move || x.sum(..)
            }),
            n,
        ),
        (
            "full argmax 256M (split over blocks)",
            Box::new({
                let x = x.clone();
                move || x.argmax(..)
            }),
            n,
        ),
    ];
    for (label, build, elems) in &reductions {
        let ms = time_ms(0, 5, || build().realize())?;
        let gbs = read_gbs(ms, *elems);
        println!(
            "{label}: {ms:.3} ms, {gbs:.0} GB/s read ({:.0}% of copy's rate)",
            100.0 * gbs / copy
        );
    }
    // Replaying a cached plan: 100 ops over 16-element tensors, recorded and realized again
    // and again. Fused it is one kernel; unfused it is 100, so the time per realize over
    // 100 is the cost of one launch on a plan-cache hit (recording included).
    let (sa, sb) = (
        Tensor::try_randn([16], 5, DType::F32)?.to(d),
        Tensor::try_randn([16], 6, DType::F32)?.to(d),
    );
    kiln::realize_all(&[&sa, &sb])?;
    let small = || {
        let mut v = sa.clone();
        for i in 0..100 {
            v = if i % 2 == 0 { &v + &sb } else { &v * &sa };
        }
        v
    };
    for (label, opts, launches) in [
        ("fused", RealizeOptions::default(), 1.0),
        ("unfused", RealizeOptions::unfused(), 100.0),
    ] {
        small().realize_with(&opts)?;
        cuda::synchronize(0)?;
        let before = kiln::cache_stats();
        let reps = 200;
        let t = Instant::now();
        for _ in 0..reps {
            small().realize_with(&opts)?;
        }
        cuda::synchronize(0)?;
        let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        let after = kiln::cache_stats();
        println!(
            "replay of 100 ops on 16 elements, {label}: {us:.1} us per realize, {:.2} us per op, {:.2} us per launch ({} hits, {} misses in {reps} realizes)",
            us / 100.0,
            us / launches,
            after.hits - before.hits,
            after.misses - before.misses
        );
    }
    let m = 8192;
    let a = Tensor::try_randn([m, m], 3, DType::F32)?
        .cast(DType::BF16)
        .to(d);
    let b = Tensor::try_randn([m, m], 4, DType::F32)?
        .cast(DType::BF16)
        .to(d);
    kiln::realize_all(&[&a, &b])?;
    let ms = time_ms(0, 5, || a.matmul(&b).realize())?;
    println!(
        "cuBLAS GEMM bf16 {m}^3: {ms:.2} ms, {:.0} TFLOP/s",
        2.0 * (m as f64).powi(3) / (ms / 1e3) / 1e12
    );
    let ms = time_ms(0, 5, || (a.matmul(&b) + 1.0).relu().realize())?;
    println!("GEMM + bias + relu epilogue bf16 {m}^3: {ms:.2} ms");
    Ok(())
}
