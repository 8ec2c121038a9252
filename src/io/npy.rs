//! Single arrays in NumPy's `.npy` format (what `numpy.save` writes and `numpy.load` reads).
//!
//! | kiln | NumPy (written) | NumPy (also read) |
//! |------|-----------------|-------------------|
//! | bool | `\|b1` | |
//! | u8   | `\|u1` | `<u1`, `>u1` |
//! | i32  | `<i4` | `>i4` |
//! | i64  | `<i8` | `>i8` |
//! | f16  | `<f2` | `>f2` |
//! | f32  | `<f4` | `>f4` |
//! | f64  | `<f8` | `>f8` |
//! | bf16 | refused | |
//!
//! NumPy has no bfloat16 dtype, so [`write_npy`] refuses a bf16 tensor with
//! [`KilnError::UnsupportedDType`] rather than write a file whose values NumPy would
//! misread; cast it to f32 first (exact: every bf16 value is an f32 value), or keep its
//! dtype by saving it with [`crate::io::safetensors`]. Arrays of dtypes kiln does not have
//! (`<u2`, `<i2`, `<c8`, strings, structured or object arrays...) are refused when read.
//!
//! Reading accepts C-order and Fortran-order arrays in either byte order: big-endian data
//! is byte-swapped, and a Fortran-order array (stored as the row-major array of the
//! reversed shape) is read as that array permuted back and made contiguous, so the result
//! is always a realized, row-major CPU tensor. Writing produces C-order, little-endian
//! files (format version 1.0, header padded to 64 bytes as NumPy does). The header text
//! differs from NumPy's only in spacing — npyz writes a shape as `(2, 3, )` where NumPy
//! writes `(2, 3)`, the same Python tuple — so the data bytes match a NumPy-written file
//! exactly but the files are not byte-identical.
//!
//! The `npyz` crate parses and writes the header (a Python dict literal); the data is
//! copied in one piece rather than element by element.
//!
//! ```
//! use kiln::Tensor;
//! let t = Tensor::from_vec(vec![1i64, -2, 3, -4, 5, -6], &[2, 3]);
//! let file = kiln::io::write_npy_bytes(&t).unwrap();
//! let back = kiln::io::read_npy_bytes(&file).unwrap();
//! assert_eq!(back.shape(), &[2, 3]);
//! assert_eq!(back.to_vec::<i64>().unwrap(), vec![1, -2, 3, -4, 5, -6]);
//! ```

use std::io::Write;
use std::path::Path;

use npyz::{Endianness, NpyHeader, Order, TypeChar, TypeStr, WriteOptions, WriterBuilder};

use super::{format_error, io_error, read_file};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

const READ: &str = "read_npy";
const WRITE: &str = "write_npy";

/// The NumPy type string kiln writes for `dtype`, or `None` for bf16 (NumPy has none).
pub fn npy_descr(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::BF16 => return None,
    })
}

/// The kiln dtype of a NumPy type string and whether its data needs byte swapping.
fn kiln_dtype(ts: &TypeStr) -> Result<(DType, bool)> {
    let dtype = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Bool, 1) => DType::Bool,
        (TypeChar::Uint, 1) => DType::U8,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Int, 8) => DType::I64,
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Float, 8) => DType::F64,
        _ => {
            return Err(format_error(
                READ,
                format!(
                    "NumPy dtype '{ts}' has no kiln dtype (kiln reads bool, uint8, int32, int64, \
                     float16, float32 and float64; convert with .astype() first)"
                ),
            ));
        }
    };
    let swap = dtype.size_bytes() > 1 && ts.endianness() == Endianness::Big;
    Ok((dtype, swap))
}

/// Reads a `.npy` file as a realized, row-major CPU tensor.
///
/// # Errors
/// [`KilnError::Backend`] (`"io"`) when the file cannot be read;
/// [`KilnError::InvalidArgument`] when it is not a valid `.npy` file, its data is shorter
/// or longer than its header says, a bool array holds a byte other than 0 or 1, or its
/// dtype has no kiln dtype.
pub fn read_npy(path: impl AsRef<Path>) -> Result<Tensor> {
    let bytes = read_file(READ, path.as_ref())?;
    read_npy_bytes(&bytes)
}

/// [`read_npy`] from the bytes of a `.npy` file.
pub fn read_npy_bytes(bytes: &[u8]) -> Result<Tensor> {
    check_prelude(bytes)?;
    let mut data: &[u8] = bytes;
    // Reading from a slice advances it: afterwards `data` is what follows the header.
    // npyz multiplies the dimensions without overflow checks, which panics in builds that
    // check overflow. `check_prelude` refuses such shapes first; should one get past it, the
    // panic is caught here, so that a hostile file is an error either way.
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        NpyHeader::from_reader(&mut data)
    }));
    let header = match parsed {
        Ok(Ok(header)) => header,
        Ok(Err(e)) => return Err(format_error(READ, format!("not a valid .npy file: {e}"))),
        Err(_) => {
            return Err(format_error(
                READ,
                "not a valid .npy file: the header's shape overflows",
            ));
        }
    };
    let ts = match header.dtype() {
        npyz::DType::Plain(ts) => ts,
        other => {
            return Err(format_error(
                READ,
                format!(
                    "structured NumPy dtype {} is not supported (only plain numeric arrays)",
                    other.descr()
                ),
            ));
        }
    };
    let (dtype, swap) = kiln_dtype(&ts)?;
    let shape = header
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|_| format_error(READ, "a dimension does not fit in usize"))?;
    let len = shape
        .iter()
        .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            format_error(
                READ,
                format!("shape {shape:?} of {dtype} is too large to address"),
            )
        })?;
    if data.len() != len {
        return Err(format_error(
            READ,
            format!(
                "the header describes {len} bytes of data ({dtype}, shape {shape:?}), but the \
                 file has {} after the header",
                data.len()
            ),
        ));
    }
    let swapped;
    let data = if swap {
        let mut v = data.to_vec();
        for element in v.chunks_exact_mut(dtype.size_bytes()) {
            element.reverse();
        }
        swapped = v;
        &swapped[..]
    } else {
        data
    };
    let data_error = |e: KilnError| format_error(READ, e.to_string());
    if header.order() == Order::Fortran && shape.len() > 1 {
        // Column-major data is the row-major array of the reversed shape; permuting its axes
        // back gives the array, and `contiguous` stores it row-major.
        let reversed: Vec<usize> = shape.iter().rev().copied().collect();
        let stored = Tensor::try_from_bytes(data, &reversed, dtype).map_err(data_error)?;
        let perm: Vec<isize> = (0..shape.len() as isize).rev().collect();
        let t = stored.try_permute(&perm)?.try_contiguous()?;
        t.realize()?;
        Ok(t)
    } else {
        Tensor::try_from_bytes(data, &shape, dtype).map_err(data_error)
    }
}

