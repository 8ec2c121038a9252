//! Losses, each a function of tensors returning a (lazy) loss tensor: the classification
//! losses ([`cross_entropy`], [`nll_loss`], [`binary_cross_entropy`],
//! [`binary_cross_entropy_with_logits`]) and the regression losses ([`mse_loss`],
//! [`l1_loss`], [`smooth_l1_loss`], [`huber_loss`], [`poisson_nll_loss`]), the
//! divergence [`kl_div`], and the margin losses ([`margin_ranking_loss`],
//! [`hinge_embedding_loss`], [`soft_margin_loss`], [`multilabel_soft_margin_loss`],
//! [`cosine_embedding_loss`], [`triplet_margin_loss`], [`multi_margin_loss`],
//! [`multilabel_margin_loss`]), [`gaussian_nll_loss`] and the sequence loss [`ctc_loss`],
//! with PyTorch's semantics and `reduction=` ([`Reduction`]). Where a loss has a custom
//! backward rule its doc says so; the others are differentiated op by op. Re-exported from
//! [`super::functional`].

pub use super::ctc::{CtcLengths, CtcLossOptions, ctc_loss, ctc_loss_with};
pub use super::loss_extra::{gaussian_nll_loss, multi_margin_loss, multilabel_margin_loss};
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
/// (`weight=None`, `ignore_index=-100`, `reduction='mean'`, `label_smoothing=0.0`).
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    /// PyTorch's `weight=`: one float weight per class (`[C]`, not requiring grad). A
    /// target's loss is scaled by its class's weight and the mean divides by the sum of the
    /// kept targets' weights.
    pub weight: Option<Tensor>,
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
            weight: None,
            ignore_index: Some(-100),
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

/// Cross entropy of `logits` (`[..., C]`) against integer class `targets` (`[...]`) or
/// class probabilities (float, `[..., C]`: see [`cross_entropy_with`]),
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

/// Cross entropy with PyTorch's `weight`, `ignore_index`, `reduction` and
/// `label_smoothing` ([`CrossEntropyOptions`]); classes are on the **last** dimension of
/// `logits`. Float `targets` of the logits' shape are class probabilities (soft labels):
/// per row `-Σ_c w_c·y_c·log_softmax(x)_c` with `y` smoothed to `(1 - ε)·y + ε/C`, the
/// mean over rows, differentiated op by op (a target that requires grad gets a gradient).
///
/// Per target `t` that is not ignored the loss is
/// `logsumexp(x) - (1 - ε)·x[t] - ε·mean(x)`; an ignored target's is 0. The mean divides
/// by the number of targets not ignored (`NaN` when every target is ignored, as in
/// PyTorch). With class weights `w` the loss is
/// `(1 - ε)·w[t]·(lse - x[t]) + ε/C·Σ_c w_c·(lse - x_c)` and the mean divides by the sum
/// of `w[t]` over the kept targets, as PyTorch's. Forward: one fused row kernel (`logsumexp` and the gathered logit), then the
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
    let eps = options.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        return Err(KilnError::InvalidArgument {
            op: "cross_entropy",
            shape: logits.shape().to_vec(),
            reason: format!("label_smoothing {eps} is not in [0, 1]"),
        });
    }
    if targets.dtype().is_float() {
        return cross_entropy_of_probabilities(logits, targets, options);
    }
    check_class_targets("cross_entropy", logits, targets)?;
    let nd = logits.ndim();
    let c = logits.shape()[nd - 1];
    let n = targets.numel();
    let dtype = if logits.dtype().is_float() {
        logits.dtype()
    } else {
        DType::F32
    };
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
        w: Option<ClassWeights>,
    }
    let p = crate::autograd::no_grad(|| -> Result<Parts> {
        let x = logits
            .try_reshape([n as isize, c as isize])?
            .try_cast(dtype)?;
        let t = targets.try_reshape([n as isize, 1])?.try_cast(DType::I64)?;
        let lse = x.try_logsumexp_keepdim(1)?;
        let (index, valid) = target_index(&t, ignore)?;
        let w = class_weights("cross_entropy", options.weight.as_ref(), c, dtype, &index)?;
        let picked = x.try_gather(1, &index)?;
        let mut rows = match &w {
            None if eps == 0.0 => lse.try_sub(&picked)?,
            None => {
                let smooth = x.try_mean_keepdim(1)?.try_mul(eps)?;
                lse.try_sub(&picked.try_mul(1.0 - eps)?)?.try_sub(&smooth)?
            }
            // (1 - ε)·w[t]·(lse - x[t]) + ε/C·Σ_c w_c·(lse - x_c), as PyTorch weighs
            // both parts.
            Some(w) => {
                let wt = w.picked.clone();
                let nll = lse.try_sub(&picked)?.try_mul(&wt)?;
                if eps == 0.0 {
                    nll
                } else {
                    let smooth = lse
                        .try_mul(&w.total)?
                        .try_sub(&x.try_mul(&w.row)?.try_sum_keepdim(1)?)?;
                    nll.try_mul(1.0 - eps)?
                        .try_add(&smooth.try_mul(eps / c as f64)?)?
                }
            }
        };
        if let Some(v) = &valid {
            rows = Tensor::try_where(v, &rows, 0.0)?;
        }
        let count = match reduction {
            Reduction::Mean => kept_weight(valid.as_ref(), w.as_ref().map(|w| &w.picked), dtype)?,
            _ => None,
        };
        Ok(Parts {
            x,
            t,
            lse,
            valid,
            count,
            rows,
            w,
        })
    })?;
    let Parts {
        x,
        t,
        lse,
        valid,
        count,
        rows,
        w,
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
                    Some(k) => mean_over_kept(&rows, k, dtype),
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
        let probs = x.try_sub(&lse)?.try_exp()?;
        let dx = match &w {
            None => {
                let target = if eps == 0.0 {
                    hot
                } else {
                    hot.try_mul(1.0 - eps)?.try_add(eps / c as f64)?
                };
                probs.try_sub(&target)?
            }
            // d/dx_j = p_j·((1 - ε)·w[t] + ε/C·Σw) - (1 - ε)·w[t]·[j = t] - ε/C·w_j.
            Some(w) if eps == 0.0 => probs.try_sub(&hot)?.try_mul(&w.picked)?,
            Some(w) => {
                let k = eps / c as f64;
                let per_row = w.picked.try_mul(1.0 - eps)?.try_add(&w.total.try_mul(k)?)?;
                let target = hot
                    .try_mul(&w.picked.try_mul(1.0 - eps)?)?
                    .try_add(&w.row.try_mul(k)?)?;
                probs.try_mul(&per_row)?.try_sub(&target)?
            }
        }
        .try_mul(&scale)?;
        let dims: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
        Ok(vec![Some(dx.try_reshape(&dims)?.try_cast(in_dtype)?)])
    })
}

