//! `scatter_reduce` and `scatter` (non-adding), and the `index_*` ops built on them
//! (`index_add`, `index_copy`, `index_fill`, `index_reduce`): PyTorch's documented examples and
//! hand-computed values for every reduction, with and without `include_self`, over integer,
//! bool, half and float dtypes; the edge cases (NaN, zeros in products, ties, duplicate
//! indices, a `src` larger than the index, views); gradients against hand-computed values
//! and the reference evaluator's; and the errors.

use kiln::{DType, KilnError, Tensor, reference};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn leaf(v: &[f64], shape: &[usize]) -> Tensor {
    let t = Tensor::from_vec(v.to_vec(), shape).requires_grad_(true);
    t.realize().unwrap();
    t
}

fn grad(t: &Tensor) -> Vec<f64> {
    t.grad().expect("a gradient").to_vec::<f64>().unwrap()
}

/// PyTorch's documented `scatter_reduce` example (1-D, `sum` and `amax`, with and without
/// `include_self`).
#[test]
fn pytorch_documented_examples() {
    let src = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [6]);
    let index = Tensor::from_vec(vec![0i64, 1, 0, 1, 2, 1], [6]);
    let input = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    let r = |x: &Tensor, reduce: &str, include_self: bool| {
        f32s(&x.scatter_reduce(0, &index, &src, reduce, include_self))
    };
    assert_eq!(r(&input, "sum", true), vec![5.0, 14.0, 8.0, 4.0]);
    assert_eq!(r(&input, "sum", false), vec![4.0, 12.0, 5.0, 4.0]);
    let input2 = Tensor::from_vec(vec![5.0f32, 4.0, 3.0, 2.0], [4]);
    assert_eq!(r(&input2, "amax", true), vec![5.0, 6.0, 5.0, 2.0]);
    assert_eq!(r(&input2, "amax", false), vec![3.0, 6.0, 5.0, 2.0]);
    // The same places: amin, prod, mean (by hand).
    assert_eq!(r(&input2, "amin", true), vec![1.0, 2.0, 3.0, 2.0]);
    assert_eq!(r(&input2, "amin", false), vec![1.0, 2.0, 5.0, 2.0]);
    assert_eq!(r(&input, "prod", true), vec![3.0, 96.0, 15.0, 4.0]);
    assert_eq!(r(&input, "prod", false), vec![3.0, 48.0, 5.0, 4.0]);
    assert_eq!(r(&input, "mean", true), vec![5.0 / 3.0, 3.5, 4.0, 4.0]);
    assert_eq!(r(&input, "mean", false), vec![2.0, 4.0, 5.0, 4.0]);
}

/// PyTorch's documented `scatter_` example: a `src` larger than the index (only its
/// index-shaped corner is read), along dimension 0 and 1.
#[test]
fn scatter_writes_the_index_shaped_corner_of_src() {
    let src = Tensor::arange(1i64, 11i64, 1i64).reshape([2, 5]);
    let index = Tensor::from_vec(vec![0i64, 1, 2, 0], [1, 4]);
    let z = Tensor::full([3, 5], 0i64);
    let out = z.scatter(0, &index, &src);
    assert_eq!(
        out.to_vec::<i64>().unwrap(),
        vec![1, 0, 0, 4, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0]
    );
    // scatter_add reads the same corner.
    assert_eq!(
        z.scatter_add(0, &index, &src).to_vec::<i64>().unwrap(),
        vec![1, 0, 0, 4, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0]
    );
    let index = Tensor::from_vec(vec![0i64, 1, 2, 0], [2, 2]);
    let out = z.scatter(1, &index, &src);
    // Row 0 gets src[0][0] at 0 and src[0][1] at 1; row 1 gets src[1][0] at 2, src[1][1] at 0.
    assert_eq!(
        out.to_vec::<i64>().unwrap(),
        vec![1, 2, 0, 0, 0, 7, 0, 6, 0, 0, 0, 0, 0, 0, 0]
    );
}

