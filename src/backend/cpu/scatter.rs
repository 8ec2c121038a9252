//! Scatter kernels: reduce values into their indexed places, deterministically. The output
//! starts as the initial value (copied through its view) or at the reduction's identity,
//! then every position of the index's shape combines its value into
//! `position with [axis] = index[position]`. Positions that differ off the axis can never
//! meet, so the work splits over them (rayon); along the axis each task combines in order,
//! so the result does not depend on the thread count.

use super::element::{Num, read, write};
use super::exec::ArgPtr;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::kernel::{Kernel, ScatterSpec};
use crate::ops::ScatterReduce;
use crate::shape::contiguous_strides;
use rayon::prelude::*;

/// Lanes (off-axis positions) one task walks the axis for together, at least.
const LANE_BLOCK: usize = 32;
/// Lanes of one innermost off-axis row one task takes at most.
const ROW_BLOCK: usize = 2048;

/// How the lanes split into blocks, one task each. A block never spans two rows of the
/// innermost off-axis dimension (in a row, consecutive lanes are usually neighbours in
/// memory and share their index, so a row's block adds one run per step: an embedding
/// gradient's rows). Long rows are cut into equal parts of at most [`ROW_BLOCK`] lanes, and
/// into at least as many parts in all as there are threads; short rows go [`LANE_BLOCK`]
/// lanes at a time, as they come. Before this, every block was [`LANE_BLOCK`] lanes, so
/// each index step of a `[8192, 768]` embedding gradient touched 24 separate 128-byte runs
/// of a random row, each in its own pass over the index.
struct LaneBlocks {
    lanes: usize,
    /// Lanes per row that blocks never cross (all the lanes when rows are short).
    row: usize,
    /// Parts per row and lanes per part.
    parts: usize,
    width: usize,
}

impl LaneBlocks {
    fn new(others: &[usize], shape: &[usize], lanes: usize, threads: usize) -> LaneBlocks {
        let row = others.last().map_or(1, |&d| shape[d]);
        let (row, width) = if row <= LANE_BLOCK {
            (lanes, LANE_BLOCK)
        } else {
            let parts = row
                .div_ceil(ROW_BLOCK)
                .max(threads.div_ceil((lanes / row).max(1)))
                .min(row.div_ceil(LANE_BLOCK));
            (row, row.div_ceil(parts))
        };
        LaneBlocks {
            lanes,
            row,
            parts: row.div_ceil(width),
            width,
        }
    }

    fn count(&self) -> usize {
        self.lanes
            .checked_div(self.row)
            .map_or(0, |rows| rows * self.parts)
    }

    /// Lanes `[lo, hi)` of block `b` (empty past a row's end).
    fn lanes(&self, b: usize) -> (usize, usize) {
        let (r, p) = (b / self.parts, b % self.parts);
        let lo = (p * self.width).min(self.row);
        (
            r * self.row + lo,
            r * self.row + (lo + self.width).min(self.row),
        )
    }
}

