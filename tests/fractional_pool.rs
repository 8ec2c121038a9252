//! `fractional_max_pool2d/3d` and `nn::FractionalMaxPool2d/3d`: PyTorch's interval
//! sequence against hand-computed values (including a case where f32 and f64 arithmetic
//! disagree), random shapes, kernels, output sizes and ratios, batched and unbatched, with
//! explicit samples against a plain f64 loop (values and indices, ties, NaN and `-inf`),
//! finite-difference gradients, seeded draws, the modules and the errors.

mod common;
mod fd_helpers;

use common::Rng;
use fd_helpers::{gradcheck, values};
use kiln::nn::functional::{
    Spatial, fractional_max_pool2d, fractional_max_pool2d_with_indices,
    fractional_max_pool2d_with_samples, fractional_max_pool3d, fractional_max_pool3d_with_indices,
    fractional_max_pool3d_with_samples,
};
use kiln::nn::{FractionalMaxPool2d, FractionalMaxPool3d, Module};
use kiln::{DType, Device, KilnError, Tensor};

/// PyTorch's interval sequence, in f32 arithmetic (its CPU kernel for f32 inputs: each
/// step rounded to f32, which for these operations equals computing in f32) or in f64.
fn starts(u: f64, len: usize, out: usize, k: usize, f32_math: bool) -> Vec<usize> {
    let r = |v: f64| if f32_math { v as f32 as f64 } else { v };
    let u = r(u);
    let mut s = vec![0usize; out];
    if out > 1 {
        let alpha = r((len - k) as f64 / (out - 1) as f64);
        for (i, v) in s.iter_mut().enumerate().take(out - 1) {
            *v = (r(r(i as f64 + u) * alpha) as i64 - r(u * alpha) as i64) as usize;
        }
    }
    s[out - 1] = len - k;
    s
}

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Fractional max pooling by definition: `x` is `[planes, *spatial]`, `starts[plane][d]`
/// each dimension's window starts; every window is scanned in row-major order keeping a
/// value when `v > best || v is NaN` (PyTorch's loop), from `-inf` at the window's first
/// element.
fn reference(
    x: &[f64],
    planes: usize,
    spatial: &[usize],
    out: &[usize],
    kernel: &[usize],
    starts: &[Vec<Vec<usize>>],
) -> (Vec<f64>, Vec<i64>) {
    let nd = spatial.len();
    let plane: usize = spatial.iter().product();
    let (in_st, out_n, k_n) = (
        strides(spatial),
        out.iter().product::<usize>(),
        kernel.iter().product::<usize>(),
    );
    let (out_st, k_st) = (strides(out), strides(kernel));
    let (mut vals, mut idx) = (vec![], vec![]);
    for (p, plane_starts) in starts.iter().enumerate().take(planes) {
        for o in 0..out_n {
            let origin: Vec<usize> = (0..nd)
                .map(|d| plane_starts[d][(o / out_st[d]) % out[d]])
                .collect();
            let first: usize = (0..nd).map(|d| origin[d] * in_st[d]).sum();
            let (mut best, mut at) = (f64::NEG_INFINITY, first);
            for t in 0..k_n {
                let pos: usize = (0..nd)
                    .map(|d| (origin[d] + (t / k_st[d]) % kernel[d]) * in_st[d])
                    .sum();
                let v = x[p * plane + pos];
                if v > best || v.is_nan() {
                    best = v;
                    at = pos;
                }
            }
            vals.push(best);
            idx.push(at as i64);
        }
    }
    (vals, idx)
}

/// Values equal where both are NaN or both equal.
fn assert_same(name: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g == w || (g.is_nan() && w.is_nan()),
            "{name}[{i}]: kiln {g}, reference {w}"
        );
    }
}

/// The samples' column for spatial dimension `d` (PyTorch: `[W, H]`, `[T, H, W]`).
fn column(nd: usize, d: usize) -> usize {
    if nd == 2 { 1 - d } else { d }
}

/// The window starts of every plane from samples `[planes, nd]` (row-major).
fn all_starts(
    u: &[f64],
    f64_math: bool,
    planes: usize,
    spatial: &[usize],
    out: &[usize],
    kernel: &[usize],
) -> Vec<Vec<Vec<usize>>> {
    let nd = spatial.len();
    (0..planes)
        .map(|p| {
            (0..nd)
                .map(|d| {
                    let s = u[p * nd + column(nd, d)];
                    starts(s, spatial[d], out[d], kernel[d], !f64_math)
                })
                .collect()
        })
        .collect()
}

