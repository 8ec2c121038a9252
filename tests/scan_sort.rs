//! Scans (`cumsum`, `cumprod`) and sorts (`argsort`, `sort`, `topk`, `max_dim`, `min_dim`)
//! against values PyTorch 2.x prints for the same calls (noted beside each), including its
//! edge cases: NaN order, stable ties, signed zeros, integer promotion and wrapping, 0-d and
//! empty tensors, and inputs read through views.

use kiln::{DType, KilnError, Tensor, reference};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

/// Bit-level equality for floats (NaN equal to NaN, -0.0 distinct from 0.0).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Kiln and the reference evaluator agree exactly.
fn agrees_with_reference(t: &Tensor) {
    let want = reference::evaluate(t).unwrap().to_f64();
    let got: Vec<f64> = t.cast(DType::F64).to_vec::<f64>().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(g == w || (g.is_nan() && w.is_nan()), "{got:?} vs {want:?}");
    }
}

#[test]
fn cumsum_and_cumprod_values_and_dtypes() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    assert_eq!(f32s(&x.cumsum(1)), vec![1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    assert_eq!(f32s(&x.cumsum(-2)), vec![1.0, 2.0, 3.0, 5.0, 7.0, 9.0]);
    assert_eq!(f32s(&x.cumprod(1)), vec![1.0, 2.0, 6.0, 4.0, 20.0, 120.0]);
    // torch.cumsum(tensor([True, False, True]), 0) -> int64 [1, 1, 2]
    let b = Tensor::from_vec(vec![true, false, true], [3]).cumsum(0);
    assert_eq!(b.dtype(), DType::I64);
    assert_eq!(i64s(&b), vec![1, 1, 2]);
    // uint8 [100, 100, 100] -> int64 [100, 200, 300] (no u8 wrap)
    let u = Tensor::from_vec(vec![100u8, 100, 100], [3]).cumsum(0);
    assert_eq!((u.dtype(), i64s(&u)), (DType::I64, vec![100, 200, 300]));
    // int64 sums wrap: [2^62]*3 -> [2^62, -2^63, -2^62]
    let w = Tensor::from_vec(vec![1i64 << 62; 3], [3]).cumsum(0);
    assert_eq!(i64s(&w), vec![1 << 62, i64::MIN, -(1 << 62)]);
    // f32 accumulates in f64: [1e8, 1, -1e8, 1] -> [1e8, 1e8, 1, 2]
    let c = Tensor::from_vec(vec![1e8f32, 1.0, -1e8, 1.0], [4]).cumsum(0);
    assert_eq!(f32s(&c), vec![1e8, 1e8, 1.0, 2.0]);
    // cumprod with zeros: [2, 0, 3, 0, 5] -> [2, 0, 0, 0, 0]
    let z = Tensor::from_vec(vec![2.0f32, 0.0, 3.0, 0.0, 5.0], [5]).cumprod(0);
    assert_eq!(f32s(&z), vec![2.0, 0.0, 0.0, 0.0, 0.0]);
    // NaN propagates from its position on.
    let n = Tensor::from_vec(vec![1.0f32, f32::NAN, 1.0], [3]).cumsum(0);
    assert!(same_bits(&f32s(&n)[..1], &[1.0]) && f32s(&n)[1..].iter().all(|v| v.is_nan()));
    // Half types keep their dtype.
    let h = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3])
        .cast(DType::F16)
        .cumsum(0);
    assert_eq!(
        (h.dtype(), f32s(&h.cast(DType::F32))),
        (DType::F16, vec![1.0, 3.0, 6.0])
    );
}

