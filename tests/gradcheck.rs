//! Gradient checks: for every differentiable op, the gradient kiln's backward pass records
//! (realized through the fused planner) matches central finite differences in f64 on
//! random inputs — including inputs reached through permuted, sliced (with steps),
//! expanded, padded and flipped views.
//!
//! Each check builds `loss = Σ w ⊙ f(inputs)` with fixed random weights `w`, runs
//! `loss.backward()`, and compares every input's gradient element with
//! `(loss(x + h) - loss(x - h)) / 2h`, `h = 1e-6`.

use kiln::nn::functional::{CrossEntropyOptions, Reduction};
use kiln::ops::{BinaryOp, Domain, UnaryOp};
use kiln::{DType, Tensor, no_grad};

/// Deterministic values in `[lo, hi)`.
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

fn leaf(data: &[f64], shape: &[usize]) -> Tensor {
    let t = Tensor::from_vec(data.to_vec(), shape).requires_grad_(true);
    t.realize().unwrap();
    t
}

/// Checks `f` at `inputs` (each `(data, shape)`); `f` may apply views to its inputs.
fn check(name: &str, inputs: &[(Vec<f64>, Vec<usize>)], f: impl Fn(&[Tensor]) -> Tensor) {
    check_tol(name, inputs, 1e-6, 1e-6, f)
}

