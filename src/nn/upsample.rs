//! Resampling: PyTorch's `F.interpolate` (nearest, nearest-exact, linear, bilinear,
//! bicubic, trilinear and area modes), `nn.Upsample`, and `F.pixel_shuffle` /
//! `F.pixel_unshuffle` with their modules.
//!
//! Interpolation is separable, so each spatial dimension is resampled in turn, the last
//! first (the order PyTorch's kernels sum in). For every output position the source
//! positions and weights are computed on the host with PyTorch's formulas, in its
//! arithmetic (f32 for f32 and half inputs, f64 for f64); the resampling itself is one
//! `index_select` per tap and a weighted sum, so it fuses and its gradient is the
//! transposed resampling. Area mode is adaptive average pooling, as in PyTorch.

use super::Module;
use super::conv::{Spatial, adaptive_avg_pool_nd};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// PyTorch's `mode` of [`interpolate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InterpolationMode {
    /// `"nearest"`: source `⌊i·scale⌋` (PyTorch's rule, which is not centred).
    #[default]
    Nearest,
    /// `"nearest-exact"`: source `⌊(i + ½)·scale⌋`, the pixel-centred rule.
    NearestExact,
    /// `"linear"`, over `[N, C, W]`.
    Linear,
    /// `"bilinear"`, over `[N, C, H, W]`.
    Bilinear,
    /// `"bicubic"` (PyTorch's `A = -0.75`, edges clamped), over `[N, C, H, W]`.
    Bicubic,
    /// `"trilinear"`, over `[N, C, D, H, W]`.
    Trilinear,
    /// `"area"`: adaptive average pooling to the output size.
    Area,
}

impl InterpolationMode {
    fn name(self) -> &'static str {
        match self {
            InterpolationMode::Nearest => "nearest",
            InterpolationMode::NearestExact => "nearest-exact",
            InterpolationMode::Linear => "linear",
            InterpolationMode::Bilinear => "bilinear",
            InterpolationMode::Bicubic => "bicubic",
            InterpolationMode::Trilinear => "trilinear",
            InterpolationMode::Area => "area",
        }
    }

    /// The spatial dimensions the mode requires, if it fixes them.
    fn spatial_dims(self) -> Option<usize> {
        match self {
            InterpolationMode::Linear => Some(1),
            InterpolationMode::Bilinear | InterpolationMode::Bicubic => Some(2),
            InterpolationMode::Trilinear => Some(3),
            _ => None,
        }
    }

    fn interpolates(self) -> bool {
        self.spatial_dims().is_some()
    }
}

fn invalid(op: &'static str, shape: &[usize], reason: String) -> KilnError {
    KilnError::InvalidArgument {
        op,
        shape: shape.to_vec(),
        reason,
    }
}

/// One value per spatial dimension from PyTorch's "an int or a tuple": a single value is
/// repeated.
fn per_dim<T: Copy>(values: &[T], dims: usize) -> Option<Vec<T>> {
    match values.len() {
        1 => Some(vec![values[0]; dims]),
        n if n == dims => Some(values.to_vec()),
        _ => None,
    }
}

