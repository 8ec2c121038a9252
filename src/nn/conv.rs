//! Convolution and pooling over 1, 2 or 3 spatial dimensions: PyTorch's `conv1d/2d/3d`,
//! `conv_transpose1d/2d/3d`, `max_pool1d/2d/3d`, `avg_pool1d/2d/3d` and
//! `adaptive_avg_pool1d/2d`, with their arguments, output sizes, errors and gradients.
//!
//! Each is recorded as kiln's primitives, so it plans, fuses, runs on every device and
//! differentiates as they do:
//! - the input is padded and permuted batch last (views), and each kernel offset's strided
//!   window is a slice (a view); the `K` windows are stacked into one `[C, K, *out, N]`
//!   tensor (one copy: the im2col columns);
//! - a convolution is one batched matmul of the weight, seen as `[G, O/G, C/G·K]`, with
//!   those columns seen as `[G, C/G·K, L·N]`; the result is viewed batch first again;
//! - the batch is the innermost dimension of every window kernel because the spatial rows
//!   are short (4 to 32): with them innermost, the CPU interpreter paid its per-run setup
//!   every few elements, and a small CNN's training step took 65 ms instead of 8 (AMD EPYC
//!   Zen 4). Consecutive layers' permutations cancel, so nothing is transposed between
//!   them;
//! - max pooling takes each window's first largest element (`argmax`, then `gather`), so
//!   its gradient goes to that one element as PyTorch's does (`amax` would split it among
//!   ties, which the zeros after a ReLU make common). That gradient is a select (`where`
//!   the tap is the chosen one), elementwise, so it fuses with the gradients around it; a
//!   `gather`'s own derivative would scatter-add into a zeroed tensor;
//! - an input stored batch first (the network's input) is copied batch last once before
//!   its windows are stacked; a layer's output is already batch-last data seen batch
//!   first, and is read in place;
//! - average pooling sums each window and divides by PyTorch's divisor, a constant per
//!   output position when padding or `ceil_mode` clips windows; windows of up to 16 taps
//!   are added tap by tap (one kernel) rather than stacked and summed;
//! - adaptive average pooling averages PyTorch's cells one spatial dimension at a time (a
//!   reshape and a mean when the size divides, else one slice per cell).

use crate::device::Device;
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// A size per spatial dimension (kernel, stride, dilation, pooling padding): one value for
/// every dimension, as PyTorch's `int` argument, or one each.
///
/// ```
/// use kiln::nn::functional::Spatial;
/// assert_eq!(Spatial::<2>::from(3), Spatial([3, 3]));
/// assert_eq!(Spatial::<2>::from((1, 2)), Spatial([1, 2]));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spatial<const N: usize>(pub [usize; N]);

impl<const N: usize> From<usize> for Spatial<N> {
    fn from(v: usize) -> Self {
        Spatial([v; N])
    }
}

impl<const N: usize> From<[usize; N]> for Spatial<N> {
    fn from(v: [usize; N]) -> Self {
        Spatial(v)
    }
}

impl From<(usize, usize)> for Spatial<2> {
    fn from((a, b): (usize, usize)) -> Self {
        Spatial([a, b])
    }
}

impl From<(usize, usize, usize)> for Spatial<3> {
    fn from((a, b, c): (usize, usize, usize)) -> Self {
        Spatial([a, b, c])
    }
}

/// A convolution's zero padding: explicit sizes, or PyTorch's `'same'` and `'valid'`.
///
/// ```
/// use kiln::nn::functional::ConvPadding;
/// assert_eq!(ConvPadding::<2>::from(1), ConvPadding::Explicit([1, 1]));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPadding<const N: usize> {
    /// `p` zeros before and after each spatial dimension.
    Explicit([usize; N]),
    /// PyTorch's `padding='same'`: the output is as large as the input (stride 1 only);
    /// an odd total puts the extra zero after, as PyTorch does.
    Same,
    /// PyTorch's `padding='valid'`: no padding.
    Valid,
}

impl<const N: usize> From<usize> for ConvPadding<N> {
    fn from(v: usize) -> Self {
        ConvPadding::Explicit([v; N])
    }
}

impl<const N: usize> From<[usize; N]> for ConvPadding<N> {
    fn from(v: [usize; N]) -> Self {
        ConvPadding::Explicit(v)
    }
}

impl From<(usize, usize)> for ConvPadding<2> {
    fn from((a, b): (usize, usize)) -> Self {
        ConvPadding::Explicit([a, b])
    }
}

/// The name PyTorch gives the `N`-dimensional convolution (for errors).
pub(crate) const fn conv_name(n: usize) -> &'static str {
    match n {
        1 => "conv1d",
        2 => "conv2d",
        _ => "conv3d",
    }
}

pub(super) fn invalid(op: &'static str, shape: &[usize], reason: String) -> KilnError {
    KilnError::InvalidArgument {
        op,
        shape: shape.to_vec(),
        reason,
    }
}

/// `x` as `[N, C, *spatial]`, and whether it came so (PyTorch also takes one unbatched
/// `[C, *spatial]` sample).
pub(super) fn batched(op: &'static str, x: &Tensor, n: usize) -> Result<(Tensor, bool)> {
    if x.ndim() == n + 2 {
        Ok((x.clone(), true))
    } else if x.ndim() == n + 1 {
        Ok((x.try_unsqueeze(0)?, false))
    } else {
        Err(invalid(
            op,
            x.shape(),
            format!(
                "expects a [C, *spatial] or [N, C, *spatial] input of {} or {} dimensions, not {}",
                n + 1,
                n + 2,
                x.ndim()
            ),
        ))
    }
}

pub(super) fn require_float(op: &'static str, x: &Tensor) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(KilnError::UnsupportedDType {
            op,
            dtype: x.dtype(),
            detail: ": it takes float tensors, as PyTorch's CPU kernels do".into(),
        })
    }
}

pub(super) fn require_positive<const N: usize>(
    op: &'static str,
    shape: &[usize],
    what: &str,
    v: Spatial<N>,
) -> Result<()> {
    if v.0.contains(&0) {
        return Err(invalid(
            op,
            shape,
            format!("{what} {:?} must be positive in every dimension", v.0),
        ));
    }
    Ok(())
}

/// Output length of a window `eff` long moved by `stride` over `len` elements padded with
/// `pad` on each side; `ceil_mode` keeps a last partial window that starts inside the
/// input or its left padding (PyTorch's pooling rule).
fn pooled_len(
    op: &'static str,
    shape: &[usize],
    len: usize,
    pad: usize,
    eff: usize,
    stride: usize,
    ceil_mode: bool,
) -> Result<usize> {
    let padded = len + 2 * pad;
    if padded < eff {
        return Err(invalid(
            op,
            shape,
            format!(
                "the window ({eff} elements with dilation) is larger than the padded input ({padded})"
            ),
        ));
    }
    let span = padded - eff;
    let mut out = if ceil_mode {
        span.div_ceil(stride)
    } else {
        span / stride
    } + 1;
    if ceil_mode && (out - 1) * stride >= len + pad {
        out -= 1;
    }
    Ok(out)
}

