//! Indexed reads and writes: `gather`, `index_select`, `embedding` (an indexed load that
//! fuses into the kernels around it) and `scatter_add` (the gradient of a gather; sums are
//! deterministic on the CPU).

use super::{Operand, Tensor, unwrap_or_panic};
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::graph::Op;
use crate::ops::ScatterReduce;
use crate::shape::normalize_axis;

impl Tensor {
    /// The index tensor as i64, checked to be an integer tensor on this device.
    pub(super) fn index_operand(&self, op: &'static str, index: &Tensor) -> Result<Tensor> {
        if !index.dtype().is_int() {
            return Err(KilnError::UnsupportedDType {
                op,
                dtype: index.dtype(),
                detail: ": indices must be an integer tensor".into(),
            });
        }
        self.require_same_device(op, index)?;
        index.try_cast(DType::I64)
    }

    /// Checks `index` against `self` for a gather/scatter along `axis`: same rank, and no
    /// larger than `self` off the axis.
    fn check_index_shape(&self, op: &'static str, index: &Tensor, axis: usize) -> Result<()> {
        let ok = index.ndim() == self.ndim()
            && (0..self.ndim()).all(|d| d == axis || index.shape()[d] <= self.shape()[d]);
        if ok {
            Ok(())
        } else {
            Err(KilnError::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: index.shape().to_vec(),
                detail: format!(
                    ": the index must have the same rank and be no larger off dimension {axis}"
                ),
            })
        }
    }

    /// PyTorch's `gather`: `out[i][j] = self[index[i][j]][j]` for `dim = 0` (the output has
    /// the index's shape). An index outside the dimension fails when realized
    /// ([`KilnError::IndexOutOfRange`]).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let i = Tensor::from_vec(vec![1i64, 0, 0, 0], &[2, 2]);
    /// assert_eq!(x.gather(1, &i).to_vec::<f32>().unwrap(), vec![2.0, 1.0, 3.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn gather(&self, dim: isize, index: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_gather(dim, index))
    }

    /// Fallible [`Tensor::gather`].
    pub fn try_gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let axis = normalize_axis("gather", dim, self.shape())?;
        let index = self.index_operand("gather", index)?;
        self.check_index_shape("gather", &index, axis)?;
        // The table seen through the index's extent off the axis (a view, no copy).
        let ranges: Vec<(isize, isize, isize)> = (0..self.ndim())
            .map(|d| {
                let end = if d == axis {
                    self.shape()[d]
                } else {
                    index.shape()[d]
                };
                (0, end as isize, 1)
            })
            .collect();
        let src = self.try_slice(&ranges)?;
        Tensor::record(
            Op::Gather { axis },
            &[&src, &index],
            index.shape().to_vec(),
            self.dtype(),
            self.device(),
        )
    }

    /// The entries of dimension `dim` at the positions `index` (1-D) lists, in that order.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    /// let rows = x.index_select(0, &Tensor::from_vec(vec![2i64, 0], &[2]));
    /// assert_eq!(rows.to_vec::<f32>().unwrap(), vec![5.0, 6.0, 1.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_index_select(dim, index))
    }

    /// Fallible [`Tensor::index_select`].
    pub fn try_index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let axis = normalize_axis("index_select", dim, self.shape())?;
        if index.ndim() != 1 {
            return Err(KilnError::InvalidShape {
                op: "index_select",
                shape: index.shape().to_vec(),
                requested: vec![-1],
                reason: "the index must be 1-D".into(),
            });
        }
        let index = self.index_operand("index_select", index)?;
        let mut out = self.shape().to_vec();
        out[axis] = index.numel();
        self.try_gather(dim, &spread_index(&index, axis, &out)?)
    }

    /// Rows of `weight` (`[vocabulary, dim]`) picked by the integer `ids` (any shape):
    /// the result has shape `ids.shape + [dim]`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let w = Tensor::from_vec(vec![0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5], &[3, 2]);
    /// let ids = Tensor::from_vec(vec![2i64, 2, 0], &[3]);
    /// assert_eq!(Tensor::embedding(&ids, &w).shape(), &[3, 2]);
    /// ```
    #[track_caller]
    pub fn embedding(ids: &Tensor, weight: &Tensor) -> Tensor {
        unwrap_or_panic(Tensor::try_embedding(ids, weight))
    }

    /// Fallible [`Tensor::embedding`].
    pub fn try_embedding(ids: &Tensor, weight: &Tensor) -> Result<Tensor> {
        if weight.ndim() != 2 {
            return Err(KilnError::InvalidShape {
                op: "embedding",
                shape: weight.shape().to_vec(),
                requested: vec![-1, -1],
                reason: "the weight must be 2-D (vocabulary, dim)".into(),
            });
        }
        let flat = ids.try_reshape([ids.numel() as isize])?;
        let rows = weight.try_index_select(0, &flat)?;
        let mut shape: Vec<isize> = ids.shape().iter().map(|&d| d as isize).collect();
        shape.push(weight.shape()[1] as isize);
        rows.try_reshape(&shape)
    }

    /// PyTorch's `scatter_add`: `self` plus `src` summed into the places `index` names along
    /// `dim` (`out[index[i][j]][j] += src[i][j]` for `dim = 0`; a `src` larger than the index
    /// is read in its index-shaped corner). Deterministic on the CPU.
    ///
    /// ```
    /// use kiln::{DType, Tensor};
    /// let z = Tensor::zeros(&[3]);
    /// let i = Tensor::from_vec(vec![0i64, 2, 0], &[3]);
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    /// assert_eq!(z.scatter_add(0, &i, &v).to_vec::<f32>().unwrap(), vec![4.0, 0.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_scatter_add(dim, index, src))
    }

    /// Fallible [`Tensor::scatter_add`].
    pub fn try_scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let axis = normalize_axis("scatter_add", dim, self.shape())?;
        let index = self.index_operand("scatter_add", index)?;
        self.check_index_shape("scatter_add", &index, axis)?;
        let src = self.scatter_source("scatter_add", &index, src)?;
        let sums = self.scattered(axis, &index, &src)?;
        self.try_add(&sums)
    }

    /// `src` cut to `index`'s shape (PyTorch reads only that corner of a larger `src`) and
    /// cast to this tensor's dtype. `src` must have the index's rank and be no smaller.
    fn scatter_source(&self, op: &'static str, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.require_same_device(op, src)?;
        let fits = src.ndim() == index.ndim()
            && src.shape().iter().zip(index.shape()).all(|(&s, &i)| i <= s);
        if !fits {
            return Err(KilnError::ShapeMismatch {
                op,
                lhs: index.shape().to_vec(),
                rhs: src.shape().to_vec(),
                detail: ": the values must have the index's rank and be no smaller".into(),
            });
        }
        let src = if src.shape() == index.shape() {
            src.clone()
        } else {
            let ranges: Vec<(isize, isize, isize)> =
                index.shape().iter().map(|&n| (0, n as isize, 1)).collect();
            src.try_slice(&ranges)?
        };
        src.try_cast(self.dtype())
    }

    /// PyTorch's `scatter_reduce`: `src` reduced into the places `index` names along `dim`
    /// (`out[index[i][j]][j] = reduce(out[index[i][j]][j], src[i][j])` for `dim = 0`), with
    /// `reduce` one of `"sum"`, `"prod"`, `"mean"`, `"amax"` and `"amin"`. With
    /// `include_self` the reduction starts from `self`'s value; without, places that receive
    /// values start from the reduction's identity and the others keep `self`'s. `"mean"`
    /// divides by the number of values reduced (plus one with `include_self`), flooring for
    /// integers; `"amax"` and `"amin"` propagate NaN. On the CPU values combine in the
    /// index's row-major order, whatever the thread count; on CUDA through atomics (sums
    /// and products of floats may round differently from run to run). Half types reduce in
    /// f32 and round once. The gradient follows PyTorch's: `amax`/`amin` share it evenly
    /// among every value equal to the result (`self`'s included), `prod` is exact with
    /// zeros.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![5.0f32, 1.0, 7.0], &[3]);
    /// let i = Tensor::from_vec(vec![0i64, 0, 2, 2], &[4]);
    /// let v = Tensor::from_vec(vec![3.0f32, 9.0, 2.0, 4.0], &[4]);
    /// let m = x.scatter_reduce(0, &i, &v, "amax", true);
    /// assert_eq!(m.to_vec::<f32>().unwrap(), vec![9.0, 1.0, 7.0]);
    /// let p = x.scatter_reduce(0, &i, &v, "prod", false);
    /// assert_eq!(p.to_vec::<f32>().unwrap(), vec![27.0, 1.0, 8.0]);
    /// let a = x.scatter_reduce(0, &i, &v, "mean", true);
    /// assert_eq!(a.to_vec::<f32>().unwrap(), vec![17.0 / 3.0, 1.0, 13.0 / 3.0]);
    /// ```
    #[track_caller]
    pub fn scatter_reduce(
        &self,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> Tensor {
        unwrap_or_panic(self.try_scatter_reduce(dim, index, src, reduce, include_self))
    }

    /// Fallible [`Tensor::scatter_reduce`].
    pub fn try_scatter_reduce(
        &self,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> Result<Tensor> {
        const OP: &str = "scatter_reduce";
        let axis = normalize_axis(OP, dim, self.shape())?;
        let index = self.index_operand(OP, index)?;
        self.check_index_shape(OP, &index, axis)?;
        let src = self.scatter_source(OP, &index, src)?;
        let r = match reduce {
            "sum" | "mean" => ScatterReduce::Sum,
            "prod" => ScatterReduce::Prod,
            "amax" => ScatterReduce::Amax,
            "amin" => ScatterReduce::Amin,
            _ => {
                return Err(KilnError::InvalidArgument {
                    op: OP,
                    shape: self.shape().to_vec(),
                    reason: format!(
                        "reduce must be \"sum\", \"prod\", \"mean\", \"amax\" or \"amin\", not {reduce:?}"
                    ),
                });
            }
        };
        if reduce == "mean" && self.dtype() == DType::Bool {
            return Err(KilnError::UnsupportedDType {
                op: OP,
                dtype: DType::Bool,
                detail: ": a mean of booleans".into(),
            });
        }
        let acc = if self.dtype().is_half() {
            DType::F32
        } else {
            self.dtype()
        };
        let (base, values) = (self.try_cast(acc)?, src.try_cast(acc)?);
        // How many values each place receives (i64: exact).
        let counts = || -> Result<Tensor> {
            let ones = Tensor::try_full_on(index.shape(), 1i64, DType::I64, self.device())?;
            base.scatter_reduced(axis, ScatterReduce::Sum, &index, &ones, false)
        };
        let out = if reduce == "mean" {
            let sums = base.scatter_reduced(axis, r, &index, &values, include_self)?;
            let n = counts()?;
            let n = if include_self { n.try_add(1i64)? } else { n };
            let d = n.try_clamp_min(1i64)?.try_cast(acc)?;
            let q = if acc.is_float() {
                sums.try_div(&d)?
            } else {
                sums.try_floor_divide(&d)?
            };
            if include_self {
                q
            } else {
                Tensor::try_where(&n.try_gt(0i64)?, &q, &base)?
            }
        } else {
            let s = base.scatter_reduced(axis, r, &index, &values, include_self)?;
            if include_self {
                s
            } else {
                Tensor::try_where(&counts()?.try_gt(0i64)?, &s, &base)?
            }
        };
        out.try_cast(self.dtype())
    }

    /// PyTorch's `scatter`: `self` with `src`'s values written at the places `index` names
    /// along `dim` (`out[index[i][j]][j] = src[i][j]` for `dim = 0`); `src` is a tensor (read
    /// in its index-shaped corner) or a number written at every place, PyTorch's
    /// `scatter(dim, index, value)`. Where several values
    /// land in one place the last in the index's row-major order wins, on every device
    /// (PyTorch leaves the pick undefined), and only that value receives the place's
    /// gradient (PyTorch sends it to all of them).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros(&[2, 3]);
    /// let i = Tensor::from_vec(vec![2i64, 0, 1, 1], &[2, 2]);
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let y = x.scatter(1, &i, &v);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 0.0, 1.0, 0.0, 4.0, 0.0]);
    /// let z = x.scatter(1, &i, 7.0);
    /// assert_eq!(z.to_vec::<f32>().unwrap(), vec![7.0, 0.0, 7.0, 0.0, 7.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn scatter<'a>(&self, dim: isize, index: &Tensor, src: impl Into<Operand<'a>>) -> Tensor {
        unwrap_or_panic(self.try_scatter(dim, index, src))
    }

    /// Fallible [`Tensor::scatter`].
    pub fn try_scatter<'a>(
        &self,
        dim: isize,
        index: &Tensor,
        src: impl Into<Operand<'a>>,
    ) -> Result<Tensor> {
        const OP: &str = "scatter";
        let axis = normalize_axis(OP, dim, self.shape())?;
        let index = self.index_operand(OP, index)?;
        self.check_index_shape(OP, &index, axis)?;
        let src = match src.into() {
            Operand::Ref(t) => self.scatter_source(OP, &index, t)?,
            Operand::Owned(t) => self.scatter_source(OP, &index, &t)?,
            Operand::Scalar(v) => {
                Tensor::try_full_on(index.shape(), v, self.dtype(), self.device())?
            }
        };
        let n = index.numel();
        if n == 0 {
            return Ok(self.clone());
        }
        // Each place's last writer: the largest row-major position aimed at it (i64::MIN
        // where none is), then that position's value.
        let start = crate::dtype::Scalar::Int(0);
        let step = crate::dtype::Scalar::Int(1);
        let positions = Tensor::generate(
            crate::ops::Generator::Arange { start, step },
            &[n],
            DType::I64,
            self.device(),
        )?
        .try_reshape(index.shape())?;
        let last = self.scatter_reduced(axis, ScatterReduce::Amax, &index, &positions, false)?;
        let flat = [self.numel() as isize];
        let picked = src
            .try_reshape([n as isize])?
            .try_gather(0, &last.try_clamp_min(0i64)?.try_reshape(flat)?)?
            .try_reshape(self.shape())?;
        Tensor::try_where(&last.try_ge(0i64)?, &picked, self)
    }

    /// The 1-D `index` of an `index_*` op along `dim`, broadcast over `source`'s shape (the
    /// scatter index that op is), after checking `source` is this tensor's shape but
    /// `index.len()` along `dim`.
    fn index_places(
        &self,
        op: &'static str,
        dim: isize,
        index: &Tensor,
        source: &[usize],
    ) -> Result<(isize, Tensor)> {
        let axis = normalize_axis(op, dim, self.shape())?;
        if index.ndim() > 1 {
            return Err(KilnError::InvalidShape {
                op,
                shape: index.shape().to_vec(),
                requested: vec![-1],
                reason: "the index must be 1-D".into(),
            });
        }
        let index = self.index_operand(op, index)?;
        let n = index.numel();
        let mut want = self.shape().to_vec();
        want[axis] = n;
        if source != want.as_slice() {
            return Err(KilnError::ShapeMismatch {
                op,
                lhs: want,
                rhs: source.to_vec(),
                detail: format!(
                    ": the source must have the tensor's shape with the index's length ({n}) along dimension {axis}"
                ),
            });
        }
        Ok((axis as isize, spread_index(&index, axis, source)?))
    }

    /// PyTorch's `index_add`: `source`'s slices added at the positions `index` (1-D) names
    /// along `dim` (`out[index[i]] += source[i]` for `dim = 0`; repeated positions add up).
    /// PyTorch's `alpha=a` is `&source * a`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::ones(&[3, 2]);
    /// let s = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let i = Tensor::from_vec(vec![2i64, 0], &[2]);
    /// assert_eq!(x.index_add(0, &i, &s).to_vec::<f32>().unwrap(), vec![4.0, 5.0, 1.0, 1.0, 2.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn index_add(&self, dim: isize, index: &Tensor, source: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_index_add(dim, index, source))
    }

    /// Fallible [`Tensor::index_add`].
    pub fn try_index_add(&self, dim: isize, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        let (d, places) = self.index_places("index_add", dim, index, source.shape())?;
        self.try_scatter_add(d, &places, source)
    }

    /// PyTorch's `index_copy`: `source`'s slices written at the positions `index` (1-D)
    /// names along `dim` (`out[index[i]] = source[i]` for `dim = 0`; where a position
    /// repeats, the last slice wins, as in [`Tensor::scatter`]).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros(&[3, 2]);
    /// let s = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let i = Tensor::from_vec(vec![2i64, 0], &[2]);
    /// assert_eq!(x.index_copy(0, &i, &s).to_vec::<f32>().unwrap(), vec![3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
    /// ```
    #[track_caller]
    pub fn index_copy(&self, dim: isize, index: &Tensor, source: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_index_copy(dim, index, source))
    }

    /// Fallible [`Tensor::index_copy`].
    pub fn try_index_copy(&self, dim: isize, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        let (d, places) = self.index_places("index_copy", dim, index, source.shape())?;
        self.try_scatter(d, &places, source)
    }

    /// PyTorch's `index_fill`: `value` written over the whole slices `index` (1-D) names
    /// along `dim`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    /// let i = Tensor::from_vec(vec![0i64, 2], &[2]);
    /// assert_eq!(x.index_fill(1, &i, -1.0).to_vec::<f32>().unwrap(), vec![-1.0, 2.0, -1.0, -1.0, 5.0, -1.0]);
    /// ```
    #[track_caller]
    pub fn index_fill(&self, dim: isize, index: &Tensor, value: impl Into<Scalar>) -> Tensor {
        unwrap_or_panic(self.try_index_fill(dim, index, value))
    }

    /// Fallible [`Tensor::index_fill`].
    pub fn try_index_fill(
        &self,
        dim: isize,
        index: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor> {
        let axis = normalize_axis("index_fill", dim, self.shape())?;
        let mut shape = self.shape().to_vec();
        shape[axis] = index.numel();
        let (d, places) = self.index_places("index_fill", dim, index, &shape)?;
        self.try_scatter(d, &places, value.into())
    }

    /// PyTorch's `index_reduce`: `source`'s slices reduced into the positions `index` (1-D)
    /// names along `dim`, with `reduce` one of `"prod"`, `"mean"`, `"amax"` and `"amin"`
    /// and `include_self` as in [`Tensor::scatter_reduce`].
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::full(&[3, 2], 2.0);
    /// let s = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    /// let i = Tensor::from_vec(vec![0i64, 2, 0], &[3]);
    /// let y = x.index_reduce(0, &i, &s, "prod", true);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![10.0, 24.0, 2.0, 2.0, 6.0, 8.0]);
    /// ```
    #[track_caller]
    pub fn index_reduce(
        &self,
        dim: isize,
        index: &Tensor,
        source: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> Tensor {
        unwrap_or_panic(self.try_index_reduce(dim, index, source, reduce, include_self))
    }

    /// Fallible [`Tensor::index_reduce`].
    pub fn try_index_reduce(
        &self,
        dim: isize,
        index: &Tensor,
        source: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> Result<Tensor> {
        if !matches!(reduce, "prod" | "mean" | "amax" | "amin") {
            return Err(KilnError::InvalidArgument {
                op: "index_reduce",
                shape: self.shape().to_vec(),
                reason: format!(
                    "reduce must be \"prod\", \"mean\", \"amax\" or \"amin\", not {reduce:?}"
                ),
            });
        }
        let (d, places) = self.index_places("index_reduce", dim, index, source.shape())?;
        self.try_scatter_reduce(d, &places, source, reduce, include_self)
    }

    /// PyTorch's `index_put`: `values` written at the places that `indices` name in this
    /// tensor's leading dimensions (`x[i0, i1] = v`), or added there when `accumulate`
    /// (`x[i0, i1] += v`, repeated places summing). The index tensors are integers
    /// (negative ones count from the end) broadcast together, or a bool mask standing for
    /// the dimensions it covers (its [`Tensor::nonzero`] columns: realized when called);
    /// `values` broadcasts to the indexed shape (the indices' shape, then the dimensions
    /// not indexed) and has this tensor's dtype. An index outside its dimension fails when
    /// realized ([`KilnError::IndexOutOfRange`]). Where a place repeats without
    /// `accumulate`, the last value in the indices' row-major order wins (PyTorch leaves it
    /// undefined). Gradients reach this tensor (except at overwritten places) and
    /// `values`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros(&[3, 3]);
    /// let rows = Tensor::from_vec(vec![0i64, 2], &[2]);
    /// let cols = Tensor::from_vec(vec![1i64, -1], &[2]);
    /// let y = x.index_put(&[&rows, &cols], &Tensor::from_vec(vec![5.0f32, 7.0], &[2]), false);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0]);
    /// ```
    #[track_caller]
    pub fn index_put(&self, indices: &[&Tensor], values: &Tensor, accumulate: bool) -> Tensor {
        unwrap_or_panic(self.try_index_put(indices, values, accumulate))
    }

    /// Fallible [`Tensor::index_put`].
    pub fn try_index_put(
        &self,
        indices: &[&Tensor],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        const OP: &str = "index_put";
        let idx = mask_indices(indices)?
            .iter()
            .map(|t| self.index_operand(OP, t))
            .collect::<Result<Vec<Tensor>>>()?;
        let k = idx.len();
        if k == 0 || k > self.ndim() {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: self.shape().to_vec(),
                reason: format!(
                    "{k} index dimensions for a tensor of {} dimensions (at least 1, at most that)",
                    self.ndim()
                ),
            });
        }
        let mut bshape = idx[0].shape().to_vec();
        for t in &idx[1..] {
            bshape = crate::shape::broadcast_shapes(OP, &bshape, t.shape())?;
        }
        if values.dtype() != self.dtype() {
            return Err(KilnError::DTypeMismatch {
                op: OP,
                lhs: self.dtype(),
                rhs: values.dtype(),
            });
        }
        let (lead, trail) = self.shape().split_at(k);
        let flat = flat_places(&idx, lead, &bshape, self.device())?;
        let places: usize = bshape.iter().product();
        let rest: usize = trail.iter().product();
        let mut vshape = bshape.clone();
        vshape.extend_from_slice(trail);
        let vals = values
            .try_broadcast_to(vshape.as_slice())?
            .try_reshape([places as isize, rest as isize])?;
        let at = flat
            .try_reshape([places as isize, 1])?
            .expand_view(&[places, rest])?;
        let rows = self.try_reshape([lead.iter().product::<usize>() as isize, rest as isize])?;
        let out = if accumulate {
            rows.try_scatter_add(0, &at, &vals)?
        } else {
            rows.try_scatter(0, &at, &vals)?
        };
        out.try_reshape(self.shape().iter().map(|&d| d as isize).collect::<Vec<_>>())
    }

    /// `values` reduced by `reduce` into a tensor of this tensor's shape at `index` along
    /// `axis`, starting from `self` (`include_self`, which must then have `values`' dtype)
    /// or from the reduction's identity. The result has `values`' dtype.
    pub(crate) fn scatter_reduced(
        &self,
        axis: usize,
        reduce: ScatterReduce,
        index: &Tensor,
        values: &Tensor,
        include_self: bool,
    ) -> Result<Tensor> {
        let op = Op::Scatter { axis, reduce };
        let inputs: Vec<&Tensor> = if include_self {
            vec![index, values, self]
        } else {
            vec![index, values]
        };
        Tensor::record(
            op,
            &inputs,
            self.shape().to_vec(),
            values.dtype(),
            self.device(),
        )
    }

    /// A zero tensor of this tensor's shape with `values` summed in at `index` along `axis`
    /// (computed in at least f32: half-precision sums would lose the small contributions).
    pub(crate) fn scattered(&self, axis: usize, index: &Tensor, values: &Tensor) -> Result<Tensor> {
        let acc = if values.dtype().is_half() {
            DType::F32
        } else {
            values.dtype()
        };
        let values = values.try_cast(acc)?;
        self.scatter_reduced(axis, ScatterReduce::Sum, index, &values, false)?
            .try_cast(self.dtype())
    }
}

