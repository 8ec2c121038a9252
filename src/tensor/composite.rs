//! PyTorch ops kiln records as compositions of its primitives (views, `cat`, `where`,
//! comparisons, arange): `roll`, `diagonal`, `diag`, the `logical_*` family and
//! `linspace`. Each is differentiated, fused and run on every device as its parts are.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::shape::normalize_axis;

impl Tensor {
    /// Rotates elements along `dims` by `shifts` (PyTorch's `torch.roll`): element `i` of
    /// a dimension of size `n` moves to `(i + shift) mod n`. With no `dims` the tensor is
    /// rolled as if flattened (one shift). A copy: two slices joined by `cat`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::arange(0, 6, 1).reshape([2, 3]);
    /// assert_eq!(x.roll(&[1], &[1]).to_vec::<i64>().unwrap(), vec![2, 0, 1, 5, 3, 4]);
    /// assert_eq!(x.roll(&[-1], &[]).to_vec::<i64>().unwrap(), vec![1, 2, 3, 4, 5, 0]);
    /// ```
    #[track_caller]
    pub fn roll(&self, shifts: &[i64], dims: &[isize]) -> Tensor {
        unwrap_or_panic(self.try_roll(shifts, dims))
    }

    /// Fallible [`Tensor::roll`].
    pub fn try_roll(&self, shifts: &[i64], dims: &[isize]) -> Result<Tensor> {
        if dims.is_empty() {
            if shifts.len() != 1 {
                return Err(KilnError::InvalidArgument {
                    op: "roll",
                    shape: self.shape.clone(),
                    reason: format!(
                        "without dims, roll takes one shift (the flattened tensor's), not {}",
                        shifts.len()
                    ),
                });
            }
            let dims: Vec<isize> = self.shape.iter().map(|&d| d as isize).collect();
            return self
                .try_reshape([-1])?
                .try_roll(shifts, &[0])?
                .try_reshape(dims.as_slice());
        }
        if shifts.len() != dims.len() {
            return Err(KilnError::InvalidArgument {
                op: "roll",
                shape: self.shape.clone(),
                reason: format!(
                    "{} shifts for {} dims: give one shift per dim",
                    shifts.len(),
                    dims.len()
                ),
            });
        }
        let mut out = self.clone();
        for (&shift, &dim) in shifts.iter().zip(dims) {
            let d = normalize_axis("roll", dim, &self.shape)?;
            let n = self.shape[d] as i64;
            if n == 0 {
                continue;
            }
            let s = shift.rem_euclid(n);
            if s == 0 {
                continue;
            }
            let cut = (n - s) as isize;
            let tail = out.try_slice_dim(d as isize, cut, n as isize, 1)?;
            let head = out.try_slice_dim(d as isize, 0, cut, 1)?;
            out = Tensor::try_cat(&[&tail, &head], d as isize)?;
        }
        if out.node_key() == self.node_key() {
            // No dimension moved: still a new tensor, as every op returns.
            out = self.try_contiguous()?;
        }
        Ok(out)
    }

    /// The diagonal of the matrices over `dim1` and `dim2`, `offset` above the main one
    /// (below for a negative offset), as PyTorch's `torch.diagonal`: those two dimensions
    /// are removed and the diagonal is appended last. Recorded as a strided slice of the
    /// flattened pair (a copy when the pair is not contiguous).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::arange(0, 12, 1).reshape([3, 4]);
    /// assert_eq!(x.diagonal(0, 0, 1).to_vec::<i64>().unwrap(), vec![0, 5, 10]);
    /// assert_eq!(x.diagonal(1, 0, 1).to_vec::<i64>().unwrap(), vec![1, 6, 11]);
    /// assert_eq!(x.diagonal(-1, 0, 1).to_vec::<i64>().unwrap(), vec![4, 9]);
    /// ```
    #[track_caller]
    pub fn diagonal(&self, offset: i64, dim1: isize, dim2: isize) -> Tensor {
        unwrap_or_panic(self.try_diagonal(offset, dim1, dim2))
    }

