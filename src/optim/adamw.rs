//! AdamW: Adam with decoupled weight decay.

use super::{Optimizer, realize_step};
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// AdamW (Loshchilov & Hutter): per parameter `m ← β₁m + (1-β₁)g`, `v ← β₂v + (1-β₂)g²`,
/// `p ← p(1 - lr·wd) - lr·m̂ / (√v̂ + ε)` with bias-corrected `m̂`, `v̂` — PyTorch's
/// `torch.optim.AdamW` update. Each parameter's update is two fused kernels, each writing
/// in place: both moments (kept in one `[2, ..]` buffer per parameter, so the gradient is
/// read, and a clipped gradient computed, once), then the parameter.
#[derive(Debug)]
pub struct AdamW {
    params: Vec<Tensor>,
    /// Per parameter: the first and second moment stacked, `[2, ..shape]`.
    state: Vec<Tensor>,
    /// Views of `state`: the first and the second moment (rebuilt after every step, as
    /// views recorded before an in-place update read the old value).
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    steps: u64,
    /// Per parameter: the steps that updated it (those where it had a gradient), which its
    /// bias correction counts, as PyTorch's per-parameter `state["step"]` does.
    param_steps: Vec<u64>,
    options: RealizeOptions,
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
        let nonneg = |v: f64| v >= 0.0;
        let unit = |v: f64| (0.0..1.0).contains(&v);
        super::check_hyper("AdamW", "the learning rate", lr, nonneg, "at least 0")?;
        super::check_hyper("AdamW", "eps", eps, nonneg, "at least 0")?;
        super::check_hyper("AdamW", "beta1", betas.0, unit, "in [0, 1)")?;
        super::check_hyper("AdamW", "beta2", betas.1, unit, "in [0, 1)")?;
        super::check_hyper("AdamW", "weight_decay", weight_decay, nonneg, "at least 0")?;
        for p in &params {
            if !p.dtype().is_float() {
                return Err(KilnError::UnsupportedDType {
                    op: "AdamW",
                    dtype: p.dtype(),
                    detail: ": parameters must be float".into(),
                });
            }
        }
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
        let (m, v) = moment_views(&state)?;
        let n = params.len();
        Ok(AdamW {
            params,
            state,
            m,
            v,
            lr,
            betas,
            eps,
            weight_decay,
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
}

impl Optimizer for AdamW {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        let (b1, b2) = self.betas;
        let (lr, eps, wd) = (self.lr, self.eps, self.weight_decay);
        // The views of the old moments go first: nothing may read them after the update.
        self.m.clear();
        self.v.clear();
        let recorded = no_grad(|| -> Result<()> {
            for ((p, s), steps) in self
                .params
                .iter()
                .zip(&self.state)
                .zip(&mut self.param_steps)
            {
                let Some(g) = p.grad() else {
                    continue;
                };
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
                let (m, v) = moments_of(s)?;
                let denom = v.try_div(bc2)?.try_sqrt()?.try_add(eps)?;
                let update = m.try_div(bc1)?.try_div(&denom)?;
                p.try_copy_(&p.try_mul(1.0 - lr * wd)?.try_sub(&update.try_mul(lr)?)?)?;
            }
            Ok(())
        });
        let report =
            recorded.and_then(|()| realize_step(&[&self.params, &self.state], &self.options));
        let (m, v) = moment_views(&self.state)?;
        (self.m, self.v) = (m, v);
        report
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.options = options;
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
