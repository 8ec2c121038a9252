//! `gaussian_nll_loss`, `multi_margin_loss` and `multilabel_margin_loss`: random shapes and
//! options against plain f64 loops written here from PyTorch's formulas, PyTorch's
//! documented values, errors, and central finite-difference gradient checks in f64.

mod common;
mod fd_helpers;

use common::Rng;
use fd_helpers::{assert_close, gradcheck, values};
use kiln::nn::functional::{
    Reduction, gaussian_nll_loss, multi_margin_loss, multilabel_margin_loss,
};
use kiln::{KilnError, Tensor};

fn reduced(per: &[f64], r: Reduction) -> Vec<f64> {
    match r {
        Reduction::None => per.to_vec(),
        Reduction::Sum => vec![per.iter().sum()],
        Reduction::Mean => vec![per.iter().sum::<f64>() / per.len() as f64],
    }
}

const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Sum, Reduction::Mean];

#[test]
fn gaussian_nll_matches_its_formula() {
    let mut rng = Rng(11);
    for case in 0..18 {
        let r = REDUCTIONS[case % 3];
        let full = case % 2 == 0;
        let (n, d) = (1 + rng.below(4), 1 + rng.below(4));
        let x = values(&mut rng, n * d, -2.0, 2.0);
        let y = values(&mut rng, n * d, -2.0, 2.0);
        // var: full shape, last dimension 1, or last dimension dropped; some below eps.
        let form = (case / 3) % 3;
        let vn = if form == 0 { n * d } else { n };
        let mut v = values(&mut rng, vn, 0.0, 2.0);
        v[0] = 1e-9;
        let eps = 1e-3;
        let per: Vec<f64> = (0..n * d)
            .map(|i| {
                let var = if form == 0 { v[i] } else { v[i / d] }.max(eps);
                let mut l = 0.5 * (var.ln() + (x[i] - y[i]).powi(2) / var);
                if full {
                    l += 0.5 * (2.0 * std::f64::consts::PI).ln();
                }
                l
            })
            .collect();
        let vshape: Vec<usize> = match form {
            0 => vec![n, d],
            1 => vec![n, 1],
            _ => vec![n],
        };
        let got = gaussian_nll_loss(
            &Tensor::from_vec(x.clone(), [n, d]),
            &Tensor::from_vec(y.clone(), [n, d]),
            &Tensor::from_vec(v.clone(), vshape.as_slice()),
            full,
            eps,
            r,
        )
        .unwrap();
        assert_close(
            &format!("gaussian_nll {r:?} form {form}"),
            &got.to_vec::<f64>().unwrap(),
            &reduced(&per, r),
            1e-12,
        );
        if case < 3 {
            let (yt, vt) = (
                Tensor::from_vec(y.clone(), [n, d]),
                Tensor::from_vec(v.clone(), vshape.as_slice()),
            );
            gradcheck(
                "gaussian_nll d input",
                &x,
                &[n, d],
                &|t| gaussian_nll_loss(t, &yt, &vt, full, eps, Reduction::Mean).unwrap(),
                1e-6,
            );
            // The variance's gradient, away from the clamp (which passes it unclamped).
            let vv: Vec<f64> = v.iter().map(|a| a + 0.5).collect();
            let xt = Tensor::from_vec(x.clone(), [n, d]);
            gradcheck(
                "gaussian_nll d var",
                &vv,
                &vshape,
                &|t| gaussian_nll_loss(&xt, &yt, t, full, eps, Reduction::Sum).unwrap(),
                1e-6,
            );
        }
    }
    // The clamp has no gradient: below eps the variance's gradient is the unclamped
    // formula's at the clamped value, d/dv ½(ln v + d²/v) = ½(1/v - d²/v²) at v = eps.
    let v = Tensor::from_vec(vec![1e-9f64], [1]).requires_grad_(true);
    let x = Tensor::from_vec(vec![0.1f64], [1]);
    gaussian_nll_loss(&x, &Tensor::zeros_like(&x), &v, false, 0.5, Reduction::Sum)
        .unwrap()
        .backward()
        .unwrap();
    let g = v.grad().unwrap().item::<f64>().unwrap();
    assert!((g - 0.5 * (2.0 - 0.01 / 0.25)).abs() < 1e-12, "{g}");
    // Errors.
    let e = gaussian_nll_loss(
        &Tensor::ones([2, 3]),
        &Tensor::ones([2, 3]),
        &Tensor::ones([3]),
        false,
        1e-6,
        Reduction::Mean,
    );
    assert!(matches!(e, Err(KilnError::ShapeMismatch { .. })), "{e:?}");
    let e = gaussian_nll_loss(
        &Tensor::ones([2]),
        &Tensor::ones([2]),
        &Tensor::ones([2]),
        false,
        -1.0,
        Reduction::Mean,
    );
    assert!(matches!(e, Err(KilnError::InvalidArgument { .. })), "{e:?}");
}

fn multi_margin_ref(
    x: &[f64],
    c: usize,
    y: &[usize],
    p: u32,
    m: f64,
    w: Option<&[f64]>,
) -> Vec<f64> {
    y.iter()
        .enumerate()
        .map(|(s, &t)| {
            let row = &x[s * c..(s + 1) * c];
            let mut acc = 0.0;
            for i in 0..c {
                if i != t {
                    let z = (m - row[t] + row[i]).max(0.0).powi(p as i32);
                    acc += w.map_or(1.0, |w| w[t]) * z;
                }
            }
            acc / c as f64
        })
        .collect()
}

