//! Renders kernel IR to CUDA C (`extern "C" __global__`), ready for NVRTC.
//!
//! * Elementwise kernels: one thread per element of S, grid-stride loop.
//! * Reduce kernels: a block reduces one output row, or 32 adjacent rows at once when the
//!   rows are adjacent in memory and the reduce space is not (a column sum: each warp then
//!   reads 32 consecutive elements). In each pass the threads stride over the reduce space,
//!   combine their partial results with warp shuffles and shared memory
//!   (`kernels/kiln_reduce.cuh`), and every thread gets its row's value; `Row` values are
//!   then computed by every thread, the `Elem` stores happen in a final pass, and one thread
//!   per row writes the `Row` stores. See [`RowLayout`].
//! * A reduction with few rows and a long reduce space (a full sum, a loss) is split over
//!   several blocks per row so that it fills the GPU: each block writes its partial result
//!   to a device scratch area, and the last block of a row to finish (an atomic counter)
//!   combines the partials in a fixed order — deterministic, one launch.
//!
//! Indices are 32-bit when every extent and view offset fits, 64-bit otherwise. Half types
//! are stored as 16-bit patterns, computed in f32 and rounded after every op, as on the CPU.
//! Integer arithmetic wraps (through unsigned arithmetic), float→int casts saturate: the
//! CPU backend's semantics exactly. The hand-written pieces in `kernels/` are pasted in
//! front of the kernel, each only when used.

use crate::dtype::{ComputeType, DType, Scalar};
use crate::error::{KilnError, Result};
use crate::kernel::{IrOp, Kernel, Level, ScanOp, Special, ValueId};
use crate::ops::{GenKind, ReduceOp, ScatterReduce};
use crate::shape::View;
use std::fmt::Write;

/// `kernels/kiln_common.cuh`.
pub const COMMON_CUH: &str = include_str!("../../../kernels/kiln_common.cuh");
/// `kernels/kiln_reduce.cuh`.
pub const REDUCE_CUH: &str = include_str!("../../../kernels/kiln_reduce.cuh");
/// `kernels/kiln_random.cuh`.
pub const RANDOM_CUH: &str = include_str!("../../../kernels/kiln_random.cuh");
/// `kernels/kiln_matmul.cuh`.
pub const MATMUL_CUH: &str = include_str!("../../../kernels/kiln_matmul.cuh");

/// Threads per block.
pub const BLOCK: u32 = 256;
/// Elements each thread of an elementwise kernel handles per grid-stride trip.
pub const ELEMENTWISE_UNROLL: usize = 4;

/// How to launch a rendered kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// One thread per element of the `numel`-element space (grid-stride).
    Elementwise {
        /// Number of elements in the kernel's index space.
        numel: u64,
    },
    /// One block of `block` threads per group of [`RowLayout::lanes`] output rows, times
    /// `splits` blocks per group when the reduce space is split.
    Rows {
        /// Number of row groups.
        groups: u64,
        /// Threads per block.
        block: u32,
        /// Blocks per row group (1 unless split; the grid is then exactly
        /// `groups * splits`).
        splits: u32,
    },
}

/// Slots of 8 bytes in the device scratch area for split reductions' partial values (as many
/// again follow for arg-reductions' indices, then `SPLIT_SLOTS / 2` u32 counters).
pub const SPLIT_SLOTS: usize = 1 << 16;

/// Bytes of the scratch area a split reduction's kernel takes: partial values, partial
/// indices, one counter per row group (zero between launches: the last block resets it).
pub const SPLIT_SCRATCH_BYTES: usize = SPLIT_SLOTS * 16 + SPLIT_SLOTS / 2 * 4;

/// Blocks a split reduction aims to launch: about eight 256-thread blocks per multiprocessor
/// of a large GPU (an H200 has 132), so that every multiprocessor has loads in flight.
const SPLIT_TARGET_BLOCKS: usize = 1024;

/// Elements each thread of a split reduction reduces at least.
const SPLIT_GRAIN: usize = 16;

/// How a reduce kernel's threads cover its rows and reduce space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLayout {
    /// Groups of `lanes` output rows (the last may be partial).
    pub groups: usize,
    /// Output rows one block reduces together: 1, or 32 for column-like reductions (thread
    /// `x` of a block serves row `x % 32`, so a warp reads 32 adjacent rows' elements).
    pub lanes: usize,
    /// Threads per row (`block = lanes * threads`).
    pub threads: usize,
    /// Blocks per row group: above 1 the reduce space is split over blocks whose partial
    /// results the last of them combines.
    pub splits: usize,
}

impl RowLayout {
    /// The layout for kernel `k` (a kernel with reduce axes). A pure function of the kernel's
    /// structure, so a rendered source depends on nothing else. `KILN_CUDA_REDUCE_SPLITS=n`
    /// forces `n` splits on every kernel that can be split (for tests of the split path on
    /// small shapes).
    pub fn choose(k: &Kernel) -> RowLayout {
        let rows: usize = k.row_shape().iter().product();
        let red: usize = k.reduce_axes.iter().map(|&a| k.shape[a]).product();
        let lanes = if rows >= 2 && column_like(k) { 32 } else { 1 };
        let threads = if lanes == 1 {
            red.next_power_of_two().clamp(32, BLOCK as usize)
        } else {
            red.next_power_of_two().clamp(1, BLOCK as usize / lanes)
        };
        let passes = k.passes();
        let splittable = passes.passes.len() == 2
            && passes.passes[1].stores.is_empty()
            && !passes.passes[0].reduces.is_empty();
        let groups = rows.div_ceil(lanes);
        let slots_per_split = groups.max(1) * lanes * passes.passes[0].reduces.len().max(1);
        let wanted = match forced_splits() {
            Some(n) => n.min(red),
            None => (red / (threads * SPLIT_GRAIN)).min(SPLIT_TARGET_BLOCKS / groups.max(1)),
        };
        let splits = wanted.min(SPLIT_SLOTS / slots_per_split);
        RowLayout {
            groups,
            lanes,
            threads,
            splits: if splittable && splits >= 2 { splits } else { 1 },
        }
    }
}

/// `KILN_CUDA_REDUCE_SPLITS`, read once.
fn forced_splits() -> Option<usize> {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        std::env::var("KILN_CUDA_REDUCE_SPLITS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// True when the kernel's loads mostly run along its last output dimension rather than its
/// reduce space (a column sum of a row-major tensor), so blocks should cover adjacent rows.
fn column_like(k: &Kernel) -> bool {
    let out_dims: Vec<usize> = (0..k.shape.len())
        .filter(|d| !k.reduce_axes.contains(d))
        .collect();
    let Some(&last) = out_dims.last() else {
        return false;
    };
    let (mut column, mut row) = (0usize, 0usize);
    for ins in &k.ops {
        let IrOp::Load { view, .. } = &ins.op else {
            continue;
        };
        if ins.level != Level::Elem {
            continue;
        }
        let unit = |d: usize| view.shape[d] > 1 && view.strides[d].unsigned_abs() == 1;
        if k.reduce_axes.iter().any(|&a| unit(a)) {
            row += 1;
        } else if unit(last) {
            column += 1;
        }
    }
    column > row
}

/// A kernel rendered to CUDA C.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedKernel {
    /// The `extern "C"` entry point.
    pub name: String,
    /// The complete CUDA C source, helper headers included.
    pub source: String,
    /// How to launch it.
    pub launch: Launch,
    /// The parameter slots the kernel takes after its buffers, in order, each passed as
    /// 64 bits in the given form.
    pub params: Vec<(usize, ParamForm)>,
    /// The kernel takes a last argument: a device error word (three u64) where it records
    /// an out-of-range index.
    pub error_word: bool,
    /// [`source_hash`] of `source`: the key of the device's loaded-function cache, computed
    /// once here rather than at every launch.
    pub hash: u64,
    /// The kernel takes two arguments before the error word: the device's split-reduction
    /// scratch area ([`SPLIT_SCRATCH_BYTES`]) and its counters (at byte `SPLIT_SLOTS * 16`).
    pub split_scratch: bool,
}

/// How a parameter's value is passed (always 64 bits: `unsigned long long pN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamForm {
    /// The bits of an f64.
    Float,
    /// An i64 (integers, bools, seeds).
    Int,
}