/// [`check`] with a step `h` (relative to the input's magnitude) and tolerance.
fn check_tol(
    name: &str,
    inputs: &[(Vec<f64>, Vec<usize>)],
    step: f64,
    tol: f64,
    f: impl Fn(&[Tensor]) -> Tensor,
) {
    let loss_of = |xs: &[Tensor], w: &Tensor| (f(xs) * w).sum(..);
    let leaves: Vec<Tensor> = inputs.iter().map(|(d, s)| leaf(d, s)).collect();
    let out = f(&leaves);
    let w = Tensor::from_vec(values(out.numel(), 99, -1.0, 1.0), out.shape());
    let loss = loss_of(&leaves, &w);
    loss.backward()
        .unwrap_or_else(|e| panic!("{name}: backward failed: {e}"));
    for (i, (data, shape)) in inputs.iter().enumerate() {
        let grad = leaves[i]
            .grad()
            .unwrap_or_else(|| panic!("{name}: input {i} got no gradient"));
        assert_eq!(grad.shape(), &shape[..], "{name}: gradient shape");
        let got = grad.to_vec::<f64>().unwrap();
        for j in 0..data.len() {
            let h = step * data[j].abs().max(1.0);
            let at = |delta: f64| -> f64 {
                no_grad(|| {
                    let xs: Vec<Tensor> = inputs
                        .iter()
                        .enumerate()
                        .map(|(k, (d, s))| {
                            let mut d = d.clone();
                            if k == i {
                                d[j] += delta;
                            }
                            Tensor::from_vec(d, s)
                        })
                        .collect();
                    loss_of(&xs, &w).item::<f64>().unwrap()
                })
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            let err = (got[j] - numeric).abs();
            assert!(
                err <= tol * (1.0 + numeric.abs()),
                "{name}: d/dx{i}[{j}] = {} but finite differences give {numeric} (|diff| {err:e})",
                got[j]
            );
        }
    }
}

/// An input interval where `u` is smooth and defined.
fn domain(u: UnaryOp) -> (f64, f64) {
    match u.info().domain {
        Domain::All => (-2.0, 2.0),
        Domain::NonNegative | Domain::Positive => (0.2, 3.0),
        Domain::NonZero => (0.3, 2.0),
        Domain::Unit => (-0.8, 0.8),
        Domain::AtLeastOne => (1.3, 3.0),
    }
}

#[test]
fn every_unary_op() {
    for (k, &u) in UnaryOp::ALL.iter().enumerate() {
        let (lo, hi) = domain(u);
        let mut x = values(12, 10 + k as u64, lo, hi);
        // Keep kinks (abs, relu at 0) away from the finite-difference stencil.
        for v in &mut x {
            if v.abs() < 0.05 {
                *v += 0.2;
            }
        }
        check(u.name(), &[(x, vec![3, 4])], |t| t[0].unary_op(u));
    }
}

#[test]
fn every_binary_op() {
    for (k, &b) in BinaryOp::ALL.iter().enumerate() {
        if b.is_comparison() {
            continue;
        }
        let x = values(12, 20 + k as u64, 0.5, 2.0);
        let mut y = values(12, 40 + k as u64, 0.5, 2.0);
        if matches!(b, BinaryOp::Max | BinaryOp::Min) {
            // No ties (the finite difference is not defined there).
            for (a, c) in x.iter().zip(y.iter_mut()) {
                if (a - *c).abs() < 0.05 {
                    *c += 0.2;
                }
            }
        }
        check(b.name(), &[(x, vec![3, 4]), (y, vec![3, 4])], |t| {
            t[0].binary_op(b, &t[1])
        });
    }
}

#[test]
fn ties_split_the_gradient_evenly() {
    // maximum/minimum: half to each side; max reduction (amax): even split among maxima.
    let a = leaf(&[1.0, 2.0, 3.0], &[3]);
    let b = leaf(&[1.0, 5.0, 0.0], &[3]);
    a.maximum(&b).sum(..).backward().unwrap();
    assert_eq!(
        a.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![0.5, 0.0, 1.0]
    );
    assert_eq!(
        b.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![0.5, 1.0, 0.0]
    );
    let x = leaf(&[3.0, 1.0, 3.0, 3.0], &[4]);
    x.max(0).backward().unwrap();
    let third = 1.0 / 3.0;
    assert_eq!(
        x.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![third, 0.0, third, third]
    );
}

#[test]
fn reductions_and_composites() {
    let x = || vec![(values(24, 5, 0.5, 2.0), vec![2, 3, 4])];
    check("sum", &x(), |t| t[0].sum(1));
    check("sum all", &x(), |t| t[0].sum_keepdim(..));
    check("prod", &x(), |t| t[0].prod(2));
    check("max", &x(), |t| t[0].max([0, 2]));
    check("min", &x(), |t| t[0].min_keepdim(1));
    check("mean", &x(), |t| t[0].mean([0, 1]));
    check("var", &x(), |t| t[0].var(2, 1));
    check("softmax", &x(), |t| t[0].softmax(-1));
    check("log_softmax", &x(), |t| t[0].log_softmax(1));
    check(
        "layer_norm",
        &[
            (values(24, 6, -2.0, 2.0), vec![2, 3, 4]),
            (values(4, 7, 0.5, 1.5), vec![4]),
            (values(4, 8, -0.5, 0.5), vec![4]),
        ],
        |t| t[0].layer_norm(&[4], Some(&t[1]), Some(&t[2]), 1e-5),
    );
}

/// softmax, log_softmax and logsumexp shift by the row maximum, which leaves their value
/// unchanged: the backward does not differentiate through that max (whose gradient, the
/// tie-splitting `eq`/`cast`/`sum` of `amax`, would be exactly zero work).
#[test]
fn row_shifts_are_not_differentiated() {
    let x = leaf(&values(24, 9, -2.0, 2.0), &[4, 6]);
    let outs = [x.softmax(-1), x.log_softmax(1), x.logsumexp_keepdim(1)];
    for (i, y) in outs.iter().enumerate() {
        x.zero_grad();
        let w = Tensor::from_vec(values(y.numel(), 10 + i as u64, -1.0, 1.0), y.shape());
        y.backward_with(&w).unwrap();
        let g = x.grad().unwrap();
        let text = g
            .plan(&kiln::RealizeOptions::default())
            .unwrap()
            .dump_text();
        assert!(
            !text.contains("= eq ") && !text.contains("= cast "),
            "output {i}: {text}"
        );
    }
}

/// The `nn::functional` forms, whose backward is one rule each rather than the derivative
/// of every forward step.
#[test]
fn composites_with_their_own_rules() {
    use kiln::nn::functional as f;
    let x = || vec![(values(24, 5, 0.5, 2.0), vec![2, 3, 4])];
    check("softmax rule", &x(), |t| f::softmax(&t[0], -1).unwrap());
    check("softmax rule, dim 1", &x(), |t| {
        f::softmax(&t[0], 1).unwrap()
    });
    check("log_softmax rule", &x(), |t| {
        f::log_softmax(&t[0], 1).unwrap()
    });
    let ln = || {
        vec![
            (values(24, 6, -2.0, 2.0), vec![2, 3, 4]),
            (values(4, 7, 0.5, 1.5), vec![4]),
            (values(4, 8, -0.5, 0.5), vec![4]),
        ]
    };
    check("layer_norm rule", &ln(), |t| {
        f::layer_norm(&t[0], &[4], Some(&t[1]), Some(&t[2]), 1e-5).unwrap()
    });
    check("layer_norm rule, two dims", &ln()[..1], |t| {
        f::layer_norm(&t[0], &[3, 4], None, None, 1e-5).unwrap()
    });
    check("layer_norm rule, all dims", &ln()[..1], |t| {
        f::layer_norm(&t[0], &[2, 3, 4], None, None, 1e-5).unwrap()
    });
}

#[test]
fn matmul_where_and_cast() {
    // Composites of views and joins: roll, diagonal, diag of a vector.
    check("roll", &[(values(12, 76, -1.0, 1.0), vec![3, 4])], |t| {
        t[0].t().roll(&[1, -3], &[0, 1])
    });
    check(
        "diagonal",
        &[(values(24, 77, -1.0, 1.0), vec![2, 3, 4])],
        |t| t[0].diagonal(-1, 2, 1),
    );
    check("diag", &[(values(3, 78, -1.0, 1.0), vec![3])], |t| {
        t[0].diag(2)
    });
    // einsum: a batched contraction with a broadcast label, a diagonal, an outer product.
    check(
        "einsum bij,jk->bik",
        &[
            (values(12, 70, -1.0, 1.0), vec![2, 2, 3]),
            (values(3, 71, -1.0, 1.0), vec![3, 1]),
        ],
        |t| Tensor::einsum("bij,jk->bik", &[&t[0], &t[1]]),
    );
    check(
        "einsum ii,ij->j",
        &[
            (values(9, 72, -1.0, 1.0), vec![3, 3]),
            (values(12, 73, -1.0, 1.0), vec![3, 4]),
        ],
        |t| Tensor::einsum("ii,ij->j", &[&t[0], &t[1].t().t()]),
    );
    check(
        "einsum i,j->ji",
        &[
            (values(3, 74, -1.0, 1.0), vec![3]),
            (values(2, 75, -1.0, 1.0), vec![2]),
        ],
        |t| Tensor::einsum("i,j->ji", &[&t[0], &t[1]]),
    );
    check(
        "matmul",
        &[
            (values(12, 1, -1.0, 1.0), vec![3, 4]),
            (values(8, 2, -1.0, 1.0), vec![4, 2]),
        ],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "batched matmul with a broadcast batch",
        &[
            (values(24, 3, -1.0, 1.0), vec![2, 3, 4]),
            (values(8, 4, -1.0, 1.0), vec![4, 2]),
        ],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "matrix-vector",
        &[
            (values(12, 5, -1.0, 1.0), vec![3, 4]),
            (values(4, 6, -1.0, 1.0), vec![4]),
        ],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "where",
        &[
            (values(6, 7, -1.0, 1.0), vec![2, 3]),
            (values(6, 8, -1.0, 1.0), vec![2, 3]),
        ],
        |t| Tensor::where_(&t[0].gt(0.0), &t[0], t[1].exp()),
    );
    // f64 -> f32 -> f64 rounds to f32: a larger step and a looser tolerance.
    check_tol(
        "cast",
        &[(values(6, 9, -1.0, 1.0), vec![6])],
        1e-3,
        1e-3,
        |t| t[0].cast(DType::F32).exp().cast(DType::F64),
    );
}

#[test]
fn inputs_reached_through_views() {
    let x = || vec![(values(24, 11, 0.5, 2.0), vec![4, 6])];
    check("permute", &x(), |t| t[0].t().exp());
    check("reshape", &x(), |t| t[0].reshape([2, 12]).sin());
    check("reshape of a transpose (copy)", &x(), |t| {
        t[0].t().reshape([-1]).log()
    });
    check("slice with steps", &x(), |t| {
        t[0].slice(&[(1, 4, 2), (0, 6, 3)]).exp()
    });
    check("slice with a step and offset", &x(), |t| {
        t[0].slice(&[(0, 4, 1), (1, 6, 2)]) * 3.0
    });
    check("pad", &x(), |t| t[0].pad(&[(1, 2), (0, 1)], 0.5).tanh());
    check("flip", &x(), |t| t[0].flip([0, 1]).sqrt());
    check("expand", &[(values(4, 12, 0.5, 2.0), vec![4, 1])], |t| {
        t[0].expand([4, 5]).log()
    });
    check(
        "broadcast in a binary op",
        &[
            (values(4, 13, 0.5, 2.0), vec![4, 1]),
            (values(6, 14, 0.5, 2.0), vec![6]),
        ],
        |t| &t[0] * &t[1],
    );
    check("views composed", &x(), |t| {
        t[0].t()
            .slice(&[(1, 6, 2)])
            .flip([1])
            .pad(&[(1, 1)], 0.0)
            .exp()
            .sum(1)
    });
    check("contiguous", &x(), |t| t[0].t().contiguous() * 2.0);
}

#[test]
fn gradients_accumulate_until_zeroed_and_detach_stops_them() {
    let w = leaf(&[1.0, 2.0], &[2]);
    (&w * 3.0).sum(..).backward().unwrap();
    (&w * &w).sum(..).backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f64>().unwrap(), vec![5.0, 7.0]);
    w.zero_grad();
    assert!(w.grad().is_none());
    let d = w.detach();
    assert!(!d.requires_grad());
    let y = (&d * &w).sum(..);
    y.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f64>().unwrap(), vec![1.0, 2.0]);
    // A second backward through the same (released) history is an error, not a silent 0.
    let z = (&w * 2.0).exp();
    let s = z.sum(..);
    s.backward().unwrap();
    assert!(s.backward().is_err());
    // no_grad records no history.
    let n = no_grad(|| &w * 2.0);
    assert!(!n.requires_grad());
}

