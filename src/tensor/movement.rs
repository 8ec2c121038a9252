//! Movement ops. Each records a view change; the planner folds chains of them into one
//! [`crate::shape::View`] per edge, so none of them copies data.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::Scalar;
use crate::error::{KilnError, Result};
use crate::graph::Op;
use crate::shape::{
    Axes, IntList, Movement, ShapeLike, SliceRange, axis_list, normalize_axes, normalize_axis,
    numel,
};

impl Tensor {
    /// Records one movement op (shape checked).
    pub(crate) fn record_movement(&self, m: Movement) -> Result<Tensor> {
        self.movement(m)
    }

    /// A new tensor with this one's value (an identity view): what an op that changes
    /// nothing returns, so that an in-place update of its result never updates `self`, nor
    /// the other way round, whatever the shapes (PyTorch's movement ops return new tensors
    /// too; only `cast`/`to` to what a tensor already is return the tensor itself, as
    /// PyTorch's do).
    pub(crate) fn unchanged(&self) -> Result<Tensor> {
        self.movement(Movement::Reshape(self.shape.clone()))
    }

    /// `r`, or a new tensor with its value where `r` is this tensor itself (an op that
    /// found nothing to do): see [`Tensor::unchanged`].
    pub(crate) fn unless_self(&self, r: Tensor) -> Result<Tensor> {
        if r.key == self.key {
            self.unchanged()
        } else {
            Ok(r)
        }
    }

    fn movement(&self, m: Movement) -> Result<Tensor> {
        let shape =
            m.checked_output_shape(&self.shape)
                .ok_or_else(|| KilnError::InvalidArgument {
                    op: m.name(),
                    shape: self.shape.clone(),
                    reason: "padding makes a dimension larger than 2^64 - 1".into(),
                })?;
        Tensor::record(Op::Movement(m), &[self], shape, self.dtype, self.device)
    }

    /// A new shape with the same number of elements; one entry may be `-1` (inferred).
    ///
    /// ```
    /// let x = kiln::Tensor::arange(0.0, 6.0, 1.0);
    /// assert_eq!(x.reshape(&[2, -1]).shape(), &[2, 3]);
    /// ```
    #[track_caller]
    pub fn reshape(&self, shape: impl IntList) -> Tensor {
        unwrap_or_panic(self.try_reshape(shape))
    }

    /// Fallible [`Tensor::reshape`].
    pub fn try_reshape(&self, shape: impl IntList) -> Result<Tensor> {
        let shape: Vec<isize> = shape
            .to_ints()
            .into_iter()
            .map(|d| d.clamp(isize::MIN as i128, isize::MAX as i128) as isize)
            .collect();
        let shape = shape.as_slice();
        let err = |reason: &str| KilnError::InvalidShape {
            op: "reshape",
            shape: self.shape.clone(),
            requested: shape.to_vec(),
            reason: reason.into(),
        };
        let mut infer = None;
        let mut known = 1usize;
        for (i, &d) in shape.iter().enumerate() {
            if d == -1 {
                if infer.is_some() {
                    return Err(err("only one dimension can be -1"));
                }
                infer = Some(i);
            } else if d < 0 {
                return Err(err("sizes must be non-negative or -1"));
            } else {
                known = known
                    .checked_mul(d as usize)
                    .ok_or_else(|| err("size overflows"))?;
            }
        }
        let total = self.numel();
        let mut out: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
        if let Some(i) = infer {
            if known == 0 || !total.is_multiple_of(known) {
                return Err(err("the -1 dimension cannot be inferred"));
            }
            out[i] = total / known;
        } else if known != total {
            return Err(err(&format!(
                "{total} elements cannot be arranged as {known}"
            )));
        }
        if out == self.shape {
            return self.unchanged();
        }
        self.movement(Movement::Reshape(out))
    }

    /// PyTorch's `movedim(source, destination)` (also `moveaxis`): dimension `source` moved
    /// to position `destination`, the others keeping their order; a view. Negative values
    /// count from the end.
    ///
    /// ```
    /// let x = kiln::Tensor::zeros([2, 3, 4]);
    /// assert_eq!(x.movedim(0, -1).shape(), &[3, 4, 2]);
    /// assert_eq!(x.movedim(2, 0).shape(), &[4, 2, 3]);
    /// ```
    #[track_caller]
    pub fn movedim(&self, source: isize, destination: isize) -> Tensor {
        unwrap_or_panic(self.try_movedim(source, destination))
    }

