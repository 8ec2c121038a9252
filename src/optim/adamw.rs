//! AdamW (Adam with decoupled weight decay) and Adam (with L2 weight decay): one update,
//! two ways of decaying.

use super::state::{StateBuffer, StateParts};
use super::{Optimizer, ParamGroup, realize_step};
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::Result;
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// AdamW (Loshchilov & Hutter): per parameter `m ← β₁m + (1-β₁)g`, `v ← β₂v + (1-β₂)g²`,
/// `p ← p(1 - lr·wd) - lr·m̂ / (√v̂ + ε)` with bias-corrected `m̂`, `v̂` — PyTorch's
/// `torch.optim.AdamW` update. Each parameter's update is two fused kernels, each writing
/// in place: both moments (kept in one `[2, ..]` buffer per parameter, so the gradient is
/// read, and a clipped gradient computed, once), then the parameter. With `amsgrad` a third
/// keeps the running maximum of `v`, which `v̂` then uses; `maximize` flips the gradient's
/// sign first.
#[derive(Debug)]
pub struct AdamW {
    params: Vec<Tensor>,
    /// Per parameter: the first and second moment stacked, `[2, ..shape]`.
    state: Vec<Tensor>,
    /// Views of `state`: the first and the second moment (rebuilt after every step, as
    /// views recorded before an in-place update read the old value).
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Per parameter whose group has `amsgrad`: the largest second moment so far.
    v_max: Vec<Option<Tensor>>,
    /// Per parameter group: its options.
    groups: Vec<AdamWOptions>,
    /// Per parameter: its group.
    group_of: Vec<usize>,
    /// AdamW's decay (`p ← p(1 - lr·wd)`), or Adam's (`g ← g + wd·p`).
    decoupled: bool,
    steps: u64,
    /// Per parameter: the steps that updated it (those where it had a gradient), which its
    /// bias correction counts, as PyTorch's per-parameter `state["step"]` does.
    param_steps: Vec<u64>,
    options: RealizeOptions,
}

/// The arguments of PyTorch's `torch.optim.AdamW` (and `Adam`), with AdamW's defaults
/// (`lr = 1e-3`, `betas = (0.9, 0.999)`, `eps = 1e-8`, `weight_decay = 1e-2`; Adam's
/// default decay is 0).
///
/// ```
/// use kiln::optim::{AdamW, AdamWOptions};
/// let w = kiln::Tensor::from_vec(vec![1.0f32], &[1]).requires_grad_(true);
/// let opt = AdamW::with_options(vec![w], AdamWOptions { amsgrad: true, ..Default::default() });
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWOptions {
    /// The learning rate.
    pub lr: f64,
    /// The decay rates of the first and second moment, each in `[0, 1)`.
    pub betas: (f64, f64),
    /// Added to `√v̂` in the denominator.
    pub eps: f64,
    /// The weight decay (decoupled for AdamW, an L2 term for Adam).
    pub weight_decay: f64,
    /// AMSGrad: the denominator uses the largest second moment so far.
    pub amsgrad: bool,
    /// Ascends instead of descending (the gradient's sign is flipped first).
    pub maximize: bool,
}

