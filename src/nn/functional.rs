//! Functional forms of layers (convolution and pooling, normalization and distances,
//! padding modes and resampling among them, and the activations PyTorch has as `F.name`),
//! and the losses
//! ([`super::loss`], re-exported here as PyTorch's `torch.nn.functional` has them).

pub use super::attention::scaled_dot_product_attention;
pub use super::conv::{
    ConvPadding, Spatial, adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_max_pool1d,
    adaptive_max_pool1d_with_indices, adaptive_max_pool2d, adaptive_max_pool2d_with_indices,
    avg_pool1d, avg_pool2d, avg_pool3d, conv_transpose1d, conv_transpose2d, conv_transpose3d,
    conv1d, conv2d, conv3d, max_pool1d, max_pool1d_with_indices, max_pool2d,
    max_pool2d_with_indices, max_pool3d, max_pool3d_with_indices, max_unpool1d, max_unpool2d,
    max_unpool3d,
};
pub use super::embedding_bag::{EmbeddingBagMode, embedding_bag};
pub use super::fractional_pool::{
    fractional_max_pool2d, fractional_max_pool2d_with_indices, fractional_max_pool2d_with_samples,
    fractional_max_pool3d, fractional_max_pool3d_with_indices, fractional_max_pool3d_with_samples,
};
pub use super::loss::*;
pub use super::norm::{
    batch_norm, cosine_similarity, group_norm, instance_norm, normalize, pairwise_distance,
    rms_norm,
};
pub use super::padding::{PadMode, pad};
pub use super::sampling::{
    GridSampleMode, GridSamplePadding, affine_grid, fold, grid_sample, unfold,
};
pub use super::upsample::{InterpolationMode, interpolate, pixel_shuffle, pixel_unshuffle};

use crate::autograd::composite;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// Softmax along `dim` ([`Tensor::softmax`]) with one backward rule, `dx = y·(g - Σ g·y)`:
/// a single row kernel, where the derivative of each forward step would also carry the
/// max's (zero) gradient and a second reduction.
pub fn softmax(x: &Tensor, dim: isize) -> Result<Tensor> {
    composite(
        &[x],
        || x.try_softmax(dim),
        move |_, y, g| {
            let gy = g.try_mul(y)?;
            Ok(vec![Some(
                gy.try_sub(&y.try_mul(&gy.try_sum_keepdim(dim)?)?)?,
            )])
        },
    )
}

/// Log-softmax along `dim` ([`Tensor::log_softmax`]) with one backward rule,
/// `dx = g - exp(y)·Σ g`: a single row kernel.
pub fn log_softmax(x: &Tensor, dim: isize) -> Result<Tensor> {
    composite(
        &[x],
        || x.try_log_softmax(dim),
        move |_, y, g| {
            Ok(vec![Some(g.try_sub(
                &y.try_exp()?.try_mul(&g.try_sum_keepdim(dim)?)?,
            )?)])
        },
    )
}

/// Layer normalization ([`Tensor::layer_norm`]) with one backward rule (PyTorch's
/// formulas): with `x̂` the normalized input and `ĝ = g·w`,
/// `dx = (ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) / sqrt(var + eps)`, `dw = Σ g·x̂` and `db = Σ g` over
/// the leading dimensions. The backward kernels recompute the row statistics from `x`
/// (stored once, `[.., 1]`) instead of the forward kernel storing more than its result.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let mut inputs = vec![x];
    inputs.extend(weight);
    inputs.extend(bias);
    let (has_w, has_b) = (weight.is_some(), bias.is_some());
    let k = normalized_shape.len();
    let nd = x.ndim();
    // Only used by the rule, which exists once the forward validated the shapes.
    let lead: Vec<isize> = (0..nd.saturating_sub(k) as isize).collect();
    let stat_axes: Vec<isize> = (nd.saturating_sub(k) as isize..nd as isize).collect();
    let n = normalized_shape.iter().product::<usize>() as f64;
    let rule = move |inputs: &[Tensor], _: &Tensor, g: &Tensor| -> Result<Vec<Option<Tensor>>> {
        let x = &inputs[0];
        let sum_lead = |t: Tensor| -> Result<Tensor> {
            if lead.is_empty() {
                Ok(t)
            } else {
                t.try_sum(lead.as_slice())
            }
        };
        // The row statistics are stored (`contiguous`: a copy root) and `x̂` is recorded
        // once per kernel that reads it (`dx`, `dw`), so each computes it from `x` instead
        // of reading it stored at the input's full size.
        let mean = x
            .try_sum_keepdim(&stat_axes)?
            .try_mul(1.0 / n)?
            .try_contiguous()?;
        let centered = x.try_sub(&mean)?;
        let inv_std = centered
            .try_mul(&centered)?
            .try_sum_keepdim(&stat_axes)?
            .try_mul(1.0 / n)?
            .try_add(eps)?
            .try_sqrt()?
            .try_recip()?
            .try_contiguous()?;
        let xhat = || x.try_sub(&mean)?.try_mul(&inv_std);
        let gw = if has_w {
            g.try_mul(&inputs[1])?
        } else {
            g.clone()
        };
        let mean_gw = gw.try_sum_keepdim(&stat_axes)?.try_mul(1.0 / n)?;
        let xhat_dx = xhat()?;
        let mean_gwx = gw
            .try_mul(&xhat_dx)?
            .try_sum_keepdim(&stat_axes)?
            .try_mul(1.0 / n)?;
        let dx = gw
            .try_sub(&mean_gw)?
            .try_sub(&xhat_dx.try_mul(&mean_gwx)?)?
            .try_mul(&inv_std)?;
        let mut grads = vec![Some(dx)];
        if has_w {
            grads.push(Some(sum_lead(g.try_mul(&xhat()?)?)?));
        }
        if has_b {
            grads.push(Some(sum_lead(g.clone())?));
        }
        Ok(grads)
    };
    composite(
        &inputs,
        || x.try_layer_norm(normalized_shape, weight, bias, eps),
        rule,
    )
}

