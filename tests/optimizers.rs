//! RMSprop, Adagrad, Adamax and NAdam against plain f64 loops written from PyTorch's
//! documented algorithms; their steps replaying one cached plan; and the learning-rate
//! schedulers' sequences against hand-computed values.
//!
//! The plan cache and the graph's node count are process-wide, so every test holds one lock.

use kiln::nn::functional::mse_loss;
use kiln::optim::{
    Adagrad, AdagradOptions, Adamax, AdamaxOptions, CosineAnnealingLr, ExponentialLr, LambdaLr,
    LinearLr, LrSchedule, LrScheduler, MultiStepLr, NAdam, NAdamOptions, OneCycleAnneal,
    OneCycleLr, Optimizer, ParamGroup, PlateauMode, ReduceLrOnPlateau, ReduceLrOnPlateauOptions,
    RmsProp, RmsPropOptions, Sgd, SgdOptions, StepLr, ThresholdMode,
};
use kiln::{KilnError, Tensor};
use std::sync::{Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The parameters' starting values: a vector and a matrix.
fn initial() -> Vec<(Vec<f64>, Vec<usize>)> {
    vec![
        (vec![0.5, -1.0, 1.5], vec![3]),
        (vec![0.2, -0.3, 0.8, -1.2], vec![2, 2]),
    ]
}

fn make_params() -> Vec<Tensor> {
    initial()
        .into_iter()
        .map(|(v, shape)| {
            let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            let t = Tensor::from_vec(v, &shape).requires_grad_(true);
            t.realize().unwrap();
            t
        })
        .collect()
}

/// The hand-set part of parameter `j`'s gradient at step `k`: the loss is
/// `Σ c·p + ½Σ p²`, so the gradient is `c + p`.
fn c_vals(k: usize, j: usize, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| (0.7 * (i + 3 * j + 1) as f64 + 1.3 * k as f64).sin())
        .collect()
}

/// Steps `opt` `steps` times on the loss above, calling `before(k, opt)` first each step
/// (a schedule); returns every parameter's values after each step and each step's report
/// of whether it hit the plan cache.
fn run_kiln(
    opt: &mut dyn Optimizer,
    params: &[Tensor],
    steps: usize,
    before: &mut dyn FnMut(usize, &mut dyn Optimizer),
) -> (Vec<Vec<Vec<f64>>>, Vec<bool>) {
    let mut history = vec![];
    let mut hits = vec![];
    for k in 0..steps {
        before(k, opt);
        opt.zero_grad();
        let mut loss: Option<Tensor> = None;
        for (j, p) in params.iter().enumerate() {
            let c: Vec<f32> = c_vals(k, j, p.numel()).iter().map(|&x| x as f32).collect();
            let c = Tensor::from_vec(c, p.shape());
            let term = (p * &c).sum(..) + (p * p).sum(..) * 0.5;
            loss = Some(match loss {
                Some(l) => l + term,
                None => term,
            });
        }
        loss.unwrap().backward().unwrap();
        hits.push(opt.step_report().unwrap().cache_hit);
        history.push(
            params
                .iter()
                .map(|p| {
                    p.to_vec::<f32>()
                        .unwrap()
                        .iter()
                        .map(|&x| x as f64)
                        .collect()
                })
                .collect(),
        );
    }
    (history, hits)
}

/// The same loop in f64: `update(j, t, k, p, g)` applies parameter `j`'s `t`-th update
/// (1-based) at step `k`.
fn run_reference(
    steps: usize,
    mut update: impl FnMut(usize, u64, usize, &mut Vec<f64>, &[f64]),
) -> Vec<Vec<Vec<f64>>> {
    let mut ps: Vec<Vec<f64>> = initial().into_iter().map(|(v, _)| v).collect();
    let mut history = vec![];
    for k in 0..steps {
        for (j, p) in ps.iter_mut().enumerate() {
            let g: Vec<f64> = c_vals(k, j, p.len())
                .iter()
                .zip(p.iter())
                .map(|(c, x)| c + x)
                .collect();
            update(j, k as u64 + 1, k, p, &g);
        }
        history.push(ps.clone());
    }
    history
}

