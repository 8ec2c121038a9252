//! Sliding blocks and spatial sampling: PyTorch's `F.unfold` (im2col) and `F.fold`
//! (col2im) with the [`Unfold`] and [`Fold`] modules, and `F.affine_grid` and
//! `F.grid_sample`.
//!
//! All are composed from kiln's primitives, so they fuse, run on every device and get
//! their gradients from their parts:
//! - [`unfold`] pads the input and stacks its `kh·kw` strided windows (views), the
//!   convolutions' im2col columns seen batch first;
//! - [`fold`], unfold's adjoint, spreads the columns out by the stride (zeros between
//!   them), places each kernel offset's slab in the padded image with a pad, sums the
//!   slabs and cuts the padding off;
//! - [`grid_sample`] computes each output point's source coordinates from the grid with
//!   tensor arithmetic (PyTorch's unnormalization, border clipping and reflection), takes
//!   the integer taps with `floor`/`round` (whose gradient is zero) and reads them with one
//!   `gather` per tap; the tap weights are differentiable functions of the grid, so the
//!   gradient reaches both the input (through the gathers) and the grid (through the
//!   weights);
//! - [`affine_grid`] is a product of the base grid (built on the host) with `θᵀ`.

use super::Module;
use super::conv::{
    Spatial, batched, invalid, require_float, require_positive, spread_by_stride, unbatch, windows,
};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// Number of sliding blocks along one dimension: `(len + 2p - d(k - 1) - 1) / s + 1`, or
/// `None` when the dilated kernel does not fit in the padded length.
fn blocks(len: usize, k: usize, d: usize, p: usize, s: usize) -> Option<usize> {
    // Checked: huge arguments must not wrap around into a small block count.
    let padded = p.checked_mul(2)?.checked_add(len)?;
    let eff = d.checked_mul(k - 1)?.checked_add(1)?;
    (padded >= eff).then(|| (padded - eff) / s + 1)
}

/// The sliding-block arguments of [`unfold`] and [`fold`], checked.
struct BlockArgs {
    kernel: [usize; 2],
    dilation: [usize; 2],
    padding: [usize; 2],
    stride: [usize; 2],
}

impl BlockArgs {
    fn new(
        op: &'static str,
        shape: &[usize],
        kernel: Spatial<2>,
        dilation: Spatial<2>,
        padding: Spatial<2>,
        stride: Spatial<2>,
    ) -> Result<BlockArgs> {
        require_positive(op, shape, "kernel_size", kernel)?;
        require_positive(op, shape, "dilation", dilation)?;
        require_positive(op, shape, "stride", stride)?;
        for (what, v) in [
            ("kernel_size", kernel),
            ("dilation", dilation),
            ("padding", padding),
            ("stride", stride),
        ] {
            if v.0.iter().any(|&x| x > isize::MAX as usize) {
                return Err(invalid(
                    op,
                    shape,
                    format!("{what} {:?} is larger than a dimension can be", v.0),
                ));
            }
        }
        Ok(BlockArgs {
            kernel: kernel.0,
            dilation: dilation.0,
            padding: padding.0,
            stride: stride.0,
        })
    }

    /// The blocks along both dimensions of a `size` image, or PyTorch's error.
    fn blocks(&self, op: &'static str, shape: &[usize], size: [usize; 2]) -> Result<[usize; 2]> {
        let b: Vec<Option<usize>> = (0..2)
            .map(|i| {
                blocks(
                    size[i],
                    self.kernel[i],
                    self.dilation[i],
                    self.padding[i],
                    self.stride[i],
                )
                .filter(|&n| n > 0)
            })
            .collect();
        match (b[0], b[1]) {
            (Some(h), Some(w)) => Ok([h, w]),
            _ => Err(invalid(
                op,
                shape,
                format!(
                    "given spatial size {size:?}, kernel_size {:?}, dilation {:?}, padding {:?} \
                     and stride {:?}, there is no sliding block: the dilated kernel is larger \
                     than the padded input",
                    self.kernel, self.dilation, self.padding, self.stride
                ),
            )),
        }
    }
}

