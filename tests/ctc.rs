//! `ctc_loss` / `nn::CtcLoss`: against a brute-force sum over every alignment and a plain
//! f64 loop of the forward recursion (in probability space, written here), PyTorch's
//! documented behaviour (the mean over target lengths, `zero_infinity`, both target
//! layouts, unbatched input), the error cases, and central finite-difference gradients.

mod common;
mod fd_helpers;

use common::Rng;
use fd_helpers::{assert_close, gradcheck, values};
use kiln::nn::CtcLoss;
use kiln::nn::functional::{CtcLossOptions, Reduction, ctc_loss, ctc_loss_with, log_softmax};
use kiln::{DType, KilnError, Tensor};

/// Log-softmax of each row of `c` values.
fn log_softmax_rows(x: &[f64], c: usize) -> Vec<f64> {
    x.chunks(c)
        .flat_map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            row.iter().map(move |v| v - lse).collect::<Vec<_>>()
        })
        .collect()
}

/// Random log-probabilities `[t, n, c]`.
fn random_log_probs(rng: &mut Rng, t: usize, n: usize, c: usize) -> Vec<f64> {
    log_softmax_rows(&values(rng, t * n * c, -2.0, 2.0), c)
}

/// Up to `most` random labels in `0..c` other than `blank`, some repeated back to back.
fn random_labels(rng: &mut Rng, most: usize, c: usize, blank: usize) -> Vec<i64> {
    let len = rng.below(most + 1);
    let mut out: Vec<i64> = Vec::with_capacity(len);
    for _ in 0..len {
        if !out.is_empty() && rng.below(4) == 0 {
            out.push(*out.last().unwrap());
            continue;
        }
        let mut k = rng.below(c - 1);
        if k >= blank {
            k += 1;
        }
        out.push(k as i64);
    }
    out
}

/// Sample `b`'s log-probability of class `k` at step `t` in the `[T, n, c]` `lp`.
fn sample(lp: &[f64], n: usize, c: usize, b: usize) -> impl Fn(usize, usize) -> f64 + '_ {
    move |t, k| lp[(t * n + b) * c + k]
}

/// `-ln` of the summed probability of every path over `0..c` of length `steps` that
/// collapses (merge repeats, drop blanks) to `labels`, `lp(t, k)` the log-probabilities.
fn brute_force(
    lp: &dyn Fn(usize, usize) -> f64,
    c: usize,
    steps: usize,
    labels: &[i64],
    blank: usize,
) -> f64 {
    let mut total = 0.0;
    let mut path = vec![0usize; steps];
    for code in 0..c.pow(steps as u32) {
        let mut rest = code;
        for p in path.iter_mut() {
            *p = rest % c;
            rest /= c;
        }
        let mut collapsed = Vec::new();
        for (i, &k) in path.iter().enumerate() {
            if (i == 0 || path[i - 1] != k) && k != blank {
                collapsed.push(k as i64);
            }
        }
        if collapsed == labels {
            total += path
                .iter()
                .enumerate()
                .map(|(t, &k)| lp(t, k))
                .sum::<f64>()
                .exp();
        }
    }
    -total.ln()
}

/// The forward recursion in probability space: `-ln p`, `lp(t, k)` the log-probabilities.
fn alpha_loop(lp: &dyn Fn(usize, usize) -> f64, steps: usize, labels: &[i64], blank: usize) -> f64 {
    if steps == 0 {
        return if labels.is_empty() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let mut ext = vec![blank];
    for &l in labels {
        ext.push(l as usize);
        ext.push(blank);
    }
    let y = |t: usize, k: usize| lp(t, k).exp();
    let mut alpha = vec![0.0; ext.len()];
    alpha[0] = y(0, ext[0]);
    if ext.len() > 1 {
        alpha[1] = y(0, ext[1]);
    }
    for t in 1..steps {
        let prev = alpha.clone();
        for s in 0..ext.len() {
            let mut a = prev[s];
            if s >= 1 {
                a += prev[s - 1];
            }
            if s >= 2 && ext[s] != blank && ext[s] != ext[s - 2] {
                a += prev[s - 2];
            }
            alpha[s] = a * y(t, ext[s]);
        }
    }
    let k = ext.len();
    let p = if k > 1 {
        alpha[k - 1] + alpha[k - 2]
    } else {
        alpha[0]
    };
    -p.ln()
}

/// The per-sample losses reduced as PyTorch reduces them.
fn reduced(per: &[f64], target_lengths: &[i64], r: Reduction) -> Vec<f64> {
    match r {
        Reduction::None => per.to_vec(),
        Reduction::Sum => vec![per.iter().sum()],
        Reduction::Mean => vec![
            per.iter()
                .zip(target_lengths)
                .map(|(l, &t)| l / t.max(1) as f64)
                .sum::<f64>()
                / per.len() as f64,
        ],
    }
}

fn opts(blank: usize, reduction: Reduction, zero_infinity: bool) -> CtcLossOptions {
    CtcLossOptions {
        blank,
        reduction,
        zero_infinity,
    }
}

fn lengths(v: &[i64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), [v.len()])
}