/// PyTorch's `F.interpolate(input, size, scale_factor, mode, align_corners,
/// recompute_scale_factor)` over `[N, C, *spatial]` with 1 to 3 spatial dimensions. Give
/// exactly one of `size` and `scale_factor` (one value for every dimension, or one per
/// dimension). With `scale_factor` the output size is `⌊in·s⌋` and, unless
/// `recompute_scale_factor`, the source positions use `1/s` as PyTorch's kernels do.
/// `align_corners` is for the interpolating modes only (`None` is `false`); `linear`,
/// `bilinear`/`bicubic` and `trilinear` need 1, 2 and 3 spatial dimensions. Interpolating
/// modes take float inputs (half ones are computed in f32); nearest modes any dtype.
/// Antialiasing is not offered.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{interpolate, InterpolationMode};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [1, 1, 2]);
/// let y = interpolate(&x, Some(&[4]), None, InterpolationMode::Linear, Some(false), false).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 1.25, 1.75, 2.0]);
/// let n = interpolate(&x, None, Some(&[2.0]), InterpolationMode::Nearest, None, false).unwrap();
/// assert_eq!(n.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 2.0, 2.0]);
/// ```
pub fn interpolate(
    input: &Tensor,
    size: Option<&[usize]>,
    scale_factor: Option<&[f64]>,
    mode: InterpolationMode,
    align_corners: Option<bool>,
    recompute_scale_factor: bool,
) -> Result<Tensor> {
    const OP: &str = "interpolate";
    let shape = input.shape();
    if !(3..=5).contains(&input.ndim()) {
        return Err(invalid(
            OP,
            shape,
            format!(
                "expects [N, C, *spatial] with 1 to 3 spatial dimensions, not {} dimensions",
                input.ndim()
            ),
        ));
    }
    let dims = input.ndim() - 2;
    if let Some(need) = mode.spatial_dims()
        && need != dims
    {
        return Err(invalid(
            OP,
            shape,
            format!(
                "got {}D input, but {} mode needs {}D input",
                input.ndim(),
                mode.name(),
                need + 2
            ),
        ));
    }
    if align_corners.is_some() && !mode.interpolates() {
        return Err(invalid(
            OP,
            shape,
            "align_corners option can only be set with the interpolating modes: linear | \
             bilinear | bicubic | trilinear"
                .into(),
        ));
    }
    if mode != InterpolationMode::Nearest
        && mode != InterpolationMode::NearestExact
        && !input.dtype().is_float()
    {
        return Err(KilnError::UnsupportedDType {
            op: OP,
            dtype: input.dtype(),
            detail: format!(": {} mode takes float inputs", mode.name()),
        });
    }
    let spatial = &shape[2..];
    let (out, scales): (Vec<usize>, Vec<Option<f64>>) = match (size, scale_factor) {
        (Some(s), None) => {
            let s = per_dim(s, dims).ok_or_else(|| {
                invalid(
                    OP,
                    shape,
                    format!("size {s:?} must have 1 or {dims} values for this input"),
                )
            })?;
            (s, vec![None; dims])
        }
        (None, Some(f)) => {
            let f = per_dim(f, dims).ok_or_else(|| {
                invalid(
                    OP,
                    shape,
                    format!("scale_factor {f:?} must have 1 or {dims} values for this input"),
                )
            })?;
            if f.iter().any(|v| !v.is_finite() || *v <= 0.0) {
                return Err(invalid(
                    OP,
                    shape,
                    format!("scale_factor {f:?} must be finite and positive"),
                ));
            }
            let out = spatial
                .iter()
                .zip(&f)
                .map(|(&n, &s)| (n as f64 * s).floor() as usize)
                .collect();
            let kept = f
                .iter()
                .map(|&s| (!recompute_scale_factor).then_some(s))
                .collect();
            (out, kept)
        }
        _ => {
            return Err(invalid(
                OP,
                shape,
                "only one of size or scale_factor should be defined".into(),
            ));
        }
    };
    // The output must be a tensor that can exist (a huge size or scale is refused here,
    // before any per-position table is built on the host).
    let mut out_shape = shape[..2].to_vec();
    out_shape.extend_from_slice(&out);
    crate::shape::check_shape(OP, &out_shape, input.dtype())?;
    if out.contains(&0) || spatial.contains(&0) {
        return Err(invalid(
            OP,
            shape,
            format!("input {spatial:?} and output {out:?} sizes should be greater than 0"),
        ));
    }
    if mode == InterpolationMode::Area {
        return match dims {
            1 => adaptive_avg_pool_nd::<1>(input, Spatial([out[0]])),
            2 => adaptive_avg_pool_nd::<2>(input, Spatial([out[0], out[1]])),
            _ => adaptive_avg_pool_nd::<3>(input, Spatial([out[0], out[1], out[2]])),
        };
    }
    let dtype = input.dtype();
    let compute = if dtype.is_half() { DType::F32 } else { dtype };
    let mut x = input.try_cast(compute)?;
    let align = align_corners.unwrap_or(false);
    for d in (0..dims).rev() {
        let taps = source_taps(mode, spatial[d], out[d], scales[d], align, compute)?;
        x = resample(&x, 2 + d, &taps)?;
    }
    x.try_cast(dtype)
}

