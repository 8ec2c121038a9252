//! Indexed reads and writes: `gather`, `index_select`, `embedding` (an indexed load that
//! fuses into the kernels around it) and `scatter_add` (the gradient of a gather; sums are
//! deterministic on the CPU).

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::graph::Op;
use crate::shape::normalize_axis;

impl Tensor {
    /// The index tensor as i64, checked to be an integer tensor on this device.
    fn index_operand(&self, op: &'static str, index: &Tensor) -> Result<Tensor> {
        if !index.dtype().is_int() {
            return Err(KilnError::UnsupportedDType {
                op,
                dtype: index.dtype(),
                detail: ": indices must be an integer tensor".into(),
            });
        }
        if index.device() != self.device() {
            return Err(KilnError::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: index.device(),
            });
        }
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
        let n = index.shape()[0];
        let mut out = self.shape().to_vec();
        out[axis] = n;
        let mut along: Vec<isize> = vec![1; self.ndim()];
        along[axis] = n as isize;
        // The index broadcast over the other dimensions (stride 0: no copy).
        let expanded = index.try_reshape(&along)?.expand_view(&out)?;
        self.try_gather(dim, &expanded)
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
    /// `dim` (`out[index[i][j]][j] += src[i][j]` for `dim = 0`). Deterministic on the CPU.
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
        if src.shape() != index.shape() {
            return Err(KilnError::ShapeMismatch {
                op: "scatter_add",
                lhs: index.shape().to_vec(),
                rhs: src.shape().to_vec(),
                detail: ": the index and the values must have the same shape".into(),
            });
        }
        let sums = self.scattered(axis, &index, &src.try_cast(self.dtype())?)?;
        self.try_add(&sums)
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
        Tensor::record(
            Op::ScatterAdd { axis },
            &[index, &values],
            self.shape().to_vec(),
            acc,
            self.device(),
        )?
        .try_cast(self.dtype())
    }
}