    /// Fallible [`Tensor::diagonal`].
    pub fn try_diagonal(&self, offset: i64, dim1: isize, dim2: isize) -> Result<Tensor> {
        let nd = self.ndim();
        let (a, b) = (
            normalize_axis("diagonal", dim1, &self.shape)?,
            normalize_axis("diagonal", dim2, &self.shape)?,
        );
        if a == b {
            return Err(KilnError::InvalidArgument {
                op: "diagonal",
                shape: self.shape.clone(),
                reason: format!("dim1 and dim2 are the same dimension ({a})"),
            });
        }
        let mut perm: Vec<isize> = (0..nd)
            .filter(|&d| d != a && d != b)
            .map(|d| d as isize)
            .collect();
        perm.push(a as isize);
        perm.push(b as isize);
        let moved = self.try_permute(perm.as_slice())?;
        // Cut the rows or columns before the wanted diagonal, then keep a square.
        let (rows, cols) = (self.shape[a] as i64, self.shape[b] as i64);
        let (r0, c0) = if offset >= 0 {
            (0, offset)
        } else {
            (-offset, 0)
        };
        let m = (rows - r0).min(cols - c0).max(0);
        let (r, c) = (nd as isize - 2, nd as isize - 1);
        let square = moved
            .try_slice_dim(r, r0.min(rows) as isize, (r0 + m).min(rows) as isize, 1)?
            .try_slice_dim(c, c0.min(cols) as isize, (c0 + m).min(cols) as isize, 1)?;
        let mut flat: Vec<isize> = square.shape[..nd - 2].iter().map(|&d| d as isize).collect();
        flat.push((m * m) as isize);
        let step = (m + 1).max(1) as isize;
        square.try_reshape(flat.as_slice())?.try_slice_dim(
            nd as isize - 2,
            0,
            (m * m) as isize,
            step,
        )
    }

    /// PyTorch's `torch.diag`: of a vector, the square matrix with it on diagonal `offset`
    /// (zeros elsewhere); of a matrix, its diagonal `offset` ([`Tensor::diagonal`]).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let v = Tensor::from_vec(vec![1i64, 2], [2]);
    /// assert_eq!(v.diag(1).to_vec::<i64>().unwrap(), vec![0, 1, 0, 0, 0, 2, 0, 0, 0]);
    /// ```
    #[track_caller]
    pub fn diag(&self, offset: i64) -> Tensor {
        unwrap_or_panic(self.try_diag(offset))
    }

    /// Fallible [`Tensor::diag`]: other ranks are refused.
    pub fn try_diag(&self, offset: i64) -> Result<Tensor> {
        match self.ndim() {
            2 => self.try_diagonal(offset, 0, 1),
            1 => {
                let n = self.shape[0];
                let k = offset.unsigned_abs() as usize;
                let size = n + k;
                let idx = Tensor::try_arange(0, size as i64, 1, DType::I64)?.try_to(self.device)?;
                let rows = idx.try_reshape([size as isize, 1])?;
                let cols = idx.try_reshape([1, size as isize])?;
                let on = cols.try_sub(&rows)?.try_eq(offset)?;
                // Row i of the matrix reads element i (offset ≥ 0), column j element j.
                let padded = self.try_pad(&[(0, k)], 0)?;
                let values = if offset >= 0 {
                    padded.try_reshape([size as isize, 1])?
                } else {
                    padded.try_reshape([1, size as isize])?
                };
                let zero = Tensor::try_full_on((), 0, self.dtype, self.device)?;
                Tensor::try_where(&on, &values, &zero)
            }
            _ => Err(KilnError::InvalidArgument {
                op: "diag",
                shape: self.shape.clone(),
                reason: "diag takes a vector or a matrix".into(),
            }),
        }
    }

    /// Whether each element is nonzero (NaN counts as nonzero), as a bool tensor.
    fn truthy(&self) -> Result<Tensor> {
        if self.dtype == DType::Bool {
            Ok(self.clone())
        } else {
            self.try_ne(0)
        }
    }

