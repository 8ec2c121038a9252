//! Learning-rate schedules.
//!
//! One design serves every PyTorch scheduler with a closed form: a schedule is a plain value
//! implementing [`LrSchedule`] — the rate at 0-based step `t` for a group whose initial rate
//! is `base_lr` ([`StepLr`], [`MultiStepLr`], [`ExponentialLr`], [`CosineAnnealingLr`],
//! [`LinearLr`], [`LambdaLr`], [`OneCycleLr`], [`WarmupCosine`], and in `schedule_more.rs`
//! `ConstantLr`, `PolynomialLr`, `CyclicLr`, `SequentialLr`, `ChainedScheduler`) — and an [`LrScheduler`]
//! drives it as PyTorch's `torch.optim.lr_scheduler` objects do: created over an optimizer,
//! it records each group's rate as that group's base and sets step 0's rate; each
//! [`LrScheduler::step`] advances one step and sets every group's rate. [`ReduceLrOnPlateau`],
//! which has no closed form, is stepped with the metric instead.
//!
//! The rates are numbers the optimizer hands to its plan at run time, so changing them every
//! step never re-plans.
//!
//! ```
//! use kiln::optim::{LrScheduler, Optimizer, Sgd, StepLr};
//! use kiln::Tensor;
//! let w = Tensor::from_vec(vec![1.0f32], &[1]).requires_grad_(true);
//! let mut opt = Sgd::new(vec![w.clone()], 0.1).unwrap();
//! let mut sched = LrScheduler::new(&mut opt, StepLr { step_size: 2, gamma: 0.5 }).unwrap();
//! let mut seen = vec![];
//! for _epoch in 0..5 {
//!     seen.push(opt.lr());
//!     // ... opt.zero_grad(); loss.backward(); opt.step() ...
//!     sched.step(&mut opt).unwrap();
//! }
//! assert_eq!(seen, [0.1, 0.1, 0.05, 0.05, 0.025]);
//! ```

use super::Optimizer;
use crate::error::{KilnError, Result};
use std::f64::consts::PI;

/// A learning rate as a function of the step: the closed form of a PyTorch scheduler.
pub trait LrSchedule {
    /// The learning rate at 0-based step `step` of a parameter group whose initial rate is
    /// `base_lr`.
    fn lr_at(&self, base_lr: f64, step: u64) -> f64;

    /// Refuses arguments PyTorch refuses (checked when an [`LrScheduler`] is made).
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// The last step the schedule is defined for (stepping past it is an error, as with
    /// PyTorch's `OneCycleLR`); `None` when it goes on for ever.
    fn last_step(&self) -> Option<u64> {
        None
    }

    /// The momentum at `step` for a schedule that cycles it (PyTorch's
    /// `cycle_momentum=True`: [`OneCycleLr`], [`CyclicLr`](super::CyclicLr)); an
    /// [`LrScheduler`] sets it as every group's momentum (`beta1` for an optimizer with
    /// `betas`, see [`Optimizer::group_momenta`]). `None` (the default) leaves the momentum
    /// alone.
    fn momentum_at(&self, step: u64) -> Option<f64> {
        let _ = step;
        None
    }
}

/// A refused schedule argument.
pub(super) fn bad(op: &'static str, reason: String) -> KilnError {
    KilnError::InvalidArgument {
        op,
        shape: vec![],
        reason,
    }
}

/// The error for a momentum-cycling schedule over an optimizer without a momentum.
fn no_momentum(op: &'static str) -> KilnError {
    bad(
        op,
        "the schedule cycles the momentum (cycle_momentum is on) but the optimizer has \
         neither a momentum nor betas; turn cycle_momentum off"
            .into(),
    )
}

/// Refuses `value` unless `ok` (NaN is never ok).
pub(super) fn check(op: &'static str, what: &str, value: f64, ok: bool, range: &str) -> Result<()> {
    if value.is_nan() || !ok {
        return Err(bad(op, format!("{what} {value} is not {range}")));
    }
    Ok(())
}