/// PyTorch's `F.unfold(input, kernel_size, dilation, padding, stride)` (im2col): the
/// sliding `kh×kw` blocks of `input` `[N, C, H, W]` (or unbatched `[C, H, W]`) as columns,
/// `[N, C·kh·kw, L]` (or `[C·kh·kw, L]`), `L` the number of blocks; row `c·kh·kw + i·kw + j`
/// holds channel `c` at kernel offset `(i, j)`. Each size takes one value or one per
/// dimension. Any dtype; differentiable (its gradient is [`fold`]).
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::unfold;
/// let x = Tensor::arange(0.0, 9.0, 1.0).reshape([1, 1, 3, 3]);
/// let cols = unfold(&x, 2, 1, 0, 1).unwrap();
/// assert_eq!(cols.shape(), &[1, 4, 4]);
/// // The first block is [[0, 1], [3, 4]]: column 0.
/// assert_eq!(cols.to_vec::<f32>().unwrap()[..16].iter().step_by(4).copied().collect::<Vec<_>>(), vec![0.0, 1.0, 3.0, 4.0]);
/// ```
pub fn unfold(
    input: &Tensor,
    kernel_size: impl Into<Spatial<2>>,
    dilation: impl Into<Spatial<2>>,
    padding: impl Into<Spatial<2>>,
    stride: impl Into<Spatial<2>>,
) -> Result<Tensor> {
    const OP: &str = "unfold";
    let (x, was_batched) = batched(OP, input, 2)?;
    let a = BlockArgs::new(
        OP,
        input.shape(),
        kernel_size.into(),
        dilation.into(),
        padding.into(),
        stride.into(),
    )?;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let out = a.blocks(OP, input.shape(), [x.shape()[2], x.shape()[3]])?;
    let pads = [
        (0, 0),
        (0, 0),
        (a.padding[0], a.padding[0]),
        (a.padding[1], a.padding[1]),
    ];
    let xp = x.try_pad(&pads, 0)?;
    // [C, K, oh, ow, N] (batch last, as the convolutions use it), seen batch first.
    let cols =
        windows(&xp, &a.kernel, &a.stride, &a.dilation, &out)?.try_permute([4, 0, 1, 2, 3])?;
    let k = a.kernel[0] * a.kernel[1];
    let y = cols.try_reshape([n, c * k, out[0] * out[1]])?;
    unbatch(y, was_batched)
}

