//! Small f32 products with a register-blocked AVX-512 or AVX2 kernel: the batched products of
//! attention (per head `64×32 · 32×64` and `64×64 · 64×32`), where the `gemm` crate's
//! per-call setup (packing both operands, picking blocking) costs as much as the
//! arithmetic. Measured on 2 Zen 4 cores (AMD EPYC, AVX-512), the six products of an
//! attention step and its backward, 128 per call, side by side in one process: `gemm`
//! 127–178 GFLOP/s, this kernel 168–197 GFLOP/s (0.75–0.9× the time).
//!
//! The kernel keeps a block of `MR` output rows × `16·NV` columns (`NV ≤ 4` vectors, a
//! panel of at most 64 columns; wider products, up to 256 columns, run panel after panel)
//! in registers for the whole depth: per depth step it loads `NV` vectors of the
//! right operand's row and broadcasts `MR` elements of the left operand, `MR·NV` FMAs. The
//! right operand is read in place when its rows are contiguous and `n` is a multiple of 16;
//! otherwise it is first copied row-major (zero-padded to whole vectors) into a per-thread
//! buffer. The left operand is read through its strides as it is (one broadcast per
//! element). Products sum over the depth in order, one FMA per term, like `gemm`'s
//! kernels, so results agree with them to rounding.
//!
//! Without AVX-512 the AVX2 kernel keeps `MR ≤ 6` rows × 16 columns (two 8-lane vectors, 12
//! accumulators) and walks the columns 16 at a time. Measured on 2 AMD EPYC Zen 3 cores
//! (AVX2), 128 heads per call, medians of 41 alternating runs, three runs: `q @ kᵀ`
//! (`64×32·32×64`) 0.79–0.86× `gemm`'s time, `att @ v` (`64×64·64×32`) 0.84–0.94×,
//! `attᵀ @ q` 0.81–0.88×.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The largest `n` (output columns) the kernel handles: four panels of four 16-lane
/// vectors with AVX-512, 16 column blocks with AVX2. Measured on the Intel Xeon test
/// machine (AVX-512, 2 cores), alternating binaries: an LSTM's 255 per-step gate products
/// (`16×64 · 64×256` plus the input projection's slice) 3.1–3.5 ms through `gemm`, 2.8 ms
/// here; 64 batched `16×64 · 64×256` 1.2× faster with the right operand transposed, as
/// fast plain; 16 batched `256×64 · 64×256` within 3%.
const MAX_N: usize = 256;
/// Columns of one AVX-512 panel: four 16-lane vectors, summed over the whole depth in
/// registers.
const PANEL: usize = 64;
/// The largest `m` and `k` it is used for (the right operand copy then fits in L2).
const MAX_MK: usize = 256;

/// One product `out = lhs @ rhs` with `out`'s rows `o_rs` elements apart (`n`: row-major)
/// and its columns adjacent, operands read through element strides. Pointers are to the
/// first element of each matrix.
#[derive(Clone, Copy)]
pub(super) struct SmallProduct {
    pub out: *mut f32,
    pub o_rs: isize,
    pub lhs: *const f32,
    pub l_rs: isize,
    pub l_cs: isize,
    pub rhs: *const f32,
    pub r_rs: isize,
    pub r_cs: isize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Whether a product of this size runs through [`run`] on this machine: AVX-512 or AVX2
/// in use (not with `KILN_NO_SIMD`), `1 ≤ n, m, k ≤ 256`.
pub(super) fn applies(m: usize, n: usize, k: usize) -> bool {
    (1..=MAX_N).contains(&n)
        && (1..=MAX_MK).contains(&m)
        && (1..=MAX_MK).contains(&k)
        && isa().is_some()
}

/// The instruction set the product kernels (these and `blocked_gemm`'s) run with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Isa {
    /// 512-bit registers: 16 f32 lanes, 32 registers.
    Avx512,
    /// 256-bit registers with FMA: 8 f32 lanes, 16 registers.
    Avx2,
}

/// The kernels this CPU runs, as the CPU backend's loops do (`KILN_NO_SIMD` turns both off).
pub(super) fn isa() -> Option<Isa> {
    match super::exec::simd_level() {
        "avx512" => Some(Isa::Avx512),
        "avx2" => Some(Isa::Avx2),
        _ => None,
    }
}