/// Drives an [`LrSchedule`] over an optimizer's parameter groups, as PyTorch's
/// `LRScheduler` does: made after the optimizer, it takes each group's current rate as the
/// group's base and sets step 0's rate; call [`step`](LrScheduler::step) once per epoch
/// (or per batch, for [`OneCycleLr`]) after the optimizer's step.
#[derive(Debug)]
pub struct LrScheduler<S> {
    schedule: S,
    base_lrs: Vec<f64>,
    step: u64,
    last_lrs: Vec<f64>,
}

impl<S: LrSchedule> LrScheduler<S> {
    /// A scheduler over `opt`'s groups; sets their rates for step 0. Refuses a schedule
    /// with arguments PyTorch refuses.
    ///
    /// A schedule that cycles the momentum (see [`LrSchedule::momentum_at`]) also sets
    /// every group's momentum for step 0, and is refused over an optimizer with neither a
    /// momentum nor `betas` ([`Adagrad`](super::Adagrad)), as PyTorch raises `ValueError`
    /// (a [`SequentialLr`](super::SequentialLr) whose cycling schedule starts later is
    /// refused by the [`step`](LrScheduler::step) that reaches it).
    pub fn new<O: Optimizer + ?Sized>(opt: &mut O, schedule: S) -> Result<LrScheduler<S>> {
        schedule.check()?;
        if schedule.momentum_at(0).is_some() && opt.group_momenta().is_none() {
            return Err(no_momentum("LrScheduler::new"));
        }
        let base_lrs = opt.group_lrs();
        let mut s = LrScheduler {
            schedule,
            last_lrs: base_lrs.clone(),
            base_lrs,
            step: 0,
        };
        s.apply(opt)?;
        Ok(s)
    }

    /// Advances one step and sets every group's rate (and momentum, for a schedule that
    /// cycles it); past the schedule's last step (see [`LrSchedule::last_step`]) it is an
    /// error and nothing changes, as when the optimizer refuses the momentum.
    pub fn step<O: Optimizer + ?Sized>(&mut self, opt: &mut O) -> Result<()> {
        let next = self.step + 1;
        if let Some(last) = self.schedule.last_step()
            && next > last
        {
            return Err(bad(
                "LrScheduler::step",
                format!("stepped {next} times, past the schedule's {last} steps"),
            ));
        }
        let saved = self.step;
        self.step = next;
        if let Err(e) = self.apply(opt) {
            self.step = saved;
            return Err(e);
        }
        Ok(())
    }

    /// Sets the current step's momentum (when the schedule cycles it; first, since the
    /// optimizer may refuse it) and rates.
    fn apply<O: Optimizer + ?Sized>(&mut self, opt: &mut O) -> Result<()> {
        if let Some(m) = self.schedule.momentum_at(self.step) {
            let Some(groups) = opt.group_momenta() else {
                return Err(no_momentum("LrScheduler::step"));
            };
            opt.set_group_momenta(&vec![m; groups.len()])?;
        }
        self.last_lrs = self.lrs_at(self.step);
        opt.set_group_lrs(&self.last_lrs);
        Ok(())
    }

    /// The scheduler's position as named 0-d f64 tensors (PyTorch's
    /// `scheduler.state_dict()`): `last_epoch` (steps taken), `base_lrs.{g}` and
    /// `last_lrs.{g}`. The schedule itself is not saved: restore into a scheduler built with
    /// the same schedule.
    pub fn state_dict(&self) -> Result<Vec<(String, crate::tensor::Tensor)>> {
        super::state::scalar_tensors(self.scalars())
    }

