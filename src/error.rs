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
        /// The op the user called.
        op: &'static str,
        /// Shape of the left (first) operand.
        lhs: Vec<usize>,
        /// Shape of the right (second) operand.
        rhs: Vec<usize>,
        /// Extra words after the shapes (may be empty, else starts with ": ").
        detail: String,
    },
    /// An axis outside `0..ndim` (negative axes count from the end).
    #[error("{op}: axis {axis} is out of range for a tensor of shape {shape:?}")]
    InvalidAxis {
        /// The op the user called.
        op: &'static str,
        /// The axis as the user gave it (possibly negative).
        axis: isize,
        /// Shape of the tensor the axis refers to.
        shape: Vec<usize>,
    },
    /// A shape argument that makes no sense for the input (wrong rank, element count, sizes).
    #[error("{op}: cannot turn shape {shape:?} into {requested:?}: {reason}")]
    InvalidShape {
        /// The op the user called.
        op: &'static str,
        /// Shape of the input tensor.
        shape: Vec<usize>,
        /// The shape argument as the user gave it (`-1` entries included).
        requested: Vec<isize>,
        /// Why the requested shape is rejected.
        reason: String,
    },
    /// An argument that is not a shape but still wrong (a slice bound, a permutation).
    #[error("{op}: invalid argument for shape {shape:?}: {reason}")]
    InvalidArgument {
        /// The op the user called.
        op: &'static str,
        /// Shape of the input tensor.
        shape: Vec<usize>,
        /// What is wrong with the argument.
        reason: String,
    },
    /// The op does not accept this dtype.
    #[error("{op}: dtype {dtype} is not supported{detail}")]
    UnsupportedDType {
        /// The op the user called.
        op: &'static str,
        /// The rejected dtype.
        dtype: DType,
        /// Extra words after "is not supported" (may be empty, else starts with a separator,
        /// e.g. `": parameters must be float"`).
        detail: String,
    },
    /// Two dtypes that must agree do not (and kiln does not promote them here).
    #[error("{op}: dtypes {lhs} and {rhs} do not match")]
    DTypeMismatch {
        /// The op the user called.
        op: &'static str,
        /// Dtype of the left (first) operand.
        lhs: DType,
        /// Dtype of the right (second) operand.
        rhs: DType,
    },
    /// Operands live on different devices.
    #[error("{op}: operands are on different devices ({lhs} and {rhs}); move one with .to(device)")]
    DeviceMismatch {
        /// The op the user called.
        op: &'static str,
        /// Device of the left (first) operand.
        lhs: Device,
        /// Device of the right (second) operand.
        rhs: Device,
    },
    /// The data given to a constructor does not fill the shape.
    #[error("{op}: {len} values cannot fill shape {shape:?} ({numel} elements)")]
    DataLength {
        /// The constructor the user called.
        op: &'static str,
        /// Number of values given.
        len: usize,
        /// The requested shape.
        shape: Vec<usize>,
        /// Number of elements the shape holds (the product of its sizes).
        numel: usize,
    },
    /// A shape whose element count or byte size cannot be represented (or exceeds the
    /// per-tensor limit), caught when the op is recorded.
    #[error("{op}: a tensor of shape {shape:?} and dtype {dtype} is too large: {detail}")]
    TooLarge {
        /// The op the user called.
        op: &'static str,
        /// The shape that is too large.
        shape: Vec<usize>,
        /// Dtype of the tensor.
        dtype: DType,
        /// Which limit is exceeded.
        detail: String,
    },
    /// A computation or a read needs a value that an in-place update has overwritten since
    /// it was recorded or realized: an update of that tensor, or of another tensor holding
    /// the same buffer (`x.detach()`, a realized reshape of `x`).
    #[error(
        "a tensor of shape {shape:?} ({dtype}) read here was overwritten in place (buffer version {recorded} -> {now}), by an update of it or of a tensor sharing its buffer such as x.detach(); realize what reads it before updating in place, or keep a copy first (x.copy())"
    )]
    Overwritten {
        /// Shape of the overwritten tensor.
        shape: Vec<usize>,
        /// Dtype of the overwritten tensor.
        dtype: DType,
        /// Buffer version the graph node recorded when the value was realized.
        recorded: u64,
        /// Buffer version now (each in-place write increments it).
        now: u64,
    },
    /// An index tensor held a value outside the indexed dimension (found when the kernel
    /// ran). A kernel's indexed load does not know which op recorded it: its `op` is
    /// [`INDEXED_LOAD`], which names every op that loads through one.
    #[error("{op}: index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange {
        /// The op the user called (e.g. `gather`, `scatter_add`).
        op: &'static str,
        /// The offending index value.
        index: i64,
        /// Size of the indexed dimension.
        size: usize,
    },
    /// An in-place update would write a buffer that a slice from `as_slice` still borrows.
    #[error(
        "{op}: {detail} is borrowed by `as_slice`; drop the slice guard before updating it in place"
    )]
    Borrowed {
        /// The in-place op the user called (`realize` when a planned in-place write is refused).
        op: &'static str,
        /// The borrowed buffer, in words (the message continues with "is borrowed").
        detail: String,
    },
    /// Reading or writing a file failed.
    #[error("{op}: {path}: {message}")]
    Io {
        /// The op the user called (e.g. a save or load function).
        op: &'static str,
        /// The file's path, as displayed.
        path: String,
        /// The kind of the underlying `std::io::Error`.
        kind: std::io::ErrorKind,
        /// The underlying error's message.
        message: String,
    },
    /// An allocation failed even after the cache was trimmed.
    #[error(
        "out of memory on {device}: requested {requested} bytes, {reserved} bytes reserved by kiln, {free} bytes free on the device"
    )]
    OutOfMemory {
        /// The device, as displayed (e.g. `cuda:0`).
        device: String,
        /// Size of the failed request, in bytes.
        requested: usize,
        /// Bytes kiln's allocator had reserved from the device at the time.
        reserved: usize,
        /// Bytes the device reported free (0 when it cannot say).
        free: usize,
    },
    /// A device that is not usable here (no driver, no GPU, feature off).
    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable {
        /// The device, as displayed (e.g. `cuda:0`).
        device: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// NVRTC refused a rendered kernel. Carries the compiler log and the source.
    #[error(
        "NVRTC failed to compile kernel {kernel} for {arch}:\n{log}\n--- source ---\n{source_code}"
    )]
    Compile {
        /// Name of the kernel's entry function.
        kernel: String,
        /// Target architecture (e.g. `sm_90`).
        arch: String,
        /// NVRTC's compiler log.
        log: String,
        /// The rendered CUDA C source.
        source_code: String,
    },
    /// A failure inside a backend (driver call, launch, library).
    #[error("{backend} backend: {message}")]
    Backend {
        /// Which backend failed (e.g. `cuda`, `io`).
        backend: &'static str,
        /// What failed, in words.
        message: String,
    },
    /// A linear-algebra op met a matrix it cannot factor: a singular matrix (`inv`, `solve`)
    /// or one that is not positive-definite (`cholesky`). Found when the input is read.
    #[error(
        "{op}: {}{reason} (input shape {shape:?})",
        .batch.map(|b| format!("(Batch element {b}): ")).unwrap_or_default()
    )]
    Linalg {
        /// The op the user called (e.g. `linalg.inv`).
        op: &'static str,
        /// Shape of the input matrix batch.
        shape: Vec<usize>,
        /// Which matrix of the batch failed (row-major over the batch dimensions); `None`
        /// for a single matrix.
        batch: Option<usize>,
        /// What failed, in PyTorch's words.
        reason: String,
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

/// The `op` of an [`KilnError::IndexOutOfRange`] found by a kernel's indexed load: the ops
/// that record one.
pub const INDEXED_LOAD: &str =
    "indexed load (gather, index_select, embedding, one_hot or cross_entropy targets)";
