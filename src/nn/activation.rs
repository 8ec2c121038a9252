//! Activation modules with PyTorch's names and defaults: each forwards to the tensor
//! method of the same name (see `src/tensor/activation.rs`), so it fuses with its
//! neighbours. [`Prelu`] alone has a parameter, its learnable `weight`.

use super::{Module, init};
use crate::error::Result;
use crate::tensor::Tensor;

/// A module with no parameters and no mode: the three `Module` methods that do nothing.
macro_rules! stateless {
    () => {
        fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

        fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

        /// No mode: the same in training and evaluation.
        fn set_training(&mut self, _training: bool) {}
    };
}

macro_rules! plain_activations {
    ($($name:ident, $method:ident, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            #[derive(Debug, Clone, Copy, Default)]
            pub struct $name;

            impl Module for $name {
                fn forward(&self, x: &Tensor) -> Result<Tensor> {
                    x.$method()
                }

                stateless!();
            }
        )*
    };
}

plain_activations! {
    Selu, try_selu, "SELU ([`Tensor::selu`]), PyTorch's `nn.SELU`.";
    Relu6, try_relu6, "`hardtanh(x, 0, 6)` ([`Tensor::relu6`]), PyTorch's `nn.ReLU6`.";
    Hardsigmoid, try_hardsigmoid, "`relu6(x + 3) / 6` ([`Tensor::hardsigmoid`]), PyTorch's `nn.Hardsigmoid`.";
    Hardswish, try_hardswish, "`x · relu6(x + 3) / 6` ([`Tensor::hardswish`]), PyTorch's `nn.Hardswish`.";
    Mish, try_mish, "`x · tanh(softplus(x))` ([`Tensor::mish`]), PyTorch's `nn.Mish`.";
    LogSigmoid, try_log_sigmoid, "`ln(sigmoid(x))` without overflow ([`Tensor::log_sigmoid`]), PyTorch's `nn.LogSigmoid`.";
    Softsign, try_softsign, "`x / (1 + |x|)` ([`Tensor::softsign`]), PyTorch's `nn.Softsign`.";
    Tanhshrink, try_tanhshrink, "`x - tanh(x)` ([`Tensor::tanhshrink`]), PyTorch's `nn.Tanhshrink`.";
}

/// `x` above 0, `negative_slope · x` below ([`Tensor::leaky_relu`]), PyTorch's
/// `nn.LeakyReLU`; the default slope is PyTorch's, 0.01.
#[derive(Debug, Clone, Copy)]
pub struct LeakyRelu {
    /// The slope below 0.
    pub negative_slope: f64,
}

impl LeakyRelu {
    /// PyTorch's `nn.LeakyReLU(negative_slope)`.
    pub fn new(negative_slope: f64) -> LeakyRelu {
        LeakyRelu { negative_slope }
    }
}

impl Default for LeakyRelu {
    fn default() -> Self {
        LeakyRelu::new(0.01)
    }
}

impl Module for LeakyRelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_leaky_relu(self.negative_slope)
    }

    stateless!();
}

/// `x` above 0, `alpha · (eˣ - 1)` below ([`Tensor::elu`]), PyTorch's `nn.ELU`
/// (default `alpha = 1`).
#[derive(Debug, Clone, Copy)]
pub struct Elu {
    /// The value the negative side tends to is `-alpha`.
    pub alpha: f64,
}

impl Elu {
    /// PyTorch's `nn.ELU(alpha)`.
    pub fn new(alpha: f64) -> Elu {
        Elu { alpha }
    }
}

impl Default for Elu {
    fn default() -> Self {
        Elu::new(1.0)
    }
}

impl Module for Elu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_elu(self.alpha)
    }

    stateless!();
}

/// `x` above 0, `alpha · (e^(x/alpha) - 1)` below ([`Tensor::celu`]), PyTorch's
/// `nn.CELU` (default `alpha = 1`; 0 is refused when the module runs).
#[derive(Debug, Clone, Copy)]
pub struct Celu {
    /// The value the negative side tends to is `-alpha`.
    pub alpha: f64,
}

impl Celu {
    /// PyTorch's `nn.CELU(alpha)`.
    pub fn new(alpha: f64) -> Celu {
        Celu { alpha }
    }
}

impl Default for Celu {
    fn default() -> Self {
        Celu::new(1.0)
    }
}

impl Module for Celu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_celu(self.alpha)
    }

    stateless!();
}

/// `x` clamped into `[min_val, max_val]` ([`Tensor::hardtanh`]), PyTorch's `nn.Hardtanh`
/// (defaults -1 and 1).
#[derive(Debug, Clone, Copy)]
pub struct Hardtanh {
    /// The lower bound.
    pub min_val: f64,
    /// The upper bound.
    pub max_val: f64,
}

impl Hardtanh {
    /// PyTorch's `nn.Hardtanh(min_val, max_val)`.
    pub fn new(min_val: f64, max_val: f64) -> Hardtanh {
        Hardtanh { min_val, max_val }
    }
}

impl Default for Hardtanh {
    fn default() -> Self {
        Hardtanh::new(-1.0, 1.0)
    }
}

impl Module for Hardtanh {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_hardtanh(self.min_val, self.max_val)
    }

    stateless!();
}

