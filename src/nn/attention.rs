//! Multi-head causal self-attention, the pre-LayerNorm transformer block, and PyTorch's
//! `F.scaled_dot_product_attention`.

use super::init::derive_seed;
use super::{
    Dropout, Gelu, LayerNorm, Linear, Module, visit_child, visit_child_buffers,
    visit_child_buffers_mut, visit_child_mut,
};
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// Multi-head causal self-attention over `[batch, time, dim]`: one fused `qkv` projection,
/// scaled dot products with a causal mask (generated positions: no mask tensor is stored),
/// softmax, the weighted sum of values, an output projection.
#[derive(Debug)]
pub struct CausalSelfAttention {
    /// Projection `dim → 3·dim`: queries, keys and values, in that order along the last axis.
    pub qkv: Linear,
    /// Output projection `dim → dim`.
    pub proj: Linear,
    /// Number of attention heads (divides `dim`).
    pub heads: usize,
    /// Dropout on the attention weights (after the softmax).
    pub dropout: Dropout,
}

impl CausalSelfAttention {
    /// Attention over `dim` features split into `heads` heads.
    pub fn new(dim: usize, heads: usize, dropout: f64, seed: u64) -> Result<Self> {
        if heads == 0 || !dim.is_multiple_of(heads) {
            return Err(KilnError::InvalidArgument {
                op: "CausalSelfAttention",
                shape: vec![dim],
                reason: format!("{dim} features do not split into {heads} heads"),
            });
        }
        Ok(CausalSelfAttention {
            qkv: Linear::new(dim, 3 * dim, true, derive_seed(seed, "attn.qkv"))?,
            proj: Linear::new(dim, dim, true, derive_seed(seed, "attn.proj"))?,
            heads,
            dropout: Dropout::new(dropout, derive_seed(seed, "attn.dropout")),
        })
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.ndim() != 3 {
            return Err(KilnError::InvalidShape {
                op: "CausalSelfAttention",
                shape: x.shape().to_vec(),
                requested: vec![-1, -1, -1],
                reason: "expects [batch, time, dim]".into(),
            });
        }
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let (nh, hs) = (self.heads, c / self.heads);
        let qkv = self.qkv.forward(x)?;
        let heads = |i: usize| -> Result<Tensor> {
            qkv.try_slice_dim(-1, (i * c) as isize, ((i + 1) * c) as isize, 1)?
                .try_reshape([b as isize, t as isize, nh as isize, hs as isize])?
                .try_permute([0, 2, 1, 3])
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let scores = q
            .try_matmul(&k.try_transpose(-2, -1)?)?
            .try_mul(1.0 / (hs as f64).sqrt())?;
        // Causal: position i attends to j <= i.
        let future = Tensor::ones_dtype([t, t], scores.dtype())
            .try_to(x.device())?
            .try_triu(1)?
            .try_ne(0)?;
        let att =
            super::functional::softmax(&scores.try_masked_fill(&future, f64::NEG_INFINITY)?, -1)?;
        let att = self.dropout.forward(&att)?;
        let y = att
            .try_matmul(&v)?
            .try_permute([0, 2, 1, 3])?
            .try_reshape([b as isize, t as isize, c as isize])?;
        self.proj.forward(&y)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        visit_child("qkv", &self.qkv, f);
        visit_child("proj", &self.proj, f);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        visit_child_mut("qkv", &mut self.qkv, f);
        visit_child_mut("proj", &mut self.proj, f);
    }

    fn visit_buffers(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        visit_child_buffers("qkv", &self.qkv, f);
        visit_child_buffers("proj", &self.proj, f);
    }

    fn visit_buffers_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        visit_child_buffers_mut("qkv", &mut self.qkv, f);
        visit_child_buffers_mut("proj", &mut self.proj, f);
    }

    fn set_training(&mut self, training: bool) {
        self.dropout.set_training(training);
    }
}

/// A pre-LayerNorm transformer block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))` with a
/// GELU MLP four times as wide.
#[derive(Debug)]
pub struct Block {
    /// LayerNorm before the attention.
    pub ln1: LayerNorm,
    /// The self-attention.
    pub attn: CausalSelfAttention,
    /// LayerNorm before the MLP.
    pub ln2: LayerNorm,
    /// The MLP's first layer, `dim → 4·dim` (followed by GELU).
    pub fc: Linear,
    /// The MLP's second layer, `4·dim → dim`.
    pub proj: Linear,
    /// Dropout on the MLP's output, before the residual add.
    pub dropout: Dropout,
}

impl Block {
    /// A block over `dim` features with `heads` attention heads.
    pub fn new(dim: usize, heads: usize, dropout: f64, seed: u64) -> Result<Block> {
        Ok(Block {
            ln1: LayerNorm::new(dim)?,
            attn: CausalSelfAttention::new(dim, heads, dropout, derive_seed(seed, "block.attn"))?,
            ln2: LayerNorm::new(dim)?,
            fc: Linear::new(dim, 4 * dim, true, derive_seed(seed, "block.fc"))?,
            proj: Linear::new(4 * dim, dim, true, derive_seed(seed, "block.proj"))?,
            dropout: Dropout::new(dropout, derive_seed(seed, "block.dropout")),
        })
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.try_add(&self.attn.forward(&self.ln1.forward(x)?)?)?;
        let h = Gelu.forward(&self.fc.forward(&self.ln2.forward(&x)?)?)?;
        x.try_add(&self.dropout.forward(&self.proj.forward(&h)?)?)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        visit_child("ln1", &self.ln1, f);
        visit_child("attn", &self.attn, f);
        visit_child("ln2", &self.ln2, f);
        visit_child("mlp.fc", &self.fc, f);
        visit_child("mlp.proj", &self.proj, f);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        visit_child_mut("ln1", &mut self.ln1, f);
        visit_child_mut("attn", &mut self.attn, f);
        visit_child_mut("ln2", &mut self.ln2, f);
        visit_child_mut("mlp.fc", &mut self.fc, f);
        visit_child_mut("mlp.proj", &mut self.proj, f);
    }

