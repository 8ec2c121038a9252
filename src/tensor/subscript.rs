//! PyTorch's subscripts: `x[...]` as [`Tensor::i`], and `x[...] = v` as
//! [`Tensor::i_put`] / [`Tensor::i_put_`].
//!
//! A subscript is a tuple of entries ([`Index`]): positions (`2`, `-1`), ranges (`1..3`,
//! `..`, `2..`, [`Index::stepped`] for a step), [`Index::NewAxis`], [`Index::Ellipsis`]
//! and index tensors (integer positions or bool masks). As in PyTorch, the integers,
//! ranges and new axes apply first, as views (no copy); the index tensors then pick from
//! the dimensions they stand at, broadcast together. Their result dimensions replace the
//! indexed ones where those were adjacent, and go first otherwise (NumPy's rule, applied
//! after the integers have removed their dimensions, as PyTorch does: `x[0, :, idx]` keeps
//! the index's dimension last). The pick is one `index_select` of the indexed dimensions
//! flattened, so it fuses and carries gradients like any gather; a bool mask is realized
//! when called (its true places decide the shape).
//!
//! A write `x[s] = v` is the read applied to the flat positions of `x` (an `arange`): the
//! positions it reads are the places `v` is scattered to.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

/// What PyTorch's errors call indexing.
const OP: &str = "index";

/// One entry of a subscript: what stands between two commas in `x[...]`.
#[derive(Debug, Clone)]
pub enum Index {
    /// `x[i]`: one position (negative counts from the end); the dimension goes away.
    At(i64),
    /// `x[start:end:step]`, Python's slice: open ends are `None`, negative bounds count
    /// from the end, bounds clamp to the dimension, and `step` is at least 1.
    Slice {
        /// First position (`None`: 0).
        start: Option<i64>,
        /// One past the last position (`None`: the dimension's length).
        end: Option<i64>,
        /// Distance between taken positions (≥ 1).
        step: i64,
    },
    /// `x[None]`: a new dimension of size 1 here.
    NewAxis,
    /// `x[...]`: as many whole dimensions as the other entries leave.
    Ellipsis,
    /// An index tensor: integer positions (negative ones count from the end) or a bool
    /// mask over the dimensions it covers. A 0-d bool (also written `true`/`false`) is
    /// `x[True]`: a new dimension of length 1 (or 0), treated as an index tensor.
    Tensor(Tensor),
}

impl Index {
    /// A range with a step: `Index::stepped(1..9, 2)` is `x[1:9:2]`, `Index::stepped(.., 3)`
    /// is `x[::3]`. (A position or tensor is returned unchanged.)
    pub fn stepped(range: impl Into<Index>, step: i64) -> Index {
        match range.into() {
            Index::Slice { start, end, .. } => Index::Slice { start, end, step },
            other => other,
        }
    }
}

macro_rules! index_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Index {
            fn from(i: $t) -> Index {
                Index::At(i as i64)
            }
        }
        impl From<Range<$t>> for Index {
            fn from(r: Range<$t>) -> Index {
                Index::Slice { start: Some(r.start as i64), end: Some(r.end as i64), step: 1 }
            }
        }
        impl From<RangeFrom<$t>> for Index {
            fn from(r: RangeFrom<$t>) -> Index {
                Index::Slice { start: Some(r.start as i64), end: None, step: 1 }
            }
        }
        impl From<RangeTo<$t>> for Index {
            fn from(r: RangeTo<$t>) -> Index {
                Index::Slice { start: None, end: Some(r.end as i64), step: 1 }
            }
        }
        impl From<RangeInclusive<$t>> for Index {
            fn from(r: RangeInclusive<$t>) -> Index {
                let end = *r.end() as i64;
                // `a..=-1` runs to the end, as `a:` does.
                let end = if end == -1 { None } else { Some(end + 1) };
                Index::Slice { start: Some(*r.start() as i64), end, step: 1 }
            }
        }
        impl From<RangeToInclusive<$t>> for Index {
            fn from(r: RangeToInclusive<$t>) -> Index {
                let end = r.end as i64;
                let end = if end == -1 { None } else { Some(end + 1) };
                Index::Slice { start: None, end, step: 1 }
            }
        }
    )*};
}

index_from_int!(i32, i64, isize, usize);

impl From<RangeFull> for Index {
    fn from(_: RangeFull) -> Index {
        Index::Slice {
            start: None,
            end: None,
            step: 1,
        }
    }
}

impl From<bool> for Index {
    /// `x[True]` / `x[False]`: a 0-d bool index, a new dimension of length 1 or 0.
    fn from(b: bool) -> Index {
        Index::Tensor(Tensor::scalar(b))
    }
}

