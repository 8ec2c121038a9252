//! `vector_norm`, `matrix_norm` and `norm`: lazy compositions of `abs`, powers, sums and
//! `max`/`min` (the spectral and nuclear norms go through [`super::svdvals`]).

use crate::autograd::{composite, is_grad_enabled};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::shape::{Axes, normalize_axes, normalize_axis};
use crate::tensor::Tensor;

/// The order of a matrix norm (and of [`norm`]): `'fro'`, `'nuc'` or a number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormOrd {
    /// The Frobenius norm, `sqrt(Σ |a_ij|²)` (PyTorch's `'fro'`).
    Fro,
    /// The nuclear norm, the sum of the singular values (PyTorch's `'nuc'`).
    Nuc,
    /// A numeric order: for matrices `1`, `-1`, `2`, `-2`, `f64::INFINITY`,
    /// `f64::NEG_INFINITY`; for vectors any number.
    P(f64),
}

impl From<f64> for NormOrd {
    fn from(p: f64) -> Self {
        NormOrd::P(p)
    }
}

fn check_float(op: &'static str, x: &Tensor) -> Result<()> {
    if x.dtype().is_float() {
        return Ok(());
    }
    Err(KilnError::UnsupportedDType {
        op,
        dtype: x.dtype(),
        detail: ": expected a floating point tensor as input".into(),
    })
}

/// PyTorch's `torch.linalg.vector_norm(x, ord, dim, keepdim)`: `(Σ |x|^ord)^(1/ord)` over
/// `dims` (`..` for every dimension, as `dim=None`). `ord` is any number: `f64::INFINITY`
/// is `max |x|`, `f64::NEG_INFINITY` `min |x|`, `0` the count of nonzeros. f16/bf16 are
/// computed in f32 and rounded back. The gradient at a zero norm is 0 (PyTorch's
/// subgradient), and a zero element contributes gradient 0 for `0 < ord < 1`.
///
/// Errors: a non-float input, a NaN `ord`, an axis out of range, and `ord < 0` or
/// `ord = inf` over an empty dimension (no identity), as PyTorch.
///
/// ```
/// use kiln::Tensor;
/// let x = Tensor::from_vec(vec![3.0f32, -4.0], [2]);
/// assert_eq!(kiln::linalg::vector_norm(&x, 2.0, .., false)?.item::<f32>()?, 5.0);
/// assert_eq!(kiln::linalg::vector_norm(&x, f64::INFINITY, 0, false)?.item::<f32>()?, 4.0);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn vector_norm(x: &Tensor, ord: f64, dims: impl Axes, keepdim: bool) -> Result<Tensor> {
    let dims: Option<Vec<isize>> = dims.axes().map(|v| {
        v.into_iter()
            .map(|a| a.clamp(isize::MIN as i128, isize::MAX as i128) as isize)
            .collect()
    });
    vector_norm_named("linalg.vector_norm", x, ord, dims.as_deref(), keepdim)
}

