//! Shapes and views: broadcasting rules, axis handling, and [`View`], the stride/offset/mask
//! metadata that every movement op collapses into.

mod view;

pub use view::{Movement, SliceRange, View};

use crate::error::{KilnError, Result};

/// Number of elements of a shape (1 for a scalar shape `[]`).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides, in elements, for a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc *= n.max(1) as isize;
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
