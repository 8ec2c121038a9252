//! The user-facing [`Tensor`]: a cheap handle to a lazy graph node.
//!
//! Ops record nodes and return at once; [`Tensor::realize`] plans and runs what the tensor
//! needs. Every op has a `try_` form returning [`Result`] and a panicking form whose panic
//! message is the same error text.

mod activation;
mod combine;
mod composite;
mod creation;
pub(crate) mod custom_grad;
mod display;
mod einsum;
mod elementwise;
mod histogram;
mod indexing;
mod inplace;
mod linalg;
mod masking;
mod matmul;
mod movement;
mod numeric;
mod operators;
mod quantile;
mod realize;
mod reduce;
mod scan;
mod selection;
mod sort;
mod subscript;
mod transfer;

pub use activation::{SELU_ALPHA, SELU_SCALE};
pub use elementwise::Operand;
pub use operators::ScalarOperand;
pub use quantile::QuantileInterpolation;
pub use realize::{RealizeReport, plan_all, realize_all, realize_all_with};
pub use selection::Unique;
pub use subscript::{Index, Subscripts};

use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{KilnError, Result};
use crate::graph::{self, NodeKey, Op};
use crate::memory::buffer::Access;
use std::sync::Arc;

/// A lazily evaluated n-dimensional array.
///
/// Cloning is cheap (it adds a handle to the same node). Dropping the last handle of an
/// unrealized node lets the graph forget it.
///
/// ```
/// use kiln::Tensor;
/// let x = Tensor::arange(0.0, 6.0, 1.0).reshape(&[2, 3]);
/// let y = (&x * 2.0 + 1.0).sum(1);
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![9.0, 27.0]);
/// ```
pub struct Tensor {
    key: NodeKey,
    shape: Vec<usize>,
    dtype: DType,
    device: Device,
}

impl Tensor {
    /// Wraps a key that already carries one handle for this tensor.
    pub(crate) fn from_node(key: NodeKey, shape: Vec<usize>, dtype: DType, device: Device) -> Self {
        Tensor {
            key,
            shape,
            dtype,
            device,
        }
    }

    /// Wraps a key that already carries one handle for this tensor.
    pub(crate) fn wrap(key: NodeKey, shape: Vec<usize>, dtype: DType, device: Device) -> Self {
        Tensor::from_node(key, shape, dtype, device)
    }

    /// A new handle to the node behind `key` (inside a `with_graph` section).
    pub(crate) fn retained(g: &mut graph::Graph, key: NodeKey) -> Result<Tensor> {
        let n = g.node(key)?;
        let (shape, dtype, device) = (n.shape.clone(), n.dtype, n.device);
        g.retain(key);
        Ok(Tensor::from_node(key, shape, dtype, device))
    }

    /// Records `op` over `inputs` (which must already agree on device).
    pub(crate) fn record(
        op: Op,
        inputs: &[&Tensor],
        shape: Vec<usize>,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        crate::shape::check_shape(op.kind_name(), &shape, dtype)?;
        let keys = inputs.iter().map(|t| t.key);
        let key = graph::with_graph(|g| g.add_node(op, keys, shape.clone(), dtype, device))?;
        Ok(Tensor::from_node(key, shape, dtype, device))
    }