    /// Restores what [`state_dict`](LrScheduler::state_dict) gave, for the same number of
    /// groups; every name, shape and dtype is checked first (all mismatches in one error),
    /// then the step count. Does not touch the optimizer's rates: restore those with
    /// [`Optimizer::load_state_dict`].
    ///
    /// ```
    /// use kiln::optim::{LrScheduler, Optimizer, Sgd, StepLr};
    /// let w = kiln::Tensor::from_vec(vec![1.0f32], &[1]).requires_grad_(true);
    /// let mut opt = Sgd::new(vec![w], 1.0).unwrap();
    /// let mut s = LrScheduler::new(&mut opt, StepLr { step_size: 2, gamma: 0.5 }).unwrap();
    /// for _ in 0..3 {
    ///     s.step(&mut opt).unwrap();
    /// }
    /// let saved = s.state_dict().unwrap();
    /// let mut again = LrScheduler::new(&mut opt, StepLr { step_size: 2, gamma: 0.5 }).unwrap();
    /// again.load_state_dict(&saved).unwrap();
    /// assert_eq!((again.current_step(), again.base_lrs()), (3, &[1.0][..]));
    /// ```
    pub fn load_state_dict(&mut self, state: &[(String, crate::tensor::Tensor)]) -> Result<()> {
        let values =
            super::state::load_scalars("LrScheduler::load_state_dict", self.scalars(), state)?;
        for (name, v) in values {
            let index = |prefix: &str| {
                name.strip_prefix(prefix)
                    .and_then(|g| g.parse::<usize>().ok())
            };
            if name == "last_epoch" {
                self.step = v as u64;
            } else if let Some(g) = index("base_lrs.") {
                self.base_lrs[g] = v;
            } else if let Some(g) = index("last_lrs.") {
                self.last_lrs[g] = v;
            }
        }
        Ok(())
    }

    fn scalars(&self) -> Vec<super::state::StateScalar> {
        use super::state::ScalarKind::{Count, Real};
        let mut out = vec![("last_epoch".to_string(), self.step as f64, Count)];
        for (g, &b) in self.base_lrs.iter().enumerate() {
            out.push((format!("base_lrs.{g}"), b, Real));
        }
        for (g, &l) in self.last_lrs.iter().enumerate() {
            out.push((format!("last_lrs.{g}"), l, Real));
        }
        out
    }

    /// Every group's rate at `step` (without changing anything).
    pub fn lrs_at(&self, step: u64) -> Vec<f64> {
        let s = &self.schedule;
        self.base_lrs.iter().map(|&b| s.lr_at(b, step)).collect()
    }

    /// The rates set last (PyTorch's `get_last_lr()`).
    pub fn last_lr(&self) -> &[f64] {
        &self.last_lrs
    }

    /// The current step (PyTorch's `last_epoch`): 0 before the first [`step`](Self::step).
    pub fn current_step(&self) -> u64 {
        self.step
    }

    /// Each group's base rate.
    pub fn base_lrs(&self) -> &[f64] {
        &self.base_lrs
    }

    /// The schedule.
    pub fn schedule(&self) -> &S {
        &self.schedule
    }
}

/// PyTorch's `StepLR`: `base · γ^⌊t / step_size⌋`.
///
/// ```
/// use kiln::optim::{LrSchedule, StepLr};
/// let s = StepLr { step_size: 3, gamma: 0.1 };
/// assert_eq!(s.lr_at(1.0, 2), 1.0);
/// assert!((s.lr_at(1.0, 3) - 0.1).abs() < 1e-15);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLr {
    /// Steps between decays (at least 1).
    pub step_size: u64,
    /// The factor of each decay.
    pub gamma: f64,
}

impl LrSchedule for StepLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        base_lr * powu(self.gamma, step / self.step_size.max(1))
    }

    fn check(&self) -> Result<()> {
        if self.step_size == 0 {
            return Err(bad("StepLr", "step_size must be at least 1".into()));
        }
        check("StepLr", "gamma", self.gamma, true, "a number")
    }
}

/// `x^n` for a step count (past `i32::MAX` through `powf`, whose integral exponents keep
/// the parity of a negative `x`; clamping the count would stop the growth or decay).
fn powu(x: f64, n: u64) -> f64 {
    match i32::try_from(n) {
        Ok(n) => x.powi(n),
        Err(_) => x.powf(n as f64),
    }
}

/// PyTorch's `MultiStepLR`: `base · γ^k`, `k` the number of milestones at or before `t`
/// (a milestone listed twice counts twice, as in PyTorch).
///
/// ```
/// use kiln::optim::{LrSchedule, MultiStepLr};
/// let s = MultiStepLr { milestones: vec![2, 5], gamma: 0.5 };
/// let lrs: Vec<f64> = (0..7).map(|t| s.lr_at(1.0, t)).collect();
/// assert_eq!(lrs, [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MultiStepLr {
    /// The steps at which the rate decays.
    pub milestones: Vec<u64>,
    /// The factor of each decay.
    pub gamma: f64,
}

