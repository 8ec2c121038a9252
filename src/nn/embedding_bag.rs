//! PyTorch's `F.embedding_bag` and `nn.EmbeddingBag`: sums, means or maxima of bags of
//! embedding rows without materializing the per-id rows as a separate result.
//!
//! The bags are laid out as a `[B, Lmax]` table of positions (from the offsets, read on the
//! host, or the 2-D input as it is) with a mask of the entries that count; the rows are one
//! indexed load ([`Tensor::embedding`]), masked and reduced over the bag dimension, so the
//! gradient reaches the table (and the per-sample weights) through those ops.

use super::Module;
use super::layers::Embedding;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// PyTorch's `mode` of [`embedding_bag`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmbeddingBagMode {
    /// `"sum"`.
    Sum,
    /// `"mean"`, PyTorch's default.
    #[default]
    Mean,
    /// `"max"`: the elementwise maximum (the gradient reaches the first largest row).
    Max,
}

fn invalid(shape: &[usize], reason: String) -> KilnError {
    KilnError::InvalidArgument {
        op: "embedding_bag",
        shape: shape.to_vec(),
        reason,
    }
}

/// PyTorch's `F.embedding_bag(input, weight, offsets, mode=..., per_sample_weights=...,
/// include_last_offset=..., padding_idx=...)`: one row per bag, reducing the `weight`
/// (`[num_embeddings, dim]`) rows of the bag's ids. `input` is either 2-D `[B, L]` (each
/// row a bag, `offsets` `None`) or 1-D with `offsets` (1-D, each bag's start; the first
/// must be 0, they must not decrease; with `include_last_offset` the last one is the end
/// of the last bag rather than a bag's start). `per_sample_weights` (the input's shape,
/// [`EmbeddingBagMode::Sum`] only) scales each row. Ids equal to `padding_idx` (negative
/// counts from the end) are left out, also of a mean's count; an empty bag gives zeros.
/// The offsets are read on the host when called (realizing them). An id out of range
/// fails when realized. Result `[B, dim]`.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{embedding_bag, EmbeddingBagMode};
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]);
/// let ids = Tensor::from_vec(vec![0i64, 2, 1], [3]);
/// let offsets = Tensor::from_vec(vec![0i64, 2], [2]);
/// let y = embedding_bag(&ids, &w, Some(&offsets), EmbeddingBagMode::Sum, None, false, None).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![6.0, 8.0, 3.0, 4.0]);
/// ```
pub fn embedding_bag(
    input: &Tensor,
    weight: &Tensor,
    offsets: Option<&Tensor>,
    mode: EmbeddingBagMode,
    per_sample_weights: Option<&Tensor>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
) -> Result<Tensor> {
    let shape = input.shape();
    if weight.ndim() != 2 || !weight.dtype().is_float() {
        return Err(invalid(
            weight.shape(),
            "the weight must be a 2-D float table [num_embeddings, dim]".into(),
        ));
    }
    if !input.dtype().is_int() {
        return Err(KilnError::UnsupportedDType {
            op: "embedding_bag",
            dtype: input.dtype(),
            detail: ": the input must hold integer ids".into(),
        });
    }
    let (count, dim) = (weight.shape()[0], weight.shape()[1]);
    if count == 0 && input.numel() > 0 {
        // Every id is out of range of an empty table (PyTorch's index error); refused here,
        // as the masked lookup below would read row 0 of nothing.
        return Err(invalid(
            weight.shape(),
            format!(
                "the table has no rows, so none of the input's {} ids can be looked up",
                input.numel()
            ),
        ));
    }
    if let Some(p) = per_sample_weights {
        if mode != EmbeddingBagMode::Sum {
            return Err(invalid(
                shape,
                "per_sample_weights is only supported for mode sum".into(),
            ));
        }
        if p.shape() != shape {
            return Err(KilnError::ShapeMismatch {
                op: "embedding_bag",
                lhs: shape.to_vec(),
                rhs: p.shape().to_vec(),
                detail: ": per_sample_weights must have the input's shape".into(),
            });
        }
    }
    let pad = padding_idx
        .map(|p| super::functional::padding_index("embedding_bag", p, count, weight.shape()))
        .transpose()?;
    let ids = input.try_cast(DType::I64)?;
    // The bags as [B, Lmax] ids (and per-sample weights) with the mask of real entries.
    let (ids, psw, mut valid) = match (input.ndim(), offsets) {
        (2, None) => (
            ids,
            per_sample_weights.cloned(),
            Tensor::try_full_on(shape, true, DType::Bool, input.device())?,
        ),
        (1, Some(off)) => {
            if off.ndim() != 1 || !off.dtype().is_int() {
                return Err(invalid(
                    off.shape(),
                    "offsets must be a 1-D integer tensor".into(),
                ));
            }
            let starts = off.try_cast(DType::I64)?.to_vec::<i64>()?;
            let len = shape[0] as i64;
            let bags = starts.len() - usize::from(include_last_offset && !starts.is_empty());
            let bad_order = starts.windows(2).any(|w| w[0] > w[1]);
            if starts.first().is_some_and(|&s| s != 0)
                || bad_order
                || starts.last().is_some_and(|&s| s > len)
            {
                return Err(invalid(
                    shape,
                    format!(
                        "offsets {starts:?} must start at 0, not decrease, and not pass the \
                         input's {len} ids"
                    ),
                ));
            }
            let end = |b: usize| starts.get(b + 1).copied().unwrap_or(len);
            if bags == 0 || (0..bags).all(|b| end(b) == starts[b]) {
                return Tensor::try_full_on([bags, dim], 0.0, weight.dtype(), weight.device());
            }
            // Each id's bag (ids past the last bag belong to none). Linear in the ids: a
            // padded [bags, longest bag] layout would be quadratic for many short bags
            // beside one long one.
            let mut bag_of = Vec::with_capacity(shape[0]);
            for (b, &start) in starts.iter().enumerate().take(bags) {
                bag_of.extend(std::iter::repeat_n(b as i64, (end(b) - start) as usize));
            }
            let inside = Tensor::try_full_on([bag_of.len()], true, DType::Bool, input.device())?
                .try_pad(&[(0, shape[0] - bag_of.len())], false)?;
            bag_of.resize(shape[0], 0);
            let bag_of = Tensor::try_from_vec(bag_of, [shape[0]])?.try_to(input.device())?;
            let pad = pad.map(|p| p as i64);
            return segments(
                &ids,
                weight,
                per_sample_weights,
                &bag_of,
                inside,
                bags,
                mode,
                pad,
            );
        }
        (2, Some(_)) => {
            return Err(invalid(
                shape,
                "offsets must be None for a 2-D input (each row is a bag)".into(),
            ));
        }
        (1, None) => {
            return Err(invalid(
                shape,
                "a 1-D input needs offsets (each bag's start)".into(),
            ));
        }
        (nd, _) => {
            return Err(invalid(
                shape,
                format!("expects a 1-D (with offsets) or 2-D input, not {nd}-D"),
            ));
        }
    };
    let bags = ids.shape()[0];
    if ids.shape()[1] == 0 {
        return Tensor::try_full_on([bags, dim], 0.0, weight.dtype(), weight.device());
    }
    if let Some(p) = pad {
        valid = valid.try_logical_and(&ids.try_ne(p as i64)?)?;
    }
    let safe = Tensor::try_where(&valid, &ids, 0i64)?;
    let mut rows = Tensor::try_embedding(&safe, weight)?; // [B, Lmax, dim]
    if let Some(p) = psw {
        rows = rows.try_mul(&p.try_cast(weight.dtype())?.try_unsqueeze(2)?)?;
    }
    let keep = valid.try_unsqueeze(2)?;
    match mode {
        EmbeddingBagMode::Sum => Tensor::try_where(&keep, &rows, 0.0)?.try_sum(1),
        EmbeddingBagMode::Mean => {
            let n = valid
                .try_cast(weight.dtype())?
                .try_sum_keepdim(1)?
                .try_clamp_min(1.0)?;
            Tensor::try_where(&keep, &rows, 0.0)?
                .try_sum(1)?
                .try_div(&n)
        }
        EmbeddingBagMode::Max => {
            let (m, _) =
                Tensor::try_where(&keep, &rows, f64::NEG_INFINITY)?.try_max_dim(1, false)?;
            let any = valid.try_any_keepdim(1)?;
            Tensor::try_where(&any, &m, 0.0)
        }
    }
}

