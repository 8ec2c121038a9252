//! Reductions over leading axes ("column" reductions) large enough that the CPU backend
//! splits the reduce space into blocks, reduces each block in its own task and combines
//! the partial results (at least 65,536 points and 256 reduce positions). Every result is
//! checked against the reference evaluator: sums within rounding, everything else exactly
//! (max, min, argmax/argmin with PyTorch's first-index tie rule, NaN propagation, integer
//! sums, any/all, half-precision rounding of the result).

use kiln::reference;
use kiln::{DType, Tensor};

/// Values with many exact ties, row `i`, column `j`: `(7i + 3j) % 11`, plus one from row 600
/// on (so the maxima, 11, are all in later blocks), minus 12 at every fifth position of rows
/// 900..1000 (so the minima are too).
fn ties(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let last = *shape.last().unwrap_or(&1);
    let v: Vec<f32> = (0..n)
        .map(|k| {
            let (i, j) = (k / last, k % last);
            let mut x = ((i * 7 + j * 3) % 11) as f32;
            if i >= 600 {
                x += 1.0;
            }
            if (900..1000).contains(&i) && (i + j) % 5 == 0 {
                x -= 12.0;
            }
            x
        })
        .collect();
    Tensor::from_vec(v, shape)
}

/// A realized random tensor (so reductions read it from memory rather than generating it
/// inside the kernel).
fn randn(shape: &[usize], seed: u64) -> Tensor {
    let t = Tensor::randn_seeded(shape, seed);
    t.realize().expect("realize");
    t
}

/// As [`randn`], uniform in [0, 1).
fn rand(shape: &[usize], seed: u64) -> Tensor {
    let t = Tensor::rand_seeded(shape, seed);
    t.realize().expect("realize");
    t
}

/// Checks `t` against the reference evaluator: `tol` relative to `1 + |want|` (0 = exact;
/// NaN must match NaN).
#[track_caller]
fn check(t: &Tensor, tol: f64) {
    let want = reference::evaluate(t).expect("reference").to_f64();
    let got = t.to_vec::<f64>().expect("realize");
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "[{i}]: got {g}, want NaN");
            continue;
        }
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "[{i}]: got {g}, want {w} (tol {tol})"
        );
    }
}

/// Sums of 300–2,048 f32 terms of size about 1 accumulated in f32, against the reference's
/// f64: a few ulps of the running sum per term at worst; 2e-4 of `1 + |sum|` is about 10x
/// what the tests measure.
const SUM_TOL: f64 = 2e-4;

#[test]
fn sums_means_and_products_over_the_first_axis() {
    let x = randn(&[1000, 300], 1);
    check(&x.sum(0), SUM_TOL);
    check(&x.mean(0), SUM_TOL);
    check(&x.sum_keepdim(0), SUM_TOL);
    // Products of values near 1, so 1,000 factors stay finite.
    let near_one = rand(&[1000, 300], 2) * 0.01 + 0.995;
    check(&near_one.prod(0), 1e-4);
}

#[test]
fn max_min_and_arg_reductions_keep_the_first_index_on_ties() {
    let x = ties(&[1200, 70]);
    check(&x.amax(0), 0.0);
    check(&x.amin(0), 0.0);
    check(&x.argmax(0), 0.0);
    check(&x.argmin(0), 0.0);
    let idx = x.argmax(0).to_vec::<i64>().unwrap();
    let v = x.to_vec::<f32>().unwrap();
    for (j, &i) in idx.iter().enumerate() {
        let first = (0..1200).find(|&r| v[r * 70 + j] == 11.0).unwrap();
        assert_eq!(i as usize, first, "column {j}");
    }
}

#[test]
fn nan_propagates_through_max_from_any_block() {
    let mut v: Vec<f32> = (0..800 * 100).map(|k| (k % 97) as f32).collect();
    // NaN in the first, a middle and the last row of different columns.
    v[3] = f32::NAN;
    v[400 * 100 + 50] = f32::NAN;
    v[799 * 100 + 99] = f32::NAN;
    let x = Tensor::from_vec(v, [800, 100]);
    check(&x.amax(0), 0.0);
    check(&x.argmax(0), 0.0);
    check(&x.amin(0), 0.0);
    let m = x.amax(0).to_vec::<f32>().unwrap();
    assert!(m[3].is_nan() && m[50].is_nan() && m[99].is_nan() && !m[0].is_nan());
}

