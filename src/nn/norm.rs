//! Normalization layers and distance functions, composed from tensor primitives (means,
//! variances, square roots, `where`, broadcasting): each fuses like any other recorded
//! op, runs on every device, and takes its gradient from its parts.
//!
//! Functional forms (re-exported from [`super::functional`]): [`batch_norm`],
//! [`group_norm`], [`instance_norm`], [`rms_norm`], [`normalize`], [`cosine_similarity`]
//! and [`pairwise_distance`]. Modules: [`BatchNorm1d`], [`BatchNorm2d`], [`BatchNorm3d`]
//! (running statistics kept as buffers, see [`Module::visit_buffers`]), [`GroupNorm`],
//! [`InstanceNorm1d`], [`InstanceNorm2d`], [`InstanceNorm3d`] and [`RmsNorm`].
//!
//! Half inputs (f16, bf16) are normalized in f32 and rounded back once, as
//! [`Tensor::layer_norm`] does.

use super::{Module, init};
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::shape::normalize_axis;
use crate::tensor::{Tensor, realize_all};

// ---------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------

/// `x` as the float dtype it is computed in: f32 for half types, itself otherwise.
/// Integer and bool inputs are refused under `op`'s name.
fn compute_input(op: &'static str, x: &Tensor) -> Result<Tensor> {
    if !x.dtype().is_float() {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: x.dtype(),
            detail: ": normalization needs a float tensor".into(),
        });
    }
    if x.dtype().is_half() {
        x.try_cast(DType::F32)
    } else {
        Ok(x.clone())
    }
}

/// `y`, computed in the wide dtype, rounded back to `dtype` where that is a half type.
fn back_to(dtype: DType, y: Tensor) -> Result<Tensor> {
    if dtype.is_half() {
        y.try_cast(dtype)
    } else {
        Ok(y)
    }
}

/// Checks that `t` (named `name`) holds one value per channel: shape `[channels]`.
fn check_per_channel(
    op: &'static str,
    name: &str,
    t: Option<&Tensor>,
    channels: usize,
    input: &[usize],
) -> Result<()> {
    if let Some(t) = t
        && t.shape() != [channels]
    {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: t.shape().to_vec(),
            rhs: input.to_vec(),
            detail: format!(
                ": {name} must have shape [{channels}], one value per channel (dimension 1 of the input)"
            ),
        });
    }
    Ok(())
}

/// A `[C]` tensor shaped to broadcast along dimension 1 of an `ndim`-dimensional input
/// (`[1, C, 1, ..]`), in the dtype `dtype`.
fn per_channel(t: &Tensor, ndim: usize, dtype: DType) -> Result<Tensor> {
    let mut shape = vec![1isize; ndim];
    shape[1] = t.numel() as isize;
    t.try_cast(dtype)?.try_reshape(shape)
}

/// `y · weight + bias` with per-channel `weight` and `bias` (either may be absent).
fn affine_per_channel(y: Tensor, weight: Option<&Tensor>, bias: Option<&Tensor>) -> Result<Tensor> {
    let (nd, dtype) = (y.ndim(), y.dtype());
    let y = match weight {
        Some(w) => y.try_mul(&per_channel(w, nd, dtype)?)?,
        None => y,
    };
    match bias {
        Some(b) => y.try_add(&per_channel(b, nd, dtype)?),
        None => Ok(y),
    }
}

/// Refuses an input with fewer than two dimensions (`[N, C, *]` is needed).
fn check_batched(op: &'static str, x: &Tensor) -> Result<usize> {
    if x.ndim() < 2 {
        return Err(KilnError::InvalidShape {
            op,
            shape: x.shape().to_vec(),
            requested: vec![-1, -1],
            reason: "expects an input [N, C, *] with at least 2 dimensions".into(),
        });
    }
    Ok(x.shape()[1])
}

/// The `p`-norm of `x` along `dim` (dimension kept), with gradient 0 where the norm is 0
/// (not `0·inf`): [`crate::linalg::vector_norm`] with `p` restricted to values ≥ 0 or
/// `f64::INFINITY` (`p = 0` counts nonzeros) and errors naming `op`.
fn vector_norm_keepdim(op: &'static str, x: &Tensor, p: f64, dim: isize) -> Result<Tensor> {
    if p.is_nan() || p < 0.0 {
        return Err(KilnError::InvalidArgument {
            op,
            shape: x.shape().to_vec(),
            reason: format!("the norm's order p must be at least 0 (or infinity), not {p}"),
        });
    }
    normalize_axis(op, dim, x.shape())?;
    crate::linalg::vector_norm_named(op, x, p, Some(&[dim]), true)
}