/// The bags of 1-D `ids` (i64, `[L]`): id `j` belongs to bag `bag_of[j]` when `inside[j]`
/// (and it is not `pad`). Sums and means are `index_add`s into `[bags, dim]`; the max
/// takes, per bag and feature, the first largest row (or the first NaN) with a `gather`,
/// so the gradient reaches that one element, as the padded layout's `max_dim` did.
#[allow(clippy::too_many_arguments)]
fn segments(
    ids: &Tensor,
    weight: &Tensor,
    per_sample_weights: Option<&Tensor>,
    bag_of: &Tensor,
    inside: Tensor,
    bags: usize,
    mode: EmbeddingBagMode,
    pad: Option<i64>,
) -> Result<Tensor> {
    let (len, dim) = (ids.shape()[0], weight.shape()[1]);
    let (dtype, device) = (weight.dtype(), weight.device());
    let valid = match pad {
        Some(p) => inside.try_logical_and(&ids.try_ne(p)?)?,
        None => inside,
    };
    let safe = Tensor::try_where(&valid, ids, 0i64)?;
    let mut rows = Tensor::try_embedding(&safe, weight)?; // [L, dim]
    if let Some(p) = per_sample_weights {
        rows = rows.try_mul(&p.try_cast(dtype)?.try_unsqueeze(1)?)?;
    }
    let keep = valid.try_unsqueeze(1)?;
    let zeros = |shape: &[usize]| Tensor::try_full_on(shape, 0.0, dtype, device);
    match mode {
        EmbeddingBagMode::Sum => {
            zeros(&[bags, dim])?.try_index_add(0, bag_of, &Tensor::try_where(&keep, &rows, 0.0)?)
        }
        EmbeddingBagMode::Mean => {
            let n = zeros(&[bags])?
                .try_index_add(0, bag_of, &valid.try_cast(dtype)?)?
                .try_clamp_min(1.0)?
                .try_unsqueeze(1)?;
            zeros(&[bags, dim])?
                .try_index_add(0, bag_of, &Tensor::try_where(&keep, &rows, 0.0)?)?
                .try_div(&n)
        }
        EmbeddingBagMode::Max => {
            let at = bag_of.try_unsqueeze(1)?.try_broadcast_to([len, dim])?;
            let masked = Tensor::try_where(&keep, &rows, f64::NEG_INFINITY)?;
            let best =
                zeros(&[bags, dim])?.try_scatter_reduce(0, &at, &masked.detach(), "amax", false)?;
            let best = best.try_index_select(0, bag_of)?;
            let same = masked
                .try_eq(&best)?
                .try_logical_or(&masked.try_isnan()?.try_logical_and(&best.try_isnan()?)?)?
                .try_logical_and(&keep)?;
            let positions = Tensor::try_arange(0, len as i64, 1, DType::I64)?
                .try_to(device)?
                .try_unsqueeze(1)?
                .try_broadcast_to([len, dim])?;
            let candidates = Tensor::try_where(&same, &positions, len as i64)?;
            let first = Tensor::try_full_on([bags, dim], len as i64, DType::I64, device)?
                .try_scatter_reduce(0, &at, &candidates, "amin", true)?;
            let any = first.try_lt(len as i64)?;
            let picked = rows.try_gather(0, &first.try_clamp(0i64, len as i64 - 1)?)?;
            Tensor::try_where(&any, &picked, 0.0)
        }
    }
}

