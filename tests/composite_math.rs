//! The second family of composites: NaN-aware and paired reductions (`nansum`, `nanmean`,
//! `count_nonzero`, `aminmax`, `var_mean`, `std_mean`), elementwise (`logaddexp`,
//! `hypot`, `lerp`, `nan_to_num`, `isclose`/`allclose`), linear algebra (`outer`, `trace`,
//! `cross`, `addmm`), arrangement (`diff`, `rot90`, `meshgrid`, `repeat_interleave`,
//! `take_along_dim`, `tril_indices`/`triu_indices`) and search (`searchsorted`,
//! `bucketize`, `kthvalue`) and counting (`bincount`, `histc`): PyTorch's documented examples and edge cases by hand, and
//! random inputs against plain loops in f64.

mod common;

use common::Rng;
use kiln::{DType, KilnError, Tensor};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| lo + (hi - lo) * (rng.next() >> 11) as f64 / (1u64 << 53) as f64)
        .collect()
}

#[test]
fn nan_aware_and_paired_reductions() {
    let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 2.0, f32::NAN, f32::NAN, 0.0], [2, 3]);
    assert_eq!(f32s(&x.nansum(1)), vec![3.0, 0.0]);
    assert_eq!(f32s(&x.nansum(..)), vec![3.0]);
    let m = f32s(&x.nanmean(1));
    assert_eq!(m[0], 1.5);
    assert_eq!(m[1], 0.0);
    assert!(f32s(&Tensor::from_vec(vec![f32::NAN; 2], [2]).nanmean(0))[0].is_nan());
    assert_eq!(x.nanmean_keepdim(0).shape(), &[1, 3]);
    // NaN counts as nonzero; -0.0 does not.
    assert_eq!(i64s(&x.count_nonzero(1)), vec![3, 2]);
    let z = Tensor::from_vec(vec![0.0f32, -0.0, 3.0], [3]);
    assert_eq!(i64s(&z.count_nonzero(..)), vec![1]);
    // Integers: nansum is the sum.
    let n = Tensor::from_vec(vec![1i64, 2, 3], [3]);
    assert_eq!(i64s(&n.nansum(0)), vec![6]);
    assert!(matches!(
        n.try_nanmean(0),
        Err(KilnError::UnsupportedDType { .. })
    ));
    // The gradient of nansum is 1 at numbers and 0 at NaNs.
    let g = Tensor::from_vec(vec![1.0f64, f64::NAN, 2.0], [3]).requires_grad_(true);
    g.nanmean(0).backward().unwrap();
    assert_eq!(f64s(&g.grad().unwrap()), vec![0.5, 0.0, 0.5]);
    // Paired reductions.
    let p = Tensor::from_vec(vec![3.0f32, -1.0, 4.0, 1.0, 5.0, 9.0], [2, 3]);
    let (lo, hi) = p.aminmax(1, true);
    assert_eq!(lo.shape(), &[2, 1]);
    assert_eq!((f32s(&lo), f32s(&hi)), (vec![-1.0, 1.0], vec![4.0, 9.0]));
    let (v, mean) = p.var_mean(1, 1, false);
    assert_eq!(f32s(&mean), vec![2.0, 5.0]);
    assert_eq!(f32s(&v), vec![7.0, 16.0]);
    let (s, _) = p.std_mean(.., 0, false);
    let all: Vec<f64> = vec![3.0, -1.0, 4.0, 1.0, 5.0, 9.0];
    let mu = all.iter().sum::<f64>() / 6.0;
    let sd = (all.iter().map(|a| (a - mu) * (a - mu)).sum::<f64>() / 6.0).sqrt();
    assert!((f32s(&s)[0] as f64 - sd).abs() < 1e-6);
}