/// The parameter slots `k` reads and how each is passed.
fn param_forms(k: &Kernel) -> Vec<(usize, ParamForm)> {
    let mut out: Vec<(usize, ParamForm)> = vec![];
    for ins in &k.ops {
        let float = ins.dtype.is_float();
        let form = |f: bool| if f { ParamForm::Float } else { ParamForm::Int };
        let used: Vec<(usize, ParamForm)> = match &ins.op {
            IrOp::Param { slot } => vec![(*slot, form(float))],
            IrOp::Generate { kind, params, .. } => match kind {
                GenKind::Full => vec![(params[0], form(float))],
                GenKind::Arange => vec![(params[0], form(float)), (params[1], form(float))],
                GenKind::Rand | GenKind::Randn => vec![(params[0], ParamForm::Int)],
            },
            _ => vec![],
        };
        for u in used {
            if !out.iter().any(|x| x.0 == u.0) {
                out.push(u);
            }
        }
    }
    out.sort_unstable_by_key(|x| x.0);
    out
}

/// The C expression for parameter `slot` as a value of `dt`.
fn param_value(slot: usize, dt: DType) -> String {
    let ct = compute_ctype(dt);
    if dt.is_float() {
        format!("({ct})__longlong_as_double((long long)p{slot})")
    } else if dt == DType::Bool {
        format!("(unsigned char)(p{slot} != 0ULL)")
    } else {
        format!("({ct})(long long)p{slot}")
    }
}

/// C type a buffer of `dt` holds.
pub fn storage_ctype(dt: DType) -> &'static str {
    match dt {
        DType::Bool | DType::U8 => "unsigned char",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// C type values of `dt` are computed in.
pub fn compute_ctype(dt: DType) -> &'static str {
    crate::ops::c_type(dt.compute())
}

/// A C literal of `s` in `dt`'s compute type (bit-exact for floats, NaN and infinities
/// included).
pub fn literal(s: Scalar, dt: DType) -> String {
    let s = s.cast(dt);
    match dt.compute() {
        ComputeType::F32 => {
            let v = s.to_f64() as f32;
            if v.is_finite() {
                let t = format!("{v:?}");
                if t.contains(['.', 'e']) {
                    format!("{t}f")
                } else {
                    format!("{t}.0f")
                }
            } else {
                format!("__int_as_float(0x{:08x})", v.to_bits())
            }
        }
        ComputeType::F64 => {
            let v = s.to_f64();
            if v.is_finite() {
                let t = format!("{v:?}");
                if t.contains(['.', 'e']) {
                    t
                } else {
                    format!("{t}.0")
                }
            } else {
                format!("__longlong_as_double(0x{:016x}LL)", v.to_bits())
            }
        }
        ComputeType::I64 => {
            let v = s.to_i64();
            if v == i64::MIN {
                "(-9223372036854775807LL - 1)".into()
            } else {
                format!("{v}LL")
            }
        }
        ComputeType::I32 => {
            let v = s.to_i64() as i32;
            if v == i32::MIN {
                "(-2147483647 - 1)".into()
            } else {
                format!("{v}")
            }
        }
        ComputeType::U8 => format!("((unsigned char){})", s.to_i64() as u8),
    }
}

/// 64-bit FNV-1a of a kernel source (stable across processes and Rust versions: it also
/// names the on-disk NVRTC cache files).
pub fn source_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Makes an identifier out of a kernel name.
fn ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic()) {
        s.insert_str(0, "k_");
    }
    s
}

struct Renderer<'k> {
    k: &'k Kernel,
    /// Index type: `int` or `long long`.
    idx: &'static str,
    out_dims: Vec<usize>,
    /// Instructions whose values are computed by a matmul (read from the output buffer).
    body: String,
    /// Render loads as lanes of the vectors `w{v}_` (the vectorized elementwise loop).
    vector_loads: bool,
    /// Loads of a reduce kernel kept in registers (`rc{v}_[q_]`) between its passes.
    cached_loads: Vec<ValueId>,
    /// Those of `cached_loads` already in registers (a later pass reads them from there).
    filled_loads: Vec<ValueId>,
}

/// Most register slots per thread a reduce kernel may keep for each cached load (see
/// `Renderer::rows`).
const ROW_CACHE: usize = 16;

/// Renders `k`. Matmul kernels render their epilogue (the product is read from the
/// output buffer, where cuBLAS left it).
pub fn render(k: &Kernel) -> Result<RenderedKernel> {
    k.validate()
        .map_err(|e| KilnError::internal(format!("render {}: {e}", k.name)))?;
    // 32-bit indices leave room for one loop step past the end (a reduce loop's step is at
    // most 256 threads × SPLIT_SLOTS splits = 2^24 elements).
    let big = k.shape.iter().product::<usize>() >= (i32::MAX as usize) - (1 << 24)
        || k.args.iter().any(|a| a.numel >= i32::MAX as usize);
    let out_dims: Vec<usize> = (0..k.shape.len())
        .filter(|d| !k.reduce_axes.contains(d))
        .collect();
    let mut r = Renderer {
        k,
        idx: if big { "long long" } else { "int" },
        out_dims,
        body: String::new(),
        vector_loads: false,
        cached_loads: vec![],
        filled_loads: vec![],
    };
    let name = ident(&k.name);
    let mut split_scratch = false;
    let launch = if k.reduce_axes.is_empty() {
        r.elementwise()?;
        Launch::Elementwise {
            numel: k.shape.iter().product::<usize>() as u64,
        }
    } else {
        let layout = RowLayout::choose(k);
        split_scratch = layout.splits > 1;
        r.rows(layout)?;
        Launch::Rows {
            groups: layout.groups as u64,
            block: (layout.lanes * layout.threads) as u32,
            splits: layout.splits as u32,
        }
    };
    let mut src = String::new();
    let _ = writeln!(
        src,
        "// kiln kernel {} — generated from kernel IR; do not edit.",
        k.name
    );
    src.push_str(COMMON_CUH);
    if !k.reduce_axes.is_empty() {
        src.push_str(REDUCE_CUH);
    }
    let random = k.ops.iter().any(|i| {
        matches!(
            i.op,
            IrOp::Generate {
                kind: GenKind::Rand | GenKind::Randn,
                ..
            }
        )
    });
    if random {
        src.push_str(RANDOM_CUH);
    }
    let forms = param_forms(k);
    let error_word = k.ops.iter().any(|i| matches!(i.op, IrOp::Gather { .. }));
    // An in-place write reads its own output: those pointers may alias, so they are not
    // `__restrict__` (each thread still reads an element before writing it).
    let aliased = k.args.iter().any(|a| a.in_place);
    let params: Vec<String> = k
        .args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let c = if a.output { "" } else { "const " };
            let restrict = if aliased && (a.output || a.in_place) {
                ""
            } else {
                " __restrict__"
            };
            format!("{c}{}*{restrict} a{i}", storage_ctype(a.dtype))
        })
        .chain(
            forms
                .iter()
                .map(|(slot, _)| format!("const unsigned long long p{slot}")),
        )
        .chain(split_scratch.then(|| {
            "unsigned long long* __restrict__ kpart_, unsigned int* __restrict__ kcount_"
                .to_string()
        }))
        .chain(error_word.then(|| "unsigned long long* __restrict__ kerr".to_string()))
        .collect();
    let bound = match launch {
        Launch::Elementwise { .. } => BLOCK,
        Launch::Rows { block, .. } => block,
    };
    let _ = write!(
        src,
        "\nextern \"C\" __global__ void __launch_bounds__({bound}) {name}({}) {{\n{}}}\n",
        params.join(", "),
        r.body
    );
    Ok(RenderedKernel {
        name,
        hash: source_hash(&src),
        source: src,
        launch,
        params: forms,
        error_word,
        split_scratch,
    })
}

