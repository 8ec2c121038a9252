//! f32 products whose shape `gemm` runs below its rate, with an AVX-512 (or AVX2) kernel
//! that owns its blocking and threading: weight gradients (`xᵀ · g` over many tokens: a
//! depth of 2048 over a 128 × 512 output) and products with few rows. Measured on 2 Intel Xeon
//! cores, medians of 20 runs alternating with `gemm` in one process (warm caches): the
//! char_gpt weight gradients 512×2048·2048×128 1.146 → 0.917 ms, 128×2048·2048×512
//! 1.202 → 1.016, 384×2048·2048×128 0.857 → 0.758, 128×2048·2048×128 0.372 → 0.283,
//! 65×2048·2048×128 0.204 → 0.136; 64×1024·1024×1024 0.844 → 0.736; 100×300·300×1000
//! 0.764 → 0.256. `gemm` stays faster on large square products (1024³ 5.81 vs 6.82 ms) and
//! on deep products with many rows (2048×512·512×128 0.80 vs 0.88 ms), which keep it.
//!
//! The same blocking runs with AVX2 where the CPU has no AVX-512 ([`kernel_avx2`]: a 6 × 16
//! tile in 12 of the 16 vector registers). Measured on 2 AMD EPYC Zen 3 cores (AVX2, no
//! AVX-512), three runs of 31 alternations with `gemm`'s AVX2 kernels in one process, time
//! against `gemm`'s: char_gpt's weight gradients 128×2048·2048×128 0.77–0.79,
//! 128×2048·2048×512 0.84–0.96, 384×2048·2048×128 0.91–0.98, 512×2048·2048×128 1.00–1.05;
//! its forward `x @ w.t()` 2048×128·128×384 0.88–0.95, ·128×512 0.90–0.98, 2048×512·512×128
//! 0.92–0.99, ·128×128 0.98–1.06; its input gradients `g @ w` 2048×128·128×512 0.80–0.97,
//! 2048×384·384×128 1.00–1.01, 2048×512·512×128 0.99–1.08. This machine's noise made
//! single runs swing by 30%, hence the ranges.
//!
//! Blocking: the right operand is copied, `KC` rows of depth at a time, into panels of
//! `KC × 64` (row-major, columns past `n` zero), each 32 KiB, so a panel stays in L1 while
//! the kernel walks down the rows of the left operand. The left operand is mostly not
//! copied: the kernel broadcasts its elements through their strides, six rows at a time, so
//! a row-major left operand is six sequential streams and a column-major one (a weight
//! gradient's `xᵀ`) one stream of six consecutive elements, a whole column apart per depth
//! step.
//!
//! With AVX2, a column-major left operand of at least 512 rows is copied ([`pack_rows`]),
//! [`MC`] rows by one depth block at a time, into blocks of six rows with each depth step's
//! six elements adjacent, so the kernel reads one contiguous stream. Unpacked, each depth
//! step of a 2048-row `aᵀ` touches a new cache line 8 KiB from the last, and lines that far
//! apart share a handful of cache sets: the L1 and L2 keep few of them. Measured on 2 AMD
//! EPYC Zen 2 cores (AVX2), best of 7 in two alternating runs of the old and new builds
//! (column blocks of 256): `a.t() @ b` 1024³ 19.8–20.2 → 12.7–12.8 ms, 2048³ 161.5–161.8 →
//! 105.1–108.0 ms, 512×2048·2048×128 (a weight gradient) 2.11–2.15 → 1.79–2.04 ms; with
//! column blocks of 1024 (see [`rows`]) 1024³ runs at 184 GFLOP/s and 2048³ at 178–182,
//! where `a @ b` runs at about 189. With 384 rows it was
//! slower (1.15–1.17 → 1.29–1.30 ms), hence the 512. Copying a row-major left operand the
//! same way (an element-by-element gather) halved the rate of a 2048³ product. The
//! AVX-512 path copies nothing: the copy was measured on no AVX-512 machine yet (there,
//! Intel CPUs hint the lines ahead instead; see [`rows`]). A 6 × 64 block of the output stays in 24
//! registers for the panel's depth (24 FMAs per four vector loads and six broadcasts), and is
//! loaded again for the next depth block, so every output element is one chain of FMAs over
//! the depth in order, as in `gemm`'s kernels.
//!
//! Threads: a product with a long depth over a small output is split along the depth, each
//! thread summing its part into its own block (the first into the output), and the blocks
//! are added at the end; any other product splits its output rows, each thread packing the
//! right operand for itself (a panel block is at most `KC × NC`, 256 KiB).

use super::matmul::{After, Scratch};
use super::prefetch;
use super::register::aligned_f32;
use super::small_gemm::{Isa, SmallProduct as Product, isa, transpose_block8, transpose_block16};
use crate::error::Result;
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// How [`rows`] blocks a product.
#[derive(Clone, Copy)]
struct Blocking {
    isa: Isa,
    /// Depth per panel block.
    kc: usize,
    /// Columns per packed block.
    nc: usize,
    /// Columns per kernel call ([`NR`] for [`kernel`], 16 for [`kernel_avx2`]).
    tile_cols: usize,
}

