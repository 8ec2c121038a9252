//! AdamW: Adam with decoupled weight decay.

use super::{Optimizer, realize_step, zeros_like_all};
use crate::autograd::no_grad;
use crate::error::{KilnError, Result};
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// AdamW (Loshchilov & Hutter): per parameter `m ← β₁m + (1-β₁)g`, `v ← β₂v + (1-β₂)g²`,
/// `p ← p(1 - lr·wd) - lr·m̂ / (√v̂ + ε)` with bias-corrected `m̂`, `v̂` — PyTorch's
/// `torch.optim.AdamW` update. Each parameter's update is three fused kernels (the two
/// moments and the parameter, each written in place).
pub struct AdamW {
    params: Vec<Tensor>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    steps: u64,
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
        for p in &params {
            if !p.dtype().is_float() {
                return Err(KilnError::UnsupportedDType {
                    op: "AdamW",
                    dtype: p.dtype(),
                    detail: ": parameters must be float".into(),
                });
            }
        }
        let m = zeros_like_all(&params)?;
        let v = zeros_like_all(&params)?;
        Ok(AdamW {
            params,
            m,
            v,
            lr,
            betas,
            eps,
            weight_decay,
            steps: 0,
            options: RealizeOptions::default(),
        })
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The first and second moment of parameter `i`.
    pub fn moments(&self, i: usize) -> Option<(&Tensor, &Tensor)> {
        Some((self.m.get(i)?, self.v.get(i)?))
    }
}

impl Optimizer for AdamW {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        let t = self.steps as i32;
        let (b1, b2) = self.betas;
        let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        let (lr, eps, wd) = (self.lr, self.eps, self.weight_decay);
        no_grad(|| -> Result<()> {
            for ((p, m), v) in self.params.iter().zip(&self.m).zip(&self.v) {
                let Some(g) = p.grad() else {
                    continue;
                };
                m.try_copy_(&m.try_mul(b1)?.try_add(&g.try_mul(1.0 - b1)?)?)?;
                v.try_copy_(&v.try_mul(b2)?.try_add(&g.try_mul(&g)?.try_mul(1.0 - b2)?)?)?;
                let denom = v.try_div(bc2)?.try_sqrt()?.try_add(eps)?;
                let update = m.try_div(bc1)?.try_div(&denom)?;
                p.try_copy_(&p.try_mul(1.0 - lr * wd)?.try_sub(&update.try_mul(lr)?)?)?;
            }
            Ok(())
        })?;
        realize_step(&[&self.params, &self.m, &self.v], &self.options)
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
