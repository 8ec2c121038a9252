//! What the tensor API accepts where PyTorch takes axes or a shape: one axis or several, in
//! any integer type, as a number, an array, a slice or a `Vec` — so `x.sum(1)`,
//! `x.sum([0, 2])`, `x.reshape([2, -1])`, `x.reshape(y.shape())` and
//! `Tensor::zeros([2, 3])` all read as they would in PyTorch. Integer literals need no
//! suffix: axes and `reshape` sizes infer as `i32`, shapes of new tensors as `usize`.

use std::ops::RangeFull;

/// An integer that can name an axis or a size.
pub trait AxisInt: Copy {
    /// The value, widened without loss.
    fn to_i128(self) -> i128;
}

macro_rules! axis_ints {
    ($($t:ty),*) => {$(
        impl AxisInt for $t {
            fn to_i128(self) -> i128 {
                self as i128
            }
        }
    )*};
}
axis_ints!(i32, i64, isize, u32, u64, usize);

/// A list of integers given any way a caller has it.
pub trait IntList {
    /// The integers, widened.
    fn to_ints(&self) -> Vec<i128>;
}

impl<T: AxisInt> IntList for [T] {
    fn to_ints(&self) -> Vec<i128> {
        self.iter().map(|v| v.to_i128()).collect()
    }
}

impl<T: AxisInt, const N: usize> IntList for [T; N] {
    fn to_ints(&self) -> Vec<i128> {
        self.as_slice().to_ints()
    }
}

impl<T: AxisInt> IntList for Vec<T> {
    fn to_ints(&self) -> Vec<i128> {
        self.as_slice().to_ints()
    }
}

/// `()`: no integers (the shape of a 0-d tensor, for `reshape(())`).
impl IntList for () {
    fn to_ints(&self) -> Vec<i128> {
        vec![]
    }
}

impl<L: IntList + ?Sized> IntList for &L {
    fn to_ints(&self) -> Vec<i128> {
        (**self).to_ints()
    }
}

/// Axes of a reduction or view op: one axis (`1`, `-1`), several (`[0, 2]`, `&axes`), or
/// every axis (`..`). Negative axes count from the end.
///
/// ```
/// use kiln::Tensor;
/// let x = Tensor::ones([2, 3, 4]);
/// assert_eq!(x.sum(1).shape(), &[2, 4]);
/// assert_eq!(x.sum([0, -1]).shape(), &[3]);
/// assert_eq!(x.sum(..).shape(), &[] as &[usize]);
/// assert_eq!(x.sum_keepdim(1).shape(), &[2, 1, 4]);
/// ```
pub trait Axes {
    /// The axes as given; `None` means every axis.
    fn axes(&self) -> Option<Vec<i128>>;
}

macro_rules! single_axes {
    ($($t:ty),*) => {$(
        impl Axes for $t {
            fn axes(&self) -> Option<Vec<i128>> {
                Some(vec![self.to_i128()])
            }
        }
    )*};
}
single_axes!(i32, i64, isize, u32, u64, usize);

impl<T: AxisInt> Axes for [T] {
    fn axes(&self) -> Option<Vec<i128>> {
        Some(self.to_ints())
    }
}

impl<T: AxisInt, const N: usize> Axes for [T; N] {
    fn axes(&self) -> Option<Vec<i128>> {
        Some(self.to_ints())
    }
}

impl<T: AxisInt> Axes for Vec<T> {
    fn axes(&self) -> Option<Vec<i128>> {
        Some(self.to_ints())
    }
}

impl Axes for RangeFull {
    fn axes(&self) -> Option<Vec<i128>> {
        None
    }
}

impl<A: Axes + ?Sized> Axes for &A {
    fn axes(&self) -> Option<Vec<i128>> {
        (**self).axes()
    }
}

/// A shape: sizes as `usize` given any way (`[2, 3]`, `&[2, 3]`, `x.shape()`, a `Vec`, `()`
/// for 0-d). Integer literals infer as `usize`, so `[1 << 40]` means what it says.
pub trait ShapeLike {
    /// The sizes.
    fn dims(&self) -> Vec<usize>;
}

impl ShapeLike for [usize] {
    fn dims(&self) -> Vec<usize> {
        self.to_vec()
    }
}

impl<const N: usize> ShapeLike for [usize; N] {
    fn dims(&self) -> Vec<usize> {
        self.to_vec()
    }
}

impl ShapeLike for Vec<usize> {
    fn dims(&self) -> Vec<usize> {
        self.clone()
    }
}

/// `()`: the shape of a 0-d tensor.
impl ShapeLike for () {
    fn dims(&self) -> Vec<usize> {
        vec![]
    }
}

impl<S: ShapeLike + ?Sized> ShapeLike for &S {
    fn dims(&self) -> Vec<usize> {
        (**self).dims()
    }
}

/// Axes as `isize` (values beyond its range saturate, so they stay out of range and are
/// reported by the axis check); `None` for every axis.
pub(crate) fn axis_list(axes: &(impl Axes + ?Sized)) -> Option<Vec<isize>> {
    axes.axes().map(|v| {
        v.into_iter()
            .map(|a| a.clamp(isize::MIN as i128, isize::MAX as i128) as isize)
            .collect()
    })
}
