//! Extreme sizes: a seeded fuzz loop that feeds kiln huge and near-overflow sizes through
//! every op family and the plan / realize / `to_vec` path, plus the rows of the hardening
//! issue that used to crash or return a wrong value.
//!
//! Sizes come from a vocabulary of small dimensions and huge ones (`usize::MAX / k`,
//! `1 << 62`, `(1 << 62) + 1`, `1 << 40`...) combined into shapes whose element count or byte
//! size overflows (often only in the last dimension, or wrapping to a small number), sits
//! just at or past `MAX_TENSOR_BYTES`, or is merely huge. Each case builds a base tensor
//! (a generator, data with a lying shape, a small realized tensor), applies one to three ops
//! drawn from every family (movement, every op of `UnaryOp::ALL` and `BinaryOp::ALL`,
//! where, casts, reductions and the composites, matmul), then finishes it.
//!
//! What must hold, per case (each runs under `catch_unwind`; a panic fails the test):
//!
//! * every failure is a typed `KilnError` whose text starts with the name of the op that
//!   was called (or of a primitive the composite is built from) and shows the shape it is
//!   about; a `TooLarge` error names a shape that really is too large;
//! * every accepted tensor has a shape whose element count and byte size fit
//!   (`checked_numel`, `MAX_TENSOR_BYTES`);
//! * an accepted tensor plans (`t.plan(&Default::default())`) quickly and without
//!   allocating memory proportional to its size (a counting allocator watches the planning
//!   thread), or fails to plan with `OutOfMemory` / `TooLarge` / `InvalidArgument`;
//! * a tensor whose every node, and every kernel of whose plan, is small (at most
//!   `SMALL_LIMIT` elements; tensors without elements but with huge dimensions count as
//!   small) realizes, and agrees with `kiln::reference::evaluate`;
//! * a huge tensor is realized (or read with `to_vec`) only when its plan's first step
//!   writes a buffer of at least 2^50 bytes, so that allocation must fail before any kernel
//!   runs: then it must fail with `OutOfMemory` / `TooLarge` / `InvalidArgument`. Any other
//!   huge tensor is recorded, planned and dropped — never computed.
//!
//! The loop runs `CASES` cases from a fixed seed (`KILN_EXTREME_CASES` and
//! `KILN_EXTREME_SEED` override them) on a thread under a watchdog (a case that makes no
//! progress for 30 s fails the test with its calls), and prints the number of cases and of
//! each outcome class (`cargo test --release --test fuzz_extreme -- --nocapture`). A failing
//! case prints its calls, ready to paste into a regression test (`KILN_EXTREME_SHOW=n`
//! prints n failures, `KILN_EXTREME_TRACE=1` every call as it is made).
//!
//! The bugs this fuzzer found are pinned by the regression tests at the end of the file.

mod common;

use kiln::ops::{BinaryOp, UnaryOp};
use kiln::shape::{MAX_TENSOR_BYTES, checked_numel};
use kiln::{DType, Device, KilnError, Operand, RealizeOptions, Scalar, Tensor, reference};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// A counting allocator: how many bytes the current thread allocates while planning
// ---------------------------------------------------------------------------------------

struct Counting;

thread_local! {
    /// Bytes this thread allocated since the counter was reset.
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
    /// The largest single allocation since the counter was reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    let _ = ALLOCATED.try_with(|c| c.set(c.get().saturating_add(bytes)));
    let _ = LARGEST.try_with(|c| c.set(c.get().max(bytes)));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counters are const-initialized thread locals without destructors, so touching them never
// allocates or unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded unchanged (see above).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `f`'s result, the bytes this thread allocated while it ran and its largest allocation.
fn counting<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    ALLOCATED.with(|c| c.set(0));
    LARGEST.with(|c| c.set(0));
    let r = f();
    (r, ALLOCATED.with(Cell::get), LARGEST.with(Cell::get))
}

// ---------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------

/// Cases per run.
const CASES: usize = 100_000;
/// A tensor is small (realized and checked) when every node of its case has at most this
/// many elements.
const SMALL_LIMIT: usize = 1 << 16;
/// A huge tensor is realized only when the first buffer its plan writes is at least this
/// large: no machine can allocate it, so realizing must fail before any kernel runs.
const UNALLOCATABLE: usize = 1 << 50;
/// Planning one case may allocate at most this much (it must not scale with the tensors).
const PLAN_BYTES: usize = 32 << 20;
/// ... and take at most this long.
const PLAN_TIME: Duration = Duration::from_secs(2);

/// Dimensions that are small enough to compute with.
const SMALL_DIMS: &[usize] = &[0, 1, 1, 2, 3, 4, 7];
/// Huge dimensions and ones whose products overflow or wrap.
const HUGE_DIMS: &[usize] = &[
    1 << 20,
    1 << 31,
    1 << 32,
    1 << 33,
    1 << 40,
    1 << 61,
    1 << 62,
    (1 << 62) + 1,
    1 << 63,
    usize::MAX / 2,
    usize::MAX / 3,
    usize::MAX / 4,
    usize::MAX / 7,
    usize::MAX - 1,
    usize::MAX,
    isize::MAX as usize,
    0x5555_5555_5555_5556,
];
/// Shapes whose element count wraps in 64 bits, most of them only in the last dimension.
const WRAPPING: &[&[usize]] = &[
    &[(1 << 62) + 1, 4],
    &[1 << 32, 1 << 32],
    &[1 << 33, 1 << 33],
    &[1 << 33, 1 << 31, 2],
    &[3, 0x5555_5555_5555_5556],
    &[1 << 20, 1 << 20, 1 << 24],
    &[1 << 31, 1 << 31, 4],
    &[2, 1 << 63],
    &[usize::MAX, 2],
    &[1 << 21, 1 << 21, 1 << 21, 3],
    &[7, 1 << 40, 1 << 30],
    &[1, 1, 1 << 62, 5],
];
const DTYPES: &[DType] = &[
    DType::F32,
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
];
const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

// ---------------------------------------------------------------------------------------
// Random choices
// ---------------------------------------------------------------------------------------

use common::Rng;

impl Rng {
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn dim(&mut self) -> usize {
        if self.chance(11, 20) {
            self.pick(SMALL_DIMS)
        } else {
            self.pick(HUGE_DIMS)
        }
    }
    /// A shape: random dimensions, a wrapping shape, or one at the byte limit of `dtype`.
    fn shape(&mut self, dtype: DType) -> Vec<usize> {
        match self.below(8) {
            0 | 1 => (0..self.below(5)).map(|_| self.dim()).collect(),
            2 => self.pick(WRAPPING).to_vec(),
            3 => {
                // At the limit, one past it, split in two.
                let n = MAX_TENSOR_BYTES / dtype.size_bytes() + self.below(2);
                if self.chance(1, 2) {
                    vec![n]
                } else {
                    vec![2, n / 2 + self.below(2)]
                }
            }
            4..=6 => {
                // Huge, mostly fine: 2^20 .. 2^67 elements over a few dimensions.
                let mut s = vec![1usize << (10 + self.below(10)), 1 << (10 + self.below(10))];
                if self.chance(1, 2) {
                    s.push(1 << (10 + self.below(20)));
                }
                s
            }
            _ => (0..1 + self.below(3))
                .map(|_| self.pick(SMALL_DIMS))
                .collect(),
        }
    }
    /// An index argument (slice bounds, axes, dims): small, negative or extreme.
    fn index(&mut self) -> isize {
        self.pick(&[
            0,
            1,
            2,
            -1,
            -2,
            3,
            7,
            isize::MAX,
            isize::MIN,
            isize::MAX - 1,
            isize::MIN + 1,
            1 << 40,
            -(1 << 40),
            1 << 62,
        ])
    }
}