/// C offset expression `offset + Σ c_d·stride_d` over coordinate names `c{d}`.
fn offset_expr(view: &View, idx: &str) -> String {
    let mut terms = vec![format!("({idx}){}", view.offset)];
    for (d, (&n, &st)) in view.shape.iter().zip(&view.strides).enumerate() {
        if st != 0 && n > 1 {
            terms.push(format!("c{d} * ({idx}){st}"));
        }
    }
    terms.join(" + ")
}

/// Appends the lines that set `c{d}` to the coordinates of row-major position `var` over
/// `shape`, for every dimension but `skip` (whose extent the position does not count).
fn unravel_lines(body: &mut String, var: &str, shape: &[usize], skip: Option<usize>) {
    let _ = writeln!(body, "        long long r_ = {var};");
    for (d, &n) in shape.iter().enumerate().rev() {
        if Some(d) != skip {
            let _ = writeln!(
                body,
                "        const long long c{d} = r_ % {n}LL; r_ /= {n}LL;"
            );
        }
    }
}

/// The C literal of `r`'s identity in `dt` (the start of a place without an initial value).
fn scatter_identity(r: ScatterReduce, dt: DType) -> String {
    match dt {
        DType::F32 => match r {
            ScatterReduce::Amax => "__int_as_float(0xff800000)".into(),
            ScatterReduce::Amin => "__int_as_float(0x7f800000)".into(),
            _ => format!("{:.1}f", r.float_identity()),
        },
        DType::F64 => match r {
            ScatterReduce::Amax => "__longlong_as_double(0xfff0000000000000ULL)".into(),
            ScatterReduce::Amin => "__longlong_as_double(0x7ff0000000000000ULL)".into(),
            _ => format!("{:.1}", r.float_identity()),
        },
        // i64::MIN has no literal of its own in C.
        _ if r.int_identity(dt) == i64::MIN => "(-9223372036854775807LL - 1)".into(),
        _ => format!("{}LL", r.int_identity(dt)),
    }
}

/// The CUDA statement that combines `val` into `out[dst]` atomically: `atomicAdd` for sums,
/// `atomicMax`/`atomicMin` for integer extremes, else a compare-and-swap loop over the
/// element's bits (stopping early when the value would not change, so a NaN that already
/// holds the place stays).
fn scatter_atomic(r: ScatterReduce, dt: DType, dst: &str, val: &str) -> String {
    let (bits, to_bits, from_bits) = match dt {
        DType::F32 => ("int", "__float_as_int", "__int_as_float"),
        DType::F64 => (
            "unsigned long long",
            "(unsigned long long)__double_as_longlong",
            "__longlong_as_double",
        ),
        DType::I32 => ("int", "", ""),
        _ => ("unsigned long long", "(unsigned long long)", "(long long)"),
    };
    let ty = storage_ctype(dt);
    match (r, dt) {
        (ScatterReduce::Sum, DType::I64) => {
            format!("atomicAdd((unsigned long long*)&{dst}, (unsigned long long)({val}));")
        }
        (ScatterReduce::Sum, _) => format!("atomicAdd(&{dst}, ({ty})({val}));"),
        (ScatterReduce::Amax | ScatterReduce::Amin, DType::I32 | DType::I64) => {
            let f = if r == ScatterReduce::Amax {
                "atomicMax"
            } else {
                "atomicMin"
            };
            format!("{f}(&{dst}, ({ty})({val}));")
        }
        _ => {
            // The combined value from the place's current one `a` and the new one `b`.
            let combine = match (r, dt) {
                (ScatterReduce::Amax, _) => "(a != a || a > b) ? a : b".to_string(),
                (ScatterReduce::Amin, _) => "(a != a || a < b) ? a : b".to_string(),
                // Integer products wrap: multiply as unsigned.
                (_, DType::I32) => "(int)((unsigned)a * (unsigned)b)".to_string(),
                (_, DType::I64) => {
                    "(long long)((unsigned long long)a * (unsigned long long)b)".to_string()
                }
                _ => "a * b".to_string(),
            };
            format!(
                "{{ {bits}* p_ = ({bits}*)&{dst}; const {ty} b = ({ty})({val}); {bits} old_ = *p_, seen_; \
                 do {{ seen_ = old_; const {ty} a = {from_bits}(seen_); const {ty} n_ = {combine}; \
                 const {bits} nb_ = {to_bits}(n_); if (nb_ == seen_) break; old_ = atomicCAS(p_, seen_, nb_); }} \
                 while (old_ != seen_); }}"
            )
        }
    }
}

/// Renders a scatter kernel as two CUDA kernels: one starting the output (a copy of the
/// initial value, or the reduction's identity), one combining every value into its place
/// with atomics (the CPU's scatter is the deterministic one).
pub fn render_scatter(k: &Kernel) -> Result<(RenderedKernel, RenderedKernel)> {
    let Some(Special::Scatter(spec)) = &k.special else {
        return Err(KilnError::internal(
            "render_scatter of a kernel without a scatter",
        ));
    };
    let op = spec.reduce.op_name();
    let out = &k.args[spec.out];
    let ty = storage_ctype(out.dtype);
    if !matches!(out.dtype, DType::F32 | DType::F64 | DType::I32 | DType::I64) {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: out.dtype,
            detail: ": CUDA scatters f32, f64, i32 and i64 (kiln reduces half types in f32)".into(),
        });
    }
    let name = ident(&k.name);
    let idx = "long long";
    let n_out: usize = k.shape.iter().product();
    let start = match &spec.init {
        Some((_, view)) => {
            let mut b = String::new();
            unravel_lines(&mut b, "i", &view.shape, None);
            let _ = write!(b, "        out[i] = init[{}];", offset_expr(view, idx));
            format!(
                "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {name}_start(const {ty}* __restrict__ init, {ty}* __restrict__ out) {{\n\
                 \x20   for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {n_out}LL; i += (long long)gridDim.x * blockDim.x) {{\n{b}\n    }}\n}}\n"
            )
        }
        None => format!(
            "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {name}_start({ty}* __restrict__ out) {{\n\
             \x20   for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {n_out}LL; i += (long long)gridDim.x * blockDim.x) out[i] = ({ty}){};\n}}\n",
            scatter_identity(spec.reduce, out.dtype)
        ),
    };
    let start = format!("// kiln kernel {name}_start — generated; do not edit.\n{start}");
    let shape = &spec.index_view.shape;
    let positions: usize = shape.iter().product();
    let mut body = String::new();
    let _ = writeln!(
        body,
        "    for (long long i_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; i_ < {positions}LL; i_ += (long long)gridDim.x * blockDim.x) {{"
    );
    unravel_lines(&mut body, "i_", shape, None);
    let out_strides = crate::shape::contiguous_strides(&k.shape);
    let mut dest = vec![];
    for (d, &st) in out_strides.iter().enumerate() {
        if d != spec.axis {
            dest.push(format!("c{d} * {st}LL"));
        }
    }
    let _ = writeln!(
        body,
        "        const long long j_ = kiln_index(a{}[{}], {}LL, kerr);",
        spec.index,
        offset_expr(&spec.index_view, idx),
        k.shape[spec.axis]
    );
    dest.push(format!("j_ * {}LL", out_strides[spec.axis]));
    let dst = format!("a{}[{}]", spec.out, dest.join(" + "));
    let val = format!("a{}[{}]", spec.values, offset_expr(&spec.values_view, idx));
    let _ = writeln!(
        body,
        "        {}",
        scatter_atomic(spec.reduce, out.dtype, &dst, &val)
    );
    let _ = writeln!(body, "    }}");
    let mut src = String::new();
    let _ = writeln!(
        src,
        "// kiln kernel {name} — generated from a scatter; do not edit."
    );
    src.push_str(COMMON_CUH);
    let vt = storage_ctype(k.args[spec.values].dtype);
    // Every argument in order (the initial value is read by the start kernel only).
    let mut params = vec![
        format!("const long long* __restrict__ a{}", spec.index),
        format!("const {vt}* __restrict__ a{}", spec.values),
    ];
    if let Some((i, _)) = &spec.init {
        params.push(format!("const {ty}* __restrict__ a{i}"));
    }
    params.push(format!("{ty}* __restrict__ a{}", spec.out));
    params.push("unsigned long long* __restrict__ kerr".into());
    let _ = write!(
        src,
        "\nextern \"C\" __global__ void __launch_bounds__({BLOCK}) {name}({}) {{\n{body}}}\n",
        params.join(", ")
    );
    let start_kernel = RenderedKernel {
        name: format!("{name}_start"),
        hash: source_hash(&start),
        source: start,
        launch: Launch::Elementwise {
            numel: n_out as u64,
        },
        params: vec![],
        error_word: false,
        split_scratch: false,
    };
    let scatter = RenderedKernel {
        name,
        hash: source_hash(&src),
        source: src,
        launch: Launch::Elementwise {
            numel: positions as u64,
        },
        params: vec![],
        error_word: true,
        split_scratch: false,
    };
    Ok((start_kernel, scatter))
}