/// [`cross_entropy_with`] for float `targets` of the logits' shape: class probabilities
/// (soft labels), PyTorch's other form. Per row `-Σ_c w_c·y_c·log_softmax(x)_c` with
/// `y` smoothed to `(1 - ε)·y + ε / C`; the mean is over the rows (not the weights, as in
/// PyTorch); `ignore_index` does not apply. Differentiated op by op, so a target that
/// requires grad gets one too.
fn cross_entropy_of_probabilities(
    logits: &Tensor,
    targets: &Tensor,
    options: &CrossEntropyOptions,
) -> Result<Tensor> {
    let op = "cross_entropy";
    if logits.ndim() == 0 || targets.shape() != logits.shape() {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: logits.shape().to_vec(),
            rhs: targets.shape().to_vec(),
            detail: ": class-probability targets must have the input's shape".into(),
        });
    }
    let c = logits.shape()[logits.ndim() - 1];
    let dtype = if logits.dtype().is_float() {
        logits.dtype()
    } else {
        DType::F32
    };
    let eps = options.label_smoothing;
    let mut y = targets.try_cast(dtype)?;
    if eps != 0.0 {
        y = y.try_mul(1.0 - eps)?.try_add(eps / c as f64)?;
    }
    let mut terms = logits.try_cast(dtype)?.try_log_softmax(-1)?.try_mul(&y)?;
    if let Some(w) = weight_row(op, options.weight.as_ref(), c, dtype)? {
        terms = terms.try_mul(&w)?;
    }
    let rows = terms
        .try_cast(accumulator(dtype))?
        .try_sum(-1)?
        .try_neg()?
        .try_cast(dtype)?;
    reduce(rows, options.reduction)
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
    reduce(d.try_mul(&d)?, reduction)
}

/// Checks that `targets` are integer class indices with `input`'s shape less its last
/// (class) dimension.
fn check_class_targets(op: &'static str, input: &Tensor, targets: &Tensor) -> Result<()> {
    let nd = input.ndim();
    if nd == 0 || targets.shape() != &input.shape()[..nd - 1] {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: input.shape().to_vec(),
            rhs: targets.shape().to_vec(),
            detail: ": targets must have the input's shape without the class dimension".into(),
        });
    }
    if !targets.dtype().is_int() {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: targets.dtype(),
            detail: ": targets must be integer class indices".into(),
        });
    }
    Ok(())
}

/// Reduces elementwise losses: the mean (in f32 for half types, as [`Tensor::mean`]), the
/// sum, or the losses themselves.
pub(super) fn reduce(losses: Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::Mean => losses.try_mean(..),
        Reduction::Sum => losses.try_sum(..),
        Reduction::None => Ok(losses),
    }
}

/// Class indices `t` (`[n, 1]`) safe to gather with, and where `ignore` is given, the mask
/// of targets kept (ignored ones gather class 0, any in-range class would do: their rows
/// are masked by the caller).
fn target_index(t: &Tensor, ignore: Option<i64>) -> Result<(Tensor, Option<Tensor>)> {
    match ignore {
        Some(i) => {
            let valid = t.try_ne(i)?;
            Ok((Tensor::try_where(&valid, t, 0i64)?, Some(valid)))
        }
        None => Ok((t.clone(), None)),
    }
}

/// A classification loss's class weights, as its rows use them.
struct ClassWeights {
    /// The weights as one row, `[1, C]`.
    row: Tensor,
    /// Each target's class weight, `[n, 1]` (ignored targets: class 0's).
    picked: Tensor,
    /// The sum of all class weights (a scalar).
    total: Tensor,
}