// ---------------------------------------------------------------------------------------
// One case
// ---------------------------------------------------------------------------------------

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// An op refused its arguments with a typed error (the error's variant).
    Rejected(&'static str),
    /// The tensor was recorded and planned (too large to compute), then dropped.
    Planned,
    /// Planning failed with OutOfMemory, TooLarge or InvalidArgument.
    PlanError(&'static str),
    /// Small: realized and equal to the reference.
    Realized,
    /// Small: realized; a discontinuous op of an inexact value makes the values
    /// incomparable (see `Case::unstable`).
    RealizedUncompared,
    /// Huge, with an unallocatable first buffer: realizing failed as it must.
    RealizeError(&'static str),
    /// `to_vec` with another element type converted the values.
    ReadBackConverted,
}

fn variant(e: &KilnError) -> &'static str {
    match e {
        KilnError::ShapeMismatch { .. } => "ShapeMismatch",
        KilnError::InvalidAxis { .. } => "InvalidAxis",
        KilnError::InvalidShape { .. } => "InvalidShape",
        KilnError::InvalidArgument { .. } => "InvalidArgument",
        KilnError::UnsupportedDType { .. } => "UnsupportedDType",
        KilnError::DTypeMismatch { .. } => "DTypeMismatch",
        KilnError::DeviceMismatch { .. } => "DeviceMismatch",
        KilnError::DataLength { .. } => "DataLength",
        KilnError::TooLarge { .. } => "TooLarge",
        KilnError::OutOfMemory { .. } => "OutOfMemory",
        KilnError::Overwritten { .. } => "Overwritten",
        KilnError::DeviceUnavailable { .. } => "DeviceUnavailable",
        KilnError::Compile { .. } => "Compile",
        KilnError::Backend { .. } => "Backend",
        KilnError::Internal(_) => "Internal",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

/// The op an error names, and the shapes its text must show.
fn error_parts(e: &KilnError) -> Option<(&'static str, Vec<&[usize]>)> {
    Some(match e {
        KilnError::ShapeMismatch { op, lhs, rhs, .. } => (*op, vec![lhs, rhs]),
        KilnError::InvalidAxis { op, shape, .. }
        | KilnError::InvalidShape { op, shape, .. }
        | KilnError::InvalidArgument { op, shape, .. }
        | KilnError::DataLength { op, shape, .. }
        | KilnError::TooLarge { op, shape, .. } => (*op, vec![shape]),
        KilnError::UnsupportedDType { op, .. }
        | KilnError::DTypeMismatch { op, .. }
        | KilnError::DeviceMismatch { op, .. } => (*op, vec![]),
        _ => return None,
    })
}

/// What a case is doing, for failure messages.
struct Case {
    /// The calls so far, as Rust.
    log: Vec<String>,
    /// The largest element count of any tensor of the case.
    max_numel: usize,
    /// Some value may differ in its last bits between kiln and the reference (a
    /// transcendental, a reordered sum...).
    inexact: bool,
    /// ... and a discontinuous op (a comparison, arg-reduction, float→int cast) read it, so
    /// kiln and the reference may legitimately disagree by a whole step: values are not
    /// compared (the case must still realize).
    unstable: bool,
}

/// Ops whose result may differ in the last bits between kiln and the reference.
const INEXACT_OPS: &[&str] = &[
    "sum",
    "prod",
    "mean",
    "var",
    "softmax",
    "log_softmax",
    "layer_norm",
    "matmul",
    "pow",
    "arange",
    "randn",
];
/// Ops that can turn a last-bit difference into a different result.
/// Ops whose result jumps where their input crosses a point, so that a value an inexact op
/// computed a few ulp off can land on the other side (seed 91535, case 55749:
/// `floor(tanh(9))`, where kiln's f32 `tanh` gives 1.0 and the correctly rounded value is
/// 0.99999994), or moves by as much as their input does, however large it is (seeds 162806
/// and 329105: `fmod` and `remainder` by 3 of `expm1` of an integer gave 0.5 against the
/// reference's 0.25, one ulp of an f32 between 2^21 and 2^22; seed 534999, case 13997:
/// `cos` of the product of six `silu`s near 5.8e6, where one ulp of an f32 is 0.5): after
/// an inexact op their results are not compared.
const DISCONTINUOUS_OPS: &[&str] = &[
    "argmax",
    "argmin",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
    "floor",
    "ceil",
    "round",
    "trunc",
    "sign",
    "fmod",
    "remainder",
    "sin",
    "cos",
    "tan",
];

/// Whether `layer_norm` over the trailing `norm` dimensions of `t` (small enough to
/// evaluate) can come out of kiln and the reference differently by more than the
/// comparison allows although both are right to f32 rounding: it divides `x - mean` by
/// `sqrt(var + 1e-5)`, and rounding the mean of values of magnitude `|x|` (in a different
/// order in each) moves `x - mean` by about `n · 2^-24 · |x|`. Seed 1524824, case 84963:
/// twelve equal values 9^9 = 387420489 gave 0 in kiln (the exact answer) and -1 in the
/// reference, whose f32 mean came out 32 away from them.
fn layer_norm_is_ill_conditioned(t: &Tensor, norm: &[usize]) -> bool {
    let group: usize = norm.iter().product();
    if group == 0 || !graph_is_small(t) {
        return false;
    }
    let Ok(x) = reference::evaluate(t) else {
        return false;
    };
    x.to_f64().chunks(group).any(|g| {
        let n = g.len() as f64;
        let mean = g.iter().sum::<f64>() / n;
        let var = g.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let big = g.iter().fold(0f64, |m, v| m.max(v.abs()));
        // The disagreement this allows, relative to the comparison's 2e-2, with margin.
        (n + 2.0) * 2f64.powi(-24) * big / (var + 1e-5).sqrt() > 1e-3 || !big.is_finite()
    })
}

/// Ops with a pole, where an input that an inexact op left a rounding error away from the
/// pole gives a result arbitrarily far from the reference's (seed 843840, case 97819: the
/// product of a layer norm's four outputs with ones, mathematically 0, came out as 0 in
/// kiln's f32 and -5.96e-8 in the f64 reference of the same f32 values, and its `recip` as
/// inf against -16777216): after an inexact op their results are not compared either.
const POLE_OPS: &[&str] = &["recip", "rsqrt", "log", "log2", "log1p", "div", "pow"];

thread_local! {
    /// The most bytes one plan allocated, and the longest one took.
    static PLAN_MAX: Cell<(usize, Duration)> = const { Cell::new((0, Duration::ZERO)) };
}

/// Where the last panic of the fuzz loop happened.
static PANIC_AT: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// The calls of the case running now (for the watchdog in the test).
static NOW: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

impl Case {
    fn note(&mut self, call: String) {
        if std::env::var_os("KILN_EXTREME_TRACE").is_some() {
            eprintln!("    {call}");
        }
        self.log.push(call);
        *NOW.lock().unwrap_or_else(|e| e.into_inner()) = self.log.clone();
    }

    fn fail(&self, what: String) -> String {
        format!("{what}\ncase:\n    {}", self.log.join("\n    "))
    }

    /// Checks a record-time result: an accepted tensor has a valid size; an error is typed
    /// and names one of `ops` and its shapes. `None` when the op refused.
    fn step(
        &mut self,
        call: String,
        ops: &[&str],
        op: impl FnOnce() -> kiln::Result<Tensor>,
    ) -> Result<Result<Tensor, &'static str>, String> {
        self.note(call);
        match op() {
            Ok(t) => {
                let shape = t.shape().to_vec();
                let bytes = checked_numel(&shape)
                    .and_then(|n| n.checked_mul(t.dtype().size_bytes()))
                    .filter(|&b| b <= MAX_TENSOR_BYTES);
                if bytes.is_none() {
                    return Err(self.fail(format!(
                        "accepted a tensor of shape {shape:?} ({}), past the size limit",
                        t.dtype()
                    )));
                }
                self.max_numel = self.max_numel.max(t.numel());
                let op = ops.first().copied().unwrap_or("");
                let unary_inexact = UnaryOp::ALL
                    .iter()
                    .any(|u| u.name() == op && !u.info().exact);
                let to_int = op == "cast" && !t.dtype().is_float();
                if self.inexact
                    && (DISCONTINUOUS_OPS.contains(&op) || POLE_OPS.contains(&op) || to_int)
                {
                    self.unstable = true;
                }
                if unary_inexact || INEXACT_OPS.contains(&op) {
                    self.inexact = true;
                }
                Ok(Ok(t))
            }
            Err(e) => {
                self.check_error(&e, ops)?;
                Ok(Err(variant(&e)))
            }
        }
    }

    fn check_error(&self, e: &KilnError, ops: &[&str]) -> Result<(), String> {
        let text = e.to_string();
        let Some((op, shapes)) = error_parts(e) else {
            return Err(self.fail(format!(
                "{}: unexpected error {e:?}",
                ops.first().unwrap_or(&"?")
            )));
        };
        if !ops.contains(&op) || !text.starts_with(&format!("{op}:")) {
            return Err(self.fail(format!(
                "the error of {} names op {op:?}: {text}",
                ops.first().unwrap_or(&"?")
            )));
        }
        for s in shapes {
            if !text.contains(&format!("{s:?}")) {
                return Err(self.fail(format!("the error does not show shape {s:?}: {text}")));
            }
        }
        if let KilnError::TooLarge { shape, dtype, .. } = e {
            let fits = checked_numel(shape)
                .and_then(|n| n.checked_mul(dtype.size_bytes()))
                .is_some_and(|b| b <= MAX_TENSOR_BYTES);
            if fits {
                return Err(self.fail(format!("TooLarge for a shape that fits: {text}")));
            }
        }
        Ok(())
    }
}

/// Op names an error of a composite may carry: the composite and its primitives.
const REDUCE_NAMES: &[&str] = &["sum", "prod", "max", "min", "cast", "reshape", "full"];
const MEAN_NAMES: &[&str] = &["mean", "sum", "div", "mul", "cast", "reshape", "full"];
const VAR_NAMES: &[&str] = &[
    "var", "mean", "sum", "sub", "mul", "div", "cast", "reshape", "expand",
];
const SOFTMAX_NAMES: &[&str] = &[
    "softmax",
    "cast",
    "log_softmax",
    "max",
    "sub",
    "exp",
    "log",
    "sum",
    "div",
    "reshape",
    "expand",
];
const LAYER_NORM_NAMES: &[&str] = &[
    "layer_norm",
    "mean",
    "var",
    "sub",
    "mul",
    "add",
    "div",
    "sum",
    "sqrt",
    "rsqrt",
    "recip",
    "cast",
    "reshape",
    "expand",
];

fn sc(s: Scalar) -> String {
    match s {
        Scalar::Float(f) => format!("{f:?}"),
        Scalar::Int(i) => format!("{i}i64"),
        Scalar::Bool(b) => format!("{b}"),
    }
}

/// `u` through its `Tensor` method (kiln has no public entry point taking a `UnaryOp`; the
/// `match` is exhaustive, so a new op is a compile error here).
fn unary(t: &Tensor, u: UnaryOp) -> kiln::Result<Tensor> {
    match u {
        UnaryOp::Neg => t.try_neg(),
        UnaryOp::Abs => t.try_abs(),
        UnaryOp::Relu => t.try_relu(),
        UnaryOp::Exp => t.try_exp(),
        UnaryOp::Log => t.try_log(),
        UnaryOp::Log2 => t.try_log2(),
        UnaryOp::Sqrt => t.try_sqrt(),
        UnaryOp::Recip => t.try_recip(),
        UnaryOp::Sin => t.try_sin(),
        UnaryOp::Cos => t.try_cos(),
        UnaryOp::Tanh => t.try_tanh(),
        UnaryOp::Sigmoid => t.try_sigmoid(),
        UnaryOp::Gelu => t.try_gelu(),
        UnaryOp::Erf => t.try_erf(),
        UnaryOp::Floor => t.try_floor(),
        UnaryOp::Ceil => t.try_ceil(),
        UnaryOp::Round => t.try_round(),
        UnaryOp::Trunc => t.try_trunc(),
        UnaryOp::Sign => t.try_sign(),
        UnaryOp::Log1p => t.try_log1p(),
        UnaryOp::Expm1 => t.try_expm1(),
        UnaryOp::Exp2 => t.try_exp2(),
        UnaryOp::Rsqrt => t.try_rsqrt(),
        UnaryOp::Square => t.try_square(),
        UnaryOp::Softplus => t.try_softplus(),
        UnaryOp::Silu => t.try_silu(),
        UnaryOp::Tan => t.try_tan(),
        UnaryOp::Asin => t.try_asin(),
        UnaryOp::Acos => t.try_acos(),
        UnaryOp::Atan => t.try_atan(),
        UnaryOp::Sinh => t.try_sinh(),
        UnaryOp::Cosh => t.try_cosh(),
        UnaryOp::Asinh => t.try_asinh(),
        UnaryOp::Acosh => t.try_acosh(),
        UnaryOp::Atanh => t.try_atanh(),
    }
}

/// `op` through its `Tensor` method (as for `unary`).
fn binary(t: &Tensor, op: BinaryOp, rhs: Operand<'_>) -> kiln::Result<Tensor> {
    match op {
        BinaryOp::Add => t.try_add(rhs),
        BinaryOp::Sub => t.try_sub(rhs),
        BinaryOp::Mul => t.try_mul(rhs),
        BinaryOp::Div => t.try_div(rhs),
        BinaryOp::Pow => t.try_pow(rhs),
        BinaryOp::Max => t.try_maximum(rhs),
        BinaryOp::Min => t.try_minimum(rhs),
        BinaryOp::Lt => t.try_lt(rhs),
        BinaryOp::Le => t.try_le(rhs),
        BinaryOp::Gt => t.try_gt(rhs),
        BinaryOp::Ge => t.try_ge(rhs),
        BinaryOp::Eq => t.try_eq(rhs),
        BinaryOp::Ne => t.try_ne(rhs),
        BinaryOp::Remainder => t.try_remainder(rhs),
        BinaryOp::Fmod => t.try_fmod(rhs),
        BinaryOp::FloorDiv => t.try_floor_divide(rhs),
        BinaryOp::Atan2 => t.try_atan2(rhs),
    }
}

fn full(shape: &[usize], v: Scalar, d: DType) -> kiln::Result<Tensor> {
    Tensor::try_full_on(shape, v, d, Device::Cpu)
}

/// Little-endian bytes of `n` small values of `d` (`i/4 - 1`, booleans alternating).
fn data_bytes(d: DType, n: usize) -> Vec<u8> {
    use half::{bf16, f16};
    (0..n)
        .flat_map(|i| {
            let v = i as f64 * 0.25 - 1.0;
            match d {
                DType::F32 => (v as f32).to_le_bytes().to_vec(),
                DType::F64 => v.to_le_bytes().to_vec(),
                DType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
                DType::BF16 => bf16::from_f64(v).to_le_bytes().to_vec(),
                DType::I32 => (i as i32 - 1).to_le_bytes().to_vec(),
                DType::I64 => (i as i64 - 1).to_le_bytes().to_vec(),
                DType::U8 => vec![i as u8],
                DType::Bool => vec![(i % 2) as u8],
            }
        })
        .collect()
}

fn data(d: DType, n: usize, shape: &[usize]) -> kiln::Result<Tensor> {
    Tensor::try_from_bytes(&data_bytes(d, n), shape, d)
}

/// Builds the base tensor of a case. `None` when the constructor refused.
fn base(rng: &mut Rng, c: &mut Case) -> Result<Result<Tensor, &'static str>, String> {
    let d = rng.pick(DTYPES);
    let shape = rng.shape(d);
    match rng.below(9) {
        0 | 1 => {
            let v = rng.pick(&[Scalar::Float(1.0), Scalar::Int(3), Scalar::Float(-0.5)]);
            c.step(
                format!(
                    "let t = Tensor::try_full_on(&{shape:?}, {}, DType::{d:?}, Device::Cpu)?;",
                    sc(v)
                ),
                &["full"],
                || full(&shape, v, d),
            )
        }
        2 => {
            let pool = if rng.chance(4, 5) { FLOATS } else { DTYPES };
            let d = rng.pick(pool);
            let seed = rng.below(100) as u64;
            if rng.chance(1, 2) {
                c.step(
                    format!("let t = Tensor::try_rand(&{shape:?}, {seed}, DType::{d:?})?;"),
                    &["rand"],
                    || Tensor::try_rand(&shape, seed, d),
                )
            } else {
                c.step(
                    format!("let t = Tensor::try_randn(&{shape:?}, {seed}, DType::{d:?})?;"),
                    &["randn"],
                    || Tensor::try_randn(&shape, seed, d),
                )
            }
        }
        3 => {
            // arange with a huge or overflowing length.
            let (s, e, st): (Scalar, Scalar, Scalar) = match rng.below(6) {
                0 => (Scalar::Int(0), Scalar::Int(i64::MAX), Scalar::Int(1)),
                1 => (Scalar::Int(i64::MIN), Scalar::Int(i64::MAX), Scalar::Int(1)),
                2 => (Scalar::Float(0.0), Scalar::Float(1e30), Scalar::Float(1e-5)),
                3 => (Scalar::Int(0), Scalar::Int(1 << 40), Scalar::Int(1)),
                4 => (
                    Scalar::Float(0.0),
                    Scalar::Float(f64::MAX),
                    Scalar::Float(1.0),
                ),
                _ => (
                    Scalar::Int(0),
                    Scalar::Int(rng.below(9) as i64),
                    Scalar::Int(1),
                ),
            };
            c.step(
                format!(
                    "let t = Tensor::try_arange({}, {}, {}, DType::{d:?})?;",
                    sc(s),
                    sc(e),
                    sc(st)
                ),
                &["arange"],
                || Tensor::try_arange(s, e, st, d),
            )
        }
        4 => {
            // Data whose length is right for a wrapped element count: the lying shape must
            // be refused, never read past the data.
            let n = checked_numel(&shape)
                .unwrap_or_else(|| shape.iter().fold(1usize, |a, &x| a.wrapping_mul(x)));
            let len = if n <= 64 { n } else { rng.below(8) };
            let ops: &[&str] = &["from_bytes", "from_vec"];
            if rng.chance(1, 3) {
                return c.step(
                    format!("let t = Tensor::try_from_vec(vec![0.5f32; {len}], &{shape:?})?;"),
                    ops,
                    || Tensor::try_from_vec(vec![0.5f32; len], &shape),
                );
            }
            c.step(
                format!(
                    "let t = Tensor::try_from_bytes(&[0u8; {}], &{shape:?}, DType::{d:?})?;",
                    len * d.size_bytes()
                ),
                ops,
                || data(d, len, &shape),
            )
        }
        5 => {
            let n = rng.pick(&[0usize, 3, 1 << 20, 1 << 31, 1 << 33, usize::MAX / 2]);
            c.step(
                format!("let t = Tensor::try_eye({n}, DType::{d:?})?;"),
                &["eye", "arange", "reshape", "eq", "expand", "cast"],
                || Tensor::try_eye(n, d),
            )
        }
        _ => {
            // A small realized tensor (to grow by expand, pad, reshape, matmul).
            let shape: Vec<usize> = (0..1 + rng.below(3))
                .map(|_| rng.pick(&[1, 2, 3]))
                .collect();
            let n = shape.iter().product();
            c.step(
                format!("let t = small(DType::{d:?}, &{shape:?});"),
                &["from_bytes"],
                || data(d, n, &shape),
            )
        }
    }
}

/// A shape that `t` can broadcast to, mostly huge.
fn grow_shape(rng: &mut Rng, shape: &[usize]) -> Vec<usize> {
    let mut out: Vec<usize> = (0..rng.below(3)).map(|_| rng.dim()).collect();
    for &n in shape {
        let grow = (n == 1 && rng.chance(2, 3)) || rng.chance(1, 8);
        out.push(if grow { rng.dim() } else { n });
    }
    out
}

fn axes(rng: &mut Rng, nd: usize) -> Vec<isize> {
    if rng.chance(1, 4) {
        return vec![];
    }
    let k = 1 + rng.below(nd.max(1));
    (0..k)
        .map(|_| {
            if rng.chance(1, 8) {
                rng.index()
            } else {
                rng.below(nd.max(1)) as isize - if rng.chance(1, 3) { nd as isize } else { 0 }
            }
        })
        .collect()
}

/// Applies one random op to `t`.
fn transform(
    rng: &mut Rng,
    c: &mut Case,
    t: &Tensor,
) -> Result<Result<Tensor, &'static str>, String> {
    let nd = t.ndim();
    let shape = t.shape().to_vec();
    match rng.below(22) {
        0 | 1 => {
            // reshape, often with -1, to huge or impossible sizes
            let mut s: Vec<isize> = (0..1 + rng.below(3))
                .map(|_| rng.dim().min(isize::MAX as usize) as isize)
                .collect();
            if rng.chance(2, 3) {
                let i = rng.below(s.len());
                s[i] = -1;
            }
            if rng.chance(1, 4) {
                s = vec![-1];
            }
            c.step(
                format!("let t = t.try_reshape(&{s:?})?;"),
                &["reshape"],
                || t.try_reshape(&s),
            )
        }
        2 | 3 => {
            let s = grow_shape(rng, &shape);
            c.step(
                format!("let t = t.try_broadcast_to(&{s:?})?;"),
                &["broadcast_to", "expand", "reshape"],
                || t.try_broadcast_to(&s),
            )
        }
        4 => {
            let r: Vec<(isize, isize, isize)> = (0..rng.below(nd + 2))
                .map(|_| {
                    (
                        rng.index(),
                        rng.index(),
                        rng.pick(&[1, 2, 3, isize::MAX, 0, -1, 1 << 40]),
                    )
                })
                .collect();
            c.step(format!("let t = t.try_slice(&{r:?})?;"), &["slice"], || {
                t.try_slice(&r)
            })
        }
        5 => {
            let (d, s, e, st) = (
                rng.index(),
                rng.index(),
                rng.index(),
                rng.pick(&[1, 2, isize::MAX, 0, -1]),
            );
            let d = if rng.chance(3, 4) && nd > 0 {
                rng.below(nd) as isize
            } else {
                d
            };
            c.step(
                format!("let t = t.try_slice_dim({d}, {s}, {e}, {st})?;"),
                &["slice_dim", "slice"],
                || t.try_slice_dim(d, s, e, st),
            )
        }
        6 | 7 => {
            let p: Vec<(usize, usize)> = (0..rng.below(nd + 2))
                .map(|_| {
                    let mut x = || {
                        if rng.chance(1, 2) {
                            rng.dim()
                        } else {
                            rng.below(3)
                        }
                    };
                    (x(), x())
                })
                .collect();
            c.step(
                format!("let t = t.try_pad(&{p:?}, 0.0)?;"),
                &["pad"],
                || t.try_pad(&p, 0.0),
            )
        }
        8 => {
            let r = match rng.below(7) {
                0 => {
                    let mut p: Vec<isize> = (0..nd as isize).rev().collect();
                    if rng.chance(1, 3) {
                        p.push(rng.index());
                    }
                    c.note(format!("let t = t.try_permute(&{p:?})?;"));
                    t.try_permute(&p)
                }
                1 => {
                    let (a, b) = (rng.index(), -1);
                    c.note(format!("let t = t.try_transpose({a}, {b})?;"));
                    t.try_transpose(a, b)
                }
                2 => {
                    let a = axes(rng, nd);
                    c.note(format!("let t = t.try_flip(&{a:?})?;"));
                    t.try_flip(&a)
                }
                3 => {
                    let d = rng.index();
                    c.note(format!("let t = t.try_unsqueeze({d})?;"));
                    t.try_unsqueeze(d)
                }
                4 => {
                    let d = if nd > 0 { rng.below(nd) as isize } else { 0 };
                    c.note(format!("let t = t.try_squeeze_dim({d})?;"));
                    t.try_squeeze_dim(d)
                }
                5 => {
                    c.note("let t = t.try_flatten_dims(0, -1)?;".into());
                    t.try_flatten_dims(0, -1)
                }
                _ => {
                    c.note("let t = t.try_contiguous()?;".into());
                    t.try_contiguous()
                }
            };
            let call = c.log.pop().unwrap_or_default();
            c.step(
                call,
                &[
                    "permute",
                    "transpose",
                    "flip",
                    "unsqueeze",
                    "squeeze_dim",
                    "squeeze",
                    "flatten_dims",
                    "flatten",
                    "reshape",
                    "contiguous",
                ],
                || r,
            )
        }
        9 | 10 => {
            let u = rng.pick(UnaryOp::ALL);
            c.step(
                format!("let t = t.try_{}()?;", u.name()),
                &[u.name(), "cast"],
                || unary(t, u),
            )
        }
        11 | 12 => {
            let op = rng.pick(BinaryOp::ALL);
            let names = [
                op.name(),
                "cast",
                "expand",
                "broadcast_to",
                "reshape",
                "full",
            ];
            match rng.below(3) {
                0 => {
                    let s = rng.pick(&[Scalar::Float(2.0), Scalar::Int(3), Scalar::Bool(true)]);
                    c.step(
                        format!("let t = t.try_{}({})?;", op.name(), sc(s)),
                        &names,
                        || binary(t, op, Operand::Scalar(s)),
                    )
                }
                1 => {
                    // Against itself, or a view of itself.
                    c.step(format!("let t = t.try_{}(&t)?;", op.name()), &names, || {
                        binary(t, op, Operand::Ref(t))
                    })
                }
                _ => {
                    // Against a huge tensor that broadcasts (or not).
                    let s = grow_shape(rng, &shape);
                    let d = rng.pick(DTYPES);
                    let o = match c.step(
                        format!(
                            "let o = Tensor::try_full_on(&{s:?}, 1, DType::{d:?}, Device::Cpu)?;"
                        ),
                        &["full"],
                        || full(&s, Scalar::Int(1), d),
                    )? {
                        Ok(o) => o,
                        Err(e) => return Ok(Err(e)),
                    };
                    c.step(format!("let t = t.try_{}(&o)?;", op.name()), &names, || {
                        binary(t, op, Operand::Ref(&o))
                    })
                }
            }
        }
        13 => {
            let d = rng.pick(DTYPES);
            c.step(
                format!("let t = t.try_cast(DType::{d:?})?;"),
                &["cast"],
                || t.try_cast(d),
            )
        }
        14 => {
            let cond = match c.step(
                "let cond = t.try_gt(0)?;".into(),
                &["gt", "cast", "full"],
                || t.try_gt(0),
            )? {
                Ok(x) => x,
                Err(e) => return Ok(Err(e)),
            };
            c.step(
                "let t = Tensor::try_where(&cond, &t, 0.5)?;".into(),
                &["where", "cast", "expand", "broadcast_to", "reshape", "full"],
                || Tensor::try_where(&cond, t, 0.5),
            )
        }
        15 | 16 => {
            let a = axes(rng, nd);
            let keep = rng.chance(1, 2);
            let which = rng.below(4);
            let name = ["sum", "prod", "max", "min"][which];
            let r = || match (which, keep) {
                (0, false) => t.try_sum(&a),
                (0, true) => t.try_sum_keepdim(&a),
                (1, false) => t.try_prod(&a),
                (1, true) => t.try_prod_keepdim(&a),
                (2, false) => t.try_max(&a),
                (2, true) => t.try_max_keepdim(&a),
                (_, false) => t.try_min(&a),
                (_, true) => t.try_min_keepdim(&a),
            };
            let mut names = vec![name];
            names.extend(REDUCE_NAMES);
            let kd = if keep { "_keepdim" } else { "" };
            c.step(format!("let t = t.try_{name}{kd}(&{a:?})?;"), &names, r)
        }
        17 => {
            let a = axes(rng, nd);
            let keep = rng.chance(1, 2);
            match rng.below(4) {
                0 => c.step(
                    format!("let t = t.try_mean{}(&{a:?})?;", kd(keep)),
                    MEAN_NAMES,
                    || {
                        if keep {
                            t.try_mean_keepdim(&a)
                        } else {
                            t.try_mean(&a)
                        }
                    },
                ),
                1 => {
                    let corr = rng.pick(&[0usize, 1, usize::MAX]);
                    if corr == usize::MAX && c.inexact {
                        // The divisor clamps to 0: the result is NaN where the squared
                        // deviations sum to exactly 0 and inf where rounding left a trace
                        // (seed 384538, case 52433: the variance of three equal GELU values
                        // was inf in kiln's f32 and NaN in the f64 reference).
                        c.unstable = true;
                    }
                    c.step(
                        format!("let t = t.try_var{}(&{a:?}, {corr})?;", kd(keep)),
                        VAR_NAMES,
                        || {
                            if keep {
                                t.try_var_keepdim(&a, corr)
                            } else {
                                t.try_var(&a, corr)
                            }
                        },
                    )
                }
                2 => {
                    let d = if rng.chance(3, 4) {
                        Some(a.first().copied().unwrap_or(-1))
                    } else {
                        None
                    };
                    let shown = d.map_or("..".to_string(), |d| d.to_string());
                    c.step(
                        format!("let t = t.try_argmax{}({shown})?;", kd(keep)),
                        &["argmax", "reshape", "full", "cast"],
                        || match (d, keep) {
                            (Some(d), false) => t.try_argmax(d),
                            (Some(d), true) => t.try_argmax_keepdim(d),
                            (None, false) => t.try_argmax(..),
                            (None, true) => t.try_argmax_keepdim(..),
                        },
                    )
                }
                _ => {
                    let d = a.first().copied().unwrap_or(0);
                    c.step(
                        format!("let t = t.try_argmin{}({d})?;", kd(keep)),
                        &["argmin", "reshape", "full", "cast"],
                        || {
                            if keep {
                                t.try_argmin_keepdim(d)
                            } else {
                                t.try_argmin(d)
                            }
                        },
                    )
                }
            }
        }
        18 => {
            let d = if nd > 0 && rng.chance(3, 4) {
                rng.below(nd) as isize
            } else {
                rng.index()
            };
            if rng.chance(1, 2) {
                c.step(
                    format!("let t = t.try_softmax({d})?;"),
                    SOFTMAX_NAMES,
                    || t.try_softmax(d),
                )
            } else {
                c.step(
                    format!("let t = t.try_log_softmax({d})?;"),
                    SOFTMAX_NAMES,
                    || t.try_log_softmax(d),
                )
            }
        }
        19 => {
            let k = rng.below(nd + 1).max(1).min(nd.max(1));
            let norm: Vec<usize> = shape[nd.saturating_sub(k)..].to_vec();
            if layer_norm_is_ill_conditioned(t, &norm) {
                c.unstable = true;
            }
            let w = if rng.chance(1, 2) {
                let w = c.step(
                    format!(
                        "let w = Tensor::try_full_on(&{norm:?}, 1.0, DType::F32, Device::Cpu)?;"
                    ),
                    &["full"],
                    || full(&norm, Scalar::Float(1.0), DType::F32),
                )?;
                match w {
                    Ok(w) => Some(w),
                    Err(e) => return Ok(Err(e)),
                }
            } else {
                None
            };
            c.step(
                format!(
                    "let t = t.try_layer_norm(&{norm:?}, {}, None, 1e-5)?;",
                    if w.is_some() { "Some(&w)" } else { "None" }
                ),
                LAYER_NORM_NAMES,
                || t.try_layer_norm(&norm, w.as_ref(), None, 1e-5),
            )
        }
        _ => {
            // matmul with huge inner, outer or batch dimensions
            let k = shape.last().copied().unwrap_or(1);
            let n = rng.dim();
            let mut s: Vec<usize> = if rng.chance(1, 3) {
                vec![rng.dim()]
            } else {
                vec![]
            };
            s.extend([if rng.chance(3, 4) { k } else { rng.dim() }, n]);
            let d = rng.pick(&[DType::F32, DType::F64, DType::I32, DType::BF16]);
            let o = match c.step(
                format!("let o = Tensor::try_full_on(&{s:?}, 1, DType::{d:?}, Device::Cpu)?;"),
                &["full"],
                || full(&s, Scalar::Int(1), d),
            )? {
                Ok(o) => o,
                Err(e) => return Ok(Err(e)),
            };
            if rng.chance(1, 2) {
                c.step(
                    "let t = t.try_matmul(&o)?;".into(),
                    &[
                        "matmul",
                        "unsqueeze",
                        "reshape",
                        "expand",
                        "broadcast_to",
                        "cast",
                        "squeeze_dim",
                    ],
                    || t.try_matmul(&o),
                )
            } else {
                c.step(
                    "let t = o.try_matmul(&t)?;".into(),
                    &[
                        "matmul",
                        "unsqueeze",
                        "reshape",
                        "expand",
                        "broadcast_to",
                        "cast",
                        "squeeze_dim",
                    ],
                    || o.try_matmul(t),
                )
            }
        }
    }
}