impl LrSchedule for MultiStepLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let passed = self.milestones.iter().filter(|&&m| m <= step).count();
        base_lr * powu(self.gamma, passed as u64)
    }

    fn check(&self) -> Result<()> {
        check("MultiStepLr", "gamma", self.gamma, true, "a number")
    }
}

/// PyTorch's `ExponentialLR`: `base · γ^t`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialLr {
    /// The factor of each step.
    pub gamma: f64,
}

impl LrSchedule for ExponentialLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        base_lr * powu(self.gamma, step)
    }

    fn check(&self) -> Result<()> {
        check("ExponentialLr", "gamma", self.gamma, true, "a number")
    }
}

/// PyTorch's `CosineAnnealingLR` in its closed form:
/// `η_min + (base - η_min)·(1 + cos(π·t / T_max)) / 2` (past `T_max` the cosine rises
/// again, as PyTorch's does).
///
/// ```
/// use kiln::optim::{CosineAnnealingLr, LrSchedule};
/// let s = CosineAnnealingLr { t_max: 10, eta_min: 0.0 };
/// assert!((s.lr_at(1.0, 5) - 0.5).abs() < 1e-12);
/// assert!(s.lr_at(1.0, 10).abs() < 1e-12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CosineAnnealingLr {
    /// Steps from the base rate down to `eta_min` (at least 1).
    pub t_max: u64,
    /// The lowest rate.
    pub eta_min: f64,
}

impl LrSchedule for CosineAnnealingLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let phase = PI * step as f64 / self.t_max.max(1) as f64;
        self.eta_min + (base_lr - self.eta_min) * (1.0 + phase.cos()) / 2.0
    }

    fn check(&self) -> Result<()> {
        if self.t_max == 0 {
            return Err(bad("CosineAnnealingLr", "t_max must be at least 1".into()));
        }
        check(
            "CosineAnnealingLr",
            "eta_min",
            self.eta_min,
            true,
            "a number",
        )
    }
}

/// PyTorch's `LinearLR`: the factor moves linearly from `start_factor` to `end_factor`
/// over `total_iters` steps, then stays: `base · (s + (e - s)·min(t, n) / n)`. The default
/// is PyTorch's (`1/3`, `1`, `5`).
///
/// ```
/// use kiln::optim::{LinearLr, LrSchedule};
/// let s = LinearLr { start_factor: 0.5, end_factor: 1.0, total_iters: 4 };
/// let lrs: Vec<f64> = (0..6).map(|t| s.lr_at(1.0, t)).collect();
/// assert_eq!(lrs, [0.5, 0.625, 0.75, 0.875, 1.0, 1.0]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearLr {
    /// The factor at step 0, in `(0, 1]`.
    pub start_factor: f64,
    /// The factor from step `total_iters` on, in `[0, 1]`.
    pub end_factor: f64,
    /// Steps of the ramp (0: `end_factor` at once).
    pub total_iters: u64,
}

impl Default for LinearLr {
    fn default() -> Self {
        LinearLr {
            start_factor: 1.0 / 3.0,
            end_factor: 1.0,
            total_iters: 5,
        }
    }
}

impl LrSchedule for LinearLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        if self.total_iters == 0 {
            return base_lr * self.end_factor;
        }
        let done = step.min(self.total_iters) as f64 / self.total_iters as f64;
        base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)
    }

    fn check(&self) -> Result<()> {
        let (s, e) = (self.start_factor, self.end_factor);
        check(
            "LinearLr",
            "start_factor",
            s,
            s > 0.0 && s <= 1.0,
            "in (0, 1]",
        )?;
        check(
            "LinearLr",
            "end_factor",
            e,
            (0.0..=1.0).contains(&e),
            "in [0, 1]",
        )
    }
}

/// PyTorch's `LambdaLR`: `base · f(t)` for a function `f` of the step.
///
/// ```
/// use kiln::optim::{LambdaLr, LrSchedule};
/// let s = LambdaLr::new(|t| 0.9f64.powi(t as i32));
/// assert!((s.lr_at(2.0, 2) - 2.0 * 0.81).abs() < 1e-12);
/// ```
pub struct LambdaLr(Box<dyn Fn(u64) -> f64 + Send + Sync>);