/// Every CUDA kernel that runs `k`, in launch order: one for fused and lane kernels, a
/// starting kernel and the scatter for scatters, none for a bare matmul (cuBLAS alone).
pub fn render_all(k: &Kernel) -> Result<Vec<RenderedKernel>> {
    Ok(match &k.special {
        Some(Special::Scatter(_)) => {
            let (zero, scatter) = render_scatter(k)?;
            vec![zero, scatter]
        }
        Some(Special::Scan { .. } | Special::ArgSort { .. }) => vec![render_lanes(k)?],
        None if k.matmul.is_some()
            && k.ops.len() == 2
            && matches!(k.ops[0].op, IrOp::MatmulResult) =>
        {
            vec![]
        }
        None => vec![render(k)?],
    })
}

/// Renders a scan or sort kernel. Scans run one thread per lane, in order along the axis
/// (f64 totals for floats, wrapping 64-bit totals for integers, as on the CPU). Sorts run
/// one thread per element: each counts the elements of its lane that sort before it (by key,
/// then index — a strict total order, so the counts are a permutation) and writes its index
/// at that rank; O(len²) work per lane, no synchronization.
pub fn render_lanes(k: &Kernel) -> Result<RenderedKernel> {
    k.validate()
        .map_err(|e| KilnError::internal(format!("render {}: {e}", k.name)))?;
    let Some((input, view, axis, out)) = k.special.as_ref().and_then(Special::lanes) else {
        return Err(KilnError::internal("render_lanes of another kernel"));
    };
    let name = ident(&k.name);
    let (idt, odt) = (k.args[input].dtype, k.args[out].dtype);
    let (it, ot) = (storage_ctype(idt), storage_ctype(odt));
    let len = k.shape[axis];
    let out_strides = crate::shape::contiguous_strides(&k.shape);
    let total: usize = k.shape.iter().product();
    let lanes = total.checked_div(len).unwrap_or(0);
    let load = |at: &str| -> String {
        if idt.is_float() {
            format!("(double){}", load_conv(idt, &format!("a{input}[{at}]")))
        } else {
            format!("(long long)a{input}[{at}]")
        }
    };
    // Lane bases from the off-axis coordinates c{d}.
    let bases = |body: &mut String, var: &str| {
        unravel_lines(body, var, &k.shape, Some(axis));
        let mut ib = vec![format!("{}LL", view.offset)];
        let mut ob = vec!["0LL".to_string()];
        for d in (0..k.shape.len()).filter(|&d| d != axis) {
            ib.push(format!("c{d} * {}LL", view.strides[d]));
            ob.push(format!("c{d} * {}LL", out_strides[d]));
        }
        let _ = writeln!(body, "        const long long ib_ = {};", ib.join(" + "));
        let _ = writeln!(body, "        const long long ob_ = {};", ob.join(" + "));
    };
    let (ist, ost) = (view.strides[axis], out_strides[axis]);
    let mut body = String::new();
    let launch_n;
    match &k.special {
        Some(Special::Scan { op, .. }) => {
            launch_n = lanes;
            let (acc_t, init, step) = match (odt.is_float(), op) {
                (true, ScanOp::Sum) => ("double", "0.0", "acc_ += x_;"),
                (true, ScanOp::Prod) => ("double", "1.0", "acc_ *= x_;"),
                (false, ScanOp::Sum) => (
                    "unsigned long long",
                    "0ULL",
                    "acc_ += (unsigned long long)x_;",
                ),
                (false, ScanOp::Prod) => (
                    "unsigned long long",
                    "1ULL",
                    "acc_ *= (unsigned long long)x_;",
                ),
            };
            let conv = if odt.is_float() {
                "(double)"
            } else {
                "(long long)"
            };
            let store = match odt {
                DType::F16 | DType::BF16 => store_conv(odt, "(float)acc_"),
                DType::F32 => "(float)acc_".into(),
                DType::F64 => "acc_".into(),
                DType::Bool => "(unsigned char)(acc_ != 0)".into(),
                _ => format!("({ot})(long long)acc_"),
            };
            let _ = writeln!(
                body,
                "    for (long long q_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; q_ < {lanes}LL; q_ += (long long)gridDim.x * blockDim.x) {{"
            );
            bases(&mut body, "q_");
            let _ = writeln!(body, "        {acc_t} acc_ = {init};");
            let _ = writeln!(
                body,
                "        for (long long j_ = 0; j_ < {len}LL; ++j_) {{"
            );
            let _ = writeln!(
                body,
                "            const auto x_ = {conv}({});",
                load(&format!("ib_ + j_ * {ist}LL"))
            );
            let _ = writeln!(body, "            {step}");
            let _ = writeln!(body, "            a{out}[ob_ + j_ * {ost}LL] = {store};");
            let _ = writeln!(body, "        }}\n    }}");
        }
        Some(Special::ArgSort { descending, .. }) => {
            launch_n = total;
            let kt = if idt.is_float() {
                "double"
            } else {
                "long long"
            };
            // less(a, b): NaN above every number.
            let less = if idt.is_float() {
                "(!isnan(A) && (isnan(B) || A < B))"
            } else {
                "(A < B)"
            };
            let lt = |a: &str, b: &str| {
                let (a, b) = if *descending { (b, a) } else { (a, b) };
                less.replace('A', a).replace('B', b)
            };
            let _ = writeln!(
                body,
                "    for (long long i_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; i_ < {total}LL; i_ += (long long)gridDim.x * blockDim.x) {{"
            );
            let _ = writeln!(
                body,
                "        const long long j_ = (i_ / {}LL) % {len}LL;",
                ost
            );
            let _ = writeln!(
                body,
                "        const long long q_ = (i_ / ({len}LL * {ost}LL)) * {ost}LL + i_ % {ost}LL;"
            );
            bases(&mut body, "q_");
            let _ = writeln!(
                body,
                "        const {kt} me_ = {};",
                load(&format!("ib_ + j_ * {ist}LL"))
            );
            let _ = writeln!(body, "        long long rank_ = 0;");
            let _ = writeln!(
                body,
                "        for (long long t_ = 0; t_ < {len}LL; ++t_) {{"
            );
            let _ = writeln!(
                body,
                "            const {kt} o_ = {};",
                load(&format!("ib_ + t_ * {ist}LL"))
            );
            let _ = writeln!(
                body,
                "            if ({} || (!{} && t_ < j_)) ++rank_;",
                lt("o_", "me_"),
                lt("me_", "o_")
            );
            let _ = writeln!(body, "        }}");
            let _ = writeln!(body, "        a{out}[ob_ + rank_ * {ost}LL] = j_;\n    }}");
        }
        _ => return Err(KilnError::internal("render_lanes of another kernel")),
    }
    let mut src = String::new();
    let _ = writeln!(
        src,
        "// kiln kernel {name} — generated from a lane kernel; do not edit."
    );
    src.push_str(COMMON_CUH);
    let _ = write!(
        src,
        "\nextern \"C\" __global__ void __launch_bounds__({BLOCK}) {name}(const {it}* __restrict__ a{input}, {ot}* __restrict__ a{out}) {{\n{body}}}\n"
    );
    Ok(RenderedKernel {
        name,
        hash: source_hash(&src),
        source: src,
        launch: Launch::Elementwise {
            numel: launch_n as u64,
        },
        params: vec![],
        error_word: false,
        split_scratch: false,
    })
}

