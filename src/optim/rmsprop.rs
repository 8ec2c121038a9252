//! RMSprop: each step divides the gradient by a running root mean square of past
//! gradients.

use super::state::{StateBuffer, StateParts};
use super::{Optimizer, ParamGroup, realize_step};
use crate::autograd::no_grad;
use crate::error::Result;
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// RMSprop as PyTorch's `torch.optim.RMSprop`. Per parameter, with `g` the gradient
/// (negated when maximizing, plus `wd·p` with a weight decay):
///
/// - `v ← αv + (1-α)g²`; centered, also `ḡ ← αḡ + (1-α)g` and the denominator uses
///   `v - ḡ²` in place of `v`;
/// - `d = √v + ε` — ε added after the square root, as PyTorch does;
/// - with momentum `μ`: `b ← μb + g/d`, `p ← p - lr·b`; without: `p ← p - lr·g/d`.
///
/// Every state starts at zero. One kernel updates `v` (and `ḡ`, kept with it in one
/// `[2, ..]` buffer, so the gradient is read once), one the momentum buffer, one the
/// parameter, each in place; the learning rate is a run-time number of the plan, so a
/// schedule never re-plans.
///
/// ```
/// use kiln::optim::{Optimizer, RmsProp, RmsPropOptions};
/// use kiln::Tensor;
/// let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).requires_grad_(true);
/// w.realize().unwrap();
/// let mut opt = RmsProp::with_options(
///     vec![w.clone()],
///     RmsPropOptions { lr: 0.01, ..Default::default() },
/// )
/// .unwrap();
/// (&w * &w).sum(..).backward().unwrap();
/// opt.step().unwrap();
/// // First step: v = 0.01·g², so each weight moves by lr·g/(0.1·|g|) = 10·lr.
/// let got = w.to_vec::<f32>().unwrap();
/// assert!((got[0] - 0.9).abs() < 1e-5 && (got[1] + 1.9).abs() < 1e-5);
/// ```
#[derive(Debug)]
pub struct RmsProp {
    params: Vec<Tensor>,
    /// Per parameter: `[1, ..shape]` holding `v`, or `[2, ..shape]` holding `v` and `ḡ`
    /// when its group is centered.
    state: Vec<Tensor>,
    /// Per parameter whose group has momentum: its momentum buffer.
    buffers: Vec<Option<Tensor>>,
    /// Per parameter group: its options.
    groups: Vec<RmsPropOptions>,
    /// Per parameter: its group.
    group_of: Vec<usize>,
    steps: u64,
    options: RealizeOptions,
}

/// The arguments of PyTorch's `torch.optim.RMSprop`, with its defaults (`lr = 1e-2`,
/// `alpha = 0.99`, `eps = 1e-8`, the rest 0 or off).
///
/// ```
/// use kiln::optim::{RmsProp, RmsPropOptions};
/// let w = kiln::Tensor::from_vec(vec![1.0f32], &[1]).requires_grad_(true);
/// let opts = RmsPropOptions { momentum: 0.9, centered: true, ..Default::default() };
/// let opt = RmsProp::with_options(vec![w], opts).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsPropOptions {
    /// The learning rate.
    pub lr: f64,
    /// The smoothing constant `α` of the running averages.
    pub alpha: f64,
    /// Added to the denominator's square root.
    pub eps: f64,
    /// L2 penalty added to the gradient, `g ← g + wd·p`.
    pub weight_decay: f64,
    /// The momentum factor `μ` (0: no momentum buffer, until a momentum-cycling schedule
    /// sets one above 0, see [`Optimizer::set_group_momenta`]).
    pub momentum: f64,
    /// Divides by an estimate of the gradient's variance (`v - ḡ²`) instead of its second
    /// moment.
    pub centered: bool,
    /// Ascends instead of descending (the gradient's sign is flipped first).
    pub maximize: bool,
}

impl Default for RmsPropOptions {
    fn default() -> Self {
        RmsPropOptions {
            lr: 1e-2,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
            maximize: false,
        }
    }
}