/// Calls the `nd`-dimensional `_with_samples` form.
fn pool_with_samples(
    x: &Tensor,
    kernel: &[usize],
    size: Option<&[usize]>,
    ratio: Option<&[f64]>,
    u: &Tensor,
) -> kiln::Result<(Tensor, Tensor)> {
    if kernel.len() == 2 {
        fractional_max_pool2d_with_samples(
            x,
            [kernel[0], kernel[1]],
            size.map(|s| Spatial([s[0], s[1]])),
            ratio.map(|r| [r[0], r[1]]),
            u,
        )
    } else {
        fractional_max_pool3d_with_samples(
            x,
            [kernel[0], kernel[1], kernel[2]],
            size.map(|s| Spatial([s[0], s[1], s[2]])),
            ratio.map(|r| [r[0], r[1], r[2]]),
            u,
        )
    }
}

/// Random cases of `nd` spatial dimensions against the reference, in `dtype`.
fn random_cases(nd: usize, dtype: DType, cases: usize, seed: u64) {
    let mut rng = Rng(seed);
    for case in 0..cases {
        let batched = case % 3 != 2;
        let (n, c) = (1 + rng.below(3), 1 + rng.below(3));
        let spatial: Vec<usize> = (0..nd)
            .map(|_| {
                if nd == 2 {
                    2 + rng.below(11)
                } else {
                    2 + rng.below(6)
                }
            })
            .collect();
        let strict = usize::from(nd == 3);
        // A kernel that leaves room for an output of at least 1.
        let kernel: Vec<usize> = spatial
            .iter()
            .map(|&len| 1 + rng.below(len - strict))
            .collect();
        let use_ratio = case % 2 == 1;
        let (out, ratio): (Vec<usize>, Option<Vec<f64>>) = if use_ratio {
            // A ratio whose ⌊len·r⌋ fits the kernel (at least 1 where possible).
            let r: Vec<f64> = (0..nd)
                .map(|d| {
                    let max_out = spatial[d] + 1 - kernel[d] - strict;
                    let o = 1 + rng.below(max_out);
                    ((o as f64 + 0.5) / spatial[d] as f64).min(0.999)
                })
                .collect();
            let out = (0..nd)
                .map(|d| (spatial[d] as f64 * r[d]).floor() as usize)
                .collect();
            (out, Some(r))
        } else {
            let out = (0..nd)
                .map(|d| 1 + rng.below(spatial[d] + 1 - kernel[d] - strict))
                .collect();
            (out, None)
        };
        let planes = if batched { n * c } else { c };
        let plane: usize = spatial.iter().product();
        let mut x = values(&mut rng, planes * plane, -2.0, 2.0);
        match case % 4 {
            // Ties: few distinct values, so the first largest in row-major order matters.
            0 => x.iter_mut().for_each(|v| *v = (*v * 1.5).round()),
            // NaN and -inf here and there.
            1 => {
                for _ in 0..(planes * plane / 6).max(1) {
                    let i = rng.below(x.len());
                    x[i] = if rng.below(2) == 0 {
                        f64::NAN
                    } else {
                        f64::NEG_INFINITY
                    };
                }
            }
            _ => {}
        }
        let f64_math = dtype == DType::F64;
        if !f64_math {
            x.iter_mut().for_each(|v| *v = *v as f32 as f64);
        }
        // Sometimes more sample rows than the batch (the extra ones are ignored).
        let rows = if batched { n } else { 1 } + rng.below(2);
        let u_all = values(&mut rng, rows * c * nd, 0.0, 1.0);
        let u: Vec<f64> = u_all
            .iter()
            .map(|&v| if f64_math { v } else { v as f32 as f64 })
            .collect();
        let mut shape = if batched { vec![n, c] } else { vec![c] };
        shape.extend_from_slice(&spatial);
        let xt = Tensor::from_vec(x.clone(), shape.as_slice()).cast(dtype);
        let ut = Tensor::from_vec(u.clone(), [rows, c, nd]).cast(dtype);
        let (y, at) = pool_with_samples(
            &xt,
            &kernel,
            (!use_ratio).then_some(out.as_slice()),
            ratio.as_deref(),
            &ut,
        )
        .unwrap();
        let mut want_shape = if batched { vec![n, c] } else { vec![c] };
        want_shape.extend_from_slice(&out);
        let name = format!(
            "{nd}-d {dtype:?} case {case}: shape {shape:?} kernel {kernel:?} out {out:?} ratio {ratio:?}"
        );
        assert_eq!(y.shape(), want_shape.as_slice(), "{name}");
        assert_eq!(at.shape(), want_shape.as_slice(), "{name}");
        assert_eq!(at.dtype(), DType::I64, "{name}");
        let starts = all_starts(&u, f64_math, planes, &spatial, &out, &kernel);
        let (want, want_at) = reference(&x, planes, &spatial, &out, &kernel, &starts);
        assert_same(&name, &y.to_vec::<f64>().unwrap(), &want);
        assert_eq!(at.to_vec::<i64>().unwrap(), want_at, "{name}: indices");
    }
}