impl Isa {
    /// The blocking for a product split by rows or (`depth_split`) along the depth. With
    /// AVX2 the kernel's tile is a quarter as wide, so a panel's 16-column slice (`kc × 16`)
    /// is what stays in L1 while the kernel walks down the rows, and a product split by rows
    /// takes a depth block of 512 (32 KiB slices), which needs fewer passes over the output
    /// than 128 or 256 (measured on 2 AMD EPYC Zen 3 cores, medians of 21 alternating runs:
    /// 2048×512·512×128 with `w.t()` 2.51 → 2.19 ms from 256 to 512, row-major 2.44 →
    /// 2.28 ms); a product split along the depth keeps 256 (its 512×2048·2048×128 ran 3.35
    /// ms with 256, 3.82 with 512).
    fn blocking(self, depth_split: bool) -> Blocking {
        match self {
            Isa::Avx512 => Blocking {
                isa: self,
                kc: KC,
                nc: NC,
                tile_cols: NR,
            },
            Isa::Avx2 => Blocking {
                isa: self,
                kc: if depth_split { 2 * KC } else { 4 * KC },
                nc: NC / 2,
                tile_cols: 16,
            },
        }
    }
}

/// Output rows per kernel call.
const MR: usize = 6;
/// Output columns per panel: four 16-lane vectors.
const NR: usize = 64;
/// Depth per panel block: a `KC × NR` panel is 32 KiB, resident in L1.
const KC: usize = 128;
/// Columns per packed block (`KC × NC` f32 = 256 KiB, resident in L2).
const NC: usize = 512;
/// Rows walked per panel before the next panel (their left-operand rows stay in L2).
const MC: usize = 96;

/// The kernel an f32 product of this size runs through [`run`] with on `threads` threads,
/// or `None` for `gemm`: AVX-512 or AVX2 in use, at least two threads, and a shape where
/// it measured faster than `gemm` (module docs). With AVX-512: a long depth over a small
/// output (split along the depth), fewer than 128 rows, or a [`shallow_transposed`]
/// product. With AVX2: a long depth over a small output, or at least 128 rows over columns
/// that [fill its tiles](fills_avx2_tiles), except a product at most 128 deep and 128 wide
/// with a row-major right operand (2048×128·128×128 ran 1.04–1.09× `gemm`'s time, where
/// the same product with `w.t()` ran 0.98–1.06×). `rhs_unit_rows`: the right operand's row
/// stride is 1 (`x @ w.t()`).
pub(super) fn route(
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    rhs_unit_rows: bool,
) -> Option<Isa> {
    let isa = isa()?;
    let takes = threads > 1
        && m.min(n).min(k) >= 16
        && match isa {
            Isa::Avx512 => {
                splits_depth(m, n, k) || m < 128 || rhs_unit_rows && shallow_transposed(m, n, k)
            }
            Isa::Avx2 => {
                splits_depth(m, n, k)
                    || m >= 128 && fills_avx2_tiles(n) && (rhs_unit_rows || n > 128 || k > 128)
            }
        };
    takes.then_some(isa)
}

/// With AVX2: whether `n` columns fill the kernel's 16-column tiles (at least 8/9): a
/// 2048×128·128×65 product (a last tile of one column) ran 1.09–1.13× `gemm`'s time.
fn fills_avx2_tiles(n: usize) -> bool {
    8 * n.next_multiple_of(16) <= 9 * n
}

/// A linear layer's forward product `x @ w.t()` with a depth of one panel block, or of up to
/// four over at most 128 columns: each block of [`MC`] rows is final as soon as the last
/// depth block's pass leaves it, so a matmul epilogue can run on it while it is in cache
/// (see [`run`]). Measured on 2 Intel Xeon cores, medians of 40 alternating runs against
/// `gemm`, the product alone: 2048×128·128×512 0.757 → 0.706 ms, ·128×384 0.575 → 0.539,
/// ·128×128 0.238 → 0.198, 1024×128·128×1024 0.830 → 0.724, 2048×96·96×256 0.328 → 0.266,
/// 8192×128·128×128 and 4096×64·64×1024 equal; but 512×128·128×2048 (four times more
/// columns than rows) 0.711 → 0.783, hence `n ≤ 2m`. Deeper products ran about as fast as
/// with `gemm` alone (2048×512·512×128 0.77–0.81 both) and faster with a bias added
/// (0.85–0.93 → 0.82–0.86 ms; char_gpt's second MLP layer with its bias and residual 0.90–0.96
/// → 0.83 ms), but 4096×512·512×256 ran 5% slower alone, hence the 128 columns. The
/// kernel computes whole 64-column panels, so the columns must fill them (at least 8/9):
/// 2048×128·128×65 ran 0.17–0.21 → 0.24–0.40 ms and ·128×80 0.19–0.22 → 0.22–0.24, where
/// 1000×100·100×300 ran 0.24–0.26 → 0.19–0.20. With a row-major right operand the same
/// shapes ran 1–6% slower than `gemm` and keep it.
fn shallow_transposed(m: usize, n: usize, k: usize) -> bool {
    m >= 128
        && n <= 2 * m
        && 8 * n.next_multiple_of(NR) <= 9 * n
        && (k <= KC || k <= 4 * KC && n <= 128)
}