/// Duplicate places: the last value in the index's row-major order wins, and only it
/// receives the place's gradient.
#[test]
fn scatter_duplicates_keep_the_last_value() {
    let x = leaf(&[10.0, 20.0, 30.0], &[3]);
    let v = leaf(&[1.0, 2.0, 3.0, 4.0], &[4]);
    let i = Tensor::from_vec(vec![2i64, 0, 2, 0], [4]);
    let y = x.scatter(0, &i, &v);
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![4.0, 20.0, 3.0]);
    let w = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3]);
    (y * w).sum(..).backward().unwrap();
    assert_eq!(grad(&x), vec![0.0, 2.0, 0.0]);
    assert_eq!(grad(&v), vec![0.0, 0.0, 3.0, 1.0]);
    // An empty index changes nothing.
    let e = Tensor::from_vec(Vec::<i64>::new(), [0]);
    let ev = Tensor::from_vec(Vec::<f64>::new(), [0]);
    assert_eq!(
        x.scatter(0, &e, &ev).to_vec::<f64>().unwrap(),
        vec![10.0, 20.0, 30.0]
    );
}

/// Integer means floor (PyTorch's rounding for integer `scatter_reduce` means); integer
/// extremes start from the dtype's limits; bool `amax`/`amin` are `or`/`and`.
#[test]
fn integer_and_bool_reductions() {
    let x = Tensor::from_vec(vec![10i64, 0, 5], [3]);
    let i = Tensor::from_vec(vec![0i64, 0, 1], [3]);
    let v = Tensor::from_vec(vec![3i64, 4, -7], [3]);
    let r = |reduce: &str, s: bool| {
        x.scatter_reduce(0, &i, &v, reduce, s)
            .to_vec::<i64>()
            .unwrap()
    };
    // (10 + 3 + 4) / 3 = 5.67 → 5; (0 - 7) / 2 = -3.5 → -4.
    assert_eq!(r("mean", true), vec![5, -4, 5]);
    assert_eq!(r("mean", false), vec![3, -7, 5]);
    assert_eq!(r("amax", false), vec![4, -7, 5]);
    assert_eq!(r("amin", true), vec![3, -7, 5]);
    assert_eq!(r("prod", true), vec![120, 0, 5]);
    assert_eq!(r("sum", false), vec![7, -7, 5]);
    let xi = Tensor::from_vec(vec![i32::MIN, i32::MAX], [2]);
    let ii = Tensor::from_vec(vec![0i64, 1], [2]);
    let vi = Tensor::from_vec(vec![i32::MIN, i32::MAX], [2]);
    assert_eq!(
        xi.scatter_reduce(0, &ii, &vi, "amax", false)
            .to_vec::<i32>()
            .unwrap(),
        vec![i32::MIN, i32::MAX]
    );
    let b = Tensor::from_vec(vec![false, true, false], [3]);
    let bi = Tensor::from_vec(vec![0i64, 0, 1, 1], [4]);
    let bv = Tensor::from_vec(vec![true, false, false, false], [4]);
    assert_eq!(
        b.scatter_reduce(0, &bi, &bv, "amax", false)
            .to_vec::<bool>()
            .unwrap(),
        vec![true, false, false]
    );
    assert_eq!(
        b.scatter_reduce(0, &bi, &bv, "amin", true)
            .to_vec::<bool>()
            .unwrap(),
        vec![false, false, false]
    );
}

/// NaN wins `amax` and `amin` wherever it lands, from `self` or from `src`; half types
/// reduce in f32 and round once.
#[test]
fn nan_propagates_and_halves_round_once() {
    let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 0.0], [3]);
    let i = Tensor::from_vec(vec![0i64, 0, 1, 2], [4]);
    let v = Tensor::from_vec(vec![f32::NAN, 5.0, 2.0, -1.0], [4]);
    for reduce in ["amax", "amin"] {
        for s in [true, false] {
            let y = f32s(&x.scatter_reduce(0, &i, &v, reduce, s));
            assert!(y[0].is_nan(), "{reduce} {s}: {y:?}");
            assert_eq!(y[1].is_nan(), s, "{reduce} {s}: {y:?}");
        }
    }
    // 2048 + 1 + 1 in f16 one at a time stays 2048; in f32 then rounded it is 2050.
    let h = Tensor::from_vec(vec![2048.0f32], [1]).cast(DType::F16);
    let hi = Tensor::from_vec(vec![0i64, 0], [2]);
    let hv = Tensor::from_vec(vec![1.0f32, 1.0], [2]).cast(DType::F16);
    let y = h.scatter_reduce(0, &hi, &hv, "sum", true);
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.cast(DType::F32).to_vec::<f32>().unwrap(), vec![2050.0]);
}