/// Average pooling adds windows of at most this many taps one by one rather than stacking
/// them and summing the stack (the stack is stored first when a sum would read more than
/// 16 padded views: 9 taps of a 3×3 window already do).
const MAX_ADDED_TAPS: usize = 16;

/// The `K = Π kernel` strided windows of `x` (`[N, C, *spatial]`, already padded), stacked
/// as `[C, K, *out, N]` with the last kernel dimension varying fastest (the order of
/// PyTorch's weight layout) and the batch last.
pub(super) fn windows(
    x: &Tensor,
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
    out: &[usize],
) -> Result<Tensor> {
    let parts = window_taps(x, kernel, stride, dilation, out, true)?;
    if let [only] = parts.as_slice() {
        return only.try_unsqueeze(1);
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    Tensor::try_stack(&refs, 1)
}

/// The windows of [`windows`] before they are stacked: one `[C, *out, N]` view per tap.
/// With `copy_batch_first`, a batch-first input is first copied batch last (see below).
pub(super) fn window_taps(
    x: &Tensor,
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
    out: &[usize],
    copy_batch_first: bool,
) -> Result<Vec<Tensor>> {
    let d = kernel.len();
    // Batch last: every window's rows then run along the batch (see the module notes).
    let mut perm: Vec<isize> = (1..=d as isize + 1).collect();
    perm.push(0);
    // A batch-first input (the network's input, or any value stored batch first) is copied
    // batch last once: stacking reads one tap per output element, so a stacking kernel
    // reading through the permuted view would gather each window's batch elements a whole
    // image apart. A layer's output is a permuted view of batch-last data already and is
    // read as it lies. (Taps that are added, as average pooling's, are read by one kernel
    // that iterates along whichever side most of its reads are contiguous on.)
    let copy = copy_batch_first && x.shape()[0] > 1 && x.is_padded_row_major()?;
    let mut x = x.try_permute(perm)?;
    if copy {
        x = x.try_contiguous()?;
    }
    let x = &x;
    let count: usize = kernel.iter().product();
    let mut parts = Vec::with_capacity(count);
    let mut offset = vec![0usize; d];
    for _ in 0..count {
        let mut ranges = vec![(0isize, isize::MAX, 1isize); 1];
        for i in 0..d {
            let start = offset[i] * dilation[i];
            let end = start + (out[i] - 1) * stride[i] + 1;
            ranges.push((start as isize, end as isize, stride[i] as isize));
        }
        parts.push(x.try_slice(&ranges)?);
        for i in (0..d).rev() {
            offset[i] += 1;
            if offset[i] < kernel[i] {
                break;
            }
            offset[i] = 0;
        }
    }
    Ok(parts)
}

/// `z` with `s - 1` zeros after each element along `axis`, the trailing ones cut (the
/// adjoint of a stride-`s` slice): `len` elements become `(len - 1)·s + 1`.
pub(super) fn spread_by_stride(z: &Tensor, axis: usize, s: usize) -> Result<Tensor> {
    let len = z.shape()[axis];
    if s <= 1 || len == 0 {
        return Ok(z.clone());
    }
    let ax = axis as isize;
    let mut pads = vec![(0, 0); axis + 1];
    pads.push((0, s - 1));
    z.try_unsqueeze(ax + 1)?
        .try_pad(&pads, 0)?
        .try_flatten_dims(ax, ax + 1)?
        .try_narrow(ax, 0, (len - 1) * s + 1)
}

/// `y` (`[C, *spatial, N]`, batch last) as `[N, C, *spatial]` (a view).
fn batch_first(y: &Tensor) -> Result<Tensor> {
    let nd = y.ndim() as isize;
    let mut perm = vec![nd - 1];
    perm.extend(0..nd - 1);
    y.try_permute(perm)
}

pub(super) fn unbatch(y: Tensor, batched: bool) -> Result<Tensor> {
    if batched { Ok(y) } else { y.try_squeeze_dim(0) }
}

/// The `N`-dimensional convolution behind [`conv1d`], [`conv2d`] and [`conv3d`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_nd<const N: usize>(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: Spatial<N>,
    padding: ConvPadding<N>,
    dilation: Spatial<N>,
    groups: usize,
) -> Result<Tensor> {
    let op = conv_name(N);
    let (x, was_batched) = batched(op, input, N)?;
    require_float(op, &x)?;
    if weight.ndim() != N + 2 {
        return Err(invalid(
            op,
            weight.shape(),
            format!(
                "the weight must be [out_channels, in_channels / groups, *kernel], {} dimensions, not {}",
                N + 2,
                weight.ndim()
            ),
        ));
    }
    x.require_same_dtype_and_device(op, weight)?;
    let (cin, oc) = (x.shape()[1], weight.shape()[0]);
    if groups == 0 || !oc.is_multiple_of(groups) || weight.shape()[1] * groups != cin {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: weight.shape().to_vec(),
            detail: format!(
                ": with groups={groups} the input's {cin} channels must be weight.shape[1] · groups \
                 and the weight's {oc} output channels a multiple of groups (groups ≥ 1)"
            ),
        });
    }
    let kernel: [usize; N] = std::array::from_fn(|i| weight.shape()[2 + i]);
    require_positive(op, weight.shape(), "the kernel size", Spatial(kernel))?;
    require_positive(op, x.shape(), "stride", stride)?;
    require_positive(op, x.shape(), "dilation", dilation)?;
    if let Some(b) = bias {
        if b.shape() != [oc] {
            return Err(KilnError::ShapeMismatch {
                op,
                lhs: weight.shape().to_vec(),
                rhs: b.shape().to_vec(),
                detail: format!(": the bias must be [{oc}], one per output channel"),
            });
        }
        x.require_same_dtype_and_device(op, b)?;
    }
    let eff: [usize; N] = std::array::from_fn(|i| dilation.0[i] * (kernel[i] - 1) + 1);
    let pads: [(usize, usize); N] = match padding {
        ConvPadding::Explicit(p) => p.map(|v| (v, v)),
        ConvPadding::Valid => [(0, 0); N],
        ConvPadding::Same => {
            if stride.0.iter().any(|&s| s != 1) {
                return Err(invalid(
                    op,
                    x.shape(),
                    format!(
                        "padding 'same' needs stride 1, not {:?} (as PyTorch)",
                        stride.0
                    ),
                ));
            }
            std::array::from_fn(|i| {
                let total = eff[i] - 1;
                (total / 2, total - total / 2)
            })
        }
    };
    let spatial = &x.shape()[2..];
    let mut out = [0usize; N];
    for i in 0..N {
        let padded = spatial[i] + pads[i].0 + pads[i].1;
        if padded < eff[i] {
            return Err(invalid(
                op,
                x.shape(),
                format!(
                    "the kernel {:?} (dilation {:?}) is larger than the padded input {:?} in dimension {}",
                    kernel,
                    dilation.0,
                    padded,
                    2 + i
                ),
            ));
        }
        out[i] = (padded - eff[i]) / stride.0[i] + 1;
    }
    let mut all_pads = vec![(0, 0); 2];
    all_pads.extend_from_slice(&pads);
    let xp = x.try_pad(&all_pads, 0)?;
    let cols = windows(&xp, &kernel, &stride.0, &dilation.0, &out)?;
    let n = x.shape()[0];
    let k: usize = kernel.iter().product();
    let l: usize = out.iter().product();
    let cg = cin / groups;
    let cols = cols.try_reshape([groups, cg * k, l * n])?;
    let w = weight.try_reshape([groups, oc / groups, cg * k])?;
    let mut shape = vec![oc];
    shape.extend_from_slice(&out);
    shape.push(n);
    let mut y = w.try_matmul(&cols)?.try_reshape(shape)?;
    if let Some(b) = bias {
        // Added batch last, so the sum is written in the product's order.
        let mut bs = vec![oc];
        bs.resize(N + 2, 1);
        y = y.try_add(&b.try_reshape(bs)?)?;
    }
    unbatch(batch_first(&y)?, was_batched)
}

