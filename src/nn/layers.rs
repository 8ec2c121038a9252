//! Basic layers.

use super::{
    Module, functional, init, visit_child, visit_child_buffers, visit_child_buffers_mut,
    visit_child_mut,
};
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
    /// PyTorch's `padding_idx`: the id whose row starts at zeros and gets no gradient.
    pub padding_idx: Option<usize>,
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
            padding_idx: None,
        })
    }

    /// [`Embedding::new`] with PyTorch's `padding_idx` (negative counts from the end): that
    /// row starts at zeros and never gets a gradient.
    ///
    /// ```
    /// let e = kiln::nn::Embedding::with_padding_idx(4, 3, -1, 0).unwrap();
    /// assert_eq!(e.padding_idx, Some(3));
    /// assert_eq!(e.weight.to_vec::<f32>().unwrap()[9..], [0.0, 0.0, 0.0]);
    /// ```
    pub fn with_padding_idx(
        count: usize,
        dim: usize,
        padding_idx: i64,
        seed: u64,
    ) -> Result<Embedding> {
        let p = functional::padding_index("Embedding", padding_idx, count, &[count, dim])?;
        let table = Embedding::new(count, dim, seed)?;
        let rows = Tensor::try_arange(0, count as i64, 1, crate::dtype::DType::I64)?
            .try_reshape([count as isize, 1])?;
        let weight = crate::autograd::no_grad(|| {
            Tensor::try_where(&rows.try_ne(p as i64)?, &table.weight, 0.0)
        })?;
        weight.realize()?;
        weight.try_requires_grad_(true)?;
        Ok(Embedding {
            weight,
            padding_idx: Some(p),
        })
    }
}

impl Module for Embedding {
    /// `ids` (integers, any shape) to `ids.shape + [dim]`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        functional::embedding(ids, &self.weight, self.padding_idx.map(|p| p as i64))
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

/// Layer normalization over the trailing `normalized_shape` dimensions, with an optional
/// learned scale and shift (PyTorch's `nn.LayerNorm`).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// The trailing dimensions the statistics are taken over.
    pub normalized_shape: Vec<usize>,
    /// The learned scale, shape `normalized_shape` (`None` without `elementwise_affine`).
    pub weight: Option<Tensor>,
    /// The learned shift, shape `normalized_shape` (`None` without `elementwise_affine` or
    /// with `bias = false`).
    pub bias: Option<Tensor>,
    /// Added to the variance before its square root.
    pub eps: f64,
}

impl LayerNorm {
    /// Normalizes the last `dim` features with a learned scale (1) and shift (0), `eps =
    /// 1e-5`: PyTorch's `nn.LayerNorm(dim)`.
    pub fn new(dim: usize) -> Result<LayerNorm> {
        LayerNorm::with_options(&[dim], 1e-5, true, true)
    }

    /// PyTorch's `nn.LayerNorm(normalized_shape, eps, elementwise_affine, bias)`: without
    /// `elementwise_affine` there are no parameters; `bias = false` keeps only the scale.
    ///
    /// ```
    /// use kiln::nn::{LayerNorm, Module};
    /// let ln = LayerNorm::with_options(&[2, 2], 1e-5, false, false).unwrap();
    /// assert_eq!(ln.parameters().len(), 0);
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 2, 2]);
    /// let y = ln.forward(&x).unwrap().to_vec::<f32>().unwrap();
    /// assert!((y[0] + 1.3416).abs() < 1e-3 && (y[3] - 1.3416).abs() < 1e-3);
    /// ```
    pub fn with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
    ) -> Result<LayerNorm> {
        let param = |v: f64, on: bool| -> Result<Option<Tensor>> {
            if on {
                init::constant(normalized_shape, v).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            weight: param(1.0, elementwise_affine)?,
            bias: param(0.0, elementwise_affine && bias)?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::layer_norm(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        super::visit_affine(self.weight.as_ref(), self.bias.as_ref(), f);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        super::visit_affine_mut(self.weight.as_mut(), self.bias.as_mut(), f);
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

macro_rules! activation_modules {
    ($($name:ident, $method:ident, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            #[derive(Debug, Clone, Copy, Default)]
            pub struct $name;

            impl Module for $name {
                fn forward(&self, x: &Tensor) -> Result<Tensor> {
                    x.$method()
                }

                fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

                fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

                /// No mode: the same in training and evaluation.
                fn set_training(&mut self, _training: bool) {}
            }
        )*
    };
}

activation_modules! {
    Relu, try_relu, "`max(x, 0)` ([`Tensor::relu`]), PyTorch's `nn.ReLU`.";
    Sigmoid, try_sigmoid, "The logistic function ([`Tensor::sigmoid`]), PyTorch's `nn.Sigmoid`.";
    Tanh, try_tanh, "The hyperbolic tangent ([`Tensor::tanh`]), PyTorch's `nn.Tanh`.";
    Silu, try_silu, "`x·sigmoid(x)` ([`Tensor::silu`]), PyTorch's `nn.SiLU`.";
}

/// Flattens dimensions `start_dim..=end_dim` into one (a view), PyTorch's `nn.Flatten`;
/// [`Flatten::new`] keeps the batch dimension (`start_dim = 1`, `end_dim = -1`), as
/// PyTorch's default does.
///
/// ```
/// use kiln::nn::{Flatten, Module};
/// use kiln::Tensor;
/// let y = Flatten::new().forward(&Tensor::ones(&[2, 3, 4, 4])).unwrap();
/// assert_eq!(y.shape(), &[2, 48]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flatten {
    /// The first dimension flattened.
    pub start_dim: isize,
    /// The last dimension flattened (negative counts from the end).
    pub end_dim: isize,
}

impl Flatten {
    /// `start_dim = 1`, `end_dim = -1`.
    pub fn new() -> Flatten {
        Flatten {
            start_dim: 1,
            end_dim: -1,
        }
    }
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten::new()
    }
}

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_flatten_dims(self.start_dim, self.end_dim)
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

    fn visit_buffers(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, l) in self.layers.iter().enumerate() {
            visit_child_buffers(&i.to_string(), l.as_ref(), f);
        }
    }

    fn visit_buffers_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (i, l) in self.layers.iter_mut().enumerate() {
            visit_child_buffers_mut(&i.to_string(), l.as_mut(), f);
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

    fn visit_buffers(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, l) in self.layers.iter().enumerate() {
            visit_child_buffers(&format!("layers.{i}"), l, f);
        }
    }

    fn visit_buffers_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (i, l) in self.layers.iter_mut().enumerate() {
            visit_child_buffers_mut(&format!("layers.{i}"), l, f);
        }
    }

    fn set_training(&mut self, training: bool) {
        for l in &mut self.layers {
            l.set_training(training);
        }
    }
}
