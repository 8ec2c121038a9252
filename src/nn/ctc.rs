//! PyTorch's `F.ctc_loss` and `nn.CTCLoss`: the connectionist temporal classification
//! loss, the negative log likelihood of a label sequence summed over every alignment of it
//! to the input's time steps (blanks between and around the labels, each label or blank
//! repeated over consecutive steps).
//!
//! **Design: computed on the host.** The loss is a dynamic program over time (Graves et
//! al.'s forward variable `α`), whose shape depends on each sample's lengths and labels.
//! Recorded from kiln ops it would be `T` dependent steps of gathers and `logsumexp`s over
//! `2·S + 1` states per sample, a graph that grows with the sequence and whose derivative
//! through `-inf` states needs care at every step. The lengths and labels must be read
//! anyway to validate them (as PyTorch reads them), so, as the decompositions in
//! `kiln::linalg` do, [`ctc_loss_with`] realizes its inputs when called and runs the
//! recursion in f64 on the host, one sample per task. The per-sample losses come back as a
//! constant of the input's dtype on its device with one backward rule: when `log_probs`
//! requires grad, the backward variable `β` is run too and the gradient of every sample's
//! loss is kept (`[T, N, C]`, computed from `α·β` as the posterior occupancy of each class
//! at each step), so the rule is one multiplication by the incoming gradient. The
//! reductions are recorded from kiln ops after it, and differentiate as such.
//!
//! The gradient is the loss's own derivative with respect to `log_probs`,
//! `-Σ_{s: l'_s = c} α_t(s)·β_t(s) / p`; PyTorch's backward returns that plus
//! `exp(log_probs)` (the gradient as if `log_probs` came from a log-softmax). The two agree
//! once composed with `log_softmax`; `docs/semantics.md` has the row.

use super::loss::{Reduction, reduce};
use crate::autograd::{composite, is_grad_enabled, no_grad};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;
use rayon::prelude::*;

const OP: &str = "ctc_loss";

/// Per-sample lengths for [`ctc_loss_with`], PyTorch's `input_lengths` / `target_lengths`:
/// an integer tensor (`[N]`, or a scalar or `[1]` for an unbatched input; read on the host
/// when the loss is called) or host values (a slice, array or `Vec` of `i64`).
#[derive(Clone, Copy, Debug)]
pub enum CtcLengths<'a> {
    /// An integer tensor of lengths.
    Tensor(&'a Tensor),
    /// Lengths given on the host.
    Values(&'a [i64]),
}

impl<'a> From<&'a Tensor> for CtcLengths<'a> {
    fn from(t: &'a Tensor) -> Self {
        CtcLengths::Tensor(t)
    }
}

impl<'a> From<&'a [i64]> for CtcLengths<'a> {
    fn from(v: &'a [i64]) -> Self {
        CtcLengths::Values(v)
    }
}

impl<'a, const K: usize> From<&'a [i64; K]> for CtcLengths<'a> {
    fn from(v: &'a [i64; K]) -> Self {
        CtcLengths::Values(v)
    }
}

impl<'a> From<&'a Vec<i64>> for CtcLengths<'a> {
    fn from(v: &'a Vec<i64>) -> Self {
        CtcLengths::Values(v)
    }
}

/// The options of [`ctc_loss_with`]; the default is PyTorch's (`blank=0`,
/// `reduction='mean'`, `zero_infinity=False`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtcLossOptions {
    /// The class that stands for "no label" (in `0..C`); targets may not contain it.
    pub blank: usize,
    /// [`Reduction::None`]: each sample's loss (`[N]`, a scalar unbatched);
    /// [`Reduction::Sum`]: their sum; [`Reduction::Mean`]: each loss divided by its target
    /// length (at least 1), then the mean over the batch.
    pub reduction: Reduction,
    /// Infinite losses (targets no alignment fits in the input length) and their gradients
    /// become 0.
    pub zero_infinity: bool,
}

/// PyTorch's `F.ctc_loss` with its defaults (`blank=0`, `reduction='mean'`,
/// `zero_infinity=False`); see [`ctc_loss_with`].
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::ctc_loss;
/// // Two steps of uniform probabilities over {blank, 1}: the label "1" has three
/// // alignments ("1 1", "- 1", "1 -"), each of probability 1/4.
/// let lp = Tensor::from_vec(vec![0.5f64.ln(); 4], [2, 1, 2]);
/// let targets = Tensor::from_vec(vec![1i64], [1, 1]);
/// let l = ctc_loss(&lp, &targets, &[2], &[1]).unwrap();
/// assert!((l.item::<f64>().unwrap() + 0.75f64.ln()).abs() < 1e-12);
/// ```
pub fn ctc_loss<'i, 't>(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: impl Into<CtcLengths<'i>>,
    target_lengths: impl Into<CtcLengths<'t>>,
) -> Result<Tensor> {
    CtcLoss::default().forward(log_probs, targets, input_lengths, target_lengths)
}

