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

/// One named tensor as a checkpoint (or a state dict) holds it: its shape and dtype
/// (`None` where kiln has no such dtype), and the dtype as the holder describes it.
pub(crate) struct Stored<'a> {
    pub(crate) name: &'a str,
    pub(crate) shape: &'a [usize],
    pub(crate) dtype: Option<crate::dtype::DType>,
    pub(crate) dtype_text: String,
}

impl<'a> Stored<'a> {
    /// How `t`, stored under `name`, is held.
    pub(crate) fn of(name: &'a str, t: &'a crate::tensor::Tensor) -> Stored<'a> {
        Stored {
            name,
            shape: t.shape(),
            dtype: Some(t.dtype()),
            dtype_text: t.dtype().to_string(),
        }
    }
}

/// Every way `stored` differs from `wanted`, one line each: names missing from `stored`,
/// names `stored` has that `wanted` lacks, shape and dtype mismatches (each with both
/// sides), and names `wanted` lists twice. Empty when they match. The lines call the
/// two sides `words.0` (the stored side, "file") and `words.1` (the wanted side,
/// "parameter").
pub(crate) fn mismatches(
    wanted: &[(String, crate::tensor::Tensor)],
    stored: &[Stored],
    words: (&str, &str),
) -> Vec<String> {
    let (held, want) = words;
    use std::collections::{HashMap, HashSet};
    let by_name: HashMap<&str, &Stored> = stored.iter().map(|s| (s.name, s)).collect();
    let mut problems = Vec::new();
    let mut seen = HashSet::with_capacity(wanted.len());
    for (name, p) in wanted {
        if !seen.insert(name.as_str()) {
            problems.push(format!("{want} {name:?} is listed twice"));
            continue;
        }
        let Some(s) = by_name.get(name.as_str()) else {
            problems.push(format!(
                "missing in {held}: {name:?} ({} {:?})",
                p.dtype(),
                p.shape()
            ));
            continue;
        };
        if s.shape != p.shape() {
            problems.push(format!(
                "shape mismatch for {name:?}: {held} has {:?}, {want} has {:?}",
                s.shape,
                p.shape()
            ));
        }
        if s.dtype != Some(p.dtype()) {
            problems.push(format!(
                "dtype mismatch for {name:?}: {held} has {}, {want} has {}",
                s.dtype_text,
                p.dtype()
            ));
        }
    }
    for s in stored {
        if !seen.contains(s.name) {
            problems.push(format!(
                "unexpected in {held}: {:?} ({} {:?})",
                s.name, s.dtype_text, s.shape
            ));
        }
    }
    problems
}

/// The one error reporting every line of `problems` under `what` (a summary sentence).
pub(crate) fn mismatch_error(op: &'static str, what: &str, problems: &[String]) -> KilnError {
    let count = problems.len();
    format_error(
        op,
        format!(
            "{what} ({count} problem{}):\n  - {}",
            if count == 1 { "" } else { "s" },
            problems.join("\n  - ")
        ),
    )
}
