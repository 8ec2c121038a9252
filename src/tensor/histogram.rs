//! Counting values into bins: PyTorch's `bincount`, `histc`, `histogram` and
//! `histogramdd`.
//!
//! Each ends in one `scatter_add` of ones (or weights) into a zero tensor of bins, so they
//! run on every device through the existing kernels. `bincount`'s length depends on the
//! largest value, so it realizes its input when called; the histograms realize only what
//! sets their edges: the data's range when none is given, and given edges (to check their
//! order).
//!
//! A value's bin among equal bins is found as PyTorch finds it: estimated in the compute
//! dtype as `trunc((x - e₀)·bins / (e_last - e₀))` over the edges `linspace(lo, hi, bins +
//! 1)`, then, for `histogram` and `histogramdd` (not `histc`), settled against the edges
//! around it so that a value on an edge starts that edge's bin. Among given edges it is
//! the number of edges at or below the value, minus one. Values outside `[e₀, e_last]`
//! and NaN are not counted, and the last bin includes its right edge.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};

impl Tensor {
    /// PyTorch's `bincount(weights, minlength)`: how often each value `0..=max` occurs in
    /// this 1-d tensor of non-negative integers (`out[x[i]] += 1`), or the sum of `weights`
    /// (`out[x[i]] += weights[i]`). The length is `max(x.max() + 1, minlength)`, so the input
    /// is realized when called. PyTorch's dtypes: i64 counts, f32 sums for f32 weights and
    /// f64 sums for any other weights; an empty input gives `minlength` i64 zeros. A
    /// negative value, a bool or float input, or weights of another shape fail, naming
    /// them. Gradients reach `weights` (PyTorch has no derivative for it).
    ///
    /// ```
    /// use kiln::{DType, Tensor};
    /// let x = Tensor::from_vec(vec![4i64, 3, 6, 3, 4], [5]);
    /// assert_eq!(x.bincount(None, 0).to_vec::<i64>().unwrap(), vec![0, 0, 0, 2, 2, 0, 1]);
    /// let w = Tensor::linspace(0.0, 1.0, 5, DType::F32);
    /// assert_eq!(
    ///     x.bincount(Some(&w), 0).to_vec::<f32>().unwrap(),
    ///     vec![0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5]
    /// );
    /// ```
    #[track_caller]
    pub fn bincount(&self, weights: Option<&Tensor>, minlength: usize) -> Tensor {
        unwrap_or_panic(self.try_bincount(weights, minlength))
    }

