//! [`View`]: how a logical tensor of some shape reads a flat buffer.
//!
//! Element at coordinates `i` lives at `offset + Σ i_k·strides_k`. Strides are in elements and
//! may be zero (broadcast) or negative (flip). An optional `mask` gives, per dimension, the
//! valid range `[lo, hi)`; coordinates outside it are padding and read the pad value instead of
//! memory (their computed offset may lie outside the buffer and is never used).
//!
//! Every [`Movement`] applies to a view and yields one view, except a reshape whose dimensions
//! cannot be regrouped with the existing strides; [`View::apply`] returns `None` then, and the
//! planner inserts an explicit copy. There are no stacked views.

use super::{contiguous_strides, numel};
use crate::dtype::Scalar;

/// `start..end` stepping by `step` (≥ 1) along one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SliceRange {
    /// First index selected.
    pub start: usize,
    /// One past the last index that may be selected (exclusive).
    pub end: usize,
    /// Distance between selected indices (≥ 1).
    pub step: usize,
}

impl SliceRange {
    /// Number of elements the range selects.
    pub fn len(&self) -> usize {
        if self.end <= self.start {
            0
        } else {
            (self.end - self.start).div_ceil(self.step)
        }
    }

    /// True when the range selects nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A zero-copy movement op. Arguments are validated when the op is recorded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Movement {
    /// New shape with the same element count.
    Reshape(Vec<usize>),
    /// `perm[i]` is the input dimension that becomes output dimension `i`.
    Permute(Vec<usize>),
    /// Same rank; size-1 dimensions grow to the new size (stride 0).
    Expand(Vec<usize>),
    /// A strided range per dimension.
    Slice(Vec<SliceRange>),
    /// `(before, after)` elements of `value` around each dimension.
    Pad {
        /// `(before, after)` per dimension.
        pads: Vec<(usize, usize)>,
        /// The pad value.
        value: Scalar,
    },
    /// Reverse the listed dimensions.
    Flip(Vec<usize>),
}

impl Movement {
    /// Short name for dumps.
    pub fn name(&self) -> &'static str {
        match self {
            Movement::Reshape(_) => "reshape",
            Movement::Permute(_) => "permute",
            Movement::Expand(_) => "expand",
            Movement::Slice(_) => "slice",
            Movement::Pad { .. } => "pad",
            Movement::Flip(_) => "flip",
        }
    }

    /// The shape this movement produces from `input` (a movement that was recorded, so
    /// its sizes were checked; see [`Movement::checked_output_shape`]).
    pub fn output_shape(&self, input: &[usize]) -> Vec<usize> {
        match self {
            Movement::Pad { pads, .. } => input
                .iter()
                .zip(pads)
                .map(|(&n, &(b, a))| n.saturating_add(b).saturating_add(a))
                .collect(),
            _ => self.checked_output_shape(input).unwrap_or_default(),
        }
    }

    /// The shape this movement produces from `input`, or `None` when a padded extent
    /// overflows or an argument does not fit `input`.
    pub fn checked_output_shape(&self, input: &[usize]) -> Option<Vec<usize>> {
        Some(match self {
            Movement::Reshape(s) | Movement::Expand(s) => s.clone(),
            Movement::Permute(p) => p
                .iter()
                .map(|&i| input.get(i).copied())
                .collect::<Option<_>>()?,
            Movement::Slice(r) => r.iter().map(|r| r.len()).collect(),
            Movement::Pad { pads, .. } => input
                .iter()
                .zip(pads)
                .map(|(&n, &(b, a))| n.checked_add(b)?.checked_add(a))
                .collect::<Option<_>>()?,
            Movement::Flip(_) => input.to_vec(),
        })
    }
}

/// Shape, strides, offset and mask of a logical tensor over a flat buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct View {
    /// The logical shape.
    pub shape: Vec<usize>,
    /// Per dimension, elements between neighbouring coordinates (0: broadcast, negative: flip).
    pub strides: Vec<isize>,
    /// Buffer element at coordinates all zero.
    pub offset: isize,
    /// Per dimension, the valid range `[lo, hi)`; `None` when every coordinate is valid.
    pub mask: Option<Vec<(usize, usize)>>,
}

