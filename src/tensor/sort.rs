//! Sorting along one axis: `argsort` is one stable sort kernel; `sort`, `topk` and the
//! value-and-index reductions (`max_dim`, `min_dim`) read values back with a gather, so the
//! values fuse into whatever consumes them.

use super::{Tensor, unwrap_or_panic};
use crate::error::{KilnError, Result};
use crate::graph::{Op, ReduceOp};
use crate::shape::normalize_axis;

impl Tensor {
    /// PyTorch's `argsort(dim, descending, stable=True)`: the i64 indices that sort each
    /// lane along `dim`. Stable (equal values keep their order, `-0.0` equals `0.0`); NaN
    /// sorts above every number, so last ascending and first descending, as PyTorch.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, f32::NAN, 1.0, 3.0], &[4]);
    /// assert_eq!(x.argsort(0, false).to_vec::<i64>().unwrap(), vec![2, 0, 3, 1]);
    /// assert_eq!(x.argsort(0, true).to_vec::<i64>().unwrap(), vec![1, 0, 3, 2]);
    /// ```
    #[track_caller]
    pub fn argsort(&self, dim: isize, descending: bool) -> Tensor {
        unwrap_or_panic(self.try_argsort(dim, descending))
    }

    /// Fallible [`Tensor::argsort`].
    pub fn try_argsort(&self, dim: isize, descending: bool) -> Result<Tensor> {
        if self.ndim() == 0 {
            normalize_axis("argsort", dim, &[1])?;
            return self
                .try_reshape([1])?
                .try_argsort(0, descending)?
                .try_reshape(());
        }
        let axis = normalize_axis("argsort", dim, self.shape())?;
        if self.dtype() == crate::DType::Bool {
            return self
                .try_cast(crate::DType::U8)?
                .try_argsort(dim, descending);
        }
        Tensor::record(
            Op::ArgSort { axis, descending },
            &[self],
            self.shape().to_vec(),
            crate::DType::I64,
            self.device(),
        )
    }

    /// PyTorch's `sort(dim, descending, stable=True)`: `(values, indices)` with the order
    /// [`Tensor::argsort`] defines.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![2i32, 0, 1], &[3]);
    /// let (v, i) = x.sort(0, false);
    /// assert_eq!(v.to_vec::<i32>().unwrap(), vec![0, 1, 2]);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 2, 0]);
    /// ```
    #[track_caller]
    pub fn sort(&self, dim: isize, descending: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_sort(dim, descending))
    }

    /// Fallible [`Tensor::sort`].
    pub fn try_sort(&self, dim: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        let idx = self.try_argsort(dim, descending)?;
        let values = if self.ndim() == 0 {
            self.unchanged()?
        } else {
            self.try_gather(dim, &idx)?
        };
        Ok((values, idx))
    }

    /// PyTorch's `topk(k, dim, largest, sorted=True)`: the `k` largest (or smallest)
    /// values along `dim` and their indices, in sorted order. NaN counts as the largest
    /// value. Ties keep the lower index first (PyTorch leaves their order unspecified).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 5.0], &[4]);
    /// let (v, i) = x.topk(2, -1, true);
    /// assert_eq!(v.to_vec::<f32>().unwrap(), vec![5.0, 5.0]);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 3]);
    /// ```
    #[track_caller]
    pub fn topk(&self, k: usize, dim: isize, largest: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_topk(k, dim, largest))
    }

    /// Fallible [`Tensor::topk`].
    pub fn try_topk(&self, k: usize, dim: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        let len = if self.ndim() == 0 {
            normalize_axis("topk", dim, &[1])?;
            1
        } else {
            self.shape()[normalize_axis("topk", dim, self.shape())?]
        };
        if k > len {
            return Err(KilnError::InvalidArgument {
                op: "topk",
                shape: self.shape().to_vec(),
                reason: format!("k = {k} is larger than dimension {dim} (size {len})"),
            });
        }
        let idx = self.try_argsort(dim, largest)?;
        if self.ndim() == 0 {
            return Ok((self.unchanged()?, idx));
        }
        let idx = idx.try_narrow(dim, 0, k)?;
        Ok((self.try_gather(dim, &idx)?, idx))
    }

    /// PyTorch's `max(dim, keepdim)`: the largest value along `dim` and its i64 index.
    /// A NaN is the largest value; ties give the first index.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 7.0, 7.0, 2.0], &[2, 2]);
    /// let (v, i) = x.max_dim(1, false);
    /// assert_eq!(v.to_vec::<f32>().unwrap(), vec![7.0, 7.0]);
    /// assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 0]);
    /// ```
    #[track_caller]
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_max_dim(dim, keepdim))
    }

    /// Fallible [`Tensor::max_dim`].
    pub fn try_max_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.value_and_index(ReduceOp::ArgMax, dim, keepdim)
    }

    /// PyTorch's `min(dim, keepdim)`: the smallest value along `dim` and its i64 index.
    /// A NaN counts as the smallest here too (it propagates, as PyTorch); ties give the
    /// first index.
    #[track_caller]
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_min_dim(dim, keepdim))
    }

    /// Fallible [`Tensor::min_dim`].
    pub fn try_min_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.value_and_index(ReduceOp::ArgMin, dim, keepdim)
    }

    fn value_and_index(&self, op: ReduceOp, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let idx = self.arg_reduce(op, Some(dim), true)?;
        let values = if self.ndim() == 0 {
            self.unchanged()?
        } else {
            self.try_gather(dim, &idx)?
        };
        if keepdim || self.ndim() == 0 {
            return Ok((values, idx));
        }
        Ok((values.try_squeeze_dim(dim)?, idx.try_squeeze_dim(dim)?))
    }
}