/// For every output position along one dimension, its (source index, weight) taps.
type Taps = Vec<Vec<(i64, f64)>>;

/// PyTorch's source positions and weights for one dimension of `n` resampled to `o`,
/// computed in f32 or f64 (`compute`) as its kernels compute them for that dtype (the
/// nearest modes always in f32).
fn source_taps(
    mode: InterpolationMode,
    n: usize,
    o: usize,
    scale: Option<f64>,
    align_corners: bool,
    compute: DType,
) -> Result<Taps> {
    let single = compute != DType::F64;
    // Round to the kernel's arithmetic.
    let r = |v: f64| if single { v as f32 as f64 } else { v };
    let f32s = |v: f64| v as f32 as f64;
    let last = n as i64 - 1;
    // PyTorch's `compute_scales_value`: 1/scale_factor when one was given, else in/out.
    let exact = match scale {
        Some(s) => 1.0 / s,
        None => n as f64 / o as f64,
    };
    let (ratio, nearest) = (r(exact), f32s(exact));
    // `area_pixel_compute_scale`: align_corners maps the corner pixels onto each other.
    let area = if align_corners {
        r(if o > 1 {
            (n as f64 - 1.0) / (o as f64 - 1.0)
        } else {
            0.0
        })
    } else {
        ratio
    };
    // One entry per output position: a failed reservation is an error, not an abort.
    let mut taps: Taps = Vec::new();
    taps.try_reserve_exact(o)
        .map_err(|_| KilnError::OutOfMemory {
            device: "cpu".into(),
            requested: o.saturating_mul(std::mem::size_of::<Vec<(i64, f64)>>()),
            reserved: 0,
            free: 0,
        })?;
    taps.extend((0..o).map(|i| {
        let i_f = i as f64;
        match mode {
            // PyTorch's nearest index: same size copies, twice the size halves, and
            // otherwise ⌊i·scale⌋ in f32 for every dtype.
            InterpolationMode::Nearest if n == o => vec![(i as i64, 1.0)],
            InterpolationMode::Nearest if o == 2 * n => vec![(i as i64 >> 1, 1.0)],
            InterpolationMode::Nearest => {
                vec![((f32s(i_f * nearest).floor() as i64).min(last), 1.0)]
            }
            InterpolationMode::NearestExact => {
                vec![((f32s((i_f + 0.5) * nearest).floor() as i64).min(last), 1.0)]
            }
            InterpolationMode::Bicubic => {
                let src = if align_corners {
                    r(area * i_f)
                } else {
                    r(r(area * (i_f + 0.5)) - 0.5)
                };
                let base = src.floor();
                let t = r(src - base);
                cubic_weights(t, single)
                    .into_iter()
                    .enumerate()
                    .map(|(k, w)| ((base as i64 - 1 + k as i64).clamp(0, last), w))
                    .collect()
            }
            _ if n == o => vec![(i as i64, 1.0)],
            _ => {
                let src = if align_corners {
                    r(area * i_f)
                } else {
                    r(r(area * (i_f + 0.5)) - 0.5).max(0.0)
                };
                let i0 = (src.floor() as i64).min(last);
                let l1 = r(src - i0 as f64).clamp(0.0, 1.0);
                let i1 = if i0 < last { i0 + 1 } else { i0 };
                vec![(i0, r(1.0 - l1)), (i1, l1)]
            }
        }
    }));
    Ok(taps)
}

/// PyTorch's cubic convolution weights (`A = -0.75`) of the four taps around a source
/// position with fraction `t`.
fn cubic_weights(t: f64, single: bool) -> [f64; 4] {
    let r = |v: f64| if single { v as f32 as f64 } else { v };
    const A: f64 = -0.75;
    // |x| ≤ 1 and 1 < |x| < 2, in PyTorch's Horner forms.
    let near = |x: f64| r(r(r(r(r((A + 2.0) * x) - (A + 3.0)) * x) * x) + 1.0);
    let far = |x: f64| r(r(r(r(r(r(A * x) - 5.0 * A) * x) + 8.0 * A) * x) - 4.0 * A);
    [
        far(r(t + 1.0)),
        near(t),
        near(r(1.0 - t)),
        far(r(r(1.0 - t) + 1.0)),
    ]
}

