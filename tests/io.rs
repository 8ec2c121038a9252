//! kiln::io: safetensors checkpoints, NumPy .npy files and (feature `ndarray`) ndarray
//! conversions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln::io::{npy, safetensors as st};
use kiln::{DType, KilnError, Tensor};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A fresh, empty directory for one test; removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kiln-io-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn le16(bits: &[u16]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}
fn le32(bits: &[u32]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}
fn le64(bits: &[u64]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}

fn raw(bytes: &[u8], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::try_from_bytes(bytes, shape, dtype).unwrap()
}

/// f16 bit patterns: ±0, 1, -2.5, max, smallest subnormal, smallest normal, ±inf, a quiet
/// NaN with a payload, a signalling NaN.
const F16_BITS: [u16; 11] = [
    0x0000, 0x8000, 0x3C00, 0xC100, 0x7BFF, 0x0001, 0x0400, 0x7C00, 0xFC00, 0x7E01, 0x7D00,
];
/// bf16: ±0, 1, max, -max, smallest subnormal, smallest normal, ±inf, quiet NaN with a
/// payload, signalling NaN, negative NaN.
const BF16_BITS: [u16; 12] = [
    0x0000, 0x8000, 0x3F80, 0x7F7F, 0xFF7F, 0x0001, 0x0080, 0x7F80, 0xFF80, 0x7FC1, 0x7F81, 0xFFFF,
];
/// f32: ±0, smallest subnormal, max, ±inf, quiet NaN with a payload, signalling NaN.
const F32_BITS: [u32; 8] = [
    0x0000_0000,
    0x8000_0000,
    0x0000_0001,
    0x7F7F_FFFF,
    0x7F80_0000,
    0xFF80_0000,
    0x7FC0_0123,
    0x7F80_0001,
];
/// f64: ±0, 1, smallest subnormal, max, -inf, quiet NaN with a payload, signalling NaN.
const F64_BITS: [u64; 8] = [
    0x0000_0000_0000_0000,
    0x8000_0000_0000_0000,
    0x3FF0_0000_0000_0000,
    0x0000_0000_0000_0001,
    0x7FEF_FFFF_FFFF_FFFF,
    0xFFF0_0000_0000_0000,
    0x7FF8_0000_0000_0001,
    0x7FF0_0000_0000_0001,
];

/// One tensor of every dtype with its extremes, empty tensors and a 0-d scalar of every
/// dtype. `with_bf16: false` leaves bf16 out (NumPy has no bf16).
fn samples(with_bf16: bool) -> Vec<(String, Tensor)> {
    let u8s: Vec<u8> = (0..=255).collect();
    let i32s: Vec<i32> = vec![i32::MIN, -1, 0, 1, 42, i32::MAX];
    let i64s: Vec<i64> = vec![i64::MIN, -1, 0, 1, i64::MAX];
    let mut out = vec![
        (
            "bool".to_string(),
            raw(&[1, 0, 1, 0, 0, 1], &[2, 3], DType::Bool),
        ),
        ("u8".to_string(), raw(&u8s, &[16, 16], DType::U8)),
        ("i32".to_string(), Tensor::from_vec(i32s, [2, 3])),
        ("i64".to_string(), Tensor::from_vec(i64s, [5])),
        ("f16".to_string(), raw(&le16(&F16_BITS), &[11], DType::F16)),
        (
            "f32".to_string(),
            raw(&le32(&F32_BITS), &[2, 4], DType::F32),
        ),
        (
            "f64".to_string(),
            raw(&le64(&F64_BITS), &[2, 2, 2], DType::F64),
        ),
        ("empty_f32".to_string(), raw(&[], &[0], DType::F32)),
        ("empty_i64".to_string(), raw(&[], &[2, 0, 3], DType::I64)),
        ("empty_bool".to_string(), raw(&[], &[0, 1], DType::Bool)),
        ("scalar_bool".to_string(), raw(&[1], &[], DType::Bool)),
        ("scalar_u8".to_string(), raw(&[200], &[], DType::U8)),
        ("scalar_i32".to_string(), Tensor::scalar(-7i32)),
        ("scalar_i64".to_string(), Tensor::scalar(1i64 << 40)),
        (
            "scalar_f16".to_string(),
            raw(&le16(&[0x7E01]), &[], DType::F16),
        ),
        (
            "scalar_f32".to_string(),
            raw(&le32(&[0x8000_0000]), &[], DType::F32),
        ),
        (
            "scalar_f64".to_string(),
            raw(&le64(&[0x7FF8_0000_0000_0001]), &[], DType::F64),
        ),
    ];
    if with_bf16 {
        out.push((
            "bf16".to_string(),
            raw(&le16(&BF16_BITS), &[3, 4], DType::BF16),
        ));
        out.push((
            "scalar_bf16".to_string(),
            raw(&le16(&[0x7F81]), &[], DType::BF16),
        ));
        out.push(("empty_bf16".to_string(), raw(&[], &[4, 0], DType::BF16)));
    }
    out
}

fn named(params: &[(String, Tensor)]) -> Vec<(&str, &Tensor)> {
    params.iter().map(|(n, t)| (n.as_str(), t)).collect()
}