/// `indices` with each bool mask replaced by its [`Tensor::nonzero`] columns (one integer
/// index per dimension it covers, as PyTorch's advanced indexing reads a mask); realizes
/// the masks.
pub(crate) fn mask_indices(indices: &[&Tensor]) -> Result<Vec<Tensor>> {
    let mut out = Vec::with_capacity(indices.len());
    for t in indices {
        if t.dtype() == DType::Bool {
            let nz = t.try_nonzero()?;
            for c in 0..t.ndim() as isize {
                out.push(nz.try_slice_dim(1, c, c + 1, 1)?.try_reshape([-1])?);
            }
        } else {
            out.push((*t).clone());
        }
    }
    Ok(out)
}

/// A tensor of `index`'s shape that is `fill` everywhere and fails when realized
/// ([`KilnError::IndexOutOfRange`]) if an element of `index` (i64) lies outside
/// `0..size`: a gather of a constant at every index. Ops whose result alone would not
/// notice a bad index (a comparison, a flattened place that aliases another row) add or
/// multiply it in, so they raise where PyTorch does.
pub(crate) fn range_guard(index: &Tensor, size: usize, fill: i64) -> Result<Tensor> {
    let constant = Tensor::try_full_on([size], fill, DType::I64, index.device())?;
    constant
        .try_gather(0, &index.try_reshape([-1])?)?
        .try_reshape(index.shape())
}

