//! `histogram`, `histogram_with_edges`, `histogramdd` and `histogramdd_with_edges`:
//! PyTorch's documented examples, edge cases by hand, and random inputs (many values on
//! bin edges, weights, density, ranges given or taken from the data, views) against a
//! plain loop of PyTorch's rule — the estimate `trunc((v - e₀)·bins / (e_last - e₀))` in
//! the input's dtype, settled by a search among the edges around it, the last bin
//! closed — and given edges against a direct count.

mod common;

use common::Rng;
use kiln::{DType, KilnError, Tensor};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| lo + (hi - lo) * (rng.next() >> 11) as f64 / (1u64 << 53) as f64)
        .collect()
}

/// PyTorch's `linspace` in f32 or f64 (`start + i·step` in the first half,
/// `end - (n-1-i)·step` in the second), as f64 values.
fn linspace(lo: f64, hi: f64, n: usize, f32_: bool) -> Vec<f64> {
    if f32_ {
        let (lo, hi) = (lo as f32, hi as f32);
        let step = (hi - lo) / (n - 1) as f32;
        (0..n)
            .map(|i| {
                if i < n / 2 {
                    (lo as f64 + step as f64 * i as f64) as f32 as f64
                } else {
                    (hi as f64 - step as f64 * (n - 1 - i) as f64) as f32 as f64
                }
            })
            .collect()
    } else {
        let step = (hi - lo) / (n - 1) as f64;
        (0..n)
            .map(|i| {
                if i < n / 2 {
                    lo + step * i as f64
                } else {
                    hi - step * (n - 1 - i) as f64
                }
            })
            .collect()
    }
}

/// PyTorch's bin for `v` among equal-bin `edges` (`None` when not counted).
fn linear_bin(v: f64, edges: &[f64], f32_: bool) -> Option<usize> {
    let bins = edges.len() - 1;
    let (l, r) = (edges[0], edges[bins]);
    if !(v >= l && v <= r) {
        return None;
    }
    let guess = if f32_ {
        ((v as f32 - l as f32) * bins as f32 / (r as f32 - l as f32)) as i64
    } else {
        ((v - l) * bins as f64 / (r - l)) as i64
    };
    let lo = (guess - 1).max(0) as usize;
    let hi = ((guess + 2) as usize).min(bins + 1);
    let pos = lo + edges[lo..hi].iter().filter(|&&e| e <= v).count() - 1;
    Some(pos.min(bins - 1))
}

/// The bin for `v` among given non-decreasing `edges`.
fn given_bin(v: f64, edges: &[f64]) -> Option<usize> {
    let bins = edges.len() - 1;
    if !(v >= edges[0] && v <= edges[bins]) {
        return None;
    }
    Some((edges.iter().filter(|&&e| e <= v).count() - 1).min(bins - 1))
}

/// Divides `hist` (row-major over `bins`) by its total and each bin's widths.
fn density(hist: &mut [f64], edges: &[Vec<f64>]) {
    let total: f64 = hist.iter().sum();
    for (flat, h) in hist.iter_mut().enumerate() {
        let mut rest = flat;
        let mut volume = 1.0;
        for e in edges.iter().rev() {
            let b = rest % (e.len() - 1);
            rest /= e.len() - 1;
            volume *= e[b + 1] - e[b];
        }
        *h /= total * volume;
    }
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: [{i}] {g} vs {w}\n{got:?}\n{want:?}");
    }
}

#[test]
fn pytorchs_documented_examples() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 1.0], [3]);
    let (hist, edges) = x.histogram(
        4,
        Some((0.0, 3.0)),
        Some(&Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3])),
        false,
    );
    assert_eq!(f32s(&hist), vec![0.0, 5.0, 2.0, 0.0]);
    assert_eq!(f32s(&edges), vec![0.0, 0.75, 1.5, 2.25, 3.0]);
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3]);
    let (d, _) = x.histogram(4, Some((0.0, 3.0)), Some(&w), true);
    close(
        &f64s(&d.cast(DType::F64)),
        &[0.0, 5.0 / 7.0 / 0.75, 2.0 / 7.0 / 0.75, 0.0],
        1e-6,
        "density",
    );

    let p = Tensor::from_vec(vec![0.0f32, 1.0, 1.0, 0.0, 2.0, 0.0, 2.0, 2.0], [4, 2]);
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 4.0, 8.0], [4]);
    let (hist, edges) = p.histogramdd(&[3, 3], None, Some(&w), false);
    assert_eq!(hist.shape(), &[3, 3]);
    assert_eq!(
        f32s(&hist),
        vec![0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 4.0, 0.0, 8.0]
    );
    assert_eq!(edges.len(), 2);
    assert_eq!(f32s(&edges[0]), vec![0.0, 0.666_666_7, 1.333_333_3, 2.0]);
    let q = Tensor::from_vec(vec![0.0f32, 0.0, 1.0, 1.0, 2.0, 2.0], [3, 2]);
    let (hist, _) = q.histogramdd(&[2, 2], Some(&[(0.0, 1.0), (0.0, 1.0)]), None, true);
    assert_eq!(f32s(&hist), vec![2.0, 0.0, 0.0, 2.0]);
}

