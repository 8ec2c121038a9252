//! Convolution and pooling layers, PyTorch's `nn.Conv1d/2d/3d`, `nn.ConvTranspose1d/2d/3d`,
//! `nn.MaxPool1d/2d`, `nn.AvgPool1d/2d` and `nn.AdaptiveAvgPool1d/2d`, over the functional
//! forms in [`super::functional`].

use super::conv::{
    ConvPadding, Spatial, adaptive_avg_pool_nd, adaptive_max_pool_nd, avg_pool_nd, conv_name,
    conv_nd, conv_transpose_name, conv_transpose_nd, max_pool_nd, max_unpool_nd,
};
use super::{Module, init};
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// A convolution layer's settings besides its channels and kernel, PyTorch's defaults
/// from [`Default`]: stride 1, no padding, dilation 1, one group, a bias.
///
/// ```
/// use kiln::nn::{Conv2d, ConvOptions};
/// let conv = Conv2d::with_options(3, 8, 3, ConvOptions { padding: 1.into(), ..Default::default() }, 0).unwrap();
/// assert_eq!(conv.weight.shape(), &[8, 3, 3, 3]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvOptions<const N: usize> {
    /// The step between windows.
    pub stride: Spatial<N>,
    /// Zero padding: sizes, [`ConvPadding::Same`] or [`ConvPadding::Valid`].
    pub padding: ConvPadding<N>,
    /// The spacing between a window's taps.
    pub dilation: Spatial<N>,
    /// Channel groups: each output channel sees `in_channels / groups` inputs.
    pub groups: usize,
    /// Whether the layer adds a learned bias per output channel.
    pub bias: bool,
}

impl<const N: usize> Default for ConvOptions<N> {
    fn default() -> Self {
        ConvOptions {
            stride: Spatial([1; N]),
            padding: ConvPadding::Explicit([0; N]),
            dilation: Spatial([1; N]),
            groups: 1,
            bias: true,
        }
    }
}

/// A convolution over `N` spatial dimensions with a learned weight
/// `[out, in / groups, *kernel]` and bias `[out]`, initialized as PyTorch's are (uniform
/// in `±1/sqrt(fan_in)`, `fan_in = in / groups · Π kernel`). See [`Conv1d`], [`Conv2d`],
/// [`Conv3d`] and [`super::functional::conv2d`].
///
/// ```
/// use kiln::nn::{Conv2d, Module};
/// use kiln::Tensor;
/// let conv = Conv2d::new(1, 4, 3, 0).unwrap();
/// let y = conv.forward(&Tensor::ones(&[2, 1, 8, 8])).unwrap();
/// assert_eq!(y.shape(), &[2, 4, 6, 6]);
/// ```
#[derive(Debug, Clone)]
pub struct Conv<const N: usize> {
    /// The weight, `[out_channels, in_channels / groups, *kernel]`.
    pub weight: Tensor,
    /// The bias, `[out_channels]`, if the layer has one.
    pub bias: Option<Tensor>,
    /// The step between windows.
    pub stride: Spatial<N>,
    /// Zero padding.
    pub padding: ConvPadding<N>,
    /// The spacing between a window's taps.
    pub dilation: Spatial<N>,
    /// Channel groups.
    pub groups: usize,
}

/// A convolution layer's weight of `shape` and, with `bias`, its `[out_channels]` bias,
/// both uniform in `±1/sqrt(fan_in)` with PyTorch's fan in of the weight's shape
/// ([`init::fans`]: `shape[1]` times the kernel's size), seeded from `seed` and `label`.
fn uniform_parameters(
    shape: &[usize],
    out_channels: usize,
    bias: bool,
    seed: u64,
    label: &str,
) -> Result<(Tensor, Option<Tensor>)> {
    let (fan_in, _) = init::fans(shape)?;
    let b = 1.0 / (fan_in.max(1) as f64).sqrt();
    let weight = init::uniform(
        shape,
        -b,
        b,
        init::derive_seed(seed, &format!("{label}.weight")),
    )?;
    let bias = if bias {
        let s = init::derive_seed(seed, &format!("{label}.bias"));
        Some(init::uniform(&[out_channels], -b, b, s)?)
    } else {
        None
    };
    Ok((weight, bias))
}