/// NumPy's default limit on the header's length (`max_header_size` of `numpy.load`).
const MAX_HEADER_BYTES: usize = 10_000;
/// Deeper nesting than any plain or structured dtype needs.
const MAX_NESTING: usize = 16;

/// Checks the magic string, version and header length, and bounds the header's size and
/// nesting, before the header text is handed to the parser (which would otherwise
/// allocate whatever length the file claims and recurse as deep as it nests).
fn check_prelude(bytes: &[u8]) -> Result<()> {
    let bad = |reason: String| format_error(READ, format!("not a valid .npy file: {reason}"));
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("it does not start with the .npy magic string".into()));
    }
    let (start, len) = match (bytes[6], bytes[7]) {
        (1, 0) => (10, u16::from_le_bytes([bytes[8], bytes[9]]) as usize),
        (2, 0) | (3, 0) => match bytes.get(8..12) {
            Some(b) => (12, u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize),
            None => return Err(bad("the header length is cut off".into())),
        },
        (major, minor) => return Err(bad(format!("unsupported format version {major}.{minor}"))),
    };
    if len > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "the header is {len} bytes long, more than the {MAX_HEADER_BYTES} NumPy accepts"
        )));
    }
    let Some(text) = bytes.get(start..start + len) else {
        return Err(bad(format!(
            "the header is {len} bytes long, but the file ends before that"
        )));
    };
    let mut depth = 0usize;
    for &b in text {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(bad("the header nests too deeply".into()));
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if shape_overflows(text) {
        return Err(bad(
            "the shape has more elements than a 64-bit count holds".into()
        ));
    }
    Ok(())
}

/// Whether the header's shape, read loosely, multiplies past `u64` (ignoring zero-length
/// dimensions, so that no partial product overflows either). A shape this reading cannot
/// make out is left to the parser.
fn shape_overflows(text: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(text) else {
        return false;
    };
    let Some(at) = text.find("'shape'").or_else(|| text.find("\"shape\"")) else {
        return false;
    };
    let rest = &text[at + "'shape'".len()..];
    let Some(open) = rest.find(['(', '[']) else {
        return false;
    };
    let Some(len) = rest[open..].find([')', ']']) else {
        return false;
    };
    let mut count: u64 = 1;
    for dim in rest[open + 1..open + len].split(',').map(str::trim) {
        match dim.parse::<u64>() {
            Ok(0) => {}
            Ok(d) => match count.checked_mul(d) {
                Some(c) => count = c,
                None => return true,
            },
            Err(_) if dim.is_empty() => {}
            Err(_) => return false,
        }
    }
    false
}

/// Writes `t` (realized first) to a `.npy` file at `path`: C order, little-endian.
///
/// # Errors
/// [`KilnError::UnsupportedDType`] for bf16 (see the module documentation); any error
/// realizing `t`; [`KilnError::Backend`] (`"io"`) when the file cannot be written.
pub fn write_npy(t: &Tensor, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let header = header_bytes(t)?;
    let data = t.to_bytes()?;
    let mut file = std::fs::File::create(path).map_err(|e| io_error(WRITE, path, &e))?;
    file.write_all(&header)
        .and_then(|()| file.write_all(&data))
        .and_then(|()| file.flush())
        .map_err(|e| io_error(WRITE, path, &e))
}

/// [`write_npy`] into memory: the bytes of a `.npy` file.
pub fn write_npy_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let mut out = header_bytes(t)?;
    out.extend_from_slice(&t.to_bytes()?);
    Ok(out)
}

/// The header (magic, version, length, padded dict) of `t`'s `.npy` file.
fn header_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let descr = npy_descr(t.dtype()).ok_or_else(|| KilnError::UnsupportedDType {
        op: WRITE,
        dtype: t.dtype(),
        detail: ": NumPy has no bfloat16 dtype; cast to f32 first (exact), or save with \
                 kiln::io::safetensors, which keeps bf16"
            .into(),
    })?;
    let ts: TypeStr = descr
        .parse()
        .map_err(|e| KilnError::Internal(format!("{WRITE}: type string {descr}: {e}")))?;
    let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
    let mut out = Vec::new();
    WriteOptions::<std::convert::Infallible>::new_header_only()
        .dtype(npyz::DType::Plain(ts))
        .shape(&shape)
        .writer(&mut out)
        .write_header_only()
        .map_err(|e| io_error(WRITE, Path::new("<memory>"), &e))?;
    Ok(out)
}
