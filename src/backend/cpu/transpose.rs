//! Permuted copies. Transposes (`x.t().contiguous()`, `permute(..).contiguous()` whose
//! output rows read a column of the input): a program that only loads one view and stores it unchanged, the
//! store contiguous along the last dimension and the load contiguous along the one before
//! it. Instead of the interpreter's strided runs (one cache line and one dependent load
//! per element), each 64 × 64 block of the output is read as 64 contiguous segments of
//! the input into a tile on the stack and written back as 64 contiguous rows, so both
//! sides stream whole cache lines and the strided part of the access happens in L1.
//! While a block is copied, the next block's 64 input segments and 64 output segments are
//! prefetched (one page each, out of the hardware prefetchers' reach): 4096² f32 went from
//! 1.9× to 1.0× a plain copy's time on the Intel Xeon test machine (where
//! `prefetch::enabled`).
//! Reorderings that keep short rows contiguous (attention's head split) are copied row by
//! row ([`try_run_rows`]).
//!
//! Soundness rests on the checks of the module above (see `exec.rs`): every view's offsets
//! lie inside its buffer, every buffer is at least as large as its argument, and the store
//! view is injective, so tasks that own disjoint output rows never write the same element.
//! [`try_run`] also refuses a load and a store whose byte ranges overlap.

use super::exec::{ArgPtr, Env};
use super::program::{CpuKernel, PView};
use crate::kernel::IrOp;
use rayon::prelude::*;

/// Side of the square blocks (64 × 64 elements: 16 KiB of f32 on the stack).
const B: usize = 64;

/// Whether `prog` is a copy this module may run (whether it does depends on the buffers).
pub(crate) fn may_run(prog: &CpuKernel) -> bool {
    shape_of(prog).is_some() || plain_copy(prog).is_some()
}

/// Runs `prog` here when it is a permuted copy (see the module docs); `false` leaves it
/// to the interpreter.
pub(crate) fn try_run(prog: &CpuKernel, env: &Env<'_>) -> bool {
    let Some(t) = shape_of(prog) else {
        return try_run_rows(prog, env);
    };
    let (Some(src), Some(dst)) = (env.args.get(t.load_arg), env.args.get(t.store_arg)) else {
        return false;
    };
    let (src, dst) = (*src, *dst);
    if overlaps(&t, src, dst) {
        return false;
    }
    // SAFETY (all four): `shape_of` matched a bit-for-bit copy whose element size is the
    // type's size, the views are inside their buffers for every coordinate of `dims`
    // (validated before the run), and the load and store ranges do not overlap.
    match t.size {
        1 => unsafe { run::<u8>(&t, src, dst) },
        2 => unsafe { run::<u16>(&t, src, dst) },
        4 => unsafe { run::<u32>(&t, src, dst) },
        8 => unsafe { run::<u64>(&t, src, dst) },
        _ => return false,
    }
    true
}

/// Runs `prog` here when it is a copy of short contiguous rows between two differently
/// ordered layouts (splitting or merging attention heads: `[b, t, h, d] <-> [b, h, t, d]`
/// with `d` contiguous on both sides): each output row is one block copy, the rows walked
/// in order with their offsets stepped like an odometer, instead of one interpreter item
/// (coordinates, dispatch, a run of `d` elements) per row. `false` leaves it to the
/// interpreter.
fn try_run_rows(prog: &CpuKernel, env: &Env<'_>) -> bool {
    let Some(t) = plain_copy(prog) else {
        return false;
    };
    let d = t.dims.len();
    let rows_fit =
        t.load.strides[d - 1] == 1 && t.store.strides[d - 1] == 1 && t.dims[d - 1] * t.size < 4096;
    if !rows_fit {
        return false;
    }
    let (Some(&src), Some(&dst)) = (env.args.get(t.load_arg), env.args.get(t.store_arg)) else {
        return false;
    };
    if overlaps(&t, src, dst) {
        return false;
    }
    // SAFETY: a bit-for-bit copy of `size`-byte elements; every offset the views reach over
    // `dims` is inside its buffer (validated before the run), the ranges do not overlap,
    // and the store view is injective.
    unsafe { run_rows(&t, src, dst) };
    true
}