impl Default for AdamWOptions {
    fn default() -> Self {
        AdamWOptions {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl AdamWOptions {
    /// The four numbers, no AMSGrad, minimizing.
    fn plain(lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> AdamWOptions {
        AdamWOptions {
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl AdamW {
    /// An optimizer over `params` (realized float leaves).
    pub fn new(
        params: Vec<Tensor>,
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
    ) -> Result<AdamW> {
        AdamW::with_options(params, AdamWOptions::plain(lr, betas, eps, weight_decay))
    }

    /// AdamW with every option PyTorch's has ([`AdamWOptions`]); refuses what PyTorch
    /// refuses.
    pub fn with_options(params: Vec<Tensor>, hyper: AdamWOptions) -> Result<AdamW> {
        AdamW::with_groups(vec![ParamGroup::new(params, hyper)])
    }

    /// AdamW over parameter groups, each with its own options (PyTorch's list of dicts:
    /// say, weight decay on matrices and none on gains and biases). One step updates every
    /// group in one realize; a parameter in two groups is refused.
    ///
    /// ```
    /// use kiln::optim::{AdamW, AdamWOptions, Optimizer, ParamGroup};
    /// use kiln::Tensor;
    /// let w = Tensor::from_vec(vec![1.0f32; 4], &[2, 2]).requires_grad_(true);
    /// let b = Tensor::from_vec(vec![1.0f32; 2], &[2]).requires_grad_(true);
    /// let decay = AdamWOptions { lr: 0.1, weight_decay: 0.1, ..Default::default() };
    /// let plain = AdamWOptions { weight_decay: 0.0, ..decay };
    /// let mut opt = AdamW::with_groups(vec![
    ///     ParamGroup::new(vec![w.clone()], decay),
    ///     ParamGroup::new(vec![b.clone()], plain),
    /// ])
    /// .unwrap();
    /// assert_eq!(opt.group_options(1).unwrap().weight_decay, 0.0);
    /// opt.set_lr(0.05); // every group
    /// opt.set_group_lr(0, 0.2).unwrap();
    /// assert_eq!(opt.group_options(0).unwrap().lr, 0.2);
    /// ```
    pub fn with_groups(groups: Vec<ParamGroup<AdamWOptions>>) -> Result<AdamW> {
        AdamW::build("AdamW", groups, true)
    }

    fn build(
        op: &'static str,
        groups: Vec<ParamGroup<AdamWOptions>>,
        decoupled: bool,
    ) -> Result<AdamW> {
        let nonneg = |v: f64| v >= 0.0;
        let unit = |v: f64| (0.0..1.0).contains(&v);
        for g in &groups {
            let AdamWOptions {
                lr,
                betas,
                eps,
                weight_decay,
                ..
            } = g.options;
            super::check_hyper(op, "the learning rate", lr, nonneg, "at least 0")?;
            super::check_hyper(op, "eps", eps, nonneg, "at least 0")?;
            super::check_hyper(op, "beta1", betas.0, unit, "in [0, 1)")?;
            super::check_hyper(op, "beta2", betas.1, unit, "in [0, 1)")?;
            super::check_hyper(op, "weight_decay", weight_decay, nonneg, "at least 0")?;
        }
        let (params, group_of, options) = super::flatten_groups(op, groups)?;
        let state = params
            .iter()
            .map(|p| {
                let mut shape = vec![2];
                shape.extend_from_slice(p.shape());
                let z = Tensor::try_full_on(shape, 0, p.dtype(), p.device())?;
                z.realize()?;
                Ok(z)
            })
            .collect::<Result<Vec<_>>>()?;
        let v_max = params
            .iter()
            .zip(&group_of)
            .map(|(p, &g)| {
                if options[g].amsgrad {
                    super::zeros_like(p).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let (m, v) = moment_views(&state)?;
        let n = params.len();
        Ok(AdamW {
            params,
            state,
            m,
            v,
            v_max,
            groups: options,
            group_of,
            decoupled,
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
    /// bias correction uses.
    pub fn param_steps(&self, i: usize) -> Option<u64> {
        self.param_steps.get(i).copied()
    }

    /// The first and second moment of parameter `i`.
    pub fn moments(&self, i: usize) -> Option<(&Tensor, &Tensor)> {
        Some((self.m.get(i)?, self.v.get(i)?))
    }

    /// The options of parameter group `i`.
    pub fn group_options(&self, i: usize) -> Option<&AdamWOptions> {
        self.groups.get(i)
    }

    /// Sets the learning rate of group `i` alone (a schedule that scales each group's own
    /// rate); `None` when there is no such group.
    pub fn set_group_lr(&mut self, i: usize, lr: f64) -> Option<()> {
        self.groups.get_mut(i).map(|g| g.lr = lr)
    }
}

impl Optimizer for AdamW {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        let decoupled = self.decoupled;
        // The views of the old moments go first: nothing may read them after the update.
        self.m.clear();
        self.v.clear();
        let recorded = no_grad(|| -> Result<()> {
            for (i, ((p, s), steps)) in self
                .params
                .iter()
                .zip(&self.state)
                .zip(&mut self.param_steps)
                .enumerate()
            {
                let Some(mut g) = p.grad() else {
                    continue;
                };
                let h = self.groups[self.group_of[i]];
                let (b1, b2) = h.betas;
                let (lr, eps, wd) = (h.lr, h.eps, h.weight_decay);
                if h.maximize {
                    g = g.try_neg()?;
                }
                if !decoupled && wd != 0.0 {
                    g = g.try_add(&p.try_mul(wd)?)?;
                }
                *steps += 1;
                let t = i32::try_from(*steps).unwrap_or(i32::MAX);
                let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
                // Both moments in one kernel over `[2, ..]`: row 0 `β₁m + (1-β₁)g`, row 1
                // `β₂v + (1-β₂)g²`, the gradient read through one broadcast view.
                let mut rows = vec![2isize];
                rows.extend(std::iter::repeat_n(1, p.ndim()));
                let second = Tensor::try_arange(0, 2, 1, DType::I64)?
                    .try_to(p.device())?
                    .try_reshape(&rows)?
                    .try_eq(1)?;
                let g2 = g.try_unsqueeze(0)?.expand_view(s.shape())?;
                let beta = |b: f64| Tensor::try_full_on((), b, s.dtype(), s.device());
                let decay = Tensor::try_where(&second, &beta(b2)?, &beta(b1)?)?;
                let fresh = Tensor::try_where(
                    &second,
                    &g2.try_mul(&g2)?.try_mul(1.0 - b2)?,
                    &g2.try_mul(1.0 - b1)?,
                )?;
                s.try_copy_(&s.try_mul(&decay)?.try_add(&fresh)?)?;
                let (m, mut v) = moments_of(s)?;
                if let Some(Some(v_max)) = self.v_max.get(i) {
                    v_max.try_copy_(&v_max.try_maximum(&v)?)?;
                    v = v_max.clone();
                }
                let denom = v.try_div(bc2)?.try_sqrt()?.try_add(eps)?;
                let update = m.try_div(bc1)?.try_div(&denom)?;
                let kept = if decoupled {
                    p.try_mul(1.0 - lr * wd)?
                } else {
                    p.clone()
                };
                p.try_copy_(&kept.try_sub(&update.try_mul(lr)?)?)?;
            }
            Ok(())
        });
        let maxima: Vec<Tensor> = self.v_max.iter().flatten().cloned().collect();
        let report = recorded
            .and_then(|()| realize_step(&[&self.params, &self.state, &maxima], &self.options));
        let (m, v) = moment_views(&self.state)?;
        (self.m, self.v) = (m, v);
        report
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    super::group_lr_methods!();

    super::group_beta1_methods!(|s| if s.decoupled { "AdamW" } else { "Adam" });

    super::state::state_dict_methods!();

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.options = options;
    }
}

/// Adam as PyTorch's `torch.optim.Adam`: [`AdamW`]'s update with the weight decay added to
/// the gradient (`g ← g + wd·p`, an L2 penalty that the moments then rescale) instead of
/// decoupled.
///
/// ```
/// use kiln::optim::{Adam, Optimizer};
/// let w = kiln::Tensor::from_vec(vec![1.0f32, -2.0], &[2]).requires_grad_(true);
/// w.realize().unwrap();
/// let mut opt = Adam::new(vec![w.clone()], 0.1, (0.9, 0.999), 1e-8, 0.0).unwrap();
/// (&w * &w).sum(..).backward().unwrap();
/// opt.step().unwrap();
/// // The first step moves each weight by lr against its gradient's sign.
/// let got = w.to_vec::<f32>().unwrap();
/// assert!((got[0] - 0.9).abs() < 1e-6 && (got[1] + 1.9).abs() < 1e-6);
/// ```
#[derive(Debug)]
pub struct Adam(AdamW);

impl Adam {
    /// An optimizer over `params` (realized float leaves); PyTorch's defaults are
    /// `lr = 1e-3`, `betas = (0.9, 0.999)`, `eps = 1e-8`, `weight_decay = 0`.
    pub fn new(
        params: Vec<Tensor>,
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
    ) -> Result<Adam> {
        Adam::with_options(params, AdamWOptions::plain(lr, betas, eps, weight_decay))
    }

    /// Adam with `amsgrad` or `maximize` ([`AdamWOptions`]; its `weight_decay` is Adam's L2
    /// term here).
    pub fn with_options(params: Vec<Tensor>, hyper: AdamWOptions) -> Result<Adam> {
        Adam::with_groups(vec![ParamGroup::new(params, hyper)])
    }

    /// Adam over parameter groups, each with its own options ([`AdamW::with_groups`]).
    pub fn with_groups(groups: Vec<ParamGroup<AdamWOptions>>) -> Result<Adam> {
        AdamW::build("Adam", groups, false).map(Adam)
    }

    /// The options of parameter group `i`.
    pub fn group_options(&self, i: usize) -> Option<&AdamWOptions> {
        self.0.group_options(i)
    }

    /// Sets the learning rate of group `i` alone; `None` when there is no such group.
    pub fn set_group_lr(&mut self, i: usize, lr: f64) -> Option<()> {
        self.0.set_group_lr(i, lr)
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.0.steps()
    }

    /// The first and second moment of parameter `i`.
    pub fn moments(&self, i: usize) -> Option<(&Tensor, &Tensor)> {
        self.0.moments(i)
    }
}

impl Optimizer for Adam {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.0.step_report()
    }

    fn params(&self) -> &[Tensor] {
        self.0.params()
    }

    fn lr(&self) -> f64 {
        self.0.lr()
    }

    fn set_lr(&mut self, lr: f64) {
        self.0.set_lr(lr);
    }

    fn group_lrs(&self) -> Vec<f64> {
        self.0.group_lrs()
    }

    fn set_group_lrs(&mut self, lrs: &[f64]) {
        self.0.set_group_lrs(lrs);
    }

    fn group_momenta(&self) -> Option<Vec<f64>> {
        self.0.group_momenta()
    }

    fn set_group_momenta(&mut self, momenta: &[f64]) -> Result<()> {
        self.0.set_group_momenta(momenta)
    }

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.0.set_realize_options(options);
    }

    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        self.0.state_dict()
    }

    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.0.load_state_dict(state)
    }
}

/// The first and the second moment of a `[2, ..]` state: views of its two rows.
fn moments_of(state: &Tensor) -> Result<(Tensor, Tensor)> {
    let shape: Vec<isize> = state.shape()[1..].iter().map(|&d| d as isize).collect();
    let row =
        |i: isize| -> Result<Tensor> { state.try_slice_dim(0, i, i + 1, 1)?.try_reshape(&shape) };
    Ok((row(0)?, row(1)?))
}

/// [`moments_of`] for every state.
fn moment_views(states: &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let mut m = Vec::with_capacity(states.len());
    let mut v = Vec::with_capacity(states.len());
    for s in states {
        let (a, b) = moments_of(s)?;
        m.push(a);
        v.push(b);
    }
    Ok((m, v))
}

super::state::option_fields!(AdamWOptions {
    numbers: [lr, eps, weight_decay],
    pairs: [betas],
    flags: [amsgrad, maximize]
});

impl StateParts for AdamW {
    const NAME: &'static str = "AdamW::load_state_dict";

    fn buffers(&self) -> Vec<StateBuffer> {
        let mut out = vec![];
        for (i, s) in self.state.iter().enumerate() {
            out.push(StateBuffer::rows(i, &["exp_avg", "exp_avg_sq"], s));
            if let Some(Some(v_max)) = self.v_max.get(i) {
                out.push(StateBuffer::whole(i, "max_exp_avg_sq", v_max));
            }
        }
        out
    }

    super::state::counted_scalar_methods!(param_steps);

    fn restored(&mut self) -> Result<()> {
        (self.m, self.v) = moment_views(&self.state)?;
        Ok(())
    }
}