#[test]
fn indexing_joining_and_masking_ops() {
    let idx = Tensor::from_vec(vec![2i64, 0, 2, 1, 1, 0], [2, 3]);
    check("gather", &[(values(12, 21, -1.0, 1.0), vec![4, 3])], |t| {
        t[0].gather(0, &idx).exp()
    });
    let rows = Tensor::from_vec(vec![3i64, 0, 3], [3]);
    check(
        "index_select",
        &[(values(12, 22, -1.0, 1.0), vec![4, 3])],
        |t| t[0].index_select(0, &rows).sin(),
    );
    let ids = Tensor::from_vec(vec![1i64, 1, 0, 2], [2, 2]);
    check(
        "embedding",
        &[(values(6, 23, -1.0, 1.0), vec![3, 2])],
        |t| Tensor::embedding(&ids, &t[0]).tanh(),
    );
    let sidx = Tensor::from_vec(vec![0i64, 2, 0, 1], [4]);
    check(
        "scatter_add",
        &[
            (values(3, 24, -1.0, 1.0), vec![3]),
            (values(4, 25, -1.0, 1.0), vec![4]),
        ],
        |t| t[0].scatter_add(0, &sidx, &t[1]).exp(),
    );
    // Distinct values away from zero: no ties for amax/amin, no zero factors for prod.
    for reduce in ["sum", "prod", "mean", "amax", "amin"] {
        for include_self in [true, false] {
            check(
                &format!("scatter_reduce {reduce} include_self={include_self}"),
                &[
                    (values(3, 30, 0.5, 2.0), vec![3]),
                    (values(5, 31, 0.5, 2.0), vec![5]),
                ],
                |t| {
                    let i = Tensor::from_vec(vec![0i64, 2, 0, 0, 2], [5]);
                    t[0].scatter_reduce(0, &i, &t[1], reduce, include_self)
                        .sin()
                },
            );
        }
    }
    check(
        "index_add, index_copy",
        &[
            (values(8, 34, -1.0, 1.0), vec![4, 2]),
            (values(6, 35, -1.0, 1.0), vec![3, 2]),
        ],
        |t| {
            let i = Tensor::from_vec(vec![3i64, 0, 3], [3]);
            t[0].index_add(0, &i, &t[1]).sin() + t[0].index_copy(0, &i, &t[1]).exp()
        },
    );
    check(
        "scatter",
        &[
            (values(6, 32, -1.0, 1.0), vec![2, 3]),
            (values(6, 33, -1.0, 1.0), vec![3, 2]),
        ],
        |t| {
            let i = Tensor::from_vec(vec![2i64, 0, 1, 1], [2, 2]);
            t[0].scatter(1, &i, &t[1]).exp()
        },
    );
    // Data-dependent selections: a constant index into a gather and a where.
    let sel = Tensor::from_vec(vec![true, false, true, true, false, true], [2, 3]);
    let rows = Tensor::from_vec(vec![false, true], [2, 1]);
    check(
        "masked_select",
        &[(values(6, 36, -1.0, 1.0), vec![2, 3])],
        |t| t[0].masked_select(&sel).exp() + t[0].t().masked_select(&sel.t()).sum(..),
    );
    check(
        "masked_select broadcast",
        &[(values(3, 37, -1.0, 1.0), vec![3])],
        |t| t[0].masked_select(&rows).sin(),
    );
    check(
        "masked_scatter",
        &[
            (values(6, 38, -1.0, 1.0), vec![2, 3]),
            (values(5, 39, -1.0, 1.0), vec![5]),
        ],
        |t| t[0].masked_scatter(&sel, &t[1]).exp() + t[0].masked_scatter(&rows, &t[1]).sin(),
    );
    let (pr, pc) = (
        Tensor::from_vec(vec![2i64, 0, 2], [3]),
        Tensor::from_vec(vec![1i64, -1, 0], [3]),
    );
    for accumulate in [false, true] {
        check(
            &format!("index_put accumulate={accumulate}"),
            &[
                (values(9, 40, -1.0, 1.0), vec![3, 3]),
                (values(3, 41, -1.0, 1.0), vec![3]),
            ],
            |t| t[0].index_put(&[&pr, &pc], &t[1], accumulate).exp(),
        );
    }
    // Subscripts: integers, ranges and index tensors mixed (adjacent and separated), and
    // a write through one.
    let (si, sj) = (
        Tensor::from_vec(vec![2i64, 0, -1], [3]),
        Tensor::from_vec(vec![1i64, 0], [2, 1]),
    );
    check(
        "i (subscripts) and i_put",
        &[
            (values(60, 42, -1.0, 1.0), vec![3, 4, 5]),
            (values(4, 43, -1.0, 1.0), vec![2, 2]),
        ],
        |t| {
            let x = &t[0];
            let read = x.i((1, &si, kiln::Index::stepped(1.., 2))).exp().sum(..)
                + x.i((&sj, .., &si)).sin().sum(..)
                + x.movedim(2, 0).select(1, -1).sum(..);
            x.i_put((0, 1..3, 3..), &t[1]).exp() * read
        },
    );
    check(
        "cat",
        &[
            (values(6, 26, -1.0, 1.0), vec![2, 3]),
            (values(3, 27, -1.0, 1.0), vec![1, 3]),
        ],
        |t| Tensor::cat(&[&t[0], &t[1], &t[0]], 0).exp(),
    );
    check(
        "stack",
        &[
            (values(3, 28, -1.0, 1.0), vec![3]),
            (values(3, 29, -1.0, 1.0), vec![3]),
        ],
        |t| Tensor::stack(&[&t[0], &t[1]], 1).sin(),
    );
    check(
        "split and chunk",
        &[(values(10, 30, -1.0, 1.0), vec![10])],
        |t| {
            let parts = t[0].split(4, 0);
            let halves = t[0].chunk(2, 0);
            parts[1].exp().sum_keepdim(0) * halves[0].sum_keepdim(0) + parts[2].sum_keepdim(0)
        },
    );
    check("tril", &[(values(12, 31, -1.0, 1.0), vec![3, 4])], |t| {
        t[0].tril(0).exp()
    });
    check("triu", &[(values(12, 32, -1.0, 1.0), vec![3, 4])], |t| {
        t[0].triu(1).exp()
    });
    let m = Tensor::from_vec(vec![true, false, false, true, true, false], [2, 3]);
    check(
        "masked_fill",
        &[(values(6, 33, -1.0, 1.0), vec![2, 3])],
        |t| t[0].masked_fill(&m, 2.0).exp(),
    );
    check(
        "gelu_tanh",
        &[(values(12, 48, -3.0, 3.0), vec![3, 4])],
        |t| t[0].permute([1, 0]).gelu_tanh(),
    );
    check(
        "logsumexp",
        &[(values(12, 34, -2.0, 2.0), vec![3, 4])],
        |t| t[0].logsumexp(1),
    );
}