    /// Fallible [`Tensor::movedim`].
    pub fn try_movedim(&self, source: isize, destination: isize) -> Result<Tensor> {
        let s = normalize_axis("movedim", source, &self.shape)?;
        let d = normalize_axis("movedim", destination, &self.shape)?;
        let mut order: Vec<isize> = (0..self.ndim() as isize)
            .filter(|&a| a != s as isize)
            .collect();
        order.insert(d, s as isize);
        self.try_permute(order)
    }

    /// Reorders dimensions: output dimension `i` is input dimension `perm[i]`.
    #[track_caller]
    pub fn permute(&self, perm: impl Axes) -> Tensor {
        unwrap_or_panic(self.try_permute(perm))
    }

    /// Fallible [`Tensor::permute`].
    pub fn try_permute(&self, perm: impl Axes) -> Result<Tensor> {
        let perm = &axis_list(&perm).unwrap_or_default()[..];
        if perm.len() != self.ndim() {
            return Err(KilnError::InvalidArgument {
                op: "permute",
                shape: self.shape.clone(),
                reason: format!(
                    "permutation {perm:?} has {} entries, need {}",
                    perm.len(),
                    self.ndim()
                ),
            });
        }
        let mut p = Vec::with_capacity(perm.len());
        for &a in perm {
            let d = normalize_axis("permute", a, &self.shape)?;
            if p.contains(&d) {
                return Err(KilnError::InvalidArgument {
                    op: "permute",
                    shape: self.shape.clone(),
                    reason: format!("{perm:?} repeats dimension {d}"),
                });
            }
            p.push(d);
        }
        if p.iter().enumerate().all(|(i, &d)| i == d) {
            return self.unchanged();
        }
        self.movement(Movement::Permute(p))
    }

    /// Swaps two dimensions.
    #[track_caller]
    pub fn transpose(&self, d0: isize, d1: isize) -> Tensor {
        unwrap_or_panic(self.try_transpose(d0, d1))
    }

