//! More of PyTorch's learning-rate schedulers as closed forms of the step ([`LrSchedule`]):
//! [`ConstantLr`], [`PolynomialLr`], [`CyclicLr`], and the combinators [`SequentialLr`]
//! and [`ChainedScheduler`].

use super::schedule::{LrSchedule, bad, check};
use crate::error::Result;

/// PyTorch's `ConstantLR`: `base · factor` for the first `total_iters` steps, then `base`.
/// The default is PyTorch's (`1/3`, `5`).
///
/// ```
/// use kiln::optim::{ConstantLr, LrSchedule};
/// // PyTorch's example: base 0.05, factor 0.5, total_iters 4.
/// let s = ConstantLr { factor: 0.5, total_iters: 4 };
/// let lrs: Vec<f64> = (0..6).map(|t| s.lr_at(0.05, t)).collect();
/// assert_eq!(lrs, [0.025, 0.025, 0.025, 0.025, 0.05, 0.05]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConstantLr {
    /// The factor, in `[0, 1]`.
    pub factor: f64,
    /// The steps that use it.
    pub total_iters: u64,
}

impl Default for ConstantLr {
    fn default() -> Self {
        ConstantLr {
            factor: 1.0 / 3.0,
            total_iters: 5,
        }
    }
}

impl LrSchedule for ConstantLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        if step < self.total_iters {
            base_lr * self.factor
        } else {
            base_lr
        }
    }

    fn check(&self) -> Result<()> {
        let f = self.factor;
        check(
            "ConstantLr",
            "factor",
            f,
            (0.0..=1.0).contains(&f),
            "in [0, 1]",
        )
    }
}

/// PyTorch's `PolynomialLR`: `base · (1 - min(t, n) / n)^power` over `n = total_iters`
/// steps (zero from then on). The default is PyTorch's (`5`, `1`). With `total_iters = 0`
/// the rate stays at `base`, as PyTorch's stepping leaves it.
///
/// ```
/// use kiln::optim::{LrSchedule, PolynomialLr};
/// // PyTorch's example: base 0.001, total_iters 4, power 1.
/// let s = PolynomialLr { total_iters: 4, power: 1.0 };
/// let want = [0.001, 0.00075, 0.0005, 0.00025, 0.0, 0.0];
/// for (t, w) in want.iter().enumerate() {
///     assert!((s.lr_at(0.001, t as u64) - w).abs() < 1e-15);
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolynomialLr {
    /// Steps of the decay (0: no decay).
    pub total_iters: u64,
    /// The polynomial's power (at least 0: a negative one makes the last rate infinite).
    pub power: f64,
}

impl Default for PolynomialLr {
    fn default() -> Self {
        PolynomialLr {
            total_iters: 5,
            power: 1.0,
        }
    }
}

impl LrSchedule for PolynomialLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let n = self.total_iters;
        if n == 0 {
            return base_lr;
        }
        base_lr * (1.0 - step.min(n) as f64 / n as f64).powf(self.power)
    }

    fn check(&self) -> Result<()> {
        // A negative power makes the last rate 0^power, infinite (PyTorch divides by zero
        // there); refused up front.
        check(
            "PolynomialLr",
            "power",
            self.power,
            self.power >= 0.0,
            "at least 0",
        )
    }
}

/// The policy of a [`CyclicLr`], PyTorch's `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum CyclicMode {
    /// `"triangular"`: every cycle from `base_lr` to `max_lr` and back.
    #[default]
    Triangular,
    /// `"triangular2"`: each cycle's amplitude half the previous one's.
    Triangular2,
    /// `"exp_range"`: the amplitude scaled by `gamma^t` (`t` the step).
    ExpRange {
        /// The factor per step.
        gamma: f64,
    },
}

