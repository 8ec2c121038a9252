//! Matrix products on the CPU. f32 and f64 go through the `gemm` crate, which reads both
//! operands through arbitrary row and column strides, so transposed and strided views reach
//! it without a copy — with one exception below. gemm is built with its `x86-v4` feature: it
//! checks `is_x86_feature_detected!` once and runs AVX-512 kernels where the CPU has them,
//! AVX2+FMA or scalar kernels elsewhere, so one binary runs on any x86-64.
//!
//! The exception: with the AVX-512 kernels, an f32 right operand with unit row stride (the
//! `x @ w.t()` of a linear layer) is first copied row-major. gemm packs that layout by
//! gathering one element from each of 64 rows that lie a power-of-two stride apart, which
//! maps them onto one L1 set; measured on 2 Zen 4 cores, the 16×16-tiled copy made
//! `x @ w.t()` 1.1× faster at 1024³ and up to 4× faster for 16–256 rows by 1024×1024,
//! and cost nothing at 2048³. Shallow products (depth under 256) skip the copy, which only
//! cost time there.
//!
//! f16 and bf16 are widened to f32 copies in parallel (the right operand row-major, as
//! above), multiplied by the f32 kernels and rounded once at the end: gemm's own f16 path was
//! slower here and rounds partial sums to f16 between depth blocks. Scratch memory comes
//! from the host caching allocator, so a repeated product does not fault in fresh pages.
//! Integer products use a plain wrapping loop.
//!
//! f32 products with a long depth over a small output (weight gradients), with fewer than
//! 128 rows, or a linear layer's `x @ w.t()` with a shallow depth, on two or more threads,
//! take `blocked_gemm`'s AVX-512 kernel, where the CPU has AVX-512: measured 1.1–1.4×
//! faster than gemm there, and as fast or faster for the linear layers (numbers in that
//! module). Without AVX-512, its AVX2 kernel takes the weight gradients and most products
//! of at least 128 rows (0.8–1.0× gemm's AVX2 time on char_gpt's shapes). Split by rows, that kernel reports each block of rows final as it leaves it
//! ([`run_then`]), and the backend runs the matmul's epilogue (bias, activation, residual)
//! on the block then, on the same thread, instead of in a pass over the whole product
//! after it.
//!
//! Small f32 products that run one per thread (`m, n, k ≤ 256`: attention's per-head
//! products, a recurrent layer's per-step `h @ W_hhᵀ`) take `small_gemm`'s
//! register-blocked kernel instead, where the CPU
//! has AVX-512 or AVX2 (and `KILN_NO_SIMD` is unset): measured on 2 Zen 4 cores with
//! AVX-512, 128 products of `64×32·32×64` and `64×64·64×32` ran 0.75–0.9× gemm's time, and
//! 0.8–0.94× on 2 Zen 3 cores with AVX2.

use super::exec::ArgPtr;
use super::small_gemm;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::kernel::MatmulSpec;
use crate::memory::{self, Buffer};
use crate::shape::View;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

/// One product `out = lhs @ rhs` of a batch: base offsets (elements) and strides. The
/// output's rows are `o_rs` apart (`n` when the product is row-major in its buffer; more
/// when it is written into a permuted layout), its columns adjacent.
#[derive(Clone, Copy)]
struct Gemm {
    out: ArgPtr,
    oo: isize,
    o_rs: isize,
    lhs: ArgPtr,
    lo: isize,
    l_rs: isize,
    l_cs: isize,
    rhs: ArgPtr,
    ro: isize,
    r_rs: isize,
    r_cs: isize,
    m: usize,
    n: usize,
    k: usize,
}

impl Gemm {
    /// This product as pointers to its first f32 elements, for the AVX-512 kernels.
    fn f32_product(&self) -> small_gemm::SmallProduct {
        small_gemm::SmallProduct {
            out: elem::<f32>(self.out, self.oo),
            o_rs: self.o_rs,
            lhs: elem::<f32>(self.lhs, self.lo),
            l_rs: self.l_rs,
            l_cs: self.l_cs,
            rhs: elem::<f32>(self.rhs, self.ro),
            r_rs: self.r_rs,
            r_cs: self.r_cs,
            m: self.m,
            n: self.n,
            k: self.k,
        }
    }
}

