//! A short GPU benchmark for `benches/gpu-check.sh`: fused against unfused elementwise work
//! as achieved GB/s next to a device-to-device copy measured in the same run, softmax, and
//! cuBLAS GEMM TFLOP/s. Prints why and exits when no GPU is usable.

use kiln::{DType, Device, RealizeOptions, Tensor, backend::cuda};
use std::time::Instant;

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
        println!("softmax 16384x4096 f32, {label}: {ms:.2} ms, {gbs:.0} GB/s effective");
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
