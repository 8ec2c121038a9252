//! Named tensors in the safetensors format: checkpoints, and weights shared with PyTorch.
//!
//! A file is an 8-byte little-endian header length `N`, `N` bytes of JSON mapping each
//! tensor name to its dtype, shape and `[begin, end)` byte range in the data section (plus
//! an optional `"__metadata__"` object of strings), then the data: every tensor row-major
//! and little-endian, packed without gaps. Reading and writing go through the
//! `safetensors` crate, which validates every offset and size before anything is read.
//!
//! | kiln | safetensors |
//! |------|-------------|
//! | bool | BOOL |
//! | u8   | U8   |
//! | i32  | I32  |
//! | i64  | I64  |
//! | f16  | F16  |
//! | bf16 | BF16 |
//! | f32  | F32  |
//! | f64  | F64  |
//!
//! Values are written bit for bit (NaN payloads and signed zeros included). A file holding
//! another dtype (`I8`, `I16`, `U16`, `U32`, `U64`, the 8-bit and smaller floats, `C64`) is
//! refused with an error naming the tensor.
//!
//! # Order
//!
//! The writer does not keep the order it is given: the `safetensors` crate lays tensors out
//! by dtype (widest first) and then by name. [`load`] returns tensors in the file's data
//! order (by data offset; empty tensors, which share an offset, by name). The crate parses
//! the header into a hash map, so the header's own key order is not available; in files
//! written by the safetensors writers (this one included) it is the data order.
//!
//! # Checkpoints
//!
//! [`save`] the named parameters, and [`load_into`] the same list later (for a module, its
//! [`Module::state_dict`]: parameters and buffers, through [`save_state_dict`] and
//! [`load_state_dict`]): it checks that the
//! file holds exactly those names with the same shapes and dtypes — reporting every
//! mismatch at once — and then copies the values into the parameters in place, so each
//! parameter keeps its buffer (and every handle to it sees the new value).
//!
//! ```
//! use kiln::{DType, Tensor};
//!
//! let params = vec![
//!     ("w".to_string(), Tensor::randn_seeded(&[4, 3], 0)),
//!     ("b".to_string(), Tensor::zeros(&[3])),
//! ];
//! let named: Vec<(&str, &Tensor)> = params.iter().map(|(n, t)| (n.as_str(), t)).collect();
//! let checkpoint = kiln::io::save_to_bytes(&named).unwrap();
//!
//! params[0].1.fill_(0.0); // training moves on...
//! kiln::io::load_into_from_bytes(&params, &checkpoint).unwrap(); // ...and restores
//! assert_eq!(params[0].1.to_vec::<f32>().unwrap(), Tensor::randn_seeded(&[4, 3], 0).to_vec::<f32>().unwrap());
//! ```

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use ::safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, TensorInfo, View};

use super::{format_error, io_error, read_file};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::nn::Module;
use crate::tensor::{Tensor, realize_all};

const SAVE: &str = "safetensors::save";
const LOAD: &str = "safetensors::load";
const LOAD_INTO: &str = "load_into";
/// The header key the format reserves for metadata.
const METADATA_KEY: &str = "__metadata__";

/// The safetensors dtype a kiln dtype is stored as.
fn file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    }
}

/// The kiln dtype of a safetensors dtype, if kiln has it.
fn kiln_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        _ => return None,
    })
}

/// A file dtype as kiln names it, or as the file does when kiln has no such dtype.
fn describe_file_dtype(dtype: Dtype) -> String {
    match kiln_dtype(dtype) {
        Some(d) => d.to_string(),
        None => format!("{dtype} (not a kiln dtype)"),
    }
}

// ---------------------------------------------------------------------------------------
// Saving
// ---------------------------------------------------------------------------------------

/// Writes `tensors` (name, tensor) to a safetensors file at `path`, realizing them first.
///
/// The file is written under a temporary name next to `path` and renamed over it once
/// complete, so an existing file at `path` is replaced only by a whole new one.
///
/// # Errors
/// [`KilnError::InvalidArgument`] for a name used twice or the reserved name
/// `"__metadata__"`; any error realizing a tensor; [`KilnError::Backend`] (`"io"`) when
/// the file cannot be written.
pub fn save(tensors: &[(&str, &Tensor)], path: impl AsRef<Path>) -> Result<()> {
    save_with_metadata(tensors, &[], path)
}