    /// Fallible [`Tensor::transpose`].
    pub fn try_transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let a = normalize_axis("transpose", d0, &self.shape)?;
        let b = normalize_axis("transpose", d1, &self.shape)?;
        let mut p: Vec<isize> = (0..self.ndim() as isize).collect();
        p.swap(a, b);
        self.try_permute(&p)
    }

    /// Transposes the last two dimensions (a no-op below 2-D).
    pub fn t(&self) -> Tensor {
        if self.ndim() < 2 {
            unwrap_or_panic(self.unchanged())
        } else {
            unwrap_or_panic(self.try_transpose(-2, -1))
        }
    }

    /// Broadcasts to `shape` (NumPy rules: leading dimensions are added, size-1 dimensions
    /// repeat with stride 0).
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl ShapeLike) -> Tensor {
        unwrap_or_panic(self.try_broadcast_to(shape))
    }

    /// Same as [`Tensor::broadcast_to`] (PyTorch's name).
    #[track_caller]
    pub fn expand(&self, shape: impl ShapeLike) -> Tensor {
        self.broadcast_to(shape)
    }

    /// Fallible [`Tensor::broadcast_to`].
    pub fn try_broadcast_to(&self, shape: impl ShapeLike) -> Result<Tensor> {
        let shape = &shape.dims()[..];
        if shape == self.shape.as_slice() {
            return self.unchanged();
        }
        self.expand_view(shape)
    }

    /// [`Tensor::try_broadcast_to`] for kiln's own ops, which need no new tensor where the
    /// shape is already `shape`: then it is `self`.
    pub(crate) fn expand_view(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape.as_slice() {
            return Ok(self.clone());
        }
        let err = || KilnError::ShapeMismatch {
            op: "broadcast_to",
            lhs: self.shape.clone(),
            rhs: shape.to_vec(),
            detail: ": size-1 dimensions can grow, others must match".into(),
        };
        if shape.len() < self.ndim() {
            return Err(err());
        }
        let lead = shape.len() - self.ndim();
        for (i, &n) in self.shape.iter().enumerate() {
            if n != shape[lead + i] && n != 1 {
                return Err(err());
            }
        }
        let x = if lead > 0 {
            let mut s: Vec<isize> = vec![1; lead];
            s.extend(self.shape.iter().map(|&n| n as isize));
            self.try_reshape(&s)?
        } else {
            self.clone()
        };
        if x.shape == shape {
            return Ok(x);
        }
        x.movement(Movement::Expand(shape.to_vec()))
    }

    /// Strided ranges over the leading dimensions, Python style: `(start, end, step)` with
    /// negative indices counting from the end, bounds clamped, `step ≥ 1` (use `flip` to
    /// reverse).
    ///
    /// ```
    /// let x = kiln::Tensor::arange(0.0, 10.0, 1.0);
    /// assert_eq!(x.slice(&[(1, -1, 3)]).to_vec::<f32>().unwrap(), vec![1.0, 4.0, 7.0]);
    /// ```
    #[track_caller]
    pub fn slice(&self, ranges: &[(isize, isize, isize)]) -> Tensor {
        unwrap_or_panic(self.try_slice(ranges))
    }

    /// Fallible [`Tensor::slice`].
    pub fn try_slice(&self, ranges: &[(isize, isize, isize)]) -> Result<Tensor> {
        if ranges.len() > self.ndim() {
            return Err(KilnError::InvalidArgument {
                op: "slice",
                shape: self.shape.clone(),
                reason: format!("{} ranges for {} dimensions", ranges.len(), self.ndim()),
            });
        }
        let mut out = Vec::with_capacity(self.ndim());
        for (d, &n) in self.shape.iter().enumerate() {
            let Some(&(s, e, step)) = ranges.get(d) else {
                out.push(SliceRange {
                    start: 0,
                    end: n,
                    step: 1,
                });
                continue;
            };
            if step < 1 {
                return Err(KilnError::InvalidArgument {
                    op: "slice",
                    shape: self.shape.clone(),
                    reason: format!(
                        "step {step} in dimension {d} must be at least 1 (use flip to reverse)"
                    ),
                });
            }
            // In i128: a dimension of an empty tensor may exceed isize::MAX.
            let clampi = |i: isize| -> usize {
                let (i, n) = (i as i128, n as i128);
                let i = if i < 0 { i + n } else { i };
                i.clamp(0, n) as usize
            };
            let (start, end) = (clampi(s), clampi(e));
            out.push(SliceRange {
                start,
                end: end.max(start),
                step: step as usize,
            });
        }
        if out
            .iter()
            .zip(&self.shape)
            .all(|(r, &n)| r.start == 0 && r.end == n && r.step == 1)
        {
            return self.unchanged();
        }
        self.movement(Movement::Slice(out))
    }

    /// `start..end` with a step along one dimension, Python style (negative indices count
    /// from the end, bounds clamp, `step >= 1`): `x[.., start:end:step]` for `dim = 1`.
    ///
    /// ```
    /// let x = kiln::Tensor::arange(0.0, 10.0, 1.0);
    /// assert_eq!(x.slice_dim(0, 1, -1, 4).to_vec::<f32>().unwrap(), vec![1.0, 5.0]);
    /// ```
    #[track_caller]
    pub fn slice_dim(&self, dim: isize, start: isize, end: isize, step: isize) -> Tensor {
        unwrap_or_panic(self.try_slice_dim(dim, start, end, step))
    }

    /// Fallible [`Tensor::slice_dim`].
    pub fn try_slice_dim(
        &self,
        dim: isize,
        start: isize,
        end: isize,
        step: isize,
    ) -> Result<Tensor> {
        let d = normalize_axis("slice_dim", dim, &self.shape)?;
        let mut r: Vec<(isize, isize, isize)> = self
            .shape
            .iter()
            .take(d)
            .map(|&n| (0, n.min(isize::MAX as usize) as isize, 1))
            .collect();
        r.push((start, end, step));
        self.try_slice(&r)
    }

    /// PyTorch's `narrow(dim, start, length)`: elements `start..start + length` along `dim`,
    /// a view. A negative `start` counts from the end; the range must lie inside the
    /// dimension (no clamping, as PyTorch).
    ///
    /// ```
    /// let x = kiln::Tensor::arange(0.0, 6.0, 1.0).reshape([2, 3]);
    /// assert_eq!(x.narrow(1, 1, 2).to_vec::<f32>().unwrap(), vec![1.0, 2.0, 4.0, 5.0]);
    /// assert_eq!(x.narrow(1, -1, 1).to_vec::<f32>().unwrap(), vec![2.0, 5.0]);
    /// assert!(x.try_narrow(1, 2, 2).is_err());
    /// ```
    #[track_caller]
    pub fn narrow(&self, dim: isize, start: isize, length: usize) -> Tensor {
        unwrap_or_panic(self.try_narrow(dim, start, length))
    }

    /// PyTorch's `x.select(dim, index)` (`x[:, index]` for `dim = 1`): the slice at
    /// `index` along `dim`, without that dimension; a view. A negative `index` counts from
    /// the end; one outside the dimension is an error here.
    ///
    /// ```
    /// let x = kiln::Tensor::arange(0.0, 6.0, 1.0).reshape([2, 3]);
    /// assert_eq!(x.select(1, -1).to_vec::<f32>().unwrap(), vec![2.0, 5.0]);
    /// assert!(x.try_select(0, 2).is_err());
    /// ```
    #[track_caller]
    pub fn select(&self, dim: isize, index: i64) -> Tensor {
        unwrap_or_panic(self.try_select(dim, index))
    }

    /// Fallible [`Tensor::select`].
    pub fn try_select(&self, dim: isize, index: i64) -> Result<Tensor> {
        let d = normalize_axis("select", dim, &self.shape)?;
        let n = self.shape[d] as i64;
        if index < -n || index >= n {
            return Err(KilnError::InvalidArgument {
                op: "select",
                shape: self.shape.clone(),
                reason: format!("index {index} is out of range for dimension {dim} (size {n})"),
            });
        }
        let k = if index < 0 { index + n } else { index };
        self.try_narrow(d as isize, k as isize, 1)?
            .try_squeeze_dim(d as isize)
    }

    /// Fallible [`Tensor::narrow`].
    pub fn try_narrow(&self, dim: isize, start: isize, length: usize) -> Result<Tensor> {
        let d = normalize_axis("narrow", dim, &self.shape)?;
        let n = self.shape[d] as i128;
        let s = if start < 0 {
            start as i128 + n
        } else {
            start as i128
        };
        if s < 0 || s > n || s + length as i128 > n {
            return Err(KilnError::InvalidArgument {
                op: "narrow",
                shape: self.shape.clone(),
                reason: format!(
                    "start {start} and length {length} do not fit dimension {dim} (size {n})"
                ),
            });
        }
        let mut ranges: Vec<SliceRange> = self
            .shape
            .iter()
            .map(|&n| SliceRange {
                start: 0,
                end: n,
                step: 1,
            })
            .collect();
        ranges[d] = SliceRange {
            start: s as usize,
            end: s as usize + length,
            step: 1,
        };
        if ranges[d].start == 0 && ranges[d].end == self.shape[d] {
            return self.unchanged();
        }
        self.movement(Movement::Slice(ranges))
    }

    /// Pads the leading dimensions with `(before, after)` elements of `value`.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    /// assert_eq!(x.pad(&[(1, 2)], 9.0).to_vec::<f32>().unwrap(), vec![9.0, 1.0, 2.0, 9.0, 9.0]);
    /// ```
    #[track_caller]
    pub fn pad(&self, pads: &[(usize, usize)], value: impl Into<Scalar>) -> Tensor {
        unwrap_or_panic(self.try_pad(pads, value))
    }

    /// Fallible [`Tensor::pad`].
    pub fn try_pad(&self, pads: &[(usize, usize)], value: impl Into<Scalar>) -> Result<Tensor> {
        if pads.len() > self.ndim() {
            return Err(KilnError::InvalidArgument {
                op: "pad",
                shape: self.shape.clone(),
                reason: format!("{} pad pairs for {} dimensions", pads.len(), self.ndim()),
            });
        }
        let mut p = pads.to_vec();
        p.resize(self.ndim(), (0, 0));
        if p.iter().all(|&(b, a)| b == 0 && a == 0) {
            return self.unchanged();
        }
        let value = value.into().cast(self.dtype);
        self.movement(Movement::Pad { pads: p, value })
    }

    /// Reverses the listed dimensions.
    #[track_caller]
    pub fn flip(&self, axes: impl Axes) -> Tensor {
        unwrap_or_panic(self.try_flip(axes))
    }

    /// Fallible [`Tensor::flip`].
    pub fn try_flip(&self, axes: impl Axes) -> Result<Tensor> {
        let axes = axis_list(&axes).unwrap_or_else(|| (0..self.ndim() as isize).collect());
        let a = normalize_axes("flip", &axes, &self.shape)?;
        let a: Vec<usize> = a.into_iter().filter(|&d| self.shape[d] > 1).collect();
        if a.is_empty() {
            return self.unchanged();
        }
        self.movement(Movement::Flip(a))
    }

    /// Removes every size-1 dimension.
    pub fn squeeze(&self) -> Tensor {
        let s: Vec<isize> = self
            .shape
            .iter()
            .filter(|&&n| n != 1)
            .map(|&n| n as isize)
            .collect();
        unwrap_or_panic(self.try_reshape(&s))
    }

    /// Removes dimension `dim` if it has size 1 (otherwise returns the tensor unchanged, as
    /// PyTorch does).
    #[track_caller]
    pub fn squeeze_dim(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_squeeze_dim(dim))
    }

    /// Fallible [`Tensor::squeeze_dim`].
    pub fn try_squeeze_dim(&self, dim: isize) -> Result<Tensor> {
        let d = normalize_axis("squeeze", dim, &self.shape)?;
        if self.shape[d] != 1 {
            return self.unchanged();
        }
        let s: Vec<isize> = self
            .shape
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != d)
            .map(|(_, &n)| n as isize)
            .collect();
        self.try_reshape(&s)
    }

    /// Inserts a size-1 dimension at `dim` (`-1` appends).
    #[track_caller]
    pub fn unsqueeze(&self, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_unsqueeze(dim))
    }

    /// Fallible [`Tensor::unsqueeze`].
    pub fn try_unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let nd = self.ndim() as isize + 1;
        let d = if dim < 0 { dim + nd } else { dim };
        if d < 0 || d >= nd {
            return Err(KilnError::InvalidAxis {
                op: "unsqueeze",
                axis: dim,
                shape: self.shape.clone(),
            });
        }
        let mut s: Vec<isize> = self.shape.iter().map(|&n| n as isize).collect();
        s.insert(d as usize, 1);
        self.try_reshape(&s)
    }

    /// Flattens to one dimension.
    pub fn flatten(&self) -> Tensor {
        unwrap_or_panic(self.try_reshape([self.numel() as isize]))
    }

    /// Flattens dimensions `start..=end` into one.
    #[track_caller]
    pub fn flatten_dims(&self, start: isize, end: isize) -> Tensor {
        unwrap_or_panic(self.try_flatten_dims(start, end))
    }

    /// Fallible [`Tensor::flatten_dims`].
    pub fn try_flatten_dims(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.ndim() == 0 {
            return self.try_reshape([1]);
        }
        let a = normalize_axis("flatten", start, &self.shape)?;
        let b = normalize_axis("flatten", end, &self.shape)?;
        if a > b {
            return Err(KilnError::InvalidArgument {
                op: "flatten",
                shape: self.shape.clone(),
                reason: format!("start dimension {a} is after end dimension {b}"),
            });
        }
        let mut s: Vec<isize> = self.shape[..a].iter().map(|&n| n as isize).collect();
        s.push(numel(&self.shape[a..=b]) as isize);
        s.extend(self.shape[b + 1..].iter().map(|&n| n as isize));
        self.try_reshape(&s)
    }

    /// A tensor that will be stored in its own row-major buffer when realized (a fusion
    /// boundary). Free for a realized tensor, which is already stored so: the result then
    /// shares its buffer (a new tensor all the same, as every op's result is; unlike
    /// PyTorch's, it never returns `self`, so an in-place update of it is never an update
    /// of `self`).
    pub fn contiguous(&self) -> Tensor {
        unwrap_or_panic(self.try_contiguous())
    }

    /// Fallible [`Tensor::contiguous`].
    pub fn try_contiguous(&self) -> Result<Tensor> {
        if self.is_realized() {
            return self.unchanged();
        }
        self.try_copy()
    }

    /// A copy of this tensor's value in a buffer of its own (PyTorch's `x.clone()`): later
    /// in-place updates of either tensor leave the other alone. Rust's `clone()` is not
    /// that: it gives another handle to the same tensor, which sees every update.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// x.realize().unwrap();
    /// let old = x.copy();
    /// let same = x.clone();
    /// x.add_(1.0);
    /// assert_eq!(old.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    /// assert_eq!(same.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn copy(&self) -> Tensor {
        unwrap_or_panic(self.try_copy())
    }

    /// Fallible [`Tensor::copy`].
    pub fn try_copy(&self) -> Result<Tensor> {
        Tensor::record(
            Op::Contiguous,
            &[self],
            self.shape.clone(),
            self.dtype,
            self.device,
        )
    }

    /// Repeats the tensor `sizes[d]` times along each dimension (PyTorch's `repeat`):
    /// `sizes` has at least `ndim` entries; extra leading ones add dimensions. Built from
    /// views — each dimension `n` becomes `[1, n]`, expanded to `[sizes[d], n]`, then merged
    /// — so nothing is copied except where that final reshape cannot be a view (then the
    /// planner stores the repeated value once).
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let y = x.repeat([2, 2]);
    /// assert_eq!(y.shape(), &[2, 4]);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn repeat(&self, sizes: impl ShapeLike) -> Tensor {
        unwrap_or_panic(self.try_repeat(sizes))
    }

    /// Fallible [`Tensor::repeat`].
    pub fn try_repeat(&self, sizes: impl ShapeLike) -> Result<Tensor> {
        self.repeat_as("repeat", &sizes.dims())
    }

    /// Repeats the tensor `reps[d]` times along each dimension (PyTorch's `tile`): like
    /// [`Tensor::repeat`], but `reps` shorter than `ndim` is padded with leading 1s.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]);
    /// assert_eq!(x.tile([2]).to_vec::<i32>().unwrap(), vec![1, 2, 1, 2, 3, 4, 3, 4]);
    /// ```
    #[track_caller]
    pub fn tile(&self, reps: impl ShapeLike) -> Tensor {
        unwrap_or_panic(self.try_tile(reps))
    }

    /// Fallible [`Tensor::tile`].
    pub fn try_tile(&self, reps: impl ShapeLike) -> Result<Tensor> {
        let reps = reps.dims();
        let mut padded = vec![1; self.ndim().saturating_sub(reps.len())];
        padded.extend(reps);
        self.repeat_as("tile", &padded)
    }

    fn repeat_as(&self, op: &'static str, sizes: &[usize]) -> Result<Tensor> {
        if sizes.len() < self.ndim() {
            return Err(KilnError::InvalidArgument {
                op,
                shape: self.shape.clone(),
                reason: format!(
                    "{} repeat counts for a {}-d tensor (at least one per dimension)",
                    sizes.len(),
                    self.ndim()
                ),
            });
        }
        let lead = sizes.len() - self.ndim();
        let mut dims = vec![1; lead];
        dims.extend(self.shape.iter().copied());
        let mut out = Vec::with_capacity(sizes.len());
        for (&r, &n) in sizes.iter().zip(&dims) {
            out.push(r.checked_mul(n).ok_or_else(|| KilnError::InvalidArgument {
                op,
                shape: self.shape.clone(),
                reason: format!("{r} repeats of a dimension of {n} overflow"),
            })?);
        }
        crate::shape::check_shape(op, &out, self.dtype)?;
        // Each dimension n with r > 1 repeats becomes [1, n] (a view), expanded to [r, n].
        let mut split = Vec::new();
        let mut expanded = Vec::new();
        for (&r, &n) in sizes.iter().zip(&dims) {
            if r != 1 {
                split.push(1);
                expanded.push(r);
            }
            split.push(n);
            expanded.push(n);
        }
        self.try_reshape(split)?
            .try_broadcast_to(expanded)?
            .try_reshape(out)
    }
}
