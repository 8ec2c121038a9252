//! Fused against unfused execution, side by side in one run. Each iteration builds the
//! expression (untimed) and times `realize`: after the first iteration the plan comes from
//! the plan cache, so this is kernel time plus replay overhead (`benches/planning.rs`
//! measures planning itself).
//!
//! `cargo bench --bench fusion` (add `-- chain` etc. to filter).

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kiln::{DType, RealizeOptions, Tensor};
use std::hint::black_box;
use std::time::Duration;

fn input(shape: &[usize], seed: u64) -> Tensor {
    let t = Tensor::try_randn(shape, seed, DType::F32).expect("rand");
    t.realize().expect("realize input");
    t
}

fn modes() -> [(&'static str, RealizeOptions); 2] {
    [
        ("fused", RealizeOptions::default()),
        ("unfused", RealizeOptions::unfused()),
    ]
}

/// Runs `build` then times the realize, for both modes, in one criterion group.
fn compare(c: &mut Criterion, group: &str, build: impl Fn() -> Tensor) {
    compare_on(c, group, None, build)
}

/// As [`compare`]; on a GPU, waits for the device before stopping the clock.
fn compare_on(c: &mut Criterion, group: &str, gpu: Option<usize>, build: impl Fn() -> Tensor) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for (name, opts) in modes() {
        g.bench_function(name, |b| {
            b.iter_batched(
                &build,
                |t| {
                    black_box(t.realize_with(&opts).expect("realize"));
                    if let Some(d) = gpu {
                        kiln::backend::cuda::synchronize(d).expect("synchronize");
                    }
                    // Dropping returns the output to the allocator cache, as a steady-state
                    // loop would.
                    drop(t);
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

/// mul, add, tanh, mul, sub, exp, mul, maximum.
fn chain8(x: &Tensor) -> Tensor {
    let y = ((x * 1.5 + 0.5).tanh() * x - 0.25).exp();
    (y * 0.5).maximum(x)
}

fn benches(c: &mut Criterion) {
    for (label, n) in [("1M", 1usize << 20), ("16M", 1 << 24)] {
        let x = input(&[n], 1);
        compare(c, &format!("chain8_{label}"), || chain8(&x));
    }
    let x = input(&[4096, 4096], 2);
    compare(c, "prologue_rowsum_4096x4096", || {
        ((&x * 2.0 + 1.0).relu() * &x).sum(1)
    });
    let (a, w, bias) = (
        input(&[1024, 1024], 3),
        input(&[1024, 1024], 4),
        input(&[1024], 5),
    );
    compare(c, "matmul_bias_relu_1024", || (a.matmul(&w) + &bias).relu());
    let s = input(&[4096, 1024], 6);
    compare(c, "softmax_4096x1024", || s.softmax(-1));
    // An embedding's gradient: 8192 rows of 768 scattered into a 50,000-row table (the
    // table's zero fill and one scatter-add kernel).
    let table = input(&[50_000, 768], 7).requires_grad_(true);
    let ids: Vec<i64> = (0..8192u64)
        .map(|i| (i * 2_654_435_761 % 50_000) as i64)
        .collect();
    let ids = Tensor::from_vec(ids, [8192]);
    let up = input(&[8192, 768], 8);
    compare(c, "embedding_grad_8192x768_of_50000", || {
        table.zero_grad();
        (Tensor::embedding(&ids, &table) * &up)
            .sum(..)
            .backward()
            .expect("backward");
        table.grad().expect("a gradient")
    });
    cuda_benches(c);
}

/// The same comparisons on `Device::Cuda(0)`, only when a GPU is usable.
fn cuda_benches(c: &mut Criterion) {
    if let Err(why) = kiln::backend::cuda::availability() {
        eprintln!("skipping CUDA benches: {why}");
        return;
    }
    let gpu = |t: Tensor| {
        let t = t.to(kiln::Device::Cuda(0));
        t.realize().expect("upload");
        t
    };
    let x = gpu(input(&[1 << 24], 7));
    compare_on(c, "cuda_chain8_16M", Some(0), || chain8(&x));
    let s = gpu(input(&[4096, 4096], 8));
    compare_on(c, "cuda_softmax_4096x4096", Some(0), || s.softmax(-1));
    let (a, w, bias) = (
        gpu(input(&[2048, 2048], 9)),
        gpu(input(&[2048, 2048], 10)),
        gpu(input(&[2048], 11)),
    );
    compare_on(c, "cuda_matmul_bias_relu_2048", Some(0), || {
        (a.matmul(&w) + &bias).relu()
    });
}

criterion_group!(fusion, benches);
criterion_main!(fusion);