/// `x` resampled along `axis`: output position `i` is `Σ weight·x[source]` over `taps[i]`.
fn resample(x: &Tensor, axis: usize, taps: &Taps) -> Result<Tensor> {
    let o = taps.len();
    let width = taps.iter().map(Vec::len).max().unwrap_or(1);
    let mut shape = vec![1usize; x.ndim()];
    shape[axis] = o;
    let mut total: Option<Tensor> = None;
    for k in 0..width {
        let index: Vec<i64> = taps.iter().map(|t| t[k.min(t.len() - 1)].0).collect();
        let index = Tensor::try_from_vec(index, [o])?.try_to(x.device())?;
        let picked = x.try_index_select(axis as isize, &index)?;
        let term = if width == 1 {
            picked
        } else {
            let weights: Vec<f64> = taps
                .iter()
                .map(|t| if k < t.len() { t[k].1 } else { 0.0 })
                .collect();
            let w = Tensor::try_from_vec(weights, shape.clone())?
                .try_cast(x.dtype())?
                .try_to(x.device())?;
            picked.try_mul(&w)?
        };
        total = Some(match total {
            None => term,
            Some(t) => t.try_add(&term)?,
        });
    }
    total.ok_or_else(|| KilnError::internal("resample without taps"))
}

/// PyTorch's `nn.Upsample(size, scale_factor, mode, align_corners)`: [`interpolate`] as a
/// layer (`recompute_scale_factor` off, as its default).
///
/// ```
/// use kiln::nn::{InterpolationMode, Module, Upsample};
/// use kiln::Tensor;
/// let up = Upsample::scale(&[2.0]).mode(InterpolationMode::Bilinear).align_corners(true);
/// assert_eq!(up.forward(&Tensor::ones(&[1, 3, 4, 5])).unwrap().shape(), &[1, 3, 8, 10]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Upsample {
    /// The output's spatial size (one value, or one per dimension).
    pub size: Option<Vec<usize>>,
    /// The scale of each spatial dimension (one value, or one per dimension).
    pub scale_factor: Option<Vec<f64>>,
    /// The interpolation.
    pub mode: InterpolationMode,
    /// PyTorch's `align_corners` (interpolating modes only).
    pub align_corners: Option<bool>,
}

impl Upsample {
    /// To a fixed spatial size, nearest mode.
    pub fn size(size: &[usize]) -> Upsample {
        Upsample {
            size: Some(size.to_vec()),
            scale_factor: None,
            mode: InterpolationMode::Nearest,
            align_corners: None,
        }
    }

    /// By a scale factor, nearest mode.
    pub fn scale(scale_factor: &[f64]) -> Upsample {
        Upsample {
            size: None,
            scale_factor: Some(scale_factor.to_vec()),
            mode: InterpolationMode::Nearest,
            align_corners: None,
        }
    }

    /// With this mode.
    pub fn mode(mut self, mode: InterpolationMode) -> Upsample {
        self.mode = mode;
        self
    }

    /// With PyTorch's `align_corners`.
    pub fn align_corners(mut self, align_corners: bool) -> Upsample {
        self.align_corners = Some(align_corners);
        self
    }
}

