//! PyTorch ops kiln records as compositions of its primitives (views, `cat`, `where`,
//! comparisons, arange, gathers): `roll`, `diagonal`, `diag`, the `logical_*` family,
//! `linspace`, `diff`, `rot90`, `meshgrid`, `repeat_interleave`, `take_along_dim`,
//! `unfold` and `tril_indices`/`triu_indices`. Each is differentiated, fused and run on every device
//! as its parts are.

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

impl Tensor {
    /// PyTorch's `diff(n, dim)`: the `n`-th forward difference along `dim`
    /// (`x[1:] - x[:-1]`, `n` times; bools give `x[1:] != x[:-1]`). Each step shortens
    /// the dimension by one (not below zero).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 4, 9, 16], [4]);
    /// assert_eq!(x.diff(1, 0).to_vec::<i64>().unwrap(), vec![3, 5, 7]);
    /// assert_eq!(x.diff(2, -1).to_vec::<i64>().unwrap(), vec![2, 2]);
    /// ```
    #[track_caller]
    pub fn diff(&self, n: usize, dim: isize) -> Tensor {
        unwrap_or_panic(self.try_diff(n, dim))
    }

    /// Fallible [`Tensor::diff`].
    pub fn try_diff(&self, n: usize, dim: isize) -> Result<Tensor> {
        let d = normalize_axis("diff", dim, &self.shape)?;
        let mut x = self.unchanged()?;
        for _ in 0..n {
            let len = x.shape[d];
            if len == 0 {
                break;
            }
            let (hi, lo) = (
                x.try_narrow(d as isize, 1, len - 1)?,
                x.try_narrow(d as isize, 0, len - 1)?,
            );
            x = if x.dtype == DType::Bool {
                hi.try_ne(&lo)?
            } else {
                hi.try_sub(&lo)?
            };
        }
        Ok(x)
    }

    /// PyTorch's `diff(n, dim, prepend, append)`: [`Tensor::diff`] of `prepend`, this
    /// tensor and `append` joined along `dim` (dtypes promote as [`Tensor::cat`]'s do). Each
    /// must have this tensor's number of dimensions and its sizes off `dim`. As in PyTorch,
    /// `n = 0` returns this tensor and ignores them.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 4, 9], [3]);
    /// let zero = Tensor::from_vec(vec![0i64], [1]);
    /// assert_eq!(x.diff_with(1, 0, Some(&zero), None).to_vec::<i64>().unwrap(), vec![1, 3, 5]);
    /// ```
    #[track_caller]
    pub fn diff_with(
        &self,
        n: usize,
        dim: isize,
        prepend: Option<&Tensor>,
        append: Option<&Tensor>,
    ) -> Tensor {
        unwrap_or_panic(self.try_diff_with(n, dim, prepend, append))
    }

    /// Fallible [`Tensor::diff_with`].
    pub fn try_diff_with(
        &self,
        n: usize,
        dim: isize,
        prepend: Option<&Tensor>,
        append: Option<&Tensor>,
    ) -> Result<Tensor> {
        normalize_axis("diff", dim, &self.shape)?;
        for t in prepend.iter().chain(append.iter()) {
            if t.ndim() != self.ndim() {
                return Err(KilnError::ShapeMismatch {
                    op: "diff",
                    lhs: self.shape.to_vec(),
                    rhs: t.shape().to_vec(),
                    detail: ": prepend and append must have the input's number of dimensions"
                        .into(),
                });
            }
        }
        if n == 0 || (prepend.is_none() && append.is_none()) {
            return self.try_diff(n, dim);
        }
        let parts: Vec<&Tensor> = prepend
            .into_iter()
            .chain(std::iter::once(self))
            .chain(append)
            .collect();
        Tensor::try_cat(&parts, dim)?.try_diff(n, dim)
    }

    /// PyTorch's `rot90(k, dims)`: rotates by 90° `k` times in the plane of `dims`, from
    /// the first dimension towards the second (negative `k` turns the other way); a view.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::arange(0, 4, 1).reshape([2, 2]);
    /// assert_eq!(x.rot90(1, [0, 1]).to_vec::<i64>().unwrap(), vec![1, 3, 0, 2]);
    /// assert_eq!(x.rot90(-1, [0, 1]).to_vec::<i64>().unwrap(), vec![2, 0, 3, 1]);
    /// ```
    #[track_caller]
    pub fn rot90(&self, k: i64, dims: [isize; 2]) -> Tensor {
        unwrap_or_panic(self.try_rot90(k, dims))
    }