macro_rules! conv_functions {
    ($($(#[$doc:meta])* $name:ident, $n:literal;)*) => {$(
        $(#[$doc])*
        pub fn $name(
            input: &Tensor,
            weight: &Tensor,
            bias: Option<&Tensor>,
            stride: impl Into<Spatial<$n>>,
            padding: impl Into<ConvPadding<$n>>,
            dilation: impl Into<Spatial<$n>>,
            groups: usize,
        ) -> Result<Tensor> {
            conv_nd(input, weight, bias, stride.into(), padding.into(), dilation.into(), groups)
        }
    )*};
}

conv_functions! {
    /// PyTorch's `F.conv1d`: `input` `[N, C, L]` (or `[C, L]`), `weight` `[O, C / groups, k]`,
    /// optional `bias` `[O]`. Float tensors of one dtype and device.
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::conv1d;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 1, 4]);
    /// let w = Tensor::from_vec(vec![1.0f32, -1.0], &[1, 1, 2]);
    /// let y = conv1d(&x, &w, None, 1, 0, 1, 1).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![-1.0, -1.0, -1.0]);
    /// ```
    conv1d, 1;
    /// PyTorch's `F.conv2d(input, weight, bias, stride, padding, dilation, groups)`: `input`
    /// `[N, C, H, W]` (or `[C, H, W]`), `weight` `[O, C / groups, kH, kW]`, optional `bias`
    /// `[O]`; output `[N, O, H', W']` with `H' = (H + 2p - d(kH - 1) - 1) / s + 1`. Strides,
    /// paddings and dilations take one value or one per dimension; `padding` also takes
    /// [`ConvPadding::Same`] and [`ConvPadding::Valid`]. Recorded as an im2col stack of
    /// strided views and one batched matmul (see the module's notes), so it fuses, runs on
    /// every device and has gradients for the input, weight and bias.
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::conv2d;
    /// let x = Tensor::arange(0.0, 16.0, 1.0).reshape([1, 1, 4, 4]);
    /// let w = Tensor::ones(&[2, 1, 3, 3]);
    /// let y = conv2d(&x, &w, None, 1, 1, 1, 1).unwrap();
    /// assert_eq!(y.shape(), &[1, 2, 4, 4]);
    /// // The top-left output sums the 2×2 corner (the rest is padding): 0 + 1 + 4 + 5.
    /// assert_eq!(y.to_vec::<f32>().unwrap()[0], 10.0);
    /// ```
    conv2d, 2;
    /// PyTorch's `F.conv3d`: `input` `[N, C, D, H, W]` (or `[C, D, H, W]`), `weight`
    /// `[O, C / groups, kD, kH, kW]`; see [`conv2d`].
    conv3d, 3;
}

/// The name PyTorch gives the `N`-dimensional transposed convolution (for errors).
pub(crate) const fn conv_transpose_name(n: usize) -> &'static str {
    match n {
        1 => "conv_transpose1d",
        2 => "conv_transpose2d",
        _ => "conv_transpose3d",
    }
}

/// The `N`-dimensional transposed convolution behind [`conv_transpose1d`],
/// [`conv_transpose2d`] and [`conv_transpose3d`]: the input with `stride - 1` zeros
/// between its elements, padded by `dilation·(k - 1) - padding` (plus `output_padding`
/// after; a negative amount crops), convolved with stride 1 by the weight flipped in
/// space with its input and output channels swapped per group. The gradient of
/// [`conv_nd`] with respect to its input, as PyTorch defines it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_transpose_nd<const N: usize>(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: Spatial<N>,
    padding: Spatial<N>,
    output_padding: Spatial<N>,
    groups: usize,
    dilation: Spatial<N>,
) -> Result<Tensor> {
    let op = conv_transpose_name(N);
    let (x, was_batched) = batched(op, input, N)?;
    require_float(op, &x)?;
    if weight.ndim() != N + 2 {
        return Err(invalid(
            op,
            weight.shape(),
            format!(
                "the weight must be [in_channels, out_channels / groups, *kernel], {} dimensions, not {}",
                N + 2,
                weight.ndim()
            ),
        ));
    }
    x.require_same_dtype_and_device(op, weight)?;
    let cin = x.shape()[1];
    if groups == 0 || weight.shape()[0] != cin || !cin.is_multiple_of(groups) {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: weight.shape().to_vec(),
            detail: format!(
                ": the input's {cin} channels must be weight.shape[0] and a multiple of \
                 groups={groups} (groups ≥ 1)"
            ),
        });
    }
    let cout = weight.shape()[1] * groups;
    let kernel: [usize; N] = std::array::from_fn(|i| weight.shape()[2 + i]);
    require_positive(op, weight.shape(), "the kernel size", Spatial(kernel))?;
    require_positive(op, x.shape(), "stride", stride)?;
    require_positive(op, x.shape(), "dilation", dilation)?;
    if let Some(b) = bias {
        if b.shape() != [cout] {
            return Err(KilnError::ShapeMismatch {
                op,
                lhs: weight.shape().to_vec(),
                rhs: b.shape().to_vec(),
                detail: format!(": the bias must be [{cout}], one per output channel"),
            });
        }
        x.require_same_dtype_and_device(op, b)?;
    }
    let mut z = x.clone();
    for (i, &k) in kernel.iter().enumerate() {
        let (len, s, p, d, extra) = (
            x.shape()[2 + i],
            stride.0[i],
            padding.0[i],
            dilation.0[i],
            output_padding.0[i],
        );
        if extra >= s.max(d) {
            return Err(invalid(
                op,
                x.shape(),
                format!(
                    "output_padding {:?} must be smaller than the stride {:?} or the dilation {:?} in each dimension (as PyTorch requires)",
                    output_padding.0, stride.0, dilation.0
                ),
            ));
        }
        let full = (len.max(1) - 1) * s + d * (k - 1) + extra + 1;
        if len == 0 || full <= 2 * p {
            return Err(invalid(
                op,
                x.shape(),
                format!(
                    "the output would be empty in dimension {} (input {len}, stride {s}, padding {p}, kernel {k}, dilation {d})",
                    2 + i
                ),
            ));
        }
        let ax = (2 + i) as isize;
        z = spread_by_stride(&z, 2 + i, s)?;
        // Pad by `d·(k - 1) - p` before and that plus `extra` after; crop where negative.
        let before = (d * (k - 1)) as isize - p as isize;
        let after = before + extra as isize;
        let mut pads = vec![(0, 0); 2 + i];
        pads.push((before.max(0) as usize, after.max(0) as usize));
        z = z.try_pad(&pads, 0)?;
        let n = z.shape()[2 + i] as isize;
        z = z.try_slice_dim(ax, (-before).max(0), n - (-after).max(0), 1)?;
    }
    // [in, out/g, *k] -> [out, in/g, *k], flipped in space.
    let (cig, cog) = (cin / groups, cout / groups);
    let mut grouped = vec![groups, cig, cog];
    grouped.extend_from_slice(&kernel);
    let mut swapped = vec![cout, cig];
    swapped.extend_from_slice(&kernel);
    let space: Vec<isize> = (2..2 + N as isize).collect();
    let w = weight
        .try_reshape(grouped)?
        .try_transpose(1, 2)?
        .try_reshape(swapped)?
        .try_flip(space)?;
    let y = conv_nd(
        &z,
        &w,
        bias,
        Spatial([1; N]),
        ConvPadding::Explicit([0; N]),
        dilation,
        groups,
    )?;
    unbatch(y, was_batched)
}

