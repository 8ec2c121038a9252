//! Optimizers ([`Sgd`], [`Adam`], [`AdamW`], [`RmsProp`], [`Adagrad`], [`Adamax`],
//! [`NAdam`]), gradient clipping ([`clip_grad_norm`], [`clip_grad_value`]) and
//! learning-rate schedules ([`LrScheduler`] driving a [`LrSchedule`] such as [`StepLr`] or
//! [`OneCycleLr`] or [`CyclicLr`], the combinators [`SequentialLr`] and [`ChainedScheduler`],
//! [`ReduceLrOnPlateau`], and [`WarmupCosine`]).
//!
//! A step records every parameter's update as an in-place write (`copy_`) and realizes it:
//! the parameters and the optimizer state keep their buffers, and everything that still
//! reads the old parameters — the loss, the gradients, the rest of the forward and backward
//! pass — runs in the same plan, before the writes. The step's numbers (learning rate, bias
//! corrections) are run-time parameters, so a training loop replays one cached plan.
//!
//! ```
//! use kiln::optim::{AdamW, Optimizer};
//! use kiln::Tensor;
//! let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).requires_grad_(true);
//! w.realize().unwrap();
//! let mut opt = AdamW::new(vec![w.clone()], 0.1, (0.9, 0.999), 1e-8, 0.0).unwrap();
//! for _ in 0..100 {
//!     opt.zero_grad();
//!     (&w * &w).sum(..).backward().unwrap();
//!     opt.step().unwrap();
//! }
//! assert!(w.to_vec::<f32>().unwrap().iter().all(|v| v.abs() < 0.2));
//! ```

mod adagrad;
mod adamax;
mod adamw;
mod clip;
mod nadam;
mod rmsprop;
mod schedule;
mod schedule_more;
mod sgd;
mod state;

pub use adagrad::{Adagrad, AdagradOptions};
pub use adamax::{Adamax, AdamaxOptions};
pub use adamw::{Adam, AdamW, AdamWOptions};
pub use clip::{clip_grad_norm, clip_grad_norm_with, clip_grad_value};
pub use nadam::{NAdam, NAdamOptions};
pub use rmsprop::{RmsProp, RmsPropOptions};
pub use schedule::{
    CosineAnnealingLr, ExponentialLr, LambdaLr, LinearLr, LrSchedule, LrScheduler, MultiStepLr,
    OneCycleAnneal, OneCycleLr, PlateauMode, ReduceLrOnPlateau, ReduceLrOnPlateauOptions, StepLr,
    ThresholdMode, WarmupCosine,
};
pub use schedule_more::{
    BoxedSchedule, ChainedScheduler, ConstantLr, CyclicLr, CyclicMode, PolynomialLr, SequentialLr,
};
pub use sgd::{Sgd, SgdOptions};

use crate::error::Result;
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// Something that updates parameters from their gradients.
pub trait Optimizer {
    /// Applies one update to every parameter that has a gradient and realizes it, with
    /// what it needs (the forward and backward pass when they are still pending); reports
    /// what ran.
    fn step_report(&mut self) -> Result<RealizeReport>;

    /// Applies one update to every parameter that has a gradient, and realizes it.
    fn step(&mut self) -> Result<()> {
        self.step_report().map(|_| ())
    }

    /// The parameters it updates.
    fn params(&self) -> &[Tensor];

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Changes the learning rate (for schedules).
    fn set_lr(&mut self, lr: f64);

    /// Every parameter group's learning rate, in group order (one entry for an optimizer
    /// without groups). Schedulers ([`LrScheduler`], [`ReduceLrOnPlateau`]) read these as
    /// PyTorch's schedulers read each group's `lr`.
    fn group_lrs(&self) -> Vec<f64> {
        vec![self.lr()]
    }

    /// Sets group `i`'s learning rate to `lrs[i]`; groups past the end of `lrs` keep theirs.
    fn set_group_lrs(&mut self, lrs: &[f64]) {
        if let Some(&lr) = lrs.first() {
            self.set_lr(lr);
        }
    }

    /// Every parameter group's momentum-like hyperparameter, in group order: `beta1` for
    /// an optimizer with `betas` ([`AdamW`], [`Adam`], [`Adamax`], [`NAdam`]), `momentum`
    /// for one with a momentum ([`Sgd`], [`RmsProp`]); `None` for an optimizer with
    /// neither ([`Adagrad`]). Momentum-cycling schedules ([`CyclicLr`], [`OneCycleLr`])
    /// read and set these as PyTorch's set each group's `momentum` or `betas[0]`.
    fn group_momenta(&self) -> Option<Vec<f64>> {
        None
    }

