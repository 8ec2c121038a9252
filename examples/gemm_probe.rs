//! Times kiln's CPU matmul and prints GFLOP/s (2·n³ / best time) for each case, one line
//! per case: the plain f32 product, transposed and strided operands, a bias+relu epilogue,
//! and f16/bf16 products (with their largest error against the f32 product of the same
//! values, rounded to the half type).
//!
//! ```sh
//! cargo run --release --example gemm_probe -- [--only TEXT] [REPS] [N...]   # defaults: 7 1024 2048
//! ```
//!
//! `--only TEXT` runs just the cases whose name contains TEXT (e.g. `--only f32`).
//!
//! Each case realizes its inputs first, then builds a fresh lazy product per repetition and
//! times only its `realize()`; the best of REPS (after one untimed warm-up) is reported.

use kiln::{DType, RealizeOptions, Tensor};
use std::time::Instant;

/// Best wall time (seconds) of `reps` realizes of `build()`, and the kernels one realize ran.
fn best_of(reps: usize, build: &dyn Fn() -> Tensor) -> kiln::Result<(f64, usize)> {
    let warm = build();
    let kernels = warm.realize_with(&RealizeOptions::default())?.kernels;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let y = build();
        let t = Instant::now();
        y.realize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok((best, kernels))
}

fn line(n: usize, case: &str, secs: f64, kernels: usize, extra: &str) {
    let gflops = 2.0 * (n as f64).powi(3) / secs / 1e9;
    println!(
        "n={n:<5} {case:<22} {:>9.3} ms {gflops:>8.1} GFLOP/s  kernels={kernels}{extra}",
        secs * 1e3
    );
}

/// Largest |half - round(f32 product)| over the largest |f32 product|.
fn half_error(a: &Tensor, b: &Tensor, dtype: DType) -> kiln::Result<f64> {
    let got = a.matmul(b).try_cast(DType::F32)?.to_vec::<f32>()?;
    let exact = a
        .try_cast(DType::F32)?
        .matmul(&b.try_cast(DType::F32)?)
        .try_cast(dtype)?
        .try_cast(DType::F32)?
        .to_vec::<f32>()?;
    let scale = exact.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    let worst = got
        .iter()
        .zip(&exact)
        .fold(0f32, |m, (g, e)| m.max((g - e).abs())) as f64;
    Ok(worst / scale)
}

fn main() -> kiln::Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    let only = if args.peek().is_some_and(|a| a == "--only") {
        args.next();
        args.next().expect("--only TEXT")
    } else {
        String::new()
    };
    let want = |case: &str| case.contains(only.as_str());
    let reps: usize = args.next().map_or(7, |s| s.parse().expect("REPS"));
    let sizes: Vec<usize> = args.map(|s| s.parse().expect("N")).collect();
    let sizes = if sizes.is_empty() {
        vec![1024, 2048]
    } else {
        sizes
    };
    println!("threads={} reps={reps}", rayon::current_num_threads());
    for &n in &sizes {
        let a = Tensor::randn_seeded([n, n], 1);
        let b = Tensor::randn_seeded([n, n], 2);
        let bias = Tensor::randn_seeded([n], 3);
        // Every other column of an [n, 2n] tensor: row stride 2n, column stride 2.
        let wide = Tensor::randn_seeded([n, 2 * n], 4);
        let strided = wide.slice(&[(0, n as isize, 1), (0, 2 * n as isize, 2)]);
        for t in [&a, &b, &bias, &wide] {
            t.realize()?;
        }

        let f32_cases: [(&str, &dyn Fn() -> Tensor); 4] = [
            ("f32 a@b", &|| a.matmul(&b)),
            ("f32 a.t()@b", &|| a.t().matmul(&b)),
            ("f32 a@b.t()", &|| a.matmul(&b.t())),
            ("f32 a[:, ::2]@b", &|| strided.matmul(&b)),
        ];
        let mut plain = f64::NAN;
        for (case, build) in f32_cases {
            if want(case) {
                let (s, k) = best_of(reps, build)?;
                if case == "f32 a@b" {
                    plain = s;
                }
                line(n, case, s, k, "");
            }
        }
        if want("f32 relu(a@b+bias)") {
            let (s, k) = best_of(reps, &|| (a.matmul(&b) + &bias).relu())?;
            let overhead = format!("  epilogue {:+.1}% vs a@b", (s / plain - 1.0) * 100.0);
            line(n, "f32 relu(a@b+bias)", s, k, &overhead);
        }

        for dtype in [DType::F16, DType::BF16] {
            if !want(&format!("{dtype:?}")) {
                continue;
            }
            let ah = Tensor::try_randn([n, n], 1, dtype)?;
            let bh = Tensor::try_randn([n, n], 2, dtype)?;
            ah.realize()?;
            bh.realize()?;
            let (s, k) = best_of(reps, &|| ah.matmul(&bh))?;
            let err = format!("  rel.err={:.2e}", half_error(&ah, &bh, dtype)?);
            line(n, &format!("{dtype:?} a@b"), s, k, &err);
            let (s, k) = best_of(reps, &|| ah.t().matmul(&bh))?;
            line(n, &format!("{dtype:?} a.t()@b"), s, k, "");
        }
    }
    Ok(())
}