/// The two inputs of a binary distance as float tensors of one broadcast shape and one
/// computed dtype, and the dtype to round the result back to.
fn broadcast_pair(op: &'static str, x1: &Tensor, x2: &Tensor) -> Result<(Tensor, Tensor, DType)> {
    for x in [x1, x2] {
        if !x.dtype().is_float() {
            return Err(KilnError::UnsupportedDType {
                op,
                dtype: x.dtype(),
                detail: ": needs float tensors".into(),
            });
        }
    }
    let shape = crate::shape::broadcast_shapes(op, x1.shape(), x2.shape())?;
    let out = DType::promote(x1.dtype(), x2.dtype());
    let wide = if out.is_half() { DType::F32 } else { out };
    let a = x1.try_cast(wide)?.try_broadcast_to(shape.as_slice())?;
    let b = x2.try_cast(wide)?.try_broadcast_to(shape.as_slice())?;
    Ok((a, b, out))
}

// ---------------------------------------------------------------------------------------
// Batch normalization
// ---------------------------------------------------------------------------------------

/// How the running statistics move towards a batch's.
enum Momentum<'a> {
    /// `running = (1 - m)·running + m·batch`.
    Fixed(f64),
    /// The cumulative average: `m = 1 / (count + 1)` with `count` the batches seen before
    /// this one (PyTorch's `momentum=None`).
    Cumulative(&'a Tensor),
}

/// `stat ← (1 - m)·stat + m·batch` in place, outside autograd (`batch` is `[1, C, 1..]`).
fn update_running(stat: &Tensor, batch: &Tensor, momentum: &Momentum<'_>) -> Result<()> {
    no_grad(|| {
        let batch = batch
            .detach()
            .try_reshape([stat.numel() as isize])?
            .try_cast(stat.dtype())?;
        let new = match momentum {
            Momentum::Fixed(m) => stat.try_mul(1.0 - m)?.try_add(&batch.try_mul(*m)?)?,
            Momentum::Cumulative(count) => {
                let m = count.try_cast(stat.dtype())?.try_add(1.0)?.try_recip()?;
                stat.try_add(&batch.try_sub(stat)?.try_mul(&m)?)?
            }
        };
        stat.try_copy_(&new)?;
        Ok(())
    })
}

/// Batch normalization with the running-statistics update left unrealized (the caller
/// realizes it, together with anything else it updated).
#[allow(clippy::too_many_arguments)]
fn batch_norm_impl(
    op: &'static str,
    input: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: &Momentum<'_>,
    eps: f64,
) -> Result<Tensor> {
    let c = check_batched(op, input)?;
    let shape = input.shape();
    check_per_channel(op, "running_mean", running_mean, c, shape)?;
    check_per_channel(op, "running_var", running_var, c, shape)?;
    check_per_channel(op, "weight", weight, c, shape)?;
    check_per_channel(op, "bias", bias, c, shape)?;
    if running_mean.is_some() != running_var.is_some() {
        return Err(KilnError::InvalidArgument {
            op,
            shape: shape.to_vec(),
            reason: "running_mean and running_var must be given together".into(),
        });
    }
    let x = compute_input(op, input)?;
    let nd = x.ndim();
    let (mean, var) = if training {
        let count = input.numel() / c.max(1);
        if count <= 1 {
            return Err(KilnError::InvalidArgument {
                op,
                shape: shape.to_vec(),
                reason: format!(
                    "expected more than 1 value per channel when training, got input of shape {shape:?}"
                ),
            });
        }
        let axes: Vec<isize> = std::iter::once(0).chain(2..nd as isize).collect();
        let (var, mean) = x.try_var_mean(axes.as_slice(), 0, true)?;
        if let (Some(rm), Some(rv)) = (running_mean, running_var) {
            update_running(rm, &mean, momentum)?;
            let unbiased = var.detach().try_mul(count as f64 / (count - 1) as f64)?;
            update_running(rv, &unbiased, momentum)?;
        }
        (mean, var)
    } else {
        let (Some(rm), Some(rv)) = (running_mean, running_var) else {
            return Err(KilnError::InvalidArgument {
                op,
                shape: shape.to_vec(),
                reason: "running_mean and running_var are needed when not training".into(),
            });
        };
        (
            per_channel(rm, nd, x.dtype())?,
            per_channel(rv, nd, x.dtype())?,
        )
    };
    let y = x.try_sub(&mean)?.try_mul(&var.try_add(eps)?.try_rsqrt()?)?;
    back_to(input.dtype(), affine_per_channel(y, weight, bias)?)
}

