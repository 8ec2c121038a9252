//! `kl_div`, `poisson_nll_loss` and the margin losses: PyTorch's documented formulas as
//! plain f64 loops over random inputs (targets of every kind the formulas distinguish,
//! zeros and ±1 included), hand-computed values, reductions, and the errors.

mod common;

use common::Rng;
use kiln::Tensor;
use kiln::nn::functional::{
    KlDivReduction, Reduction, cosine_embedding_loss, hinge_embedding_loss, kl_div,
    margin_ranking_loss, multilabel_soft_margin_loss, poisson_nll_loss, soft_margin_loss,
    triplet_margin_loss,
};

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| lo + (hi - lo) * (rng.next() >> 11) as f64 / (1u64 << 53) as f64)
        .collect()
}

fn signs(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| if rng.below(2) == 0 { 1.0 } else { -1.0 })
        .collect()
}

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape)
}

fn got(x: &Tensor) -> Vec<f64> {
    x.to_vec::<f64>().unwrap()
}

fn close(name: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()),
            "{name}[{i}]: kiln {g}, reference {w}"
        );
    }
}

/// Checks every reduction of a pointwise loss against its per-element values.
fn reductions(name: &str, f: impl Fn(Reduction) -> Tensor, each: &[f64]) {
    close(name, &got(&f(Reduction::None)), each);
    let sum: f64 = each.iter().sum();
    close(&format!("{name} sum"), &got(&f(Reduction::Sum)), &[sum]);
    close(
        &format!("{name} mean"),
        &got(&f(Reduction::Mean)),
        &[sum / each.len() as f64],
    );
}

#[test]
fn kl_div_and_poisson_nll_match_their_formulas() {
    let mut rng = Rng(0x7A11);
    let (n, c) = (4, 5);
    let input = uniform(&mut rng, n * c, -3.0, 0.0);
    let mut target = uniform(&mut rng, n * c, 0.0, 1.0);
    target[3] = 0.0; // 0·ln 0 = 0
    target[7] = 0.0;
    let (x, y) = (t(&input, &[n, c]), t(&target, &[n, c]));
    let each: Vec<f64> = input
        .iter()
        .zip(&target)
        .map(|(&i, &t)| if t == 0.0 { 0.0 } else { t * (t.ln() - i) })
        .collect();
    close(
        "kl_div none",
        &got(&kl_div(&x, &y, KlDivReduction::None, false).unwrap()),
        &each,
    );
    let sum: f64 = each.iter().sum();
    close(
        "kl_div batchmean",
        &got(&kl_div(&x, &y, KlDivReduction::BatchMean, false).unwrap()),
        &[sum / n as f64],
    );
    close(
        "kl_div mean",
        &got(&kl_div(&x, &y, KlDivReduction::Mean, false).unwrap()),
        &[sum / (n * c) as f64],
    );
    close(
        "kl_div sum",
        &got(&kl_div(&x, &y, KlDivReduction::Sum, false).unwrap()),
        &[sum],
    );
    // log_target: the target given as log-probabilities.
    let log_t: Vec<f64> = uniform(&mut rng, n * c, -4.0, 0.0);
    let each: Vec<f64> = input
        .iter()
        .zip(&log_t)
        .map(|(&i, &lt)| lt.exp() * (lt - i))
        .collect();
    close(
        "kl_div log_target",
        &got(&kl_div(&x, &t(&log_t, &[n, c]), KlDivReduction::None, true).unwrap()),
        &each,
    );
    // A target of zero gives a finite gradient to the input and the target.
    let xi = x.detach().requires_grad_(true);
    let yi = y.detach().requires_grad_(true);
    kl_div(&xi, &yi, KlDivReduction::Sum, false)
        .unwrap()
        .backward()
        .unwrap();
    let gx = got(&xi.grad().unwrap());
    let gy = got(&yi.grad().unwrap());
    for k in 0..n * c {
        assert_eq!(gx[k], -target[k], "d/dinput at {k}");
        if target[k] != 0.0 {
            close("d/dtarget", &[gy[k]], &[target[k].ln() + 1.0 - input[k]]);
        }
    }
    assert!(gy.iter().all(|g| g.is_finite()), "{gy:?}");

    // Poisson: log input (the default) and rates, with Stirling's term where target > 1.
    let rates = uniform(&mut rng, 12, 0.1, 3.0);
    let counts: Vec<f64> = (0..12).map(|k| (k % 5) as f64).collect();
    for (log_input, full) in [(true, false), (true, true), (false, false), (false, true)] {
        let each: Vec<f64> = rates
            .iter()
            .zip(&counts)
            .map(|(&r, &k)| {
                let mut l = if log_input {
                    r.exp() - k * r
                } else {
                    r - k * (r + 1e-8).ln()
                };
                if full && k > 1.0 {
                    l += k * k.ln() - k + 0.5 * (2.0 * std::f64::consts::PI * k).ln();
                }
                l
            })
            .collect();
        reductions(
            &format!("poisson log_input={log_input} full={full}"),
            |r| {
                poisson_nll_loss(
                    &t(&rates, &[12]),
                    &t(&counts, &[12]),
                    log_input,
                    full,
                    1e-8,
                    r,
                )
                .unwrap()
            },
            &each,
        );
    }
}