#[test]
fn elementwise_composites_match_their_definitions() {
    // logaddexp: equal infinities, mixed infinities, NaN, and far-apart values.
    let x = Tensor::from_vec(
        vec![
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NAN,
            800.0,
            -3.0,
        ],
        [6],
    );
    let y = Tensor::from_vec(
        vec![
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
            1.0,
            0.0,
            2.0,
        ],
        [6],
    );
    let z = f64s(&x.logaddexp(&y));
    assert_eq!(&z[..3], &[f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY]);
    assert!(z[3].is_nan());
    assert_eq!(z[4], 800.0);
    assert!((z[5] - ((-3.0f64).exp() + 2.0f64.exp()).ln()).abs() < 1e-15);
    // hypot: overflow- and underflow-free squares, infinities beat NaN, zeros.
    let a = Tensor::from_vec(vec![3e200f64, 3e-200, f64::INFINITY, 0.0, -5.0], [5]);
    let b = Tensor::from_vec(vec![4e200f64, 4e-200, f64::NAN, 0.0, 12.0], [5]);
    let h = f64s(&a.hypot(&b));
    assert!((h[0] / 5e200 - 1.0).abs() < 1e-15);
    assert!((h[1] / 5e-200 - 1.0).abs() < 1e-15);
    assert_eq!(&h[2..], &[f64::INFINITY, 0.0, 13.0]);
    // lerp with a tensor weight: weight 1 gives `end` exactly, from either side.
    let s = Tensor::from_vec(vec![0.1f32, 1e8, -2.0], [3]);
    let e = Tensor::from_vec(vec![0.7f32, 1.0, 6.0], [3]);
    let w = Tensor::from_vec(vec![1.0f32, 1.0, 0.25], [3]);
    assert_eq!(f32s(&s.lerp(&e, &w)), vec![0.7, 1.0, 0.0]);
    // nan_to_num, per dtype defaults.
    let h16 = Tensor::from_vec(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY], [3])
        .cast(DType::F16)
        .nan_to_num(1.0, None, None);
    assert_eq!(f32s(&h16.cast(DType::F32)), vec![1.0, 65504.0, -65504.0]);
    let ints = Tensor::from_vec(vec![1i64, 2], [2]);
    assert_eq!(i64s(&ints.nan_to_num(0.0, None, None)), vec![1, 2]);
    // isclose / allclose: PyTorch's formula, infinities, NaN with equal_nan, integers.
    let p = Tensor::from_vec(vec![10000.0f64, 1e-7, f64::INFINITY, f64::NAN, 1.0], [5]);
    let q = Tensor::from_vec(
        vec![10000.1f64, 1e-8, f64::NEG_INFINITY, f64::NAN, 1.0],
        [5],
    );
    let c = p.isclose(&q, 1e-5, 1e-8, false).to_vec::<bool>().unwrap();
    assert_eq!(c, vec![true, false, false, false, true]);
    let c = p.isclose(&q, 1e-5, 1e-8, true).to_vec::<bool>().unwrap();
    assert!(c[3]);
    let i = Tensor::from_vec(vec![100i64, 7], [2]);
    let j = Tensor::from_vec(vec![101i64, 7], [2]);
    assert_eq!(
        i.isclose(&j, 0.01, 0.0, false).to_vec::<bool>().unwrap(),
        vec![true, true]
    );
    assert!(!i.allclose(&j, 0.0, 0.5, false));
    assert!(p.try_isclose(&q, -1.0, 0.0, false).is_err());
    // Random pairs against the f64 definitions.
    let mut rng = Rng(11);
    let xs = uniform(&mut rng, 200, -30.0, 30.0);
    let ys = uniform(&mut rng, 200, -30.0, 30.0);
    let (xt, yt) = (
        Tensor::from_vec(xs.clone(), [200]),
        Tensor::from_vec(ys.clone(), [200]),
    );
    for ((l, hy), (x, y)) in f64s(&xt.logaddexp(&yt))
        .iter()
        .zip(f64s(&xt.hypot(&yt)))
        .zip(xs.iter().zip(&ys))
    {
        let want = (x.exp() + y.exp()).ln();
        assert!((l - want).abs() <= 1e-14 * want.abs().max(1.0), "{x} {y}");
        assert!((hy - x.hypot(*y)).abs() <= 4e-16 * x.hypot(*y), "{x} {y}");
    }
}