/// PyTorch's `F.batch_norm`: normalizes each channel (dimension 1 of an `[N, C, *]`
/// input) with a mean and variance, then scales by `weight` and shifts by `bias` (each
/// `[C]`, optional).
///
/// When `training`, the statistics are the batch's: over every dimension but 1, with the
/// biased variance. If `running_mean` and `running_var` are given they are then updated in
/// place, outside autograd, as `running = (1 - momentum)·running + momentum·batch`, where
/// the variance moved into `running_var` is the unbiased one (`n/(n-1)` times the
/// normalizing one, `n` values per channel). The update is recorded like any in-place
/// update: it runs with whatever next realizes the statistics or overwrites a value they
/// read (an optimizer step, in the same plan as the step), and a pending one is realized
/// before the next call records another, so no graph builds up across steps. When not
/// `training`, the running statistics normalize, and are required.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::batch_norm;
/// let x = Tensor::from_vec(vec![1.0f32, 10.0, 3.0, 30.0], [2, 2]);
/// let (mean, var) = (Tensor::zeros([2]), Tensor::ones([2]));
/// let y = batch_norm(&x, Some(&mean), Some(&var), None, None, true, 0.1, 0.0).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![-1.0, -1.0, 1.0, 1.0]);
/// // Batch means 2 and 20; unbiased variances 2 and 200.
/// assert_eq!(mean.to_vec::<f32>().unwrap(), vec![0.2, 2.0]);
/// assert_eq!(var.to_vec::<f32>().unwrap(), vec![1.1, 20.9]);
/// ```
///
/// # Errors
/// [`KilnError::InvalidShape`] for an input with fewer than 2 dimensions;
/// [`KilnError::ShapeMismatch`] when a statistic, `weight` or `bias` is not `[C]`;
/// [`KilnError::InvalidArgument`] when training with one value per channel (PyTorch's
/// "Expected more than 1 value per channel when training"), when only one running
/// statistic is given, or when not training without them;
/// [`KilnError::UnsupportedDType`] for a non-float input.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    input: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    settle(&[running_mean, running_var])?;
    batch_norm_impl(
        "batch_norm",
        input,
        running_mean,
        running_var,
        weight,
        bias,
        training,
        &Momentum::Fixed(momentum),
        eps,
    )
}

/// Realizes running statistics that an earlier training step left pending, so at most
/// one update is ever pending and no graph builds up across steps. In a training loop the
/// optimizer's step has usually realized them already, in its own plan: they read the
/// activations the step's in-place parameter writes overwrite, and a realize runs every
/// such reader with the write (so the forward pass is not computed twice).
fn settle(stats: &[Option<&Tensor>]) -> Result<()> {
    let pending: Vec<&Tensor> = stats
        .iter()
        .flatten()
        .copied()
        .filter(|t| !t.is_realized())
        .collect();
    if pending.is_empty() {
        Ok(())
    } else {
        realize_all(&pending)
    }
}

// ---------------------------------------------------------------------------------------
// Group, instance and RMS normalization
// ---------------------------------------------------------------------------------------

/// PyTorch's `F.group_norm`: splits the `C` channels of an `[N, C, *]` input into
/// `num_groups` groups of consecutive channels and normalizes each (sample, group) with
/// its own mean and biased variance, then applies the per-channel `weight` and `bias`
/// (`[C]`, optional). The same in training and evaluation.
///
/// ```
/// use kiln::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 3.0, 5.0, 7.0], [1, 4]);
/// let y = kiln::nn::functional::group_norm(&x, 2, None, None, 0.0).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![-1.0, 1.0, -1.0, 1.0]);
/// ```
///
/// # Errors
/// [`KilnError::InvalidArgument`] when `num_groups` is 0 or does not divide `C`;
/// [`KilnError::ShapeMismatch`] when `weight` or `bias` is not `[C]`;
/// [`KilnError::InvalidShape`] for fewer than 2 dimensions.
pub fn group_norm(
    input: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "group_norm";
    let c = check_batched(OP, input)?;
    if num_groups == 0 || !c.is_multiple_of(num_groups) {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: input.shape().to_vec(),
            reason: format!("{c} channels do not split into {num_groups} groups"),
        });
    }
    check_per_channel(OP, "weight", weight, c, input.shape())?;
    check_per_channel(OP, "bias", bias, c, input.shape())?;
    let x = compute_input(OP, input)?;
    let n = input.shape()[0];
    let per_group = (c / num_groups) * input.shape()[2..].iter().product::<usize>();
    let grouped = x.try_reshape([n as isize, num_groups as isize, per_group as isize])?;
    let (var, mean) = grouped.try_var_mean(2, 0, true)?;
    let y = grouped
        .try_sub(&mean)?
        .try_mul(&var.try_add(eps)?.try_rsqrt()?)?
        .try_reshape(input.shape())?;
    back_to(input.dtype(), affine_per_channel(y, weight, bias)?)
}