/// Dropout: zeroes each element with probability `p` (`x · 0`: NaN for an infinite or NaN
/// `x`, as PyTorch) and scales the rest by `1/(1-p)`
/// when `training`, is the identity otherwise. `seed` picks the mask (a run-time
/// parameter: a new seed every step does not re-plan).
pub fn dropout(x: &Tensor, p: f64, training: bool, seed: u64) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(KilnError::InvalidArgument {
            op: "dropout",
            shape: x.shape().to_vec(),
            reason: format!("the probability {p} is not in [0, 1]"),
        });
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    if p == 1.0 {
        return x.try_mul(0.0);
    }
    let keep = Tensor::try_rand(x.shape(), seed, DType::F32)?
        .try_to(x.device())?
        .try_ge(p)?;
    // A dropped element is `x · 0`, not 0: an inf or NaN input stays NaN, as PyTorch's
    // `x · mask · scale` gives (a zero would hide a NaN from a debugging user).
    Tensor::try_where(&keep, &x.try_mul(1.0 / (1.0 - p))?, &x.try_mul(0.0)?)
}

/// Rows of `weight` (`[vocabulary, dim]`) by integer `ids` ([`Tensor::embedding`]), with
/// PyTorch's `padding_idx` (negative counts from the end): positions holding that id get
/// the row's value but pass no gradient to it, so the padding row never learns
/// (`F.embedding(ids, w, padding_idx)`).
///
/// ```
/// use kiln::Tensor;
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).requires_grad_(true);
/// let ids = Tensor::from_vec(vec![0i64, 1, 1], &[3]);
/// let y = kiln::nn::functional::embedding(&ids, &w, Some(-1)).unwrap();
/// y.sum(..).backward().unwrap();
/// assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0, 0.0, 0.0]);
/// ```
pub fn embedding(ids: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Result<Tensor> {
    let out = Tensor::try_embedding(ids, weight)?;
    let Some(p) = padding_idx else {
        return Ok(out);
    };
    let count = weight.shape().first().copied().unwrap_or(0);
    let p = padding_index("embedding", p, count, weight.shape())?;
    if crate::graph::grad_enabled() && weight.requires_grad() {
        let keep = ids.try_ne(p as i64)?.try_unsqueeze(-1)?;
        Tensor::try_where(&keep, &out, out.detach())
    } else {
        Ok(out)
    }
}

/// PyTorch's `padding_idx` in `0..count`, from `-count..count`.
pub(crate) fn padding_index(
    op: &'static str,
    padding_idx: i64,
    count: usize,
    shape: &[usize],
) -> Result<usize> {
    let p = if padding_idx < 0 {
        padding_idx.saturating_add(count as i64)
    } else {
        padding_idx
    };
    if p < 0 || p >= count as i64 {
        return Err(crate::error::KilnError::InvalidArgument {
            op,
            shape: shape.to_vec(),
            reason: format!("padding_idx {padding_idx} is not within {count} embeddings"),
        });
    }
    Ok(p as usize)
}

/// `x @ weightᵀ + bias` (PyTorch's `linear`: `weight` is `[out, in]`). Leading
/// dimensions of `x` fold into one matrix dimension (a view), so the product — and its
/// gradients — are single matrix products rather than a batch of small ones.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if x.ndim() > 2 && weight.ndim() == 2 {
        let lead = &x.shape()[..x.ndim() - 1];
        let features = x.shape()[x.ndim() - 1] as isize;
        let flat = x.try_reshape([-1, features])?;
        let y = linear(&flat, weight, bias)?;
        let mut shape: Vec<isize> = lead.iter().map(|&d| d as isize).collect();
        shape.push(weight.shape()[0] as isize);
        return y.try_reshape(&shape);
    }
    let y = x.try_matmul(&weight.try_transpose(-2, -1)?)?;
    match bias {
        Some(b) => y.try_add(b),
        None => Ok(y),
    }
}

