//! Optimizer and scheduler state dicts: a run that saves its state after a few steps and
//! resumes in fresh objects continues bit for bit as the uninterrupted run does, for every
//! optimizer with the options that add state (AMSGrad, momentum, Nesterov, centered); the
//! state goes through a safetensors file's bytes; mismatched or invalid states are refused
//! before anything changes.

use kiln::optim::{
    Adagrad, AdagradOptions, Adam, AdamW, AdamWOptions, Adamax, AdamaxOptions, LrScheduler, NAdam,
    NAdamOptions, Optimizer, ParamGroup, PlateauMode, ReduceLrOnPlateau, ReduceLrOnPlateauOptions,
    RmsProp, RmsPropOptions, Sgd, SgdOptions, StepLr,
};
use kiln::{DType, Tensor};

/// The starting values of the two parameters, `[3, 4]` and `[5]`.
fn start() -> Vec<Vec<f32>> {
    vec![
        (0..12).map(|i| (i as f32 * 0.37).sin()).collect(),
        (0..5).map(|i| 1.0 - i as f32 * 0.45).collect(),
    ]
}

fn params_from(values: &[Vec<f32>]) -> Vec<Tensor> {
    let shapes: [&[usize]; 2] = [&[3, 4], &[5]];
    values
        .iter()
        .zip(shapes)
        .map(|(v, s)| {
            let t = Tensor::from_vec(v.clone(), s).requires_grad_(true);
            t.realize().unwrap();
            t
        })
        .collect()
}

fn values_of(params: &[Tensor]) -> Vec<Vec<f32>> {
    params.iter().map(|p| p.to_vec::<f32>().unwrap()).collect()
}

/// One step on a loss whose gradient depends on the parameters (so every state matters).
fn step(opt: &mut dyn Optimizer, params: &[Tensor], i: usize) {
    opt.zero_grad();
    let c = Tensor::from_vec(
        (0..12).map(|k| ((k + i) as f32 * 0.7).cos()).collect(),
        [3, 4],
    );
    let loss = (&params[0] * &params[0] * &c).sum(..) + (&params[1] - 0.25).pow(4.0).sum(..);
    loss.backward().unwrap();
    opt.step().unwrap();
}

fn to_bytes(state: &[(String, Tensor)]) -> Vec<u8> {
    let named: Vec<(&str, &Tensor)> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    kiln::io::save_to_bytes(&named).unwrap()
}

/// An optimizer over two parameter groups whose first group's rate is `lr`.
type Make = fn(Vec<Tensor>, f64) -> Box<dyn Optimizer>;

/// Runs 7 steps straight, and 3 steps + save + resume in a fresh optimizer (built with
/// another rate, which the state restores) + 4 steps; the parameters must agree exactly.
/// A fresh optimizer that skips the restore must not agree (the check has teeth).
fn resumes_exactly(name: &str, make: Make) {
    let a_params = params_from(&start());
    let mut a = make(a_params.clone(), 0.05);
    for i in 0..3 {
        step(a.as_mut(), &a_params, i);
    }
    let saved = to_bytes(&a.state_dict().unwrap());
    let mid = values_of(&a_params);
    for i in 3..7 {
        step(a.as_mut(), &a_params, i);
    }
    let straight = values_of(&a_params);

    let b_params = params_from(&mid);
    let mut b = make(b_params.clone(), 0.9);
    b.load_state_dict(&kiln::io::load_from_bytes(&saved).unwrap())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(b.group_lrs(), a.group_lrs(), "{name}: rates restored");
    for i in 3..7 {
        step(b.as_mut(), &b_params, i);
    }
    assert_eq!(
        values_of(&b_params),
        straight,
        "{name}: resumed run differs"
    );

    let c_params = params_from(&mid);
    let mut c = make(c_params.clone(), 0.05);
    for i in 3..7 {
        step(c.as_mut(), &c_params, i);
    }
    assert_ne!(
        values_of(&c_params),
        straight,
        "{name}: state made no difference"
    );
}

fn two_groups<O: Copy>(params: Vec<Tensor>, first: O, second: O) -> Vec<ParamGroup<O>> {
    vec![
        ParamGroup::new(vec![params[0].clone()], first),
        ParamGroup::new(vec![params[1].clone()], second),
    ]
}