fn assert_close(what: &str, got: &[Vec<Vec<f64>>], want: &[Vec<Vec<f64>>]) {
    assert_eq!(got.len(), want.len());
    for (k, (gs, ws)) in got.iter().zip(want).enumerate() {
        for (j, (g, w)) in gs.iter().zip(ws).enumerate() {
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-4 * (1.0 + b.abs()),
                    "{what}: step {k}, param {j}[{i}]: kiln {a} vs reference {b}"
                );
            }
        }
    }
    // The parameters moved: the comparison is not vacuous.
    let first = &initial()[0].0;
    assert!(
        want.last().unwrap()[0]
            .iter()
            .zip(first)
            .any(|(a, b)| (a - b).abs() > 1e-3)
    );
}

/// PyTorch's RMSprop on one parameter: `state[j] = (v, ḡ, b)`.
fn rmsprop_ref(
    h: RmsPropOptions,
    state: &mut [(Vec<f64>, Vec<f64>, Vec<f64>)],
    j: usize,
    lr: f64,
    p: &mut [f64],
    g: &[f64],
) {
    let (v, gavg, b) = &mut state[j];
    if v.is_empty() {
        *v = vec![0.0; p.len()];
        *gavg = vec![0.0; p.len()];
        *b = vec![0.0; p.len()];
    }
    for i in 0..p.len() {
        let mut gi = if h.maximize { -g[i] } else { g[i] };
        gi += h.weight_decay * p[i];
        v[i] = h.alpha * v[i] + (1.0 - h.alpha) * gi * gi;
        let mut avg = v[i];
        if h.centered {
            gavg[i] = h.alpha * gavg[i] + (1.0 - h.alpha) * gi;
            avg -= gavg[i] * gavg[i];
        }
        let denom = avg.sqrt() + h.eps;
        if h.momentum > 0.0 {
            b[i] = h.momentum * b[i] + gi / denom;
            p[i] -= lr * b[i];
        } else {
            p[i] -= lr * gi / denom;
        }
    }
}

#[test]
fn rmsprop_matches_pytorchs_algorithm() {
    let _g = lock();
    let cases = [
        RmsPropOptions::default(),
        RmsPropOptions {
            lr: 0.02,
            weight_decay: 0.1,
            ..Default::default()
        },
        RmsPropOptions {
            lr: 0.01,
            momentum: 0.9,
            ..Default::default()
        },
        RmsPropOptions {
            lr: 0.01,
            centered: true,
            alpha: 0.9,
            ..Default::default()
        },
        RmsPropOptions {
            lr: 0.005,
            centered: true,
            momentum: 0.5,
            weight_decay: 0.05,
            maximize: true,
            eps: 1e-3,
            ..Default::default()
        },
    ];
    for h in cases {
        let params = make_params();
        let mut opt = RmsProp::with_options(params.clone(), h).unwrap();
        let (got, _) = run_kiln(&mut opt, &params, 10, &mut |_, _| {});
        let mut state = vec![Default::default(); 2];
        let want = run_reference(10, |j, _, _, p, g| {
            rmsprop_ref(h, &mut state, j, h.lr, p, g)
        });
        assert_close(&format!("RmsProp {h:?}"), &got, &want);
    }
}

#[test]
fn rmsprop_param_groups_keep_their_own_options() {
    let _g = lock();
    let params = make_params();
    let h0 = RmsPropOptions {
        lr: 0.01,
        ..Default::default()
    };
    let h1 = RmsPropOptions {
        lr: 0.05,
        momentum: 0.8,
        centered: true,
        weight_decay: 0.1,
        ..Default::default()
    };
    let mut opt = RmsProp::with_groups(vec![
        ParamGroup::new(vec![params[0].clone()], h0),
        ParamGroup::new(vec![params[1].clone()], h1),
    ])
    .unwrap();
    assert_eq!(opt.group_lrs(), vec![0.01, 0.05]);
    let (got, _) = run_kiln(&mut opt, &params, 10, &mut |_, _| {});
    let mut state = vec![Default::default(); 2];
    let want = run_reference(10, |j, _, _, p, g| {
        let h = if j == 0 { h0 } else { h1 };
        rmsprop_ref(h, &mut state, j, h.lr, p, g)
    });
    assert_close("RmsProp groups", &got, &want);
}

