//! Joins and pads whose blocks between mask edges hold 128K elements and more, or that have
//! three or more blocks of 4K elements and more (run at once), run on the CPU as one kernel
//! per block. Every case here is exact arithmetic on exactly representable
//! values, so fused, unfused and the reference evaluator must agree bit for bit; each case
//! also checks that the split happened (or, for blocks too small to pay, that it did not).
//! Random programs of the same families: `fuzz_large_joins_and_pads` in `differential.rs`.

use kiln::{DType, RealizeOptions, Tensor, backend, reference};

/// `n` values of the form `k / 8 - 3.5` (exact in every float dtype kiln has).
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 61) as f32 / 8.0 - 3.5)
        .collect()
}

fn input(shape: &[usize], seed: usize, dtype: DType) -> Tensor {
    let n = shape.iter().product();
    let t = Tensor::from_vec(values(n, seed), shape).cast(dtype);
    t.realize().expect("realize");
    t
}

/// Builds the expression twice (a realized node becomes a buffer), realizes it fused and
/// unfused, and compares both with the reference evaluator bit for bit. Returns how many
/// kernels were split at their masks meanwhile.
#[track_caller]
fn check(build: impl Fn() -> Tensor) -> u64 {
    // The counter is global: one check at a time across this file's tests.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = backend::cpu::kernels_split_at_masks();
    let want = reference::evaluate(&build()).expect("reference").to_f64();
    for opts in [RealizeOptions::default(), RealizeOptions::unfused()] {
        let t = build();
        t.realize_with(&opts).expect("realize");
        let got = t.to_vec::<f64>().expect("read back");
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "element {i}: got {g}, want {w}");
        }
    }
    backend::cpu::kernels_split_at_masks() - before
}

#[test]
fn cat_along_every_axis_and_dtype() {
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::I64,
    ] {
        for axis in 0..3 {
            let mut shapes = [[64usize, 64, 64], [64, 64, 64], [64, 64, 64]];
            // Pieces of 32, 64 and 96 along the joined axis.
            for (k, s) in shapes.iter_mut().enumerate() {
                s[axis] = 32 * (k + 1);
            }
            let (a, b, c) = (
                input(&shapes[0], 1, dtype),
                input(&shapes[1], 2, dtype),
                input(&shapes[2], 3, dtype),
            );
            let split = check(|| Tensor::cat(&[&a, &b, &c], axis as isize) * 2 + 1);
            assert!(split > 0, "{dtype:?} cat along {axis} was not split");
        }
    }
}

#[test]
fn stack_and_the_sum_of_disjoint_pads() {
    let (a, b, c) = (
        input(&[64, 64, 128], 4, DType::F32),
        input(&[64, 64, 128], 5, DType::F32),
        input(&[64, 64, 128], 6, DType::F32),
    );
    assert!(check(|| Tensor::stack(&[&a, &b, &c], 2).neg()) > 0);
    // The gradient of three slices of one tensor (attention's q, k, v) is this sum.
    let padsum = || {
        &(&a.pad(&[(0, 0), (0, 0), (0, 256)], 0.0) + &b.pad(&[(0, 0), (0, 0), (128, 128)], 0.0))
            + &c.pad(&[(0, 0), (0, 0), (256, 0)], 0.0)
    };
    assert!(check(padsum) > 0);
}

#[test]
fn pads_with_fill_values_flips_and_broadcasts() {
    let x = input(&[1000, 600], 7, DType::F32);
    // Wide pads on both axes with a non-zero fill, of a flipped view: split along the rows,
    // each block still masked along the columns.
    let padded = || x.flip([1]).pad(&[(200, 300), (100, 60)], -2.5) * 0.5;
    assert!(check(padded) > 0);
    // A pad of a broadcast row, then an op with another input.
    let row = input(&[1, 512], 8, DType::F32);
    let y = input(&[1024, 840], 9, DType::F32);
    let wide = || &row.expand([1024, 512]).pad(&[(0, 0), (128, 200)], 1.0) - &y;
    assert!(check(wide) > 0);
}