/// Whether every value `t` depends on (composite ops' internal ones included) is small
/// enough for the reference evaluator, which computes all of them: kiln's plan may skip
/// work whose result has no elements (a layer norm's row statistics), the reference does
/// not.
fn graph_is_small(t: &Tensor) -> bool {
    kiln::graph::read_graph(|g| {
        g.lazy_subgraph(&[t.node_key()]).is_ok_and(|nodes| {
            nodes.iter().all(|&k| {
                g.node(k)
                    .is_ok_and(|n| checked_numel(&n.shape).is_some_and(|m| m <= SMALL_LIMIT))
            })
        })
    })
}

/// Whether running `plan` is cheap: every kernel's index space, row space and matmul
/// operands, and every buffer, hold at most `SMALL_LIMIT` elements. (A composite can hide a
/// huge intermediate behind a result without elements: `layer_norm` over `[0, 2]` of a
/// `[2^31, 0, 2]` tensor still computes 2^31 row means.)
fn plan_is_small(plan: &kiln::Plan) -> bool {
    let small = |s: &[usize]| checked_numel(s).is_some_and(|n| n <= SMALL_LIMIT);
    plan.kernels().all(|k| {
        let k = k.kernel();
        small(&k.shape)
            && small(&k.row_shape())
            && k.matmul
                .as_ref()
                .is_none_or(|m| small(&m.lhs_view.shape) && small(&m.rhs_view.shape))
    }) && plan
        .program
        .buffers
        .iter()
        .all(|b| b.bytes <= 8 * SMALL_LIMIT)
}

