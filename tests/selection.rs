//! Data-dependent selections: `nonzero`/`argwhere`, `masked_select`, `masked_scatter` (and
//! in place), `masked_fill_` and `unique`; and `index_put` (`x[i0, i1] = v`, in place too),
//! whose bool-mask indices are selections. PyTorch's documented examples, hand-computed
//! edge cases (NaN, `-0.0`, 0-d and empty tensors, broadcasting, views, half types, no
//! selected element), gradients against hand-computed values, fusion with what follows,
//! and the typed errors.

use kiln::{DType, KilnError, Tensor};

fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// PyTorch's `torch.nonzero` examples, and NaN, `-0.0`, bools, 0-d and empty inputs.
#[test]
fn nonzero_matches_pytorch() {
    let x = Tensor::from_vec(vec![1i64, 1, 1, 0, 1], [5]);
    let nz = x.nonzero();
    assert_eq!(nz.shape(), &[4, 1]);
    assert_eq!(nz.dtype(), DType::I64);
    assert_eq!(i64s(&nz), vec![0, 1, 2, 4]);
    let d = Tensor::from_vec(
        vec![
            0.6f32, 0.0, 0.0, 0.0, 0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 1.2, 0.0, 0.0, 0.0, 0.0, -0.4,
        ],
        [4, 4],
    );
    assert_eq!(d.nonzero().shape(), &[4, 2]);
    assert_eq!(i64s(&d.nonzero()), vec![0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(i64s(&d.argwhere()), i64s(&d.nonzero()));
    // NaN is nonzero, -0.0 is zero.
    let f = Tensor::from_vec(vec![-0.0f32, f32::NAN, 0.0, 2.0], [2, 2]);
    assert_eq!(i64s(&f.nonzero()), vec![0, 1, 1, 1]);
    let b = Tensor::from_vec(vec![false, true, true], [3]);
    assert_eq!(i64s(&b.nonzero()), vec![1, 2]);
    // A 0-d tensor gives [n, 0]; an empty one [0, ndim].
    assert_eq!(Tensor::scalar(3.0f32).nonzero().shape(), &[1, 0]);
    assert_eq!(Tensor::scalar(0.0f32).nonzero().shape(), &[0, 0]);
    assert_eq!(Tensor::zeros([0, 3]).nonzero().shape(), &[0, 2]);
    // Through a view, in the view's order; and of a lazy value (realized first).
    let t = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 0.0, 0.0, 3.0], [2, 3]);
    assert_eq!(i64s(&t.t().nonzero()), vec![1, 0, 2, 0, 2, 1]);
    assert_eq!(
        i64s(&(&t - 1.0).nonzero()),
        vec![0, 0, 0, 2, 1, 0, 1, 1, 1, 2]
    );
}

/// `masked_select` picks in row-major order over the broadcast shape.
#[test]
fn masked_select_matches_hand_values() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let m = Tensor::from_vec(vec![true, false, false, true], [2, 2]);
    let s = x.masked_select(&m);
    assert_eq!(s.shape(), &[2]);
    assert_eq!(f32s(&s), vec![1.0, 4.0]);
    // The mask broadcasts over the tensor, and the tensor over the mask.
    let rows = Tensor::from_vec(vec![false, true], [2, 1]);
    assert_eq!(f32s(&x.masked_select(&rows)), vec![3.0, 4.0]);
    let v = Tensor::from_vec(vec![5i32, 6, 7], [3]);
    let m2 = Tensor::from_vec(vec![true, false, true, false, true, true], [2, 3]);
    assert_eq!(
        v.masked_select(&m2).to_vec::<i32>().unwrap(),
        vec![5, 7, 6, 7]
    );
    // Transposed views read in the view's order; half types keep their dtype.
    let xt = x.t();
    assert_eq!(f32s(&xt.masked_select(&m)), vec![1.0, 4.0]);
    assert_eq!(f32s(&xt.masked_select(&m.t())), vec![1.0, 4.0]);
    let h = x.cast(DType::F16).masked_select(&x.gt(2.0));
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(f32s(&h), vec![3.0, 4.0]);
    // Nothing selected: an empty result.
    let none = x.masked_select(&x.gt(10.0));
    assert_eq!(none.shape(), &[0]);
    assert!(f32s(&none).is_empty());
    // What follows the selection is ordinary lazy work.
    assert_eq!(
        f32s(&(x.masked_select(&x.gt(1.5)) * 2.0).sum(..)),
        vec![18.0]
    );
}

