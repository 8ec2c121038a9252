//! PyTorch's `nn.MultiheadAttention`: input projections, scaled dot-product attention over
//! several heads with key-padding and attention masks, an output projection, and the
//! attention weights when asked.

use super::attention::{safe_softmax, scaled_dot_product_attention};
use super::conv::require_float;
use super::init::{constant, derive_seed, fans, xavier_normal, xavier_uniform};
use super::{Linear, Module, functional, visit_child, visit_child_mut};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;
use std::cell::Cell;

const OP: &str = "MultiheadAttention";

/// The options of PyTorch's `nn.MultiheadAttention` constructor, with PyTorch's defaults
/// (`MultiheadAttentionOptions::default()`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MultiheadAttentionOptions {
    /// Dropout probability on the attention weights, in training only.
    pub dropout: f64,
    /// Whether the input and output projections have biases.
    pub bias: bool,
    /// Learned `bias_k`, `bias_v` (`[1, 1, embed_dim]`) appended to the keys and values
    /// as one more source position.
    pub add_bias_kv: bool,
    /// A zero key and value appended (after `bias_k`/`bias_v`) as one more source position.
    pub add_zero_attn: bool,
    /// The keys' feature count (`None`: `embed_dim`).
    pub kdim: Option<usize>,
    /// The values' feature count (`None`: `embed_dim`).
    pub vdim: Option<usize>,
    /// Inputs and outputs `[batch, seq, feature]` instead of `[seq, batch, feature]`.
    pub batch_first: bool,
}

impl Default for MultiheadAttentionOptions {
    fn default() -> Self {
        MultiheadAttentionOptions {
            dropout: 0.0,
            bias: true,
            add_bias_kv: false,
            add_zero_attn: false,
            kdim: None,
            vdim: None,
            batch_first: false,
        }
    }
}

/// The arguments of PyTorch's `MultiheadAttention.forward` after `query`, `key`, `value`,
/// with PyTorch's defaults (`MultiheadAttentionArgs::default()`: no masks, weights
/// wanted and averaged over heads, not causal).
#[derive(Debug, Clone, Copy)]
pub struct MultiheadAttentionArgs<'a> {
    /// `[batch, source]` (`[source]` unbatched): a bool mask is true where a key is
    /// ignored; a float mask is added to the scores.
    pub key_padding_mask: Option<&'a Tensor>,
    /// Whether to return the attention weights.
    pub need_weights: bool,
    /// `[target, source]` or `[batch·heads, target, source]`: a bool mask is true where
    /// attending is not allowed; a float mask is added to the scores.
    pub attn_mask: Option<&'a Tensor>,
    /// Whether the returned weights are averaged over heads (`[batch, target, source]`)
    /// rather than per head (`[batch, heads, target, source]`).
    pub average_attn_weights: bool,
    /// PyTorch's hint that `attn_mask` is the causal mask: it still needs `attn_mask`;
    /// with neither a key padding mask nor weights wanted, the causal triangle is used in
    /// place of `attn_mask`, as PyTorch does.
    pub is_causal: bool,
}

impl Default for MultiheadAttentionArgs<'_> {
    fn default() -> Self {
        MultiheadAttentionArgs {
            key_padding_mask: None,
            need_weights: true,
            attn_mask: None,
            average_attn_weights: true,
            is_causal: false,
        }
    }
}

