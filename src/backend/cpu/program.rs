//! Compiles a [`Kernel`] into a [`CpuKernel`] the CPU executor runs: reduce axes moved last,
//! dimensions coalesced where every view allows it, instructions split into phases (one per
//! round of reductions, then the final stores), registers assigned, and a loop strategy
//! chosen.

use crate::dtype::{ComputeType, DType, Scalar};

use crate::kernel::{IrOp, Kernel, Level};
use crate::ops::{BinaryOp, Cost, GenKind, Scal, UnaryOp};
use crate::shape::View;

/// Elements per register (one run of a loop).
pub(crate) const CHUNK: usize = 1024;

/// A view over the program's coalesced dimensions (all of them for `Elem`, the first
/// `n_out` for `Row`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PView {
    pub strides: Vec<isize>,
    pub offset: isize,
    pub mask: Option<Vec<(usize, usize)>>,
    /// Loads: runs can be read in place (no mask, unit stride, no conversion).
    pub borrow: bool,
}

impl PView {
    /// Offset of the run starting at `coords` (run dimension `ax` at `coords[ax]`), and
    /// whether every dimension other than `ax` is inside the mask.
    #[inline(always)]
    pub fn base(&self, coords: &[usize], ax: usize) -> (isize, bool) {
        let mut off = self.offset;
        let mut ok = true;
        for (d, (&c, &s)) in coords.iter().zip(&self.strides).enumerate() {
            off += c as isize * s;
            if d != ax
                && let Some(m) = &self.mask
            {
                ok &= c >= m[d].0 && c < m[d].1;
            }
        }
        (off, ok)
    }