/// PyTorch's Adagrad on one parameter (`t` its update count): `sums[j]`.
fn adagrad_ref(
    h: AdagradOptions,
    sums: &mut [Vec<f64>],
    j: usize,
    t: u64,
    p: &mut [f64],
    g: &[f64],
) {
    let s = &mut sums[j];
    if s.is_empty() {
        *s = vec![h.initial_accumulator_value; p.len()];
    }
    let clr = h.lr / (1.0 + (t - 1) as f64 * h.lr_decay);
    for i in 0..p.len() {
        let mut gi = if h.maximize { -g[i] } else { g[i] };
        gi += h.weight_decay * p[i];
        s[i] += gi * gi;
        p[i] -= clr * gi / (s[i].sqrt() + h.eps);
    }
}

#[test]
fn adagrad_matches_pytorchs_algorithm() {
    let _g = lock();
    let cases = [
        AdagradOptions::default(),
        AdagradOptions {
            lr: 0.1,
            lr_decay: 0.05,
            ..Default::default()
        },
        AdagradOptions {
            lr: 0.1,
            weight_decay: 0.2,
            initial_accumulator_value: 0.5,
            ..Default::default()
        },
        AdagradOptions {
            lr: 0.05,
            lr_decay: 0.1,
            weight_decay: 0.05,
            maximize: true,
            eps: 1e-3,
            ..Default::default()
        },
    ];
    for h in cases {
        let params = make_params();
        let mut opt = Adagrad::with_options(params.clone(), h).unwrap();
        let (got, hits) = run_kiln(&mut opt, &params, 10, &mut |_, _| {});
        // The decaying rate changes every step; the plan does not.
        assert!(hits[1..].iter().all(|&h| h), "{h:?}: {hits:?}");
        let mut sums = vec![vec![]; 2];
        let want = run_reference(10, |j, t, _, p, g| adagrad_ref(h, &mut sums, j, t, p, g));
        assert_close(&format!("Adagrad {h:?}"), &got, &want);
        assert_eq!(opt.param_steps(0), Some(10));
    }
}

#[test]
fn adagrad_param_groups_keep_their_own_options() {
    let _g = lock();
    let params = make_params();
    let h0 = AdagradOptions {
        lr: 0.05,
        ..Default::default()
    };
    let h1 = AdagradOptions {
        lr: 0.2,
        lr_decay: 0.1,
        ..Default::default()
    };
    let mut opt = Adagrad::with_groups(vec![
        ParamGroup::new(vec![params[0].clone()], h0),
        ParamGroup::new(vec![params[1].clone()], h1),
    ])
    .unwrap();
    let (got, _) = run_kiln(&mut opt, &params, 10, &mut |_, _| {});
    let mut sums = vec![vec![]; 2];
    let want = run_reference(10, |j, t, _, p, g| {
        adagrad_ref(if j == 0 { h0 } else { h1 }, &mut sums, j, t, p, g)
    });
    assert_close("Adagrad groups", &got, &want);
}

#[test]
fn adamax_matches_pytorchs_algorithm() {
    let _g = lock();
    let cases = [
        AdamaxOptions {
            lr: 0.05,
            ..Default::default()
        },
        AdamaxOptions {
            lr: 0.05,
            betas: (0.8, 0.9),
            weight_decay: 0.1,
            maximize: true,
            eps: 1e-3,
        },
    ];
    for h in cases {
        let params = make_params();
        let mut opt = Adamax::with_options(params.clone(), h).unwrap();
        let (got, _) = run_kiln(&mut opt, &params, 10, &mut |_, _| {});
        let mut state: Vec<(Vec<f64>, Vec<f64>)> = vec![Default::default(); 2];
        let want = run_reference(10, |j, t, _, p, g| {
            let (m, u) = &mut state[j];
            if m.is_empty() {
                *m = vec![0.0; p.len()];
                *u = vec![0.0; p.len()];
            }
            let (b1, b2) = h.betas;
            for i in 0..p.len() {
                let mut gi = if h.maximize { -g[i] } else { g[i] };
                gi += h.weight_decay * p[i];
                m[i] = b1 * m[i] + (1.0 - b1) * gi;
                u[i] = (b2 * u[i]).max(gi.abs() + h.eps);
                p[i] -= h.lr / (1.0 - b1.powi(t as i32)) * m[i] / u[i];
            }
        });
        assert_close(&format!("Adamax {h:?}"), &got, &want);
    }
}