impl From<&Tensor> for Index {
    fn from(t: &Tensor) -> Index {
        Index::Tensor(t.clone())
    }
}

impl From<Tensor> for Index {
    fn from(t: Tensor) -> Index {
        Index::Tensor(t)
    }
}

/// A whole subscript: one entry (`x.i(2)`, `x.i(1..3)`, `x.i(&idx)`), a tuple of up to
/// eight (`x.i((.., 0))`), or a `Vec`/slice of [`Index`].
pub trait Subscripts {
    /// The entries, in order.
    fn entries(self) -> Vec<Index>;
}

macro_rules! one_entry {
    ($($t:ty),*) => {$(
        impl Subscripts for $t {
            fn entries(self) -> Vec<Index> {
                vec![self.into()]
            }
        }
    )*};
}

one_entry!(
    Index,
    bool,
    i32,
    i64,
    isize,
    usize,
    Range<i32>,
    Range<i64>,
    Range<isize>,
    Range<usize>,
    RangeFrom<i32>,
    RangeFrom<i64>,
    RangeFrom<isize>,
    RangeFrom<usize>,
    RangeTo<i32>,
    RangeTo<i64>,
    RangeTo<isize>,
    RangeTo<usize>,
    RangeInclusive<i32>,
    RangeInclusive<i64>,
    RangeInclusive<isize>,
    RangeInclusive<usize>,
    RangeFull,
    &Tensor,
    Tensor
);

impl Subscripts for Vec<Index> {
    fn entries(self) -> Vec<Index> {
        self
    }
}

impl Subscripts for &[Index] {
    fn entries(self) -> Vec<Index> {
        self.to_vec()
    }
}

macro_rules! tuple_entries {
    ($(($($name:ident),+)),*) => {$(
        impl<$($name: Into<Index>),+> Subscripts for ($($name,)+) {
            #[allow(non_snake_case)]
            fn entries(self) -> Vec<Index> {
                let ($($name,)+) = self;
                vec![$($name.into()),+]
            }
        }
    )*};
}

tuple_entries!(
    (A),
    (A, B),
    (A, B, C),
    (A, B, C, D),
    (A, B, C, D, E),
    (A, B, C, D, E, F),
    (A, B, C, D, E, F, G),
    (A, B, C, D, E, F, G, H)
);

fn invalid(shape: &[usize], reason: String) -> KilnError {
    KilnError::InvalidArgument {
        op: OP,
        shape: shape.to_vec(),
        reason,
    }
}

impl Tensor {
    /// PyTorch's `x[...]`: `x.i((.., 0))` is `x[:, 0]`, `x.i((&rows, 1..))` is
    /// `x[rows, 1:]`; see [`Index`] for the entries. As in PyTorch, the integers, ranges
    /// and new axes apply first, as views (no copy); the index tensors then pick from the
    /// dimensions they stand at, broadcast together. Their result dimensions replace the
    /// indexed ones where those were adjacent, and go first otherwise (NumPy's rule,
    /// applied after the integers have removed their dimensions, as PyTorch does:
    /// `x[0, :, idx]` keeps the index's dimension last). The pick is one fusable
    /// `index_select` that carries gradients; a bool mask is realized when called, and an
    /// index outside its dimension fails when realized ([`KilnError::IndexOutOfRange`]).
    /// A position out of range, a second ellipsis or more entries than dimensions fail
    /// here, naming the shape.
    ///
    /// ```
    /// use kiln::{Index, Tensor};
    /// let x = Tensor::arange(0.0, 24.0, 1.0).reshape([2, 3, 4]);
    /// assert_eq!(x.i((1, .., -1)).to_vec::<f32>().unwrap(), vec![15.0, 19.0, 23.0]);
    /// assert_eq!(x.i((.., 1..3, Index::stepped(.., 2))).shape(), &[2, 2, 2]);
    /// let idx = Tensor::from_vec(vec![2i64, 0], [2]);
    /// // x[0, :, idx]: the integer goes first, so the index's dimension stays in place.
    /// assert_eq!(x.i((0, .., &idx)).to_vec::<f32>().unwrap(), vec![2.0, 0.0, 6.0, 4.0, 10.0, 8.0]);
    /// assert_eq!(x.i((Index::Ellipsis, Index::NewAxis)).shape(), &[2, 3, 4, 1]);
    /// ```
    #[track_caller]
    pub fn i(&self, subscripts: impl Subscripts) -> Tensor {
        unwrap_or_panic(self.try_i(subscripts))
    }