/// PyTorch's `nn.Conv1d`.
pub type Conv1d = Conv<1>;
/// PyTorch's `nn.Conv2d`.
pub type Conv2d = Conv<2>;
/// PyTorch's `nn.Conv3d`.
pub type Conv3d = Conv<3>;

impl<const N: usize> Conv<N> {
    /// A layer from `in_channels` to `out_channels` with PyTorch's default settings,
    /// initialized from `seed`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: impl Into<Spatial<N>>,
        seed: u64,
    ) -> Result<Conv<N>> {
        Conv::with_options(
            in_channels,
            out_channels,
            kernel_size,
            ConvOptions::default(),
            seed,
        )
    }

    /// A layer with `options` (stride, padding, dilation, groups, bias).
    pub fn with_options(
        in_channels: usize,
        out_channels: usize,
        kernel_size: impl Into<Spatial<N>>,
        options: ConvOptions<N>,
        seed: u64,
    ) -> Result<Conv<N>> {
        let kernel = kernel_size.into();
        let groups = options.groups;
        let op = conv_name(N);
        if groups == 0
            || !in_channels.is_multiple_of(groups)
            || !out_channels.is_multiple_of(groups)
        {
            return Err(KilnError::InvalidArgument {
                op,
                shape: vec![out_channels, in_channels],
                reason: format!(
                    "in_channels ({in_channels}) and out_channels ({out_channels}) must be multiples of groups ({groups} ≥ 1)"
                ),
            });
        }
        if kernel.0.contains(&0) {
            return Err(KilnError::InvalidArgument {
                op,
                shape: vec![out_channels, in_channels],
                reason: format!("kernel_size {:?} must be positive", kernel.0),
            });
        }
        let mut shape = vec![out_channels, in_channels / groups];
        shape.extend_from_slice(&kernel.0);
        let (weight, bias) = uniform_parameters(&shape, out_channels, options.bias, seed, "conv")?;
        Ok(Conv {
            weight,
            bias,
            stride: options.stride,
            padding: options.padding,
            dilation: options.dilation,
            groups,
        })
    }
}

impl<const N: usize> Module for Conv<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        conv_nd(
            x,
            &self.weight,
            self.bias.as_ref(),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )
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

/// A transposed convolution layer's settings besides its channels and kernel, PyTorch's
/// defaults from [`Default`]: stride 1, no padding or output padding, one group,
/// dilation 1, a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvTransposeOptions<const N: usize> {
    /// The step between the input's footprints in the output.
    pub stride: Spatial<N>,
    /// Positions cut from each side of the full output.
    pub padding: Spatial<N>,
    /// Positions added after (below the stride or dilation).
    pub output_padding: Spatial<N>,
    /// Channel groups.
    pub groups: usize,
    /// The spacing between a kernel's taps.
    pub dilation: Spatial<N>,
    /// Whether the layer adds a learned bias per output channel.
    pub bias: bool,
}

impl<const N: usize> Default for ConvTransposeOptions<N> {
    fn default() -> Self {
        ConvTransposeOptions {
            stride: Spatial([1; N]),
            padding: Spatial([0; N]),
            output_padding: Spatial([0; N]),
            groups: 1,
            dilation: Spatial([1; N]),
            bias: true,
        }
    }
}

/// A transposed convolution over `N` spatial dimensions (PyTorch's
/// `nn.ConvTranspose1d/2d/3d`) with a learned weight `[in, out / groups, *kernel]` and bias
/// `[out]`, initialized as PyTorch's are (uniform in `±1/sqrt(fan_in)` with PyTorch's
/// `fan_in = out / groups · Π kernel` for this layout). See
/// [`super::functional::conv_transpose2d`].
///
/// ```
/// use kiln::nn::{ConvTranspose2d, ConvTransposeOptions, Module};
/// use kiln::Tensor;
/// let up = ConvTranspose2d::with_options(
///     8, 4, 4, ConvTransposeOptions { stride: 2.into(), padding: 1.into(), ..Default::default() }, 0,
/// ).unwrap();
/// assert_eq!(up.forward(&Tensor::ones(&[1, 8, 5, 5])).unwrap().shape(), &[1, 4, 10, 10]);
/// ```
#[derive(Debug, Clone)]
pub struct ConvTranspose<const N: usize> {
    /// The weight, `[in_channels, out_channels / groups, *kernel]`.
    pub weight: Tensor,
    /// The bias, `[out_channels]`, if the layer has one.
    pub bias: Option<Tensor>,
    /// The settings besides the parameters (`bias` says whether there is one).
    pub options: ConvTransposeOptions<N>,
}