#[test]
fn intervals_match_hand_computed_values() {
    // Rows: 3 high with a 3-high kernel and one output row (start 0, its last row kept);
    // the input increases in row-major order, so each window keeps its last element and
    // the index is 2·W + start + k - 1.
    let w = 10;
    let x = Tensor::arange(0.0, (3 * w) as f64, 1.0).reshape([1, 1, 3, w]);
    let case = |u_w: f32, out: usize| -> Vec<i64> {
        let u = Tensor::from_vec(vec![u_w, 0.25], [1, 1, 2]);
        let (_, at) =
            fractional_max_pool2d_with_samples(&x, [3, 3], Some(Spatial([1, out])), None, &u)
                .unwrap();
        at.to_vec::<i64>()
            .unwrap()
            .iter()
            .map(|i| i - 2 * w as i64 - 2)
            .collect()
    };
    // α = 7/3: trunc((i + 0.3)·α) - trunc(0.3·α) = 0, 3, 5, then n - k = 7.
    assert_eq!(case(0.3, 4), vec![0, 3, 5, 7]);
    // u = 0: trunc(i·α).
    assert_eq!(case(0.0, 4), vec![0, 2, 4, 7]);
    // α = 7/4, u = 0.9 (u·α = 1.575): trunc(1.575) - 1 = 0, trunc(3.325) - 1 = 2,
    // trunc(5.075) - 1 = 4, trunc(6.825) - 1 = 5, then 7.
    assert_eq!(case(0.9, 5), vec![0, 2, 4, 5, 7]);
    // One output: the last window, whatever the sample.
    assert_eq!(case(0.6, 1), vec![7]);
    // Eight outputs (α = 1): consecutive windows.
    assert_eq!(case(0.5, 8), (0..8).collect::<Vec<i64>>());
    // The helpers in the tests agree with these.
    assert_eq!(starts(0.3, 10, 4, 3, true), vec![0, 3, 5, 7]);
    assert_eq!(starts(0.9, 10, 5, 3, false), vec![0, 2, 4, 5, 7]);
}

#[test]
fn interval_arithmetic_is_in_the_input_dtype() {
    // n = 6, k = 2, o = 4: α = 4/3. With u = 1 - 2⁻²⁴, f32 rounds 2 + u to 3 and 3·α to
    // 4, so start[2] = 4 - 1 = 3; in f64 (3 - 2⁻²⁴)·4/3 < 4 gives 3 - 1 = 2.
    let u = 1.0 - 2f64.powi(-24);
    assert_eq!(starts(u, 6, 4, 2, true), vec![0, 1, 3, 4]);
    assert_eq!(starts(u, 6, 4, 2, false), vec![0, 1, 2, 4]);
    let x = Tensor::arange(0.0, 12.0, 1.0).reshape([1, 1, 2, 6]);
    for (dtype, want) in [(DType::F32, [0i64, 1, 3, 4]), (DType::F64, [0, 1, 2, 4])] {
        let samples = Tensor::from_vec(vec![u, 0.0], [1, 1, 2]).cast(dtype);
        let (_, at) = fractional_max_pool2d_with_samples(
            &x.cast(dtype),
            [2, 2],
            Some(Spatial([1, 4])),
            None,
            &samples,
        )
        .unwrap();
        // Row window 0..2 (one output), so each index is 6 + start + 1.
        let got: Vec<i64> = at.to_vec::<i64>().unwrap().iter().map(|i| i - 7).collect();
        assert_eq!(got, want, "{dtype:?}");
    }
}

#[test]
fn pool2d_matches_reference() {
    random_cases(2, DType::F32, 80, 11);
    random_cases(2, DType::F64, 24, 12);
}

