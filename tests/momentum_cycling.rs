//! Momentum cycling of CyclicLr and OneCycleLr (PyTorch's `cycle_momentum=True`): the
//! momentum sequences against hand-written f64 loops of PyTorch's formulas, the optimizers'
//! momentum / beta1 actually changing, an SGD run against a hand-written reference, the
//! error for an optimizer without momentum, the plan cache and the state dicts.

use kiln::Tensor;
use kiln::optim::{
    Adagrad, Adam, AdamW, ChainedScheduler, ConstantLr, CyclicLr, CyclicMode, ExponentialLr,
    LrSchedule, LrScheduler, NAdam, OneCycleAnneal, OneCycleLr, Optimizer, ParamGroup, RmsProp,
    RmsPropOptions, SequentialLr, Sgd, SgdOptions,
};

/// A small deterministic generator of values in `[-1, 1)`.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

fn close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{name}[{i}]: {g} vs {w}"
        );
    }
}

/// PyTorch's CyclicLR momentum at step `t`, written out.
fn cyclic_reference(s: &CyclicLr, t: u64) -> f64 {
    let up = s.step_size_up as f64;
    let down = s.step_size_down.unwrap_or(s.step_size_up) as f64;
    let total = up + down;
    let step_ratio = up / total;
    let t = t as f64;
    let cycle = (1.0 + t / total).floor();
    let x = 1.0 + t / total - cycle;
    let scale_factor = if x <= step_ratio {
        x / step_ratio
    } else {
        (x - 1.0) / (step_ratio - 1.0)
    };
    let scale = match s.mode {
        CyclicMode::Triangular => 1.0,
        CyclicMode::Triangular2 => 1.0 / 2f64.powf(cycle - 1.0),
        CyclicMode::ExpRange { gamma } => gamma.powf(t),
    };
    let base_height = (s.max_momentum - s.base_momentum) * scale_factor;
    s.max_momentum - base_height * scale
}

/// PyTorch's OneCycleLR momentum at step `t`, written out from its phase table.
fn one_cycle_reference(s: &OneCycleLr, t: u64) -> f64 {
    let total = s.total_steps as f64;
    let (lo, hi) = (s.base_momentum, s.max_momentum);
    let phases: Vec<(f64, f64, f64)> = if s.three_phase {
        vec![
            (s.pct_start * total - 1.0, hi, lo),
            (2.0 * s.pct_start * total - 2.0, lo, hi),
            (total - 1.0, hi, hi),
        ]
    } else {
        vec![(s.pct_start * total - 1.0, hi, lo), (total - 1.0, lo, hi)]
    };
    let t = t as f64;
    let mut start = 0.0;
    for (i, &(end, a, b)) in phases.iter().enumerate() {
        if t <= end || i == phases.len() - 1 {
            let pct = (t - start) / (end - start);
            return match s.anneal {
                OneCycleAnneal::Cos => {
                    b + (a - b) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0)
                }
                OneCycleAnneal::Linear => (b - a) * pct + a,
            };
        }
        start = end;
    }
    unreachable!()
}

/// The optimizer's momenta after construction and after each of `n` scheduler steps.
fn driven_momenta<S: LrSchedule>(opt: &mut dyn Optimizer, s: S, n: usize) -> Vec<Vec<f64>> {
    let mut sched = LrScheduler::new(opt, s).unwrap();
    let mut seen = vec![opt.group_momenta().unwrap()];
    for _ in 0..n {
        sched.step(opt).unwrap();
        seen.push(opt.group_momenta().unwrap());
    }
    seen
}

fn param(n: usize, rng: &mut Lcg) -> Tensor {
    let v: Vec<f32> = (0..n).map(|_| rng.next() as f32).collect();
    let w = Tensor::from_vec(v, [n]).requires_grad_(true);
    w.realize().unwrap();
    w
}