    /// Fallible [`Tensor::i`].
    pub fn try_i(&self, subscripts: impl Subscripts) -> Result<Tensor> {
        let (view, advanced) = self.basic_indexing(&subscripts.entries())?;
        if advanced.is_empty() {
            return view.unchanged();
        }
        advanced_indexing(&view, advanced)
    }

    /// PyTorch's `x[...] = values` out of place: a copy of this tensor with `values`
    /// (broadcast to the shape `x.i(subscripts)` has, and of this tensor's dtype) written
    /// where that read would read. Where index tensors name a place twice, the last value
    /// in their row-major order wins (PyTorch leaves it undefined). Gradients reach this
    /// tensor (except at the written places) and `values`.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros([2, 3]);
    /// let y = x.i_put((.., 1..), &Tensor::from_vec(vec![7.0f32, 8.0], [2]));
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 7.0, 8.0, 0.0, 7.0, 8.0]);
    /// ```
    #[track_caller]
    pub fn i_put(&self, subscripts: impl Subscripts, values: &Tensor) -> Tensor {
        unwrap_or_panic(self.try_i_put(subscripts, values))
    }

    /// Fallible [`Tensor::i_put`].
    pub fn try_i_put(&self, subscripts: impl Subscripts, values: &Tensor) -> Result<Tensor> {
        let entries = subscripts.entries();
        let places = self.written_places(&entries)?;
        self.scatter_places(&places, values)
    }

    /// [`Tensor::i_put`] in place: PyTorch's `x[...] = values` on this tensor's own
    /// buffer (see the in-place rules of [`Tensor::add_`]). Bool masks in the subscript
    /// are realized once, before the update is recorded.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let x = Tensor::zeros([2, 2]);
    /// x.i_put_((1, ..), &Tensor::ones([2]));
    /// assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 1.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn i_put_(&self, subscripts: impl Subscripts, values: &Tensor) -> &Tensor {
        unwrap_or_panic(self.try_i_put_(subscripts, values))
    }

    /// Fallible [`Tensor::i_put_`].
    pub fn try_i_put_(&self, subscripts: impl Subscripts, values: &Tensor) -> Result<&Tensor> {
        let places = self.written_places(&subscripts.entries())?;
        self.update("i_put_", |x| x.scatter_places(&places, values))
    }

    /// The flat positions in this tensor that `x.i(entries)` reads, in the read's shape.
    fn written_places(&self, entries: &[Index]) -> Result<Tensor> {
        let positions = Tensor::try_arange(0, self.numel() as i64, 1, DType::I64)?
            .try_to(self.device())?
            .try_reshape(self.shape().iter().map(|&d| d as isize).collect::<Vec<_>>())?;
        positions.try_i(entries.to_vec())
    }

    /// A copy of this tensor with `values` (broadcast to `places`' shape) scattered to the
    /// flat positions `places`.
    fn scatter_places(&self, places: &Tensor, values: &Tensor) -> Result<Tensor> {
        if values.dtype() != self.dtype() {
            return Err(KilnError::DTypeMismatch {
                op: "i_put",
                lhs: self.dtype(),
                rhs: values.dtype(),
            });
        }
        let vals = values.try_broadcast_to(places.shape())?.try_reshape([-1])?;
        let shape: Vec<isize> = self.shape().iter().map(|&d| d as isize).collect();
        self.try_reshape([-1])?
            .try_scatter(0, &places.try_reshape([-1])?, &vals)?
            .try_reshape(shape)
    }

    /// Applies the positions, ranges, new axes and ellipsis of `entries` as views; returns
    /// the view and each index tensor (i64, masks turned into their columns) with the
    /// dimension of the view it indexes.
    fn basic_indexing(&self, entries: &[Index]) -> Result<(Tensor, Vec<(usize, Tensor)>)> {
        let shape = self.shape();
        let mut consumed = 0;
        let mut ellipses = 0;
        for e in entries {
            match e {
                Index::At(_) | Index::Slice { .. } => consumed += 1,
                Index::Tensor(t) if t.dtype() == DType::Bool => consumed += t.ndim(),
                Index::Tensor(_) => consumed += 1,
                Index::NewAxis => {}
                Index::Ellipsis => ellipses += 1,
            }
        }
        if ellipses > 1 {
            return Err(invalid(
                shape,
                "an index can only have a single ellipsis".into(),
            ));
        }
        if consumed > self.ndim() {
            return Err(invalid(
                shape,
                format!(
                    "too many indices for a tensor of {} dimensions ({consumed} given)",
                    self.ndim()
                ),
            ));
        }
        let fill = self.ndim() - consumed;
        let mut view = self.clone();
        let mut at = 0usize;
        let mut advanced = Vec::new();
        for e in entries {
            match e {
                Index::At(i) => {
                    let n = view.shape()[at] as i64;
                    if *i < -n || *i >= n {
                        return Err(invalid(
                            shape,
                            format!("index {i} is out of bounds for dimension {at} with size {n}"),
                        ));
                    }
                    view = view.try_select(at as isize, *i)?;
                }
                Index::Slice { start, end, step } => {
                    if *step < 1 {
                        return Err(invalid(
                            shape,
                            format!("slice step must be greater than zero, not {step}"),
                        ));
                    }
                    let n = view.shape()[at] as i64;
                    let clamp = |v: i64| v.clamp(-n - 1, n) as isize;
                    view = view.try_slice_dim(
                        at as isize,
                        clamp(start.unwrap_or(0)),
                        clamp(end.unwrap_or(n)),
                        *step as isize,
                    )?;
                    at += 1;
                }
                Index::NewAxis => {
                    view = view.try_unsqueeze(at as isize)?;
                    at += 1;
                }
                Index::Ellipsis => at += fill,
                Index::Tensor(t) if t.dtype() == DType::Bool && t.ndim() == 0 => {
                    // NumPy's and PyTorch's rule: a new dimension, indexed by [0] (true) or
                    // by nothing (false), broadcasting with the other index tensors.
                    let keep = t.item::<bool>()?;
                    view = view.try_unsqueeze(at as isize)?;
                    let pick = Tensor::try_zeros_dtype([usize::from(keep)], DType::I64)?;
                    advanced.push((at, pick.try_to(view.device())?));
                    at += 1;
                }
                Index::Tensor(t) if t.dtype() == DType::Bool => {
                    let covered = &view.shape()[at..at + t.ndim()];
                    if t.shape() != covered {
                        return Err(KilnError::ShapeMismatch {
                            op: OP,
                            lhs: covered.to_vec(),
                            rhs: t.shape().to_vec(),
                            detail: format!(
                                ": the mask must match the {} dimensions it indexes from dimension {at}",
                                t.ndim()
                            ),
                        });
                    }
                    let nz = t.try_nonzero()?;
                    for c in 0..t.ndim() {
                        let column = nz
                            .try_slice_dim(1, c as isize, c as isize + 1, 1)?
                            .try_reshape([-1])?;
                        advanced.push((at + c, column.try_to(view.device())?));
                    }
                    at += t.ndim();
                }
                Index::Tensor(t) => {
                    advanced.push((at, view.index_operand(OP, t)?));
                    at += 1;
                }
            }
        }
        Ok((view, advanced))
    }
}