/// [`vector_norm`] with errors naming `op` (for composites such as `F.normalize`); `None`
/// or an empty list of `dims` is every dimension.
pub(crate) fn vector_norm_named(
    op: &'static str,
    x: &Tensor,
    ord: f64,
    dims: Option<&[isize]>,
    keepdim: bool,
) -> Result<Tensor> {
    check_float(op, x)?;
    if ord.is_nan() {
        return Err(KilnError::InvalidArgument {
            op,
            shape: x.shape().to_vec(),
            reason: "the order of the norm must not be NaN".into(),
        });
    }
    let dims = dims.filter(|d| !d.is_empty());
    if x.ndim() == 0 {
        // A 0-d tensor reduces over "dimension 0 or -1" as one of size 1.
        if let Some(d) = dims {
            normalize_axes(op, d, &[1])?;
        }
        return vector_norm_named(op, &x.try_reshape([1])?, ord, None, false)?.try_reshape(());
    }
    let axes: Vec<usize> = match dims {
        Some(d) => normalize_axes(op, d, x.shape())?,
        None => (0..x.ndim()).collect(),
    };
    if (ord < 0.0 || ord == f64::INFINITY)
        && let Some(&d) = axes.iter().find(|&&a| x.shape()[a] == 0)
    {
        return Err(KilnError::InvalidArgument {
            op,
            shape: x.shape().to_vec(),
            reason: format!(
                "cannot compute the {ord} norm over dimension {d} of size 0: the operation has no identity"
            ),
        });
    }
    let axes_i: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
    let wide = if x.dtype().is_half() {
        x.try_cast(DType::F32)?
    } else {
        x.clone()
    };
    let r = norm_keepdim(&wide, ord, &axes_i)?;
    let r = if keepdim {
        r
    } else {
        let out: Vec<usize> = (0..x.ndim())
            .filter(|d| !axes.contains(d))
            .map(|d| x.shape()[d])
            .collect();
        r.try_reshape(out.iter().map(|&d| d as isize).collect::<Vec<_>>())?
    };
    if x.dtype().is_half() {
        r.try_cast(x.dtype())
    } else {
        Ok(r)
    }
}

/// The `ord`-norm of the float tensor `x` over `axes`, dimensions kept.
fn norm_keepdim(x: &Tensor, ord: f64, axes: &[isize]) -> Result<Tensor> {
    let a = x.try_abs()?;
    if ord == f64::INFINITY {
        return a.try_max_keepdim(axes);
    }
    if ord == f64::NEG_INFINITY {
        return a.try_min_keepdim(axes);
    }
    if ord == 0.0 {
        let count = a.try_ne(0)?.try_cast(x.dtype())?.try_sum_keepdim(axes)?;
        if !(is_grad_enabled() && x.requires_grad()) {
            return Ok(count);
        }
        // PyTorch's gradient of the 0-"norm" is zero (a step function), not absent.
        return composite(
            &[x],
            move || Ok(count),
            |ins, _, _| {
                let x = &ins[0];
                Ok(vec![Some(Tensor::try_full_on(
                    x.shape(),
                    0,
                    x.dtype(),
                    x.device(),
                )?)])
            },
        );
    }
    if ord == 1.0 {
        return a.try_sum_keepdim(axes);
    }
    if ord < 0.0 {
        // A zero element makes the sum infinite and the norm 0, as in PyTorch.
        return a.try_pow(ord)?.try_sum_keepdim(axes)?.try_pow(1.0 / ord);
    }
    let total = if ord == 2.0 {
        x.try_mul(x)?.try_sum_keepdim(axes)?
    } else {
        // A zero element contributes 0 through a `where`: the slope of its power at 0 is
        // infinite for ord < 1, and inf·0 would be NaN.
        let zero = a.try_eq(0)?;
        let powered = Tensor::try_where(&zero, 1.0, &a)?.try_pow(ord)?;
        Tensor::try_where(&zero, 0.0, &powered)?.try_sum_keepdim(axes)?
    };
    // The root of 0 has gradient 0 (PyTorch's subgradient).
    total.try_norm_root(ord)
}