#[test]
fn pool3d_matches_reference() {
    random_cases(3, DType::F32, 40, 21);
    random_cases(3, DType::F64, 12, 22);
}

#[test]
fn half_inputs_pool_like_f32() {
    let mut rng = Rng(5);
    let x: Vec<f64> = values(&mut rng, 2 * 9 * 8, -4.0, 4.0)
        .iter()
        .map(|v| (v * 8.0).round() / 8.0)
        .collect();
    let u = values(&mut rng, 4, 0.0, 1.0);
    let run = |dtype: DType| {
        let xt = Tensor::from_vec(x.clone(), [2, 1, 9, 8]).cast(dtype);
        let ut = Tensor::from_vec(u.clone(), [2, 1, 2]).cast(dtype);
        let (y, at) =
            fractional_max_pool2d_with_samples(&xt, 2, Some(Spatial([5, 4])), None, &ut).unwrap();
        assert_eq!(y.dtype(), dtype);
        (y.to_vec::<f64>().unwrap(), at.to_vec::<i64>().unwrap())
    };
    // The inputs are exact in every dtype; the samples are rounded to f16 first in both.
    let f16_samples: Vec<f64> = Tensor::from_vec(u.clone(), [4])
        .cast(DType::F16)
        .to_vec::<f64>()
        .unwrap();
    let want = {
        let xt = Tensor::from_vec(x.clone(), [2, 1, 9, 8]).cast(DType::F32);
        let ut = Tensor::from_vec(f16_samples, [2, 1, 2]).cast(DType::F32);
        let (y, at) =
            fractional_max_pool2d_with_samples(&xt, 2, Some(Spatial([5, 4])), None, &ut).unwrap();
        (y.to_vec::<f64>().unwrap(), at.to_vec::<i64>().unwrap())
    };
    assert_eq!(run(DType::F16), want);
}

#[test]
fn gradients_match_finite_differences() {
    let mut rng = Rng(3);
    // 2-D, batched, overlapping windows (k = 3, 7 → 4), distinct values (no ties).
    let x = values(&mut rng, 2 * 2 * 7 * 6, -1.0, 1.0);
    let u = Tensor::from_vec(values(&mut rng, 8, 0.0, 1.0), [2, 2, 2]);
    let probe = Tensor::from_vec(values(&mut rng, 2 * 2 * 4 * 3, 0.5, 1.5), [2, 2, 4, 3]);
    gradcheck(
        "2-d",
        &x,
        &[2, 2, 7, 6],
        &|t| {
            let (y, _) =
                fractional_max_pool2d_with_samples(t, [3, 2], Some(Spatial([4, 3])), None, &u)
                    .unwrap();
            (&y * &probe).sum(..)
        },
        1e-6,
    );
    // 3-D, unbatched, by ratio.
    let x = values(&mut rng, 2 * 5 * 4 * 6, -1.0, 1.0);
    let u = Tensor::from_vec(values(&mut rng, 6, 0.0, 1.0), [1, 2, 3]);
    let probe = Tensor::from_vec(values(&mut rng, 2 * 2 * 2 * 3, 0.5, 1.5), [2, 2, 2, 3]);
    gradcheck(
        "3-d",
        &x,
        &[2, 5, 4, 6],
        &|t| {
            let (y, _) =
                fractional_max_pool3d_with_samples(t, 2, None, Some([0.5, 0.6, 0.6]), &u).unwrap();
            (&y * &probe).sum(..)
        },
        1e-6,
    );
}

#[test]
fn gradient_reaches_the_indexed_elements() {
    // Each output's gradient lands on the element its index names (summed where windows
    // share a winner), as PyTorch's backward scatters it.
    let mut rng = Rng(8);
    let x =
        Tensor::from_vec(values(&mut rng, 3 * 11 * 9, 0.0, 1.0), [3, 11, 9]).requires_grad_(true);
    let u = Tensor::from_vec(values(&mut rng, 6, 0.0, 1.0), [1, 3, 2]);
    let (y, at) =
        fractional_max_pool2d_with_samples(&x, 2, Some(Spatial([7, 5])), None, &u).unwrap();
    y.sum(..).backward().unwrap();
    let grad = x.grad().unwrap().to_vec::<f32>().unwrap();
    let mut want = vec![0.0f32; 3 * 99];
    for (o, i) in at.to_vec::<i64>().unwrap().iter().enumerate() {
        want[(o / 35) * 99 + *i as usize] += 1.0;
    }
    assert_eq!(grad, want);
}