#[test]
fn scans_of_0d_empty_and_viewed_inputs() {
    // torch.cumsum(tensor(5.), 0) and (.., -1) -> tensor(5.)
    let s = Tensor::scalar(5.0f32);
    assert_eq!(
        (
            s.cumsum(0).shape().to_vec(),
            s.cumsum(-1).item::<f32>().unwrap()
        ),
        (vec![], 5.0)
    );
    assert!(matches!(
        s.try_cumsum(1),
        Err(KilnError::InvalidAxis { .. })
    ));
    let e = Tensor::zeros([0, 3]);
    assert_eq!(e.cumsum(0).shape(), &[0, 3]);
    assert_eq!(e.cumprod(1).to_vec::<f32>().unwrap(), Vec::<f32>::new());
    // Transposed, flipped, expanded and padded inputs: read through their views.
    let x = Tensor::arange(1.0, 7.0, 1.0).reshape([2, 3]);
    assert_eq!(f32s(&x.t().cumsum(1)), vec![1.0, 5.0, 2.0, 7.0, 3.0, 9.0]);
    assert_eq!(
        f32s(&x.flip([1]).cumsum(1)),
        vec![3.0, 5.0, 6.0, 6.0, 11.0, 15.0]
    );
    let row = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2]).expand([3, 2]);
    assert_eq!(f32s(&row.cumsum(0)), vec![1.0, 2.0, 2.0, 4.0, 3.0, 6.0]);
    let padded = Tensor::from_vec(vec![1.0f32, 2.0], [2]).pad(&[(1, 1)], 10.0);
    assert_eq!(f32s(&padded.cumsum(0)), vec![10.0, 11.0, 13.0, 23.0]);
    for t in [
        x.t().cumsum(1),
        padded.cumprod(0),
        row.cumsum(0),
        (x * 2.0 + 1.0).cumsum(0),
    ] {
        agrees_with_reference(&t);
    }
}

#[test]
fn argsort_orders_nan_last_and_keeps_ties_stable() {
    let x = Tensor::from_vec(vec![3.0f32, f32::NAN, 1.0, 3.0, -0.0, 0.0], [6]);
    assert_eq!(i64s(&x.argsort(0, false)), vec![4, 5, 2, 0, 3, 1]);
    assert_eq!(i64s(&x.argsort(0, true)), vec![1, 0, 3, 2, 4, 5]);
    // torch.argsort(tensor([0.0, -0.0, 0.0]), stable=True, descending=True) -> [0, 1, 2]
    let z = Tensor::from_vec(vec![0.0f32, -0.0, 0.0], [3]);
    assert_eq!(i64s(&z.argsort(0, true)), vec![0, 1, 2]);
    // torch.sort([[3, nan, 1], [-inf, 2, inf]], dim=1, descending=True, stable=True)
    let m = Tensor::from_vec(
        vec![3.0f32, f32::NAN, 1.0, f32::NEG_INFINITY, 2.0, f32::INFINITY],
        [2, 3],
    );
    let (v, i) = m.sort(1, true);
    assert!(same_bits(
        &f32s(&v),
        &[f32::NAN, 3.0, 1.0, f32::INFINITY, 2.0, f32::NEG_INFINITY]
    ));
    assert_eq!(i64s(&i), vec![1, 0, 2, 2, 1, 0]);
    // Along dim 0 of a transposed view.
    let (v, i) = m.t().sort(0, false);
    assert_eq!(i64s(&i), vec![2, 0, 0, 1, 1, 2]);
    agrees_with_reference(&v);
    // int64 beyond 2^53 sorts exactly: [2^60+1, 2^60, -5] -> [-5, 2^60, 2^60+1], [2, 1, 0]
    let big = Tensor::from_vec(vec![(1i64 << 60) + 1, 1 << 60, -5], [3]);
    let (v, i) = big.sort(0, false);
    assert_eq!(
        (i64s(&v), i64s(&i)),
        (vec![-5, 1 << 60, (1 << 60) + 1], vec![2, 1, 0])
    );
    // torch.sort(tensor([True, False, True]), stable=True) -> [False, True, True], [1, 0, 2]
    let b = Tensor::from_vec(vec![true, false, true], [3]);
    let (v, i) = b.sort(0, false);
    assert_eq!(
        (v.to_vec::<bool>().unwrap(), i64s(&i)),
        (vec![false, true, true], vec![1, 0, 2])
    );
    assert_eq!(v.dtype(), DType::Bool);
    // 0-d: index 0; empty lanes: empty.
    assert_eq!(
        Tensor::scalar(2.5f32)
            .argsort(0, false)
            .item::<i64>()
            .unwrap(),
        0
    );
    assert_eq!(Tensor::zeros([2, 0]).argsort(1, false).shape(), &[2, 0]);
    for t in [
        x.argsort(0, false),
        m.argsort(1, true),
        big.argsort(0, true),
    ] {
        agrees_with_reference(&t);
    }
}