#[test]
fn several_reduce_axes_and_outer_output_axes() {
    let x = randn(&[64, 32, 100], 3);
    check(&x.sum([0, 1]), SUM_TOL);
    let y = randn(&[8, 600, 40], 4);
    check(&y.sum(1), SUM_TOL);
    check(&y.amax(1), 0.0);
    check(&y.argmin(1), 0.0);
}

#[test]
fn fused_elementwise_inputs_views_and_epilogues() {
    let x = randn(&[512, 257], 5);
    check(&((&x * 0.5 + 1.0).exp().sum(0)), SUM_TOL);
    check(&(x.sum(0) * 3.0 + 1.0), SUM_TOL);
    // A transposed read, a slice with a step and a padded view.
    let t = randn(&[300, 1000], 6);
    check(&t.t().sum(0), SUM_TOL);
    check(&t.slice_dim(1, 1, 1000, 3).sum(0), SUM_TOL);
    check(&t.pad(&[(7, 5), (0, 0)], -2.0).sum(0), SUM_TOL);
    check(&t.pad(&[(7, 5), (0, 0)], -2.0).amax(0), 0.0);
}

#[test]
fn integer_bool_and_half_dtypes() {
    let i = ties(&[2000, 64]).cast(DType::I64) * 1_000_000_007i64;
    check(&i.sum(0), 0.0);
    let i32s = ties(&[2000, 64]).cast(DType::I32);
    check(&i32s.sum(0), 0.0);
    let b = ties(&[2000, 64]).gt(10.5);
    check(&b.any(0), 0.0);
    check(&b.all(0), 0.0);
    for dt in [DType::F16, DType::BF16] {
        let h = randn(&[1000, 130], 7).cast(dt);
        // Accumulated in f32, rounded once to the half type.
        check(&h.sum(0), 1e-2);
        check(&h.amax(0), 0.0);
    }
}

/// Wider than one run of the CPU backend (1,024 positions): each task of the split walks
/// several runs per reduce position, and where the pass only loads it folds eight reduce
/// positions per run at once, in order. The results must be the same bits as one position
/// at a time (a negation fused into the pass turns the grouping off; negating is exact),
/// and agree with the reference, including the positions left over after the last group
/// of eight in a block (333 rows in two blocks) and masked loads (a padded view).
#[test]
fn wide_column_reductions_fold_rows_in_order() {
    for (rows, cols, seed) in [(1000, 2500, 11), (333, 4100, 12)] {
        let x = randn(&[rows, cols], seed);
        let grouped = x.sum(0).to_vec::<f32>().unwrap();
        let one_by_one = x.neg().sum(0).to_vec::<f32>().unwrap();
        assert_eq!(grouped.len(), cols);
        for (j, (g, o)) in grouped.iter().zip(&one_by_one).enumerate() {
            assert_eq!(g.to_bits(), (-o).to_bits(), "{rows}x{cols} column {j}");
        }
        check(&x.sum(0), SUM_TOL);
        check(&x.amax(0), 0.0);
        check(&x.amin(0), 0.0);
        check(&x.argmax(0), 0.0);
        let near_one = rand(&[rows, cols], seed + 100) * 0.01 + 0.995;
        check(&near_one.prod(0), 1e-4);
        check(&x.pad(&[(5, 9), (0, 0)], -2.0).sum(0), SUM_TOL);
        check(&x.pad(&[(5, 9), (0, 0)], 7.0).amax(0), 0.0);
        // Two reductions of one input in one kernel.
        let (s, m) = (x.sum(0), x.amin(0));
        kiln::realize_all(&[&s, &m]).unwrap();
        check(&s, SUM_TOL);
        check(&m, 0.0);
    }
    // Exact integer sums, and NaN from rows inside a group and in the leftovers.
    let i = ties(&[1500, 2100]).cast(DType::I64) * 1_000_000_007i64;
    check(&i.sum(0), 0.0);
    let mut v: Vec<f32> = (0..333 * 2100).map(|k| (k % 89) as f32).collect();
    v[3] = f32::NAN;
    v[100 * 2100 + 1500] = f32::NAN;
    v[332 * 2100 + 2099] = f32::NAN;
    let x = Tensor::from_vec(v, [333, 2100]);
    check(&x.amax(0), 0.0);
    check(&x.sum(0), SUM_TOL);
    let m = x.amax(0).to_vec::<f32>().unwrap();
    assert!(m[3].is_nan() && m[1500].is_nan() && m[2099].is_nan() && !m[0].is_nan());
}