/// The row copies of [`try_run_rows`], split over rayon's threads by blocks of rows.
///
/// # Safety
/// As [`run`], with both views contiguous along the last dimension.
unsafe fn run_rows(t: &Transpose<'_>, src: ArgPtr, dst: ArgPtr) {
    let d = t.dims.len();
    let cols = t.dims[d - 1];
    let rows: usize = t.dims[..d - 1].iter().product();
    let bytes = cols * t.size;
    let per_task = (16384 / bytes.max(1)).max(1);
    let sz = t.size as isize;
    let task = move |i: usize| {
        let (src, dst) = (src, dst);
        let (sp, dp) = (src.ptr as *const u8, dst.ptr);
        let r0 = i * per_task;
        let r1 = (r0 + per_task).min(rows);
        let mut coords = vec![0usize; d - 1];
        let (mut so, mut doff) = (t.load.offset, t.store.offset);
        let mut rest = r0;
        for k in (0..d - 1).rev() {
            coords[k] = rest % t.dims[k];
            rest /= t.dims[k];
            so += coords[k] as isize * t.load.strides[k];
            doff += coords[k] as isize * t.store.strides[k];
        }
        for _ in r0..r1 {
            // SAFETY: `so` and `doff` are the views' offsets of the row's first element,
            // and its `cols` elements are contiguous on both sides (unit strides), inside
            // the buffers, which do not overlap; this task alone writes its rows.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    sp.wrapping_offset(so * sz),
                    dp.wrapping_offset(doff * sz),
                    bytes,
                )
            };
            // Next row: step the odometer over the leading dimensions.
            for k in (0..d - 1).rev() {
                coords[k] += 1;
                so += t.load.strides[k];
                doff += t.store.strides[k];
                if coords[k] < t.dims[k] {
                    break;
                }
                so -= t.load.strides[k] * t.dims[k] as isize;
                doff -= t.store.strides[k] * t.dims[k] as isize;
                coords[k] = 0;
            }
        }
    };
    let n_tasks = rows.div_ceil(per_task);
    if rows * cols < 1 << 15 {
        (0..n_tasks).for_each(task);
    } else {
        (0..n_tasks).into_par_iter().for_each(task);
    }
}

/// A matched permuted copy over `dims` (leading batch dimensions, then rows and columns of
/// the output).
struct Transpose<'p> {
    dims: &'p [usize],
    load: &'p PView,
    store: &'p PView,
    load_arg: usize,
    store_arg: usize,
    /// Bytes per element.
    size: usize,
}

/// A program that only loads one unmasked view and stores it unchanged (same dtype, another
/// argument) over two or more output dimensions.
fn plain_copy(prog: &CpuKernel) -> Option<Transpose<'_>> {
    let d = prog.dims.len();
    if prog.has_reduce || prog.n_out != d || d < 2 || prog.instrs.len() != 2 {
        return None;
    }
    let (load, store) = (&prog.instrs[0], &prog.instrs[1]);
    let (
        IrOp::Load {
            arg: la, view: lv, ..
        },
        IrOp::Store {
            arg: sa,
            view: sv,
            src: 0,
        },
    ) = (&load.op, &store.op)
    else {
        return None;
    };
    let plain = lv.mask.is_none() && sv.mask.is_none() && load.dtype == store.dtype;
    (plain && la != sa).then_some(Transpose {
        dims: &prog.dims,
        load: lv,
        store: sv,
        load_arg: *la,
        store_arg: *sa,
        size: load.dtype.size_bytes(),
    })
}

fn shape_of(prog: &CpuKernel) -> Option<Transpose<'_>> {
    let t = plain_copy(prog)?;
    let d = t.dims.len();
    let (lv, sv) = (t.load, t.store);
    // Output rows contiguous, input contiguous down the output's columns, and the input's
    // run along an output row strided (else the interpreter already streams it).
    let transposed =
        sv.strides[d - 1] == 1 && lv.strides[d - 2] == 1 && lv.strides[d - 1].abs() >= 16;
    let big = t.dims[d - 1] >= B && t.dims[d - 2] >= B;
    (transposed && big).then_some(t)
}

/// Lowest and highest element offsets a view reaches over `dims`.
fn extent(v: &PView, dims: &[usize]) -> (isize, isize) {
    let (mut lo, mut hi) = (v.offset, v.offset);
    for (&n, &s) in dims.iter().zip(&v.strides) {
        let reach = (n.saturating_sub(1)) as isize * s;
        if reach < 0 { lo += reach } else { hi += reach }
    }
    (lo, hi)
}