#[test]
fn nadam_matches_pytorchs_algorithm() {
    let _g = lock();
    let cases = [
        NAdamOptions {
            lr: 0.05,
            ..Default::default()
        },
        NAdamOptions {
            lr: 0.05,
            weight_decay: 0.1,
            momentum_decay: 0.1,
            maximize: true,
            ..Default::default()
        },
        NAdamOptions {
            lr: 0.05,
            weight_decay: 0.1,
            decoupled_weight_decay: true,
            betas: (0.8, 0.99),
            ..Default::default()
        },
    ];
    for h in cases {
        let params = make_params();
        let mut opt = NAdam::with_options(params.clone(), h).unwrap();
        let (got, _) = run_kiln(&mut opt, &params, 10, &mut |_, _| {});
        let mut state: Vec<(Vec<f64>, Vec<f64>, f64)> = vec![(vec![], vec![], 1.0); 2];
        let want = run_reference(10, |j, t, _, p, g| {
            let (m, v, prod) = &mut state[j];
            if m.is_empty() {
                *m = vec![0.0; p.len()];
                *v = vec![0.0; p.len()];
            }
            let (b1, b2) = h.betas;
            let tf = t as f64;
            let mu = b1 * (1.0 - 0.5 * 0.96f64.powf(tf * h.momentum_decay));
            let mu1 = b1 * (1.0 - 0.5 * 0.96f64.powf((tf + 1.0) * h.momentum_decay));
            *prod *= mu;
            for i in 0..p.len() {
                let mut gi = if h.maximize { -g[i] } else { g[i] };
                if h.decoupled_weight_decay {
                    p[i] *= 1.0 - h.lr * h.weight_decay;
                } else {
                    gi += h.weight_decay * p[i];
                }
                m[i] = b1 * m[i] + (1.0 - b1) * gi;
                v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
                let denom = (v[i] / (1.0 - b2.powf(tf))).sqrt() + h.eps;
                p[i] -= h.lr * (1.0 - mu) / (1.0 - *prod) * gi / denom;
                p[i] -= h.lr * mu1 / (1.0 - *prod * mu1) * m[i] / denom;
            }
        });
        assert_close(&format!("NAdam {h:?}"), &got, &want);
    }
}

/// Builds a boxed optimizer over parameters.
type MakeOptimizer = fn(Vec<Tensor>) -> Box<dyn Optimizer>;

/// After one warm-up step, every step replays the cached plan — with the learning rate
/// changed by a schedule every step — and the graph's node count stays flat.
#[test]
fn steps_replay_one_plan_while_the_rate_changes() {
    let _g = lock();
    let build: Vec<(&str, MakeOptimizer)> = vec![
        ("RmsProp", |p| {
            let h = RmsPropOptions {
                momentum: 0.9,
                centered: true,
                weight_decay: 0.01,
                ..Default::default()
            };
            Box::new(RmsProp::with_options(p, h).unwrap())
        }),
        ("Adagrad", |p| {
            let h = AdagradOptions {
                lr_decay: 0.01,
                weight_decay: 0.01,
                ..Default::default()
            };
            Box::new(Adagrad::with_options(p, h).unwrap())
        }),
        ("Adamax", |p| Box::new(Adamax::new(p, 0.01).unwrap())),
        ("NAdam", |p| Box::new(NAdam::new(p, 0.01).unwrap())),
    ];
    for (name, make) in build {
        let params = make_params();
        let mut opt = make(params.clone());
        let mut sched = LrScheduler::new(opt.as_mut(), ExponentialLr { gamma: 0.9 }).unwrap();
        // Warm-up: the first steps plan.
        let _ = run_kiln(opt.as_mut(), &params, 3, &mut |_, o| {
            sched.step(o).unwrap();
        });
        let before = kiln::cache_stats();
        let nodes_before = kiln::graph::live_nodes();
        let lr_before = opt.lr();
        let (_, hits) = run_kiln(opt.as_mut(), &params, 12, &mut |_, o| {
            sched.step(o).unwrap();
        });
        let after = kiln::cache_stats();
        assert!(hits.iter().all(|&h| h), "{name}: {hits:?}");
        assert!(
            after.hits >= before.hits + 12,
            "{name}: {before:?} -> {after:?}"
        );
        assert_eq!(after.misses, before.misses, "{name}: steps re-planned");
        assert_eq!(
            kiln::graph::live_nodes(),
            nodes_before,
            "{name}: the graph grew"
        );
        assert!((opt.lr() - lr_before * 0.9f64.powi(12)).abs() < 1e-12);
    }
}