/// PyTorch's `F.instance_norm` with `use_input_stats=True`: normalizes each (sample,
/// channel) of an `[N, C, *]` input over its spatial dimensions with its own mean and
/// biased variance, then applies the per-channel `weight` and `bias` (`[C]`, optional).
///
/// PyTorch's optional `running_mean`/`running_var` (and `momentum`) are left out: kiln's
/// instance normalization always uses the input's statistics and tracks none.
///
/// ```
/// use kiln::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 3.0, 10.0, 20.0], [1, 2, 2]);
/// let y = kiln::nn::functional::instance_norm(&x, None, None, 0.0).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![-1.0, 1.0, -1.0, 1.0]);
/// ```
///
/// # Errors
/// [`KilnError::InvalidArgument`] when each (sample, channel) has only one value (as
/// PyTorch: "Expected more than 1 spatial element"); [`KilnError::ShapeMismatch`] when
/// `weight` or `bias` is not `[C]`; [`KilnError::InvalidShape`] for fewer than 2
/// dimensions.
pub fn instance_norm(
    input: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "instance_norm";
    let c = check_batched(OP, input)?;
    check_per_channel(OP, "weight", weight, c, input.shape())?;
    check_per_channel(OP, "bias", bias, c, input.shape())?;
    let spatial: usize = input.shape()[2..].iter().product();
    if spatial <= 1 {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: input.shape().to_vec(),
            reason: format!(
                "expected more than 1 spatial element per channel, got input of shape {:?}",
                input.shape()
            ),
        });
    }
    let x = compute_input(OP, input)?;
    let axes: Vec<isize> = (2..x.ndim() as isize).collect();
    let (var, mean) = x.try_var_mean(axes.as_slice(), 0, true)?;
    let y = x.try_sub(&mean)?.try_mul(&var.try_add(eps)?.try_rsqrt()?)?;
    back_to(input.dtype(), affine_per_channel(y, weight, bias)?)
}

/// The machine epsilon of a float dtype (PyTorch's `torch.finfo(dtype).eps`).
fn machine_epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f64::from(half::f16::EPSILON),
        DType::BF16 => f64::from(half::bf16::EPSILON),
        DType::F64 => f64::EPSILON,
        _ => f64::from(f32::EPSILON),
    }
}

/// PyTorch's `F.rms_norm` (2.4+): `x / sqrt(mean(x²) + eps) · weight`, the mean over the
/// trailing `normalized_shape` dimensions, `weight` of that shape (optional). `eps: None`
/// is the input dtype's machine epsilon (`torch.finfo(dtype).eps`: `2⁻²³` for f32).
///
/// ```
/// use kiln::Tensor;
/// let x = Tensor::from_vec(vec![3.0f32, 4.0], [1, 2]);
/// let y = kiln::nn::functional::rms_norm(&x, &[2], None, Some(0.0)).unwrap();
/// let r = (12.5f32).sqrt(); // the root of the mean square
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0 / r, 4.0 / r]);
/// ```
///
/// # Errors
/// [`KilnError::ShapeMismatch`] when `normalized_shape` is empty or is not the input's
/// trailing dimensions, or when `weight` does not have that shape;
/// [`KilnError::UnsupportedDType`] for a non-float input.
pub fn rms_norm(
    input: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<Tensor> {
    const OP: &str = "rms_norm";
    let k = normalized_shape.len();
    let nd = input.ndim();
    if k == 0 || k > nd || input.shape()[nd - k..] != *normalized_shape {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: input.shape().to_vec(),
            rhs: normalized_shape.to_vec(),
            detail: ": normalized_shape must equal the trailing dimensions".into(),
        });
    }
    if let Some(w) = weight
        && w.shape() != normalized_shape
    {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: w.shape().to_vec(),
            rhs: normalized_shape.to_vec(),
            detail: ": weight must have the normalized shape".into(),
        });
    }
    let x = compute_input(OP, input)?;
    let eps = eps.unwrap_or_else(|| machine_epsilon(input.dtype()));
    let axes: Vec<isize> = ((nd - k) as isize..nd as isize).collect();
    let y = x.try_mul(
        &x.try_mul(&x)?
            .try_mean_keepdim(axes.as_slice())?
            .try_add(eps)?
            .try_rsqrt()?,
    )?;
    match weight {
        Some(w) => back_to(
            DType::promote(input.dtype(), w.dtype()),
            y.try_mul(&w.try_cast(x.dtype())?)?,
        ),
        None => back_to(input.dtype(), y),
    }
}

// ---------------------------------------------------------------------------------------
// Normalizing vectors and distances
// ---------------------------------------------------------------------------------------

/// PyTorch's `F.normalize`: `x / max(‖x‖_p, eps)` with the `p`-norm taken along `dim`
/// (`p ≥ 0` or `f64::INFINITY`; PyTorch's defaults are `p = 2`, `dim = 1`,
/// `eps = 1e-12`). A zero vector stays zero, with a finite gradient.
///
/// ```
/// use kiln::Tensor;
/// let x = Tensor::from_vec(vec![3.0f32, 4.0, 0.0, 0.0], [2, 2]);
/// let y = kiln::nn::functional::normalize(&x, 2.0, 1, 1e-12).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.6, 0.8, 0.0, 0.0]);
/// ```
///
/// # Errors
/// [`KilnError::InvalidAxis`] for a `dim` outside the input;
/// [`KilnError::InvalidArgument`] for a negative or NaN `p`;
/// [`KilnError::UnsupportedDType`] for a non-float input.
pub fn normalize(input: &Tensor, p: f64, dim: isize, eps: f64) -> Result<Tensor> {
    const OP: &str = "normalize";
    let x = compute_input(OP, input)?;
    let norm = vector_norm_keepdim(OP, &x, p, dim)?;
    back_to(input.dtype(), x.try_div(&norm.try_clamp_min(eps)?)?)
}