/// PyTorch's `F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank,
/// reduction, zero_infinity)`.
///
/// - `log_probs`: `[T, N, C]` log-probabilities over `C` classes (blank included) at each
///   of `T` steps for `N` samples, or unbatched `[T, C]`; f32 or f64 (half types are
///   refused, as PyTorch refuses them). Usually a `log_softmax` over the classes.
/// - `targets`: integer labels, either padded `[N, S]` (sample `n`'s labels are the first
///   `target_lengths[n]` of its row; the rest is not read) or 1-D, every sample's labels
///   concatenated (length `Σ target_lengths`). Unbatched: 1-D of exactly the target length
///   (as PyTorch, whose 1-D targets are the concatenated form), or `[1, S]`.
/// - `input_lengths`: each sample's steps (`≤ T`); `target_lengths`: each sample's labels
///   (`≤ S` when padded). Integer tensors or host values ([`CtcLengths`]).
///
/// A sample's loss is `-ln Σ_π Π_t exp(log_probs[t, n, π_t])` over the alignments `π` of
/// length `input_lengths[n]` that collapse to its labels (merge repeats, then drop
/// blanks): repeated labels need a blank between them, so a target that cannot fit has
/// an infinite loss (0 with `zero_infinity`). An empty target's loss is the all-blank
/// alignment's; with no input steps the loss is 0 for an empty target and infinite
/// otherwise. Reductions as [`CtcLossOptions::reduction`].
///
/// The inputs are realized and read when called, the loss computed in f64 on the host
/// (see the module's doc) and returned in `log_probs`'s dtype on its device. The gradient
/// reaches `log_probs` only: per sample `-Σ α·β / p` of each class at each step (the loss's
/// own derivative, where PyTorch's adds `exp(log_probs)`; the same once through
/// `log_softmax`), 0 at steps past the sample's input length, NaN where the loss is
/// infinite (as PyTorch's) unless `zero_infinity`, which makes it 0.
///
/// Errors (before anything is computed): a `log_probs` that is not a non-empty float
/// `[T, N, C]`/`[T, C]`, `blank` outside `0..C`, targets that are not integers in 1 or 2
/// dimensions, lengths that are not integers or not one per sample, an input length
/// outside `0..=T`, a negative target length or one past the padded targets' `S`, 1-D
/// targets whose length is not `Σ target_lengths`, and a label (within its target length)
/// outside `0..C` or equal to `blank`.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{ctc_loss_with, CtcLossOptions, Reduction};
/// // Label "1 1" needs three steps ("1 - 1"); two steps cannot hold it.
/// let lp = Tensor::from_vec(vec![0.5f64.ln(); 4], [2, 1, 2]);
/// let targets = Tensor::from_vec(vec![1i64, 1], [1, 2]);
/// let opts = CtcLossOptions { reduction: Reduction::None, ..Default::default() };
/// let l = ctc_loss_with(&lp, &targets, &[2], &[2], &opts).unwrap();
/// assert_eq!(l.to_vec::<f64>().unwrap(), vec![f64::INFINITY]);
/// let opts = CtcLossOptions { zero_infinity: true, ..opts };
/// let l = ctc_loss_with(&lp, &targets, &[2], &[2], &opts).unwrap();
/// assert_eq!(l.to_vec::<f64>().unwrap(), vec![0.0]);
/// ```
pub fn ctc_loss_with<'i, 't>(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: impl Into<CtcLengths<'i>>,
    target_lengths: impl Into<CtcLengths<'t>>,
    options: &CtcLossOptions,
) -> Result<Tensor> {
    let (input_lengths, target_lengths) = (input_lengths.into(), target_lengths.into());
    let lp_shape = log_probs.shape().to_vec();
    let dtype = log_probs.dtype();
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(KilnError::UnsupportedDType {
            op: OP,
            dtype,
            detail: if dtype.is_half() {
                ": low precision log_probs are not supported (as in PyTorch); cast to f32".into()
            } else {
                ": log_probs must be a floating point tensor (f32 or f64)".into()
            },
        });
    }
    let batched = match log_probs.ndim() {
        3 => true,
        2 => false,
        nd => {
            return Err(invalid(
                &lp_shape,
                format!("log_probs must be [T, N, C] or unbatched [T, C], not {nd}-D"),
            ));
        }
    };
    let lp3 = if batched {
        log_probs.clone()
    } else {
        log_probs.try_unsqueeze(1)?
    };
    let (t_max, n, c) = (lp3.shape()[0], lp3.shape()[1], lp3.shape()[2]);
    if lp3.numel() == 0 {
        return Err(invalid(&lp_shape, "log_probs must not be empty".into()));
    }
    let blank = options.blank;
    if blank >= c {
        return Err(invalid(
            &lp_shape,
            format!("blank {blank} must be in the label range 0..{c}"),
        ));
    }
    let il = read_lengths("input_lengths", input_lengths, n, &lp_shape)?;
    let tl = read_lengths("target_lengths", target_lengths, n, &lp_shape)?;
    if let Some((b, &v)) = il
        .iter()
        .enumerate()
        .find(|&(_, &v)| v < 0 || v as usize > t_max)
    {
        return Err(invalid(
            &lp_shape,
            format!("input_lengths[{b}] = {v} must be in 0..={t_max} (the input's steps)"),
        ));
    }
    if let Some((b, &v)) = tl.iter().enumerate().find(|&(_, &v)| v < 0) {
        return Err(invalid(
            &lp_shape,
            format!("target_lengths[{b}] = {v} must not be negative"),
        ));
    }
    let labels = read_targets(targets, &tl, n, c, blank, &lp_shape)?;
    let data = no_grad(|| lp3.to_vec::<f64>())?;
    let tracking = is_grad_enabled() && log_probs.requires_grad();
    let zero_infinity = options.zero_infinity;
    let samples: Vec<(f64, Option<Vec<f64>>)> = (0..n)
        .into_par_iter()
        .map(|b| {
            let lp = |t: usize, k: usize| data[(t * n + b) * c + k];
            let mut s = ctc_sample(&lp, il[b] as usize, &labels[b], blank, c, tracking);
            if zero_infinity && s.0 == f64::INFINITY {
                s.0 = 0.0;
                if let Some(g) = &mut s.1 {
                    g.fill(0.0);
                }
            }
            s
        })
        .collect();
    let nll: Vec<f64> = samples.iter().map(|s| s.0).collect();
    let per_sample = constant(nll, &[n], log_probs)?;
    let per_sample = if tracking {
        // The gradient of each sample's loss, [T, N, C]; steps past a sample's input
        // length stay 0.
        let mut grad = vec![0.0; t_max * n * c];
        for (b, (_, g)) in samples.iter().enumerate() {
            for (t, row) in g.iter().flat_map(|g| g.chunks_exact(c)).enumerate() {
                grad[(t * n + b) * c..(t * n + b + 1) * c].copy_from_slice(row);
            }
        }
        let grad = constant(grad, &[t_max, n, c], log_probs)?;
        composite(
            &[&lp3],
            move || Ok(per_sample),
            move |_, _, g| {
                Ok(vec![Some(
                    grad.try_mul(&g.try_reshape([1, n as isize, 1])?)?,
                )])
            },
        )?
    } else {
        per_sample
    };
    let losses = match options.reduction {
        Reduction::Mean => {
            let lengths: Vec<f64> = tl.iter().map(|&v| v.max(1) as f64).collect();
            per_sample.try_div(&constant(lengths, &[n], log_probs)?)?
        }
        _ => per_sample,
    };
    match (options.reduction, batched) {
        (Reduction::None, false) => losses.try_reshape(Vec::<isize>::new()),
        (r, _) => reduce(losses, r),
    }
}