/// PyTorch's documented `masked_scatter` example, broadcasting, in place, and no selection.
#[test]
fn masked_scatter_matches_pytorch() {
    let x = Tensor::from_vec(vec![0i64, 0, 0, 0, 0], [5]);
    let mask = Tensor::from_vec(
        vec![
            false, false, false, true, true, true, true, false, true, true,
        ],
        [2, 5],
    );
    let source = Tensor::from_vec((0..10).collect::<Vec<i64>>(), [2, 5]);
    let y = x.masked_scatter(&mask, &source);
    assert_eq!(y.shape(), &[2, 5]);
    assert_eq!(i64s(&y), vec![0, 0, 0, 0, 1, 2, 3, 0, 4, 5]);
    // In place: the tensor keeps its shape and identity.
    let z = Tensor::from_vec(vec![9.0f32, 9.0, 9.0, 9.0], [2, 2]);
    let alias = z.clone();
    z.masked_scatter_(
        &Tensor::from_vec(vec![true, false], [1, 2]),
        &Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]),
    );
    assert_eq!(f32s(&alias), vec![1.0, 9.0, 2.0, 9.0]);
    z.masked_fill_(&z.gt(5.0), -1.0);
    assert_eq!(f32s(&alias), vec![1.0, -1.0, 2.0, -1.0]);
    // No true element: source is never read and may be empty.
    let w = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    let none = w.masked_scatter(&w.gt(5.0), &Tensor::zeros([0]));
    assert_eq!(f32s(&none), vec![1.0, 2.0]);
}

/// Gradients: the selected elements get the upstream gradient; `masked_scatter` sends it
/// to `self` where the mask is false and to the source elements used, in order.
#[test]
fn selection_gradients_match_hand_values() {
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]).requires_grad_(true);
    let m = Tensor::from_vec(vec![true, false, true, true], [2, 2]);
    let w = Tensor::from_vec(vec![10.0f64, 20.0, 30.0], [3]);
    (x.masked_select(&m) * &w).sum(..).backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![10.0, 0.0, 20.0, 30.0]
    );
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]).requires_grad_(true);
    let s = Tensor::from_vec(vec![5.0f64, 6.0, 7.0, 8.0, 9.0], [5]).requires_grad_(true);
    let g = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]);
    (a.masked_scatter(&m, &s) * &g).sum(..).backward().unwrap();
    assert_eq!(
        a.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![0.0, 2.0, 0.0, 0.0]
    );
    assert_eq!(
        s.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 3.0, 4.0, 0.0, 0.0]
    );
}

/// PyTorch's documented `torch.unique` examples, counts, NaN, `-0.0`, bools and halves.
#[test]
fn unique_matches_pytorch() {
    let x = Tensor::from_vec(vec![1i64, 3, 2, 3], [4]);
    assert_eq!(i64s(&x.unique()), vec![1, 2, 3]);
    let u = x.unique_all();
    assert_eq!(i64s(&u.values), vec![1, 2, 3]);
    assert_eq!(i64s(&u.inverse), vec![0, 2, 1, 2]);
    assert_eq!(i64s(&u.counts), vec![1, 1, 2]);
    let y = Tensor::from_vec(vec![1i64, 3, 2, 3], [2, 2]);
    let u = y.unique_all();
    assert_eq!(u.inverse.shape(), &[2, 2]);
    assert_eq!(i64s(&u.inverse), vec![0, 2, 1, 2]);
    // Floats: -0.0 and 0.0 are one value; each NaN is its own, sorted last.
    let f = Tensor::from_vec(vec![f32::NAN, 0.0, -0.0, 2.5, f32::NAN, -1.0], [6]);
    let u = f.unique_all();
    let v = f32s(&u.values);
    assert_eq!(v.len(), 5);
    assert_eq!(&v[..3], &[-1.0, 0.0, 2.5]);
    assert!(v[3].is_nan() && v[4].is_nan());
    assert_eq!(i64s(&u.counts), vec![1, 2, 1, 1, 1]);
    assert_eq!(i64s(&u.inverse), vec![3, 1, 1, 2, 4, 0]);
    // Bools and half types keep their dtype; large i64 values stay exact.
    let b = Tensor::from_vec(vec![true, true, false], [3]);
    assert_eq!(b.unique().to_vec::<bool>().unwrap(), vec![false, true]);
    let h = Tensor::from_vec(vec![2.0f32, 0.5, 2.0], [3]).cast(DType::BF16);
    assert_eq!(h.unique().dtype(), DType::BF16);
    assert_eq!(f32s(&h.unique()), vec![0.5, 2.0]);
    let big = Tensor::from_vec(vec![(1i64 << 60) + 1, 1 << 60, (1 << 60) + 1], [3]);
    assert_eq!(i64s(&big.unique()), vec![1 << 60, (1 << 60) + 1]);
    // Empty input, and a value without history.
    assert_eq!(Tensor::zeros([0]).unique().shape(), &[0]);
    let r = Tensor::from_vec(vec![1.0f32, 1.0], [2]).requires_grad_(true);
    assert!(!r.unique().requires_grad());
}