impl Renderer<'_> {
    fn line(&mut self, depth: usize, s: &str) {
        for _ in 0..depth {
            self.body.push_str("    ");
        }
        self.body.push_str(s);
        self.body.push('\n');
    }

    /// `c{d} = ...` for the dims in `dims`, from flat index `var` (row-major over `dims`).
    fn unflatten(&mut self, depth: usize, var: &str, dims: &[usize]) {
        let idx = self.idx;
        if dims.is_empty() {
            return;
        }
        self.line(depth, &format!("{idx} r_ = {var};"));
        for (j, &d) in dims.iter().enumerate().rev() {
            let n = self.k.shape[d];
            if j == 0 {
                self.line(depth, &format!("const {idx} c{d} = r_;"));
            } else {
                self.line(depth, &format!("const {idx} c{d} = r_ % {n}; r_ /= {n};"));
            }
        }
    }

    fn elementwise(&mut self) -> Result<()> {
        let idx = self.idx;
        let n: usize = self.k.shape.iter().product();
        let dims: Vec<usize> = (0..self.k.shape.len()).collect();
        // Grid-stride loop over ELEMENTWISE_UNROLL elements per trip, rendered as all their
        // loads and arithmetic first, then all their stores: the loads are in flight
        // together, which a memory-bound kernel needs to approach copy bandwidth (each unit
        // stores only its own element, so the order is safe even for the in-place matmul
        // epilogue). The trip counter is 64-bit so it cannot overflow; `i_` uses the
        // kernel's index type. A tail loop takes the rest one element at a time.
        let u = ELEMENTWISE_UNROLL;
        let passes = self.k.passes();
        let last = passes.passes.len() - 1;
        let (elem_ids, store_ids) = (
            passes.passes[last].elem.clone(),
            passes.passes[last].stores.clone(),
        );
        let elem = self.captured(|r| {
            r.unflatten(0, "i_", &dims);
            elem_ids.iter().try_for_each(|&v| r.instr(0, v))
        })?;
        let stores = self.captured(|r| store_ids.iter().try_for_each(|&v| r.instr(0, v)))?;
        if self.vectorizable(&elem_ids, &store_ids) {
            return self.vector_elementwise(&elem_ids, &store_ids, &elem, &stores);
        }
        self.line(1, &format!("const long long n_ = {n}LL;"));
        self.line(
            1,
            "const long long stride_ = (long long)gridDim.x * blockDim.x;",
        );
        self.line(
            1,
            "long long i0_ = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        );
        self.line(
            1,
            &format!(
                "for (; i0_ < n_ - {} * stride_; i0_ += {u} * stride_) {{",
                u - 1
            ),
        );
        for unit in 0..u {
            self.line(
                2,
                &format!("const {idx} i__{unit} = ({idx})(i0_ + {unit} * stride_);"),
            );
            for l in elem.lines() {
                self.line(2, &unit_names(l, unit));
            }
        }
        for unit in 0..u {
            for l in stores.lines() {
                self.line(2, &unit_names(l, unit));
            }
        }
        self.line(1, "}");
        self.line(1, "for (; i0_ < n_; i0_ += stride_) {");
        self.line(2, &format!("const {idx} i_ = ({idx})i0_;"));
        for l in elem.lines().chain(stores.lines()) {
            self.line(2, l);
        }
        self.line(1, "}");
        Ok(())
    }

    /// True when every buffer the elementwise kernel reads or writes is read or written
    /// contiguously and in order (unmasked, offset 0), in a 2- or 4-byte type: then four
    /// neighbouring elements are one 8- or 16-byte vector load or store (see
    /// [`Renderer::vector_elementwise`]). `KILN_CUDA_VECTOR=0` turns this off.
    fn vectorizable(&self, elem: &[ValueId], stores: &[ValueId]) -> bool {
        static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let enabled =
            *ENABLED.get_or_init(|| std::env::var("KILN_CUDA_VECTOR").map_or(true, |v| v != "0"));
        let k = self.k;
        let n: usize = k.shape.iter().product();
        let ok = |view: &View, dt: DType| {
            vector_ctype(dt).is_some() && view.is_contiguous() && view.shape == k.shape
        };
        enabled
            && n >= 4
            && k.matmul.is_none()
            && elem.iter().chain(stores).all(|&v| match &k.ops[v].op {
                IrOp::Load { view, .. } | IrOp::Store { view, .. } => ok(view, k.ops[v].dtype),
                IrOp::Gather { .. } | IrOp::MatmulResult => false,
                _ => true,
            })
    }

    /// The vectorized elementwise loop: thread `j_` of the grid-stride loop takes elements
    /// `4 j_ .. 4 j_ + 4`, loads each input as one vector, computes the four elements as four
    /// units, and stores each output as one vector; a scalar loop takes the last `n % 4`.
    fn vector_elementwise(
        &mut self,
        elem_ids: &[ValueId],
        store_ids: &[ValueId],
        scalar_elem: &str,
        scalar_stores: &str,
    ) -> Result<()> {
        let k = self.k;
        let idx = self.idx;
        let n: usize = k.shape.iter().product();
        let dims: Vec<usize> = (0..k.shape.len()).collect();
        self.vector_loads = true;
        let elem = self.captured(|r| {
            r.unflatten(0, "i_", &dims);
            elem_ids.iter().try_for_each(|&v| r.instr(0, v))
        });
        self.vector_loads = false;
        let elem = elem?;
        self.line(
            1,
            &format!("const long long n_ = {n}LL, nv_ = {}LL;", n / 4),
        );
        self.line(
            1,
            "const long long stride_ = (long long)gridDim.x * blockDim.x;",
        );
        self.line(
            1,
            "for (long long j_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; j_ < nv_; j_ += stride_) {",
        );
        for &v in elem_ids {
            if let IrOp::Load { arg, .. } = &k.ops[v].op {
                let dt = k.args[*arg].dtype;
                let vt = vector_ctype(dt).unwrap_or("float4");
                self.line(
                    2,
                    &format!("const {vt} w{v}_ = reinterpret_cast<const {vt}*>(a{arg})[j_];"),
                );
            }
        }
        for (unit, lane) in ["x", "y", "z", "w"].iter().enumerate() {
            self.line(
                2,
                &format!("const {idx} i__{unit} = ({idx})(4 * j_ + {unit});"),
            );
            for l in elem.lines() {
                self.line(
                    2,
                    &unit_names(l, unit).replace(".LANE_", &format!(".{lane}")),
                );
            }
        }
        for &s in store_ids {
            if let IrOp::Store { arg, src, .. } = &k.ops[s].op {
                let dt = k.ops[s].dtype;
                let vt = vector_ctype(dt).unwrap_or("float4");
                let parts: Vec<String> = (0..4)
                    .map(|u| store_conv(dt, &unit_names(&self.value(*src, Level::Elem), u)))
                    .collect();
                self.line(
                    2,
                    &format!(
                        "reinterpret_cast<{vt}*>(a{arg})[j_] = make_{vt}({});",
                        parts.join(", ")
                    ),
                );
            }
        }
        self.line(1, "}");
        if !n.is_multiple_of(4) {
            self.line(
                1,
                "for (long long i0_ = 4 * nv_ + (long long)blockIdx.x * blockDim.x + threadIdx.x; i0_ < n_; i0_ += stride_) {",
            );
            self.line(2, &format!("const {idx} i_ = ({idx})i0_;"));
            for l in scalar_elem.lines().chain(scalar_stores.lines()) {
                self.line(2, l);
            }
            self.line(1, "}");
        }
        Ok(())
    }

    /// The lines `f` renders, taken out of the kernel body.
    fn captured(&mut self, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<String> {
        let saved = std::mem::take(&mut self.body);
        let out = f(self);
        let text = std::mem::replace(&mut self.body, saved);
        out.map(|()| text)
    }

    /// The reduce kernel body for `layout` (see [`RowLayout`]).
    fn rows(&mut self, layout: RowLayout) -> Result<()> {
        let idx = self.idx;
        let k = self.k;
        let rows: usize = k.row_shape().iter().product();
        let red: usize = k.reduce_axes.iter().map(|&a| k.shape[a]).product();
        let out_dims = self.out_dims.clone();
        let axes = k.reduce_axes.clone();
        let passes = k.passes();
        let RowLayout {
            groups,
            lanes,
            threads,
            splits,
        } = layout;
        let smem = if lanes == 1 { 64 } else { 2 * lanes * threads };
        self.line(1, &format!("__shared__ unsigned long long smem_[{smem}];"));
        if lanes == 1 {
            self.line(1, "const int t_ = threadIdx.x;");
        } else {
            self.line(
                1,
                &format!("const int lane_ = threadIdx.x % {lanes}, t_ = threadIdx.x / {lanes};"),
            );
        }
        if splits > 1 {
            self.line(1, "__shared__ int last_;");
            self.line(1, &format!("const int s_ = blockIdx.x % {splits};"));
            self.line(
                1,
                &format!(
                    "for (long long g_ = blockIdx.x / {splits}; g_ < {groups}LL; g_ += gridDim.x / {splits}) {{"
                ),
            );
        } else {
            self.line(
                1,
                &format!("for (long long g_ = blockIdx.x; g_ < {groups}LL; g_ += gridDim.x) {{"),
            );
        }
        if lanes == 1 {
            self.line(2, "const long long row_ = g_;");
        } else {
            // Lanes past the last row compute the last row again and store nothing.
            self.line(
                2,
                &format!("const bool live_ = g_ * {lanes} + lane_ < {rows}LL;"),
            );
            self.line(
                2,
                &format!(
                    "const long long row_ = live_ ? g_ * {lanes} + lane_ : {}LL;",
                    rows - 1
                ),
            );
        }
        self.unflatten(2, &format!("({idx})row_"), &out_dims);
        for &v in &passes.row_first {
            self.instr(2, v)?;
        }
        let step = threads * splits;
        let start = if splits > 1 {
            format!("s_ * {threads} + t_")
        } else {
            "t_".to_string()
        };
        // A load that several passes read (softmax and layer norm read their row three
        // times) is kept in registers when each thread's share of the row is at most
        // ROW_CACHE elements: the first pass loads it, later passes reuse it. The passes then
        // run fully unrolled over the thread's slots, so every load of the first pass is in
        // flight at once and the register array is indexed by constants.
        let slots = red.div_ceil(threads);
        self.cached_loads = if lanes == 1 && splits == 1 && slots <= ROW_CACHE {
            k.ops
                .iter()
                .enumerate()
                .filter(|(v, ins)| {
                    matches!(ins.op, IrOp::Load { .. })
                        && ins.level == Level::Elem
                        && passes.passes.iter().filter(|p| p.elem.contains(v)).count() >= 2
                })
                .map(|(v, _)| v)
                .collect()
        } else {
            vec![]
        };
        self.filled_loads.clear();
        let cached = !self.cached_loads.is_empty();
        for &v in &self.cached_loads.clone() {
            let ct = compute_ctype(k.ops[v].dtype);
            self.line(2, &format!("{ct} rc{v}_[{slots}];"));
        }
        for pass in &passes.passes {
            if !pass.reduces.is_empty() || !pass.stores.is_empty() {
                // Accumulators.
                for &r in &pass.reduces {
                    let (op, src) = reduce_parts(k, r);
                    let acc = acc_ctype(k.ops[src].dtype);
                    let id = identity(op, k.ops[src].dtype);
                    self.line(2, &format!("{acc} acc{r} = {id};"));
                    if op.is_arg() {
                        self.line(2, &format!("long long acci{r} = -1;"));
                    }
                }
                if cached {
                    self.line(2, "#pragma unroll");
                    self.line(2, &format!("for (int q_ = 0; q_ < {slots}; ++q_) {{"));
                    self.line(3, &format!("const {idx} a_ = t_ + q_ * {threads};"));
                    // Guarded only when the row does not fill every slot; a guard, not an
                    // early exit, so the unrolled loads stay independent of each other.
                    if !red.is_multiple_of(threads) {
                        self.line(3, &format!("if (a_ < {red}) {{"));
                    }
                } else {
                    self.line(2, "#pragma unroll 4");
                    self.line(
                        2,
                        &format!("for ({idx} a_ = {start}; a_ < {red}; a_ += {step}) {{"),
                    );
                }
                self.unflatten(3, "a_", &axes);
                for &v in &pass.elem {
                    self.instr(3, v)?;
                }
                for &r in &pass.reduces {
                    let (op, src) = reduce_parts(k, r);
                    let acc = acc_ctype(k.ops[src].dtype);
                    let val = self.value(src, Level::Elem);
                    let line = match op {
                        ReduceOp::ArgMax | ReduceOp::ArgMin => format!(
                            "kiln_arg_combine<{}>(acc{r}, acci{r}, ({acc}){val}, (long long)a_);",
                            op_code(op)
                        ),
                        _ => format!(
                            "acc{r} = kiln_combine<{}>(acc{r}, ({acc}){val});",
                            op_code(op)
                        ),
                    };
                    self.line(3, &line);
                }
                if !pass.stores.is_empty() {
                    if lanes > 1 {
                        self.line(3, "if (live_) {");
                    }
                    let depth = if lanes > 1 { 4 } else { 3 };
                    for &s in &pass.stores {
                        self.instr(depth, s)?;
                    }
                    if lanes > 1 {
                        self.line(3, "}");
                    }
                }
                if cached && !red.is_multiple_of(threads) {
                    self.line(3, "}");
                }
                self.line(2, "}");
                let filled: Vec<ValueId> = self
                    .cached_loads
                    .iter()
                    .copied()
                    .filter(|v| pass.elem.contains(v))
                    .collect();
                self.filled_loads.extend(filled);
                if splits > 1 {
                    self.split_combine(&pass.reduces, layout);
                }
                for &r in &pass.reduces {
                    self.reduce_result(r, lanes);
                }
            }
            for &v in &pass.row_after {
                self.instr(2, v)?;
            }
        }
        if !passes.row_stores.is_empty() {
            if lanes == 1 {
                self.line(2, "if (t_ == 0) {");
            } else {
                self.line(2, "if (t_ == 0 && live_) {");
            }
            for &s in &passes.row_stores {
                self.instr(3, s)?;
            }
            self.line(2, "}");
        }
        self.line(1, "}");
        Ok(())
    }

    /// `acc{r}` (and `acci{r}`) combined over the threads of each row: every thread gets its
    /// row's value in place.
    fn combine_threads(&mut self, depth: usize, r: ValueId, lanes: usize) {
        let k = self.k;
        let (op, src) = reduce_parts(k, r);
        let acc = acc_ctype(k.ops[src].dtype);
        let code = op_code(op);
        let line = match (op.is_arg(), lanes) {
            (true, 1) => format!("kiln_block_arg_reduce<{code}, {acc}>(acc{r}, acci{r}, smem_);"),
            (true, l) => {
                format!("kiln_lane_arg_reduce<{code}, {l}, {acc}>(acc{r}, acci{r}, smem_);")
            }
            (false, 1) => format!(
                "acc{r} = kiln_block_reduce<{code}, {acc}>(acc{r}, {}, smem_);",
                identity(op, k.ops[src].dtype)
            ),
            (false, l) => format!("acc{r} = kiln_lane_reduce<{code}, {l}, {acc}>(acc{r}, smem_);"),
        };
        self.line(depth, &line);
    }

    /// `v{r}`: reduction `r`'s row value, from the per-thread accumulators.
    fn reduce_result(&mut self, r: ValueId, lanes: usize) {
        let k = self.k;
        let (op, _) = reduce_parts(k, r);
        let dt = k.ops[r].dtype;
        let ct = compute_ctype(dt);
        self.combine_threads(2, r, lanes);
        let expr = if op.is_arg() {
            format!("({ct})(acci{r} < 0 ? 0 : acci{r})")
        } else {
            round_half(dt, format!("({ct})acc{r}"))
        };
        self.line(2, &format!("const {ct} v{r} = {expr};"));
    }

    /// For a split reduction: each block's per-row partials go to the scratch area; the
    /// last block of the row group to finish reloads every block's partials, in block
    /// order, into its accumulators (the others move on), and resets the group's counter.
    fn split_combine(&mut self, reduces: &[ValueId], layout: RowLayout) {
        let k = self.k;
        let RowLayout {
            groups,
            lanes,
            threads,
            splits,
        } = layout;
        let n = reduces.len();
        let lane = if lanes == 1 { "0" } else { "lane_" };
        let slot =
            |s: &str, j: usize| format!("(((g_ * {splits} + {s}) * {lanes} + {lane}) * {n} + {j})");
        debug_assert!(groups * splits * lanes * n <= SPLIT_SLOTS);
        for &r in reduces {
            self.combine_threads(2, r, lanes);
        }
        self.line(2, "if (t_ == 0) {");
        for (j, &r) in reduces.iter().enumerate() {
            let (op, src) = reduce_parts(k, r);
            let acc = acc_ctype(k.ops[src].dtype);
            let at = slot("s_", j);
            self.line(3, &format!("*({acc}*)&kpart_[{at}] = acc{r};"));
            if op.is_arg() {
                self.line(
                    3,
                    &format!("kpart_[{SPLIT_SLOTS} + {at}] = (unsigned long long)acci{r};"),
                );
            }
        }
        self.line(3, "__threadfence();");
        self.line(2, "}");
        self.line(2, "__syncthreads();");
        self.line(
            2,
            &format!(
                "if (threadIdx.x == 0) last_ = atomicAdd(&kcount_[g_], 1u) == {}u;",
                splits - 1
            ),
        );
        self.line(2, "__syncthreads();");
        self.line(2, "if (!last_) continue;");
        self.line(2, "__threadfence();");
        for (j, &r) in reduces.iter().enumerate() {
            let (op, src) = reduce_parts(k, r);
            let acc = acc_ctype(k.ops[src].dtype);
            self.line(2, &format!("acc{r} = {};", identity(op, k.ops[src].dtype)));
            if op.is_arg() {
                self.line(2, &format!("acci{r} = -1;"));
            }
            self.line(
                2,
                &format!("for (int q_ = t_; q_ < {splits}; q_ += {threads}) {{"),
            );
            let at = slot("q_", j);
            let v = format!("*(volatile {acc}*)&kpart_[{at}]");
            if op.is_arg() {
                self.line(
                    3,
                    &format!(
                        "kiln_arg_combine<{}>(acc{r}, acci{r}, ({acc}){v}, (long long)((volatile unsigned long long*)kpart_)[{SPLIT_SLOTS} + {at}]);",
                        op_code(op)
                    ),
                );
            } else {
                self.line(
                    3,
                    &format!(
                        "acc{r} = kiln_combine<{}>(acc{r}, ({acc}){v});",
                        op_code(op)
                    ),
                );
            }
            self.line(2, "}");
        }
        self.line(2, "if (threadIdx.x == 0) kcount_[g_] = 0u;");
    }

    /// The C expression for value `v` as read by an instruction of level `_reader`.
    fn value(&self, v: ValueId, _reader: Level) -> String {
        match &self.k.ops[v].op {
            IrOp::Const(s) => literal(*s, self.k.ops[v].dtype),
            IrOp::Param { slot } => param_value(*slot, self.k.ops[v].dtype),
            _ => format!("v{v}"),
        }
    }

    /// `offset + Σ c_d·stride_d` for a view over S (`Elem`) or O (`Row`).
    fn offset(&self, view: &View, level: Level) -> String {
        let dims = self.view_dims(level);
        let mut terms: Vec<String> = vec![];
        if view.offset != 0 {
            terms.push(format!("({}){}", self.idx, view.offset));
        }
        for (j, &d) in dims.iter().enumerate() {
            let st = view.strides[j];
            if st == 0 || view.shape[j] <= 1 {
                continue;
            }
            terms.push(match st {
                1 => format!("c{d}"),
                -1 => format!("-c{d}"),
                _ => format!("c{d} * {st}"),
            });
        }
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ").replace("+ -", "- ")
        }
    }

    /// The mask test of a view, or `None` if unmasked.
    fn valid(&self, view: &View, level: Level) -> Option<String> {
        let m = view.mask.as_ref()?;
        if view.is_fully_masked() {
            return Some("false".into());
        }
        let dims = self.view_dims(level);
        let mut parts = vec![];
        for (j, &d) in dims.iter().enumerate() {
            let (lo, hi) = m[j];
            if lo >= hi {
                return Some("false".into());
            }
            if lo > 0 {
                parts.push(format!("c{d} >= {lo}"));
            }
            if hi < view.shape[j] {
                parts.push(format!("c{d} < {hi}"));
            }
        }
        Some(if parts.is_empty() {
            "true".into()
        } else {
            parts.join(" && ")
        })
    }

    /// S dimensions a view of `level` is indexed by.
    fn view_dims(&self, level: Level) -> Vec<usize> {
        match level {
            Level::Elem => (0..self.k.shape.len()).collect(),
            Level::Row => self.out_dims.clone(),
        }
    }

    fn instr(&mut self, depth: usize, v: ValueId) -> Result<()> {
        let k = self.k;
        let ins = &k.ops[v];
        let dt = ins.dtype;
        let ct = compute_ctype(dt);
        let expr = match &ins.op {
            IrOp::Const(_) | IrOp::Param { .. } => return Ok(()),
            IrOp::Load { .. } if self.vector_loads => load_conv(dt, &format!("w{v}_.LANE_")),
            IrOp::Load { .. } if self.filled_loads.contains(&v) => format!("rc{v}_[q_]"),
            IrOp::Load { arg, view, fill } => {
                let read = load_conv(dt, &format!("a{arg}[{}]", self.offset(view, ins.level)));
                match self.valid(view, ins.level) {
                    Some(c) => format!("({c}) ? {read} : {}", literal(*fill, dt)),
                    None => read,
                }
            }
            IrOp::Gather {
                arg,
                view,
                stride,
                len,
                index,
                fill,
            } => {
                let j = format!(
                    "kiln_index((long long){}, {len}LL, kerr)",
                    self.value(*index, ins.level)
                );
                let at = format!("({}) + ({j}) * {stride}", self.offset(view, ins.level));
                let read = load_conv(dt, &format!("a{arg}[{at}]"));
                match self.valid(view, ins.level) {
                    Some(c) => format!("({c}) ? {read} : {}", literal(*fill, dt)),
                    None => read,
                }
            }
            IrOp::Generate {
                kind,
                params,
                view,
                fill,
            } => {
                let g = generate(*kind, *params, dt, &self.offset(view, ins.level));
                match self.valid(view, ins.level) {
                    Some(c) => format!("({c}) ? ({g}) : {}", literal(*fill, dt)),
                    None => g,
                }
            }
            IrOp::Valid { view } => match self.valid(view, ins.level) {
                Some(c) => format!("(unsigned char)({c})"),
                None => "(unsigned char)1".into(),
            },
            IrOp::MatmulResult => {
                let out = k.matmul.as_ref().map(|m| m.out).unwrap_or(0);
                load_conv(
                    dt,
                    &format!(
                        "a{out}[{}]",
                        self.offset(&View::contiguous(&k.shape), Level::Elem)
                    ),
                )
            }
            IrOp::Unary(u, a) => round_half(dt, u.cuda(dt, &self.value(*a, ins.level))),
            IrOp::Binary(b, x, y) => {
                let in_dt = k.ops[*x].dtype;
                let (x, y) = (self.value(*x, ins.level), self.value(*y, ins.level));
                let e = b.cuda(in_dt, &x, &y);
                if b.is_comparison() {
                    e
                } else {
                    round_half(dt, e)
                }
            }
            IrOp::Where(c, x, y) => format!(
                "{} ? {} : {}",
                self.value(*c, ins.level),
                self.value(*x, ins.level),
                self.value(*y, ins.level)
            ),
            IrOp::Cast(a) => cast(k.ops[*a].dtype, dt, &self.value(*a, ins.level)),
            IrOp::Reduce { .. } => return Ok(()),
            IrOp::Store { arg, view, src } => {
                let val = self.value(*src, ins.level);
                let line = format!(
                    "a{arg}[{}] = {};",
                    self.offset(view, ins.level),
                    store_conv(dt, &val)
                );
                self.line(depth, &line);
                return Ok(());
            }
        };
        self.line(depth, &format!("const {ct} v{v} = {expr};"));
        if self.cached_loads.contains(&v) && !self.filled_loads.contains(&v) {
            self.line(depth, &format!("rc{v}_[q_] = v{v};"));
        }
        Ok(())
    }
}