#[test]
fn linear_algebra_composites() {
    let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let w = Tensor::from_vec(vec![4.0f32, 5.0], [2]);
    assert_eq!(f32s(&v.outer(&w)), vec![4.0, 5.0, 8.0, 10.0, 12.0, 15.0]);
    assert!(v.try_outer(&v.reshape([3, 1])).is_err());
    let sq = Tensor::arange(0, 9, 1).reshape([3, 3]);
    assert_eq!(i64s(&sq.trace()), vec![12]);
    assert_eq!(i64s(&sq.t().trace()), vec![12]);
    assert!(v.try_trace().is_err());
    // cross: the right-hand rule, batched along a middle dimension, broadcast.
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 0.0, 1.0, 0.0], [2, 3]);
    let b = Tensor::from_vec(vec![4.0f64, 5.0, 6.0], [1, 3]);
    assert_eq!(f64s(&a.cross(&b, 1)), vec![-3.0, 6.0, -3.0, 6.0, 0.0, -4.0]);
    assert_eq!(
        f64s(&a.t().cross(&b.t(), 0).t()),
        vec![-3.0, 6.0, -3.0, 6.0, 0.0, -4.0]
    );
    assert!(a.try_cross(&b, 0).is_err());
    // Broadcast first: a 1-D operand against dimension 1 of a 2-D one.
    let b1 = Tensor::from_vec(vec![4.0f64, 5.0, 6.0], [3]);
    assert_eq!(f64s(&a.cross(&b1, 1)), f64s(&a.cross(&b, 1)));
    // addmm: beta = 0 ignores NaN in the input, as PyTorch.
    let m1 = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let nan = Tensor::from_vec(vec![f32::NAN, 1.0], [2]);
    assert_eq!(
        f32s(&nan.addmm(&m1, &m1, 0.0, 1.0)),
        vec![7.0, 10.0, 15.0, 22.0]
    );
    assert_eq!(
        f32s(&Tensor::ones([2, 2]).addmm(&m1, &m1, 2.0, 0.5)),
        vec![5.5, 7.0, 9.5, 13.0]
    );
}

#[test]
fn arrangement_composites() {
    // diff: n times, any dimension, bools as !=, past the length.
    let x = Tensor::from_vec(vec![1i64, 3, 2, 10, 20, 40], [2, 3]);
    assert_eq!(i64s(&x.diff(1, 1)), vec![2, -1, 10, 20]);
    assert_eq!(i64s(&x.diff(1, 0)), vec![9, 17, 38]);
    assert_eq!(i64s(&x.diff(2, 1)), vec![-3, 10]);
    assert_eq!(x.diff(5, 1).shape(), &[2, 0]);
    let b = Tensor::from_vec(vec![true, true, false, true], [4]);
    assert_eq!(
        b.diff(1, 0).to_vec::<bool>().unwrap(),
        vec![false, true, true]
    );
    // rot90: four turns are the identity; two are a flip of both.
    let r = Tensor::arange(0, 6, 1).reshape([2, 3]);
    assert_eq!(r.rot90(1, [0, 1]).shape(), &[3, 2]);
    assert_eq!(i64s(&r.rot90(1, [0, 1])), vec![2, 5, 1, 4, 0, 3]);
    assert_eq!(i64s(&r.rot90(2, [0, 1])), vec![5, 4, 3, 2, 1, 0]);
    assert_eq!(i64s(&r.rot90(4, [0, 1])), i64s(&r));
    assert_eq!(i64s(&r.rot90(3, [0, 1])), i64s(&r.rot90(-1, [0, 1])));
    assert_eq!(i64s(&r.rot90(1, [1, 0])), i64s(&r.rot90(-1, [0, 1])));
    assert!(r.try_rot90(1, [1, 1]).is_err());
    // meshgrid: three tensors, a 0-D one, both orders.
    let (p, q, s) = (
        Tensor::from_vec(vec![1i64, 2], [2]),
        Tensor::from_vec(vec![3i64, 4, 5], [3]),
        Tensor::scalar(9i64),
    );
    let g = Tensor::meshgrid(&[&p, &q, &s], "ij");
    assert_eq!(g[1].shape(), &[2, 3, 1]);
    assert_eq!(i64s(&g[1]), vec![3, 4, 5, 3, 4, 5]);
    let g = Tensor::meshgrid(&[&p, &q], "xy");
    assert_eq!(i64s(&g[0]), vec![1, 2, 1, 2, 1, 2]);
    assert_eq!(i64s(&g[1]), vec![3, 3, 4, 4, 5, 5]);
    assert!(Tensor::try_meshgrid(&[&p], "yx").is_err());
    assert!(Tensor::try_meshgrid(&[&r], "ij").is_err());
    // repeat_interleave: scalar and per-element counts, along a dimension.
    let t = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]);
    assert_eq!(
        i64s(&t.repeat_interleave(3, Some(1))),
        vec![1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    );
    let counts = Tensor::from_vec(vec![1i64, 2], [2]);
    assert_eq!(
        i64s(&t.repeat_interleave_by(&counts, Some(0))),
        vec![1, 2, 3, 4, 3, 4]
    );
    assert!(
        t.try_repeat_interleave_by(&Tensor::from_vec(vec![-1i64, 1], [2]), Some(0))
            .is_err()
    );
    assert!(
        t.try_repeat_interleave_by(&Tensor::from_vec(vec![1i64, 1, 1], [3]), Some(0))
            .is_err()
    );
    // take_along_dim broadcasts the other dimensions.
    let v = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], [1, 3]);
    let idx = Tensor::from_vec(vec![2i64, 0], [2, 1]);
    assert_eq!(f32s(&v.take_along_dim(&idx, Some(1))), vec![30.0, 10.0]);
    assert!(
        v.try_take_along_dim(&Tensor::from_vec(vec![0i64], [1]), Some(1))
            .is_err()
    );
    // Triangle indices, with offsets and non-square shapes.
    assert_eq!(
        i64s(&Tensor::tril_indices(3, 2, -1)),
        vec![1, 2, 2, 0, 0, 1]
    );
    assert_eq!(i64s(&Tensor::triu_indices(3, 3, 0)).len(), 12);
    assert_eq!(Tensor::tril_indices(0, 4, 0).shape(), &[2, 0]);
    // unfold: windows along a middle dimension become a new last dimension.
    let u = Tensor::arange(0, 12, 1).reshape([2, 6]).unfold(1, 4, 2);
    assert_eq!(u.shape(), &[2, 2, 4]);
    assert_eq!(
        i64s(&u),
        vec![0, 1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 9, 8, 9, 10, 11]
    );
    let u = Tensor::arange(0, 12, 1).reshape([3, 4]).unfold(0, 2, 1);
    assert_eq!(u.shape(), &[2, 4, 2]);
    assert_eq!(i64s(&u.i((1, 3))), vec![7, 11]);
    assert!(Tensor::zeros([3]).try_unfold(0, 4, 1).is_err());
    assert!(Tensor::zeros([3]).try_unfold(0, 2, 0).is_err());
    // Random: diff and repeat_interleave against loops.
    let mut rng = Rng(5);
    for _ in 0..20 {
        let (n, k) = (1 + rng.below(9), rng.below(4));
        let data: Vec<f64> = uniform(&mut rng, n, -5.0, 5.0);
        let mut want = data.clone();
        for _ in 0..k {
            want = want.windows(2).map(|w| w[1] - w[0]).collect();
        }
        let got = f64s(&Tensor::from_vec(data.clone(), [n]).diff(k, 0));
        assert_eq!(got, want);
        let reps: Vec<i64> = (0..n).map(|_| rng.below(3) as i64).collect();
        let want: Vec<f64> = data
            .iter()
            .zip(&reps)
            .flat_map(|(&d, &r)| std::iter::repeat_n(d, r as usize))
            .collect();
        let got =
            Tensor::from_vec(data, [n]).repeat_interleave_by(&Tensor::from_vec(reps, [n]), None);
        assert_eq!(f64s(&got), want);
    }
}