/// Checks PyTorch's `weight=` of a classification loss over `c` classes (a float vector of
/// `c` weights that does not require grad: neither PyTorch nor kiln differentiates a loss
/// by it), cast to `dtype`, with each target's weight at the class indices `index`
/// (`[n, 1]`, from [`target_index`]).
fn class_weights(
    op: &'static str,
    weight: Option<&Tensor>,
    c: usize,
    dtype: DType,
    index: &Tensor,
) -> Result<Option<ClassWeights>> {
    let Some(row) = weight_row(op, weight, c, dtype)? else {
        return Ok(None);
    };
    let n = index.shape()[0];
    Ok(Some(ClassWeights {
        picked: row.try_broadcast_to([n, c])?.try_gather(1, index)?,
        total: row.try_sum(..)?,
        row,
    }))
}

/// The checks of [`class_weights`]; the weights as one `[1, C]` row of `dtype`.
fn weight_row(
    op: &'static str,
    weight: Option<&Tensor>,
    c: usize,
    dtype: DType,
) -> Result<Option<Tensor>> {
    let Some(w) = weight else {
        return Ok(None);
    };
    if w.shape() != [c] {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: vec![c],
            rhs: w.shape().to_vec(),
            detail: ": weight must hold one value per class".into(),
        });
    }
    if !w.dtype().is_float() {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: w.dtype(),
            detail: ": class weights must be floating-point".into(),
        });
    }
    if w.requires_grad() {
        return Err(KilnError::InvalidArgument {
            op,
            shape: w.shape().to_vec(),
            reason: "the class weights require grad; a loss is not differentiated by its \
                     class weights (detach them)"
                .into(),
        });
    }
    Ok(Some(w.try_cast(dtype)?.try_reshape([1, c as isize])?))
}

/// The divisor of a mean over the kept targets: their total class weight (`picked`, each
/// target's), or their count where some may be ignored (`valid`); `None` where every
/// target counts once (a plain mean). Summed in [`accumulator`]`(dtype)`.
fn kept_weight(
    valid: Option<&Tensor>,
    picked: Option<&Tensor>,
    dtype: DType,
) -> Result<Option<Tensor>> {
    match (valid, picked) {
        (None, None) => Ok(None),
        (Some(v), None) => kept_count(v, dtype).map(Some),
        (v, Some(p)) => {
            let kept = match v {
                Some(v) => Tensor::try_where(v, p, 0.0)?,
                None => p.clone(),
            };
            Ok(Some(kept.try_cast(accumulator(dtype))?.try_sum(..)?))
        }
    }
}

/// The dtype a loss of `dtype` sums in: f32 for half types (a count or a sum past 65504 is
/// not an f16), `dtype` otherwise.
fn accumulator(dtype: DType) -> DType {
    if dtype.is_half() { DType::F32 } else { dtype }
}

/// How many targets the mask `valid` keeps, in [`accumulator`]`(dtype)`.
fn kept_count(valid: &Tensor, dtype: DType) -> Result<Tensor> {
    valid.try_cast(accumulator(dtype))?.try_sum(..)
}

/// The mean of `rows` over the `count` targets kept: summed in [`accumulator`]`(dtype)` and
/// rounded to `dtype` once, as [`Tensor::mean`] does.
fn mean_over_kept(rows: &Tensor, count: &Tensor, dtype: DType) -> Result<Tensor> {
    rows.try_cast(accumulator(dtype))?
        .try_sum(..)?
        .try_div(count)?
        .try_cast(dtype)
}

/// Negative log likelihood of log-probabilities `input` (`[..., C]`, classes on the last
/// dimension) at integer class `targets` (`[...]`), PyTorch's `nll_loss` with its defaults
/// (`ignore_index=-100`, `reduction='mean'`): `-input[target]`, averaged over the targets
/// that are not ignored. `nll_loss(log_softmax(x))` is [`cross_entropy`] (which is one
/// kernel each way).
///
/// ```
/// use kiln::Tensor;
/// let lp = Tensor::from_vec(vec![-0.5f32, -1.0, -2.0, -0.25], &[2, 2]);
/// let t = Tensor::from_vec(vec![1i64, 0], &[2]);
/// let l = kiln::nn::functional::nll_loss(&lp, &t).unwrap();
/// assert_eq!(l.item::<f32>().unwrap(), 1.5);
/// ```
pub fn nll_loss(input: &Tensor, targets: &Tensor) -> Result<Tensor> {
    nll_loss_with(input, targets, None, Some(-100), Reduction::Mean)
}