#[test]
fn losses_and_dropout() {
    let targets = Tensor::from_vec(vec![2i64, 0, 1], [3]);
    check(
        "cross_entropy",
        &[(values(12, 35, -2.0, 2.0), vec![3, 4])],
        |t| kiln::nn::functional::cross_entropy(&t[0], &targets).unwrap(),
    );
    // An ignored target, label smoothing and each reduction.
    let skipping = Tensor::from_vec(vec![2i64, -100, 1], [3]);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let opts = CrossEntropyOptions {
            reduction,
            label_smoothing: 0.1,
            ..Default::default()
        };
        check(
            "cross_entropy_with",
            &[(values(12, 38, -2.0, 2.0), vec![3, 4])],
            |t| kiln::nn::functional::cross_entropy_with(&t[0], &skipping, &opts).unwrap(),
        );
    }
    // Class weights (PyTorch's `weight=`), with and without label smoothing.
    let class_w = Tensor::from_vec(vec![0.5f64, 2.0, 1.25, 0.75], [4]);
    for (reduction, label_smoothing) in [
        (Reduction::Mean, 0.0),
        (Reduction::Mean, 0.2),
        (Reduction::Sum, 0.2),
        (Reduction::None, 0.2),
    ] {
        let opts = CrossEntropyOptions {
            weight: Some(class_w.clone()),
            reduction,
            label_smoothing,
            ..Default::default()
        };
        check(
            "cross_entropy_with weight",
            &[(values(12, 37, -2.0, 2.0), vec![3, 4])],
            |t| kiln::nn::functional::cross_entropy_with(&t[0], &skipping, &opts).unwrap(),
        );
    }
    // Class-probability targets: the gradient reaches the logits and the targets.
    for reduction in [Reduction::Mean, Reduction::None] {
        let opts = CrossEntropyOptions {
            weight: Some(class_w.clone()),
            reduction,
            label_smoothing: 0.1,
            ..Default::default()
        };
        check(
            "cross_entropy probabilities",
            &[
                (values(12, 36, -2.0, 2.0), vec![3, 4]),
                (values(12, 46, 0.0, 1.0), vec![3, 4]),
            ],
            |t| kiln::nn::functional::cross_entropy_with(&t[0], &t[1], &opts).unwrap(),
        );
    }
    let nll_targets = Tensor::from_vec(vec![2i64, -100, 1], [3]);
    check(
        "nll_loss",
        &[(values(12, 39, -2.0, 2.0), vec![3, 4])],
        |t| kiln::nn::functional::nll_loss(&t[0], &nll_targets).unwrap(),
    );
    check(
        "nll_loss weight",
        &[(values(12, 39, -2.0, 2.0), vec![3, 4])],
        |t| {
            kiln::nn::functional::nll_loss_with(
                &t[0],
                &nll_targets,
                Some(&class_w),
                Some(-100),
                Reduction::Mean,
            )
            .unwrap()
        },
    );
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        check(
            "binary_cross_entropy",
            &[
                (values(6, 40, 0.05, 0.95), vec![2, 3]),
                (values(6, 41, 0.0, 1.0), vec![2, 3]),
            ],
            |t| kiln::nn::functional::binary_cross_entropy(&t[0], &t[1], None, reduction).unwrap(),
        );
        // A per-element weight broadcast over the rows: its gradient sums over them.
        check(
            "binary_cross_entropy weight",
            &[
                (values(6, 47, 0.05, 0.95), vec![2, 3]),
                (values(6, 48, 0.0, 1.0), vec![2, 3]),
                (values(3, 49, 0.5, 3.0), vec![3]),
            ],
            |t| {
                kiln::nn::functional::binary_cross_entropy(&t[0], &t[1], Some(&t[2]), reduction)
                    .unwrap()
            },
        );
        check(
            "binary_cross_entropy_with_logits",
            &[
                (values(6, 42, -3.0, 3.0), vec![2, 3]),
                (values(6, 43, 0.0, 1.0), vec![2, 3]),
            ],
            |t| {
                kiln::nn::functional::binary_cross_entropy_with_logits(
                    &t[0], &t[1], None, None, reduction,
                )
                .unwrap()
            },
        );
        // pos_weight broadcast over the rows: its gradient sums over them.
        check(
            "binary_cross_entropy_with_logits pos_weight",
            &[
                (values(6, 44, -3.0, 3.0), vec![2, 3]),
                (values(6, 45, 0.0, 1.0), vec![2, 3]),
                (values(3, 46, 0.5, 3.0), vec![3]),
            ],
            |t| {
                kiln::nn::functional::binary_cross_entropy_with_logits(
                    &t[0],
                    &t[1],
                    None,
                    Some(&t[2]),
                    reduction,
                )
                .unwrap()
            },
        );
        // Both weights, the per-element one of the input's shape.
        check(
            "binary_cross_entropy_with_logits weight and pos_weight",
            &[
                (values(6, 50, -3.0, 3.0), vec![2, 3]),
                (values(6, 51, 0.0, 1.0), vec![2, 3]),
                (values(6, 52, 0.0, 2.0), vec![2, 3]),
                (values(3, 53, 0.5, 3.0), vec![3]),
            ],
            |t| {
                kiln::nn::functional::binary_cross_entropy_with_logits(
                    &t[0],
                    &t[1],
                    Some(&t[2]),
                    Some(&t[3]),
                    reduction,
                )
                .unwrap()
            },
        );
        // Differences away from the kinks at |d| = width (values in ±2, targets 0).
        let zeros = Tensor::zeros([8]).cast(DType::F64);
        for (name, f) in [
            ("l1_loss", 0usize),
            ("smooth_l1_loss", 1),
            ("huber_loss", 2),
        ] {
            check(name, &[(kink_free(8, 47, 0.7), vec![8])], |t| match f {
                0 => kiln::nn::functional::l1_loss(&t[0], &zeros, reduction).unwrap(),
                1 => kiln::nn::functional::smooth_l1_loss(&t[0], &zeros, reduction, 0.7).unwrap(),
                _ => kiln::nn::functional::huber_loss(&t[0], &zeros, reduction, 0.7).unwrap(),
            });
        }
    }
    check(
        "mse_loss",
        &[
            (values(6, 36, -1.0, 1.0), vec![6]),
            (values(6, 37, -1.0, 1.0), vec![6]),
        ],
        |t| kiln::nn::functional::mse_loss(&t[0], &t[1]).unwrap(),
    );
    // A fixed seed: the same mask in every evaluation.
    check("dropout", &[(values(20, 38, -1.0, 1.0), vec![20])], |t| {
        kiln::nn::functional::dropout(&t[0], 0.3, true, 5)
            .unwrap()
            .exp()
    });
}