    /// Fallible [`Tensor::bincount`].
    pub fn try_bincount(&self, weights: Option<&Tensor>, minlength: usize) -> Result<Tensor> {
        const OP: &str = "bincount";
        if !self.dtype.is_int() || self.dtype == DType::Bool {
            return Err(KilnError::UnsupportedDType {
                op: OP,
                dtype: self.dtype,
                detail: ": it counts integers".into(),
            });
        }
        if self.ndim() != 1 {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: self.shape.to_vec(),
                reason: "bincount only supports 1-d non-negative integral inputs".into(),
            });
        }
        let out = match weights {
            None => DType::I64,
            Some(w) => {
                if w.shape() != self.shape() {
                    return Err(KilnError::ShapeMismatch {
                        op: OP,
                        lhs: self.shape.to_vec(),
                        rhs: w.shape().to_vec(),
                        detail: ": weights must be 1-d and as long as the input".into(),
                    });
                }
                self.require_same_device(OP, w)?;
                if w.dtype() == DType::F32 {
                    DType::F32
                } else {
                    DType::F64
                }
            }
        };
        if self.numel() == 0 {
            crate::shape::check_shape(OP, &[minlength], DType::I64)?;
            return Tensor::try_full_on([minlength], 0i64, DType::I64, self.device());
        }
        let x = self.try_cast(DType::I64)?;
        x.realize()?;
        let (lo, hi) = x.try_aminmax(.., false)?;
        let (lo, hi) = (lo.item::<i64>()?, hi.item::<i64>()?);
        if lo < 0 {
            return Err(KilnError::InvalidArgument {
                op: OP,
                shape: self.shape.to_vec(),
                reason: format!(
                    "bincount only supports 1-d non-negative integral inputs; found {lo}"
                ),
            });
        }
        let len = (hi as usize + 1).max(minlength);
        // The counts must be a tensor that can exist (a huge value or minlength is
        // refused here by name, not inside the zeros it would fill).
        crate::shape::check_shape(OP, &[len], out)?;
        let src = match weights {
            Some(w) => w.try_cast(out)?,
            None => Tensor::try_full_on(self.shape(), 1i64, DType::I64, self.device())?,
        };
        Tensor::try_full_on([len], 0i64, out, self.device())?.try_scatter_add(0, &x, &src)
    }

    /// PyTorch's `histc(bins, min, max)`: a histogram of this float tensor's elements in
    /// `bins` equal bins from `min` to `max`, of this tensor's dtype and shape `[bins]`.
    /// Elements outside `[min, max]` (and NaN) are not counted; the last bin includes `max`.
    /// When `min == max` the range is the data's own (realized when called), widened by 1
    /// on each side if that is a single value. A bin is found as PyTorch's `histc` finds
    /// it: `trunc((x - min)·bins / (max - min))` in the dtype, over the edges
    /// `linspace(min, max, bins + 1)` in the dtype. f16/bf16
    /// are counted in f32. A non-finite range, `min > max` or `bins = 0` fail, as in
    /// PyTorch.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 1.0], [3]);
    /// assert_eq!(x.histc(4, 0.0, 3.0).to_vec::<f32>().unwrap(), vec![0.0, 2.0, 1.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn histc(&self, bins: usize, min: f64, max: f64) -> Tensor {
        unwrap_or_panic(self.try_histc(bins, min, max))
    }

    /// Fallible [`Tensor::histc`].
    pub fn try_histc(&self, bins: usize, min: f64, max: f64) -> Result<Tensor> {
        const OP: &str = "histc";
        let c = histogram_dtype(OP, self)?;
        let refuse = |reason: String| KilnError::InvalidArgument {
            op: OP,
            shape: self.shape.to_vec(),
            reason,
        };
        if bins == 0 {
            return Err(refuse("bins must be > 0".into()));
        }
        check_bin_count(OP, self.shape(), &[bins])?;
        let (mut lo, mut hi) = (min, max);
        if lo == hi && self.numel() > 0 {
            let (a, b) = self.try_aminmax(.., false)?;
            (lo, hi) = (a.item::<f64>()?, b.item::<f64>()?);
        }
        if lo == hi {
            (lo, hi) = (lo - 1.0, hi + 1.0);
        }
        if !lo.is_finite() || !hi.is_finite() {
            return Err(refuse(format!("range of [{lo}, {hi}] is not finite")));
        }
        if lo >= hi {
            return Err(refuse(format!(
                "max must be larger than min (min {lo}, max {hi})"
            )));
        }
        let binning = Binning::linear(lo, hi, bins, c, self.device(), false)?;
        let x = self.try_reshape([-1])?.try_cast(c)?;
        count(&[x], &[binning], None, false)?.try_cast(self.dtype)
    }

    /// PyTorch's `torch.histogram(input, bins, range=, weight=, density=)`: the histogram
    /// of every element in `bins` equal bins over `range` (the data's minimum and maximum
    /// when `None`, realized when called; `[0, 1]` for an empty input; a single value is
    /// widened by 0.5 each side), and the `bins + 1` edges, both of this float tensor's
    /// dtype. `weight` (this tensor's shape and dtype) adds each element's weight instead
    /// of 1; `density` divides by the total and by each bin's width, so the histogram
    /// integrates to 1. A value on an inner edge starts that edge's bin; the last bin
    /// includes its right edge; values outside the range and NaN are not counted.
    /// f16/bf16 are counted in f32.
    ///
    /// ```
    /// use kiln::Tensor;
    /// // PyTorch's documented example.
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 1.0], [3]);
    /// let w = Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3]);
    /// let (hist, edges) = x.histogram(4, Some((0.0, 3.0)), Some(&w), false);
    /// assert_eq!(hist.to_vec::<f32>().unwrap(), vec![0.0, 5.0, 2.0, 0.0]);
    /// assert_eq!(edges.to_vec::<f32>().unwrap(), vec![0.0, 0.75, 1.5, 2.25, 3.0]);
    /// let (density, _) = x.histogram(4, Some((0.0, 3.0)), Some(&w), true);
    /// let want = [0.0, 0.952_381, 0.380_952_4, 0.0];
    /// for (d, w) in density.to_vec::<f32>().unwrap().iter().zip(want) {
    ///     assert!((d - w).abs() < 1e-6);
    /// }
    /// ```
    #[track_caller]
    pub fn histogram(
        &self,
        bins: usize,
        range: Option<(f64, f64)>,
        weight: Option<&Tensor>,
        density: bool,
    ) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_histogram(bins, range, weight, density))
    }

    /// Fallible [`Tensor::histogram`].
    pub fn try_histogram(
        &self,
        bins: usize,
        range: Option<(f64, f64)>,
        weight: Option<&Tensor>,
        density: bool,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "histogram";
        let range = range.map(|r| vec![r]);
        let (hist, mut edges) = self.try_reshape([-1, 1])?.histogramdd_of(
            OP,
            &[bins],
            range.as_deref(),
            weight,
            self.shape(),
            density,
        )?;
        Ok((hist, edges.remove(0)))
    }

    /// [`Tensor::histogram`] over the given bin `edges` (1-D, this tensor's dtype, at least
    /// two, non-decreasing: `histogram` with a tensor of bins in PyTorch). Returns the
    /// histogram and a copy of the edges. The edges are realized when called, to check
    /// their order (PyTorch leaves unsorted edges undefined).
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![0.5f64, 1.0, 2.5, 9.0, 3.0], [5]);
    /// let edges = Tensor::from_vec(vec![0.0f64, 1.0, 3.0], [3]);
    /// let (hist, _) = x.histogram_with_edges(&edges, None, false);
    /// assert_eq!(hist.to_vec::<f64>().unwrap(), vec![1.0, 3.0]); // 3.0 is in the last bin
    /// ```
    #[track_caller]
    pub fn histogram_with_edges(
        &self,
        edges: &Tensor,
        weight: Option<&Tensor>,
        density: bool,
    ) -> (Tensor, Tensor) {
        unwrap_or_panic(self.try_histogram_with_edges(edges, weight, density))
    }

    /// Fallible [`Tensor::histogram_with_edges`].
    pub fn try_histogram_with_edges(
        &self,
        edges: &Tensor,
        weight: Option<&Tensor>,
        density: bool,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "histogram";
        let (hist, mut edges) = self.try_reshape([-1, 1])?.histogramdd_edges_of(
            OP,
            &[edges],
            weight,
            self.shape(),
            density,
        )?;
        Ok((hist, edges.remove(0)))
    }

    /// PyTorch's `torch.histogramdd(input, bins, range=, weight=, density=)`: the
    /// histogram of the points in the last dimension of this float tensor (`[.., D]`, at
    /// least 2-D) on a grid of `bins[d]` equal bins per dimension (one entry: the same for
    /// every dimension), shape `[bins[0], .., bins[D-1]]`, and each dimension's edges.
    /// `range` gives each dimension's `(min, max)` (else the data's, per dimension,
    /// realized when called); `weight` has the input's shape without its last dimension.
    /// Bins, edges, `density` and the edge rule as [`Tensor::histogram`]; a point outside
    /// the range in any dimension is not counted.
    ///
    /// ```
    /// use kiln::Tensor;
    /// // PyTorch's documented example.
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 1.0, 0.0, 2.0, 0.0, 2.0, 2.0], [4, 2]);
    /// let w = Tensor::from_vec(vec![1.0f32, 2.0, 4.0, 8.0], [4]);
    /// let (hist, edges) = x.histogramdd(&[3, 3], None, Some(&w), false);
    /// assert_eq!(
    ///     hist.to_vec::<f32>().unwrap(),
    ///     vec![0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 4.0, 0.0, 8.0]
    /// );
    /// assert_eq!(edges[1].to_vec::<f32>().unwrap(), vec![0.0, 0.666_666_7, 1.333_333_3, 2.0]);
    /// ```
    #[track_caller]
    pub fn histogramdd(
        &self,
        bins: &[usize],
        range: Option<&[(f64, f64)]>,
        weight: Option<&Tensor>,
        density: bool,
    ) -> (Tensor, Vec<Tensor>) {
        unwrap_or_panic(self.try_histogramdd(bins, range, weight, density))
    }

    /// Fallible [`Tensor::histogramdd`].
    pub fn try_histogramdd(
        &self,
        bins: &[usize],
        range: Option<&[(f64, f64)]>,
        weight: Option<&Tensor>,
        density: bool,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let points = self.points("histogramdd")?;
        let lead = &self.shape()[..self.ndim().saturating_sub(1)];
        points.histogramdd_of("histogramdd", bins, range, weight, lead, density)
    }

    /// [`Tensor::histogramdd`] over given edges, one 1-D non-decreasing tensor of at
    /// least two edges per dimension (this tensor's dtype), realized when called to check
    /// their order.
    #[track_caller]
    pub fn histogramdd_with_edges(
        &self,
        edges: &[&Tensor],
        weight: Option<&Tensor>,
        density: bool,
    ) -> (Tensor, Vec<Tensor>) {
        unwrap_or_panic(self.try_histogramdd_with_edges(edges, weight, density))
    }

    /// Fallible [`Tensor::histogramdd_with_edges`].
    pub fn try_histogramdd_with_edges(
        &self,
        edges: &[&Tensor],
        weight: Option<&Tensor>,
        density: bool,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let points = self.points("histogramdd")?;
        let lead = &self.shape()[..self.ndim().saturating_sub(1)];
        points.histogramdd_edges_of("histogramdd", edges, weight, lead, density)
    }

    /// This `[.., D]` tensor as `[N, D]` points (refused below 2-D, as PyTorch does).
    fn points(&self, op: &'static str) -> Result<Tensor> {
        if self.ndim() < 2 {
            return Err(KilnError::InvalidArgument {
                op,
                shape: self.shape.to_vec(),
                reason: "input tensor should have at least 2 dimensions".into(),
            });
        }
        let d = self.shape()[self.ndim() - 1];
        if d == 0 {
            return Err(KilnError::InvalidArgument {
                op,
                shape: self.shape.to_vec(),
                reason: "the points (the last dimension) need at least one coordinate".into(),
            });
        }
        self.try_reshape([-1, d as isize])
    }

    /// `histogramdd` of `[N, D]` points with equal bins; `weight` must be shaped `lead`.
    fn histogramdd_of(
        &self,
        op: &'static str,
        bins: &[usize],
        range: Option<&[(f64, f64)]>,
        weight: Option<&Tensor>,
        lead: &[usize],
        density: bool,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let c = histogram_dtype(op, self)?;
        let d = self.shape()[1];
        let refuse = |reason: String| KilnError::InvalidArgument {
            op,
            shape: self.shape.to_vec(),
            reason,
        };
        let bins: Vec<usize> = match bins {
            [b] => vec![*b; d],
            b if b.len() == d => b.to_vec(),
            b => {
                return Err(refuse(format!(
                    "{} bin counts given for {d}-dimensional points",
                    b.len()
                )));
            }
        };
        if let Some(dim) = bins.iter().position(|&b| b == 0) {
            return Err(refuse(format!(
                "bins must be > 0, but got 0 for dimension {dim}"
            )));
        }
        check_bin_count(op, self.shape(), &bins)?;
        let mut outer = vec![(0.0, 1.0); d];
        match range {
            Some(r) if r.len() != d => {
                return Err(refuse(format!(
                    "for a {d}-dimensional histogram range should have {d} (min, max) pairs, but got {}",
                    r.len()
                )));
            }
            Some(r) => outer.copy_from_slice(r),
            None if self.numel() > 0 => {
                let (lo, hi) = self.try_aminmax(0, false)?;
                let lo = lo.try_cast(DType::F64)?.to_vec::<f64>()?;
                let hi = hi.try_cast(DType::F64)?.to_vec::<f64>()?;
                for (o, (l, h)) in outer.iter_mut().zip(lo.into_iter().zip(hi)) {
                    *o = (l, h);
                }
            }
            None => {}
        }
        let mut binnings = Vec::with_capacity(d);
        for (dim, (&(mut lo, mut hi), &b)) in outer.iter().zip(&bins).enumerate() {
            if !lo.is_finite() || !hi.is_finite() {
                return Err(refuse(format!(
                    "dimension {dim}'s range [{lo}, {hi}] is not finite"
                )));
            }
            if lo > hi {
                return Err(refuse(format!(
                    "min should not exceed max, but got min {lo} max {hi} for dimension {dim}"
                )));
            }
            if lo == hi {
                (lo, hi) = (lo - 0.5, hi + 0.5);
            }
            binnings.push(Binning::linear(lo, hi, b, c, self.device(), true)?);
        }
        self.histogram_with(op, c, binnings, weight, lead, density)
    }

    /// `histogramdd` of `[N, D]` points over given edges.
    fn histogramdd_edges_of(
        &self,
        op: &'static str,
        edges: &[&Tensor],
        weight: Option<&Tensor>,
        lead: &[usize],
        density: bool,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let c = histogram_dtype(op, self)?;
        let d = self.shape()[1];
        if edges.len() != d {
            return Err(KilnError::InvalidArgument {
                op,
                shape: self.shape.to_vec(),
                reason: format!(
                    "{} edge tensors given for {d}-dimensional points",
                    edges.len()
                ),
            });
        }
        let binnings = edges
            .iter()
            .enumerate()
            .map(|(dim, e)| Binning::given(op, dim, e, self, c))
            .collect::<Result<Vec<_>>>()?;
        self.histogram_with(op, c, binnings, weight, lead, density)
    }

    /// Counts `[N, D]` points into `binnings` in dtype `c` (from [`histogram_dtype`]);
    /// returns the histogram and the edges, in this tensor's dtype.
    fn histogram_with(
        &self,
        op: &'static str,
        c: DType,
        binnings: Vec<Binning>,
        weight: Option<&Tensor>,
        lead: &[usize],
        density: bool,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let weight = match weight {
            None => None,
            Some(w) if w.dtype() != self.dtype => {
                return Err(KilnError::DTypeMismatch {
                    op,
                    lhs: self.dtype,
                    rhs: w.dtype(),
                });
            }
            Some(w) if w.shape() != lead => {
                return Err(KilnError::ShapeMismatch {
                    op,
                    lhs: lead.to_vec(),
                    rhs: w.shape().to_vec(),
                    detail: ": weight must have the input's shape (without the points' last dimension for histogramdd)".into(),
                });
            }
            Some(w) => {
                self.require_same_device(op, w)?;
                Some(w.try_reshape([-1])?.try_cast(c)?)
            }
        };
        let columns = (0..binnings.len())
            .map(|dim| {
                let dim = dim as isize;
                self.try_slice_dim(1, dim, dim + 1, 1)?
                    .try_reshape([-1])?
                    .try_cast(c)
            })
            .collect::<Result<Vec<_>>>()?;
        let hist = count(&columns, &binnings, weight.as_ref(), density)?.try_cast(self.dtype)?;
        let edges = binnings
            .into_iter()
            .map(|b| b.edges.try_cast(self.dtype))
            .collect::<Result<Vec<_>>>()?;
        Ok((hist, edges))
    }
}

