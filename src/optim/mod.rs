//! Optimizers ([`Sgd`], [`Adam`], [`AdamW`]), gradient clipping ([`clip_grad_norm`],
//! [`clip_grad_value`]) and a learning-rate
//! schedule ([`WarmupCosine`]).
//!
//! A step records every parameter's update as an in-place write (`copy_`) and realizes it:
//! the parameters and the optimizer state keep their buffers, and everything that still
//! reads the old parameters — the loss, the gradients, the rest of the forward and backward
//! pass — runs in the same plan, before the writes. The step's numbers (learning rate, bias
//! corrections) are run-time parameters, so a training loop replays one cached plan.
//!
//! ```
//! use kiln::optim::{AdamW, Optimizer};
//! use kiln::Tensor;
//! let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).requires_grad_(true);
//! w.realize().unwrap();
//! let mut opt = AdamW::new(vec![w.clone()], 0.1, (0.9, 0.999), 1e-8, 0.0).unwrap();
//! for _ in 0..100 {
//!     opt.zero_grad();
//!     (&w * &w).sum(..).backward().unwrap();
//!     opt.step().unwrap();
//! }
//! assert!(w.to_vec::<f32>().unwrap().iter().all(|v| v.abs() < 0.2));
//! ```

mod adamw;
mod clip;
mod schedule;
mod sgd;

pub use adamw::{Adam, AdamW, AdamWOptions};
pub use clip::{clip_grad_norm, clip_grad_norm_with, clip_grad_value};
pub use schedule::WarmupCosine;
pub use sgd::{Sgd, SgdOptions};

use crate::error::Result;
use crate::plan::RealizeOptions;
use crate::tensor::{RealizeReport, Tensor};

/// Something that updates parameters from their gradients.
pub trait Optimizer {
    /// Applies one update to every parameter that has a gradient and realizes it, with
    /// what it needs (the forward and backward pass when they are still pending); reports
    /// what ran.
    fn step_report(&mut self) -> Result<RealizeReport>;

    /// Applies one update to every parameter that has a gradient, and realizes it.
    fn step(&mut self) -> Result<()> {
        self.step_report().map(|_| ())
    }

    /// The parameters it updates.
    fn params(&self) -> &[Tensor];

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Changes the learning rate (for schedules).
    fn set_lr(&mut self, lr: f64);

    /// How steps are realized (`RealizeOptions::unfused()` to compare against fusion).
    fn set_realize_options(&mut self, options: RealizeOptions);

    /// Clears the parameters' gradients.
    fn zero_grad(&self) {
        for p in self.params() {
            p.zero_grad();
        }
    }
}

/// Zeros shaped like `p`, realized (optimizer state).
fn zeros_like(p: &Tensor) -> Result<Tensor> {
    let z = Tensor::try_full_on(p.shape(), 0, p.dtype(), p.device())?;
    z.realize()?;
    Ok(z)
}

/// Realizes the parameters and state after a step's updates were recorded.
fn realize_step(groups: &[&[Tensor]], options: &RealizeOptions) -> Result<RealizeReport> {
    let all: Vec<&Tensor> = groups.iter().flat_map(|g| g.iter()).collect();
    crate::tensor::realize_all_with(&all, options)
}

/// Parameters that share an optimizer's options: one entry of PyTorch's list of parameter
/// groups.
#[derive(Clone, Debug)]
pub struct ParamGroup<O> {
    /// The group's parameters.
    pub params: Vec<Tensor>,
    /// Their options ([`SgdOptions`], [`AdamWOptions`]).
    pub options: O,
}

impl<O> ParamGroup<O> {
    /// A group of `params` with `options`.
    pub fn new(params: Vec<Tensor>, options: O) -> ParamGroup<O> {
        ParamGroup { params, options }
    }
}

/// Every group's parameters in order, each one's group index, and the groups' options.
/// Refuses non-float parameters and a parameter in two groups (or twice in one), as
/// PyTorch does.
fn flatten_groups<O>(
    op: &'static str,
    groups: Vec<ParamGroup<O>>,
) -> Result<(Vec<Tensor>, Vec<usize>, Vec<O>)> {
    let mut params = vec![];
    let mut group_of = vec![];
    let mut options = Vec::with_capacity(groups.len());
    let mut seen = std::collections::HashSet::new();
    for (i, g) in groups.into_iter().enumerate() {
        check_float_params(op, &g.params)?;
        for p in g.params {
            if !seen.insert(p.node_key()) {
                return Err(crate::error::KilnError::InvalidArgument {
                    op,
                    shape: p.shape().to_vec(),
                    reason: "a parameter appears more than once in the parameter groups".into(),
                });
            }
            params.push(p);
            group_of.push(i);
        }
        options.push(g.options);
    }
    Ok((params, group_of, options))
}

/// Refuses parameters that are not floating-point (`op` the optimizer).
fn check_float_params(op: &'static str, params: &[Tensor]) -> Result<()> {
    for p in params {
        if !p.dtype().is_float() {
            return Err(crate::error::KilnError::UnsupportedDType {
                op,
                dtype: p.dtype(),
                detail: ": parameters must be float".into(),
            });
        }
    }
    Ok(())
}

/// Refuses a hyperparameter outside its range as PyTorch's optimizers do (`op` the
/// optimizer, `what` the argument); NaN is outside every range.
pub(crate) fn check_hyper(
    op: &'static str,
    what: &str,
    value: f64,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> crate::error::Result<()> {
    if value.is_nan() || !ok(value) {
        return Err(crate::error::KilnError::InvalidArgument {
            op,
            shape: vec![],
            reason: format!("{what} {value} is not {range}"),
        });
    }
    Ok(())
}
