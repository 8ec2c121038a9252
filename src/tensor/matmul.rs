//! Matrix multiplication with PyTorch's rules: 1-D operands become a row/column vector,
//! batch dimensions broadcast. Operands are read through their views (a transposed operand
//! is strides, not a copy).

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::graph::Op;
use crate::shape::broadcast_shapes;

impl Tensor {
    /// `self @ rhs`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let b = a.t().matmul(&a); // aᵀa, read through strides
    /// assert_eq!(b.to_vec::<f32>().unwrap(), vec![10.0, 14.0, 14.0, 20.0]);
    /// ```
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_matmul(rhs))
    }

    /// Fallible [`Tensor::matmul`].
    pub fn try_matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.require_same_device("matmul", rhs)?;
        if self.ndim() == 0 || rhs.ndim() == 0 {
            return Err(KilnError::ShapeMismatch {
                op: "matmul",
                lhs: self.shape.clone(),
                rhs: rhs.shape.clone(),
                detail: ": both operands need at least one dimension".into(),
            });
        }
        if self.dtype == DType::Bool || rhs.dtype == DType::Bool {
            return Err(KilnError::UnsupportedDType {
                op: "matmul",
                dtype: DType::Bool,
                detail: ": cast to a numeric dtype".into(),
            });
        }
        let a = if self.ndim() == 1 {
            self.try_unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if rhs.ndim() == 1 {
            rhs.try_unsqueeze(-1)?
        } else {
            rhs.clone()
        };
        let (m, k) = (a.shape[a.ndim() - 2], a.shape[a.ndim() - 1]);
        let (k2, n) = (b.shape[b.ndim() - 2], b.shape[b.ndim() - 1]);
        if k != k2 {
            return Err(KilnError::ShapeMismatch {
                op: "matmul",
                lhs: self.shape.clone(),
                rhs: rhs.shape.clone(),
                detail: format!(": inner dimensions differ ({k} vs {k2})"),
            });
        }
        let batch = broadcast_shapes("matmul", &a.shape[..a.ndim() - 2], &b.shape[..b.ndim() - 2])
            .map_err(|_| KilnError::ShapeMismatch {
                op: "matmul",
                lhs: self.shape.clone(),
                rhs: rhs.shape.clone(),
                detail: ": batch dimensions cannot broadcast".into(),
            })?;
        let dtype = DType::promote(a.dtype, b.dtype);
        let with = |extra: [usize; 2]| -> Vec<usize> {
            let mut s = batch.clone();
            s.extend(extra);
            s
        };
        let a = a.try_cast(dtype)?.expand_view(&with([m, k]))?;
        let b = b.try_cast(dtype)?.expand_view(&with([k, n]))?;
        let out_shape = with([m, n]);
        let out = Tensor::record(Op::Matmul, &[&a, &b], out_shape, dtype, a.device)?;
        // 1-D operands lose their inserted dimension again.
        let mut final_shape: Vec<isize> = batch.iter().map(|&d| d as isize).collect();
        if self.ndim() > 1 {
            final_shape.push(m as isize);
        }
        if rhs.ndim() > 1 {
            final_shape.push(n as isize);
        }
        out.try_reshape(&final_shape)
    }
}
