//! Fractional max pooling (Graham, "Fractional Max-Pooling", 2014): PyTorch's
//! `F.fractional_max_pool2d/3d` and `nn.FractionalMaxPool2d/3d`.
//!
//! Windows of a fixed kernel start at pseudo-random places, one sequence per spatial
//! dimension of every `(sample, channel)` plane, drawn from one number `u` in `[0, 1)` per
//! plane and dimension (PyTorch's `_random_samples`). PyTorch's sequence for an input of
//! length `n` pooled to `o` by a kernel `k` is
//! `start[i] = trunc((i + u)·α) - trunc(u·α)` for `i < o - 1`, with `α = (n - k) / (o - 1)`,
//! and `start[o - 1] = n - k`; the arithmetic is in the input's dtype (f32 for half inputs,
//! as PyTorch's CUDA kernel does).
//!
//! Recorded as kiln's primitives, so it plans, fuses, runs on every device and
//! differentiates as they do: the starts are tensor arithmetic on the samples (no data is
//! read to record it), each dimension's windows are one `gather` of the positions
//! `start + 0..k`, and each window keeps the element max pooling's rule names (its first
//! largest, or its last NaN), picked with an `argmax` and gathered along with its flat
//! position in the plane. The last dimension is pooled first, then each earlier one picks
//! among those winners, so the window keeps its first largest element in row-major order
//! (or its last NaN), as PyTorch's loop does, and the gradient (through the gathers'
//! scatter-adds) reaches that element alone.

use std::cell::Cell;

use super::Module;
use super::conv::{
    Spatial, batched, invalid, plane_positions, pooled_pick, require_float, require_positive,
    unbatch,
};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// The name PyTorch gives the `N`-dimensional fractional max pooling (for errors).
const fn fractional_name(n: usize) -> &'static str {
    if n == 2 {
        "fractional_max_pool2d"
    } else {
        "fractional_max_pool3d"
    }
}

/// The column of `_random_samples` that drives spatial dimension `i` (PyTorch's layout:
/// `[W, H]` in 2-D, `[T, H, W]` in 3-D).
const fn sample_column(n: usize, i: usize) -> usize {
    if n == 2 { 1 - i } else { i }
}

/// The dtype the interval arithmetic runs in: f64 for f64 inputs, else f32.
fn interval_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Where the samples come from: given (PyTorch's `_random_samples`), or drawn from a seed.
#[derive(Clone, Copy)]
enum Samples<'a> {
    Given(&'a Tensor),
    Seed(u64),
}

/// The output's spatial size from exactly one of `output_size` and `output_ratio`
/// (`⌊in · ratio⌋`, each ratio in `(0, 1)`).
fn output_spatial<const N: usize>(
    op: &'static str,
    shape: &[usize],
    spatial: &[usize],
    output_size: Option<Spatial<N>>,
    output_ratio: Option<[f64; N]>,
) -> Result<[usize; N]> {
    match (output_size, output_ratio) {
        (Some(size), None) => Ok(size.0),
        (None, Some(ratio)) => {
            check_ratio(op, shape, &ratio)?;
            Ok(std::array::from_fn(|i| {
                (spatial[i] as f64 * ratio[i]).floor() as usize
            }))
        }
        (Some(size), Some(ratio)) => Err(invalid(
            op,
            shape,
            format!(
                "takes one of output_size {:?} and output_ratio {ratio:?}, not both",
                size.0
            ),
        )),
        (None, None) => Err(invalid(
            op,
            shape,
            "needs an output_size or an output_ratio".into(),
        )),
    }
}

/// Every ratio lies strictly between 0 and 1, as PyTorch's modules require.
fn check_ratio(op: &'static str, shape: &[usize], ratio: &[f64]) -> Result<()> {
    if ratio.iter().all(|r| *r > 0.0 && *r < 1.0) {
        Ok(())
    } else {
        Err(invalid(
            op,
            shape,
            format!("output_ratio {ratio:?} must lie strictly between 0 and 1 in every dimension"),
        ))
    }
}

/// The given samples checked as PyTorch checks them (the input's dtype and device,
/// `[≥ N, C, dims]`), cut to the batch and cast to the interval dtype.
fn given_samples(
    op: &'static str,
    input: &Tensor,
    x: &Tensor,
    dims: usize,
    samples: &Tensor,
) -> Result<Tensor> {
    x.require_same_dtype_and_device(op, samples)?;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let s = samples.shape();
    if s.len() != 3 || s[0] < n || s[1] != c || s[2] != dims {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: input.shape().to_vec(),
            rhs: s.to_vec(),
            detail: format!(
                ": _random_samples must be [N, C, {dims}] with at least the input's {n} samples \
                 and exactly its {c} channels"
            ),
        });
    }
    let cut = if s[0] > n {
        samples.try_narrow(0, 0, n)?
    } else {
        samples.clone()
    };
    cut.try_cast(interval_dtype(x.dtype()))
}

