//! The CPU backend: executes kernel IR with vectorized loops over runs of elements, rayon
//! across blocks of rows, and matmuls through the `gemm` crate.
//!
//! * `program` compiles a kernel (reduce axes last, dimensions coalesced, phases,
//!   registers, loop strategy);
//! * `exec` runs programs (SIMD level picked at run time) on cache-line-aligned run
//!   registers (`register`);
//! * `ops` holds the typed elementwise and reduction loops, `matmul` the products
//!   (`small_gemm` the register-blocked kernel for small f32 ones, `blocked_gemm` the
//!   packed, threaded one for weight gradients and few-row products),
//!   `transpose` permuted copies block by block; `pieces` splits elementwise kernels at
//!   the edges of their masks (`cat`, `pad`) into kernels without masks.

#[cfg(target_arch = "x86_64")]
mod blocked_gemm;
mod element;
mod exec;
mod f16c;
mod lanes;
mod matmul;
mod ops;
mod pieces;
mod prefetch;
mod program;
mod register;
mod scatter;
mod small_gemm;
mod stream;
mod transpose;
mod vexp;

pub use exec::simd_level;

use crate::device::Device;
use crate::dtype::Scalar;
use crate::error::{KilnError, Result};
use crate::kernel::{IrOp, Kernel, PlannedKernel, Special};
use crate::memory::Buffer;
use crate::shape::numel;
use exec::ArgPtr;

/// A kernel compiled for the CPU: the programs that run after its product (if any), in
/// order. None for a bare matmul (the product is the whole result) or a special kernel;
/// one per block for a kernel split at its mask edges (see [`pieces`]); else one.
struct Compiled {
    programs: Vec<program::CpuKernel>,
    /// The programs are blocks of a small kernel split at its masks, run at once (see
    /// [`pieces::parallel_blocks`]).
    parallel: bool,
    /// How a matmul kernel's epilogue runs (decided once, from the kernel alone).
    epilogue: Epilogue,
}

/// How a matmul kernel runs its epilogue, where the product's route allows (see
/// [`matmul::run_then`]); otherwise, and for every other kernel, after the product.
enum Epilogue {
    /// After the product (or there is none).
    After,
    /// `relu?(product + bias)`: in the product's registers ([`bias_epilogue`]).
    Bias {
        arg: usize,
        offset: isize,
        relu: bool,
    },
    /// The one program, on each block of rows as the product finishes it.
    Rows(exec::RowItems),
}

impl Epilogue {
    /// The route for `kernel`, whose compiled programs are `programs`.
    fn of(kernel: &Kernel, programs: &[program::CpuKernel]) -> Epilogue {
        let (Some(mm), [prog]) = (&kernel.matmul, programs) else {
            return Epilogue::After;
        };
        if let Some((arg, offset, relu)) = bias_epilogue(kernel, mm) {
            return Epilogue::Bias { arg, offset, relu };
        }
        let shape = mm.shape();
        let (m, n) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        exec::RowItems::new(prog, mm.out, m, n).map_or(Epilogue::After, Epilogue::Rows)
    }
}

