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
    clip_grad_norm_with(params, max_norm, 2.0)
}

/// [`clip_grad_norm`] with PyTorch's `norm_type`: the global norm is
/// `(Σ |g|^norm_type)^(1 / norm_type)` over every gradient element, or the largest `|g|`
/// for `f64::INFINITY`. `norm_type` must be positive (PyTorch's 0-"norm" is not
/// supported).
///
/// ```
/// use kiln::Tensor;
/// let w = Tensor::from_vec(vec![0.0f32, 0.0], &[2]).requires_grad_(true);
/// (&w * Tensor::from_vec(vec![3.0f32, -4.0], &[2])).sum(..).backward().unwrap();
/// let norm = kiln::optim::clip_grad_norm_with(&[w.clone()], 1.0, f64::INFINITY).unwrap();
/// assert_eq!(norm.item::<f32>().unwrap(), 4.0);
/// let g = w.grad().unwrap().to_vec::<f32>().unwrap();
/// assert!((g[1] + 1.0).abs() < 1e-6);
/// ```
pub fn clip_grad_norm_with(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<Tensor> {
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(crate::error::KilnError::InvalidArgument {
            op: "clip_grad_norm",
            shape: vec![],
            reason: format!("norm_type {norm_type} is not a positive number or infinity"),
        });
    }
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
            let part = if norm_type == 2.0 {
                g.try_mul(&g)?.try_sum(..)?
            } else if norm_type == f64::INFINITY {
                g.try_abs()?.try_max(..)?
            } else if norm_type == 1.0 {
                g.try_abs()?.try_sum(..)?
            } else {
                g.try_abs()?.try_pow(norm_type)?.try_sum(..)?
            };
            total = Some(match total {
                Some(t) if norm_type == f64::INFINITY => t.try_maximum(&part)?,
                Some(t) => t.try_add(&part)?,
                None => part,
            });
        }
        let Some(total) = total else {
            return Tensor::try_full_on((), 0.0, crate::DType::F32, crate::Device::Cpu);
        };
        let norm = if norm_type == 2.0 {
            total.try_sqrt()?
        } else if norm_type == 1.0 || norm_type == f64::INFINITY {
            total
        } else {
            total.try_pow(1.0 / norm_type)?
        };
        let coef = norm.try_add(1e-6)?.try_rdiv(max_norm)?.try_minimum(1.0)?;
        for (p, g) in &grads {
            p.set_grad(Some(&g.try_mul(&coef.try_cast(g.dtype())?)?))?;
        }
        Ok(norm)
    })
}

/// Clamps every gradient of `params` to `[-clip_value, clip_value]` (PyTorch's
/// `clip_grad_value_`), recorded lazily and realized with the optimizer step. NaN stays NaN.
///
/// ```
/// use kiln::Tensor;
/// let w = Tensor::from_vec(vec![0.0f32, 0.0, 0.0], &[3]).requires_grad_(true);
/// (&w * Tensor::from_vec(vec![3.0f32, -0.5, -4.0], &[3])).sum(..).backward().unwrap();
/// kiln::optim::clip_grad_value(&[w.clone()], 1.0).unwrap();
/// assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0, -0.5, -1.0]);
/// ```
pub fn clip_grad_value(params: &[Tensor], clip_value: f64) -> Result<()> {
    if clip_value.is_nan() {
        return Err(crate::error::KilnError::InvalidArgument {
            op: "clip_grad_value",
            shape: vec![],
            reason: "clip_value is NaN".into(),
        });
    }
    no_grad(|| {
        for p in params {
            if let Some(g) = p.grad() {
                p.set_grad(Some(&g.try_clamp(-clip_value, clip_value)?))?;
            }
        }
        Ok(())
    })
}