/// PyTorch's `F.cosine_similarity`: along `dim` of the inputs' broadcast shape,
/// `x1·x2 / (max(‖x1‖, eps) · max(‖x2‖, eps))` (PyTorch's current formula, which bounds
/// each norm separately; its default `eps` is `1e-8`). `dim` is removed from the result.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 1.0], [2, 2]);
/// let b = Tensor::from_vec(vec![2.0f32, 0.0], [2]); // broadcasts over the rows of `a`
/// let s = kiln::nn::functional::cosine_similarity(&a, &b, 1, 1e-8).unwrap();
/// let v = s.to_vec::<f32>().unwrap();
/// assert!((v[0] - 1.0).abs() < 1e-6 && (v[1] - 0.5f32.sqrt()).abs() < 1e-6);
/// ```
///
/// # Errors
/// [`KilnError::ShapeMismatch`] when the inputs do not broadcast;
/// [`KilnError::InvalidAxis`] for a `dim` outside the broadcast shape;
/// [`KilnError::UnsupportedDType`] for a non-float input.
pub fn cosine_similarity(x1: &Tensor, x2: &Tensor, dim: isize, eps: f64) -> Result<Tensor> {
    const OP: &str = "cosine_similarity";
    let (a, b, out) = broadcast_pair(OP, x1, x2)?;
    let na = vector_norm_keepdim(OP, &a, 2.0, dim)?.try_clamp_min(eps)?;
    let nb = vector_norm_keepdim(OP, &b, 2.0, dim)?.try_clamp_min(eps)?;
    let s = a.try_div(&na)?.try_mul(&b.try_div(&nb)?)?.try_sum(dim)?;
    back_to(out, s)
}

/// PyTorch's `F.pairwise_distance`: `‖x1 - x2 + eps‖_p` over the last dimension of the
/// inputs' broadcast shape (PyTorch's defaults: `p = 2`, `eps = 1e-6`,
/// `keepdim = false`); `p ≥ 0` or `f64::INFINITY`.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![0.0f32, 0.0, 3.0, 4.0], [2, 2]);
/// let b = Tensor::from_vec(vec![0.0f32, 0.0], [2]);
/// let d = kiln::nn::functional::pairwise_distance(&a, &b, 2.0, 0.0, false).unwrap();
/// assert_eq!(d.to_vec::<f32>().unwrap(), vec![0.0, 5.0]);
/// ```
///
/// # Errors
/// [`KilnError::ShapeMismatch`] when the inputs do not broadcast;
/// [`KilnError::InvalidAxis`] when both are 0-d;
/// [`KilnError::InvalidArgument`] for a negative or NaN `p`;
/// [`KilnError::UnsupportedDType`] for a non-float input.
pub fn pairwise_distance(
    x1: &Tensor,
    x2: &Tensor,
    p: f64,
    eps: f64,
    keepdim: bool,
) -> Result<Tensor> {
    const OP: &str = "pairwise_distance";
    let (a, b, out) = broadcast_pair(OP, x1, x2)?;
    let d = vector_norm_keepdim(OP, &a.try_sub(&b)?.try_add(eps)?, p, -1)?;
    let d = if keepdim { d } else { d.try_squeeze_dim(-1)? };
    back_to(out, d)
}

// ---------------------------------------------------------------------------------------
// Modules
// ---------------------------------------------------------------------------------------

/// A realized buffer: not a parameter, never requires grad.
fn buffer(t: Tensor) -> Result<Tensor> {
    t.realize()?;
    Ok(t)
}

/// Batch normalization over the channels (dimension 1) of `N`-d spatial inputs: PyTorch's
/// `nn.BatchNorm1d` (`[N, C]` or `[N, C, L]`), `nn.BatchNorm2d` (`[N, C, H, W]`) and
/// `nn.BatchNorm3d` (`[N, C, D, H, W]`), as [`BatchNorm1d`], [`BatchNorm2d`] and
/// [`BatchNorm3d`].
///
/// Parameters `weight` (ones) and `bias` (zeros), each `[C]`, with `affine`. With
/// `track_running_stats` three buffers ([`Module::visit_buffers`]; saved in checkpoints,
/// moved by [`Module::to_device`], not among the parameters): `running_mean` (zeros),
/// `running_var` (ones) and `num_batches_tracked` (a 0-d i64 counter). In training each
/// forward normalizes with the batch's statistics, counts the batch and moves the running
/// statistics towards it (see [`batch_norm`]; `momentum: None` is the cumulative average
/// over every batch counted); in evaluation the running statistics normalize. Without
/// `track_running_stats` the batch's statistics normalize in both modes.
///
/// ```
/// use kiln::nn::{BatchNorm2d, Module};
/// use kiln::Tensor;
/// let mut bn = BatchNorm2d::new(3).unwrap();
/// let names: Vec<String> = bn.named_buffers().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["running_mean", "running_var", "num_batches_tracked"]);
/// assert_eq!(bn.parameters().len(), 2); // weight and bias: the buffers are not parameters
/// let x = Tensor::randn_seeded(&[4, 3, 5, 5], 0);
/// let y = bn.forward(&x).unwrap(); // training: batch statistics
/// assert_eq!(y.shape(), &[4, 3, 5, 5]);
/// assert_eq!(bn.num_batches_tracked.as_ref().unwrap().item::<i64>().unwrap(), 1);
/// bn.set_training(false); // evaluation: running statistics
/// let _ = bn.forward(&x).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct BatchNorm<const N: usize> {
    /// The number of channels `C`.
    pub num_features: usize,
    /// Added to the variance before its square root.
    pub eps: f64,
    /// How far each training batch moves the running statistics; `None` is the
    /// cumulative average.
    pub momentum: Option<f64>,
    /// The learned scale, `[C]` (`None` without `affine`).
    pub weight: Option<Tensor>,
    /// The learned shift, `[C]` (`None` without `affine`).
    pub bias: Option<Tensor>,
    /// The running mean, `[C]` (`None` without `track_running_stats`).
    pub running_mean: Option<Tensor>,
    /// The running (unbiased) variance, `[C]` (`None` without `track_running_stats`).
    pub running_var: Option<Tensor>,
    /// Training batches seen, a 0-d i64 tensor (`None` without `track_running_stats`).
    pub num_batches_tracked: Option<Tensor>,
    training: bool,
}

