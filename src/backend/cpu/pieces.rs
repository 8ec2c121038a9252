//! Elementwise kernels split at the edges of their masks.
//!
//! `cat`, `stack`, `pad` and the gradient of a slice read their inputs through masked views:
//! each input is valid in one block of the output and reads as its fill value elsewhere,
//! and a `where` on the position (or a sum) picks the valid one. Evaluated as one program,
//! every run loads every input (filling the masked part), and the picking costs a pass per
//! input: `cat` of three `[2048, 128]` f32 tensors along the last axis took 2.5× a copy of
//! its output on the Intel Xeon test machine.
//!
//! [`split`] takes such a kernel and returns the same computation as one kernel per block
//! between mask edges along one output axis: in each block every view is either wholly
//! valid (its mask dropped, so the load is read in place where it can be) or wholly masked
//! (the load compiles to its fill value and a `Valid` to a constant; a padded `full`, as
//! `cat` uses for its conditions, to its value or its fill), so each block is a plain
//! elementwise program. The blocks cover the output exactly once and none reads what
//! another writes, so they run in any order (or at once) with the same result as the whole
//! kernel, value for value.
//!
//! Two kinds of kernel are split: large ones whose blocks each hold [`MIN_BLOCK_ELEMS`]
//! elements and more (run one after the other, each on every thread), and small ones of at
//! least [`MIN_SMALL_BLOCKS`] blocks of [`MIN_SMALL_BLOCK_ELEMS`] elements and more, whose
//! blocks run at once, one per task ([`parallel_blocks`]): the `K`-tap window stack of a
//! convolution, where every element of the whole kernel would load all `K` inputs.
//!
//! Each block is then simplified ([`simplify`]): a wholly masked load becomes its fill, a
//! `where` on a known condition becomes the side it picks, adding a known `+0` to a value
//! that cannot be `-0` becomes that value, and what no store reads is dropped. A block of a
//! `cat` of `T` inputs then loads and stores one input, and a block of a sum of `T`
//! padded slices (a slice's gradient, summed over the steps of an unrolled loop) adds one,
//! so the whole kernel's work grows with its size, not with `T` times its size.

use crate::dtype::Scalar;
use crate::kernel::{Instr, IrOp, Kernel, ValueId};
use crate::ops::BinaryOp;
use crate::ops::GenKind;
use crate::shape::View;

/// Fewest elements a block may hold in the split axis and those after it (the longest run
/// it can have): shorter runs do not pay for their setup.
const MIN_BLOCK_RUN: usize = 32;
/// Fewest elements a block may hold: blocks run one after the other, each split into
/// parallel tasks of 64K positions (see `exec::for_each_task`), so a smaller block would
/// run on one thread (an optimizer update of a stacked `[2, 384, 128]` state, split in two,
/// took 0.72 ms per step instead of 0.47).
const MIN_BLOCK_ELEMS: usize = 1 << 17;
/// Fewest elements a kernel must have to be split: two blocks.
const MIN_ELEMS: usize = 2 * MIN_BLOCK_ELEMS;
/// Most blocks a kernel is split into.
const MAX_BLOCKS: usize = 1024;
/// Fewest blocks a small kernel (blocks under [`MIN_BLOCK_ELEMS`]) is split into: with
/// two, the whole kernel loads each element's input twice, which its two parallel tasks
/// repay (a `[256, 256]` cat of two stayed as fast unsplit); with three and more the
/// loads saved win. The nine-tap window stack of a small CNN (`[16, 9, 4, 4, 64]`) took
/// 1.26 ms as one kernel.
const MIN_SMALL_BLOCKS: usize = 3;
/// Fewest elements a small kernel's block may hold (a block runs as one task).
const MIN_SMALL_BLOCK_ELEMS: usize = 1 << 12;
/// From this many blocks on, a block may be as small as [`MIN_MANY_BLOCK_ELEMS`]: unsplit,
/// every element would evaluate all the blocks' inputs (a stack of 256 steps' `[16, 64]`
/// gradients took 13 ms as one kernel).
const MANY_BLOCKS: usize = 16;
/// Fewest elements a block may hold when there are [`MANY_BLOCKS`] or more.
const MIN_MANY_BLOCK_ELEMS: usize = 1 << 9;