impl LambdaLr {
    /// The schedule `base · f(step)`.
    pub fn new(f: impl Fn(u64) -> f64 + Send + Sync + 'static) -> LambdaLr {
        LambdaLr(Box::new(f))
    }
}

impl std::fmt::Debug for LambdaLr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LambdaLr(..)")
    }
}

impl LrSchedule for LambdaLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        base_lr * (self.0)(step)
    }
}

/// How [`OneCycleLr`] moves between its phases' end points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OneCycleAnneal {
    /// Half a cosine (PyTorch's `anneal_strategy='cos'`, the default).
    #[default]
    Cos,
    /// A straight line (`'linear'`).
    Linear,
}

/// PyTorch's `OneCycleLR`: from `max_lr / div_factor` up to `max_lr` over the first
/// `pct_start` of `total_steps`, then down to `max_lr / div_factor / final_div_factor` at
/// step `total_steps - 1` (with `three_phase`, back down to the start rate by twice the
/// warm-up, then down to the floor). Phase `k` ends at PyTorch's float step
/// (`pct_start·total - 1`, `2·pct_start·total - 2`, `total - 1`). The optimizer's own rate
/// is ignored (every group follows `max_lr`).
///
/// With `cycle_momentum` (the default, as PyTorch's) the momentum moves inversely to the
/// rate over the same phases and with the same annealing: from `max_momentum` down to
/// `base_momentum` while the rate rises, then back up to `max_momentum` (three phases: up
/// again over the second phase, then flat at `max_momentum`). An [`LrScheduler`] sets it
/// as every group's `momentum` or `beta1` (see [`Optimizer::group_momenta`]) and refuses
/// an optimizer with neither.
///
/// ```
/// use kiln::optim::{LrSchedule, OneCycleLr};
/// let s = OneCycleLr::new(1.0, 10);
/// assert!((s.lr_at(0.0, 0) - 0.04).abs() < 1e-12);  // max_lr / 25
/// assert!((s.lr_at(0.0, 2) - 1.0).abs() < 1e-12);   // the peak, at 0.3·10 - 1
/// assert!((s.lr_at(0.0, 9) - 4e-6).abs() < 1e-15); // max_lr / 25 / 1e4
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OneCycleLr {
    /// The peak rate.
    pub max_lr: f64,
    /// Steps in the cycle; stepping a scheduler past it is an error.
    pub total_steps: u64,
    /// The share of the cycle spent rising, in `[0, 1]`.
    pub pct_start: f64,
    /// Cosine or linear annealing.
    pub anneal: OneCycleAnneal,
    /// The start rate is `max_lr / div_factor`.
    pub div_factor: f64,
    /// The final rate is the start rate over `final_div_factor`.
    pub final_div_factor: f64,
    /// Three phases (up, back down to the start rate, down to the floor) instead of two.
    pub three_phase: bool,
    /// Whether the momentum is cycled inversely to the rate (PyTorch's default: on).
    pub cycle_momentum: bool,
    /// The momentum at the rate's peak (PyTorch's default 0.85).
    pub base_momentum: f64,
    /// The momentum at the rate's ends (PyTorch's default 0.95).
    pub max_momentum: f64,
}

impl OneCycleLr {
    /// The schedule peaking at `max_lr` over `total_steps`, with PyTorch's defaults
    /// (`pct_start = 0.3`, cosine, `div_factor = 25`, `final_div_factor = 1e4`, two
    /// phases, momentum cycled between 0.85 and 0.95).
    pub fn new(max_lr: f64, total_steps: u64) -> OneCycleLr {
        OneCycleLr {
            max_lr,
            total_steps,
            pct_start: 0.3,
            anneal: OneCycleAnneal::Cos,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
            cycle_momentum: true,
            base_momentum: 0.85,
            max_momentum: 0.95,
        }
    }

    /// Each phase's end step and its start and end momenta (the rate's mirror image).
    fn momentum_phases(&self) -> Vec<(f64, f64, f64)> {
        let (lo, hi) = (self.base_momentum, self.max_momentum);
        let total = self.total_steps as f64;
        let rise = self.pct_start * total - 1.0;
        if self.three_phase {
            vec![
                (rise, hi, lo),
                (2.0 * self.pct_start * total - 2.0, lo, hi),
                (total - 1.0, hi, hi),
            ]
        } else {
            vec![(rise, hi, lo), (total - 1.0, lo, hi)]
        }
    }

