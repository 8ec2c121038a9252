//! Reading and writing tensors: checkpoints and data interchange.
//!
//! - [`safetensors`]: named tensors of every kiln dtype in the
//!   safetensors format (what PyTorch checkpoints are shared as), with optional string
//!   metadata; [`load_into`] restores a checkpoint into existing parameters in place,
//!   checking names, shapes and dtypes first.
//! - [`npy`]: single arrays in NumPy's `.npy` format (C or Fortran order, either byte
//!   order on reading).
//! - `ndarray` (cargo feature `ndarray`): `Tensor::from_ndarray` / `Tensor::to_ndarray`
//!   conversions with the `ndarray` crate, for any memory layout.
//!
//! Everything loaded is a realized CPU tensor in its own buffer (a copy of the file's
//! bytes). Saving realizes what it writes first; tensors on other devices are read back to
//! the host.
//!
//! ```
//! use kiln::{DType, Tensor};
//!
//! let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
//! let step = Tensor::scalar(7i64);
//! let bytes = kiln::io::save_to_bytes(&[("w", &w), ("step", &step)]).unwrap();
//! let loaded = kiln::io::load_from_bytes(&bytes).unwrap();
//! let (_, t) = loaded.iter().find(|(name, _)| name == "w").unwrap();
//! assert_eq!((t.shape(), t.dtype()), (&[2usize, 2][..], DType::F32));
//! assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
//! ```
//!
//! # Errors
//!
//! Failures of the file system (open, read, write, rename) are
//! [`KilnError::Backend`] with `backend: "io"` and a message naming the operation and the
//! path. Files that are not valid for their format, or that hold something kiln cannot
//! represent (a safetensors `I16` tensor, a NumPy `<u2` array), are
//! [`KilnError::InvalidArgument`] naming the operation and, where there is one, the tensor.
//! Nothing in a file's bytes can make these functions panic.

pub mod npy;
pub mod safetensors;

#[cfg(feature = "ndarray")]
pub mod ndarray;

pub use self::npy::{read_npy, read_npy_bytes, write_npy, write_npy_bytes};
pub use self::safetensors::{
    TensorsWithMetadata, load, load_from_bytes, load_into, load_into_from_bytes, load_state_dict,
    load_state_dict_from_bytes, load_with_metadata, load_with_metadata_from_bytes, save,
    save_state_dict, save_state_dict_to_bytes, save_to_bytes, save_with_metadata,
    save_with_metadata_to_bytes,
};

use crate::error::KilnError;
use std::path::Path;

/// A file-system failure of `op` on `path`.
pub(crate) fn io_error(op: &'static str, path: &Path, err: &std::io::Error) -> KilnError {
    KilnError::Io {
        op,
        path: path.display().to_string(),
        kind: err.kind(),
        message: err.to_string(),
    }
}

/// Bytes that are not a valid file of the format `op` reads (or that kiln cannot represent).
pub(crate) fn format_error(op: &'static str, reason: impl Into<String>) -> KilnError {
    KilnError::InvalidArgument {
        op,
        shape: vec![],
        reason: reason.into(),
    }
}

/// Reads a whole file.
pub(crate) fn read_file(op: &'static str, path: &Path) -> crate::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| io_error(op, path, &e))
}
