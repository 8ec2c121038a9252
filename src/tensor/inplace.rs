//! In-place updates in PyTorch's trailing-underscore style (`add_`, `sub_`, `mul_`,
//! `div_`, `zero_`, `fill_`, `copy_`, `scatter_`, `scatter_add_`, `scatter_reduce_`,
//! `index_add_`, `index_copy_`, `index_fill_`, `index_reduce_`, `index_put_`,
//! `masked_fill_`, `masked_scatter_`).
//! They are lazy like every op: the tensor keeps its identity (every handle to it sees
//! the new value), computations recorded before the update keep reading the old value,
//! and when the tensor is realized the new value is
//! written into the tensor's own buffer — after every pending reader of the old value, which
//! the planner orders first. A value overwritten this way cannot be read afterwards: a
//! computation that still needs it fails when realized (the buffer's version counter), as
//! PyTorch's autograd does. Other tensors that share the buffer (`x.detach()`, a realized
//! reshape) are not updated with it, unlike PyTorch's views: they keep the old value, their
//! pending readers run before the write, and reading them after it fails the same way.
//!
//! Which handles are "the tensor": its Rust clones, and what `cast`/`to` return when the
//! tensor already has that dtype and device (the tensor itself, as in PyTorch). Every other
//! op returns a new tensor, also where it changes nothing (a reshape to the same shape, a
//! flip over size-1 dimensions), so whether an update reaches another handle never depends
//! on shapes. [`Tensor::copy`] is PyTorch's `clone()`.

use super::{Operand, Tensor, unwrap_or_panic};
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::graph;

/// What one try to record an in-place update came to.
enum Attempt {
    /// Recorded.
    Done,
    /// Another update was recorded meanwhile: record the value again, at once.
    Again,
    /// A realize is installing on the tensor: wait, then record the value again.
    Wait,
}

impl Tensor {
    /// Replaces this tensor's value with `f(self)` in place (see the module documentation).
    pub(super) fn update(
        &self,
        op: &'static str,
        f: impl Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<&Tensor> {
        if graph::grad_enabled() && self.requires_grad() {
            return Err(KilnError::InvalidArgument {
                op,
                shape: self.shape.clone(),
                reason: "in-place update of a tensor that requires grad; do it inside kiln::no_grad (as optimizers do)".into(),
            });
        }
        // Another thread's update of any tensor between recording `value` and installing
        // it could leave `value` reading this tensor's value from before that update while
        // the new write lands after it (a lost update, and an order the planner cannot
        // satisfy): the update records `value` again then, so updates from several
        // threads apply one after another.
        // An update of a tensor whose realize is running waits for it to finish, so that
        // the update applies to its result.
        let mut tries = 0;
        loop {
            let epoch = graph::read_graph(|g| g.inplace_epoch());
            let value = self.updated_value(op, &f)?;
            // `x.copy_(&x)` (or through a view that is `x` itself): the value is the
            // tensor, and assigning a node to itself would be a cycle. Nothing changes.
            if value.key == self.key {
                return Ok(self);
            }
            let attempt = graph::with_graph(|g| {
                if g.inplace_epoch() != epoch {
                    return Ok(Attempt::Again);
                }
                if g.is_installing(self.key) {
                    return Ok(Attempt::Wait);
                }
                let old = g.begin_inplace(self.key)?;
                let done = g.finish_inplace(self.key, old, value.key);
                g.release(old);
                done.map(|()| Attempt::Done)
            })?;
            match attempt {
                Attempt::Done => return Ok(self),
                Attempt::Again => {}
                // Outside the graph lock: on a rayon worker the wait runs other queued
                // jobs, and one that records or realizes would lock the graph again on
                // this thread (a deadlock), while the realize waited for could not
                // install its result.
                Attempt::Wait => crate::memory::buffer::back_off(&mut tries),
            }
        }
    }

    /// `f(self)`, checked to be storable into this tensor in place and cast to its dtype.
    fn updated_value(
        &self,
        op: &'static str,
        f: &impl Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let value = f(self)?;
        if value.shape != self.shape {
            return Err(KilnError::ShapeMismatch {
                op,
                lhs: self.shape.clone(),
                rhs: value.shape.clone(),
                detail: ": an in-place result must keep the tensor's shape".into(),
            });
        }
        self.require_same_device(op, &value)?;
        if !can_store(value.dtype, self.dtype) {
            return Err(KilnError::UnsupportedDType {
                op,
                dtype: value.dtype,
                detail: format!(
                    ": the result cannot be stored in place into a {} tensor",
                    self.dtype
                ),
            });
        }
        let borrowed = graph::with_graph(|g| {
            g.node(self.key)
                .ok()
                .and_then(|n| n.buffer.as_ref().map(|b| b.is_borrowed()))
                .unwrap_or(false)
        });
        if borrowed {
            return Err(KilnError::Borrowed {
                op,
                detail: format!("the buffer of this {:?} {} tensor", self.shape, self.dtype),
            });
        }
        value.try_cast(self.dtype)
    }

    /// `self += rhs` in place (broadcasting `rhs` to this tensor's shape).
    #[track_caller]
    pub fn add_<'a>(&self, rhs: impl Into<Operand<'a>>) -> &Tensor {
        unwrap_or_panic(self.try_add_(rhs))
    }