impl View {
    /// The row-major view of a freshly allocated buffer.
    pub fn contiguous(shape: &[usize]) -> View {
        View {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
            mask: None,
        }
        .normalized()
    }

    /// For a view that reads a row-major buffer of shape `src` with its axes permuted (no
    /// offset, no mask, each axis of `self` of size above one is an axis of `src`): the
    /// view, with `src`'s shape, of where each `src` element lands in a row-major buffer of
    /// `self.shape`. Writing `src`'s values through it lays them out as reading them through
    /// `self` and storing row-major would. `None` for any other view.
    ///
    /// ```
    /// use kiln::shape::{Movement, View};
    /// // [2, 3, 4] seen as [3, 2, 4] (axes 0 and 1 swapped) ...
    /// let seen = View::contiguous(&[2, 3, 4]).apply(&Movement::Permute(vec![1, 0, 2])).unwrap();
    /// // ... puts element (i, j, k) at j·8 + i·4 + k of a row-major [3, 2, 4] buffer.
    /// let into = seen.permuted_into_row_major(&[2, 3, 4]).unwrap();
    /// assert_eq!(into.strides, vec![4, 8, 1]);
    /// assert!(View::contiguous(&[6, 4]).permuted_into_row_major(&[2, 3, 4]).is_none());
    /// ```
    pub fn permuted_into_row_major(&self, src: &[usize]) -> Option<View> {
        if self.offset != 0 || self.mask.is_some() || self.ndim() != src.len() {
            return None;
        }
        let src_strides = contiguous_strides(src);
        let row_major = contiguous_strides(&self.shape);
        let mut strides = vec![0isize; src.len()];
        let mut used = vec![false; src.len()];
        for (i, (&n, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            if n == 1 {
                continue;
            }
            let j = (0..src.len()).find(|&j| !used[j] && src[j] == n && src_strides[j] == s)?;
            used[j] = true;
            strides[j] = row_major[i];
        }
        // Every other axis of `src` has one coordinate.
        if (0..src.len()).any(|j| !used[j] && src[j] != 1) {
            return None;
        }
        Some(View {
            shape: src.to_vec(),
            strides,
            offset: 0,
            mask: None,
        })
    }

    /// Where a matrix product of shape `product` (`[batch.., m, n]`) can be written so that
    /// reading it through `self` gives what a kernel reads: the product's own row-major
    /// layout when `self` is that layout, else [`View::permuted_into_row_major`] if the
    /// product's rows stay unit-stride there (its last axis kept last). `None` otherwise.
    pub fn product_placement(&self, product: &[usize]) -> Option<View> {
        if *self == View::contiguous(product) {
            return Some(View::contiguous(product));
        }
        self.permuted_into_row_major(product)
            .filter(|v| product.last() == Some(&1) || v.strides.last() == Some(&1))
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of logical elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Row-major, unmasked, starting at offset 0: reads the buffer exactly in order.
    pub fn is_contiguous(&self) -> bool {
        self.mask.is_none() && self.offset == 0 && self.strides_are_contiguous()
    }

    fn strides_are_contiguous(&self) -> bool {
        let cs = contiguous_strides(&self.shape);
        self.shape
            .iter()
            .zip(self.strides.iter().zip(&cs))
            .all(|(&n, (&s, &c))| n <= 1 || s == c)
    }

    /// True when no coordinate is valid (everything reads the pad value).
    pub fn is_fully_masked(&self) -> bool {
        self.numel() > 0
            && self
                .mask
                .as_ref()
                .is_some_and(|m| m.iter().any(|&(lo, hi)| lo >= hi))
    }

    /// The valid range of dimension `d`.
    pub fn valid_range(&self, d: usize) -> (usize, usize) {
        match &self.mask {
            Some(m) => m[d],
            None => (0, self.shape[d]),
        }
    }

    /// Buffer offset of the element at `coords`, or `None` where the mask says padding.
    pub fn index_of(&self, coords: &[usize]) -> Option<isize> {
        if self.is_fully_masked() {
            return None;
        }
        if let Some(m) = &self.mask
            && coords
                .iter()
                .zip(m)
                .any(|(&c, &(lo, hi))| c < lo || c >= hi)
        {
            return None;
        }
        let off = coords
            .iter()
            .zip(&self.strides)
            .fold(self.offset as i128, |acc, (&c, &s)| {
                acc + c as i128 * s as i128
            });
        isize::try_from(off).ok()
    }

    /// Smallest and largest buffer offsets any valid coordinate reads, or `None` if nothing is
    /// read. Computed in 128-bit arithmetic and saturated to `isize`, so a view whose offsets
    /// do not fit reports bounds no buffer satisfies. The backends check `0 <= min` and
    /// `max < buffer length` before running a kernel, which is what makes their unchecked
    /// inner loops sound.
    pub fn offset_bounds(&self) -> Option<(isize, isize)> {
        if self.shape.contains(&0) || self.is_fully_masked() {
            return None;
        }
        let (mut lo_off, mut hi_off) = (self.offset as i128, self.offset as i128);
        for d in 0..self.ndim() {
            let (lo, hi) = self.valid_range(d);
            let s = self.strides[d] as i128;
            let a = lo as i128 * s;
            let b = (hi as i128 - 1) * s;
            lo_off += a.min(b);
            hi_off += a.max(b);
        }
        let sat = |x: i128| x.clamp(isize::MIN as i128, isize::MAX as i128) as isize;
        Some((sat(lo_off), sat(hi_off)))
    }

    /// Smallest and largest offsets of any coordinate of the shape, masked or not (what a
    /// backend may compute, though it never reads masked ones), in 128-bit arithmetic.
    pub fn box_bounds(&self) -> Option<(i128, i128)> {
        if self.shape.contains(&0) {
            return None;
        }
        let (mut lo, mut hi) = (self.offset as i128, self.offset as i128);
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            let far = (n as i128 - 1) * s as i128;
            lo += far.min(0);
            hi += far.max(0);
        }
        Some((lo, hi))
    }

    /// Whether every offset [`View::box_bounds`] allows (masked coordinates included),
    /// counted in bytes of `elem_bytes`-byte elements, fits an `isize`: backends' address
    /// arithmetic over such a view cannot wrap. An empty view fits.
    pub fn offsets_fit(&self, elem_bytes: usize) -> bool {
        let limit = (isize::MAX as usize / elem_bytes.max(1)) as i128;
        self.box_bounds()
            .is_none_or(|(lo, hi)| lo >= -limit && hi <= limit)
    }

    /// Applies one movement; `None` when a reshape cannot be expressed with strides.
    pub fn apply(&self, m: &Movement) -> Option<View> {
        let v = match m {
            Movement::Reshape(s) => return self.reshape(s),
            Movement::Permute(p) => self.permute(p),
            Movement::Expand(s) => self.expand(s),
            Movement::Slice(r) => self.slice(r),
            Movement::Pad { pads, .. } => self.pad(pads),
            Movement::Flip(axes) => self.flip(axes),
        };
        Some(v)
    }

    /// Applies a chain of movements in order.
    pub fn apply_all<'a>(&self, chain: impl IntoIterator<Item = &'a Movement>) -> Option<View> {
        let mut v = self.clone();
        for m in chain {
            v = v.apply(m)?;
        }
        Some(v)
    }