    /// The value at `step` of a piecewise schedule through `phases` (each phase's end step,
    /// start and end value), annealed per `self.anneal`.
    fn walk(&self, phases: &[(f64, f64, f64)], step: u64) -> f64 {
        let t = step as f64;
        let mut start = 0.0;
        for (i, &(end, from, to)) in phases.iter().enumerate() {
            if t <= end || i + 1 == phases.len() {
                // A phase without steps (`pct_start · total_steps = 1`, or `pct_start = 1`
                // at the last step), where PyTorch divides by zero, gives its end value.
                let pct = if end == start {
                    1.0
                } else {
                    (t - start) / (end - start)
                };
                return match self.anneal {
                    OneCycleAnneal::Cos => to + (from - to) / 2.0 * ((PI * pct).cos() + 1.0),
                    OneCycleAnneal::Linear => (to - from) * pct + from,
                };
            }
            start = end;
        }
        f64::NAN
    }

    /// Each phase's end step and its start and end rates.
    fn phases(&self) -> Vec<(f64, f64, f64)> {
        let initial = self.max_lr / self.div_factor;
        let min = initial / self.final_div_factor;
        let total = self.total_steps as f64;
        let rise = self.pct_start * total - 1.0;
        if self.three_phase {
            vec![
                (rise, initial, self.max_lr),
                (2.0 * self.pct_start * total - 2.0, self.max_lr, initial),
                (total - 1.0, initial, min),
            ]
        } else {
            vec![
                (rise, initial, self.max_lr),
                (total - 1.0, self.max_lr, min),
            ]
        }
    }
}

impl LrSchedule for OneCycleLr {
    /// The rate at `step` (`base_lr` is ignored: the cycle is set by `max_lr`).
    fn lr_at(&self, _base_lr: f64, step: u64) -> f64 {
        self.walk(&self.phases(), step)
    }

    /// The momentum at `step` when `cycle_momentum` is on.
    fn momentum_at(&self, step: u64) -> Option<f64> {
        self.cycle_momentum
            .then(|| self.walk(&self.momentum_phases(), step))
    }

    fn check(&self) -> Result<()> {
        const OP: &str = "OneCycleLr";
        if self.total_steps == 0 {
            return Err(bad(OP, "total_steps must be at least 1".into()));
        }
        let p = self.pct_start;
        check(OP, "pct_start", p, (0.0..=1.0).contains(&p), "in [0, 1]")?;
        check(OP, "max_lr", self.max_lr, self.max_lr >= 0.0, "at least 0")?;
        let d = self.div_factor;
        check(OP, "div_factor", d, d > 0.0, "above 0")?;
        let f = self.final_div_factor;
        check(OP, "final_div_factor", f, f > 0.0, "above 0")?;
        if self.cycle_momentum {
            check(OP, "base_momentum", self.base_momentum, true, "a number")?;
            check(OP, "max_momentum", self.max_momentum, true, "a number")?;
        }
        Ok(())
    }

    fn last_step(&self) -> Option<u64> {
        Some(self.total_steps)
    }
}

/// Whether [`ReduceLrOnPlateau`]'s metric should fall or rise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlateauMode {
    /// Lower is better (a loss; PyTorch's `mode='min'`, the default).
    #[default]
    Min,
    /// Higher is better (an accuracy).
    Max,
}

/// How [`ReduceLrOnPlateau`]'s `threshold` measures a significant improvement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThresholdMode {
    /// Relative: better than `best·(1 ∓ threshold)` (the default).
    #[default]
    Rel,
    /// Absolute: better than `best ∓ threshold`.
    Abs,
}

/// The arguments of PyTorch's `ReduceLROnPlateau`, with its defaults (min mode, factor
/// 0.1, patience 10, relative threshold 1e-4, no cooldown, min_lr 0, eps 1e-8).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReduceLrOnPlateauOptions {
    /// Whether the metric should fall or rise.
    pub mode: PlateauMode,
    /// The factor a reduction multiplies the rate by, in `[0, 1)`.
    pub factor: f64,
    /// Steps without improvement tolerated; the next one reduces.
    pub patience: u64,
    /// How much better than the best a metric must be to count as an improvement.
    pub threshold: f64,
    /// Relative or absolute threshold.
    pub threshold_mode: ThresholdMode,
    /// Steps after a reduction during which bad steps are not counted.
    pub cooldown: u64,
    /// No group's rate goes below this.
    pub min_lr: f64,
    /// A reduction smaller than this is skipped.
    pub eps: f64,
}