static COMPILED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many kernels the CPU backend has compiled (a cached plan's kernels compile once).
pub fn kernels_compiled() -> u64 {
    COMPILED.load(std::sync::atomic::Ordering::Relaxed)
}

static SPLIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many of the compiled kernels run as blocks between the edges of their masks (a
/// `cat`, `stack` or `pad` whose blocks hold 128K elements and more, or that has three or
/// more blocks of 4K elements and more; see `pieces.rs` in the CPU backend).
pub fn kernels_split_at_masks() -> u64 {
    SPLIT.load(std::sync::atomic::Ordering::Relaxed)
}

static BY_ROWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static IN_REGISTERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many matmul kernel runs applied their whole epilogue, `relu?(product + bias)` with
/// one bias per column, to the sums in registers before storing them (the same products as
/// [`epilogues_run_by_rows`]; any other epilogue runs by rows).
pub fn epilogues_in_registers() -> u64 {
    IN_REGISTERS.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many matmul kernel runs applied their epilogue to blocks of rows as the product
/// finished them (each block on the thread that computed it), rather than in a pass over
/// the whole product afterwards: f32 products `x @ w.t()` of one batch index with a
/// shallow depth or few rows, on two or more threads with AVX-512 (see `blocked_gemm.rs`
/// in the CPU backend).
pub fn epilogues_run_by_rows() -> u64 {
    BY_ROWS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Validates `kernel` (views inside their buffers' declared sizes, matmul operands
/// unmasked and in range) and compiles it. Done once per planned kernel.
fn compile(kernel: &Kernel) -> Result<Compiled> {
    COMPILED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    kernel
        .validate()
        .map_err(|e| KilnError::internal(format!("kernel {}: {e}", kernel.name)))?;
    if kernel.special.is_some() {
        return Ok(Compiled {
            programs: vec![],
            parallel: false,
            epilogue: Epilogue::After,
        });
    }
    if let Some(blocks) = pieces::split(kernel) {
        SPLIT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut programs = Vec::with_capacity(blocks.len());
        for b in &blocks {
            b.validate()
                .map_err(|e| KilnError::internal(format!("kernel {} block: {e}", kernel.name)))?;
            programs.push(program::compile(b, &[]));
        }
        return Ok(Compiled {
            parallel: pieces::parallel_blocks(numel(&kernel.shape), programs.len()),
            programs,
            epilogue: Epilogue::After,
        });
    }
    let mut in_place: Vec<usize> = (0..kernel.args.len())
        .filter(|&i| kernel.args[i].in_place)
        .collect();
    if let Some(mm) = &kernel.matmul {
        for (arg, view) in [(mm.lhs, &mm.lhs_view), (mm.rhs, &mm.rhs_view)] {
            let a = &kernel.args[arg];
            let fits = match view.offset_bounds() {
                Some((lo, hi)) => lo >= 0 && (hi as usize) < a.numel && view.mask.is_none(),
                None => true,
            };
            if !fits {
                return Err(KilnError::internal(
                    "matmul operand view outside its buffer",
                ));
            }
        }
        // The product's placement: inside the output, one address per element (a
        // permutation of a row-major layout, as lowering builds it), rows of unit stride.
        let ov = &mm.out_view;
        let out = &kernel.args[mm.out];
        let placed = ov.mask.is_none()
            && ov.numel() == out.numel
            && ov.numel() == numel(&kernel.shape)
            && (ov.shape.last().is_some_and(|&n| n <= 1) || ov.strides.last() == Some(&1))
            && is_permuted_row_major(ov);
        if !placed {
            return Err(KilnError::internal(
                "matmul output view is not a permutation of its buffer",
            ));
        }
        let trivial = kernel.ops.len() == 2 && matches!(kernel.ops[0].op, IrOp::MatmulResult);
        if trivial {
            return Ok(Compiled {
                programs: vec![],
                parallel: false,
                epilogue: Epilogue::After,
            });
        }
        in_place.push(mm.out);
    }
    let programs = vec![program::compile(kernel, &in_place)];
    Ok(Compiled {
        epilogue: Epilogue::of(kernel, &programs),
        programs,
        parallel: false,
    })
}

/// Whether `v` (offset 0) addresses each element of a `v.numel()`-element buffer exactly
/// once: its axes of size above one, ordered by stride, have the strides of a row-major
/// layout of those sizes.
fn is_permuted_row_major(v: &crate::shape::View) -> bool {
    let mut axes: Vec<(isize, usize)> = v
        .shape
        .iter()
        .zip(&v.strides)
        .filter(|(n, _)| **n > 1)
        .map(|(&n, &s)| (s, n))
        .collect();
    axes.sort_unstable();
    let mut expect = 1isize;
    for (s, n) in axes {
        if s != expect {
            return false;
        }
        expect = expect.saturating_mul(n as isize);
    }
    v.offset == 0
}

/// Checks that every buffer is a host buffer at least as large as its argument declares
/// (what makes the validated views' offsets safe to dereference) and returns the pointers.
fn bind_args(kernel: &Kernel, args: &[&Buffer]) -> Result<Vec<ArgPtr>> {
    if args.len() != kernel.args.len() {
        return Err(KilnError::internal(format!(
            "kernel {} takes {} buffers, got {}",
            kernel.name,
            kernel.args.len(),
            args.len()
        )));
    }
    args.iter()
        .zip(&kernel.args)
        .map(|(b, a)| {
            let need = a
                .numel
                .checked_mul(a.dtype.size_bytes())
                .ok_or_else(|| KilnError::internal("argument size overflows"))?;
            if b.device() != Device::Cpu || b.len_bytes() < need {
                return Err(KilnError::internal(format!(
                    "kernel {}: buffer of {} bytes on {} for an argument of {need} bytes",
                    kernel.name,
                    b.len_bytes(),
                    b.device()
                )));
            }
            Ok(ArgPtr { ptr: b.host_ptr() })
        })
        .collect()
}

/// Runs one planned kernel on host buffers (`args` in the kernel's argument order) with the
/// plan's parameter values.
pub(crate) fn run_kernel(pk: &PlannedKernel, args: &[&Buffer], params: &[Scalar]) -> Result<()> {
    let kernel = &pk.kernel;
    // A kernel that may split across threads runs on kiln's pool (see
    // `backend::on_pool`); below this size no loop goes parallel, and the kernel stays on
    // the calling thread without a hand-over.
    let numel = kernel
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d));
    let may_split =
        kernel.matmul.is_some() || kernel.special.is_some() || numel.is_none_or(|n| n >= 1 << 13);
    if may_split && !crate::backend::on_pool_thread() {
        return crate::backend::on_pool(|| run_kernel_here(pk, args, params));
    }
    run_kernel_here(pk, args, params)
}

/// [`run_kernel`] on this thread.
fn run_kernel_here(pk: &PlannedKernel, args: &[&Buffer], params: &[Scalar]) -> Result<()> {
    let kernel = &pk.kernel;
    let compiled = pk.compiled.get_or_try_init(|| compile(kernel))?;
    let ptrs = bind_args(kernel, args)?;
    match &kernel.special {
        Some(Special::Scatter(spec)) => return scatter::run(kernel, spec, &ptrs),
        Some(Special::Scan {
            input,
            view,
            axis,
            op,
            out,
        }) => return lanes::scan(kernel, *input, view, *axis, *op, *out, &ptrs),
        Some(Special::ArgSort {
            input,
            view,
            axis,
            descending,
            out,
        }) => return lanes::argsort(kernel, *input, view, *axis, *descending, *out, &ptrs),
        None => {}
    }
    // A product without elements has nothing to compute, however large its batch.
    if let Some(mm) = &kernel.matmul
        && kernel.shape.iter().all(|&n| n > 0)
    {
        let dtype = kernel.args[mm.out].dtype;
        match (&compiled.epilogue, compiled.programs.as_slice()) {
            // A bias (and relu) added to the sums before they are stored.
            (&Epilogue::Bias { arg, offset, relu }, [prog]) => {
                let bias = ptrs[arg].ptr.cast::<f32>().wrapping_offset(offset);
                let after = matmul::After::Bias { bias, relu };
                if matmul::run_then(mm, dtype, &ptrs, after)? {
                    IN_REGISTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(());
                }
                return run_program(prog, &ptrs, params);
            }
            // The epilogue on each block of rows as soon as the product has finished it,
            // on the thread that computed it (while it is in that core's cache), instead of
            // in a pass over the whole output after the product.
            (Epilogue::Rows(rows), [prog]) => {
                let env = exec::Env::new(prog, &ptrs, params);
                let boundaries = std::sync::Mutex::new(Vec::new());
                let done = |r0: usize, r1: usize| rows.run(prog, &env, &boundaries, r0, r1);
                if matmul::run_then(mm, dtype, &ptrs, matmul::After::Rows(&done))? {
                    rows.finish(prog, &env, boundaries);
                    BY_ROWS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                } else {
                    exec::execute(prog, &env);
                }
                return bad_index(env);
            }
            _ => matmul::run(mm, dtype, &ptrs)?,
        }
    }
    if compiled.parallel {
        use rayon::prelude::*;
        return compiled
            .programs
            .par_iter()
            .try_for_each(|prog| run_program(prog, &ptrs, params));
    }
    for prog in &compiled.programs {
        run_program(prog, &ptrs, params)?;
    }
    Ok(())
}

/// Runs one compiled program over the kernel's arguments.
fn run_program(prog: &program::CpuKernel, ptrs: &[ArgPtr], params: &[Scalar]) -> Result<()> {
    let env = exec::Env::new(prog, ptrs, params);
    exec::execute(prog, &env);
    bad_index(env)
}

/// `(bias argument, its offset, relu)` when `kernel`'s whole epilogue is
/// `relu?(product + bias)` over a two-dimensional f32 product written row-major from
/// offset 0, with the bias one f32 per column (a view of stride 0 down the rows, 1 along
/// them) in a buffer other than the output: the epilogue the product kernel applies in
/// registers ([`matmul::After::Bias`]).
fn bias_epilogue(kernel: &Kernel, mm: &crate::kernel::MatmulSpec) -> Option<(usize, isize, bool)> {
    use crate::ops::{BinaryOp, UnaryOp};
    let [m, n] = kernel.shape[..] else {
        return None;
    };
    let f32_only = kernel
        .ops
        .iter()
        .all(|i| i.dtype == crate::dtype::DType::F32);
    let (mut product, mut bias, mut sum, mut relu, mut store) = (None, None, None, None, None);
    for (id, ins) in kernel.ops.iter().enumerate() {
        match &ins.op {
            IrOp::MatmulResult if product.is_none() => product = Some(id),
            IrOp::Load { arg, view, .. }
                if bias.is_none()
                    && *arg != mm.out
                    && kernel.args.get(*arg).is_some_and(|a| !a.in_place)
                    && view.strides == [0, 1]
                    && view.mask.is_none()
                    && view.offset >= 0 =>
            {
                bias = Some((id, *arg, view.offset));
            }
            IrOp::Binary(BinaryOp::Add, a, b) if sum.is_none() => sum = Some((id, *a, *b)),
            IrOp::Unary(UnaryOp::Relu, a) if relu.is_none() => relu = Some((id, *a)),
            IrOp::Store { arg, view, src }
                if store.is_none()
                    && *arg == mm.out
                    && view.offset == 0
                    && view.mask.is_none()
                    && view.strides == [n as isize, 1] =>
            {
                store = Some(*src);
            }
            _ => return None,
        }
    }
    let (p, (b, arg, offset), (s, x, y), stored) = (product?, bias?, sum?, store?);
    if !f32_only || m == 0 || !((x, y) == (p, b) || (x, y) == (b, p)) {
        return None;
    }
    match relu {
        None if stored == s => Some((arg, offset, false)),
        Some((r, a)) if a == s && stored == r => Some((arg, offset, true)),
        _ => None,
    }
}

/// The error for the first out-of-range index a gather met during a run of `env`, if any.
fn bad_index(env: exec::Env<'_>) -> Result<()> {
    match env
        .bad_index
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
    {
        Some((index, size)) => Err(KilnError::IndexOutOfRange {
            op: crate::error::INDEXED_LOAD,
            index,
            size,
        }),
        None => Ok(()),
    }
}