/// The dtype `op` counts `x` in: f32 for half types, else x's float dtype; refuses
/// integer and bool inputs.
fn histogram_dtype(op: &'static str, x: &Tensor) -> Result<DType> {
    if !x.dtype().is_float() {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: x.dtype(),
            detail: ": it takes float tensors, as PyTorch's does".into(),
        });
    }
    Ok(if x.dtype().is_half() {
        DType::F32
    } else {
        x.dtype()
    })
}

/// The bins of one dimension.
struct Binning {
    /// The edges, in the compute dtype, on the input's device.
    edges: Tensor,
    /// How many bins (one less than the edges).
    bins: usize,
    /// The first and last edge: values outside them are not counted.
    left: f64,
    right: f64,
    /// For equal bins: whether a value's estimated bin is settled against the edges
    /// around it (`Some(true)`), or kept (`Some(false)`, `histc`). `None` for given edges.
    linear: Option<bool>,
}

/// Refuses bin counts whose histogram (or edges) could not be a tensor: the product of
/// `bins` (each plus one for its edges) must be a valid element count.
fn check_bin_count(op: &'static str, shape: &[usize], bins: &[usize]) -> Result<()> {
    let total = bins.iter().try_fold(1usize, |acc, &b| {
        acc.checked_mul(b)?;
        acc.checked_mul(b.checked_add(1)?)
    });
    match total.and_then(|t| t.checked_mul(8)) {
        Some(bytes) if bytes <= crate::shape::MAX_TENSOR_BYTES => Ok(()),
        _ => Err(KilnError::InvalidArgument {
            op,
            shape: shape.to_vec(),
            reason: format!("bins {bins:?} make a histogram too large to hold"),
        }),
    }
}