/// PyTorch's `nn.MultiheadAttention(embed_dim, num_heads, dropout, bias, add_bias_kv,
/// add_zero_attn, kdim, vdim, batch_first)`: queries, keys and values are projected
/// (`in_proj_weight [3·embed_dim, embed_dim]` and `in_proj_bias [3·embed_dim]`, or
/// `q_proj_weight`, `k_proj_weight [embed_dim, kdim]`, `v_proj_weight [embed_dim, vdim]`
/// when `kdim` or `vdim` differ from `embed_dim`), split into heads, attend with
/// `softmax(q·kᵀ/√head_dim + mask)`, and are merged and projected by `out_proj`.
/// Parameter names, shapes and initialization are PyTorch's (xavier-uniform input
/// projections, zero biases, `bias_k`/`bias_v` xavier-normal), so a PyTorch `state_dict`
/// loads by name.
///
/// ```
/// use kiln::nn::{Module, MultiheadAttention, MultiheadAttentionArgs};
/// use kiln::Tensor;
/// let mha = MultiheadAttention::new(8, 2, 0).unwrap();
/// let names: Vec<String> = mha.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
/// let x = Tensor::randn_seeded(&[5, 3, 8], 1); // [seq, batch, embed]
/// let (y, w) = mha.forward_attention(&x, &x, &x, &MultiheadAttentionArgs::default()).unwrap();
/// assert_eq!((y.shape(), w.unwrap().shape()), (&[5, 3, 8][..], &[3, 5, 5][..]));
/// ```
#[derive(Debug, Clone)]
pub struct MultiheadAttention {
    /// `[3·embed_dim, embed_dim]`: the query, key and value projections stacked (when
    /// `kdim` and `vdim` equal `embed_dim`).
    pub in_proj_weight: Option<Tensor>,
    /// `[embed_dim, embed_dim]` (when `kdim` or `vdim` differ from `embed_dim`).
    pub q_proj_weight: Option<Tensor>,
    /// `[embed_dim, kdim]` (when `kdim` or `vdim` differ from `embed_dim`).
    pub k_proj_weight: Option<Tensor>,
    /// `[embed_dim, vdim]` (when `kdim` or `vdim` differ from `embed_dim`).
    pub v_proj_weight: Option<Tensor>,
    /// `[3·embed_dim]`, with `bias`.
    pub in_proj_bias: Option<Tensor>,
    /// `[1, 1, embed_dim]`, with `add_bias_kv`.
    pub bias_k: Option<Tensor>,
    /// `[1, 1, embed_dim]`, with `add_bias_kv`.
    pub bias_v: Option<Tensor>,
    /// The output projection `embed_dim → embed_dim` (its bias starts at zero).
    pub out_proj: Linear,
    embed_dim: usize,
    num_heads: usize,
    options: MultiheadAttentionOptions,
    training: bool,
    seed: Cell<u64>,
}

impl MultiheadAttention {
    /// PyTorch's `nn.MultiheadAttention(embed_dim, num_heads)`, initialized from `seed`.
    pub fn new(embed_dim: usize, num_heads: usize, seed: u64) -> Result<MultiheadAttention> {
        MultiheadAttention::with_options(
            embed_dim,
            num_heads,
            MultiheadAttentionOptions::default(),
            seed,
        )
    }

    /// PyTorch's constructor with every option, initialized from `seed`. `embed_dim` must
    /// split into `num_heads` heads, and `dropout` lie in `[0, 1]`.
    pub fn with_options(
        embed_dim: usize,
        num_heads: usize,
        options: MultiheadAttentionOptions,
        seed: u64,
    ) -> Result<MultiheadAttention> {
        let bad = |reason: String| {
            Err(KilnError::InvalidArgument {
                op: OP,
                shape: vec![embed_dim, num_heads],
                reason,
            })
        };
        if embed_dim == 0 || num_heads == 0 {
            return bad("embed_dim and num_heads must be greater than zero".into());
        }
        if !embed_dim.is_multiple_of(num_heads) {
            return bad(format!(
                "embed_dim {embed_dim} must be divisible by num_heads {num_heads}"
            ));
        }
        if !(0.0..=1.0).contains(&options.dropout) {
            return bad(format!(
                "dropout should be a probability in [0, 1], not {}",
                options.dropout
            ));
        }
        let (kdim, vdim) = (
            options.kdim.unwrap_or(embed_dim),
            options.vdim.unwrap_or(embed_dim),
        );
        let e = embed_dim;
        let xavier = |shape: &[usize], name: &str| -> Result<Tensor> {
            let (fan_in, fan_out) = fans(shape)?;
            xavier_uniform(shape, fan_in, fan_out, derive_seed(seed, name))
        };
        let same = kdim == e && vdim == e;
        let separate = |shape: &[usize], name: &str| -> Result<Option<Tensor>> {
            if same {
                Ok(None)
            } else {
                xavier(shape, name).map(Some)
            }
        };
        let bias_kv = |name: &str| -> Result<Option<Tensor>> {
            if options.add_bias_kv {
                let shape = [1, 1, e];
                let (fan_in, fan_out) = fans(&shape)?;
                xavier_normal(&shape, fan_in, fan_out, derive_seed(seed, name)).map(Some)
            } else {
                Ok(None)
            }
        };
        let mut out_proj = Linear::new(e, e, options.bias, derive_seed(seed, "out_proj"))?;
        if options.bias {
            out_proj.bias = Some(constant(&[e], 0.0)?);
        }
        Ok(MultiheadAttention {
            in_proj_weight: if same {
                Some(xavier(&[3 * e, e], "in_proj_weight")?)
            } else {
                None
            },
            q_proj_weight: separate(&[e, e], "q_proj_weight")?,
            k_proj_weight: separate(&[e, kdim], "k_proj_weight")?,
            v_proj_weight: separate(&[e, vdim], "v_proj_weight")?,
            in_proj_bias: if options.bias {
                Some(constant(&[3 * e], 0.0)?)
            } else {
                None
            },
            bias_k: bias_kv("bias_k")?,
            bias_v: bias_kv("bias_v")?,
            out_proj,
            embed_dim,
            num_heads,
            options,
            training: true,
            seed: Cell::new(derive_seed(seed, "dropout")),
        })
    }