#[test]
fn seeded_draws_are_reproducible_and_documented() {
    let x = Tensor::randn_seeded([2, 3, 16, 15], 4);
    let pool = |seed| fractional_max_pool2d_with_indices(&x, 2, None, Some([0.6, 0.7]), seed);
    let (a, ia) = pool(9).unwrap();
    let (b, ib) = pool(9).unwrap();
    let (_, ic) = pool(10).unwrap();
    assert_eq!(a.shape(), &[2, 3, 9, 10]);
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let ia = ia.to_vec::<i64>().unwrap();
    assert_eq!(ia, ib.to_vec::<i64>().unwrap());
    assert_ne!(ia, ic.to_vec::<i64>().unwrap());
    // The draw is `Tensor::try_rand([N, C, 2], seed, f32)`, as documented.
    let u = Tensor::try_rand([2, 3, 2], 9, DType::F32).unwrap();
    let (_, iu) = fractional_max_pool2d_with_samples(&x, 2, None, Some([0.6, 0.7]), &u).unwrap();
    assert_eq!(ia, iu.to_vec::<i64>().unwrap());
    // The values-only form agrees with the indexed one.
    let y = fractional_max_pool2d(&x, 2, None, Some([0.6, 0.7]), 9).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
    // 3-D: the same seed, the same windows; another seed, others.
    let v = Tensor::randn_seeded([2, 9, 10, 11], 5);
    let p3 = |seed| fractional_max_pool3d_with_indices(&v, 2, Some(Spatial([5, 6, 7])), None, seed);
    let i1 = p3(1).unwrap().1.to_vec::<i64>().unwrap();
    assert_eq!(i1, p3(1).unwrap().1.to_vec::<i64>().unwrap());
    assert_ne!(i1, p3(2).unwrap().1.to_vec::<i64>().unwrap());
    let y3 = fractional_max_pool3d(&v, 2, Some(Spatial([5, 6, 7])), None, 1).unwrap();
    assert_eq!(y3.shape(), &[2, 5, 6, 7]);
}

#[test]
fn modules_draw_new_samples_each_forward() {
    let x = Tensor::randn_seeded([2, 3, 12, 12], 6);
    let pool = FractionalMaxPool2d::new(2, 7, 42);
    let first = pool
        .forward_with_indices(&x)
        .unwrap()
        .1
        .to_vec::<i64>()
        .unwrap();
    let second = pool
        .forward_with_indices(&x)
        .unwrap()
        .1
        .to_vec::<i64>()
        .unwrap();
    assert_ne!(first, second);
    // A module with the same seed repeats the sequence; its first draw is the seed's.
    let again = FractionalMaxPool2d::new(2, 7, 42);
    assert_eq!(
        again
            .forward_with_indices(&x)
            .unwrap()
            .1
            .to_vec::<i64>()
            .unwrap(),
        first
    );
    let (_, direct) = fractional_max_pool2d_with_indices(&x, 2, Some(7.into()), None, 42).unwrap();
    assert_eq!(direct.to_vec::<i64>().unwrap(), first);
    assert!(pool.named_parameters().is_empty());
    // Fixed samples: the same windows every forward, kept as a buffer.
    let u = Tensor::rand_seeded([2, 3, 2], 1);
    let fixed = FractionalMaxPool2d::new(2, 7, 0).samples(u.clone());
    let a = fixed.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(fixed.forward(&x).unwrap().to_vec::<f32>().unwrap(), a);
    let (want, _) = fractional_max_pool2d_with_samples(&x, 2, Some(7.into()), None, &u).unwrap();
    assert_eq!(a, want.to_vec::<f32>().unwrap());
    let mut names = vec![];
    fixed.visit_buffers(&mut |n, _| names.push(n.to_string()));
    assert_eq!(names, vec!["_random_samples"]);
    // 3-D by ratio, unbatched; evaluation mode still samples.
    let mut pool3 = FractionalMaxPool3d::with_ratio(2, [0.5, 0.5, 0.75], 3).unwrap();
    pool3.set_training(false);
    let y = pool3
        .forward(&Tensor::randn_seeded([2, 8, 6, 8], 7))
        .unwrap();
    assert_eq!(y.shape(), &[2, 4, 3, 6]);
}