#[test]
fn scans_and_sorts() {
    check("cumsum", &[(values(12, 40, -1.0, 1.0), vec![3, 4])], |t| {
        t[0].cumsum(1).sin()
    });
    check(
        "cumsum of a transposed view",
        &[(values(12, 41, -1.0, 1.0), vec![3, 4])],
        |t| t[0].t().cumsum(1).exp(),
    );
    check("cumprod", &[(values(12, 42, 0.5, 1.5), vec![2, 6])], |t| {
        t[0].cumprod(1)
    });
    // Exact zeros: one, two and none per lane (PyTorch's zero-aware cumprod gradient).
    let with_zeros = vec![
        2.0, 0.0, 3.0, 0.0, 5.0, 0.7, //
        0.0, 1.5, -2.0, 0.5, 1.1, 0.9, //
        1.2, -0.8, 0.6, 1.3, 0.0, 2.0,
    ];
    check("cumprod with zeros", &[(with_zeros, vec![3, 6])], |t| {
        t[0].cumprod(1)
    });
    check(
        "cumprod along dim 0",
        &[(values(12, 43, -1.5, 1.5), vec![4, 3])],
        |t| t[0].cumprod(0).sin(),
    );
    // Sorting moves gradients back to where each value came from.
    let distinct = vec![0.3, -1.2, 2.5, 0.9, -0.4, 1.7, -2.2, 0.1];
    check("sort", &[(distinct.clone(), vec![2, 4])], |t| {
        t[0].sort(1, true).0.exp()
    });
    check("topk", &[(distinct.clone(), vec![8])], |t| {
        t[0].topk(3, 0, false).0.sin()
    });
    check("max_dim", &[(distinct, vec![4, 2])], |t| {
        let (v, _) = t[0].max_dim(0, true);
        let (w, _) = t[0].min_dim(1, false);
        v.sum(..) * w.exp().sum(..)
    });
}

#[test]
fn rounding_division_and_repeat_ops() {
    // Piecewise-constant ops have a zero gradient away from their steps (PyTorch's rule):
    // inputs kept off integers and half-integers, where the finite difference is 0 too.
    let off_steps = || {
        let mut x = values(12, 50, -3.0, 3.0);
        for v in &mut x {
            let f = (*v * 2.0).fract().abs();
            if !(0.1..=0.9).contains(&f) {
                *v += 0.23;
            }
        }
        vec![(x, vec![3, 4])]
    };
    check("floor ceil round trunc sign", &off_steps(), |t| {
        (t[0].floor() + t[0].ceil() + t[0].round() + t[0].trunc() + t[0].sign()) * &t[0]
    });
    // remainder / fmod: ∂/∂b = -floor(a/b) or -trunc(a/b), with mixed signs.
    let signed = || {
        let a = values(12, 51, -6.0, 6.0);
        let mut b = values(12, 52, 0.7, 2.0);
        for (k, v) in b.iter_mut().enumerate() {
            if k % 3 == 0 {
                *v = -*v;
            }
        }
        vec![(a, vec![3, 4]), (b, vec![3, 4])]
    };
    check("remainder (mixed signs)", &signed(), |t| {
        t[0].remainder(&t[1])
    });
    check("fmod (mixed signs)", &signed(), |t| t[0].fmod(&t[1]));
    check("floor_divide times a smooth op", &signed(), |t| {
        t[0].floor_divide(&t[1]) * t[0].sin()
    });
    check(
        "clamp with tensor bounds (broadcast)",
        &[
            (values(12, 53, -2.0, 2.0), vec![3, 4]),
            (values(4, 54, -1.5, -0.5), vec![4]),
            (values(3, 55, 0.5, 1.5), vec![3, 1]),
        ],
        |t| t[0].clamp_tensor(&t[1], &t[2]),
    );
    check(
        "repeat and tile",
        &[(values(6, 56, -1.0, 1.0), vec![2, 3])],
        |t| t[0].repeat([2, 1, 3]).exp() * t[0].t().tile([2, 2]).sum(..).sin(),
    );
    check(
        "activations",
        &[(values(12, 57, -4.0, 4.0), vec![3, 4])],
        |t| t[0].softplus() * t[0].silu() + (&t[0] * 0.5).expm1() + t[0].exp2().log1p(),
    );
}

/// `n` values in `[-2, 2]` at least 0.05 away from 0 and from `±width` (the kinks of the
/// L1, smooth L1 and Huber losses).
fn kink_free(n: usize, seed: u64, width: f64) -> Vec<f64> {
    values(n * 4, seed, -2.0, 2.0)
        .into_iter()
        .filter(|v| v.abs() > 0.05 && (v.abs() - width).abs() > 0.05)
        .take(n)
        .collect()
}