/// Output rows `[r0, r1)` of a product are final (see [`run_then`]): called by the thread
/// that computed them, right after it did, with `r0` a multiple of [`ROW_STEP`] and `r1`
/// one too or the row count.
pub(crate) type RowsDone<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// Row boundaries [`RowsDone`] is called with are multiples of this (or the row count).
pub(crate) const ROW_STEP: usize = 6;

/// What a product does for its epilogue on the way (see [`run_then`]).
#[derive(Clone, Copy)]
pub(crate) enum After<'a> {
    /// Nothing: the epilogue, if any, runs after the whole product.
    Nothing,
    /// Report blocks of rows final as they are.
    Rows(&'a RowsDone<'a>),
    /// The whole epilogue is `relu?(product + bias[j])` (bias one f32 per column, read from
    /// `bias` on): applied to the sums in registers before they are stored.
    Bias {
        /// The bias of column 0 (`n` readable f32s).
        bias: *const f32,
        /// Then `relu` (kiln's: `x > 0` or NaN keeps `x`, anything else is `+0`).
        relu: bool,
    },
}

// SAFETY: `Rows` holds a `Sync` callback; `Bias`'s pointer is only read, by the threads of
// one product, while the kernel's argument buffers are alive and the bias is not written
// (it is an input of the running kernel, not its output).
unsafe impl Sync for After<'_> {}
// SAFETY: as above.
unsafe impl Send for After<'_> {}

/// Computes `out[b] = lhs[b] @ rhs[b]` for every batch index, each product written through
/// `mm.out_view`.
pub(crate) fn run(mm: &MatmulSpec, dtype: DType, args: &[ArgPtr]) -> Result<()> {
    run_then(mm, dtype, args, After::Nothing).map(|_| ())
}

/// [`run`], doing `after` where the product's route allows it (an f32 product of one batch
/// index with a row-major output at offset 0, run by `blocked_gemm` split by rows): with
/// [`After::Rows`], calls covering all rows, each row once; with [`After::Bias`], the
/// epilogue applied. Then the result is `true`; otherwise `after` is not done at all and the
/// result is `false`.
pub(crate) fn run_then(
    mm: &MatmulSpec,
    dtype: DType,
    args: &[ArgPtr],
    after: After<'_>,
) -> Result<bool> {
    let shape = mm.shape();
    let nd = shape.len();
    let (m, n) = (shape[nd - 2], shape[nd - 1]);
    let k = mm.lhs_view.shape[nd - 1];
    let batch: usize = shape[..nd - 2].iter().product();
    let (lhs, rhs, out) = (args[mm.lhs], args[mm.rhs], args[mm.out]);
    let offsets = |v: &View, b: usize| -> isize {
        let mut rem = b;
        let mut off = v.offset;
        for d in (0..nd - 2).rev() {
            let c = rem % shape[d];
            rem /= shape[d];
            off += c as isize * v.strides[d];
        }
        off
    };
    let (ls, rs) = (&mm.lhs_view.strides, &mm.rhs_view.strides);
    let (l_rs, l_cs, r_rs, r_cs) = (ls[nd - 2], ls[nd - 1], rs[nd - 2], rs[nd - 1]);
    // Rows of the output: `n` apart when row-major, further in a permuted layout (a
    // single row's stride is never used).
    let o_rs = if m > 1 {
        mm.out_view.strides[nd - 2]
    } else {
        n as isize
    };
    let threads = crate::backend::threads().max(1);
    let flops = 2.0 * (m * n * k) as f64;
    let parallel_batches = batch >= threads && batch > 1;
    let inner_par = if !parallel_batches && flops > 2e6 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // Small products that run one per thread go through the register-blocked kernel.
    let small = matches!(inner_par, gemm::Parallelism::None) && small_gemm::applies(m, n, k);
    // Only for one product written row-major from offset 0.
    let after = match after {
        After::Nothing => None,
        a => (batch == 1
            && dtype == DType::F32
            && !small
            && o_rs == n as isize
            && offsets(&mm.out_view, 0) == 0)
            .then_some(a),
    };

    let product = |b: usize| {
        let lo = offsets(&mm.lhs_view, b);
        let ro = offsets(&mm.rhs_view, b);
        Gemm {
            out,
            oo: offsets(&mm.out_view, b),
            o_rs,
            lhs,
            lo,
            l_rs,
            l_cs,
            rhs,
            ro,
            r_rs,
            r_cs,
            m,
            n,
            k,
        }
    };
    // Small products hint the next batch's operands while they run (see `small_gemm::run`).
    let hint_next = small && dtype == DType::F32 && batch > 1 && super::prefetch::enabled();
    let one = |b: usize| -> Result<()> {
        let g = product(b);
        // SAFETY: the operand views were checked to lie inside their buffers, so every
        // element gemm reads through (offset, row stride, column stride) is in bounds; the
        // output view was checked to address each element of the output buffer once, so
        // the m rows of n elements at `oo + i·o_rs` are inside it and written by this
        // batch index only; operands and output are distinct buffers.
        unsafe {
            match dtype {
                DType::F32 if small => {
                    let next = (hint_next && b + 1 < batch).then(|| product(b + 1));
                    small_f32(g, next)
                }
                DType::F32 => _ = f32_gemm(g, inner_par, After::Nothing)?,
                DType::F64 => gemm_typed::<f64>(g, inner_par),
                DType::F16 => half_gemm::<f16>(g, inner_par)?,
                DType::BF16 => half_gemm::<bf16>(g, inner_par)?,
                DType::I32 => int_gemm::<i32>(g),
                DType::I64 => int_gemm::<i64>(g),
                DType::U8 => int_gemm::<u8>(g),
                DType::Bool => {
                    return Err(KilnError::UnsupportedDType {
                        op: "matmul",
                        dtype,
                        detail: String::new(),
                    });
                }
            }
        }
        Ok(())
    };
    if let Some(after) = after {
        // SAFETY: as in `one` (the single batch index).
        return unsafe { f32_gemm(product(0), inner_par, after) };
    }
    if parallel_batches {
        (0..batch).into_par_iter().try_for_each(one)?;
    } else {
        (0..batch).try_for_each(one)?;
    }
    Ok(false)
}

