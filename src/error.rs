//! Typed errors. Every error names the op and the shapes, dtypes or devices involved.

use crate::device::Device;
use crate::dtype::DType;

/// Result alias used throughout kiln.
pub type Result<T, E = KilnError> = std::result::Result<T, E>;

/// Everything that can go wrong, from recording an op to running a kernel.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KilnError {
    /// Two shapes that must broadcast or match do not.
    #[error("{op}: shapes {lhs:?} and {rhs:?} are incompatible{detail}")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
        /// Extra words after the shapes (may be empty, else starts with ": ").
        detail: String,
    },
    /// An axis outside `0..ndim` (negative axes count from the end).
    #[error("{op}: axis {axis} is out of range for a tensor of shape {shape:?}")]
    InvalidAxis {
        op: &'static str,
        axis: isize,
        shape: Vec<usize>,
    },
    /// A shape argument that makes no sense for the input (wrong rank, element count, sizes).
    #[error("{op}: cannot turn shape {shape:?} into {requested:?}: {reason}")]
    InvalidShape {
        op: &'static str,
        shape: Vec<usize>,
        requested: Vec<isize>,
        reason: String,
    },
    /// An argument that is not a shape but still wrong (a slice bound, a permutation).
    #[error("{op}: invalid argument for shape {shape:?}: {reason}")]
    InvalidArgument {
        op: &'static str,
        shape: Vec<usize>,
        reason: String,
    },
    /// The op does not accept this dtype.
    #[error("{op}: dtype {dtype} is not supported{detail}")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        detail: String,
    },
    /// Two dtypes that must agree do not (and kiln does not promote them here).
    #[error("{op}: dtypes {lhs} and {rhs} do not match")]
    DTypeMismatch {
        op: &'static str,
        lhs: DType,
        rhs: DType,
    },
    /// Operands live on different devices.
    #[error("{op}: operands are on different devices ({lhs} and {rhs}); move one with .to(device)")]
    DeviceMismatch {
        op: &'static str,
        lhs: Device,
        rhs: Device,
    },
    /// The data given to a constructor does not fill the shape.
    #[error("{op}: {len} values cannot fill shape {shape:?} ({numel} elements)")]
    DataLength {
        op: &'static str,
        len: usize,
        shape: Vec<usize>,
        numel: usize,
    },
    /// A shape whose element count or byte size cannot be represented (or exceeds the
    /// per-tensor limit), caught when the op is recorded.
    #[error("{op}: a tensor of shape {shape:?} and dtype {dtype} is too large: {detail}")]
    TooLarge {
        op: &'static str,
        shape: Vec<usize>,
        dtype: DType,
        detail: String,
    },
    /// A computation reads a value that an in-place update has overwritten since it was
    /// recorded.
    #[error(
        "a tensor of shape {shape:?} ({dtype}) that this computation reads was overwritten in place (buffer version {recorded} -> {now}); realize the computation before updating in place, or clone the value first"
    )]
    Overwritten {
        shape: Vec<usize>,
        dtype: DType,
        recorded: u64,
        now: u64,
    },
    /// An index tensor held a value outside the indexed dimension (found when the kernel
    /// ran).
    #[error("{op}: index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange {
        op: &'static str,
        index: i64,
        size: usize,
    },
    /// An in-place update would write a buffer that a slice from `as_slice` still borrows.
    #[error(
        "{op}: {detail} is borrowed by `as_slice`; drop the slice guard before updating it in place"
    )]
    Borrowed { op: &'static str, detail: String },
    /// Reading or writing a file failed.
    #[error("{op}: {path}: {message}")]
    Io {
        op: &'static str,
        path: String,
        kind: std::io::ErrorKind,
        message: String,
    },
    /// An allocation failed even after the cache was trimmed.
    #[error(
        "out of memory on {device}: requested {requested} bytes, {reserved} bytes reserved by kiln, {free} bytes free on the device"
    )]
    OutOfMemory {
        device: String,
        requested: usize,
        reserved: usize,
        free: usize,
    },
    /// A device that is not usable here (no driver, no GPU, feature off).
    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable { device: String, reason: String },
    /// NVRTC refused a rendered kernel. Carries the compiler log and the source.
    #[error(
        "NVRTC failed to compile kernel {kernel} for {arch}:\n{log}\n--- source ---\n{source_code}"
    )]
    Compile {
        kernel: String,
        arch: String,
        log: String,
        source_code: String,
    },
    /// A failure inside a backend (driver call, launch, library).
    #[error("{backend} backend: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
    /// A tensor handle whose node is gone (should not happen through the public API).
    #[error("internal error: {0}")]
    Internal(String),
}

impl KilnError {
    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        KilnError::Internal(msg.into())
    }
}
