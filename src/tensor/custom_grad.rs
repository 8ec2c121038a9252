//! Gradient tracking on this thread (`no_grad`) and composites with one backward rule.
//!
//! These live below the autograd layer (which re-exports them) so that tensor ops, which
//! cannot reach up to the autograd engine, can record a composite: `cat` gives each input
//! a slice of the output's gradient this way. The engine runs the rule when it reaches the
//! composite's node.

use super::Tensor;
use crate::error::Result;
use crate::graph;
use crate::shape::Movement;

/// The backward rule of a composite recorded as one step: from its inputs, its output and
/// the output's gradient, the inputs' gradients.
pub(crate) type VjpFn =
    dyn Fn(&[Tensor], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync;

/// A composite's backward rule, as stored in the graph.
pub(crate) struct CustomRule(pub(crate) Box<VjpFn>);

impl Tensor {
    /// True when gradients flow to (or through) this tensor.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let w = Tensor::from_vec(vec![1.0f32], &[1]).requires_grad_(true);
    /// assert!(w.requires_grad() && (&w * 2.0).requires_grad());
    /// assert!(!w.detach().requires_grad());
    /// ```
    pub fn requires_grad(&self) -> bool {
        graph::with_graph(|g| g.node(self.node_key()).is_ok_and(|n| n.autograd.is_some()))
    }
}

/// Computes `forward()` (over `inputs`) without recording history and, when gradients are
/// enabled and an input requires grad, gives the result the single backward `rule` instead
/// (so a composite like cross entropy has one fused backward kernel rather than the
/// derivative of each of its steps).
pub(crate) fn composite(
    inputs: &[&Tensor],
    forward: impl FnOnce() -> Result<Tensor>,
    rule: impl Fn(&[Tensor], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Result<Tensor> {
    let track = is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
    let out = no_grad(forward)?;
    if !track {
        return Ok(out);
    }
    // A fresh node for the result, so the rule belongs to it alone.
    let out = no_grad(|| out.record_movement(Movement::Reshape(out.shape().to_vec())))?;
    let keys = inputs.iter().map(|t| t.node_key()).collect();
    let rule: std::sync::Arc<dyn std::any::Any + Send + Sync> =
        std::sync::Arc::new(CustomRule(Box::new(rule)));
    graph::with_graph(|g| g.set_custom_grad(out.node_key(), rule, keys))?;
    Ok(out)
}

/// Runs `f` with gradient tracking off on this thread (ops record no history), as
/// PyTorch's `torch.no_grad()`.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = NoGradGuard::new();
    f()
}

/// Turns gradient tracking off on this thread until dropped.
#[derive(Debug)]
pub struct NoGradGuard {
    previous: bool,
}

impl NoGradGuard {
    /// Disables gradient tracking.
    pub fn new() -> Self {
        NoGradGuard {
            previous: graph::set_grad_enabled(false),
        }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        graph::set_grad_enabled(self.previous);
    }
}

/// Whether ops recorded on this thread track gradients now.
pub fn is_grad_enabled() -> bool {
    graph::grad_enabled()
}