impl Binning {
    /// `bins` equal bins: the edges are `linspace(lo, hi, bins + 1)` in `c`.
    fn linear(
        lo: f64,
        hi: f64,
        bins: usize,
        c: DType,
        device: crate::Device,
        local_search: bool,
    ) -> Result<Binning> {
        let edges = Tensor::try_linspace(lo, hi, bins + 1, c)?;
        // Only the outer edges are read back (the callers bound `bins`).
        let end = |at: usize| -> Result<f64> {
            edges
                .try_narrow(0, at as isize, 1)?
                .try_cast(DType::F64)?
                .item::<f64>()
        };
        Ok(Binning {
            left: end(0)?,
            right: end(bins)?,
            edges: edges.try_to(device)?,
            bins,
            linear: Some(local_search),
        })
    }

    /// Dimension `dim`'s given `edges` for the points `x` (counted in `c`): 1-D, of x's
    /// dtype and device, at least two, non-decreasing.
    fn given(
        op: &'static str,
        dim: usize,
        edges: &Tensor,
        x: &Tensor,
        c: DType,
    ) -> Result<Binning> {
        let refuse = |reason: String| KilnError::InvalidArgument {
            op,
            shape: edges.shape().to_vec(),
            reason: format!("bin edges for dimension {dim}: {reason}"),
        };
        x.require_same_dtype_and_device(op, edges)?;
        if edges.ndim() != 1 || edges.numel() < 2 {
            return Err(refuse("must be 1-D with at least two edges".into()));
        }
        let edges = edges.try_cast(c)?;
        let values = edges.try_cast(DType::F64)?.to_vec::<f64>()?;
        if let Some(i) = values.windows(2).position(|w| {
            !matches!(
                w[0].partial_cmp(&w[1]),
                Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
            )
        }) {
            return Err(refuse(format!(
                "must be non-decreasing, but edge {} is {} and edge {} is {}",
                i,
                values[i],
                i + 1,
                values[i + 1]
            )));
        }
        let bins = values.len() - 1;
        Ok(Binning {
            edges: edges.copy(),
            bins,
            left: values[0],
            right: values[bins],
            linear: None,
        })
    }