/// `ln(1 + e^(beta·x)) / beta`, `x` itself where `beta · x > threshold`
/// ([`Tensor::softplus_with`]), PyTorch's `nn.Softplus` (defaults `beta = 1`,
/// `threshold = 20`).
#[derive(Debug, Clone, Copy)]
pub struct Softplus {
    /// The sharpness.
    pub beta: f64,
    /// Above this `beta · x`, the result is `x`.
    pub threshold: f64,
}

impl Softplus {
    /// PyTorch's `nn.Softplus(beta, threshold)`.
    pub fn new(beta: f64, threshold: f64) -> Softplus {
        Softplus { beta, threshold }
    }
}

impl Default for Softplus {
    fn default() -> Self {
        Softplus::new(1.0, 20.0)
    }
}

impl Module for Softplus {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_softplus_with(self.beta, self.threshold)
    }

    stateless!();
}

/// The gated linear unit: halves `a`, `b` of the input along `dim`, `a · sigmoid(b)`
/// ([`Tensor::glu`]), PyTorch's `nn.GLU` (default `dim = -1`).
#[derive(Debug, Clone, Copy)]
pub struct Glu {
    /// The dimension that is halved (negative counts from the end).
    pub dim: isize,
}

impl Glu {
    /// PyTorch's `nn.GLU(dim)`.
    pub fn new(dim: isize) -> Glu {
        Glu { dim }
    }
}

impl Default for Glu {
    fn default() -> Self {
        Glu::new(-1)
    }
}

impl Module for Glu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_glu(self.dim)
    }

    stateless!();
}

/// Moves values `lambd` toward 0, and those within `lambd` of it to 0
/// ([`Tensor::softshrink`]), PyTorch's `nn.Softshrink` (default `lambd = 0.5`).
#[derive(Debug, Clone, Copy)]
pub struct Softshrink {
    /// The half-width of the band sent to 0 (at least 0).
    pub lambd: f64,
}

impl Softshrink {
    /// PyTorch's `nn.Softshrink(lambd)`.
    pub fn new(lambd: f64) -> Softshrink {
        Softshrink { lambd }
    }
}

impl Default for Softshrink {
    fn default() -> Self {
        Softshrink::new(0.5)
    }
}

impl Module for Softshrink {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_softshrink(self.lambd)
    }

    stateless!();
}

/// Sends the values within `lambd` of 0 to 0 ([`Tensor::hardshrink`]), PyTorch's
/// `nn.Hardshrink` (default `lambd = 0.5`).
#[derive(Debug, Clone, Copy)]
pub struct Hardshrink {
    /// The half-width of the band sent to 0.
    pub lambd: f64,
}

impl Hardshrink {
    /// PyTorch's `nn.Hardshrink(lambd)`.
    pub fn new(lambd: f64) -> Hardshrink {
        Hardshrink { lambd }
    }
}

impl Default for Hardshrink {
    fn default() -> Self {
        Hardshrink::new(0.5)
    }
}

impl Module for Hardshrink {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_hardshrink(self.lambd)
    }

    stateless!();
}

/// `value` where `x <= threshold`, else `x` ([`Tensor::threshold`]), PyTorch's
/// `nn.Threshold(threshold, value)` (both required, so no `Default`).
#[derive(Debug, Clone, Copy)]
pub struct Threshold {
    /// At and below this, the result is `value`.
    pub threshold: f64,
    /// The replacement.
    pub value: f64,
}

impl Threshold {
    /// PyTorch's `nn.Threshold(threshold, value)`.
    pub fn new(threshold: f64, value: f64) -> Threshold {
        Threshold { threshold, value }
    }
}

impl Module for Threshold {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_threshold(self.threshold, self.value)
    }

    stateless!();
}

/// The parametric ReLU, `x` above 0 and `weight · x` below ([`Tensor::prelu`]), PyTorch's
/// `nn.PReLU(num_parameters, init)`: one learnable slope shared by every channel, or one
/// per channel (dimension 1 of the input). The parameter is named `weight`, f32, of shape
/// `[num_parameters]`.
///
/// ```
/// use kiln::nn::{Module, Prelu};
/// let p = Prelu::default();
/// let names: Vec<String> = p.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, vec!["weight"]);
/// let x = kiln::Tensor::from_vec(vec![-4.0f32, 2.0], [2]);
/// assert_eq!(p.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![-1.0, 2.0]);
/// ```
#[derive(Debug, Clone)]
pub struct Prelu {
    /// The slopes below 0, shape `[num_parameters]`.
    pub weight: Tensor,
}

impl Prelu {
    /// `num_parameters` slopes (1, or the input's channel count), each starting at
    /// `init` (PyTorch's defaults: 1 and 0.25).
    pub fn new(num_parameters: usize, init: f64) -> Result<Prelu> {
        Ok(Prelu {
            weight: init::constant(&[num_parameters], init)?,
        })
    }
}

impl Default for Prelu {
    /// One slope starting at 0.25, PyTorch's `nn.PReLU()`.
    fn default() -> Self {
        // One f32 element on the CPU: neither the tensor nor `requires_grad_` can fail.
        Prelu {
            weight: Tensor::from_vec(vec![0.25f32], [1]).requires_grad_(true),
        }
    }
}

impl Module for Prelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.try_prelu(&self.weight)
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