    fn permute(&self, perm: &[usize]) -> View {
        View {
            shape: perm.iter().map(|&i| self.shape[i]).collect(),
            strides: perm.iter().map(|&i| self.strides[i]).collect(),
            offset: self.offset,
            mask: self
                .mask
                .as_ref()
                .map(|m| perm.iter().map(|&i| m[i]).collect()),
        }
        .normalized()
    }

    fn expand(&self, new_shape: &[usize]) -> View {
        let mut v = self.clone();
        for (d, &n) in new_shape.iter().enumerate() {
            if v.shape[d] != n {
                // Only size-1 dimensions expand (checked when recorded).
                v.shape[d] = n;
                v.strides[d] = 0;
                if let Some(m) = &mut v.mask {
                    m[d] = if m[d].0 < m[d].1 { (0, n) } else { (0, 0) };
                }
            }
        }
        v.normalized()
    }

    fn slice(&self, ranges: &[SliceRange]) -> View {
        let mut v = self.clone();
        for (d, r) in ranges.iter().enumerate() {
            let n_new = r.len();
            let (start, step) = (r.start as isize, r.step as isize);
            if let Some(m) = &mut v.mask {
                let (lo, hi) = (m[d].0 as isize, m[d].1 as isize);
                let lo2 = div_ceil_i(lo - start, step).clamp(0, n_new as isize);
                let hi2 = div_ceil_i(hi - start, step).clamp(0, n_new as isize);
                m[d] = if hi2 > lo2 {
                    (lo2 as usize, hi2 as usize)
                } else {
                    (0, 0)
                };
            }
            if n_new > 0 {
                v.offset = v.offset.saturating_add(start.saturating_mul(v.strides[d]));
            }
            v.strides[d] = v.strides[d].saturating_mul(step);
            v.shape[d] = n_new;
        }
        v.normalized()
    }