    /// Fallible [`Tensor::rot90`].
    pub fn try_rot90(&self, k: i64, dims: [isize; 2]) -> Result<Tensor> {
        let (a, b) = (
            normalize_axis("rot90", dims[0], &self.shape)?,
            normalize_axis("rot90", dims[1], &self.shape)?,
        );
        if a == b {
            return Err(KilnError::InvalidArgument {
                op: "rot90",
                shape: self.shape.clone(),
                reason: format!("the two dimensions are the same ({a})"),
            });
        }
        let (a, b) = (a as isize, b as isize);
        match k.rem_euclid(4) {
            1 => self.try_flip(b)?.try_transpose(a, b),
            2 => self.try_flip([a, b]),
            3 => self.try_flip(a)?.try_transpose(a, b),
            _ => self.unchanged(),
        }
    }

    /// PyTorch's `torch.meshgrid(*tensors, indexing=…)`: each 1-D (or 0-D) tensor spread
    /// over the grid of all their lengths, as views. `"ij"` puts the tensors' dimensions in
    /// order; `"xy"` (NumPy's default) swaps the first two.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3], [3]);
    /// let y = Tensor::from_vec(vec![4i64, 5], [2]);
    /// let g = Tensor::meshgrid(&[&x, &y], "ij");
    /// assert_eq!(g[0].shape(), &[3, 2]);
    /// assert_eq!(g[0].to_vec::<i64>().unwrap(), vec![1, 1, 2, 2, 3, 3]);
    /// assert_eq!(g[1].to_vec::<i64>().unwrap(), vec![4, 5, 4, 5, 4, 5]);
    /// assert_eq!(Tensor::meshgrid(&[&x, &y], "xy")[0].shape(), &[2, 3]);
    /// ```
    #[track_caller]
    pub fn meshgrid(tensors: &[&Tensor], indexing: &str) -> Vec<Tensor> {
        unwrap_or_panic(Tensor::try_meshgrid(tensors, indexing))
    }