/// [`BatchNorm`] over `[N, C]` or `[N, C, L]`: PyTorch's `nn.BatchNorm1d`.
pub type BatchNorm1d = BatchNorm<1>;
/// [`BatchNorm`] over `[N, C, H, W]`: PyTorch's `nn.BatchNorm2d`.
pub type BatchNorm2d = BatchNorm<2>;
/// [`BatchNorm`] over `[N, C, D, H, W]`: PyTorch's `nn.BatchNorm3d`.
pub type BatchNorm3d = BatchNorm<3>;

impl<const N: usize> BatchNorm<N> {
    const NAME: &'static str = match N {
        1 => "BatchNorm1d",
        2 => "BatchNorm2d",
        _ => "BatchNorm3d",
    };

    /// PyTorch's defaults: `eps = 1e-5`, `momentum = 0.1`, `affine`, `track_running_stats`;
    /// in training mode.
    pub fn new(num_features: usize) -> Result<Self> {
        Self::with_options(num_features, 1e-5, Some(0.1), true, true)
    }

    /// PyTorch's `nn.BatchNormNd(num_features, eps, momentum, affine,
    /// track_running_stats)` (`momentum: None` for the cumulative average).
    pub fn with_options(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
        track_running_stats: bool,
    ) -> Result<Self> {
        let c = [num_features];
        let param = |v: f64| -> Result<Option<Tensor>> {
            if affine {
                init::constant(&c, v).map(Some)
            } else {
                Ok(None)
            }
        };
        let (running_mean, running_var, num_batches_tracked) = if track_running_stats {
            (
                Some(buffer(Tensor::try_zeros(c)?)?),
                Some(buffer(Tensor::try_ones(c)?)?),
                Some(buffer(Tensor::scalar(0i64))?),
            )
        } else {
            (None, None, None)
        };
        Ok(BatchNorm {
            num_features,
            eps,
            momentum,
            weight: param(1.0)?,
            bias: param(0.0)?,
            running_mean,
            running_var,
            num_batches_tracked,
            training: true,
        })
    }

    /// Whether the module is in training mode ([`Module::set_training`]).
    pub fn is_training(&self) -> bool {
        self.training
    }
}