/// PyTorch's `nn.CTCLoss(blank, reduction, zero_infinity)`: [`ctc_loss_with`] with fixed
/// options. It has no parameters and takes four inputs, so it has its own
/// [`CtcLoss::forward`] rather than [`super::Module`]'s one-tensor forward.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::CtcLoss;
/// let lp = Tensor::from_vec(vec![0.5f64.ln(); 4], [2, 2]); // unbatched [T, C]
/// let targets = Tensor::from_vec(vec![1i64], [1]);
/// let l = CtcLoss::default().forward(&lp, &targets, &[2], &[1]).unwrap();
/// assert!((l.item::<f64>().unwrap() + 0.75f64.ln()).abs() < 1e-12);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtcLoss {
    /// The blank class, reduction and `zero_infinity`.
    pub options: CtcLossOptions,
}

impl CtcLoss {
    /// The loss with `options`.
    pub fn new(options: CtcLossOptions) -> CtcLoss {
        CtcLoss { options }
    }

    /// The loss of `log_probs` against `targets` ([`ctc_loss_with`]'s arguments).
    pub fn forward<'i, 't>(
        &self,
        log_probs: &Tensor,
        targets: &Tensor,
        input_lengths: impl Into<CtcLengths<'i>>,
        target_lengths: impl Into<CtcLengths<'t>>,
    ) -> Result<Tensor> {
        ctc_loss_with(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            &self.options,
        )
    }
}