    fn pad(&self, pads: &[(usize, usize)]) -> View {
        let mut mask = self
            .mask
            .clone()
            .unwrap_or_else(|| self.shape.iter().map(|&n| (0, n)).collect());
        let mut v = self.clone();
        for (d, &(b, a)) in pads.iter().enumerate() {
            let (lo, hi) = mask[d];
            mask[d] = if lo < hi {
                (lo.saturating_add(b), hi.saturating_add(b))
            } else {
                (0, 0)
            };
            let shift = (b.min(isize::MAX as usize) as isize).saturating_mul(v.strides[d]);
            v.offset = v.offset.saturating_sub(shift);
            v.shape[d] = v.shape[d].saturating_add(b).saturating_add(a);
        }
        v.mask = Some(mask);
        v.normalized()
    }

    fn flip(&self, axes: &[usize]) -> View {
        let mut v = self.clone();
        for &d in axes {
            let n = v.shape[d];
            if n > 0 {
                let far = (n as isize - 1).saturating_mul(v.strides[d]);
                v.offset = v.offset.saturating_add(far);
            }
            v.strides[d] = -v.strides[d];
            if let Some(m) = &mut v.mask {
                let (lo, hi) = m[d];
                m[d] = if lo < hi { (n - hi, n - lo) } else { (0, 0) };
            }
        }
        v.normalized()
    }

    fn reshape(&self, new_shape: &[usize]) -> Option<View> {
        if numel(new_shape) == 0 || self.numel() == 0 {
            return Some(View::contiguous(new_shape));
        }
        if self.is_fully_masked() {
            return Some(View::fully_masked(new_shape));
        }
        if self.mask.is_none() && self.strides_are_contiguous() {
            let mut v = View::contiguous(new_shape);
            v.offset = self.offset;
            return Some(v);
        }
        // Non-unit dimensions of the old and new shapes, grouped by equal products.
        let old: Vec<usize> = (0..self.ndim()).filter(|&d| self.shape[d] != 1).collect();
        let new: Vec<usize> = (0..new_shape.len())
            .filter(|&d| new_shape[d] != 1)
            .collect();
        let mut strides = vec![0isize; new_shape.len()];
        let mut mask: Vec<(usize, usize)> = new_shape.iter().map(|&n| (0, n)).collect();
        let (mut i, mut j) = (0, 0);
        while i < old.len() || j < new.len() {
            let (gi, gj) = (i, j);
            if i >= old.len() || j >= new.len() {
                return None;
            }
            let (mut po, mut pn) = (self.shape[old[i]], new_shape[new[j]]);
            i += 1;
            j += 1;
            while po != pn {
                if po < pn {
                    po *= *old.get(i).map(|&d| &self.shape[d])?;
                    i += 1;
                } else {
                    pn *= *new.get(j).map(|&d| new_shape[d]).as_ref()?;
                    j += 1;
                }
            }
            let g_old = &old[gi..i];
            let g_new = &new[gj..j];
            // The old dims of a group must be one run of memory.
            for w in g_old.windows(2) {
                let (a, b) = (w[0], w[1]);
                if self.strides[a] != self.strides[b] * self.shape[b] as isize {
                    return None;
                }
            }
            // Masks survive only a one-to-one group; merged or split dims must be fully valid.
            if g_old.len() == 1 && g_new.len() == 1 {
                mask[g_new[0]] = self.valid_range(g_old[0]);
            } else if g_old
                .iter()
                .any(|&d| self.valid_range(d) != (0, self.shape[d]))
            {
                return None;
            }
            let mut s = self.strides[*g_old.last()?];
            for &d in g_new.iter().rev() {
                strides[d] = s;
                s = s.saturating_mul(new_shape[d] as isize);
            }
        }
        Some(
            View {
                shape: new_shape.to_vec(),
                strides,
                offset: self.offset,
                mask: Some(mask),
            }
            .normalized(),
        )
    }