    /// Sets group `i`'s momentum-like hyperparameter (see
    /// [`group_momenta`](Optimizer::group_momenta)) to `momenta[i]`; groups past the end of
    /// `momenta` keep theirs. Refuses a value the optimizer's constructor refuses (a
    /// negative or NaN momentum, a `beta1` outside `[0, 1)`), changing nothing. A group of
    /// [`Sgd`] or [`RmsProp`] made without momentum gets zeroed momentum buffers when its
    /// momentum is first set above 0 ([`Sgd`]'s buffer then starts at the next gradient,
    /// as PyTorch's lazily created one does). Does nothing for an optimizer without one.
    fn set_group_momenta(&mut self, momenta: &[f64]) -> Result<()> {
        let _ = momenta;
        Ok(())
    }

    /// How steps are realized (`RealizeOptions::unfused()` to compare against fusion).
    fn set_realize_options(&mut self, options: RealizeOptions);

    /// The optimizer's state as named tensors, PyTorch's `optimizer.state_dict()`
    /// flattened: `state.{i}.{slot}` for parameter `i`'s buffers and counters (`exp_avg`,
    /// `exp_avg_sq`, `momentum_buffer`, `step`, ...), `param_groups.{g}.{option}` for each
    /// group's options (`lr`, `betas.0`, `weight_decay`, `amsgrad` as 0 or 1, ...) and
    /// `steps`. Buffers keep their parameter's dtype; counters and options are 0-d f64.
    /// Save it with [`crate::io::save`] before the next step: a step overwrites the
    /// buffers these entries read, and reading one afterwards fails
    /// ([`crate::KilnError::Overwritten`]).
    ///
    /// ```
    /// use kiln::optim::{AdamW, Optimizer};
    /// use kiln::Tensor;
    /// let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).requires_grad_(true);
    /// w.realize().unwrap();
    /// let mut opt = AdamW::new(vec![w.clone()], 0.1, (0.9, 0.999), 1e-8, 0.0).unwrap();
    /// (&w * &w).sum(..).backward().unwrap();
    /// opt.step().unwrap();
    /// let state = opt.state_dict().unwrap();
    /// let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    /// assert!(names.contains(&"state.0.exp_avg_sq") && names.contains(&"param_groups.0.lr"));
    /// let bytes = kiln::io::save_to_bytes(
    ///     &state.iter().map(|(n, t)| (n.as_str(), t)).collect::<Vec<_>>(),
    /// )
    /// .unwrap();
    ///
    /// let mut fresh = AdamW::new(vec![w.clone()], 0.5, (0.9, 0.999), 1e-8, 0.0).unwrap();
    /// fresh.load_state_dict(&kiln::io::load_from_bytes(&bytes).unwrap()).unwrap();
    /// assert_eq!(fresh.lr(), 0.1); // options come back too, as in PyTorch
    /// ```
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>>;

    /// Restores the state [`state_dict`](Optimizer::state_dict) gave, for an optimizer over
    /// parameters of the same shapes and dtypes in the same groups (PyTorch's
    /// `optimizer.load_state_dict()`). Checks every name, shape and dtype first and reports
    /// every mismatch in one error; refuses a counter that is not a whole number of at
    /// least 0, a flag that is not 0 or 1 and a NaN option; only then overwrites the state
    /// buffers in place (moving values to their device) and sets the counters and options.
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()>;

    /// Clears the parameters' gradients.
    fn zero_grad(&self) {
        for p in self.params() {
            p.zero_grad();
        }
    }
}

/// Zeros shaped like `p`, realized (optimizer state).
fn zeros_like(p: &Tensor) -> Result<Tensor> {
    let z = Tensor::try_full_on(p.shape(), 0, p.dtype(), p.device())?;
    z.realize()?;
    Ok(z)
}

/// A realized zero state of `rows` stacked copies of `p`'s shape, `[rows, ..shape]`: the
/// optimizer state of one parameter whose rows update independently, so one kernel writes
/// them all.
fn stacked_zeros(p: &Tensor, rows: usize) -> Result<Tensor> {
    let mut shape = vec![rows];
    shape.extend_from_slice(p.shape());
    let z = Tensor::try_full_on(shape, 0, p.dtype(), p.device())?;
    z.realize()?;
    Ok(z)
}