fn invalid(shape: &[usize], reason: String) -> KilnError {
    KilnError::InvalidArgument {
        op: OP,
        shape: shape.to_vec(),
        reason,
    }
}

/// A constant `[shape]` of `like`'s dtype on its device holding `data`.
fn constant(data: Vec<f64>, shape: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::try_from_vec(data, shape)?
        .try_cast(like.dtype())?
        .try_to(like.device())
}

/// One length per sample (`n`), read on the host.
fn read_lengths(
    name: &str,
    lengths: CtcLengths<'_>,
    n: usize,
    lp_shape: &[usize],
) -> Result<Vec<i64>> {
    let values = match lengths {
        CtcLengths::Values(v) => v.to_vec(),
        CtcLengths::Tensor(t) => {
            if !t.dtype().is_int() {
                return Err(KilnError::UnsupportedDType {
                    op: OP,
                    dtype: t.dtype(),
                    detail: format!(": {name} must be integral"),
                });
            }
            if t.ndim() > 1 {
                return Err(KilnError::ShapeMismatch {
                    op: OP,
                    lhs: lp_shape.to_vec(),
                    rhs: t.shape().to_vec(),
                    detail: format!(": {name} must be 1-D (one length per sample)"),
                });
            }
            no_grad(|| t.to_vec::<i64>())?
        }
    };
    if values.len() != n {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: lp_shape.to_vec(),
            rhs: vec![values.len()],
            detail: format!(": {name} must hold one length per sample ({n})"),
        });
    }
    Ok(values)
}

/// Each sample's labels, from padded `[N, S]` or concatenated 1-D `targets`, checked to be
/// classes in `0..c` other than `blank`.
fn read_targets(
    targets: &Tensor,
    tl: &[i64],
    n: usize,
    c: usize,
    blank: usize,
    lp_shape: &[usize],
) -> Result<Vec<Vec<usize>>> {
    let t_shape = targets.shape().to_vec();
    if !targets.dtype().is_int() {
        return Err(KilnError::UnsupportedDType {
            op: OP,
            dtype: targets.dtype(),
            detail: ": targets must be integer labels".into(),
        });
    }
    let mismatch = |detail: String| KilnError::ShapeMismatch {
        op: OP,
        lhs: lp_shape.to_vec(),
        rhs: t_shape.clone(),
        detail,
    };
    let values = no_grad(|| targets.to_vec::<i64>())?;
    // Where sample b's labels start in `values`, and the stride to the next sample.
    let starts: Vec<usize> = match targets.ndim() {
        1 => {
            let total: i64 = tl.iter().sum();
            if total as usize != values.len() {
                return Err(mismatch(format!(
                    ": 1-D (concatenated) targets must hold Σ target_lengths = {total} labels"
                )));
            }
            tl.iter()
                .scan(0usize, |pos, &l| {
                    let start = *pos;
                    *pos += l as usize;
                    Some(start)
                })
                .collect()
        }
        2 => {
            let (rows, s) = (t_shape[0], t_shape[1]);
            if rows != n {
                return Err(mismatch(format!(
                    ": padded targets must have one row per sample ({n})"
                )));
            }
            if let Some((b, &l)) = tl.iter().enumerate().find(|&(_, &l)| l as usize > s) {
                return Err(mismatch(format!(
                    ": target_lengths[{b}] = {l} is more than the padded targets' {s} columns"
                )));
            }
            (0..n).map(|b| b * s).collect()
        }
        nd => {
            return Err(mismatch(format!(
                ": targets must be padded [N, S] or concatenated 1-D, not {nd}-D"
            )));
        }
    };
    let mut labels = Vec::with_capacity(n);
    for b in 0..n {
        let row = &values[starts[b]..starts[b] + tl[b] as usize];
        let mut out = Vec::with_capacity(row.len());
        for (i, &v) in row.iter().enumerate() {
            if v < 0 || v as usize >= c {
                return Err(invalid(
                    &t_shape,
                    format!("label {v} (sample {b}, position {i}) is not a class in 0..{c}"),
                ));
            }
            if v as usize == blank {
                return Err(invalid(
                    &t_shape,
                    format!(
                        "label {v} (sample {b}, position {i}) is the blank, which targets may \
                         not contain"
                    ),
                ));
            }
            out.push(v as usize);
        }
        labels.push(out);
    }
    Ok(labels)
}