/// Whether a product is split between threads along the depth: a long depth (at least four
/// times the larger output side) over an output of at most 512 × 512.
fn splits_depth(m: usize, n: usize, k: usize) -> bool {
    k >= 4 * m.max(n) && m * n <= 512 * 512
}

// Blocks of rows reported final start and end at multiples of the rows per kernel call.
const _: () = assert!(MR == super::matmul::ROW_STEP && MC.is_multiple_of(MR));

/// Computes `p.out = p.lhs @ p.rhs` on up to `threads` threads. A product split by rows does
/// `after` ([`After::Rows`]: calls it for every block of rows once the block is final,
/// covering all `m` rows; [`After::Bias`]: applies it to each output tile's sums before
/// they are stored) and returns `true`; a product split along the depth (final only at the
/// end) ignores it and returns `false`. `After::Bias` must hold `n` readable f32s.
///
/// # Safety
/// The CPU has `isa` (as [`route`] returning it proves) and the size is at least 1 in each
/// dimension; every element `lhs + i·l_rs + j·l_cs`
/// (`i < m`, `j < k`) and `rhs + i·r_rs + j·r_cs` (`i < k`, `j < n`) is readable; the `m·n`
/// elements from `out` (row-major, row stride `n`: `p.o_rs` is `n`) are writable and
/// overlap neither operand.
pub(super) unsafe fn run(p: &Product, threads: usize, after: After<'_>, isa: Isa) -> Result<bool> {
    debug_assert_eq!(p.o_rs, p.n as isize, "blocked products are row-major");
    let threads = threads.max(1);
    if threads > 1 && splits_depth(p.m, p.n, p.k) {
        // SAFETY: the caller's contract.
        unsafe { depth_split(p, threads, isa.blocking(true))? };
        return Ok(false);
    }
    // Rows in multiples of `MR` per thread (a range may come out empty: `rows` skips it).
    let parts = threads.min(p.m.div_ceil(MR * 4)).max(1);
    let per = p.m.div_ceil(parts).next_multiple_of(MR);
    let q = SendProduct(*p);
    let b = isa.blocking(false);
    (0..parts).into_par_iter().for_each(|t| {
        let m = q.get().m;
        let (i0, i1) = ((t * per).min(m), ((t + 1) * per).min(m));
        // SAFETY: the caller's contract; the row ranges are disjoint, so no output element
        // is written by two threads.
        unsafe { rows(q.get(), i0, i1, after, b) };
    });
    Ok(!matches!(after, After::Nothing))
}

/// [`run`] for a long depth: each thread sums whole depth blocks into its own m × n block
/// (the first into the output, the others into scratch), then the blocks are added.
///
/// # Safety
/// As for [`run`].
unsafe fn depth_split(p: &Product, threads: usize, b: Blocking) -> Result<()> {
    // Whole depth blocks per part; rounding up can leave fewer parts than threads, and every
    // part must be non-empty (a part writes its whole block only if it has depth).
    let kc = b.kc;
    let per =
        p.k.div_ceil(threads.min(p.k / kc).max(1))
            .next_multiple_of(kc);
    let parts = p.k.div_ceil(per);
    let partials: Vec<Scratch> = (1..parts)
        .map(|_| Scratch::new(p.m * p.n))
        .collect::<Result<_>>()?;
    let outs: Vec<usize> = std::iter::once(p.out as usize)
        .chain(partials.iter().map(|b| b.arg().ptr as usize))
        .collect();
    let q = SendProduct(*p);
    (0..parts).into_par_iter().for_each(|t| {
        let p = q.get();
        let (k0, k1) = ((t * per).min(p.k), ((t + 1) * per).min(p.k));
        let part = Product {
            out: outs[t] as *mut f32,
            lhs: p.lhs.wrapping_offset(k0 as isize * p.l_cs),
            rhs: p.rhs.wrapping_offset(k0 as isize * p.r_rs),
            k: k1 - k0,
            ..*p
        };
        // SAFETY: depth `[k0, k1)` of the caller's operands; `outs[t]` is this part's own
        // m × n block (the caller's output or its scratch block).
        unsafe { rows(&part, 0, p.m, After::Nothing, b) };
    });
    // SAFETY: the caller's output holds m·n f32s and no other reference to it lives.
    let out = unsafe { std::slice::from_raw_parts_mut(p.out, p.m * p.n) };
    const GRAIN: usize = 1 << 14;
    out.par_chunks_mut(GRAIN).enumerate().for_each(|(i, o)| {
        for s in &partials {
            for (x, y) in o.iter_mut().zip(&s.as_slice()[i * GRAIN..]) {
                *x += *y;
            }
        }
    });
    Ok(())
}

/// A product shared by the threads of one call.
struct SendProduct(Product);