/// The first buffer a plan writes, in bytes.
fn first_buffer_bytes(plan: &kiln::Plan) -> Option<usize> {
    let step = plan.program.steps.first()?;
    let spec = plan.program.buffers.get(step.output())?;
    if spec.input.is_some() {
        return None;
    }
    Some(spec.bytes)
}

/// Reads `t` back as f64 through `to_vec` in its own element type.
fn read(t: &Tensor) -> kiln::Result<Vec<f64>> {
    use half::{bf16, f16};
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F64 => t.to_vec::<f64>()?,
        DType::F16 => t.to_vec::<f16>()?.into_iter().map(f64::from).collect(),
        DType::BF16 => t.to_vec::<bf16>()?.into_iter().map(f64::from).collect(),
        DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        DType::I64 => t.to_vec::<i64>()?.into_iter().map(|x| x as f64).collect(),
        DType::U8 => t.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        DType::Bool => t
            .to_vec::<bool>()?
            .into_iter()
            .map(|b| b as u8 as f64)
            .collect(),
    })
}

/// `to_vec` with an element type other than `t`'s: must be refused before realizing.
fn read_wrong_type(t: &Tensor) -> kiln::Result<()> {
    match t.dtype() {
        DType::F32 => t.to_vec::<f64>().map(drop),
        _ => t.to_vec::<f32>().map(drop),
    }
}