#[test]
fn cyclic_momentum_follows_pytorchs_formula_in_every_mode() {
    let mut rng = Lcg(7);
    for mode in [
        CyclicMode::Triangular,
        CyclicMode::Triangular2,
        CyclicMode::ExpRange { gamma: 0.95 },
    ] {
        for (up, down) in [(3u64, None), (2, Some(5)), (4, Some(1))] {
            let s = CyclicLr {
                step_size_down: down,
                mode,
                ..CyclicLr::new(0.01, 0.1, up)
            };
            assert_eq!((s.base_momentum, s.max_momentum), (0.8, 0.9));
            assert!(s.cycle_momentum);
            // Two groups, the second without momentum: both get the cycled momentum.
            let groups = vec![
                ParamGroup::new(
                    vec![param(2, &mut rng)],
                    SgdOptions {
                        lr: 0.5,
                        momentum: 0.3,
                        ..Default::default()
                    },
                ),
                ParamGroup::new(vec![param(3, &mut rng)], SgdOptions::default()),
            ];
            let mut opt = Sgd::with_groups(groups).unwrap();
            let seen = driven_momenta(&mut opt, s, 25);
            let name = format!("{mode:?} {up} {down:?}");
            for g in 0..2 {
                let got: Vec<f64> = seen.iter().map(|m| m[g]).collect();
                let want: Vec<f64> = (0..=25).map(|t| cyclic_reference(&s, t)).collect();
                close(&name, &got, &want, 1e-12);
            }
            // Step 0 sets max_momentum, as PyTorch's constructor does.
            assert_eq!(seen[0], [0.9, 0.9], "{name}");
            // Random bounds too.
            let (a, b) = (rng.next().abs() * 0.5, 0.5 + rng.next().abs() * 0.4);
            let s = CyclicLr {
                base_momentum: a,
                max_momentum: b,
                ..s
            };
            let got: Vec<f64> = (0..20).map(|t| s.momentum_at(t).unwrap()).collect();
            let want: Vec<f64> = (0..20).map(|t| cyclic_reference(&s, t)).collect();
            close(&name, &got, &want, 1e-12);
        }
    }
    // Off: no momentum, and the optimizer's stays.
    let s = CyclicLr {
        cycle_momentum: false,
        ..CyclicLr::new(0.1, 1.0, 2)
    };
    assert_eq!(s.momentum_at(1), None);
    let mut opt = Sgd::with_momentum(vec![param(2, &mut rng)], 0.1, 0.3, 0.0, false).unwrap();
    let mut sched = LrScheduler::new(&mut opt, s).unwrap();
    sched.step(&mut opt).unwrap();
    assert_eq!(opt.group_momenta(), Some(vec![0.3]));
}

#[test]
fn one_cycle_momentum_follows_pytorchs_phases_and_sets_beta1() {
    let mut rng = Lcg(11);
    for three_phase in [false, true] {
        for anneal in [OneCycleAnneal::Cos, OneCycleAnneal::Linear] {
            for (total, pct) in [(10u64, 0.3), (17, 0.25), (23, 0.4)] {
                let s = OneCycleLr {
                    three_phase,
                    anneal,
                    pct_start: pct,
                    ..OneCycleLr::new(0.1, total)
                };
                assert_eq!((s.base_momentum, s.max_momentum), (0.85, 0.95));
                let w = param(3, &mut rng);
                let mut opt = AdamW::new(vec![w], 0.1, (0.5, 0.999), 1e-8, 0.0).unwrap();
                let n = total as usize - 1;
                let seen = driven_momenta(&mut opt, s, n);
                let got: Vec<f64> = seen.iter().map(|m| m[0]).collect();
                let want: Vec<f64> = (0..=n as u64).map(|t| one_cycle_reference(&s, t)).collect();
                let name = format!("three_phase {three_phase} {anneal:?} {total} {pct}");
                close(&name, &got, &want, 1e-12);
                // beta1 is what changed; beta2 stays.
                let b = opt.group_options(0).unwrap().betas;
                assert_eq!(b.1, 0.999, "{name}");
                assert!((b.0 - want[n]).abs() < 1e-12, "{name}");
                // It really moves step to step.
                assert!(got.windows(2).any(|p| p[0] != p[1]), "{name}");
            }
        }
    }
    // Hand-computed: two phases over 10 steps, peak at step 2 (momentum 0.85), cosine.
    let s = OneCycleLr::new(1.0, 10);
    assert!((s.momentum_at(0).unwrap() - 0.95).abs() < 1e-15);
    assert!((s.momentum_at(1).unwrap() - 0.9).abs() < 1e-12);
    assert!((s.momentum_at(2).unwrap() - 0.85).abs() < 1e-12);
    assert!((s.momentum_at(9).unwrap() - 0.95).abs() < 1e-12);
}