    /// Elementwise logical AND of the truth values of `self` and `other` (nonzero is
    /// true), broadcast, as bool: PyTorch's `logical_and`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let a = Tensor::from_vec(vec![0.0f32, 1.0, -2.0, f32::NAN], [4]);
    /// let b = Tensor::from_vec(vec![true, true, false, true], [4]);
    /// assert_eq!(a.logical_and(&b).to_vec::<bool>().unwrap(), vec![false, true, false, true]);
    /// assert_eq!(a.logical_or(&b).to_vec::<bool>().unwrap(), vec![true, true, true, true]);
    /// assert_eq!(a.logical_xor(&b).to_vec::<bool>().unwrap(), vec![true, false, true, false]);
    /// assert_eq!(a.logical_not().to_vec::<bool>().unwrap(), vec![true, false, false, false]);
    /// ```
    #[track_caller]
    pub fn logical_and(&self, other: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_logical_and(other))
    }

    /// Fallible [`Tensor::logical_and`].
    pub fn try_logical_and(&self, other: &Tensor) -> Result<Tensor> {
        Tensor::try_where(&self.truthy()?, &other.truthy()?, false)
    }

    /// Elementwise logical OR (PyTorch's `logical_or`); see [`Tensor::logical_and`].
    #[track_caller]
    pub fn logical_or(&self, other: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_logical_or(other))
    }

    /// Fallible [`Tensor::logical_or`].
    pub fn try_logical_or(&self, other: &Tensor) -> Result<Tensor> {
        Tensor::try_where(&self.truthy()?, true, &other.truthy()?)
    }

    /// Elementwise logical XOR (PyTorch's `logical_xor`); see [`Tensor::logical_and`].
    #[track_caller]
    pub fn logical_xor(&self, other: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_logical_xor(other))
    }

    /// Fallible [`Tensor::logical_xor`].
    pub fn try_logical_xor(&self, other: &Tensor) -> Result<Tensor> {
        self.truthy()?.try_ne(&other.truthy()?)
    }

    /// Elementwise logical NOT: whether each element is zero (PyTorch's `logical_not`).
    #[track_caller]
    pub fn logical_not(&self) -> Tensor {
        unwrap_or_panic(self.try_logical_not())
    }

    /// Fallible [`Tensor::logical_not`].
    pub fn try_logical_not(&self) -> Result<Tensor> {
        Tensor::try_where(&self.truthy()?, false, true)
    }

    /// `steps` values from `start` to `end` inclusive, evenly spaced, as PyTorch's
    /// `torch.linspace` computes them in `dtype` (a float type): with
    /// `step = (end - start) / (steps - 1)` rounded to `dtype`, the first half is
    /// `start + i·step` and the second `end - (steps - 1 - i)·step`, each rounded once, so
    /// both ends are exact (f32: the same bits as PyTorch's CPU kernel in the tests).
    ///
    /// ```
    /// use kiln::{DType, Tensor};
    /// let t = Tensor::linspace(0.0, 1.0, 5, DType::F32);
    /// assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    /// ```
    #[track_caller]
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType) -> Tensor {
        unwrap_or_panic(Tensor::try_linspace(start, end, steps, dtype))
    }

    /// Fallible [`Tensor::linspace`]: a non-float dtype or a non-finite end is refused.
    pub fn try_linspace(start: f64, end: f64, steps: usize, dtype: DType) -> Result<Tensor> {
        if !dtype.is_float() || !start.is_finite() || !end.is_finite() {
            return Err(KilnError::InvalidArgument {
                op: "linspace",
                shape: vec![steps],
                reason: format!(
                    "linspace from {start} to {end} in {dtype:?}: the ends must be finite and \
                     the dtype a float type"
                ),
            });
        }
        let ends = |v: f64| Tensor::try_full_on((), Scalar::Float(v), dtype, crate::Device::Cpu);
        if steps <= 1 {
            let first = ends(start)?;
            return if steps == 1 {
                first.try_reshape([1])
            } else {
                Tensor::try_full_on([0], 0.0, dtype, crate::Device::Cpu)
            };
        }
        // The step rounded to `dtype` from the ends rounded to it, as PyTorch's kernel;
        // each value is then `start + i·step` rounded once (PyTorch's vector loop fuses the
        // multiply and add): computed wider, where the product is exact, and rounded back.
        let (s, e) = (ends(start)?, ends(end)?);
        let step = e.try_sub(&s)?.try_div((steps - 1) as f64)?;
        let wide = if dtype.is_half() {
            DType::F32
        } else {
            DType::F64
        };
        let (s, e, step) = (s.try_cast(wide)?, e.try_cast(wide)?, step.try_cast(wide)?);
        let i = Tensor::try_arange(0, steps as i64, 1, DType::I64)?;
        let up = i.try_cast(wide)?.try_mul(&step)?.try_add(&s)?;
        let back = i
            .try_rsub((steps - 1) as i64)?
            .try_cast(wide)?
            .try_mul(&step)?
            .try_rsub(&e)?;
        Tensor::try_where(&i.try_lt((steps / 2) as i64)?, &up, &back)?.try_cast(dtype)
    }
}