impl<const N: usize> Module for BatchNorm<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let ranks: &[usize] = if N == 1 { &[2, 3] } else { &[N + 2] };
        if !ranks.contains(&x.ndim()) {
            return Err(KilnError::InvalidShape {
                op: Self::NAME,
                shape: x.shape().to_vec(),
                requested: vec![-1; N + 2],
                reason: format!(
                    "expects a {}-d input, got {}-d",
                    ranks[ranks.len() - 1],
                    x.ndim()
                ) + if N == 1 { " (or a 2-d one)" } else { "" },
            });
        }
        // PyTorch: the batch's statistics in training and wherever no running ones are
        // kept; the running ones are updated only in training.
        let stats_update = self.training;
        let use_batch = self.training || self.running_mean.is_none();
        let count = self.num_batches_tracked.as_ref();
        let momentum = match (self.momentum, count) {
            (None, Some(n)) => Momentum::Cumulative(n),
            (m, _) => Momentum::Fixed(m.unwrap_or(0.0)),
        };
        let (rm, rv) = if stats_update || !use_batch {
            (self.running_mean.as_ref(), self.running_var.as_ref())
        } else {
            (None, None)
        };
        settle(&[rm, rv, count])?;
        let y = batch_norm_impl(
            Self::NAME,
            x,
            rm,
            rv,
            self.weight.as_ref(),
            self.bias.as_ref(),
            use_batch,
            &momentum,
            self.eps,
        )?;
        if self.training
            && let (Some(_), Some(_), Some(n)) = (rm, rv, count)
        {
            no_grad(|| n.try_add_(1i64).map(|_| ()))?;
        }
        Ok(y)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        super::visit_affine(self.weight.as_ref(), self.bias.as_ref(), f);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        super::visit_affine_mut(self.weight.as_mut(), self.bias.as_mut(), f);
    }

    fn visit_buffers(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        if let Some(t) = &self.running_mean {
            f("running_mean", t);
        }
        if let Some(t) = &self.running_var {
            f("running_var", t);
        }
        if let Some(t) = &self.num_batches_tracked {
            f("num_batches_tracked", t);
        }
    }

    fn visit_buffers_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        if let Some(t) = &mut self.running_mean {
            f("running_mean", t);
        }
        if let Some(t) = &mut self.running_var {
            f("running_var", t);
        }
        if let Some(t) = &mut self.num_batches_tracked {
            f("num_batches_tracked", t);
        }
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// PyTorch's `nn.GroupNorm(num_groups, num_channels, eps=1e-5, affine=True)`: see
/// [`group_norm`]. The same in training and evaluation.
///
/// ```
/// use kiln::nn::{GroupNorm, Module};
/// let gn = GroupNorm::new(2, 4).unwrap();
/// let y = gn.forward(&kiln::Tensor::randn_seeded(&[3, 4, 5], 1)).unwrap();
/// assert_eq!(y.shape(), &[3, 4, 5]);
/// assert!(GroupNorm::new(3, 4).is_err()); // 3 does not divide 4
/// ```
#[derive(Debug, Clone)]
pub struct GroupNorm {
    /// Number of groups the channels split into.
    pub num_groups: usize,
    /// Number of channels `C`.
    pub num_channels: usize,
    /// Added to the variance before its square root.
    pub eps: f64,
    /// The learned per-channel scale, `[C]` (`None` without `affine`).
    pub weight: Option<Tensor>,
    /// The learned per-channel shift, `[C]` (`None` without `affine`).
    pub bias: Option<Tensor>,
}

impl GroupNorm {
    /// `eps = 1e-5`, with a learned scale (ones) and shift (zeros).
    pub fn new(num_groups: usize, num_channels: usize) -> Result<GroupNorm> {
        GroupNorm::with_options(num_groups, num_channels, 1e-5, true)
    }