/// Lines hinted for the next product at most (a 256 × 256 operand pair needs more; the
/// rest go unhinted).
const MAX_HINTS: usize = 1024;

thread_local! {
    /// The cache lines of the next product's operands, one per thread.
    static NEXT_LINES: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Row-major copies of right operands (at most `256 × 256` f32, 256 KiB), one per thread.
    static PACKED_RHS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Computes `p.out = p.lhs @ p.rhs`.
///
/// # Safety
/// [`applies`] holds for `(p.m, p.n, p.k)`; every element `lhs + i·l_rs + j·l_cs`
/// (`i < m`, `j < k`) and `rhs + i·r_rs + j·r_cs` (`i < k`, `j < n`) is readable; the `n`
/// elements from `out + i·o_rs` (`i < m`) are writable and overlap neither operand.
///
/// `next` is the product this thread runs after this one (the next head of a batched
/// product), if any: the kernel hints its operands' cache lines into L2, one per depth
/// step, so they arrive while this product computes. Attention's per-head operands are
/// views into `qkv` (rows 128 bytes long, 1.5 KiB apart) that the hardware prefetchers do
/// not follow, and in a training step they come from memory. Hints never fault: `next`'s
/// pointers need not be valid.
pub(super) unsafe fn run(p: &SmallProduct, next: Option<&SmallProduct>) {
    match isa() {
        // SAFETY: the caller's contract; the CPU has `isa`.
        Some(isa) => unsafe { run_on(p, next, isa) },
        None => unreachable!("small_gemm::applies is false without AVX-512 or AVX2"),
    }
}

/// [`run`] with the kernel for `isa`.
///
/// # Safety
/// As for [`run`], except that the CPU must have `isa` (whatever the backend's SIMD level).
unsafe fn run_on(p: &SmallProduct, next: Option<&SmallProduct>, isa: Isa) {
    let wide = isa == Isa::Avx512;
    #[cfg(target_arch = "x86_64")]
    NEXT_LINES.with(|cell| {
        let mut lines = cell.borrow_mut();
        lines.clear();
        if let Some(q) = next {
            operand_lines(q, &mut lines);
        }
        let mut hints = lines.iter();
        let direct = p.r_cs == 1 && p.n.is_multiple_of(16);
        if direct {
            // SAFETY: the caller's contract.
            unsafe { blocks(p, p.rhs, p.r_rs, &mut hints, wide) };
            return;
        }
        let np = p.n.div_ceil(16) * 16;
        PACKED_RHS.with(|cell| {
            let mut cell = cell.borrow_mut();
            // Aligned, so each vector load of a packed row reads one cache line.
            let buf = super::register::aligned_f32(&mut cell, p.k * np);
            buf.fill(0.0);
            // SAFETY: the caller's contract (the operand is readable, the CPU features
            // `wide` names available); `buf` is k × np.
            unsafe { pack_rhs(p, buf, np, wide) };
            // SAFETY: `buf` holds the k × np row-major copy (padding columns are zero);
            // the rest is the caller's contract.
            unsafe { blocks(p, buf.as_ptr(), np as isize, &mut hints, wide) };
        });
    });
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (p, next, isa);
        unreachable!("small_gemm::applies is false off x86-64");
    }
}

/// Pushes the cache lines of `p`'s two operands onto `lines` (up to [`MAX_HINTS`]): each
/// operand as the strips of consecutive elements its unit stride gives (rows when its
/// columns are adjacent, columns when its rows are); an operand with neither stride 1
/// adds nothing.
pub(super) fn operand_lines(p: &SmallProduct, lines: &mut Vec<usize>) {
    strip_lines(p.lhs, p.l_rs, p.l_cs, p.m, p.k, lines);
    strip_lines(p.rhs, p.r_rs, p.r_cs, p.k, p.n, lines);
}