fn reduce_parts(k: &Kernel, r: ValueId) -> (ReduceOp, ValueId) {
    match k.ops[r].op {
        IrOp::Reduce { op, src } => (op, src),
        _ => (ReduceOp::Sum, r),
    }
}

fn op_code(op: ReduceOp) -> u8 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::ArgMax => 4,
        ReduceOp::ArgMin => 5,
    }
}

/// Accumulator type for a reduction over values of `dt`.
fn acc_ctype(dt: DType) -> &'static str {
    compute_ctype(dt)
}

fn identity(op: ReduceOp, dt: DType) -> String {
    let ct = compute_ctype(dt);
    let s = match (op, dt.compute()) {
        (ReduceOp::Sum, _) => return format!("({ct})0"),
        (ReduceOp::Prod, _) => return format!("({ct})1"),
        (ReduceOp::Max | ReduceOp::ArgMax, ComputeType::F32 | ComputeType::F64) => {
            Scalar::Float(f64::NEG_INFINITY)
        }
        (ReduceOp::Min | ReduceOp::ArgMin, ComputeType::F32 | ComputeType::F64) => {
            Scalar::Float(f64::INFINITY)
        }
        (ReduceOp::Max | ReduceOp::ArgMax, ComputeType::U8) => Scalar::Int(0),
        (ReduceOp::Min | ReduceOp::ArgMin, ComputeType::U8) => Scalar::Int(255),
        (ReduceOp::Max | ReduceOp::ArgMax, ComputeType::I32) => Scalar::Int(i32::MIN as i64),
        (ReduceOp::Min | ReduceOp::ArgMin, ComputeType::I32) => Scalar::Int(i32::MAX as i64),
        (ReduceOp::Max | ReduceOp::ArgMax, ComputeType::I64) => Scalar::Int(i64::MIN),
        (ReduceOp::Min | ReduceOp::ArgMin, ComputeType::I64) => Scalar::Int(i64::MAX),
    };
    // Identities are literals of the compute type (f32 for half types).
    let lit_dt = match dt.compute() {
        ComputeType::F32 => DType::F32,
        ComputeType::F64 => DType::F64,
        ComputeType::I32 => DType::I32,
        ComputeType::I64 => DType::I64,
        ComputeType::U8 => DType::U8,
    };
    literal(s, lit_dt)
}