macro_rules! conv_transpose_functions {
    ($($(#[$doc:meta])* $name:ident, $n:literal;)*) => {$(
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name(
            input: &Tensor,
            weight: &Tensor,
            bias: Option<&Tensor>,
            stride: impl Into<Spatial<$n>>,
            padding: impl Into<Spatial<$n>>,
            output_padding: impl Into<Spatial<$n>>,
            groups: usize,
            dilation: impl Into<Spatial<$n>>,
        ) -> Result<Tensor> {
            conv_transpose_nd(
                input,
                weight,
                bias,
                stride.into(),
                padding.into(),
                output_padding.into(),
                groups,
                dilation.into(),
            )
        }
    )*};
}

conv_transpose_functions! {
    /// PyTorch's `F.conv_transpose1d(input, weight, bias, stride, padding,
    /// output_padding, groups, dilation)` over `[N, C, L]` or `[C, L]`; see
    /// [`conv_transpose2d`].
    conv_transpose1d, 1;
    /// PyTorch's `F.conv_transpose2d(input, weight, bias, stride, padding, output_padding,
    /// groups, dilation)` (note PyTorch's order: `groups` before `dilation`): `input`
    /// `[N, C, H, W]` (or `[C, H, W]`), `weight` `[C, O / groups, kH, kW]`, output
    /// `[N, O, H', W']` with `H' = (H - 1)·s - 2p + d·(kH - 1) + output_padding + 1`. The
    /// gradient of [`conv2d`] with respect to its input (a decoder's upsampling layer).
    /// Recorded as a zero-inserted, padded input and a [`conv2d`] with the flipped weight.
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::conv_transpose2d;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2]);
    /// let w = Tensor::ones(&[1, 1, 2, 2]);
    /// // Stride 2 places each input's 2×2 footprint side by side.
    /// let y = conv_transpose2d(&x, &w, None, 2, 0, 0, 1, 1).unwrap();
    /// assert_eq!(y.shape(), &[1, 1, 4, 4]);
    /// assert_eq!(&y.to_vec::<f32>().unwrap()[..4], &[1.0, 1.0, 2.0, 2.0]);
    /// ```
    conv_transpose2d, 2;
    /// PyTorch's `F.conv_transpose3d` over `[N, C, D, H, W]` or `[C, D, H, W]`; see
    /// [`conv_transpose2d`].
    conv_transpose3d, 3;
}

/// The name PyTorch gives the `N`-dimensional pooling `kind` (for errors).
const fn pool_name(kind: u8, n: usize) -> &'static str {
    match (kind, n) {
        (b'm', 1) => "max_pool1d",
        (b'm', 2) => "max_pool2d",
        (b'm', _) => "max_pool3d",
        (b'a', 1) => "avg_pool1d",
        (b'a', 2) => "avg_pool2d",
        (b'a', _) => "avg_pool3d",
        (b'x', 1) => "adaptive_max_pool1d",
        (b'x', 2) => "adaptive_max_pool2d",
        (b'x', _) => "adaptive_max_pool3d",
        (_, 1) => "adaptive_avg_pool1d",
        (_, 2) => "adaptive_avg_pool2d",
        _ => "adaptive_avg_pool3d",
    }
}

/// The flat index of every element in its spatial plane (`h·W + w` in 2-D), i64, as a
/// view of `x`'s `[N, C, *spatial]` shape (one `arange`, broadcast over batch and channels).
pub(super) fn plane_positions(x: &Tensor) -> Result<Tensor> {
    let spatial = &x.shape()[2..];
    let plane: usize = spatial.iter().product();
    let mut shape = vec![1isize, 1];
    shape.extend(spatial.iter().map(|&d| d as isize));
    Tensor::try_arange(0, plane as i64, 1, DType::I64)?
        .try_to(x.device())?
        .try_reshape(shape)?
        .try_broadcast_to(x.shape())
}

/// The windows of a pooling over a plane of `spatial` size (the padding is `padding` on
/// both sides before the windows are taken).
struct WindowGeometry<'a> {
    spatial: &'a [usize],
    kernel: &'a [usize],
    stride: &'a [usize],
    padding: &'a [usize],
    dilation: &'a [usize],
    out: &'a [usize],
}

/// Each window tap's flat position in its input plane, or `-1` where the tap lies in the
/// padding: `[1, K, *out, 1]` i64, the taps in [`windows`]' order, computed from indices
/// (generators and integer ops, which fuse into whatever reads them) rather than as
/// windows of a padded `arange` (views that are each copied out).
fn tap_positions(g: &WindowGeometry<'_>, device: Device) -> Result<Tensor> {
    let d = g.spatial.len();
    let taps: usize = g.kernel.iter().product();
    let rank = d + 3;
    let arange = |n: usize, axis: usize| -> Result<Tensor> {
        let mut shape = vec![1isize; rank];
        shape[axis] = n as isize;
        Tensor::try_arange(0, n as i64, 1, DType::I64)?
            .try_to(device)?
            .try_reshape(shape)
    };
    let tap = arange(taps, 1)?;
    let (mut inner, mut plane) = (taps, g.spatial.iter().product::<usize>());
    // Per dimension: the tap's term of the flat position, and whether it is inside.
    let mut parts = Vec::with_capacity(d);
    for i in 0..d {
        inner /= g.kernel[i].max(1);
        plane /= g.spatial[i].max(1);
        let t = tap
            .try_floor_divide(inner as i64)?
            .try_remainder(g.kernel[i] as i64)?;
        // The coordinate along dimension i: o·stride + t·dilation - padding.
        let c = arange(g.out[i], 2 + i)?
            .try_mul(g.stride[i] as i64)?
            .try_add(&t.try_mul(g.dilation[i] as i64)?)?
            .try_sub(g.padding[i] as i64)?;
        let ok = c
            .try_ge(0i64)?
            .try_logical_and(&c.try_lt(g.spatial[i] as i64)?)?;
        parts.push((c.try_mul(plane as i64)?, ok));
    }
    let Some(((position, inside), rest)) = parts.split_first() else {
        return Err(KilnError::internal("tap positions of a 0-d pooling"));
    };
    let (mut position, mut inside) = (position.clone(), inside.clone());
    for (term, ok) in rest {
        position = position.try_add(term)?;
        inside = inside.try_logical_and(ok)?;
    }
    Tensor::try_where(&inside, &position, -1i64)
}