/// [`nll_loss`] with PyTorch's `weight` (one weight per class: a target's loss is scaled by
/// its class's, and the mean divides by the kept targets' total weight), `ignore_index`
/// (`None` ignores nothing) and `reduction`, in PyTorch's argument order. Differentiated op
/// by op: the gradient is a scatter of `-g·w[t]` into the target classes.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{nll_loss_with, Reduction};
/// let lp = Tensor::from_vec(vec![-0.5f32, -1.0, -2.0, -0.25], &[2, 2]);
/// let t = Tensor::from_vec(vec![1i64, 0], &[2]);
/// let w = Tensor::from_vec(vec![3.0f32, 1.0], &[2]);
/// let l = nll_loss_with(&lp, &t, Some(&w), None, Reduction::Mean).unwrap();
/// assert_eq!(l.item::<f32>().unwrap(), (1.0 + 6.0) / 4.0);
/// ```
pub fn nll_loss_with(
    input: &Tensor,
    targets: &Tensor,
    weight: Option<&Tensor>,
    ignore_index: Option<i64>,
    reduction: Reduction,
) -> Result<Tensor> {
    check_class_targets("nll_loss", input, targets)?;
    if !input.dtype().is_float() {
        return Err(KilnError::UnsupportedDType {
            op: "nll_loss",
            dtype: input.dtype(),
            detail: ": the input must be floating-point log-probabilities".into(),
        });
    }
    let c = input.shape()[input.ndim() - 1];
    let n = targets.numel();
    let x = input.try_reshape([n as isize, c as isize])?;
    let t = targets.try_reshape([n as isize, 1])?.try_cast(DType::I64)?;
    let (index, valid) = target_index(&t, ignore_index)?;
    let w = class_weights("nll_loss", weight, c, x.dtype(), &index)?;
    let mut rows = x.try_gather(1, &index)?.try_neg()?;
    if let Some(w) = &w {
        rows = rows.try_mul(&w.picked)?;
    }
    if let Some(v) = &valid {
        rows = Tensor::try_where(v, &rows, 0.0)?;
    }
    let target_shape: Vec<isize> = targets.shape().iter().map(|&d| d as isize).collect();
    let divisor = match reduction {
        Reduction::Mean => kept_weight(valid.as_ref(), w.as_ref().map(|w| &w.picked), x.dtype())?,
        _ => None,
    };
    match divisor {
        Some(d) => mean_over_kept(&rows, &d, x.dtype()),
        None => reduce(rows.try_reshape(target_shape.as_slice())?, reduction),
    }
}

/// Binary cross entropy of probabilities `input` in `[0, 1]` against `target` of the same
/// shape, PyTorch's `binary_cross_entropy`: `-(y·ln p + (1 - y)·ln(1 - p))` with each
/// logarithm clamped to at least -100 (so `p = 0` or `1` gives a finite loss), times the
/// optional `weight` (of the input's dtype, broadcast to its shape; it may require grad,
/// where PyTorch refuses one that does), reduced by `reduction` (the mean divides by the
/// element count, not by the weights' sum, as PyTorch's). One backward rule, PyTorch's: `dp = g·(p - y) / max(p·(1 - p), 1e-12)`
/// and `dy = g·(ln(1 - p) - ln p)` (not clamped: ±inf at `p = 0` or `1`, as PyTorch). An
/// input outside `[0, 1]` is not checked (PyTorch raises; kiln never reads data when
/// recording): its loss is NaN.
/// Prefer [`binary_cross_entropy_with_logits`], which is stable for any logit.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{binary_cross_entropy, Reduction};
/// let p = Tensor::from_vec(vec![0.5f32, 1.0], &[2]);
/// let y = Tensor::from_vec(vec![1.0f32, 0.0], &[2]);
/// let l = binary_cross_entropy(&p, &y, None, Reduction::None).unwrap();
/// assert_eq!(l.to_vec::<f32>().unwrap(), vec![2f32.ln(), 100.0]);
/// ```
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "binary_cross_entropy";
    same_float_shapes(OP, input, target)?;
    check_element_weight(OP, input, weight)?;
    let dtype = input.dtype();
    let losses = composite(
        &[input, target],
        || {
            let lp = input.try_log()?.try_clamp_min(-100.0)?;
            let lq = input.try_neg()?.try_log1p()?.try_clamp_min(-100.0)?;
            // -(y·lp + (1 - y)·lq) = -(lq + y·(lp - lq))
            target.try_mul(&lp.try_sub(&lq)?)?.try_add(&lq)?.try_neg()
        },
        move |inputs, _, g| {
            let (p, y) = (&inputs[0], &inputs[1]);
            let q = p.try_neg()?.try_add(1.0)?;
            let denom = p.try_mul(&q)?.try_clamp_min(1e-12)?;
            let dp = g.try_mul(&p.try_sub(y)?)?.try_div(&denom)?;
            // Unclamped, as PyTorch's: ±inf where p is 0 or 1.
            let dy = g.try_mul(&p.try_neg()?.try_log1p()?.try_sub(&p.try_log()?)?)?;
            Ok(vec![Some(dp.try_cast(dtype)?), Some(dy)])
        },
    )?;
    reduce(weighted(losses, weight)?, reduction)
}

/// Checks a binary loss's per-element `weight`: the input's dtype, broadcasting to the
/// input's shape.
fn check_element_weight(op: &'static str, input: &Tensor, weight: Option<&Tensor>) -> Result<()> {
    let Some(w) = weight else {
        return Ok(());
    };
    let shape = input.shape();
    if !crate::shape::broadcast_shapes(op, w.shape(), shape).is_ok_and(|s| s == shape) {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: w.shape().to_vec(),
            detail: ": weight must broadcast to the input's shape".into(),
        });
    }
    if w.dtype() != input.dtype() {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: w.dtype(),
            detail: format!(": weight must have the input's dtype {}", input.dtype()),
        });
    }
    Ok(())
}

/// Each element's loss times its weight (checked by [`check_element_weight`]); a weight
/// that requires grad gets `g·loss`.
fn weighted(losses: Tensor, weight: Option<&Tensor>) -> Result<Tensor> {
    match weight {
        Some(w) => losses.try_mul(w),
        None => Ok(losses),
    }
}