fn round_half(dt: DType, e: String) -> String {
    match dt {
        DType::F16 => format!("kiln_round_f16({e})"),
        DType::BF16 => format!("kiln_round_bf16({e})"),
        _ => e,
    }
}

/// `line` with the per-element names of an elementwise body (`i_`, `r_`, `cN`, `vN`) given
/// the suffix `_unit`, so several elements' bodies can share one scope. Number literals
/// (which may contain letters, like `0x3f80` or `1e-5f`) are copied unchanged.
fn unit_names(line: &str, unit: usize) -> String {
    let mut out = String::with_capacity(line.len() + 16);
    let chars: Vec<char> = line.chars().collect();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if !word(c) {
            out.push(c);
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len()
            && (word(chars[i]) || (chars[start].is_ascii_digit() && chars[i] == '.'))
        {
            i += 1;
        }
        let tok: String = chars[start..i].iter().collect();
        out.push_str(&tok);
        let numbered = |p: char| {
            tok.len() > 1 && tok.starts_with(p) && tok[1..].bytes().all(|b| b.is_ascii_digit())
        };
        if tok == "i_" || tok == "r_" || numbered('v') || numbered('c') {
            out.push('_');
            out.push_str(&unit.to_string());
        }
    }
    out
}

/// The CUDA vector type holding four stored elements of `dt`, for the 2- and 4-byte types.
fn vector_ctype(dt: DType) -> Option<&'static str> {
    match dt {
        DType::F32 => Some("float4"),
        DType::I32 => Some("int4"),
        DType::F16 | DType::BF16 => Some("ushort4"),
        _ => None,
    }
}