#[test]
fn edge_cases_by_hand() {
    // An empty input without a range: [0, 1], nothing counted.
    let (hist, edges) = Tensor::zeros([0]).histogram(3, None, None, false);
    assert_eq!(f32s(&hist), vec![0.0; 3]);
    close(
        &f64s(&edges.cast(DType::F64)),
        &linspace(0.0, 1.0, 4, true),
        0.0,
        "empty",
    );
    // A single value: widened by 0.5 each side (histc widens by 1).
    let one = Tensor::from_vec(vec![2.0f64, 2.0], [2]);
    let (hist, edges) = one.histogram(2, None, None, false);
    assert_eq!(
        (f64s(&hist), f64s(&edges)),
        (vec![0.0, 2.0], vec![1.5, 2.0, 2.5])
    );
    // Range given as one point: widened too.
    let (_, edges) = one.histogram(1, Some((4.0, 4.0)), None, false);
    assert_eq!(f64s(&edges), vec![3.5, 4.5]);
    // NaN and values outside are skipped; the last bin includes its edge; a NaN weight of
    // a skipped value does not leak in.
    let x = Tensor::from_vec(vec![f64::NAN, -1.0, 0.0, 0.5, 1.0, 7.0], [6]);
    let w = Tensor::from_vec(vec![f64::NAN, f64::NAN, 1.0, 2.0, 4.0, f64::NAN], [6]);
    let (hist, _) = x.histogram(2, Some((0.0, 1.0)), Some(&w), false);
    assert_eq!(f64s(&hist), vec![1.0, 6.0]);
    // Given edges with a repeated edge: the empty bin stays empty.
    let e = Tensor::from_vec(vec![0.0f64, 1.0, 1.0, 2.0], [4]);
    let v = Tensor::from_vec(vec![0.5f64, 1.0, 1.5, 2.0], [4]);
    assert_eq!(
        f64s(&v.histogram_with_edges(&e, None, false).0),
        vec![1.0, 0.0, 3.0]
    );
    // All weight outside: density is 0/0, NaN as in PyTorch.
    let (d, _) = v.histogram(2, Some((5.0, 6.0)), None, true);
    assert!(f64s(&d).iter().all(|x| x.is_nan()));
    // Half types count in f32 and return their dtype.
    let h = Tensor::from_vec(vec![1.0f32, 2.0, 1.0], [3]).cast(DType::BF16);
    let (hist, edges) = h.histogram(4, Some((0.0, 3.0)), None, false);
    assert_eq!((hist.dtype(), edges.dtype()), (DType::BF16, DType::BF16));
    assert_eq!(f32s(&hist.cast(DType::F32)), vec![0.0, 2.0, 1.0, 0.0]);
}