/// Runs a scatter kernel (`spec` of `kernel`) on bound arguments.
pub(crate) fn run(kernel: &Kernel, spec: &ScatterSpec, args: &[ArgPtr]) -> Result<()> {
    let out = args[spec.out];
    let dtype = kernel.args[spec.out].dtype;
    let vdt = kernel.args[spec.values].dtype;
    let n_out: usize = kernel.shape.iter().product();
    let out_strides = contiguous_strides(&kernel.shape);
    let len = kernel.shape[spec.axis];
    let shape = &spec.index_view.shape;
    let axis = spec.axis;
    // Off-axis positions, each a task's sequence along the axis.
    let others: Vec<usize> = (0..shape.len()).filter(|&d| d != axis).collect();
    let lanes: usize = others.iter().map(|&d| shape[d]).product();
    let along = shape[axis];
    let reduce = spec.reduce;
    match &spec.init {
        // SAFETY: the validator checked the initial value's view lies inside its buffer and
        // has the output's shape and dtype; the output holds `n_out` elements.
        Some((i, view)) => unsafe { copy_view(args[*i], view, out, dtype) },
        None => fill_identity(out, dtype, n_out, reduce),
    }
    if lanes == 0 || along == 0 {
        return Ok(());
    }
    // Element offsets of a lane's first position (axis coordinate 0) in the index, the
    // values and the output; each step along the axis adds the axis strides.
    let lane_base = |q: usize| -> (isize, isize, isize) {
        let mut r = q;
        let (mut bi, mut bv, mut bo) = (spec.index_view.offset, spec.values_view.offset, 0isize);
        for &d in others.iter().rev() {
            let c = (r % shape[d]) as isize;
            r /= shape[d];
            bi += c * spec.index_view.strides[d];
            bv += c * spec.values_view.strides[d];
            bo += c * out_strides[d];
        }
        (bi, bv, bo)
    };
    let (i_step, v_step) = (
        spec.index_view.strides[axis],
        spec.values_view.strides[axis],
    );
    let o_step = out_strides[axis];
    // Lanes go in blocks of consecutive ones, each block walking the axis once with its
    // lanes innermost (neighbouring lanes are usually neighbours in memory). Every lane
    // still adds in axis order, so results do not depend on the blocking or the threads.
    let blocking = LaneBlocks::new(&others, shape, lanes, rayon::current_num_threads());
    let block = |b: usize| -> std::result::Result<(), i64> {
        let (lo, hi) = blocking.lanes(b);
        if lo >= hi {
            return Ok(());
        }
        let bases: Vec<(isize, isize, isize)> = (lo..hi).map(lane_base).collect();
        let (bi0, bv0, bo0) = bases[0];
        // f32 rows (an embedding's gradient): the block's lanes share one index per step
        // and sit side by side in the values and the output, so each step adds one run.
        let rows = reduce == ScatterReduce::Sum
            && dtype == DType::F32
            && vdt == DType::F32
            && bases.iter().enumerate().all(|(i, &(bi, bv, bo))| {
                bi == bi0 && bv == bv0 + i as isize && bo == bo0 + i as isize
            });
        if rows {
            let m = bases.len();
            for j in 0..along as isize {
                // SAFETY: as below (the index offset of the block's first lane at step j).
                let k = unsafe { *(args[spec.index].ptr as *const i64).offset(bi0 + j * i_step) };
                if k < 0 || k as u64 >= len as u64 {
                    return Err(k);
                }
                // SAFETY: the block's lanes are `m` consecutive elements in the values at
                // `bv0 + j·v_step` and in the output at `bo0 + k·o_step` (checked just
                // above), each inside its buffer as below; no other task writes these
                // output elements (they differ off the axis from every other block's).
                unsafe {
                    let v = (args[spec.values].ptr as *const f32).offset(bv0 + j * v_step);
                    let o = (out.ptr as *mut f32).offset(bo0 + k as isize * o_step);
                    let (v, o) = (
                        std::slice::from_raw_parts(v, m),
                        std::slice::from_raw_parts_mut(o, m),
                    );
                    for (o, v) in o.iter_mut().zip(v) {
                        *o += *v;
                    }
                }
            }
            return Ok(());
        }
        for j in 0..along as isize {
            for &(bi, bv, bo) in &bases {
                // SAFETY: the validator checked both views lie inside their buffers, which
                // are at least as large as their arguments declare (checked before the
                // run); `bi + j·i_step` is the view's offset of an in-range coordinate.
                let k = unsafe { *(args[spec.index].ptr as *const i64).offset(bi + j * i_step) };
                if k < 0 || k as u64 >= len as u64 {
                    return Err(k);
                }
                // SAFETY: as for the index: an in-range coordinate of the validated values
                // view.
                let v = unsafe { read(args[spec.values], vdt, bv + j * v_step) };
                let o = bo + k as isize * o_step;
                // SAFETY: `o` is the row-major offset of a coordinate inside the output's
                // shape (off-axis coordinates are below the index's extents, which are at
                // most the output's; the axis coordinate was just checked); positions of
                // different lanes differ off the axis, so no two tasks touch the same
                // element.
                unsafe {
                    let old = read(out, dtype, o);
                    write(out, dtype, o as usize, combine(reduce, old, v));
                }
            }
        }
        Ok(())
    };
    let blocks = blocking.count();
    let bad = if lanes * along < 1 << 14 || blocks == 1 {
        (0..blocks).map(block).find_map(|r| r.err())
    } else {
        (0..blocks)
            .into_par_iter()
            .map(block)
            .find_map_any(|r| r.err())
    };
    match bad {
        Some(k) => Err(KilnError::IndexOutOfRange {
            op: reduce.op_name(),
            index: k,
            size: len,
        }),
        None => Ok(()),
    }
}

/// `old` and `new` combined (in f64 for floats: an f32 result rounds once, exactly as the
/// f32 operation would; half types round through f32, as the tensor API's casts do).
fn combine(r: ScatterReduce, old: Num, new: Num) -> Num {
    match (old, new) {
        (Num::F(a), Num::F(b)) => Num::F(r.combine_f64(a, b)),
        (Num::I(a), Num::I(b)) => Num::I(r.combine_i64(a, b)),
        (Num::F(a), Num::I(b)) => Num::F(r.combine_f64(a, b as f64)),
        (Num::I(a), Num::F(b)) => Num::I(r.combine_i64(a, b as i64)),
    }
}