    /// `other` (a second operand, an index, a weight) lives on this tensor's device; else a
    /// `DeviceMismatch` for `op` naming this device first.
    pub(crate) fn require_same_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if other.device != self.device {
            return Err(KilnError::DeviceMismatch {
                op,
                lhs: self.device,
                rhs: other.device,
            });
        }
        Ok(())
    }

    /// `other` has this tensor's dtype (checked first) and device; else a `DTypeMismatch`
    /// or `DeviceMismatch` for `op` naming this tensor's first.
    pub(crate) fn require_same_dtype_and_device(
        &self,
        op: &'static str,
        other: &Tensor,
    ) -> Result<()> {
        if other.dtype != self.dtype {
            return Err(KilnError::DTypeMismatch {
                op,
                lhs: self.dtype,
                rhs: other.dtype,
            });
        }
        self.require_same_device(op, other)
    }

    /// The graph node this tensor refers to.
    pub fn node_key(&self) -> NodeKey {
        self.key
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        crate::shape::numel(&self.shape)
    }

    /// True once this tensor's node holds a buffer.
    pub fn is_realized(&self) -> bool {
        graph::with_graph(|g| {
            g.node(self.key)
                .map(|n| n.op == Op::Buffer)
                .unwrap_or(false)
        })
    }

    /// Reads the data back as a `Vec<T>` in row-major order, realizing first if needed. When
    /// `T` is not the tensor's dtype the values are converted as [`Tensor::cast`] converts
    /// them (in the same plan), so `to_vec::<f64>()` of an f32 tensor just works.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.5f32, -2.5], [2]);
    /// assert_eq!(x.to_vec::<f64>().unwrap(), vec![1.5, -2.5]);
    /// assert_eq!(x.to_vec::<i32>().unwrap(), vec![1, -2]);
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let t = self.try_cast(T::DTYPE)?;
        let bytes = t.to_bytes()?;
        let sz = T::DTYPE.size_bytes();
        Ok(bytes.chunks_exact(sz).map(T::read_bytes).collect())
    }

    /// The only element of a one-element tensor, converted to `T` as [`Tensor::to_vec`] does.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(KilnError::InvalidShape {
                op: "item",
                shape: self.shape.clone(),
                requested: vec![],
                reason: "item() needs exactly one element".into(),
            });
        }
        let v = self.to_vec::<T>()?;
        v.first()
            .copied()
            .ok_or_else(|| KilnError::internal("item(): empty read-back"))
    }

    /// Borrows the data of a CPU tensor whose dtype is `T`, without copying: realizes it
    /// first if needed (a view of a realized tensor is copied once into a buffer of its
    /// own). While the returned guard lives, in-place updates of the tensor are refused
    /// with [`KilnError::Borrowed`]; the guard keeps the memory alive even if the tensor is
    /// dropped.
    ///
    /// ```
    /// let x = kiln::Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    /// let s = x.as_slice::<f32>().unwrap();
    /// assert_eq!(&*s, &[1.0, 2.0, 3.0]);
    /// assert!(x.try_add_(1.0).is_err()); // borrowed
    /// drop(s);
    /// x.add_(1.0);
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<SliceGuard<T>> {
        if T::DTYPE != self.dtype {
            return Err(KilnError::DTypeMismatch {
                op: "as_slice",
                lhs: self.dtype,
                rhs: T::DTYPE,
            });
        }
        if self.device != Device::Cpu {
            return Err(KilnError::DeviceMismatch {
                op: "as_slice",
                lhs: self.device,
                rhs: Device::Cpu,
            });
        }
        self.realize()?;
        let (buf, version) = self.realized_buffer()?;
        let len = self.numel();
        if buf.len_bytes() < len * std::mem::size_of::<T>() || buf.device() != Device::Cpu {
            return Err(KilnError::internal("buffer shorter than its tensor"));
        }
        // Waits while an in-place write (another thread's realize) runs on this buffer.
        buf.share(Access::Slice);
        if let Err(e) = self.check_unchanged(&buf, version) {
            buf.unshare(Access::Slice);
            return Err(e);
        }
        Ok(SliceGuard {
            buf,
            len,
            _t: std::marker::PhantomData,
        })
    }

    /// The buffer of this realized tensor and the buffer version its value has.
    fn realized_buffer(&self) -> Result<(Arc<crate::memory::Buffer>, u64)> {
        graph::with_graph(|g| {
            let n = g.node(self.key)?;
            n.buffer
                .clone()
                .map(|b| (b, n.version))
                .ok_or_else(|| KilnError::internal("realized node has no buffer"))
        })
    }

    /// Fails with [`KilnError::Overwritten`] when an in-place write through another tensor
    /// holding the same buffer (`x.detach()`, a realized reshape) has replaced this
    /// tensor's value since it was realized. Called with a hold on `buf` taken, so no write
    /// can start between the check and the read.
    fn check_unchanged(&self, buf: &crate::memory::Buffer, version: u64) -> Result<()> {
        check_unchanged(&self.shape, self.dtype, buf, version)
    }

    /// Realizes (if needed) and returns the raw little-endian bytes, row-major.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let t = if self.device == Device::Cpu {
            self.clone()
        } else {
            self.try_to(Device::Cpu)?
        };
        t.realize()?;
        let (buf, version) = t.realized_buffer()?;
        let len = t.numel() * t.dtype.size_bytes();
        if buf.len_bytes() < len {
            return Err(KilnError::internal("buffer shorter than its tensor"));
        }
        let mut out = vec![0u8; len];
        if len > 0 {
            // A read hold (not a slice's): a write that comes meanwhile waits for the copy
            // instead of failing as it would against a slice the user keeps.
            buf.share(Access::Read);
            if let Err(e) = t.check_unchanged(&buf, version) {
                buf.unshare(Access::Read);
                return Err(e);
            }
            // SAFETY: `buf` is a host buffer (`t` is on the CPU) of at least `len`
            // initialized bytes (allocations are zeroed and kernels write every element),
            // and the hold taken just above keeps in-place writes out until the copy is done.
            unsafe { std::ptr::copy_nonoverlapping(buf.host_ptr(), out.as_mut_ptr(), len) };
            buf.unshare(Access::Read);
        }
        Ok(out)
    }
}

