//! Stochastic gradient descent with momentum.

use super::state::{
    ScalarKind, StateBuffer, StateParts, StateScalar, counted_scalars, param_index,
    set_counted_scalar,
};
use super::{Optimizer, ParamGroup, realize_step, zeros_like};
use crate::autograd::no_grad;
use crate::error::{KilnError, Result};
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// SGD as PyTorch's `torch.optim.SGD`: `g ← -g` when maximizing, `g ← g + wd·p`; with
/// momentum `μ`, `b ← μb + (1 - dampening)·g` (a parameter's first update with a gradient
/// takes `b = g`), then
/// `p ← p - lr·b` (Nesterov: `p ← p - lr·(g + μb)`). A step with `μ = 0` updates
/// `p ← p - lr·g` and leaves the buffer as it was, as PyTorch's does (a momentum-cycling
/// schedule can pass through 0).
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Tensor>,
    /// Per parameter whose group has momentum: its momentum buffer.
    buffers: Vec<Option<Tensor>>,
    /// Per parameter group: its options.
    groups: Vec<SgdOptions>,
    /// Per parameter: its group.
    group_of: Vec<usize>,
    steps: u64,
    /// Per parameter: whether its momentum buffer holds a value (PyTorch starts it at the
    /// parameter's first gradient, not at the optimizer's first step).
    started: Vec<bool>,
    options: RealizeOptions,
}

/// The arguments of PyTorch's `torch.optim.SGD`, with its defaults (`lr = 1e-3`, the rest 0
/// or off).
///
/// ```
/// use kiln::optim::{Sgd, SgdOptions};
/// let w = kiln::Tensor::from_vec(vec![1.0f32], &[1]).requires_grad_(true);
/// let opts = SgdOptions { lr: 0.1, momentum: 0.9, dampening: 0.1, ..Default::default() };
/// let opt = Sgd::with_options(vec![w], opts).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdOptions {
    /// The learning rate.
    pub lr: f64,
    /// The momentum factor `μ` (0: no momentum buffer, until a momentum-cycling schedule
    /// sets one above 0, see [`Optimizer::set_group_momenta`]).
    pub momentum: f64,
    /// Dampening of the gradient's share of the momentum, `b ← μb + (1 - dampening)·g`.
    pub dampening: f64,
    /// L2 penalty added to the gradient, `g ← g + wd·p`.
    pub weight_decay: f64,
    /// Nesterov momentum (needs a momentum and zero dampening).
    pub nesterov: bool,
    /// Ascends instead of descending (the gradient's sign is flipped first).
    pub maximize: bool,
}

impl Default for SgdOptions {
    fn default() -> Self {
        SgdOptions {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
        }
    }
}

impl Sgd {
    /// Plain SGD (no momentum, no weight decay).
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Sgd> {
        Sgd::with_momentum(params, lr, 0.0, 0.0, false)
    }

    /// SGD with momentum, L2 weight decay and optionally Nesterov momentum.
    pub fn with_momentum(
        params: Vec<Tensor>,
        lr: f64,
        momentum: f64,
        weight_decay: f64,
        nesterov: bool,
    ) -> Result<Sgd> {
        let opts = SgdOptions {
            lr,
            momentum,
            weight_decay,
            nesterov,
            ..SgdOptions::default()
        };
        Sgd::with_options(params, opts)
    }

    /// SGD with every option PyTorch's has ([`SgdOptions`]); refuses what PyTorch refuses.
    pub fn with_options(params: Vec<Tensor>, hyper: SgdOptions) -> Result<Sgd> {
        Sgd::with_groups(vec![ParamGroup::new(params, hyper)])
    }