#[test]
fn every_optimizer_resumes_exactly() {
    resumes_exactly("AdamW", |p, lr| {
        let o = AdamWOptions {
            lr,
            weight_decay: 0.1,
            ..Default::default()
        };
        let ams = AdamWOptions {
            amsgrad: true,
            lr: 0.02,
            ..o
        };
        Box::new(AdamW::with_groups(two_groups(p, o, ams)).unwrap())
    });
    resumes_exactly("Adam", |p, lr| {
        let o = AdamWOptions {
            lr,
            betas: (0.8, 0.95),
            ..Default::default()
        };
        Box::new(Adam::with_options(p, o).unwrap())
    });
    resumes_exactly("Sgd", |p, lr| {
        let o = SgdOptions {
            lr,
            momentum: 0.9,
            nesterov: true,
            ..Default::default()
        };
        let plain = SgdOptions {
            momentum: 0.0,
            nesterov: false,
            lr: 0.01,
            ..o
        };
        Box::new(Sgd::with_groups(two_groups(p, o, plain)).unwrap())
    });
    resumes_exactly("RmsProp", |p, lr| {
        let o = RmsPropOptions {
            lr,
            momentum: 0.5,
            centered: true,
            ..Default::default()
        };
        let plain = RmsPropOptions {
            momentum: 0.0,
            centered: false,
            lr: 0.01,
            ..o
        };
        Box::new(RmsProp::with_groups(two_groups(p, o, plain)).unwrap())
    });
    resumes_exactly("Adagrad", |p, lr| {
        let o = AdagradOptions {
            lr,
            lr_decay: 0.1,
            ..Default::default()
        };
        Box::new(Adagrad::with_options(p, o).unwrap())
    });
    resumes_exactly("Adamax", |p, lr| {
        let o = AdamaxOptions {
            lr,
            ..Default::default()
        };
        Box::new(Adamax::with_options(p, o).unwrap())
    });
    resumes_exactly("NAdam", |p, lr| {
        let o = NAdamOptions {
            lr,
            ..Default::default()
        };
        Box::new(NAdam::with_options(p, o).unwrap())
    });
}

#[test]
fn names_follow_pytorch_and_buffers_keep_their_dtype() {
    let p = params_from(&start());
    let o = AdamWOptions {
        amsgrad: true,
        ..Default::default()
    };
    let mut opt = AdamW::with_options(p.clone(), o).unwrap();
    step(&mut opt, &p, 0);
    let state = opt.state_dict().unwrap();
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "state.0.exp_avg",
        "state.0.exp_avg_sq",
        "state.0.max_exp_avg_sq",
        "state.1.exp_avg",
        "state.0.step",
        "state.1.step",
        "steps",
        "param_groups.0.lr",
        "param_groups.0.betas.0",
        "param_groups.0.betas.1",
        "param_groups.0.eps",
        "param_groups.0.weight_decay",
        "param_groups.0.amsgrad",
        "param_groups.0.maximize",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let get = |n: &str| &state.iter().find(|(m, _)| m == n).unwrap().1;
    assert_eq!(get("state.0.exp_avg").shape(), &[3, 4]);
    assert_eq!(get("state.0.exp_avg").dtype(), DType::F32);
    assert_eq!(get("state.1.step").to_vec::<f64>().unwrap(), vec![1.0]);
    assert_eq!(
        get("param_groups.0.amsgrad").to_vec::<f64>().unwrap(),
        vec![1.0]
    );
    // After one step from zero moments, exp_avg = (1 - β₁)·g and exp_avg_sq = (1 - β₂)·g².
    let m = get("state.1.exp_avg").to_vec::<f32>().unwrap();
    let v = get("state.1.exp_avg_sq").to_vec::<f32>().unwrap();
    for (m, v) in m.iter().zip(&v) {
        let g = m / 0.1;
        assert!(
            (v - 0.001 * g * g).abs() <= 1e-6 * (1.0 + v.abs()),
            "{m} {v}"
        );
    }
}

