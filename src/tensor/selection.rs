//! Selections whose result shape depends on the data: `nonzero` (`argwhere`),
//! `masked_select`, `masked_scatter`, `unique` (flattened or along a dimension) and
//! `unique_consecutive`.
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
use crate::dtype::DType;
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
        self.distinct("unique", None, false)
    }

    /// PyTorch's `torch.unique(x, dim=d)`: the distinct slices along `dim`, sorted
    /// lexicographically (elements compared in order, NaN after every number); see
    /// [`Tensor::unique_dim_all`] for the inverse and the counts.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 3, 0, 2, 1, 3], [3, 2]);
    /// assert_eq!(x.unique_dim(0).to_vec::<i64>().unwrap(), vec![0, 2, 1, 3]);
    /// ```
    #[track_caller]
    pub fn unique_dim(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_unique_dim(dim))
    }

    /// Fallible [`Tensor::unique_dim`].
    pub fn try_unique_dim(&self, dim: isize) -> Result<Tensor> {
        Ok(self.try_unique_dim_all(dim)?.values)
    }

    /// [`Tensor::unique_dim`] with the inverse (for each slice along `dim`, the position of
    /// its value among the distinct ones: shape `[x.shape[dim]]`) and the counts. Slices
    /// holding a NaN are each distinct, as PyTorch compares them with `==`. As in PyTorch, a
    /// tensor whose only empty dimension is `dim` comes back unchanged with empty inverse
    /// and counts, and any other empty dimension is an error.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 3, 0, 2, 1, 3], [3, 2]);
    /// let u = x.unique_dim_all(0);
    /// assert_eq!(u.inverse.to_vec::<i64>().unwrap(), vec![1, 0, 1]);
    /// assert_eq!(u.counts.to_vec::<i64>().unwrap(), vec![1, 2]);
    /// ```
    #[track_caller]
    pub fn unique_dim_all(&self, dim: isize) -> Unique {
        unwrap_or_panic(self.try_unique_dim_all(dim))
    }

    /// Fallible [`Tensor::unique_dim_all`].
    pub fn try_unique_dim_all(&self, dim: isize) -> Result<Unique> {
        self.distinct("unique", Some(dim), false)
    }

    /// PyTorch's `torch.unique_consecutive(x)`: the flattened tensor with each run of equal
    /// consecutive elements kept once (its first), unsorted. NaNs are each their own run;
    /// `-0.0` and `0.0` are one value. Realizes the tensor; not differentiable.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 1, 2, 2, 3, 1, 1, 2], [8]);
    /// assert_eq!(x.unique_consecutive().to_vec::<i64>().unwrap(), vec![1, 2, 3, 1, 2]);
    /// ```
    #[track_caller]
    pub fn unique_consecutive(&self) -> Tensor {
        unwrap_or_panic(self.try_unique_consecutive())
    }

    /// Fallible [`Tensor::unique_consecutive`].
    pub fn try_unique_consecutive(&self) -> Result<Tensor> {
        Ok(self.try_unique_consecutive_all()?.values)
    }

    /// [`Tensor::unique_consecutive`] with `return_inverse=True, return_counts=True`: each
    /// element's run number (the input's shape) and each run's length.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 1, 2, 2, 3, 1, 1, 2], [8]);
    /// let u = x.unique_consecutive_all();
    /// assert_eq!(u.inverse.to_vec::<i64>().unwrap(), vec![0, 0, 1, 1, 2, 3, 3, 4]);
    /// assert_eq!(u.counts.to_vec::<i64>().unwrap(), vec![2, 2, 1, 2, 1]);
    /// ```
    #[track_caller]
    pub fn unique_consecutive_all(&self) -> Unique {
        unwrap_or_panic(self.try_unique_consecutive_all())
    }

    /// Fallible [`Tensor::unique_consecutive_all`].
    pub fn try_unique_consecutive_all(&self) -> Result<Unique> {
        self.distinct("unique_consecutive", None, true)
    }

    /// PyTorch's `torch.unique_consecutive(x, dim=d)`: runs of equal consecutive slices
    /// along `dim`, each kept once; see [`Tensor::unique_consecutive_dim_all`].
    #[track_caller]
    pub fn unique_consecutive_dim(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_unique_consecutive_dim(dim))
    }

    /// Fallible [`Tensor::unique_consecutive_dim`].
    pub fn try_unique_consecutive_dim(&self, dim: isize) -> Result<Tensor> {
        Ok(self.try_unique_consecutive_dim_all(dim)?.values)
    }

    /// `torch.unique_consecutive(x, dim=d)` with the inverse and counts: runs of equal
    /// consecutive slices along `dim`, each kept once.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 1, 1, 1, 2, 2], [3, 2]);
    /// let u = x.unique_consecutive_dim_all(0);
    /// assert_eq!(u.values.to_vec::<i64>().unwrap(), vec![1, 1, 2, 2]);
    /// assert_eq!(u.counts.to_vec::<i64>().unwrap(), vec![2, 1]);
    /// ```
    #[track_caller]
    pub fn unique_consecutive_dim_all(&self, dim: isize) -> Unique {
        unwrap_or_panic(self.try_unique_consecutive_dim_all(dim))
    }

    /// Fallible [`Tensor::unique_consecutive_dim_all`].
    pub fn try_unique_consecutive_dim_all(&self, dim: isize) -> Result<Unique> {
        self.distinct("unique_consecutive", Some(dim), true)
    }

    /// The distinct values (`dim: None`, flattened) or slices along `dim`: sorted, or runs
    /// of equal neighbours (`consecutive`). Each group's representative is its first
    /// element in visiting order (the stable sort's, or the input's).
    fn distinct(&self, op: &'static str, dim: Option<isize>, consecutive: bool) -> Result<Unique> {
        let x = self.detach();
        let (x, d) = match dim {
            None => (x.try_reshape([-1])?, 0),
            Some(dim) => {
                let d = crate::shape::normalize_axis(op, dim, self.shape())?;
                let empty_dims = self.shape().iter().filter(|&&s| s == 0).count();
                // PyTorch's rules: an empty `dim` (and no other) gives the input back with
                // empty inverse and counts; any other empty dimension is an error.
                if empty_dims > 1 || (empty_dims == 1 && self.shape()[d] != 0) {
                    return Err(KilnError::InvalidArgument {
                        op,
                        shape: self.shape().to_vec(),
                        reason: format!(
                            "{empty_dims} dimension(s) are empty and not only dimension {dim}, so unique cannot be applied"
                        ),
                    });
                }
                if empty_dims == 1 {
                    let empty = index_tensor(Vec::new(), &[0], self)?;
                    return Ok(Unique {
                        values: x.try_copy()?,
                        inverse: empty.clone(),
                        counts: empty,
                    });
                }
                (x, d)
            }
        };
        let n = x.shape()[d];
        let width = x.numel().checked_div(n).unwrap_or(0);
        // The slices along `d` as rows of `width` elements.
        let rows = x.try_movedim(d as isize, 0)?.try_contiguous()?;
        let (order, groups, firsts) = if self.dtype().is_float() {
            let v = rows.to_vec::<f64>()?;
            group_rows(&v, n, width, consecutive, |a, b| {
                match (a.is_nan(), b.is_nan()) {
                    (false, false) => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
                    (p, q) => p.cmp(&q),
                }
            })
        } else {
            let v = rows.to_vec::<i64>()?;
            group_rows(&v, n, width, consecutive, |a, b| a.cmp(b))
        };
        let mut inverse = vec![0i64; n];
        let mut counts = vec![0i64; firsts.len()];
        for (&i, &g) in order.iter().zip(&groups) {
            inverse[i] = g as i64;
            counts[g] += 1;
        }
        let picks = index_tensor(
            firsts.iter().map(|&i| i as i64).collect(),
            &[firsts.len()],
            self,
        )?;
        let inverse_shape = if dim.is_none() {
            self.shape().to_vec()
        } else {
            vec![n]
        };
        let k = counts.len();
        Ok(Unique {
            values: x.try_index_select(d as isize, &picks)?.try_contiguous()?,
            inverse: index_tensor(inverse, &inverse_shape, self)?,
            counts: index_tensor(counts, &[k], self)?,
        })
    }
}

/// Groups the `n` rows of `width` elements in `v` (row-major): visited in a stable sort by
/// `cmp` (lexicographic over a row) or in order (`consecutive`); a new group starts at
/// each row that differs (`!=` on some element: NaN differs from itself) from the one
/// visited before. Returns the visiting order, each visited row's group, and each group's
/// first row.
fn group_rows<T: PartialEq>(
    v: &[T],
    n: usize,
    width: usize,
    consecutive: bool,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let row = |i: usize| &v[i * width..(i + 1) * width];
    let mut order: Vec<usize> = (0..n).collect();
    if !consecutive {
        order.sort_by(|&a, &b| {
            row(a)
                .iter()
                .zip(row(b))
                .map(|(p, q)| cmp(p, q))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    }
    let mut groups = Vec::with_capacity(n);
    let mut firsts = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        if k == 0 || row(order[k - 1]) != row(i) {
            firsts.push(i);
        }
        groups.push(firsts.len() - 1);
    }
    (order, groups, firsts)
}