    /// PyTorch's `nn.GroupNorm(num_groups, num_channels, eps, affine)`; refuses a
    /// `num_groups` that is 0 or does not divide `num_channels`.
    pub fn with_options(
        num_groups: usize,
        num_channels: usize,
        eps: f64,
        affine: bool,
    ) -> Result<GroupNorm> {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(KilnError::InvalidArgument {
                op: "GroupNorm",
                shape: vec![num_channels],
                reason: format!("{num_channels} channels do not split into {num_groups} groups"),
            });
        }
        let param = |v: f64| -> Result<Option<Tensor>> {
            if affine {
                init::constant(&[num_channels], v).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(GroupNorm {
            num_groups,
            num_channels,
            eps,
            weight: param(1.0)?,
            bias: param(0.0)?,
        })
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.ndim() >= 2 && x.shape()[1] != self.num_channels {
            return Err(KilnError::ShapeMismatch {
                op: "GroupNorm",
                lhs: x.shape().to_vec(),
                rhs: vec![self.num_channels],
                detail: format!(": expects {} channels in dimension 1", self.num_channels),
            });
        }
        group_norm(
            x,
            self.num_groups,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        super::visit_affine(self.weight.as_ref(), self.bias.as_ref(), f);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        super::visit_affine_mut(self.weight.as_mut(), self.bias.as_mut(), f);
    }

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// Instance normalization of `N`-d spatial inputs: PyTorch's `nn.InstanceNorm1d`
/// (`[N, C, L]` or unbatched `[C, L]`), `nn.InstanceNorm2d` and `nn.InstanceNorm3d`, as
/// [`InstanceNorm1d`], [`InstanceNorm2d`] and [`InstanceNorm3d`]; see [`instance_norm`].
///
/// PyTorch's defaults: `eps = 1e-5`, `affine = false`, `track_running_stats = false`.
/// Only `track_running_stats = false` is supported (the input's own statistics in
/// training and evaluation alike); asking for running statistics is refused.
///
/// ```
/// use kiln::nn::{InstanceNorm1d, Module};
/// let norm = InstanceNorm1d::new(2).unwrap();
/// let x = kiln::Tensor::from_vec(vec![1.0f32, 3.0, 10.0, 20.0], [2, 2]); // unbatched [C, L]
/// let y = norm.forward(&x).unwrap().to_vec::<f32>().unwrap();
/// assert!(y.iter().zip([-1.0f32, 1.0, -1.0, 1.0]).all(|(a, b)| (a - b).abs() < 1e-4));
/// ```
#[derive(Debug, Clone)]
pub struct InstanceNorm<const N: usize> {
    /// Number of channels `C`.
    pub num_features: usize,
    /// Added to the variance before its square root.
    pub eps: f64,
    /// The learned per-channel scale, `[C]` (with `affine` only).
    pub weight: Option<Tensor>,
    /// The learned per-channel shift, `[C]` (with `affine` only).
    pub bias: Option<Tensor>,
}

/// [`InstanceNorm`] over `[N, C, L]` (or `[C, L]`): PyTorch's `nn.InstanceNorm1d`.
pub type InstanceNorm1d = InstanceNorm<1>;
/// [`InstanceNorm`] over `[N, C, H, W]` (or `[C, H, W]`): PyTorch's `nn.InstanceNorm2d`.
pub type InstanceNorm2d = InstanceNorm<2>;
/// [`InstanceNorm`] over `[N, C, D, H, W]` (or `[C, D, H, W]`): PyTorch's
/// `nn.InstanceNorm3d`.
pub type InstanceNorm3d = InstanceNorm<3>;

impl<const N: usize> InstanceNorm<N> {
    const NAME: &'static str = match N {
        1 => "InstanceNorm1d",
        2 => "InstanceNorm2d",
        _ => "InstanceNorm3d",
    };

    /// PyTorch's defaults: `eps = 1e-5`, no affine parameters, no running statistics.
    pub fn new(num_features: usize) -> Result<Self> {
        Self::with_options(num_features, 1e-5, false, false)
    }

    /// PyTorch's `nn.InstanceNormNd(num_features, eps, affine=…, track_running_stats=…)`
    /// (its `momentum` only matters to running statistics, which kiln does not keep here).
    ///
    /// # Errors
    /// [`KilnError::InvalidArgument`] for `track_running_stats = true`.
    pub fn with_options(
        num_features: usize,
        eps: f64,
        affine: bool,
        track_running_stats: bool,
    ) -> Result<Self> {
        if track_running_stats {
            return Err(KilnError::InvalidArgument {
                op: Self::NAME,
                shape: vec![num_features],
                reason: "track_running_stats = true is not supported; instance normalization here always uses the input's statistics".into(),
            });
        }
        let param = |v: f64| -> Result<Option<Tensor>> {
            if affine {
                init::constant(&[num_features], v).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(InstanceNorm {
            num_features,
            eps,
            weight: param(1.0)?,
            bias: param(0.0)?,
        })
    }
}

impl<const N: usize> Module for InstanceNorm<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let norm =
            |x: &Tensor| instance_norm(x, self.weight.as_ref(), self.bias.as_ref(), self.eps);
        if x.ndim() == N + 2 {
            norm(x)
        } else if x.ndim() == N + 1 {
            norm(&x.try_unsqueeze(0)?)?.try_squeeze_dim(0)
        } else {
            Err(KilnError::InvalidShape {
                op: Self::NAME,
                shape: x.shape().to_vec(),
                requested: vec![-1; N + 2],
                reason: format!(
                    "expects a {}-d (or unbatched {}-d) input, got {}-d",
                    N + 2,
                    N + 1,
                    x.ndim()
                ),
            })
        }
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        super::visit_affine(self.weight.as_ref(), self.bias.as_ref(), f);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        super::visit_affine_mut(self.weight.as_mut(), self.bias.as_mut(), f);
    }

    /// No mode: without running statistics, the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// PyTorch's `nn.RMSNorm(normalized_shape, eps=None, elementwise_affine=True)`: see
/// [`rms_norm`] (`eps: None` is the input dtype's machine epsilon).
///
/// ```
/// use kiln::nn::{Module, RmsNorm};
/// let norm = RmsNorm::new(&[4]).unwrap();
/// assert_eq!(norm.parameters()[0].to_vec::<f32>().unwrap(), vec![1.0; 4]);
/// let y = norm.forward(&kiln::Tensor::ones(&[2, 4])).unwrap();
/// assert!(y.to_vec::<f32>().unwrap().iter().all(|v| (v - 1.0).abs() < 1e-6));
/// ```
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// The trailing dimensions the mean square is taken over.
    pub normalized_shape: Vec<usize>,
    /// Added to the mean square; `None` is the input dtype's machine epsilon.
    pub eps: Option<f64>,
    /// The learned scale, shape `normalized_shape` (`None` without
    /// `elementwise_affine`).
    pub weight: Option<Tensor>,
}

impl RmsNorm {
    /// `eps: None`, with a learned scale (ones).
    pub fn new(normalized_shape: &[usize]) -> Result<RmsNorm> {
        RmsNorm::with_options(normalized_shape, None, true)
    }

    /// PyTorch's `nn.RMSNorm(normalized_shape, eps, elementwise_affine)`.
    pub fn with_options(
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
    ) -> Result<RmsNorm> {
        Ok(RmsNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps,
            weight: if elementwise_affine {
                Some(init::constant(normalized_shape, 1.0)?)
            } else {
                None
            },
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        rms_norm(x, &self.normalized_shape, self.weight.as_ref(), self.eps)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        if let Some(w) = &self.weight {
            f("weight", w);
        }
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        if let Some(w) = &mut self.weight {
            f("weight", w);
        }
    }

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}
