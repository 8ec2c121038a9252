//! Losses and functional forms of layers.

use crate::autograd::composite;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// How a loss reduces its per-element values, PyTorch's `reduction=` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The mean over the elements (for [`cross_entropy_with`]: over the targets that are
    /// not ignored), PyTorch's `'mean'`, the default.
    #[default]
    Mean,
    /// The sum, PyTorch's `'sum'`.
    Sum,
    /// No reduction: one loss per element (per target), PyTorch's `'none'`.
    None,
}

/// The options of [`cross_entropy_with`]; the default is PyTorch's
/// (`ignore_index=-100`, `reduction='mean'`, `label_smoothing=0.0`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyOptions {
    /// Targets equal to this class are skipped: they add nothing to the loss or the
    /// gradient and the mean does not count them (a padding token). `None` skips none.
    pub ignore_index: Option<i64>,
    /// How the per-target losses reduce.
    pub reduction: Reduction,
    /// `ε` in `[0, 1]`: the target distribution is `(1 - ε)·one_hot + ε / C`.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            ignore_index: Some(-100),
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

/// Cross entropy of `logits` (`[..., C]`) against integer class `targets` (`[...]`),
/// averaged over the targets — PyTorch's `cross_entropy` with its defaults: targets of
/// -100 are skipped (`ignore_index=-100`) and the mean is over the others
/// (`reduction='mean'`). [`cross_entropy_with`] takes the options.
///
/// ```
/// use kiln::Tensor;
/// let logits = Tensor::from_vec(vec![0.0f32, 0.0, 0.0, 0.0], &[2, 2]);
/// let t = Tensor::from_vec(vec![0i64, 1], &[2]);
/// let l = kiln::nn::functional::cross_entropy(&logits, &t).unwrap();
/// assert!((l.item::<f32>().unwrap() - 2f32.ln()).abs() < 1e-6);
/// ```
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    cross_entropy_with(logits, targets, &CrossEntropyOptions::default())
}