#[test]
fn sort_of_a_long_lane_matches_a_stable_sort() {
    // 3 lanes of 5000 values with many ties and some NaN, sorted along the middle axis.
    let n = 5000;
    let vals: Vec<f32> = (0..3 * n)
        .map(|i| {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            if h.is_multiple_of(97) {
                f32::NAN
            } else {
                (h % 50) as f32 - 25.0
            }
        })
        .collect();
    let x = Tensor::from_vec(vals.clone(), [3, n]).t().contiguous().t();
    let got = i64s(&x.argsort(1, false));
    for lane in 0..3 {
        let row = &vals[lane * n..(lane + 1) * n];
        let mut want: Vec<usize> = (0..n).collect();
        want.sort_by(|&a, &b| {
            let (x, y) = (row[a], row[b]);
            match (x.is_nan(), y.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                _ => x.partial_cmp(&y).unwrap(),
            }
        });
        let want: Vec<i64> = want.into_iter().map(|i| i as i64).collect();
        assert_eq!(&got[lane * n..(lane + 1) * n], &want[..], "lane {lane}");
    }
}

#[test]
fn topk_values_and_indices() {
    let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 5.0], [4]);
    let (v, i) = x.topk(2, -1, true);
    assert_eq!((f32s(&v), i64s(&i)), (vec![5.0, 5.0], vec![1, 3]));
    let (v, i) = x.topk(3, 0, false);
    assert_eq!((f32s(&v), i64s(&i)), (vec![1.0, 3.0, 5.0], vec![0, 2, 1]));
    // torch.topk(tensor([1, nan, 3]), 2) -> [nan, 3], [1, 2]; largest=False -> [1, 3], [0, 2]
    let n = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0], [3]);
    let (v, i) = n.topk(2, 0, true);
    assert!(same_bits(&f32s(&v), &[f32::NAN, 3.0]));
    assert_eq!(i64s(&i), vec![1, 2]);
    let (v, i) = n.topk(2, 0, false);
    assert_eq!((f32s(&v), i64s(&i)), (vec![1.0, 3.0], vec![0, 2]));
    // k = 0 gives empty results of shape [1, 0]; k above the size is an error naming topk.
    let r = Tensor::from_vec(vec![1i64, 5, 5, 2], [1, 4]);
    let (v, i) = r.topk(0, 1, true);
    assert_eq!(
        (v.shape(), i.shape(), v.dtype()),
        (&[1, 0][..], &[1, 0][..], DType::I64)
    );
    let e = r.try_topk(5, 1, true).unwrap_err();
    assert!(
        matches!(e, KilnError::InvalidArgument { op: "topk", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("[1, 4]"), "{e}");
    // Rows of a matrix, through a transposed view: [[4, 3, 9], [1, 2, 0]].
    let m = Tensor::from_vec(vec![4.0f32, 1.0, 3.0, 2.0, 9.0, 0.0], [3, 2]).t();
    let (v, i) = m.topk(2, 1, true);
    assert_eq!(
        (f32s(&v), i64s(&i)),
        (vec![9.0, 4.0, 2.0, 1.0], vec![2, 0, 1, 0])
    );
}

#[test]
fn max_dim_and_min_dim_return_values_and_first_indices() {
    // torch.max([[3, 1, 3], [2, 2, 0]], 1) -> values [3, 2], indices [0, 0]
    let y = Tensor::from_vec(vec![3.0f32, 1.0, 3.0, 2.0, 2.0, 0.0], [2, 3]);
    let (v, i) = y.max_dim(1, false);
    assert_eq!((f32s(&v), i64s(&i)), (vec![3.0, 2.0], vec![0, 0]));
    // torch.min(y, 0) -> values [2, 1, 0], indices [1, 0, 1]
    let (v, i) = y.min_dim(0, false);
    assert_eq!((f32s(&v), i64s(&i)), (vec![2.0, 1.0, 0.0], vec![1, 0, 1]));
    let (v, i) = y.max_dim(-1, true);
    assert_eq!((v.shape(), i.shape()), (&[2, 1][..], &[2, 1][..]));
    // NaN wins both: torch.max / torch.min of [1, nan, 0, nan] -> (nan, 1)
    let n = Tensor::from_vec(vec![1.0f32, f32::NAN, 0.0, f32::NAN], [4]);
    for (v, i) in [n.max_dim(0, false), n.min_dim(0, false)] {
        assert!(v.item::<f32>().unwrap().is_nan());
        assert_eq!(i.item::<i64>().unwrap(), 1);
    }
    // Integers keep their dtype.
    let (v, i) = Tensor::from_vec(vec![7i32, -2, 7], [3]).max_dim(0, false);
    assert_eq!(
        (
            v.dtype(),
            v.item::<i32>().unwrap(),
            i.item::<i64>().unwrap()
        ),
        (DType::I32, 7, 0)
    );
}

#[test]
fn scans_and_sorts_replay_from_the_plan_cache() {
    // Same structure, new data: the second realize reuses the plan.
    let run = |seed: u64| {
        let x = Tensor::rand_seeded([4, 16], seed);
        let (v, _) = x.sort(1, true);
        (x.cumsum(1) + v).to_vec::<f32>().unwrap()
    };
    let a = run(1);
    let b = run(2);
    assert_ne!(a, b);
    let x = Tensor::rand_seeded([4, 16], 2);
    let (v, _) = x.sort(1, true);
    assert_eq!((x.cumsum(1) + v).to_vec::<f32>().unwrap(), b);
}

#[test]
fn median_matches_pytorch_including_nan_lanes_and_edge_cases() {
    let nan = f32::NAN;
    // PyTorch 2.15: x.median(dim=1) -> values [nan, 2.], indices [1, 3].
    let x = Tensor::from_vec(
        vec![3.0f32, nan, 1.0, nan, 2.0, 4.0, 1.0, 1.0, 2.0, 4.0],
        [2, 5],
    );
    let (v, i) = x.median_dim(1, false);
    assert!(same_bits(&f32s(&v), &[nan, 2.0]));
    assert_eq!(i64s(&i), vec![1, 3]);
    let (vk, ik) = x.median_dim(-1, true);
    assert_eq!(vk.shape(), &[2, 1]);
    assert_eq!(ik.shape(), &[2, 1]);
    // x.median() -> nan; tensor([1., 2., 3., 4.]).median() -> 2. (the lower median).
    assert!(x.median().item::<f32>().unwrap().is_nan());
    let even = Tensor::from_vec(vec![4.0f32, 1.0, 3.0, 2.0], [4]);
    assert_eq!(even.median().item::<f32>().unwrap(), 2.0);
    assert_eq!(even.median().shape(), &[] as &[usize]);
    // Integers: tensor([[1, 5, 2], [3, 3, 9]]).median(1) -> values [2, 3].
    let ints = Tensor::from_vec(vec![1i64, 5, 2, 3, 3, 9], [2, 3]);
    let (v, i) = ints.median_dim(1, false);
    assert_eq!(v.to_vec::<i64>().unwrap(), vec![2, 3]);
    // The tied 3s: a stable sort puts index 1 in the middle, PyTorch's index too.
    assert_eq!(i64s(&i), vec![2, 1]);
    // tensor([5., 1., 5., 1.]).median(0) -> (1., index 3).
    let (v, i) = Tensor::from_vec(vec![5.0f32, 1.0, 5.0, 1.0], [4]).median_dim(0, false);
    assert_eq!(
        (v.item::<f32>().unwrap(), i.item::<i64>().unwrap()),
        (1.0, 3)
    );
    // tensor([]).median() -> nan; a dimension of size 0 is refused.
    assert!(Tensor::zeros([0]).median().item::<f32>().unwrap().is_nan());
    assert!(matches!(
        Tensor::zeros([2, 0]).try_median_dim(1, false),
        Err(KilnError::InvalidArgument { op: "median", .. })
    ));
    // Through a transposed view, against the reference evaluator.
    let y = Tensor::from_vec(
        (0..24).map(|k| ((k * 7) % 11) as f32).collect::<Vec<_>>(),
        [4, 6],
    );
    let (v, i) = y.t().median_dim(1, false);
    agrees_with_reference(&v);
    agrees_with_reference(&i.cast(DType::F64));
}

#[test]
fn quantile_matches_pytorch_for_every_interpolation() {
    use kiln::QuantileInterpolation as Q;
    let y = Tensor::from_vec(
        vec![0.0f32, 1.0, 2.0, 3.0, 10.0, 5.0, f32::NAN, 1.0, 2.0, 3.0],
        [2, 5],
    );
    let qs = [0.0, 0.25, 0.375, 0.5, 0.875, 1.0];
    // PyTorch: torch.quantile(y, tensor(qs), dim=1, keepdim=True, interpolation=m); the
    // second row holds a NaN, so all its quantiles are NaN.
    let want: [(Q, [f32; 6]); 5] = [
        (Q::Linear, [0.0, 1.0, 1.5, 2.0, 6.5, 10.0]),
        (Q::Lower, [0.0, 1.0, 1.0, 2.0, 3.0, 10.0]),
        (Q::Higher, [0.0, 1.0, 2.0, 2.0, 10.0, 10.0]),
        (Q::Nearest, [0.0, 1.0, 2.0, 2.0, 10.0, 10.0]),
        (Q::Midpoint, [0.0, 1.0, 1.5, 2.0, 6.5, 10.0]),
    ];
    for (mode, row0) in want {
        let out = y.quantiles(&qs, Some(1), true, mode);
        assert_eq!(out.shape(), &[6, 2, 1], "{mode:?}");
        let v = f32s(&out);
        for (k, &w) in row0.iter().enumerate() {
            assert_eq!(v[2 * k], w, "{mode:?} q = {}", qs[k]);
            assert!(v[2 * k + 1].is_nan(), "{mode:?}: a NaN lane gives NaN");
        }
    }
    // torch.quantile(y[0], 0.3) -> 1.2 (0-d); nearest rounds the rank half to even:
    // [1, 2, 3, 4] at 0.5 -> 3, [1..6] at 0.5 -> 3, [1, 2, 3] at 0.25 -> 1 and 0.75 -> 3.
    let row = y.slice(&[(0, 1, 1)]).reshape([5]);
    let q = row.quantile(0.3, None, false, Q::Linear);
    assert_eq!(q.shape(), &[] as &[usize]);
    assert!((q.item::<f32>().unwrap() - 1.2).abs() < 1e-6);
    let ramp = |n: usize| Tensor::from_vec((1..=n).map(|k| k as f32).collect::<Vec<_>>(), [n]);
    let nearest = |t: &Tensor, q: f64| {
        t.quantile(q, None, false, Q::Nearest)
            .item::<f32>()
            .unwrap()
    };
    assert_eq!(nearest(&ramp(4), 0.5), 3.0);
    assert_eq!(nearest(&ramp(6), 0.5), 3.0);
    assert_eq!(nearest(&ramp(3), 0.25), 1.0);
    assert_eq!(nearest(&ramp(3), 0.75), 3.0);
    // Without dim, keepdim keeps every dimension as 1.
    assert_eq!(
        y.quantiles(&[0.5], None, true, Q::Linear).shape(),
        &[1, 1, 1]
    );
    // PyTorch's refusals: integer input, q outside [0, 1], an empty input.
    let e = ramp(3)
        .cast(DType::I64)
        .try_quantile(0.5, None, false, Q::Linear);
    assert!(matches!(
        e,
        Err(KilnError::UnsupportedDType { op: "quantile", .. })
    ));
    let e = ramp(3)
        .try_quantile(1.5, None, false, Q::Linear)
        .unwrap_err();
    assert!(e.to_string().contains("[0, 1]"), "{e}");
    assert!(
        Tensor::zeros([0])
            .try_quantile(0.5, None, false, Q::Linear)
            .is_err()
    );
}

#[test]
fn nanmedian_and_nanquantile_match_pytorch() {
    use kiln::QuantileInterpolation as Q;
    let nan = f32::NAN;
    let x = Tensor::from_vec(
        vec![
            3.0f32, nan, 1.0, 4.0, nan, nan, nan, nan, 2.0, 5.0, nan, nan, 1.0, 1.0, 1.0, 2.0,
        ],
        [4, 4],
    );
    // PyTorch 2.15: torch.nanmedian(x, dim=1) -> values [3, nan, 2, 1], indices
    // [0, 2, 0, 1] (for the lane of NaNs PyTorch's index is its own choice; kiln gives 0).
    let (v, i) = x.nanmedian_dim(1, false);
    let v = f32s(&v);
    assert_eq!((v[0], v[2], v[3]), (3.0, 2.0, 1.0));
    assert!(v[1].is_nan());
    let i = i.to_vec::<i64>().unwrap();
    assert_eq!((i[0], i[2], i[3]), (0, 0, 1));
    assert!(x.isnan().to_vec::<u8>().unwrap()[4 + i[1] as usize] == 1);
    // torch.nanmedian(x) -> 2; of NaNs only -> nan; integers -> the median
    // (torch.nanmedian(tensor([[1, 5, 2]]), dim=1) -> (2, index 2)).
    assert_eq!(x.nanmedian().item::<f32>().unwrap(), 2.0);
    assert!(
        Tensor::from_vec(vec![nan, nan], [2])
            .nanmedian()
            .item::<f32>()
            .unwrap()
            .is_nan()
    );
    let (iv, ii) = Tensor::from_vec(vec![1i64, 5, 2], [1, 3]).nanmedian_dim(1, false);
    assert_eq!(
        (iv.to_vec::<i64>().unwrap(), ii.to_vec::<i64>().unwrap()),
        (vec![2], vec![2])
    );
    // torch.nanquantile(x, tensor([0, 0.3, 0.5, 1]), dim=1, interpolation=m).
    let qs = [0.0, 0.3, 0.5, 1.0];
    let want: [(Q, [[f32; 4]; 4]); 5] = [
        (
            Q::Linear,
            [
                [1.0, nan, 2.0, 1.0],
                [2.2, nan, 2.9, 1.0],
                [3.0, nan, 3.5, 1.0],
                [4.0, nan, 5.0, 2.0],
            ],
        ),
        (
            Q::Lower,
            [
                [1.0, nan, 2.0, 1.0],
                [1.0, nan, 2.0, 1.0],
                [3.0, nan, 2.0, 1.0],
                [4.0, nan, 5.0, 2.0],
            ],
        ),
        (
            Q::Higher,
            [
                [1.0, nan, 2.0, 1.0],
                [3.0, nan, 5.0, 1.0],
                [3.0, nan, 5.0, 1.0],
                [4.0, nan, 5.0, 2.0],
            ],
        ),
        (
            Q::Nearest,
            [
                [1.0, nan, 2.0, 1.0],
                [3.0, nan, 2.0, 1.0],
                [3.0, nan, 2.0, 1.0],
                [4.0, nan, 5.0, 2.0],
            ],
        ),
        (
            Q::Midpoint,
            [
                [1.0, nan, 2.0, 1.0],
                [2.0, nan, 3.5, 1.0],
                [3.0, nan, 3.5, 1.0],
                [4.0, nan, 5.0, 2.0],
            ],
        ),
    ];
    for (mode, rows) in want {
        let out = x.nanquantiles(&qs, Some(1), false, mode);
        assert_eq!(out.shape(), &[4, 4], "{mode:?}");
        let got = f32s(&out);
        for (k, row) in rows.iter().enumerate() {
            for (j, &w) in row.iter().enumerate() {
                let g = got[4 * k + j];
                assert!(
                    (w.is_nan() && g.is_nan()) || (g - w).abs() <= 1e-6 * w.abs(),
                    "{mode:?} q = {}: lane {j} gives {g}, want {w}",
                    qs[k]
                );
            }
        }
    }
    // torch.nanquantile(tensor([1, 2, nan, 7]), 0.4) -> 1.8; with keepdim over all.
    let t = Tensor::from_vec(vec![1.0f32, 2.0, nan, 7.0], [4]);
    let q = t.nanquantile(0.4, None, false, Q::Linear);
    assert_eq!(q.shape(), &[] as &[usize]);
    assert!((q.item::<f32>().unwrap() - 1.8).abs() < 1e-6);
    assert_eq!(t.nanquantile(0.4, None, true, Q::Linear).shape(), &[1]);
    // PyTorch's lerp at infinities: torch.nanquantile(tensor([[nan, 1, inf]]),
    // tensor([0, 0.5, 1]), dim=1) -> [1, nan, nan]; torch.quantile(tensor([1, inf]), q)
    // -> 1 at q = 0, nan at 1 (linear) and 0.5 (midpoint), inf at 1 (higher).
    let inf = f32::INFINITY;
    let got = f32s(&Tensor::from_vec(vec![nan, 1.0, inf], [1, 3]).nanquantiles(
        &[0.0, 0.5, 1.0],
        Some(1),
        false,
        Q::Linear,
    ));
    assert!(
        got[0] == 1.0 && got[1].is_nan() && got[2].is_nan(),
        "{got:?}"
    );
    let pair = Tensor::from_vec(vec![1.0f32, inf], [2]);
    let one = |q: f64, m: Q| pair.quantile(q, None, false, m).item::<f32>().unwrap();
    assert_eq!(one(0.0, Q::Linear), 1.0);
    assert!(one(1.0, Q::Linear).is_nan() && one(0.5, Q::Midpoint).is_nan());
    assert_eq!(one(1.0, Q::Higher), inf);
    // Gradients (PyTorch): z = [3, nan, 2, 5, nan, 1]; nanquantile(z, 0.4) ->
    // [0.2, 0, 0.8, 0, 0, 0]; nanmedian(z) -> [0, 0, 1, 0, 0, 0].
    let z = Tensor::from_vec(vec![3.0f32, nan, 2.0, 5.0, nan, 1.0], [6]).requires_grad_(true);
    z.realize().unwrap();
    z.nanquantile(0.4, None, false, Q::Linear)
        .backward()
        .unwrap();
    let g = f32s(&z.grad().unwrap());
    let want = [0.2f32, 0.0, 0.8, 0.0, 0.0, 0.0];
    assert!(
        g.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
        "{g:?}"
    );
    z.zero_grad();
    z.nanmedian().backward().unwrap();
    assert_eq!(f32s(&z.grad().unwrap()), vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    // Refusals as quantile's: integer input, q outside [0, 1].
    assert!(matches!(
        Tensor::from_vec(vec![1i64, 2], [2]).try_nanquantile(0.5, None, false, Q::Linear),
        Err(KilnError::UnsupportedDType {
            op: "nanquantile",
            ..
        })
    ));
    assert!(t.try_nanquantile(-0.1, None, false, Q::Linear).is_err());
}

#[test]
fn median_and_quantile_gradients_reach_the_chosen_elements() {
    // PyTorch: z = [3, 1, 2, 5]; z.median().backward() -> [0, 0, 1, 0];
    // torch.quantile(z, 0.4).backward() -> [0.2, 0, 0.8, 0].
    let z = Tensor::from_vec(vec![3.0f32, 1.0, 2.0, 5.0], [4]).requires_grad_(true);
    z.realize().unwrap();
    z.median().backward().unwrap();
    assert_eq!(f32s(&z.grad().unwrap()), vec![0.0, 0.0, 1.0, 0.0]);
    z.zero_grad();
    z.quantile(0.4, None, false, kiln::QuantileInterpolation::Linear)
        .backward()
        .unwrap();
    let g = f32s(&z.grad().unwrap());
    let want = [0.2f32, 0.0, 0.8, 0.0];
    assert!(
        g.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
        "{g:?}"
    );
}

/// `mode`: the most frequent value (the smallest among equally frequent ones, as PyTorch's
/// CPU kernel) and its last index; NaNs each count once; bools, keepdim, views, 0-d input,
/// the gradient, and random small-integer lanes against a plain count.
#[test]
fn mode_matches_pytorch_and_a_plain_count() {
    // Rows [6, 5, 1] (all once: the smallest), [0, 2, 0], [0, 1, 1].
    let x = Tensor::from_vec(vec![6.0f32, 5.0, 1.0, 0.0, 2.0, 0.0, 0.0, 1.0, 1.0], [3, 3]);
    let (v, i) = x.mode(-1, false);
    assert_eq!(f32s(&v), vec![1.0, 0.0, 1.0]);
    assert_eq!(i64s(&i), vec![2, 2, 2]);
    // Along dim 0 with keepdim: columns [6, 0, 0], [5, 2, 1], [1, 0, 1].
    let (v, i) = x.mode(0, true);
    assert_eq!(v.shape(), &[1, 3]);
    assert_eq!(f32s(&v), vec![0.0, 1.0, 1.0]);
    assert_eq!(i64s(&i), vec![2, 2, 2]);
    // NaNs are distinct: [nan, nan, 3] has mode 3; a lane of NaNs gives NaN, index 1.
    let n = Tensor::from_vec(
        vec![f32::NAN, f32::NAN, 3.0, f32::NAN, f32::NAN, f32::NAN],
        [2, 3],
    );
    let (v, i) = n.mode(1, false);
    let v = f32s(&v);
    assert_eq!(v[0], 3.0);
    assert!(v[1].is_nan());
    assert_eq!(i64s(&i)[0], 2);
    // -0.0 and 0.0 are one value.
    let z = Tensor::from_vec(vec![-0.0f32, 1.0, 0.0, 1.0, 0.0], [5]);
    let (v, i) = z.mode(0, false);
    assert_eq!(v.item::<f32>().unwrap(), 0.0);
    assert_eq!(i.item::<i64>().unwrap(), 4);
    // Bools, and a transposed view.
    let b = Tensor::from_vec(vec![true, false, true], [3]);
    assert!(b.mode(0, false).0.item::<bool>().unwrap());
    // Rows of the transpose: [1, 2], [2, 1], [2, 1] (ties: the smallest).
    let t = Tensor::from_vec(vec![1i64, 2, 2, 2, 1, 1], [2, 3]).t();
    let (v, i) = t.mode(1, false);
    assert_eq!(i64s(&v), vec![1, 1, 1]);
    assert_eq!(i64s(&i), vec![0, 1, 1]);
    let t3 = Tensor::from_vec(vec![2i64, 2, 1, 2, 1, 1], [2, 3]).t();
    // Columns of the transpose: [2, 2, 1], [2, 1, 1].
    assert_eq!(i64s(&t3.mode(0, false).0), vec![2, 1]);
    // 0-d: the value itself and index 0; an empty lane is an error.
    let (v, i) = Tensor::scalar(2.5f32).mode(0, false);
    assert_eq!(
        (v.item::<f32>().unwrap(), i.item::<i64>().unwrap()),
        (2.5, 0)
    );
    assert!(matches!(
        Tensor::zeros([2, 0]).try_mode(1, false),
        Err(KilnError::InvalidArgument { .. })
    ));
    // The gradient reaches the returned element only.
    let w = Tensor::from_vec(vec![3.0f32, 1.0, 3.0, 2.0], [4]).requires_grad_(true);
    let (v, _) = w.mode(0, false);
    (v * 2.0).backward().unwrap();
    assert_eq!(f32s(&w.grad().unwrap()), vec![0.0, 0.0, 2.0, 0.0]);
    // Random lanes of small integers: the value with the highest count (smallest on a
    // tie) and its last index.
    let mut state = 12345u64;
    for _ in 0..40 {
        let (rows, cols) = (1 + (state % 5) as usize, 1 + (state % 13) as usize);
        let data: Vec<i64> = (0..rows * cols)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % 4) as i64
            })
            .collect();
        let x = Tensor::from_vec(data.clone(), [rows, cols]);
        let (v, i) = x.mode(1, false);
        let (v, i) = (i64s(&v), i64s(&i));
        for r in 0..rows {
            let lane = &data[r * cols..(r + 1) * cols];
            let count = |val: i64| lane.iter().filter(|&&e| e == val).count();
            let best = (0..4).max_by_key(|&val| (count(val), -val)).unwrap();
            let last = lane.iter().rposition(|&e| e == best).unwrap() as i64;
            assert_eq!((v[r], i[r]), (best, last), "lane {lane:?}");
        }
        // The float path agrees.
        let (fv, fi) = x.cast(DType::F32).mode(1, false);
        assert_eq!(f32s(&fv), v.iter().map(|&e| e as f32).collect::<Vec<_>>());
        assert_eq!(i64s(&fi), i);
    }
}