/// Fills the `n` elements of `out` with the reduction's identity.
fn fill_identity(out: ArgPtr, dtype: DType, n: usize, r: ScatterReduce) {
    let v = if dtype.is_float() {
        Num::F(r.float_identity())
    } else {
        Num::I(r.int_identity(dtype))
    };
    let zero = matches!(v, Num::F(0.0) | Num::I(0));
    let size = dtype.size_bytes();
    // In parallel above a few pages: one thread fills a 150 MB embedding gradient at
    // about half the rate of two.
    let fill = |c: usize| {
        let (lo, hi) = (c * FILL_CHUNK, ((c + 1) * FILL_CHUNK).min(n));
        if zero {
            // SAFETY: the output buffer holds at least `n` elements of `dtype` (checked
            // before the run); chunks are disjoint and nothing else accesses the buffer
            // during the kernel.
            unsafe { std::ptr::write_bytes(out.ptr.add(lo * size), 0, (hi - lo) * size) };
        } else {
            for i in lo..hi {
                // SAFETY: as above, element `i < n`, in this chunk only.
                unsafe { write(out, dtype, i, v) };
            }
        }
    };
    let chunks = n.div_ceil(FILL_CHUNK);
    if chunks > 1 {
        (0..chunks).into_par_iter().for_each(fill);
    } else {
        (0..chunks).for_each(fill);
    }
}

/// Elements per task of [`fill_identity`].
const FILL_CHUNK: usize = 1 << 16;

/// Copies `view` of `src` (the output's shape and dtype) into `out`, row-major.
///
/// # Safety
/// `view` lies inside `src`'s buffer, `out` holds the view's element count of `dtype`, and
/// nothing else writes `out` meanwhile.
unsafe fn copy_view(src: ArgPtr, view: &crate::shape::View, out: ArgPtr, dtype: DType) {
    let shape = &view.shape;
    let n: usize = shape.iter().product();
    if n == 0 {
        return;
    }
    let size = dtype.size_bytes();
    if view.strides == contiguous_strides(shape) {
        // SAFETY: the contract: `n` elements from the view's offset lie in `src`; `out`
        // holds `n` elements; the buffers are distinct (the output is fresh).
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.ptr.offset(view.offset * size as isize),
                out.ptr,
                n * size,
            )
        };
        return;
    }
    let mut coords = vec![0usize; shape.len()];
    let mut off = view.offset;
    for i in 0..n as isize {
        // SAFETY: `off` is the view's offset of an in-range coordinate, inside `src`; `i <
        // n` is inside `out`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.ptr.offset(off * size as isize),
                out.ptr.offset(i * size as isize),
                size,
            )
        };
        for d in (0..shape.len()).rev() {
            coords[d] += 1;
            off += view.strides[d];
            if coords[d] < shape[d] {
                break;
            }
            off -= view.strides[d] * shape[d] as isize;
            coords[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every lane lands in exactly one block, a block never spans two innermost rows, and
    /// a single long row is still split over the threads.
    #[test]
    fn lane_blocks_partition_the_lanes_along_rows() {
        let shapes: &[&[usize]] = &[
            &[7],
            &[8192, 768],
            &[3, 5000],
            &[2, 4, 33],
            &[5, 100, 1],
            &[1, 1],
            &[16, 2, 65],
            &[4, 0, 40],
        ];
        for &shape in shapes {
            for axis in 0..shape.len() {
                let others: Vec<usize> = (0..shape.len()).filter(|&d| d != axis).collect();
                let lanes: usize = others.iter().map(|&d| shape[d]).product();
                let row = others.last().map_or(1, |&d| shape[d]);
                for threads in [1, 2, 3, 16] {
                    let b = LaneBlocks::new(&others, shape, lanes, threads);
                    let mut seen = vec![0u32; lanes];
                    for k in 0..b.count() {
                        let (lo, hi) = b.lanes(k);
                        if lo >= hi {
                            continue;
                        }
                        if row > LANE_BLOCK {
                            assert_eq!(
                                lo / row,
                                (hi - 1) / row,
                                "{shape:?} axis {axis}: block {k} spans rows"
                            );
                            assert!(hi - lo <= ROW_BLOCK.max(LANE_BLOCK));
                        }
                        for s in &mut seen[lo..hi] {
                            *s += 1;
                        }
                    }
                    assert!(
                        seen.iter().all(|&s| s == 1),
                        "{shape:?} axis {axis} threads {threads}"
                    );
                    if row > LANE_BLOCK && lanes == row && threads > 1 {
                        assert!(
                            b.count() >= 2,
                            "{shape:?} axis {axis}: one block for {threads} threads"
                        );
                    }
                }
            }
        }
    }
}