/// Row `i` of a `[rows, ..]` state, as a view shaped like the parameter. A view recorded
/// after an in-place update of the state reads the updated value.
fn state_row(state: &Tensor, i: usize) -> Result<Tensor> {
    let shape: Vec<isize> = state.shape()[1..].iter().map(|&d| d as isize).collect();
    let i = i as isize;
    state.try_slice_dim(0, i, i + 1, 1)?.try_reshape(&shape)
}

/// For a `[2, ..]` state: a bool tensor shaped `[2, 1, ..]` that is true on row 1, to pick
/// each row's formula with `where`.
fn second_row(state: &Tensor) -> Result<Tensor> {
    let mut rows = vec![2isize];
    rows.extend(std::iter::repeat_n(1, state.ndim() - 1));
    Tensor::try_arange(0, 2, 1, crate::dtype::DType::I64)?
        .try_to(state.device())?
        .try_reshape(&rows)?
        .try_eq(1)
}

/// `g` read once per row of a `[rows, ..]` state (a broadcast view, no copy).
fn per_row(g: &Tensor, state: &Tensor) -> Result<Tensor> {
    g.try_unsqueeze(0)?.expand_view(state.shape())
}

/// A 0-d tensor holding `v` (a run-time parameter of the plan, never its structure) in the
/// state's dtype and device.
fn scalar_like(state: &Tensor, v: f64) -> Result<Tensor> {
    Tensor::try_full_on((), v, state.dtype(), state.device())
}

/// The flip and L2 term every optimizer applies to a gradient first: `g ← -g` when
/// maximizing, then `g ← g + wd·p` when `wd` is not 0.
fn adjusted_grad(p: &Tensor, mut g: Tensor, maximize: bool, wd: f64) -> Result<Tensor> {
    if maximize {
        g = g.try_neg()?;
    }
    if wd != 0.0 {
        g = g.try_add(&p.try_mul(wd)?)?;
    }
    Ok(g)
}

/// Realizes the parameters and state after a step's updates were recorded.
fn realize_step(groups: &[&[Tensor]], options: &RealizeOptions) -> Result<RealizeReport> {
    let all: Vec<&Tensor> = groups.iter().flat_map(|g| g.iter()).collect();
    crate::tensor::realize_all_with(&all, options)
}

/// Parameters that share an optimizer's options: one entry of PyTorch's list of parameter
/// groups.
#[derive(Clone, Debug)]
pub struct ParamGroup<O> {
    /// The group's parameters.
    pub params: Vec<Tensor>,
    /// Their options ([`SgdOptions`], [`AdamWOptions`]).
    pub options: O,
}

impl<O> ParamGroup<O> {
    /// A group of `params` with `options`.
    pub fn new(params: Vec<Tensor>, options: O) -> ParamGroup<O> {
        ParamGroup { params, options }
    }
}

/// Every group's parameters in order, each one's group index, and the groups' options.
/// Refuses non-float parameters and a parameter in two groups (or twice in one), as
/// PyTorch does.
fn flatten_groups<O>(
    op: &'static str,
    groups: Vec<ParamGroup<O>>,
) -> Result<(Vec<Tensor>, Vec<usize>, Vec<O>)> {
    let mut params = vec![];
    let mut group_of = vec![];
    let mut options = Vec::with_capacity(groups.len());
    let mut seen = std::collections::HashSet::new();
    for (i, g) in groups.into_iter().enumerate() {
        check_float_params(op, &g.params)?;
        for p in g.params {
            if !seen.insert(p.node_key()) {
                return Err(crate::error::KilnError::InvalidArgument {
                    op,
                    shape: p.shape().to_vec(),
                    reason: "a parameter appears more than once in the parameter groups".into(),
                });
            }
            params.push(p);
            group_of.push(i);
        }
        options.push(g.options);
    }
    Ok((params, group_of, options))
}

/// Refuses parameters that are not floating-point (`op` the optimizer).
fn check_float_params(op: &'static str, params: &[Tensor]) -> Result<()> {
    for p in params {
        if !p.dtype().is_float() {
            return Err(crate::error::KilnError::UnsupportedDType {
                op,
                dtype: p.dtype(),
                detail: ": parameters must be float".into(),
            });
        }
    }
    Ok(())
}