/// [`operand_lines`] for one `rows × cols` operand at `at` with element strides `rs`, `cs`.
fn strip_lines(
    at: *const f32,
    rs: isize,
    cs: isize,
    rows: usize,
    cols: usize,
    lines: &mut Vec<usize>,
) {
    use super::prefetch::LINE;
    let (step, strips, len) = if cs == 1 {
        (rs, rows, cols)
    } else if rs == 1 {
        (cs, cols, rows)
    } else {
        return;
    };
    for s in 0..strips {
        let start = at.wrapping_offset(s as isize * step) as usize;
        let end = start.wrapping_add(len * std::mem::size_of::<f32>());
        let mut line = start & !(LINE - 1);
        while line < end {
            if lines.len() >= MAX_HINTS {
                return;
            }
            lines.push(line);
            line += LINE;
        }
    }
}

/// Copies the right operand row-major into `buf` (`k × np`, the padding columns left as
/// they are). Whole tiles of an operand with unit row stride (`x @ w.t()`, `q @ kᵀ`) are
/// read as contiguous column runs and transposed in registers (16 × 16 with AVX-512,
/// `wide`; 8 × 8 with AVX2); every other element is copied on its own.
///
/// # Safety
/// As for [`run`] (the right operand is readable); AVX-512F available if `wide`, AVX2
/// otherwise; `buf.len() == p.k · np`, `np ≥ p.n`.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_rhs(p: &SmallProduct, buf: &mut [f32], np: usize, wide: bool) {
    let t = if wide { 16 } else { 8 };
    let (n_tiled, k_tiled) = if p.r_rs == 1 {
        (p.n / t * t, p.k / t * t)
    } else {
        (0, 0)
    };
    for j0 in (0..n_tiled).step_by(t) {
        for i0 in (0..k_tiled).step_by(t) {
            let src = p.rhs.wrapping_offset(j0 as isize * p.r_cs + i0 as isize);
            let dst = buf[(i0 * np + j0)..].as_mut_ptr();
            // SAFETY: elements (i0..i0 + t, j0..j0 + t) are inside `k × n`, each column's
            // `t` contiguous (row stride 1); `dst` starts `t` rows of `np ≥ j0 + t`
            // columns inside `buf`; the caller's CPU features.
            unsafe {
                if wide {
                    transpose_block16(src, p.r_cs, dst, np);
                } else {
                    transpose_block8(src, p.r_cs, dst, np);
                }
            }
        }
    }
    for (i, row) in buf.chunks_exact_mut(np).enumerate() {
        let from = if i < k_tiled { n_tiled } else { 0 };
        let src = p.rhs.wrapping_offset(i as isize * p.r_rs);
        for (j, x) in row.iter_mut().enumerate().take(p.n).skip(from) {
            // SAFETY: `i < k`, `j < n`: readable per the caller's contract.
            *x = unsafe { *src.offset(j as isize * p.r_cs) };
        }
    }
}

/// Writes the transpose of the 16 × 16 block whose column `c` is the 16 contiguous f32s at
/// `src + c·stride` into 16 rows from `dst`, `ld` apart.
///
/// # Safety
/// AVX-512F is available; those 256 source f32s are readable and the 16 × 16 destination
/// f32s writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose_block16(src: *const f32, stride: isize, dst: *mut f32, ld: usize) {
    let mut v = [_mm512_setzero_ps(); 16];
    for (c, x) in v.iter_mut().enumerate() {
        // SAFETY: column c's 16 f32s are readable (the caller's contract).
        *x = unsafe { _mm512_loadu_ps(src.wrapping_offset(c as isize * stride)) };
    }
    for (r, x) in transpose16(v).iter().enumerate() {
        // SAFETY: destination row r's 16 f32s are writable (the caller's contract).
        unsafe { _mm512_storeu_ps(dst.add(r * ld), *x) };
    }
}