/// Which element along `axis` of `cell` PyTorch's CPU max pooling keeps (`axis` stays, of
/// size 1): its loop replaces the running maximum when `value > max || isnan(value)`, so
/// the last NaN wins where there is one, and the first largest element otherwise.
///
/// One `argmax` and one integer `max`: each NaN is tagged with its index plus one (other
/// elements with 0), so the tags' maximum is 0 without a NaN and one past the last NaN's
/// index with one.
pub(super) fn pooled_pick(cell: &Tensor, axis: isize) -> Result<Tensor> {
    let first_max = cell.try_argmax_keepdim(axis)?;
    let len = cell.shape()[axis as usize];
    let mut shape = vec![1isize; cell.ndim()];
    shape[axis as usize] = len as isize;
    let tags = Tensor::try_arange(1, len as i64 + 1, 1, DType::I64)?
        .try_to(cell.device())?
        .try_reshape(shape)?;
    let last_nan = Tensor::try_where(&cell.try_isnan()?, &tags, 0i64)?.try_max_keepdim(axis)?;
    Tensor::try_where(
        &last_nan.try_gt(0i64)?,
        &last_nan.try_sub(1i64)?,
        &first_max,
    )
}

/// The `N`-dimensional max pooling behind [`max_pool1d`], [`max_pool2d`] and their
/// `_with_indices` forms: the pooled values and, when `with_indices`, each one's i64 flat
/// index in its input plane.
///
/// Each window keeps the element [`pooled_pick`] names. A window whose largest value is
/// `-inf` and that starts in the padding keeps, as PyTorch's does, its first element inside
/// the input (its value is `-inf` either way; the index and the gradient go there).
pub(crate) fn max_pool_nd<const N: usize>(
    input: &Tensor,
    kernel: Spatial<N>,
    stride: Spatial<N>,
    padding: Spatial<N>,
    dilation: Spatial<N>,
    ceil_mode: bool,
    with_indices: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let op = pool_name(b'm', N);
    let (x, was_batched) = batched(op, input, N)?;
    require_float(op, &x)?;
    require_positive(op, x.shape(), "kernel_size", kernel)?;
    require_positive(op, x.shape(), "stride", stride)?;
    require_positive(op, x.shape(), "dilation", dilation)?;
    let eff: [usize; N] = std::array::from_fn(|i| dilation.0[i] * (kernel.0[i] - 1) + 1);
    let mut pads = vec![(0, 0); 2];
    let mut out = [0usize; N];
    for i in 0..N {
        let (len, p, s) = (x.shape()[2 + i], padding.0[i], stride.0[i]);
        if p > eff[i] / 2 {
            return Err(invalid(
                op,
                x.shape(),
                format!(
                    "padding {:?} must be at most half the window ({:?} with dilation), as PyTorch requires",
                    padding.0, eff
                ),
            ));
        }
        out[i] = pooled_len(op, x.shape(), len, p, eff[i], s, ceil_mode)?;
        let needed = (out[i] - 1) * s + eff[i];
        pads.push((p, needed.saturating_sub(p + len)));
    }
    let taps = |t: &Tensor| windows(t, &kernel.0, &stride.0, &dilation.0, &out);
    let w = taps(&x.try_pad(&pads, Scalar::Float(f64::NEG_INFINITY))?)?;
    let mut pick = pooled_pick(&w, 1)?;
    let mut places = None;
    // Only a window that starts in the left padding can pick a padded element.
    if with_indices || padding.0.iter().any(|&p| p > 0) {
        let geometry = WindowGeometry {
            spatial: &x.shape()[2..],
            kernel: &kernel.0,
            stride: &stride.0,
            padding: &padding.0,
            dilation: &dilation.0,
            out: &out,
        };
        let at = tap_positions(&geometry, x.device())?;
        // The picked tap's position: a select and a sum over the taps (one matches).
        let taps_index = at.shape()[1];
        let mut shape = vec![1isize; at.ndim()];
        shape[1] = taps_index as isize;
        let index = Tensor::try_arange(0, taps_index as i64, 1, DType::I64)?
            .try_to(x.device())?
            .try_reshape(shape)?;
        let position_of = |pick: &Tensor| -> Result<Tensor> {
            Tensor::try_where(&index.try_eq(pick)?, &at, 0i64)?.try_sum_keepdim(1)
        };
        let in_padding = position_of(&pick)?.try_lt(0i64)?;
        let first_inside = at.try_ge(0i64)?.try_argmax_keepdim(1)?;
        let first_inside = first_inside.try_broadcast_to(pick.shape())?;
        pick = Tensor::try_where(&in_padding, &first_inside, &pick)?;
        if with_indices {
            let chosen = position_of(&pick)?.try_squeeze_dim(1)?;
            places = Some(unbatch(batch_first(&chosen)?, was_batched)?);
        }
    }
    let y = select_along(&w, 1, &pick)?;
    Ok((unbatch(batch_first(&y)?, was_batched)?, places))
}

/// `t`'s element at index `pick` along `axis` (which `pick` holds with size 1), the axis
/// removed: a `gather`, whose gradient is written as a select (`where` the axis index
/// equals `pick`, over the gradient broadcast along the axis) rather than a scatter-add
/// into a zeroed tensor, so it is elementwise and fuses with the gradients around it.
fn select_along(t: &Tensor, axis: usize, pick: &Tensor) -> Result<Tensor> {
    let len = t.shape()[axis];
    let mut shape = vec![1isize; t.shape().len()];
    shape[axis] = len as isize;
    let hit = Tensor::try_arange(0, len as i64, 1, DType::I64)?
        .try_to(t.device())?
        .try_reshape(shape)?
        .try_eq(pick)?;
    let forward = || {
        t.try_gather(axis as isize, pick)?
            .try_squeeze_dim(axis as isize)
    };
    crate::autograd::composite(&[t], forward, move |_, _, g| {
        let g = g.try_unsqueeze(axis as isize)?;
        Ok(vec![Some(Tensor::try_where(&hit, &g, 0.0)?)])
    })
}