    /// Each value's bin (i64, in `0..bins`) and whether it is counted (in
    /// `[left, right]`, not NaN), for the 1-D `x` in the compute dtype.
    fn place(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let (bins, left, right) = (self.bins as i64, self.left, self.right);
        let inside = x.try_ge(left)?.try_logical_and(&x.try_le(right)?)?;
        let x = Tensor::try_where(&inside, x, left)?;
        let pos = match self.linear {
            None => self.edges.try_searchsorted(&x, true)?.try_sub(1i64)?,
            Some(local_search) => {
                // PyTorch's estimate: `(x - e₀)·bins / (e_last - e₀)` in the dtype, truncated.
                let guess = x
                    .try_sub(left)?
                    .try_mul(bins as f64)?
                    .try_div(right - left)?
                    .try_cast(DType::I64)?;
                if local_search {
                    // Settled by counting the edges at or below x among the three around
                    // it, so an element on an edge starts that bin.
                    let mut pos = guess
                        .try_sub(1i64)?
                        .try_clamp(0i64, i64::MAX)?
                        .try_sub(1i64)?;
                    for step in [-1i64, 0, 1] {
                        let k = guess.try_add(step)?;
                        let real = k.try_ge(0i64)?.try_logical_and(&k.try_le(bins)?)?;
                        let edge = self.edges.try_gather(0, &k.try_clamp(0i64, bins)?)?;
                        let below = real.try_logical_and(&edge.try_le(&x)?)?;
                        pos = pos.try_add(&below.try_cast(DType::I64)?)?;
                    }
                    pos
                } else {
                    guess
                }
            }
        };
        // The last bin includes its right edge.
        Ok((pos.try_clamp(0i64, bins - 1)?, inside))
    }
}