/// PyTorch's `torch.linalg.matrix_norm(A, ord, dim, keepdim)` over the two dimensions
/// `dims` (PyTorch's default is `[-2, -1]`): `Fro`; `P(1.0)` / `P(-1.0)` the largest /
/// smallest absolute column sum; `P(f64::INFINITY)` / `P(f64::NEG_INFINITY)` the largest /
/// smallest absolute row sum; `P(2.0)` / `P(-2.0)` the largest / smallest singular value
/// and `Nuc` their sum (these three realize the input: see [`super::svdvals`]). f16/bf16
/// are computed in f32 (the singular-value orders refuse them, as PyTorch's SVD does).
///
/// ```
/// use kiln::{Tensor, linalg::{NormOrd, matrix_norm}};
/// let a = Tensor::from_vec(vec![1.0f64, -2.0, 3.0, 4.0], [2, 2]);
/// assert_eq!(matrix_norm(&a, NormOrd::P(1.0), [-2, -1], false)?.item::<f64>()?, 6.0);
/// assert_eq!(matrix_norm(&a, NormOrd::P(f64::INFINITY), [-2, -1], false)?.item::<f64>()?, 7.0);
/// assert_eq!(matrix_norm(&a, NormOrd::Fro, [-2, -1], false)?.item::<f64>()?, 30f64.sqrt());
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn matrix_norm(x: &Tensor, ord: NormOrd, dims: [isize; 2], keepdim: bool) -> Result<Tensor> {
    matrix_norm_named("linalg.matrix_norm", x, ord, dims, keepdim)
}

fn matrix_norm_named(
    op: &'static str,
    x: &Tensor,
    ord: NormOrd,
    dims: [isize; 2],
    keepdim: bool,
) -> Result<Tensor> {
    check_float(op, x)?;
    if x.ndim() < 2 {
        return Err(KilnError::InvalidArgument {
            op,
            shape: x.shape().to_vec(),
            reason: "the input must have at least 2 dimensions".into(),
        });
    }
    // In the given order (`normalize_axes` would sort them): d0 is the rows' dimension.
    let (d0, d1) = (
        normalize_axis(op, dims[0], x.shape())?,
        normalize_axis(op, dims[1], x.shape())?,
    );
    if d0 == d1 {
        return Err(KilnError::InvalidArgument {
            op,
            shape: x.shape().to_vec(),
            reason: format!("dims must be different, got {dims:?}"),
        });
    }
    let drop = |r: Tensor| -> Result<Tensor> {
        if keepdim {
            return Ok(r);
        }
        let out: Vec<isize> = (0..x.ndim())
            .filter(|&d| d != d0 && d != d1)
            .map(|d| x.shape()[d] as isize)
            .collect();
        r.try_reshape(out)
    };
    let (i0, i1) = (d0 as isize, d1 as isize);
    // The orders that pick a largest or smallest column sum, row sum or singular value
    // have nothing to pick from when that dimension is empty (PyTorch's `amax` refuses it
    // too); say so in this op's name rather than the inner reduction's.
    let picked = match ord {
        NormOrd::P(p) if p.abs() == 1.0 => Some(x.shape()[d1]),
        NormOrd::P(p) if p.is_infinite() => Some(x.shape()[d0]),
        NormOrd::P(p) if p.abs() == 2.0 => Some(x.shape()[d0].min(x.shape()[d1])),
        _ => None,
    };
    if picked == Some(0) {
        return Err(KilnError::InvalidArgument {
            op,
            shape: x.shape().to_vec(),
            reason: format!(
                "order {ord:?} of an empty matrix is undefined (it takes a largest or smallest \
                 value over an empty dimension)"
            ),
        });
    }
    match ord {
        NormOrd::Fro => vector_norm_named(op, x, 2.0, Some(&[i0, i1]), keepdim),
        NormOrd::P(p) if p.abs() == 1.0 || p.is_infinite() => {
            let wide = if x.dtype().is_half() {
                x.try_cast(DType::F32)?
            } else {
                x.clone()
            };
            // Column sums (over the rows, d0) for ±1; row sums (over d1) for ±inf.
            let (sum_dim, pick_dim) = if p.abs() == 1.0 { (i0, i1) } else { (i1, i0) };
            let sums = wide.try_abs()?.try_sum_keepdim(sum_dim)?;
            let r = if p > 0.0 {
                sums.try_max_keepdim(pick_dim)?
            } else {
                sums.try_min_keepdim(pick_dim)?
            };
            let r = drop(r)?;
            if x.dtype().is_half() {
                r.try_cast(x.dtype())
            } else {
                Ok(r)
            }
        }
        NormOrd::Nuc | NormOrd::P(2.0) | NormOrd::P(-2.0) => {
            // The two dimensions last, singular values, then one reduction.
            let mut perm: Vec<isize> = (0..x.ndim())
                .filter(|&d| d != d0 && d != d1)
                .map(|d| d as isize)
                .collect();
            perm.extend([i0, i1]);
            let s = super::decomp::svdvals_named(op, &x.try_permute(perm)?)?;
            let r = match ord {
                NormOrd::Nuc => s.try_sum_keepdim(-1)?,
                NormOrd::P(p) if p > 0.0 => s.try_max_keepdim(-1)?,
                _ => s.try_min_keepdim(-1)?,
            };
            // [..., 1] back to the input's rank with size 1 at d0 and d1.
            let mut kept: Vec<isize> = x.shape().iter().map(|&d| d as isize).collect();
            kept[d0] = 1;
            kept[d1] = 1;
            drop(r.try_reshape(kept)?)
        }
        NormOrd::P(p) => Err(KilnError::InvalidArgument {
            op,
            shape: x.shape().to_vec(),
            reason: format!(
                "order {p} is not supported for matrices (1, -1, 2, -2, inf, -inf, Fro, Nuc are)"
            ),
        }),
    }
}