/// Plans, then realizes or drops the last tensor of a case.
fn finish(
    rng: &mut Rng,
    c: &mut Case,
    t: Tensor,
    slow: &mut Vec<String>,
) -> Result<Outcome, String> {
    if c.max_numel <= SMALL_LIMIT && rng.chance(1, 16) {
        c.note("t.to_vec::<another type>()".into());
        return match read_wrong_type(&t) {
            Ok(()) => Ok(Outcome::ReadBackConverted),
            Err(e) => Err(c.fail(format!("to_vec with another element type gave {e:?}"))),
        };
    }
    c.note("let plan = t.plan(&Default::default())?;".into());
    let start = Instant::now();
    let (plan, bytes, largest) = counting(|| t.plan(&RealizeOptions::default()));
    let took = start.elapsed();
    PLAN_MAX.with(|m| {
        let (b, d) = m.get();
        m.set((b.max(bytes), d.max(took)));
    });
    if took > PLAN_TIME || bytes > PLAN_BYTES {
        slow.push(c.fail(format!(
            "planning {:?} ({}) took {took:?} and allocated {bytes} bytes (largest {largest})",
            t.shape(),
            t.dtype()
        )));
    }
    let plan = match plan {
        Ok(p) => p,
        Err(e) => {
            return match e {
                KilnError::OutOfMemory { .. }
                | KilnError::TooLarge { .. }
                | KilnError::InvalidArgument { .. } => {
                    if !matches!(e, KilnError::OutOfMemory { .. }) {
                        c.check_error(&e, &[e_op(&e)])?;
                    }
                    Ok(Outcome::PlanError(variant(&e)))
                }
                e => Err(c.fail(format!("planning failed with {e:?}"))),
            };
        }
    };
    if c.max_numel <= SMALL_LIMIT && plan_is_small(&plan) && graph_is_small(&t) {
        drop(plan);
        c.note("t.realize()?; // and compare with the reference".into());
        let want = reference::evaluate(&t)
            .map_err(|e| c.fail(format!("reference: {e}")))?
            .to_f64();
        let got = read(&t).map_err(|e| c.fail(format!("realizing a small tensor failed: {e}")))?;
        if c.unstable {
            return Ok(Outcome::RealizedUncompared);
        }
        if got.len() != want.len() {
            return Err(c.fail(format!("{} values, expected {}", got.len(), want.len())));
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let ok =
                (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 2e-2 * (1.0 + w.abs());
            if !ok {
                return Err(c.fail(format!("element {i}: got {g}, reference {w}")));
            }
        }
        return Ok(Outcome::Realized);
    }
    let first = first_buffer_bytes(&plan);
    drop(plan);
    if first.is_some_and(|b| b >= UNALLOCATABLE) {
        let r = if rng.chance(1, 2) {
            c.note("t.realize()?;".into());
            t.realize()
        } else {
            c.note("t.to_vec()?;".into());
            read(&t).map(drop)
        };
        return match r {
            Ok(()) => Err(c.fail("realizing an unallocatable tensor succeeded".into())),
            Err(
                e @ (KilnError::OutOfMemory { .. }
                | KilnError::TooLarge { .. }
                | KilnError::InvalidArgument { .. }),
            ) => {
                if !matches!(e, KilnError::OutOfMemory { .. }) {
                    c.check_error(&e, &[e_op(&e)])?;
                }
                Ok(Outcome::RealizeError(variant(&e)))
            }
            Err(e) => Err(c.fail(format!("realizing failed with {e:?}"))),
        };
    }
    Ok(Outcome::Planned)
}

/// The method-name suffix of a reduction's keepdim form.
fn kd(keep: bool) -> &'static str {
    if keep { "_keepdim" } else { "" }
}

