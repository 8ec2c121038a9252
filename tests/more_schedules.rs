//! ConstantLr, PolynomialLr, CyclicLr, SequentialLr and ChainedScheduler driven through an
//! optimizer by `LrScheduler`, against step-by-step simulations written here (a cycle
//! walked up and down one increment at a time, schedules switched at their milestones)
//! and PyTorch's documented values; the arguments PyTorch refuses.

use kiln::Tensor;
use kiln::optim::{
    ChainedScheduler, ConstantLr, CyclicLr, CyclicMode, ExponentialLr, LrSchedule, LrScheduler,
    Optimizer, PolynomialLr, SequentialLr, Sgd, StepLr,
};

/// The rates an optimizer (initial rate `lr`) sees over `steps` steps of `schedule`.
fn driven<S: LrSchedule>(schedule: S, lr: f64, steps: usize) -> Vec<f64> {
    let w = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::new(vec![w], lr).unwrap();
    let mut sched = LrScheduler::new(&mut opt, schedule).unwrap();
    let mut seen = vec![];
    for _ in 0..steps {
        seen.push(opt.lr());
        sched.step(&mut opt).unwrap();
    }
    seen
}

fn close(name: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-12, "{name}[{i}]: {g} vs {w}");
    }
}

#[test]
fn constant_and_polynomial() {
    // PyTorch's documented examples.
    close(
        "ConstantLR",
        &driven(
            ConstantLr {
                factor: 0.5,
                total_iters: 4,
            },
            0.05,
            6,
        ),
        &[0.025, 0.025, 0.025, 0.025, 0.05, 0.05],
    );
    close(
        "PolynomialLR",
        &driven(
            PolynomialLr {
                total_iters: 4,
                power: 1.0,
            },
            0.001,
            6,
        ),
        &[0.001, 0.00075, 0.0005, 0.00025, 0.0, 0.0],
    );
    // Power 2 against PyTorch's recursive form: lr_t = lr_{t-1}·((1 - t/n) / (1 - (t-1)/n))^p.
    let (n, p) = (7u64, 2.0);
    let mut want = vec![0.3];
    for t in 1..10u64 {
        let prev = *want.last().unwrap();
        want.push(if t > n {
            prev
        } else {
            prev * ((1.0 - t as f64 / n as f64) / (1.0 - (t - 1) as f64 / n as f64)).powf(p)
        });
    }
    close(
        "PolynomialLR p=2",
        &driven(
            PolynomialLr {
                total_iters: n,
                power: p,
            },
            0.3,
            10,
        ),
        &want,
    );
    let w = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::new(vec![w], 0.1).unwrap();
    assert!(
        LrScheduler::new(
            &mut opt,
            ConstantLr {
                factor: 1.5,
                total_iters: 2
            }
        )
        .is_err()
    );
    assert!(
        LrScheduler::new(
            &mut opt,
            PolynomialLr {
                total_iters: 3,
                power: f64::NAN
            }
        )
        .is_err()
    );
}

/// A cycle walked one increment at a time: up `up` steps, down `down` steps, the height
/// scaled per cycle (triangular2) or per step (exp_range).
fn walked_cycle(base: f64, max: f64, up: u64, down: u64, mode: CyclicMode, steps: u64) -> Vec<f64> {
    let mut out = vec![];
    let mut frac = 0.0f64; // position on the ramp, 0 (base) to 1 (max)
    let mut rising = true;
    let mut left = up;
    let mut cycle = 1;
    for t in 0..steps {
        let amplitude = match mode {
            CyclicMode::Triangular => 1.0,
            CyclicMode::Triangular2 => 0.5f64.powi(cycle - 1),
            CyclicMode::ExpRange { gamma } => gamma.powi(t as i32),
        };
        out.push(base + (max - base) * frac * amplitude);
        if rising {
            frac += 1.0 / up as f64;
        } else {
            frac -= 1.0 / down as f64;
        }
        left -= 1;
        if left == 0 {
            if rising {
                rising = false;
                left = down;
                frac = 1.0;
            } else {
                rising = true;
                left = up;
                frac = 0.0;
                cycle += 1;
            }
        }
    }
    out
}

