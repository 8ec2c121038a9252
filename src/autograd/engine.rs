//! The backward pass: walk the recorded history from the output, apply each op's
//! derivative rule to the gradient flowing back, accumulate into the leaves, release the
//! history. Iterative (no recursion), so arbitrarily deep histories are fine.

use super::{NoGradGuard, rules};
use crate::error::{KilnError, Result};
use crate::graph::{self, GradFn, NodeKey};
use crate::tensor::Tensor;
use std::collections::HashMap;

/// One node of the history: how it was computed and its inputs (those requiring grad
/// flagged).
struct Step {
    node: Tensor,
    op: Option<GradFn>,
    inputs: Vec<(Tensor, bool)>,
    /// Leaves: the node whose `grad` slot receives the gradient.
    accumulate_into: Option<NodeKey>,
}

/// The history of `root`, inputs before consumers.
fn history(root: &Tensor) -> Result<Vec<Step>> {
    graph::with_graph(|g| {
        let requires = |k: NodeKey| g.node(k).is_ok_and(|n| n.autograd.is_some());
        if !requires(root.node_key()) {
            return Err(KilnError::InvalidArgument {
                op: "backward",
                shape: root.shape().to_vec(),
                reason:
                    "the tensor does not require grad (no input it was computed from requires grad)"
                        .into(),
            });
        }
        let mut order: Vec<NodeKey> = vec![];
        let mut state: HashMap<NodeKey, bool> = HashMap::new();
        let mut stack = vec![(root.node_key(), false)];
        while let Some((k, expanded)) = stack.pop() {
            if expanded {
                order.push(k);
                continue;
            }
            if state.contains_key(&k) {
                continue;
            }
            state.insert(k, true);
            stack.push((k, true));
            let n = g.node(k)?;
            if n.autograd.as_ref().is_some_and(|a| a.released) {
                return Err(KilnError::InvalidArgument {
                    op: "backward",
                    shape: n.shape.clone(),
                    reason: "a backward pass already used this part of the graph's history (kiln frees it after use, like PyTorch without retain_graph)".into(),
                });
            }
            let inputs = match n.autograd.as_ref().and_then(|a| a.grad_fn.as_ref()) {
                Some(GradFn::Op(_)) => g.inputs(k)?,
                Some(GradFn::Custom { inputs, .. }) => inputs.clone(),
                None => vec![],
            };
            {
                for i in inputs.into_iter().rev() {
                    if requires(i) && !state.contains_key(&i) {
                        stack.push((i, false));
                    }
                }
            }
        }
        let facts = order
            .into_iter()
            .map(|k| {
                let a = g.node(k)?.autograd.as_deref().cloned().unwrap_or_default();
                let keys = match &a.grad_fn {
                    Some(GradFn::Op(_)) => g.inputs(k)?,
                    Some(GradFn::Custom { inputs, .. }) => inputs.clone(),
                    None => vec![],
                };
                let inputs: Vec<(NodeKey, bool)> =
                    keys.into_iter().map(|i| (i, requires(i))).collect();
                Ok((k, a, inputs))
            })
            .collect::<Result<Vec<_>>>()?;
        facts
            .into_iter()
            .map(|(k, a, inputs)| {
                let inputs = inputs
                    .into_iter()
                    .map(|(i, r)| Ok((Tensor::retained(g, i)?, r)))
                    .collect::<Result<Vec<_>>>()?;
                let leaf_target = a.accumulate_into.unwrap_or(k);
                Ok(Step {
                    node: Tensor::retained(g, k)?,
                    accumulate_into: a.is_leaf().then_some(leaf_target),
                    op: a.grad_fn,
                    inputs,
                })
            })
            .collect()
    })
}

/// Backpropagates `grad` (the gradient of `root`).
pub(super) fn backward(root: &Tensor, grad: Tensor) -> Result<()> {
    let steps = history(root)?;
    let _no_grad = NoGradGuard::new();
    let mut grads: HashMap<NodeKey, Tensor> = HashMap::new();
    grads.insert(root.node_key(), grad);
    let mut leaves: Vec<(NodeKey, Tensor)> = vec![];
    for step in steps.iter().rev() {
        let Some(g) = grads.remove(&step.node.node_key()) else {
            continue;
        };
        match (&step.op, step.accumulate_into) {
            (Some(op), _) => {
                let inputs: Vec<Tensor> = step.inputs.iter().map(|i| i.0.clone()).collect();
                let needs: Vec<bool> = step.inputs.iter().map(|i| i.1).collect();
                let input_grads = match op {
                    GradFn::Op(op) => rules::vjp(op, &inputs, &step.node, &g, &needs)?,
                    GradFn::Custom { rule, .. } => {
                        let rule = rule
                            .downcast_ref::<super::CustomRule>()
                            .ok_or_else(|| KilnError::internal("autograd: unknown custom rule"))?;
                        (rule.0)(&inputs, &step.node, &g)?
                    }
                };
                for ((input, need), gi) in inputs.iter().zip(needs).zip(input_grads) {
                    let Some(gi) = gi.filter(|_| need) else {
                        continue;
                    };
                    let gi = gi.try_cast(input.dtype())?;
                    let total = match grads.remove(&input.node_key()) {
                        Some(acc) => acc.try_add(&gi)?,
                        None => gi,
                    };
                    grads.insert(input.node_key(), total);
                }
            }
            (None, Some(target)) => leaves.push((target, g)),
            (None, None) => {}
        }
    }
    // Accumulate into the leaves' gradient slots.
    for (target, g) in leaves {
        let previous = graph::with_graph(|gr| -> Result<Option<Tensor>> {
            let key = gr.node(target)?.autograd.as_ref().and_then(|a| a.grad);
            key.map(|k| Tensor::retained(gr, k)).transpose()
        })?;
        let total = match previous {
            Some(p) => p.try_add(&g)?,
            None => g,
        };
        graph::with_graph(|gr| gr.set_grad(target, Some(total.node_key())))?;
    }
    // The history is used: forget it, so activations are freed after their last reader.
    graph::with_graph(|g| {
        for step in &steps {
            if step.op.is_some() {
                g.release_history(step.node.node_key())?;
            }
        }
        Ok(())
    })
}