#[test]
fn mismatched_states_are_refused_with_every_problem() {
    let p = params_from(&start());
    let mut opt = AdamW::with_options(p.clone(), AdamWOptions::default()).unwrap();
    step(&mut opt, &p, 0);
    let mut state = opt.state_dict().unwrap();
    // Drop one entry, reshape another, add one.
    state.retain(|(n, _)| n != "state.1.exp_avg_sq");
    for (n, t) in &mut state {
        if n == "state.0.exp_avg" {
            *t = Tensor::zeros([4, 3]);
        }
    }
    state.push(("state.7.exp_avg".into(), Tensor::zeros([2])));
    let before = values_of(&p);
    let err = opt.load_state_dict(&state).unwrap_err().to_string();
    for want in [
        "3 problems",
        r#"missing in state: "state.1.exp_avg_sq""#,
        r#"shape mismatch for "state.0.exp_avg": state has [4, 3], expected has [3, 4]"#,
        r#"unexpected in state: "state.7.exp_avg""#,
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    // Structure differs (AMSGrad adds a buffer): refused by name.
    let ams = AdamWOptions {
        amsgrad: true,
        ..Default::default()
    };
    let mut other = AdamW::with_options(p.clone(), ams).unwrap();
    let err = other
        .load_state_dict(&opt.state_dict().unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_exp_avg_sq"), "{err}");
    assert_eq!(values_of(&p), before);
}

#[test]
fn invalid_counters_are_refused_before_anything_changes() {
    let p = params_from(&start());
    let mut opt = AdamW::with_options(p.clone(), AdamWOptions::default()).unwrap();
    step(&mut opt, &p, 0);
    let good = to_bytes(&opt.state_dict().unwrap());
    for (name, value, want) in [
        ("state.0.step", -1.0, "state.0.step is -1"),
        ("steps", 2.5, "steps is 2.5"),
        (
            "param_groups.0.amsgrad",
            0.5,
            "param_groups.0.amsgrad is 0.5",
        ),
        ("param_groups.0.lr", f64::NAN, "param_groups.0.lr is NaN"),
    ] {
        let mut state = kiln::io::load_from_bytes(&good).unwrap();
        for (n, t) in &mut state {
            if n == "state.0.exp_avg" {
                *t = Tensor::full([3, 4], 7.0);
            }
            if n == name {
                *t = Tensor::full_dtype((), value, DType::F64);
            }
        }
        let err = opt.load_state_dict(&state).unwrap_err().to_string();
        assert!(err.contains(want), "{want:?} not in {err}");
        let now = opt.state_dict().unwrap();
        let m = &now.iter().find(|(n, _)| n == "state.0.exp_avg").unwrap().1;
        assert!(
            m.to_vec::<f32>().unwrap().iter().all(|&v| v != 7.0),
            "{name}: written"
        );
        assert_eq!(opt.param_steps(0), Some(1));
    }
}

#[test]
fn schedulers_resume_where_they_stopped() {
    let p = params_from(&start());
    let mut opt = Sgd::new(p.clone(), 1.0).unwrap();
    let schedule = StepLr {
        step_size: 2,
        gamma: 0.5,
    };
    let mut s = LrScheduler::new(&mut opt, schedule).unwrap();
    for _ in 0..5 {
        s.step(&mut opt).unwrap();
    }
    let saved = kiln::io::load_from_bytes(&to_bytes(&s.state_dict().unwrap())).unwrap();
    let mut again = LrScheduler::new(&mut opt, schedule).unwrap();
    assert_eq!(again.base_lrs(), &[0.25]); // built from the decayed rate...
    again.load_state_dict(&saved).unwrap();
    assert_eq!((again.current_step(), again.base_lrs()), (5, &[1.0][..])); // ...restored
    assert_eq!(again.last_lr(), s.last_lr());
    s.step(&mut opt).unwrap();
    let want = opt.lr();
    again.step(&mut opt).unwrap();
    assert_eq!(opt.lr(), want);
    assert_eq!(opt.lr(), 0.125);
    // Another number of groups is refused by name.
    let two = Sgd::with_groups(two_groups(
        p.clone(),
        SgdOptions::default(),
        SgdOptions::default(),
    ));
    let mut two = two.unwrap();
    let mut other = LrScheduler::new(&mut two, schedule).unwrap();
    let err = other.load_state_dict(&saved).unwrap_err().to_string();
    assert!(err.contains("base_lrs.1"), "{err}");

    let options = ReduceLrOnPlateauOptions {
        mode: PlateauMode::Min,
        patience: 1,
        ..Default::default()
    };
    let mut plateau = ReduceLrOnPlateau::new(options).unwrap();
    for metric in [3.0, 2.0, 2.5] {
        plateau.step(&mut opt, metric);
    }
    let saved = plateau.state_dict().unwrap();
    let mut resumed = ReduceLrOnPlateau::new(options).unwrap();
    resumed.load_state_dict(&saved).unwrap();
    assert_eq!(resumed, plateau);
    assert_eq!(
        (resumed.best(), resumed.bad_steps(), resumed.steps()),
        (2.0, 1, 3)
    );
    let mut bad = saved.clone();
    bad[1].1 = Tensor::full_dtype((), -3.0, DType::F64);
    let err = resumed.load_state_dict(&bad).unwrap_err().to_string();
    assert!(err.contains("num_bad_epochs is -3"), "{err}");
}