/// [`transpose_block16`] for an 8 × 8 block, with AVX2: pairs of columns interleaved, then
/// pairs of pairs, then the 128-bit halves exchanged.
///
/// # Safety
/// AVX2 is available; the 64 source f32s are readable and the 8 × 8 destination f32s
/// writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_block8(src: *const f32, stride: isize, dst: *mut f32, ld: usize) {
    let mut v = [_mm256_setzero_ps(); 8];
    for (c, x) in v.iter_mut().enumerate() {
        // SAFETY: column c's 8 f32s are readable (the caller's contract).
        *x = unsafe { _mm256_loadu_ps(src.wrapping_offset(c as isize * stride)) };
    }
    // t[2i] / t[2i+1]: columns 2i and 2i+1 interleaved (low / high pairs of each half).
    let mut t = [_mm256_setzero_ps(); 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    // u[4g + r]: rows r (low half) and r + 4 (high half), columns 4g..4g + 4.
    let mut u = [_mm256_setzero_ps(); 8];
    for g in 0..2 {
        let (a0, a1) = (_mm256_castps_pd(t[4 * g]), _mm256_castps_pd(t[4 * g + 2]));
        let (b0, b1) = (
            _mm256_castps_pd(t[4 * g + 1]),
            _mm256_castps_pd(t[4 * g + 3]),
        );
        u[4 * g] = _mm256_castpd_ps(_mm256_unpacklo_pd(a0, a1));
        u[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a0, a1));
        u[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(b0, b1));
        u[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(b0, b1));
    }
    for r in 0..4 {
        let lo = _mm256_permute2f128_ps::<0x20>(u[r], u[4 + r]);
        let hi = _mm256_permute2f128_ps::<0x31>(u[r], u[4 + r]);
        // SAFETY: destination rows r and r + 4, 8 f32s each, are writable.
        unsafe {
            _mm256_storeu_ps(dst.add(r * ld), lo);
            _mm256_storeu_ps(dst.add((r + 4) * ld), hi);
        }
    }
}

/// The 16×16 transpose of `x` (vector `c`, lane `r` → vector `r`, lane `c`): 32-bit then
/// 64-bit interleaves within 128-bit lanes, then two rounds of 128-bit lane shuffles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) fn transpose16(x: [__m512; 16]) -> [__m512; 16] {
    // t[2i] / t[2i+1]: vectors 2i and 2i+1 interleaved (low / high pairs of each lane).
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
    }
    // u[4g + c]: lane L holds lane `4L + c` of vectors 4g..4g + 4.
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (a0, a1) = (_mm512_castps_pd(t[4 * g]), _mm512_castps_pd(t[4 * g + 2]));
        let (b0, b1) = (
            _mm512_castps_pd(t[4 * g + 1]),
            _mm512_castps_pd(t[4 * g + 3]),
        );
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a1));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a1));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b0, b1));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b0, b1));
    }
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        // 0x88 takes 128-bit lanes 0, 2 of each operand; 0xDD lanes 1, 3.
        let v0 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let v1 = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
        let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let v3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
        out[8 + c] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
    }
    out
}

/// Runs the row blocks of `p` with the right operand at `rhs`, rows `ld` apart and
/// readable for whole vectors up to `16·ceil(n/16)` columns.
///
/// # Safety
/// As for [`run_on`], with `rhs`/`ld` describing such a right operand.
#[cfg(target_arch = "x86_64")]
unsafe fn blocks(p: &SmallProduct, rhs: *const f32, ld: isize, hints: &mut Hints<'_>, wide: bool) {
    if !wide {
        // SAFETY: the caller's contract (not `wide`: AVX2 and FMA).
        unsafe { blocks_avx2(p, rhs, ld, hints) };
        return;
    }
    // Panels of at most 64 columns, each its own product over the same rows: the output
    // and `rhs` shifted by the panel's first column, `n` cut to its width (the kernels
    // read the right operand through `rhs` and `ld` only).
    for j0 in (0..p.n).step_by(PANEL) {
        let q = SmallProduct {
            out: p.out.wrapping_add(j0),
            n: (p.n - j0).min(PANEL),
            ..*p
        };
        let rhs = rhs.wrapping_add(j0);
        // SAFETY (whole block): forwarded to kernels with the same contract for the panel
        // (its columns `j0..j0 + q.n` of the output are inside `p`'s, and `rhs`'s rows
        // are readable for whole vectors up to `16·ceil(p.n/16) ≥ j0 + 16·ceil(q.n/16)`,
        // since `j0` is a multiple of 16); each call covers rows `[i, i + MR)` with
        // `i + MR ≤ m`.
        unsafe {
            // Main blocks of `MR·NV ≤ 24` accumulators: with the `NV` right-operand vectors
            // and the broadcast they fit the 32 vector registers without spilling.
            match q.n.div_ceil(16) {
                1 => rows::<1, 16>(&q, rhs, ld, hints),
                2 => rows::<2, 12>(&q, rhs, ld, hints),
                3 => rows::<3, 8>(&q, rhs, ld, hints),
                _ => rows::<4, 6>(&q, rhs, ld, hints),
            }
        }
    }
}