/// PyTorch's `F.fold(input, output_size, kernel_size, dilation, padding, stride)` (col2im),
/// the adjoint of [`unfold`]: columns `[N, C·kh·kw, L]` (or unbatched `[C·kh·kw, L]`) are
/// summed back into an image `[N, C, H, W]` (or `[C, H, W]`), `(H, W) = output_size`,
/// overlapping blocks adding up. `L` must be the number of blocks [`unfold`] makes of such
/// an image. Differentiable (its gradient is [`unfold`]).
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{fold, unfold};
/// let x = Tensor::ones([1, 1, 3, 3]);
/// let counts = fold(&unfold(&x, 2, 1, 0, 1).unwrap(), [3, 3], 2, 1, 0, 1).unwrap();
/// // How many 2×2 blocks cover each pixel.
/// assert_eq!(counts.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0]);
/// ```
pub fn fold(
    input: &Tensor,
    output_size: impl Into<Spatial<2>>,
    kernel_size: impl Into<Spatial<2>>,
    dilation: impl Into<Spatial<2>>,
    padding: impl Into<Spatial<2>>,
    stride: impl Into<Spatial<2>>,
) -> Result<Tensor> {
    const OP: &str = "fold";
    let (x, was_batched) = match input.ndim() {
        3 => (input.clone(), true),
        2 => (input.try_unsqueeze(0)?, false),
        nd => {
            return Err(invalid(
                OP,
                input.shape(),
                format!(
                    "expects unbatched [C·kh·kw, L] or batched [N, C·kh·kw, L] columns (2 or 3 \
                     dimensions), not {nd} dimensions"
                ),
            ));
        }
    };
    let a = BlockArgs::new(
        OP,
        input.shape(),
        kernel_size.into(),
        dilation.into(),
        padding.into(),
        stride.into(),
    )?;
    let size = output_size.into().0;
    let (n, ck, l) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let k = a.kernel[0] * a.kernel[1];
    if !ck.is_multiple_of(k) {
        return Err(invalid(
            OP,
            input.shape(),
            format!(
                "expected the size of dimension 1 ({ck}) to be divisible by the product of \
                 kernel_size {:?} ({k})",
                a.kernel
            ),
        ));
    }
    let out = a.blocks(OP, input.shape(), size)?;
    if out[0] * out[1] != l {
        return Err(invalid(
            OP,
            input.shape(),
            format!(
                "given output_size {size:?}, kernel_size {:?}, dilation {:?}, padding {:?} and \
                 stride {:?}, the input's last dimension should be {} ({} × {} blocks), not {l}",
                a.kernel,
                a.dilation,
                a.padding,
                a.stride,
                out[0] * out[1],
                out[0],
                out[1]
            ),
        ));
    }
    let c = ck / k;
    let mut z = x.try_reshape([n, c, a.kernel[0], a.kernel[1], out[0], out[1]])?;
    // Spread the blocks out by the stride: `s - 1` zeros after each.
    for i in 0..2 {
        z = spread_by_stride(&z, 4 + i, a.stride[i])?;
    }
    let padded = [size[0] + 2 * a.padding[0], size[1] + 2 * a.padding[1]];
    let spread = [z.shape()[4], z.shape()[5]];
    let mut sum: Option<Tensor> = None;
    for i in 0..a.kernel[0] {
        for j in 0..a.kernel[1] {
            let before = [i * a.dilation[0], j * a.dilation[1]];
            let pads = [
                (0, 0),
                (0, 0),
                (before[0], padded[0] - before[0] - spread[0]),
                (before[1], padded[1] - before[1] - spread[1]),
            ];
            let slab = z
                .try_select(2, i as i64)?
                .try_select(2, j as i64)?
                .try_pad(&pads, 0)?;
            sum = Some(match sum {
                Some(s) => s.try_add(&slab)?,
                None => slab,
            });
        }
    }
    let sum = sum.ok_or_else(|| KilnError::internal("fold: an empty kernel"))?;
    let y = sum.try_slice(&[
        (0, n as isize, 1),
        (0, c as isize, 1),
        (a.padding[0] as isize, (a.padding[0] + size[0]) as isize, 1),
        (a.padding[1] as isize, (a.padding[1] + size[1]) as isize, 1),
    ])?;
    unbatch(y, was_batched)
}

/// PyTorch's `nn.Unfold`: [`unfold`] with its arguments fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unfold {
    /// The block size.
    pub kernel_size: Spatial<2>,
    /// The spacing of a block's elements.
    pub dilation: Spatial<2>,
    /// Zeros added on both sides of each spatial dimension.
    pub padding: Spatial<2>,
    /// The step between blocks.
    pub stride: Spatial<2>,
}

impl Unfold {
    /// `nn.Unfold(kernel_size)` with PyTorch's defaults (dilation 1, padding 0, stride 1);
    /// set the public fields for others.
    pub fn new(kernel_size: impl Into<Spatial<2>>) -> Unfold {
        Unfold {
            kernel_size: kernel_size.into(),
            dilation: Spatial([1, 1]),
            padding: Spatial([0, 0]),
            stride: Spatial([1, 1]),
        }
    }
}

impl Module for Unfold {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        unfold(
            x,
            self.kernel_size,
            self.dilation,
            self.padding,
            self.stride,
        )
    }

    stateless!();
}