/// name → (dtype, shape, bytes) of a list of tensors.
fn contents(tensors: &[(String, Tensor)]) -> BTreeMap<String, (DType, Vec<usize>, Vec<u8>)> {
    tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                (t.dtype(), t.shape().to_vec(), t.to_bytes().unwrap()),
            )
        })
        .collect()
}

fn assert_invalid(err: KilnError, op: &str, needles: &[&str]) {
    match &err {
        KilnError::InvalidArgument { op: o, reason, .. } => {
            assert_eq!(*o, op, "{err}");
            for n in needles {
                assert!(reason.contains(n), "{n:?} not in: {reason}");
            }
        }
        other => panic!("expected InvalidArgument from {op}, got {other:?}"),
    }
}

fn assert_io(err: KilnError) {
    assert!(
        matches!(&err, KilnError::Io { .. }),
        "expected an io error, got {err:?}"
    );
}

/// A safetensors file from a hand-written header (padded to 8 bytes) and data section.
fn raw_safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend_from_slice(data);
    out
}

// ---------------------------------------------------------------------------------------
// safetensors
// ---------------------------------------------------------------------------------------

#[test]
fn safetensors_round_trips_every_dtype_bit_exactly() {
    let dir = TempDir::new("st-roundtrip");
    let tensors = samples(true);
    let expected = contents(&tensors);

    let bytes = st::save_to_bytes(&named(&tensors)).unwrap();
    let from_bytes = st::load_from_bytes(&bytes).unwrap();
    assert_eq!(contents(&from_bytes), expected);

    let path = dir.path("all.safetensors");
    st::save(&named(&tensors), &path).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "file and in-memory saves differ"
    );
    let from_file = st::load(&path).unwrap();
    assert_eq!(contents(&from_file), expected);
    for (_, t) in &from_file {
        assert!(t.is_realized());
        assert_eq!(t.device(), kiln::Device::Cpu);
    }
    // Nothing but the file is left behind (the partial file was renamed).
    assert_eq!(dir.entries(), vec!["all.safetensors".to_string()]);

    // Saving again replaces the file whole.
    let small = [("only".to_string(), Tensor::scalar(1.5f32))];
    st::save(&named(&small), &path).unwrap();
    assert_eq!(contents(&st::load(&path).unwrap()), contents(&small));
    assert_eq!(dir.entries(), vec!["all.safetensors".to_string()]);
}

#[test]
fn safetensors_saves_lazy_tensors_by_realizing_them() {
    let x = Tensor::arange(0.0, 6.0, 1.0).reshape([2, 3]);
    let y = (&x * 2.0 + 1.0).t(); // lazy, and a transposed view
    let z = Tensor::try_arange(0, 4, 1, DType::I64).unwrap();
    let bytes = st::save_to_bytes(&[("y", &y), ("z", &z)]).unwrap();
    let back: BTreeMap<String, Tensor> = st::load_from_bytes(&bytes).unwrap().into_iter().collect();
    assert_eq!(back["y"].shape(), &[3, 2]);
    assert_eq!(
        back["y"].to_vec::<f32>().unwrap(),
        vec![1.0, 7.0, 3.0, 9.0, 5.0, 11.0]
    );
    assert_eq!(back["z"].to_vec::<i64>().unwrap(), vec![0, 1, 2, 3]);
}