/// Whether the blocks [`split`] returned for a kernel of `numel` elements in `blocks`
/// blocks are small ones, to be run at once rather than one after the other.
pub(super) fn parallel_blocks(numel: usize, blocks: usize) -> bool {
    blocks >= MIN_SMALL_BLOCKS && numel < blocks * MIN_BLOCK_ELEMS
}

/// The blocks of `k` between mask edges along one output axis, or `None` where `k` is not
/// a plain elementwise kernel with masked views, or its blocks would be too small or too
/// many (see the module docs).
pub(super) fn split(k: &Kernel) -> Option<Vec<Kernel>> {
    let plain = k.matmul.is_none()
        && k.special.is_none()
        && k.reduce_axes.is_empty()
        && k.args.iter().all(|a| !a.in_place)
        && k.ops.iter().all(|ins| {
            matches!(
                ins.op,
                IrOp::Load { .. }
                    | IrOp::Valid { .. }
                    | IrOp::Generate {
                        kind: GenKind::Full,
                        ..
                    }
                    | IrOp::Const(_)
                    | IrOp::Param { .. }
                    | IrOp::Unary(..)
                    | IrOp::Binary(..)
                    | IrOp::Where(..)
                    | IrOp::Cast(_)
                    | IrOp::Store { .. }
            )
        });
    let numel: usize = k.shape.iter().product();
    if !plain
        || numel < MIN_SMALL_BLOCKS * MIN_SMALL_BLOCK_ELEMS.min(MANY_BLOCKS * MIN_MANY_BLOCK_ELEMS)
    {
        return None;
    }
    // A buffer that is stored must not be loaded: a block could then read what an earlier
    // block wrote.
    let stored: Vec<usize> = k
        .ops
        .iter()
        .filter_map(|ins| match ins.op {
            IrOp::Store { arg, .. } => Some(arg),
            _ => None,
        })
        .collect();
    let loads_stored = k
        .ops
        .iter()
        .any(|ins| matches!(ins.op, IrOp::Load { arg, .. } if stored.contains(&arg)));
    if loads_stored {
        return None;
    }
    // The axis whose mask edges give the most blocks that are large enough (the last such
    // axis on a tie): the more blocks, the fewer inputs each still loads. Along the join
    // axis of a stack whose inputs are also padded there are more blocks than along a
    // padded axis, which would leave every block loading all the joined inputs.
    let mut best: Option<(usize, Vec<usize>)> = None;
    for d in (0..k.shape.len()).rev() {
        let Some(edges) = edges_along(k, d) else {
            continue;
        };
        let inner: usize = k.shape[d + 1..].iter().product();
        let outer = numel / (k.shape[d] * inner);
        let at_least = |elems: usize| {
            edges.windows(2).all(|w| {
                let run = (w[1] - w[0]) * inner;
                run >= MIN_BLOCK_RUN && run * outer >= elems
            })
        };
        let blocks = edges.len() - 1;
        let smallest = if blocks >= MANY_BLOCKS {
            MIN_MANY_BLOCK_ELEMS
        } else {
            MIN_SMALL_BLOCK_ELEMS
        };
        let fits = blocks <= MAX_BLOCKS
            && ((numel >= MIN_ELEMS && at_least(MIN_BLOCK_ELEMS))
                || (blocks >= MIN_SMALL_BLOCKS && at_least(smallest)));
        if fits && best.as_ref().is_none_or(|(_, e)| e.len() < edges.len()) {
            best = Some((d, edges));
        }
    }
    let (axis, edges) = best?;
    Some(
        edges
            .windows(2)
            .map(|w| block(k, axis, w[0], w[1]))
            .collect(),
    )
}

/// `0`, the mask edges strictly inside dimension `d`, and its length, in order; `None`
/// when no view's mask has an edge inside it.
fn edges_along(k: &Kernel, d: usize) -> Option<Vec<usize>> {
    let len = k.shape[d];
    let mut edges = vec![0, len];
    for ins in &k.ops {
        let view = match &ins.op {
            IrOp::Load { view, .. } | IrOp::Valid { view } | IrOp::Generate { view, .. } => view,
            _ => continue,
        };
        if let Some(m) = &view.mask {
            let (lo, hi) = m[d];
            edges.extend([lo, hi].into_iter().filter(|&e| e > 0 && e < len));
        }
    }
    edges.sort_unstable();
    edges.dedup();
    (edges.len() > 2).then_some(edges)
}