trait GemmScalar: Copy + 'static {
    const ZERO: Self;
    const ONE: Self;
}
impl GemmScalar for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}
impl GemmScalar for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

/// # Safety
/// Every address `g` describes lies inside its buffer, and `g.out` is not aliased.
unsafe fn gemm_typed<T: GemmScalar>(g: Gemm, par: gemm::Parallelism) {
    let Gemm {
        out,
        oo,
        o_rs,
        lhs,
        lo,
        l_rs,
        l_cs,
        rhs,
        ro,
        r_rs,
        r_cs,
        m,
        n,
        k,
    } = g;
    // SAFETY (whole function): the caller guarantees every pointer below addresses elements
    // inside its buffer for the given strides and extents, and that `out` is not aliased.
    unsafe {
        let dst = (out.ptr as *mut T).offset(oo);
        if k == 0 {
            for i in 0..m {
                std::slice::from_raw_parts_mut(dst.offset(i as isize * o_rs), n).fill(T::ZERO);
            }
            return;
        }
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            o_rs,
            false,
            (lhs.ptr as *const T).offset(lo),
            l_cs,
            l_rs,
            (rhs.ptr as *const T).offset(ro),
            r_cs,
            r_rs,
            T::ZERO,
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
}

/// Whether an f32 product runs transposed (`Cᵀ = Bᵀ·Aᵀ`, then a tiled copy into place):
/// a column-major left operand with few rows and a long depth, the shape of a weight
/// gradient `xᵀ·g` over many tokens. gemm runs those well below its rate; measured on 2
/// Zen 4 cores, one process, the transposed route took 0.69× the time at m = 128, n = 512,
/// k = 2048 (char_gpt's MLP weight gradient), 0.78–0.90× at (64, 1024, 1024), (128, 384,
/// 2048), (32, 512, 2048), (128, 256, 4096), (256, 512, 2048) and (128, 1024, 2048), but
/// 1.22× at (256, 1024, 1024) and 1.34× at (512, 1024, 512) (depth under 8·m), and 3.35×
/// at (65, 128, 2048) (the swapped product's 65 columns are not whole vectors). Row-major
/// left operands run slower transposed at every shape measured.
fn computes_transposed(g: &Gemm) -> bool {
    g.l_rs == 1
        && g.l_cs != 1
        && g.m < g.n
        && g.k >= 8 * g.m
        && g.m.is_multiple_of(16)
        && g.n.is_multiple_of(16)
}

/// An f32 product through [`small_gemm`].
///
/// # Safety
/// As for [`gemm_typed`], and [`small_gemm::applies`] holds for `(g.m, g.n, g.k)`.
/// `next` (the product this thread runs next) only has its operands' lines hinted.
unsafe fn small_f32(g: Gemm, next: Option<Gemm>) {
    let p = g.f32_product();
    let next = next.map(|n| n.f32_product());
    // SAFETY: the caller's contract: the operands are in bounds for their strides, the
    // m × n output block is this product's alone, and the size is one the kernel takes
    // (`next` is never dereferenced).
    unsafe { small_gemm::run(&p, next.as_ref()) }
}

/// Whether gemm runs its AVX-512 kernels on this CPU (it makes the same check).
fn gemm_uses_avx512() -> bool {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
    {
        false
    }
}

/// Fewest output rows for which an f32 right operand with unit row stride is copied
/// row-major first (see the module docs; measured faster from 16 rows up).
const MIN_ROWS_FOR_RHS_COPY: usize = 16;

/// Least depth for which that copy is made. The copy pays for itself where gemm's packing
/// reads would alias (long columns); at depth 32 (attention heads: 128 products of
/// 64×32 by 32×64) the copy, and a scratch block per product, made `q @ k.t()` 1.25× slower
/// on 2 Zen 4 cores, and at depth 128 (width-128 linear layers) it changed nothing.
const MIN_DEPTH_FOR_RHS_COPY: usize = 256;

/// f32 products, copying a unit-row-stride right operand row-major first where that is
/// faster (see the module docs). `after` and the result: as for [`run_then`].
///
/// # Safety
/// As for [`gemm_typed`].
unsafe fn f32_gemm(g: Gemm, par: gemm::Parallelism, after: After<'_>) -> Result<bool> {
    #[cfg(target_arch = "x86_64")]
    if let gemm::Parallelism::Rayon(threads) = par
        && g.o_rs == g.n as isize
        && let Some(isa) =
            super::blocked_gemm::route(g.m, g.n, g.k, threads, g.r_rs == 1 && g.n > 1)
    {
        let p = g.f32_product();
        // SAFETY: the caller's contract: operands in bounds for their strides, the m × n
        // output block this product's alone; `route` found the CPU has `isa` and the size
        // has no empty dimension.
        return unsafe { super::blocked_gemm::run(&p, threads, after, isa) };
    }
    let _ = after;
    if g.o_rs == g.n as isize && computes_transposed(&g) {
        // Cᵀ = Bᵀ·Aᵀ into scratch (n × m, row-major), then copied into place.
        let scratch = Scratch::new(g.m * g.n)?;
        let swapped = Gemm {
            out: scratch.arg(),
            oo: 0,
            o_rs: g.m as isize,
            lhs: g.rhs,
            lo: g.ro,
            l_rs: g.r_cs,
            l_cs: g.r_rs,
            rhs: g.lhs,
            ro: g.lo,
            r_rs: g.l_cs,
            r_cs: g.l_rs,
            m: g.n,
            n: g.m,
            k: g.k,
        };
        // SAFETY: the swapped operands are the caller's (in bounds for the swapped
        // strides: the same elements); the scratch holds its n × m output. `computes_
        // transposed` is false for the swapped product (its m is the larger), so this
        // recursion ends.
        unsafe { f32_gemm(swapped, par, After::Nothing)? };
        // SAFETY: the caller's contract: the m × n output block at `oo` is this product's
        // alone.
        let dst = unsafe { std::slice::from_raw_parts_mut(elem::<f32>(g.out, g.oo), g.m * g.n) };
        // SAFETY: the scratch holds Cᵀ row-major, i.e. C with row stride 1 and column
        // stride m, all m·n elements inside it.
        unsafe { widen_row_major::<f32>(scratch.arg(), 0, 1, g.m as isize, g.m, g.n, dst) };
        return Ok(false);
    }
    let column_major_rhs = g.r_rs == 1 && g.k > 1 && g.n > 1;
    if !(column_major_rhs
        && g.m >= MIN_ROWS_FOR_RHS_COPY
        && g.k >= MIN_DEPTH_FOR_RHS_COPY
        && gemm_uses_avx512())
    {
        // SAFETY: the caller's contract.
        unsafe { gemm_typed::<f32>(g, par) };
        return Ok(false);
    }
    let mut rhs = Scratch::new(g.k * g.n)?;
    // SAFETY: the right operand view is in bounds per the caller's contract.
    unsafe { widen_row_major::<f32>(g.rhs, g.ro, g.r_rs, g.r_cs, g.k, g.n, rhs.as_mut_slice()) };
    let copied = Gemm {
        rhs: rhs.arg(),
        ro: 0,
        r_rs: g.n as isize,
        r_cs: 1,
        ..g
    };
    // SAFETY: the scratch holds the k × n right operand row-major; the rest is the caller's.
    unsafe { gemm_typed::<f32>(copied, par) };
    Ok(false)
}

/// A float type the f32 kernels can read after widening.
trait Widen: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Widens a contiguous run (`src.len() == dst.len()`).
    fn widen(src: &[Self], dst: &mut [f32]);
}
impl Widen for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}
impl Widen for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}
impl Widen for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