macro_rules! max_pool_functions {
    ($($(#[$doc:meta])* $name:ident, $with:ident, $n:literal;)*) => {$(
        $(#[$doc])*
        pub fn $name(
            input: &Tensor,
            kernel_size: impl Into<Spatial<$n>>,
            stride: impl Into<Spatial<$n>>,
            padding: impl Into<Spatial<$n>>,
            dilation: impl Into<Spatial<$n>>,
            ceil_mode: bool,
        ) -> Result<Tensor> {
            Ok(max_pool_nd(
                input,
                kernel_size.into(),
                stride.into(),
                padding.into(),
                dilation.into(),
                ceil_mode,
                false,
            )?
            .0)
        }

        #[doc = concat!("[`", stringify!($name), "`] with PyTorch's `return_indices=True`: ")]
        /// the values and, for each, the i64 flat index of the kept element in its input
        /// plane (row-major over the spatial dimensions), which the matching `max_unpool`
        /// takes.
        pub fn $with(
            input: &Tensor,
            kernel_size: impl Into<Spatial<$n>>,
            stride: impl Into<Spatial<$n>>,
            padding: impl Into<Spatial<$n>>,
            dilation: impl Into<Spatial<$n>>,
            ceil_mode: bool,
        ) -> Result<(Tensor, Tensor)> {
            let (y, at) = max_pool_nd(
                input,
                kernel_size.into(),
                stride.into(),
                padding.into(),
                dilation.into(),
                ceil_mode,
                true,
            )?;
            Ok((y, at.ok_or_else(|| KilnError::internal("max pooling indices"))?))
        }
    )*};
}

max_pool_functions! {
    /// PyTorch's `F.max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode)` over
    /// `[N, C, L]` or `[C, L]`; see [`max_pool2d`].
    max_pool1d, max_pool1d_with_indices, 1;
    /// PyTorch's `F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)` over
    /// `[N, C, H, W]` or `[C, H, W]` (float). PyTorch's default stride is the kernel size:
    /// pass it. Padding is `-inf` and at most half the window; `ceil_mode` keeps a last
    /// partial window that starts inside the input. Each output is its window's first
    /// largest element, or its last NaN where it has one (PyTorch's CPU rule); the
    /// gradient goes to that element alone, as PyTorch's does. `return_indices=True` is
    /// [`max_pool2d_with_indices`].
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::{max_pool2d, max_pool2d_with_indices};
    /// let x = Tensor::arange(0.0, 16.0, 1.0).reshape([1, 1, 4, 4]);
    /// let y = max_pool2d(&x, 2, 2, 0, 1, false).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.0, 7.0, 13.0, 15.0]);
    /// let (_, at) = max_pool2d_with_indices(&x, 2, 2, 0, 1, false).unwrap();
    /// assert_eq!(at.to_vec::<i64>().unwrap(), vec![5, 7, 13, 15]);
    /// ```
    max_pool2d, max_pool2d_with_indices, 2;
    /// PyTorch's `F.max_pool3d` over `[N, C, D, H, W]` or `[C, D, H, W]`; see [`max_pool2d`].
    max_pool3d, max_pool3d_with_indices, 3;
}

/// The name PyTorch gives the `N`-dimensional max unpooling (for errors).
const fn unpool_name(n: usize) -> &'static str {
    match n {
        1 => "max_unpool1d",
        2 => "max_unpool2d",
        _ => "max_unpool3d",
    }
}

/// The `N`-dimensional max unpooling behind [`max_unpool1d`] and [`max_unpool2d`]: zeros of
/// the unpooled shape with each input value written at its index's place in its plane.
pub(crate) fn max_unpool_nd<const N: usize>(
    input: &Tensor,
    indices: &Tensor,
    kernel: Spatial<N>,
    stride: Spatial<N>,
    padding: Spatial<N>,
    output_size: Option<Spatial<N>>,
) -> Result<Tensor> {
    let op = unpool_name(N);
    let (x, was_batched) = batched(op, input, N)?;
    require_float(op, &x)?;
    if indices.shape() != input.shape() {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: input.shape().to_vec(),
            rhs: indices.shape().to_vec(),
            detail: ": the indices must have the input's shape (as max pooling returned them)"
                .into(),
        });
    }
    if indices.dtype() != DType::I64 {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: indices.dtype(),
            detail: ": the indices must be i64, as PyTorch requires".into(),
        });
    }
    input.require_same_device(op, indices)?;
    require_positive(op, x.shape(), "kernel_size", kernel)?;
    require_positive(op, x.shape(), "stride", stride)?;
    let mut out = [0usize; N];
    for (i, slot) in out.iter_mut().enumerate() {
        let (len, k, s, p) = (
            x.shape()[2 + i] as i64,
            kernel.0[i] as i64,
            stride.0[i] as i64,
            padding.0[i] as i64,
        );
        let default = (len - 1) * s - 2 * p + k;
        let size = match output_size {
            None => default,
            Some(o) => {
                let o = o.0[i] as i64;
                if o <= default - s || o >= default + s {
                    return Err(invalid(
                        op,
                        x.shape(),
                        format!(
                            "output size {:?} is invalid: dimension {i} must lie strictly between {} and {}, as PyTorch requires",
                            output_size.map(|o| o.0),
                            default - s,
                            default + s
                        ),
                    ));
                }
                o
            }
        };
        if size < 1 {
            return Err(invalid(
                op,
                x.shape(),
                format!(
                    "kernel {:?}, stride {:?} and padding {:?} leave dimension {i} empty",
                    kernel.0, stride.0, padding.0
                ),
            ));
        }
        *slot = size as usize;
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let plane: usize = out.iter().product();
    let index = indices.try_reshape([n as isize, c as isize, -1])?;
    let values = x.try_reshape([n as isize, c as isize, -1])?;
    let mut shape = vec![n, c];
    shape.extend_from_slice(&out);
    let y = Tensor::try_full_on([n, c, plane], 0.0, x.dtype(), x.device())?
        .try_scatter(2, &index, &values)?
        .try_reshape(shape)?;
    unbatch(y, was_batched)
}

macro_rules! max_unpool_functions {
    ($($(#[$doc:meta])* $name:ident, $n:literal;)*) => {$(
        $(#[$doc])*
        pub fn $name(
            input: &Tensor,
            indices: &Tensor,
            kernel_size: impl Into<Spatial<$n>>,
            stride: impl Into<Spatial<$n>>,
            padding: impl Into<Spatial<$n>>,
            output_size: Option<Spatial<$n>>,
        ) -> Result<Tensor> {
            max_unpool_nd(
                input,
                indices,
                kernel_size.into(),
                stride.into(),
                padding.into(),
                output_size,
            )
        }
    )*};
}

max_unpool_functions! {
    /// PyTorch's `F.max_unpool1d(input, indices, kernel_size, stride, padding, output_size)`
    /// over `[N, C, L]` or `[C, L]`; see [`max_unpool2d`].
    max_unpool1d, 1;
    /// PyTorch's `F.max_unpool2d(input, indices, kernel_size, stride, padding, output_size)`:
    /// the partial inverse of [`max_pool2d_with_indices`]. The output is zeros of spatial
    /// size `(in - 1)·stride - 2·padding + kernel` (or `output_size`, which may differ from
    /// that by less than a stride), with each input value at its index's place in its
    /// `[H', W']` plane. `indices` is i64, of the input's shape; an index outside the plane
    /// fails when realized ([`KilnError::IndexOutOfRange`]). Where two indices name one
    /// place, the last in row-major order wins and alone receives the place's gradient.
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::{max_pool2d_with_indices, max_unpool2d};
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 2.0, 0.0, 3.0, 4.0, 8.0, 6.0], [1, 1, 2, 4]);
    /// let (y, at) = max_pool2d_with_indices(&x, 2, 2, 0, 1, false).unwrap();
    /// let back = max_unpool2d(&y, &at, 2, 2, 0, None).unwrap();
    /// assert_eq!(back.to_vec::<f32>().unwrap(), vec![0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 8.0, 0.0]);
    /// ```
    max_unpool2d, 2;
    /// PyTorch's `F.max_unpool3d` over `[N, C, D, H, W]` or `[C, D, H, W]`; see
    /// [`max_unpool2d`].
    max_unpool3d, 3;
}