fn overlaps(t: &Transpose<'_>, src: ArgPtr, dst: ArgPtr) -> bool {
    let sz = t.size as isize;
    let byte_range = |v: &PView, p: ArgPtr| {
        let (lo, hi) = extent(v, t.dims);
        let base = p.ptr as isize;
        (base + lo * sz, base + (hi + 1) * sz)
    };
    let (a0, a1) = byte_range(t.load, src);
    let (b0, b1) = byte_range(t.store, dst);
    a0 < b1 && b0 < a1
}

/// The copy, split over rayon's threads by blocks of output rows.
///
/// # Safety
/// `T` is `t.size` bytes; every offset the views reach over `t.dims` is inside the
/// buffers behind `src` and `dst`, which do not overlap; the store view is injective.
unsafe fn run<T: Copy + Default + Send + Sync>(t: &Transpose<'_>, src: ArgPtr, dst: ArgPtr) {
    let d = t.dims.len();
    let (rows, cols) = (t.dims[d - 2], t.dims[d - 1]);
    let batch: usize = t.dims[..d - 2].iter().product();
    let row_blocks = rows.div_ceil(B);
    #[cfg(target_arch = "x86_64")]
    let avx512 = super::exec::simd_level() == "avx512";
    // A large output of 4-byte elements (it cannot stay in the caches) is written with
    // streaming stores (`super::stream`), whole output rows of a block at a time.
    let stream = cfg!(target_arch = "x86_64")
        && std::mem::size_of::<T>() == 4
        && (batch * rows * cols).saturating_mul(4) >= super::program::STREAM_MIN_BYTES;
    let task = |i: usize| {
        let (b, rb) = (i / row_blocks, i % row_blocks);
        // Offsets of this batch element (row-major over the leading dimensions).
        let (mut so, mut doff) = (t.load.offset, t.store.offset);
        let mut rest = b;
        for k in (0..d - 2).rev() {
            let c = (rest % t.dims[k]) as isize;
            rest /= t.dims[k];
            so += c * t.load.strides[k];
            doff += c * t.store.strides[k];
        }
        let r0 = rb * B;
        let nr = B.min(rows - r0);
        // SAFETY: forwarded from `run`'s contract; this task writes only output rows
        // `r0..r0 + nr` of batch element `b`, which no other task writes (injective store).
        // The AVX-512 copy of the loop runs only where the CPU has those features.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            if avx512 {
                block_row_avx512::<T>(t, src, dst, so, doff, r0, nr, cols, stream);
            } else {
                block_row::<T>(t, src, dst, so, doff, r0, nr, cols, stream);
            }
            #[cfg(not(target_arch = "x86_64"))]
            block_row::<T>(t, src, dst, so, doff, r0, nr, cols, stream);
        };
        if stream {
            // The task's streaming stores reach memory before it reports done.
            super::stream::fence();
        }
    };
    let n_tasks = batch * row_blocks;
    if batch * rows * cols < 1 << 15 {
        (0..n_tasks).for_each(task);
    } else {
        (0..n_tasks).into_par_iter().for_each(task);
    }
}

/// [`block_row`] compiled for AVX-512.
///
/// # Safety
/// As [`block_row`], and the CPU supports AVX-512 F/VL/BW/DQ and AVX2.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2")]
unsafe fn block_row_avx512<T: Copy + Default>(
    t: &Transpose<'_>,
    src: ArgPtr,
    dst: ArgPtr,
    so: isize,
    doff: isize,
    r0: usize,
    nr: usize,
    cols: usize,
    stream: bool,
) {
    // SAFETY: forwarded.
    unsafe { block_row::<T>(t, src, dst, so, doff, r0, nr, cols, stream) }
}