#[test]
fn searches_and_kthvalue() {
    // PyTorch's searchsorted example: a 2-D sequence, row by row.
    let seq = Tensor::from_vec(vec![1i64, 3, 5, 7, 9, 2, 4, 6, 8, 10], [2, 5]);
    let vals = Tensor::from_vec(vec![3i64, 6, 9, 3, 6, 9], [2, 3]);
    assert_eq!(
        i64s(&seq.searchsorted(&vals, false)),
        vec![1, 3, 4, 1, 2, 4]
    );
    assert_eq!(i64s(&seq.searchsorted(&vals, true)), vec![2, 3, 5, 1, 3, 4]);
    assert!(
        seq.try_searchsorted(&Tensor::from_vec(vec![1i64], [1]), false)
            .is_err()
    );
    // PyTorch's bucketize example.
    let bounds = Tensor::from_vec(vec![1i64, 3, 5, 7, 9], [5]);
    let v = Tensor::from_vec(vec![3i64, 6, 9, 3, 6, 9], [2, 3]);
    assert_eq!(i64s(&v.bucketize(&bounds, false)), vec![1, 3, 4, 1, 3, 4]);
    assert_eq!(i64s(&v.bucketize(&bounds, true)), vec![2, 3, 5, 2, 3, 5]);
    assert!(v.try_bucketize(&seq, false).is_err());
    // Random sorted sequences with repeats against a binary search.
    let mut rng = Rng(17);
    for _ in 0..20 {
        let m = 1 + rng.below(8);
        let mut b: Vec<f64> = (0..m).map(|_| rng.below(6) as f64).collect();
        b.sort_by(f64::total_cmp);
        let q: Vec<f64> = (0..10).map(|_| rng.below(8) as f64 - 1.0).collect();
        let (bt, qt) = (
            Tensor::from_vec(b.clone(), [m]),
            Tensor::from_vec(q.clone(), [10]),
        );
        let left: Vec<i64> = q
            .iter()
            .map(|v| b.partition_point(|x| x < v) as i64)
            .collect();
        let right: Vec<i64> = q
            .iter()
            .map(|v| b.partition_point(|x| x <= v) as i64)
            .collect();
        assert_eq!(i64s(&bt.searchsorted(&qt, false)), left);
        assert_eq!(i64s(&bt.searchsorted(&qt, true)), right);
    }
    // kthvalue: NaN sorts last, ties keep the stable order, keepdim, bounds of k.
    let x = Tensor::from_vec(vec![2.0f32, f32::NAN, 1.0, 2.0], [4]);
    let (v, i) = x.kthvalue(2, 0, false);
    assert_eq!((f32s(&v), i64s(&i)), (vec![2.0], vec![0]));
    let (v, i) = x.kthvalue(3, 0, true);
    assert_eq!((f32s(&v), i64s(&i)), (vec![2.0], vec![3]));
    assert!(f32s(&x.kthvalue(4, 0, false).0)[0].is_nan());
    assert!(x.try_kthvalue(0, 0, false).is_err());
    assert!(x.try_kthvalue(5, 0, false).is_err());
    let w = Tensor::from_vec(vec![5.0f64, 1.0, 3.0], [3]).requires_grad_(true);
    w.kthvalue(2, 0, false).0.backward().unwrap();
    assert_eq!(f64s(&w.grad().unwrap()), vec![0.0, 0.0, 1.0]);
}