/// A parameter without a gradient is left alone, and its state does not advance.
#[test]
fn a_parameter_without_a_gradient_is_skipped() {
    let _g = lock();
    let params = make_params();
    let mut opt = Adagrad::new(params.clone(), 0.1).unwrap();
    (&params[0] * &params[0]).sum(..).backward().unwrap();
    opt.step().unwrap();
    assert_eq!(opt.param_steps(0), Some(1));
    assert_eq!(opt.param_steps(1), Some(0));
    let untouched: Vec<f32> = initial()[1].0.iter().map(|&x| x as f32).collect();
    assert_eq!(params[1].to_vec::<f32>().unwrap(), untouched);
}

#[test]
fn bad_hyperparameters_are_refused() {
    let _g = lock();
    let p = || make_params();
    let err = |e: KilnError| e.to_string();
    let e = RmsProp::new(p(), -0.1).unwrap_err();
    assert!(err(e).contains("learning rate"));
    let h = RmsPropOptions {
        eps: -1.0,
        ..Default::default()
    };
    assert!(err(RmsProp::with_options(p(), h).unwrap_err()).contains("eps"));
    let h = RmsPropOptions {
        alpha: f64::NAN,
        ..Default::default()
    };
    assert!(err(RmsProp::with_options(p(), h).unwrap_err()).contains("alpha"));
    let h = AdagradOptions {
        lr_decay: -1.0,
        ..Default::default()
    };
    assert!(err(Adagrad::with_options(p(), h).unwrap_err()).contains("lr_decay"));
    let h = AdagradOptions {
        initial_accumulator_value: -1.0,
        ..Default::default()
    };
    let e = Adagrad::with_options(p(), h).unwrap_err();
    assert!(err(e).contains("initial_accumulator_value"));
    let h = AdamaxOptions {
        betas: (1.0, 0.9),
        ..Default::default()
    };
    assert!(err(Adamax::with_options(p(), h).unwrap_err()).contains("beta1"));
    let h = NAdamOptions {
        momentum_decay: -1.0,
        ..Default::default()
    };
    assert!(err(NAdam::with_options(p(), h).unwrap_err()).contains("momentum_decay"));
    // A parameter in two groups.
    let ps = p();
    let e = RmsProp::with_groups(vec![
        ParamGroup::new(vec![ps[0].clone()], Default::default()),
        ParamGroup::new(vec![ps[0].clone()], Default::default()),
    ])
    .unwrap_err();
    assert!(err(e).contains("more than once"));
}

#[test]
fn defaults_are_pytorchs() {
    let r = RmsPropOptions::default();
    assert_eq!((r.lr, r.alpha, r.eps, r.momentum), (1e-2, 0.99, 1e-8, 0.0));
    assert!(!r.centered && !r.maximize && r.weight_decay == 0.0);
    let a = AdagradOptions::default();
    assert_eq!((a.lr, a.lr_decay, a.eps), (1e-2, 0.0, 1e-10));
    assert_eq!((a.weight_decay, a.initial_accumulator_value), (0.0, 0.0));
    let m = AdamaxOptions::default();
    assert_eq!(
        (m.lr, m.betas, m.eps, m.weight_decay),
        (2e-3, (0.9, 0.999), 1e-8, 0.0)
    );
    let n = NAdamOptions::default();
    assert_eq!((n.lr, n.momentum_decay), (2e-3, 4e-3));
    let l = LinearLr::default();
    assert_eq!(
        (l.start_factor, l.end_factor, l.total_iters),
        (1.0 / 3.0, 1.0, 5)
    );
    let o = OneCycleLr::new(1.0, 100);
    assert_eq!(
        (o.pct_start, o.div_factor, o.final_div_factor),
        (0.3, 25.0, 1e4)
    );
    assert!(!o.three_phase && o.anneal == OneCycleAnneal::Cos);
    let p = ReduceLrOnPlateauOptions::default();
    assert_eq!(
        (p.factor, p.patience, p.threshold, p.cooldown),
        (0.1, 10, 1e-4, 0)
    );
    assert_eq!(
        (p.mode, p.threshold_mode, p.min_lr),
        (PlateauMode::Min, ThresholdMode::Rel, 0.0)
    );
}