/// A 16-bit float type whose products run through the f32 kernels.
trait HalfFloat: Widen {
    /// Rounds a contiguous run (`src.len() == dst.len()`).
    fn narrow(src: &[f32], dst: &mut [Self]);
}
impl HalfFloat for f16 {
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}
impl HalfFloat for bf16 {
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

/// Temporary f32 storage from the host caching allocator: a repeated product gets the same
/// block back instead of faulting in fresh pages on every call.
pub(super) struct Scratch {
    buf: Buffer,
    len: usize,
}

impl Scratch {
    pub(super) fn new(len: usize) -> Result<Self> {
        let buf = memory::alloc_host(len * std::mem::size_of::<f32>())?;
        Ok(Self { buf, len })
    }

    /// The `len` f32s, read-only.
    pub(super) fn as_slice(&self) -> &[f32] {
        // SAFETY: as for `as_mut_slice`; `&self` allows no writer through this value.
        unsafe { std::slice::from_raw_parts(self.buf.host_ptr().cast::<f32>(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: the block holds at least `len` f32s, is 64-byte aligned and initialized
        // (the allocator zeroes fresh memory), and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.buf.host_ptr().cast::<f32>(), self.len) }
    }

    pub(super) fn arg(&self) -> ArgPtr {
        ArgPtr {
            ptr: self.buf.host_ptr(),
        }
    }
}

/// Elements converted per rayon task, at least.
const CONVERT_GRAIN: usize = 1 << 14;

/// Side of the square tiles [`widen_row_major`] transposes through.
const TILE: usize = 16;

/// The address of element `i` of the buffer behind `p`.
fn elem<T>(p: ArgPtr, i: isize) -> *mut T {
    (p.ptr as *mut T).wrapping_offset(i)
}

/// Writes the `rows × cols` operand at element `off` of `p` with strides `(rs, cs)` into
/// `dst` as a row-major f32 matrix. Rows whose elements are the nearer in memory are copied
/// run by run; otherwise 16×16 tiles go through a local buffer, so both the reads (16
/// elements along a column) and the writes (16 along a row) use whole cache lines however
/// the row stride aliases in the cache.
///
/// # Safety
/// Every element the view describes lies inside `p`'s buffer; `dst.len() == rows * cols`.
unsafe fn widen_row_major<S: Widen>(
    p: ArgPtr,
    off: isize,
    rs: isize,
    cs: isize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
) {
    debug_assert_eq!(dst.len(), rows * cols);
    if rows == 0 || cols == 0 {
        return;
    }
    if cs.unsigned_abs() <= rs.unsigned_abs() || rows == 1 {
        // SAFETY: the caller's contract; lines are rows.
        unsafe { widen_lines::<S>(p, off, rs, cs, cols, dst) };
        return;
    }
    let tiles_per_task = (CONVERT_GRAIN / (TILE * cols)).max(1);
    dst.par_chunks_mut(TILE * cols)
        .with_min_len(tiles_per_task)
        .enumerate()
        .for_each(|(t, block)| {
            let r0 = t * TILE;
            let rh = block.len() / cols;
            let mut tile = [[0f32; TILE]; TILE];
            let hints = super::prefetch::enabled();
            for c0 in (0..cols).step_by(TILE) {
                let ch = TILE.min(cols - c0);
                for (c, column) in tile.iter_mut().enumerate().take(ch) {
                    let first = off + r0 as isize * rs + (c0 + c) as isize * cs;
                    // Hints for the next tile: this column's segment there (in another page,
                    // out of the hardware prefetchers' reach) and one output row's next
                    // segment. Hints never fault, wherever the addresses fall.
                    if hints {
                        let next = elem::<S>(p, first + (TILE as isize) * cs) as usize;
                        let bytes = (rh as isize * rs).unsigned_abs() * size_of::<S>();
                        super::prefetch::hint_range(next, bytes, false);
                        let row = c.min(rh - 1) * cols;
                        let at = block[row..].as_ptr() as usize + (c0 + TILE) * 4;
                        super::prefetch::hint_range(at, 1, true);
                    }
                    for (r, x) in column.iter_mut().enumerate().take(rh) {
                        // SAFETY: element (r0 + r, c0 + c) of the view: in bounds.
                        *x = unsafe { *elem::<S>(p, first + r as isize * rs) }.to_f32();
                    }
                }
                for r in 0..rh {
                    let row = &mut block[r * cols + c0..r * cols + c0 + ch];
                    for (c, d) in row.iter_mut().enumerate() {
                        *d = tile[c][r];
                    }
                }
            }
        });
}

/// Widens the operand at element `off` of `p` line by line into `dst`, whose lines are
/// `len` long: line `l` starts at `off + l·line_stride` and steps by `step`.
///
/// # Safety
/// Every element described lies inside `p`'s buffer; `dst.len()` is a multiple of `len`.
unsafe fn widen_lines<S: Widen>(
    p: ArgPtr,
    off: isize,
    line_stride: isize,
    step: isize,
    len: usize,
    dst: &mut [f32],
) {
    let Some(per_task) = CONVERT_GRAIN.checked_div(len) else {
        return;
    };
    dst.par_chunks_mut(len)
        .with_min_len(per_task.max(1))
        .enumerate()
        .for_each(|(l, line)| {
            let start = off + l as isize * line_stride;
            if step == 1 {
                // SAFETY: the line's `len` elements are consecutive and in bounds.
                let src = unsafe { std::slice::from_raw_parts(elem::<S>(p, start), len) };
                S::widen(src, line);
            } else {
                for (i, d) in line.iter_mut().enumerate() {
                    // SAFETY: in bounds per the caller's contract.
                    *d = unsafe { *elem::<S>(p, start + i as isize * step) }.to_f32();
                }
            }
        });
}

/// f16 and bf16 products: both operands are widened to f32 scratch in parallel — the left
/// one in its own major order (so a transposed view is read along memory), the right one
/// row-major (see the module docs) — multiplied by the f32 kernels, and the result is
/// rounded back once.
///
/// # Safety
/// As for [`gemm_typed`].
unsafe fn half_gemm<H: HalfFloat>(g: Gemm, par: gemm::Parallelism) -> Result<()> {
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let mut a = Scratch::new(m * k)?;
    let mut b = Scratch::new(k * n)?;
    let mut c = Scratch::new(m * n)?;
    let (l_rs, l_cs) = if g.l_cs.unsigned_abs() > g.l_rs.unsigned_abs() {
        // Column-major: lines are columns.
        // SAFETY: the left operand view is in bounds per the caller's contract.
        unsafe { widen_lines::<H>(g.lhs, g.lo, g.l_cs, g.l_rs, m, a.as_mut_slice()) };
        (1, m as isize)
    } else {
        // SAFETY: as above.
        unsafe { widen_lines::<H>(g.lhs, g.lo, g.l_rs, g.l_cs, k, a.as_mut_slice()) };
        (k as isize, 1)
    };
    // SAFETY: the right operand view is in bounds per the caller's contract.
    unsafe { widen_row_major::<H>(g.rhs, g.ro, g.r_rs, g.r_cs, k, n, b.as_mut_slice()) };
    let widened = Gemm {
        out: c.arg(),
        oo: 0,
        o_rs: n as isize,
        lhs: a.arg(),
        lo: 0,
        l_rs,
        l_cs,
        rhs: b.arg(),
        ro: 0,
        r_rs: n as isize,
        r_cs: 1,
        m,
        n,
        k,
    };
    // SAFETY: the three scratch blocks have exactly the sizes and layouts `widened`
    // describes, and `c` is aliased by nothing else.
    unsafe { gemm_typed::<f32>(widened, par) };
    let (out, oo, o_rs) = (g.out, g.oo, g.o_rs);
    c.as_mut_slice()
        .par_chunks(n)
        .enumerate()
        .with_min_len((CONVERT_GRAIN / n).max(1))
        .for_each(|(i, s)| {
            // SAFETY: row `i` of the output (n elements at `oo + i·o_rs`) is in bounds and
            // written only here (the caller's contract).
            let d = unsafe {
                std::slice::from_raw_parts_mut(elem::<H>(out, oo + i as isize * o_rs), n)
            };
            H::narrow(s, d)
        });
    Ok(())
}

trait IntScalar: Copy + Send + Sync + 'static {
    fn zero() -> Self;
    fn mul_add(acc: Self, a: Self, b: Self) -> Self;
}
macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl IntScalar for $t {
            fn zero() -> Self { 0 }
            fn mul_add(acc: Self, a: Self, b: Self) -> Self { acc.wrapping_add(a.wrapping_mul(b)) }
        }
    )*};
}
int_scalar!(i32, i64, u8);