/// Output rows `r0..r0 + nr` (at most `B`) of one batch element, block by block; with
/// `stream` (4-byte `T` only), each whole block row through streaming stores.
///
/// # Safety
/// As [`run`]; `so` and `doff` are the batch element's view offsets.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block_row<T: Copy + Default>(
    t: &Transpose<'_>,
    src: ArgPtr,
    dst: ArgPtr,
    so: isize,
    doff: isize,
    r0: usize,
    nr: usize,
    cols: usize,
    stream: bool,
) {
    let stream = stream && std::mem::size_of::<T>() == 4;
    let d = t.dims.len();
    let lc = t.load.strides[d - 1];
    let dr = t.store.strides[d - 2];
    let (sp, dp) = (src.ptr as *const T, dst.ptr as *mut T);
    let mut tile = [[T::default(); B]; B];
    let hints = super::prefetch::enabled();
    let mut c0 = 0;
    while c0 < cols {
        let nc = B.min(cols - c0);
        // Read: output column c0 + c is the input segment of rows r0.. at that column,
        // contiguous (load stride 1 along the output rows).
        for (c, line) in tile.iter_mut().enumerate().take(nc) {
            let at = so + (r0 as isize) + (c0 + c) as isize * lc;
            // The same segment of the next block of columns: its lines are in other pages
            // than this one's, where the hardware prefetchers do not follow.
            if hints {
                hint_lines(sp.wrapping_offset(at + B as isize * lc), nr, false);
            }
            // Offsets `at .. at + nr` are the load view's offsets of output coordinates
            // (r0..r0 + nr, c0 + c), inside the source buffer.
            if nr == B {
                // A fixed-size copy compiles to a few vector moves (a slice copy of this
                // length would be a call to memmove).
                // SAFETY: `B` elements from `at`, inside the source (above); `[T; B]` has
                // `T`'s alignment and the read is a plain copy of initialized memory.
                *line = unsafe { std::ptr::read(sp.offset(at) as *const [T; B]) };
                continue;
            }
            // SAFETY: `nr` elements from `at`, inside the source (above).
            let seg = unsafe { std::slice::from_raw_parts(sp.offset(at), nr) };
            line[..nr].copy_from_slice(seg);
        }
        // Write: output row r0 + r, columns c0..c0 + nc, from the tile's column r.
        for r in 0..nr {
            let at = doff + (r0 + r) as isize * dr + c0 as isize;
            if stream && nc == B {
                let mut out = [T::default(); B];
                for (x, line) in out.iter_mut().zip(&tile) {
                    *x = line[r];
                }
                // SAFETY: `T` is 4 bytes (checked above; `try_run` uses u32 for them), so
                // `out` is `B` u32 values; the destination range is as below.
                unsafe {
                    let words = std::slice::from_raw_parts(out.as_ptr().cast::<u32>(), B);
                    super::stream::store_u32(dp.offset(at).cast::<u32>(), words);
                }
                continue;
            }
            // This output row's segment of the next block, to be written.
            if hints && !stream {
                hint_lines(dp.wrapping_offset(at + B as isize), B, true);
            }
            // SAFETY: offsets `at .. at + nc` are the store view's offsets of output
            // coordinates (r0 + r, c0..c0 + nc), inside the destination buffer, written
            // only by this task; the source does not overlap them.
            let row = unsafe { std::slice::from_raw_parts_mut(dp.offset(at), nc) };
            for (x, line) in row.iter_mut().zip(&tile) {
                *x = line[r];
            }
        }
        c0 += nc;
    }
}

/// Prefetch hints for the lines of `n` elements from `p`.
#[inline(always)]
fn hint_lines<T>(p: *const T, n: usize, write: bool) {
    super::prefetch::hint_range(p as usize, n * size_of::<T>(), write);
}

#[cfg(test)]
mod tests {
    use crate::{DType, Tensor};

    /// `x.permute(perm).contiguous()` through the block path against index arithmetic,
    /// for each element size, with partial blocks and a batch dimension.
    #[test]
    fn permuted_copies_match_index_arithmetic() {
        for (shape, perm) in [
            (vec![130usize, 70], vec![1usize, 0]),
            (vec![64, 64], vec![1, 0]),
            (vec![3, 100, 65], vec![0, 2, 1]),
            (vec![65, 2, 129], vec![1, 2, 0]),
        ] {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|i| (i % 251) as f32).collect();
            let x = Tensor::from_vec(data.clone(), shape.clone());
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let strides: Vec<usize> = (0..shape.len())
                .map(|d| shape[d + 1..].iter().product())
                .collect();
            let mut want = vec![0f32; n];
            for (i, w) in want.iter_mut().enumerate() {
                let mut rest = i;
                let mut src = 0;
                for d in (0..out_shape.len()).rev() {
                    src += (rest % out_shape[d]) * strides[perm[d]];
                    rest /= out_shape[d];
                }
                *w = data[src];
            }
            for dtype in [DType::F32, DType::F16, DType::U8, DType::F64] {
                // Realized first, so the permuted copy is a kernel of its own (a pending
                // cast would fuse into it and take the interpreter's path).
                let xc = x.cast(dtype);
                xc.realize().unwrap();
                let y = xc.permute(perm.clone()).contiguous();
                let got: Vec<f32> = y.to_vec().unwrap();
                assert_eq!(got, want, "{shape:?} permuted {perm:?} in {dtype:?}");
            }
        }
    }
}
