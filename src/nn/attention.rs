//! Multi-head causal self-attention and the pre-LayerNorm transformer block.

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