/// `cummax`/`cummin` against PyTorch's loop (a later equal value takes the index over; a
/// NaN takes over and stays), over random lanes with ties and NaNs along either
/// dimension; `logcumsumexp` against a running log-sum in f64 (with values far apart).
#[test]
fn running_extremes_and_logcumsumexp() {
    let mut rng = Rng(23);
    for case in 0..30 {
        let (r, n) = (1 + rng.below(3), 1 + rng.below(70));
        let data: Vec<f64> = (0..r * n)
            .map(|_| match rng.below(12) {
                0 if case % 3 == 0 => f64::NAN,
                _ => rng.below(5) as f64,
            })
            .collect();
        let x = Tensor::from_vec(data.clone(), [r, n]);
        for max in [true, false] {
            let (v, i) = if max { x.cummax(1) } else { x.cummin(1) };
            // Along dim 0 of the transpose: the same lanes.
            let (vt, it) = if max {
                x.t().contiguous().cummax(0)
            } else {
                x.t().contiguous().cummin(0)
            };
            let (v, i, vt, it) = (f64s(&v), i64s(&i), f64s(&vt.t()), i64s(&it.t()));
            for row in 0..r {
                let lane = &data[row * n..(row + 1) * n];
                let (mut out, mut at) = (lane[0], 0i64);
                for (j, &e) in lane.iter().enumerate() {
                    let better = if max { e >= out } else { e <= out };
                    if e.is_nan() || (!out.is_nan() && better) {
                        out = e;
                        at = j as i64;
                    }
                    let k = row * n + j;
                    assert!(
                        v[k] == out || (v[k].is_nan() && out.is_nan()),
                        "case {case}"
                    );
                    assert_eq!(i[k], at, "case {case} lane {lane:?}");
                    assert!(vt[k] == out || (vt[k].is_nan() && out.is_nan()));
                    assert_eq!(it[k], at);
                }
            }
        }
        let spread: Vec<f64> = uniform(&mut rng, r * n, -800.0, 800.0);
        let y = f64s(&Tensor::from_vec(spread.clone(), [r, n]).logcumsumexp(-1));
        for row in 0..r {
            let mut acc = f64::NEG_INFINITY;
            for j in 0..n {
                let e = spread[row * n + j];
                let m = acc.max(e);
                acc = m + ((acc - m).exp() + (e - m).exp()).ln();
                let got = y[row * n + j];
                assert!(
                    (got - acc).abs() <= 1e-12 * acc.abs().max(1.0),
                    "{got} vs {acc}"
                );
            }
        }
    }
    // Integers, 0-d input, the gradient, and the errors.
    let (v, i) = Tensor::scalar(2.5f32).cummax(0);
    assert_eq!((f32s(&v), i64s(&i)), (vec![2.5], vec![0]));
    let w = Tensor::from_vec(vec![1.0f64, 3.0, 2.0], [3]).requires_grad_(true);
    w.cummax(0).0.sum(..).backward().unwrap();
    assert_eq!(f64s(&w.grad().unwrap()), vec![1.0, 2.0, 0.0]);
    assert!(Tensor::from_vec(vec![true], [1]).try_cummax(0).is_err());
    assert!(
        Tensor::from_vec(vec![1i64], [1])
            .try_logcumsumexp(0)
            .is_err()
    );
}

