//! Gradient clipping.

use crate::autograd::no_grad;
use crate::error::Result;
use crate::tensor::Tensor;

/// Scales the gradients of `params` so their global L2 norm is at most `max_norm`
/// (PyTorch's `clip_grad_norm_`: the factor is `min(1, max_norm / (norm + 1e-6))`), and
/// returns the norm before clipping (a lazy 0-d tensor: f32, or f64 when a gradient is
/// f64; half gradients are squared and summed in f32). The scaling is recorded lazily
/// and realized with the optimizer step.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<Tensor> {
    no_grad(|| {
        let grads: Vec<(Tensor, Tensor)> = params
            .iter()
            .filter_map(|p| p.grad().map(|g| (p.clone(), g)))
            .collect();
        // Squares are summed in f32 (f64 when any gradient is f64): an f16 gradient element
        // past 256, or an f16 sum of squares past 65504, would make the norm infinite and
        // the clip zero every gradient.
        let wide = if grads.iter().any(|(_, g)| g.dtype() == crate::DType::F64) {
            crate::DType::F64
        } else {
            crate::DType::F32
        };
        let mut total: Option<Tensor> = None;
        for (_, g) in &grads {
            let g = g.try_cast(wide)?;
            let sq = g.try_mul(&g)?.try_sum(..)?;
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