/// The op an error names (for errors raised by plan/realize, whose op is kiln's choice).
fn e_op(e: &KilnError) -> &'static str {
    error_parts(e).map(|(op, _)| op).unwrap_or("?")
}

fn run_case(rng: &mut Rng, c: &mut Case, slow: &mut Vec<String>) -> Result<Outcome, String> {
    let mut t = match base(rng, c)? {
        Ok(t) => t,
        Err(v) => return Ok(Outcome::Rejected(v)),
    };
    for _ in 0..1 + rng.below(3) {
        t = match transform(rng, c, &t)? {
            Ok(t) => t,
            Err(v) => return Ok(Outcome::Rejected(v)),
        };
    }
    finish(rng, c, t, slow)
}

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Runs `f` on its own thread; if `progress` stops moving for `stall`, fails with what
/// the case running then was doing (a hang would otherwise stall the whole suite).
fn with_watchdog<T: Send + 'static>(
    progress: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stall: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    use std::sync::atomic::Ordering;
    let h = std::thread::spawn(f);
    let mut last = (usize::MAX, Instant::now());
    while !h.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        let p = progress.load(Ordering::Relaxed);
        if p != last.0 {
            last = (p, Instant::now());
        } else if last.1.elapsed() > stall {
            let now = NOW.lock().unwrap_or_else(|e| e.into_inner()).join("\n    ");
            panic!("case {p} made no progress for {stall:?}; it was running:\n    {now}");
        }
    }
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// The tests of this file run one at a time (the fuzz loop checks that the graph forgets
/// every node it recorded).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn extreme_sizes_fail_typed_or_plan_without_computing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let nodes_before = kiln::graph::live_nodes();
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cases = std::env::var("KILN_EXTREME_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES);
    let seed = std::env::var("KILN_EXTREME_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6b69_6c6e_u64);
    let print = std::env::var_os("KILN_EXTREME_PRINT").is_some();
    // `KILN_EXTREME_CASE=i` reruns case `i` of the seed alone (each case seeds its own rng).
    let only: Option<usize> = std::env::var("KILN_EXTREME_CASE")
        .ok()
        .and_then(|v| v.parse().ok());
    let progress = Arc::new(AtomicUsize::new(0));
    let p2 = Arc::clone(&progress);
    let start = Instant::now();
    // Panics are part of the report, with where they happened; the default hook would print
    // each one too.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" (at {}:{})", l.file(), l.line()))
            .unwrap_or_default();
        *PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }));
    let (outcomes, failures, slow) = with_watchdog(progress, Duration::from_secs(30), move || {
        let mut outcomes: BTreeMap<Outcome, usize> = BTreeMap::new();
        let mut failures: Vec<String> = vec![];
        let mut slow: Vec<String> = vec![];
        for i in 0..cases {
            if only.is_some_and(|o| o != i) {
                continue;
            }
            p2.store(i, Ordering::Relaxed);
            if std::env::var_os("KILN_EXTREME_TRACE").is_some() {
                eprintln!("case {i}:");
            }
            let mut rng = Rng(seed ^ (i as u64).wrapping_mul(0xA24B_AED4_963E_E407));
            let mut case_slow = vec![];
            let mut c = Case {
                log: vec![],
                max_numel: 0,
                inexact: false,
                unstable: false,
            };
            let r = catch_unwind(AssertUnwindSafe(|| {
                run_case(&mut rng, &mut c, &mut case_slow)
            }));
            if print {
                println!("case {i}: {r:?}\n    {}", c.log.join("\n    "));
            }
            match r {
                Ok(Ok(o)) => *outcomes.entry(o).or_default() += 1,
                Ok(Err(f)) => failures.push(format!("case {i}: {f}")),
                Err(p) => {
                    let msg = panic_text(p);
                    let at = PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let what = format!("panicked: {msg}{at}");
                    failures.push(format!("case {i}: {}", c.fail(what)));
                }
            }
            slow.extend(case_slow);
        }
        let (plan_bytes, plan_time) = PLAN_MAX.with(Cell::get);
        println!(
            "fuzz_extreme: the largest plan allocated {plan_bytes} bytes, the slowest took \
             {plan_time:?}"
        );
        (outcomes, failures, slow)
    });
    std::panic::set_hook(hook);
    println!(
        "fuzz_extreme: {cases} cases in {:.2} s, {} failures, {} slow or allocating plans",
        start.elapsed().as_secs_f64(),
        failures.len(),
        slow.len()
    );
    for (o, n) in &outcomes {
        println!("    {n:6}  {o:?}");
    }
    let shown: usize = std::env::var("KILN_EXTREME_SHOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    for f in failures.iter().take(shown) {
        println!("--- {f}");
    }
    for s in slow.iter().take(5) {
        println!("--- slow: {s}");
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed",
        failures.len()
    );
    // Every tensor of every case was dropped, accepted or not: the graph holds nothing more.
    assert_eq!(
        kiln::graph::live_nodes(),
        nodes_before,
        "the fuzz cases left nodes in the graph"
    );
    assert!(
        slow.is_empty(),
        "{} plans were slow or allocated more than {PLAN_BYTES} bytes",
        slow.len()
    );
}

/// Realizing a matmul without elements must not loop over its (huge) batch: it used to run
/// the CPU backend's per-batch loop 2^62 times. Run on a thread with a deadline, so that the
/// bug fails this test instead of hanging it.
#[test]
fn empty_matmul_over_a_huge_batch_finishes_at_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let a = Tensor::zeros([0, 0]);
        let b = Tensor::zeros([1 << 62, 0, 4]);
        let c = a.matmul(&b);
        let r = c.realize().map(|()| c.shape().to_vec());
        // Drop the tensors before answering, so that no node outlives this test.
        drop((a, b, c));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(shape)) => assert_eq!(shape, vec![1 << 62, 0, 4]),
        Ok(Err(e)) => panic!("realizing an empty matmul failed: {e}"),
        Err(_) => panic!("realizing [0, 0] @ [2^62, 0, 4] did not finish within 10 s"),
    }
}

/// A bool/u8/f16/bf16 tensor that `check_shape` accepts must plan (and fail to realize with
/// `OutOfMemory`), not fail with `KilnError::Internal` from the kernel validator, whose
/// offset bound assumes 8-byte elements.
#[test]
fn accepted_one_and_two_byte_tensors_plan() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let padded = Tensor::from_vec(vec![1u8, 2, 3], [3]).pad(&[(1 << 61, 0)], 0);
    for t in [
        Tensor::full_dtype([1 << 61], true, DType::Bool),
        Tensor::full_dtype([(1 << 62) - 1], 1, DType::U8),
        Tensor::full_dtype([(1 << 61) - 1], 1.0, DType::BF16),
        padded,
    ] {
        let plan = t.plan(&RealizeOptions::default());
        assert!(
            plan.is_ok(),
            "{:?} {}: {:?}",
            t.shape(),
            t.dtype(),
            plan.err()
        );
        match t.realize() {
            Err(KilnError::OutOfMemory { .. } | KilnError::TooLarge { .. }) => {}
            other => panic!("{:?} {}: realize gave {other:?}", t.shape(), t.dtype()),
        }
    }
}