#[test]
fn multi_margin_matches_its_formula() {
    let mut rng = Rng(23);
    for case in 0..12 {
        let r = REDUCTIONS[case % 3];
        let p = 1 + (case as u32 / 3) % 2;
        let (n, c) = (1 + rng.below(4), 2 + rng.below(4));
        let x = values(&mut rng, n * c, -1.0, 1.0);
        let y: Vec<usize> = (0..n).map(|_| rng.below(c)).collect();
        let w = (case >= 6).then(|| values(&mut rng, c, 0.2, 2.0));
        let margin = 0.5 + case as f64 * 0.1;
        let want = reduced(&multi_margin_ref(&x, c, &y, p, margin, w.as_deref()), r);
        let yt = Tensor::from_vec(y.iter().map(|&v| v as i64).collect::<Vec<_>>(), [n]);
        let wt = w.clone().map(|w| Tensor::from_vec(w, [c]));
        let got = multi_margin_loss(
            &Tensor::from_vec(x.clone(), [n, c]),
            &yt,
            p,
            margin,
            wt.as_ref(),
            r,
        )
        .unwrap();
        assert_close("multi_margin", &got.to_vec::<f64>().unwrap(), &want, 1e-12);
        gradcheck(
            &format!("multi_margin p={p}"),
            &x,
            &[n, c],
            &|t| multi_margin_loss(t, &yt, p, margin, wt.as_ref(), Reduction::Sum).unwrap(),
            1e-6,
        );
    }
    // Unbatched: a scalar target, a scalar loss.
    let x = Tensor::from_vec(vec![0.1f64, 0.2, 0.4, 0.8], [4]);
    let l = multi_margin_loss(&x, &Tensor::scalar(3i64), 1, 1.0, None, Reduction::None).unwrap();
    assert_eq!(l.shape(), &[] as &[usize]);
    assert!((l.item::<f64>().unwrap() - 0.325).abs() < 1e-12);
    // Errors.
    let x2 = Tensor::ones([2, 3]);
    let t2 = Tensor::from_vec(vec![0i64, 1], [2]);
    let e = multi_margin_loss(&x2, &t2, 3, 1.0, None, Reduction::Mean);
    assert!(matches!(e, Err(KilnError::InvalidArgument { .. })), "{e:?}");
    let e = multi_margin_loss(
        &x2,
        &Tensor::from_vec(vec![0i64], [1]),
        1,
        1.0,
        None,
        Reduction::Mean,
    );
    assert!(matches!(e, Err(KilnError::ShapeMismatch { .. })), "{e:?}");
    let e = multi_margin_loss(&x2, &t2, 1, 1.0, Some(&Tensor::ones([2])), Reduction::Mean);
    assert!(matches!(e, Err(KilnError::ShapeMismatch { .. })), "{e:?}");
    let e = multi_margin_loss(&x2, &Tensor::ones([2]), 1, 1.0, None, Reduction::Mean);
    assert!(
        matches!(e, Err(KilnError::UnsupportedDType { .. })),
        "{e:?}"
    );
}

fn multilabel_ref(x: &[f64], c: usize, y: &[i64]) -> Vec<f64> {
    (0..x.len() / c)
        .map(|s| {
            let row = &x[s * c..(s + 1) * c];
            let t = &y[s * c..(s + 1) * c];
            let listed: Vec<usize> = t
                .iter()
                .take_while(|&&v| v >= 0)
                .map(|&v| v as usize)
                .collect();
            let mut acc = 0.0;
            for &j in &listed {
                for i in 0..c {
                    if !listed.contains(&i) {
                        acc += (1.0 - (row[j] - row[i])).max(0.0);
                    }
                }
            }
            acc / c as f64
        })
        .collect()
}

#[test]
fn multilabel_margin_matches_its_formula() {
    let mut rng = Rng(37);
    for case in 0..12 {
        let r = REDUCTIONS[case % 3];
        let (n, c) = (1 + rng.below(4), 2 + rng.below(4));
        let x = values(&mut rng, n * c, -1.0, 1.0);
        // Random lists, a -1 somewhere (entries after it ignored, even valid ones), repeats.
        let y: Vec<i64> = (0..n * c)
            .map(|_| {
                if rng.below(4) == 0 {
                    -1
                } else {
                    rng.below(c) as i64
                }
            })
            .collect();
        let want = reduced(&multilabel_ref(&x, c, &y), r);
        let yt = Tensor::from_vec(y.clone(), [n, c]);
        let got = multilabel_margin_loss(&Tensor::from_vec(x.clone(), [n, c]), &yt, r).unwrap();
        assert_close(
            &format!("multilabel_margin {y:?}"),
            &got.to_vec::<f64>().unwrap(),
            &want,
            1e-12,
        );
        gradcheck(
            "multilabel_margin",
            &x,
            &[n, c],
            &|t| multilabel_margin_loss(t, &yt, Reduction::Mean).unwrap(),
            1e-6,
        );
    }
    // PyTorch's documented example, unbatched.
    let x = Tensor::from_vec(vec![0.1f64, 0.2, 0.4, 0.8], [4]);
    let y = Tensor::from_vec(vec![3i64, 0, -1, 1], [4]);
    let l = multilabel_margin_loss(&x, &y, Reduction::None).unwrap();
    assert_eq!(l.shape(), &[] as &[usize]);
    assert!((l.item::<f64>().unwrap() - 0.85).abs() < 1e-12);
    let e = multilabel_margin_loss(&Tensor::ones([2, 3]), &y, Reduction::Mean);
    assert!(matches!(e, Err(KilnError::ShapeMismatch { .. })), "{e:?}");
    let e = multilabel_margin_loss(
        &Tensor::ones([2, 2, 2]),
        &Tensor::ones([2, 2, 2]),
        Reduction::Mean,
    );
    assert!(matches!(e, Err(KilnError::InvalidArgument { .. })), "{e:?}");
}
