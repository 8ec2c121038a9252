//! More of PyTorch's losses: [`gaussian_nll_loss`], [`multi_margin_loss`] and
//! [`multilabel_margin_loss`], composed from elementwise ops, gathers and reductions (so
//! each is differentiated op by op). Re-exported from [`super::loss`] and
//! [`super::functional`].

use super::conv::require_float;
use super::loss::{Reduction, reduce};
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// PyTorch's `F.gaussian_nll_loss(input, target, var, full, eps, reduction)`: the negative
/// log likelihood of `target` under Gaussians of mean `input` and variance `var`,
/// `½(ln max(var, eps) + (input - target)² / max(var, eps))`, plus `½ ln 2π` with `full`.
/// `var` has the input's shape, or that shape with the last dimension 1 or dropped (one
/// variance for every entry of the last dimension); `target` broadcasts with `input`. As
/// in PyTorch the clamp to `eps` has no gradient: the gradient reaches `var` as if it
/// were unclamped.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{gaussian_nll_loss, Reduction};
/// let mu = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
/// let y = Tensor::from_vec(vec![1.0f32, 4.0], [2]);
/// let var = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
/// let l = gaussian_nll_loss(&mu, &y, &var, false, 1e-6, Reduction::None).unwrap();
/// let v = l.to_vec::<f32>().unwrap();
/// assert_eq!(v[0], 0.0);
/// assert!((v[1] - 0.5 * (2f32.ln() + 2.0)).abs() < 1e-6);
/// ```
pub fn gaussian_nll_loss(
    input: &Tensor,
    target: &Tensor,
    var: &Tensor,
    full: bool,
    eps: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "gaussian_nll_loss";
    require_float(OP, input)?;
    let (is, vs) = (input.shape(), var.shape());
    let var = if vs == is {
        var.clone()
    } else if !is.is_empty() && vs == &is[..is.len() - 1] {
        var.try_unsqueeze(-1)?
    } else if !is.is_empty()
        && vs.len() == is.len()
        && vs[..vs.len() - 1] == is[..is.len() - 1]
        && vs[vs.len() - 1] == 1
    {
        var.clone()
    } else {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: is.to_vec(),
            rhs: vs.to_vec(),
            detail: ": var is of incorrect size (it must have the input's shape, or that \
                     shape with the last dimension 1 or dropped)"
                .into(),
        });
    };
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: is.to_vec(),
            reason: format!("eps {eps} must be finite and non-negative"),
        });
    }
    // max(var, eps) whose derivative is var's own: the shift is recorded without gradient.
    let shift = no_grad(|| var.try_clamp_min(eps)?.try_sub(&var))?;
    let var = var.try_add(&shift)?;
    let d = input.try_sub(target)?;
    let mut loss = var
        .try_log()?
        .try_add(&d.try_mul(&d)?.try_div(&var)?)?
        .try_mul(0.5)?;
    if full {
        loss = loss.try_add(0.5 * (2.0 * std::f64::consts::PI).ln())?;
    }
    reduce(loss, reduction)
}

/// Scores as `[N, C]` and whether they came as one unbatched `[C]` sample, for the
/// multi-class margin losses.
fn scores(op: &'static str, input: &Tensor) -> Result<(Tensor, bool)> {
    require_float(op, input)?;
    match input.ndim() {
        2 => Ok((input.clone(), true)),
        1 => Ok((input.try_unsqueeze(0)?, false)),
        nd => Err(KilnError::InvalidArgument {
            op,
            shape: input.shape().to_vec(),
            reason: format!("expects [C] or [N, C] scores, not {nd} dimensions"),
        }),
    }
}

/// The per-sample losses `[N]` reduced; an unbatched sample's unreduced loss is a scalar.
fn reduce_samples(per_sample: Tensor, batched: bool, reduction: Reduction) -> Result<Tensor> {
    let per_sample = if batched {
        per_sample
    } else {
        per_sample.try_reshape(Vec::<isize>::new())?
    };
    reduce(per_sample, reduction)
}

