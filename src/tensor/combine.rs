//! Joining and splitting tensors. `split` and `chunk` return views (no copies). `cat` and
//! `stack` produce a new tensor: each input is padded into place and a `where` on the
//! position picks it, so the whole join is one fused kernel (and fuses with the work before
//! and after it) — kiln has no separate concatenation kernel. Its gradient is one rule
//! (a composite, [`custom_grad`](super::custom_grad)): each input gets its slice of the
//! output's gradient, a view. The derivative of each `where` would instead pass the
//! gradient of the rest of the join down the chain, one whole-size tensor per input.

use super::custom_grad::composite;
use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::shape::normalize_axis;

impl Tensor {
    /// Joins tensors along an existing dimension `dim`; they must agree on every other
    /// dimension and on the device (dtypes promote).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]);
    /// let b = Tensor::from_vec(vec![3.0f32, 4.0, 5.0, 6.0], &[2, 2]);
    /// assert_eq!(Tensor::cat(&[&a, &b], 0).to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    /// ```
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Tensor {
        unwrap_or_panic(Tensor::try_cat(tensors, dim))
    }

    /// Fallible [`Tensor::cat`].
    pub fn try_cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| KilnError::InvalidArgument {
            op: "cat",
            shape: vec![],
            reason: "needs at least one tensor".into(),
        })?;
        let axis = normalize_axis("cat", dim, first.shape())?;
        let mut dtype = first.dtype();
        let mut total = 0usize;
        for t in tensors {
            let same_rest = t.ndim() == first.ndim()
                && (0..first.ndim()).all(|d| d == axis || t.shape()[d] == first.shape()[d]);
            if !same_rest {
                return Err(KilnError::ShapeMismatch {
                    op: "cat",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    detail: format!(": shapes must match except in dimension {axis}"),
                });
            }
            first.require_same_device("cat", t)?;
            dtype = DType::promote(dtype, t.dtype());
            total =
                total
                    .checked_add(t.shape()[axis])
                    .ok_or_else(|| KilnError::InvalidArgument {
                        op: "cat",
                        shape: first.shape().to_vec(),
                        reason: "the joined dimension overflows".into(),
                    })?;
        }
        if tensors.len() == 1 {
            // A new tensor, as PyTorch's `cat` gives, even where no cast is needed.
            return first.unless_self(first.try_cast(dtype)?);
        }
        let nd = first.ndim();
        let mut starts = Vec::with_capacity(tensors.len());
        let mut s = 0;
        for t in tensors {
            starts.push(s);
            s += t.shape()[axis];
        }
        // The padding that puts input `i` in its place along `axis`.
        let pads_of = |i: usize| {
            let mut pads = vec![(0usize, 0usize); nd];
            pads[axis] = (starts[i], total - starts[i] - tensors[i].shape()[axis]);
            pads
        };
        let placed =
            |i: usize| -> Result<Tensor> { tensors[i].try_cast(dtype)?.try_pad(&pads_of(i), 0) };
        // True where input `i` lies, broadcast over the other dimensions: a padded
        // constant, which a kernel evaluates from the position alone (and the CPU backend
        // splits at its edges, see `backend/cpu/pieces.rs`).
        let inside = |i: usize| -> Result<Tensor> {
            let mut shape = vec![1usize; nd];
            shape[axis] = tensors[i].shape()[axis];
            Tensor::try_full_on(shape, true, DType::Bool, first.device())?
                .try_pad(&pads_of(i), false)
        };
        let last = tensors.len() - 1;
        let join = || {
            let mut acc = placed(last)?;
            for i in (0..last).rev() {
                acc = Tensor::try_where(&inside(i)?, &placed(i)?, &acc)?;
            }
            Ok(acc)
        };
        let ranges: Vec<(isize, isize)> = (starts.iter().zip(tensors))
            .map(|(&s, t)| (s as isize, (s + t.shape()[axis]) as isize))
            .collect();
        composite(tensors, join, move |_, _, g| {
            (ranges.iter())
                .map(|&(from, to)| Ok(Some(g.try_slice_dim(axis as isize, from, to, 1)?)))
                .collect()
        })
    }

    /// Joins tensors of one shape along a new dimension `dim`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let a = Tensor::from_vec(vec![1i64, 2], &[2]);
    /// let b = Tensor::from_vec(vec![3i64, 4], &[2]);
    /// assert_eq!(Tensor::stack(&[&a, &b], 1).shape(), &[2, 2]);
    /// ```
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Tensor {
        unwrap_or_panic(Tensor::try_stack(tensors, dim))
    }

    /// Fallible [`Tensor::stack`].
    pub fn try_stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| KilnError::InvalidArgument {
            op: "stack",
            shape: vec![],
            reason: "needs at least one tensor".into(),
        })?;
        for t in tensors {
            if t.shape() != first.shape() {
                return Err(KilnError::ShapeMismatch {
                    op: "stack",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    detail: ": stacked tensors must have one shape".into(),
                });
            }
        }
        let unsqueezed = tensors
            .iter()
            .map(|t| t.try_unsqueeze(dim))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = unsqueezed.iter().collect();
        let nd = first.ndim() as isize + 1;
        let d = if dim < 0 { dim + nd } else { dim };
        Tensor::try_cat(&refs, d)
    }

    /// Views of consecutive pieces of `size` along `dim` (the last may be shorter), as
    /// PyTorch's `split` with an integer size.
    #[track_caller]
    pub fn split(&self, size: usize, dim: isize) -> Vec<Tensor> {
        unwrap_or_panic(self.try_split(size, dim))
    }

    /// Fallible [`Tensor::split`].
    pub fn try_split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        let axis = normalize_axis("split", dim, self.shape())?;
        if size == 0 {
            return Err(KilnError::InvalidArgument {
                op: "split",
                shape: self.shape().to_vec(),
                reason: "the piece size must be at least 1".into(),
            });
        }
        let n = self.shape()[axis];
        let sizes: Vec<usize> = (0..n.div_ceil(size).max(1))
            .map(|i| size.min(n - (i * size).min(n)))
            .collect();
        self.try_split_sizes(&sizes, dim)
    }

    /// Views of consecutive pieces of the given sizes along `dim` (they must add up to the
    /// dimension), as PyTorch's `split` with a list of sizes.
    #[track_caller]
    pub fn split_sizes(&self, sizes: &[usize], dim: isize) -> Vec<Tensor> {
        unwrap_or_panic(self.try_split_sizes(sizes, dim))
    }

    /// Fallible [`Tensor::split_sizes`].
    pub fn try_split_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let axis = normalize_axis("split", dim, self.shape())?;
        let n = self.shape()[axis];
        if sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)) != Some(n) {
            return Err(KilnError::InvalidArgument {
                op: "split",
                shape: self.shape().to_vec(),
                reason: format!("sizes {sizes:?} do not add up to dimension {axis} ({n})"),
            });
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let mut ranges: Vec<(isize, isize, isize)> =
                    self.shape().iter().map(|&d| (0, d as isize, 1)).collect();
                ranges[axis] = (start as isize, (start + len) as isize, 1);
                start += len;
                self.try_slice(&ranges)
            })
            .collect()
    }

    /// At most `chunks` views along `dim`, each of `ceil(n / chunks)` elements but the last
    /// (PyTorch's `chunk`: fewer pieces when the dimension is short).
    #[track_caller]
    pub fn chunk(&self, chunks: usize, dim: isize) -> Vec<Tensor> {
        unwrap_or_panic(self.try_chunk(chunks, dim))
    }

    /// Fallible [`Tensor::chunk`].
    pub fn try_chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        let axis = normalize_axis("chunk", dim, self.shape())?;
        if chunks == 0 {
            return Err(KilnError::InvalidArgument {
                op: "chunk",
                shape: self.shape().to_vec(),
                reason: "the number of chunks must be at least 1".into(),
            });
        }
        let n = self.shape()[axis];
        if n == 0 {
            // PyTorch: `chunks` empty pieces of a size-0 dimension.
            return self.try_split_sizes(&vec![0; chunks], dim);
        }
        self.try_split(n.div_ceil(chunks), dim)
    }
}