/// Binary-search positions, computed as counts: for sorted boundaries `b` and a value
/// `v`, the left insertion point is how many `b < v` and the right one how many `b ≤ v`.
/// The comparisons broadcast into one fused reduction (no `[values, boundaries]` array is
/// stored), so the cost is the number of pairs, not a logarithm of it.
impl Tensor {
    /// PyTorch's `torch.searchsorted(sorted_sequence, values, right=…)`: for each value,
    /// where it would be inserted to keep this sorted sequence sorted (i64): the first
    /// position whose element is `≥ v` (or `> v` with `right`). A 1-D sequence serves
    /// every value; otherwise its leading dimensions match `values`' and each row serves
    /// its row. NaN values go after everything (the sequence's length). The sequence must
    /// be sorted ascending and hold no NaN (not checked, as in PyTorch).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let seq = Tensor::from_vec(vec![1.0f32, 3.0, 5.0, 7.0, 9.0], [5]);
    /// let v = Tensor::from_vec(vec![3.0f32, 6.0, 9.0, 10.0, f32::NAN], [5]);
    /// assert_eq!(seq.searchsorted(&v, false).to_vec::<i64>().unwrap(), vec![1, 3, 4, 5, 5]);
    /// assert_eq!(seq.searchsorted(&v, true).to_vec::<i64>().unwrap(), vec![2, 3, 5, 5, 5]);
    /// ```
    #[track_caller]
    pub fn searchsorted(&self, values: &Tensor, right: bool) -> Tensor {
        unwrap_or_panic(self.try_searchsorted(values, right))
    }

    /// Fallible [`Tensor::searchsorted`].
    pub fn try_searchsorted(&self, values: &Tensor, right: bool) -> Result<Tensor> {
        const OP: &str = "searchsorted";
        if self.ndim() == 0 {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: self.shape().to_vec(),
                reason: "the sorted sequence must have at least one dimension".into(),
            });
        }
        let lead = &self.shape()[..self.ndim() - 1];
        if self.ndim() > 1
            && (values.ndim() != self.ndim() || &values.shape()[..values.ndim() - 1] != lead)
        {
            return Err(KilnError::ShapeMismatch {
                op: OP,
                lhs: self.shape().to_vec(),
                rhs: values.shape().to_vec(),
                detail: ": an N-D sorted sequence needs values with the same leading dimensions"
                    .into(),
            });
        }
        // values [..., k, 1] against boundaries [(...), 1, m].
        let v = values.try_unsqueeze(-1)?;
        let b = if self.ndim() > 1 {
            self.try_unsqueeze(-2)?
        } else {
            self.unchanged()?
        };
        let below = if right { b.try_le(&v)? } else { b.try_lt(&v)? };
        let count = below.try_cast(crate::dtype::DType::I64)?.try_sum(-1)?;
        if !values.dtype().is_float() {
            return Ok(count);
        }
        let m = self.shape()[self.ndim() - 1] as i64;
        Tensor::try_where(&values.try_isnan()?, m, &count)
    }

    /// PyTorch's `torch.bucketize(input, boundaries, right=…)`: for each element, the index
    /// of the bucket of the 1-D sorted `boundaries` it falls in (i64): `i` such that
    /// `boundaries[i-1] < x ≤ boundaries[i]` (or `boundaries[i-1] ≤ x < boundaries[i]`
    /// with `right`), from 0 to `len(boundaries)`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let b = Tensor::from_vec(vec![1i64, 3, 5, 7, 9], [5]);
    /// let x = Tensor::from_vec(vec![3i64, 6, 9], [3]);
    /// assert_eq!(x.bucketize(&b, false).to_vec::<i64>().unwrap(), vec![1, 3, 4]);
    /// assert_eq!(x.bucketize(&b, true).to_vec::<i64>().unwrap(), vec![2, 3, 5]);
    /// ```
    #[track_caller]
    pub fn bucketize(&self, boundaries: &Tensor, right: bool) -> Tensor {
        unwrap_or_panic(self.try_bucketize(boundaries, right))
    }

    /// Fallible [`Tensor::bucketize`].
    pub fn try_bucketize(&self, boundaries: &Tensor, right: bool) -> Result<Tensor> {
        if boundaries.ndim() != 1 {
            return Err(KilnError::InvalidArgument {
                op: "bucketize",
                shape: boundaries.shape().to_vec(),
                reason: "boundaries must be 1-D".into(),
            });
        }
        boundaries.try_searchsorted(self, right)
    }
}