impl Module for Upsample {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        interpolate(
            x,
            self.size.as_deref(),
            self.scale_factor.as_deref(),
            self.mode,
            self.align_corners,
            false,
        )
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

/// PyTorch's `F.pixel_shuffle(input, r)`: `[*, C·r², H, W]` to `[*, C, H·r, W·r]`, each
/// group of `r²` channels spread over an `r × r` block (sub-pixel convolution's output).
/// A reshape, a permutation and a reshape.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{pixel_shuffle, pixel_unshuffle};
/// let x = Tensor::arange(0.0, 8.0, 1.0).reshape([1, 4, 1, 2]);
/// let y = pixel_shuffle(&x, 2).unwrap();
/// assert_eq!(y.shape(), &[1, 1, 2, 4]);
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
/// assert_eq!(pixel_unshuffle(&y, 2).unwrap().to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
/// ```
pub fn pixel_shuffle(input: &Tensor, upscale_factor: usize) -> Result<Tensor> {
    shuffle("pixel_shuffle", input, upscale_factor, true)
}

/// PyTorch's `F.pixel_unshuffle(input, r)`: the inverse of [`pixel_shuffle`],
/// `[*, C, H·r, W·r]` to `[*, C·r², H, W]`.
pub fn pixel_unshuffle(input: &Tensor, downscale_factor: usize) -> Result<Tensor> {
    shuffle("pixel_unshuffle", input, downscale_factor, false)
}

fn shuffle(op: &'static str, x: &Tensor, r: usize, up: bool) -> Result<Tensor> {
    let shape = x.shape();
    if x.ndim() < 3 || r == 0 {
        return Err(invalid(
            op,
            shape,
            format!("expects [*, C, H, W] (3 or more dimensions) and a factor ≥ 1, not {r}"),
        ));
    }
    let nd = x.ndim();
    let (c, h, w) = (shape[nd - 3], shape[nd - 2], shape[nd - 1]);
    // Every size the shuffle makes (r², C·r², H·r, W·r) must be a size: a huge factor
    // used to wrap r² to 0 and divide by it.
    let fits = |v: Option<usize>| v.is_some_and(|v| v <= isize::MAX as usize);
    let r2 = r.checked_mul(r);
    let made = if up {
        [r2, h.checked_mul(r), w.checked_mul(r)]
    } else {
        [r2, r2.and_then(|r2| c.checked_mul(r2)), Some(r)]
    };
    if !made.into_iter().all(fits) {
        return Err(invalid(
            op,
            shape,
            format!("factor {r} makes a dimension larger than a tensor can have"),
        ));
    }
    let lead: Vec<isize> = shape[..nd - 3].iter().map(|&d| d as isize).collect();
    let b = lead.len() as isize;
    let (r_, c_, h_, w_) = (r as isize, c as isize, h as isize, w as isize);
    let dims = |tail: &[isize]| -> Vec<isize> { lead.iter().chain(tail).copied().collect() };
    let lead_axes: Vec<isize> = (0..b).collect();
    let axes = |tail: &[isize]| -> Vec<isize> {
        lead_axes
            .iter()
            .copied()
            .chain(tail.iter().map(|&a| a + b))
            .collect()
    };
    if up {
        if !c.is_multiple_of(r * r) {
            return Err(invalid(
                op,
                shape,
                format!("the {c} channels must be divisible by the square of factor {r}"),
            ));
        }
        let oc = c_ / (r_ * r_);
        x.try_reshape(dims(&[oc, r_, r_, h_, w_]))?
            .try_permute(axes(&[0, 3, 1, 4, 2]))?
            .try_reshape(dims(&[oc, h_ * r_, w_ * r_]))
    } else {
        if !h.is_multiple_of(r) || !w.is_multiple_of(r) {
            return Err(invalid(
                op,
                shape,
                format!("height {h} and width {w} must be divisible by factor {r}"),
            ));
        }
        let (oh, ow) = (h_ / r_, w_ / r_);
        x.try_reshape(dims(&[c_, oh, r_, ow, r_]))?
            .try_permute(axes(&[0, 2, 4, 1, 3]))?
            .try_reshape(dims(&[c_ * r_ * r_, oh, ow]))
    }
}

/// PyTorch's `nn.PixelShuffle(r)`; see [`pixel_shuffle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelShuffle(pub usize);

/// PyTorch's `nn.PixelUnshuffle(r)`; see [`pixel_unshuffle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelUnshuffle(pub usize);

impl Module for PixelShuffle {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        pixel_shuffle(x, self.0)
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}

impl Module for PixelUnshuffle {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        pixel_unshuffle(x, self.0)
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}