/// `kron` against its block definition, and `cdist` against plain loops for several `p`
/// (zero distances included), with batch dimensions broadcast.
#[test]
fn kron_and_cdist() {
    let a = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]);
    let b = Tensor::from_vec(vec![0i64, 5, 6, 7, 1, 1], [2, 3]);
    let k = a.kron(&b);
    assert_eq!(k.shape(), &[4, 6]);
    let (av, bv, kv) = (i64s(&a), i64s(&b), i64s(&k));
    for i in 0..4 {
        for j in 0..6 {
            assert_eq!(
                kv[i * 6 + j],
                av[(i / 2) * 2 + j / 3] * bv[(i % 2) * 3 + j % 3]
            );
        }
    }
    // Different ranks align at the last dimension.
    assert_eq!(
        a.kron(&Tensor::from_vec(vec![1i64, 1], [2])).shape(),
        &[2, 4]
    );
    let mut rng = Rng(31);
    let x1: Vec<f64> = uniform(&mut rng, 2 * 3 * 4, -2.0, 2.0);
    let mut x2: Vec<f64> = uniform(&mut rng, 5 * 4, -2.0, 2.0);
    // Row 0 of x2 equals row 1 of x1's first batch: a zero distance.
    x2[..4].copy_from_slice(&x1[4..8]);
    let (t1, t2) = (
        Tensor::from_vec(x1.clone(), [2, 3, 4]),
        Tensor::from_vec(x2.clone(), [5, 4]),
    );
    for p in [0.0, 0.5, 1.0, 2.0, 3.0, f64::INFINITY] {
        let d = t1.cdist(&t2, p);
        assert_eq!(d.shape(), &[2, 3, 5]);
        let got = f64s(&d);
        for bt in 0..2 {
            for i in 0..3 {
                for j in 0..5 {
                    let diffs: Vec<f64> = (0..4)
                        .map(|c| (x1[bt * 12 + i * 4 + c] - x2[j * 4 + c]).abs())
                        .collect();
                    let want = if p == 0.0 {
                        diffs.iter().filter(|&&v| v != 0.0).count() as f64
                    } else if p.is_infinite() {
                        diffs.iter().cloned().fold(0.0, f64::max)
                    } else {
                        diffs.iter().map(|v| v.powf(p)).sum::<f64>().powf(1.0 / p)
                    };
                    let g = got[bt * 15 + i * 5 + j];
                    assert!(
                        (g - want).abs() <= 1e-12 * want.max(1.0),
                        "p={p}: {g} vs {want}"
                    );
                }
            }
        }
    }
    // The gradient at a zero distance is 0 (finite everywhere), as PyTorch's.
    for p in [0.5, 2.0, 3.0] {
        let l = Tensor::from_vec(x1.clone(), [2, 3, 4]).requires_grad_(true);
        l.cdist(&t2, p).sum(..).backward().unwrap();
        assert!(
            f64s(&l.grad().unwrap()).iter().all(|g| g.is_finite()),
            "p={p}"
        );
    }
    assert!(t1.try_cdist(&Tensor::zeros([5, 3]), 2.0).is_err());
    assert!(t1.try_cdist(&t2, -1.0).is_err());
}