/// Cache lines still to hint, one per depth step of the kernels (see [`run`]).
type Hints<'a> = std::slice::Iter<'a, usize>;

/// Splits the `m` rows into blocks of `MAIN`, then of 4, then at most one of 2 and one of 1.
///
/// # Safety
/// As for [`blocks`], with `NV = ceil(n / 16)`.
#[cfg(target_arch = "x86_64")]
unsafe fn rows<const NV: usize, const MAIN: usize>(
    p: &SmallProduct,
    rhs: *const f32,
    ld: isize,
    hints: &mut Hints<'_>,
) {
    let mut i = 0;
    // SAFETY (whole function): every call covers rows `[i, i + MR)` inside `[0, m)`.
    unsafe {
        while i + MAIN <= p.m {
            kernel::<MAIN, NV>(p, rhs, ld, i, hints);
            i += MAIN;
        }
        while i + 4 <= p.m {
            kernel::<4, NV>(p, rhs, ld, i, hints);
            i += 4;
        }
        if i + 2 <= p.m {
            kernel::<2, NV>(p, rhs, ld, i, hints);
            i += 2;
        }
        if i < p.m {
            kernel::<1, NV>(p, rhs, ld, i, hints);
        }
    }
}

/// Output rows `[i0, i0 + MR)`, all `n` columns, summed over the whole depth in registers.
///
/// # Safety
/// AVX-512F is available; rows `[i0, i0 + MR)` lie inside `[0, m)`; `NV = ceil(n / 16)`;
/// `rhs` rows `0..k`, `ld` apart, are readable for `16·NV` elements; the rest as for [`run`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel<const MR: usize, const NV: usize>(
    p: &SmallProduct,
    rhs: *const f32,
    ld: isize,
    i0: usize,
    hints: &mut Hints<'_>,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    let mut a_row = [std::ptr::null::<f32>(); MR];
    for (r, a) in a_row.iter_mut().enumerate() {
        *a = p.lhs.wrapping_offset((i0 + r) as isize * p.l_rs);
    }
    for kk in 0..p.k {
        if let Some(&line) = hints.next() {
            super::prefetch::hint(line, false);
        }
        let kk = kk as isize;
        let mut b = [_mm512_setzero_ps(); NV];
        for (v, bv) in b.iter_mut().enumerate() {
            // SAFETY: row `kk < k` of the right operand, elements `16v..16v+16` with
            // `v < NV`: readable per the contract.
            *bv = unsafe { _mm512_loadu_ps(rhs.offset(kk * ld + 16 * v as isize)) };
        }
        for r in 0..MR {
            // SAFETY: element (i0 + r, kk) of the left operand, inside `m × k`.
            let a = _mm512_set1_ps(unsafe { *a_row[r].offset(kk * p.l_cs) });
            for v in 0..NV {
                acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
            }
        }
    }
    let tail = p.n - 16 * (NV - 1);
    let mask: __mmask16 = if tail >= 16 {
        0xFFFF
    } else {
        (1u16 << tail) - 1
    };
    for (r, row) in acc.iter().enumerate() {
        let out = p.out.wrapping_offset((i0 + r) as isize * p.o_rs);
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: row `i0 + r < m` of the output, columns `16v..` of which only the `n`
            // that exist are written (the mask covers the last vector).
            unsafe {
                if v + 1 < NV {
                    _mm512_storeu_ps(out.add(16 * v), x);
                } else {
                    _mm512_mask_storeu_ps(out.add(16 * v), mask, x);
                }
            }
        }
    }
}