/// PyTorch's `nn.ConvTranspose1d`.
pub type ConvTranspose1d = ConvTranspose<1>;
/// PyTorch's `nn.ConvTranspose2d`.
pub type ConvTranspose2d = ConvTranspose<2>;
/// PyTorch's `nn.ConvTranspose3d`.
pub type ConvTranspose3d = ConvTranspose<3>;

impl<const N: usize> ConvTranspose<N> {
    /// A layer from `in_channels` to `out_channels` with PyTorch's default settings.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: impl Into<Spatial<N>>,
        seed: u64,
    ) -> Result<ConvTranspose<N>> {
        ConvTranspose::with_options(
            in_channels,
            out_channels,
            kernel_size,
            ConvTransposeOptions::default(),
            seed,
        )
    }

    /// A layer with `options`.
    pub fn with_options(
        in_channels: usize,
        out_channels: usize,
        kernel_size: impl Into<Spatial<N>>,
        options: ConvTransposeOptions<N>,
        seed: u64,
    ) -> Result<ConvTranspose<N>> {
        let kernel = kernel_size.into();
        let groups = options.groups;
        let op = conv_transpose_name(N);
        if groups == 0
            || !in_channels.is_multiple_of(groups)
            || !out_channels.is_multiple_of(groups)
            || kernel.0.contains(&0)
        {
            return Err(KilnError::InvalidArgument {
                op,
                shape: vec![in_channels, out_channels],
                reason: format!(
                    "in_channels ({in_channels}) and out_channels ({out_channels}) must be multiples of groups ({groups} ≥ 1), and kernel_size {:?} positive",
                    kernel.0
                ),
            });
        }
        let mut shape = vec![in_channels, out_channels / groups];
        shape.extend_from_slice(&kernel.0);
        let (weight, bias) =
            uniform_parameters(&shape, out_channels, options.bias, seed, "conv_transpose")?;
        Ok(ConvTranspose {
            weight,
            bias,
            options,
        })
    }
}

impl<const N: usize> Module for ConvTranspose<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let o = &self.options;
        conv_transpose_nd(
            x,
            &self.weight,
            self.bias.as_ref(),
            o.stride,
            o.padding,
            o.output_padding,
            o.groups,
            o.dilation,
        )
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

/// Max pooling over `N` spatial dimensions (PyTorch's `nn.MaxPool1d/2d`); the stride is
/// the kernel size unless set. See [`super::functional::max_pool2d`].
///
/// ```
/// use kiln::nn::{MaxPool2d, Module};
/// use kiln::Tensor;
/// let pool = MaxPool2d::new(3).stride(2).padding(1);
/// assert_eq!(pool.forward(&Tensor::ones(&[1, 2, 8, 8])).unwrap().shape(), &[1, 2, 4, 4]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool<const N: usize> {
    /// The window.
    pub kernel_size: Spatial<N>,
    /// The step between windows.
    pub stride: Spatial<N>,
    /// `-inf` padding, at most half the window.
    pub padding: Spatial<N>,
    /// The spacing between a window's taps.
    pub dilation: Spatial<N>,
    /// Whether a last partial window is kept.
    pub ceil_mode: bool,
}

/// PyTorch's `nn.MaxPool1d`.
pub type MaxPool1d = MaxPool<1>;
/// PyTorch's `nn.MaxPool2d`.
pub type MaxPool2d = MaxPool<2>;

impl<const N: usize> MaxPool<N> {
    /// Windows of `kernel_size`, stride the kernel size, no padding, dilation 1.
    pub fn new(kernel_size: impl Into<Spatial<N>>) -> MaxPool<N> {
        let k = kernel_size.into();
        MaxPool {
            kernel_size: k,
            stride: k,
            padding: Spatial([0; N]),
            dilation: Spatial([1; N]),
            ceil_mode: false,
        }
    }

    /// With this stride.
    pub fn stride(mut self, stride: impl Into<Spatial<N>>) -> MaxPool<N> {
        self.stride = stride.into();
        self
    }

    /// With this padding.
    pub fn padding(mut self, padding: impl Into<Spatial<N>>) -> MaxPool<N> {
        self.padding = padding.into();
        self
    }