/// The flat (row-major) place of each index tuple in dimensions of `sizes`: `idx[j]` (i64)
/// indexes dimension `j`, all broadcast to `bshape`. Negative indices count from the end,
/// and an index outside `-n..n` fails when realized, checked per dimension (a flat place
/// alone could alias another row).
pub(crate) fn flat_places(
    idx: &[Tensor],
    sizes: &[usize],
    bshape: &[usize],
    device: crate::Device,
) -> Result<Tensor> {
    let mut flat = Tensor::try_full_on(bshape, 0i64, DType::I64, device)?;
    let mut stride = 1i64;
    for (t, &n) in idx.iter().zip(sizes).rev() {
        let wrapped = Tensor::try_where(&t.try_lt(0)?, &t.try_add(n as i64)?, t)?;
        let term = wrapped
            .try_add(&range_guard(&wrapped, n, 0)?)?
            .try_broadcast_to(bshape)?
            .try_mul(stride)?;
        flat = flat.try_add(&term)?;
        stride *= n as i64;
    }
    Ok(flat)
}

/// The 1-D (or 0-D) `index` laid along `axis` and broadcast over the other dimensions of
/// `shape` (stride 0: no copy); `shape[axis]` is the index's length.
fn spread_index(index: &Tensor, axis: usize, shape: &[usize]) -> Result<Tensor> {
    let mut along: Vec<isize> = vec![1; shape.len()];
    along[axis] = index.numel() as isize;
    index.try_reshape(&along)?.expand_view(shape)
}