impl SendProduct {
    /// The product (a method, so closures capture the `Sync` wrapper, not the field).
    fn get(&self) -> &Product {
        &self.0
    }
}
// SAFETY: the pointers are only dereferenced under `run`'s contract, each thread writing
// its own output rows.
unsafe impl Sync for SendProduct {}

thread_local! {
    /// Packed right-operand panels, one block per thread.
    static PANELS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Packed left-operand row blocks ([`pack_rows`]), one block per thread.
    static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Output rows `[i0, i1)` of `p` on this thread, doing `after` as the last column block's
/// last depth block passes: [`After::Rows`] for each block of [`MC`] rows (the last block
/// may be shorter) once that pass has left it, [`After::Bias`] on every tile of that pass.
///
/// # Safety
/// As for [`run`], with `b.isa` available; `i0 ≤ i1 ≤ m`.
unsafe fn rows(p: &Product, i0: usize, i1: usize, after: After<'_>, b: Blocking) {
    if i0 >= i1 {
        return;
    }
    // A column-major left operand (a weight gradient's `xᵀ`) is read one cache line per
    // depth step at a stride of a whole row of `x`: too far apart for the hardware
    // prefetchers, and in a training step `x` comes from memory. The kernel hints the line
    // of the same depth 16 rows further on, which a kernel call two or three calls later
    // reads (char_gpt's weight gradients in a step, Intel Xeon, two alternating runs:
    // 512×2048·2048×128 1.53–1.60 → 1.10–1.21 ms, 384×2048·2048×128 1.17–1.23 →
    // 0.90–1.02 ms; 128×2048·2048×512, whose `xᵀ` is the small operand, unchanged).
    let ahead = if p.l_rs == 1 && prefetch::enabled() {
        16
    } else {
        0
    };
    let (kc_max, nc_max, wide) = (b.kc, b.nc, b.isa == Isa::Avx512);
    // With AVX2, a column-major left operand of at least 512 rows is copied a block of rows
    // at a time (`pack_rows`; measurements in the module docs).
    let pack_a = !wide && p.l_rs == 1 && p.l_cs != 1 && p.m >= 512;
    // Each column block copies the left operand again: a packed product takes blocks of
    // 1024 columns (`2 · NC`; with 256, `a.t() @ b` 1024³ ran at 168–170 GFLOP/s against
    // 184–185, 2048³ at 163–164 against 178–182; with 2048, 176–180).
    let nc_max = if pack_a { 2 * NC } else { nc_max };
    let mut rows_cell = ROWS.with(|c| c.take());
    let abuf: &mut [f32] = if pack_a {
        aligned_f32(&mut rows_cell, MC * kc_max)
    } else {
        &mut []
    };
    PANELS.with(|cell| {
        let mut cell = cell.borrow_mut();
        let need = kc_max * nc_max.min(p.n.next_multiple_of(NR));
        // Aligned, so the kernel's four loads per panel row each read one cache line.
        let buf = aligned_f32(&mut cell, need);
        for j0 in (0..p.n).step_by(nc_max) {
            let nc = nc_max.min(p.n - j0);
            let panels = nc.div_ceil(NR);
            for d0 in (0..p.k).step_by(kc_max) {
                let kc = kc_max.min(p.k - d0);
                // SAFETY: rows `[d0, d0 + kc)`, columns `[j0, j0 + nc)` of the right
                // operand are readable; `buf` holds `panels · kc · NR` f32s; AVX-512F is
                // available if `wide`, AVX2 (which AVX-512 implies here) otherwise.
                unsafe { pack_panels(p, d0, kc, j0, nc, buf, wide) };
                // The last depth block's pass applies a bias epilogue to its sums.
                let bias = match after {
                    After::Bias { bias, .. } if d0 + kc == p.k => bias.wrapping_add(j0),
                    _ => std::ptr::null(),
                };
                for r0 in (i0..i1).step_by(MC) {
                    let r1 = (r0 + MC).min(i1);
                    let packed = if pack_a {
                        // SAFETY: rows `[r0, r1)` (at most `MC`), depth `[d0, d0 + kc)` of
                        // the left operand are readable (the caller's contract); `abuf` holds
                        // `MC · kc_max` f32s.
                        unsafe { pack_rows(p, r0, r1, d0, kc, abuf) };
                        abuf.as_ptr()
                    } else {
                        std::ptr::null()
                    };
                    for pn in 0..panels {
                        let cols = NR.min(nc - pn * NR);
                        let panel = buf[pn * kc * NR..].as_ptr();
                        for g0 in (0..cols).step_by(b.tile_cols) {
                            let mut r = r0;
                            while r < r1 {
                                let nr = MR.min(r1 - r);
                                let c0 = pn * NR + g0;
                                let tile = Tile {
                                    a: if packed.is_null() {
                                        p.lhs.wrapping_offset(
                                            r as isize * p.l_rs + d0 as isize * p.l_cs,
                                        )
                                    } else {
                                        packed.wrapping_add((r - r0) * kc)
                                    },
                                    l_rs: if packed.is_null() { p.l_rs } else { 1 },
                                    l_cs: if packed.is_null() {
                                        p.l_cs
                                    } else {
                                        MR as isize
                                    },
                                    b: panel.wrapping_add(g0),
                                    c: p.out.wrapping_add(r * p.n + j0 + c0),
                                    ldc: p.n,
                                    kc,
                                    rows: nr,
                                    cols: b.tile_cols.min(cols - g0),
                                    accumulate: d0 > 0,
                                    // The panel's first tile hints for the others.
                                    ahead: if g0 == 0 && packed.is_null() {
                                        ahead
                                    } else {
                                        0
                                    },
                                    bias: if bias.is_null() {
                                        bias
                                    } else {
                                        bias.wrapping_add(c0)
                                    },
                                    relu: matches!(after, After::Bias { relu: true, .. }),
                                };
                                // SAFETY: rows `[r, r + nr)` and depth `[d0, d0 + kc)` of
                                // the left operand are readable; the panel holds `kc × NR`
                                // from its column `g0` on; the output tile lies inside this
                                // thread's rows; the CPU has the kernel's instructions.
                                unsafe {
                                    if wide {
                                        kernel(&tile);
                                    } else {
                                        kernel_avx2(&tile);
                                    }
                                };
                                r += nr;
                            }
                        }
                    }
                    if let After::Rows(f) = after
                        && j0 + nc == p.n
                        && d0 + kc == p.k
                    {
                        f(r0, r1);
                    }
                }
            }
        }
    });
    ROWS.with(|c| c.replace(rows_cell));
}

/// Copies rows `[r0, r1)`, depth `[d0, d0 + kc)` of a column-major left operand (unit row
/// stride) into `buf` as blocks of [`MR`] rows, each `kc × MR` with a depth step's `MR`
/// elements adjacent (rows past `r1` zero): the kernel then reads one contiguous stream
/// (`l_rs` 1, `l_cs` `MR`) where it read one cache line per depth step, a whole column of
/// the operand apart.
///
/// # Safety
/// Those elements of the left operand are readable, and `p.l_rs == 1`;
/// `buf.len() ≥ (r1 - r0).next_multiple_of(MR) · kc`.
unsafe fn pack_rows(p: &Product, r0: usize, r1: usize, d0: usize, kc: usize, buf: &mut [f32]) {
    debug_assert_eq!(p.l_rs, 1, "packed left operands are column-major");
    let rows = r1 - r0;
    for d in 0..kc {
        let col = p
            .lhs
            .wrapping_offset(r0 as isize + (d0 + d) as isize * p.l_cs);
        // SAFETY: rows `[r0, r1)` at depth `d0 + d`, adjacent in memory (unit row stride):
        // readable (the contract).
        let src = unsafe { std::slice::from_raw_parts(col, rows) };
        for (blk, part) in src.chunks(MR).enumerate() {
            let dst = &mut buf[blk * MR * kc + d * MR..][..MR];
            dst[..part.len()].copy_from_slice(part);
            dst[part.len()..].fill(0.0);
        }
    }
}

/// Copies rows `[d0, d0 + kc)`, columns `[j0, j0 + nc)` of the right operand into panels of
/// `kc × NR` (row-major, columns past `nc` zero). A unit-row-stride operand (`x @ w.t()`)
/// goes through register transposes (16 × 16 with AVX-512, `wide`; 8 × 8 with AVX2); a
/// row-major one is copied row by row.
///
/// # Safety
/// As for [`run`] for those elements; `buf.len() ≥ nc.div_ceil(NR) · kc · NR`; AVX-512F
/// available if `wide`, AVX2 otherwise.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_panels(
    p: &Product,
    d0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    buf: &mut [f32],
    wide: bool,
) {
    let at = |i: usize, j: usize| {
        p.rhs
            .wrapping_offset((d0 + i) as isize * p.r_rs + (j0 + j) as isize * p.r_cs)
    };
    let panels = nc.div_ceil(NR);
    let side = if wide { 16 } else { 8 };
    for pn in 0..panels {
        let cols = NR.min(nc - pn * NR);
        let panel = &mut buf[pn * kc * NR..(pn + 1) * kc * NR];
        let c0 = pn * NR;
        if p.r_cs == 1 {
            for (i, row) in panel.chunks_exact_mut(NR).enumerate() {
                // SAFETY: element (d0 + i, j0 + c0 + j) for j < cols: readable.
                let src = unsafe { std::slice::from_raw_parts(at(i, c0), cols) };
                row[..cols].copy_from_slice(src);
                row[cols..].fill(0.0);
            }
            continue;
        }
        let (full_i, full_j) = if p.r_rs == 1 {
            (kc / side * side, cols / side * side)
        } else {
            (0, 0)
        };
        for jb in (0..full_j).step_by(side) {
            for ib in (0..full_i).step_by(side) {
                let dst = panel[ib * NR + jb..].as_mut_ptr();
                // SAFETY: elements (d0 + ib .. + side, columns c0 + jb .. + side) are
                // readable, each column's `side` elements contiguous (row stride 1); `dst`
                // starts `side` panel rows of which `side` f32s each are writable (`ib +
                // side ≤ kc`, `jb + side ≤ NR`); the caller's CPU features.
                unsafe {
                    if wide {
                        transpose_block16(at(ib, c0 + jb), p.r_cs, dst, NR);
                    } else {
                        transpose_block8(at(ib, c0 + jb), p.r_cs, dst, NR);
                    }
                }
            }
        }
        for (i, row) in panel.chunks_exact_mut(NR).enumerate() {
            let from = if i < full_i { full_j } else { 0 };
            for (j, x) in row.iter_mut().enumerate().skip(from) {
                // SAFETY: element (d0 + i, j0 + c0 + j) for j < cols: readable.
                *x = if j < cols {
                    unsafe { *at(i, c0 + j) }
                } else {
                    0.0
                };
            }
        }
    }
}