#[test]
fn sgd_run_with_cycled_momentum_matches_a_reference_loop() {
    let mut rng = Lcg(3);
    // The last case cycles through momentum 0, where PyTorch's SGD skips the buffer (left
    // as it was for the next step with momentum).
    for (start_momentum, dampening, wd, low) in [
        (0.0, 0.0, 0.0, 0.3),
        (0.5, 0.1, 0.01, 0.3),
        (0.0, 0.0, 0.01, 0.0),
    ] {
        let n = 6;
        let w0: Vec<f64> = (0..n).map(|_| rng.next()).collect();
        let c: Vec<f64> = (0..n).map(|_| rng.next() + 1.5).collect();
        let w = Tensor::from_vec(w0.iter().map(|&v| v as f32).collect(), [n]).requires_grad_(true);
        w.realize().unwrap();
        let ct = Tensor::from_vec(c.iter().map(|&v| v as f32).collect(), [n]);
        let opts = SgdOptions {
            lr: 0.1,
            momentum: start_momentum,
            dampening,
            weight_decay: wd,
            ..Default::default()
        };
        let mut opt = Sgd::with_options(vec![w.clone()], opts).unwrap();
        let s = CyclicLr {
            base_momentum: low,
            max_momentum: 0.9,
            ..CyclicLr::new(0.02, 0.2, 2)
        };
        let mut sched = LrScheduler::new(&mut opt, s).unwrap();
        let mut seen = vec![];
        for _ in 0..5 {
            let m = opt.group_momenta().unwrap()[0];
            seen.push(m);
            opt.zero_grad();
            (&(&w * &w) * &ct).sum(..).backward().unwrap();
            opt.step().unwrap();
            sched.step(&mut opt).unwrap();
        }
        // The momentum changed each step (0.9, 0.6, 0.3, 0.6, 0.9).
        let mid = (0.9 + low) / 2.0;
        close("momenta", &seen, &[0.9, mid, low, mid, 0.9], 1e-12);

        // PyTorch's SGD in f64 with that momentum and rate sequence.
        let mut p = w0.clone();
        let mut buf: Option<Vec<f64>> = None;
        for t in 0..5u64 {
            let lr = s.lr_at(0.1, t);
            let mu = s.momentum_at(t).unwrap();
            let g: Vec<f64> = (0..n).map(|i| 2.0 * c[i] * p[i] + wd * p[i]).collect();
            if mu == 0.0 {
                for i in 0..n {
                    p[i] -= lr * g[i];
                }
                continue;
            }
            let b = match buf {
                None => g.clone(),
                Some(b) => (0..n)
                    .map(|i| mu * b[i] + (1.0 - dampening) * g[i])
                    .collect(),
            };
            for i in 0..n {
                p[i] -= lr * b[i];
            }
            buf = Some(b);
        }
        let got: Vec<f64> = w
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        close(
            &format!("sgd from momentum {start_momentum}"),
            &got,
            &p,
            1e-5,
        );
    }
}

