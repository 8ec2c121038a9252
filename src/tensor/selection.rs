//! Selections whose result shape depends on the data: `nonzero` (`argwhere`),
//! `masked_select`, `masked_scatter` and `unique`.
//!
//! kiln plans from shapes alone, so each of these realizes what decides the result's shape
//! (the mask, or for `unique` the input), reads it back, and builds on the host the
//! positions it selects. `nonzero` and `unique` return those as new tensors;
//! `masked_select` and `masked_scatter` record ordinary lazy ops over them (an
//! `index_select` of a constant index and a `where`), which fuse with what follows and
//! carry gradients like any gather. A call is therefore a synchronization point, as
//! PyTorch's `nonzero` is on CUDA, and a new count of selected elements is a new shape to
//! the plan cache.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::{DType, Element};
use crate::error::{KilnError, Result};
use crate::shape::{broadcast_shapes, contiguous_strides};

/// What [`Tensor::unique_all`] returns.
#[derive(Debug, Clone)]
pub struct Unique {
    /// The distinct values, ascending (NaNs last, each its own value, as PyTorch's CPU
    /// kernel keeps them), in the input's dtype.
    pub values: Tensor,
    /// For every input element (the input's shape), the position of its value in
    /// `values` (i64).
    pub inverse: Tensor,
    /// How often each of `values` occurs (i64).
    pub counts: Tensor,
}

/// Flat (row-major) positions of `mask`'s true elements after broadcasting it to `shape`.
fn true_positions(op: &'static str, mask: &Tensor, shape: &[usize]) -> Result<Vec<usize>> {
    if mask.dtype() != DType::Bool {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: mask.dtype(),
            detail: ": the mask must be bool".into(),
        });
    }
    let bits = mask.try_broadcast_to(shape)?.to_vec::<bool>()?;
    Ok(bits
        .iter()
        .enumerate()
        .filter_map(|(i, &b)| b.then_some(i))
        .collect())
}

/// A 1-D i64 tensor of `v` on `like`'s device.
fn index_tensor(v: Vec<i64>, shape: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::try_from_vec(v, shape)?.try_to(like.device())
}

impl Tensor {
    /// The indices of the nonzero elements (`true` for bools; NaN counts as nonzero, `-0.0`
    /// does not), one row per element in row-major order: an i64 tensor of shape
    /// `[count, ndim]`, as PyTorch's `nonzero()`. Realizes this tensor to count them.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.5, 0.0, -2.0], [2, 2]);
    /// let nz = x.nonzero();
    /// assert_eq!(nz.shape(), &[2, 2]);
    /// assert_eq!(nz.to_vec::<i64>().unwrap(), vec![0, 1, 1, 1]);
    /// ```
    #[track_caller]
    pub fn nonzero(&self) -> Tensor {
        unwrap_or_panic(self.try_nonzero())
    }

    /// Fallible [`Tensor::nonzero`].
    pub fn try_nonzero(&self) -> Result<Tensor> {
        let mask = self.try_ne(0)?;
        let at = true_positions("nonzero", &mask, self.shape())?;
        let strides = contiguous_strides(self.shape());
        let mut rows = Vec::with_capacity(at.len() * self.ndim());
        for &p in &at {
            for (&s, &d) in strides.iter().zip(self.shape()) {
                rows.push(((p as isize / s) as usize % d) as i64);
            }
        }
        index_tensor(rows, &[at.len(), self.ndim()], self)
    }

    /// [`Tensor::nonzero`] under NumPy's and PyTorch's other name.
    #[track_caller]
    pub fn argwhere(&self) -> Tensor {
        unwrap_or_panic(self.try_nonzero())
    }

    /// Fallible [`Tensor::argwhere`].
    pub fn try_argwhere(&self) -> Result<Tensor> {
        self.try_nonzero()
    }