/// Found by the fuzz loop with seed 99887766 (case 65430): a one-byte value padded by 2^61
/// elements, computed elementwise from an eight-byte one. Fusion pushed the pad's view
/// through the comparison onto the f64 load, whose byte offsets (-2^64) no longer fit an
/// `isize`, and planning failed with an internal error. Now the comparison is stored and
/// the pad reads its one-byte result; the padded tensor plans (and, at 2^61 bytes, does not
/// fit in memory).
#[test]
fn a_pad_of_a_narrow_value_computed_from_a_wide_one_plans() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (dtype, wide) in [
        (DType::Bool, DType::F64),
        (DType::Bool, DType::I64),
        (DType::U8, DType::F32),
    ] {
        let x = Tensor::from_vec(vec![1.0f64, 3.0], [2]).cast(wide);
        let narrow = if dtype == DType::Bool {
            x.eq(3.0)
        } else {
            x.cast(dtype)
        };
        let t = narrow.pad(&[(1 << 61, 1)], 0);
        let plan = t.plan(&RealizeOptions::default());
        assert!(plan.is_ok(), "{dtype} from {wide}: {:?}", plan.err());
        match t.realize() {
            Err(KilnError::OutOfMemory { .. } | KilnError::TooLarge { .. }) => {}
            other => panic!("{dtype} from {wide}: realize gave {other:?}"),
        }
        // The same program at a size that runs agrees with the reference evaluator.
        let small = narrow.pad(&[(3, 1)], 0);
        let want = kiln::reference::evaluate(&small).unwrap();
        assert_eq!(small.to_vec::<f64>().unwrap(), want.to_f64());
    }
}

/// Found by the fuzz loop with seed 20264 (case 20727): a product without elements over a
/// batch of 2^31, whose right operand was a generated `[4, 1]` broadcast over the batch.
/// The planner stored the generated operand at its broadcast shape (2^33 elements, 64 GiB
/// of f64) and reading the empty result failed with `OutOfMemory`. A generated operand
/// read through a broadcast is now stored at its own shape.
#[test]
fn a_generated_operand_broadcast_over_a_batch_is_stored_at_its_own_shape() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Tensor::eye(0, DType::I32).reshape([1usize << 31, 0, 4]);
    let o = Tensor::full_dtype([4, 1], 1, DType::F64);
    let t = t.matmul(&o);
    assert_eq!(t.shape(), &[1 << 31, 0, 1]);
    assert_eq!(t.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    // At a size that runs: the copy holds 4 elements, not 8 · 4.
    let x = Tensor::from_vec((0..96).map(|v| v as f64).collect::<Vec<_>>(), [8, 3, 4]);
    let y = x.matmul(&Tensor::full_dtype([4, 1], 0.5, DType::F64));
    let plan = y.plan(&RealizeOptions::default()).unwrap();
    let largest_copy = plan
        .kernels()
        .filter(|k| k.kernel().matmul.is_none())
        .map(|k| k.kernel().shape.iter().product::<usize>())
        .max();
    assert_eq!(largest_copy, Some(4));
    let want = kiln::reference::evaluate(&y).unwrap().to_f64();
    assert_eq!(y.to_vec::<f64>().unwrap(), want);
}

/// Found by the fuzz loop with seed 36102 (case 74380): the sum of no elements is +0 (as
/// in PyTorch), so `rsqrt` of it is +inf and `tanh` of that 1. The reference evaluator
/// summed with `Iterator::sum`, which starts at -0.0 for floats, and gave -1.
#[test]
fn an_empty_sum_is_positive_zero_in_the_reference_too() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let x = Tensor::full_dtype([0, 4], 1.0, dtype);
        let t = x.sum(&[] as &[isize]).rsqrt().tanh();
        let want = kiln::reference::evaluate(&t).unwrap().to_f64();
        assert_eq!(want, vec![1.0], "{dtype}");
        assert_eq!(t.to_vec::<f64>().unwrap(), want, "{dtype}");
        // An empty product, likewise.
        let p =
            Tensor::full_dtype([3, 0], 1.0, dtype).matmul(&Tensor::full_dtype([0, 2], 1.0, dtype));
        let got = p.rsqrt().to_vec::<f64>().unwrap();
        assert_eq!(got, vec![f64::INFINITY; 6], "{dtype}");
        let want = kiln::reference::evaluate(&p.rsqrt()).unwrap().to_f64();
        assert_eq!(want, got, "{dtype}");
    }
}

/// Found by the fuzz loop with seed 59859 (case 51108): a layer norm over the last two axes
/// of `[3, 2^40, 0, 2^33]` has no elements, but its kernel's rows (the statistics of each
/// of the 3·2^40 rows) are not empty, and the CPU backend walked all of them, reducing
/// nothing, to store nothing (the loop's watchdog stopped it after 30 s). A kernel whose
/// space has no elements and that stores no row values now returns at once.
#[test]
fn a_layer_norm_without_elements_over_many_rows_finishes_at_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Under the loop's watchdog: without the fix this never finishes.
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    with_watchdog(progress, Duration::from_secs(30), || {
        let shape = [3usize, 1 << 40, 0, 1 << 33];
        let x = Tensor::randn_seeded(shape, 25);
        let t = x.layer_norm(&[0, 1 << 33], None, None, 1e-5);
        assert_eq!(t.to_vec::<f64>().unwrap(), Vec::<f64>::new());
        // Row values that are stored still run: the sum over an empty axis is zeros.
        let s = Tensor::randn_seeded([5usize, 0], 3).sum([-1isize]);
        assert_eq!(s.to_vec::<f32>().unwrap(), vec![0.0; 5]);
    });
}

/// Found by the fuzz loop with seeds 471647 (case 40569) and 321186 (case 75717): a pad
/// read straight from a strided view, a slice with a step past the axis or a squeeze of an
/// axis the producer's layout strides over, reached offsets past `isize::MAX` in the
/// padded rows (`2^33` rows of stride `2^31`) though every element read lay inside the
/// producer, and planning failed with an internal error. The views pass now splits such a
/// chain before the pad (a copy of the strided part; a pad over a row-major copy stays
/// within its own result's size). At sizes that run, nothing is split.
#[test]
fn a_pad_over_a_strided_view_plans_when_its_offsets_pass_isize() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    type Program = fn(&Tensor, usize) -> kiln::Result<Tensor>;
    fn strided_then_padded(x: &Tensor, pad: usize) -> kiln::Result<Tensor> {
        x.try_slice_dim(2, 0, 3, isize::MAX)?
            .try_squeeze_dim(2)?
            .try_pad(&[(0, pad)], 0.0)
    }
    fn padded_sliced_padded(x: &Tensor, pad: usize) -> kiln::Result<Tensor> {
        x.try_pad(&[(1, 1)], 0.0)?
            .try_slice_dim(1, 0, 1, 1)?
            .try_pad(&[(pad, 2), (4, 1)], 0.0)
    }
    // The fuzzer's programs (results of 2^46 bytes and more): they plan.
    let found: [(Tensor, Program); 2] = [
        (
            Tensor::try_full_on([8192, 524288, 4096], 3i64, DType::Bool, Device::Cpu).unwrap(),
            strided_then_padded,
        ),
        (
            Tensor::try_rand([8192, 8192, 2097152], 35, DType::F32).unwrap(),
            padded_sliced_padded,
        ),
    ];
    for (i, (x, f)) in found.iter().enumerate() {
        let plan = f(x, 1 << 33).unwrap().plan(&RealizeOptions::default());
        assert!(plan.is_ok(), "program {i}: {:?}", plan.err());
    }
    // Small results over huge generators, with the same overflow (a padded axis of stride
    // 2^60 or 2^58): they run, and equal the same program with its strided part copied
    // explicitly (`contiguous()`) before the last pad.
    let t =
        strided_then_padded(&Tensor::full_dtype([2usize, 1, 1 << 60], 3, DType::Bool), 8).unwrap();
    assert_eq!(t.shape(), &[10, 1]);
    let got = t.to_vec::<f64>().unwrap();
    assert_eq!(got, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let x = Tensor::rand_seeded([1usize, 1 << 58, 1], 35);
    let t = padded_sliced_padded(&x, 8).unwrap();
    assert_eq!(t.shape(), &[13, 6, 1]);
    let inner = x.pad(&[(1, 1)], 0.0).slice_dim(1, 0, 1, 1).contiguous();
    let want = inner.pad(&[(8, 2), (4, 1)], 0.0).to_vec::<f32>().unwrap();
    let got = t.to_vec::<f32>().unwrap();
    assert_eq!(got, want);
    assert!(
        got.iter().any(|&v| v != 0.0),
        "the generated values are read"
    );
    // At sizes whose offsets fit, nothing is split: one kernel, equal to the reference.
    let small: [(Tensor, Program); 2] = [
        (
            Tensor::from_vec(
                (0..60).map(|v| (v % 3) as f64).collect::<Vec<_>>(),
                [3, 4, 5],
            )
            .cast(DType::Bool),
            strided_then_padded,
        ),
        (Tensor::rand_seeded([3, 4, 5], 35), padded_sliced_padded),
    ];
    for (i, (x, f)) in small.iter().enumerate() {
        let t = f(x, 3).unwrap();
        let plan = t.plan(&RealizeOptions::default()).unwrap();
        assert_eq!(plan.kernels().count(), 1, "program {i}");
        let want = reference::evaluate(&t).unwrap().to_f64();
        assert_eq!(t.to_vec::<f64>().unwrap(), want, "program {i}");
    }
}