fn load_conv(dt: DType, read: &str) -> String {
    match dt {
        DType::F16 => format!("kiln_f16_to_f32({read})"),
        DType::BF16 => format!("kiln_bf16_to_f32({read})"),
        _ => read.to_string(),
    }
}

fn store_conv(dt: DType, v: &str) -> String {
    match dt {
        DType::F16 => format!("kiln_f32_to_f16({v})"),
        DType::BF16 => format!("kiln_f32_to_bf16({v})"),
        _ => v.to_string(),
    }
}

fn generate(g: GenKind, [p0, p1]: [usize; 2], dt: DType, index: &str) -> String {
    let ct = compute_ctype(dt);
    let i = format!("(unsigned long long)({index})");
    let f64_ = dt == DType::F64;
    let raw = match g {
        GenKind::Full => return param_value(p0, dt),
        GenKind::Arange => {
            if dt.is_float() {
                let e = format!(
                    "({} + (double)({index}) * {})",
                    param_value(p0, DType::F64),
                    param_value(p1, DType::F64)
                );
                if f64_ { e } else { format!("(float){e}") }
            } else {
                format!(
                    "({ct})kiln_add({}, kiln_mul((long long)({index}), {}))",
                    param_value(p0, DType::I64),
                    param_value(p1, DType::I64)
                )
            }
        }
        GenKind::Rand if f64_ => format!("kiln_uniform_f64(p{p0}, {i})"),
        GenKind::Rand => format!("kiln_uniform_f32(p{p0}, {i})"),
        GenKind::Randn if f64_ => format!("kiln_normal_f64(p{p0}, {i})"),
        GenKind::Randn => format!("kiln_normal_f32(p{p0}, {i})"),
    };
    round_half(dt, raw)
}

/// Conversion with the CPU's cast semantics.
fn cast(from: DType, to: DType, a: &str) -> String {
    if to == DType::Bool {
        return format!("(unsigned char)({a} != 0)");
    }
    match (from.is_float(), to) {
        (true, DType::U8) => format!("kiln_f2u8((double){a})"),
        (true, DType::I32) => format!("kiln_f2i32((double){a})"),
        (true, DType::I64) => format!("kiln_f2i64((double){a})"),
        (_, DType::F16) => format!("kiln_round_f16((float){a})"),
        (_, DType::BF16) => format!("kiln_round_bf16((float){a})"),
        (_, to) => format!("({}){a}", compute_ctype(to)),
    }
}
