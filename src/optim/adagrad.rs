//! Adagrad: each coordinate's step shrinks with the sum of its squared gradients.

use super::state::{StateBuffer, StateParts};
use super::{Optimizer, ParamGroup, realize_step};
use crate::autograd::no_grad;
use crate::error::Result;
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// Adagrad as PyTorch's `torch.optim.Adagrad`. Per parameter, on its `t`-th update (the
/// steps where it had a gradient), with `g` the gradient (negated when maximizing, plus
/// `wd·p` with a weight decay):
///
/// - `clr = lr / (1 + (t - 1)·lr_decay)`;
/// - `s ← s + g²` (`s` starts at `initial_accumulator_value`);
/// - `p ← p - clr·g / (√s + ε)`.
///
/// Two kernels per parameter, each writing in place (the sum, then the parameter); `clr`
/// is a run-time number of the plan, so the decaying rate never re-plans.
///
/// ```
/// use kiln::optim::{Adagrad, Optimizer};
/// use kiln::Tensor;
/// let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).requires_grad_(true);
/// w.realize().unwrap();
/// let mut opt = Adagrad::new(vec![w.clone()], 0.5).unwrap();
/// (&w * &w).sum(..).backward().unwrap();
/// opt.step().unwrap();
/// // First step: s = g², so each weight moves by lr against its gradient's sign.
/// let got = w.to_vec::<f32>().unwrap();
/// assert!((got[0] - 0.5).abs() < 1e-6 && (got[1] + 1.5).abs() < 1e-6);
/// ```
#[derive(Debug)]
pub struct Adagrad {
    params: Vec<Tensor>,
    /// Per parameter: the running sum of squared gradients.
    sums: Vec<Tensor>,
    /// Per parameter group: its options.
    groups: Vec<AdagradOptions>,
    /// Per parameter: its group.
    group_of: Vec<usize>,
    steps: u64,
    /// Per parameter: the steps that updated it, which its rate decay counts (PyTorch's
    /// per-parameter `state["step"]`).
    param_steps: Vec<u64>,
    options: RealizeOptions,
}

/// The arguments of PyTorch's `torch.optim.Adagrad`, with its defaults (`lr = 1e-2`,
/// `eps = 1e-10`, the rest 0 or off).
///
/// ```
/// use kiln::optim::{Adagrad, AdagradOptions};
/// let w = kiln::Tensor::from_vec(vec![1.0f32], &[1]).requires_grad_(true);
/// let opts = AdagradOptions { lr_decay: 1e-3, initial_accumulator_value: 0.1, ..Default::default() };
/// let opt = Adagrad::with_options(vec![w], opts).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdagradOptions {
    /// The learning rate.
    pub lr: f64,
    /// The rate's decay: update `t` uses `lr / (1 + (t - 1)·lr_decay)`.
    pub lr_decay: f64,
    /// L2 penalty added to the gradient, `g ← g + wd·p`.
    pub weight_decay: f64,
    /// The sum of squares' starting value.
    pub initial_accumulator_value: f64,
    /// Added to the denominator's square root.
    pub eps: f64,
    /// Ascends instead of descending (the gradient's sign is flipped first).
    pub maximize: bool,
}

impl Default for AdagradOptions {
    fn default() -> Self {
        AdagradOptions {
            lr: 1e-2,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
            maximize: false,
        }
    }
}

