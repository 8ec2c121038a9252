//! Stochastic gradient descent with momentum.

use super::{Optimizer, realize_step, zeros_like_all};
use crate::autograd::no_grad;
use crate::error::{KilnError, Result};
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// SGD as PyTorch's `torch.optim.SGD`: `g ← -g` when maximizing, `g ← g + wd·p`; with
/// momentum `μ`, `b ← μb + (1 - dampening)·g` (the first step takes `b = g`), then
/// `p ← p - lr·b` (Nesterov: `p ← p - lr·(g + μb)`).
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
    hyper: SgdOptions,
    steps: u64,
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
    /// The momentum factor `μ` (0: no momentum buffer).
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
        let nonneg = |v: f64| v >= 0.0;
        super::check_hyper("Sgd", "the learning rate", hyper.lr, nonneg, "at least 0")?;
        super::check_hyper("Sgd", "momentum", hyper.momentum, nonneg, "at least 0")?;
        super::check_hyper("Sgd", "dampening", hyper.dampening, |_| true, "a number")?;
        let wd = hyper.weight_decay;
        super::check_hyper("Sgd", "weight_decay", wd, nonneg, "at least 0")?;
        if hyper.nesterov && (hyper.momentum <= 0.0 || hyper.dampening != 0.0) {
            // PyTorch: "Nesterov momentum requires a momentum and zero dampening".
            return Err(KilnError::InvalidArgument {
                op: "Sgd",
                shape: vec![],
                reason: "Nesterov momentum requires a momentum above 0 and zero dampening".into(),
            });
        }
        super::check_float_params("Sgd", &params)?;
        let buffers = if hyper.momentum != 0.0 {
            zeros_like_all(&params)?
        } else {
            vec![]
        };
        Ok(Sgd {
            params,
            buffers,
            hyper,
            steps: 0,
            options: RealizeOptions::default(),
        })
    }
}

impl Optimizer for Sgd {
    fn step_report(&mut self) -> Result<RealizeReport> {
        self.steps += 1;
        let first = self.steps == 1;
        let h = self.hyper;
        let (lr, mu, wd) = (h.lr, h.momentum, h.weight_decay);
        no_grad(|| -> Result<()> {
            for (i, p) in self.params.iter().enumerate() {
                let Some(mut g) = p.grad() else {
                    continue;
                };
                if h.maximize {
                    g = g.try_neg()?;
                }
                if wd != 0.0 {
                    g = g.try_add(&p.try_mul(wd)?)?;
                }
                let direction = match self.buffers.get(i) {
                    Some(b) => {
                        // PyTorch starts the buffer at the first gradient.
                        let nb = if first {
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
        self.hyper.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.hyper.lr = lr;
    }

    fn set_realize_options(&mut self, options: RealizeOptions) {
        self.options = options;
    }
}