/// Views as every operand (a transposed `self`, a strided index, a flipped `src`) and a
/// higher-rank case, against the reference evaluator for every reduction.
#[test]
fn views_and_ranks_match_the_reference() {
    let base = Tensor::from_vec((0..24).map(|v| (v % 7) as f32 - 3.0).collect(), [4, 6]);
    let x = base.transpose(0, 1); // [6, 4]
    let idx_full = Tensor::from_vec((0..30).map(|k| ((k * 7 + 3) % 6) as i64).collect(), [5, 6]);
    let idx = idx_full.slice(&[(0, 5, 2), (0, 4, 1)]); // [3, 4]
    let src = Tensor::from_vec(
        (0..20).map(|k| (k % 5) as f32 * 0.5 - 1.0).collect(),
        [4, 5],
    )
    .flip([0]);
    for reduce in ["sum", "prod", "mean", "amax", "amin"] {
        for s in [true, false] {
            let y = x.scatter_reduce(0, &idx, &src, reduce, s);
            let want = reference::evaluate(&y).unwrap().to_f64();
            let got: Vec<f64> = f32s(&y).iter().map(|&v| v as f64).collect();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{reduce} include_self={s} [{k}]: {g} vs {w}"
                );
            }
        }
    }
    let y = x.scatter(0, &idx, &src);
    let want = reference::evaluate(&y).unwrap().to_f64();
    let got: Vec<f64> = f32s(&y).iter().map(|&v| v as f64).collect();
    assert_eq!(got, want);
}

/// `amax`/`amin` share a place's gradient evenly among every contributor equal to the
/// result, `self` included (PyTorch's rule).
#[test]
fn extreme_gradients_share_ties() {
    let x = leaf(&[2.0, 7.0], &[2]);
    let v = leaf(&[2.0, 1.0, 2.0, 9.0], &[4]);
    let i = Tensor::from_vec(vec![0i64, 0, 0, 1], [4]);
    x.scatter_reduce(0, &i, &v, "amax", true)
        .sum(..)
        .backward()
        .unwrap();
    let third = 1.0 / 3.0;
    assert_eq!(grad(&x), vec![third, 0.0]);
    assert_eq!(grad(&v), vec![third, 0.0, third, 1.0]);
    // Without self: places that receive values pass nothing to self.
    let x = leaf(&[2.0, 7.0, 4.0], &[3]);
    let v = leaf(&[2.0, 1.0, 2.0, 9.0], &[4]);
    x.scatter_reduce(0, &i, &v, "amin", false)
        .sum(..)
        .backward()
        .unwrap();
    assert_eq!(grad(&x), vec![0.0, 0.0, 1.0]);
    assert_eq!(grad(&v), vec![0.0, 1.0, 0.0, 1.0]);
}

/// `prod`'s gradient is the product of the place's other contributors, exact with one or
/// more zeros.
#[test]
fn product_gradients_are_exact_with_zeros() {
    let x = leaf(&[2.0, 3.0, 0.0], &[3]);
    let v = leaf(&[0.0, 5.0, 4.0, 0.0, 0.5], &[5]);
    let i = Tensor::from_vec(vec![0i64, 0, 1, 2, 2], [5]);
    let y = x.scatter_reduce(0, &i, &v, "prod", true);
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![0.0, 12.0, 0.0]);
    y.sum(..).backward().unwrap();
    // Place 0: 2·0·5 (one zero); place 1: 3·4; place 2: 0·0·0.5 (two zeros).
    assert_eq!(grad(&x), vec![0.0, 4.0, 0.0]);
    assert_eq!(grad(&v), vec![10.0, 0.0, 3.0, 0.0, 0.0]);
}

