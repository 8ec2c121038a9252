//! NAdam: Adam with Nesterov momentum and a warming momentum schedule.

use super::state::{
    ScalarKind, StateBuffer, StateParts, StateScalar, counted_scalars, param_index,
    set_counted_scalar,
};
use super::{Optimizer, ParamGroup, realize_step};
use crate::autograd::no_grad;
use crate::error::Result;
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// NAdam as PyTorch's `torch.optim.NAdam`. Per parameter, on its `t`-th update, with `g`
/// the gradient (negated when maximizing; plus `wd·p` with an L2 weight decay, or
/// `p ← p(1 - lr·wd)` first when the decay is decoupled) and `ψ` the momentum decay:
///
/// - `μₜ = β₁(1 - ½·0.96^(tψ))`, `μₜ₊₁ = β₁(1 - ½·0.96^((t+1)ψ))`, `Πₜ = μ₁⋯μₜ`;
/// - `m ← β₁m + (1-β₁)g`, `v ← β₂v + (1-β₂)g²`, `d = √(v / (1 - β₂ᵗ)) + ε`;
/// - `p ← p - lr·(1-μₜ)/(1-Πₜ)·g/d - lr·μₜ₊₁/(1-Πₜμₜ₊₁)·m/d`.
///
/// Two kernels per parameter, each writing in place: both moments (one `[2, ..]`
/// buffer), then the parameter; the momentum products and bias corrections are computed
/// here each step and enter the plan as run-time numbers.
///
/// ```
/// use kiln::optim::{NAdam, Optimizer};
/// use kiln::Tensor;
/// let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).requires_grad_(true);
/// w.realize().unwrap();
/// let mut opt = NAdam::new(vec![w.clone()], 0.1).unwrap();
/// for _ in 0..50 {
///     opt.zero_grad();
///     (&w * &w).sum(..).backward().unwrap();
///     opt.step().unwrap();
/// }
/// assert!(w.to_vec::<f32>().unwrap().iter().all(|v| v.abs() < 0.5));
/// ```
#[derive(Debug)]
pub struct NAdam {
    params: Vec<Tensor>,
    /// Per parameter: the first and second moment stacked, `[2, ..shape]`.
    state: Vec<Tensor>,
    /// Per parameter group: its options.
    groups: Vec<NAdamOptions>,
    /// Per parameter: its group.
    group_of: Vec<usize>,
    steps: u64,
    /// Per parameter: the steps that updated it and the product of their `μ`.
    param_steps: Vec<(u64, f64)>,
    options: RealizeOptions,
}

/// The arguments of PyTorch's `torch.optim.NAdam`, with its defaults (`lr = 2e-3`,
/// `betas = (0.9, 0.999)`, `eps = 1e-8`, `weight_decay = 0`, `momentum_decay = 4e-3`, L2
/// decay rather than decoupled).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NAdamOptions {
    /// The learning rate.
    pub lr: f64,
    /// The decay rates of the first and second moment, each in `[0, 1)`.
    pub betas: (f64, f64),
    /// Added to the denominator's square root.
    pub eps: f64,
    /// The weight decay (an L2 term, or decoupled as AdamW's).
    pub weight_decay: f64,
    /// `ψ`, how fast the momentum schedule `μₜ` warms up.
    pub momentum_decay: f64,
    /// Decays the weights directly (`p ← p(1 - lr·wd)`) instead of through the gradient.
    pub decoupled_weight_decay: bool,
    /// Ascends instead of descending (the gradient's sign is flipped first).
    pub maximize: bool,
}

impl Default for NAdamOptions {
    fn default() -> Self {
        NAdamOptions {
            lr: 2e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            momentum_decay: 4e-3,
            decoupled_weight_decay: false,
            maximize: false,
        }
    }
}

impl NAdam {
    /// NAdam over `params` (realized float leaves) with learning rate `lr` and PyTorch's
    /// other defaults.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<NAdam> {
        let opts = NAdamOptions {
            lr,
            ..NAdamOptions::default()
        };
        NAdam::with_options(params, opts)
    }

    /// NAdam with every option PyTorch's has ([`NAdamOptions`]); refuses what PyTorch
    /// refuses (a negative lr, eps, weight decay or momentum decay, betas outside `[0, 1)`).
    pub fn with_options(params: Vec<Tensor>, hyper: NAdamOptions) -> Result<NAdam> {
        NAdam::with_groups(vec![ParamGroup::new(params, hyper)])
    }

    /// NAdam over parameter groups, each with its own options; one step updates every group
    /// in one realize. A parameter in two groups is refused.
    pub fn with_groups(groups: Vec<ParamGroup<NAdamOptions>>) -> Result<NAdam> {
        const OP: &str = "NAdam";
        let nonneg = |v: f64| v >= 0.0;
        let unit = |v: f64| (0.0..1.0).contains(&v);
        for g in &groups {
            let h = g.options;
            super::check_hyper(OP, "the learning rate", h.lr, nonneg, "at least 0")?;
            super::check_hyper(OP, "eps", h.eps, nonneg, "at least 0")?;
            super::check_hyper(OP, "beta1", h.betas.0, unit, "in [0, 1)")?;
            super::check_hyper(OP, "beta2", h.betas.1, unit, "in [0, 1)")?;
            let wd = h.weight_decay;
            super::check_hyper(OP, "weight_decay", wd, nonneg, "at least 0")?;
            let psi = h.momentum_decay;
            super::check_hyper(OP, "momentum_decay", psi, nonneg, "at least 0")?;
        }
        let (params, group_of, groups) = super::flatten_groups(OP, groups)?;
        let state = params
            .iter()
            .map(|p| super::stacked_zeros(p, 2))
            .collect::<Result<Vec<_>>>()?;
        let n = params.len();
        Ok(NAdam {
            params,
            state,
            groups,
            group_of,
            steps: 0,
            param_steps: vec![(0, 1.0); n],
            options: RealizeOptions::default(),
        })
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The first and second moment of parameter `i`.
    pub fn moments(&self, i: usize) -> Option<(Tensor, Tensor)> {
        let s = self.state.get(i)?;
        Some((super::state_row(s, 0).ok()?, super::state_row(s, 1).ok()?))
    }

    /// The options of parameter group `i`.
    pub fn group_options(&self, i: usize) -> Option<&NAdamOptions> {
        self.groups.get(i)
    }

    /// Sets the learning rate of group `i` alone; `None` when there is no such group.
    pub fn set_group_lr(&mut self, i: usize, lr: f64) -> Option<()> {
        self.groups.get_mut(i).map(|g| g.lr = lr)
    }
}