/// The pick of the index tensors `advanced` (dimension of `view`, i64 index) from `view`.
fn advanced_indexing(view: &Tensor, advanced: Vec<(usize, Tensor)>) -> Result<Tensor> {
    let dims: Vec<usize> = advanced.iter().map(|(d, _)| *d).collect();
    let idx: Vec<Tensor> = advanced.into_iter().map(|(_, t)| t).collect();
    let mut bshape = idx[0].shape().to_vec();
    for t in &idx[1..] {
        bshape = crate::shape::broadcast_shapes(OP, &bshape, t.shape())?;
    }
    let sizes: Vec<usize> = dims.iter().map(|&d| view.shape()[d]).collect();
    let flat = super::indexing::flat_places(&idx, &sizes, &bshape, view.device())?;
    let rest: Vec<usize> = (0..view.ndim()).filter(|d| !dims.contains(d)).collect();
    let perm: Vec<isize> = dims.iter().chain(&rest).map(|&d| d as isize).collect();
    let rest_shape: Vec<isize> = rest.iter().map(|&d| view.shape()[d] as isize).collect();
    let places: usize = sizes.iter().product();
    let mut rows_shape = vec![places as isize];
    rows_shape.extend_from_slice(&rest_shape);
    let picked = view
        .try_permute(perm)?
        .try_reshape(rows_shape)?
        .try_index_select(0, &flat.try_reshape([-1])?)?;
    let mut out_shape: Vec<isize> = bshape.iter().map(|&d| d as isize).collect();
    out_shape.extend_from_slice(&rest_shape);
    let out = picked.try_reshape(out_shape)?;
    // Adjacent index dimensions: their result dimensions go where they stood.
    let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
    let first = dims[0];
    if !adjacent || first == 0 {
        return Ok(out);
    }
    let (nb, nr) = (bshape.len(), rest.len());
    let perm: Vec<isize> = (nb..nb + first)
        .chain(0..nb)
        .chain(nb + first..nb + nr)
        .map(|d| d as isize)
        .collect();
    out.try_permute(perm)
}