#[test]
fn every_momentum_optimizer_is_cycled_and_adagrad_is_refused() {
    let mut rng = Lcg(5);
    // RmsProp without momentum gets a buffer; NAdam's beta1 moves.
    let mut rms =
        RmsProp::with_options(vec![param(2, &mut rng)], RmsPropOptions::default()).unwrap();
    let seen = driven_momenta(&mut rms, CyclicLr::new(0.01, 0.1, 2), 4);
    close(
        "rmsprop",
        &seen.concat(),
        &[0.9, 0.85, 0.8, 0.85, 0.9],
        1e-12,
    );
    assert_eq!(rms.group_options(0).unwrap().momentum, 0.9);
    let names: Vec<String> = rms
        .state_dict()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(
        names.iter().any(|n| n == "state.0.momentum_buffer"),
        "{names:?}"
    );
    let mut nadam = NAdam::new(vec![param(2, &mut rng)], 0.01).unwrap();
    let seen = driven_momenta(&mut nadam, OneCycleLr::new(0.1, 10), 3);
    assert!((seen[0][0] - 0.95).abs() < 1e-12 && (seen[2][0] - 0.85).abs() < 1e-12);

    // Adagrad has neither momentum nor betas: refused with cycle_momentum on.
    let w = param(2, &mut rng);
    let mut ada = Adagrad::new(vec![w.clone()], 0.1).unwrap();
    assert_eq!(ada.group_momenta(), None);
    let e = LrScheduler::new(&mut ada, CyclicLr::new(0.01, 0.1, 2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("momentum") && e.contains("LrScheduler"), "{e}");
    assert!(LrScheduler::new(&mut ada, OneCycleLr::new(0.1, 10)).is_err());
    assert_eq!(ada.lr(), 0.1, "a refused scheduler changes nothing");
    // With cycle_momentum off it works and cycles the rate.
    let s = CyclicLr {
        cycle_momentum: false,
        ..CyclicLr::new(0.01, 0.1, 2)
    };
    let mut sched = LrScheduler::new(&mut ada, s).unwrap();
    sched.step(&mut ada).unwrap();
    assert!((ada.lr() - 0.055).abs() < 1e-12);
    (&w * &w).sum(..).backward().unwrap();
    ada.step().unwrap();
    let s = OneCycleLr {
        cycle_momentum: false,
        ..OneCycleLr::new(0.1, 10)
    };
    assert!(LrScheduler::new(&mut ada, s).is_ok());

    // A momentum the optimizer refuses is an error naming it; nothing steps.
    let mut adam = AdamW::new(vec![param(2, &mut rng)], 0.1, (0.9, 0.999), 1e-8, 0.0).unwrap();
    let s = OneCycleLr {
        max_momentum: 1.0,
        ..OneCycleLr::new(0.1, 10)
    };
    let e = LrScheduler::new(&mut adam, s).unwrap_err().to_string();
    assert!(e.contains("beta1") && e.contains("AdamW"), "{e}");
    // Adam (AdamW's update with an L2 term) is named Adam in the same error.
    let mut plain = Adam::new(vec![param(2, &mut rng)], 0.1, (0.9, 0.999), 1e-8, 0.0).unwrap();
    let e = plain.set_group_momenta(&[1.0]).unwrap_err().to_string();
    assert!(
        e.contains("beta1") && e.contains("Adam") && !e.contains("AdamW"),
        "{e}"
    );
    assert_eq!(plain.group_momenta(), Some(vec![0.9]));
    let mut sgd = Sgd::new(vec![param(2, &mut rng)], 0.1).unwrap();
    let s = CyclicLr {
        base_momentum: -0.5,
        ..CyclicLr::new(0.01, 0.1, 1)
    };
    let mut sched = LrScheduler::new(&mut sgd, s).unwrap();
    let e = sched.step(&mut sgd).unwrap_err().to_string();
    assert!(e.contains("momentum"), "{e}");
    assert_eq!(sched.current_step(), 0);
    assert_eq!(sgd.group_momenta(), Some(vec![0.9]));
    let nan = CyclicLr {
        max_momentum: f64::NAN,
        ..CyclicLr::new(0.01, 0.1, 2)
    };
    assert!(LrScheduler::new(&mut sgd, nan).is_err());
}

#[test]
fn cycled_training_loop_replays_the_cached_plan() {
    let mut rng = Lcg(9);
    type Make = fn(Tensor) -> Box<dyn Optimizer>;
    let makers: Vec<(&str, Make)> = vec![
        ("Sgd", |w| Box::new(Sgd::new(vec![w], 0.01).unwrap())),
        ("AdamW", |w| {
            Box::new(AdamW::new(vec![w], 0.01, (0.9, 0.999), 1e-8, 0.01).unwrap())
        }),
    ];
    for (name, make) in makers {
        let w = param(4, &mut rng);
        let mut opt = make(w.clone());
        let mut sched = LrScheduler::new(opt.as_mut(), OneCycleLr::new(0.1, 40)).unwrap();
        let mut momenta = vec![];
        let mut train = |opt: &mut Box<dyn Optimizer>| {
            opt.zero_grad();
            (&w * &w).sum(..).backward().unwrap();
            let report = opt.step_report().unwrap();
            sched.step(opt.as_mut()).unwrap();
            momenta.push(opt.group_momenta().unwrap()[0]);
            report.cache_hit
        };
        for _ in 0..3 {
            train(&mut opt);
        }
        let before = kiln::cache_stats();
        let hits: Vec<bool> = (0..10).map(|_| train(&mut opt)).collect();
        let after = kiln::cache_stats();
        assert!(hits.iter().all(|&h| h), "{name}: {hits:?}");
        assert!(
            after.hits >= before.hits + 10,
            "{name}: {before:?} -> {after:?}"
        );
        // ... while the momentum changed every step.
        assert!(
            momenta.windows(2).all(|p| p[0] != p[1]),
            "{name}: {momenta:?}"
        );
    }
}

#[test]
fn state_dicts_round_trip_with_cycled_momentum() {
    let mut rng = Lcg(13);
    let w = param(3, &mut rng);
    // Made without momentum: cycling gives it a buffer at once, so a fresh optimizer and
    // scheduler built the same way accept its state.
    let mut opt = Sgd::new(vec![w.clone()], 0.1).unwrap();
    let s = CyclicLr::new(0.01, 0.1, 3);
    let mut sched = LrScheduler::new(&mut opt, s).unwrap();
    for _ in 0..4 {
        opt.zero_grad();
        (&w * &w).sum(..).backward().unwrap();
        opt.step().unwrap();
        sched.step(&mut opt).unwrap();
    }
    let opt_state = opt.state_dict().unwrap();
    let bytes = kiln::io::save_to_bytes(
        &opt_state
            .iter()
            .map(|(n, t)| (n.as_str(), t))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let sched_state = sched.state_dict().unwrap();

    let mut fresh = Sgd::new(vec![w.clone()], 0.5).unwrap();
    let mut again = LrScheduler::new(&mut fresh, s).unwrap();
    fresh
        .load_state_dict(&kiln::io::load_from_bytes(&bytes).unwrap())
        .unwrap();
    again.load_state_dict(&sched_state).unwrap();
    assert_eq!(again.current_step(), 4);
    assert_eq!(fresh.group_momenta(), opt.group_momenta());
    assert_eq!(fresh.lr(), opt.lr());
    // Both go on identically.
    again.step(&mut fresh).unwrap();
    sched.step(&mut opt).unwrap();
    assert_eq!(fresh.group_momenta(), opt.group_momenta());
    close(
        "momentum at 5",
        &fresh.group_momenta().unwrap(),
        &[cyclic_reference(&s, 5)],
        1e-12,
    );
}

#[test]
fn combinators_forward_the_running_schedules_momentum() {
    let mut rng = Lcg(17);
    let cyclic = CyclicLr::new(0.01, 0.1, 2);
    let seq = || {
        SequentialLr::new(
            vec![
                Box::new(ConstantLr {
                    factor: 0.5,
                    total_iters: 2,
                }),
                Box::new(cyclic),
            ],
            vec![2],
        )
    };
    let mut opt = Sgd::with_momentum(vec![param(2, &mut rng)], 0.1, 0.3, 0.0, false).unwrap();
    let seen = driven_momenta(&mut opt, seq(), 4);
    // The constant schedule leaves the momentum alone; then CyclicLr from its own step 0.
    close(
        "sequential",
        &seen.concat(),
        &[0.3, 0.3, 0.9, 0.85, 0.8],
        1e-12,
    );
    let chained = ChainedScheduler::new(vec![
        Box::new(cyclic),
        Box::new(ExponentialLr { gamma: 0.9 }),
    ]);
    let want: Vec<f64> = (0..4).map(|t| cyclic_reference(&cyclic, t)).collect();
    let got: Vec<f64> = (0..4).map(|t| chained.momentum_at(t).unwrap()).collect();
    close("chained", &got, &want, 1e-12);
    // Adagrad under a SequentialLr whose cycling part starts at step 2: refused there.
    let mut ada = Adagrad::new(vec![param(2, &mut rng)], 0.1).unwrap();
    let mut sched = LrScheduler::new(&mut ada, seq()).unwrap();
    sched.step(&mut ada).unwrap();
    let e = sched.step(&mut ada).unwrap_err().to_string();
    assert!(e.contains("momentum"), "{e}");
    assert_eq!(sched.current_step(), 1);
}
