//! Gradient clipping.

use crate::autograd::no_grad;
use crate::error::Result;
use crate::tensor::Tensor;

/// Scales the gradients of `params` so their global L2 norm is at most `max_norm`
/// (PyTorch's `clip_grad_norm_`: the factor is `min(1, max_norm / (norm + 1e-6))`), and
/// returns the norm before clipping (a lazy 0-d tensor). The scaling is recorded lazily
/// and realized with the optimizer step.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<Tensor> {
    no_grad(|| {
        let grads: Vec<(Tensor, Tensor)> = params
            .iter()
            .filter_map(|p| p.grad().map(|g| (p.clone(), g)))
            .collect();
        let mut total: Option<Tensor> = None;
        for (_, g) in &grads {
            let sq = g.try_mul(g)?.try_sum(..)?.try_cast(crate::DType::F32)?;
            total = Some(match total {
                Some(t) => t.try_add(&sq)?,
                None => sq,
            });
        }
        let Some(total) = total else {
            return Tensor::try_full_on((), 0.0, crate::DType::F32, crate::Device::Cpu);
        };
        let norm = total.try_sqrt()?;
        let coef = norm.try_add(1e-6)?.try_rdiv(max_norm)?.try_minimum(1.0)?;
        for (p, g) in &grads {
            p.set_grad(Some(&g.try_mul(&coef.try_cast(g.dtype())?)?))?;
        }
        Ok(norm)
    })
}