/// [`blocks`] with AVX2: 16 columns (two vectors) at a time, their rows in blocks of 6
/// (12 accumulators, two right-operand vectors and the broadcast: 15 of the 16 vector
/// registers), then 4, then at most one of 2 and one of 1.
///
/// # Safety
/// As for [`blocks`], with AVX2 and FMA available.
#[cfg(target_arch = "x86_64")]
unsafe fn blocks_avx2(p: &SmallProduct, rhs: *const f32, ld: isize, hints: &mut Hints<'_>) {
    for j0 in (0..p.n).step_by(16) {
        let mut i = 0;
        // SAFETY: every call covers rows `[i, i + MR)` inside `[0, m)` and columns from
        // `j0 < n`; the rest is the caller's contract.
        unsafe {
            while i + 6 <= p.m {
                kernel_avx2::<6>(p, rhs, ld, i, j0, hints);
                i += 6;
            }
            while i + 4 <= p.m {
                kernel_avx2::<4>(p, rhs, ld, i, j0, hints);
                i += 4;
            }
            if i + 2 <= p.m {
                kernel_avx2::<2>(p, rhs, ld, i, j0, hints);
                i += 2;
            }
            if i < p.m {
                kernel_avx2::<1>(p, rhs, ld, i, j0, hints);
            }
        }
    }
}