/// [`save`] with string metadata, stored as the header's `"__metadata__"` object (written
/// only when `metadata` is not empty). PyTorch's loaders read `("format", "pt")` there.
pub fn save_with_metadata(
    tensors: &[(&str, &Tensor)],
    metadata: &[(&str, &str)],
    path: impl AsRef<Path>,
) -> Result<()> {
    let path = path.as_ref();
    let failure = RefCell::new(None);
    let (views, metadata) = prepare(tensors, metadata, &failure)?;
    let partial = partial_path(path)?;
    let written = ::safetensors::serialize_to_file(views, metadata, &partial);
    let failed = match written {
        Err(e) => Some(write_error(path, e)),
        Ok(()) => failure.into_inner(),
    };
    if let Some(e) = failed {
        // The partial file is garbage; `path` itself was never touched.
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, path).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        io_error(SAVE, path, &e)
    })
}

/// [`save`] into memory: the bytes of a safetensors file.
pub fn save_to_bytes(tensors: &[(&str, &Tensor)]) -> Result<Vec<u8>> {
    save_with_metadata_to_bytes(tensors, &[])
}

/// [`save_with_metadata`] into memory.
pub fn save_with_metadata_to_bytes(
    tensors: &[(&str, &Tensor)],
    metadata: &[(&str, &str)],
) -> Result<Vec<u8>> {
    let failure = RefCell::new(None);
    let (views, metadata) = prepare(tensors, metadata, &failure)?;
    let bytes = ::safetensors::serialize(views, metadata)
        .map_err(|e| write_error(Path::new("<memory>"), e))?;
    match failure.into_inner() {
        Some(e) => Err(e),
        None => Ok(bytes),
    }
}

/// A tensor as the `safetensors` writer sees it. Its bytes are read back only when the
/// writer asks for them, so a whole checkpoint is never copied at once (only one tensor
/// at a time). A read-back failure is kept in `failure` (the writer's callback cannot
/// return one) and turns the save into an error afterwards.
struct Lazy<'a> {
    tensor: &'a Tensor,
    dtype: Dtype,
    len: usize,
    failure: &'a RefCell<Option<KilnError>>,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let err = match self.tensor.to_bytes() {
            Ok(bytes) if bytes.len() == self.len => return Cow::Owned(bytes),
            Ok(bytes) => KilnError::Internal(format!(
                "{SAVE}: read back {} bytes for a tensor of {} bytes",
                bytes.len(),
                self.len
            )),
            Err(e) => e,
        };
        self.failure.borrow_mut().get_or_insert(err);
        Cow::Borrowed(&[])
    }

    fn data_len(&self) -> usize {
        self.len
    }
}

type Prepared<'a> = (Vec<(&'a str, Lazy<'a>)>, Option<HashMap<String, String>>);