/// Binary cross entropy of logits `input` against `target` of the same shape, PyTorch's
/// `binary_cross_entropy_with_logits`: `(1 - y)·x + (1 + (w - 1)·y)·softplus(-x)` with
/// `w` the optional `pos_weight` (broadcast to the input, e.g. one per class on the last
/// dimension; 1 when `None`), times the optional per-element `weight` (as in
/// [`binary_cross_entropy`]), reduced by `reduction`. `softplus(-x)` is computed as
/// `ln(1 + e^-|x|) + max(-x, 0)`, exact for any `x`. One backward rule:
/// `dx = g·((1 - y) - (1 + (w - 1)·y)·σ(-x))` (`σ(x) - y` when `w = 1`),
/// `dy = g·((w - 1)·softplus(-x) - x)` and `dw = g·y·softplus(-x)`.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{binary_cross_entropy_with_logits, Reduction};
/// let x = Tensor::from_vec(vec![0.0f32, 100.0], &[2]);
/// let y = Tensor::from_vec(vec![1.0f32, 0.0], &[2]);
/// let l = binary_cross_entropy_with_logits(&x, &y, None, None, Reduction::None).unwrap();
/// assert_eq!(l.to_vec::<f32>().unwrap(), vec![2f32.ln(), 100.0]);
/// ```
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "binary_cross_entropy_with_logits";
    same_float_shapes(OP, input, target)?;
    check_element_weight(OP, input, weight)?;
    let shape = input.shape().to_vec();
    let pos_w = match pos_weight {
        Some(w) => {
            if crate::shape::broadcast_shapes(OP, w.shape(), &shape)? != shape {
                return Err(KilnError::ShapeMismatch {
                    op: OP,
                    lhs: shape,
                    rhs: w.shape().to_vec(),
                    detail: ": pos_weight must broadcast to the input's shape".into(),
                });
            }
            // Broadcast here, recorded: the expand's rule sums `dw` back to `w`'s shape.
            Some(w.expand_view(&shape)?)
        }
        None => None,
    };
    let mut inputs = vec![input, target];
    inputs.extend(pos_w.as_ref());
    let dtype = input.dtype();
    // softplus(-x) = ln(1 + e^-|x|) + max(-x, 0)
    let softplus_neg = |x: &Tensor| -> Result<Tensor> {
        x.try_abs()?
            .try_neg()?
            .try_exp()?
            .try_log1p()?
            .try_add(&x.try_neg()?.try_relu()?)
    };
    let losses = composite(
        &inputs,
        || {
            let sp = softplus_neg(input)?;
            let lin = target.try_neg()?.try_add(1.0)?.try_mul(input)?;
            match &pos_w {
                None => lin.try_add(&sp),
                Some(w) => {
                    let lw = w.try_sub(1.0)?.try_mul(target)?.try_add(1.0)?;
                    lin.try_add(&lw.try_mul(&sp)?)
                }
            }
        },
        move |inputs, _, g| {
            let (x, y) = (&inputs[0], &inputs[1]);
            let one_m_y = y.try_neg()?.try_add(1.0)?;
            let sig_neg = x.try_neg()?.try_sigmoid()?;
            let sp = softplus_neg(x)?;
            let mut grads = Vec::with_capacity(3);
            match inputs.get(2) {
                None => {
                    grads.push(Some(
                        g.try_mul(&one_m_y.try_sub(&sig_neg)?)?.try_cast(dtype)?,
                    ));
                    grads.push(Some(g.try_mul(&x.try_neg()?)?));
                }
                Some(w) => {
                    let wm1 = w.try_sub(1.0)?;
                    let lw = wm1.try_mul(y)?.try_add(1.0)?;
                    let dx = one_m_y.try_sub(&lw.try_mul(&sig_neg)?)?;
                    grads.push(Some(g.try_mul(&dx)?.try_cast(dtype)?));
                    grads.push(Some(g.try_mul(&wm1.try_mul(&sp)?.try_sub(x)?)?));
                    grads.push(Some(g.try_mul(&y.try_mul(&sp)?)?));
                }
            }
            Ok(grads)
        },
    )?;
    reduce(weighted(losses, weight)?, reduction)
}

/// Checks that a binary loss's input and target are floating-point of one shape.
fn same_float_shapes(op: &'static str, input: &Tensor, target: &Tensor) -> Result<()> {
    if input.shape() != target.shape() {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: input.shape().to_vec(),
            rhs: target.shape().to_vec(),
            detail: ": the target must have the input's shape".into(),
        });
    }
    for t in [input, target] {
        if !t.dtype().is_float() {
            return Err(KilnError::UnsupportedDType {
                op,
                dtype: t.dtype(),
                detail: ": input and target must be floating-point".into(),
            });
        }
    }
    Ok(())
}

/// Mean absolute error `|prediction - target|` reduced by `reduction`, PyTorch's
/// `l1_loss` (the gradient at a zero difference is 0, as `abs`'s).
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{l1_loss, Reduction};
/// let p = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
/// let t = Tensor::from_vec(vec![0.0f32, 4.0], &[2]);
/// assert_eq!(l1_loss(&p, &t, Reduction::Mean).unwrap().item::<f32>().unwrap(), 1.5);
/// ```
pub fn l1_loss(prediction: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    reduce(prediction.try_sub(target)?.try_abs()?, reduction)
}