#[test]
fn convolution_and_pooling() {
    use kiln::nn::functional::{
        ConvPadding, adaptive_avg_pool2d, avg_pool1d, avg_pool2d, conv1d, conv2d, conv3d,
        max_pool1d, max_pool2d,
    };
    // The input reached through a transposed view; groups, stride, padding and dilation.
    check(
        "conv2d",
        &[
            (values(2 * 4 * 5 * 4, 101, -1.0, 1.0), vec![2, 4, 4, 5]),
            (values(6 * 2 * 3 * 2, 102, -1.0, 1.0), vec![6, 2, 3, 2]),
            (values(6, 103, -1.0, 1.0), vec![6]),
        ],
        |t| {
            conv2d(
                &t[0].transpose(2, 3),
                &t[1],
                Some(&t[2]),
                (2, 1),
                (1, 2),
                (1, 2),
                2,
            )
            .unwrap()
        },
    );
    check(
        "conv1d same",
        &[
            (values(3 * 7, 104, -1.0, 1.0), vec![3, 7]),
            (values(2 * 3 * 4, 105, -1.0, 1.0), vec![2, 3, 4]),
        ],
        |t| conv1d(&t[0], &t[1], None, 1, ConvPadding::Same, 1, 1).unwrap(),
    );
    check(
        "conv3d",
        &[
            (values(2 * 3 * 4 * 3, 106, -1.0, 1.0), vec![1, 2, 3, 4, 3]),
            (
                values(2 * 2 * 2 * 2 * 2, 107, -1.0, 1.0),
                vec![2, 2, 2, 2, 2],
            ),
        ],
        |t| conv3d(&t[0], &t[1], None, 1, [1, 0, 1], 1, 1).unwrap(),
    );
    // Distinct random values: no window has a tie, so the max is differentiable.
    check(
        "max_pool2d",
        &[(values(2 * 6 * 7, 108, -2.0, 2.0), vec![1, 2, 6, 7])],
        |t| max_pool2d(&t[0], 3, 2, 1, [1, 2], true).unwrap(),
    );
    check(
        "max_pool1d of a padded view",
        &[(values(2 * 7, 109, -2.0, 2.0), vec![2, 7])],
        |t| max_pool1d(&t[0].pad(&[(0, 0), (1, 0)], 0.5), 2, 2, 1, 1, false).unwrap(),
    );
    check(
        "avg_pool2d",
        &[(values(2 * 5 * 7, 110, -2.0, 2.0), vec![1, 2, 5, 7])],
        |t| avg_pool2d(&t[0], 3, 2, 1, true, false, None).unwrap(),
    );
    check(
        "avg_pool1d",
        &[(values(9, 111, -2.0, 2.0), vec![1, 9])],
        |t| avg_pool1d(&t[0], 4, 2, 2, true, true).unwrap(),
    );
    check(
        "conv_transpose2d",
        &[
            (values(2 * 4 * 3 * 3, 113, -1.0, 1.0), vec![2, 4, 3, 3]),
            (values(4 * 2 * 2 * 3, 114, -1.0, 1.0), vec![4, 2, 2, 3]),
            (values(4, 115, -1.0, 1.0), vec![4]),
        ],
        |t| {
            kiln::nn::functional::conv_transpose2d(
                &t[0],
                &t[1],
                Some(&t[2]),
                (2, 1),
                (0, 1),
                (1, 0),
                2,
                (1, 2),
            )
            .unwrap()
        },
    );
    check(
        "adaptive_avg_pool2d",
        &[(values(2 * 5 * 7, 112, -2.0, 2.0), vec![2, 5, 7])],
        |t| adaptive_avg_pool2d(&t[0], (3, 4)).unwrap(),
    );
    check(
        "adaptive_max_pool2d",
        &[(values(2 * 5 * 7, 113, -2.0, 2.0), vec![2, 5, 7])],
        |t| kiln::nn::functional::adaptive_max_pool2d(&t[0], (3, 4)).unwrap(),
    );
    // Unpooling values at the places a pooling (of fixed data) chose, to a larger size.
    let (_, at) = kiln::nn::functional::max_pool2d_with_indices(
        &Tensor::from_vec(values(2 * 6 * 5, 116, -2.0, 2.0), [1, 2, 6, 5]),
        2,
        2,
        0,
        1,
        false,
    )
    .unwrap();
    check(
        "max_unpool2d of a permuted view",
        &[(values(2 * 3 * 2, 117, -2.0, 2.0), vec![1, 2, 2, 3])],
        |t| {
            kiln::nn::functional::max_unpool2d(
                &t[0].transpose(2, 3),
                &at,
                2,
                2,
                0,
                Some((7, 5).into()),
            )
            .unwrap()
        },
    );
}

#[test]
fn padding_modes_and_resampling() {
    use kiln::nn::functional::{InterpolationMode as M, PadMode, interpolate, pad, pixel_shuffle};
    for mode in [PadMode::Reflect, PadMode::Replicate, PadMode::Circular] {
        check(
            &format!("pad {mode:?} of a transposed view"),
            &[(values(2 * 3 * 4, 131, -1.0, 1.0), vec![2, 4, 3])],
            |t| pad(&t[0].transpose(1, 2), &[2, 3, 1, 2], mode, 0.0).unwrap(),
        );
    }
    for (mode, align) in [
        (M::Bilinear, Some(false)),
        (M::Bilinear, Some(true)),
        (M::Bicubic, Some(false)),
        (M::Nearest, None),
        (M::Area, None),
    ] {
        check(
            &format!("interpolate {mode:?} {align:?}"),
            &[(values(2 * 3 * 4, 132, -1.0, 1.0), vec![1, 2, 3, 4])],
            |t| interpolate(&t[0], Some(&[5, 3]), None, mode, align, false).unwrap(),
        );
    }
    check(
        "pixel_shuffle",
        &[(values(8 * 2 * 3, 133, -1.0, 1.0), vec![1, 8, 2, 3])],
        |t| pixel_shuffle(&t[0], 2).unwrap(),
    );
}

#[test]
fn divergence_and_margin_losses() {
    use kiln::nn::functional::{
        KlDivReduction, Reduction, cosine_embedding_loss, kl_div, margin_ranking_loss,
        multilabel_soft_margin_loss, poisson_nll_loss, soft_margin_loss, triplet_margin_loss,
    };
    let sign = Tensor::from_vec(vec![1.0f64, -1.0, -1.0, 1.0, 1.0, -1.0], [6]);
    check(
        "kl_div (input and target)",
        &[
            (values(6, 150, -3.0, -0.1), vec![2, 3]),
            (values(6, 151, 0.1, 1.0), vec![2, 3]),
        ],
        |t| kl_div(&t[0], &t[1], KlDivReduction::BatchMean, false).unwrap(),
    );
    check(
        "kl_div log_target",
        &[
            (values(6, 152, -3.0, -0.1), vec![2, 3]),
            (values(6, 153, -3.0, -0.1), vec![2, 3]),
        ],
        |t| kl_div(&t[0], &t[1], KlDivReduction::Sum, true).unwrap(),
    );
    check(
        "poisson_nll_loss of rates",
        &[(values(6, 154, 0.5, 3.0), vec![6])],
        |t| {
            let k = Tensor::from_vec(vec![0.0f64, 1.0, 2.0, 3.0, 4.0, 5.0], [6]);
            poisson_nll_loss(&t[0], &k, false, true, 1e-8, Reduction::Mean).unwrap()
        },
    );
    check(
        "margin_ranking_loss",
        &[
            (values(6, 155, -1.0, 1.0), vec![6]),
            (values(6, 156, -1.0, 1.0), vec![6]),
        ],
        |t| margin_ranking_loss(&t[0], &t[1], &sign, 5.0, Reduction::Sum).unwrap(),
    );
    check(
        "soft_margin_loss",
        &[(values(6, 157, -2.0, 2.0), vec![6])],
        |t| soft_margin_loss(&t[0], &sign, Reduction::Mean).unwrap(),
    );
    check(
        "multilabel_soft_margin_loss",
        &[(values(6, 158, -2.0, 2.0), vec![2, 3])],
        |t| {
            let y = Tensor::from_vec(vec![1.0f64, 0.0, 1.0, 0.0, 0.0, 1.0], [2, 3]);
            multilabel_soft_margin_loss(&t[0], &y, None, Reduction::Mean).unwrap()
        },
    );
    check(
        "cosine_embedding_loss",
        &[
            (values(6, 159, -1.0, 1.0), vec![2, 3]),
            (values(6, 160, -1.0, 1.0), vec![2, 3]),
        ],
        |t| {
            let y = Tensor::from_vec(vec![1.0f64, -1.0], [2]);
            cosine_embedding_loss(&t[0], &t[1], &y, -2.0, Reduction::Sum).unwrap()
        },
    );
    check(
        "triplet_margin_loss",
        &[
            (values(6, 161, -1.0, 1.0), vec![2, 3]),
            (values(6, 162, -1.0, 1.0), vec![2, 3]),
            (values(6, 163, -1.0, 1.0), vec![2, 3]),
        ],
        |t| {
            triplet_margin_loss(&t[0], &t[1], &t[2], 10.0, 2.0, 1e-6, true, Reduction::Mean)
                .unwrap()
        },
    );
}