/// A tiny linear regression, `y = x·w* + b*`, fit from zero.
fn fit(make: impl Fn(Vec<Tensor>) -> Box<dyn Optimizer>, steps: usize) -> (f32, f32) {
    let x = Tensor::randn_seeded([64, 3], 11);
    x.realize().unwrap();
    let w_true = Tensor::from_vec(vec![1.0f32, -2.0, 0.5], [3, 1]);
    let y = x.matmul(&w_true) + 0.3;
    y.realize().unwrap();
    let w = Tensor::from_vec(vec![0.0f32; 3], [3, 1]).requires_grad_(true);
    let b = Tensor::from_vec(vec![0.0f32], [1]).requires_grad_(true);
    w.realize().unwrap();
    b.realize().unwrap();
    let mut opt = make(vec![w.clone(), b.clone()]);
    let (mut first, mut last) = (0.0, 0.0);
    for k in 0..steps {
        opt.zero_grad();
        let loss = mse_loss(&(x.matmul(&w) + &b), &y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        let v = loss.item::<f32>().unwrap();
        if k == 0 {
            first = v;
        }
        last = v;
    }
    (first, last)
}

#[test]
fn linear_regression_trains_with_rmsprop_and_adagrad() {
    let _g = lock();
    let (first, last) = fit(|p| Box::new(RmsProp::new(p, 0.01).unwrap()), 400);
    assert!(
        last < 1e-3 && last < first * 1e-3,
        "RmsProp: {first} -> {last}"
    );
    let (first, last) = fit(|p| Box::new(Adagrad::new(p, 0.5).unwrap()), 300);
    assert!(
        last < 1e-3 && last < first * 1e-3,
        "Adagrad: {first} -> {last}"
    );
}

fn assert_seq(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-12 + 1e-9 * w.abs(),
            "{what}: step {t}: {g} vs {w}"
        );
    }
}

/// The rates a scheduler sets over `n` steps, starting with the one it sets when made.
fn drive<S: LrSchedule>(base: f64, schedule: S, n: usize) -> Vec<f64> {
    let w = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::new(vec![w], base).unwrap();
    let mut sched = LrScheduler::new(&mut opt, schedule).unwrap();
    let mut lrs = vec![opt.lr()];
    for _ in 1..n {
        sched.step(&mut opt).unwrap();
        lrs.push(opt.lr());
        assert_eq!(sched.last_lr(), &[opt.lr()]);
    }
    lrs
}

#[test]
fn closed_form_schedules_match_pytorchs_values() {
    let s = StepLr {
        step_size: 3,
        gamma: 0.1,
    };
    assert_seq(
        "StepLr",
        &drive(0.5, s, 8),
        &[0.5, 0.5, 0.5, 0.05, 0.05, 0.05, 0.005, 0.005],
    );
    let s = MultiStepLr {
        milestones: vec![2, 5],
        gamma: 0.1,
    };
    assert_seq(
        "MultiStepLr",
        &drive(1.0, s, 7),
        &[1.0, 1.0, 0.1, 0.1, 0.1, 0.01, 0.01],
    );
    assert_seq(
        "ExponentialLr",
        &drive(0.8, ExponentialLr { gamma: 0.5 }, 5),
        &[0.8, 0.4, 0.2, 0.1, 0.05],
    );
    // η_min + (base - η_min)(1 + cos(πt/4))/2 with base 1.1, η_min 0.1; past T_max the
    // cosine rises again.
    let s = CosineAnnealingLr {
        t_max: 4,
        eta_min: 0.1,
    };
    assert_seq(
        "CosineAnnealingLr",
        &drive(1.1, s, 7),
        &[
            1.1,
            0.953_553_390_593_273_8,
            0.6,
            0.246_446_609_406_726_3,
            0.1,
            0.246_446_609_406_726_2,
            0.6,
        ],
    );
    // Factor 1/3 rising by (2/3)/5 a step to 1, then flat.
    let l = drive(0.3, LinearLr::default(), 7);
    assert_seq("LinearLr", &l, &[0.1, 0.14, 0.18, 0.22, 0.26, 0.3, 0.3]);
    let s = LinearLr {
        start_factor: 1.0,
        end_factor: 0.0,
        total_iters: 2,
    };
    assert_seq("LinearLr down", &drive(2.0, s, 4), &[2.0, 1.0, 0.0, 0.0]);
    let s = LambdaLr::new(|t| 1.0 / (t + 1) as f64);
    assert_seq("LambdaLr", &drive(0.6, s, 4), &[0.6, 0.3, 0.2, 0.15]);
}