/// PyTorch's `smooth_l1_loss`: with `d = prediction - target`, `0.5·d²/β` where
/// `|d| < β` and `|d| - 0.5·β` elsewhere (`β = 0` is [`l1_loss`]); `β` must not be
/// negative.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{smooth_l1_loss, Reduction};
/// let p = Tensor::from_vec(vec![0.5f32, 3.0], &[2]);
/// let t = Tensor::from_vec(vec![0.0f32, 0.0], &[2]);
/// let l = smooth_l1_loss(&p, &t, Reduction::None, 1.0).unwrap();
/// assert_eq!(l.to_vec::<f32>().unwrap(), vec![0.125, 2.5]);
/// ```
pub fn smooth_l1_loss(
    prediction: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    beta: f64,
) -> Result<Tensor> {
    robust_loss(
        "smooth_l1_loss",
        prediction,
        target,
        reduction,
        beta,
        1.0 / beta.max(f64::MIN_POSITIVE),
        1.0,
    )
}

/// PyTorch's `huber_loss`: with `d = prediction - target`, `0.5·d²` where `|d| < δ` and
/// `δ·(|d| - 0.5·δ)` elsewhere; `δ` must be positive. It is `δ ·`
/// [`smooth_l1_loss`] with `β = δ`.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{huber_loss, Reduction};
/// let p = Tensor::from_vec(vec![0.5f32, 3.0], &[2]);
/// let t = Tensor::from_vec(vec![0.0f32, 0.0], &[2]);
/// let l = huber_loss(&p, &t, Reduction::None, 2.0).unwrap();
/// assert_eq!(l.to_vec::<f32>().unwrap(), vec![0.125, 4.0]);
/// ```
pub fn huber_loss(
    prediction: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    delta: f64,
) -> Result<Tensor> {
    if delta <= 0.0 || delta.is_nan() {
        return Err(KilnError::InvalidArgument {
            op: "huber_loss",
            shape: prediction.shape().to_vec(),
            reason: format!("delta {delta} is not positive"),
        });
    }
    robust_loss(
        "huber_loss",
        prediction,
        target,
        reduction,
        delta,
        1.0,
        delta,
    )
}

/// `0.5·d²·quad` where `|d| < width`, else `lin·(|d| - 0.5·width)`: smooth L1
/// (`quad = 1/β`, `lin = 1`) and Huber (`quad = 1`, `lin = δ`).
fn robust_loss(
    op: &'static str,
    prediction: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    width: f64,
    quad: f64,
    lin: f64,
) -> Result<Tensor> {
    if width < 0.0 || width.is_nan() {
        return Err(KilnError::InvalidArgument {
            op,
            shape: prediction.shape().to_vec(),
            reason: format!("the width {width} of the quadratic zone is negative"),
        });
    }
    let d = prediction.try_sub(target)?;
    let ad = d.try_abs()?;
    if width == 0.0 {
        return reduce(ad, reduction);
    }
    let quadratic = d.try_mul(&d)?.try_mul(0.5 * quad)?;
    let linear = ad.try_sub(0.5 * width)?.try_mul(lin)?;
    reduce(
        Tensor::try_where(&ad.try_lt(width)?, &quadratic, &linear)?,
        reduction,
    )
}

// ---------------------------------------------------------------------------------------
// Divergence, Poisson and margin losses (compositions of elementwise ops)
// ---------------------------------------------------------------------------------------

/// PyTorch's `reduction=` for [`kl_div`], which adds `'batchmean'`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KlDivReduction {
    /// The mean over every element, PyTorch's `'mean'` (its default, which PyTorch warns
    /// does not give the divergence).
    #[default]
    Mean,
    /// The sum divided by the batch size (the first dimension): the divergence per sample,
    /// PyTorch's `'batchmean'`.
    BatchMean,
    /// The sum, `'sum'`.
    Sum,
    /// One value per element, `'none'`.
    None,
}

/// `t·ln(t)` with `0·ln(0) = 0` (PyTorch's `xlogy(t, t)`), with no NaN in the gradient of
/// the discarded branch.
fn t_log_t(t: &Tensor) -> Result<Tensor> {
    let zero = t.try_eq(0.0)?;
    let safe = Tensor::try_where(&zero, 1.0, t)?;
    Tensor::try_where(&zero, 0.0, &t.try_mul(&safe.try_log()?)?)
}

/// PyTorch's `F.kl_div(input, target, reduction, log_target)`: the pointwise
/// Kullback–Leibler divergence of `target` from the distribution whose **log**-probabilities
/// are `input`: `target·(ln target - input)` (with `0·ln 0 = 0`, PyTorch's `xlogy` form
/// `xlogy(t, t) - t·input`), or with `log_target` (target given as log-probabilities)
/// `e^target·(target - input)`; then reduced. Inputs broadcast.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{kl_div, KlDivReduction};
/// let p = Tensor::from_vec(vec![0.5f32, 0.5], [1, 2]);
/// let q_log = Tensor::from_vec(vec![0.25f32.ln(), 0.75f32.ln()], [1, 2]);
/// let d = kl_div(&q_log, &p, KlDivReduction::BatchMean, false).unwrap();
/// let want = 0.5 * (0.5f32 / 0.25).ln() + 0.5 * (0.5f32 / 0.75).ln();
/// assert!((d.item::<f32>().unwrap() - want).abs() < 1e-6);
/// ```
pub fn kl_div(
    input: &Tensor,
    target: &Tensor,
    reduction: KlDivReduction,
    log_target: bool,
) -> Result<Tensor> {
    const OP: &str = "kl_div";
    super::conv::require_float(OP, input)?;
    super::conv::require_float(OP, target)?;
    let pointwise = if log_target {
        target.try_exp()?.try_mul(&target.try_sub(input)?)?
    } else {
        t_log_t(target)?.try_sub(&target.try_mul(input)?)?
    };
    match reduction {
        KlDivReduction::Mean => pointwise.try_mean(..),
        KlDivReduction::Sum => pointwise.try_sum(..),
        KlDivReduction::None => Ok(pointwise),
        KlDivReduction::BatchMean => {
            let batch = if input.ndim() == 0 {
                1
            } else {
                input.shape()[0]
            };
            pointwise.try_sum(..)?.try_div(batch as f64)
        }
    }
}

