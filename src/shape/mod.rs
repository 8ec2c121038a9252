//! Shapes and views: broadcasting rules, axis handling, and [`View`], the stride/offset/mask
//! metadata that every movement op collapses into.

mod args;
mod view;

pub(crate) use args::axis_list;
pub use args::{Axes, AxisInt, IntList, ShapeLike};
pub use view::{Movement, SliceRange, View};

use crate::dtype::DType;
use crate::error::{KilnError, Result};

/// Number of elements of a shape (1 for a scalar shape `[]`). Only for shapes that passed
/// [`check_shape`] (every tensor's shape did); use [`checked_numel`] for anything else.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Number of elements, or `None` when the product overflows `usize`.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The largest byte size of one tensor: every byte offset into it (and every element offset
/// of any view of it) fits an `isize`, so address arithmetic on a valid view never wraps.
pub const MAX_TENSOR_BYTES: usize = isize::MAX as usize / 2;

/// Checks that a tensor of `shape` and `dtype` can exist: its element count and byte size
/// are computable without overflow and at most [`MAX_TENSOR_BYTES`]. Every recorded node's
/// shape passes through here, so nothing downstream sees a size that could have wrapped.
///
/// ```
/// use kiln::DType;
/// assert!(kiln::shape::check_shape("zeros", &[1 << 20, 1 << 20], DType::F32).is_ok());
/// assert!(kiln::shape::check_shape("zeros", &[1 << 40, 1 << 40, 1 << 40], DType::F32).is_err());
/// ```
pub fn check_shape(op: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    let too_large = |detail: String| KilnError::TooLarge {
        op,
        shape: shape.to_vec(),
        dtype,
        detail,
    };
    let n = checked_numel(shape)
        .ok_or_else(|| too_large("the element count overflows a 64-bit integer".into()))?;
    match n.checked_mul(dtype.size_bytes()) {
        Some(bytes) if bytes <= MAX_TENSOR_BYTES => Ok(n),
        _ => Err(too_large(format!(
            "{n} elements of {} bytes exceed the {MAX_TENSOR_BYTES}-byte limit of one tensor",
            dtype.size_bytes()
        ))),
    }
}

/// Row-major strides, in elements, for a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(n.max(1).min(isize::MAX as usize) as isize);
    }
    strides
}

/// The shape two shapes broadcast to under NumPy rules.
///
/// ```
/// assert_eq!(kiln::shape::broadcast_shapes("add", &[3, 1, 4], &[2, 4]).unwrap(), vec![3, 2, 4]);
/// assert!(kiln::shape::broadcast_shapes("add", &[3], &[4]).is_err());
/// ```
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    if a == b {
        return Ok(a.to_vec());
    }
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(KilnError::ShapeMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                    detail: format!(": dimension {i} has sizes {da} and {db} (cannot broadcast)"),
                });
            }
        };
    }
    Ok(out)
}

/// Resolves a possibly negative axis against `ndim`.
pub fn normalize_axis(op: &'static str, axis: isize, shape: &[usize]) -> Result<usize> {
    let nd = shape.len() as isize;
    let a = if axis < 0 { axis + nd } else { axis };
    if a < 0 || a >= nd {
        return Err(KilnError::InvalidAxis {
            op,
            axis,
            shape: shape.to_vec(),
        });
    }
    Ok(a as usize)
}

/// Resolves a list of axes, rejecting duplicates; returns them sorted.
pub fn normalize_axes(op: &'static str, axes: &[isize], shape: &[usize]) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(op, a, shape)?;
        if out.contains(&n) {
            return Err(KilnError::InvalidArgument {
                op,
                shape: shape.to_vec(),
                reason: format!("axis {a} is given twice"),
            });
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}