/// Checks the bytes against the format's specification without the safetensors crate:
/// an 8-byte little-endian header length N; N bytes of JSON that begin with `{`, may be
/// padded with spaces (the crate pads to a multiple of 8, so data starts 8-aligned), and
/// map every tensor name to {"dtype", "shape", "data_offsets": [begin, end]} plus an
/// optional "__metadata__" of string → string; offsets relative to the byte after the
/// header, contiguous from 0, covering the data exactly; data row-major little-endian.
#[test]
fn safetensors_header_follows_the_format_specification() {
    let tensors = samples(true);
    let meta = [
        ("format", "pt"),
        ("epoch", "3"),
        ("note", "ünïcode \"quoted\""),
    ];
    let file = st::save_with_metadata_to_bytes(&named(&tensors), &meta).unwrap();

    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    assert!(8 + n <= file.len());
    assert_eq!(
        n % 8,
        0,
        "the crate pads the header to a multiple of 8 bytes"
    );
    let header = &file[8..8 + n];
    assert_eq!(header[0], b'{', "the header must begin with '{{'");
    let close = header.iter().rposition(|&b| b == b'}').unwrap();
    assert!(
        header[close + 1..].iter().all(|&b| b == b' '),
        "padding after the JSON must be spaces (0x20)"
    );
    let json: serde_json::Value = serde_json::from_slice(&header[..=close]).unwrap();
    let obj = json.as_object().unwrap();

    // Metadata: string → string, exactly what was given.
    let md = obj["__metadata__"].as_object().unwrap();
    assert_eq!(md.len(), meta.len());
    for (k, v) in meta {
        assert_eq!(md[k].as_str(), Some(v));
    }

    let data = &file[8 + n..];
    let spec_dtype = |d: DType| match d {
        DType::Bool => "BOOL",
        DType::U8 => "U8",
        DType::I32 => "I32",
        DType::I64 => "I64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F32 => "F32",
        DType::F64 => "F64",
    };
    let mut ranges = Vec::new();
    assert_eq!(obj.len(), tensors.len() + 1);
    for (name, t) in &tensors {
        let entry = obj[name.as_str()].as_object().unwrap();
        let mut keys: Vec<&str> = entry.keys().map(|k| k.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["data_offsets", "dtype", "shape"], "{name}");
        assert_eq!(
            entry["dtype"].as_str(),
            Some(spec_dtype(t.dtype())),
            "{name}"
        );
        let shape: Vec<usize> = entry["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(shape, t.shape(), "{name}");
        let offsets = entry["data_offsets"].as_array().unwrap();
        assert_eq!(offsets.len(), 2);
        let (begin, end) = (
            offsets[0].as_u64().unwrap() as usize,
            offsets[1].as_u64().unwrap() as usize,
        );
        assert_eq!(end - begin, t.numel() * t.dtype().size_bytes(), "{name}");
        assert_eq!(&data[begin..end], &t.to_bytes().unwrap()[..], "{name}");
        ranges.push((begin, end));
    }
    ranges.sort();
    let mut at = 0;
    for (begin, end) in ranges {
        assert_eq!(begin, at, "tensor data must be contiguous, without holes");
        at = end;
    }
    assert_eq!(
        at,
        data.len(),
        "the offsets must cover the data section exactly"
    );

    // Without metadata there is no "__metadata__" key.
    let plain = st::save_to_bytes(&named(&tensors)).unwrap();
    let n = u64::from_le_bytes(plain[..8].try_into().unwrap()) as usize;
    let json: serde_json::Value = serde_json::from_slice(&plain[8..8 + n]).unwrap();
    assert!(json.get("__metadata__").is_none());
}

#[test]
fn safetensors_loads_in_data_order_and_returns_metadata() {
    let tensors = samples(true);
    let file =
        st::save_with_metadata_to_bytes(&named(&tensors), &[("format", "pt"), ("step", "10")])
            .unwrap();
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let json: serde_json::Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let mut by_offset: Vec<(u64, String)> = json
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| (v["data_offsets"][0].as_u64().unwrap(), k.clone()))
        .collect();
    by_offset.sort();
    let expected: Vec<String> = by_offset.into_iter().map(|(_, k)| k).collect();

    let (loaded, metadata) = st::load_with_metadata_from_bytes(&file).unwrap();
    let names: Vec<String> = loaded.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, expected);
    assert_eq!(
        metadata,
        BTreeMap::from([
            ("format".to_string(), "pt".to_string()),
            ("step".to_string(), "10".to_string()),
        ])
    );
    // Loading twice gives the same order (ties between empty tensors are broken by name).
    let again: Vec<String> = st::load_from_bytes(&file)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(again, names);
    assert!(
        st::load_with_metadata_from_bytes(&st::save_to_bytes(&named(&tensors)).unwrap())
            .unwrap()
            .1
            .is_empty()
    );
}

fn buffer_addr(t: &Tensor) -> Option<u64> {
    kiln::graph::read_graph(|g| {
        g.node(t.node_key())
            .ok()
            .and_then(|n| n.buffer.as_ref().map(|b| b.addr()))
    })
}

#[test]
fn load_into_restores_parameters_in_place() {
    let dir = TempDir::new("st-load-into");
    let path = dir.path("ckpt.safetensors");
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]).requires_grad_(true);
    let params = vec![
        ("layer.w".to_string(), w),
        (
            "layer.b".to_string(),
            raw(&le16(&F16_BITS[..3]), &[3], DType::F16),
        ),
        ("step".to_string(), Tensor::scalar(41i64)),
        ("mask".to_string(), raw(&[1, 0, 0, 1], &[4], DType::Bool)),
        (
            "bf".to_string(),
            raw(&le16(&BF16_BITS[..4]), &[2, 2], DType::BF16),
        ),
    ];
    let saved = contents(&params);
    st::save(&named(&params), &path).unwrap();

    // Training moves on: every parameter changes in place.
    kiln::no_grad(|| {
        for (_, p) in &params {
            p.fill_(0);
        }
    });
    for (_, p) in &params {
        p.realize().unwrap();
    }
    let addrs: Vec<Option<u64>> = params.iter().map(|(_, p)| buffer_addr(p)).collect();
    assert!(addrs.iter().all(|a| a.is_some()));
    let alias = params[0].1.clone();
    let keys: Vec<_> = params.iter().map(|(_, p)| p.node_key()).collect();

    st::load_into(&params, &path).unwrap();

    assert_eq!(contents(&params), saved);
    for (i, (name, p)) in params.iter().enumerate() {
        assert!(p.is_realized(), "{name}");
        assert_eq!(p.node_key(), keys[i], "{name} must stay the same tensor");
        assert_eq!(buffer_addr(p), addrs[i], "{name} must keep its buffer");
    }
    assert!(params[0].1.requires_grad());
    assert_eq!(
        alias.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
}