    /// The elements where the bool `mask` is true, in row-major order, as a 1-D tensor
    /// (the tensor and the mask broadcast together), as PyTorch's `masked_select` and
    /// `x[mask]` for a mask of `x`'s shape. Realizes the mask; the selection itself is a
    /// lazy `index_select`, so it fuses with what follows and gradients reach the selected
    /// elements.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], [2, 2]);
    /// let picked = x.masked_select(&x.lt(0.0));
    /// assert_eq!(picked.to_vec::<f32>().unwrap(), vec![-2.0, -4.0]);
    /// ```
    #[track_caller]
    pub fn masked_select(&self, mask: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_masked_select(mask))
    }

    /// Fallible [`Tensor::masked_select`].
    pub fn try_masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shapes("masked_select", self.shape(), mask.shape())?;
        let at = true_positions("masked_select", mask, &shape)?;
        let n = at.len();
        let index = index_tensor(at.into_iter().map(|p| p as i64).collect(), &[n], self)?;
        self.try_broadcast_to(shape.as_slice())?
            .try_reshape([-1])?
            .try_index_select(0, &index)
    }

    /// This tensor with the positions where the bool `mask` is true replaced, in
    /// row-major order, by consecutive elements of `source` (read in its own row-major
    /// order; it needs at least as many elements as the mask has true values and this
    /// tensor's dtype), as PyTorch's out-of-place `masked_scatter`: the tensor and the mask
    /// broadcast together. Realizes the mask; gradients reach both this tensor (where the
    /// mask is false) and the elements of `source` that were used.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros([2, 3]);
    /// let m = Tensor::from_vec(vec![true, false, true, false, false, true], [2, 3]);
    /// let s = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    /// let y = x.masked_scatter(&m, &s);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 2.0, 0.0, 0.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn masked_scatter(&self, mask: &Tensor, source: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_masked_scatter(mask, source))
    }

    /// Fallible [`Tensor::masked_scatter`].
    pub fn try_masked_scatter(&self, mask: &Tensor, source: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shapes("masked_scatter", self.shape(), mask.shape())?;
        let picked = self.scattered_source(mask, source, &shape)?;
        Tensor::try_where(mask, &picked, self)
    }

    /// `source`'s elements laid out over `shape`: the k-th true position of `mask` holds
    /// `source`'s k-th element, every other position `source`'s first (never used).
    pub(crate) fn scattered_source(
        &self,
        mask: &Tensor,
        source: &Tensor,
        shape: &[usize],
    ) -> Result<Tensor> {
        const OP: &str = "masked_scatter";
        if source.dtype() != self.dtype() {
            return Err(KilnError::DTypeMismatch {
                op: OP,
                lhs: self.dtype(),
                rhs: source.dtype(),
            });
        }
        let at = true_positions(OP, mask, shape)?;
        if at.len() > source.numel() {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: source.shape().to_vec(),
                reason: format!(
                    "the mask selects {} elements but source has only {}",
                    at.len(),
                    source.numel()
                ),
            });
        }
        let numel: usize = shape.iter().product();
        let mut map = vec![0i64; numel];
        for (k, &p) in at.iter().enumerate() {
            map[p] = k as i64;
        }
        if at.is_empty() {
            // Nothing is read from `source` (which may be empty): the where keeps `self`.
            return self.try_broadcast_to(shape);
        }
        let index = index_tensor(map, &[numel], self)?;
        source
            .try_reshape([-1])?
            .try_index_select(0, &index)?
            .try_reshape(shape.iter().map(|&d| d as isize).collect::<Vec<_>>())
    }

    /// The distinct values of this tensor, flattened and sorted ascending, as PyTorch's
    /// `torch.unique(x)` (`sorted=True`, `dim=None`). Realizes the tensor. Not
    /// differentiable (PyTorch's `unique` has no derivative either): the result is a new
    /// tensor without history. See [`Tensor::unique_all`] for the inverse and the counts.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![3i64, 1, 3, 2, 1], [5]);
    /// assert_eq!(x.unique().to_vec::<i64>().unwrap(), vec![1, 2, 3]);
    /// ```
    #[track_caller]
    pub fn unique(&self) -> Tensor {
        unwrap_or_panic(self.try_unique())
    }

    /// Fallible [`Tensor::unique`].
    pub fn try_unique(&self) -> Result<Tensor> {
        Ok(self.try_unique_all()?.values)
    }

    /// [`Tensor::unique`] with PyTorch's `return_inverse=True, return_counts=True`: the
    /// distinct values, each element's position among them, and each value's count.
    /// NaNs stay distinct from each other (each is its own value, sorted last), and
    /// `-0.0` and `0.0` are one value, as PyTorch's CPU kernel has them.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32, 1.0, 2.0, f32::NAN], [2, 2]);
    /// let u = x.unique_all();
    /// assert_eq!(u.counts.to_vec::<i64>().unwrap(), vec![1, 2, 1]);
    /// assert_eq!(u.inverse.shape(), &[2, 2]);
    /// assert_eq!(u.inverse.to_vec::<i64>().unwrap(), vec![1, 0, 1, 2]);
    /// ```
    #[track_caller]
    pub fn unique_all(&self) -> Unique {
        unwrap_or_panic(self.try_unique_all())
    }

    /// Fallible [`Tensor::unique_all`].
    pub fn try_unique_all(&self) -> Result<Unique> {
        let dtype = self.dtype();
        let values = self.detach();
        let (order, groups, distinct) = if dtype.is_float() {
            // Ascending, NaNs last in input order; NaN != NaN, so every NaN starts a group,
            // and -0.0 == 0.0 share one.
            distinct_sorted(values.to_vec::<f64>()?, |a, b| {
                match (a.is_nan(), b.is_nan()) {
                    (false, false) => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
                    (x, y) => x.cmp(&y),
                }
            })?
        } else {
            distinct_sorted(values.to_vec::<i64>()?, |a, b| a.cmp(b))?
        };
        let mut inverse = vec![0i64; order.len()];
        let mut counts = vec![0i64; distinct.numel()];
        for (&i, &g) in order.iter().zip(&groups) {
            inverse[i] = g as i64;
            counts[g] += 1;
        }
        let n = counts.len();
        Ok(Unique {
            values: distinct.try_cast(dtype)?.try_to(self.device())?,
            inverse: index_tensor(inverse, self.shape(), self)?,
            counts: index_tensor(counts, &[n], self)?,
        })
    }
}

/// `v` sorted stably by `cmp`: the visiting order, each element's group number along it
/// (a new group wherever an element differs (`!=`) from the one before), and the
/// distinct values (each group's first) as a 1-D tensor.
fn distinct_sorted<T: Element + PartialEq>(
    v: Vec<T>,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Result<(Vec<usize>, Vec<usize>, Tensor)> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| cmp(&v[a], &v[b]));
    let mut groups = Vec::with_capacity(order.len());
    let mut distinct = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        if k == 0 || v[order[k - 1]] != v[i] {
            distinct.push(v[i]);
        }
        groups.push(distinct.len() - 1);
    }
    let n = distinct.len();
    Ok((order, groups, Tensor::try_from_vec(distinct, [n])?))
}