/// PyTorch's `F.poisson_nll_loss(input, target, log_input, full, eps, reduction)`: with
/// `log_input` (the default) `e^input - target·input`, else
/// `input - target·ln(input + eps)`; `full` adds Stirling's approximation of
/// `ln(target!)`, `target·ln(target) - target + ½·ln(2π·target)`, where `target > 1`.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{poisson_nll_loss, Reduction};
/// let rate_log = Tensor::from_vec(vec![0.0f32], [1]);
/// let k = Tensor::from_vec(vec![2.0f32], [1]);
/// let l = poisson_nll_loss(&rate_log, &k, true, false, 1e-8, Reduction::Sum).unwrap();
/// assert_eq!(l.item::<f32>().unwrap(), 1.0); // e^0 - 2·0
/// ```
pub fn poisson_nll_loss(
    input: &Tensor,
    target: &Tensor,
    log_input: bool,
    full: bool,
    eps: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "poisson_nll_loss";
    super::conv::require_float(OP, input)?;
    let mut loss = if log_input {
        input.try_exp()?.try_sub(&target.try_mul(input)?)?
    } else {
        input.try_sub(&target.try_mul(&input.try_add(eps)?.try_log()?)?)?
    };
    if full {
        let big = target.try_gt(1.0)?;
        let t = Tensor::try_where(&big, target, 2.0)?;
        let stirling = t_log_t(&t)?.try_sub(&t)?.try_add(
            &t.try_mul(2.0 * std::f64::consts::PI)?
                .try_log()?
                .try_mul(0.5)?,
        )?;
        loss = loss.try_add(&Tensor::try_where(&big, &stirling, 0.0)?)?;
    }
    reduce(loss, reduction)
}

/// PyTorch's `F.margin_ranking_loss(x1, x2, y, margin, reduction)`:
/// `max(0, -y·(x1 - x2) + margin)`, `y` being 1 where `x1` should rank higher and -1
/// where `x2` should. Inputs broadcast.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{margin_ranking_loss, Reduction};
/// let (a, b) = (Tensor::from_vec(vec![1.0f32, 1.0], [2]), Tensor::from_vec(vec![0.5f32, 0.5], [2]));
/// let y = Tensor::from_vec(vec![1.0f32, -1.0], [2]);
/// let l = margin_ranking_loss(&a, &b, &y, 0.0, Reduction::None).unwrap();
/// assert_eq!(l.to_vec::<f32>().unwrap(), vec![0.0, 0.5]);
/// ```
pub fn margin_ranking_loss(
    x1: &Tensor,
    x2: &Tensor,
    y: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    super::conv::require_float("margin_ranking_loss", x1)?;
    let loss = y
        .try_neg()?
        .try_mul(&x1.try_sub(x2)?)?
        .try_add(margin)?
        .try_clamp_min(0.0)?;
    reduce(loss, reduction)
}

/// PyTorch's `F.hinge_embedding_loss(input, target, margin, reduction)`: `input` where
/// `target` is 1 and `max(0, margin - input)` where it is -1 (PyTorch adds both terms for
/// any other target value, and so does kiln).
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{hinge_embedding_loss, Reduction};
/// let d = Tensor::from_vec(vec![0.3f32, 0.3, 2.0], [3]);
/// let y = Tensor::from_vec(vec![1.0f32, -1.0, -1.0], [3]);
/// let l = hinge_embedding_loss(&d, &y, 1.0, Reduction::None).unwrap();
/// assert_eq!(l.to_vec::<f32>().unwrap(), vec![0.3, 0.7, 0.0]);
/// ```
pub fn hinge_embedding_loss(
    input: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    super::conv::require_float("hinge_embedding_loss", input)?;
    let below = input.try_rsub(margin)?.try_clamp_min(0.0)?;
    let margin_part = Tensor::try_where(&target.try_ne(1.0)?, &below, 0.0)?;
    let self_part = Tensor::try_where(&target.try_ne(-1.0)?, input, 0.0)?;
    reduce(margin_part.try_add(&self_part)?, reduction)
}

/// PyTorch's `F.soft_margin_loss(input, target, reduction)`: the logistic loss
/// `ln(1 + e^(-target·input))` for targets ±1 (computed as a `softplus`, so a large
/// margin does not overflow).
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{soft_margin_loss, Reduction};
/// let x = Tensor::from_vec(vec![0.0f32], [1]);
/// let y = Tensor::from_vec(vec![1.0f32], [1]);
/// let l = soft_margin_loss(&x, &y, Reduction::Mean).unwrap();
/// assert!((l.item::<f32>().unwrap() - 2f32.ln()).abs() < 1e-6);
/// ```
pub fn soft_margin_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    super::conv::require_float("soft_margin_loss", input)?;
    let loss = target.try_neg()?.try_mul(input)?.try_softplus()?;
    reduce(loss, reduction)
}