    /// The query (and output) feature count.
    pub fn embed_dim(&self) -> usize {
        self.embed_dim
    }

    /// The number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// The options it was made with.
    pub fn options(&self) -> &MultiheadAttentionOptions {
        &self.options
    }

    /// PyTorch's `mha(query, key, value, key_padding_mask, need_weights, attn_mask,
    /// average_attn_weights, is_causal)`: `query [target, batch, embed_dim]`, `key
    /// [source, batch, kdim]`, `value [source, batch, vdim]` (batch first with
    /// `batch_first`; unbatched `[target, embed_dim]` etc. too); gives the output
    /// `[target, batch, embed_dim]` and, with `need_weights`, the attention weights
    /// (after dropout, as PyTorch returns them) `[batch, target, source]` averaged over
    /// heads or `[batch, heads, target, source]`, without the batch dimension when
    /// unbatched. `source` counts the `bias_k` and zero positions when added. A target
    /// whose every source is masked gets zero weights and a zero attention output.
    pub fn forward_attention(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        args: &MultiheadAttentionArgs,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (q, k, v, batched) = self.seq_first(query, key, value)?;
        let (l, n, s) = (q.shape()[0], q.shape()[1], k.shape()[0]);
        let (h, e) = (self.num_heads, self.embed_dim);
        let d = e / h;
        let mut kpm = self.key_padding_bias(args.key_padding_mask, batched, n, s, q.dtype())?;
        if args.is_causal && args.attn_mask.is_none() {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: query.shape().to_vec(),
                reason: "is_causal is a hint that attn_mask is the causal mask: give attn_mask \
                         too, as PyTorch requires"
                    .into(),
            });
        }
        let causal = args.is_causal && kpm.is_none() && !args.need_weights;
        let mut mask = if causal {
            None
        } else {
            self.attn_mask_bias(args.attn_mask, n, l, s, q.dtype())?
        };
        // Input projections.
        let (wq, wk, wv) = match &self.in_proj_weight {
            Some(w) => {
                let w = w.try_chunk(3, 0)?;
                (w[0].clone(), w[1].clone(), w[2].clone())
            }
            None => (
                self.separate_weight(&self.q_proj_weight)?,
                self.separate_weight(&self.k_proj_weight)?,
                self.separate_weight(&self.v_proj_weight)?,
            ),
        };
        let b = self
            .in_proj_bias
            .as_ref()
            .map(|b| b.try_chunk(3, 0))
            .transpose()?;
        let bias = |i: usize| b.as_ref().map(|b| &b[i]);
        let q = functional::linear(&q, &wq, bias(0))?;
        let mut k = functional::linear(&k, &wk, bias(1))?;
        let mut v = functional::linear(&v, &wv, bias(2))?;
        // One more source position: the learned biases, then a zero one; the masks allow
        // attending to each.
        let mut extra = |k: &mut Tensor, v: &mut Tensor, tk: Tensor, tv: Tensor| -> Result<()> {
            *k = Tensor::try_cat(&[&*k, &tk], 0)?;
            *v = Tensor::try_cat(&[&*v, &tv], 0)?;
            for m in [&mut mask, &mut kpm].into_iter().flatten() {
                *m = pad_last(m)?;
            }
            Ok(())
        };
        if let (Some(bk), Some(bv)) = (&self.bias_k, &self.bias_v) {
            extra(
                &mut k,
                &mut v,
                bk.try_broadcast_to([1, n, e])?,
                bv.try_broadcast_to([1, n, e])?,
            )?;
        }
        if self.options.add_zero_attn {
            let zeros = Tensor::try_zeros_dtype([1, n, e], k.dtype())?.try_to(k.device())?;
            extra(&mut k, &mut v, zeros.clone(), zeros)?;
        }
        let s = k.shape()[0];
        // [seq, batch, embed] -> [batch, heads, seq, head_dim].
        let heads = |t: &Tensor, len: usize| {
            t.try_reshape([len as isize, n as isize, h as isize, d as isize])?
                .try_permute([1, 2, 0, 3])
        };
        let (q, k, v) = (heads(&q, l)?, heads(&k, s)?, heads(&v, s)?);
        // The masks as one additive bias broadcasting to [batch, heads, target, source].
        let bias = match (mask, kpm) {
            (Some(m), Some(p)) => Some(m.try_add(&p)?),
            (m, p) => m.or(p),
        };
        let p = if self.training {
            self.options.dropout
        } else {
            0.0
        };
        let seed = self.seed.get();
        self.seed.set(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
        let (attended, weights) = if args.need_weights || p >= 1.0 {
            let scores = q
                .try_matmul(&k.try_transpose(-2, -1)?)?
                .try_mul(1.0 / (d as f64).sqrt())?;
            let mut w = safe_softmax(&plus(&scores, bias.as_ref())?)?;
            w = functional::dropout(&w, p, true, seed)?;
            (w.try_matmul(&v)?, Some(w))
        } else {
            let y = scaled_dot_product_attention(&q, &k, &v, bias.as_ref(), p, seed, causal, None)?;
            (y, None)
        };
        // [batch, heads, target, head_dim] -> [target, batch, embed].
        let y = attended
            .try_permute([2, 0, 1, 3])?
            .try_reshape([l as isize, n as isize, e as isize])?;
        let y = self.out_proj.forward(&y)?;
        let weights = match weights {
            Some(w) if args.need_weights => {
                let w = if args.average_attn_weights {
                    w.try_mean(1)?
                } else {
                    w
                };
                Some(if batched { w } else { w.try_squeeze_dim(0)? })
            }
            _ => None,
        };
        let y = if !batched {
            y.try_squeeze_dim(1)?
        } else if self.options.batch_first {
            y.try_transpose(0, 1)?
        } else {
            y
        };
        Ok((y, weights))
    }

    fn separate_weight(&self, w: &Option<Tensor>) -> Result<Tensor> {
        w.clone().ok_or_else(|| KilnError::InvalidArgument {
            op: OP,
            shape: vec![self.embed_dim],
            reason: "neither in_proj_weight nor q/k/v_proj_weight is set".into(),
        })
    }

    /// Checks ranks and sizes; gives `query`, `key`, `value` as `[seq, batch, features]`
    /// and whether the input was batched.
    fn seq_first(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor, bool)> {
        for t in [query, key, value] {
            require_float(OP, t)?;
        }
        let batched = match query.ndim() {
            3 => true,
            2 => false,
            r => {
                return Err(KilnError::InvalidShape {
                    op: OP,
                    shape: query.shape().to_vec(),
                    requested: vec![-1, -1, self.embed_dim as isize],
                    reason: format!("expects a 3-D (batched) or 2-D (unbatched) query, got {r}-D"),
                });
            }
        };
        let kdim = self.options.kdim.unwrap_or(self.embed_dim);
        let vdim = self.options.vdim.unwrap_or(self.embed_dim);
        let lead = |t: &Tensor| t.shape()[..t.ndim().saturating_sub(1)].to_vec();
        let rank_ok = key.ndim() == query.ndim() && value.ndim() == query.ndim();
        let sizes_ok = rank_ok
            && query.shape()[query.ndim() - 1] == self.embed_dim
            && key.shape()[key.ndim() - 1] == kdim
            && value.shape()[value.ndim() - 1] == vdim
            && lead(key) == lead(value)
            && (!batched || {
                let bd = if self.options.batch_first { 0 } else { 1 };
                key.shape()[bd] == query.shape()[bd]
            });
        if !sizes_ok {
            return Err(KilnError::ShapeMismatch {
                op: OP,
                lhs: query.shape().to_vec(),
                rhs: key.shape().to_vec(),
                detail: format!(
                    " (value {:?}): expected query [.., {}], key [.., {kdim}] and value [.., {vdim}] \
                     of the same rank, key and value of the same length, and one batch size",
                    value.shape(),
                    self.embed_dim
                ),
            });
        }
        let to = |t: &Tensor| -> Result<Tensor> {
            if !batched {
                t.try_unsqueeze(1)
            } else if self.options.batch_first {
                t.try_transpose(0, 1)
            } else {
                Ok(t.clone())
            }
        };
        Ok((to(query)?, to(key)?, to(value)?, batched))
    }

    /// The key padding mask as an additive bias `[batch, 1, 1, source]`.
    fn key_padding_bias(
        &self,
        mask: Option<&Tensor>,
        batched: bool,
        n: usize,
        s: usize,
        dtype: DType,
    ) -> Result<Option<Tensor>> {
        let Some(m) = mask else { return Ok(None) };
        let want: Vec<usize> = if batched { vec![n, s] } else { vec![s] };
        let reason = format!("key_padding_mask must have shape {want:?}");
        mask_bias("key_padding_mask", m, &want, [n, 1, 1, s], dtype, reason).map(Some)
    }

    /// The attention mask as an additive bias broadcasting to `[batch, heads, target, source]`.
    fn attn_mask_bias(
        &self,
        mask: Option<&Tensor>,
        n: usize,
        l: usize,
        s: usize,
        dtype: DType,
    ) -> Result<Option<Tensor>> {
        let Some(m) = mask else { return Ok(None) };
        let h = self.num_heads;
        let (want, view) = if m.ndim() == 3 {
            (vec![n * h, l, s], [n, h, l, s])
        } else {
            (vec![l, s], [1, 1, l, s])
        };
        let reason = format!(
            "attn_mask must be 2-D [target, source] = {:?} or 3-D [batch·heads, target, source] \
             = {:?}",
            [l, s],
            [n * h, l, s]
        );
        mask_bias("attn_mask", m, &want, view, dtype, reason).map(Some)
    }
}