/// Cross entropy with PyTorch's `ignore_index`, `reduction` and `label_smoothing`
/// ([`CrossEntropyOptions`]); classes are on the **last** dimension of `logits`.
///
/// Per target `t` that is not ignored the loss is
/// `logsumexp(x) - (1 - ε)·x[t] - ε·mean(x)`; an ignored target's is 0. The mean divides
/// by the number of targets not ignored (`NaN` when every target is ignored, as in
/// PyTorch). Forward: one fused row kernel (`logsumexp` and the gathered logit), then the
/// reduction. Backward: one elementwise kernel,
/// `(exp(x - lse) - (1 - ε)·one_hot(t) - ε / C) · g'` with `g'` the incoming gradient
/// scaled for the reduction and zero on ignored rows, from the `lse` the forward kept (a
/// custom rule, not the derivative of each step). A target outside `0..C` that is not
/// ignored fails when realized.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{cross_entropy_with, CrossEntropyOptions, Reduction};
/// let logits = Tensor::from_vec(vec![0.0f32, 0.0, 5.0, 1.0], &[2, 2]);
/// let t = Tensor::from_vec(vec![0i64, -100], &[2]);
/// // The second row is skipped: the loss is the first row's alone.
/// let mean = kiln::nn::functional::cross_entropy(&logits, &t).unwrap();
/// assert!((mean.item::<f32>().unwrap() - 2f32.ln()).abs() < 1e-6);
/// let opts = CrossEntropyOptions { reduction: Reduction::None, ..Default::default() };
/// let each = cross_entropy_with(&logits, &t, &opts).unwrap();
/// assert_eq!(each.shape(), &[2]);
/// assert_eq!(each.to_vec::<f32>().unwrap()[1], 0.0);
/// ```
pub fn cross_entropy_with(
    logits: &Tensor,
    targets: &Tensor,
    options: &CrossEntropyOptions,
) -> Result<Tensor> {
    let nd = logits.ndim();
    if nd == 0 || targets.shape() != &logits.shape()[..nd - 1] {
        return Err(KilnError::ShapeMismatch {
            op: "cross_entropy",
            lhs: logits.shape().to_vec(),
            rhs: targets.shape().to_vec(),
            detail: ": targets must have the logits' shape without the class dimension".into(),
        });
    }
    if !targets.dtype().is_int() {
        return Err(KilnError::UnsupportedDType {
            op: "cross_entropy",
            dtype: targets.dtype(),
            detail:
                ": targets must be integer class indices (class probabilities are not supported)"
                    .into(),
        });
    }
    let eps = options.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        return Err(KilnError::InvalidArgument {
            op: "cross_entropy",
            shape: logits.shape().to_vec(),
            reason: format!("label_smoothing {eps} is not in [0, 1]"),
        });
    }
    let c = logits.shape()[nd - 1];
    let n = targets.numel();
    let dtype = if logits.dtype().is_float() {
        logits.dtype()
    } else {
        DType::F32
    };
    let wide = if dtype.is_half() { DType::F32 } else { dtype };
    let reduction = options.reduction;
    let ignore = options.ignore_index;
    // The forward records no history: the rule below is the whole backward. `valid` is
    // `None` when no target can be ignored; `count` is the divisor of the mean.
    struct Parts {
        x: Tensor,
        t: Tensor,
        lse: Tensor,
        valid: Option<Tensor>,
        count: Option<Tensor>,
        rows: Tensor,
    }
    let p = crate::autograd::no_grad(|| -> Result<Parts> {
        let x = logits
            .try_reshape([n as isize, c as isize])?
            .try_cast(dtype)?;
        let t = targets.try_reshape([n as isize, 1])?.try_cast(DType::I64)?;
        let lse = x.try_logsumexp_keepdim(1)?;
        let valid = ignore.map(|i| t.try_ne(i)).transpose()?;
        // Ignored targets gather class 0 (any in-range class would do; the row is masked).
        let picked = match &valid {
            Some(v) => x.try_gather(1, &Tensor::try_where(v, &t, 0i64)?)?,
            None => x.try_gather(1, &t)?,
        };
        let mut rows = if eps == 0.0 {
            lse.try_sub(&picked)?
        } else {
            let smooth = x.try_mean_keepdim(1)?.try_mul(eps)?;
            lse.try_sub(&picked.try_mul(1.0 - eps)?)?.try_sub(&smooth)?
        };
        if let Some(v) = &valid {
            rows = Tensor::try_where(v, &rows, 0.0)?;
        }
        let count = match (reduction, &valid) {
            // Counted in f32 for half logits: a count past 65504 is not an f16.
            (Reduction::Mean, Some(v)) => Some(v.try_cast(wide)?.try_sum(..)?),
            _ => None,
        };
        Ok(Parts {
            x,
            t,
            lse,
            valid,
            count,
            rows,
        })
    })?;
    let Parts {
        x,
        t,
        lse,
        valid,
        count,
        rows,
    } = p;
    let shape = logits.shape().to_vec();
    let target_shape: Vec<isize> = targets.shape().iter().map(|&d| d as isize).collect();
    let in_dtype = logits.dtype();
    let forward = {
        let count = count.clone();
        move || -> Result<Tensor> {
            match reduction {
                Reduction::None => rows.try_reshape(target_shape.as_slice()),
                Reduction::Sum => rows.try_sum(..),
                Reduction::Mean => match &count {
                    // Summed in f32 for half logits, rounded once (as `mean` does).
                    Some(k) => rows
                        .try_cast(wide)?
                        .try_sum(..)?
                        .try_div(k)?
                        .try_cast(dtype),
                    None => rows.try_mean(..),
                },
            }
        }
    };
    composite(&[logits], forward, move |_, _, g| {
        let classes = Tensor::try_arange(0, c as i64, 1, DType::I64)?
            .try_to(x.device())?
            .try_reshape([1, c as isize])?;
        let hot = classes.try_eq(&t)?.try_cast(dtype)?;
        // The incoming gradient per row, `[n, 1]` or a scalar, scaled for the reduction.
        let mut scale = match reduction {
            Reduction::None => g.try_reshape([n as isize, 1])?,
            Reduction::Sum => g.clone(),
            Reduction::Mean => match &count {
                Some(k) => g.try_div(k)?,
                None => g.try_div(n as f64)?,
            },
        };
        if let Some(v) = &valid {
            scale = Tensor::try_where(v, &scale, 0.0)?;
        }
        let target = if eps == 0.0 {
            hot
        } else {
            hot.try_mul(1.0 - eps)?.try_add(eps / c as f64)?
        };
        let dx = x
            .try_sub(&lse)?
            .try_exp()?
            .try_sub(&target)?
            .try_mul(&scale)?;
        let dims: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
        Ok(vec![Some(dx.try_reshape(&dims)?.try_cast(in_dtype)?)])
    })
}

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

/// Mean squared error, `mean((prediction - target)²)` — PyTorch's `mse_loss` with its
/// default `reduction='mean'`.
pub fn mse_loss(prediction: &Tensor, target: &Tensor) -> Result<Tensor> {
    mse_loss_with(prediction, target, Reduction::Mean)
}

/// Squared error `(prediction - target)²` reduced by `reduction` (PyTorch's `mse_loss`
/// with `reduction=`; `Reduction::None` keeps the broadcast shape).
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{mse_loss_with, Reduction};
/// let p = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
/// let t = Tensor::from_vec(vec![0.0f32, 4.0], &[2]);
/// assert_eq!(mse_loss_with(&p, &t, Reduction::Sum).unwrap().item::<f32>().unwrap(), 5.0);
/// assert_eq!(
///     mse_loss_with(&p, &t, Reduction::None).unwrap().to_vec::<f32>().unwrap(),
///     vec![1.0, 4.0]
/// );
/// ```
pub fn mse_loss_with(prediction: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let d = prediction.try_sub(target)?;
    let sq = d.try_mul(&d)?;
    match reduction {
        Reduction::Mean => sq.try_mean(..),
        Reduction::Sum => sq.try_sum(..),
        Reduction::None => Ok(sq),
    }
}

/// Dropout: zeroes each element with probability `p` and scales the rest by `1/(1-p)`
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
    Tensor::try_where(&keep, &x.try_mul(1.0 / (1.0 - p))?, 0.0)
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