#[test]
fn small_stacks_of_many_windows_run_as_parallel_blocks() {
    // A convolution's im2col columns: nine strided windows of a padded batch-last input,
    // stacked ([16, 9, 4, 4, 64]: nine blocks of 16K elements), and the same of a computed
    // value (the windows then read through a fused producer).
    let x = input(&[16, 8, 8, 64], 12, DType::F32);
    let windows = |v: &Tensor| {
        let p = v.pad(&[(0, 0), (1, 1), (1, 1)], 0.0);
        let taps: Vec<Tensor> = (0..9)
            .map(|k| {
                let (i, j) = ((k / 3) as isize, (k % 3) as isize);
                p.slice(&[(0, 16, 1), (i, i + 7, 2), (j, j + 7, 2)])
            })
            .collect();
        Tensor::stack(&taps.iter().collect::<Vec<_>>(), 1)
    };
    assert!(check(|| windows(&x)) > 0);
    assert!(check(|| windows(&(&x * 2.0 + 1.0)) * 3.0) > 0);
    // Mixed dtypes, and blocks of exactly the smallest size (4096 elements).
    let h = input(&[4, 16, 16, 16], 13, DType::F16);
    let three = || {
        Tensor::stack(
            &[
                &h.slice(&[(0, 4, 1), (0, 16, 1), (0, 16, 1), (0, 16, 1)]),
                &h.flip([3]),
                &h.neg(),
            ],
            0,
        )
    };
    assert!(check(three) > 0);
}

#[test]
fn small_pads_and_small_tensors_stay_one_kernel() {
    // A pad of one position: blocks that short would cost more than the masks.
    let x = input(&[512, 256], 10, DType::F32);
    assert_eq!(check(|| x.pad(&[(1, 1), (1, 1)], 0.0) + 1.0), 0);
    // Two blocks under 128K elements (each would run on one thread).
    let s = input(&[256, 128], 11, DType::F32);
    assert_eq!(check(|| Tensor::cat(&[&s, &s], 1) * 3), 0);
    // Three blocks, each under 4K elements.
    let t = input(&[16, 16, 15], 14, DType::F32);
    assert_eq!(check(|| Tensor::stack(&[&t, &t, &t], 0) + 1.0), 0);
}

#[test]
fn cat_keeps_minus_zero_in_every_float_dtype() {
    // `cat` picks each input's own values: a sum of zero-padded inputs would turn every
    // -0.0 into +0.0.
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        for (shape, splits) in [([64usize, 64, 64], true), ([2, 3, 4], false)] {
            let n: usize = shape.iter().product();
            let signed: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 3 == 0 {
                        -0.0
                    } else {
                        (i % 64) as f32 / 4.0
                    }
                })
                .collect();
            let a = Tensor::from_vec(signed.clone(), shape).cast(dtype);
            let b = input(&shape, 7, dtype);
            a.realize().expect("realize");
            let split = check(|| Tensor::cat(&[&b, &a, &b], 1));
            assert_eq!(split > 0, splits, "{dtype:?} {shape:?}");
            let joined = Tensor::cat(&[&b, &a, &b], 1)
                .to_vec::<f64>()
                .expect("reads");
            let (rows, inner) = (shape[0], shape[1] * shape[2]);
            for r in 0..rows {
                let middle = &joined[(3 * r + 1) * inner..(3 * r + 2) * inner];
                for (g, w) in middle.iter().zip(&signed[r * inner..(r + 1) * inner]) {
                    assert_eq!(g.to_bits(), (*w as f64).to_bits(), "{dtype:?} row {r}");
                }
            }
        }
    }
}

#[test]
fn the_gradient_of_a_long_cat_reads_each_part_of_the_output_gradient_once() {
    // Every input's gradient is a slice of the output's: the kernels that realize all 64
    // gradients cover about the output once (a chain of `where`s would pass the gradient
    // of the rest of the join down to every input: 64 kernels of the whole size).
    let parts: Vec<Tensor> = (0..64)
        .map(|i| input(&[1, 16, 256], 20 + i, DType::F32).requires_grad_(true))
        .collect();
    let w = input(&[64, 16, 256], 9, DType::F32);
    let joined = Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0);
    (&joined * &w).sum(..).backward().expect("backward");
    let grads: Vec<Tensor> = parts.iter().map(|p| p.grad().expect("grad")).collect();
    let plan = kiln::plan_all(
        &grads.iter().collect::<Vec<_>>(),
        &RealizeOptions::default(),
    )
    .expect("plans");
    let covered: usize = plan
        .kernels()
        .map(|k| k.kernel().shape.iter().product::<usize>())
        .sum();
    let total = 64 * 16 * 256;
    assert!(
        covered <= 2 * total,
        "kernels cover {covered} elements for {total}"
    );
    kiln::realize_all(&grads.iter().collect::<Vec<_>>()).expect("realizes");
    let want = w.to_vec::<f32>().expect("reads");
    for (i, g) in grads.iter().enumerate() {
        assert_eq!(g.shape(), &[1, 16, 256]);
        let g = g.to_vec::<f32>().expect("reads");
        assert_eq!(g, want[i * 4096..(i + 1) * 4096], "part {i}");
    }
}