/// The part of `k` at positions `[lo, hi)` of dimension `d`, simplified.
fn block(k: &Kernel, d: usize, lo: usize, hi: usize) -> Kernel {
    let mut b = k.clone();
    b.shape[d] = hi - lo;
    for ins in &mut b.ops {
        match &mut ins.op {
            IrOp::Load { view, .. }
            | IrOp::Valid { view }
            | IrOp::Generate { view, .. }
            | IrOp::Store { view, .. } => {
                narrow(view, d, lo, hi);
            }
            _ => {}
        }
    }
    simplify(&mut b);
    b
}

/// Whether `c` is `+0` (an integer 0, or a float zero with a positive sign).
fn is_plus_zero(c: Scalar) -> bool {
    match c {
        Scalar::Int(0) => true,
        Scalar::Float(v) => v == 0.0 && v.is_sign_positive(),
        _ => false,
    }
}

/// Rewrites a block's instructions to what they compute within it, value for value:
/// - a load or generator whose view is wholly masked becomes its fill, and a `Valid` test
///   a constant;
/// - `where(c, a, b)` with a constant `c` becomes `a` or `b`;
/// - `x + 0` (or `0 + x`) becomes `x` where `x` cannot be `-0.0` (an integer, a constant
///   other than `-0.0`, or itself the result of adding `+0`, which is never `-0.0` in
///   round-to-nearest); otherwise the sum is kept (it turns `-0.0` into `+0.0`);
/// - instructions no store reads are dropped, and the rest renumbered in order.
fn simplify(k: &mut Kernel) {
    let n = k.ops.len();
    // What each value is replaced by (itself unless forwarded), and whether it can be -0.
    let mut to: Vec<ValueId> = (0..n).collect();
    let mut never_minus_zero = vec![false; n];
    let konst = |ops: &[Instr], v: ValueId| match ops[v].op {
        IrOp::Const(c) => Some(c),
        _ => None,
    };
    for v in 0..n {
        let remapped = remap(&k.ops[v].op, &to);
        k.ops[v].op = remapped;
        let dtype = k.ops[v].dtype;
        let same = |ops: &[Instr], a: ValueId| ops[a].dtype == dtype;
        match k.ops[v].op.clone() {
            IrOp::Load { view, fill, .. } | IrOp::Generate { view, fill, .. }
                if view.is_fully_masked() =>
            {
                k.ops[v].op = IrOp::Const(fill);
            }
            IrOp::Valid { view } if view.mask.is_none() => {
                k.ops[v].op = IrOp::Const(Scalar::Bool(true));
            }
            IrOp::Valid { view } if view.is_fully_masked() => {
                k.ops[v].op = IrOp::Const(Scalar::Bool(false));
            }
            IrOp::Where(c, a, b) => {
                if let Some(Scalar::Bool(pick)) = konst(&k.ops, c) {
                    let side = if pick { a } else { b };
                    if same(&k.ops, side) {
                        to[v] = side;
                    }
                }
            }
            IrOp::Binary(BinaryOp::Add, a, b) if dtype != crate::dtype::DType::Bool => {
                let zero = |x: ValueId| konst(&k.ops, x).is_some_and(is_plus_zero);
                let plain = |x: ValueId| !dtype.is_float() || never_minus_zero[x];
                if zero(b) && plain(a) && same(&k.ops, a) {
                    to[v] = a;
                } else if zero(a) && plain(b) && same(&k.ops, b) {
                    to[v] = b;
                } else if zero(a) || zero(b) {
                    never_minus_zero[v] = true;
                }
            }
            _ => {}
        }
        if let IrOp::Const(c) = k.ops[v].op {
            never_minus_zero[v] =
                !matches!(c, Scalar::Float(x) if x == 0.0 && x.is_sign_negative());
        }
        if to[v] != v {
            never_minus_zero[v] = never_minus_zero[to[v]];
        }
    }
    // Keep what the stores read.
    let mut live = vec![false; n];
    for v in (0..n).rev() {
        if matches!(k.ops[v].op, IrOp::Store { .. }) {
            live[v] = true;
        }
        if live[v] && to[v] == v {
            for o in k.ops[v].operands() {
                live[o] = true;
            }
        }
    }
    let mut new_id = vec![usize::MAX; n];
    let mut kept = Vec::with_capacity(n);
    for (v, ins) in std::mem::take(&mut k.ops).into_iter().enumerate() {
        if live[v] && to[v] == v {
            new_id[v] = kept.len();
            kept.push(Instr {
                op: remap(&ins.op, &new_id),
                ..ins
            });
        }
    }
    k.ops = kept;
}

