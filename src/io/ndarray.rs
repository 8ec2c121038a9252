//! Conversions between kiln tensors and `ndarray` arrays (cargo feature `ndarray`).
//!
//! [`Tensor::from_ndarray`] accepts any array, view or owned, of any dimensionality and
//! memory layout: standard (row-major) arrays are copied in one piece; every other layout
//! (Fortran order, permuted or reversed axes, negative strides, stepped slices) is copied
//! element by element in logical order. The result is a realized, row-major CPU tensor.
//! [`Tensor::to_ndarray`] realizes the tensor and returns an owned, standard-layout
//! [`ArrayD`].
//!
//! Element types are kiln's [`Element`] types: `bool`, `u8`, `i32`, `i64`, `half::f16`,
//! `half::bf16`, `f32` and `f64`.
//!
//! ```
//! use kiln::Tensor;
//! use ndarray::{Array2, s};
//!
//! let a = Array2::from_shape_vec((2, 3), vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
//! let t = Tensor::from_ndarray(&a.t()); // a transposed view: Fortran-ordered
//! assert_eq!(t.shape(), &[3, 2]);
//! assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
//!
//! let r = Tensor::from_ndarray(&a.slice(s![.., ..;-2])); // negative stride, every other column
//! assert_eq!(r.to_ndarray::<f32>().unwrap().into_raw_vec_and_offset().0, vec![3.0, 1.0, 6.0, 4.0]);
//! ```
//!
//! # Layouts as views
//!
//! The non-standard copy could often be a cheap kiln view instead. An array whose elements
//! fill one block of memory in some axis order (`as_slice_memory_order()` is `Some`:
//! Fortran order, permuted axes, reversed axes) can be copied with one `memcpy` into a
//! buffer whose shape is the axes sorted by decreasing `|stride|`, then viewed with
//! `permute` (the inverse of that sort) and `flip` (the axes whose stride is negative):
//! movement ops that kiln folds into the reading kernel's indexing, with no copy until then.
//! An array that skips memory (a stepped slice) could be a `slice` with steps over a
//! buffer holding its covering block, at the cost of copying the skipped elements too.

use ::ndarray::{ArrayBase, ArrayD, Data, Dimension, IxDyn};

use crate::dtype::Element;
use crate::error::{KilnError, Result};
use crate::tensor::{Tensor, unwrap_or_panic};

impl Tensor {
    /// A realized CPU tensor holding a copy of `array` (any layout; see [`crate::io::ndarray`]).
    ///
    /// Panics with the error's text where [`Tensor::try_from_ndarray`] fails.
    #[track_caller]
    pub fn from_ndarray<T, S, D>(array: &ArrayBase<S, D>) -> Tensor
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        unwrap_or_panic(Self::try_from_ndarray(array))
    }

    /// Fallible [`Tensor::from_ndarray`].
    ///
    /// # Errors
    /// [`KilnError::TooLarge`] for a shape beyond kiln's per-tensor limit;
    /// [`KilnError::OutOfMemory`] when the buffer cannot be allocated.
    pub fn try_from_ndarray<T, S, D>(array: &ArrayBase<S, D>) -> Result<Tensor>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        let shape = array.shape();
        match array.as_slice() {
            Some(values) => Tensor::try_from_slice(values, shape),
            None => {
                let values: Vec<T> = array.iter().copied().collect();
                Tensor::try_from_slice(&values, shape)
            }
        }
    }

    /// The tensor's values (realized first) as an owned, row-major `ndarray` array.
    ///
    /// # Errors
    /// Any error realizing the tensor. Values convert to `T` as [`Tensor::to_vec`] converts
    /// them.
    pub fn to_ndarray<T: Element>(&self) -> Result<ArrayD<T>> {
        let values = self.to_vec::<T>()?;
        ArrayD::from_shape_vec(IxDyn(self.shape()), values).map_err(|e| KilnError::InvalidShape {
            op: "to_ndarray",
            shape: self.shape().to_vec(),
            requested: self.shape().iter().map(|&d| d as isize).collect(),
            reason: e.to_string(),
        })
    }
}