#[test]
fn one_cycle_matches_pytorchs_phases() {
    // max_lr 1, 10 steps: start 0.04, floor 4e-6; the rise ends at 0.3·10 - 1 = 2, the
    // fall at 9.
    let cos = |from: f64, to: f64, pct: f64| {
        to + (from - to) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0)
    };
    let lrs = drive(123.0, OneCycleLr::new(1.0, 10), 11);
    let mut want = vec![0.04, 0.52, 1.0];
    for t in 3..=10 {
        want.push(cos(1.0, 4e-6, (t - 2) as f64 / 7.0));
    }
    assert_seq("OneCycleLr", &lrs, &want);
    assert!((lrs[9] - 4e-6).abs() < 1e-15);
    assert!((lrs[3] - 0.950_484_632_013_473_7).abs() < 1e-12);
    // Stepping past total_steps is an error, as in PyTorch.
    let w = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::new(vec![w], 0.1).unwrap();
    let mut sched = LrScheduler::new(&mut opt, OneCycleLr::new(1.0, 3)).unwrap();
    for _ in 0..3 {
        sched.step(&mut opt).unwrap();
    }
    assert!(sched.step(&mut opt).is_err());
    assert_eq!(sched.current_step(), 3);

    // Three phases: up to 1 by step 2, back to 0.04 by 2·3 - 2 = 4, down to the floor at 9.
    let s = OneCycleLr {
        three_phase: true,
        ..OneCycleLr::new(1.0, 10)
    };
    let lrs = drive(1.0, s, 10);
    let mut want = vec![0.04, 0.52, 1.0, 0.52, 0.04];
    for t in 5..10 {
        want.push(cos(0.04, 4e-6, (t - 4) as f64 / 5.0));
    }
    assert_seq("OneCycleLr three_phase", &lrs, &want);

    // Linear annealing.
    let s = OneCycleLr {
        anneal: OneCycleAnneal::Linear,
        ..OneCycleLr::new(1.0, 10)
    };
    let lrs = drive(1.0, s, 10);
    let mut want = vec![0.04, 0.52, 1.0];
    for t in 3..10 {
        want.push(1.0 + (4e-6 - 1.0) * (t - 2) as f64 / 7.0);
    }
    assert_seq("OneCycleLr linear", &lrs, &want);
}

#[test]
fn schedulers_scale_each_groups_own_rate() {
    let a = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let b = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::with_groups(vec![
        ParamGroup::new(
            vec![a],
            SgdOptions {
                lr: 0.1,
                ..Default::default()
            },
        ),
        ParamGroup::new(
            vec![b],
            SgdOptions {
                lr: 0.01,
                ..Default::default()
            },
        ),
    ])
    .unwrap();
    let s = LinearLr {
        start_factor: 0.5,
        end_factor: 1.0,
        total_iters: 2,
    };
    let mut sched = LrScheduler::new(&mut opt, s).unwrap();
    assert_seq("group lrs at 0", &opt.group_lrs(), &[0.05, 0.005]);
    sched.step(&mut opt).unwrap();
    assert_seq("group lrs at 1", &opt.group_lrs(), &[0.075, 0.0075]);
    sched.step(&mut opt).unwrap();
    assert_seq("group lrs at 2", &opt.group_lrs(), &[0.1, 0.01]);
    assert_eq!(sched.base_lrs(), &[0.1, 0.01]);
    assert_seq("lrs_at", &sched.lrs_at(1), &[0.075, 0.0075]);
}