/// `mean` and `sum` gradients, and every reduction's gradient against the reference
/// evaluator's own derivative rules (written independently, in f64).
#[test]
fn gradients_match_the_reference() {
    let xs = [1.5, -2.0, 0.25, 3.0, 1.5, -0.5];
    let vs = [1.5, 2.0, -1.0, 1.5, 0.5, -2.0, 3.0, 1.5];
    let i = Tensor::from_vec(vec![0i64, 2, 2, 0, 5, 4, 2, 4], [8]);
    let w = Tensor::from_vec(vec![1.0f64, -2.0, 0.5, 3.0, 1.0, -1.0], [6]);
    for reduce in ["sum", "prod", "mean", "amax", "amin"] {
        for s in [true, false] {
            let x = leaf(&xs, &[6]);
            let v = leaf(&vs, &[8]);
            let loss = (x.scatter_reduce(0, &i, &v, reduce, s) * &w).sum(..);
            let want = reference::grad::gradients(&loss, None, &[&x, &v]).unwrap();
            loss.backward().unwrap();
            for (t, want, name) in [(&x, &want[0], "self"), (&v, &want[1], "src")] {
                let want = want.to_f64();
                let got = grad(t);
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
                        "{reduce} include_self={s}: d/d{name}[{k}] = {g}, reference {w}"
                    );
                }
            }
        }
    }
    let x = leaf(&[1.0, 2.0], &[2]);
    let v = leaf(&[4.0, 6.0, 1.0], &[3]);
    let i = Tensor::from_vec(vec![0i64, 0, 1], [3]);
    x.scatter_reduce(0, &i, &v, "mean", true)
        .sum(..)
        .backward()
        .unwrap();
    assert_eq!(grad(&x), vec![1.0 / 3.0, 0.5]);
    assert_eq!(grad(&v), vec![1.0 / 3.0, 1.0 / 3.0, 0.5]);
}

