//! Small linear-algebra composites with PyTorch's names: `outer`, `trace`, `cross`,
//! `addmm`, `kron` and `cdist`. Each records views, elementwise ops, reductions or a product, so it fuses,
//! runs on every device and is differentiated as its parts are.

use super::{Tensor, unwrap_or_panic};
use crate::error::{KilnError, Result};
use crate::shape::normalize_axis;

impl Tensor {
    /// PyTorch's `outer(v, w)`: the `[n, m]` matrix `v[i]·w[j]` of two 1-D tensors (a
    /// broadcast product, no matmul).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let v = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let w = Tensor::from_vec(vec![3.0f32, 4.0, 5.0], [3]);
    /// assert_eq!(v.outer(&w).to_vec::<f32>().unwrap(), vec![3.0, 4.0, 5.0, 6.0, 8.0, 10.0]);
    /// ```
    #[track_caller]
    pub fn outer(&self, other: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_outer(other))
    }

    /// Fallible [`Tensor::outer`].
    pub fn try_outer(&self, other: &Tensor) -> Result<Tensor> {
        if self.ndim() != 1 || other.ndim() != 1 {
            return Err(KilnError::ShapeMismatch {
                op: "outer",
                lhs: self.shape().to_vec(),
                rhs: other.shape().to_vec(),
                detail: ": both operands must be 1-D".into(),
            });
        }
        self.try_unsqueeze(1)?.try_mul(&other.try_unsqueeze(0)?)
    }

    /// PyTorch's `trace()`: the sum of a 2-D tensor's main diagonal (integers sum as i64).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::arange(0.0, 6.0, 1.0).reshape([2, 3]);
    /// assert_eq!(x.trace().item::<f32>().unwrap(), 4.0);
    /// ```
    #[track_caller]
    pub fn trace(&self) -> Tensor {
        unwrap_or_panic(self.try_trace())
    }

    /// Fallible [`Tensor::trace`].
    pub fn try_trace(&self) -> Result<Tensor> {
        if self.ndim() != 2 {
            return Err(KilnError::InvalidArgument {
                op: "trace",
                shape: self.shape().to_vec(),
                reason: "expected a 2-D tensor".into(),
            });
        }
        self.try_diagonal(0, 0, 1)?.try_sum(..)
    }

    /// PyTorch's `torch.linalg.cross(a, b, dim)`: the cross product of 3-vectors along
    /// `dim` of the two tensors broadcast together (that dimension must then have size 3).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0, 0.0], [3]);
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0, 0.0], [3]);
    /// assert_eq!(x.cross(&y, -1).to_vec::<f32>().unwrap(), vec![0.0, 0.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn cross(&self, other: &Tensor, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_cross(other, dim))
    }

    /// Fallible [`Tensor::cross`].
    pub fn try_cross(&self, other: &Tensor, dim: isize) -> Result<Tensor> {
        // Broadcast first, then find `dim` (as PyTorch's `linalg.cross`).
        let shape = crate::shape::broadcast_shapes("cross", self.shape(), other.shape())?;
        let d = normalize_axis("cross", dim, &shape)?;
        if shape[d] != 3 {
            return Err(KilnError::ShapeMismatch {
                op: "cross",
                lhs: self.shape().to_vec(),
                rhs: other.shape().to_vec(),
                detail: format!(": dimension {dim} must have size 3 after broadcasting"),
            });
        }
        let (a, b) = (
            self.try_broadcast_to(shape.as_slice())?,
            other.try_broadcast_to(shape.as_slice())?,
        );
        // c[i] = a[i+1]·b[i+2] - a[i+2]·b[i+1], indices mod 3: rolls by -1 and -2.
        let roll = |t: &Tensor, s: i64| t.try_roll(&[s], &[d as isize]);
        roll(&a, -1)?
            .try_mul(&roll(&b, -2)?)?
            .try_sub(&roll(&a, -2)?.try_mul(&roll(&b, -1)?)?)
    }

    /// PyTorch's `addmm(input, m1, m2, beta, alpha)`: `beta·input + alpha·(m1 @ m2)`, with
    /// `input` broadcast to the product's shape; `beta = 0` ignores `input` (its NaNs too),
    /// as PyTorch does.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let bias = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let m1 = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2]);
    /// let m2 = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], [2, 2]);
    /// assert_eq!(bias.addmm(&m1, &m2, 1.0, 2.0).to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
    /// ```
    #[track_caller]
    pub fn addmm(&self, m1: &Tensor, m2: &Tensor, beta: f64, alpha: f64) -> Tensor {
        unwrap_or_panic(self.try_addmm(m1, m2, beta, alpha))
    }

    /// Fallible [`Tensor::addmm`].
    pub fn try_addmm(&self, m1: &Tensor, m2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        if m1.ndim() != 2 || m2.ndim() != 2 {
            return Err(KilnError::ShapeMismatch {
                op: "addmm",
                lhs: m1.shape().to_vec(),
                rhs: m2.shape().to_vec(),
                detail: ": both matrices must be 2-D".into(),
            });
        }
        let product = m1.try_matmul(m2)?;
        let scaled = if alpha == 1.0 {
            product
        } else {
            product.try_mul(alpha)?
        };
        let input = self.try_broadcast_to(scaled.shape())?;
        if beta == 0.0 {
            return Ok(scaled);
        }
        let input = if beta == 1.0 {
            input
        } else {
            input.try_mul(beta)?
        };
        input.try_add(&scaled)
    }

    /// PyTorch's `kron(a, b)`: the Kronecker product. The operands are aligned at their
    /// last dimensions (the shorter one gets leading 1s) and each output dimension has
    /// size `a_i·b_i`: block `(i, j)` of a 2-D result is `a[i, j]·b`. One broadcast
    /// product and a reshape.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let a = Tensor::from_vec(vec![1i64, 2], [2]);
    /// let b = Tensor::from_vec(vec![1i64, 10, 100], [3]);
    /// assert_eq!(a.kron(&b).to_vec::<i64>().unwrap(), vec![1, 10, 100, 2, 20, 200]);
    /// let i = Tensor::eye(2, kiln::DType::I64);
    /// assert_eq!(i.kron(&Tensor::from_vec(vec![5i64], [1, 1])).to_vec::<i64>().unwrap(), vec![5, 0, 0, 5]);
    /// ```
    #[track_caller]
    pub fn kron(&self, other: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_kron(other))
    }

    /// Fallible [`Tensor::kron`].
    pub fn try_kron(&self, other: &Tensor) -> Result<Tensor> {
        let nd = self.ndim().max(other.ndim());
        let pad = |t: &Tensor| -> Vec<usize> {
            let mut s = vec![1; nd - t.ndim()];
            s.extend_from_slice(t.shape());
            s
        };
        let (sa, sb) = (pad(self), pad(other));
        // a as [a0, 1, a1, 1, ...] and b as [1, b0, 1, b1, ...]: their product interleaves.
        let spread = |s: &[usize], first: bool| -> Vec<isize> {
            s.iter()
                .flat_map(|&d| {
                    if first {
                        [d as isize, 1]
                    } else {
                        [1, d as isize]
                    }
                })
                .collect()
        };
        let out: Vec<isize> = sa
            .iter()
            .zip(&sb)
            .map(|(&a, &b)| (a * b) as isize)
            .collect();
        self.try_reshape(spread(&sa, true))?
            .try_mul(&other.try_reshape(spread(&sb, false))?)?
            .try_reshape(out)
    }

    /// PyTorch's `cdist(x1, x2, p)`: the `p`-norm distance between each row of `x1`
    /// (`[..., P, M]`) and each row of `x2` (`[..., R, M]`), as `[..., P, R]` (batch
    /// dimensions broadcast). `p` is any value ≥ 0, `f64::INFINITY` included (`p = 0`
    /// counts differing coordinates). One fused difference-and-reduce, no `x1·x2ᵀ`
    /// shortcut, so distances keep full precision; the gradient at a zero distance is 0,
    /// as PyTorch's.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let a = Tensor::from_vec(vec![0.0f32, 0.0, 1.0, 1.0], [2, 2]);
    /// let b = Tensor::from_vec(vec![3.0f32, 4.0], [1, 2]);
    /// assert_eq!(a.cdist(&b, 2.0).to_vec::<f32>().unwrap(), vec![5.0, 13f32.sqrt()]);
    /// assert_eq!(a.cdist(&b, 1.0).to_vec::<f32>().unwrap(), vec![7.0, 5.0]);
    /// assert_eq!(a.cdist(&b, f64::INFINITY).to_vec::<f32>().unwrap(), vec![4.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn cdist(&self, other: &Tensor, p: f64) -> Tensor {
        unwrap_or_panic(self.try_cdist(other, p))
    }

    /// Fallible [`Tensor::cdist`].
    pub fn try_cdist(&self, other: &Tensor, p: f64) -> Result<Tensor> {
        const OP: &str = "cdist";
        if self.ndim() < 2
            || other.ndim() < 2
            || self.shape()[self.ndim() - 1] != other.shape()[other.ndim() - 1]
        {
            return Err(KilnError::ShapeMismatch {
                op: OP,
                lhs: self.shape().to_vec(),
                rhs: other.shape().to_vec(),
                detail: ": both need at least 2 dimensions and the same last one".into(),
            });
        }
        if !self.dtype().is_float() || !other.dtype().is_float() {
            return Err(KilnError::UnsupportedDType {
                op: OP,
                dtype: if self.dtype().is_float() {
                    other.dtype()
                } else {
                    self.dtype()
                },
                detail: ": cdist needs float tensors".into(),
            });
        }
        if p.is_nan() || p < 0.0 {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: self.shape().to_vec(),
                reason: format!("p must be at least 0, not {p}"),
            });
        }
        // [..., P, 1, M] - [..., 1, R, M].
        let gap = self
            .try_unsqueeze(-2)?
            .try_sub(&other.try_unsqueeze(-3)?)?
            .try_abs()?;
        if p == 0.0 {
            return gap.try_ne(0)?.try_cast(gap.dtype())?.try_sum(-1);
        }
        if p == 1.0 {
            return gap.try_sum(-1);
        }
        if p.is_infinite() {
            return gap.try_max(-1);
        }
        let total = if p == 2.0 {
            gap.try_mul(&gap)?.try_sum(-1)?
        } else {
            // An equal coordinate contributes 0 through a `where` (its power's slope at 0
            // is infinite for p < 1, and inf·0 would be NaN).
            let same = gap.try_eq(0)?;
            let powered = Tensor::try_where(&same, 1.0, &gap)?.try_pow(p)?;
            Tensor::try_where(&same, 0.0, &powered)?.try_sum(-1)?
        };
        total.try_norm_root(p)
    }

    /// `self^(1/p)` for a sum of `p`-th powers (`p > 0`), with gradient 0 where the sum is
    /// 0 (not `0·inf`): the root is taken of 1 there, through a `where` whose other arm
    /// takes the gradient, and replaced by 0. `cdist` and `linalg::vector_norm` end so.
    pub(crate) fn try_norm_root(&self, p: f64) -> Result<Tensor> {
        let zero = self.try_eq(0)?;
        let safe = Tensor::try_where(&zero, 1.0, self)?;
        let root = if p == 2.0 {
            safe.try_sqrt()?
        } else {
            safe.try_pow(1.0 / p)?
        };
        Tensor::try_where(&zero, 0.0, &root)
    }
}