/// A mask of shape `want` as an additive bias viewed as `view`.
fn mask_bias(
    name: &str,
    m: &Tensor,
    want: &[usize],
    view: [usize; 4],
    dtype: DType,
    reason: String,
) -> Result<Tensor> {
    if m.shape() != want {
        return Err(KilnError::InvalidShape {
            op: OP,
            shape: m.shape().to_vec(),
            requested: want.iter().map(|&d| d as isize).collect(),
            reason,
        });
    }
    additive(name, m, dtype)?.try_reshape(view.map(|x| x as isize))
}

/// A bool mask (true: masked) as `-inf`/0, or a float mask as it is (PyTorch's
/// `_canonical_mask`); other dtypes refused.
fn additive(name: &str, m: &Tensor, dtype: DType) -> Result<Tensor> {
    if m.dtype() == DType::Bool {
        Tensor::try_where(m, f64::NEG_INFINITY, 0.0)?.try_cast(dtype)
    } else if m.dtype().is_float() {
        Ok(m.clone())
    } else {
        Err(KilnError::UnsupportedDType {
            op: OP,
            dtype: m.dtype(),
            detail: format!(": only bool and floating-point {name}s are supported"),
        })
    }
}

/// Appends a zero column to the last dimension.
fn pad_last(m: &Tensor) -> Result<Tensor> {
    let mut shape = m.shape().to_vec();
    let last = shape.len() - 1;
    shape[last] = 1;
    let zero = Tensor::try_zeros_dtype(&shape[..], m.dtype())?.try_to(m.device())?;
    Tensor::try_cat(&[m, &zero], -1)
}