/// PyTorch's `nn.EmbeddingBag(num_embeddings, embedding_dim, mode, include_last_offset,
/// padding_idx)`: a learnable table (initialized as [`Embedding`]'s) reduced per bag by
/// [`embedding_bag`]. [`Module::forward`] takes a 2-D input (each row a bag);
/// [`EmbeddingBag::forward_with`] takes offsets and per-sample weights.
#[derive(Debug)]
pub struct EmbeddingBag {
    /// The table, `[num_embeddings, dim]`.
    pub weight: Tensor,
    /// How each bag reduces.
    pub mode: EmbeddingBagMode,
    /// PyTorch's `include_last_offset`.
    pub include_last_offset: bool,
    /// The id left out of every bag (its row starts at zeros).
    pub padding_idx: Option<usize>,
}

impl EmbeddingBag {
    /// A table of `count` vectors of `dim` features, initialized from `seed`.
    pub fn new(
        count: usize,
        dim: usize,
        mode: EmbeddingBagMode,
        seed: u64,
    ) -> Result<EmbeddingBag> {
        Ok(EmbeddingBag {
            weight: Embedding::new(count, dim, seed)?.weight,
            mode,
            include_last_offset: false,
            padding_idx: None,
        })
    }

    /// [`EmbeddingBag::new`] with PyTorch's `padding_idx` (negative counts from the end):
    /// that row starts at zeros and its ids are left out of the bags.
    pub fn with_padding_idx(
        count: usize,
        dim: usize,
        mode: EmbeddingBagMode,
        padding_idx: i64,
        seed: u64,
    ) -> Result<EmbeddingBag> {
        let table = Embedding::with_padding_idx(count, dim, padding_idx, seed)?;
        Ok(EmbeddingBag {
            weight: table.weight,
            mode,
            include_last_offset: false,
            padding_idx: table.padding_idx,
        })
    }

    /// The bags of `input` (1-D with `offsets`, or 2-D), optionally weighted (sum mode).
    pub fn forward_with(
        &self,
        input: &Tensor,
        offsets: Option<&Tensor>,
        per_sample_weights: Option<&Tensor>,
    ) -> Result<Tensor> {
        embedding_bag(
            input,
            &self.weight,
            offsets,
            self.mode,
            per_sample_weights,
            self.include_last_offset,
            self.padding_idx.map(|p| p as i64),
        )
    }
}

impl Module for EmbeddingBag {
    /// A 2-D input `[B, L]`, each row a bag, to `[B, dim]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, None, None)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        f("weight", &self.weight);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        f("weight", &mut self.weight);
    }

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}