/// PyTorch's `nn.Fold`: [`fold`] with its arguments fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fold {
    /// The image size `(H, W)`.
    pub output_size: Spatial<2>,
    /// The sliding blocks the columns came from: kernel size, dilation, padding (cut off
    /// the result) and stride, as [`Unfold`] takes them.
    pub blocks: Unfold,
}

impl Fold {
    /// `nn.Fold(output_size, kernel_size)` with PyTorch's defaults (dilation 1, padding 0,
    /// stride 1); set `blocks`' fields for others.
    pub fn new(output_size: impl Into<Spatial<2>>, kernel_size: impl Into<Spatial<2>>) -> Fold {
        Fold {
            output_size: output_size.into(),
            blocks: Unfold::new(kernel_size),
        }
    }
}

impl Module for Fold {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let b = &self.blocks;
        fold(
            x,
            self.output_size,
            b.kernel_size,
            b.dilation,
            b.padding,
            b.stride,
        )
    }

    stateless!();
}

/// PyTorch's `F.affine_grid(theta, size, align_corners)`: the sampling grid of the affine
/// maps `theta` for [`grid_sample`]. With `theta` `[N, 2, 3]` and `size` `[N, C, H, W]` the
/// grid is `[N, H, W, 2]`, point `(h, w)` being `θ·(x_w, y_h, 1)` with `x`, `y` the
/// normalized pixel positions in `[-1, 1]` (pixel corners with `align_corners`, pixel
/// centres without); with `theta` `[N, 3, 4]` and `size` `[N, C, D, H, W]` it is
/// `[N, D, H, W, 3]`. Float `theta`; differentiable in it.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::affine_grid;
/// let id = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0], [1, 2, 3]);
/// let g = affine_grid(&id, &[1, 1, 2, 2], true).unwrap();
/// assert_eq!(g.to_vec::<f32>().unwrap(), vec![-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0]);
/// ```
pub fn affine_grid(theta: &Tensor, size: &[usize], align_corners: bool) -> Result<Tensor> {
    const OP: &str = "affine_grid";
    require_float(OP, theta)?;
    let d = match size.len() {
        4 => 2,
        5 => 3,
        _ => {
            return Err(invalid(
                OP,
                theta.shape(),
                format!("size {size:?} must be [N, C, H, W] or [N, C, D, H, W] (4 or 5 values)"),
            ));
        }
    };
    let n = size[0];
    if theta.shape() != [n, d, d + 1] {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: size.to_vec(),
            rhs: theta.shape().to_vec(),
            detail: format!(
                ": for a {}-D size theta must be [N, {d}, {}] with N = size[0]",
                size.len(),
                d + 1
            ),
        });
    }
    if size.contains(&0) {
        return Err(invalid(
            OP,
            theta.shape(),
            format!("size {size:?} must be positive"),
        ));
    }
    // The normalized positions along each dimension (PyTorch's `linspace_from_neg_one`),
    // recorded lazily so that a huge size is refused when recorded rather than allocated
    // on the host.
    let spatial = &size[2..];
    let mut full = vec![1usize];
    full.extend_from_slice(spatial);
    let axis = |k: usize| -> Result<Tensor> {
        let len = spatial[k];
        let mut at = vec![1usize; d + 1];
        at[k + 1] = len;
        let positions = if len <= 1 {
            Tensor::try_zeros_dtype([len], DType::F64)?
        } else {
            let scale = if align_corners {
                1.0
            } else {
                (len as f64 - 1.0) / len as f64
            };
            Tensor::try_arange(0, len as i64, 1, DType::F64)?
                .try_mul(2.0)?
                .try_div(len as f64 - 1.0)?
                .try_add(-1.0)?
                .try_mul(scale)?
        };
        positions
            .try_reshape(at.as_slice())?
            .try_broadcast_to(full.as_slice())
    };
    // Spatial sizes innermost last; the grid lists x (the last dimension) first.
    let mut columns = (0..d).rev().map(axis).collect::<Result<Vec<Tensor>>>()?;
    columns.push(Tensor::try_full_on(
        full.as_slice(),
        1.0,
        DType::F64,
        Device::Cpu,
    )?);
    let points = full.iter().product::<usize>();
    let refs: Vec<&Tensor> = columns.iter().collect();
    let base = Tensor::try_stack(&refs, -1)?;
    let base = base
        .try_reshape([1, points, d + 1])?
        .try_cast(theta.dtype())?
        .try_to(theta.device())?;
    let grid = base.try_matmul(&theta.try_transpose(1, 2)?)?;
    let mut shape = vec![n];
    shape.extend_from_slice(spatial);
    shape.push(d);
    grid.try_reshape(shape)
}