/// PyTorch's window starts for one spatial dimension of every plane: `u` is `[N, C, 1]`
/// (the interval dtype), the result `[N, C, out]` i64.
fn interval_starts(u: &Tensor, len: usize, out: usize, k: usize) -> Result<Tensor> {
    let (n, c) = (u.shape()[0], u.shape()[1]);
    let last = Tensor::try_full_on([n, c, 1], (len - k) as i64, DType::I64, u.device())?;
    if out == 1 {
        return Ok(last);
    }
    let dtype = u.dtype();
    // α in the interval dtype, as PyTorch divides in its scalar type.
    let alpha = if dtype == DType::F64 {
        (len - k) as f64 / (out - 1) as f64
    } else {
        ((len - k) as f32 / (out - 1) as f32) as f64
    };
    let i = Tensor::try_arange(0, (out - 1) as i64, 1, dtype)?
        .try_to(u.device())?
        .try_reshape([1, 1, out - 1])?;
    // A float → integer cast truncates toward zero, as C++'s `static_cast<int>`.
    let head = i
        .try_add(u)?
        .try_mul(alpha)?
        .try_cast(DType::I64)?
        .try_sub(&u.try_mul(alpha)?.try_cast(DType::I64)?)?;
    Tensor::try_cat(&[&head, &last], 2)
}