/// PyTorch's `F.multi_margin_loss(input, target, p, margin, weight, reduction)`: the
/// multi-class hinge loss of scores `input` `[N, C]` (or `[C]`) at integer classes
/// `target` `[N]` (or a scalar), per sample
/// `Σ_{i ≠ y} w_y·max(0, margin - x_y + x_i)^p / C`, `p` 1 or 2, `weight` an optional
/// `[C]` class weight. A class out of range fails when realized.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{multi_margin_loss, Reduction};
/// // PyTorch's nn.MultiMarginLoss example: 0.25·((1 - 0.7) + (1 - 0.6) + (1 - 0.4)).
/// let x = Tensor::from_vec(vec![0.1f32, 0.2, 0.4, 0.8], [1, 4]);
/// let y = Tensor::from_vec(vec![3i64], [1]);
/// let l = multi_margin_loss(&x, &y, 1, 1.0, None, Reduction::Mean).unwrap();
/// assert!((l.item::<f32>().unwrap() - 0.325).abs() < 1e-6);
/// ```
pub fn multi_margin_loss(
    input: &Tensor,
    target: &Tensor,
    p: u32,
    margin: f64,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "multi_margin_loss";
    let (x, batched) = scores(OP, input)?;
    if p != 1 && p != 2 {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: input.shape().to_vec(),
            reason: format!("only p == 1 and p == 2 are supported, not {p}"),
        });
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    if target.ndim() > 1 || target.numel() != n {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: input.shape().to_vec(),
            rhs: target.shape().to_vec(),
            detail: format!(
                ": the target must hold one class per sample ({n}), in 0 or 1 dimensions"
            ),
        });
    }
    if !target.dtype().is_int() {
        return Err(KilnError::UnsupportedDType {
            op: OP,
            dtype: target.dtype(),
            detail: ": targets must be integer class indices".into(),
        });
    }
    let y = target.try_cast(DType::I64)?.try_reshape([n as isize, 1])?;
    let xy = x.try_gather(1, &y)?;
    let mut z = x.try_sub(&xy)?.try_add(margin)?.try_clamp_min(0.0)?;
    if p == 2 {
        z = z.try_mul(&z)?;
    }
    let classes = Tensor::try_arange(0i64, c as i64, 1i64, DType::I64)?
        .try_to(x.device())?
        .try_reshape([1, c as isize])?;
    z = Tensor::try_where(&classes.try_eq(&y)?, 0.0, &z)?;
    if let Some(w) = weight {
        if w.shape() != [c] || !w.dtype().is_float() {
            return Err(KilnError::ShapeMismatch {
                op: OP,
                lhs: input.shape().to_vec(),
                rhs: w.shape().to_vec(),
                detail: format!(": weight must be a float vector of {c} class weights"),
            });
        }
        let wy = w
            .try_cast(x.dtype())?
            .try_index_select(0, &y.try_reshape([n as isize])?)?;
        z = z.try_mul(&wy.try_reshape([n as isize, 1])?)?;
    }
    reduce_samples(z.try_sum(1)?.try_div(c as f64)?, batched, reduction)
}

/// PyTorch's `F.multilabel_margin_loss(input, target, reduction)`: scores `input`
/// `[N, C]` (or `[C]`) against integer `target` of the same shape listing each sample's
/// classes, ended by the first negative entry (-1 padding); per sample
/// `Σ_j Σ_{i ∉ targets} max(0, 1 - (x_{y_j} - x_i)) / C` over the listed `y_j`. A class
/// out of range fails when realized.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{multilabel_margin_loss, Reduction};
/// // PyTorch's nn.MultiLabelMarginLoss example: classes 3 and 0 (the -1 ends the list).
/// let x = Tensor::from_vec(vec![0.1f32, 0.2, 0.4, 0.8], [1, 4]);
/// let y = Tensor::from_vec(vec![3i64, 0, -1, 1], [1, 4]);
/// let l = multilabel_margin_loss(&x, &y, Reduction::Mean).unwrap();
/// assert!((l.item::<f32>().unwrap() - 0.85).abs() < 1e-6);
/// ```
pub fn multilabel_margin_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "multilabel_margin_loss";
    let (x, batched) = scores(OP, input)?;
    if target.shape() != input.shape() {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: input.shape().to_vec(),
            rhs: target.shape().to_vec(),
            detail: ": the target must have the input's shape".into(),
        });
    }
    if !target.dtype().is_int() {
        return Err(KilnError::UnsupportedDType {
            op: OP,
            dtype: target.dtype(),
            detail: ": targets must be integer class indices".into(),
        });
    }
    let (n, c) = (x.shape()[0] as isize, x.shape()[1]);
    let t = target.try_cast(DType::I64)?.try_reshape([n, c as isize])?;
    // The listed targets: those before the first negative entry.
    let listed = t
        .try_lt(0)?
        .try_cast(DType::I64)?
        .try_cumsum(1)?
        .try_eq(0)?;
    let y = Tensor::try_where(&listed, &t, 0i64)?;
    // is_target[n, i]: class i is listed for sample n.
    let is_target = y
        .try_one_hot(c)?
        .try_mul(&listed.try_cast(DType::I64)?.try_unsqueeze(2)?)?
        .try_sum(1)?
        .try_gt(0)?;
    let xy = x.try_gather(1, &y)?.try_unsqueeze(2)?; // [N, C(j), 1]
    let hinge = x
        .try_unsqueeze(1)?
        .try_sub(&xy)?
        .try_add(1.0)?
        .try_clamp_min(0.0)?; // max(0, 1 - x_y + x_i): [N, C(j), C(i)]
    let keep = listed
        .try_unsqueeze(2)?
        .try_logical_and(&is_target.try_logical_not()?.try_unsqueeze(1)?)?;
    let per_sample = Tensor::try_where(&keep, &hinge, 0.0)?
        .try_sum([1, 2])?
        .try_div(c as f64)?;
    reduce_samples(per_sample, batched, reduction)
}