/// PyTorch's `torch.linalg.norm(A, ord, dim, keepdim)`: with `dims` of one dimension, a
/// [`vector_norm`] (`ord` a number, default 2); of two, a [`matrix_norm`] (default `Fro`).
/// Without `dims`: `ord = None` is the 2-norm of the flattened input; otherwise the input
/// must be 1-D (vector norm) or 2-D (matrix norm).
///
/// ```
/// use kiln::{Tensor, linalg::{NormOrd, norm}};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 2.0, 4.0], [2, 2]);
/// assert_eq!(norm(&a, None, None, false)?.item::<f32>()?, 5.0);
/// assert_eq!(norm(&a, Some(NormOrd::P(1.0)), None, false)?.item::<f32>()?, 6.0);
/// assert_eq!(norm(&a, Some(NormOrd::P(1.0)), Some(&[1]), false)?.to_vec::<f32>()?, vec![3.0, 6.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn norm(
    x: &Tensor,
    ord: Option<NormOrd>,
    dims: Option<&[isize]>,
    keepdim: bool,
) -> Result<Tensor> {
    const OP: &str = "linalg.norm";
    let vector = |ord: Option<NormOrd>, dims: Option<&[isize]>| -> Result<Tensor> {
        match ord {
            None => vector_norm_named(OP, x, 2.0, dims, keepdim),
            Some(NormOrd::P(p)) => vector_norm_named(OP, x, p, dims, keepdim),
            Some(o) => Err(KilnError::InvalidArgument {
                op: OP,
                shape: x.shape().to_vec(),
                reason: format!("order {o:?} is a matrix norm; a vector norm needs a number"),
            }),
        }
    };
    match dims {
        Some(&[d]) => vector(ord, Some(&[d])),
        Some(&[d0, d1]) => matrix_norm_named(OP, x, ord.unwrap_or(NormOrd::Fro), [d0, d1], keepdim),
        Some(d) => Err(KilnError::InvalidArgument {
            op: OP,
            shape: x.shape().to_vec(),
            reason: format!("dim must name 1 or 2 dimensions, got {d:?}"),
        }),
        None => match (ord, x.ndim()) {
            (None, _) => vector(None, None),
            (Some(_), 1) => vector(ord, None),
            (Some(o), 2) => matrix_norm_named(OP, x, o, [-2, -1], keepdim),
            (Some(_), nd) => Err(KilnError::InvalidArgument {
                op: OP,
                shape: x.shape().to_vec(),
                reason: format!(
                    "with an order and no dim the input must be 1-D or 2-D, not {nd}-D"
                ),
            }),
        },
    }
}