/// PyTorch's `F.multilabel_soft_margin_loss(input, target, weight, reduction)` over
/// `[N, C]` (or `[C]`): per sample `-mean_c w_c·(y_c·ln σ(x_c) + (1 - y_c)·ln σ(-x_c))`,
/// then reduced over the samples.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{multilabel_soft_margin_loss, Reduction};
/// let x = Tensor::from_vec(vec![0.0f32, 0.0], [1, 2]);
/// let y = Tensor::from_vec(vec![1.0f32, 0.0], [1, 2]);
/// let l = multilabel_soft_margin_loss(&x, &y, None, Reduction::Mean).unwrap();
/// assert!((l.item::<f32>().unwrap() - 2f32.ln()).abs() < 1e-6);
/// ```
pub fn multilabel_soft_margin_loss(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "multilabel_soft_margin_loss";
    super::conv::require_float(OP, input)?;
    if input.ndim() == 0 || input.ndim() > 2 {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: input.shape().to_vec(),
            reason: "expects [C] or [N, C] scores".into(),
        });
    }
    let y = target.try_cast(input.dtype())?;
    let pos = y.try_mul(&input.try_log_sigmoid()?)?;
    let neg = y
        .try_rsub(1.0)?
        .try_mul(&input.try_neg()?.try_log_sigmoid()?)?;
    let mut per_class = pos.try_add(&neg)?.try_neg()?;
    if let Some(w) = weight {
        per_class = per_class.try_mul(w)?;
    }
    reduce(per_class.try_mean(-1)?, reduction)
}

/// PyTorch's `F.cosine_embedding_loss(x1, x2, y, margin, reduction)` over `[N, D]` (or
/// `[D]`) pairs: `1 - cos(x1, x2)` where `y` is 1 and `max(0, cos(x1, x2) - margin)` where
/// it is -1, with PyTorch's `cos = Σ x1·x2 / √((Σ x1² + ε)(Σ x2² + ε))`, `ε = 10⁻¹²`.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{cosine_embedding_loss, Reduction};
/// let a = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 0.0], [2, 2]);
/// let b = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], [2, 2]);
/// let y = Tensor::from_vec(vec![1.0f32, -1.0], [2]);
/// let l = cosine_embedding_loss(&a, &b, &y, 0.0, Reduction::None).unwrap();
/// assert_eq!(l.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
/// ```
pub fn cosine_embedding_loss(
    x1: &Tensor,
    x2: &Tensor,
    y: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "cosine_embedding_loss";
    super::conv::require_float(OP, x1)?;
    if x1.shape() != x2.shape() || x1.ndim() == 0 || x1.ndim() > 2 {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: x1.shape().to_vec(),
            rhs: x2.shape().to_vec(),
            detail: ": expects two [N, D] or [D] inputs of one shape".into(),
        });
    }
    const EPS: f64 = 1e-12;
    let dot = x1.try_mul(x2)?.try_sum(-1)?;
    let m1 = x1.try_mul(x1)?.try_sum(-1)?.try_add(EPS)?;
    let m2 = x2.try_mul(x2)?.try_sum(-1)?.try_add(EPS)?;
    let cos = dot.try_div(&m1.try_mul(&m2)?.try_sqrt()?)?;
    let pos = Tensor::try_where(&y.try_eq(1.0)?, &cos.try_rsub(1.0)?, 0.0)?;
    let neg = Tensor::try_where(
        &y.try_eq(-1.0)?,
        &cos.try_sub(margin)?.try_clamp_min(0.0)?,
        0.0,
    )?;
    reduce(pos.try_add(&neg)?, reduction)
}

/// PyTorch's `F.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap,
/// reduction)`: `max(0, d(a, p) - d(a, n) + margin)` with `d` the
/// [`super::functional::pairwise_distance`] (`‖x - y + eps‖_p` over the last dimension);
/// `swap` uses `min(d(a, n), d(p, n))` as the negative distance.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{triplet_margin_loss, Reduction};
/// let a = Tensor::from_vec(vec![0.0f32, 0.0], [1, 2]);
/// let p = Tensor::from_vec(vec![3.0f32, 4.0], [1, 2]);
/// let n = Tensor::from_vec(vec![0.0f32, 1.0], [1, 2]);
/// let l = triplet_margin_loss(&a, &p, &n, 1.0, 2.0, 0.0, false, Reduction::Sum).unwrap();
/// assert_eq!(l.item::<f32>().unwrap(), 5.0); // 5 - 1 + 1
/// ```
#[allow(clippy::too_many_arguments)]
pub fn triplet_margin_loss(
    anchor: &Tensor,
    positive: &Tensor,
    negative: &Tensor,
    margin: f64,
    p: f64,
    eps: f64,
    swap: bool,
    reduction: Reduction,
) -> Result<Tensor> {
    use super::functional::pairwise_distance;
    let d_ap = pairwise_distance(anchor, positive, p, eps, false)?;
    let mut d_an = pairwise_distance(anchor, negative, p, eps, false)?;
    if swap {
        d_an = d_an.try_minimum(&pairwise_distance(positive, negative, p, eps, false)?)?;
    }
    reduce(
        d_ap.try_sub(&d_an)?.try_add(margin)?.try_clamp_min(0.0)?,
        reduction,
    )
}