/// The `N`-dimensional fractional max pooling behind the public functions and modules: the
/// pooled values and each one's i64 flat index in its input plane.
fn fractional_max_pool_nd<const N: usize>(
    input: &Tensor,
    kernel: Spatial<N>,
    output_size: Option<Spatial<N>>,
    output_ratio: Option<[f64; N]>,
    samples: Samples<'_>,
) -> Result<(Tensor, Tensor)> {
    let op = fractional_name(N);
    let (x, was_batched) = batched(op, input, N)?;
    require_float(op, &x)?;
    if x.shape()[1..].contains(&0) {
        return Err(invalid(
            op,
            input.shape(),
            "the channel and spatial dimensions must not be empty (as PyTorch requires)".into(),
        ));
    }
    require_positive(op, input.shape(), "kernel_size", kernel)?;
    let spatial = &x.shape()[2..];
    let out = output_spatial(op, input.shape(), spatial, output_size, output_ratio)?;
    for i in 0..N {
        let (len, o, k) = (spatial[i], out[i], kernel.0[i]);
        // PyTorch's checks: `o + k - 1 <= len` in 2-D, `o + k - 1 < len` in 3-D.
        // Checked: a huge kernel or output size must not wrap around and pass.
        let fits = match (o.checked_add(k), len.checked_add(1)) {
            (Some(ok), Some(len1)) if N == 2 => ok <= len1,
            (Some(ok), _) => ok <= len,
            _ => false,
        };
        if !fits {
            return Err(invalid(
                op,
                input.shape(),
                format!(
                    "kernel_size {:?} is too large for output {out:?} in dimension {}: output + kernel - 1 must be {} the input's {len} (as PyTorch requires)",
                    kernel.0,
                    input.ndim() - N + i,
                    if N == 2 { "at most" } else { "below" },
                ),
            ));
        }
    }
    let cdtype = interval_dtype(x.dtype());
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let u = match samples {
        Samples::Given(s) => given_samples(op, input, &x, N, s)?,
        Samples::Seed(seed) => Tensor::try_rand([n, c, N], seed, cdtype)?.try_to(x.device())?,
    };
    if out.contains(&0) {
        // PyTorch returns empty tensors; a view of the input keeps the graph connected.
        let mut y = x.clone();
        for (i, &o) in out.iter().enumerate() {
            y = y.try_narrow((2 + i) as isize, 0, o)?;
        }
        let at = Tensor::try_full_on(y.shape(), 0i64, DType::I64, x.device())?;
        return Ok((unbatch(y, was_batched)?, unbatch(at, was_batched)?));
    }
    let mut values = x.clone();
    let mut at = plane_positions(&x)?;
    for i in (0..N).rev() {
        let axis = 2 + i;
        let (len, o, k) = (spatial[i], out[i], kernel.0[i]);
        let col = sample_column(N, i) as isize;
        let starts = interval_starts(&u.try_narrow(2, col, 1)?, len, o, k)?;
        let offsets = Tensor::try_arange(0, k as i64, 1, DType::I64)?.try_to(x.device())?;
        // Every window's positions, `[N, C, o·k]`, laid along `axis` and broadcast over
        // the other dimensions.
        let mut index_shape = vec![1usize; N + 2];
        index_shape[..2].copy_from_slice(&[n, c]);
        index_shape[axis] = o * k;
        let mut gathered = values.shape().to_vec();
        gathered[axis] = o * k;
        let index = starts
            .try_unsqueeze(-1)?
            .try_add(&offsets)?
            .try_reshape(index_shape)?
            .try_broadcast_to(gathered.as_slice())?;
        let mut split = values.shape().to_vec();
        split.splice(axis..axis + 1, [o, k]);
        let windows = values
            .try_gather(axis as isize, &index)?
            .try_reshape(split.as_slice())?;
        let places = at
            .try_gather(axis as isize, &index)?
            .try_reshape(split.as_slice())?;
        let tap = (axis + 1) as isize;
        let pick = pooled_pick(&windows, tap)?;
        values = windows.try_gather(tap, &pick)?.try_squeeze_dim(tap)?;
        at = places.try_gather(tap, &pick)?.try_squeeze_dim(tap)?;
    }
    Ok((unbatch(values, was_batched)?, unbatch(at, was_batched)?))
}