    /// With this dilation.
    pub fn dilation(mut self, dilation: impl Into<Spatial<N>>) -> MaxPool<N> {
        self.dilation = dilation.into();
        self
    }

    /// With PyTorch's `ceil_mode`.
    pub fn ceil_mode(mut self, ceil_mode: bool) -> MaxPool<N> {
        self.ceil_mode = ceil_mode;
        self
    }
}

impl<const N: usize> MaxPool<N> {
    /// PyTorch's `return_indices=True`: the pooled values and each one's i64 flat index
    /// in its input plane, as [`MaxUnpool`] takes them.
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let (y, at) = self.pool(x, true)?;
        Ok((
            y,
            at.ok_or_else(|| KilnError::internal("max pooling indices"))?,
        ))
    }

    fn pool(&self, x: &Tensor, with_indices: bool) -> Result<(Tensor, Option<Tensor>)> {
        let (k, s, p, d) = (self.kernel_size, self.stride, self.padding, self.dilation);
        max_pool_nd(x, k, s, p, d, self.ceil_mode, with_indices)
    }
}

impl<const N: usize> Module for MaxPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.pool(x, false)?.0)
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// Max unpooling over `N` spatial dimensions (PyTorch's `nn.MaxUnpool1d/2d/3d`): puts
/// pooled values back at the places [`MaxPool::forward_with_indices`] reported, zeros
/// elsewhere; the stride is the kernel size unless set. It takes two inputs, so it is
/// not a [`Module`]. See [`super::functional::max_unpool2d`].
///
/// ```
/// use kiln::nn::{MaxPool2d, MaxUnpool2d};
/// use kiln::Tensor;
/// let x = Tensor::arange(0.0, 16.0, 1.0).reshape([1, 1, 4, 4]);
/// let (y, at) = MaxPool2d::new(2).forward_with_indices(&x).unwrap();
/// let back = MaxUnpool2d::new(2).forward(&y, &at).unwrap();
/// assert_eq!(back.shape(), &[1, 1, 4, 4]);
/// assert_eq!(back.sum(..).item::<f32>().unwrap(), 5.0 + 7.0 + 13.0 + 15.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxUnpool<const N: usize> {
    /// The pooling window.
    pub kernel_size: Spatial<N>,
    /// The pooling step.
    pub stride: Spatial<N>,
    /// The pooling padding.
    pub padding: Spatial<N>,
}

/// PyTorch's `nn.MaxUnpool1d`.
pub type MaxUnpool1d = MaxUnpool<1>;
/// PyTorch's `nn.MaxUnpool2d`.
pub type MaxUnpool2d = MaxUnpool<2>;
/// PyTorch's `nn.MaxUnpool3d`.
pub type MaxUnpool3d = MaxUnpool<3>;

impl<const N: usize> MaxUnpool<N> {
    /// Undoes windows of `kernel_size`, stride the kernel size, no padding.
    pub fn new(kernel_size: impl Into<Spatial<N>>) -> MaxUnpool<N> {
        let k = kernel_size.into();
        MaxUnpool {
            kernel_size: k,
            stride: k,
            padding: Spatial([0; N]),
        }
    }

    /// With this stride.
    pub fn stride(mut self, stride: impl Into<Spatial<N>>) -> MaxUnpool<N> {
        self.stride = stride.into();
        self
    }

    /// With this padding.
    pub fn padding(mut self, padding: impl Into<Spatial<N>>) -> MaxUnpool<N> {
        self.padding = padding.into();
        self
    }

    /// Unpools `x` with its `indices` to the default size.
    pub fn forward(&self, x: &Tensor, indices: &Tensor) -> Result<Tensor> {
        max_unpool_nd(
            x,
            indices,
            self.kernel_size,
            self.stride,
            self.padding,
            None,
        )
    }

    /// Unpools `x` with its `indices` to `output_size` (spatial).
    pub fn forward_with_size(
        &self,
        x: &Tensor,
        indices: &Tensor,
        output_size: impl Into<Spatial<N>>,
    ) -> Result<Tensor> {
        let size = Some(output_size.into());
        max_unpool_nd(
            x,
            indices,
            self.kernel_size,
            self.stride,
            self.padding,
            size,
        )
    }
}