impl Adagrad {
    /// Adagrad over `params` (realized float leaves) with learning rate `lr` and PyTorch's
    /// other defaults.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Result<Adagrad> {
        let opts = AdagradOptions {
            lr,
            ..AdagradOptions::default()
        };
        Adagrad::with_options(params, opts)
    }

    /// Adagrad with every option PyTorch's has ([`AdagradOptions`]); refuses what PyTorch
    /// refuses (a negative lr, lr_decay, weight decay, initial accumulator value or eps).
    pub fn with_options(params: Vec<Tensor>, hyper: AdagradOptions) -> Result<Adagrad> {
        Adagrad::with_groups(vec![ParamGroup::new(params, hyper)])
    }

    /// Adagrad over parameter groups, each with its own options (PyTorch's list of dicts);
    /// one step updates every group in one realize. A parameter in two groups is refused.
    pub fn with_groups(groups: Vec<ParamGroup<AdagradOptions>>) -> Result<Adagrad> {
        const OP: &str = "Adagrad";
        let nonneg = |v: f64| v >= 0.0;
        for g in &groups {
            let h = g.options;
            super::check_hyper(OP, "the learning rate", h.lr, nonneg, "at least 0")?;
            super::check_hyper(OP, "lr_decay", h.lr_decay, nonneg, "at least 0")?;
            let wd = h.weight_decay;
            super::check_hyper(OP, "weight_decay", wd, nonneg, "at least 0")?;
            let init = h.initial_accumulator_value;
            super::check_hyper(OP, "initial_accumulator_value", init, nonneg, "at least 0")?;
            super::check_hyper(OP, "eps", h.eps, nonneg, "at least 0")?;
        }
        let (params, group_of, groups) = super::flatten_groups(OP, groups)?;
        let sums = params
            .iter()
            .zip(&group_of)
            .map(|(p, &g)| {
                let init = groups[g].initial_accumulator_value;
                let s = Tensor::try_full_on(p.shape(), init, p.dtype(), p.device())?;
                s.realize()?;
                Ok(s)
            })
            .collect::<Result<Vec<_>>>()?;
        let n = params.len();
        Ok(Adagrad {
            params,
            sums,
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

    /// Steps that updated parameter `i` (those where it had a gradient): the count its
    /// rate decay uses.
    pub fn param_steps(&self, i: usize) -> Option<u64> {
        self.param_steps.get(i).copied()
    }

    /// Parameter `i`'s sum of squared gradients.
    pub fn sum(&self, i: usize) -> Option<&Tensor> {
        self.sums.get(i)
    }

    /// The options of parameter group `i`.
    pub fn group_options(&self, i: usize) -> Option<&AdagradOptions> {
        self.groups.get(i)
    }

    /// Sets the learning rate of group `i` alone; `None` when there is no such group.
    pub fn set_group_lr(&mut self, i: usize, lr: f64) -> Option<()> {
        self.groups.get_mut(i).map(|g| g.lr = lr)
    }
}

impl Optimizer for Adagrad {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        no_grad(|| -> Result<()> {
            for (i, ((p, s), steps)) in self
                .params
                .iter()
                .zip(&self.sums)
                .zip(&mut self.param_steps)
                .enumerate()
            {
                let Some(g) = p.grad() else {
                    continue;
                };
                let h = self.groups[self.group_of[i]];
                let g = super::adjusted_grad(p, g, h.maximize, h.weight_decay)?;
                *steps += 1;
                let clr = h.lr / (1.0 + (*steps - 1) as f64 * h.lr_decay);
                s.try_copy_(&s.try_add(&g.try_mul(&g)?)?)?;
                let denom = s.try_sqrt()?.try_add(h.eps)?;
                p.try_copy_(&p.try_sub(&g.try_div(&denom)?.try_mul(clr)?)?)?;
            }
            Ok(())
        })?;
        realize_step(&[&self.params, &self.sums], &self.options)
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    super::group_lr_methods!();

    super::state::state_dict_methods!();

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.options = options;
    }
}

super::state::option_fields!(AdagradOptions {
    numbers: [lr, lr_decay, weight_decay, initial_accumulator_value, eps],
    pairs: [],
    flags: [maximize]
});

impl StateParts for Adagrad {
    const NAME: &'static str = "Adagrad::load_state_dict";

    fn buffers(&self) -> Vec<StateBuffer> {
        (self.sums.iter().enumerate())
            .map(|(i, s)| StateBuffer::whole(i, "sum", s))
            .collect()
    }

    super::state::counted_scalar_methods!(param_steps);
}