/// PyTorch's `CyclicLR(base_lr, max_lr, step_size_up, step_size_down, mode, gamma)`: the
/// rate climbs linearly from `base_lr` to `max_lr` over `step_size_up` steps, falls back
/// over `step_size_down` (`None`: as many), and repeats, the amplitude scaled per
/// [`CyclicMode`]. As PyTorch's, it replaces the optimizer's rate (the group's base is
/// ignored); one `base_lr`/`max_lr` for every group; stepped per batch. Custom `scale_fn`s
/// are not taken.
///
/// With `cycle_momentum` (the default, as PyTorch's) the momentum cycles inversely to the
/// rate: `max_momentum - (max_momentum - base_momentum)·x·scale` with the rate's position
/// `x` in the cycle and amplitude `scale`, so `max_momentum` at step 0. An
/// [`LrScheduler`](super::LrScheduler) sets it as every group's `momentum` or `beta1`
/// (see [`Optimizer::group_momenta`](super::Optimizer::group_momenta)) and refuses an
/// optimizer with neither.
///
/// ```
/// use kiln::optim::{CyclicLr, CyclicMode, LrSchedule};
/// let s = CyclicLr::new(1.0, 3.0, 2);
/// let lrs: Vec<f64> = (0..5).map(|t| s.lr_at(0.5, t)).collect();
/// assert_eq!(lrs, [1.0, 2.0, 3.0, 2.0, 1.0]);
/// let halving = CyclicLr { mode: CyclicMode::Triangular2, ..s };
/// assert_eq!(halving.lr_at(0.5, 6), 2.0); // the second cycle's peak
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CyclicLr {
    /// The lower bound.
    pub base_lr: f64,
    /// The upper bound (reached only where the amplitude is not scaled down).
    pub max_lr: f64,
    /// Steps of the increasing half of a cycle (at least 1).
    pub step_size_up: u64,
    /// Steps of the decreasing half; `None` is `step_size_up`.
    pub step_size_down: Option<u64>,
    /// The amplitude policy.
    pub mode: CyclicMode,
    /// Whether the momentum is cycled inversely to the rate (PyTorch's default: on).
    pub cycle_momentum: bool,
    /// The momentum at the rate's peak (PyTorch's default 0.8).
    pub base_momentum: f64,
    /// The momentum at the rate's low (PyTorch's default 0.9).
    pub max_momentum: f64,
}

impl CyclicLr {
    /// `CyclicLR(base_lr, max_lr, step_size_up)`, triangular, as long down as up, momentum
    /// cycled between 0.8 and 0.9 (PyTorch's defaults).
    pub fn new(base_lr: f64, max_lr: f64, step_size_up: u64) -> CyclicLr {
        CyclicLr {
            base_lr,
            max_lr,
            step_size_up,
            step_size_down: None,
            mode: CyclicMode::Triangular,
            cycle_momentum: true,
            base_momentum: 0.8,
            max_momentum: 0.9,
        }
    }

    /// The position in the cycle scaled to `[0, 1]` (0 at the low, 1 at the peak) and the
    /// amplitude at `step`.
    fn position(&self, step: u64) -> (f64, f64) {
        let up = self.step_size_up as f64;
        let down = self.step_size_down.unwrap_or(self.step_size_up) as f64;
        let total = up + down;
        let ratio = up / total;
        let t = step as f64;
        let cycle = (1.0 + t / total).floor();
        let x = 1.0 + t / total - cycle;
        let scale = if x <= ratio {
            x / ratio
        } else {
            (x - 1.0) / (ratio - 1.0)
        };
        let amplitude = match self.mode {
            CyclicMode::Triangular => 1.0,
            CyclicMode::Triangular2 => 1.0 / 2f64.powf(cycle - 1.0),
            CyclicMode::ExpRange { gamma } => gamma.powf(t),
        };
        (scale, amplitude)
    }
}

impl LrSchedule for CyclicLr {
    fn lr_at(&self, _base_lr: f64, step: u64) -> f64 {
        let (scale, amplitude) = self.position(step);
        self.base_lr + (self.max_lr - self.base_lr) * scale * amplitude
    }

    /// The momentum at `step` when `cycle_momentum` is on.
    fn momentum_at(&self, step: u64) -> Option<f64> {
        let (scale, amplitude) = self.position(step);
        let height = (self.max_momentum - self.base_momentum) * scale;
        self.cycle_momentum
            .then_some(self.max_momentum - height * amplitude)
    }

    fn check(&self) -> Result<()> {
        if self.step_size_up == 0 || self.step_size_down == Some(0) {
            return Err(bad(
                "CyclicLr",
                "step_size_up and step_size_down must be at least 1".into(),
            ));
        }
        check("CyclicLr", "base_lr", self.base_lr, true, "a number")?;
        check("CyclicLr", "max_lr", self.max_lr, true, "a number")?;
        if let CyclicMode::ExpRange { gamma } = self.mode {
            check("CyclicLr", "gamma", gamma, true, "a number")?;
        }
        if self.cycle_momentum {
            check(
                "CyclicLr",
                "base_momentum",
                self.base_momentum,
                true,
                "a number",
            )?;
            check(
                "CyclicLr",
                "max_momentum",
                self.max_momentum,
                true,
                "a number",
            )?;
        }
        Ok(())
    }
}

/// A boxed schedule, as [`SequentialLr`] and [`ChainedScheduler`] hold them.
pub type BoxedSchedule = Box<dyn LrSchedule + Send + Sync>;

/// PyTorch's `SequentialLR(schedulers, milestones)`: schedule `i` runs from milestone
/// `i - 1` (step 0 for the first) to milestone `i`, each starting again at its own step 0
/// from the group's base rate, as PyTorch's restarts them.
///
/// ```
/// use kiln::optim::{ConstantLr, ExponentialLr, LrSchedule, SequentialLr};
/// let s = SequentialLr::new(
///     vec![Box::new(ConstantLr { factor: 0.1, total_iters: 2 }), Box::new(ExponentialLr { gamma: 0.9 })],
///     vec![2],
/// );
/// let lrs: Vec<f64> = (0..4).map(|t| s.lr_at(1.0, t)).collect();
/// assert_eq!(lrs, [0.1, 0.1, 1.0, 0.9]);
/// ```
pub struct SequentialLr {
    schedules: Vec<BoxedSchedule>,
    milestones: Vec<u64>,
}