/// # Safety
/// As for [`gemm_typed`].
unsafe fn int_gemm<T: IntScalar>(g: Gemm) {
    let Gemm {
        out,
        oo,
        o_rs,
        lhs,
        lo,
        l_rs,
        l_cs,
        rhs,
        ro,
        r_rs,
        r_cs,
        m,
        n,
        k,
    } = g;
    let (a, b) = (lhs.ptr as *const T, rhs.ptr as *const T);
    for i in 0..m {
        // SAFETY: row `i` of the output is in bounds and written only here.
        let dst = unsafe {
            std::slice::from_raw_parts_mut((out.ptr as *mut T).offset(oo + i as isize * o_rs), n)
        };
        for (j, d) in dst.iter_mut().enumerate() {
            let mut acc = T::zero();
            for p in 0..k {
                // SAFETY: in bounds per the caller's contract.
                let (x, y) = unsafe {
                    (
                        *a.offset(lo + i as isize * l_rs + p as isize * l_cs),
                        *b.offset(ro + p as isize * r_rs + j as isize * r_cs),
                    )
                };
                acc = T::mul_add(acc, x, y);
            }
            *d = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ArgPtr, Gemm, computes_transposed};
    use crate::{DType, Tensor};

    /// Largest |half product − f32 product rounded to the half type|, over the largest
    /// |f32 product|.
    fn half_vs_f32(a: &Tensor, b: &Tensor, dtype: DType) -> f32 {
        let got = a.matmul(b).cast(DType::F32).to_vec::<f32>().unwrap();
        let want = a
            .cast(DType::F32)
            .matmul(&b.cast(DType::F32))
            .cast(dtype)
            .cast(DType::F32)
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        worst / scale
    }

    #[test]
    fn half_products_match_the_rounded_f32_product_for_every_layout() {
        for (dtype, ulp) in [(DType::F16, 2f32.powi(-10)), (DType::BF16, 2f32.powi(-7))] {
            let a = Tensor::try_randn([37, 53], 1, dtype).unwrap();
            let b = Tensor::try_randn([53, 29], 2, dtype).unwrap();
            let at = Tensor::try_randn([53, 37], 3, dtype).unwrap();
            let bt = Tensor::try_randn([29, 53], 4, dtype).unwrap();
            let wide = Tensor::try_randn([37, 106], 5, dtype).unwrap();
            let batch = Tensor::try_randn([3, 37, 53], 6, dtype).unwrap();
            // Realized first, so the products read them through strided views.
            for t in [&a, &b, &at, &bt, &wide, &batch] {
                t.realize().unwrap();
            }
            let cases: [(&str, Tensor, Tensor); 6] = [
                ("a@b", a.clone(), b.clone()),
                ("a.t()@b", at.t(), b.clone()),
                ("a@b.t()", a.clone(), bt.t()),
                ("a.t()@b.t()", at.t(), bt.t()),
                (
                    "a[:, ::2]@flip(b)",
                    wide.slice(&[(0, 37, 1), (0, 106, 2)]),
                    b.flip([0]),
                ),
                ("batched", batch, b.clone()),
            ];
            for (name, x, y) in cases {
                let err = half_vs_f32(&x, &y, dtype);
                // Both sides round the same f32 sums; only the f32 summation order may
                // differ between layouts, which moves a result by at most one half ulp.
                assert!(err <= ulp, "{dtype:?} {name}: error {err:e} > {ulp:e}");
            }
        }
    }

    /// Largest |f32 product − f64 product| over the largest |f64 product|.
    fn f32_vs_f64(a: &Tensor, b: &Tensor) -> f64 {
        let got = a.matmul(b).to_vec::<f32>().unwrap();
        let want = a
            .cast(DType::F64)
            .matmul(&b.cast(DType::F64))
            .to_vec::<f64>()
            .unwrap();
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f64, |m, (g, w)| m.max((*g as f64 - w).abs()));
        worst / scale
    }

    /// Right operands with unit row stride, which take the row-major copy on AVX-512 CPUs
    /// (at least 16 output rows and depth 256; sizes that leave partial 16×16 tiles).
    #[test]
    fn f32_products_with_column_major_right_operands() {
        for depth in [53, 300] {
            f32_products_with_column_major_right_operands_of_depth(depth);
        }
    }

    fn f32_products_with_column_major_right_operands_of_depth(d: usize) {
        let a = Tensor::randn_seeded([37, d], 1);
        let at = Tensor::randn_seeded([d, 37], 2);
        let bt = Tensor::randn_seeded([29, d], 3);
        let wide = Tensor::randn_seeded([58, d], 4);
        let batch = Tensor::randn_seeded([3, 37, d], 5);
        let btt = Tensor::randn_seeded([3, 29, d], 6);
        for t in [&a, &at, &bt, &wide, &batch, &btt] {
            t.realize().unwrap();
        }
        let cases: [(&str, Tensor, Tensor); 6] = [
            ("a@b.t()", a.clone(), bt.t()),
            ("a.t()@b.t()", at.t(), bt.t()),
            (
                "a@wide.t()[:, ::2]",
                a.clone(),
                wide.t().slice(&[(0, d as isize, 1), (0, 58, 2)]),
            ),
            ("a@flip(b.t())", a.clone(), bt.t().flip([1])),
            ("batch@b.t()", batch.clone(), bt.t()),
            ("batch@batch.t()", batch, btt.transpose(1, 2)),
        ];
        for (name, x, y) in cases {
            let err = f32_vs_f64(&x, &y);
            assert!(err <= 1e-5, "{name} (depth {d}): error {err:e}");
        }
    }

    /// Weight-gradient shapes (`xᵀ·g`: a column-major left operand, few rows, long depth),
    /// which are computed transposed and copied into place, against f64; with a batch, a
    /// column-major right operand and a stepped right operand as well.
    #[test]
    fn f32_products_computed_transposed() {
        for (m, n, k) in [(16, 32, 128), (32, 48, 512), (16, 48, 300)] {
            let xt = Tensor::randn_seeded([k, m], 1);
            let g = Tensor::randn_seeded([k, n], 2);
            let gt = Tensor::randn_seeded([n, k], 3);
            let g2 = Tensor::randn_seeded([k, 2 * n], 4);
            let bx = Tensor::randn_seeded([2, k, m], 5);
            let bg = Tensor::randn_seeded([2, k, n], 6);
            for t in [&xt, &g, &gt, &g2, &bx, &bg] {
                t.realize().unwrap();
            }
            let a = xt.t();
            assert!(
                computes_transposed(&Gemm {
                    out: ArgPtr {
                        ptr: std::ptr::null_mut()
                    },
                    oo: 0,
                    o_rs: n as isize,
                    lhs: ArgPtr {
                        ptr: std::ptr::null_mut()
                    },
                    lo: 0,
                    l_rs: 1,
                    l_cs: m as isize,
                    rhs: ArgPtr {
                        ptr: std::ptr::null_mut()
                    },
                    ro: 0,
                    r_rs: n as isize,
                    r_cs: 1,
                    m,
                    n,
                    k,
                }),
                "({m}, {n}, {k}) should take the transposed route"
            );
            let cases: [(&str, Tensor, Tensor); 4] = [
                ("x.t()@g", a.clone(), g.clone()),
                ("x.t()@g.t()", a.clone(), gt.t()),
                (
                    "x.t()@g2[:, ::2]",
                    a.clone(),
                    g2.slice(&[(0, k as isize, 1), (0, 2 * n as isize, 2)]),
                ),
                ("bx.mT@bg", bx.transpose(1, 2), bg),
            ];
            for (name, x, y) in cases {
                let err = f32_vs_f64(&x, &y);
                assert!(err <= 1e-5, "{name} ({m}, {n}, {k}): error {err:e}");
            }
        }
    }

    #[test]
    fn empty_and_zero_depth_half_products() {
        for dtype in [DType::F16, DType::BF16] {
            let a = Tensor::zeros_dtype([4, 0], dtype);
            let b = Tensor::zeros_dtype([0, 3], dtype);
            let c = a.matmul(&b).cast(DType::F32).to_vec::<f32>().unwrap();
            assert_eq!(c, vec![0.0; 12]);
            let e = Tensor::zeros_dtype([0, 5], dtype).matmul(&Tensor::zeros_dtype([5, 3], dtype));
            assert!(e.cast(DType::F32).to_vec::<f32>().unwrap().is_empty());
        }
    }
}