    /// Valid sub-range `[lo, hi)` of a run of `n` starting at `c0` along `ax`, relative to
    /// the run start.
    #[inline(always)]
    pub fn run_valid(&self, ax: usize, c0: usize, n: usize) -> (usize, usize) {
        match &self.mask {
            None => (0, n),
            Some(m) => {
                let (lo, hi) = m[ax];
                let a = lo.saturating_sub(c0).min(n);
                let b = hi.saturating_sub(c0).min(n).max(a);
                (a, b)
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct PInstr {
    /// The kernel IR op with views over the program's coalesced dimensions.
    pub op: IrOp<PView>,
    /// The op's constant (`Const`) or fill value (`Load`, `Generate`) in its compute type.
    pub scal: Scal,
    pub dtype: DType,
    pub level: Level,
    /// Register for `Row` values (and reduce accumulators); `usize::MAX` if none.
    pub row_reg: usize,
    /// Second register for arg-reductions (the best value so far).
    pub aux_reg: usize,
    /// Evaluated together with its one operand that it absorbed (see [`plan_pairs`]).
    pub pair: Option<Pair>,
    /// Absorbed into its only reader's [`Pair`]: never evaluated on its own.
    pub folded: bool,
    /// Writes its run straight into this `Store` instruction's buffer, which then does
    /// nothing (see [`plan_direct_stores`]).
    pub direct: Option<usize>,
    /// A `Store` whose value was written by its source instruction (`direct`).
    pub stored_by_src: bool,
    /// A row `Reduce` that reads its 16-bit float source straight from memory, widening
    /// each value inside the reduction loop (the `Load` is not evaluated; see
    /// [`plan_half_reduces`]).
    pub half_src: bool,
    /// An f32 value saved for later passes (see [`plan_reuse`]) that its pass computes
    /// straight into the saved buffer instead of a register copied there.
    pub save_direct: bool,
    /// A `Store` written with non-temporal (streaming) stores: see [`plan_streams`].
    pub stream: bool,
}

/// Two f32 ops evaluated in one loop: a binary `outer(inner(x, y), z)` (or
/// `outer(z, inner(x, y))` when `z_left`), or a unary `op(inner(x, y))` (`z` unused), or,
/// when `negate`, a unary `op(-x)` (`y` is `x`, `z` and `inner` unused). The inner op's
/// value is never written to a register, which saves one pass over the run (`a * b + c`
/// reads its three operands and writes its result once; `exp(x - max)` and `exp(-x)` are
/// one loop each).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Pair {
    /// A unary pair over a negation (`exp(-x)`): the negation, exact, in the loop.
    pub negate: bool,
    pub inner: BinaryOp,
    pub x: usize,
    pub y: usize,
    pub outer: BinaryOp,
    pub z: usize,
    pub z_left: bool,
}

impl PInstr {
    pub fn ct(&self) -> ComputeType {
        self.dtype.compute()
    }
}

/// One pass over the reduce space.
#[derive(Debug, Clone, Default)]
pub(crate) struct Phase {
    /// Reductions completed by this pass.
    pub reduces: Vec<usize>,
    /// `Elem` instructions evaluated at every step, in dependency order.
    pub elem: Vec<usize>,
    /// `Elem` stores performed at every step.
    pub stores: Vec<usize>,
    /// `Row` instructions computable once this pass is done.
    pub row_after: Vec<usize>,
    /// Register of each `Elem` instruction in this pass (`usize::MAX` = borrowed or none).
    pub regs: Vec<usize>,
    /// Values this pass computes and saves for later passes (see [`plan_reuse`]).
    pub saves: Vec<usize>,
    /// Values this pass reads from an earlier pass's save instead of recomputing them.
    pub reuses: Vec<usize>,
    /// `elem` without what `reuses` makes unnecessary.
    pub elem_reusing: Vec<usize>,
    /// Packed runs (see [`CpuKernel::pack`]): the `Row` values this pass's `Elem` work
    /// reads, expanded across each row's segment before every run.
    pub row_operands: Vec<usize>,
}

/// Which dimension runs innermost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// Runs along the last output dimension; reductions accumulate per position
    /// (elementwise kernels, column reductions).
    OutInner,
    /// Runs along the last reduce dimension; each output row is reduced in turn (row
    /// reductions, softmax over the last axis).
    ReduceInner,
}

/// An executable program.
#[derive(Debug, Clone)]
pub(crate) struct CpuKernel {
    /// Coalesced dimensions: output dimensions first, then reduce dimensions.
    pub dims: Vec<usize>,
    pub n_out: usize,
    pub instrs: Vec<PInstr>,
    /// `Row` instructions needing no reduction, computed before the first pass.
    pub row_first: Vec<usize>,
    /// Reduction passes, then the final pass (which holds the `Elem` stores, if any).
    pub phases: Vec<Phase>,
    /// `Row` stores, done last.
    pub row_stores: Vec<usize>,
    pub strategy: Strategy,
    pub n_regs: usize,
    /// Buffer arguments that are also written (matmul epilogues): never borrowed.
    pub has_reduce: bool,
    /// Slot of each instruction saved across passes (`usize::MAX` if none), and the count.
    pub reuse_slot: Vec<usize>,
    pub n_reuse: usize,
    /// How many rows share one run, each row a segment of the run dimension's length
    /// ([`CpuKernel::pack_axes`]); 1 = one row per run. See [`pack_rows`].
    pub pack: usize,
    /// Packed runs: the register each `Row` value read by `Elem` work is expanded into
    /// (`usize::MAX` if none).
    pub exp_reg: Vec<usize>,
    /// Packed runs: a register sources are read into one row segment at a time.
    pub scratch_reg: usize,
    /// Some store streams ([`PInstr::stream`]): each task ends with a store fence.
    pub streams: bool,
}

impl CpuKernel {
    pub fn rows(&self) -> usize {
        self.dims[..self.n_out].iter().product()
    }
    pub fn reduce_len(&self) -> usize {
        self.dims[self.n_out..].iter().product()
    }
    /// Packed runs: `(row axis, run axis)`. A row reduction packs output rows, each a
    /// segment of its one reduce dimension; an elementwise kernel packs rows of its
    /// next-to-last output dimension, each a segment of its last; a column reduction packs
    /// positions of its last reduce dimension, each a segment of its (short) output run.
    pub fn pack_axes(&self) -> (usize, usize) {
        pack_axes(self.strategy, self.has_reduce, self.dims.len(), self.n_out)
    }
}

/// Compiles `k`. `in_place` lists args that are read and written by the same kernel.
pub(crate) fn compile(k: &Kernel, in_place: &[usize]) -> CpuKernel {
    let nd = k.shape.len();
    let mut out_dims: Vec<usize> = (0..nd).filter(|d| !k.reduce_axes.contains(d)).collect();
    if let Some(d) = long_run_dim(k) {
        out_dims.retain(|&x| x != d);
        out_dims.push(d);
    }
    let perm: Vec<usize> = out_dims.iter().chain(&k.reduce_axes).copied().collect();
    let n_out0 = out_dims.len();
    let mut dims: Vec<usize> = perm.iter().map(|&d| k.shape[d]).collect();

    // Convert views to the permuted order: Elem views permute; Row views are already over O.
    let conv = |v: &View, level: Level| -> PView {
        match level {
            Level::Elem => PView {
                strides: perm.iter().map(|&d| v.strides[d]).collect(),
                offset: v.offset,
                mask: v
                    .mask
                    .as_ref()
                    .map(|m| perm.iter().map(|&d| m[d]).collect()),
                borrow: false,
            },
            Level::Row => PView {
                strides: v.strides.clone(),
                offset: v.offset,
                mask: v.mask.clone(),
                borrow: false,
            },
        }
    };
    let mut instrs: Vec<PInstr> = k
        .ops
        .iter()
        .map(|ins| {
            let lv = ins.level;
            let conv_op = |op: &IrOp| op.map_view(|v| conv(v, lv));
            let (op, scal) = match &ins.op {
                // Fully masked reads are their fill value.
                IrOp::Load { view, fill, .. }
                | IrOp::Generate { view, fill, .. }
                | IrOp::Gather { view, fill, .. }
                    if view.is_fully_masked() =>
                {
                    (IrOp::Const(*fill), *fill)
                }
                IrOp::Valid { view } if view.is_fully_masked() => {
                    (IrOp::Const(Scalar::Bool(false)), Scalar::Bool(false))
                }
                IrOp::Valid { view } if view.mask.is_none() => {
                    (IrOp::Const(Scalar::Bool(true)), Scalar::Bool(true))
                }
                // An unmasked `full` is its parameter, one scalar for the kernel.
                IrOp::Generate {
                    kind: GenKind::Full,
                    params,
                    view,
                    ..
                } if view.mask.is_none() => (IrOp::Param { slot: params[0] }, Scalar::Int(0)),
                IrOp::MatmulResult => {
                    // The product already sits in the output buffer: read it in place.
                    let out = k.matmul.as_ref().map(|m| m.out).unwrap_or(0);
                    let view = conv(&View::contiguous(&k.shape), Level::Elem);
                    let fill = Scalar::Int(0);
                    (
                        IrOp::Load {
                            arg: out,
                            view,
                            fill,
                        },
                        fill,
                    )
                }
                IrOp::Load { fill, .. }
                | IrOp::Generate { fill, .. }
                | IrOp::Gather { fill, .. } => (conv_op(&ins.op), *fill),
                IrOp::Const(s) => (IrOp::Const(*s), *s),
                op => (conv_op(op), Scalar::Int(0)),
            };
            let dtype = ins.dtype;
            PInstr {
                op,
                scal: Scal::from_scalar(scal, dtype),
                dtype,
                level: lv,
                row_reg: usize::MAX,
                aux_reg: usize::MAX,
                pair: None,
                folded: false,
                direct: None,
                stored_by_src: false,
                half_src: false,
                save_direct: false,
                stream: false,
            }
        })
        .collect();
    let has_reduce = instrs.iter().any(|p| matches!(p.op, IrOp::Reduce { .. }));

    // Coalesce dimensions.
    let mut n_out = n_out0;
    coalesce(&mut dims, &mut n_out, &mut instrs);

    // Borrowable loads: Elem level, unit stride along the run dimension, no mask, storage
    // type equal to compute type, not written by this kernel.
    let strategy = choose_strategy(&dims, n_out, has_reduce, &instrs, k);
    let pack = pack_rows(strategy, &dims, n_out, &instrs);
    let (pack_row, pack_run) = pack_axes(strategy, has_reduce, dims.len(), n_out);
    for p in instrs.iter_mut() {
        let run_dim = run_dim(strategy, p.level, &dims, n_out);
        let level = p.level;
        if let IrOp::Load { arg, view, .. } = &mut p.op {
            let same_type = matches!(
                p.dtype,
                DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::U8 | DType::Bool
            );
            // Row values live in their own registers (they are read across passes).
            view.borrow = view.mask.is_none()
                && same_type
                && !in_place.contains(arg)
                && run_dim.is_some_and(|d| view.strides[d] == 1)
                && level == Level::Elem
                // A packed run is read in place only if consecutive rows follow each other.
                && (pack <= 1 || view.strides[pack_row] == dims[pack_run] as isize);
        }
    }

    plan_pairs(&mut instrs);
    let (row_first, mut phases, row_stores, mut n_regs) = plan_phases(k, &mut instrs);
    let mut exp_reg = vec![usize::MAX; instrs.len()];
    let mut scratch_reg = usize::MAX;
    if pack > 1 {
        for ph in phases.iter_mut() {
            let mut ro: Vec<usize> = vec![];
            for &v in ph.elem.iter().chain(&ph.reduces).chain(&ph.stores) {
                for o in operands(&instrs[v]) {
                    let p = &instrs[o];
                    if p.level == Level::Row && p.row_reg != usize::MAX && !ro.contains(&o) {
                        ro.push(o);
                    }
                }
            }
            for &o in &ro {
                if exp_reg[o] == usize::MAX {
                    exp_reg[o] = n_regs;
                    n_regs += 1;
                }
            }
            ph.row_operands = ro;
        }
        scratch_reg = n_regs;
        n_regs += 1;
    }
    let (reuse_slot, n_reuse) = if strategy == Strategy::ReduceInner {
        plan_reuse(
            &instrs,
            &mut phases,
            (pack > 1).then_some((pack_row, pack_run)),
        )
    } else {
        (vec![usize::MAX; instrs.len()], 0)
    };
    for ph in &phases {
        for &v in &ph.saves {
            instrs[v].save_direct = writes_f32_run(&instrs[v]);
        }
    }
    // A packed run is one contiguous stretch of the output only if its rows follow
    // each other there.
    let rows_follow = |v: &PView| pack <= 1 || v.strides[pack_row] == dims[pack_run] as isize;
    let streams = plan_streams(
        k,
        in_place,
        &mut instrs,
        &phases,
        strategy,
        &dims,
        n_out,
        &rows_follow,
    );
    plan_direct_stores(&mut instrs, &phases, strategy, &dims, n_out, rows_follow);
    if pack <= 1 && strategy == Strategy::ReduceInner {
        plan_half_reduces(&mut instrs, &mut phases, &reuse_slot, dims.len() - 1);
    }
    CpuKernel {
        dims,
        n_out,
        instrs,
        row_first,
        phases,
        row_stores,
        strategy,
        n_regs,
        has_reduce,
        reuse_slot,
        n_reuse,
        pack,
        exp_reg,
        scratch_reg,
        streams,
    }
}

/// Rows per run for a row reduction over one short dimension: runs of up to [`CHUNK`]
/// elements then cover several whole rows, each reduced as its own segment (the same
/// summation order as one row per run), so every instruction is dispatched once for all
/// of them instead of once per row.
///
/// Elementwise kernels whose last dimension stays short after coalescing (a view broadcasts
/// a per-row value across it, or repeats a vector along the rows: layer norm's statistics
/// and weights) pack rows of the next-to-last dimension the same way, within one span of it.
///
/// Column reductions with a short output run (a layer norm's weight gradient: 2,048 rows
/// summed into 128 columns) pack positions of the last reduce dimension: the elementwise
/// work runs once over several reduce positions, and the run is then accumulated segment
/// by segment in reduce order (the same order as one position per run). Only where the
/// reducing pass reads no `Row` value and takes no arg-reduction (see `column_block`).
fn pack_rows(strategy: Strategy, dims: &[usize], n_out: usize, instrs: &[PInstr]) -> usize {
    let reduce_dims = dims.len() - n_out;
    // `len`: the run dimension's length (one segment); `span`: the packed dimension's.
    let (len, span) = match strategy {
        Strategy::ReduceInner if reduce_dims == 1 => {
            (dims[n_out], dims[..n_out].iter().product::<usize>())
        }
        Strategy::OutInner if reduce_dims == 0 => {
            let elementwise = instrs
                .iter()
                .all(|p| p.level == Level::Elem && !matches!(p.op, IrOp::Reduce { .. }));
            if !elementwise || n_out < 2 {
                return 1;
            }
            (dims[n_out - 1], dims[n_out - 2])
        }
        Strategy::OutInner if reduce_dims > 0 => {
            let reads_row = instrs.iter().any(|p| {
                p.level == Level::Elem
                    && operands(p)
                        .iter()
                        .any(|&o| instrs[o].level == Level::Row && !is_scalar(&instrs[o].op))
            });
            let arg = instrs
                .iter()
                .any(|p| matches!(p.op, IrOp::Reduce { op, .. } if op.is_arg()));
            if reads_row || arg {
                return 1;
            }
            (dims[n_out - 1], dims[dims.len() - 1])
        }
        _ => return 1,
    };
    if len == 0 || 2 * len > CHUNK || span < 2 {
        return 1;
    }
    (CHUNK / len).min(span)
}

/// `(row axis, run axis)` of packed runs: see [`CpuKernel::pack_axes`].
fn pack_axes(strategy: Strategy, has_reduce: bool, nd: usize, n_out: usize) -> (usize, usize) {
    match strategy {
        Strategy::ReduceInner => (n_out - 1, n_out),
        Strategy::OutInner if has_reduce => (nd - 1, n_out - 1),
        Strategy::OutInner => (n_out.saturating_sub(2), n_out - 1),
    }
}

/// Ops worth saving rather than recomputing (polynomial evaluations, and indexed loads:
/// an index check and a scattered read per element).
fn expensive(op: &IrOp<PView>) -> bool {
    let cost = match op {
        IrOp::Unary(u, _) => u.info().cost,
        IrOp::Binary(b, ..) => b.info().cost,
        IrOp::Gather { .. } => Cost::Polynomial,
        _ => Cost::Cheap,
    };
    cost == Cost::Polynomial
}

/// A value whose recomputation takes at least this many passes over the run is saved by
/// the pass that first computes it rather than recomputed (saving is one pass; reading it
/// back is free: the later pass reads the saved run in place).
const RECOMPUTE_PASSES: usize = 2;

/// Store once instead of recomputing, across the passes of a row reduction: a value a later
/// pass needs that an earlier pass already computed, and whose computation involves a
/// polynomial op or a gather, or at least [`RECOMPUTE_PASSES`] ops (softmax's `exp(x - max)`, needed by the sum and again by the final
/// division), is saved per position in the earlier pass and read back in the later one,
/// which then skips everything only that value needed. Only passes that run over the reduce
/// space (they reduce or store) take part. The executor uses this when a block's saves fit
/// in its per-thread budget and runs the full `elem` lists otherwise.
fn plan_reuse(
    instrs: &[PInstr],
    phases: &mut [Phase],
    packed: Option<(usize, usize)>,
) -> (Vec<usize>, usize) {
    let n = instrs.len();
    let mut slot = vec![usize::MAX; n];
    let mut n_slots = 0;
    // The first running pass that computed each value.
    let mut computed_in = vec![usize::MAX; n];
    for q in 0..phases.len() {
        let ph = &phases[q];
        if ph.reduces.is_empty() && ph.stores.is_empty() {
            continue;
        }
        // Membership in this pass's list, and whether computing a value here involves an
        // expensive op (one sweep: the list is in dependency order).
        let mut in_elem = vec![false; n];
        let mut costly = vec![false; n];
        // Passes over the run that recomputing a value would take (its ops in this pass).
        let mut work = vec![0usize; n];
        for &v in &ph.elem {
            in_elem[v] = true;
            let ops = operands(&instrs[v]);
            let own = match &instrs[v].op {
                IrOp::Unary(..) | IrOp::Binary(..) | IrOp::Where(..) | IrOp::Cast(..) => 1,
                // Packed runs fill a broadcast read across every row segment: one pass.
                IrOp::Load { view, .. }
                    if packed.is_some_and(|(row, run)| {
                        view.strides[run] == 0 || view.strides[row] == 0
                    }) =>
                {
                    1
                }
                _ => 0,
            };
            work[v] = own + ops.iter().map(|&o| work[o]).sum::<usize>();
            costly[v] = expensive(&instrs[v].op)
                || work[v] >= RECOMPUTE_PASSES
                || ops.into_iter().any(|o| costly[o]);
        }
        // Walk back from the pass's consumers; stop at values an earlier pass computed.
        let mut needed = vec![false; n];
        let mut reuses = vec![];
        let mut stack: Vec<usize> = ph
            .reduces
            .iter()
            .chain(&ph.stores)
            .flat_map(|&r| operands(&instrs[r]))
            .collect();
        while let Some(v) = stack.pop() {
            if needed[v] || !in_elem[v] {
                continue;
            }
            if computed_in[v] < q && costly[v] {
                if !reuses.contains(&v) {
                    reuses.push(v);
                }
                continue;
            }
            needed[v] = true;
            stack.extend(operands(&instrs[v]));
        }
        for &v in &reuses {
            if slot[v] == usize::MAX {
                slot[v] = n_slots;
                n_slots += 1;
                let p = computed_in[v];
                phases[p].saves.push(v);
            }
        }
        let elem_reusing: Vec<usize> = phases[q]
            .elem
            .iter()
            .copied()
            .filter(|&v| needed[v])
            .collect();
        for &v in &phases[q].elem {
            if computed_in[v] == usize::MAX {
                computed_in[v] = q;
            }
        }
        phases[q].reuses = reuses;
        phases[q].elem_reusing = elem_reusing;
    }
    (slot, n_slots)
}

/// For an elementwise kernel, a dimension to iterate innermost instead of the last one:
/// - when the last dimension is too short for efficient runs (an output like `[100000, 3]`
///   read through a transpose), the longest dimension along which some input is
///   contiguous;
/// - otherwise, a dimension along which more of the kernel's loads and stores are
///   contiguous than along the last one (a gradient computed batch first from batch-last
///   activations: five loads walk the batch, one store walks the row), so most accesses
///   read whole cache lines and only the minority walk with a stride, which
///   [`super::exec`]'s tiled order keeps in cache.
///
/// Elementwise kernels may visit their elements in any order (generators index by view,
/// not by visit), so this only changes speed. Kernels with a product keep their order: the
/// epilogue runs by rows as the product finishes them.
fn long_run_dim(k: &Kernel) -> Option<usize> {
    const SHORT: usize = 32;
    const LONG: usize = 64;
    const MIN: usize = 16;
    let last = k.shape.len().checked_sub(1)?;
    if !k.reduce_axes.is_empty()
        || k.matmul.is_some()
        || k.ops.iter().any(|o| o.level != Level::Elem)
    {
        return None;
    }
    let contiguous = |d: usize, loads_only: bool| {
        k.ops
            .iter()
            .filter(|o| match &o.op {
                IrOp::Load { view, .. } => !view.is_fully_masked() && view.strides[d].abs() == 1,
                IrOp::Store { view, .. } => !loads_only && view.strides[d].abs() == 1,
                _ => false,
            })
            .count()
    };
    if k.shape[last] < SHORT {
        let short = (0..last)
            .filter(|&d| k.shape[d] >= LONG && contiguous(d, true) > 0)
            .max_by_key(|&d| k.shape[d]);
        if short.is_some() {
            return short;
        }
    }
    let here = contiguous(last, false);
    (0..last)
        .filter(|&d| k.shape[d] >= MIN.min(k.shape[last]).max(2))
        .map(|d| (contiguous(d, false), k.shape[d], d))
        .filter(|&(n, _, _)| n > here)
        .max()
        .map(|(_, _, d)| d)
}

/// The dimension runs go along for values of `level`.
pub(crate) fn run_dim(s: Strategy, level: Level, dims: &[usize], n_out: usize) -> Option<usize> {
    match (s, level) {
        (Strategy::OutInner, _) | (Strategy::ReduceInner, Level::Row) => Some(n_out - 1),
        (Strategy::ReduceInner, Level::Elem) => Some(dims.len() - 1),
    }
}

fn views_mut(p: &mut PInstr) -> Option<&mut PView> {
    p.op.view_mut()
}

/// Drops size-1 dimensions and merges neighbours that every view walks as one run.
/// Afterwards there is at least one output dimension, and at least one reduce dimension if
/// the kernel reduces.
fn coalesce(dims: &mut Vec<usize>, n_out: &mut usize, instrs: &mut [PInstr]) {
    let had_reduce_dims = dims.len() > *n_out;
    for d in (0..dims.len()).rev() {
        if dims[d] == 1 {
            remove_dim(dims, n_out, instrs, d);
        }
    }
    // Check pairs (b-1, b) from the innermost outwards; merging removes index b, which
    // leaves the pairs still to check untouched.
    for b in (1..dims.len()).rev() {
        let a = b - 1;
        let same_group = b < *n_out || a >= *n_out;
        if !same_group || !mergeable(dims, *n_out, instrs, a, b) {
            continue;
        }
        let merged = dims[a] * dims[b];
        for p in instrs.iter_mut() {
            let level = p.level;
            if let Some(v) = views_mut(p)
                && (level == Level::Elem || b < *n_out)
            {
                v.strides[a] = v.strides[b];
                v.strides.remove(b);
                if let Some(m) = &mut v.mask {
                    m[a] = (0, merged);
                    m.remove(b);
                }
            }
        }
        dims[a] = merged;
        dims.remove(b);
        if b < *n_out {
            *n_out -= 1;
        }
    }
    if *n_out == 0 {
        insert_unit_dim(dims, n_out, instrs, 0, true);
    }
    if had_reduce_dims && dims.len() == *n_out {
        let at = dims.len();
        insert_unit_dim(dims, n_out, instrs, at, false);
    }
}

fn mergeable(dims: &[usize], n_out: usize, instrs: &[PInstr], a: usize, b: usize) -> bool {
    instrs.iter().all(|p| {
        let Some(v) = p.op.view() else {
            return true;
        };
        if p.level == Level::Row && b >= n_out {
            return true;
        }
        let masked = v
            .mask
            .as_ref()
            .is_some_and(|m| m[a] != (0, dims[a]) || m[b] != (0, dims[b]));
        !masked && v.strides[a] == v.strides[b] * dims[b] as isize
    })
}

fn remove_dim(dims: &mut Vec<usize>, n_out: &mut usize, instrs: &mut [PInstr], d: usize) {
    for p in instrs.iter_mut() {
        let level = p.level;
        if let Some(v) = views_mut(p)
            && (level == Level::Elem || d < *n_out)
        {
            v.strides.remove(d);
            if let Some(m) = &mut v.mask {
                m.remove(d);
            }
        }
    }
    dims.remove(d);
    if d < *n_out {
        *n_out -= 1;
    }
}

fn insert_unit_dim(
    dims: &mut Vec<usize>,
    n_out: &mut usize,
    instrs: &mut [PInstr],
    at: usize,
    is_out: bool,
) {
    for p in instrs.iter_mut() {
        let level = p.level;
        if let Some(v) = views_mut(p)
            && (level == Level::Elem || is_out)
        {
            v.strides.insert(at, 0);
            if let Some(m) = &mut v.mask {
                m.insert(at, (0, 1));
            }
        }
    }
    dims.insert(at, 1);
    if is_out {
        *n_out += 1;
    }
}

fn choose_strategy(
    dims: &[usize],
    n_out: usize,
    has_reduce: bool,
    instrs: &[PInstr],
    k: &Kernel,
) -> Strategy {
    if !has_reduce || dims.len() == n_out {
        return Strategy::OutInner;
    }
    let la = *dims.last().unwrap_or(&1);
    let lo = dims[n_out - 1];
    let rows: usize = dims[..n_out].iter().product();
    if rows == 1 {
        return Strategy::ReduceInner;
    }
    // Which run dimension do the Elem loads walk with unit stride (weighted by bytes)?
    let (mut w_red, mut w_out) = (0usize, 0usize);
    for p in instrs {
        if let (IrOp::Load { arg, view, .. }, Level::Elem) = (&p.op, p.level) {
            let bytes = k
                .args
                .get(*arg)
                .map(|a| a.numel * a.dtype.size_bytes())
                .unwrap_or(0);
            if view.strides[dims.len() - 1].abs() == 1 {
                w_red += bytes;
            }
            if view.strides[n_out - 1].abs() == 1 {
                w_out += bytes;
            }
        }
    }
    if la < 8 && lo >= 8 {
        return Strategy::OutInner;
    }
    if lo < 8 && la >= 8 {
        return Strategy::ReduceInner;
    }
    if w_red != w_out {
        return if w_red > w_out {
            Strategy::ReduceInner
        } else {
            Strategy::OutInner
        };
    }
    if la >= lo {
        Strategy::ReduceInner
    } else {
        Strategy::OutInner
    }
}

/// Takes the kernel's pass structure and assigns registers: every `Row` value (and reduce
/// accumulator) gets its own register; `Elem` values reuse registers within a pass once
/// their last reader is done.
fn plan_phases(k: &Kernel, instrs: &mut [PInstr]) -> (Vec<usize>, Vec<Phase>, Vec<usize>, usize) {
    let n = instrs.len();
    let kp = k.passes();
    let mut next_reg = 0;
    for p in instrs.iter_mut() {
        let is_row_value = p.level == Level::Row
            && !matches!(
                p.op,
                IrOp::Store { .. } | IrOp::Const(_) | IrOp::Param { .. }
            );
        if is_row_value {
            p.row_reg = next_reg;
            next_reg += 1;
            if let IrOp::Reduce { op, .. } = p.op
                && op.is_arg()
            {
                p.aux_reg = next_reg;
                next_reg += 1;
            }
        }
    }
    let row_regs = next_reg;
    let mut max_regs = row_regs;
    let mut phases = Vec::with_capacity(kp.passes.len());
    for pass in &kp.passes {
        // Fully masked loads became constants: they need no register.
        let elem: Vec<usize> = pass
            .elem
            .iter()
            .copied()
            .filter(|&v| !is_scalar(&instrs[v].op) && !instrs[v].folded)
            .collect();
        let mut last_use = vec![0usize; n];
        for (pos, &v) in elem.iter().enumerate() {
            for o in operands(&instrs[v]) {
                last_use[o] = last_use[o].max(pos);
            }
        }
        for &r in pass.reduces.iter().chain(&pass.stores) {
            for o in operands(&instrs[r]) {
                last_use[o] = elem.len();
            }
        }
        let mut regs = vec![usize::MAX; n];
        let mut free: Vec<usize> = vec![];
        let mut next = row_regs;
        for (pos, &v) in elem.iter().enumerate() {
            if !matches!(&instrs[v].op, IrOp::Load { view, .. } if view.borrow) {
                regs[v] = free.pop().unwrap_or_else(|| {
                    next += 1;
                    next - 1
                });
            }
            let mut ops = operands(&instrs[v]);
            ops.sort_unstable();
            ops.dedup(); // `add %1, %1` frees %1's register once
            for o in ops {
                let elem_operand = instrs[o].level == Level::Elem;
                if last_use[o] == pos && regs[o] != usize::MAX && elem_operand {
                    free.push(regs[o]);
                }
            }
        }
        max_regs = max_regs.max(next);
        phases.push(Phase {
            reduces: pass.reduces.clone(),
            elem,
            stores: pass.stores.clone(),
            row_after: pass.row_after.clone(),
            regs,
            saves: vec![],
            reuses: vec![],
            elem_reusing: vec![],
            row_operands: vec![],
        });
    }
    let row_first = kp
        .row_first
        .iter()
        .copied()
        .filter(|&v| !is_scalar(&instrs[v].op))
        .collect();
    (row_first, phases, kp.row_stores, max_regs.max(1))
}

/// Operands of a program instruction (a [`Pair`]'s three).
pub(crate) fn operands(p: &PInstr) -> Vec<usize> {
    match p.pair {
        Some(pr) if pr.negate => vec![pr.x],
        Some(pr) if matches!(p.op, IrOp::Unary(..)) => vec![pr.x, pr.y],
        Some(pr) => vec![pr.x, pr.y, pr.z],
        None => p.op.operands(),
    }
}

/// How many instructions read each value (a [`Pair`] counts its three operands; `folded`
/// instructions, evaluated inside their pair, count for nothing).
fn reader_counts(instrs: &[PInstr]) -> Vec<usize> {
    let mut readers = vec![0usize; instrs.len()];
    for p in instrs.iter().filter(|p| !p.folded) {
        for o in operands(p) {
            readers[o] += 1;
        }
    }
    readers
}

/// Whether `p` is an f32 `Elem` unary, arithmetic binary or [`Pair`]: the ops the executor
/// can write straight into memory outside its registers (an output run, a saved run).
fn writes_f32_run(p: &PInstr) -> bool {
    let computed = match p.op {
        IrOp::Unary(..) => true,
        IrOp::Binary(op, ..) => !op.is_comparison(),
        _ => false,
    };
    computed && p.dtype == DType::F32 && p.level == Level::Elem
}

/// Lets the last op of a value that is only stored write its run straight into the output
/// buffer instead of a register (saving the store's copy): an f32 unary, arithmetic binary
/// or [`Pair`] `Elem` value whose only reader is an f32 `Store` of the pass that computes
/// it, unmasked and contiguous along the run dimension (and, in packed runs, from one row
/// to the next), into a buffer the kernel reads only as copies of the same run taken
/// earlier in the pass (a matmul epilogue's product, an in-place update's old value), so a
/// run written early is never read, and the write aliases nothing the op reads.
fn plan_direct_stores(
    instrs: &mut [PInstr],
    phases: &[Phase],
    strategy: Strategy,
    dims: &[usize],
    n_out: usize,
    rows_follow: impl Fn(&PView) -> bool,
) {
    let readers = reader_counts(instrs);
    let Some(ax) = run_dim(strategy, Level::Elem, dims, n_out) else {
        return;
    };
    for ph in phases {
        for &s in &ph.stores {
            let (arg, src) = match &instrs[s].op {
                IrOp::Store { arg, view, src }
                    if contiguous_f32_store(&instrs[s], view, ax, &rows_follow)
                        && !instrs[s].stream =>
                {
                    (*arg, *src)
                }
                _ => continue,
            };
            let p = &instrs[src];
            let (store_view, at) = match &instrs[s].op {
                IrOp::Store { view, .. } => (view, ph.elem.iter().position(|&e| e == src)),
                _ => continue,
            };
            // A matmul epilogue reads the output it writes: fine when every such read is a
            // copy of exactly this run's positions, taken earlier in the pass (the product
            // as loaded into a register before the last op overwrites it).
            let read_here = instrs.iter().enumerate().any(|(q, i)| match &i.op {
                IrOp::Load { arg: a, view, .. } if *a == arg => {
                    let pos = ph.elem.iter().position(|&e| e == q);
                    let earlier = matches!((pos, at), (Some(p), Some(a)) if p < a);
                    view.borrow
                        || view.strides != store_view.strides
                        || view.offset != store_view.offset
                        || view.mask.is_some()
                        || !earlier
                }
                IrOp::Gather { arg: a, .. } => *a == arg,
                _ => false,
            });
            if writes_f32_run(p)
                && !read_here
                && readers[src] == 1
                && p.direct.is_none()
                && ph.elem.contains(&src)
            {
                instrs[src].direct = Some(s);
                instrs[s].stored_by_src = true;
            }
        }
    }
}

/// An f32 store whose run is one contiguous stretch of its buffer: unmasked, unit stride
/// along the run dimension `ax`, and (packed runs) rows that follow each other. Direct
/// stores and streaming stores both need it.
fn contiguous_f32_store(
    p: &PInstr,
    view: &PView,
    ax: usize,
    rows_follow: &impl Fn(&PView) -> bool,
) -> bool {
    p.dtype == DType::F32
        && view.mask.is_none()
        && view.strides.get(ax) == Some(&1)
        && rows_follow(view)
}

/// Outputs at least this large are written with streaming stores: they cannot stay in the
/// caches until the next kernel reads them anyway.
pub(crate) const STREAM_MIN_BYTES: usize = 16 << 20;

/// Marks the f32 `Elem` stores of a kernel whose output is at least [`STREAM_MIN_BYTES`]
/// to be written with non-temporal stores (x86-64 only): the line goes to memory without
/// first being read for ownership, which a cacheable store costs, so writing a large
/// output moves half the bytes. Such a store takes its value from a register (no
/// [`plan_direct_stores`]) and needs no prefetch of the lines it writes. Only stores
/// with unit stride along the run dimension, no mask and (packed runs) rows that follow
/// each other, in kernels that read nothing they write (not a matmul epilogue, not an
/// in-place update). Every `Elem` store runs in a task of `exec::items_impl` or
/// `exec::run_packed_rows`, which end with a store fence (column and split reductions
/// store only `Row` values). Returns whether any store streams.
#[allow(clippy::too_many_arguments)]
fn plan_streams(
    k: &Kernel,
    in_place: &[usize],
    instrs: &mut [PInstr],
    phases: &[Phase],
    strategy: Strategy,
    dims: &[usize],
    n_out: usize,
    rows_follow: &impl Fn(&PView) -> bool,
) -> bool {
    let Some(ax) = run_dim(strategy, Level::Elem, dims, n_out) else {
        return false;
    };
    // A kernel updating a buffer in place has just read each line it writes.
    if !cfg!(target_arch = "x86_64") || k.matmul.is_some() || !in_place.is_empty() {
        return false;
    }
    let bytes = dims.iter().product::<usize>().saturating_mul(4);
    if bytes < STREAM_MIN_BYTES {
        return false;
    }
    let mut any = false;
    for ph in phases {
        for &s in &ph.stores {
            let IrOp::Store { arg, view, .. } = &instrs[s].op else {
                continue;
            };
            let reads_own = instrs.iter().any(|q| match &q.op {
                IrOp::Load { arg: a, .. } | IrOp::Gather { arg: a, .. } => a == arg,
                _ => false,
            });
            if instrs[s].level == Level::Elem
                && contiguous_f32_store(&instrs[s], view, ax, rows_follow)
                && !reads_own
            {
                instrs[s].stream = true;
                any = true;
            }
        }
    }
    any
}

/// Row reductions (sum, product, max, min) of an f16 or bf16 tensor read in place: when the
/// reduce's source is an unmasked load, contiguous along the run dimension `ax`, that
/// nothing else reads, no later pass reuses and the kernel does not write, the load leaves the pass's instruction lists
/// and the reduce widens the stored values as it folds them ([`PInstr::half_src`]) instead
/// of a pass widening the run into a register and a second pass reducing it.
fn plan_half_reduces(instrs: &mut [PInstr], phases: &mut [Phase], reuse_slot: &[usize], ax: usize) {
    let readers = reader_counts(instrs);
    for ph in phases.iter_mut() {
        for &r in &ph.reduces {
            let IrOp::Reduce { op, src } = instrs[r].op else {
                continue;
            };
            let direct = matches!(
                &instrs[src].op,
                IrOp::Load { view, .. }
                    if view.mask.is_none() && view.strides.get(ax) == Some(&1)
            );
            let arg = match &instrs[src].op {
                IrOp::Load { arg, .. } => *arg,
                _ => continue,
            };
            let written = instrs
                .iter()
                .any(|q| matches!(&q.op, IrOp::Store { arg: a, .. } if *a == arg));
            if op.is_arg()
                || written
                || !direct
                || !instrs[src].dtype.is_half()
                || instrs[src].level != Level::Elem
                || readers[src] != 1
                || reuse_slot[src] != usize::MAX
            {
                continue;
            }
            instrs[r].half_src = true;
            ph.elem.retain(|&v| v != src);
            ph.elem_reusing.retain(|&v| v != src);
        }
    }
}

/// Finds [`Pair`]s: an f32 `Elem` add, subtract, multiply or divide, or an `exp`, whose
/// operand is an f32 add, subtract, multiply or divide read by
/// nothing else absorbs it (the operand is then `folded`). One level only: an op that
/// absorbed its operand is not absorbed in turn.
fn plan_pairs(instrs: &mut [PInstr]) {
    let n = instrs.len();
    let readers = reader_counts(instrs);
    let arith = |p: &PInstr| -> Option<(BinaryOp, usize, usize)> {
        match p.op {
            IrOp::Binary(op, a, b)
                if p.level == Level::Elem
                    && p.dtype == DType::F32
                    && matches!(
                        op,
                        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
                    ) =>
            {
                Some((op, a, b))
            }
            _ => None,
        }
    };
    let f32_operand = |p: &PInstr| p.dtype == DType::F32;
    for v in 0..n {
        // `exp` over an arithmetic value (softmax's `exp(x - max)`). Only `exp`: every
        // unary op paired would compile its loop once per inner op, operand mix and SIMD
        // level, which multiplied the backend's compile time.
        if let IrOp::Unary(UnaryOp::Exp, a) = instrs[v].op
            && instrs[v].level == Level::Elem
            && instrs[v].dtype == DType::F32
            && readers[a] == 1
            && instrs[a].pair.is_none()
            && let Some((inner, x, y)) = arith(&instrs[a])
            && f32_operand(&instrs[x])
            && f32_operand(&instrs[y])
        {
            instrs[a].folded = true;
            instrs[v].pair = Some(Pair {
                negate: false,
                inner,
                x,
                y,
                outer: inner,
                z: x,
                z_left: false,
            });
            continue;
        }
        // `exp(-x)`: the negation (exact) inside `exp`'s loop.
        if let IrOp::Unary(UnaryOp::Exp, a) = instrs[v].op
            && instrs[v].level == Level::Elem
            && instrs[v].dtype == DType::F32
            && readers[a] == 1
            && instrs[a].pair.is_none()
            && instrs[a].level == Level::Elem
            && instrs[a].dtype == DType::F32
            && let IrOp::Unary(UnaryOp::Neg, x) = instrs[a].op
            && f32_operand(&instrs[x])
        {
            instrs[a].folded = true;
            instrs[v].pair = Some(Pair {
                negate: true,
                inner: BinaryOp::Sub,
                x,
                y: x,
                outer: BinaryOp::Sub,
                z: x,
                z_left: false,
            });
            continue;
        }
        let Some((outer, a, b)) = arith(&instrs[v]) else {
            continue;
        };
        if a == b || !f32_operand(&instrs[a]) || !f32_operand(&instrs[b]) {
            continue;
        }
        let absorbable = |u: usize| {
            readers[u] == 1
                && instrs[u].pair.is_none()
                && arith(&instrs[u])
                    .is_some_and(|(_, x, y)| f32_operand(&instrs[x]) && f32_operand(&instrs[y]))
        };
        let (inner_at, z, z_left) = if absorbable(a) {
            (a, b, false)
        } else if absorbable(b) {
            (b, a, true)
        } else {
            continue;
        };
        let Some((inner, x, y)) = arith(&instrs[inner_at]) else {
            continue;
        };
        instrs[inner_at].folded = true;
        instrs[v].pair = Some(Pair {
            negate: false,
            inner,
            x,
            y,
            outer,
            z,
            z_left,
        });
    }
}

/// Ops whose value is one scalar for the whole kernel (no register).
pub(crate) fn is_scalar(op: &IrOp<PView>) -> bool {
    matches!(op, IrOp::Const(_) | IrOp::Param { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RealizeOptions, Tensor};

    fn program_of(t: &Tensor) -> CpuKernel {
        let plan = t.plan(&RealizeOptions::default()).expect("plans");
        let kernels: Vec<_> = plan.kernels().collect();
        assert_eq!(kernels.len(), 1, "{}", plan.dump_text());
        compile(&kernels[0].kernel, &[])
    }

    #[test]
    fn softmax_saves_exp_for_the_final_pass() {
        let x = Tensor::try_rand([8, 64], 1, DType::F32).expect("rand");
        let p = program_of(&x.softmax(-1));
        assert_eq!(p.strategy, Strategy::ReduceInner);
        assert_eq!(p.n_reuse, 1);
        let saved = (0..p.instrs.len())
            .find(|&v| p.reuse_slot[v] != usize::MAX)
            .expect("one saved value");
        assert!(matches!(
            p.instrs[saved].op,
            IrOp::Unary(crate::ops::UnaryOp::Exp, _)
        ));
        let running: Vec<&Phase> = p
            .phases
            .iter()
            .filter(|ph| !ph.reduces.is_empty() || !ph.stores.is_empty())
            .collect();
        // max pass, sum-of-exp pass (saves exp), divide pass (reads it back).
        assert_eq!(running.len(), 3);
        assert!(running[1].saves.contains(&saved));
        assert!(running[2].reuses.contains(&saved));
        // The final pass no longer loads x or computes exp.
        assert!(running[2].elem_reusing.len() < running[2].elem.len());
        assert!(!running[2].elem_reusing.contains(&saved));
        assert!(
            running[2]
                .elem_reusing
                .iter()
                .all(|&v| !matches!(p.instrs[v].op, IrOp::Load { .. }))
        );
    }

    #[test]
    fn exp_of_a_negation_is_one_loop_with_the_same_bits() {
        let mut vals: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.23).collect();
        vals.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 104.5, -89.0]);
        let n = vals.len();
        let x = Tensor::from_vec(vals.clone(), [n]);
        x.realize().expect("realizes");
        let y = (-&x).exp();
        let p = program_of(&y);
        let negs: Vec<usize> = (0..p.instrs.len())
            .filter(|&v| matches!(p.instrs[v].op, IrOp::Unary(UnaryOp::Neg, _)))
            .collect();
        assert_eq!(negs.len(), 1);
        assert!(
            p.instrs[negs[0]].folded,
            "the negation runs inside exp's loop"
        );
        assert!(
            p.instrs.iter().any(|q| q.pair.is_some_and(|pr| pr.negate)
                && matches!(q.op, IrOp::Unary(UnaryOp::Exp, _)))
        );
        let got = y.to_vec::<f32>().expect("values");
        for (k, (&g, &v)) in got.iter().zip(&vals).enumerate() {
            let want = crate::math::f32::exp_f32(-v);
            assert_eq!(g.to_bits(), want.to_bits(), "exp(-{v:e}) at {k}");
        }
        // A negation something else also reads is evaluated on its own.
        let neg = -&x;
        let both = neg.exp() + &neg;
        let p = program_of(&both);
        assert!(
            p.instrs
                .iter()
                .all(|q| !q.folded || !matches!(q.op, IrOp::Unary(UnaryOp::Neg, _)))
        );
        let got = both.to_vec::<f32>().expect("values");
        for (&g, &v) in got.iter().zip(&vals) {
            let want = crate::math::f32::exp_f32(-v) + -v;
            assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()));
        }
    }

    #[test]
    fn short_rows_share_runs() {
        let x = Tensor::try_rand([32, 64], 3, DType::F32).expect("rand");
        x.realize().expect("realizes");
        let p = program_of(&x.softmax(-1));
        assert_eq!(p.pack, CHUNK / 64);
        // Rows of x follow each other: the packed run is read in place.
        assert!(
            p.instrs
                .iter()
                .any(|i| matches!(&i.op, IrOp::Load { view, .. } if view.borrow))
        );
        // The max and the sum are expanded across their rows' segments.
        assert!(p.phases.iter().any(|ph| !ph.row_operands.is_empty()));
        let long = Tensor::try_rand([4, 4096], 4, DType::F32).expect("rand");
        assert_eq!(program_of(&long.softmax(-1)).pack, 1);
    }

    #[test]
    fn runs_follow_the_majority_of_contiguous_accesses() {
        // Three batch-last buffers combined batch first: the loads are contiguous along the
        // batch, the store along the rows. The batch is iterated innermost so that three of
        // the four accesses read whole runs; the store walks with a stride.
        for (w, n) in [(16, 32), (64, 32), (40, 16)] {
            let parts: Vec<Tensor> = (0..3)
                .map(|i| {
                    let t = Tensor::try_rand([8, 4, w, n], 20 + i, DType::F32).expect("rand");
                    t.realize().expect("realizes");
                    t
                })
                .collect();
            let bf: Vec<Tensor> = parts.iter().map(|t| t.permute([3, 0, 1, 2])).collect();
            let y = bf[0].mul(&bf[1]).add(&bf[2]);
            let p = program_of(&y);
            let run = p.n_out - 1;
            assert_eq!(p.dims[run], n, "{:?}", p.dims);
            for i in &p.instrs {
                match &i.op {
                    IrOp::Load { view, .. } => assert_eq!(view.strides[run], 1),
                    IrOp::Store { view, .. } => assert_eq!(view.strides[run], (8 * 4 * w) as isize),
                    _ => {}
                }
            }
            let want = crate::reference::evaluate(&y).expect("reference").to_f64();
            y.realize().expect("realizes");
            let got = crate::reference::evaluate(&y).expect("reads").to_f64();
            assert_eq!(got, want);
        }
        // One load and one store (a transposed copy, plus one): the store's order stays.
        let t = Tensor::try_rand([8, 64, 32], 30, DType::F32).expect("rand");
        t.realize().expect("realizes");
        let p = program_of(&t.permute([2, 0, 1]).add(1.0));
        assert_eq!(p.dims[p.n_out - 1], 8 * 64);
    }

    #[test]
    fn short_elementwise_rows_share_runs() {
        // Layer norm's last step: a row statistic and a weight vector broadcast over rows of
        // 128 keep the last dimension from merging; rows of it share one run.
        let x = Tensor::try_rand([32, 64, 128], 5, DType::F32).expect("rand");
        let stat = Tensor::try_rand([32, 64, 1], 6, DType::F32).expect("rand");
        let w = Tensor::try_rand([128], 7, DType::F32).expect("rand");
        for t in [&x, &stat, &w] {
            t.realize().expect("realizes");
        }
        let y = x.sub(&stat).mul(&w);
        let p = program_of(&y);
        assert_eq!(p.strategy, Strategy::OutInner);
        assert_eq!(p.pack, CHUNK / 128);
        assert_eq!(p.pack_axes(), (p.n_out - 2, p.n_out - 1));
        // x's rows follow each other: read in place; the result is written straight out.
        assert!(
            p.instrs
                .iter()
                .any(|i| matches!(&i.op, IrOp::Load { view, .. } if view.borrow))
        );
        assert!(p.instrs.iter().any(|i| i.direct.is_some()));
        // A long last dimension, or a reduction, keeps one row per run.
        let long = Tensor::try_rand([4, 4096], 8, DType::F32).expect("rand");
        let row = Tensor::try_rand([4, 1], 9, DType::F32).expect("rand");
        assert_eq!(program_of(&long.mul(&row)).pack, 1);
        assert_eq!(program_of(&x.sum_keepdim(0)).pack, 1);
    }

    #[test]
    fn short_column_reductions_share_runs() {
        let x = Tensor::try_rand([32, 64, 128], 10, DType::F32).expect("rand");
        let stat = Tensor::try_rand([32, 64, 1], 11, DType::F32).expect("rand");
        for t in [&x, &stat] {
            t.realize().expect("realizes");
        }
        let p = program_of(&x.sub(&stat).sum([0, 1]));
        assert_eq!(p.strategy, Strategy::OutInner);
        assert_eq!(p.pack, CHUNK / 128);
        assert_eq!(p.pack_axes(), (p.dims.len() - 1, p.n_out - 1));
        // An arg-reduction keeps one position per run.
        assert_eq!(program_of(&x.argmax(0)).pack, 1);
    }

    #[test]
    fn epilogues_write_their_last_op_into_the_product() {
        let a = Tensor::try_rand([64, 32], 12, DType::F32).expect("rand");
        let b = Tensor::try_rand([32, 48], 13, DType::F32).expect("rand");
        let bias = Tensor::try_rand([48], 14, DType::F32).expect("rand");
        for t in [&a, &b, &bias] {
            t.realize().expect("realizes");
        }
        let plan = a
            .matmul(&b)
            .add(&bias)
            .relu()
            .plan(&RealizeOptions::default())
            .expect("plans");
        let kernels: Vec<_> = plan.kernels().collect();
        assert_eq!(kernels.len(), 1, "{}", plan.dump_text());
        let mm_out = kernels[0].kernel.matmul.as_ref().expect("a product").out;
        let p = compile(&kernels[0].kernel, &[mm_out]);
        // The product is copied into a register first; relu writes the run back in place.
        let direct: Vec<&PInstr> = p.instrs.iter().filter(|i| i.direct.is_some()).collect();
        assert_eq!(direct.len(), 1);
        assert!(matches!(
            direct[0].op,
            IrOp::Unary(crate::ops::UnaryOp::Relu, _)
        ));
    }

    #[test]
    fn cheap_values_are_recomputed_not_saved() {
        // layer_norm's passes share only `x - mean`: cheaper to recompute than to save.
        let x = Tensor::try_rand([8, 64], 2, DType::F32).expect("rand");
        let p = program_of(&x.layer_norm(&[64], None, None, 1e-5));
        assert_eq!(p.n_reuse, 0);
        assert!(
            p.phases
                .iter()
                .all(|ph| ph.saves.is_empty() && ph.reuses.is_empty())
        );
    }

    #[test]
    fn only_outputs_of_16_mib_and_more_stream() {
        let streams = |p: &CpuKernel| {
            p.instrs
                .iter()
                .any(|i| i.stream && matches!(i.op, IrOp::Store { .. }))
        };
        let big = Tensor::try_rand([STREAM_MIN_BYTES / 4], 30, DType::F32).expect("rand");
        let small = Tensor::try_rand([STREAM_MIN_BYTES / 4 - 1], 31, DType::F32).expect("rand");
        for t in [&big, &small] {
            t.realize().expect("realizes");
        }
        let p = program_of(&big.mul(2.0).add(1.0));
        assert!(cfg!(not(target_arch = "x86_64")) || (streams(&p) && p.streams));
        // The streaming store takes its value from a register.
        assert!(p.instrs.iter().all(|i| i.direct.is_none()));
        let p = program_of(&small.mul(2.0).add(1.0));
        assert!(!streams(&p) && !p.streams);
        assert!(p.instrs.iter().any(|i| i.direct.is_some()));
        // Half outputs keep ordinary stores.
        assert!(!streams(&program_of(&big.cast(DType::F16))));
    }

    #[test]
    fn packed_broadcast_reads_count_as_passes() {
        // Layer norm's input gradient over rows of 128 (packed): `x̂ = (x - mean) · inv_std`
        // reads two stored row statistics, each filled across every row's segment of the
        // run, so recomputing it in the final pass costs three passes: it is saved by the
        // reducing pass instead.
        let x = Tensor::try_rand([16, 128], 20, DType::F32).expect("rand");
        let g = Tensor::try_rand([16, 128], 21, DType::F32).expect("rand");
        let mean = Tensor::try_rand([16, 1], 22, DType::F32).expect("rand");
        let inv = Tensor::try_rand([16, 1], 23, DType::F32).expect("rand");
        for t in [&x, &g, &mean, &inv] {
            t.realize().expect("realizes");
        }
        let xhat = x.sub(&mean).mul(&inv);
        let dx = g
            .sub(g.mean_keepdim(-1))
            .sub(xhat.mul(g.mul(&xhat).mean_keepdim(-1)));
        let p = program_of(&dx);
        assert_eq!(p.strategy, Strategy::ReduceInner);
        assert_eq!(p.pack, CHUNK / 128);
        assert_eq!(p.n_reuse, 1, "x̂ is saved");
        let saved = (0..p.instrs.len())
            .find(|&v| p.reuse_slot[v] != usize::MAX)
            .expect("one saved value");
        let last = p.phases.last().expect("phases");
        assert_eq!(last.reuses, vec![saved]);
        // The final pass no longer reads the statistics.
        let reads_stat =
            |v: &usize| matches!(&p.instrs[*v].op, IrOp::Load { view, .. } if view.strides[1] == 0);
        assert!(last.elem.iter().any(reads_stat));
        assert!(!last.elem_reusing.iter().any(reads_stat));
    }
}