#[test]
fn margin_losses_match_their_formulas() {
    let mut rng = Rng(0x3A26);
    let n = 16;
    let (a, b) = (
        uniform(&mut rng, n, -2.0, 2.0),
        uniform(&mut rng, n, -2.0, 2.0),
    );
    let y = signs(&mut rng, n);
    let each: Vec<f64> = (0..n)
        .map(|i| (-y[i] * (a[i] - b[i]) + 0.3).max(0.0))
        .collect();
    reductions(
        "margin_ranking",
        |r| margin_ranking_loss(&t(&a, &[n]), &t(&b, &[n]), &t(&y, &[n]), 0.3, r).unwrap(),
        &each,
    );
    // Hinge embedding, with a target that is neither 1 nor -1 (both terms, as PyTorch).
    let mut yh = y.clone();
    yh[0] = 0.0;
    let each: Vec<f64> = (0..n)
        .map(|i| {
            let m = if yh[i] != 1.0 {
                (1.5 - a[i]).max(0.0)
            } else {
                0.0
            };
            let s = if yh[i] != -1.0 { a[i] } else { 0.0 };
            m + s
        })
        .collect();
    reductions(
        "hinge_embedding",
        |r| hinge_embedding_loss(&t(&a, &[n]), &t(&yh, &[n]), 1.5, r).unwrap(),
        &each,
    );
    let each: Vec<f64> = (0..n).map(|i| (1.0 + (-y[i] * a[i]).exp()).ln()).collect();
    reductions(
        "soft_margin",
        |r| soft_margin_loss(&t(&a, &[n]), &t(&y, &[n]), r).unwrap(),
        &each,
    );
    // A large margin does not overflow.
    let big = soft_margin_loss(&t(&[-200.0], &[1]), &t(&[1.0], &[1]), Reduction::Sum).unwrap();
    close("soft_margin(-200)", &got(&big), &[200.0]);

    // Multilabel soft margin over [N, C] with class weights.
    let (rows, c) = (4, 4);
    let x = uniform(&mut rng, rows * c, -3.0, 3.0);
    let lab: Vec<f64> = (0..rows * c).map(|_| rng.below(2) as f64).collect();
    let w = uniform(&mut rng, c, 0.5, 2.0);
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let each: Vec<f64> = (0..rows)
        .map(|r| {
            -(0..c)
                .map(|k| {
                    let (v, l) = (x[r * c + k], lab[r * c + k]);
                    w[k] * (l * sig(v).ln() + (1.0 - l) * sig(-v).ln())
                })
                .sum::<f64>()
                / c as f64
        })
        .collect();
    let (xt, lt, wt) = (t(&x, &[rows, c]), t(&lab, &[rows, c]), t(&w, &[c]));
    let per_row = multilabel_soft_margin_loss(&xt, &lt, Some(&wt), Reduction::None).unwrap();
    for (g, e) in got(&per_row).iter().zip(&each) {
        assert!((g - e).abs() < 1e-10, "multilabel: {g} vs {e}");
    }

    // Cosine embedding over [N, D] with PyTorch's ε inside the root.
    let (rows, d) = (6, 3);
    let (p, q) = (
        uniform(&mut rng, rows * d, -1.0, 1.0),
        uniform(&mut rng, rows * d, -1.0, 1.0),
    );
    let yc = signs(&mut rng, rows);
    let each: Vec<f64> = (0..rows)
        .map(|r| {
            let (u, v) = (&p[r * d..(r + 1) * d], &q[r * d..(r + 1) * d]);
            let dot: f64 = u.iter().zip(v).map(|(a, b)| a * b).sum();
            let m1: f64 = u.iter().map(|a| a * a).sum::<f64>() + 1e-12;
            let m2: f64 = v.iter().map(|a| a * a).sum::<f64>() + 1e-12;
            let cos = dot / (m1 * m2).sqrt();
            if yc[r] == 1.0 {
                1.0 - cos
            } else {
                (cos - 0.2).max(0.0)
            }
        })
        .collect();
    reductions(
        "cosine_embedding",
        |r| {
            cosine_embedding_loss(
                &t(&p, &[rows, d]),
                &t(&q, &[rows, d]),
                &t(&yc, &[rows]),
                0.2,
                r,
            )
            .unwrap()
        },
        &each,
    );

    // Triplet margin with p = 2 and p = 1, with and without the swap.
    let n3 = uniform(&mut rng, rows * d, -1.0, 1.0);
    let dist = |u: &[f64], v: &[f64], pw: f64| -> f64 {
        u.iter()
            .zip(v)
            .map(|(a, b)| (a - b + 1e-6).abs().powf(pw))
            .sum::<f64>()
            .powf(1.0 / pw)
    };
    for (pw, swap) in [(2.0, false), (2.0, true), (1.0, false)] {
        let each: Vec<f64> = (0..rows)
            .map(|r| {
                let s = r * d..(r + 1) * d;
                let (an, po, ne) = (&p[s.clone()], &q[s.clone()], &n3[s]);
                let mut dn = dist(an, ne, pw);
                if swap {
                    dn = dn.min(dist(po, ne, pw));
                }
                (dist(an, po, pw) - dn + 1.0).max(0.0)
            })
            .collect();
        let l = triplet_margin_loss(
            &t(&p, &[rows, d]),
            &t(&q, &[rows, d]),
            &t(&n3, &[rows, d]),
            1.0,
            pw,
            1e-6,
            swap,
            Reduction::None,
        )
        .unwrap();
        for (g, e) in got(&l).iter().zip(&each) {
            assert!(
                (g - e).abs() < 1e-10,
                "triplet p={pw} swap={swap}: {g} vs {e}"
            );
        }
    }
}

#[test]
fn losses_refuse_bad_inputs() {
    let ints = Tensor::from_vec(vec![1i64, 2], [2]);
    let f = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    assert!(kl_div(&ints, &f, KlDivReduction::Mean, false).is_err());
    assert!(margin_ranking_loss(&ints, &ints, &ints, 0.0, Reduction::Mean).is_err());
    assert!(
        multilabel_soft_margin_loss(&Tensor::zeros([1, 2, 3]), &f, None, Reduction::Mean).is_err()
    );
    let e = cosine_embedding_loss(
        &Tensor::zeros([2, 3]),
        &Tensor::zeros([2, 4]),
        &f,
        0.0,
        Reduction::Mean,
    )
    .unwrap_err();
    assert!(e.to_string().contains("cosine_embedding_loss"), "{e}");
}