    /// Fallible [`Tensor::add_`].
    pub fn try_add_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        let rhs = rhs.into();
        self.update("add_", |x| x.try_add(rhs.reborrow()))
    }

    /// `self -= rhs` in place.
    #[track_caller]
    pub fn sub_<'a>(&self, rhs: impl Into<Operand<'a>>) -> &Tensor {
        unwrap_or_panic(self.try_sub_(rhs))
    }

    /// Fallible [`Tensor::sub_`].
    pub fn try_sub_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        let rhs = rhs.into();
        self.update("sub_", |x| x.try_sub(rhs.reborrow()))
    }

    /// `self *= rhs` in place.
    #[track_caller]
    pub fn mul_<'a>(&self, rhs: impl Into<Operand<'a>>) -> &Tensor {
        unwrap_or_panic(self.try_mul_(rhs))
    }

    /// Fallible [`Tensor::mul_`].
    pub fn try_mul_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        let rhs = rhs.into();
        self.update("mul_", |x| x.try_mul(rhs.reborrow()))
    }

    /// `self /= rhs` in place (float tensors).
    #[track_caller]
    pub fn div_<'a>(&self, rhs: impl Into<Operand<'a>>) -> &Tensor {
        unwrap_or_panic(self.try_div_(rhs))
    }

    /// Fallible [`Tensor::div_`].
    pub fn try_div_<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<&Tensor> {
        let rhs = rhs.into();
        self.update("div_", |x| x.try_div(rhs.reborrow()))
    }

    /// Sets every element to zero in place.
    #[track_caller]
    pub fn zero_(&self) -> &Tensor {
        unwrap_or_panic(self.try_fill_(0))
    }

    /// Sets every element to `value` in place.
    #[track_caller]
    pub fn fill_(&self, value: impl Into<Scalar>) -> &Tensor {
        unwrap_or_panic(self.try_fill_(value))
    }

    /// Fallible [`Tensor::fill_`].
    pub fn try_fill_(&self, value: impl Into<Scalar>) -> Result<&Tensor> {
        let v = value.into();
        self.update("fill_", |x| {
            Tensor::try_full_on(&x.shape, v, x.dtype, x.device)
        })
    }

    /// [`Tensor::index_put`] in place (`x[i0, i1] = v`, or `+=` with `accumulate`).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros(&[2, 2]);
    /// let i = Tensor::from_vec(vec![1i64, 1], &[2]);
    /// x.index_put_(&[&i], &Tensor::ones(&[2, 2]), true);
    /// assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 2.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn index_put_(&self, indices: &[&Tensor], values: &Tensor, accumulate: bool) -> &Tensor {
        unwrap_or_panic(self.try_index_put_(indices, values, accumulate))
    }

    /// Fallible [`Tensor::index_put_`].
    pub fn try_index_put_(
        &self,
        indices: &[&Tensor],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<&Tensor> {
        // Bool masks are turned into indices (realized) once, before the update.
        let owned = super::indexing::mask_indices(indices)?;
        let refs: Vec<&Tensor> = owned.iter().collect();
        self.update("index_put_", |x| x.try_index_put(&refs, values, accumulate))
    }

    /// [`Tensor::masked_fill`] in place (the mask broadcasts to this tensor's shape).
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, -2.0, 3.0], &[3]);
    /// x.masked_fill_(&x.lt(0.0), 0.0);
    /// assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> &Tensor {
        unwrap_or_panic(self.try_masked_fill_(mask, value))
    }

    /// Fallible [`Tensor::masked_fill_`].
    pub fn try_masked_fill_(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<&Tensor> {
        let value = value.into();
        self.update("masked_fill_", |x| x.try_masked_fill(mask, value))
    }

    /// [`Tensor::masked_scatter`] in place (the mask broadcasts to this tensor's shape).
    /// Realizes the mask once, before the update is recorded.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros([3]);
    /// x.masked_scatter_(&Tensor::from_vec(vec![false, true, true], [3]), &Tensor::ones([2]));
    /// assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn masked_scatter_(&self, mask: &Tensor, source: &Tensor) -> &Tensor {
        unwrap_or_panic(self.try_masked_scatter_(mask, source))
    }

    /// Fallible [`Tensor::masked_scatter_`].
    pub fn try_masked_scatter_(&self, mask: &Tensor, source: &Tensor) -> Result<&Tensor> {
        let shape = self.shape().to_vec();
        let both = crate::shape::broadcast_shapes("masked_scatter_", &shape, mask.shape())?;
        if both != shape {
            return Err(KilnError::ShapeMismatch {
                op: "masked_scatter_",
                lhs: shape,
                rhs: mask.shape().to_vec(),
                detail: ": the mask must broadcast to the updated tensor's shape".into(),
            });
        }
        let picked = self.scattered_source(mask, source, &shape)?;
        self.update("masked_scatter_", |x| Tensor::try_where(mask, &picked, x))
    }

    /// Copies `src` (broadcast to this tensor's shape, converted to its dtype) into this
    /// tensor in place.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let p = Tensor::zeros(&[3]);
    /// p.realize().unwrap();
    /// let before = &p + 1.0; // recorded before the update: reads the old value
    /// p.copy_(&Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]));
    /// // Realizing `p` also runs `before` (a live reader of the old value) first.
    /// assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    /// assert_eq!(before.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn copy_(&self, src: &Tensor) -> &Tensor {
        unwrap_or_panic(self.try_copy_(src))
    }

    /// [`Tensor::scatter`] in place: `src` (a tensor or a number) written at the places
    /// `index` names along `dim`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros(&[4]);
    /// x.scatter_(0, &Tensor::from_vec(vec![3i64, 1], &[2]), 5.0);
    /// assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, 5.0, 0.0, 5.0]);
    /// ```
    #[track_caller]
    pub fn scatter_<'a>(&self, dim: isize, index: &Tensor, src: impl Into<Operand<'a>>) -> &Tensor {
        unwrap_or_panic(self.try_scatter_(dim, index, src))
    }

    /// Fallible [`Tensor::scatter_`].
    pub fn try_scatter_<'a>(
        &self,
        dim: isize,
        index: &Tensor,
        src: impl Into<Operand<'a>>,
    ) -> Result<&Tensor> {
        let src = src.into();
        self.update("scatter_", |x| x.try_scatter(dim, index, src.reborrow()))
    }

    /// [`Tensor::scatter_add`] in place.
    #[track_caller]
    pub fn scatter_add_(&self, dim: isize, index: &Tensor, src: &Tensor) -> &Tensor {
        unwrap_or_panic(self.try_scatter_add_(dim, index, src))
    }

    /// Fallible [`Tensor::scatter_add_`].
    pub fn try_scatter_add_(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<&Tensor> {
        self.update("scatter_add_", |x| x.try_scatter_add(dim, index, src))
    }

    /// [`Tensor::scatter_reduce`] in place.
    #[track_caller]
    pub fn scatter_reduce_(
        &self,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> &Tensor {
        unwrap_or_panic(self.try_scatter_reduce_(dim, index, src, reduce, include_self))
    }

    /// Fallible [`Tensor::scatter_reduce_`].
    pub fn try_scatter_reduce_(
        &self,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> Result<&Tensor> {
        self.update("scatter_reduce_", |x| {
            x.try_scatter_reduce(dim, index, src, reduce, include_self)
        })
    }

    /// [`Tensor::index_add`] in place.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros(&[3]);
    /// x.index_add_(0, &Tensor::from_vec(vec![1i64, 1], &[2]), &Tensor::ones(&[2]));
    /// assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, 2.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn index_add_(&self, dim: isize, index: &Tensor, source: &Tensor) -> &Tensor {
        unwrap_or_panic(self.try_index_add_(dim, index, source))
    }

    /// Fallible [`Tensor::index_add_`].
    pub fn try_index_add_(&self, dim: isize, index: &Tensor, source: &Tensor) -> Result<&Tensor> {
        self.update("index_add_", |x| x.try_index_add(dim, index, source))
    }

    /// [`Tensor::index_copy`] in place.
    #[track_caller]
    pub fn index_copy_(&self, dim: isize, index: &Tensor, source: &Tensor) -> &Tensor {
        unwrap_or_panic(self.try_index_copy_(dim, index, source))
    }

    /// Fallible [`Tensor::index_copy_`].
    pub fn try_index_copy_(&self, dim: isize, index: &Tensor, source: &Tensor) -> Result<&Tensor> {
        self.update("index_copy_", |x| x.try_index_copy(dim, index, source))
    }

    /// [`Tensor::index_fill`] in place.
    #[track_caller]
    pub fn index_fill_(&self, dim: isize, index: &Tensor, value: impl Into<Scalar>) -> &Tensor {
        unwrap_or_panic(self.try_index_fill_(dim, index, value))
    }

    /// Fallible [`Tensor::index_fill_`].
    pub fn try_index_fill_(
        &self,
        dim: isize,
        index: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<&Tensor> {
        let v = value.into();
        self.update("index_fill_", |x| x.try_index_fill(dim, index, v))
    }

    /// [`Tensor::index_reduce`] in place.
    #[track_caller]
    pub fn index_reduce_(
        &self,
        dim: isize,
        index: &Tensor,
        source: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> &Tensor {
        unwrap_or_panic(self.try_index_reduce_(dim, index, source, reduce, include_self))
    }

    /// Fallible [`Tensor::index_reduce_`].
    pub fn try_index_reduce_(
        &self,
        dim: isize,
        index: &Tensor,
        source: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> Result<&Tensor> {
        self.update("index_reduce_", |x| {
            x.try_index_reduce(dim, index, source, reduce, include_self)
        })
    }

    /// Fallible [`Tensor::copy_`].
    pub fn try_copy_(&self, src: &Tensor) -> Result<&Tensor> {
        self.update("copy_", |x| {
            x.require_same_device("copy_", src)?;
            let value = src.try_cast(x.dtype)?.expand_view(&x.shape)?;
            if x.is_realized() {
                return Ok(value);
            }
            // An unrealized `x` becomes its new value: were that a view of `src`, `x` would
            // share `src`'s buffer once realized, and a later in-place update of `x` would
            // overwrite `src`. A copy of its own, as PyTorch's `copy_` makes.
            Tensor::record(
                crate::graph::Op::Contiguous,
                &[&value],
                value.shape.clone(),
                value.dtype,
                value.device,
            )
        })
    }
}

/// Whether a result of dtype `from` may be stored in place into a `to` tensor (PyTorch's
/// rule: not from a higher category — float into integer, integer into bool).
fn can_store(from: DType, to: DType) -> bool {
    let cat = |d: DType| {
        if d == DType::Bool {
            0
        } else if d.is_float() {
            2
        } else {
            1
        }
    };
    cat(from) <= cat(to)
}