// Activations: PyTorch's `F.name` forms of the tensor methods (`src/tensor/activation.rs`),
// taking PyTorch's arguments in PyTorch's order.

/// `F.leaky_relu(x, negative_slope)`: [`Tensor::leaky_relu`] (PyTorch's default slope is
/// 0.01).
pub fn leaky_relu(x: &Tensor, negative_slope: f64) -> Result<Tensor> {
    x.try_leaky_relu(negative_slope)
}

/// `F.elu(x, alpha)`: [`Tensor::elu`] (PyTorch's default `alpha` is 1).
pub fn elu(x: &Tensor, alpha: f64) -> Result<Tensor> {
    x.try_elu(alpha)
}

/// `F.selu(x)`: [`Tensor::selu`].
pub fn selu(x: &Tensor) -> Result<Tensor> {
    x.try_selu()
}

/// `F.celu(x, alpha)`: [`Tensor::celu`] (PyTorch's default `alpha` is 1).
pub fn celu(x: &Tensor, alpha: f64) -> Result<Tensor> {
    x.try_celu(alpha)
}

/// `F.hardtanh(x, min_val, max_val)`: [`Tensor::hardtanh`] (PyTorch's defaults -1, 1).
pub fn hardtanh(x: &Tensor, min_val: f64, max_val: f64) -> Result<Tensor> {
    x.try_hardtanh(min_val, max_val)
}

/// `F.relu6(x)`: [`Tensor::relu6`].
pub fn relu6(x: &Tensor) -> Result<Tensor> {
    x.try_relu6()
}

/// `F.hardsigmoid(x)`: [`Tensor::hardsigmoid`].
pub fn hardsigmoid(x: &Tensor) -> Result<Tensor> {
    x.try_hardsigmoid()
}

/// `F.hardswish(x)`: [`Tensor::hardswish`].
pub fn hardswish(x: &Tensor) -> Result<Tensor> {
    x.try_hardswish()
}

/// `F.mish(x)`: [`Tensor::mish`].
pub fn mish(x: &Tensor) -> Result<Tensor> {
    x.try_mish()
}

/// `F.logsigmoid(x)`: [`Tensor::log_sigmoid`].
pub fn logsigmoid(x: &Tensor) -> Result<Tensor> {
    x.try_log_sigmoid()
}

/// `F.softsign(x)`: [`Tensor::softsign`].
pub fn softsign(x: &Tensor) -> Result<Tensor> {
    x.try_softsign()
}

/// `F.softplus(x, beta, threshold)`: [`Tensor::softplus_with`] (PyTorch's defaults,
/// `beta = 1` and `threshold = 20`, are [`Tensor::softplus`]).
///
/// ```
/// use kiln::nn::functional::softplus;
/// let x = kiln::Tensor::from_vec(vec![-1.0f32, 30.0], [2]);
/// assert_eq!(
///     softplus(&x, 1.0, 20.0).unwrap().to_vec::<f32>().unwrap(),
///     x.softplus().to_vec::<f32>().unwrap()
/// );
/// ```
pub fn softplus(x: &Tensor, beta: f64, threshold: f64) -> Result<Tensor> {
    x.try_softplus_with(beta, threshold)
}

/// `F.glu(x, dim)`: [`Tensor::glu`] (PyTorch's default `dim` is -1).
pub fn glu(x: &Tensor, dim: isize) -> Result<Tensor> {
    x.try_glu(dim)
}

/// `F.prelu(x, weight)`: [`Tensor::prelu`].
pub fn prelu(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    x.try_prelu(weight)
}

/// `F.threshold(x, threshold, value)`: [`Tensor::threshold`].
pub fn threshold(x: &Tensor, threshold: f64, value: f64) -> Result<Tensor> {
    x.try_threshold(threshold, value)
}

/// `F.tanhshrink(x)`: [`Tensor::tanhshrink`].
pub fn tanhshrink(x: &Tensor) -> Result<Tensor> {
    x.try_tanhshrink()
}

/// `F.softshrink(x, lambd)`: [`Tensor::softshrink`] (PyTorch's default `lambd` is 0.5).
pub fn softshrink(x: &Tensor, lambd: f64) -> Result<Tensor> {
    x.try_softshrink(lambd)
}

/// `F.hardshrink(x, lambd)`: [`Tensor::hardshrink`] (PyTorch's default `lambd` is 0.5).
pub fn hardshrink(x: &Tensor, lambd: f64) -> Result<Tensor> {
    x.try_hardshrink(lambd)
}
