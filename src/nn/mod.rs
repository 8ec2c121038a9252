//! Neural-network building blocks on kiln's lazy tensors: the [`Module`] trait (named,
//! nested parameters; train/eval mode), layers ([`Linear`], [`Embedding`], [`LayerNorm`],
//! [`Dropout`], [`Gelu`], [`GeluTanh`], [`Relu`], [`Flatten`], [`Sequential`], the rest of
//! PyTorch's activations ([`LeakyRelu`], [`Elu`], [`Selu`], [`Prelu`], [`Mish`], [`Glu`], ...),
//! [`CausalSelfAttention`], [`MultiheadAttention`], [`Block`]), convolution and pooling ([`Conv2d`], [`MaxPool2d`],
//! [`AvgPool2d`], [`AdaptiveAvgPool2d`], [`AdaptiveMaxPool2d`], [`MaxUnpool2d`] and their 1-d forms,
//! [`FractionalMaxPool2d`]),
//! normalization ([`BatchNorm2d`], [`GroupNorm`], [`InstanceNorm2d`], [`RmsNorm`] and the
//! other dimensions), recurrent layers ([`Rnn`], [`Lstm`], [`Gru`] and their cells),
//! padding ([`Pad`]), resampling ([`Upsample`], [`PixelShuffle`]) and sliding blocks ([`Unfold`], [`Fold`]), losses ([`loss`], and [`CtcLoss`]), functional forms ([`functional`], which re-exports the
//! losses and the normalization and distance functions) and seeded initializers ([`init`]).
//!
//! A module's parameters are realized leaves that require grad. Its buffers
//! ([`Module::visit_buffers`]: BatchNorm's running statistics) are realized tensors that
//! are not parameters: optimizers never see them, but checkpoints
//! ([`Module::state_dict`], `kiln::safetensors::save_state_dict`) and
//! [`Module::to_device`] include them. Everything a forward pass records is lazy; a
//! training step (forward, `backward`, an optimizer step) is realized as one plan.
//!
//! ```
//! use kiln::nn::{Linear, Module};
//! use kiln::Tensor;
//! let layer = Linear::new(4, 2, true, 0).unwrap();
//! let names: Vec<String> = layer.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, vec!["weight", "bias"]);
//! let y = layer.forward(&Tensor::ones(&[3, 4])).unwrap();
//! assert_eq!(y.shape(), &[3, 2]);
//! ```

#[macro_use]
mod activation;
mod attention;
mod conv;
mod conv_layers;
mod ctc;
mod embedding_bag;
mod fractional_pool;
pub mod functional;
pub mod init;
mod layers;
pub mod loss;
mod loss_extra;
mod multihead;
mod norm;
mod padding;
mod recurrent;
mod sampling;
mod upsample;

pub use activation::{
    Celu, Elu, Glu, Hardshrink, Hardsigmoid, Hardswish, Hardtanh, LeakyRelu, LogSigmoid, Mish,
    Prelu, Relu6, Selu, Softplus, Softshrink, Softsign, Tanhshrink, Threshold,
};
pub use attention::{Block, CausalSelfAttention};
pub use conv_layers::{
    AdaptiveAvgPool, AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool, AdaptiveMaxPool1d,
    AdaptiveMaxPool2d, AvgPool, AvgPool1d, AvgPool2d, Conv, Conv1d, Conv2d, Conv3d, ConvOptions,
    ConvTranspose, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d, ConvTransposeOptions,
    MaxPool, MaxPool1d, MaxPool2d, MaxUnpool, MaxUnpool1d, MaxUnpool2d, MaxUnpool3d,
};
pub use ctc::CtcLoss;
pub use embedding_bag::{EmbeddingBag, EmbeddingBagMode};
pub use fractional_pool::{FractionalMaxPool, FractionalMaxPool2d, FractionalMaxPool3d};
pub use layers::{
    Dropout, Embedding, Flatten, Gelu, GeluTanh, LayerNorm, Linear, Mlp, Relu, Sequential, Sigmoid,
    Silu, Tanh,
};
pub use multihead::{MultiheadAttention, MultiheadAttentionArgs, MultiheadAttentionOptions};
pub use norm::{
    BatchNorm, BatchNorm1d, BatchNorm2d, BatchNorm3d, GroupNorm, InstanceNorm, InstanceNorm1d,
    InstanceNorm2d, InstanceNorm3d, RmsNorm,
};
pub use padding::{Pad, PadMode};
pub use recurrent::{
    Gru, GruCell, Lstm, LstmCell, Nonlinearity, RecurrentOptions, RecurrentWeights, Rnn, RnnCell,
};
pub use sampling::{Fold, Unfold};
pub use upsample::{InterpolationMode, PixelShuffle, PixelUnshuffle, Upsample};

use crate::error::Result;
use crate::tensor::Tensor;