    /// A view that reads only padding. A 0-dimensional one has no dimension to carry the
    /// empty range, so its mask is the single entry `(0, 0)`: the one exception to
    /// `mask.len() == ndim`, recognised by [`View::is_fully_masked`].
    fn fully_masked(shape: &[usize]) -> View {
        View {
            shape: shape.to_vec(),
            strides: vec![0; shape.len()],
            offset: 0,
            mask: Some(vec![(0, 0); shape.len().max(1)]),
        }
    }

    /// Canonical form: full-range masks dropped, fully masked views zeroed, and size-1
    /// dimensions given stride 0, so equal views compare equal.
    fn normalized(mut self) -> View {
        if self.is_fully_masked() {
            return View::fully_masked(&self.shape);
        }
        for d in 0..self.ndim() {
            if self.shape[d] == 1 {
                self.strides[d] = 0;
            }
        }
        if let Some(m) = &self.mask
            && m.iter()
                .zip(&self.shape)
                .all(|(&(lo, hi), &n)| lo == 0 && hi == n)
        {
            self.mask = None;
        }
        self
    }
}

fn div_ceil_i(a: isize, b: isize) -> isize {
    let q = a.div_euclid(b);
    if a.rem_euclid(b) != 0 { q + 1 } else { q }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Materializes a view over `data` by brute force (`None` = padding).
    fn read(v: &View, data: &[i64]) -> Vec<Option<i64>> {
        let mut out = vec![];
        let n = v.numel();
        for flat in 0..n {
            let mut coords = vec![0; v.ndim()];
            let mut r = flat;
            for d in (0..v.ndim()).rev() {
                coords[d] = r % v.shape[d];
                r /= v.shape[d];
            }
            out.push(v.index_of(&coords).map(|i| data[i as usize]));
        }
        out
    }

    #[test]
    fn transpose_then_flatten_needs_a_copy() {
        let v = View::contiguous(&[2, 3])
            .apply(&Movement::Permute(vec![1, 0]))
            .unwrap();
        assert!(v.apply(&Movement::Reshape(vec![6])).is_none());
        // but splitting a transposed dim is fine
        let v = View::contiguous(&[4, 3])
            .apply(&Movement::Permute(vec![1, 0]))
            .unwrap();
        let r = v.apply(&Movement::Reshape(vec![3, 2, 2])).unwrap();
        let data: Vec<i64> = (0..12).collect();
        let expect: Vec<Option<i64>> = [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]
            .iter()
            .map(|&x| Some(x))
            .collect();
        assert_eq!(read(&r, &data), expect);
    }

    #[test]
    fn slice_with_step_multiplies_stride() {
        let v = View::contiguous(&[10])
            .apply(&Movement::Slice(vec![SliceRange {
                start: 1,
                end: 8,
                step: 3,
            }]))
            .unwrap();
        assert_eq!(v.shape, vec![3]);
        assert_eq!(v.strides, vec![3]);
        assert_eq!(v.offset, 1);
    }

    #[test]
    fn flip_and_pad_compose_into_one_view() {
        let data: Vec<i64> = (0..4).collect();
        let v = View::contiguous(&[4])
            .apply(&Movement::Flip(vec![0]))
            .unwrap()
            .apply(&Movement::Pad {
                pads: vec![(2, 1)],
                value: Scalar::Int(0),
            })
            .unwrap();
        assert_eq!(
            read(&v, &data),
            vec![None, None, Some(3), Some(2), Some(1), Some(0), None]
        );
        let f = v.apply(&Movement::Flip(vec![0])).unwrap();
        assert_eq!(
            read(&f, &data),
            vec![None, Some(0), Some(1), Some(2), Some(3), None, None]
        );
        let s = f
            .apply(&Movement::Slice(vec![SliceRange {
                start: 0,
                end: 7,
                step: 2,
            }]))
            .unwrap();
        assert_eq!(read(&s, &data), vec![None, Some(1), Some(3), None]);
    }

    #[test]
    fn slicing_into_padding_is_fully_masked() {
        let v = View::contiguous(&[3])
            .apply(&Movement::Pad {
                pads: vec![(2, 0)],
                value: Scalar::Int(0),
            })
            .unwrap()
            .apply(&Movement::Slice(vec![SliceRange {
                start: 0,
                end: 2,
                step: 1,
            }]))
            .unwrap();
        assert!(v.is_fully_masked());
        assert_eq!(v.offset_bounds(), None);
    }

    #[test]
    fn reshape_keeps_one_to_one_masks_and_rejects_merging_masked_dims() {
        let v = View::contiguous(&[3, 4])
            .apply(&Movement::Pad {
                pads: vec![(1, 0), (0, 0)],
                value: Scalar::Int(0),
            })
            .unwrap();
        let u = v.apply(&Movement::Reshape(vec![4, 1, 2, 2])).unwrap();
        let data: Vec<i64> = (0..12).collect();
        let mut expect = vec![None; 4];
        expect.extend((0..12).map(Some));
        assert_eq!(read(&u, &data), expect);
        assert!(v.apply(&Movement::Reshape(vec![16])).is_none());
    }

    #[test]
    fn expand_gives_zero_stride_and_bounds_cover_reads() {
        let v = View::contiguous(&[3, 1])
            .apply(&Movement::Expand(vec![3, 5]))
            .unwrap();
        assert_eq!(v.strides, vec![1, 0]);
        assert_eq!(v.offset_bounds(), Some((0, 2)));
        let f = View::contiguous(&[2, 3])
            .apply(&Movement::Flip(vec![0, 1]))
            .unwrap();
        assert_eq!(f.offset_bounds(), Some((0, 5)));
    }

    #[test]
    fn permuted_views_give_where_each_element_lands() {
        let src = [2, 3, 1, 4];
        let at = |perm: Vec<usize>| {
            View::contiguous(&src)
                .apply(&Movement::Permute(perm))
                .unwrap()
                .permuted_into_row_major(&src)
        };
        // The identity is the row-major layout itself.
        let id = at(vec![0, 1, 2, 3]).unwrap();
        assert_eq!(id.shape, src.to_vec());
        assert_eq!((id.strides[0], id.strides[1], id.strides[3]), (12, 4, 1));
        // [3, 2, 4, 1] row-major: element (i, j, 0, k) of `src` at j·8 + i·4 + k.
        let p = at(vec![1, 0, 3, 2]).unwrap();
        assert_eq!((p.strides[0], p.strides[1], p.strides[3]), (4, 8, 1));
        for i in 0..2 {
            for j in 0..3 {
                for k in 0..4 {
                    assert_eq!(
                        p.index_of(&[i, j, 0, k]),
                        Some((j * 8 + i * 4 + k) as isize)
                    );
                }
            }
        }
        // Anything but a pure permutation has no such layout.
        let v = View::contiguous(&src);
        let range = |start, end| SliceRange {
            start,
            end,
            step: 1,
        };
        let sliced = v
            .apply(&Movement::Slice(vec![
                range(0, 2),
                range(1, 3),
                range(0, 1),
                range(0, 4),
            ]))
            .unwrap();
        assert!(sliced.permuted_into_row_major(&[2, 2, 1, 4]).is_none());
        let flipped = v.apply(&Movement::Flip(vec![1])).unwrap();
        assert!(flipped.permuted_into_row_major(&src).is_none());
        let padded = v
            .apply(&Movement::Pad {
                pads: vec![(0, 0), (0, 0), (0, 0), (0, 1)],
                value: crate::dtype::Scalar::Float(0.0),
            })
            .unwrap();
        assert!(padded.permuted_into_row_major(&[2, 3, 1, 5]).is_none());
        let reshaped = View::contiguous(&[6, 4]);
        assert!(reshaped.permuted_into_row_major(&src).is_none());
        let expanded = View::contiguous(&[2, 1, 4])
            .apply(&Movement::Expand(vec![2, 3, 4]))
            .unwrap();
        assert!(expanded.permuted_into_row_major(&[2, 3, 4]).is_none());
    }
}