#[test]
fn bad_input_is_a_typed_error() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let not_bool = Tensor::from_vec(vec![1i64, 0, 1], [3]);
    assert!(matches!(
        x.try_masked_select(&not_bool),
        Err(KilnError::UnsupportedDType {
            op: "masked_select",
            ..
        })
    ));
    let wrong = Tensor::from_vec(vec![true, false], [2]);
    assert!(matches!(
        x.try_masked_select(&wrong),
        Err(KilnError::ShapeMismatch {
            op: "masked_select",
            ..
        })
    ));
    let m = Tensor::from_vec(vec![true, true, false], [3]);
    // Too short a source names both counts.
    let e = x
        .try_masked_scatter(&m, &Tensor::from_vec(vec![1.0f32], [1]))
        .unwrap_err();
    assert!(matches!(
        e,
        KilnError::InvalidArgument {
            op: "masked_scatter",
            ..
        }
    ));
    assert!(
        e.to_string()
            .contains("selects 2 elements but source has only 1"),
        "{e}"
    );
    assert!(matches!(
        x.try_masked_scatter(&m, &Tensor::from_vec(vec![1.0f64, 2.0], [2])),
        Err(KilnError::DTypeMismatch {
            op: "masked_scatter",
            ..
        })
    ));
    // In place, the mask may not widen the tensor.
    let rows = Tensor::from_vec(vec![true, false], [2, 1]);
    assert!(matches!(
        x.try_masked_scatter_(&rows, &x),
        Err(KilnError::ShapeMismatch {
            op: "masked_scatter_",
            ..
        })
    ));
    assert_eq!(f32s(&x), vec![1.0, 2.0, 3.0]);
}