#[test]
fn diff_with_prepend_and_append() {
    let x = Tensor::from_vec(vec![1i64, 4, 9], [3]);
    let (zero, sixteen) = (
        Tensor::from_vec(vec![0i64], [1]),
        Tensor::from_vec(vec![16i64, 25], [2]),
    );
    assert_eq!(
        i64s(&x.diff_with(1, 0, Some(&zero), Some(&sixteen))),
        vec![1, 3, 5, 7, 9]
    );
    assert_eq!(
        i64s(&x.diff_with(2, 0, None, Some(&sixteen))),
        vec![2, 2, 2]
    );
    // n = 0 returns the input and ignores prepend and append, as PyTorch does.
    assert_eq!(i64s(&x.diff_with(0, 0, Some(&zero), None)), vec![1, 4, 9]);
    // Along a dimension of a matrix, with dtypes promoting as cat's do.
    let m = Tensor::from_vec(vec![1.0f32, 2.0, 4.0, 8.0], [2, 2]);
    let col = Tensor::from_vec(vec![0i64, 1], [2, 1]);
    let d = m.diff_with(1, 1, Some(&col), None);
    assert_eq!(d.dtype(), DType::F32);
    assert_eq!(f32s(&d), vec![1.0, 1.0, 3.0, 4.0]);
    // prepend must have the input's number of dimensions and sizes off the dimension.
    let e = m.try_diff_with(1, 1, Some(&zero), None).unwrap_err();
    assert!(matches!(e, KilnError::ShapeMismatch { .. }), "{e}");
    assert!(
        m.try_diff_with(1, 1, Some(&Tensor::zeros([3, 1])), None)
            .is_err()
    );
}

#[test]
fn bincount_counts_and_sums_weights() {
    // PyTorch's documented example.
    let x = Tensor::from_vec(vec![4i64, 3, 6, 3, 4], [5]);
    let counts = x.bincount(None, 0);
    assert_eq!(counts.dtype(), DType::I64);
    assert_eq!(i64s(&counts), vec![0, 0, 0, 2, 2, 0, 1]);
    let w = Tensor::linspace(0.0, 1.0, 5, DType::F32);
    let sums = x.bincount(Some(&w), 0);
    assert_eq!(sums.dtype(), DType::F32);
    assert_eq!(f32s(&sums), vec![0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5]);
    // minlength pads; other weights sum in f64; an empty input gives i64 zeros.
    assert_eq!(i64s(&x.bincount(None, 9)), vec![0, 0, 0, 2, 2, 0, 1, 0, 0]);
    let iw = Tensor::from_vec(vec![1i32, 2, 3, 4, 5], [5]);
    let s = x.bincount(Some(&iw), 0);
    assert_eq!(s.dtype(), DType::F64);
    assert_eq!(f64s(&s), vec![0.0, 0.0, 0.0, 6.0, 6.0, 0.0, 3.0]);
    let empty = Tensor::from_vec(Vec::<i64>::new(), [0]);
    let z = empty.bincount(Some(&Tensor::zeros([0])), 3);
    assert_eq!((z.dtype(), i64s(&z)), (DType::I64, vec![0, 0, 0]));
    // Random inputs against a plain loop, with a lazy (unrealized) input.
    let mut rng = Rng(0xB1C0);
    for case in 0..20 {
        let n = 1 + rng.below(200);
        let vals: Vec<i64> = (0..n).map(|_| rng.below(30) as i64).collect();
        let wts = uniform(&mut rng, n, -1.0, 1.0);
        let minlength = rng.below(40);
        let t = Tensor::from_vec(vals.iter().map(|&v| v as i32).collect::<Vec<_>>(), [n]).add(0i32);
        let len = (*vals.iter().max().unwrap() as usize + 1).max(minlength);
        let (mut want_c, mut want_s) = (vec![0i64; len], vec![0.0f64; len]);
        for (&v, &w) in vals.iter().zip(&wts) {
            want_c[v as usize] += 1;
            want_s[v as usize] += w;
        }
        assert_eq!(i64s(&t.bincount(None, minlength)), want_c, "case {case}");
        let got = f64s(&t.bincount(Some(&Tensor::from_vec(wts, [n])), minlength));
        for (g, w) in got.iter().zip(&want_s) {
            assert!((g - w).abs() < 1e-12, "case {case}: {g} vs {w}");
        }
    }
    // Errors: a negative value (when called), a 2-d, float or bool input, and weights of
    // another length.
    let e = Tensor::from_vec(vec![1i64, -2], [2])
        .try_bincount(None, 0)
        .unwrap_err();
    assert!(e.to_string().contains("non-negative"), "{e}");
    assert!(
        Tensor::zeros_dtype([2, 2], DType::I64)
            .try_bincount(None, 0)
            .is_err()
    );
    let e = Tensor::zeros([3]).try_bincount(None, 0).unwrap_err();
    assert!(matches!(e, KilnError::UnsupportedDType { .. }), "{e}");
    assert!(
        Tensor::scalar(true)
            .reshape([1])
            .try_bincount(None, 0)
            .is_err()
    );
    let e = x.try_bincount(Some(&Tensor::zeros([4])), 0).unwrap_err();
    assert!(matches!(e, KilnError::ShapeMismatch { .. }), "{e}");
}