#[test]
fn random_histograms_match_pytorchs_rule() {
    let mut rng = Rng(0x4157_0C4A);
    for case in 0..60 {
        let f32_ = case % 2 == 0;
        let bins = 1 + rng.below(30);
        let n = rng.below(200);
        let (lo, hi) = (
            -(rng.below(4) as f64) - 0.3,
            0.7 + rng.below(5) as f64 / 3.0,
        );
        let given_range = case % 3 != 0;
        let mut vals = uniform(&mut rng, n, lo - 0.4, hi + 0.4);
        if !given_range && n >= 2 {
            // The data's extremes, kept apart from the values moved onto edges below.
            vals[0] = lo - 0.4;
            vals[n - 1] = hi + 0.4;
        }
        if f32_ {
            vals.iter_mut().for_each(|v| *v = *v as f32 as f64);
        }
        let (rlo, rhi) = if given_range {
            (lo, hi)
        } else if n == 0 {
            (0.0, 1.0)
        } else {
            let mn = vals.iter().copied().fold(f64::INFINITY, f64::min);
            let mx = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (mn, mx)
        };
        let edges = linspace(rlo, rhi, bins + 1, f32_);
        // Put every third value on an edge.
        for (i, v) in vals.iter_mut().enumerate() {
            if i % 3 == 0 && i > 0 && i + 1 < n {
                *v = edges[i % (bins + 1)];
            }
        }
        let weights = uniform(&mut rng, n, 0.0, 2.0);
        let weights: Vec<f64> = if f32_ {
            weights.iter().map(|&w| w as f32 as f64).collect()
        } else {
            weights
        };
        let with_weight = case % 4 < 2;
        let dens = case % 5 == 1;
        let mut want = vec![0.0; bins];
        for (v, w) in vals.iter().zip(&weights) {
            if let Some(b) = linear_bin(*v, &edges, f32_) {
                want[b] += if with_weight { *w } else { 1.0 };
            }
        }
        if dens {
            density(&mut want, std::slice::from_ref(&edges));
        }
        let dt = if f32_ { DType::F32 } else { DType::F64 };
        // As a transposed view when there is a shape for it.
        let x = if n.is_multiple_of(2) && n > 0 {
            Tensor::from_vec(vals.clone(), [2, n / 2])
                .cast(dt)
                .t()
                .contiguous()
                .t()
        } else {
            Tensor::from_vec(vals.clone(), [n]).cast(dt)
        };
        let w = Tensor::from_vec(weights.clone(), x.shape()).cast(dt);
        let range = given_range.then_some((lo, hi));
        let (hist, got_edges) = x.histogram(bins, range, with_weight.then_some(&w), dens);
        let what = format!("case {case}: {bins} bins over [{rlo}, {rhi}], n {n}, {dt}");
        close(&f64s(&got_edges.cast(DType::F64)), &edges, 0.0, &what);
        let tol = if f32_ { 1e-5 } else { 1e-12 };
        close(&f64s(&hist.cast(DType::F64)), &want, tol, &what);

        // The same values over random given edges (sorted, some repeated).
        let count = 2 + rng.below(8);
        let mut given = uniform(&mut rng, count, lo, hi);
        given.sort_by(f64::total_cmp);
        if given.len() > 3 {
            given[2] = given[1];
        }
        if f32_ {
            given.iter_mut().for_each(|v| *v = *v as f32 as f64);
        }
        let mut want = vec![0.0; given.len() - 1];
        for (v, w) in vals.iter().zip(&weights) {
            if let Some(b) = given_bin(*v, &given) {
                want[b] += if with_weight { *w } else { 1.0 };
            }
        }
        let et = Tensor::from_vec(given.clone(), [given.len()]).cast(dt);
        let (hist, copy) = x.histogram_with_edges(&et, with_weight.then_some(&w), false);
        close(&f64s(&copy.cast(DType::F64)), &given, 0.0, &what);
        close(&f64s(&hist.cast(DType::F64)), &want, tol, &what);
    }
}

#[test]
fn random_multidimensional_histograms() {
    let mut rng = Rng(0xDD_2024);
    for case in 0..30 {
        let d = 1 + rng.below(3);
        let n = 1 + rng.below(120);
        let bins: Vec<usize> = (0..d).map(|_| 1 + rng.below(6)).collect();
        let pts = uniform(&mut rng, n * d, -1.0, 2.0);
        let weights = uniform(&mut rng, n, 0.5, 1.5);
        let ranges: Vec<(f64, f64)> = (0..d).map(|k| (-0.5 + k as f64 * 0.1, 1.5)).collect();
        let given_range = case % 2 == 0;
        let dens = case % 3 == 0;
        let outer: Vec<(f64, f64)> = (0..d)
            .map(|k| {
                if given_range {
                    ranges[k]
                } else {
                    let col = (0..n).map(|i| pts[i * d + k]);
                    let mn = col.clone().fold(f64::INFINITY, f64::min);
                    let mx = col.fold(f64::NEG_INFINITY, f64::max);
                    if mn == mx {
                        (mn - 0.5, mx + 0.5)
                    } else {
                        (mn, mx)
                    }
                }
            })
            .collect();
        let edges: Vec<Vec<f64>> = (0..d)
            .map(|k| linspace(outer[k].0, outer[k].1, bins[k] + 1, false))
            .collect();
        let total: usize = bins.iter().product();
        let mut want = vec![0.0; total];
        'points: for i in 0..n {
            let mut flat = 0;
            for k in 0..d {
                match linear_bin(pts[i * d + k], &edges[k], false) {
                    Some(b) => flat = flat * bins[k] + b,
                    None => continue 'points,
                }
            }
            want[flat] += weights[i];
        }
        if dens {
            density(&mut want, &edges);
        }
        // Points as [n/… , …, d] when n is even: a leading shape of two dimensions.
        let shape: Vec<usize> = if n.is_multiple_of(2) {
            vec![2, n / 2, d]
        } else {
            vec![n, d]
        };
        let x = Tensor::from_vec(pts.clone(), &shape[..]);
        let w = Tensor::from_vec(weights.clone(), &shape[..shape.len() - 1]);
        let range = given_range.then_some(&ranges[..]);
        let (hist, got_edges) = x.histogramdd(&bins, range, Some(&w), dens);
        let what = format!("case {case}: bins {bins:?}, n {n}");
        assert_eq!(hist.shape(), &bins[..], "{what}");
        close(&f64s(&hist), &want, 1e-12, &what);
        for (g, e) in got_edges.iter().zip(&edges) {
            close(&f64s(g), e, 0.0, &what);
        }
        // The same edges given as tensors.
        let ets: Vec<Tensor> = edges
            .iter()
            .map(|e| Tensor::from_vec(e.clone(), [e.len()]))
            .collect();
        let refs: Vec<&Tensor> = ets.iter().collect();
        let (hist2, _) = x.histogramdd_with_edges(&refs, Some(&w), dens);
        // Given edges use the count of edges at or below each value, the same bins here.
        close(&f64s(&hist2), &want, 1e-12, &what);
    }
}

