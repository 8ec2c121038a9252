//! Stochastic gradient descent with momentum.

use super::{Optimizer, realize_step, zeros_like_all};
use crate::autograd::no_grad;
use crate::error::{KilnError, Result};
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// SGD as PyTorch's `torch.optim.SGD`: `g ← g + wd·p`; with momentum `μ`,
/// `b ← μb + g` (the first step takes `b = g`), then `p ← p - lr·b` (Nesterov:
/// `p ← p - lr·(g + μb)`).
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    nesterov: bool,
    steps: u64,
    options: RealizeOptions,
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
        let nonneg = |v: f64| v >= 0.0;
        super::check_hyper("Sgd", "the learning rate", lr, nonneg, "at least 0")?;
        super::check_hyper("Sgd", "momentum", momentum, nonneg, "at least 0")?;
        super::check_hyper("Sgd", "weight_decay", weight_decay, nonneg, "at least 0")?;
        if nesterov && momentum == 0.0 {
            // PyTorch: "Nesterov momentum requires a momentum and zero dampening".
            return Err(KilnError::InvalidArgument {
                op: "Sgd",
                shape: vec![],
                reason: "Nesterov momentum requires a momentum above 0".into(),
            });
        }
        let buffers = if momentum != 0.0 {
            zeros_like_all(&params)?
        } else {
            vec![]
        };
        Ok(Sgd {
            params,
            buffers,
            lr,
            momentum,
            weight_decay,
            nesterov,
            steps: 0,
            options: RealizeOptions::default(),
        })
    }
}

impl Optimizer for Sgd {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        let first = self.steps == 1;
        let (lr, mu, wd) = (self.lr, self.momentum, self.weight_decay);
        no_grad(|| -> Result<()> {
            for (i, p) in self.params.iter().enumerate() {
                let Some(mut g) = p.grad() else {
                    continue;
                };
                if wd != 0.0 {
                    g = g.try_add(&p.try_mul(wd)?)?;
                }
                let direction = match self.buffers.get(i) {
                    Some(b) => {
                        // PyTorch starts the buffer at the first gradient.
                        let nb = if first {
                            g.clone()
                        } else {
                            b.try_mul(mu)?.try_add(&g)?
                        };
                        b.try_copy_(&nb)?;
                        if self.nesterov {
                            g.try_add(&b.try_mul(mu)?)?
                        } else {
                            b.clone()
                        }
                    }
                    None => g,
                };
                p.try_copy_(&p.try_sub(&direction.try_mul(lr)?)?)?;
            }
            Ok(())
        })?;
        realize_step(&[&self.params, &self.buffers], &self.options)
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