/// Output rows `[i0, i0 + MR)`, columns `[j0, j0 + 16)` (those below `n`), summed over the
/// whole depth in registers.
///
/// # Safety
/// AVX2 and FMA are available; rows `[i0, i0 + MR)` lie inside `[0, m)`, `j0 < n`; `rhs`
/// rows `0..k`, `ld` apart, are readable for `16·ceil(n/16)` elements; the rest as for
/// [`run`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2<const MR: usize>(
    p: &SmallProduct,
    rhs: *const f32,
    ld: isize,
    i0: usize,
    j0: usize,
    hints: &mut Hints<'_>,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    let mut a_row = [std::ptr::null::<f32>(); MR];
    for (r, a) in a_row.iter_mut().enumerate() {
        *a = p.lhs.wrapping_offset((i0 + r) as isize * p.l_rs);
    }
    let rhs = rhs.wrapping_add(j0);
    for kk in 0..p.k {
        if let Some(&line) = hints.next() {
            super::prefetch::hint(line, false);
        }
        let kk = kk as isize;
        // SAFETY: row `kk < k` of the right operand, elements `j0..j0 + 16` with `j0 + 16 ≤
        // 16·ceil(n/16)`: readable per the contract.
        let b = unsafe {
            let row = rhs.offset(kk * ld);
            [_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8))]
        };
        for r in 0..MR {
            // SAFETY: element (i0 + r, kk) of the left operand, inside `m × k`.
            let a = _mm256_set1_ps(unsafe { *a_row[r].offset(kk * p.l_cs) });
            for v in 0..2 {
                acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
            }
        }
    }
    let left = p.n - j0;
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let masks = [left.min(8), left.saturating_sub(8).min(8)]
        .map(|l| _mm256_cmpgt_epi32(_mm256_set1_epi32(l as i32), lanes));
    for (r, row) in acc.iter().enumerate() {
        let out = p
            .out
            .wrapping_offset((i0 + r) as isize * p.o_rs)
            .wrapping_add(j0);
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: row `i0 + r < m` of the output, columns `j0 + 8v..` of which only
            // those below `n` are written (all lanes when 16 remain, else through the mask,
            // which touches no other lane; the address is computed wrapping).
            unsafe {
                if left >= 16 {
                    _mm256_storeu_ps(out.wrapping_add(8 * v), x);
                } else {
                    _mm256_maskstore_ps(out.wrapping_add(8 * v), masks[v], x);
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Runs `m×k · k×n` through `run` with the operands stored transposed or not (rows
    /// padded by `pad` elements, so strides are uneven) and filled with a deterministic
    /// pattern, and compares every element with an f64 sum: within the standard bound for a
    /// sum of `k` products in f32, γ_k·Σ|a·b|, and nothing written past the output.
    pub(in crate::backend::cpu) fn check_product(
        (m, n, k): (usize, usize, usize),
        lhs_t: bool,
        rhs_t: bool,
        pad: usize,
        run: impl FnOnce(&SmallProduct),
    ) {
        let (l_rs, l_cs) = if lhs_t {
            (1, (m + pad) as isize)
        } else {
            ((k + pad) as isize, 1)
        };
        let (r_rs, r_cs) = if rhs_t {
            (1, (k + pad) as isize)
        } else {
            ((n + pad) as isize, 1)
        };
        let lhs_len = if lhs_t { k * (m + pad) } else { m * (k + pad) };
        let rhs_len = if rhs_t { n * (k + pad) } else { k * (n + pad) };
        let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 317.0;
        let lhs: Vec<f32> = (0..lhs_len).map(val).collect();
        let rhs: Vec<f32> = (0..rhs_len).map(|i| val(i + 13)).collect();
        let mut out = vec![f32::NAN; m * n + 16];
        run(&SmallProduct {
            out: out.as_mut_ptr(),
            o_rs: n as isize,
            lhs: lhs.as_ptr(),
            l_rs,
            l_cs,
            rhs: rhs.as_ptr(),
            r_rs,
            r_cs,
            m,
            n,
            k,
        });
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut mag) = (0f64, 0f64);
                for t in 0..k {
                    let a = lhs[(i as isize * l_rs + t as isize * l_cs) as usize] as f64;
                    let b = rhs[(t as isize * r_rs + j as isize * r_cs) as usize] as f64;
                    exact += a * b;
                    mag += (a * b).abs();
                }
                let got = out[i * n + j] as f64;
                let bound = 1.01 * k as f64 * f32::EPSILON as f64 / 2.0 * mag;
                assert!(
                    (got - exact).abs() <= bound + 1e-30,
                    "{m}×{k}·{k}×{n} lhs_t={lhs_t} rhs_t={rhs_t} at ({i}, {j}): {got} vs {exact}"
                );
            }
        }
        assert!(
            out[m * n..].iter().all(|x| x.is_nan()),
            "wrote past the output"
        );
    }

    fn check(m: usize, n: usize, k: usize, lhs_t: bool, rhs_t: bool, pad: usize) {
        if !applies(m, n, k) {
            return;
        }
        // SAFETY (the closures): the harness's buffers hold every element the strides
        // address; `applies` holds; the CPU has the kernel's features (`kernels`).
        check_product((m, n, k), lhs_t, rhs_t, pad, |p| unsafe { run(p, None) });
        for isa in kernels() {
            check_product((m, n, k), lhs_t, rhs_t, pad, |p| unsafe {
                run_on(p, None, isa)
            });
            // Hinting another product's lines (here its own, and one far outside any
            // allocation) changes nothing.
            check_product((m, n, k), lhs_t, rhs_t, pad, |p| unsafe {
                run_on(p, Some(p), isa)
            });
            let stray = SmallProduct {
                lhs: p_far(),
                rhs: p_far(),
                ..dummy(m, n, k)
            };
            check_product((m, n, k), lhs_t, rhs_t, pad, |p| unsafe {
                run_on(p, Some(&stray), isa)
            });
        }
    }

    /// The kernels this CPU can run: AVX2's wherever AVX-512's runs (the CPU backend's
    /// AVX-512 level requires AVX2 and FMA too).
    pub(in crate::backend::cpu) fn kernels() -> Vec<Isa> {
        match isa() {
            Some(Isa::Avx512) => vec![Isa::Avx512, Isa::Avx2],
            Some(Isa::Avx2) => vec![Isa::Avx2],
            None => Vec::new(),
        }
    }

    /// An address no allocation holds.
    fn p_far() -> *const f32 {
        std::ptr::without_provenance(usize::MAX - (1 << 20))
    }

    /// A row-major `m × k · k × n` product at made-up addresses (never dereferenced).
    fn dummy(m: usize, n: usize, k: usize) -> SmallProduct {
        SmallProduct {
            out: std::ptr::without_provenance_mut(0x8000_0000),
            o_rs: n as isize,
            lhs: std::ptr::without_provenance(0x1000_0000),
            l_rs: k as isize,
            l_cs: 1,
            rhs: std::ptr::without_provenance(0x2000_0000),
            r_rs: n as isize,
            r_cs: 1,
            m,
            n,
            k,
        }
    }

    #[test]
    fn operand_lines_are_the_lines_of_every_operand_element() {
        use std::collections::BTreeSet;
        let line_of = |at: *const f32, i: isize| (at as usize).wrapping_add(4 * i as usize) & !63;
        // (m, n, k, lhs strides, rhs strides, lhs offset in f32s)
        for (m, n, k, (l_rs, l_cs), (r_rs, r_cs), off) in [
            (64, 32, 64, (64, 1), (384, 1), 0),
            (64, 64, 32, (384, 1), (1, 384), 32),
            (64, 32, 64, (1, 64), (384, 1), 3),
            (5, 7, 3, (1, 9), (1, 5), 1),
            (4, 4, 4, (9, 2), (2, 9), 0),
        ] {
            let mut p = dummy(m, n, k);
            p.lhs = p.lhs.wrapping_add(off);
            (p.l_rs, p.l_cs, p.r_rs, p.r_cs) = (l_rs, l_cs, r_rs, r_cs);
            let mut lines = Vec::new();
            operand_lines(&p, &mut lines);
            let mut want = BTreeSet::new();
            let unit = |rs: isize, cs: isize| rs == 1 || cs == 1;
            if unit(l_rs, l_cs) {
                for i in 0..m as isize {
                    for j in 0..k as isize {
                        want.insert(line_of(p.lhs, i * l_rs + j * l_cs));
                    }
                }
            }
            if unit(r_rs, r_cs) {
                for i in 0..k as isize {
                    for j in 0..n as isize {
                        want.insert(line_of(p.rhs, i * r_rs + j * r_cs));
                    }
                }
            }
            let got: BTreeSet<usize> = lines.iter().copied().collect();
            assert_eq!(
                got, want,
                "{m}x{k}·{k}x{n} strides {l_rs},{l_cs} / {r_rs},{r_cs}"
            );
        }
        // Operands larger than the cap: exactly MAX_HINTS lines, the first ones.
        let mut lines = Vec::new();
        operand_lines(&dummy(256, 64, 256), &mut lines);
        assert_eq!(lines.len(), MAX_HINTS);
        assert_eq!(lines[0], 0x1000_0000);
    }

    #[test]
    fn block_transposes_transpose() {
        // Columns 20 apart in the source, rows 24 apart in the destination.
        let x: Vec<f32> = (0..20 * 16).map(|i| i as f32).collect();
        for isa in kernels() {
            let wide = isa == Isa::Avx512;
            let t = if wide { 16 } else { 8 };
            let mut got = vec![f32::NAN; 24 * t];
            // SAFETY: `t` columns of `t` f32s, 20 apart, lie inside `x`; `t` rows of `t`
            // f32s, 24 apart, inside `got`; the CPU has the features (`kernels`).
            unsafe {
                if wide {
                    transpose_block16(x.as_ptr(), 20, got.as_mut_ptr(), 24);
                } else {
                    transpose_block8(x.as_ptr(), 20, got.as_mut_ptr(), 24);
                }
            }
            for r in 0..t {
                for c in 0..24 {
                    let want = if c < t { x[20 * c + r] } else { f32::NAN };
                    assert_eq!(
                        got[24 * r + c].to_bits(),
                        want.to_bits(),
                        "t={t} ({r}, {c})"
                    );
                }
            }
        }
    }

    #[test]
    fn small_products_match_f64_for_every_layout_and_edge() {
        for &(m, n, k) in &[
            (64, 64, 32),
            (64, 32, 64),
            (1, 1, 1),
            (15, 17, 3),
            (8, 16, 1),
            (13, 48, 31),
            (7, 63, 9),
            (256, 64, 256),
            (3, 33, 200),
            (31, 16, 16),
            (23, 32, 5),
            (11, 40, 17),
            (16, 256, 64),
            (9, 200, 33),
            (256, 256, 256),
            (5, 65, 7),
            (17, 129, 64),
        ] {
            for lhs_t in [false, true] {
                for rhs_t in [false, true] {
                    for pad in [0, 3] {
                        check(m, n, k, lhs_t, rhs_t, pad);
                    }
                }
            }
        }
    }
}