    /// Fallible [`Tensor::meshgrid`].
    pub fn try_meshgrid(tensors: &[&Tensor], indexing: &str) -> Result<Vec<Tensor>> {
        let shape_of = |t: &Tensor| t.shape.clone();
        if let Some(bad) = tensors.iter().find(|t| t.ndim() > 1) {
            return Err(KilnError::InvalidArgument {
                op: "meshgrid",
                shape: shape_of(bad),
                reason: "every tensor must be 0-D or 1-D".into(),
            });
        }
        let xy = match indexing {
            "ij" => false,
            "xy" => true,
            other => {
                return Err(KilnError::InvalidArgument {
                    op: "meshgrid",
                    shape: Vec::new(),
                    reason: format!("indexing must be \"ij\" or \"xy\", not {other:?}"),
                });
            }
        };
        let n = tensors.len();
        // Grid position of each tensor's dimension ("xy" swaps the first two).
        let place = |i: usize| match (xy && n >= 2, i) {
            (true, 0) => 1,
            (true, 1) => 0,
            _ => i,
        };
        let mut grid = vec![0usize; n];
        for (i, t) in tensors.iter().enumerate() {
            grid[place(i)] = t.numel();
        }
        tensors
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut along = vec![1isize; n];
                along[place(i)] = t.numel() as isize;
                t.try_reshape(along)?.try_broadcast_to(grid.as_slice())
            })
            .collect()
    }

    /// PyTorch's `repeat_interleave(repeats, dim)` with one count: each element (or slice
    /// along `dim`) repeated `repeats` times in place, `[a, b]` → `[a, a, b, b]`; with
    /// `dim = None` over the flattened tensor.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]);
    /// assert_eq!(x.repeat_interleave(2, None).to_vec::<i64>().unwrap(), vec![1, 1, 2, 2, 3, 3, 4, 4]);
    /// assert_eq!(x.repeat_interleave(2, Some(0)).to_vec::<i64>().unwrap(), vec![1, 2, 1, 2, 3, 4, 3, 4]);
    /// ```
    #[track_caller]
    pub fn repeat_interleave(&self, repeats: usize, dim: Option<isize>) -> Tensor {
        unwrap_or_panic(self.try_repeat_interleave(repeats, dim))
    }

    /// Fallible [`Tensor::repeat_interleave`].
    pub fn try_repeat_interleave(&self, repeats: usize, dim: Option<isize>) -> Result<Tensor> {
        let (x, d) = self.interleave_axis(dim)?;
        let mut spread = x.shape.clone();
        spread.insert(d + 1, repeats);
        let mut out: Vec<isize> = x.shape.iter().map(|&s| s as isize).collect();
        out[d] = (x.shape[d] * repeats) as isize;
        x.try_unsqueeze(d as isize + 1)?
            .try_broadcast_to(spread.as_slice())?
            .try_reshape(out)
    }

    /// PyTorch's `repeat_interleave(repeats_tensor, dim)`: element (or slice) `i` repeated
    /// `repeats[i]` times. The output's length depends on the counts, so they are realized
    /// when called (a synchronization point, as in PyTorch on CUDA); then one lazy
    /// `index_select`, which fuses and carries gradients.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    /// let r = Tensor::from_vec(vec![2i64, 0, 1], [3]);
    /// assert_eq!(x.repeat_interleave_by(&r, Some(0)).to_vec::<f32>().unwrap(), vec![1.0, 1.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn repeat_interleave_by(&self, repeats: &Tensor, dim: Option<isize>) -> Tensor {
        unwrap_or_panic(self.try_repeat_interleave_by(repeats, dim))
    }

    /// Fallible [`Tensor::repeat_interleave_by`].
    pub fn try_repeat_interleave_by(&self, repeats: &Tensor, dim: Option<isize>) -> Result<Tensor> {
        const OP: &str = "repeat_interleave";
        let (x, d) = self.interleave_axis(dim)?;
        if !repeats.dtype.is_int() || repeats.ndim() > 1 {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: repeats.shape.clone(),
                reason: format!(
                    "repeats must be a 0-D or 1-D integer tensor (dtype {:?})",
                    repeats.dtype
                ),
            });
        }
        let n = x.shape[d];
        let counts = repeats
            .try_cast(DType::I64)?
            .try_broadcast_to([n])?
            .to_vec::<i64>()?;
        if let Some(bad) = counts.iter().find(|&&c| c < 0) {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: repeats.shape.clone(),
                reason: format!("repeats must not be negative (found {bad})"),
            });
        }
        let picks: Vec<i64> = counts
            .iter()
            .enumerate()
            .flat_map(|(i, &c)| std::iter::repeat_n(i as i64, c as usize))
            .collect();
        let len = picks.len();
        let index = Tensor::try_from_vec(picks, [len])?.try_to(x.device)?;
        x.try_index_select(d as isize, &index)
    }

    /// The tensor `repeat_interleave` works on and its axis: flattened for `None`.
    fn interleave_axis(&self, dim: Option<isize>) -> Result<(Tensor, usize)> {
        match dim {
            None => Ok((self.try_reshape([-1])?, 0)),
            Some(dim) => Ok((
                self.unchanged()?,
                normalize_axis("repeat_interleave", dim, &self.shape)?,
            )),
        }
    }

    /// PyTorch's `take_along_dim(indices, dim)`: a [`Tensor::gather`] along `dim` after
    /// broadcasting this tensor and `indices` over the other dimensions; with `dim = None`
    /// both are flattened first.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![10.0f32, 30.0, 20.0, 5.0, 1.0, 7.0], [2, 3]);
    /// let top = x.argmax_keepdim(1);
    /// assert_eq!(x.take_along_dim(&top, Some(1)).to_vec::<f32>().unwrap(), vec![30.0, 7.0]);
    /// let i = Tensor::from_vec(vec![5i64, 0], [2]);
    /// assert_eq!(x.take_along_dim(&i, None).to_vec::<f32>().unwrap(), vec![7.0, 10.0]);
    /// ```
    #[track_caller]
    pub fn take_along_dim(&self, indices: &Tensor, dim: Option<isize>) -> Tensor {
        unwrap_or_panic(self.try_take_along_dim(indices, dim))
    }

    /// Fallible [`Tensor::take_along_dim`].
    pub fn try_take_along_dim(&self, indices: &Tensor, dim: Option<isize>) -> Result<Tensor> {
        const OP: &str = "take_along_dim";
        let Some(dim) = dim else {
            return self
                .try_reshape([-1])?
                .try_gather(0, &indices.try_reshape([-1])?);
        };
        let d = normalize_axis(OP, dim, &self.shape)?;
        if indices.ndim() != self.ndim() {
            return Err(KilnError::ShapeMismatch {
                op: OP,
                lhs: self.shape.clone(),
                rhs: indices.shape.clone(),
                detail: ": the indices need as many dimensions as the tensor".into(),
            });
        }
        // Broadcast every dimension but `d` (each keeps its own length there).
        let (mut xs, mut is) = (self.shape.clone(), indices.shape.clone());
        xs[d] = 1;
        is[d] = 1;
        let common = crate::shape::broadcast_shapes(OP, &xs, &is)?;
        let (mut xb, mut ib) = (common.clone(), common);
        xb[d] = self.shape[d];
        ib[d] = indices.shape[d];
        self.try_broadcast_to(xb.as_slice())?
            .try_gather(dim, &indices.try_broadcast_to(ib.as_slice())?)
    }

    /// PyTorch's `x.unfold(dim, size, step)`: the windows of `size` elements every `step`
    /// along `dim`, that dimension becoming the window count and a new last dimension of
    /// `size` holding each window. One gather (a copy, where PyTorch returns a view).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::arange(1, 8, 1);
    /// let w = x.unfold(0, 3, 2);
    /// assert_eq!(w.shape(), &[3, 3]);
    /// assert_eq!(w.to_vec::<i64>().unwrap(), vec![1, 2, 3, 3, 4, 5, 5, 6, 7]);
    /// ```
    #[track_caller]
    pub fn unfold(&self, dim: isize, size: usize, step: usize) -> Tensor {
        unwrap_or_panic(self.try_unfold(dim, size, step))
    }

    /// Fallible [`Tensor::unfold`].
    pub fn try_unfold(&self, dim: isize, size: usize, step: usize) -> Result<Tensor> {
        const OP: &str = "unfold";
        let d = normalize_axis(OP, dim, &self.shape)?;
        let n = self.shape[d];
        if step == 0 || size > n {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: self.shape.clone(),
                reason: format!(
                    "size {size} must be at most dimension {dim}'s {n}, and step {step} at least 1"
                ),
            });
        }
        let windows = (n - size) / step + 1;
        let picks: Vec<i64> = (0..windows)
            .flat_map(|w| (0..size).map(move |j| (w * step + j) as i64))
            .collect();
        let index = Tensor::try_from_vec(picks, [windows * size])?.try_to(self.device)?;
        let mut split: Vec<isize> = self.shape.iter().map(|&s| s as isize).collect();
        split.splice(d..=d, [windows as isize, size as isize]);
        self.try_index_select(d as isize, &index)?
            .try_reshape(split)?
            .try_movedim(d as isize + 1, -1)
    }

    /// PyTorch's `torch.tril_indices(row, col, offset)`: the `[2, count]` i64 coordinates
    /// of a `row × col` matrix's lower triangle (`j ≤ i + offset`), row by row.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let t = Tensor::tril_indices(3, 3, 0);
    /// assert_eq!(t.to_vec::<i64>().unwrap(), vec![0, 1, 1, 2, 2, 2, 0, 0, 1, 0, 1, 2]);
    /// assert_eq!(Tensor::triu_indices(2, 3, 1).to_vec::<i64>().unwrap(), vec![0, 0, 1, 1, 2, 2]);
    /// ```
    #[track_caller]
    pub fn tril_indices(row: usize, col: usize, offset: i64) -> Tensor {
        unwrap_or_panic(triangle_indices(row, col, |i, j| j <= i + offset))
    }

    /// PyTorch's `torch.triu_indices(row, col, offset)`: the upper triangle's coordinates
    /// (`j ≥ i + offset`); see [`Tensor::tril_indices`].
    #[track_caller]
    pub fn triu_indices(row: usize, col: usize, offset: i64) -> Tensor {
        unwrap_or_panic(triangle_indices(row, col, |i, j| j >= i + offset))
    }
}

/// The `[2, count]` coordinates `(i, j)` of a `row × col` matrix where `keep(i, j)`.
fn triangle_indices(row: usize, col: usize, keep: impl Fn(i64, i64) -> bool) -> Result<Tensor> {
    let (mut rows, mut cols) = (Vec::new(), Vec::new());
    for i in 0..row as i64 {
        for j in 0..col as i64 {
            if keep(i, j) {
                rows.push(i);
                cols.push(j);
            }
        }
    }
    let n = rows.len();
    rows.extend(cols);
    Tensor::try_from_vec(rows, [2, n])
}