impl Default for ReduceLrOnPlateauOptions {
    fn default() -> Self {
        ReduceLrOnPlateauOptions {
            mode: PlateauMode::Min,
            factor: 0.1,
            patience: 10,
            threshold: 1e-4,
            threshold_mode: ThresholdMode::Rel,
            cooldown: 0,
            min_lr: 0.0,
            eps: 1e-8,
        }
    }
}

/// PyTorch's `ReduceLROnPlateau`: stepped with a metric each epoch; when it has not
/// improved on the best so far (by `threshold`) for more than `patience` steps, every
/// group's rate becomes `max(lr·factor, min_lr)` (unless that changes it by less than
/// `eps`), and the next `cooldown` steps count no bad steps.
///
/// ```
/// use kiln::optim::{Optimizer, ReduceLrOnPlateau, ReduceLrOnPlateauOptions, Sgd};
/// let w = kiln::Tensor::from_vec(vec![1.0f32], &[1]).requires_grad_(true);
/// let mut opt = Sgd::new(vec![w], 1.0).unwrap();
/// let opts = ReduceLrOnPlateauOptions { patience: 1, factor: 0.5, ..Default::default() };
/// let mut plateau = ReduceLrOnPlateau::new(opts).unwrap();
/// for loss in [3.0, 2.0, 2.0, 2.0] {
///     plateau.step(&mut opt, loss);
/// }
/// assert_eq!(opt.lr(), 0.5); // the second step without improvement reduced it
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ReduceLrOnPlateau {
    options: ReduceLrOnPlateauOptions,
    best: f64,
    bad_steps: u64,
    cooldown_left: u64,
    steps: u64,
}

impl ReduceLrOnPlateau {
    /// A scheduler with `options`; refuses a factor outside `[0, 1)` and a negative
    /// threshold, min_lr or eps.
    pub fn new(options: ReduceLrOnPlateauOptions) -> Result<ReduceLrOnPlateau> {
        const OP: &str = "ReduceLrOnPlateau";
        let o = options;
        check(
            OP,
            "factor",
            o.factor,
            (0.0..1.0).contains(&o.factor),
            "in [0, 1)",
        )?;
        check(
            OP,
            "threshold",
            o.threshold,
            o.threshold >= 0.0,
            "at least 0",
        )?;
        check(OP, "min_lr", o.min_lr, o.min_lr >= 0.0, "at least 0")?;
        check(OP, "eps", o.eps, o.eps >= 0.0, "at least 0")?;
        Ok(ReduceLrOnPlateau {
            options,
            best: match o.mode {
                PlateauMode::Min => f64::INFINITY,
                PlateauMode::Max => f64::NEG_INFINITY,
            },
            bad_steps: 0,
            cooldown_left: 0,
            steps: 0,
        })
    }

    /// Whether `metric` improves on the best so far by more than the threshold (NaN never
    /// does).
    fn is_better(&self, metric: f64) -> bool {
        let (best, th) = (self.best, self.options.threshold);
        match (self.options.mode, self.options.threshold_mode) {
            (PlateauMode::Min, ThresholdMode::Rel) => metric < best * (1.0 - th),
            (PlateauMode::Min, ThresholdMode::Abs) => metric < best - th,
            (PlateauMode::Max, ThresholdMode::Rel) => metric > best * (1.0 + th),
            (PlateauMode::Max, ThresholdMode::Abs) => metric > best + th,
        }
    }

