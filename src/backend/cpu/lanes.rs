//! Lane kernels: running totals (`cumsum`, `cumprod`) and stable sorts (`argsort`) along
//! one axis. A lane is the line of elements that differ only in the axis coordinate; lanes
//! never share an output element, so the work splits over them (rayon) and each lane runs
//! in order, so results do not depend on the thread count.
//!
//! Floats accumulate in f64 and round each output once (half types through f32, as every
//! cast to them does); integers accumulate in i64 with
//! wrapping and are truncated to the output dtype (wrapping again), as the reference
//! evaluator defines them.

use super::element::{Num, read, write};
use super::exec::ArgPtr;
use crate::error::Result;
use crate::kernel::{Kernel, ScanOp};
use crate::shape::{View, contiguous_strides};
use rayon::prelude::*;
use std::cmp::Ordering;

/// Lane geometry shared by scans and sorts.
struct Lanes<'a> {
    shape: &'a [usize],
    axis: usize,
    view: &'a View,
    out_strides: Vec<usize>,
}

impl<'a> Lanes<'a> {
    fn new(kernel: &'a Kernel, view: &'a View, axis: usize) -> Self {
        Lanes {
            shape: &kernel.shape,
            axis,
            view,
            out_strides: contiguous_strides(&kernel.shape)
                .into_iter()
                .map(|s| s as usize)
                .collect(),
        }
    }

    /// The lane length and the input's and output's strides along it.
    fn along(&self) -> (usize, isize, usize) {
        (
            self.shape[self.axis],
            self.view.strides[self.axis],
            self.out_strides[self.axis],
        )
    }

    fn count(&self) -> usize {
        self.shape
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != self.axis)
            .map(|(_, &n)| n)
            .product()
    }

    /// The input offset and output offset of element 0 of lane `q`.
    fn bases(&self, q: usize) -> (isize, usize) {
        let mut r = q;
        let (mut inp, mut out) = (self.view.offset, 0usize);
        for d in (0..self.shape.len()).rev() {
            if d == self.axis {
                continue;
            }
            let c = r % self.shape[d];
            r /= self.shape[d];
            inp += c as isize * self.view.strides[d];
            out += c * self.out_strides[d];
        }
        (inp, out)
    }

    /// Runs `f(lane)` over every lane, in parallel when the work is large.
    fn for_each(&self, f: impl Fn(usize) + Sync + Send) {
        let lanes = self.count();
        let len = self.shape[self.axis];
        if lanes * len < 1 << 14 {
            (0..lanes).for_each(f);
        } else {
            (0..lanes).into_par_iter().for_each(f);
        }
    }
}

/// Runs a scan kernel: `out` holds running `op` totals of `input` (through `view`) along
/// `axis`.
pub(crate) fn scan(
    kernel: &Kernel,
    input: usize,
    view: &View,
    axis: usize,
    op: ScanOp,
    out: usize,
    args: &[ArgPtr],
) -> Result<()> {
    let lanes = Lanes::new(kernel, view, axis);
    let (src, dst) = (args[input], args[out]);
    let (sdt, odt) = (kernel.args[input].dtype, kernel.args[out].dtype);
    let (len, istride, ostride) = lanes.along();
    lanes.for_each(|q| {
        let (ib, ob) = lanes.bases(q);
        let mut acc = match (odt.is_float(), op) {
            (true, ScanOp::Sum) => Num::F(0.0),
            (true, ScanOp::Prod) => Num::F(1.0),
            (false, ScanOp::Sum) => Num::I(0),
            (false, ScanOp::Prod) => Num::I(1),
        };
        for j in 0..len {
            // SAFETY: the offset of an in-range coordinate of the input view, which
            // `Kernel::validate` checked lies inside the buffer (its size was checked
            // before the run).
            let x = unsafe { read(src, sdt, ib + j as isize * istride) };
            acc = match (acc, x, op) {
                (Num::F(a), Num::F(b), ScanOp::Sum) => Num::F(a + b),
                (Num::F(a), Num::F(b), ScanOp::Prod) => Num::F(a * b),
                (Num::F(a), Num::I(b), ScanOp::Sum) => Num::F(a + b as f64),
                (Num::F(a), Num::I(b), ScanOp::Prod) => Num::F(a * b as f64),
                (Num::I(a), Num::I(b), ScanOp::Sum) => Num::I(a.wrapping_add(b)),
                (Num::I(a), Num::I(b), ScanOp::Prod) => Num::I(a.wrapping_mul(b)),
                (Num::I(a), Num::F(b), ScanOp::Sum) => Num::I(a.wrapping_add(b as i64)),
                (Num::I(a), Num::F(b), ScanOp::Prod) => Num::I(a.wrapping_mul(b as i64)),
            };
            // SAFETY: `ob + j * ostride` is the row-major offset of a coordinate of the
            // kernel's shape, inside the output (validated numel); lanes write disjoint
            // elements.
            unsafe { write(dst, odt, ob + j * ostride, acc) };
        }
    });
    Ok(())
}

/// The sort order of two keys: NaN above every number, -0.0 equal to 0.0.
fn order(a: Num, b: Num) -> Ordering {
    match (a, b) {
        (Num::I(a), Num::I(b)) => a.cmp(&b),
        (Num::F(a), Num::F(b)) => match (a.is_nan(), b.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        },
        // One dtype per input: mixed keys cannot occur; order them as floats regardless.
        (Num::I(a), Num::F(b)) => order(Num::F(a as f64), Num::F(b)),
        (Num::F(a), Num::I(b)) => order(Num::F(a), Num::F(b as f64)),
    }
}

/// Runs an argsort kernel: `out` (i64) holds, for each lane, the stable sorting permutation
/// of `input` along `axis`.
pub(crate) fn argsort(
    kernel: &Kernel,
    input: usize,
    view: &View,
    axis: usize,
    descending: bool,
    out: usize,
    args: &[ArgPtr],
) -> Result<()> {
    let lanes = Lanes::new(kernel, view, axis);
    let (src, dst) = (args[input], args[out]);
    let (sdt, odt) = (kernel.args[input].dtype, kernel.args[out].dtype);
    let (len, istride, ostride) = lanes.along();
    lanes.for_each(|q| {
        let (ib, ob) = lanes.bases(q);
        let keys: Vec<Num> = (0..len)
            // SAFETY: as in `scan`: an in-range coordinate of the validated input view.
            .map(|j| unsafe { read(src, sdt, ib + j as isize * istride) })
            .collect();
        let mut perm: Vec<usize> = (0..len).collect();
        // `sort_by` is stable: equal keys keep their index order in both directions.
        if descending {
            perm.sort_by(|&a, &b| order(keys[b], keys[a]));
        } else {
            perm.sort_by(|&a, &b| order(keys[a], keys[b]));
        }
        for (j, &p) in perm.iter().enumerate() {
            // SAFETY: as in `scan`: an in-bounds row-major offset, disjoint across lanes.
            unsafe { write(dst, odt, ob + j * ostride, Num::I(p as i64)) };
        }
    });
    Ok(())
}