/// PyTorch's `mode` of [`grid_sample`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GridSampleMode {
    /// `"bilinear"` (trilinear for 5-D input), the default.
    #[default]
    Bilinear,
    /// `"nearest"`: the nearest pixel, ties to even (`nearbyint`), as PyTorch.
    Nearest,
    /// `"bicubic"` (4-D input only): PyTorch's cubic convolution with `A = -0.75` over 4×4
    /// pixels.
    Bicubic,
}

/// PyTorch's `padding_mode` of [`grid_sample`]: what points outside the input read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GridSamplePadding {
    /// `"zeros"`: zero outside, the default.
    #[default]
    Zeros,
    /// `"border"`: the coordinates clipped to the input.
    Border,
    /// `"reflection"`: the coordinates reflected at the input's border (the pixel corners
    /// with `align_corners`, the pixel centres' half-pixel margin without), then clipped.
    Reflection,
}

/// `v` reflected into `[low/2, high/2]` (PyTorch's `reflect_coordinates`, with twice the
/// bounds as its arguments), differentiable in `v` with slope ±1.
fn reflect(v: &Tensor, twice_low: i64, twice_high: i64) -> Result<Tensor> {
    if twice_low == twice_high {
        return v.try_mul(0.0);
    }
    let min = twice_low as f64 / 2.0;
    let span = (twice_high - twice_low) as f64 / 2.0;
    let a = v.try_sub(min)?.try_abs()?;
    // `floor` has no gradient, so the flips are constants of the derivative.
    let flips = a.try_div(span)?.try_floor()?;
    let extra = a.try_sub(&flips.try_mul(span)?)?;
    let even = flips
        .try_sub(&flips.try_mul(0.5)?.try_floor()?.try_mul(2.0)?)?
        .try_eq(0.0)?;
    Tensor::try_where(&even, &extra.try_add(min)?, &extra.try_rsub(span + min)?)
}

/// PyTorch's padding of a source coordinate `v` along a dimension of `len` pixels: border
/// and reflection clip it (reflection first reflects it); zeros leave it.
fn pad_coordinate(
    v: &Tensor,
    len: usize,
    padding: GridSamplePadding,
    align_corners: bool,
) -> Result<Tensor> {
    let last = len as f64 - 1.0;
    match padding {
        GridSamplePadding::Zeros => Ok(v.clone()),
        GridSamplePadding::Border => v.try_clamp(0.0, last),
        GridSamplePadding::Reflection => {
            let r = if align_corners {
                reflect(v, 0, 2 * (len as i64 - 1))?
            } else {
                reflect(v, -1, 2 * len as i64 - 1)?
            };
            r.try_clamp(0.0, last)
        }
    }
}