#[test]
fn load_into_reports_every_mismatch_in_one_error() {
    let file_tensors = vec![
        ("w".to_string(), Tensor::zeros([3, 2])), // shape differs
        ("b".to_string(), Tensor::zeros([3])),    // matches
        ("d".to_string(), Tensor::zeros_dtype([2], DType::F64)), // dtype differs
        ("both".to_string(), Tensor::zeros_dtype([5], DType::I64)), // shape and dtype differ
        ("extra".to_string(), Tensor::zeros_dtype([4], DType::U8)), // not a parameter
    ];
    let file = st::save_to_bytes(&named(&file_tensors)).unwrap();
    let params = vec![
        ("w".to_string(), Tensor::full_dtype([2, 3], 7.0, DType::F32)),
        ("b".to_string(), Tensor::full_dtype([3], 7.0, DType::F32)),
        ("d".to_string(), Tensor::full_dtype([2], 7, DType::I32)),
        ("both".to_string(), Tensor::full_dtype([4], 7.0, DType::F16)),
        (
            "gone".to_string(),
            Tensor::full_dtype([1], 7.0, DType::BF16),
        ),
        ("b".to_string(), Tensor::full_dtype([3], 7.0, DType::F32)),
    ];
    for (_, p) in &params {
        p.realize().unwrap();
    }
    let before = contents(&params[..5]);

    let err = st::load_into_from_bytes(&params, &file).unwrap_err();
    let text = err.to_string();
    assert_invalid(
        err,
        "load_into",
        &[
            "7 problems",
            r#"shape mismatch for "w": file has [3, 2], parameter has [2, 3]"#,
            r#"dtype mismatch for "d": file has f64, parameter has i32"#,
            r#"shape mismatch for "both": file has [5], parameter has [4]"#,
            r#"dtype mismatch for "both": file has i64, parameter has f16"#,
            r#"missing in file: "gone" (bf16 [1])"#,
            r#"parameter "b" is listed twice"#,
            r#"unexpected in file: "extra" (u8 [4])"#,
        ],
    );
    assert_eq!(text.lines().count(), 8, "{text}");
    assert!(!text.contains(r#"for "b""#), "{text}");
    // Nothing was written.
    assert_eq!(contents(&params[..5]), before);

    // A dtype kiln lacks is named as the file names it.
    let i16_file = raw_safetensors(
        r#"{"w":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}}"#,
        &[1, 0, 2, 0],
    );
    let params = vec![("w".to_string(), Tensor::zeros_dtype([2], DType::I32))];
    let err = st::load_into_from_bytes(&params, &i16_file).unwrap_err();
    assert_invalid(
        err,
        "load_into",
        &[r#"dtype mismatch for "w": file has I16 (not a kiln dtype), parameter has i32"#],
    );

    // A file that is not a safetensors file at all.
    let err = st::load_into_from_bytes(&params, b"not a checkpoint").unwrap_err();
    assert_invalid(err, "load_into", &["not a valid safetensors file"]);
    let dir = TempDir::new("st-load-into-missing");
    assert_io(st::load_into(&params, dir.path("missing.safetensors")).unwrap_err());
}

#[test]
fn malformed_safetensors_are_typed_errors() {
    let op = "safetensors::load";
    let good = st::save_to_bytes(&named(&samples(true))).unwrap();
    // Every truncation is an error, never a panic.
    for len in 0..good.len() {
        let err = st::load_from_bytes(&good[..len]).unwrap_err();
        assert_invalid(err, op, &[]);
    }
    // A trailing byte leaves part of the data unindexed.
    let mut longer = good.clone();
    longer.push(0);
    assert_invalid(st::load_from_bytes(&longer).unwrap_err(), op, &[]);
    // A header length far past the end.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_invalid(st::load_from_bytes(&huge).unwrap_err(), op, &[]);
    // Not JSON.
    assert_invalid(
        st::load_from_bytes(&raw_safetensors("{not json", &[])).unwrap_err(),
        op,
        &["not a valid safetensors file"],
    );
    // A tensor whose byte range does not match its shape and dtype.
    let bad_size = raw_safetensors(
        r#"{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
        &[0; 8],
    );
    assert_invalid(st::load_from_bytes(&bad_size).unwrap_err(), op, &[]);
    // A hole between two tensors.
    let hole = raw_safetensors(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}"#,
        &[0; 3],
    );
    assert_invalid(st::load_from_bytes(&hole).unwrap_err(), op, &[]);
    // A dtype kiln does not have.
    let i16_file = raw_safetensors(
        r#"{"small":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}}"#,
        &[1, 0, 2, 0],
    );
    assert_invalid(
        st::load_from_bytes(&i16_file).unwrap_err(),
        op,
        &[r#"tensor "small" has dtype I16"#],
    );
    // A bool byte other than 0 or 1.
    let bad_bool = raw_safetensors(
        r#"{"flags":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}"#,
        &[0, 1, 2],
    );
    assert_invalid(
        st::load_from_bytes(&bad_bool).unwrap_err(),
        op,
        &[r#"tensor "flags""#, "bool"],
    );
    // A shape whose element count overflows.
    let overflow = raw_safetensors(
        r#"{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#,
        &[],
    );
    assert!(st::load_from_bytes(&overflow).is_err());
    // A metadata value that is not a string.
    let bad_meta = raw_safetensors(r#"{"__metadata__":{"epoch":3}}"#, &[]);
    assert_invalid(st::load_from_bytes(&bad_meta).unwrap_err(), op, &[]);
    // An empty file list is a valid (empty) file.
    assert!(
        st::load_from_bytes(&raw_safetensors("{}", &[]))
            .unwrap()
            .is_empty()
    );

    // I/O failures.
    let dir = TempDir::new("st-errors");
    assert_io(st::load(dir.path("missing.safetensors")).unwrap_err());
    let t = Tensor::scalar(1.0f32);
    assert_io(st::save(&[("t", &t)], dir.path("no/such/dir/x.safetensors")).unwrap_err());
    assert_eq!(dir.entries(), Vec::<String>::new());

    // Bad names and metadata keys.
    let save_op = "safetensors::save";
    assert_invalid(
        st::save_to_bytes(&[("t", &t), ("t", &t)]).unwrap_err(),
        save_op,
        &["given twice"],
    );
    assert_invalid(
        st::save_to_bytes(&[("__metadata__", &t)]).unwrap_err(),
        save_op,
        &["reserved"],
    );
    assert_invalid(
        st::save_with_metadata_to_bytes(&[("t", &t)], &[("k", "1"), ("k", "2")]).unwrap_err(),
        save_op,
        &["given twice"],
    );
}

// ---------------------------------------------------------------------------------------
// .npy
// ---------------------------------------------------------------------------------------

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The parts of a .npy file, parsed by hand: (descr, fortran_order, shape, header length
/// including the 10 or 12 leading bytes, data).
fn npy_parts(file: &[u8]) -> (String, bool, Vec<usize>, usize, &[u8]) {
    assert_eq!(&file[..6], b"\x93NUMPY");
    let (len, start) = match file[6] {
        1 => (u16::from_le_bytes([file[8], file[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes(file[8..12].try_into().unwrap()) as usize,
            12,
        ),
    };
    let text = std::str::from_utf8(&file[start..start + len]).unwrap();
    assert!(text.ends_with('\n'));
    let after = |key: &str| {
        let i = text.find(key).unwrap_or_else(|| panic!("{key} in {text}"));
        &text[i + key.len()..]
    };
    let descr = after("'descr': '").split('\'').next().unwrap().to_string();
    let fortran = after("'fortran_order': ").starts_with("True");
    let shape = after("'shape': (")
        .split(')')
        .next()
        .unwrap()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    (descr, fortran, shape, start + len, &file[start + len..])
}

fn bits_of<const N: usize>(t: &Tensor) -> Vec<u64> {
    t.to_bytes()
        .unwrap()
        .chunks_exact(N)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..N].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect()
}

/// Every fixture that tests/fixtures/make_npy.py writes, with the values it writes.
#[test]
fn npy_fixtures_read_with_the_values_numpy_wrote() {
    let read = |name: &str, dtype: DType, shape: &[usize]| {
        let t = npy::read_npy(fixture(name)).unwrap();
        assert_eq!((t.dtype(), t.shape()), (dtype, shape), "{name}");
        assert!(t.is_realized(), "{name}");
        t
    };
    let t = read("bool_c.npy", DType::Bool, &[2, 3]);
    assert_eq!(
        t.to_vec::<bool>().unwrap(),
        vec![true, false, true, false, false, true]
    );
    let t = read("u8_c.npy", DType::U8, &[5]);
    assert_eq!(t.to_vec::<u8>().unwrap(), vec![0, 1, 127, 128, 255]);
    let t = read("i32_c.npy", DType::I32, &[2, 3]);
    assert_eq!(
        t.to_vec::<i32>().unwrap(),
        vec![i32::MIN, -1, 0, 1, 42, i32::MAX]
    );
    let t = read("i64_c.npy", DType::I64, &[5]);
    assert_eq!(
        t.to_vec::<i64>().unwrap(),
        vec![i64::MIN, -1, 0, 1, i64::MAX]
    );
    let t = read("f16_c.npy", DType::F16, &[11]);
    let want: Vec<u64> = F16_BITS.iter().map(|&b| b as u64).collect();
    assert_eq!(bits_of::<2>(&t), want);
    let t = read("f32_c.npy", DType::F32, &[2, 3]);
    assert_eq!(
        bits_of::<4>(&t),
        vec![
            0x3FC0_0000,
            0x8000_0000,
            0x0000_0001,
            0x7FC0_0123,
            0xFF80_0000,
            0x7F7F_FFFF
        ]
    );
    let t = read("f64_c.npy", DType::F64, &[3, 2]);
    assert_eq!(
        bits_of::<8>(&t),
        vec![
            0x0000_0000_0000_0000,
            0x8000_0000_0000_0000,
            0x3FF0_0000_0000_0000,
            0x7FF8_0000_0000_0001,
            0x7FF0_0000_0000_0000,
            0x0000_0000_0000_0001
        ]
    );
    let t = read("f64_scalar.npy", DType::F64, &[]);
    assert_eq!(t.item::<f64>().unwrap(), 3.25);
    let t = read("f32_empty.npy", DType::F32, &[0, 3]);
    assert!(t.to_vec::<f32>().unwrap().is_empty());

    // Fortran order: arange(24).reshape(2, 3, 4), read back in logical (row-major) order.
    let t = read("i32_fortran.npy", DType::I32, &[2, 3, 4]);
    assert_eq!(t.to_vec::<i32>().unwrap(), (0..24).collect::<Vec<i32>>());
    let t = read("f32_fortran.npy", DType::F32, &[2, 3]);
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );

    // Big-endian.
    let t = read("i64_be.npy", DType::I64, &[2, 2]);
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![1, -2, 3, 258]);
    let t = read("f32_be.npy", DType::F32, &[3]);
    assert_eq!(
        bits_of::<4>(&t),
        vec![0x3FC0_0000, 0x8000_0000, 0x4780_0020]
    );
    let t = read("f16_be.npy", DType::F16, &[3]);
    assert_eq!(bits_of::<2>(&t), vec![0x3C00, 0xC000, 0x3800]);
    let t = read("f64_be_fortran.npy", DType::F64, &[3, 2]);
    assert_eq!(
        t.to_vec::<f64>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
}

#[test]
fn npy_fixtures_round_trip() {
    let c_order_le = [
        "bool_c.npy",
        "u8_c.npy",
        "i32_c.npy",
        "i64_c.npy",
        "f16_c.npy",
        "f32_c.npy",
        "f64_c.npy",
        "f64_scalar.npy",
        "f32_empty.npy",
    ];
    for name in c_order_le {
        let original = std::fs::read(fixture(name)).unwrap();
        let t = npy::read_npy_bytes(&original).unwrap();
        let written = npy::write_npy_bytes(&t).unwrap();
        // The same array description and the same data bytes as NumPy's file. (The header
        // text itself differs in spacing: npyz writes a shape as `(2, 3, )`, NumPy as
        // `(2, 3)`; both are the same Python tuple.)
        let (d0, f0, s0, h0, data0) = npy_parts(&original);
        let (d1, f1, s1, h1, data1) = npy_parts(&written);
        assert_eq!((d1, f1, s1), (d0, f0, s0), "{name}");
        assert_eq!(data1, data0, "{name}: data bytes");
        assert_eq!(written[..8], original[..8], "{name}: magic and version");
        assert_eq!(h1 % 64, 0, "{name}: the data must start 64-byte aligned");
        assert_eq!(h0 % 64, 0);
        // Reading what kiln wrote gives the same tensor, bit for bit.
        let again = npy::read_npy_bytes(&written).unwrap();
        assert_eq!(again.to_bytes().unwrap(), t.to_bytes().unwrap(), "{name}");
    }
    for name in [
        "i32_fortran.npy",
        "f32_fortran.npy",
        "i64_be.npy",
        "f32_be.npy",
        "f16_be.npy",
        "f64_be_fortran.npy",
    ] {
        let t = npy::read_npy(fixture(name)).unwrap();
        let written = npy::write_npy_bytes(&t).unwrap();
        let (descr, fortran, shape, _, _) = npy_parts(&written);
        assert!(!fortran, "{name}: kiln writes C order");
        assert!(descr.starts_with('<'), "{name}: kiln writes little-endian");
        assert_eq!(shape, t.shape(), "{name}");
        let again = npy::read_npy_bytes(&written).unwrap();
        assert_eq!(again.to_bytes().unwrap(), t.to_bytes().unwrap(), "{name}");
        assert_eq!((again.dtype(), again.shape()), (t.dtype(), t.shape()));
    }
}

#[test]
fn npy_round_trips_every_numpy_dtype_bit_exactly() {
    let dir = TempDir::new("npy-roundtrip");
    for (name, t) in samples(false) {
        let path = dir.path(&format!("{name}.npy"));
        npy::write_npy(&t, &path).unwrap();
        let bytes = npy::write_npy_bytes(&t).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}");
        let (descr, fortran, shape, _, data) = npy_parts(&bytes);
        assert_eq!(descr, npy::npy_descr(t.dtype()).unwrap(), "{name}");
        assert!(!fortran);
        assert_eq!(shape, t.shape(), "{name}");
        assert_eq!(data, &t.to_bytes().unwrap()[..], "{name}");
        for back in [
            npy::read_npy(&path).unwrap(),
            npy::read_npy_bytes(&bytes).unwrap(),
        ] {
            assert_eq!(
                (back.dtype(), back.shape()),
                (t.dtype(), t.shape()),
                "{name}"
            );
            assert_eq!(back.to_bytes().unwrap(), t.to_bytes().unwrap(), "{name}");
        }
    }
    // A lazy, transposed tensor is written in its logical order.
    let x = Tensor::arange(0.0, 6.0, 1.0).reshape([2, 3]).t();
    let back = npy::read_npy_bytes(&npy::write_npy_bytes(&x).unwrap()).unwrap();
    assert_eq!(back.shape(), &[3, 2]);
    assert_eq!(
        back.to_vec::<f32>().unwrap(),
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
}

/// A .npy file (version 1.0) from a hand-written header dict and data.
fn raw_npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut text = dict.as_bytes().to_vec();
    while !(10 + text.len() + 1).is_multiple_of(64) {
        text.push(b' ');
    }
    text.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((text.len() as u16).to_le_bytes());
    out.extend(text);
    out.extend_from_slice(data);
    out
}

#[test]
fn npy_refuses_bf16_foreign_dtypes_and_malformed_files() {
    let bf = raw(&le16(&BF16_BITS), &[12], DType::BF16);
    for err in [
        npy::write_npy_bytes(&bf).unwrap_err(),
        npy::write_npy(&bf, std::env::temp_dir().join("kiln-never-written.npy")).unwrap_err(),
    ] {
        match err {
            KilnError::UnsupportedDType { op, dtype, detail } => {
                assert_eq!((op, dtype), ("write_npy", DType::BF16));
                assert!(detail.contains("cast to f32"), "{detail}");
            }
            other => panic!("expected UnsupportedDType, got {other:?}"),
        }
    }
    assert!(!std::env::temp_dir().join("kiln-never-written.npy").exists());
    assert_eq!(npy::npy_descr(DType::BF16), None);

    let op = "read_npy";
    // The hand-written header is read like NumPy's.
    let ok = raw_npy(
        "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
        &le32(&[5, 0xFFFF_FFFF]),
    );
    assert_eq!(
        npy::read_npy_bytes(&ok).unwrap().to_vec::<i32>().unwrap(),
        vec![5, -1]
    );
    // Every truncation is an error, never a panic.
    for len in 0..ok.len() {
        assert_invalid(npy::read_npy_bytes(&ok[..len]).unwrap_err(), op, &[]);
    }
    let mut longer = ok.clone();
    longer.push(0);
    assert_invalid(
        npy::read_npy_bytes(&longer).unwrap_err(),
        op,
        &["bytes of data"],
    );
    for descr in ["<u2", "<i2", "|i1", "<u4", "<u8", "<c8", "|S3", "<f16"] {
        let file = raw_npy(
            &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (0,), }}"),
            &[],
        );
        assert_invalid(npy::read_npy_bytes(&file).unwrap_err(), op, &[]);
    }
    let structured = raw_npy(
        "{'descr': [('a', '<i4'), ('b', '<f4')], 'fortran_order': False, 'shape': (1,), }",
        &[0; 8],
    );
    assert_invalid(
        npy::read_npy_bytes(&structured).unwrap_err(),
        op,
        &["structured"],
    );
    let bad_bool = raw_npy(
        "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
        &[0, 1, 2],
    );
    assert_invalid(npy::read_npy_bytes(&bad_bool).unwrap_err(), op, &["bool"]);
    let bad_magic = b"\x93NUMPX\x01\x00".to_vec();
    assert_invalid(npy::read_npy_bytes(&bad_magic).unwrap_err(), op, &[]);
    let not_a_dict = raw_npy("[1, 2, 3]", &[]);
    assert_invalid(npy::read_npy_bytes(&not_a_dict).unwrap_err(), op, &[]);
    for shape in [
        "(4294967296, 4294967296)",
        "(0, 4294967296, 4294967296)",
        "[4294967296, 4294967297]",
    ] {
        let overflow = raw_npy(
            &format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}"),
            &[],
        );
        assert_invalid(npy::read_npy_bytes(&overflow).unwrap_err(), op, &["64-bit"]);
    }
    // Large but countable: the data is simply missing.
    let large = raw_npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (65536, 65536, 4096), }",
        &[],
    );
    assert_invalid(npy::read_npy_bytes(&large).unwrap_err(), op, &[]);

    // Header lengths past the end of the file or past NumPy's limit, and deep nesting,
    // are refused before the header is parsed.
    let mut claims_more = ok.clone();
    claims_more[8..10].copy_from_slice(&60_000u16.to_le_bytes());
    assert_invalid(npy::read_npy_bytes(&claims_more).unwrap_err(), op, &[]);
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    v2.extend(u32::MAX.to_le_bytes());
    assert_invalid(npy::read_npy_bytes(&v2).unwrap_err(), op, &["more than"]);
    let mut v9 = ok.clone();
    v9[6] = 9;
    assert_invalid(npy::read_npy_bytes(&v9).unwrap_err(), op, &["version"]);
    let deep = raw_npy(&format!("{}1{}", "(".repeat(500), ")".repeat(500)), &[]);
    assert_invalid(npy::read_npy_bytes(&deep).unwrap_err(), op, &["nests"]);

    let dir = TempDir::new("npy-errors");
    assert_io(npy::read_npy(dir.path("missing.npy")).unwrap_err());
    assert_io(npy::write_npy(&Tensor::scalar(1u8), dir.path("no/such/dir/x.npy")).unwrap_err());
}

// ---------------------------------------------------------------------------------------
// ndarray
// ---------------------------------------------------------------------------------------

#[cfg(feature = "ndarray")]
mod ndarray_conversions {
    use super::*;
    use half::{bf16, f16};
    use ndarray::{Array, Array2, Array3, ArrayD, IxDyn, ShapeBuilder, arr0, s};

    #[test]
    fn a_transposed_array_converts_in_logical_order() {
        let a = Array2::from_shape_vec((2, 3), vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let at = a.t();
        assert!(!at.is_standard_layout());
        let t = Tensor::from_ndarray(&at);
        assert_eq!(t.shape(), &[3, 2]);
        assert!(t.is_realized());
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        assert_eq!(t.to_ndarray::<f32>().unwrap(), at.to_owned().into_dyn());

        // An owned Fortran-order array, and a 3-d array with permuted axes.
        let f = Array::from_shape_vec((2, 3).f(), vec![1i64, 4, 2, 5, 3, 6]).unwrap();
        assert_eq!(
            Tensor::from_ndarray(&f).to_vec::<i64>().unwrap(),
            vec![1, 2, 3, 4, 5, 6]
        );
        let c = Array3::from_shape_fn((2, 3, 4), |(i, j, k)| (i * 100 + j * 10 + k) as i32);
        let p = c.view().permuted_axes([2, 0, 1]);
        let t = Tensor::try_from_ndarray(&p).unwrap();
        assert_eq!(t.shape(), &[4, 2, 3]);
        assert_eq!(
            t.to_vec::<i32>().unwrap(),
            p.iter().copied().collect::<Vec<_>>()
        );
        assert_eq!(t.to_ndarray::<i32>().unwrap(), p.to_owned().into_dyn());
    }

    #[test]
    fn a_negatively_strided_slice_converts() {
        let a = Array3::from_shape_fn((2, 3, 4), |(i, j, k)| (i * 12 + j * 4 + k) as f64);
        let v = a.slice(s![..;-1, 1.., ..;-2]);
        assert_eq!(v.shape(), &[2, 2, 2]);
        assert!(v.strides().iter().any(|&s| s < 0));
        let t = Tensor::from_ndarray(&v);
        assert_eq!(t.shape(), &[2, 2, 2]);
        assert_eq!(
            t.to_vec::<f64>().unwrap(),
            vec![19.0, 17.0, 23.0, 21.0, 7.0, 5.0, 11.0, 9.0]
        );
        assert_eq!(t.to_ndarray::<f64>().unwrap(), v.to_owned().into_dyn());
        // A non-contiguous positive-stride slice too.
        let w = a.slice(s![.., ..;2, 1..3]);
        let t = Tensor::from_ndarray(&w);
        assert_eq!(
            t.to_vec::<f64>().unwrap(),
            w.iter().copied().collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_zero_dimensional_array_converts() {
        let a = arr0(2.5f64);
        let t = Tensor::from_ndarray(&a);
        assert_eq!(t.shape(), &[] as &[usize]);
        assert_eq!(t.item::<f64>().unwrap(), 2.5);
        let back = t.to_ndarray::<f64>().unwrap();
        assert_eq!(back.ndim(), 0);
        assert_eq!(back[IxDyn(&[])], 2.5);
        let s = Tensor::scalar(true).to_ndarray::<bool>().unwrap();
        assert_eq!(s, arr0(true).into_dyn());
    }

    fn round_trip<T: kiln::Element + PartialEq>(values: Vec<T>, shape: &[usize]) {
        let a = ArrayD::from_shape_vec(IxDyn(shape), values.clone()).unwrap();
        let t = Tensor::from_ndarray(&a);
        assert_eq!((t.dtype(), t.shape()), (T::DTYPE, shape));
        assert_eq!(t.to_vec::<T>().unwrap(), values);
        let back = t.to_ndarray::<T>().unwrap();
        assert_eq!(back.shape(), shape);
        assert_eq!(back.iter().copied().collect::<Vec<T>>(), values);
    }

    #[test]
    fn every_element_type_round_trips() {
        round_trip(vec![true, false, true, true], &[2, 2]);
        round_trip((0..=255u8).collect(), &[4, 8, 8]);
        round_trip(vec![i32::MIN, 0, i32::MAX], &[3]);
        round_trip(vec![i64::MIN, -1, i64::MAX, 0], &[1, 4]);
        round_trip(
            vec![f16::MAX, f16::MIN_POSITIVE_SUBNORMAL, f16::NEG_INFINITY],
            &[3],
        );
        round_trip(
            vec![bf16::MAX, bf16::MIN_POSITIVE, -bf16::ONE, bf16::ZERO],
            &[2, 2],
        );
        round_trip(vec![1.5f32, -0.0, f32::MAX], &[3, 1]);
        round_trip(vec![f64::MIN_POSITIVE, 1e300], &[2]);
        round_trip(Vec::<f32>::new(), &[0, 5]);
        // NaN payloads survive (compared as bits).
        let nan = f32::from_bits(0x7FC0_0123);
        let t = Tensor::from_ndarray(&ndarray::arr1(&[nan]));
        assert_eq!(t.to_ndarray::<f32>().unwrap()[[0]].to_bits(), 0x7FC0_0123);

        // Other element types convert as `cast` does.
        let a = Tensor::from_vec(vec![1.5f32, -2.5], [2])
            .to_ndarray::<f64>()
            .unwrap();
        assert_eq!(a.as_slice().unwrap(), &[1.5, -2.5]);
        let a = Tensor::from_vec(vec![1.5f32, -2.5], [2])
            .to_ndarray::<i64>()
            .unwrap();
        assert_eq!(a.as_slice().unwrap(), &[1, -2]);
    }
}