/// Padded `[n, s]` targets (padding `pad`) and the concatenated form of `labels`.
fn layouts(labels: &[Vec<i64>], s: usize, pad: i64) -> (Tensor, Tensor) {
    let mut padded = Vec::new();
    for l in labels {
        padded.extend_from_slice(l);
        padded.extend(std::iter::repeat_n(pad, s - l.len()));
    }
    let concat: Vec<i64> = labels.concat();
    let len = concat.len();
    (
        Tensor::from_vec(padded, [labels.len(), s]),
        Tensor::from_vec(concat, [len]),
    )
}

#[test]
fn matches_the_brute_force_sum_over_alignments() {
    let mut rng = Rng(3);
    let mut infinite = 0;
    for case in 0..40 {
        let (t, c) = (1 + rng.below(5), 2 + rng.below(3));
        let n = 1 + rng.below(3);
        let blank = rng.below(c);
        let labels: Vec<Vec<i64>> = (0..n)
            .map(|_| random_labels(&mut rng, 3, c, blank))
            .collect();
        let il: Vec<i64> = (0..n).map(|_| rng.below(t + 1) as i64).collect();
        let tl: Vec<i64> = labels.iter().map(|l| l.len() as i64).collect();
        let lp = random_log_probs(&mut rng, t, n, c);
        let want: Vec<f64> = (0..n)
            .map(|b| brute_force(&sample(&lp, n, c, b), c, il[b] as usize, &labels[b], blank))
            .collect();
        infinite += want.iter().filter(|v| v.is_infinite()).count();
        let (padded, _) = layouts(&labels, 3, 0);
        let got = ctc_loss_with(
            &Tensor::from_vec(lp, [t, n, c]),
            &padded,
            &lengths(&il),
            &lengths(&tl),
            &opts(blank, Reduction::None, false),
        )
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            if w.is_infinite() {
                assert_eq!(*g, f64::INFINITY, "case {case} sample {b}");
            } else {
                assert!(
                    (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
                    "case {case} sample {b}: {g} vs {w}"
                );
            }
        }
    }
    // Some targets did not fit their input lengths.
    assert!(infinite > 0);
}