#[test]
fn empty_outputs_and_edge_sizes() {
    // ⌊1 · 0.5⌋ = 0 rows: PyTorch returns an empty result.
    let x = Tensor::randn_seeded([2, 3, 1, 6], 1);
    let (y, at) = fractional_max_pool2d_with_indices(&x, 1, None, Some([0.5, 0.5]), 0).unwrap();
    assert_eq!(y.shape(), &[2, 3, 0, 3]);
    assert_eq!(at.shape(), &[2, 3, 0, 3]);
    assert!(y.to_vec::<f32>().unwrap().is_empty());
    // An empty batch is allowed, as in PyTorch (only the other dimensions must be non-empty).
    let x = Tensor::zeros([0, 2, 6, 5]);
    let (y, at) =
        fractional_max_pool2d_with_indices(&x, 2, Some(Spatial([3, 2])), None, 1).unwrap();
    assert_eq!(y.shape(), &[0, 2, 3, 2]);
    assert!(at.to_vec::<i64>().unwrap().is_empty());
    // 2-D allows output + kernel - 1 == input: the output covers the input with windows
    // one apart; a kernel as large as the input with one output is global max pooling.
    let x = Tensor::from_vec((0..20).map(|v| v as f32).collect(), [1, 4, 5]);
    let (y, at) = fractional_max_pool2d_with_indices(&x, [4, 5], Some(1.into()), None, 3).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![19.0]);
    assert_eq!(at.to_vec::<i64>().unwrap(), vec![19]);
    let y = fractional_max_pool2d(&x, [2, 2], Some(Spatial([3, 4])), None, 3).unwrap();
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![
            6.0, 7.0, 8.0, 9.0, 11.0, 12.0, 13.0, 14.0, 16.0, 17.0, 18.0, 19.0
        ]
    );
}