/// `Ok` while `buf` still holds version `version` of a value of `shape` and `dtype`, else
/// [`KilnError::Overwritten`]: an in-place write has replaced that value since.
pub(crate) fn check_unchanged(
    shape: &[usize],
    dtype: DType,
    buf: &crate::memory::Buffer,
    version: u64,
) -> Result<()> {
    let now = buf.version();
    if now == version {
        return Ok(());
    }
    Err(KilnError::Overwritten {
        shape: shape.to_vec(),
        dtype,
        recorded: version,
        now,
    })
}

/// A borrowed view of a realized CPU tensor's data (from [`Tensor::as_slice`]); derefs to
/// `&[T]`. In-place updates of the tensor are refused while it lives.
pub struct SliceGuard<T: Element> {
    buf: Arc<crate::memory::Buffer>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Element> std::ops::Deref for SliceGuard<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the buffer is a host allocation of at least `len * size_of::<T>()`
        // initialized bytes (checked when the guard was made), aligned for `T` (the
        // allocator aligns blocks to 64 bytes; an adopted vector was a `Vec<T>` of this
        // dtype, whose element type has this alignment); the `Arc` keeps it alive; and no
        // kernel writes it while the guard lives: the only writes into an existing buffer
        // are in-place updates, whose realize must take the buffer for writing first
        // (`Buffer::try_write`), which the guard's slice hold refuses.
        unsafe { std::slice::from_raw_parts(self.buf.host_ptr() as *const T, self.len) }
    }
}

impl<T: Element> std::fmt::Debug for SliceGuard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: Element> Drop for SliceGuard<T> {
    fn drop(&mut self) {
        self.buf.unshare(Access::Slice);
    }
}

impl Clone for Tensor {
    fn clone(&self) -> Self {
        graph::with_graph(|g| g.retain(self.key));
        Tensor {
            key: self.key,
            shape: self.shape.clone(),
            dtype: self.dtype,
            device: self.device,
        }
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        graph::release_handle(self.key);
    }
}

/// Panics with the error's text; the panicking API forms use this.
#[track_caller]
pub(crate) fn unwrap_or_panic<T>(r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}