#[test]
fn random_batches_match_the_forward_recursion() {
    let mut rng = Rng(17);
    for case in 0..30 {
        let (t, n, c) = (1 + rng.below(12), 1 + rng.below(5), 2 + rng.below(5));
        let blank = if case % 3 == 0 { c - 1 } else { rng.below(c) };
        let s = rng.below(6);
        let labels: Vec<Vec<i64>> = (0..n)
            .map(|_| random_labels(&mut rng, s, c, blank))
            .collect();
        let il: Vec<i64> = (0..n)
            .map(|_| (t - rng.below(t.min(3) + 1)) as i64)
            .collect();
        let tl: Vec<i64> = labels.iter().map(|l| l.len() as i64).collect();
        let lp = random_log_probs(&mut rng, t, n, c);
        let per: Vec<f64> = (0..n)
            .map(|b| alpha_loop(&sample(&lp, n, c, b), il[b] as usize, &labels[b], blank))
            .collect();
        let r = [Reduction::None, Reduction::Sum, Reduction::Mean][case % 3];
        let zero_infinity = case % 2 == 1;
        let per_z: Vec<f64> = per
            .iter()
            .map(|&v| {
                if zero_infinity && v.is_infinite() {
                    0.0
                } else {
                    v
                }
            })
            .collect();
        let want = reduced(&per_z, &tl, r);
        let (padded, concat) = layouts(&labels, s, -1);
        let x = Tensor::from_vec(lp, [t, n, c]);
        for targets in [&padded, &concat] {
            let got = ctc_loss_with(
                &x,
                targets,
                &lengths(&il),
                &lengths(&tl),
                &opts(blank, r, zero_infinity),
            )
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                if w.is_infinite() {
                    assert_eq!(g, w, "case {case}");
                } else {
                    assert!(
                        (g - w).abs() <= 1e-10 * (1.0 + w.abs()),
                        "case {case}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn both_target_layouts_and_length_forms_agree() {
    let mut rng = Rng(5);
    let (t, n, c) = (7, 4, 5);
    let labels = vec![vec![1, 2, 2], vec![], vec![4], vec![3, 1, 3, 1]];
    let tl = [3i64, 0, 1, 4];
    let il = [7i64, 3, 6, 7];
    let x = Tensor::from_vec(random_log_probs(&mut rng, t, n, c), [t, n, c]);
    // Padding past each target length is never read, even out of the class range.
    let (padded, concat) = layouts(&labels, 5, 99);
    for r in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        let o = opts(0, r, false);
        let a = ctc_loss_with(&x, &padded, &lengths(&il), &lengths(&tl), &o).unwrap();
        let b = ctc_loss_with(&x, &concat, &il, &tl, &o).unwrap();
        let i32_lengths = Tensor::from_vec(vec![7i32, 3, 6, 7], [4]);
        let c32 = concat.cast(DType::I32);
        let d = ctc_loss_with(&x, &c32, &i32_lengths, &tl.to_vec(), &o).unwrap();
        let a = a.to_vec::<f64>().unwrap();
        assert!(a.iter().all(|v| v.is_finite()));
        assert_eq!(a, b.to_vec::<f64>().unwrap());
        assert_eq!(a, d.to_vec::<f64>().unwrap());
    }
}

#[test]
fn mean_divides_each_loss_by_its_target_length() {
    let mut rng = Rng(8);
    let (t, n, c) = (6, 3, 4);
    let x = Tensor::from_vec(random_log_probs(&mut rng, t, n, c), [t, n, c]);
    let targets = Tensor::from_vec(vec![1i64, 2, 3, 0, 0, 0, 2, 2, 0], [3, 3]);
    let (il, tl) = ([6i64, 6, 5], [3i64, 0, 2]);
    let each = ctc_loss_with(&x, &targets, &il, &tl, &opts(0, Reduction::None, false))
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    assert_eq!(each.len(), 3);
    // PyTorch: (loss / target_lengths.clamp_min(1)).mean(); the empty target divides by 1.
    let want = (each[0] / 3.0 + each[1] / 1.0 + each[2] / 2.0) / 3.0;
    let mean = ctc_loss(&x, &targets, &il, &tl)
        .unwrap()
        .item::<f64>()
        .unwrap();
    assert!((mean - want).abs() < 1e-12, "{mean} vs {want}");
    let sum = ctc_loss_with(&x, &targets, &il, &tl, &opts(0, Reduction::Sum, false))
        .unwrap()
        .item::<f64>()
        .unwrap();
    assert!((sum - each.iter().sum::<f64>()).abs() < 1e-12);
}

#[test]
fn hand_computed_alignments() {
    // Three steps, classes {blank, 1, 2}, probabilities chosen per step.
    let p = [[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.2, 0.7, 0.1]];
    let lp: Vec<f64> = p.iter().flatten().map(|v: &f64| v.ln()).collect();
    let x = Tensor::from_vec(lp.clone(), [3, 1, 3]);
    let none = opts(0, Reduction::None, false);
    let loss = |targets: &[i64], steps: i64| {
        let t = Tensor::from_vec(targets.to_vec(), [targets.len()]);
        ctc_loss_with(&x, &t, &[steps], &[targets.len() as i64], &none)
            .unwrap()
            .item::<f64>()
            .unwrap()
    };
    // "1 1" needs a blank between: only "1 - 1" in three steps, nothing in two.
    assert!((loss(&[1, 1], 3) + (0.3f64 * 0.6 * 0.7).ln()).abs() < 1e-12);
    assert_eq!(loss(&[1, 1], 2), f64::INFINITY);
    // "1 2" in two steps: only "1 2".
    assert!((loss(&[1, 2], 2) + (0.3f64 * 0.3).ln()).abs() < 1e-12);
    // The empty target: all blanks.
    assert!((loss(&[], 3) + (0.5f64 * 0.6 * 0.2).ln()).abs() < 1e-12);
    // No input steps: 0 for the empty target, infinite otherwise.
    assert_eq!(loss(&[], 0), 0.0);
    assert_eq!(loss(&[2], 0), f64::INFINITY);
    // "2" in two steps: "2 2", "- 2", "2 -".
    let want = 0.2 * 0.3 + 0.5 * 0.3 + 0.2 * 0.6;
    assert!((loss(&[2], 2) + f64::ln(want)).abs() < 1e-12);
}

#[test]
fn zero_infinity_zeroes_impossible_losses_and_their_gradients() {
    let mut rng = Rng(21);
    let (t, n, c) = (4, 2, 3);
    let lp = random_log_probs(&mut rng, t, n, c);
    // Sample 0: "1 1 2" needs 4 steps and has 4; sample 1: "1 1" needs 3 and has 2.
    let targets = Tensor::from_vec(vec![1i64, 1, 2, 1, 1, 0], [2, 3]);
    let (il, tl) = ([4i64, 2], [3i64, 2]);
    let want0 = alpha_loop(&sample(&lp, n, c, 0), 4, &[1, 1, 2], 0);
    assert!(want0.is_finite());
    for zero_infinity in [false, true] {
        let x = Tensor::from_vec(lp.clone(), [t, n, c]).requires_grad_(true);
        let call = |r| ctc_loss_with(&x, &targets, &il, &tl, &opts(0, r, zero_infinity)).unwrap();
        let v = call(Reduction::None).to_vec::<f64>().unwrap();
        assert!((v[0] - want0).abs() < 1e-12);
        assert_eq!(v[1], if zero_infinity { 0.0 } else { f64::INFINITY });
        let mean = call(Reduction::Mean);
        mean.backward().unwrap();
        let g = x.grad().unwrap().to_vec::<f64>().unwrap();
        for step in 0..t {
            for k in 0..c {
                let g0 = g[(step * n) * c + k];
                let g1 = g[(step * n + 1) * c + k];
                assert!(g0.is_finite(), "sample 0 step {step}");
                if zero_infinity || step >= 2 {
                    // Zeroed, or past the input length.
                    assert_eq!(g1, 0.0, "zero_infinity {zero_infinity} step {step}");
                } else {
                    // As PyTorch: an infinite loss has NaN gradients within its input length.
                    assert!(g1.is_nan(), "step {step}");
                }
            }
        }
        if zero_infinity {
            let m = mean.item::<f64>().unwrap();
            assert!((m - (want0 / 3.0) / 2.0).abs() < 1e-12);
        }
    }
}

#[test]
fn unbatched_input_is_a_batch_of_one() {
    let mut rng = Rng(9);
    let (t, c) = (5, 4);
    let lp = random_log_probs(&mut rng, t, 1, c);
    let labels = vec![2i64, 3, 3];
    let want = alpha_loop(&sample(&lp, 1, c, 0), 5, &labels, 0);
    let x = Tensor::from_vec(lp.clone(), [t, c]);
    let targets = Tensor::from_vec(labels.clone(), [3]);
    let il = Tensor::from_vec(vec![5i64], Vec::<usize>::new());
    let tl = Tensor::from_vec(vec![3i64], Vec::<usize>::new());
    let none = ctc_loss_with(&x, &targets, &il, &tl, &opts(0, Reduction::None, false)).unwrap();
    assert_eq!(none.shape(), &[] as &[usize]);
    assert!((none.item::<f64>().unwrap() - want).abs() < 1e-12);
    let mean = ctc_loss(&x, &targets, &[5], &[3]).unwrap();
    assert_eq!(mean.shape(), &[] as &[usize]);
    assert!((mean.item::<f64>().unwrap() - want / 3.0).abs() < 1e-12);
    // Padded [1, S] targets too.
    let padded = Tensor::from_vec(vec![2i64, 3, 3, 0], [1, 4]);
    let sum = ctc_loss_with(&x, &padded, &[5], &[3], &opts(0, Reduction::Sum, false)).unwrap();
    assert!((sum.item::<f64>().unwrap() - want).abs() < 1e-12);
    // The gradient reaches the unbatched input with its shape.
    let xg = Tensor::from_vec(lp, [t, c]).requires_grad_(true);
    ctc_loss(&xg, &targets, &[4], &[3])
        .unwrap()
        .backward()
        .unwrap();
    let g = xg.grad().unwrap();
    assert_eq!(g.shape(), &[t, c]);
    let g = g.to_vec::<f64>().unwrap();
    assert!(g[..4 * c].iter().any(|&v| v != 0.0));
    assert!(g[4 * c..].iter().all(|&v| v == 0.0));
}

#[test]
fn module_and_f32_inputs() {
    let mut rng = Rng(13);
    let (t, n, c) = (6, 3, 5);
    let lp = random_log_probs(&mut rng, t, n, c);
    let targets = Tensor::from_vec(vec![1i64, 2, 3, 4, 4, 1], [6]);
    let (il, tl) = ([6i64, 5, 6], [2i64, 3, 1]);
    let module = CtcLoss::new(opts(0, Reduction::Sum, false));
    let x = Tensor::from_vec(lp.clone(), [t, n, c]);
    let a = module
        .forward(&x, &targets, &il, &tl)
        .unwrap()
        .item::<f64>()
        .unwrap();
    let b = ctc_loss_with(&x, &targets, &il, &tl, &module.options)
        .unwrap()
        .item::<f64>()
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(CtcLoss::default().options, CtcLossOptions::default());
    // f32 in, f32 out, the same value to f32 precision.
    let x32 = x.cast(DType::F32);
    let l32 = module.forward(&x32, &targets, &il, &tl).unwrap();
    assert_eq!(l32.dtype(), DType::F32);
    let v = l32.item::<f32>().unwrap() as f64;
    assert!((v - a).abs() < 1e-5 * (1.0 + a.abs()), "{v} vs {a}");
}

fn expect_err(what: &str, r: kiln::Result<Tensor>, check: impl Fn(&KilnError) -> bool) {
    match r {
        Ok(_) => panic!("{what}: expected an error"),
        Err(e) => {
            assert!(check(&e), "{what}: unexpected error {e:?}");
            assert!(e.to_string().contains("ctc_loss"), "{what}: {e}");
        }
    }
}

#[test]
fn invalid_inputs_are_refused() {
    let x = Tensor::from_vec(vec![0.25f64.ln(); 3 * 2 * 4], [3, 2, 4]);
    let padded = Tensor::from_vec(vec![1i64, 2, 3, 0], [2, 2]);
    let d = CtcLossOptions::default();
    let invalid = |e: &KilnError| matches!(e, KilnError::InvalidArgument { .. });
    let shapes = |e: &KilnError| matches!(e, KilnError::ShapeMismatch { .. });
    let dtype = |e: &KilnError| matches!(e, KilnError::UnsupportedDType { .. });
    // The valid call, for contrast.
    assert!(ctc_loss_with(&x, &padded, &[3, 3], &[2, 1], &d).is_ok());
    expect_err(
        "blank out of range",
        ctc_loss_with(
            &x,
            &padded,
            &[3, 3],
            &[2, 1],
            &opts(4, Reduction::Mean, false),
        ),
        invalid,
    );
    expect_err(
        "label is the blank",
        ctc_loss_with(&x, &padded, &[3, 3], &[2, 2], &d),
        |e| invalid(e) && e.to_string().contains("blank"),
    );
    let big = Tensor::from_vec(vec![1i64, 4, 3, 0], [2, 2]);
    expect_err(
        "label out of range",
        ctc_loss_with(&x, &big, &[3, 3], &[2, 1], &d),
        invalid,
    );
    let negative = Tensor::from_vec(vec![1i64, -1, 3, 0], [2, 2]);
    expect_err(
        "negative label",
        ctc_loss_with(&x, &negative, &[3, 3], &[2, 1], &d),
        invalid,
    );
    expect_err(
        "input length past T",
        ctc_loss_with(&x, &padded, &[4, 3], &[2, 1], &d),
        invalid,
    );
    expect_err(
        "negative input length",
        ctc_loss_with(&x, &padded, &[3, -1], &[2, 1], &d),
        invalid,
    );
    expect_err(
        "negative target length",
        ctc_loss_with(&x, &padded, &[3, 3], &[2, -1], &d),
        invalid,
    );
    expect_err(
        "target length past S",
        ctc_loss_with(&x, &padded, &[3, 3], &[3, 1], &d),
        shapes,
    );
    let concat = Tensor::from_vec(vec![1i64, 2, 3], [3]);
    expect_err(
        "concatenated length",
        ctc_loss_with(&x, &concat, &[3, 3], &[2, 2], &d),
        shapes,
    );
    expect_err(
        "one length per sample",
        ctc_loss_with(&x, &padded, &[3], &[2, 1], &d),
        shapes,
    );
    let rows = Tensor::from_vec(vec![1i64, 2, 3, 1, 2, 3], [3, 2]);
    expect_err(
        "padded rows",
        ctc_loss_with(&x, &rows, &[3, 3], &[2, 1], &d),
        shapes,
    );
    let cube = Tensor::from_vec(vec![1i64; 4], [2, 2, 1]);
    expect_err(
        "3-D targets",
        ctc_loss_with(&x, &cube, &[3, 3], &[1, 1], &d),
        shapes,
    );
    expect_err(
        "float targets",
        ctc_loss_with(&x, &padded.cast(DType::F32), &[3, 3], &[2, 1], &d),
        dtype,
    );
    let float_lengths = Tensor::from_vec(vec![3.0f32, 3.0], [2]);
    expect_err(
        "float lengths",
        ctc_loss_with(&x, &padded, &float_lengths, &[2, 1], &d),
        dtype,
    );
    let matrix_lengths = Tensor::from_vec(vec![3i64, 3], [1, 2]);
    expect_err(
        "2-D lengths",
        ctc_loss_with(&x, &padded, &[3, 3], &matrix_lengths, &d),
        shapes,
    );
    expect_err(
        "integer log_probs",
        ctc_loss_with(&x.cast(DType::I64), &padded, &[3, 3], &[2, 1], &d),
        dtype,
    );
    expect_err(
        "half log_probs",
        ctc_loss_with(&x.cast(DType::F16), &padded, &[3, 3], &[2, 1], &d),
        dtype,
    );
    let four = x.reshape([3, 2, 2, 2]);
    expect_err(
        "4-D log_probs",
        ctc_loss_with(&four, &padded, &[3, 3], &[2, 1], &d),
        invalid,
    );
    let empty = Tensor::from_vec(Vec::<f64>::new(), [0, 2, 4]);
    expect_err(
        "empty log_probs",
        ctc_loss_with(&empty, &padded, &[0, 0], &[0, 0], &d),
        invalid,
    );
}

#[test]
fn gradients_match_finite_differences() {
    let mut rng = Rng(31);
    for case in 0..4 {
        let (t, n, c) = (3 + rng.below(3), 1 + rng.below(3), 3 + rng.below(2));
        let blank = rng.below(c);
        let labels: Vec<Vec<i64>> = (0..n)
            .map(|_| random_labels(&mut rng, 2, c, blank))
            .collect();
        let tl: Vec<i64> = labels.iter().map(|l| l.len() as i64).collect();
        // The last sample is cut short: its later steps get no gradient.
        let il: Vec<i64> = (0..n)
            .map(|b| if b + 1 == n { t as i64 - 1 } else { t as i64 })
            .collect();
        let (_, concat) = layouts(&labels, 2, 0);
        let r = [Reduction::Mean, Reduction::Sum, Reduction::None][case % 3];
        let o = opts(blank, r, false);
        let logits = values(&mut rng, t * n * c, -1.5, 1.5);
        let scalar = |l: Tensor| if r == Reduction::None { l.sum(..) } else { l };
        // Through log_softmax (where PyTorch's convention agrees with kiln's).
        gradcheck(
            &format!("case {case} d logits"),
            &logits,
            &[t, n, c],
            &|x| scalar(ctc_loss_with(&log_softmax(x, 2).unwrap(), &concat, &il, &tl, &o).unwrap()),
            1e-6,
        );
        // Directly on the log-probabilities: kiln's gradient is the loss's own derivative.
        let lp = log_softmax_rows(&logits, c);
        gradcheck(
            &format!("case {case} d log_probs"),
            &lp,
            &[t, n, c],
            &|x| scalar(ctc_loss_with(x, &concat, &il, &tl, &o).unwrap()),
            1e-6,
        );
        // Steps past the input length get exactly zero, through log_softmax too.
        let x = Tensor::from_vec(logits.clone(), [t, n, c]).requires_grad_(true);
        scalar(ctc_loss_with(&log_softmax(&x, 2).unwrap(), &concat, &il, &tl, &o).unwrap())
            .backward()
            .unwrap();
        let g = x.grad().unwrap().to_vec::<f64>().unwrap();
        let b = n - 1;
        for k in 0..c {
            assert_eq!(g[((t - 1) * n + b) * c + k], 0.0, "case {case}");
        }
        // Through log_softmax the gradient is PyTorch's (softmax - occupancy): each
        // step's gradient sums to zero.
        for step in 0..t {
            for s in 0..n {
                let row: f64 = g[(step * n + s) * c..(step * n + s + 1) * c].iter().sum();
                assert!(row.abs() < 1e-12, "case {case}");
            }
        }
    }
    // The occupancy of each step sums to 1: the gradient on log_probs of a sample's
    // unreduced loss sums to -1 over the classes at each step within its input length.
    let lp = random_log_probs(&mut rng, 5, 1, 4);
    let x = Tensor::from_vec(lp, [5, 1, 4]).requires_grad_(true);
    let t = Tensor::from_vec(vec![1i64, 3], [2]);
    ctc_loss_with(&x, &t, &[4], &[2], &opts(0, Reduction::Sum, false))
        .unwrap()
        .backward()
        .unwrap();
    let g = x.grad().unwrap().to_vec::<f64>().unwrap();
    let sums: Vec<f64> = g.chunks(4).map(|r| r.iter().sum()).collect();
    assert_close("occupancy", &sums, &[-1.0, -1.0, -1.0, -1.0, 0.0], 1e-12);
}

#[test]
fn long_sequences_stay_finite_in_log_space() {
    // Uniform probabilities 1/C over T = 1000 steps (each path has probability 5^-1000,
    // below f64's range): a single label has T(T + 1)/2 alignments (one run of the label
    // anywhere), the empty target one.
    let (t, c) = (1000usize, 5usize);
    let x = Tensor::from_vec(vec![-(c as f64).ln(); t * 2 * c], [t, 2, c]).requires_grad_(true);
    let targets = Tensor::from_vec(vec![3i64, 0], [2, 1]);
    let l = ctc_loss_with(
        &x,
        &targets,
        &[1000, 1000],
        &[1, 0],
        &opts(0, Reduction::None, false),
    )
    .unwrap();
    let tf = t as f64;
    let want = [
        tf * (c as f64).ln() - (tf * (tf + 1.0) / 2.0).ln(),
        tf * (c as f64).ln(),
    ];
    assert_close("long", &l.to_vec::<f64>().unwrap(), &want, 1e-12);
    l.sum(..).backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f64>().unwrap();
    assert!(g.iter().all(|v| v.is_finite()));
    // The empty target's gradient is -1 on the blank at every step.
    let empty: Vec<f64> = g.chunks(c).skip(1).step_by(2).flatten().copied().collect();
    let want: Vec<f64> = (0..t * c)
        .map(|i| if i % c == 0 { -1.0 } else { 0.0 })
        .collect();
    assert_close("long, empty target gradient", &empty, &want, 1e-9);
    // The single label's occupancy sums to 1 at every step.
    let sums: Vec<f64> = g.chunks(c).step_by(2).map(|r| r.iter().sum()).collect();
    assert_close("long, occupancy", &sums, &vec![-1.0; t], 1e-9);
}
