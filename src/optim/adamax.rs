//! Adamax: Adam with the second moment replaced by a decaying infinity norm.

use super::state::{StateBuffer, StateParts};
use super::{Optimizer, ParamGroup, realize_step};
use crate::autograd::no_grad;
use crate::error::Result;
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// Adamax as PyTorch's `torch.optim.Adamax`. Per parameter, on its `t`-th update, with `g`
/// the gradient (negated when maximizing, plus `wd·p` with a weight decay):
/// `m ← β₁m + (1-β₁)g`, `u ← max(β₂u, |g| + ε)`, `p ← p - lr·m / ((1 - β₁ᵗ)·u)`.
///
/// Two kernels per parameter, each writing in place: `m` and `u` (one `[2, ..]` buffer),
/// then the parameter; the bias-corrected rate is a run-time number of the plan.
///
/// ```
/// use kiln::optim::{Adamax, AdamaxOptions, Optimizer};
/// use kiln::Tensor;
/// let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).requires_grad_(true);
/// w.realize().unwrap();
/// let opts = AdamaxOptions { lr: 0.1, ..Default::default() };
/// let mut opt = Adamax::with_options(vec![w.clone()], opts).unwrap();
/// (&w * &w).sum(..).backward().unwrap();
/// opt.step().unwrap();
/// // First step: m/(1-β₁) = g and u ≈ |g|, so each weight moves by lr.
/// let got = w.to_vec::<f32>().unwrap();
/// assert!((got[0] - 0.9).abs() < 1e-6 && (got[1] + 1.9).abs() < 1e-6);
/// ```
#[derive(Debug)]
pub struct Adamax {
    params: Vec<Tensor>,
    /// Per parameter: `m` and `u` stacked, `[2, ..shape]`.
    state: Vec<Tensor>,
    /// Per parameter group: its options.
    groups: Vec<AdamaxOptions>,
    /// Per parameter: its group.
    group_of: Vec<usize>,
    steps: u64,
    /// Per parameter: the steps that updated it, which its bias correction counts.
    param_steps: Vec<u64>,
    options: RealizeOptions,
}

/// The arguments of PyTorch's `torch.optim.Adamax`, with its defaults (`lr = 2e-3`,
/// `betas = (0.9, 0.999)`, `eps = 1e-8`, no weight decay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamaxOptions {
    /// The learning rate.
    pub lr: f64,
    /// The decay rates of `m` and `u`, each in `[0, 1)`.
    pub betas: (f64, f64),
    /// Added to `|g|` before the maximum.
    pub eps: f64,
    /// L2 penalty added to the gradient, `g ← g + wd·p`.
    pub weight_decay: f64,
    /// Ascends instead of descending (the gradient's sign is flipped first).
    pub maximize: bool,
}

impl Default for AdamaxOptions {
    fn default() -> Self {
        AdamaxOptions {
            lr: 2e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            maximize: false,
        }
    }
}

impl Adamax {
    /// Adamax over `params` (realized float leaves) with learning rate `lr` and PyTorch's
    /// other defaults.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Adamax> {
        let opts = AdamaxOptions {
            lr,
            ..AdamaxOptions::default()
        };
        Adamax::with_options(params, opts)
    }

    /// Adamax with every option PyTorch's has ([`AdamaxOptions`]); refuses what PyTorch
    /// refuses (a negative lr, eps or weight decay, betas outside `[0, 1)`).
    pub fn with_options(params: Vec<Tensor>, hyper: AdamaxOptions) -> Result<Adamax> {
        Adamax::with_groups(vec![ParamGroup::new(params, hyper)])
    }

    /// Adamax over parameter groups, each with its own options; one step updates every
    /// group in one realize. A parameter in two groups is refused.
    pub fn with_groups(groups: Vec<ParamGroup<AdamaxOptions>>) -> Result<Adamax> {
        const OP: &str = "Adamax";
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
        }
        let (params, group_of, groups) = super::flatten_groups(OP, groups)?;
        let state = params
            .iter()
            .map(|p| super::stacked_zeros(p, 2))
            .collect::<Result<Vec<_>>>()?;
        let n = params.len();
        Ok(Adamax {
            params,
            state,
            groups,
            group_of,
            steps: 0,
            param_steps: vec![0; n],
            options: RealizeOptions::default(),
        })
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Parameter `i`'s first moment `m` and infinity norm `u`.
    pub fn state(&self, i: usize) -> Option<(Tensor, Tensor)> {
        let s = self.state.get(i)?;
        Some((super::state_row(s, 0).ok()?, super::state_row(s, 1).ok()?))
    }

    /// The options of parameter group `i`.
    pub fn group_options(&self, i: usize) -> Option<&AdamaxOptions> {
        self.groups.get(i)
    }

    /// Sets the learning rate of group `i` alone; `None` when there is no such group.
    pub fn set_group_lr(&mut self, i: usize, lr: f64) -> Option<()> {
        self.groups.get_mut(i).map(|g| g.lr = lr)
    }
}

impl Optimizer for Adamax {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        no_grad(|| -> Result<()> {
            for (i, ((p, s), steps)) in self
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
                let g = super::adjusted_grad(p, g, h.maximize, h.weight_decay)?;
                *steps += 1;
                let t = i32::try_from(*steps).unwrap_or(i32::MAX);
                // Row 0: β₁m + (1-β₁)g; row 1: max(β₂u, |g| + ε). One kernel.
                let gs = super::per_row(&g, s)?;
                let m = s.try_mul(b1)?.try_add(&gs.try_mul(1.0 - b1)?)?;
                let u = s.try_mul(b2)?.try_maximum(&gs.try_abs()?.try_add(h.eps)?)?;
                s.try_copy_(&Tensor::try_where(&super::second_row(s)?, &u, &m)?)?;
                let (m, u) = (super::state_row(s, 0)?, super::state_row(s, 1)?);
                let clr = h.lr / (1.0 - b1.powi(t));
                p.try_copy_(&p.try_sub(&m.try_div(&u)?.try_mul(clr)?)?)?;
            }
            Ok(())
        })?;
        realize_step(&[&self.params, &self.state], &self.options)
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    super::group_lr_methods!();

    super::group_beta1_methods!("Adamax");

    super::state::state_dict_methods!();

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.options = options;
    }
}

super::state::option_fields!(AdamaxOptions {
    numbers: [lr, eps, weight_decay],
    pairs: [betas],
    flags: [maximize]
});

impl StateParts for Adamax {
    const NAME: &'static str = "Adamax::load_state_dict";

    fn buffers(&self) -> Vec<StateBuffer> {
        (self.state.iter().enumerate())
            .map(|(i, s)| StateBuffer::rows(i, &["exp_avg", "exp_inf"], s))
            .collect()
    }

    super::state::counted_scalar_methods!(param_steps);
}