/// Checks the names, realizes the tensors and wraps them for the writer.
fn prepare<'a>(
    tensors: &[(&'a str, &'a Tensor)],
    metadata: &[(&str, &str)],
    failure: &'a RefCell<Option<KilnError>>,
) -> Result<Prepared<'a>> {
    let mut names = HashSet::with_capacity(tensors.len());
    for &(name, _) in tensors {
        if name == METADATA_KEY {
            return Err(format_error(
                SAVE,
                format!("the tensor name {METADATA_KEY:?} is reserved for the file's metadata"),
            ));
        }
        if !names.insert(name) {
            return Err(format_error(
                SAVE,
                format!("the tensor name {name:?} is given twice"),
            ));
        }
    }
    let mut info = HashMap::with_capacity(metadata.len());
    for &(key, value) in metadata {
        if info.insert(key.to_string(), value.to_string()).is_some() {
            return Err(format_error(
                SAVE,
                format!("the metadata key {key:?} is given twice"),
            ));
        }
    }
    let all: Vec<&Tensor> = tensors.iter().map(|&(_, t)| t).collect();
    realize_by_device(&all)?;
    let views = tensors
        .iter()
        .map(|&(name, tensor)| {
            let len = tensor
                .numel()
                .checked_mul(tensor.dtype().size_bytes())
                .ok_or_else(|| KilnError::TooLarge {
                    op: SAVE,
                    shape: tensor.shape().to_vec(),
                    dtype: tensor.dtype(),
                    detail: "its byte size overflows usize".into(),
                })?;
            Ok((
                name,
                Lazy {
                    tensor,
                    dtype: file_dtype(tensor.dtype()),
                    len,
                    failure,
                },
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((views, (!metadata.is_empty()).then_some(info)))
}

/// Realizes `tensors` with one plan per device (shared work runs once).
fn realize_by_device(tensors: &[&Tensor]) -> Result<()> {
    let mut devices: Vec<Device> = Vec::new();
    for t in tensors {
        if !devices.contains(&t.device()) {
            devices.push(t.device());
        }
    }
    for device in devices {
        let group: Vec<&Tensor> = tensors
            .iter()
            .copied()
            .filter(|t| t.device() == device)
            .collect();
        realize_all(&group)?;
    }
    Ok(())
}

/// Where a save writes before renaming over `path`: a hidden sibling.
fn partial_path(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| format_error(SAVE, format!("{} does not name a file", path.display())))?;
    let mut partial = std::ffi::OsString::from(".");
    partial.push(name);
    // Unique per process and per save, so that concurrent saves never share it.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    partial.push(format!(".kiln-partial-{}-{n}", std::process::id()));
    Ok(path.with_file_name(partial))
}

fn write_error(path: &Path, e: SafeTensorError) -> KilnError {
    match e {
        SafeTensorError::IoError(io) => io_error(SAVE, path, &io),
        other => format_error(SAVE, format!("cannot write {}: {other}", path.display())),
    }
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

/// What [`load_with_metadata`] returns: the named tensors in file order and the
/// `"__metadata__"` strings.
pub type TensorsWithMetadata = (Vec<(String, Tensor)>, BTreeMap<String, String>);

/// Reads every tensor of a safetensors file as a realized CPU tensor, in the file's data
/// order (see the module documentation).
///
/// # Errors
/// [`KilnError::Backend`] (`"io"`) when the file cannot be read;
/// [`KilnError::InvalidArgument`] when it is not a valid safetensors file or holds a dtype
/// kiln does not have (the message names the tensor).
pub fn load(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    Ok(load_with_metadata(path)?.0)
}

/// [`load`] from the bytes of a safetensors file.
pub fn load_from_bytes(bytes: &[u8]) -> Result<Vec<(String, Tensor)>> {
    Ok(load_with_metadata_from_bytes(bytes)?.0)
}

/// [`load`], also returning the header's `"__metadata__"` strings (empty when absent).
pub fn load_with_metadata(path: impl AsRef<Path>) -> Result<TensorsWithMetadata> {
    let bytes = read_file(LOAD, path.as_ref())?;
    load_with_metadata_from_bytes(&bytes)
}

/// [`load_with_metadata`] from the bytes of a safetensors file.
pub fn load_with_metadata_from_bytes(bytes: &[u8]) -> Result<TensorsWithMetadata> {
    let file = Parsed::new(LOAD, bytes)?;
    let tensors = file
        .entries
        .iter()
        .map(|e| Ok((e.name.clone(), file.tensor(LOAD, e)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok((tensors, file.metadata))
}

/// One tensor's header entry.
struct Entry {
    name: String,
    info: TensorInfo,
}

/// A validated safetensors file: its entries in data order and its data section.
struct Parsed<'a> {
    data: &'a [u8],
    entries: Vec<Entry>,
    metadata: BTreeMap<String, String>,
}

impl<'a> Parsed<'a> {
    fn new(op: &'static str, bytes: &'a [u8]) -> Result<Self> {
        let (n, header) = SafeTensors::read_metadata(bytes).map_err(|e| match e {
            SafeTensorError::IoError(io) => io_error(op, Path::new("<memory>"), &io),
            other => format_error(op, format!("not a valid safetensors file: {other}")),
        })?;
        let data = n
            .checked_add(8)
            .and_then(|start| bytes.get(start..))
            .ok_or_else(|| format_error(op, "the header length points past the end of the file"))?;
        let mut entries: Vec<Entry> = header
            .tensors()
            .into_iter()
            .map(|(name, info)| Entry {
                name,
                info: info.clone(),
            })
            .collect();
        entries.sort_by(|a, b| {
            a.info
                .data_offsets
                .cmp(&b.info.data_offsets)
                .then_with(|| a.name.cmp(&b.name))
        });
        let metadata = header
            .metadata()
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        Ok(Parsed {
            data,
            entries,
            metadata,
        })
    }

    /// The entry's values as a realized CPU tensor (a copy of the file's bytes).
    fn tensor(&self, op: &'static str, e: &Entry) -> Result<Tensor> {
        let dtype = kiln_dtype(e.info.dtype).ok_or_else(|| {
            format_error(
                op,
                format!(
                    "tensor {:?} has dtype {}, which kiln does not have",
                    e.name, e.info.dtype
                ),
            )
        })?;
        let (begin, end) = e.info.data_offsets;
        let bytes = self.data.get(begin..end).ok_or_else(|| {
            format_error(
                op,
                format!(
                    "tensor {:?}: data offsets [{begin}, {end}] lie outside the {}-byte data section",
                    e.name,
                    self.data.len()
                ),
            )
        })?;
        Tensor::try_from_bytes(bytes, &e.info.shape, dtype)
            .map_err(|err| format_error(op, format!("tensor {:?}: {err}", e.name)))
    }
}

/// Saves a module's [`Module::state_dict`] (its named parameters and buffers, such as
/// BatchNorm's running statistics) to `path`: PyTorch's
/// `save_file(model.state_dict(), path)`.
pub fn save_state_dict<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    let state = module.state_dict();
    save(&named_refs(&state), path)
}

/// [`save_state_dict`] to the bytes of a safetensors file.
pub fn save_state_dict_to_bytes<M: Module + ?Sized>(module: &M) -> Result<Vec<u8>> {
    let state = module.state_dict();
    save_to_bytes(&named_refs(&state))
}

/// Restores a checkpoint of a module's [`Module::state_dict`] (parameters and buffers) in
/// place: [`load_into`] with that list, so the file must hold exactly those names, shapes
/// and dtypes, and every mismatch is reported at once. PyTorch's
/// `model.load_state_dict(load_file(path))`.
///
/// ```
/// use kiln::nn::{BatchNorm1d, Linear, Module, Sequential};
/// use kiln::Tensor;
/// let model = Sequential::new()
///     .push(Linear::new(3, 2, true, 0).unwrap())
///     .push(BatchNorm1d::new(2).unwrap());
/// model.forward(&Tensor::randn_seeded(&[8, 3], 1)).unwrap(); // moves the running stats
/// let bytes = kiln::safetensors::save_state_dict_to_bytes(&model).unwrap();
///
/// let fresh = Sequential::new()
///     .push(Linear::new(3, 2, true, 5).unwrap())
///     .push(BatchNorm1d::new(2).unwrap());
/// kiln::safetensors::load_state_dict_from_bytes(&fresh, &bytes).unwrap();
/// for ((_, a), (_, b)) in model.state_dict().iter().zip(fresh.state_dict().iter()) {
///     assert_eq!(a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap());
/// }
/// ```
pub fn load_state_dict<M: Module + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    load_into(&module.state_dict(), path)
}

/// [`load_state_dict`] from the bytes of a safetensors file.
pub fn load_state_dict_from_bytes<M: Module + ?Sized>(module: &M, bytes: &[u8]) -> Result<()> {
    load_into_from_bytes(&module.state_dict(), bytes)
}

/// `(name, tensor)` pairs borrowed as the savers take them.
fn named_refs(state: &[(String, Tensor)]) -> Vec<(&str, &Tensor)> {
    state.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

/// Restores a checkpoint into `params` in place.
///
/// First checks that the file holds exactly the names of `params`, each with the
/// parameter's shape and dtype. If anything differs, nothing is written and the one error
/// returned lists every problem: names missing from the file, names the file has that
/// `params` lacks, shape mismatches and dtype mismatches (each with both sides), and
/// parameter names given twice. Otherwise every value is copied into its parameter with
/// [`Tensor::copy_`] (under [`crate::no_grad`], so parameters that require grad are fine;
/// parameters on another device receive a transferred copy) and the parameters are
/// realized: each keeps its own buffer, which now holds the file's values.
///
/// # Errors
/// [`KilnError::InvalidArgument`] with `op: "load_into"` for mismatches or a malformed
/// file; [`KilnError::Backend`] (`"io"`) when the file cannot be read; any error from
/// copying or realizing.
pub fn load_into(params: &[(String, Tensor)], path: impl AsRef<Path>) -> Result<()> {
    let bytes = read_file(LOAD_INTO, path.as_ref())?;
    load_into_from_bytes(params, &bytes)
}

/// [`load_into`] from the bytes of a safetensors file.
pub fn load_into_from_bytes(params: &[(String, Tensor)], bytes: &[u8]) -> Result<()> {
    let file = Parsed::new(LOAD_INTO, bytes)?;
    let by_name: HashMap<&str, &Entry> =
        file.entries.iter().map(|e| (e.name.as_str(), e)).collect();

    let stored: Vec<super::Stored> = file
        .entries
        .iter()
        .map(|e| super::Stored {
            name: &e.name,
            shape: &e.info.shape,
            dtype: kiln_dtype(e.info.dtype),
            dtype_text: describe_file_dtype(e.info.dtype),
        })
        .collect();
    let problems = super::mismatches(params, &stored, ("file", "parameter"));
    if !problems.is_empty() {
        return Err(super::mismatch_error(
            LOAD_INTO,
            "the checkpoint does not match the parameters",
            &problems,
        ));
    }

    // Every value is read (and checked) before any parameter is touched.
    let values = params
        .iter()
        .map(|(name, p)| {
            let e = by_name
                .get(name.as_str())
                .ok_or_else(|| KilnError::Internal(format!("{LOAD_INTO}: {name:?} vanished")))?;
            let value = file.tensor(LOAD_INTO, e)?;
            if value.device() == p.device() {
                Ok(value)
            } else {
                value.try_to(p.device())
            }
        })
        .collect::<Result<Vec<_>>>()?;
    crate::autograd::no_grad(|| {
        for ((_, p), value) in params.iter().zip(&values) {
            p.try_copy_(value)?;
        }
        Ok::<(), KilnError>(())
    })?;
    let all: Vec<&Tensor> = params.iter().map(|(_, p)| p).collect();
    realize_by_device(&all)
}