    /// SGD over parameter groups, each with its own options (PyTorch's list of dicts); one
    /// step updates every group in one realize. A parameter in two groups is refused.
    pub fn with_groups(groups: Vec<ParamGroup<SgdOptions>>) -> Result<Sgd> {
        let nonneg = |v: f64| v >= 0.0;
        for g in &groups {
            let h = g.options;
            super::check_hyper("Sgd", "the learning rate", h.lr, nonneg, "at least 0")?;
            super::check_hyper("Sgd", "momentum", h.momentum, nonneg, "at least 0")?;
            super::check_hyper("Sgd", "dampening", h.dampening, |_| true, "a number")?;
            let wd = h.weight_decay;
            super::check_hyper("Sgd", "weight_decay", wd, nonneg, "at least 0")?;
            if h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0) {
                // PyTorch: "Nesterov momentum requires a momentum and zero dampening".
                return Err(KilnError::InvalidArgument {
                    op: "Sgd",
                    shape: vec![],
                    reason: "Nesterov momentum requires a momentum above 0 and zero dampening"
                        .into(),
                });
            }
        }
        let (params, group_of, groups) = super::flatten_groups("Sgd", groups)?;
        let n = params.len();
        let buffers = params
            .iter()
            .zip(&group_of)
            .map(|(p, &g)| {
                if groups[g].momentum != 0.0 {
                    zeros_like(p).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sgd {
            params,
            buffers,
            groups,
            group_of,
            steps: 0,
            started: vec![false; n],
            options: RealizeOptions::default(),
        })
    }

    /// The options of parameter group `i`.
    pub fn group_options(&self, i: usize) -> Option<&SgdOptions> {
        self.groups.get(i)
    }

    /// Sets the learning rate of group `i` alone; `None` when there is no such group.
    pub fn set_group_lr(&mut self, i: usize, lr: f64) -> Option<()> {
        self.groups.get_mut(i).map(|g| g.lr = lr)
    }
}

impl Optimizer for Sgd {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        no_grad(|| -> Result<()> {
            for (i, p) in self.params.iter().enumerate() {
                let Some(mut g) = p.grad() else {
                    continue;
                };
                let h = self.groups[self.group_of[i]];
                let (lr, mu, wd) = (h.lr, h.momentum, h.weight_decay);
                if h.maximize {
                    g = g.try_neg()?;
                }
                if wd != 0.0 {
                    g = g.try_add(&p.try_mul(wd)?)?;
                }
                // As PyTorch's, a momentum of 0 leaves the buffer alone (it has one when a
                // schedule cycles the momentum through 0).
                let direction = match self.buffers.get(i) {
                    Some(Some(b)) if mu != 0.0 => {
                        // PyTorch starts the buffer at the first gradient.
                        let nb = if !std::mem::replace(&mut self.started[i], true) {
                            g.clone()
                        } else if h.dampening != 0.0 {
                            b.try_mul(mu)?.try_add(&g.try_mul(1.0 - h.dampening)?)?
                        } else {
                            b.try_mul(mu)?.try_add(&g)?
                        };
                        b.try_copy_(&nb)?;
                        if h.nesterov {
                            g.try_add(&b.try_mul(mu)?)?
                        } else {
                            b.clone()
                        }
                    }
                    _ => g,
                };
                p.try_copy_(&p.try_sub(&direction.try_mul(lr)?)?)?;
            }
            Ok(())
        })?;
        let buffers: Vec<Tensor> = self.buffers.iter().flatten().cloned().collect();
        realize_step(&[&self.params, &buffers], &self.options)
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    super::group_lr_methods!();

    super::group_momentum_methods!("Sgd");

    super::state::state_dict_methods!();

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.options = options;
    }
}

super::state::option_fields!(SgdOptions {
    numbers: [lr, momentum, dampening, weight_decay],
    pairs: [],
    flags: [nesterov, maximize]
});

impl StateParts for Sgd {
    const NAME: &'static str = "Sgd::load_state_dict";

    fn buffers(&self) -> Vec<StateBuffer> {
        (self.buffers.iter().enumerate())
            .filter_map(|(i, b)| Some(StateBuffer::whole(i, "momentum_buffer", b.as_ref()?)))
            .collect()
    }

    fn scalars(&self) -> Vec<StateScalar> {
        let mut out: Vec<StateScalar> = (self.started.iter().enumerate())
            .filter(|(i, _)| matches!(self.buffers.get(*i), Some(Some(_))))
            .map(|(i, &s)| {
                let v = f64::from(u8::from(s));
                (format!("state.{i}.momentum_started"), v, ScalarKind::Flag)
            })
            .collect();
        out.extend(counted_scalars(&[], self.steps, &self.groups));
        out
    }

    fn set_scalar(&mut self, name: &str, v: f64) {
        if let Some(i) = param_index(name, "momentum_started") {
            if let Some(s) = self.started.get_mut(i) {
                *s = v != 0.0;
            }
        } else {
            set_counted_scalar(name, v, &mut [], &mut self.steps, &mut self.groups);
        }
    }
}