/// Average pooling over `N` spatial dimensions (PyTorch's `nn.AvgPool1d/2d`); the stride
/// is the kernel size unless set. See [`super::functional::avg_pool2d`].
///
/// ```
/// use kiln::nn::{AvgPool2d, Module};
/// use kiln::Tensor;
/// let pool = AvgPool2d::new(2);
/// let y = pool.forward(&Tensor::ones(&[1, 1, 4, 4])).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0; 4]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool<const N: usize> {
    /// The window.
    pub kernel_size: Spatial<N>,
    /// The step between windows.
    pub stride: Spatial<N>,
    /// Zero padding, at most half the kernel.
    pub padding: Spatial<N>,
    /// Whether a last partial window is kept.
    pub ceil_mode: bool,
    /// Whether padding counts in a window's divisor.
    pub count_include_pad: bool,
    /// A fixed divisor instead.
    pub divisor_override: Option<usize>,
}

/// PyTorch's `nn.AvgPool1d`.
pub type AvgPool1d = AvgPool<1>;
/// PyTorch's `nn.AvgPool2d`.
pub type AvgPool2d = AvgPool<2>;

impl<const N: usize> AvgPool<N> {
    /// Windows of `kernel_size`, stride the kernel size, no padding, padding counted.
    pub fn new(kernel_size: impl Into<Spatial<N>>) -> AvgPool<N> {
        let k = kernel_size.into();
        AvgPool {
            kernel_size: k,
            stride: k,
            padding: Spatial([0; N]),
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }

    /// With this stride.
    pub fn stride(mut self, stride: impl Into<Spatial<N>>) -> AvgPool<N> {
        self.stride = stride.into();
        self
    }

    /// With this padding.
    pub fn padding(mut self, padding: impl Into<Spatial<N>>) -> AvgPool<N> {
        self.padding = padding.into();
        self
    }

    /// With PyTorch's `ceil_mode`.
    pub fn ceil_mode(mut self, ceil_mode: bool) -> AvgPool<N> {
        self.ceil_mode = ceil_mode;
        self
    }

    /// With PyTorch's `count_include_pad`.
    pub fn count_include_pad(mut self, count_include_pad: bool) -> AvgPool<N> {
        self.count_include_pad = count_include_pad;
        self
    }

    /// With PyTorch's `divisor_override`.
    pub fn divisor_override(mut self, divisor: Option<usize>) -> AvgPool<N> {
        self.divisor_override = divisor;
        self
    }
}

impl<const N: usize> Module for AvgPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        avg_pool_nd(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// Adaptive average pooling to a fixed output size (PyTorch's
/// `nn.AdaptiveAvgPool1d/2d`); see [`super::functional::adaptive_avg_pool2d`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveAvgPool<const N: usize> {
    /// The output's spatial size.
    pub output_size: Spatial<N>,
}

/// PyTorch's `nn.AdaptiveAvgPool1d`.
pub type AdaptiveAvgPool1d = AdaptiveAvgPool<1>;
/// PyTorch's `nn.AdaptiveAvgPool2d`.
pub type AdaptiveAvgPool2d = AdaptiveAvgPool<2>;

impl<const N: usize> AdaptiveAvgPool<N> {
    /// Pools to `output_size`.
    pub fn new(output_size: impl Into<Spatial<N>>) -> AdaptiveAvgPool<N> {
        AdaptiveAvgPool {
            output_size: output_size.into(),
        }
    }
}

impl<const N: usize> Module for AdaptiveAvgPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        adaptive_avg_pool_nd(x, self.output_size)
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// Adaptive max pooling to a fixed output size (PyTorch's `nn.AdaptiveMaxPool1d/2d`
/// without `return_indices`); see [`super::functional::adaptive_max_pool2d`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveMaxPool<const N: usize> {
    /// The output's spatial size.
    pub output_size: Spatial<N>,
}

/// PyTorch's `nn.AdaptiveMaxPool1d`.
pub type AdaptiveMaxPool1d = AdaptiveMaxPool<1>;
/// PyTorch's `nn.AdaptiveMaxPool2d`.
pub type AdaptiveMaxPool2d = AdaptiveMaxPool<2>;

impl<const N: usize> AdaptiveMaxPool<N> {
    /// Pools to `output_size`.
    pub fn new(output_size: impl Into<Spatial<N>>) -> AdaptiveMaxPool<N> {
        AdaptiveMaxPool {
            output_size: output_size.into(),
        }
    }
}

impl<const N: usize> Module for AdaptiveMaxPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(adaptive_max_pool_nd(x, self.output_size)?.0)
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}