#[test]
fn scaled_dot_product_attention() {
    use kiln::nn::functional::scaled_dot_product_attention as sdpa;
    let mask = Tensor::from_vec(vec![true, false, true, true, true, false], [2, 3]);
    check(
        "sdpa with a bool mask, over a transposed key",
        &[
            (values(2 * 2 * 4, 170, -1.0, 1.0), vec![2, 2, 4]),
            (values(2 * 4 * 3, 171, -1.0, 1.0), vec![2, 4, 3]),
            (values(2 * 3 * 2, 172, -1.0, 1.0), vec![2, 3, 2]),
        ],
        |t| {
            sdpa(
                &t[0],
                &t[1].transpose(1, 2),
                &t[2],
                Some(&mask),
                0.0,
                0,
                false,
                None,
            )
            .unwrap()
        },
    );
    check(
        "sdpa causal with a scale",
        &[
            (values(3 * 2, 173, -1.0, 1.0), vec![3, 2]),
            (values(3 * 2, 174, -1.0, 1.0), vec![3, 2]),
            (values(3 * 2, 175, -1.0, 1.0), vec![3, 2]),
        ],
        |t| sdpa(&t[0], &t[1], &t[2], None, 0.0, 0, true, Some(0.7)).unwrap(),
    );
}

#[test]
fn median_and_quantile() {
    use kiln::QuantileInterpolation as Q;
    // Distinct random values: the chosen elements do not change within the step.
    check(
        "median_dim of a transposed view",
        &[(values(20, 121, -2.0, 2.0), vec![4, 5])],
        |t| t[0].t().median_dim(1, false).0,
    );
    check("median", &[(values(9, 122, -2.0, 2.0), vec![3, 3])], |t| {
        t[0].median()
    });
    // The mode of lanes with repeats built in (each lane's third value three times), so
    // the differences move every copy together and the mode stays the same element.
    let repeat = Tensor::from_vec(vec![0i64, 1, 1, 2, 2, 2, 3], [7]);
    check("mode", &[(values(12, 125, -2.0, 2.0), vec![3, 4])], |t| {
        let x = t[0].index_select(1, &repeat);
        x.mode(1, false).0.exp() + x.t().mode(0, true).0.squeeze_dim(0)
    });
    check(
        "quantiles linear and midpoint",
        &[(values(18, 123, -2.0, 2.0), vec![3, 6])],
        |t| {
            t[0].quantiles(&[0.1, 0.5, 0.9], Some(1), false, Q::Linear)
                + t[0].quantiles(&[0.3, 0.7, 1.0], Some(1), false, Q::Midpoint)
        },
    );
    // The NaN-skipping forms, with NaNs put in by a mask (their lanes then hold 3 to 5
    // numbers) so that the finite differences move only the numbers.
    let nan_mask = |t: &Tensor| {
        let m = Tensor::from_vec(
            vec![
                false, true, false, false, false, false, true, false, false, true, false, false,
                false, false, false, false, false, false,
            ],
            [3, 6],
        );
        t.masked_fill(&m, f64::NAN)
    };
    check(
        "nanmedian_dim and nanquantiles",
        &[(values(18, 124, -2.0, 2.0), vec![3, 6])],
        |t| {
            let x = nan_mask(&t[0]);
            x.nanquantiles(&[0.1, 0.6], Some(1), false, Q::Linear) + x.nanmedian_dim(1, false).0
        },
    );
}

/// The second family of composites (see `tests/composite_math.rs`): their gradients come
/// from their parts; these check the compositions, including the `where` arms that must
/// not leak NaN into the gradient.
#[test]
fn numeric_linalg_and_arrangement_composites() {
    let nan_mask = Tensor::from_vec(vec![false, true, false, false, false, true], [2, 3]);
    check(
        "nansum, nanmean, var_mean, std_mean, aminmax",
        &[(values(6, 130, -2.0, 2.0), vec![2, 3])],
        |t| {
            let x = t[0].masked_fill(&nan_mask, f64::NAN);
            let (v, m) = t[0].var_mean(1, 1, false);
            let (s, m2) = t[0].std_mean(0, 0, false);
            let (lo, hi) = t[0].aminmax(1, false);
            x.nansum(1) + x.nanmean(1) * 3.0 + v + m + s.sum(..) * m2.sum(..) + lo * hi
        },
    );
    check(
        "logaddexp, hypot, lerp (tensor weight), nan_to_num",
        &[
            (values(6, 131, -3.0, 3.0), vec![2, 3]),
            (values(3, 132, -3.0, 3.0), vec![3]),
            (values(3, 133, 0.0, 1.0), vec![3]),
        ],
        |t| {
            let inf = Tensor::from_vec(vec![f64::INFINITY, 0.0, f64::NEG_INFINITY], [3]);
            t[0].logaddexp(&t[1])
                + t[0].hypot(&t[1])
                + t[0].lerp(&t[1].unsqueeze(0).expand([2, 3]), &t[2])
                + t[0].lerp(&t[1].unsqueeze(0).expand([2, 3]), 0.75)
                + (&t[1] + &inf).nan_to_num(0.0, Some(2.0), Some(-2.0)) * &t[1]
        },
    );
    check(
        "logaddexp at equal arguments",
        &[(values(4, 134, -2.0, 2.0), vec![4])],
        |t| t[0].logaddexp(&t[0]) + t[0].hypot(&t[0]),
    );
    check(
        "outer, trace, cross, addmm, kron, cdist",
        &[
            (values(3, 135, -1.0, 1.0), vec![3]),
            (values(6, 136, -1.0, 1.0), vec![2, 3]),
            (values(9, 137, -1.0, 1.0), vec![3, 3]),
        ],
        |t| {
            let o = t[0].outer(&t[0]);
            let c = t[1].cross(&t[0].unsqueeze(0), 1);
            let a = t[0].addmm(&t[1], &t[2], 0.5, 2.0);
            o.trace()
                + c.sum(..)
                + a.sum(..)
                + t[2].t().trace() * o.sum(..)
                + t[1].kron(&t[2]).exp().sum(..)
                + t[1].cdist(&t[2], 2.0).sum(..)
                + t[1].cdist(&t[2], 1.5).sum(..)
                + t[1].cdist(&t[2], f64::INFINITY).sum(..)
        },
    );
    let take = Tensor::from_vec(vec![2i64, 0, 1, 1], [2, 2]);
    let reps = Tensor::from_vec(vec![2i64, 0, 3], [3]);
    check(
        "diff, rot90, meshgrid, repeat_interleave, take_along_dim, kthvalue, unfold, cummax, cummin, logcumsumexp",
        &[(values(6, 138, -2.0, 2.0), vec![2, 3])],
        |t| {
            let x = &t[0];
            let g = Tensor::meshgrid(&[&x.select(0, 0), &x.select(1, 1)], "xy");
            x.diff(2, 1).sum(..)
                + x.rot90(1, [0, 1]).diff(1, 0).sum(..)
                + (&g[0] * &g[1]).sum(..)
                + x.repeat_interleave(2, Some(0)).exp().sum(..)
                + x.repeat_interleave_by(&reps, Some(1)).sin().sum(..)
                + x.take_along_dim(&take, Some(1)).exp().sum(..)
                + x.kthvalue(2, 1, false).0.sum(..)
                + x.unfold(1, 2, 1).exp().sum(..)
                + x.cummax(1).0.sum(..)
                + x.cummin(0).0.exp().sum(..)
                + x.logcumsumexp(1).sum(..)
        },
    );
}