/// `index_put` by hand: integer indices (negative ones wrap, broadcast together, fewer than
/// the dimensions), a bool mask, accumulation with repeated places, the last write winning
/// without it, in place.
#[test]
fn index_put_matches_hand_values() {
    let rows = Tensor::from_vec(vec![0i64, 2], [2]);
    let cols = Tensor::from_vec(vec![1i64, -1], [2]);
    let v = Tensor::from_vec(vec![5.0f32, 7.0], [2]);
    let y = Tensor::zeros([3, 3]).index_put(&[&rows, &cols], &v, false);
    assert_eq!(f32s(&y), vec![0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0]);
    // One index: whole rows.
    let i = Tensor::from_vec(vec![2i64, 0], [2]);
    let rowsv = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let y = Tensor::zeros([3, 2]).index_put(&[&i], &rowsv, false);
    assert_eq!(f32s(&y), vec![3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
    // Indices broadcast ([2, 1] with [3]) to a 2×3 block; the value broadcasts too.
    let r = Tensor::from_vec(vec![0i64, 1], [2, 1]);
    let c = Tensor::from_vec(vec![0i64, 1, 2], [3]);
    let y = Tensor::zeros([3, 3]).index_put(&[&r, &c], &Tensor::from_vec(vec![9.0f32], [1]), false);
    assert_eq!(f32s(&y), vec![9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 0.0, 0.0, 0.0]);
    // Accumulate sums repeated places; without it the last value wins.
    let rep = Tensor::from_vec(vec![1i64, 1, 3], [3]);
    let add = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    assert_eq!(
        f32s(&Tensor::zeros([4]).index_put(&[&rep], &add, true)),
        vec![0.0, 3.0, 0.0, 3.0]
    );
    assert_eq!(
        f32s(&Tensor::zeros([4]).index_put(&[&rep], &add, false)),
        vec![0.0, 2.0, 0.0, 3.0]
    );
    // A bool mask names the places of its true elements, in row-major order.
    let x = Tensor::from_vec(vec![0i64, 1, 2, 3, 4, 5], [2, 3]);
    let m = Tensor::from_vec(vec![true, false, true, false, false, true], [2, 3]);
    let y = x.index_put(&[&m], &Tensor::from_vec(vec![-1i64, -2, -3], [3]), false);
    assert_eq!(i64s(&y), vec![-1, 1, -2, 3, 4, -3]);
    // A mask over the leading dimension, then an integer index.
    let lead = Tensor::from_vec(vec![false, true], [2]);
    let y = x.index_put(
        &[&lead, &Tensor::from_vec(vec![2i64], [1])],
        &Tensor::from_vec(vec![9i64], [1]),
        false,
    );
    assert_eq!(i64s(&y), vec![0, 1, 2, 3, 4, 9]);
    // In place, through every handle.
    let z = Tensor::zeros([2, 2]);
    let alias = z.clone();
    z.index_put_(
        &[&Tensor::from_vec(vec![1i64, 1], [2])],
        &Tensor::ones([2, 2]),
        true,
    );
    assert_eq!(f32s(&alias), vec![0.0, 0.0, 2.0, 2.0]);
}

#[test]
fn index_put_gradients_match_hand_values() {
    let w = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [4]);
    let i = Tensor::from_vec(vec![3i64, 1], [2]);
    for accumulate in [false, true] {
        let x = Tensor::from_vec(vec![0.5f64, 0.5, 0.5, 0.5], [4]).requires_grad_(true);
        let v = Tensor::from_vec(vec![10.0f64, 20.0], [2]).requires_grad_(true);
        (x.index_put(&[&i], &v, accumulate) * &w)
            .sum(..)
            .backward()
            .unwrap();
        let gx = x.grad().unwrap().to_vec::<f64>().unwrap();
        if accumulate {
            assert_eq!(gx, vec![1.0, 2.0, 3.0, 4.0]);
        } else {
            assert_eq!(gx, vec![1.0, 0.0, 3.0, 0.0]);
        }
        assert_eq!(v.grad().unwrap().to_vec::<f64>().unwrap(), vec![4.0, 2.0]);
    }
}

#[test]
fn index_put_errors_are_typed() {
    let x = Tensor::zeros([3, 3]);
    let i = Tensor::from_vec(vec![0i64], [1]);
    let v = Tensor::from_vec(vec![1.0f32], [1]);
    assert!(matches!(
        x.try_index_put(&[&i], &Tensor::from_vec(vec![1.0f64], [1]), false),
        Err(KilnError::DTypeMismatch {
            op: "index_put",
            ..
        })
    ));
    assert!(matches!(
        x.try_index_put(&[&i, &i, &i], &v, false),
        Err(KilnError::InvalidArgument {
            op: "index_put",
            ..
        })
    ));
    assert!(matches!(
        x.try_index_put(&[&Tensor::from_vec(vec![0.0f32], [1])], &v, false),
        Err(KilnError::UnsupportedDType {
            op: "index_put",
            ..
        })
    ));
    let two = Tensor::from_vec(vec![0i64, 1], [2]);
    let three = Tensor::from_vec(vec![0i64, 1, 2], [3]);
    assert!(matches!(
        x.try_index_put(&[&two, &three], &v, false),
        Err(KilnError::ShapeMismatch {
            op: "index_put",
            ..
        })
    ));
    // An index outside its own dimension fails when realized, even where its flat place
    // would land inside the tensor (row 0, column 5 is element 5).
    let far = Tensor::from_vec(vec![5i64], [1]);
    let y = x.try_index_put(&[&i, &far], &v, false).unwrap();
    assert!(matches!(
        y.realize(),
        Err(KilnError::IndexOutOfRange { .. })
    ));
    let low = Tensor::from_vec(vec![-4i64], [1]);
    let y = x
        .try_index_put(&[&low], &Tensor::zeros([1, 3]), false)
        .unwrap();
    assert!(matches!(
        y.realize(),
        Err(KilnError::IndexOutOfRange { .. })
    ));
}

/// `unique(dim=…)` and `unique_consecutive` (flattened and along a dimension): hand
/// values with NaN and `-0.0`, PyTorch's empty-tensor rules, and random integer slices
/// against a sorted map of rows.
#[test]
fn unique_dim_and_unique_consecutive_match_hand_values() {
    let x = Tensor::from_vec(vec![1.0f32, 1.0, f32::NAN, f32::NAN, -0.0, 0.0, 2.0], [7]);
    let u = x.unique_consecutive_all();
    let v = f32s(&u.values);
    assert_eq!(v.len(), 5);
    assert!(v[1].is_nan() && v[2].is_nan());
    assert_eq!((v[0], v[4]), (1.0, 2.0));
    // The run keeps its first element: -0.0.
    assert!(v[3] == 0.0 && v[3].is_sign_negative());
    assert_eq!(i64s(&u.inverse), vec![0, 0, 1, 2, 3, 3, 4]);
    assert_eq!(i64s(&u.counts), vec![2, 1, 1, 2, 1]);
    // Columns (1, 2), (0, 5), (1, 2): sorted (0, 5), (1, 2).
    let c = Tensor::from_vec(vec![1i64, 0, 1, 2, 5, 2], [2, 3]);
    let u = c.unique_dim_all(1);
    assert_eq!(u.values.shape(), &[2, 2]);
    assert_eq!(i64s(&u.values), vec![0, 1, 5, 2]);
    assert_eq!(i64s(&u.inverse), vec![1, 0, 1]);
    assert_eq!(i64s(&u.counts), vec![1, 2]);
    assert_eq!(i64s(&c.unique_dim(-1)), vec![0, 1, 5, 2]);
    // Slices holding a NaN are never equal.
    let n = Tensor::from_vec(vec![f32::NAN, 1.0, f32::NAN, 1.0], [2, 2]);
    assert_eq!(i64s(&n.unique_dim_all(0).counts), vec![1, 1]);
    // Consecutive slices along the middle dimension of a 3-D tensor.
    let t = Tensor::from_vec(vec![1i64, 1, 2, 1, 1, 2, 3, 3, 3], [1, 3, 3]).permute([0, 2, 1]);
    let u = t.unique_consecutive_dim_all(1);
    assert_eq!(u.values.shape(), &[1, 2, 3]);
    assert_eq!(i64s(&u.values), vec![1, 1, 3, 2, 2, 3]);
    assert_eq!(i64s(&u.inverse), vec![0, 0, 1]);
    assert_eq!(i64s(&u.counts), vec![2, 1]);
    // Empty tensors (PyTorch's rules): `dim` the only empty dimension gives the input
    // back; another empty dimension is an error.
    let u = Tensor::zeros([0, 3]).unique_dim_all(0);
    assert_eq!(u.values.shape(), &[0, 3]);
    assert_eq!(
        (u.inverse.shape(), u.counts.shape()),
        (&[0usize][..], &[0usize][..])
    );
    assert!(Tensor::zeros([3, 0]).try_unique_dim_all(0).is_err());
    assert!(Tensor::zeros([0, 0]).try_unique_dim_all(0).is_err());
    assert_eq!(Tensor::zeros([0, 3]).unique().shape(), &[0]);
    assert!(Tensor::zeros([2]).try_unique_dim(1).is_err());
    // Random integer rows against a sorted map.
    let mut state = 7u64;
    for _ in 0..30 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let (n, w) = (
            1 + (state >> 40) as usize % 9,
            1 + (state >> 50) as usize % 3,
        );
        let data: Vec<i64> = (0..n * w)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % 3) as i64
            })
            .collect();
        let x = Tensor::from_vec(data.clone(), [n, w]);
        let rows: Vec<&[i64]> = data.chunks(w).collect();
        let mut map = std::collections::BTreeMap::new();
        for r in &rows {
            *map.entry(r.to_vec()).or_insert(0i64) += 1;
        }
        let u = x.unique_dim_all(0);
        let want: Vec<i64> = map.keys().flatten().copied().collect();
        assert_eq!(i64s(&u.values), want);
        assert_eq!(i64s(&u.counts), map.values().copied().collect::<Vec<_>>());
        let keys: Vec<&Vec<i64>> = map.keys().collect();
        let inv: Vec<i64> = rows
            .iter()
            .map(|r| keys.iter().position(|k| k.as_slice() == *r).unwrap() as i64)
            .collect();
        assert_eq!(i64s(&u.inverse), inv);
        // Consecutive: the runs of equal rows.
        let uc = x.unique_consecutive_dim_all(0);
        let mut runs: Vec<(&[i64], i64)> = Vec::new();
        for r in &rows {
            match runs.last_mut() {
                Some((last, count)) if last == r => *count += 1,
                _ => runs.push((r, 1)),
            }
        }
        let want: Vec<i64> = runs.iter().flat_map(|(r, _)| r.iter().copied()).collect();
        assert_eq!(i64s(&uc.values), want);
        assert_eq!(
            i64s(&uc.counts),
            runs.iter().map(|r| r.1).collect::<Vec<_>>()
        );
    }
}