/// The histogram of the points whose coordinates are `columns` (1-D, the compute dtype),
/// one per binning: shaped by the bins, in the compute dtype; each point adds its
/// `weight` (or 1) when every coordinate is counted. `density` divides by the total and
/// by each bin's widths.
fn count(
    columns: &[Tensor],
    binnings: &[Binning],
    weight: Option<&Tensor>,
    density: bool,
) -> Result<Tensor> {
    let first = columns
        .first()
        .ok_or_else(|| KilnError::Internal("histogram: no columns".into()))?;
    let (c, device) = (first.dtype(), first.device());
    let total: usize = binnings.iter().map(|b| b.bins).product();
    let mut flat = Tensor::try_full_on(first.shape(), 0i64, DType::I64, device)?;
    let mut counted = Tensor::try_full_on(first.shape(), true, DType::Bool, device)?;
    let mut stride = total;
    for (x, b) in columns.iter().zip(binnings) {
        stride /= b.bins;
        let (pos, inside) = b.place(x)?;
        flat = flat.try_add(&pos.try_mul(stride as i64)?)?;
        counted = counted.try_logical_and(&inside)?;
    }
    let ones = Tensor::try_full_on((), 1.0, c, device)?;
    let adds =
        Tensor::try_where(&counted, weight.unwrap_or(&ones), 0.0)?.expand_view(first.shape())?;
    let shape: Vec<usize> = binnings.iter().map(|b| b.bins).collect();
    let mut hist = Tensor::try_full_on([total], 0.0, c, device)?
        .try_scatter_add(0, &flat, &adds)?
        .try_reshape(shape.iter().map(|&b| b as isize).collect::<Vec<_>>())?;
    if density {
        hist = hist.try_div(&hist.try_sum(..)?)?;
        for (dim, b) in binnings.iter().enumerate() {
            let mut widths_shape = vec![1isize; shape.len()];
            widths_shape[dim] = b.bins as isize;
            hist = hist.try_div(&b.edges.try_diff(1, 0)?.try_reshape(widths_shape)?)?;
        }
    }
    Ok(hist)
}