/// PyTorch's `linspace` in f32 (`start + i·step` in the first half, `end - (n-1-i)·step`
/// in the second, the multiply and add rounded once).
fn edges_f32(lo: f32, hi: f32, n: usize) -> Vec<f32> {
    let step = (hi - lo) / (n - 1) as f32;
    (0..n)
        .map(|i| {
            if i < n / 2 {
                (lo as f64 + step as f64 * i as f64) as f32
            } else {
                (hi as f64 - step as f64 * (n - 1 - i) as f64) as f32
            }
        })
        .collect()
}

#[test]
fn histc_bins_like_pytorch() {
    // PyTorch's documented example.
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 1.0], [3]);
    assert_eq!(f32s(&x.histc(4, 0.0, 3.0)), vec![0.0, 2.0, 1.0, 0.0]);
    // Outside the range and NaN are not counted; the last bin includes max; 0.7 (rounded
    // to f32, just below 0.7) lands in bin 7, as `(0.7f32 - 0)·10 / 1` rounds to 7.
    let y = Tensor::from_vec(vec![-0.5f32, 0.0, 0.3, 0.7, 1.0, 1.5, f32::NAN], [7]);
    assert_eq!(
        f32s(&y.histc(10, 0.0, 1.0)),
        vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    );
    // min == max: the data's own range; a single value is widened by 1 each side.
    let z = Tensor::from_vec(vec![2.0f64, 4.0, 3.0, 4.0], [2, 2]);
    assert_eq!(f64s(&z.histc(2, 0.0, 0.0)), vec![1.0, 3.0]);
    let one = Tensor::from_vec(vec![5.0f32, 5.0], [2]);
    assert_eq!(f32s(&one.histc(4, 0.0, 0.0)), vec![0.0, 0.0, 2.0, 0.0]);
    assert_eq!(f32s(&Tensor::zeros([0]).histc(3, 0.0, 0.0)), vec![0.0; 3]);
    // Random values, many on edges, against PyTorch's edges and rule.
    let mut rng = Rng(0x415C);
    for case in 0..30 {
        let bins = 1 + rng.below(40);
        let (lo, hi) = (
            -(rng.below(5) as f32) - 0.25,
            1.0 + rng.below(7) as f32 / 3.0,
        );
        let edges = edges_f32(lo, hi, bins + 1);
        let n = 1 + rng.below(300);
        let vals: Vec<f32> = uniform(&mut rng, n, lo as f64 - 0.5, hi as f64 + 0.5)
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                if i % 3 == 0 {
                    edges[i % (bins + 1)]
                } else {
                    v as f32
                }
            })
            .collect();
        // PyTorch's histc: `trunc((v - e₀)·bins / (e_last - e₀))` in f32, no search among
        // the edges (PyTorch's `histogram` adds that search; tests/histogram.rs).
        let mut want = vec![0.0f32; bins];
        for &v in &vals {
            if v >= edges[0] && v <= edges[bins] {
                let b = ((v - edges[0]) * bins as f32 / (edges[bins] - edges[0])) as usize;
                want[b.min(bins - 1)] += 1.0;
            }
        }
        let got = Tensor::from_vec(vals, [n]).histc(bins, lo as f64, hi as f64);
        assert_eq!(
            f32s(&got),
            want,
            "case {case}: {bins} bins over [{lo}, {hi}]"
        );
    }
    // Half precision counts in f32 and returns its own dtype.
    let h = x.cast(DType::BF16).histc(4, 0.0, 3.0);
    assert_eq!(
        (h.dtype(), f32s(&h.cast(DType::F32))),
        (DType::BF16, vec![0.0, 2.0, 1.0, 0.0])
    );
    // Errors, as PyTorch raises them.
    let e = Tensor::from_vec(vec![0.0f32, f32::NAN], [2])
        .try_histc(3, 0.0, 0.0)
        .unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");
    let e = Tensor::from_vec(vec![0.0f32, f32::INFINITY], [2])
        .try_histc(3, 0.0, 0.0)
        .unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");
    let e = x.try_histc(3, 2.0, 1.0).unwrap_err();
    assert!(e.to_string().contains("max must be larger than min"), "{e}");
    assert!(x.try_histc(0, 0.0, 1.0).is_err());
    let e = Tensor::from_vec(vec![1i64], [1])
        .try_histc(3, 0.0, 1.0)
        .unwrap_err();
    assert!(matches!(e, KilnError::UnsupportedDType { .. }), "{e}");
}