#[test]
fn runs_on_cuda_like_the_cpu() {
    if !Device::cuda_is_available() {
        eprintln!(
            "skipped: {}",
            kiln::backend::cuda::availability().unwrap_err()
        );
        return;
    }
    let gpu = Device::Cuda(0);
    let x = Tensor::randn_seeded([3, 4, 17, 13], 2);
    let u = Tensor::rand_seeded([3, 4, 2], 3);
    let (y, at) = fractional_max_pool2d_with_samples(&x, 3, None, Some([0.7, 0.6]), &u).unwrap();
    let (yg, atg) =
        fractional_max_pool2d_with_samples(&x.to(gpu), 3, None, Some([0.7, 0.6]), &u.to(gpu))
            .unwrap();
    assert_eq!(yg.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    assert_eq!(atg.to_vec::<i64>().unwrap(), at.to_vec::<i64>().unwrap());
    let v = Tensor::randn_seeded([2, 3, 9, 8, 7], 4);
    let a = fractional_max_pool3d_with_indices(&v, 2, Some(Spatial([5, 4, 3])), None, 8).unwrap();
    let g = fractional_max_pool3d_with_indices(&v.to(gpu), 2, Some(Spatial([5, 4, 3])), None, 8)
        .unwrap();
    assert_eq!(g.0.to_vec::<f32>().unwrap(), a.0.to_vec::<f32>().unwrap());
    assert_eq!(g.1.to_vec::<i64>().unwrap(), a.1.to_vec::<i64>().unwrap());
    // The gradient on the device is the CPU's.
    let leaf = x.to(gpu).detach().requires_grad_(true);
    let (y, _) =
        fractional_max_pool2d_with_samples(&leaf, 3, None, Some([0.7, 0.6]), &u.to(gpu)).unwrap();
    y.sum(..).backward().unwrap();
    let cpu_leaf = x.detach().requires_grad_(true);
    let (y, _) =
        fractional_max_pool2d_with_samples(&cpu_leaf, 3, None, Some([0.7, 0.6]), &u).unwrap();
    y.sum(..).backward().unwrap();
    assert_eq!(
        leaf.grad().unwrap().to_vec::<f32>().unwrap(),
        cpu_leaf.grad().unwrap().to_vec::<f32>().unwrap()
    );
}

fn invalid_reason(r: kiln::Result<Tensor>, op: &str) -> String {
    match r {
        Err(KilnError::InvalidArgument { op: o, reason, .. }) => {
            assert_eq!(o, op);
            reason
        }
        other => panic!("expected InvalidArgument from {op}, got {other:?}"),
    }
}

#[test]
fn errors_name_the_op_and_shapes() {
    let x = Tensor::zeros([2, 3, 8, 8]);
    let op2 = "fractional_max_pool2d";
    let r = invalid_reason(
        fractional_max_pool2d(&x, 2, Some(4.into()), Some([0.5, 0.5]), 0),
        op2,
    );
    assert!(r.contains("not both"), "{r}");
    let r = invalid_reason(fractional_max_pool2d(&x, 2, None, None, 0), op2);
    assert!(r.contains("output_size or an output_ratio"), "{r}");
    for bad in [0.0, 1.0, 1.5, -0.5, f64::NAN] {
        let r = invalid_reason(fractional_max_pool2d(&x, 2, None, Some([0.5, bad]), 0), op2);
        assert!(r.contains("strictly between 0 and 1"), "{r}");
    }
    // output + kernel - 1 must be at most the input (2-D) ...
    let r = invalid_reason(
        fractional_max_pool2d(&x, [2, 3], Some(Spatial([7, 7])), None, 0),
        op2,
    );
    assert!(r.contains("too large") && r.contains("dimension 3"), "{r}");
    assert!(fractional_max_pool2d(&x, [2, 3], Some(Spatial([7, 6])), None, 0).is_ok());
    // ... and below it in 3-D, as PyTorch checks.
    let v = Tensor::zeros([3, 8, 8, 8]);
    let op3 = "fractional_max_pool3d";
    let r = invalid_reason(fractional_max_pool3d(&v, 2, Some(7.into()), None, 0), op3);
    assert!(r.contains("below"), "{r}");
    assert!(fractional_max_pool3d(&v, 2, Some(6.into()), None, 0).is_ok());
    let r = invalid_reason(
        fractional_max_pool2d(&x, [0, 2], Some(2.into()), None, 0),
        op2,
    );
    assert!(r.contains("kernel_size"), "{r}");
    // Wrong rank, empty dimensions, integer input.
    let r = invalid_reason(
        fractional_max_pool2d(&Tensor::zeros([8, 8]), 2, Some(2.into()), None, 0),
        op2,
    );
    assert!(r.contains("dimensions"), "{r}");
    let r = invalid_reason(
        fractional_max_pool2d(&Tensor::zeros([2, 0, 8, 8]), 2, Some(2.into()), None, 0),
        op2,
    );
    assert!(r.contains("empty"), "{r}");
    assert!(matches!(
        fractional_max_pool2d(&x.cast(DType::I64), 2, Some(2.into()), None, 0),
        Err(KilnError::UnsupportedDType {
            op: "fractional_max_pool2d",
            ..
        })
    ));
    // Samples: dtype, shape (rank, channels, fewer rows than the batch, columns).
    let with = |u: &Tensor| fractional_max_pool2d_with_samples(&x, 2, Some(4.into()), None, u);
    assert!(matches!(
        with(&Tensor::zeros_dtype([2, 3, 2], DType::F64)),
        Err(KilnError::DTypeMismatch {
            op: "fractional_max_pool2d",
            lhs: DType::F32,
            rhs: DType::F64
        })
    ));
    for bad in [vec![6, 2], vec![2, 2, 2], vec![1, 3, 2], vec![2, 3, 3]] {
        match with(&Tensor::zeros(bad.as_slice())) {
            Err(KilnError::ShapeMismatch {
                op,
                lhs,
                rhs,
                detail,
            }) => {
                assert_eq!((op, lhs, rhs.clone()), (op2, vec![2, 3, 8, 8], bad));
                assert!(detail.contains("_random_samples"), "{detail}");
            }
            other => panic!("samples {bad:?}: {other:?}"),
        }
    }
    assert!(with(&Tensor::zeros([3, 3, 2])).is_ok());
    assert!(matches!(
        fractional_max_pool3d_with_samples(&v, 2, Some(4.into()), None, &Tensor::zeros([1, 3, 2])),
        Err(KilnError::ShapeMismatch {
            op: "fractional_max_pool3d",
            ..
        })
    ));
    // The modules check their ratio when built, as PyTorch's constructors do.
    assert!(matches!(
        FractionalMaxPool2d::with_ratio(2, [0.5, 1.0], 0),
        Err(KilnError::InvalidArgument {
            op: "FractionalMaxPool2d",
            ..
        })
    ));
    assert!(FractionalMaxPool3d::with_ratio(2, [0.0, 0.5, 0.5], 0).is_err());
}