/// A layer or model: a forward computation with named parameters.
pub trait Module {
    /// Computes the output for `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Calls `f(name, parameter)` for every parameter, depth-first, names relative to this
    /// module (`blocks.0.attn.qkv.weight`).
    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor));

    /// Like [`Module::visit_parameters`], with each parameter replaceable (to move a model
    /// to a device, or load another one's values).
    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor));

    /// Calls `f(name, buffer)` for every buffer, depth-first, names relative to this module
    /// (`3.running_mean`): state that is not a parameter (PyTorch's `register_buffer`), such
    /// as BatchNorm's running statistics. Buffers never require grad and are not among
    /// [`Module::parameters`], so optimizers leave them alone; [`Module::state_dict`] and
    /// [`Module::to_device`] include them.
    ///
    /// The default visits nothing: a module with buffers lists them, and a module with
    /// children forwards this to each (with [`visit_child_buffers`]), as it does
    /// [`Module::visit_parameters`].
    fn visit_buffers(&self, _f: &mut dyn FnMut(&str, &Tensor)) {}

    /// Like [`Module::visit_buffers`], with each buffer replaceable (to move a model to a
    /// device). Forwarded to children with [`visit_child_buffers_mut`].
    fn visit_buffers_mut(&mut self, _f: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// Moves every parameter to `device` (realized there, still requiring grad), and every
    /// buffer (realized there).
    fn to_device(&mut self, device: crate::Device) -> Result<()> {
        let mut err = None;
        self.visit_buffers_mut(&mut |_, b| {
            if err.is_some() || b.device() == device {
                return;
            }
            let moved = crate::autograd::no_grad(|| b.try_to(device)).and_then(|t| {
                t.realize()?;
                Ok(t)
            });
            match moved {
                Ok(t) => *b = t,
                Err(e) => err = Some(e),
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        self.visit_parameters_mut(&mut |_, p| {
            if err.is_some() || p.device() == device {
                return;
            }
            let moved = crate::autograd::no_grad(|| p.try_to(device)).and_then(|t| {
                t.realize()?;
                t.try_requires_grad_(true)?;
                Ok(t)
            });
            match moved {
                Ok(t) => *p = t,
                Err(e) => err = Some(e),
            }
        });
        err.map_or(Ok(()), Err)
    }

    /// Switches training behaviour (dropout) on or off, in this module and its children
    /// (PyTorch's `train()`/`eval()`). Required, with no default: PyTorch recurses into
    /// registered children by itself, and a default here that did nothing would leave a
    /// wrapped model's dropout on in evaluation with no sign of it. A module forwards it to
    /// each child; one with neither children nor a mode writes `{}`.
    fn set_training(&mut self, training: bool);

    /// `(name, parameter)` pairs, depth-first.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        self.visit_parameters(&mut |n, t| out.push((n.to_string(), t.clone())));
        out
    }

    /// `(name, buffer)` pairs, depth-first ([`Module::visit_buffers`]).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        self.visit_buffers(&mut |n, t| out.push((n.to_string(), t.clone())));
        out
    }

    /// Everything a checkpoint holds, PyTorch's `state_dict()`: the named parameters, then
    /// the named buffers. Save it with `kiln::safetensors::save_state_dict` (or `save`)
    /// and restore it in place with `kiln::safetensors::load_state_dict` (or `load_into`);
    /// those live above `nn`, in `io`.
    ///
    /// ```
    /// use kiln::nn::{BatchNorm1d, Linear, Module, Sequential};
    /// let model = Sequential::new()
    ///     .push(Linear::new(4, 3, true, 0).unwrap())
    ///     .push(BatchNorm1d::new(3).unwrap());
    /// let names: Vec<String> = model.state_dict().into_iter().map(|(n, _)| n).collect();
    /// assert_eq!(names, ["0.weight", "0.bias", "1.weight", "1.bias",
    ///     "1.running_mean", "1.running_var", "1.num_batches_tracked"]);
    /// ```
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = self.named_parameters();
        out.extend(self.named_buffers());
        out
    }

    /// The parameters, depth-first.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// Number of scalar parameters.
    fn num_parameters(&self) -> usize {
        let mut n = 0;
        self.visit_parameters(&mut |_, t| n += t.numel());
        n
    }

    /// Clears every parameter's gradient.
    fn zero_grad(&self) {
        self.visit_parameters(&mut |_, t| t.zero_grad());
    }
}

/// Visits a child module's parameters mutably with `prefix.` in front of their names.
pub fn visit_child_mut(prefix: &str, child: &mut dyn Module, f: &mut dyn FnMut(&str, &mut Tensor)) {
    child.visit_parameters_mut(&mut |n, t| f(&format!("{prefix}.{n}"), t));
}

/// Visits a child module's parameters with `prefix.` in front of their names.
pub fn visit_child(prefix: &str, child: &dyn Module, f: &mut dyn FnMut(&str, &Tensor)) {
    child.visit_parameters(&mut |n, t| f(&format!("{prefix}.{n}"), t));
}

/// Visits a child module's buffers with `prefix.` in front of their names.
pub fn visit_child_buffers(prefix: &str, child: &dyn Module, f: &mut dyn FnMut(&str, &Tensor)) {
    child.visit_buffers(&mut |n, t| f(&format!("{prefix}.{n}"), t));
}

/// Visits a child module's buffers mutably with `prefix.` in front of their names.
pub fn visit_child_buffers_mut(
    prefix: &str,
    child: &mut dyn Module,
    f: &mut dyn FnMut(&str, &mut Tensor),
) {
    child.visit_buffers_mut(&mut |n, t| f(&format!("{prefix}.{n}"), t));
}

/// Visits a normalization layer's optional affine `weight` and `bias`, under those names.
pub(crate) fn visit_affine(
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    f: &mut dyn FnMut(&str, &Tensor),
) {
    for (name, t) in [("weight", weight), ("bias", bias)] {
        if let Some(t) = t {
            f(name, t);
        }
    }
}

/// [`visit_affine`] for mutable visits.
pub(crate) fn visit_affine_mut(
    weight: Option<&mut Tensor>,
    bias: Option<&mut Tensor>,
    f: &mut dyn FnMut(&str, &mut Tensor),
) {
    for (name, t) in [("weight", weight), ("bias", bias)] {
        if let Some(t) = t {
            f(name, t);
        }
    }
}