#[test]
fn activations() {
    // Inputs spread over [-5, 5] (kinks at 0, ±0.5, ±1, ±3, 6 fall between the samples;
    // a finite difference never straddles one). Each function gets its own weights through
    // `sin`/`exp` of the sum so that a wrong term cannot cancel another.
    check(
        "leaky_relu, elu, selu, celu, hardtanh, relu6, hardsigmoid, hardswish",
        &[(values(12, 140, -5.0, 5.0), vec![3, 4])],
        |t| {
            let x = &t[0];
            x.leaky_relu(0.1).sum(..)
                + x.elu(0.7).sin().sum(..)
                + x.selu().exp().sum(..) * 0.01
                + x.celu(1.5).square().sum(..)
                + x.hardtanh(-1.0, 2.0).exp().sum(..)
                + (x * 2.0).relu6().sin().sum(..)
                + x.hardsigmoid().square().sum(..)
                + x.hardswish().sin().sum(..)
        },
    );
    check(
        "mish, log_sigmoid, softsign, softplus_with, tanhshrink, softshrink, hardshrink, threshold",
        &[(values(12, 141, -5.0, 5.0), vec![4, 3])],
        |t| {
            let x = &t[0];
            x.mish().sum(..)
                + x.log_sigmoid().sin().sum(..)
                + x.softsign().square().sum(..)
                + x.softplus_with(2.0, 3.0).sin().sum(..)
                + x.softplus_with(0.5, 20.0).exp().sum(..)
                + x.tanhshrink().sin().sum(..)
                + x.softshrink(0.5).square().sum(..)
                + x.hardshrink(1.0).sin().sum(..)
                + x.threshold(0.25, -2.0).exp().sum(..)
        },
    );
    // glu along the strided last dimension of a transposed input, and prelu's input and slopes.
    check(
        "glu, prelu",
        &[
            (values(24, 142, -3.0, 3.0), vec![2, 4, 3]),
            (values(4, 143, -1.0, 1.0), vec![4]),
            (values(1, 144, 0.1, 0.5), vec![1]),
        ],
        |t| {
            let x = t[0].transpose(1, 2);
            x.glu(2).sin().sum(..)
                + t[0].prelu(&t[1]).square().sum(..)
                + t[0].prelu(&t[2]).sin().sum(..)
                + t[1].prelu(&t[2]).exp().sum(..)
        },
    );
}

#[test]
fn normalization() {
    use kiln::nn::functional as F;
    check(
        "batch_norm (training, weight, bias), on a permuted input",
        &[
            (values(24, 140, -2.0, 2.0), vec![4, 2, 3]),
            (values(3, 141, 0.5, 1.5), vec![3]),
            (values(3, 142, -1.0, 1.0), vec![3]),
        ],
        |t| {
            let (rm, rv) = (
                Tensor::zeros_dtype([3], DType::F64),
                Tensor::ones_dtype([3], DType::F64),
            );
            let x = t[0].permute([1, 2, 0]); // [2, 3, 4]: channels 3
            F::batch_norm(
                &x,
                Some(&rm),
                Some(&rv),
                Some(&t[1]),
                Some(&t[2]),
                true,
                0.1,
                1e-5,
            )
            .unwrap()
        },
    );
    check(
        "group_norm (weight, bias)",
        &[
            (values(36, 143, -2.0, 2.0), vec![3, 4, 3]),
            (values(4, 144, 0.5, 1.5), vec![4]),
            (values(4, 145, -1.0, 1.0), vec![4]),
        ],
        |t| F::group_norm(&t[0], 2, Some(&t[1]), Some(&t[2]), 1e-5).unwrap(),
    );
    check(
        "instance_norm, rms_norm (weight)",
        &[
            (values(24, 146, -2.0, 2.0), vec![2, 3, 4]),
            (values(4, 147, 0.5, 1.5), vec![4]),
        ],
        |t| {
            F::instance_norm(&t[0], None, None, 1e-5).unwrap()
                + F::rms_norm(&t[0].transpose(0, 1), &[4], Some(&t[1]), None)
                    .unwrap()
                    .transpose(0, 1)
        },
    );
    check(
        "normalize (p = 2, 3, inf; a row shorter than eps)",
        &[(
            {
                let mut v = values(12, 148, -2.0, 2.0);
                v[8..].copy_from_slice(&values(4, 151, -0.2, 0.2));
                v
            },
            vec![3, 4],
        )],
        |t| {
            F::normalize(&t[0], 2.0, 1, 1e-12).unwrap()
                + F::normalize(&t[0], 2.0, 1, 1.0).unwrap()
                + F::normalize(&t[0], 3.0, 1, 1e-12).unwrap()
                + F::normalize(&t[0], f64::INFINITY, -1, 1e-12).unwrap()
                + F::normalize(&t[0].t(), 2.0, 0, 1e-12).unwrap().t()
        },
    );
    check(
        "cosine_similarity (broadcast), pairwise_distance (p = 2, 1.5)",
        &[
            (values(12, 149, -2.0, 2.0), vec![3, 4]),
            (values(8, 150, -2.0, 2.0), vec![2, 1, 4]),
        ],
        |t| {
            F::cosine_similarity(&t[0], &t[1], -1, 1e-8).unwrap()
                + F::pairwise_distance(&t[0], &t[1], 2.0, 1e-6, false).unwrap()
                + F::pairwise_distance(&t[1], &t[0], 1.5, 1e-6, false).unwrap()
        },
    );
}