impl RmsProp {
    /// RMSprop over `params` (realized float leaves) with learning rate `lr` and PyTorch's
    /// other defaults.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<RmsProp> {
        let opts = RmsPropOptions {
            lr,
            ..RmsPropOptions::default()
        };
        RmsProp::with_options(params, opts)
    }

    /// RMSprop with every option PyTorch's has ([`RmsPropOptions`]); refuses what PyTorch
    /// refuses (a negative lr, alpha, eps, momentum or weight decay).
    pub fn with_options(params: Vec<Tensor>, hyper: RmsPropOptions) -> Result<RmsProp> {
        RmsProp::with_groups(vec![ParamGroup::new(params, hyper)])
    }

    /// RMSprop over parameter groups, each with its own options (PyTorch's list of dicts);
    /// one step updates every group in one realize. A parameter in two groups is refused.
    pub fn with_groups(groups: Vec<ParamGroup<RmsPropOptions>>) -> Result<RmsProp> {
        const OP: &str = "RmsProp";
        let nonneg = |v: f64| v >= 0.0;
        for g in &groups {
            let h = g.options;
            super::check_hyper(OP, "the learning rate", h.lr, nonneg, "at least 0")?;
            super::check_hyper(OP, "alpha", h.alpha, nonneg, "at least 0")?;
            super::check_hyper(OP, "eps", h.eps, nonneg, "at least 0")?;
            super::check_hyper(OP, "momentum", h.momentum, nonneg, "at least 0")?;
            let wd = h.weight_decay;
            super::check_hyper(OP, "weight_decay", wd, nonneg, "at least 0")?;
        }
        let (params, group_of, groups) = super::flatten_groups(OP, groups)?;
        let mut state = Vec::with_capacity(params.len());
        let mut buffers = Vec::with_capacity(params.len());
        for (p, &g) in params.iter().zip(&group_of) {
            let h = groups[g];
            state.push(super::stacked_zeros(p, if h.centered { 2 } else { 1 })?);
            buffers.push(if h.momentum > 0.0 {
                Some(super::zeros_like(p)?)
            } else {
                None
            });
        }
        Ok(RmsProp {
            params,
            state,
            buffers,
            groups,
            group_of,
            steps: 0,
            options: RealizeOptions::default(),
        })
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Parameter `i`'s running average of squared gradients `v`.
    pub fn square_avg(&self, i: usize) -> Option<Tensor> {
        super::state_row(self.state.get(i)?, 0).ok()
    }

    /// Parameter `i`'s running average of gradients `ḡ` (centered groups only).
    pub fn grad_avg(&self, i: usize) -> Option<Tensor> {
        let s = self.state.get(i)?;
        if s.shape()[0] < 2 {
            return None;
        }
        super::state_row(s, 1).ok()
    }

    /// The options of parameter group `i`.
    pub fn group_options(&self, i: usize) -> Option<&RmsPropOptions> {
        self.groups.get(i)
    }

    /// Sets the learning rate of group `i` alone; `None` when there is no such group.
    pub fn set_group_lr(&mut self, i: usize, lr: f64) -> Option<()> {
        self.groups.get_mut(i).map(|g| g.lr = lr)
    }
}

impl Optimizer for RmsProp {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        no_grad(|| -> Result<()> {
            for (i, (p, s)) in self.params.iter().zip(&self.state).enumerate() {
                let Some(g) = p.grad() else {
                    continue;
                };
                let h = self.groups[self.group_of[i]];
                let g = super::adjusted_grad(p, g, h.maximize, h.weight_decay)?;
                // Every row decays by α: row 0 takes (1-α)g², row 1 (centered) (1-α)g.
                let gs = super::per_row(&g, s)?;
                let fresh = if h.centered {
                    Tensor::try_where(&super::second_row(s)?, &gs, &gs.try_mul(&gs)?)?
                } else {
                    gs.try_mul(&gs)?
                };
                s.try_copy_(
                    &s.try_mul(h.alpha)?
                        .try_add(&fresh.try_mul(1.0 - h.alpha)?)?,
                )?;
                let mut v = super::state_row(s, 0)?;
                if h.centered {
                    let mean = super::state_row(s, 1)?;
                    v = v.try_sub(&mean.try_mul(&mean)?)?;
                }
                let denom = v.try_sqrt()?.try_add(h.eps)?;
                // As PyTorch's, a momentum of 0 leaves the buffer alone (it has one when a
                // schedule cycles the momentum through 0).
                let direction = match &self.buffers[i] {
                    Some(b) if h.momentum > 0.0 => {
                        b.try_copy_(&b.try_mul(h.momentum)?.try_add(&g.try_div(&denom)?)?)?;
                        b.clone()
                    }
                    _ => g.try_div(&denom)?,
                };
                p.try_copy_(&p.try_sub(&direction.try_mul(h.lr)?)?)?;
            }
            Ok(())
        })?;
        let buffers: Vec<Tensor> = self.buffers.iter().flatten().cloned().collect();
        realize_step(&[&self.params, &self.state, &buffers], &self.options)
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    super::group_lr_methods!();

    super::group_momentum_methods!("RmsProp");

    super::state::state_dict_methods!();

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.options = options;
    }
}

super::state::option_fields!(RmsPropOptions {
    numbers: [lr, alpha, eps, weight_decay, momentum],
    pairs: [],
    flags: [centered, maximize]
});

impl StateParts for RmsProp {
    const NAME: &'static str = "RmsProp::load_state_dict";

    fn buffers(&self) -> Vec<StateBuffer> {
        let mut out = vec![];
        for (i, s) in self.state.iter().enumerate() {
            let rows: &[&str] = if s.shape().first() == Some(&2) {
                &["square_avg", "grad_avg"]
            } else {
                &["square_avg"]
            };
            out.push(StateBuffer::rows(i, rows, s));
            if let Some(Some(b)) = self.buffers.get(i) {
                out.push(StateBuffer::whole(i, "momentum_buffer", b));
            }
        }
        out
    }

    super::state::counted_scalar_methods!();
}