/// `ln(eᵃ + eᵇ)`, exact where either is `-inf` (and NaN where either is NaN).
fn log_add(a: f64, b: f64) -> f64 {
    if a == f64::NEG_INFINITY {
        return b;
    }
    if b == f64::NEG_INFINITY {
        return a;
    }
    let m = if a > b { a } else { b };
    m + ((a - m).exp() + (b - m).exp()).ln()
}

/// One sample's loss and, with `grad`, the loss's gradient with respect to its
/// log-probabilities (`[steps, c]`): the forward variable `α` over the extended labels
/// `l'` (blank, l₁, blank, l₂, …, blank), and with `grad` the backward variable `β`, both
/// in log space. Here `α_t(s)` includes step `t`'s emission and `β_t(s)` does not, so
/// `α_t(s)·β_t(s)` is the probability of the alignments through state `s` at step `t`,
/// which is also the derivative of the total probability `p` with respect to
/// `log_probs[t, l'_s]`: the gradient of `-ln p` is `-Σ_{s: l'_s = k} α_t(s)·β_t(s) / p`.
fn ctc_sample(
    lp: &dyn Fn(usize, usize) -> f64,
    steps: usize,
    labels: &[usize],
    blank: usize,
    c: usize,
    grad: bool,
) -> (f64, Option<Vec<f64>>) {
    if steps == 0 {
        let nll = if labels.is_empty() {
            0.0
        } else {
            f64::INFINITY
        };
        return (nll, grad.then(Vec::new));
    }
    let states = 2 * labels.len() + 1;
    let label = |s: usize| {
        if s.is_multiple_of(2) {
            blank
        } else {
            labels[s / 2]
        }
    };
    // A state may be entered from two states back: a label different from the one before.
    let skip = |s: usize| s % 2 == 1 && s >= 2 && labels[s / 2] != labels[s / 2 - 1];
    let neg = f64::NEG_INFINITY;
    let mut alpha = vec![neg; steps * states];
    alpha[0] = lp(0, blank);
    if states > 1 {
        alpha[1] = lp(0, label(1));
    }
    for t in 1..steps {
        let (prev, cur) = alpha.split_at_mut(t * states);
        let prev = &prev[(t - 1) * states..];
        for s in 0..states {
            let mut a = prev[s];
            if s >= 1 {
                a = log_add(a, prev[s - 1]);
            }
            if skip(s) {
                a = log_add(a, prev[s - 2]);
            }
            cur[s] = a + lp(t, label(s));
        }
    }
    let last = &alpha[(steps - 1) * states..];
    let log_p = if states > 1 {
        log_add(last[states - 1], last[states - 2])
    } else {
        last[0]
    };
    let nll = -log_p;
    if !grad {
        return (nll, None);
    }
    if log_p == neg {
        // No alignment fits: the derivative is undefined (PyTorch's is NaN too).
        return (nll, Some(vec![f64::NAN; steps * c]));
    }
    let mut beta = vec![neg; steps * states];
    beta[(steps - 1) * states + states - 1] = 0.0;
    if states > 1 {
        beta[(steps - 1) * states + states - 2] = 0.0;
    }
    for t in (0..steps - 1).rev() {
        let (cur, next) = beta.split_at_mut((t + 1) * states);
        let cur = &mut cur[t * states..];
        let next = &next[..states];
        let from = |s: usize| next[s] + lp(t + 1, label(s));
        for (s, out) in cur.iter_mut().enumerate() {
            let mut b = from(s);
            if s + 1 < states {
                b = log_add(b, from(s + 1));
            }
            if s + 2 < states && skip(s + 2) {
                b = log_add(b, from(s + 2));
            }
            *out = b;
        }
    }
    let mut g = vec![0.0; steps * c];
    for t in 0..steps {
        for s in 0..states {
            let ab = alpha[t * states + s] + beta[t * states + s];
            if ab != neg {
                g[t * c + label(s)] -= (ab - log_p).exp();
            }
        }
    }
    (nll, Some(g))
}