/// `op` with every operand `v` replaced by `to[v]`.
fn remap(op: &IrOp, to: &[ValueId]) -> IrOp {
    let mut op = op.clone();
    op.map_operands(|v| to[v]);
    op
}

/// Restricts `view` to positions `[lo, hi)` of dimension `d` (renumbered from 0). A mask
/// that then covers the whole view is dropped.
fn narrow(view: &mut View, d: usize, lo: usize, hi: usize) {
    view.offset += lo as isize * view.strides[d];
    view.shape[d] = hi - lo;
    if let Some(m) = &mut view.mask {
        let (a, b) = m[d];
        let a = a.clamp(lo, hi) - lo;
        let b = b.clamp(lo, hi) - lo;
        m[d] = (a, b.max(a));
        let whole = m
            .iter()
            .zip(&view.shape)
            .all(|(&(a, b), &n)| a == 0 && b >= n);
        if whole {
            view.mask = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    #[test]
    fn narrowing_shifts_the_offset_and_drops_a_mask_that_covers_the_block() {
        let mut v = View {
            shape: vec![4, 300],
            strides: vec![300, 1],
            offset: 7,
            mask: Some(vec![(0, 4), (100, 200)]),
        };
        let mut inside = v.clone();
        narrow(&mut inside, 1, 100, 200);
        assert_eq!(inside.offset, 107);
        assert_eq!(inside.shape, vec![4, 100]);
        assert_eq!(inside.mask, None);
        narrow(&mut v, 1, 200, 300);
        assert_eq!(v.offset, 207);
        assert_eq!(v.mask, Some(vec![(0, 4), (0, 0)]));
        assert!(v.is_fully_masked());
    }

    /// The kernels a realize of `t` plans (fused).
    fn kernels_of(t: &Tensor) -> Vec<Kernel> {
        let plan = t.plan(&crate::RealizeOptions::default()).expect("plans");
        plan.kernels().map(|pk| pk.kernel.clone()).collect()
    }

    #[test]
    fn cat_along_the_last_axis_splits_at_each_input() {
        let a = Tensor::randn_seeded([1024, 128], 1);
        let b = Tensor::randn_seeded([1024, 192], 2);
        let c = Tensor::randn_seeded([1024, 160], 3);
        for x in [&a, &b, &c] {
            x.realize().expect("realizes");
        }
        let t = Tensor::cat(&[&a, &b, &c], 1);
        let ks = kernels_of(&t);
        assert_eq!(ks.len(), 1, "cat of realized inputs is one kernel");
        let k = &ks[0];
        let blocks = split(k).expect("splits");
        let widths: Vec<usize> = blocks.iter().map(|b| b.shape[1]).collect();
        assert_eq!(widths, vec![128, 192, 160]);
        for b in &blocks {
            b.validate().expect("each block is a valid kernel");
        }
    }

    #[test]
    fn a_small_stack_of_padded_windows_splits_along_the_stacked_axis() {
        // Nine taps of a padded [16, 6, 6, 64] input stacked on axis 1: the pad's mask
        // edges on axes 2 and 3 give fewer blocks, each still loading all nine taps.
        let x = Tensor::randn_seeded([16, 6, 6, 64], 6);
        x.realize().expect("realizes");
        let p = x.pad(&[(0, 0), (1, 1), (1, 1)], 0.0);
        let taps: Vec<Tensor> = (0..9)
            .map(|k| {
                let (i, j) = ((k / 3) as isize, (k % 3) as isize);
                p.slice(&[(0, 16, 1), (i, i + 4, 2), (j, j + 4, 2)])
            })
            .collect();
        let stacked = Tensor::stack(&taps.iter().collect::<Vec<_>>(), 1);
        let ks = kernels_of(&stacked);
        assert_eq!(ks.len(), 1);
        let blocks = split(&ks[0]).expect("split");
        assert_eq!(blocks.len(), 9);
        assert!(blocks.iter().all(|b| b.shape == [16, 1, 2, 2, 64]));
        assert!(parallel_blocks(ks[0].shape.iter().product(), blocks.len()));
    }

    /// Loads and adds left in each block of `k`.
    fn loads_and_adds(blocks: &[Kernel]) -> Vec<(usize, usize)> {
        blocks
            .iter()
            .map(|b| {
                let loads = b
                    .ops
                    .iter()
                    .filter(|i| matches!(i.op, IrOp::Load { .. }))
                    .count();
                let adds = (b.ops.iter())
                    .filter(|i| matches!(i.op, IrOp::Binary(BinaryOp::Add, ..)))
                    .count();
                (loads, adds)
            })
            .collect()
    }

    #[test]
    fn blocks_of_a_long_cat_or_sum_of_slices_keep_only_their_own_input() {
        let parts: Vec<Tensor> = (0..64)
            .map(|i| Tensor::randn_seeded([1, 16, 256], 100 + i))
            .collect();
        for p in &parts {
            p.realize().expect("realizes");
        }
        let cat = Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0);
        let ks = kernels_of(&cat);
        assert_eq!(ks.len(), 1);
        let blocks = split(&ks[0]).expect("splits");
        assert_eq!(blocks.len(), 64);
        assert!(
            loads_and_adds(&blocks)
                .iter()
                .all(|&(l, a)| (l, a) == (1, 0))
        );
        for b in &blocks {
            b.validate().expect("each block is a valid kernel");
        }
        // A slice's gradient, summed over 64 steps: each block adds one +0 at most.
        let mut sum: Option<Tensor> = None;
        for (i, p) in parts.iter().enumerate() {
            let padded = p.pad(&[(i, 63 - i), (0, 0), (0, 0)], 0.0);
            sum = Some(match sum {
                Some(s) => s + padded,
                None => padded,
            });
        }
        let sum = sum.expect("64 parts");
        let ks = kernels_of(&sum);
        assert_eq!(ks.len(), 1);
        let blocks = split(&ks[0]).expect("splits");
        assert_eq!(blocks.len(), 64);
        assert!(
            loads_and_adds(&blocks)
                .iter()
                .all(|&(l, a)| l == 1 && a <= 1)
        );
        for b in &blocks {
            b.validate().expect("each block is a valid kernel");
        }
    }

    #[test]
    fn a_simplified_sum_of_slices_still_turns_minus_zero_into_plus_zero() {
        // Unsplit, `-0 + 0 + .. + 0` is `+0`: the blocks must give the same bits.
        let parts: Vec<Tensor> = (0..8)
            .map(|i| Tensor::full([1, 64, 128], if i % 2 == 0 { -0.0 } else { -1.5 }))
            .collect();
        for p in &parts {
            p.realize().expect("realizes");
        }
        let build = || {
            let mut sum = parts[0].pad(&[(0, 7), (0, 0), (0, 0)], 0.0);
            for (i, p) in parts.iter().enumerate().skip(1) {
                sum = sum + p.pad(&[(i, 7 - i), (0, 0), (0, 0)], 0.0);
            }
            sum
        };
        let fused = build();
        assert!(kernels_of(&fused).iter().any(|k| split(k).is_some()));
        let got: Vec<u32> = fused
            .to_vec::<f32>()
            .expect("reads")
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let unfused = build();
        unfused
            .realize_with(&crate::RealizeOptions::unfused())
            .expect("realizes");
        let want: Vec<u32> = unfused
            .to_vec::<f32>()
            .expect("reads")
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got, want);
        assert_eq!(got[0], 0.0f32.to_bits());
    }

    #[test]
    fn small_blocks_small_kernels_and_reductions_are_not_split() {
        // A pad of 1: blocks of one column (runs too short) or one row (too few elements).
        let x = Tensor::randn_seeded([512, 256], 4);
        x.realize().expect("realizes");
        let padded = x.pad(&[(1, 1), (1, 1)], 0.0) * 2.0;
        assert!(kernels_of(&padded).iter().all(|k| split(k).is_none()));
        // Too few elements.
        let a = Tensor::randn_seeded([256, 128], 5);
        a.realize().expect("realizes");
        let small = Tensor::cat(&[&a, &a], 1);
        assert!(kernels_of(&small).iter().all(|k| split(k).is_none()));
        // A reduction over a padded view.
        let s = Tensor::cat(&[&x, &x], 1).sum(1);
        assert!(kernels_of(&s).iter().all(|k| split(k).is_none()));
    }
}