    /// Records one step's `metric` and reduces every group's rate of `opt` when the
    /// plateau has lasted more than `patience` steps; returns whether it reduced.
    pub fn step<O: Optimizer + ?Sized>(&mut self, opt: &mut O, metric: f64) -> bool {
        self.steps += 1;
        if self.is_better(metric) {
            self.best = metric;
            self.bad_steps = 0;
        } else {
            self.bad_steps += 1;
        }
        if self.cooldown_left > 0 {
            self.cooldown_left -= 1;
            self.bad_steps = 0;
        }
        if self.bad_steps <= self.options.patience {
            return false;
        }
        let o = self.options;
        let lrs: Vec<f64> = opt
            .group_lrs()
            .into_iter()
            .map(|old| {
                let new = (old * o.factor).max(o.min_lr);
                if old - new > o.eps { new } else { old }
            })
            .collect();
        opt.set_group_lrs(&lrs);
        self.cooldown_left = o.cooldown;
        self.bad_steps = 0;
        true
    }

    /// The scheduler's progress as named 0-d f64 tensors, with PyTorch's names: `best`,
    /// `num_bad_epochs`, `cooldown_counter` and `last_epoch` (steps taken). The options
    /// are not saved: restore into a scheduler built with the same options.
    pub fn state_dict(&self) -> Result<Vec<(String, crate::tensor::Tensor)>> {
        super::state::scalar_tensors(self.scalars())
    }

    /// Restores what [`state_dict`](ReduceLrOnPlateau::state_dict) gave; every name, shape
    /// and dtype is checked first (all mismatches in one error), then the counts.
    pub fn load_state_dict(&mut self, state: &[(String, crate::tensor::Tensor)]) -> Result<()> {
        let values = super::state::load_scalars(
            "ReduceLrOnPlateau::load_state_dict",
            self.scalars(),
            state,
        )?;
        for (name, v) in values {
            match name.as_str() {
                "best" => self.best = v,
                "num_bad_epochs" => self.bad_steps = v as u64,
                "cooldown_counter" => self.cooldown_left = v as u64,
                _ => self.steps = v as u64,
            }
        }
        Ok(())
    }

    fn scalars(&self) -> Vec<super::state::StateScalar> {
        use super::state::ScalarKind::{Count, Real};
        vec![
            ("best".into(), self.best, Real),
            ("num_bad_epochs".into(), self.bad_steps as f64, Count),
            ("cooldown_counter".into(), self.cooldown_left as f64, Count),
            ("last_epoch".into(), self.steps as f64, Count),
        ]
    }

    /// The best metric so far.
    pub fn best(&self) -> f64 {
        self.best
    }

    /// Bad steps counted since the last improvement, reduction or cooldown.
    pub fn bad_steps(&self) -> u64 {
        self.bad_steps
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The options.
    pub fn options(&self) -> &ReduceLrOnPlateauOptions {
        &self.options
    }
}

/// Linear warmup to `base` over `warmup` steps (0-based step `s < warmup` gets
/// `base · (s + 1) / warmup`, so the first step already moves), then cosine decay to
/// `base · min_ratio` at step `total` (and constant after).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosine {
    /// The peak learning rate, reached at the end of the warmup.
    pub base: f64,
    /// Number of warmup steps.
    pub warmup: u64,
    /// The step at which the decay reaches its floor.
    pub total: u64,
    /// The floor as a fraction of `base`.
    pub min_ratio: f64,
}

impl WarmupCosine {
    /// The learning rate for 0-based `step`.
    ///
    /// ```
    /// let s = kiln::optim::WarmupCosine { base: 1.0, warmup: 10, total: 110, min_ratio: 0.1 };
    /// assert!((s.lr(4) - 0.5).abs() < 1e-12);      // warming up: (4 + 1) / 10
    /// assert!((s.lr(10) - 1.0).abs() < 1e-12);     // peak
    /// assert!((s.lr(110) - 0.1).abs() < 1e-12);    // floor
    /// ```
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.base * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let floor = self.base * self.min_ratio;
        floor + (self.base - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// Runs a [`WarmupCosine`] under an [`LrScheduler`]: its own `base` is the peak, so the
/// optimizer's rate is ignored.
impl LrSchedule for WarmupCosine {
    fn lr_at(&self, _base_lr: f64, step: u64) -> f64 {
        self.lr(step)
    }

    fn check(&self) -> Result<()> {
        check("WarmupCosine", "base", self.base, true, "a number")?;
        check(
            "WarmupCosine",
            "min_ratio",
            self.min_ratio,
            true,
            "a number",
        )
    }
}