#[test]
fn bad_schedules_are_refused() {
    let w = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::new(vec![w], 0.1).unwrap();
    let s = StepLr {
        step_size: 0,
        gamma: 0.1,
    };
    assert!(LrScheduler::new(&mut opt, s).is_err());
    let s = CosineAnnealingLr {
        t_max: 0,
        eta_min: 0.0,
    };
    assert!(LrScheduler::new(&mut opt, s).is_err());
    let s = LinearLr {
        start_factor: 0.0,
        ..Default::default()
    };
    assert!(LrScheduler::new(&mut opt, s).is_err());
    let s = OneCycleLr {
        pct_start: 1.5,
        ..OneCycleLr::new(1.0, 10)
    };
    assert!(LrScheduler::new(&mut opt, s).is_err());
    assert!(LrScheduler::new(&mut opt, OneCycleLr::new(1.0, 0)).is_err());
    let o = ReduceLrOnPlateauOptions {
        factor: 1.0,
        ..Default::default()
    };
    let e = ReduceLrOnPlateau::new(o).unwrap_err().to_string();
    assert!(e.contains("factor"), "{e}");
    // Nothing changed the optimizer's rate.
    assert_eq!(opt.lr(), 0.1);
}

#[test]
fn reduce_on_plateau_waits_cools_down_and_floors() {
    let a = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let b = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::with_groups(vec![
        ParamGroup::new(
            vec![a],
            SgdOptions {
                lr: 1.0,
                ..Default::default()
            },
        ),
        ParamGroup::new(
            vec![b],
            SgdOptions {
                lr: 0.3,
                ..Default::default()
            },
        ),
    ])
    .unwrap();
    let opts = ReduceLrOnPlateauOptions {
        factor: 0.5,
        patience: 2,
        cooldown: 1,
        min_lr: 0.2,
        ..Default::default()
    };
    let mut plateau = ReduceLrOnPlateau::new(opts).unwrap();
    let metrics = [
        10.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0,
    ];
    // Step 5 is the third without improvement on 9: reduce (group 1 floors at 0.2); step 6
    // is cooled down; 9 at step 7 and 8 count again, 8 at step 9 improves; step 12 is the
    // third bad one: group 0 halves, group 1 stays at its floor; cooldown at 13; step 16
    // reduces group 0 to the floor as well.
    let want = [
        (1.0, 0.3),
        (1.0, 0.3),
        (1.0, 0.3),
        (1.0, 0.3),
        (0.5, 0.2),
        (0.5, 0.2),
        (0.5, 0.2),
        (0.5, 0.2),
        (0.5, 0.2),
        (0.5, 0.2),
        (0.5, 0.2),
        (0.25, 0.2),
        (0.25, 0.2),
        (0.25, 0.2),
        (0.25, 0.2),
        (0.2, 0.2),
    ];
    for (k, (&m, &(w0, w1))) in metrics.iter().zip(&want).enumerate() {
        let reduced = plateau.step(&mut opt, m);
        assert_seq(
            &format!("plateau step {}", k + 1),
            &opt.group_lrs(),
            &[w0, w1],
        );
        assert_eq!(reduced, matches!(k + 1, 5 | 12 | 16), "step {}", k + 1);
    }
    assert_eq!(plateau.best(), 8.0);

    // Max mode with an absolute threshold: 1.4 is not better than 1.0 + 0.5.
    let w = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::new(vec![w], 1.0).unwrap();
    let opts = ReduceLrOnPlateauOptions {
        mode: PlateauMode::Max,
        threshold_mode: ThresholdMode::Abs,
        threshold: 0.5,
        patience: 0,
        ..Default::default()
    };
    let mut plateau = ReduceLrOnPlateau::new(opts).unwrap();
    assert!(!plateau.step(&mut opt, 1.0));
    assert!(plateau.step(&mut opt, 1.4));
    assert!((opt.lr() - 0.1).abs() < 1e-15);
    assert!(!plateau.step(&mut opt, 2.0));
    assert_eq!(plateau.best(), 2.0);
    // Relative threshold in min mode: 9.9995 is within 1e-4 of 10, so not better.
    let mut plateau = ReduceLrOnPlateau::new(ReduceLrOnPlateauOptions {
        patience: 0,
        ..Default::default()
    })
    .unwrap();
    plateau.step(&mut opt, 10.0);
    assert!(plateau.step(&mut opt, 9.9995));
    assert!((opt.lr() - 0.01).abs() < 1e-15);
}