impl Optimizer for NAdam {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        no_grad(|| -> Result<()> {
            for (i, ((p, s), (steps, mu_product))) in self
                .params
                .iter()
                .zip(&self.state)
                .zip(&mut self.param_steps)
                .enumerate()
            {
                let Some(g) = p.grad() else {
                    continue;
                };
                let h = self.groups[self.group_of[i]];
                let (b1, b2) = h.betas;
                let (lr, wd) = (h.lr, h.weight_decay);
                let l2 = if h.decoupled_weight_decay { 0.0 } else { wd };
                let g = super::adjusted_grad(p, g, h.maximize, l2)?;
                *steps += 1;
                let t = *steps as f64;
                let mu = b1 * (1.0 - 0.5 * 0.96f64.powf(t * h.momentum_decay));
                let mu_next = b1 * (1.0 - 0.5 * 0.96f64.powf((t + 1.0) * h.momentum_decay));
                *mu_product *= mu;
                let bc2 = 1.0 - b2.powf(t);
                // Both moments in one kernel: row 0 β₁m + (1-β₁)g, row 1 β₂v + (1-β₂)g².
                let second = super::second_row(s)?;
                let gs = super::per_row(&g, s)?;
                let decay = Tensor::try_where(
                    &second,
                    &super::scalar_like(s, b2)?,
                    &super::scalar_like(s, b1)?,
                )?;
                let fresh = Tensor::try_where(
                    &second,
                    &gs.try_mul(&gs)?.try_mul(1.0 - b2)?,
                    &gs.try_mul(1.0 - b1)?,
                )?;
                s.try_copy_(&s.try_mul(&decay)?.try_add(&fresh)?)?;
                let (m, v) = (super::state_row(s, 0)?, super::state_row(s, 1)?);
                let denom = v.try_div(bc2)?.try_sqrt()?.try_add(h.eps)?;
                let grad_rate = lr * (1.0 - mu) / (1.0 - *mu_product);
                let moment_rate = lr * mu_next / (1.0 - *mu_product * mu_next);
                let step = g
                    .try_mul(grad_rate)?
                    .try_add(&m.try_mul(moment_rate)?)?
                    .try_div(&denom)?;
                let kept = if h.decoupled_weight_decay && wd != 0.0 {
                    p.try_mul(1.0 - lr * wd)?
                } else {
                    p.clone()
                };
                p.try_copy_(&kept.try_sub(&step)?)?;
            }
            Ok(())
        })?;
        realize_step(&[&self.params, &self.state], &self.options)
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    super::group_lr_methods!();

    super::group_beta1_methods!("NAdam");

    super::state::state_dict_methods!();

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.options = options;
    }
}

super::state::option_fields!(NAdamOptions {
    numbers: [lr, eps, weight_decay, momentum_decay],
    pairs: [betas],
    flags: [decoupled_weight_decay, maximize]
});

impl StateParts for NAdam {
    const NAME: &'static str = "NAdam::load_state_dict";

    fn buffers(&self) -> Vec<StateBuffer> {
        (self.state.iter().enumerate())
            .map(|(i, s)| StateBuffer::rows(i, &["exp_avg", "exp_avg_sq"], s))
            .collect()
    }

    fn scalars(&self) -> Vec<StateScalar> {
        let mut out: Vec<StateScalar> = (self.param_steps.iter().enumerate())
            .flat_map(|(i, &(s, mu))| {
                [
                    (format!("state.{i}.step"), s as f64, ScalarKind::Count),
                    (format!("state.{i}.mu_product"), mu, ScalarKind::Real),
                ]
            })
            .collect();
        out.extend(counted_scalars(&[], self.steps, &self.groups));
        out
    }

    fn set_scalar(&mut self, name: &str, v: f64) {
        if let Some(i) = param_index(name, "step") {
            if let Some(s) = self.param_steps.get_mut(i) {
                s.0 = v as u64;
            }
        } else if let Some(i) = param_index(name, "mu_product") {
            if let Some(s) = self.param_steps.get_mut(i) {
                s.1 = v;
            }
        } else {
            set_counted_scalar(name, v, &mut [], &mut self.steps, &mut self.groups);
        }
    }
}