/// PyTorch's cubic convolution weights (`A = -0.75`) of the taps at `-1, 0, 1, 2` from
/// the pixel below a point `t` past it.
fn cubic_weights(t: &Tensor) -> Result<[Tensor; 4]> {
    const A: f64 = -0.75;
    // |x| ≤ 1: ((A + 2)x - (A + 3))x² + 1; 1 < |x| < 2: ((Ax - 5A)x + 8A)x - 4A.
    let near = |x: &Tensor| -> Result<Tensor> {
        x.try_mul(A + 2.0)?
            .try_sub(A + 3.0)?
            .try_mul(x)?
            .try_mul(x)?
            .try_add(1.0)
    };
    let far = |x: &Tensor| -> Result<Tensor> {
        x.try_mul(A)?
            .try_sub(5.0 * A)?
            .try_mul(x)?
            .try_add(8.0 * A)?
            .try_mul(x)?
            .try_sub(4.0 * A)
    };
    let u = t.try_rsub(1.0)?;
    Ok([
        far(&t.try_add(1.0)?)?,
        near(t)?,
        near(&u)?,
        far(&u.try_add(1.0)?)?,
    ])
}

/// One dimension's taps: each an integer-valued (float) source index and, except for
/// nearest, its weight.
type DimTaps = Vec<(Tensor, Option<Tensor>)>;