/// The `N`-dimensional average pooling behind [`avg_pool1d`] and [`avg_pool2d`].
pub(crate) fn avg_pool_nd<const N: usize>(
    input: &Tensor,
    kernel: Spatial<N>,
    stride: Spatial<N>,
    padding: Spatial<N>,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Option<usize>,
) -> Result<Tensor> {
    let op = pool_name(b'a', N);
    let (x, was_batched) = batched(op, input, N)?;
    require_float(op, &x)?;
    require_positive(op, x.shape(), "kernel_size", kernel)?;
    require_positive(op, x.shape(), "stride", stride)?;
    if divisor_override == Some(0) {
        return Err(invalid(
            op,
            x.shape(),
            "divisor_override must not be 0".into(),
        ));
    }
    let mut pads = vec![(0, 0); 2];
    let mut out = [0usize; N];
    // Per dimension, each output position's divisor factor (PyTorch's rule: the window
    // clipped to the padded input, or to the input itself without `count_include_pad`).
    let mut factors: Vec<Vec<usize>> = Vec::with_capacity(N);
    for (i, o_len) in out.iter_mut().enumerate() {
        let (len, k, p, s) = (x.shape()[2 + i], kernel.0[i], padding.0[i], stride.0[i]);
        if p > k / 2 {
            return Err(invalid(
                op,
                x.shape(),
                format!(
                    "padding {:?} must be at most half the kernel {:?}, as PyTorch requires",
                    padding.0, kernel.0
                ),
            ));
        }
        *o_len = pooled_len(op, x.shape(), len, p, k, s, ceil_mode)?;
        let needed = (*o_len - 1) * s + k;
        pads.push((p, needed.saturating_sub(p + len)));
        factors.push(
            (0..*o_len)
                .map(|o| {
                    // Positions in the padded input: the input is [p, p + len).
                    let start = o * s;
                    let end = (start + k).min(len + 2 * p);
                    if count_include_pad {
                        end - start
                    } else {
                        end.min(p + len) - start.max(p)
                    }
                })
                .collect(),
        );
    }
    let xp = x.try_pad(&pads, 0)?;
    let ones = [1; N];
    let count: usize = kernel.0.iter().product();
    // Up to 16 taps are added in window order (one elementwise kernel, every read useful);
    // larger windows are stacked and summed, which keeps the graph small.
    let taps = window_taps(
        &xp,
        &kernel.0,
        &stride.0,
        &ones,
        &out,
        count > MAX_ADDED_TAPS,
    )?;
    let sum = match taps.split_first() {
        Some((first, rest)) if taps.len() <= MAX_ADDED_TAPS => rest
            .iter()
            .try_fold(first.clone(), |acc, t| acc.try_add(t))?,
        _ => {
            let refs: Vec<&Tensor> = taps.iter().collect();
            Tensor::try_stack(&refs, 1)?.try_sum(1)?
        }
    };
    let sum = batch_first(&sum)?;
    let y = if let Some(d) = divisor_override {
        sum.try_div(d as f64)?
    } else if factors.iter().all(|f| f.iter().all(|&v| v == f[0])) {
        let d: usize = factors.iter().map(|f| f[0]).product();
        sum.try_div(d as f64)?
    } else {
        let total: usize = out.iter().product();
        let mut divisor = Vec::with_capacity(total);
        for flat in 0..total {
            let (mut rest, mut d) = (flat, 1usize);
            for i in (0..N).rev() {
                d *= factors[i][rest % out[i]];
                rest /= out[i];
            }
            divisor.push(d as f64);
        }
        let divisor = Tensor::try_from_vec(divisor, out.to_vec())?
            .try_cast(x.dtype())?
            .try_to(x.device())?;
        sum.try_div(&divisor)?
    };
    unbatch(y, was_batched)
}

/// PyTorch's `F.avg_pool1d(input, kernel_size, stride, padding, ceil_mode,
/// count_include_pad)` over `[N, C, L]` or `[C, L]`; see [`avg_pool2d`].
pub fn avg_pool1d(
    input: &Tensor,
    kernel_size: impl Into<Spatial<1>>,
    stride: impl Into<Spatial<1>>,
    padding: impl Into<Spatial<1>>,
    ceil_mode: bool,
    count_include_pad: bool,
) -> Result<Tensor> {
    avg_pool_nd(
        input,
        kernel_size.into(),
        stride.into(),
        padding.into(),
        ceil_mode,
        count_include_pad,
        None,
    )
}