macro_rules! fractional_functions {
    ($($(#[$doc:meta])* $name:ident, $with:ident, $samples:ident, $n:literal;)*) => {$(
        $(#[$doc])*
        pub fn $name(
            input: &Tensor,
            kernel_size: impl Into<Spatial<$n>>,
            output_size: Option<Spatial<$n>>,
            output_ratio: Option<[f64; $n]>,
            seed: u64,
        ) -> Result<Tensor> {
            let kernel = kernel_size.into();
            let samples = Samples::Seed(seed);
            Ok(fractional_max_pool_nd(input, kernel, output_size, output_ratio, samples)?.0)
        }

        #[doc = concat!("[`", stringify!($name), "`] with PyTorch's `return_indices=True`: ")]
        /// the values and, for each, the i64 flat index of the kept element in its input
        /// plane (row-major over the spatial dimensions), as max pooling gives them.
        pub fn $with(
            input: &Tensor,
            kernel_size: impl Into<Spatial<$n>>,
            output_size: Option<Spatial<$n>>,
            output_ratio: Option<[f64; $n]>,
            seed: u64,
        ) -> Result<(Tensor, Tensor)> {
            let kernel = kernel_size.into();
            let samples = Samples::Seed(seed);
            fractional_max_pool_nd(input, kernel, output_size, output_ratio, samples)
        }

        #[doc = concat!("[`", stringify!($name), "`] with PyTorch's `_random_samples`: ")]
        #[doc = concat!("`samples` is `[N, C, ", stringify!($n), "]` ")]
        /// (more rows than the batch are ignored; `[1, C, _]` or more for an unbatched
        /// input) of the input's dtype and device, values in `[0, 1)`. Returns the values
        /// and their i64 flat indices in the input planes. A sample outside `[0, 1)` that
        /// moves a window past the input fails when realized
        /// ([`KilnError::IndexOutOfRange`]).
        pub fn $samples(
            input: &Tensor,
            kernel_size: impl Into<Spatial<$n>>,
            output_size: Option<Spatial<$n>>,
            output_ratio: Option<[f64; $n]>,
            samples: &Tensor,
        ) -> Result<(Tensor, Tensor)> {
            let kernel = kernel_size.into();
            let samples = Samples::Given(samples);
            fractional_max_pool_nd(input, kernel, output_size, output_ratio, samples)
        }
    )*};
}

fractional_functions! {
    /// PyTorch's `F.fractional_max_pool2d(input, kernel_size, output_size, output_ratio)`
    /// over `[N, C, H, W]` or `[C, H, W]` (float): each output is the largest element of a
    /// `kernel_size` window whose start, per dimension, follows PyTorch's pseudo-random
    /// sequence (see the module notes), NaN propagating (the window's last NaN, else its
    /// first largest element, as max pooling). Give exactly one of `output_size` and
    /// `output_ratio` (output `⌊in · ratio⌋`, each ratio in `(0, 1)`); each dimension needs
    /// `output + kernel - 1 ≤ input`.
    ///
    /// The samples (one per plane and dimension, PyTorch's `_random_samples`) are
    /// `Tensor::try_rand([N, C, 2], seed, dtype)` (f64 for f64 inputs, else f32; one row
    /// for an unbatched input): the same `seed` gives the same windows, and, as with
    /// [`super::functional::dropout`], a new seed per step does not re-plan.
    /// [`fractional_max_pool2d_with_samples`] takes them explicitly; column 0 drives the
    /// width and column 1 the height, as in PyTorch. The gradient goes to each window's
    /// kept element.
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::{fractional_max_pool2d, fractional_max_pool2d_with_samples};
    /// let x = Tensor::arange(0.0, 25.0, 1.0).reshape([1, 1, 5, 5]);
    /// let y = fractional_max_pool2d(&x, 2, None, Some([0.5, 0.5]), 7).unwrap();
    /// assert_eq!(y.shape(), &[1, 1, 2, 2]);
    /// // u = 0.5, 5 → 3 with a 2-wide kernel: α = 1.5, starts [0, 2, 3] in both dimensions.
    /// let u = Tensor::full_dtype([1, 1, 2], 0.5, kiln::DType::F32);
    /// let (y, at) = fractional_max_pool2d_with_samples(&x, 2, Some(3.into()), None, &u).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![6.0, 8.0, 9.0, 16.0, 18.0, 19.0, 21.0, 23.0, 24.0]);
    /// assert_eq!(at.to_vec::<i64>().unwrap()[..3], [6, 8, 9]);
    /// ```
    fractional_max_pool2d, fractional_max_pool2d_with_indices, fractional_max_pool2d_with_samples, 2;
    /// PyTorch's `F.fractional_max_pool3d` over `[N, C, D, H, W]` or `[C, D, H, W]`; see
    /// [`fractional_max_pool2d`]. The samples are `[N, C, 3]`, columns for depth, height and
    /// width in that order (PyTorch's), and each dimension needs
    /// `output + kernel - 1 < input` (PyTorch's 3-D check is strict where its 2-D one is
    /// not).
    fractional_max_pool3d, fractional_max_pool3d_with_indices, fractional_max_pool3d_with_samples, 3;
}

/// Fractional max pooling over `N` spatial dimensions (PyTorch's
/// `nn.FractionalMaxPool2d/3d`); see [`super::functional::fractional_max_pool2d`].
///
/// Each forward draws new samples from the layer's seed, which then advances (as
/// [`super::Dropout`]'s does; a cached plan is reused), in training and evaluation alike,
/// as PyTorch's module does; [`FractionalMaxPool::samples`] fixes them instead (PyTorch's
/// `_random_samples`, kept as a buffer of that name).
///
/// ```
/// use kiln::nn::{FractionalMaxPool2d, Module};
/// use kiln::Tensor;
/// let pool = FractionalMaxPool2d::with_ratio(3, [0.5, 0.5], 0).unwrap();
/// let y = pool.forward(&Tensor::ones(&[2, 4, 10, 12])).unwrap();
/// assert_eq!(y.shape(), &[2, 4, 5, 6]);
/// ```
#[derive(Debug, Clone)]
pub struct FractionalMaxPool<const N: usize> {
    /// The window.
    pub kernel_size: Spatial<N>,
    /// The output's spatial size (exactly one of this and `output_ratio` is set).
    pub output_size: Option<Spatial<N>>,
    /// The output's size as a fraction of the input's, each in `(0, 1)`.
    pub output_ratio: Option<[f64; N]>,
    /// Fixed samples `[N, C, dims]` (PyTorch's `_random_samples`), or `None` to draw them.
    pub samples: Option<Tensor>,
    seed: Cell<u64>,
}

/// PyTorch's `nn.FractionalMaxPool2d`.
pub type FractionalMaxPool2d = FractionalMaxPool<2>;
/// PyTorch's `nn.FractionalMaxPool3d`.
pub type FractionalMaxPool3d = FractionalMaxPool<3>;

impl<const N: usize> FractionalMaxPool<N> {
    /// Windows of `kernel_size` pooled to `output_size`, samples drawn from `seed` onwards.
    pub fn new(
        kernel_size: impl Into<Spatial<N>>,
        output_size: impl Into<Spatial<N>>,
        seed: u64,
    ) -> FractionalMaxPool<N> {
        FractionalMaxPool {
            kernel_size: kernel_size.into(),
            output_size: Some(output_size.into()),
            output_ratio: None,
            samples: None,
            seed: Cell::new(seed),
        }
    }

    /// Windows of `kernel_size` pooled to `⌊in · output_ratio⌋`, samples drawn from `seed`
    /// onwards. A ratio outside `(0, 1)` is an error, as PyTorch's constructor raises.
    pub fn with_ratio(
        kernel_size: impl Into<Spatial<N>>,
        output_ratio: [f64; N],
        seed: u64,
    ) -> Result<FractionalMaxPool<N>> {
        let op = if N == 2 {
            "FractionalMaxPool2d"
        } else {
            "FractionalMaxPool3d"
        };
        check_ratio(op, &[], &output_ratio)?;
        Ok(FractionalMaxPool {
            kernel_size: kernel_size.into(),
            output_size: None,
            output_ratio: Some(output_ratio),
            samples: None,
            seed: Cell::new(seed),
        })
    }

    /// With these fixed samples (PyTorch's `_random_samples`) for every forward.
    pub fn samples(mut self, samples: Tensor) -> FractionalMaxPool<N> {
        self.samples = Some(samples);
        self
    }

    /// PyTorch's `return_indices=True`: the pooled values and each one's i64 flat index in
    /// its input plane.
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let samples = match &self.samples {
            Some(s) => Samples::Given(s),
            None => {
                let seed = self.seed.get();
                self.seed.set(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
                Samples::Seed(seed)
            }
        };
        let (k, size, ratio) = (self.kernel_size, self.output_size, self.output_ratio);
        fractional_max_pool_nd(x, k, size, ratio, samples)
    }
}

impl<const N: usize> Module for FractionalMaxPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_indices(x)?.0)
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    fn visit_buffers(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        if let Some(s) = &self.samples {
            f("_random_samples", s);
        }
    }

    fn visit_buffers_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        if let Some(s) = &mut self.samples {
            f("_random_samples", s);
        }
    }

    /// No mode: samples are drawn in training and evaluation alike, as in PyTorch.
    fn set_training(&mut self, _training: bool) {}
}