/// PyTorch's `F.grid_sample(input, grid, mode, padding_mode, align_corners)`: `input`
/// `[N, C, H, W]` read at the points of `grid` `[N, Ho, Wo, 2]` (each `(x, y)`, normalized
/// so that -1 and 1 are the input's outer pixel corners, or with `align_corners` its
/// outer pixel centres), giving `[N, C, Ho, Wo]`; or `input` `[N, C, D, H, W]` with
/// `grid` `[N, Do, Ho, Wo, 3]` (`(x, y, z)`; bilinear, which is then trilinear, and
/// nearest only). Float tensors of one dtype (half ones are computed in f32). Gradients
/// reach the input and the grid (the grid's is zero for nearest, as in PyTorch).
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{grid_sample, GridSampleMode, GridSamplePadding};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 2, 2]);
/// // The centre of the image, and the top-left pixel's centre.
/// let grid = Tensor::from_vec(vec![0.0f32, 0.0, -0.5, -0.5], [1, 1, 2, 2]);
/// let y = grid_sample(&x, &grid, GridSampleMode::Bilinear, GridSamplePadding::Zeros, false).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.5, 1.0]);
/// ```
pub fn grid_sample(
    input: &Tensor,
    grid: &Tensor,
    mode: GridSampleMode,
    padding_mode: GridSamplePadding,
    align_corners: bool,
) -> Result<Tensor> {
    const OP: &str = "grid_sample";
    require_float(OP, input)?;
    input.require_same_dtype_and_device(OP, grid)?;
    let nd = input.ndim();
    if !(nd == 4 || nd == 5) {
        return Err(invalid(
            OP,
            input.shape(),
            format!("expects a 4-D or 5-D input, not {nd}-D"),
        ));
    }
    let d = nd - 2;
    let (is, gs) = (input.shape(), grid.shape());
    if grid.ndim() != nd || gs[0] != is[0] || gs[nd - 1] != d {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: is.to_vec(),
            rhs: gs.to_vec(),
            detail: format!(
                ": a {nd}-D input needs a {nd}-D grid [N, *out, {d}] with the input's batch size"
            ),
        });
    }
    if mode == GridSampleMode::Bicubic && d != 2 {
        return Err(invalid(
            OP,
            is,
            "bicubic interpolation only supports 4-D input".into(),
        ));
    }
    if is[2..].contains(&0) {
        return Err(invalid(
            OP,
            is,
            "expected the input to have non-empty spatial dimensions".into(),
        ));
    }
    let dtype = input.dtype();
    let compute = if dtype.is_half() { DType::F32 } else { dtype };
    let (n, c) = (is[0], is[1]);
    let sizes = &is[2..];
    let plane: usize = sizes.iter().product();
    let points: usize = gs[1..nd - 1].iter().product();
    let flat = input.try_cast(compute)?.try_reshape([n, c, plane])?;
    let g = grid.try_cast(compute)?.try_reshape([n, points, d])?;

    // Each spatial dimension's taps (the grid lists the last dimension first).
    let mut dims: Vec<DimTaps> = Vec::with_capacity(d);
    for (j, &len) in sizes.iter().enumerate() {
        let v = g.try_select(2, (d - 1 - j) as i64)?;
        // PyTorch's `grid_sampler_unnormalize`.
        let v = if align_corners {
            v.try_add(1.0)?.try_mul((len as f64 - 1.0) / 2.0)?
        } else {
            v.try_add(1.0)?
                .try_mul(len as f64)?
                .try_sub(1.0)?
                .try_mul(0.5)?
        };
        let taps = match mode {
            GridSampleMode::Nearest => {
                let v = pad_coordinate(&v, len, padding_mode, align_corners)?;
                vec![(v.try_round()?, None)]
            }
            GridSampleMode::Bilinear => {
                let v = pad_coordinate(&v, len, padding_mode, align_corners)?;
                let i0 = v.try_floor()?;
                let t = v.try_sub(&i0)?;
                vec![
                    (i0.clone(), Some(t.try_rsub(1.0)?)),
                    (i0.try_add(1.0)?, Some(t)),
                ]
            }
            GridSampleMode::Bicubic => {
                // The taps are padded one by one (PyTorch's `get_value_bounded`).
                let i0 = v.try_floor()?;
                let t = v.try_sub(&i0)?;
                let w = cubic_weights(&t)?;
                let mut taps = Vec::with_capacity(4);
                for (k, wk) in w.into_iter().enumerate() {
                    let at = i0.try_add(k as f64 - 1.0)?;
                    taps.push((
                        pad_coordinate(&at, len, padding_mode, align_corners)?,
                        Some(wk),
                    ));
                }
                taps
            }
        };
        dims.push(taps);
    }

    // Sum over every combination of the dimensions' taps.
    let strides: Vec<usize> = (0..d).map(|j| sizes[j + 1..].iter().product()).collect();
    let count: usize = dims.iter().map(Vec::len).product();
    let mut out: Option<Tensor> = None;
    for combo in 0..count {
        let mut rest = combo;
        let mut index: Option<Tensor> = None;
        let mut valid: Option<Tensor> = None;
        let mut weight: Option<Tensor> = None;
        for j in (0..d).rev() {
            let (at, w) = &dims[j][rest % dims[j].len()];
            rest /= dims[j].len();
            let last = sizes[j] as f64 - 1.0;
            let inside = at.try_ge(0.0)?.try_logical_and(&at.try_le(last)?)?;
            let i = at
                .try_clamp(0.0, last)?
                .try_cast(DType::I64)?
                .try_mul(strides[j] as i64)?;
            index = Some(match index {
                Some(s) => s.try_add(&i)?,
                None => i,
            });
            valid = Some(match valid {
                Some(s) => s.try_logical_and(&inside)?,
                None => inside,
            });
            if let Some(w) = w {
                weight = Some(match weight {
                    Some(s) => s.try_mul(w)?,
                    None => w.clone(),
                });
            }
        }
        let (Some(index), Some(valid)) = (index, valid) else {
            return Err(KilnError::internal("grid_sample: no spatial dimension"));
        };
        let index = index.try_unsqueeze(1)?.try_broadcast_to([n, c, points])?;
        let read = flat.try_gather(2, &index)?;
        let scale = match weight {
            Some(w) => Tensor::try_where(&valid, &w, 0.0)?,
            None => valid.try_cast(compute)?,
        };
        let term = read.try_mul(&scale.try_unsqueeze(1)?)?;
        out = Some(match out {
            Some(s) => s.try_add(&term)?,
            None => term,
        });
    }
    let out = out.ok_or_else(|| KilnError::internal("grid_sample: no taps"))?;
    let mut shape = vec![n, c];
    shape.extend_from_slice(&gs[1..nd - 1]);
    out.try_reshape(shape)?.try_cast(dtype)
}