fn plus(a: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    match b {
        Some(b) => a.try_add(b),
        None => Ok(a.clone()),
    }
}

impl Module for MultiheadAttention {
    /// Self-attention (`x` as query, key and value) without masks or weights: the output.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let args = MultiheadAttentionArgs {
            need_weights: false,
            ..Default::default()
        };
        Ok(self.forward_attention(x, x, x, &args)?.0)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        for (name, t) in [
            ("in_proj_weight", &self.in_proj_weight),
            ("q_proj_weight", &self.q_proj_weight),
            ("k_proj_weight", &self.k_proj_weight),
            ("v_proj_weight", &self.v_proj_weight),
            ("in_proj_bias", &self.in_proj_bias),
            ("bias_k", &self.bias_k),
            ("bias_v", &self.bias_v),
        ] {
            if let Some(t) = t {
                f(name, t);
            }
        }
        visit_child("out_proj", &self.out_proj, f);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (name, t) in [
            ("in_proj_weight", &mut self.in_proj_weight),
            ("q_proj_weight", &mut self.q_proj_weight),
            ("k_proj_weight", &mut self.k_proj_weight),
            ("v_proj_weight", &mut self.v_proj_weight),
            ("in_proj_bias", &mut self.in_proj_bias),
            ("bias_k", &mut self.bias_k),
            ("bias_v", &mut self.bias_v),
        ] {
            if let Some(t) = t {
                f(name, t);
            }
        }
        visit_child_mut("out_proj", &mut self.out_proj, f);
    }

    /// Dropout on the attention weights is on in training only.
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}