/// One kernel call: `rows × cols` of the output at `c` (row stride `ldc`) gets (or, with
/// `accumulate`, adds) `a · b` over `kc` depth steps.
struct Tile {
    /// Left operand at (first row, first depth step), read through `l_rs`/`l_cs`.
    a: *const f32,
    l_rs: isize,
    l_cs: isize,
    /// A packed `kc × NR` panel.
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    kc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
    /// Elements to go along the rows of a column-major left operand (unit row stride) for
    /// the line each depth step hints into L1; 0 for no hints.
    ahead: isize,
    /// The bias of the tile's first column, added to the final sums before they are stored
    /// (null for none).
    bias: *const f32,
    /// With a bias: then kiln's `relu` (`x > 0` or NaN keeps `x`, anything else is `+0`).
    relu: bool,
}

/// The 6 × 64 register kernel (fewer rows or columns through masks).
///
/// # Safety
/// AVX-512F is available; `rows ≤ MR`, `cols ≤ NR`; the left operand's `rows × kc`
/// elements and the panel's `kc × NR` are readable; the output's `rows × cols` elements
/// are writable (and readable with `accumulate`); a non-null `bias` has `cols` readable f32s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel(t: &Tile) {
    let mut masks = [0 as __mmask16; 4];
    for (v, m) in masks.iter_mut().enumerate() {
        let lanes = t.cols.saturating_sub(16 * v).min(16);
        *m = ((1u32 << lanes) - 1) as __mmask16;
    }
    let mut acc = [[_mm512_setzero_ps(); 4]; MR];
    if t.accumulate {
        for (r, row) in acc.iter_mut().enumerate().take(t.rows) {
            for (v, x) in row.iter_mut().enumerate() {
                // SAFETY: row r < rows, the masked lanes are columns < cols; lanes outside
                // the mask are not touched (a vector may start past the buffer: its
                // address is computed wrapping).
                *x = unsafe {
                    _mm512_maskz_loadu_ps(masks[v], t.c.wrapping_add(r * t.ldc + 16 * v))
                };
            }
        }
    } else {
        for r in 0..t.rows {
            let row = t.c.wrapping_add(r * t.ldc) as usize;
            prefetch::hint_range(row, t.cols * 4, true);
        }
    }
    // Rows past `rows` read row 0 again (their sums are never stored).
    let mut a = [t.a; MR];
    for (r, x) in a.iter_mut().enumerate() {
        if r < t.rows {
            *x = t.a.wrapping_offset(r as isize * t.l_rs);
        }
    }
    for d in 0..t.kc {
        // SAFETY: panel row d < kc, 64 f32s.
        let b = unsafe {
            let row = t.b.add(d * NR);
            [
                _mm512_loadu_ps(row),
                _mm512_loadu_ps(row.add(16)),
                _mm512_loadu_ps(row.add(32)),
                _mm512_loadu_ps(row.add(48)),
            ]
        };
        let off = d as isize * t.l_cs;
        if t.ahead > 0 {
            // A hint: it never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(t.a.wrapping_offset(off + t.ahead).cast());
        }
        for r in 0..MR {
            // SAFETY: element (row r or 0, depth d) of the left operand: readable.
            let x = _mm512_set1_ps(unsafe { *a[r].offset(off) });
            for v in 0..4 {
                acc[r][v] = _mm512_fmadd_ps(x, b[v], acc[r][v]);
            }
        }
    }
    if !t.bias.is_null() {
        // The epilogue, rounding as its ops do one by one: `sum + bias` (an f32 add, which
        // is commutative bit for bit), then `relu`.
        let zero = _mm512_setzero_ps();
        for v in 0..4 {
            // SAFETY: the masked lanes are columns < cols, which the bias holds; lanes
            // outside the mask are not touched.
            let b = unsafe { _mm512_maskz_loadu_ps(masks[v], t.bias.wrapping_add(16 * v)) };
            for row in acc.iter_mut().take(t.rows) {
                let x = _mm512_add_ps(row[v], b);
                row[v] = if t.relu {
                    // Not (x <= 0): x > 0, or unordered (NaN).
                    let keep = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(x, zero);
                    _mm512_maskz_mov_ps(keep, x)
                } else {
                    x
                };
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(t.rows) {
        for (v, x) in row.iter().enumerate() {
            // SAFETY: row r < rows, the masked lanes are columns < cols; lanes outside the
            // mask are not touched.
            unsafe { _mm512_mask_storeu_ps(t.c.wrapping_add(r * t.ldc + 16 * v), masks[v], *x) };
        }
    }
}

/// The kernel with AVX2: a tile of at most 16 columns ([`Blocking::tile_cols`]), a 6 × 16
/// block of the output in 12 registers for the panel's depth (12 FMAs per two vector loads
/// and six broadcasts); fewer rows or columns through masks. Sums, bias and `relu` round
/// as in [`kernel`].
///
/// # Safety
/// As for [`kernel`], with AVX2 and FMA available instead of AVX-512F, and `cols ≤ 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(t: &Tile) {
    debug_assert!(t.cols <= 16, "an AVX2 tile is at most 16 columns");
    let zero = _mm256_setzero_ps();
    // Rows past `rows` read row 0 again (their sums are never stored).
    let mut a = [t.a; MR];
    for (r, x) in a.iter_mut().enumerate() {
        if r < t.rows {
            *x = t.a.wrapping_offset(r as isize * t.l_rs);
        }
    }
    let full = t.cols == 16;
    // Lane masks of the tile's two vectors (all lanes when `full`).
    let masks = [t.cols.min(8), t.cols.saturating_sub(8)].map(|lanes| {
        let i = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes as i32), i)
    });
    let mut acc = [[zero; 2]; MR];
    if t.accumulate {
        for (r, row) in acc.iter_mut().enumerate().take(t.rows) {
            for (v, x) in row.iter_mut().enumerate() {
                let at = t.c.wrapping_add(r * t.ldc + 8 * v);
                // SAFETY: row r < rows; the (masked) lanes are columns < cols; lanes outside
                // the mask are not touched (the address is computed wrapping).
                *x = unsafe {
                    if full {
                        _mm256_loadu_ps(at)
                    } else {
                        _mm256_maskload_ps(at, masks[v])
                    }
                };
            }
        }
    } else {
        for r in 0..t.rows {
            let row = t.c.wrapping_add(r * t.ldc) as usize;
            prefetch::hint_range(row, t.cols * 4, true);
        }
    }
    for d in 0..t.kc {
        // SAFETY: panel row d < kc: the tile's 16 columns lie inside its NR f32s.
        let b = unsafe {
            let row = t.b.add(d * NR);
            [_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8))]
        };
        let off = d as isize * t.l_cs;
        if t.ahead > 0 {
            // A hint: it never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(t.a.wrapping_offset(off + t.ahead).cast());
        }
        for r in 0..MR {
            // SAFETY: element (row r or 0, depth d) of the left operand: readable.
            let x = _mm256_set1_ps(unsafe { *a[r].offset(off) });
            for v in 0..2 {
                acc[r][v] = _mm256_fmadd_ps(x, b[v], acc[r][v]);
            }
        }
    }
    if !t.bias.is_null() {
        for v in 0..2 {
            // SAFETY: the masked lanes are columns < cols, which the bias holds; lanes
            // outside the mask are not touched (the address is computed wrapping).
            let b = unsafe { _mm256_maskload_ps(t.bias.wrapping_add(8 * v), masks[v]) };
            for row in acc.iter_mut().take(t.rows) {
                let x = _mm256_add_ps(row[v], b);
                row[v] = if t.relu {
                    // Not (x <= 0): x > 0, or unordered (NaN); else +0.
                    _mm256_and_ps(_mm256_cmp_ps::<_CMP_NLE_UQ>(x, zero), x)
                } else {
                    x
                };
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(t.rows) {
        for (v, x) in row.iter().enumerate() {
            let at = t.c.wrapping_add(r * t.ldc + 8 * v);
            // SAFETY: row r < rows; the (masked) lanes are columns < cols; lanes outside the
            // mask are not touched.
            unsafe {
                if full {
                    _mm256_storeu_ps(at, *x);
                } else {
                    _mm256_maskstore_ps(at, masks[v], *x);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::matmul::ROW_STEP;
    use crate::backend::cpu::small_gemm::tests::{check_product, kernels};

    #[test]
    fn blocked_products_match_f64_for_every_layout_edge_and_split() {
        for &(m, n, k) in &[
            (16, 16, 16),
            (96, 64, 128),
            (97, 65, 129),
            (13, 130, 300),
            (200, 17, 40),
            (64, 600, 257),
            (31, 47, 1100),
            (128, 96, 2048),
            (40, 200, 1000),
            (20, 40, 385),
            // At least 512 rows: a column-major left operand is packed (AVX2), over two
            // depth blocks, in a product split along the depth, and over two column blocks.
            (515, 70, 600),
            (512, 33, 2100),
            (512, 1030, 40),
        ] {
            for lhs_t in [false, true] {
                for rhs_t in [false, true] {
                    for (pad, threads) in [(0, 1), (3, 2), (0, 3)] {
                        for isa in kernels() {
                            check_product((m, n, k), lhs_t, rhs_t, pad, |p| {
                                // SAFETY: the harness's buffers hold every element the
                                // strides address; the CPU has `isa`.
                                unsafe { run(p, threads, After::Nothing, isa) }
                                    .expect("partial sums' memory");
                            });
                        }
                    }
                }
            }
        }
    }

    /// A bias epilogue in registers gives, bit for bit, the product stored and then
    /// `relu?(x + bias[j])` computed element by element as kiln's ops do, for tiles cut by
    /// masks (columns not a multiple of 16, rows not of 6) and several depth blocks.
    #[test]
    fn bias_epilogue_matches_the_elementwise_ops() {
        for &(m, n, k, rhs_t) in &[
            (130, 50, 200, true),
            (200, 77, 700, false),
            (64, 16, 32, true),
        ] {
            let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 317.0;
            let lhs: Vec<f32> = (0..m * k).map(val).collect();
            let rhs: Vec<f32> = (0..k * n).map(|i| val(i + 5)).collect();
            let mut bias: Vec<f32> = (0..n).map(|i| val(i * 3 + 1)).collect();
            bias[1] = f32::NAN;
            bias[2] = -1e30;
            let (r_rs, r_cs) = if rhs_t {
                (1, k as isize)
            } else {
                (n as isize, 1)
            };
            for (isa, relu) in kernels().into_iter().flat_map(|i| [(i, false), (i, true)]) {
                let mut plain = vec![0f32; m * n];
                let mut fused = vec![0f32; m * n];
                for (out, after) in [
                    (&mut plain, After::Nothing),
                    (
                        &mut fused,
                        After::Bias {
                            bias: bias.as_ptr(),
                            relu,
                        },
                    ),
                ] {
                    let p = Product {
                        out: out.as_mut_ptr(),
                        o_rs: n as isize,
                        lhs: lhs.as_ptr(),
                        l_rs: k as isize,
                        l_cs: 1,
                        rhs: rhs.as_ptr(),
                        r_rs,
                        r_cs,
                        m,
                        n,
                        k,
                    };
                    let epilogue = !matches!(after, After::Nothing);
                    // SAFETY: the operands hold m × k and k × n elements for these strides,
                    // the output m × n, the bias n; the CPU has `isa`.
                    let done = unsafe { run(&p, 2, after, isa) }.expect("memory");
                    assert_eq!(done, epilogue, "split by rows, so the epilogue is done");
                }
                for (i, (x, y)) in plain.iter().zip(&fused).enumerate() {
                    let mut want = x + bias[i % n];
                    if relu && want <= 0.0 {
                        want = 0.0;
                    }
                    assert_eq!(
                        want.to_bits(),
                        y.to_bits(),
                        "{isa:?} relu={relu} {m}×{n}×{k} element {i}: {want} vs {y}"
                    );
                }
            }
        }
    }

    /// Shallow products split by rows report every row final exactly once, in blocks that
    /// start at multiples of `ROW_STEP`, and a reported row no longer changes; depth-split
    /// products report nothing.
    #[test]
    fn row_blocks_are_reported_once_when_final() {
        use std::sync::Mutex;
        for &(m, n, k, rhs_t) in &[
            (128, 64, 128, true),
            (301, 126, 96, true),
            (300, 600, 128, true),
            (300, 128, 400, true),
            (97, 65, 300, false),
            (120, 40, 300, false),
            (64, 64, 2048, false),
        ] {
            for (threads, isa) in [2, 3]
                .into_iter()
                .flat_map(|t| kernels().into_iter().map(move |i| (t, i)))
            {
                check_product((m, n, k), false, rhs_t, 1, |p| {
                    let out = p.out as usize;
                    let seen: Mutex<Vec<Option<Vec<f32>>>> = Mutex::new(vec![None; m]);
                    let done = |r0: usize, r1: usize| {
                        assert!(r0 < r1 && r1 <= m, "rows {r0}..{r1} of {m}");
                        assert!(r0.is_multiple_of(ROW_STEP), "block starts at {r0}");
                        assert!(r1 == m || r1.is_multiple_of(ROW_STEP));
                        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                        for (r, slot) in seen.iter_mut().enumerate().take(r1).skip(r0) {
                            assert!(slot.is_none(), "row {r} reported twice");
                            // SAFETY: row r of the harness's m × n output, written by
                            // this thread.
                            let row = unsafe {
                                std::slice::from_raw_parts((out as *const f32).add(r * n), n)
                            };
                            *slot = Some(row.to_vec());
                        }
                    };
                    // SAFETY: as in the test above.
                    let all = unsafe { run(p, threads, After::Rows(&done), isa) }.expect("memory");
                    let seen = seen.into_inner().unwrap_or_else(|e| e.into_inner());
                    assert_eq!(all, !splits_depth(m, n, k), "{m}×{n}×{k}");
                    for (r, slot) in seen.iter().enumerate() {
                        match slot {
                            None => assert!(!all, "row {r} never reported"),
                            Some(v) => {
                                // SAFETY: row r of the output; the run has finished.
                                let now = unsafe {
                                    std::slice::from_raw_parts((out as *const f32).add(r * n), n)
                                };
                                assert!(
                                    v.iter().zip(now).all(|(a, b)| a.to_bits() == b.to_bits()),
                                    "row {r} changed after it was reported"
                                );
                            }
                        }
                    }
                });
            }
        }
    }
}