#[test]
fn cyclic_modes() {
    for mode in [
        CyclicMode::Triangular,
        CyclicMode::Triangular2,
        CyclicMode::ExpRange { gamma: 0.97 },
    ] {
        for (up, down) in [(3u64, None), (2, Some(5)), (4, Some(1))] {
            let s = CyclicLr {
                base_lr: 0.01,
                max_lr: 0.1,
                step_size_up: up,
                step_size_down: down,
                mode,
                ..CyclicLr::new(0.01, 0.1, up)
            };
            let want = walked_cycle(0.01, 0.1, up, down.unwrap_or(up), mode, 30);
            // The optimizer's own rate is replaced, as PyTorch's CyclicLR does.
            close(
                &format!("{mode:?} {up} {down:?}"),
                &driven(s, 5.0, 30),
                &want,
            );
        }
    }
    let w = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::new(vec![w], 0.1).unwrap();
    assert!(LrScheduler::new(&mut opt, CyclicLr::new(0.1, 1.0, 0)).is_err());
    let nan = CyclicLr {
        mode: CyclicMode::ExpRange { gamma: f64::NAN },
        ..CyclicLr::new(0.1, 1.0, 2)
    };
    assert!(LrScheduler::new(&mut opt, nan).is_err());
}

#[test]
fn sequential_and_chained() {
    // Constant for 2 steps, then exponential from its own step 0 (PyTorch restarts it),
    // then StepLR from step 5.
    let s = SequentialLr::new(
        vec![
            Box::new(ConstantLr {
                factor: 0.1,
                total_iters: 2,
            }),
            Box::new(ExponentialLr { gamma: 0.9 }),
            Box::new(StepLr {
                step_size: 2,
                gamma: 0.5,
            }),
        ],
        vec![2, 5],
    );
    let mut want = vec![];
    for t in 0..9u64 {
        want.push(if t < 2 {
            0.1
        } else if t < 5 {
            0.9f64.powi((t - 2) as i32)
        } else {
            0.5f64.powi(((t - 5) / 2) as i32)
        });
    }
    close("SequentialLR", &driven(s, 1.0, 9), &want);
    // Chained: the factors multiply.
    let c = ChainedScheduler::new(vec![
        Box::new(ConstantLr {
            factor: 0.1,
            total_iters: 2,
        }),
        Box::new(ExponentialLr { gamma: 0.9 }),
    ]);
    let want: Vec<f64> = (0..5)
        .map(|t| 2.0 * if t < 2 { 0.1 } else { 1.0 } * 0.9f64.powi(t))
        .collect();
    close("ChainedScheduler", &driven(c, 2.0, 5), &want);
    // Refused: milestones not one fewer than the schedules, decreasing milestones, and a
    // refused schedule inside.
    let w = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let mut opt = Sgd::new(vec![w], 0.1).unwrap();
    let two = || -> Vec<kiln::optim::BoxedSchedule> {
        vec![
            Box::new(ConstantLr::default()),
            Box::new(ConstantLr::default()),
        ]
    };
    assert!(LrScheduler::new(&mut opt, SequentialLr::new(two(), vec![])).is_err());
    let mut three = two();
    three.push(Box::new(ConstantLr::default()));
    assert!(LrScheduler::new(&mut opt, SequentialLr::new(three, vec![4, 2])).is_err());
    let bad: Vec<kiln::optim::BoxedSchedule> = vec![Box::new(PolynomialLr {
        total_iters: 2,
        power: f64::NAN,
    })];
    assert!(LrScheduler::new(&mut opt, ChainedScheduler::new(bad)).is_err());
    // total_iters = 0: PyTorch's stepping never decays (its recursive form returns the
    // group's rate while the step exceeds total_iters).
    let flat = PolynomialLr {
        total_iters: 0,
        power: 1.0,
    };
    assert!((0..5).all(|t| flat.lr_at(0.3, t) == 0.3));
}
