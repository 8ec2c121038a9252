//! Basic layers.

use super::{Module, functional, init, visit_child, visit_child_mut};
use crate::error::Result;
use crate::tensor::Tensor;
use std::cell::Cell;

/// `y = x Wᵀ + b` with `W: [out, in]`, PyTorch's `nn.Linear` (and its default
/// initialization: weight and bias uniform in `±1/sqrt(in)`).
#[derive(Debug, Clone)]
pub struct Linear {
    /// The weight `W`, shape `[out, in]`.
    pub weight: Tensor,
    /// The bias `b`, shape `[out]`, if the layer has one.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer from `inputs` to `outputs` features, initialized from `seed`.
    pub fn new(inputs: usize, outputs: usize, bias: bool, seed: u64) -> Result<Linear> {
        let b = 1.0 / (inputs.max(1) as f64).sqrt();
        Ok(Linear {
            weight: init::uniform(
                &[outputs, inputs],
                -b,
                b,
                init::derive_seed(seed, "linear.weight"),
            )?,
            bias: if bias {
                Some(init::uniform(
                    &[outputs],
                    -b,
                    b,
                    init::derive_seed(seed, "linear.bias"),
                )?)
            } else {
                None
            },
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::linear(x, &self.weight, self.bias.as_ref())
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        f("weight", &self.weight);
        if let Some(b) = &self.bias {
            f("bias", b);
        }
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        f("weight", &mut self.weight);
        if let Some(b) = &mut self.bias {
            f("bias", b);
        }
    }

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// A lookup table: rows of `weight` (`[vocabulary, dim]`, standard normal) by integer id.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// The table, shape `[vocabulary, dim]`: row `i` is id `i`'s vector.
    pub weight: Tensor,
}

impl Embedding {
    /// A table of `count` vectors of `dim` features, initialized from `seed`.
    pub fn new(count: usize, dim: usize, seed: u64) -> Result<Embedding> {
        Ok(Embedding {
            weight: init::normal(
                &[count, dim],
                0.0,
                1.0,
                init::derive_seed(seed, "embedding.weight"),
            )?,
        })
    }
}

impl Module for Embedding {
    /// `ids` (integers, any shape) to `ids.shape + [dim]`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Tensor::try_embedding(ids, &self.weight)
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

/// Layer normalization over the last dimension with a learned scale and shift.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// The learned scale, shape `[dim]`.
    pub weight: Tensor,
    /// The learned shift, shape `[dim]`.
    pub bias: Tensor,
    /// Added to the variance before its square root.
    pub eps: f64,
}

impl LayerNorm {
    /// Normalizes `dim` features (scale 1, shift 0, `eps = 1e-5` as PyTorch).
    pub fn new(dim: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: init::constant(&[dim], 1.0)?,
            bias: init::constant(&[dim], 0.0)?,
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = self.weight.shape().to_vec();
        functional::layer_norm(x, &d, Some(&self.weight), Some(&self.bias), self.eps)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        f("weight", &self.weight);
        f("bias", &self.bias);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        f("weight", &mut self.weight);
        f("bias", &mut self.bias);
    }

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// Dropout with probability `p` while training; each forward draws a new mask (the seed
/// advances), which does not re-plan a cached training step.
#[derive(Debug, Clone)]
pub struct Dropout {
    /// Probability of zeroing each element.
    pub p: f64,
    training: bool,
    seed: Cell<u64>,
}

impl Dropout {
    /// Dropout with probability `p`, masks from `seed` onwards.
    pub fn new(p: f64, seed: u64) -> Dropout {
        Dropout {
            p,
            training: true,
            seed: Cell::new(seed),
        }
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let seed = self.seed.get();
        self.seed.set(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
        functional::dropout(x, self.p, self.training, seed)
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// The GELU activation's tanh approximation ([`Tensor::gelu_tanh`]), PyTorch's
/// `nn.GELU(approximate='tanh')`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GeluTanh;

impl Module for GeluTanh {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_gelu_tanh()
    }

    fn visit_parameters(&self, _f: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _f: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// The GELU activation (exact erf form).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gelu;

impl Module for Gelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_gelu()
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// Modules applied in order; parameters are named by position (`0.weight`, `2.bias`).
#[derive(Default)]
pub struct Sequential {
    /// The modules, in the order they are applied.
    pub layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends a layer.
    pub fn push(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequential")
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for l in &self.layers {
            y = l.forward(&y)?;
        }
        Ok(y)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, l) in self.layers.iter().enumerate() {
            visit_child(&i.to_string(), l.as_ref(), f);
        }
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (i, l) in self.layers.iter_mut().enumerate() {
            visit_child_mut(&i.to_string(), l.as_mut(), f);
        }
    }

    fn set_training(&mut self, training: bool) {
        for l in &mut self.layers {
            l.set_training(training);
        }
    }
}

/// A multi-layer perceptron: `Linear` layers with ReLU between them (none after the last).
#[derive(Debug)]
pub struct Mlp {
    /// The linear layers, in the order they are applied.
    pub layers: Vec<Linear>,
}

impl Mlp {
    /// Layers of the given widths (`[in, hidden.., out]`), initialized from `seed`.
    pub fn new(widths: &[usize], seed: u64) -> Result<Mlp> {
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| {
                Linear::new(
                    w[0],
                    w[1],
                    true,
                    init::derive_seed(seed, &format!("mlp.layers.{i}")),
                )
            })
            .collect::<Result<_>>()?;
        Ok(Mlp { layers })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        let last = self.layers.len().saturating_sub(1);
        for (i, l) in self.layers.iter().enumerate() {
            y = l.forward(&y)?;
            if i < last {
                y = y.try_relu()?;
            }
        }
        Ok(y)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, l) in self.layers.iter().enumerate() {
            visit_child(&format!("layers.{i}"), l, f);
        }
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (i, l) in self.layers.iter_mut().enumerate() {
            visit_child_mut(&format!("layers.{i}"), l, f);
        }
    }

    fn set_training(&mut self, training: bool) {
        for l in &mut self.layers {
            l.set_training(training);
        }
    }
}