#[test]
fn bad_arguments_are_refused() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let e = Tensor::from_vec(vec![1i64], [1])
        .try_histogram(3, None, None, false)
        .unwrap_err();
    assert!(matches!(e, KilnError::UnsupportedDType { .. }), "{e}");
    let msg = |e: KilnError| e.to_string();
    assert!(msg(x.try_histogram(0, None, None, false).unwrap_err()).contains("bins must be > 0"));
    assert!(
        msg(x
            .try_histogram(2, Some((2.0, 1.0)), None, false)
            .unwrap_err())
        .contains("min should not exceed max")
    );
    assert!(
        msg(x
            .try_histogram(2, Some((0.0, f64::INFINITY)), None, false)
            .unwrap_err())
        .contains("not finite")
    );
    let nan = Tensor::from_vec(vec![f32::NAN, 1.0], [2]);
    assert!(msg(nan.try_histogram(2, None, None, false).unwrap_err()).contains("not finite"));
    let e = x
        .try_histogram(2, None, Some(&Tensor::ones_dtype([3], DType::F64)), false)
        .unwrap_err();
    assert!(matches!(e, KilnError::DTypeMismatch { .. }), "{e}");
    let e = x
        .try_histogram(2, None, Some(&Tensor::ones([4])), false)
        .unwrap_err();
    assert!(matches!(e, KilnError::ShapeMismatch { .. }), "{e}");
    let unsorted = Tensor::from_vec(vec![0.0f32, 2.0, 1.0], [3]);
    let e = x
        .try_histogram_with_edges(&unsorted, None, false)
        .unwrap_err();
    assert!(e.to_string().contains("non-decreasing"), "{e}");
    let e = x
        .try_histogram_with_edges(&Tensor::zeros([1]), None, false)
        .unwrap_err();
    assert!(e.to_string().contains("at least two"), "{e}");
    let e = x
        .try_histogram_with_edges(&Tensor::zeros_dtype([3], DType::F64), None, false)
        .unwrap_err();
    assert!(matches!(e, KilnError::DTypeMismatch { .. }), "{e}");
    // histogramdd: 1-D input, bin counts and ranges of the wrong length.
    assert!(msg(x.try_histogramdd(&[2], None, None, false).unwrap_err()).contains("at least 2"));
    let p = Tensor::zeros([4, 2]);
    assert!(p.try_histogramdd(&[2, 2, 2], None, None, false).is_err());
    assert!(
        p.try_histogramdd(&[2], Some(&[(0.0, 1.0)]), None, false)
            .is_err()
    );
    let e = p.try_histogramdd(&[2, 0], None, None, false).unwrap_err();
    assert!(e.to_string().contains("dimension 1"), "{e}");
    let e = p
        .try_histogramdd(&[2], None, Some(&Tensor::ones([4, 2])), false)
        .unwrap_err();
    assert!(matches!(e, KilnError::ShapeMismatch { .. }), "{e}");
}