macro_rules! avg_pool_functions {
    ($($(#[$doc:meta])* $name:ident, $n:literal;)*) => {$(
        $(#[$doc])*
        pub fn $name(
            input: &Tensor,
            kernel_size: impl Into<Spatial<$n>>,
            stride: impl Into<Spatial<$n>>,
            padding: impl Into<Spatial<$n>>,
            ceil_mode: bool,
            count_include_pad: bool,
            divisor_override: Option<usize>,
        ) -> Result<Tensor> {
            avg_pool_nd(
                input,
                kernel_size.into(),
                stride.into(),
                padding.into(),
                ceil_mode,
                count_include_pad,
                divisor_override,
            )
        }
    )*};
}

avg_pool_functions! {
    /// PyTorch's `F.avg_pool2d(input, kernel_size, stride, padding, ceil_mode,
    /// count_include_pad, divisor_override)` over `[N, C, H, W]` or `[C, H, W]` (float).
    /// PyTorch's defaults are `stride = kernel_size`, `padding = 0`, `ceil_mode = false`,
    /// `count_include_pad = true`, no override. Each window's sum is divided by its size
    /// clipped to the padded input (or to the input without `count_include_pad`), or by
    /// `divisor_override`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::avg_pool2d;
    /// let x = Tensor::arange(0.0, 16.0, 1.0).reshape([1, 1, 4, 4]);
    /// let y = avg_pool2d(&x, 2, 2, 0, false, true, None).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.5, 4.5, 10.5, 12.5]);
    /// ```
    avg_pool2d, 2;
    /// PyTorch's `F.avg_pool3d` over `[N, C, D, H, W]` or `[C, D, H, W]`; see [`avg_pool2d`].
    avg_pool3d, 3;
}

/// Output cell `j` of a dimension of length `len` pooled to `o`: PyTorch's (possibly
/// overlapping) `⌊j·len/o⌋ .. ⌈(j+1)·len/o⌉`.
fn adaptive_cell(j: usize, len: usize, o: usize) -> (isize, isize) {
    ((j * len / o) as isize, ((j + 1) * len).div_ceil(o) as isize)
}

/// The `N`-dimensional adaptive average pooling behind [`adaptive_avg_pool1d`] and
/// [`adaptive_avg_pool2d`].
pub(crate) fn adaptive_avg_pool_nd<const N: usize>(
    input: &Tensor,
    output_size: Spatial<N>,
) -> Result<Tensor> {
    let op = pool_name(b'd', N);
    let (mut x, was_batched) = batched(op, input, N)?;
    require_float(op, &x)?;
    require_positive(op, x.shape(), "output_size", output_size)?;
    if x.shape()[2..].contains(&0) {
        return Err(invalid(
            op,
            x.shape(),
            "the spatial dimensions must not be empty (as PyTorch requires)".into(),
        ));
    }
    for i in 0..N {
        let axis = (2 + i) as isize;
        let (len, o) = (x.shape()[2 + i], output_size.0[i]);
        if len.is_multiple_of(o) {
            // Equal cells: split the axis into [o, len / o] (a view) and average the second.
            let mut shape: Vec<usize> = x.shape().to_vec();
            shape.splice(2 + i..3 + i, [o, len / o]);
            x = x.try_reshape(shape)?.try_mean(axis + 1)?;
        } else {
            // PyTorch's cells: [⌊j·len/o⌋, ⌈(j+1)·len/o⌉), which overlap.
            let cells: Vec<Tensor> = (0..o)
                .map(|j| {
                    let (start, end) = adaptive_cell(j, len, o);
                    x.try_slice_dim(axis, start, end, 1)?.try_mean_keepdim(axis)
                })
                .collect::<Result<_>>()?;
            let refs: Vec<&Tensor> = cells.iter().collect();
            x = Tensor::try_cat(&refs, axis)?;
        }
    }
    unbatch(x, was_batched)
}

macro_rules! adaptive_avg_pool_functions {
    ($($(#[$doc:meta])* $name:ident, $n:literal;)*) => {$(
        $(#[$doc])*
        pub fn $name(input: &Tensor, output_size: impl Into<Spatial<$n>>) -> Result<Tensor> {
            adaptive_avg_pool_nd(input, output_size.into())
        }
    )*};
}

adaptive_avg_pool_functions! {
    /// PyTorch's `F.adaptive_avg_pool1d(input, output_size)` over `[N, C, L]` or `[C, L]`;
    /// see [`adaptive_avg_pool2d`].
    adaptive_avg_pool1d, 1;
    /// PyTorch's `F.adaptive_avg_pool2d(input, output_size)` over `[N, C, H, W]` or
    /// `[C, H, W]` (float): output cell `j` of a dimension of length `n` pooled to `o` is the
    /// mean of elements `⌊j·n/o⌋ .. ⌈(j+1)·n/o⌉`. `output_size = 1` is global average
    /// pooling.
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::adaptive_avg_pool2d;
    /// let x = Tensor::arange(0.0, 16.0, 1.0).reshape([1, 1, 4, 4]);
    /// let y = adaptive_avg_pool2d(&x, 1).unwrap();
    /// assert_eq!(y.shape(), &[1, 1, 1, 1]);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![7.5]);
    /// ```
    adaptive_avg_pool2d, 2;
}

/// The `N`-dimensional adaptive max pooling behind [`adaptive_max_pool1d`] and
/// [`adaptive_max_pool2d`]: the values and, for each, its flat index in the input's
/// spatial plane (`h·W + w` in 2-D), as PyTorch's `return_indices=True` gives them.
///
/// Each spatial dimension is pooled in turn, the last first: each row of a cell keeps the
/// element [`pooled_pick`] names (its first largest, or its last NaN), gathered with the
/// flat index it came from. Each earlier dimension then picks among those row winners by
/// the same rule, so the cell keeps its first largest element in row-major order, or its
/// last NaN, as PyTorch's loop does (pooling the first dimension first would find the
/// column-major first), and the gradient (through the gathers) reaches it alone.
pub(crate) fn adaptive_max_pool_nd<const N: usize>(
    input: &Tensor,
    output_size: Spatial<N>,
) -> Result<(Tensor, Tensor)> {
    let op = pool_name(b'x', N);
    let (mut x, was_batched) = batched(op, input, N)?;
    require_float(op, &x)?;
    require_positive(op, x.shape(), "output_size", output_size)?;
    let spatial = &x.shape()[2..];
    if spatial.contains(&0) {
        return Err(invalid(
            op,
            x.shape(),
            "the spatial dimensions must not be empty (as PyTorch requires)".into(),
        ));
    }
    let mut at = plane_positions(&x)?;
    for i in (0..N).rev() {
        let axis = (2 + i) as isize;
        let (len, o) = (x.shape()[2 + i], output_size.0[i]);
        let (values, places): (Vec<Tensor>, Vec<Tensor>) = (0..o)
            .map(|j| {
                let (start, end) = adaptive_cell(j, len, o);
                let cell = x.try_slice_dim(axis, start, end, 1)?;
                let first = pooled_pick(&cell, axis)?;
                Ok((
                    cell.try_gather(axis, &first)?,
                    at.try_slice_dim(axis, start, end, 1)?
                        .try_gather(axis, &first)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        x = Tensor::try_cat(&values.iter().collect::<Vec<_>>(), axis)?;
        at = Tensor::try_cat(&places.iter().collect::<Vec<_>>(), axis)?;
    }
    Ok((unbatch(x, was_batched)?, unbatch(at, was_batched)?))
}

macro_rules! adaptive_max_pool_functions {
    ($($(#[$doc:meta])* $name:ident, $with:ident, $n:literal;)*) => {$(
        $(#[$doc])*
        pub fn $name(input: &Tensor, output_size: impl Into<Spatial<$n>>) -> Result<Tensor> {
            Ok(adaptive_max_pool_nd(input, output_size.into())?.0)
        }

        #[doc = concat!("[`", stringify!($name), "`] with PyTorch's `return_indices=True`: ")]
        /// the values and, for each, the i64 flat index of the chosen element in its
        /// input plane (row-major over the spatial dimensions).
        pub fn $with(
            input: &Tensor,
            output_size: impl Into<Spatial<$n>>,
        ) -> Result<(Tensor, Tensor)> {
            adaptive_max_pool_nd(input, output_size.into())
        }
    )*};
}

adaptive_max_pool_functions! {
    /// PyTorch's `F.adaptive_max_pool1d(input, output_size)` over `[N, C, L]` or `[C, L]`;
    /// see [`adaptive_max_pool2d`].
    adaptive_max_pool1d, adaptive_max_pool1d_with_indices, 1;
    /// PyTorch's `F.adaptive_max_pool2d(input, output_size)` over `[N, C, H, W]` or
    /// `[C, H, W]` (float): output cell `j` of a dimension of length `n` pooled to `o` is
    /// the largest of elements `⌊j·n/o⌋ .. ⌈(j+1)·n/o⌉` (cells may overlap), NaN
    /// propagating. The gradient goes to each cell's first largest element in row-major
    /// order, as PyTorch's does.
    ///
    /// ```
    /// use kiln::Tensor;
    /// use kiln::nn::functional::{adaptive_max_pool2d, adaptive_max_pool2d_with_indices};
    /// let x = Tensor::arange(0.0, 16.0, 1.0).reshape([1, 1, 4, 4]);
    /// let y = adaptive_max_pool2d(&x, 2).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.0, 7.0, 13.0, 15.0]);
    /// let (_, at) = adaptive_max_pool2d_with_indices(&x, [1, 3]).unwrap();
    /// assert_eq!(at.to_vec::<i64>().unwrap(), vec![13, 14, 15]);
    /// ```
    adaptive_max_pool2d, adaptive_max_pool2d_with_indices, 2;
}