#[test]
fn bad_input_is_a_typed_error() {
    let x = Tensor::zeros([3]);
    let i = Tensor::from_vec(vec![0i64, 1], [2]);
    let v = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    match x.try_scatter_reduce(0, &i, &v, "max", true) {
        Err(KilnError::InvalidArgument { op, reason, .. }) => {
            assert_eq!(op, "scatter_reduce");
            assert!(reason.contains("amax"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let short = Tensor::from_vec(vec![1.0f32], [1]);
    assert!(matches!(
        x.try_scatter(0, &i, &short),
        Err(KilnError::ShapeMismatch { op: "scatter", .. })
    ));
    let fi = Tensor::from_vec(vec![0.0f32, 1.0], [2]);
    assert!(matches!(
        x.try_scatter_reduce(0, &fi, &v, "sum", true),
        Err(KilnError::UnsupportedDType {
            op: "scatter_reduce",
            ..
        })
    ));
    let b = Tensor::from_vec(vec![true, false], [2]);
    assert!(matches!(
        b.try_scatter_reduce(0, &i, &b, "mean", true),
        Err(KilnError::UnsupportedDType {
            op: "scatter_reduce",
            ..
        })
    ));
    let far = Tensor::from_vec(vec![0i64, 3], [2]);
    let y = x.scatter_reduce(0, &far, &v, "amax", false);
    match y.realize() {
        Err(KilnError::IndexOutOfRange { index, size, .. }) => {
            assert_eq!((index, size), (3, 3));
        }
        other => panic!("expected IndexOutOfRange, got {other:?}"),
    }
}

/// The in-place forms write into the tensor's own buffer after readers of the old value.
#[test]
fn in_place_forms_update_the_tensor() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    x.realize().unwrap();
    let before = &x * 1.0;
    let i = Tensor::from_vec(vec![2i64, 2], [2]);
    let v = Tensor::from_vec(vec![10.0f32, 20.0], [2]);
    x.scatter_add_(0, &i, &v);
    assert_eq!(f32s(&x), vec![1.0, 2.0, 33.0]);
    assert_eq!(f32s(&before), vec![1.0, 2.0, 3.0]);
    x.scatter_reduce_(0, &i, &v, "amin", true);
    assert_eq!(f32s(&x), vec![1.0, 2.0, 10.0]);
    x.scatter_(0, &Tensor::from_vec(vec![0i64], [1]), -1.0);
    assert_eq!(f32s(&x), vec![-1.0, 2.0, 10.0]);
}

/// A padded, expanded or flipped `self` (masked and broadcast views) as the initial value.
#[test]
fn padded_and_expanded_self() {
    let base = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let i = Tensor::from_vec(vec![0i64, 3, 3, 1], [2, 2]);
    let v = Tensor::from_vec(vec![5.0f32, -6.0, 7.0, 8.0], [2, 2]);
    let padded = base.pad(&[(1, 1), (0, 0)], -1.0); // [4, 2]
    let expanded = Tensor::from_vec(vec![0.5f32, -0.5], [1, 2]).expand([4, 2]);
    for x in [padded, expanded, base.pad(&[(0, 2), (0, 0)], 9.0).flip([0])] {
        for reduce in ["sum", "amax", "prod", "mean"] {
            let y = x.scatter_reduce(0, &i, &v, reduce, true);
            let want = reference::evaluate(&y).unwrap().to_f64();
            let got: Vec<f64> = f32s(&y).iter().map(|&v| v as f64).collect();
            assert_eq!(got, want, "{reduce}");
        }
    }
}

/// PyTorch's documented `index_add_`, `index_copy_`, `index_fill_` and `index_reduce_`
/// examples, out of place and in place.
#[test]
fn index_ops_match_pytorch_examples() {
    let t = Tensor::from_vec((1..=9).map(|v| v as f32).collect(), [3, 3]);
    let index = Tensor::from_vec(vec![0i64, 4, 2], [3]);
    let x = Tensor::ones([5, 3]);
    assert_eq!(
        f32s(&x.index_add(0, &index, &t)),
        vec![2., 3., 4., 1., 1., 1., 8., 9., 10., 1., 1., 1., 5., 6., 7.]
    );
    let z = Tensor::zeros([5, 3]);
    assert_eq!(
        f32s(&z.index_copy(0, &index, &t)),
        vec![1., 2., 3., 0., 0., 0., 7., 8., 9., 0., 0., 0., 4., 5., 6.]
    );
    let cols = Tensor::from_vec(vec![0i64, 2], [2]);
    assert_eq!(
        f32s(&t.index_fill(1, &cols, -1.0)),
        vec![-1., 2., -1., -1., 5., -1., -1., 8., -1.]
    );
    let x = Tensor::full([5, 3], 2.0);
    let t4 = Tensor::from_vec((1..=12).map(|v| v as f32).collect(), [4, 3]);
    let i4 = Tensor::from_vec(vec![0i64, 4, 2, 0], [4]);
    assert_eq!(
        f32s(&x.index_reduce(0, &i4, &t4, "prod", true)),
        vec![
            20., 44., 72., 2., 2., 2., 14., 16., 18., 2., 2., 2., 8., 10., 12.
        ]
    );
    assert_eq!(
        f32s(&x.index_reduce(0, &i4, &t4, "prod", false)),
        vec![
            10., 22., 36., 2., 2., 2., 7., 8., 9., 2., 2., 2., 4., 5., 6.
        ]
    );
    // In place: the same values in the tensor's own buffer.
    let y = Tensor::ones([5, 3]);
    y.realize().unwrap();
    y.index_add_(0, &index, &t);
    y.index_fill_(1, &cols, 0.5);
    y.index_reduce_(0, &i4, &t4, "amax", true);
    let w = Tensor::ones([5, 3])
        .index_add(0, &index, &t)
        .index_fill(1, &cols, 0.5)
        .index_reduce(0, &i4, &t4, "amax", true);
    assert_eq!(f32s(&y), f32s(&w));
    let c = Tensor::zeros([5, 3]);
    c.realize().unwrap();
    c.index_copy_(0, &index, &t);
    assert_eq!(f32s(&c), f32s(&z.index_copy(0, &index, &t)));
}

/// Gradients of the `index_*` ops against the reference evaluator's, and their errors.
#[test]
fn index_ops_gradients_and_errors() {
    let i = Tensor::from_vec(vec![2i64, 0, 2], [3]);
    let w = Tensor::from_vec((0..8).map(|k| k as f64 * 0.5 - 1.0).collect(), [4, 2]);
    type Op = fn(&Tensor, &Tensor, &Tensor) -> Tensor;
    let ops: [(&str, Op); 4] = [
        ("index_add", |x, i, s| x.index_add(0, i, s)),
        ("index_copy", |x, i, s| x.index_copy(0, i, s)),
        ("index_reduce amax", |x, i, s| {
            x.index_reduce(0, i, s, "amax", true)
        }),
        ("index_reduce mean", |x, i, s| {
            x.index_reduce(0, i, s, "mean", false)
        }),
    ];
    for (name, f) in ops {
        let x = leaf(&[0.5, -1.0, 2.0, 0.25, 1.5, -0.75, 3.0, 1.0], &[4, 2]);
        let s = leaf(&[1.0, 2.0, -0.5, 0.75, 2.5, -2.0], &[3, 2]);
        let loss = (f(&x, &i, &s) * &w).sum(..);
        let want = reference::grad::gradients(&loss, None, &[&x, &s]).unwrap();
        loss.backward().unwrap();
        assert_eq!(grad(&x), want[0].to_f64(), "{name}: self");
        assert_eq!(grad(&s), want[1].to_f64(), "{name}: source");
    }
    let x = Tensor::zeros([4, 2]);
    let bad = Tensor::zeros([3, 3]);
    assert!(matches!(
        x.try_index_add(0, &i, &bad),
        Err(KilnError::ShapeMismatch {
            op: "index_add",
            ..
        })
    ));
    let i2 = Tensor::from_vec(vec![0i64, 1], [1, 2]);
    assert!(matches!(
        x.try_index_fill(0, &i2, 1.0),
        Err(KilnError::InvalidShape {
            op: "index_fill",
            ..
        })
    ));
    assert!(matches!(
        x.try_index_reduce(0, &i, &Tensor::zeros([3, 2]), "sum", true),
        Err(KilnError::InvalidArgument {
            op: "index_reduce",
            ..
        })
    ));
    let far = Tensor::from_vec(vec![4i64], [1]);
    assert!(matches!(
        x.index_copy(0, &far, &Tensor::zeros([1, 2])).realize(),
        Err(KilnError::IndexOutOfRange { .. })
    ));
}

/// Long rows (an embedding gradient's shape: each index step adds a whole row) take the
/// row-blocked path, split into parts and over threads; large outputs are filled in
/// parallel. Checked against plain loops, for sums (rows of f32) and for the other
/// reductions and dtypes, which go element by element under the same blocking.
#[test]
fn long_rows_and_large_outputs_match_plain_loops() {
    let (vocab, tokens, dim) = (40usize, 300usize, 5000usize);
    // The last 5 rows are never indexed.
    let ids: Vec<i64> = (0..tokens)
        .map(|i| ((i * 7 + i / 3) % (vocab - 5)) as i64)
        .collect();
    let vals: Vec<f32> = (0..tokens * dim)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0)
        .collect();
    let index = Tensor::from_vec(ids.clone(), [tokens, 1]).expand([tokens, dim]);
    let src = Tensor::from_vec(vals.clone(), [tokens, dim]);
    // sum into zeros, as an embedding's backward does: in index order, per place.
    let mut want = vec![0.0f32; vocab * dim];
    for t in 0..tokens {
        let r = ids[t] as usize;
        for c in 0..dim {
            want[r * dim + c] += vals[t * dim + c];
        }
    }
    let got = f32s(&Tensor::zeros([vocab, dim]).scatter_add(0, &index, &src));
    assert_eq!(got, want);
    // amax without self: the identity fill (-inf) is not zero, and every untouched place
    // keeps self's value.
    let base: Vec<f64> = (0..vocab * dim).map(|i| (i % 13) as f64 - 6.0).collect();
    let x = Tensor::from_vec(base.clone(), [vocab, dim]);
    let src64 = src.cast(DType::F64);
    let got = x
        .scatter_reduce(0, &index, &src64, "amax", false)
        .to_vec::<f64>()
        .unwrap();
    let mut want: Vec<Option<f64>> = vec![None; vocab * dim];
    for t in 0..tokens {
        let r = ids[t] as usize;
        for c in 0..dim {
            let v = vals[t * dim + c] as f64;
            let w = &mut want[r * dim + c];
            *w = Some(w.map_or(v, |o: f64| o.max(v)));
        }
    }
    let want: Vec<f64> = want
        .iter()
        .zip(&base)
        .map(|(w, &b)| w.unwrap_or(b))
        .collect();
    assert_eq!(got, want);
    assert!(
        vocab * dim > 1 << 16,
        "the output is larger than one fill chunk"
    );
}