impl SequentialLr {
    /// The schedules and the steps at which each after the first takes over (one fewer
    /// milestones than schedules, non-decreasing; checked when an
    /// [`LrScheduler`](super::LrScheduler) is made).
    pub fn new(schedules: Vec<BoxedSchedule>, milestones: Vec<u64>) -> SequentialLr {
        SequentialLr {
            schedules,
            milestones,
        }
    }

    /// The milestones.
    pub fn milestones(&self) -> &[u64] {
        &self.milestones
    }
}

impl std::fmt::Debug for SequentialLr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequentialLr")
            .field("schedules", &self.schedules.len())
            .field("milestones", &self.milestones)
            .finish()
    }
}

impl LrSchedule for SequentialLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let i = self.milestones.partition_point(|&m| m <= step);
        let start = if i == 0 { 0 } else { self.milestones[i - 1] };
        match self.schedules.get(i) {
            Some(s) => s.lr_at(base_lr, step - start),
            None => base_lr,
        }
    }

    /// The momentum of the schedule running at `step`, at its own step (`None` while that
    /// one does not cycle the momentum: the optimizer's stays as it was).
    fn momentum_at(&self, step: u64) -> Option<f64> {
        let i = self.milestones.partition_point(|&m| m <= step);
        let start = if i == 0 { 0 } else { self.milestones[i - 1] };
        self.schedules.get(i)?.momentum_at(step - start)
    }

    fn check(&self) -> Result<()> {
        if self.schedules.is_empty() || self.milestones.len() + 1 != self.schedules.len() {
            return Err(bad(
                "SequentialLr",
                format!(
                    "expects one more schedule than milestones, got {} schedules and {} milestones",
                    self.schedules.len(),
                    self.milestones.len()
                ),
            ));
        }
        if self.milestones.windows(2).any(|w| w[0] > w[1]) {
            return Err(bad(
                "SequentialLr",
                format!("milestones {:?} must not decrease", self.milestones),
            ));
        }
        self.schedules.iter().try_for_each(|s| s.check())
    }

    fn last_step(&self) -> Option<u64> {
        let last = self.schedules.last()?.last_step()?;
        Some(last.saturating_add(self.milestones.last().copied().unwrap_or(0)))
    }
}

/// PyTorch's `ChainedScheduler(schedulers)`: every schedule at once, their factors
/// multiplied: `base · Π_i (lr_i(t) / base)`. This is PyTorch's result for its
/// multiplicative schedulers (`ConstantLR`, `LinearLR`, `StepLR`, `MultiStepLR`,
/// `ExponentialLR`, `PolynomialLR`); for the others PyTorch chains its recursive forms,
/// which differ.
///
/// ```
/// use kiln::optim::{ChainedScheduler, ConstantLr, ExponentialLr, LrSchedule};
/// let s = ChainedScheduler::new(vec![
///     Box::new(ConstantLr { factor: 0.1, total_iters: 2 }),
///     Box::new(ExponentialLr { gamma: 0.9 }),
/// ]);
/// assert!((s.lr_at(1.0, 1) - 0.09).abs() < 1e-12);
/// assert!((s.lr_at(1.0, 2) - 0.81).abs() < 1e-12);
/// ```
pub struct ChainedScheduler {
    schedules: Vec<BoxedSchedule>,
}

impl ChainedScheduler {
    /// The schedules whose factors multiply.
    pub fn new(schedules: Vec<BoxedSchedule>) -> ChainedScheduler {
        ChainedScheduler { schedules }
    }
}

impl std::fmt::Debug for ChainedScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainedScheduler")
            .field("schedules", &self.schedules.len())
            .finish()
    }
}

impl LrSchedule for ChainedScheduler {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        if base_lr == 0.0 {
            return 0.0;
        }
        self.schedules
            .iter()
            .fold(base_lr, |lr, s| lr * (s.lr_at(base_lr, step) / base_lr))
    }

    fn check(&self) -> Result<()> {
        self.schedules.iter().try_for_each(|s| s.check())
    }

    fn last_step(&self) -> Option<u64> {
        self.schedules.iter().filter_map(|s| s.last_step()).min()
    }

    /// The momentum of the last schedule that cycles it (PyTorch steps each in turn, so
    /// the last one's momentum stays).
    fn momentum_at(&self, step: u64) -> Option<f64> {
        self.schedules
            .iter()
            .rev()
            .find_map(|s| s.momentum_at(step))
    }
}