/// Found by the fuzz loop with seed 59859 (case 51108): a second layer norm, with a
/// weight, over the result of the one above. Its input has no elements, but the first
/// layer norm's row statistics (3·2^40 floats) were stored for it, and realizing failed
/// with `OutOfMemory`. A value without elements is now planned as a constant: nothing it
/// reads is computed.
#[test]
fn work_that_feeds_only_values_without_elements_is_not_planned() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let shape = [3usize, 1 << 40, 0, 1 << 33];
    let x = Tensor::randn_seeded(shape, 25);
    let t = x.layer_norm(&[0, 1 << 33], None, None, 1e-5);
    let w = Tensor::full(shape, 1.0);
    let t = t.layer_norm(&shape, Some(&w), None, 1e-5);
    let plan = t.plan(&RealizeOptions::default()).unwrap();
    assert!(
        plan.program.buffers.iter().all(|b| b.bytes == 0),
        "{:?}",
        plan.program.buffers
    );
    assert_eq!(t.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    // Values with elements computed from empty ones still run: a sum over an empty axis,
    // a product with an empty inner dimension, a kept handle on an empty intermediate.
    let e = Tensor::rand_seeded([4usize, 6], 3)
        .slice_dim(1, 2, 2, 1)
        .exp();
    let s = (e.sum([-1isize]) + 1.0).to_vec::<f32>().unwrap();
    assert_eq!(s, vec![1.0; 4]);
    let p = e.matmul(&Tensor::rand_seeded([0usize, 3], 4).relu());
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.0; 12]);
    let kept = e.sqrt();
    let total = (kept.sum(&[] as &[isize]) * 2.0).to_vec::<f32>().unwrap();
    assert_eq!(total, vec![0.0]);
    assert_eq!(kept.shape(), &[4, 0]);
    assert_eq!(kept.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    for v in [&s[..], &total[..]] {
        assert!(v.iter().all(|x| x.is_finite()));
    }
    // The reference evaluator agrees at a small size.
    let x = Tensor::randn_seeded([3usize, 5, 0, 4], 25);
    let t = x.layer_norm(&[0, 4], None, None, 1e-5);
    let w = Tensor::full([3usize, 5, 0, 4], 1.0);
    let t = t
        .layer_norm(&[3, 5, 0, 4], Some(&w), None, 1e-5)
        .sum(&[] as &[isize]);
    let want = reference::evaluate(&t).unwrap().to_f64();
    assert_eq!(t.to_vec::<f64>().unwrap(), want);
}

/// A panic's message (`String` or `&str` payloads), without printing it.
fn panic_message(f: impl FnOnce()) -> Option<String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f)).err().map(panic_text);
    std::panic::set_hook(hook);
    r
}

/// Expects `r` to be `TooLarge` about `shape` from `op` (the op the user called, even when
/// it broadcasts its operands first).
#[track_caller]
fn assert_too_large<T: std::fmt::Debug>(r: kiln::Result<T>, op: &str, shape: &[usize]) {
    match r {
        Err(e @ KilnError::TooLarge { .. }) => {
            let text = e.to_string();
            assert!(text.starts_with(&format!("{op}:")), "{text}");
            assert!(text.contains(&format!("{shape:?}")), "{text}");
        }
        other => panic!("{op} {shape:?}: expected TooLarge, got {other:?}"),
    }
}

/// The rows of the hardening issue, each through every path that reaches it.
#[test]
fn hardening_rows_are_errors_not_wrong_values() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = Device::Cpu;

    // [(1 << 62) + 1, 4] has 2^64 + 4 elements, which wraps to 4: refused when recorded, so a
    // sum over dim 1, a slice or a read-back can never see a 4-element buffer.
    let wrap = [(1usize << 62) + 1, 4];
    assert_too_large(
        Tensor::try_full_on(wrap, 1.0, DType::F32, cpu),
        "full",
        &wrap,
    );
    let r = Tensor::try_full_on(wrap, 1.0, DType::F32, cpu);
    assert!(r.and_then(|t| t.try_sum(1)?.to_vec::<f32>()).is_err());
    let r = Tensor::try_full_on(wrap, 1.0, DType::F32, cpu);
    assert!(
        r.and_then(|t| t.try_slice(&[(0, 2, 1)])?.to_vec::<f32>())
            .is_err()
    );
    let r = Tensor::try_full_on(wrap, 1.0, DType::F32, cpu);
    assert!(r.and_then(|t| t.to_vec::<f32>()).is_err());
    // The same shape reached from accepted tensors.
    let row = Tensor::full_dtype([1, 4], 1.0, DType::F32);
    assert_too_large(row.try_broadcast_to(wrap), "expand", &wrap);
    assert!(Tensor::try_from_vec(vec![1.0f32; 4], wrap).is_err());
    assert!(Tensor::try_from_bytes(&[0u8; 16], &wrap, DType::F32).is_err());

    // [2^33, 2^33]: 2^66 elements, which wraps to 0; `(full + 1).sum()` used to give [0.0].
    let sq = [1usize << 33, 1 << 33];
    let r = Tensor::try_full_on(sq, 1.0, DType::F32, cpu)
        .and_then(|t| t.try_add(1.0))
        .and_then(|t| t.try_sum([0, 1]))
        .and_then(|t| t.to_vec::<f32>());
    assert!(r.is_err(), "(full([2^33, 2^33]) + 1).sum() gave {r:?}");
    assert_too_large(Tensor::try_full_on(sq, 1.0, DType::F32, cpu), "full", &sq);
    // The panicking form panics with the same typed message.
    let msg = panic_message(|| {
        let _ = (Tensor::full_dtype(sq, 1.0, DType::F32) + 1.0).sum([0, 1]);
    })
    .expect("Tensor::full of [2^33, 2^33] panics");
    assert!(msg.contains("full:") && msg.contains("too large"), "{msg}");
    // Through a broadcast, an outer product and a reshape of an accepted [2^33] tensor.
    let v = Tensor::full_dtype([1 << 33], 1.0, DType::F32);
    let col = v.reshape([-1, 1]);
    let row = v.reshape([1, -1]);
    assert_too_large(row.try_broadcast_to(sq), "expand", &sq);
    assert_too_large(col.try_add(&row), "add", &sq);
    assert_too_large(col.try_matmul(&row), "matmul", &sq);
    assert!(col.try_add(&row).and_then(|t| t.try_sum([0, 1])).is_err());

    // Padding by usize::MAX overflows the dimension.
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    for pads in [
        (usize::MAX, 1),
        (1, usize::MAX),
        (usize::MAX, 0),
        (usize::MAX / 2, usize::MAX / 2 + 2),
    ] {
        match x.try_pad(&[pads], 0.0) {
            Err(e @ (KilnError::InvalidArgument { .. } | KilnError::TooLarge { .. })) => {
                let text = e.to_string();
                assert!(text.starts_with("pad:"), "{text}");
                assert!(text.contains("[2]"), "{text}");
            }
            other => panic!("pad {pads:?} of a [2] tensor gave {other:?}"),
        }
    }
    let msg = panic_message(|| {
        let _ = x.pad(&[(usize::MAX, 1)], 0.0);
    })
    .expect("pad by usize::MAX panics");
    assert!(msg.starts_with("pad:"), "{msg}");

    // Tensors without elements but with huge dimensions realize at once.
    for t in [
        Tensor::zeros([1 << 40, 0]) + 1.0,
        Tensor::zeros([0, 1 << 40]).sum(1),
        Tensor::zeros([1 << 62, 0]).t().contiguous(),
        Tensor::zeros_dtype([0, usize::MAX], DType::U8).cast(DType::F64),
        Tensor::zeros([0, 1 << 40]).softmax(-1),
    ] {
        let start = Instant::now();
        assert_eq!(t.to_vec::<f32>().map(|v| v.len()).unwrap_or(0), 0);
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", t.shape());
    }
}

/// A tensor without elements may have a dimension above `isize::MAX`; slicing or narrowing
/// it must not panic (`isize::clamp(0, n as isize)` with a negative bound).
#[test]
fn slicing_a_dimension_past_isize_max_does_not_panic() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Tensor::full_dtype([1 << 63, 0], 1.0, DType::F32);
    let r = catch_unwind(AssertUnwindSafe(|| {
        (
            t.try_slice(&[(0, 1, 1)]).map(|t| t.shape().to_vec()),
            t.try_slice_dim(0, 0, -1, 1).map(|t| t.shape().to_vec()),
        )
    }));
    let (slice, narrow) = r.unwrap_or_else(|p| panic!("panicked: {}", panic_text(p)));
    assert_eq!(slice, Ok(vec![1, 0]));
    assert_eq!(narrow, Ok(vec![(1 << 63) - 1, 0]));
}

/// gelu(-inf) is -0 (docs/math.md), in every dtype: the f64 definition (reference evaluator,
/// f64 kernels) gives NaN.
#[test]
fn gelu_of_minus_infinity_is_minus_zero_in_every_dtype() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let x32 = Tensor::from_vec(vec![f32::NEG_INFINITY], [1]).gelu();
    assert_eq!(x32.to_vec::<f32>().unwrap(), vec![-0.0]);
    let x64 = Tensor::from_vec(vec![f64::NEG_INFINITY], [1]).gelu();
    assert_eq!(x64.to_vec::<f64>().unwrap(), vec![-0.0]);
    let r = reference::evaluate(&Tensor::from_vec(vec![f32::NEG_INFINITY], [1]).gelu());
    assert_eq!(r.unwrap().to_f64(), vec![-0.0]);
}