/// Refuses a hyperparameter outside its range as PyTorch's optimizers do (`op` the
/// optimizer, `what` the argument); NaN is outside every range.
pub(crate) fn check_hyper(
    op: &'static str,
    what: &str,
    value: f64,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> crate::error::Result<()> {
    if value.is_nan() || !ok(value) {
        return Err(crate::error::KilnError::InvalidArgument {
            op,
            shape: vec![],
            reason: format!("{what} {value} is not {range}"),
        });
    }
    Ok(())
}

/// The learning-rate methods of [`Optimizer`] (`lr`, `set_lr`, `group_lrs`,
/// `set_group_lrs`) for an optimizer whose `groups` field holds each parameter group's
/// options, each with an `lr`: the first group's rate, every group's, and per group.
macro_rules! group_lr_methods {
    () => {
        /// The first group's learning rate.
        fn lr(&self) -> f64 {
            self.groups.first().map_or(0.0, |g| g.lr)
        }

        /// Sets every group's learning rate.
        fn set_lr(&mut self, lr: f64) {
            for g in &mut self.groups {
                g.lr = lr;
            }
        }

        fn group_lrs(&self) -> Vec<f64> {
            self.groups.iter().map(|g| g.lr).collect()
        }

        fn set_group_lrs(&mut self, lrs: &[f64]) {
            for (g, &lr) in self.groups.iter_mut().zip(lrs) {
                g.lr = lr;
            }
        }
    };
}
pub(crate) use group_lr_methods;

/// The momentum methods of [`Optimizer`] (`group_momenta`, `set_group_momenta`) for an
/// optimizer whose `groups` field holds each group's options with `betas`: `beta1` is the
/// momentum, checked to lie in `[0, 1)`. The error names the optimizer: `$op`, or
/// `|s| name` computed from the optimizer `s` (AdamW also serves as Adam).
macro_rules! group_beta1_methods {
    ($op:literal) => {
        super::group_beta1_methods!(|_s| $op);
    };
    (|$s:ident| $op:expr) => {
        fn group_momenta(&self) -> Option<Vec<f64>> {
            Some(self.groups.iter().map(|g| g.betas.0).collect())
        }

        fn set_group_momenta(&mut self, momenta: &[f64]) -> crate::error::Result<()> {
            let op: &'static str = {
                let $s = &*self;
                $op
            };
            for &m in momenta.iter().take(self.groups.len()) {
                let unit = |v: f64| (0.0..1.0).contains(&v);
                super::check_hyper(op, "beta1", m, unit, "in [0, 1)")?;
            }
            for (g, &m) in self.groups.iter_mut().zip(momenta) {
                g.betas.0 = m;
            }
            Ok(())
        }
    };
}
pub(crate) use group_beta1_methods;

/// The momentum methods of [`Optimizer`] (`group_momenta`, `set_group_momenta`) for an
/// optimizer whose `groups` field holds each group's options with a `momentum`, and whose
/// `params`, `group_of` and `buffers` fields give each parameter, its group and its optional
/// momentum buffer (`$op` names the optimizer in errors).
macro_rules! group_momentum_methods {
    ($op:expr) => {
        fn group_momenta(&self) -> Option<Vec<f64>> {
            Some(self.groups.iter().map(|g| g.momentum).collect())
        }

        fn set_group_momenta(&mut self, momenta: &[f64]) -> crate::error::Result<()> {
            let mut slots: Vec<&mut f64> =
                self.groups.iter_mut().map(|g| &mut g.momentum).collect();
            super::set_momenta_with_buffers(
                $op,
                momenta,
                &mut slots,
                &self.params,
                &self.group_of,
                &mut self.buffers,
            )
        }
    };
}
pub(crate) use group_momentum_methods;

/// Sets each group's `momentum` to `momenta[g]` for an optimizer whose parameters keep an
/// optional momentum buffer each (`buffers[i]`, parameter `i` in group `group_of[i]`):
/// refuses a negative or NaN momentum first, then gives every parameter of a group whose
/// momentum becomes non-zero a zeroed buffer if it had none (`op` the optimizer).
fn set_momenta_with_buffers(
    op: &'static str,
    momenta: &[f64],
    group_momentum: &mut [&mut f64],
    params: &[Tensor],
    group_of: &[usize],
    buffers: &mut [Option<Tensor>],
) -> Result<()> {
    let nonneg = |v: f64| v >= 0.0;
    for &m in momenta.iter().take(group_momentum.len()) {
        check_hyper(op, "momentum", m, nonneg, "at least 0")?;
    }
    for (i, (p, &g)) in params.iter().zip(group_of).enumerate() {
        if momenta.get(g).is_some_and(|&m| m != 0.0) && buffers[i].is_none() {
            buffers[i] = Some(zeros_like(p)?);
        }
    }
    for (slot, &m) in group_momentum.iter_mut().zip(momenta) {
        **slot = m;
    }
    Ok(())
}
