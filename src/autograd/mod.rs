//! Autograd on the lazy graph: the backward pass is more graph.
//!
//! A tensor that requires grad makes every op recorded on it (while gradients are enabled)
//! remember how it was computed: its graph node keeps the op and its input edges. A
//! [`Tensor::backward`] walks that history from the output and records, for every op, the
//! ops of its derivative (the `rules` module) — lazily, like any op, so the gradients are
//! planned, fused and memory-planned together with the forward pass when they are
//! realized, and an activation is freed as soon as its last backward reader ran. Gradients
//! accumulate into the leaves' `grad` slots across backward calls until zeroed; the history
//! is released once used.
//!
//! ```
//! use kiln::Tensor;
//! let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).requires_grad_(true);
//! let loss = (&w * &w).sum(0); // sum of squares
//! loss.backward().unwrap();
//! assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
//! ```

mod engine;
mod rules;

use crate::error::{KilnError, Result};
use crate::graph::{self, Autograd};
use crate::shape::Movement;
use crate::tensor::{Tensor, unwrap_or_panic};

pub(crate) use crate::tensor::custom_grad::{CustomRule, composite};
pub use crate::tensor::custom_grad::{NoGradGuard, is_grad_enabled, no_grad};

impl Tensor {
    /// True for a tensor that was not computed from tensors requiring grad (a parameter or
    /// an input): gradients accumulate in its [`Tensor::grad`].
    pub fn is_leaf(&self) -> bool {
        graph::with_graph(|g| {
            g.node(self.node_key())
                .is_ok_and(|n| n.autograd.as_ref().is_none_or(|a| a.is_leaf()))
        })
    }

    /// Makes this leaf require grad (or not) and returns it, for chaining.
    ///
    /// # Panics
    /// On a tensor computed from tensors requiring grad; [`Tensor::try_requires_grad_`]
    /// returns the error instead.
    #[track_caller]
    pub fn requires_grad_(self, on: bool) -> Tensor {
        unwrap_or_panic(self.try_requires_grad_(on).map(|_| ()));
        self
    }

    /// Fallible [`Tensor::requires_grad_`].
    pub fn try_requires_grad_(&self, on: bool) -> Result<&Tensor> {
        if on && !self.dtype().is_float() {
            return Err(KilnError::UnsupportedDType {
                op: "requires_grad_",
                dtype: self.dtype(),
                detail: ": only float tensors can require grad".into(),
            });
        }
        graph::with_graph(|g| {
            let a = g.autograd_mut(self.node_key())?;
            if a.as_ref().is_some_and(|a| !a.is_leaf()) {
                return Err(KilnError::InvalidArgument {
                    op: "requires_grad_",
                    shape: self.shape().to_vec(),
                    reason: "only leaves can change requires_grad (use detach() for a non-leaf)"
                        .into(),
                });
            }
            match (on, a.is_some()) {
                (true, false) => *a = Some(Box::default()),
                (false, true) => {
                    g.set_grad(self.node_key(), None)?;
                    *g.autograd_mut(self.node_key())? = None;
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(self)
    }

    /// The gradient accumulated into this leaf by backward passes, if any.
    pub fn grad(&self) -> Option<Tensor> {
        graph::with_graph(|g| {
            let key = g.node(self.node_key()).ok()?.autograd.as_ref()?.grad?;
            Tensor::retained(g, key).ok()
        })
    }

    /// Replaces this leaf's accumulated gradient (`None` clears it, like PyTorch's
    /// `zero_grad(set_to_none=True)`).
    pub fn set_grad(&self, grad: Option<&Tensor>) -> Result<()> {
        if let Some(gr) = grad
            && (gr.shape() != self.shape() || gr.dtype() != self.dtype())
        {
            return Err(KilnError::ShapeMismatch {
                op: "set_grad",
                lhs: self.shape().to_vec(),
                rhs: gr.shape().to_vec(),
                detail: format!(
                    ": a gradient must match its tensor ({} vs {})",
                    self.dtype(),
                    gr.dtype()
                ),
            });
        }
        graph::with_graph(|g| {
            let a = g.autograd_mut(self.node_key())?;
            if a.is_none() {
                if grad.is_none() {
                    return Ok(());
                }
                *a = Some(Box::<Autograd>::default());
            }
            g.set_grad(self.node_key(), grad.map(|t| t.node_key()))
        })
    }

    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        // Clearing cannot fail for a live tensor.
        let _ = self.set_grad(None);
    }

    /// The same value without gradient history: a new leaf that does not require grad and
    /// shares this tensor's data (no copy).
    ///
    /// Unlike PyTorch, a later in-place update of either tensor does not show through the
    /// other: each keeps its value (computations recorded on the other before the update
    /// run first). Once the update has run, the other's value is gone, and reading it fails
    /// with [`KilnError::Overwritten`].
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// x.realize().unwrap();
    /// let d = x.detach();
    /// let y = &d * 2.0; // recorded before the update: reads the old value
    /// x.add_(1.0);
    /// x.realize().unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    /// assert!(d.to_vec::<f32>().is_err()); // the old value is gone
    /// assert_eq!(x.detach().to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    /// ```
    pub fn detach(&self) -> Tensor {
        let _guard = NoGradGuard::new();
        let alias = graph::with_graph(|g| g.add_buffer_alias(self.node_key()).ok().flatten());
        match alias {
            Some(key) => Tensor::wrap(key, self.shape().to_vec(), self.dtype(), self.device()),
            None => unwrap_or_panic(self.record_movement(Movement::Reshape(self.shape().to_vec()))),
        }
    }

    /// Computes the gradient of this scalar (one-element) tensor with respect to every leaf
    /// it was computed from that requires grad, accumulating into their [`Tensor::grad`].
    /// Lazy: the gradients are recorded, and realized with whatever needs them next.
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(KilnError::InvalidShape {
                op: "backward",
                shape: self.shape().to_vec(),
                requested: vec![],
                reason: "a gradient can be created implicitly only for one-element outputs (use backward_with)".into(),
            });
        }
        let ones = Tensor::try_full_on(self.shape(), 1, self.dtype(), self.device())?;
        engine::backward(self, ones)
    }

    /// Like [`Tensor::backward`], with the output's gradient given.
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        if grad.shape() != self.shape() {
            return Err(KilnError::ShapeMismatch {
                op: "backward",
                lhs: self.shape().to_vec(),
                rhs: grad.shape().to_vec(),
                detail: ": the gradient must have the output's shape".into(),
            });
        }
        engine::backward(self, grad.try_cast(self.dtype())?)
    }
}