    fn visit_buffers(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        visit_child_buffers("ln1", &self.ln1, f);
        visit_child_buffers("attn", &self.attn, f);
        visit_child_buffers("ln2", &self.ln2, f);
        visit_child_buffers("mlp.fc", &self.fc, f);
        visit_child_buffers("mlp.proj", &self.proj, f);
    }

    fn visit_buffers_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        visit_child_buffers_mut("ln1", &mut self.ln1, f);
        visit_child_buffers_mut("attn", &mut self.attn, f);
        visit_child_buffers_mut("ln2", &mut self.ln2, f);
        visit_child_buffers_mut("mlp.fc", &mut self.fc, f);
        visit_child_buffers_mut("mlp.proj", &mut self.proj, f);
    }

    fn set_training(&mut self, training: bool) {
        self.attn.set_training(training);
        self.dropout.set_training(training);
    }
}

/// PyTorch's `F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
/// is_causal, scale)`: `softmax(q·kᵀ·scale + bias)·v` over `q [.., L, E]`, `k [.., S, E]`,
/// `v [.., S, Ev]` (leading dimensions broadcast, as in `matmul`), giving `[.., L, Ev]`.
/// `scale` defaults to `1/√E`. A bool `attn_mask` (broadcasting to `[.., L, S]`) keeps the
/// scores where it is true; a float one is added to them. `is_causal` keeps `j ≤ i`
/// (the top-left aligned lower triangle of `[L, S]`, as PyTorch's) and excludes a mask.
/// A query whose every score is masked attends to nothing and gives zeros (with zero
/// gradients), as PyTorch's `_safe_softmax` does, rather than NaN. `dropout_p > 0` drops
/// attention weights with kiln's counter-based [`super::functional::dropout`] under
/// `dropout_seed` (PyTorch draws from its global generator). Recorded as primitives, so
/// it fuses and differentiates like any composite; no flash kernel.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::scaled_dot_product_attention;
/// let q = Tensor::from_vec(vec![1.0f32, 0.0], [1, 1, 2]);
/// let k = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], [1, 2, 2]);
/// let v = Tensor::from_vec(vec![10.0f32, 20.0], [1, 2, 1]);
/// // With a causal mask the first query sees only the first key.
/// let y = scaled_dot_product_attention(&q, &k, &v, None, 0.0, 0, true, None).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![10.0]);
/// ```
#[allow(clippy::too_many_arguments)]
pub fn scaled_dot_product_attention(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    dropout_seed: u64,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    const OP: &str = "scaled_dot_product_attention";
    for t in [query, key, value] {
        if t.ndim() < 2 {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: t.shape().to_vec(),
                reason: "query, key and value need [.., L, E] shapes (2 or more dimensions)".into(),
            });
        }
    }
    if is_causal && attn_mask.is_some() {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: query.shape().to_vec(),
            reason: "an explicit attn_mask should not be set when is_causal is true, as PyTorch \
                     requires"
                .into(),
        });
    }
    if !(0.0..1.0).contains(&dropout_p) {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: query.shape().to_vec(),
            reason: format!("dropout_p must lie in [0, 1), not {dropout_p}"),
        });
    }
    let e = query.shape()[query.ndim() - 1];
    let (l, s) = (query.shape()[query.ndim() - 2], key.shape()[key.ndim() - 2]);
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let mut scores = query
        .try_matmul(&key.try_transpose(-2, -1)?)?
        .try_mul(scale)?;
    let keep = if is_causal {
        Some(
            Tensor::try_ones_dtype([l, s], crate::dtype::DType::Bool)?
                .try_to(query.device())?
                .try_tril(0)?,
        )
    } else {
        match attn_mask {
            Some(m) if m.dtype() == crate::dtype::DType::Bool => Some(m.clone()),
            Some(m) => {
                scores = scores.try_add(m)?;
                None
            }
            None => None,
        }
    };
    if let Some(keep) = keep {
        scores = Tensor::try_where(&keep, &scores, f64::NEG_INFINITY)?;
    }
    let mut weights = safe_softmax(&scores)?;
    if dropout_p > 0.0 {
        weights = super::functional::dropout(&weights, dropout_p, true, dropout_seed)?;
    }
    weights.try_matmul(value)
}

/// Softmax over the last dimension, where a row with every score at `-inf` gives zeros
/// (with zero gradients) instead of NaN, as PyTorch's `_safe_softmax`.
pub(crate) fn safe_softmax(scores: &Tensor) -> Result<Tensor> {
    // Such a row: softmax over zeros instead (finite), then zeros.
    let dead = scores.try_max_keepdim(-1)?.try_eq(f64::NEG_INFINITY)?;
    let finite = Tensor::try_where(&dead, 0.0, scores)?;
    Tensor::try_where(&dead, 0.0, &super::functional::softmax(&finite, -1)?)
}
