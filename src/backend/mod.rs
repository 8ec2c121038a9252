//! Backends run a [`Program`] on buffers. `run_program` (called by `realize`) is device-neutral: it allocates
//! each planned buffer from its device's caching allocator just before the step that writes
//! it, runs the step on the device's backend, and drops every buffer right after its last
//! reader, as the memory plan says.

pub mod cpu;
pub mod cuda;

use crate::device::Device;
use crate::dtype::Scalar;
use crate::error::{KilnError, Result};
use crate::kernel::{BufferRef, Program, Step};
use crate::memory::{self, Buffer};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// `KILN_DEBUG` (0 when unset): 1 prints one line per realize, 2 adds one line per kernel.
pub fn debug_level() -> u8 {
    static LEVEL: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        std::env::var("KILN_DEBUG")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// Buffers left alive after a program ran, by planned buffer.
pub type ProgramOutputs = Vec<Option<Arc<Buffer>>>;

/// `Ok` when `device` can run kernels here, else [`KilnError::DeviceUnavailable`] saying why.
pub fn check_device(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(n) => match cuda::availability() {
            Ok(count) if n < count => Ok(()),
            Ok(count) => Err(KilnError::DeviceUnavailable {
                device: device.to_string(),
                reason: format!("this machine has {count} CUDA device(s)"),
            }),
            Err(reason) => Err(KilnError::DeviceUnavailable {
                device: device.to_string(),
                reason,
            }),
        },
    }
}

fn allocate(device: Device, bytes: usize) -> Result<Buffer> {
    match device {
        Device::Cpu => memory::alloc_host(bytes),
        Device::Cuda(n) => cuda::allocate(n, bytes),
    }
}

/// The thread pool kiln's kernels run on: its own, not rayon's global pool, so that a
/// kernel waiting for its parallel halves never picks up the program's own rayon jobs. One
/// such job may wait for a buffer the running realize holds (`as_slice` of a tensor being
/// updated in place), and run on top of that realize's kernel on the same thread it would
/// wait forever. Sized like the global pool (`RAYON_NUM_THREADS`, else every CPU). `None`
/// if its threads could not be started: kernels then run on the global pool.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("kiln-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Whether this thread is one of kiln's pool's workers.
pub(crate) fn on_pool_thread() -> bool {
    pool().is_some_and(|p| p.current_thread_index().is_some())
}

/// Runs `op` on kiln's pool (inline on one of its workers): every rayon call inside it
/// runs there.
pub(crate) fn on_pool<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) => p.install(op),
        None => op(),
    }
}

/// Threads of kiln's pool.
pub(crate) fn threads() -> usize {
    pool().map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
}

/// Runs `program` with `inputs` bound to its input slots and `params` to its parameter
/// slots; returns the planned buffers that are still alive (the kept ones). Slots that
/// share an in-place destination's memory must be bound to copies ([`alias_snapshots`]).
///
/// The caller holds every input for the run (`realize` does, from planning until its
/// results are installed): the in-place destinations for writing, the rest for reading, so
/// no other thread reads what the program writes in place or writes what it reads.
///
/// Called on a worker of another rayon pool (a realize inside the program's own parallel
/// loop), the run moves to a plain thread: a rayon worker waiting for kiln's pool would run
/// other jobs of its own pool meanwhile, and one of them may wait for a buffer this realize
/// holds — which it would then never give back.
pub(crate) fn run_program(
    program: &Program,
    inputs: &[Arc<Buffer>],
    params: &[Scalar],
) -> Result<ProgramOutputs> {
    if rayon::current_thread_index().is_some() && !on_pool_thread() {
        return std::thread::scope(|s| {
            s.spawn(|| run_program_here(program, inputs, params))
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
    }
    run_program_here(program, inputs, params)
}

/// [`run_program`] on this thread.
fn run_program_here(
    program: &Program,
    inputs: &[Arc<Buffer>],
    params: &[Scalar],
) -> Result<ProgramOutputs> {
    if inputs.len() < program.n_inputs || params.len() < program.n_params {
        return Err(KilnError::internal(format!(
            "program takes {} inputs and {} parameters, got {} and {}",
            program.n_inputs,
            program.n_params,
            inputs.len(),
            params.len()
        )));
    }
    // Several steps run on one of rayon's workers: each kernel's parallel loop then starts
    // on the thread that asks for it, instead of a non-pool thread handing every kernel over
    // and sleeping until it is done (two thread wake-ups per kernel). The other workers are
    // kept awake for the run (see `keep_awake`), so a kernel's loop does not wait for one to
    // be woken. A single step keeps the caller's thread: its loop hands over at most once
    // either way, and a small one runs without the pool at all.
    if program.steps.len() > 1 {
        let done = AtomicBool::new(false);
        on_pool(|| {
            rayon::scope(|s| {
                let owner = rayon::current_thread_index();
                for _ in 1..rayon::current_num_threads() {
                    let done = &done;
                    s.spawn(move |_| keep_awake(done, owner));
                }
                let out = run_steps(program, inputs, params);
                done.store(true, Ordering::Release);
                out
            })
        })
    } else {
        run_steps(program, inputs, params)
    }
}

/// The inputs with every slot that shares an in-place destination's buffer (but is not that
/// destination) bound to a copy of it; `None` when no slot does (the common case).
///
/// The plan takes distinct input slots for distinct memory, but two slots can hold one
/// buffer (`x` and `x.detach()`, or a realized reshape of `x`): if one of them is written in
/// place, the other reads a copy taken before anything runs — the value it stood for —
/// instead of memory a kernel overwrites while it reads it. The caller runs the program on
/// these inputs, and a target that shares such a slot's memory is given the copy.
pub(crate) fn alias_snapshots(
    program: &Program,
    inputs: &[Arc<Buffer>],
) -> Result<Option<Vec<Arc<Buffer>>>> {
    let same = |a: &Buffer, b: &Buffer| {
        a.len_bytes() > 0 && a.device() == b.device() && a.addr() == b.addr()
    };
    let mut out: Option<Vec<Arc<Buffer>>> = None;
    for spec in &program.buffers {
        let Some(dst) = spec.input.and_then(|d| inputs.get(d).map(|b| (d, b))) else {
            continue;
        };
        for (s, b) in inputs.iter().enumerate() {
            if s != dst.0 && same(b, dst.1) {
                let copy = snapshot(b)?;
                out.get_or_insert_with(|| inputs.to_vec())[s] = copy;
            }
        }
    }
    Ok(out)
}

/// A copy of a whole buffer on its own device.
fn snapshot(b: &Buffer) -> Result<Arc<Buffer>> {
    let bytes = b.len_bytes();
    match b.device() {
        Device::Cpu => {
            let dst = memory::alloc_host(bytes)?;
            // SAFETY: both are host buffers of at least `bytes` initialized bytes, distinct
            // blocks (the copy is fresh), and no kernel runs before the program starts.
            unsafe { std::ptr::copy_nonoverlapping(b.host_ptr(), dst.host_ptr(), bytes) };
            Ok(Arc::new(dst))
        }
        to @ Device::Cuda(_) => Ok(Arc::new(cuda::copy(b, bytes, to)?)),
    }
}

/// How long a kept-awake worker spins without finding work before it stops and leaves the
/// pool's own sleeping to rayon. The gaps between one realize's parallel kernels (small
/// kernels running on the calling thread) are microseconds; the limit also bounds how long
/// a worker stays here when it picked this job up while work of its own waits beneath it
/// (two realizes on two threads at once).
const IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(500);

/// Keeps a pool worker busy while one realize runs: it runs whatever work the pool has (each
/// kernel's parallel loop, stolen as soon as it is offered) and spins in between, instead of
/// going to sleep between kernels and being woken by a system call when the next one starts.
/// Measured on 2 cores (Intel Xeon), a char_gpt step's unfused kernels ran ≈ 10% faster.
/// Returns at once on the thread that owns the realize (it must never wait on itself).
fn keep_awake(done: &AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner {
        return;
    }
    let mut idle_since = std::time::Instant::now();
    let mut spins = 0u32;
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            spins = 0;
            idle_since = std::time::Instant::now();
            continue;
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) && idle_since.elapsed() > IDLE_SPIN {
            return;
        }
    }
}

fn run_steps(
    program: &Program,
    inputs: &[Arc<Buffer>],
    params: &[Scalar],
) -> Result<ProgramOutputs> {
    let mut bufs: ProgramOutputs = vec![None; program.buffers.len()];
    let profile = debug_level() >= 2;
    // A new plan's CUDA kernels are compiled together, in parallel, before the first runs.
    cuda::prepare(program);
    for (step_idx, step) in program.steps.iter().enumerate() {
        let started = profile.then(std::time::Instant::now);
        match step {
            Step::Kernel(pk) => {
                let spec = program
                    .buffers
                    .get(pk.out)
                    .ok_or_else(|| KilnError::internal("kernel output is not a planned buffer"))?;
                let out = match spec.input {
                    Some(slot) => inputs
                        .get(slot)
                        .cloned()
                        .ok_or_else(|| KilnError::internal("in-place write to a missing input"))?,
                    None => Arc::new(allocate(spec.device, spec.bytes)?),
                };
                bufs[pk.out] = Some(out);
                let args: Vec<Arc<Buffer>> = pk
                    .args
                    .iter()
                    .map(|r| resolve(*r, inputs, &bufs))
                    .collect::<Result<_>>()?;
                let refs: Vec<&Buffer> = args.iter().map(|b| b.as_ref()).collect();
                let ran = match pk.device {
                    Device::Cpu => cpu::run_kernel(pk, &refs, params),
                    Device::Cuda(n) => cuda::run_kernel(n, pk, &refs, params),
                };
                if spec.input.is_some()
                    && let Some(b) = &bufs[pk.out]
                {
                    // Readers that recorded the previous version now read a stale value.
                    // Bumped even when the kernel failed: it may have written part of the
                    // buffer before failing, so the old version is gone either way.
                    b.bump_version();
                }
                ran?;
            }
            Step::Transfer {
                src,
                out,
                to,
                bytes,
            } => {
                let from = resolve(*src, inputs, &bufs)?;
                bufs[*out] = Some(Arc::new(cuda::copy(&from, *bytes, *to)?));
            }
        }
        if let (Some(t), Step::Kernel(pk)) = (started, step) {
            if let Device::Cuda(n) = pk.device {
                cuda::synchronize(n)?;
            }
            print_kernel_line(pk, t.elapsed());
        }
        for &b in &program.release_after[step_idx] {
            bufs[b] = None;
        }
    }
    Ok(bufs)
}

/// One `KILN_DEBUG=2` line: the kernel's name (its ops) and index space, time, bytes moved
/// (each argument's declared elements once), arithmetic rate (matmul: 2·m·n·k; other
/// kernels: one flop per arithmetic instruction per point of the space it runs over) and,
/// on the CPU, the bytes' rate as a fraction of [`host_copy_gbs`].
fn print_kernel_line(pk: &crate::kernel::PlannedKernel, took: std::time::Duration) {
    let k = &pk.kernel;
    let bytes: usize = k.args.iter().map(|a| a.numel * a.dtype.size_bytes()).sum();
    let secs = took.as_secs_f64().max(1e-9);
    let gbs = bytes as f64 / secs / 1e9;
    let flops = kernel_flops(k);
    let limit = match pk.device {
        Device::Cpu => format!("{:.0}% of copy", 100.0 * gbs / host_copy_gbs()),
        Device::Cuda(_) => "-".to_string(),
    };
    eprintln!(
        "kiln: kernel {} {:?} {:.3} ms {:.1} GB/s {:.1} GFLOP/s {}",
        k.name,
        k.shape,
        secs * 1e3,
        gbs,
        flops / secs / 1e9,
        limit
    );
}

/// Floating-point (or integer) operations a kernel performs: 2·m·n·k for a matmul plus one
/// per arithmetic instruction per point (element-level instructions over the whole index
/// space, row-level ones once per row).
fn kernel_flops(k: &crate::kernel::Kernel) -> f64 {
    use crate::kernel::{IrOp, Level};
    let space: usize = k.shape.iter().product();
    let rows: usize = k.row_shape().iter().product();
    let mut flops = 0.0;
    if let Some(mm) = &k.matmul {
        let nd = k.shape.len();
        if let Some(&depth) = mm.lhs_view.shape.get(nd.wrapping_sub(1)) {
            flops += 2.0 * space as f64 * depth as f64;
        }
    }
    for i in &k.ops {
        let arithmetic = matches!(
            i.op,
            IrOp::Unary(..) | IrOp::Binary(..) | IrOp::Where(..) | IrOp::Reduce { .. }
        );
        if arithmetic {
            flops += match (&i.op, i.level) {
                (IrOp::Reduce { .. }, _) | (_, Level::Elem) => space as f64,
                (_, Level::Row) => rows as f64,
            };
        }
    }
    flops
}

/// The host's copy bandwidth in GB/s (bytes read plus bytes written), measured once per
/// process on the first `KILN_DEBUG=2` kernel line: a 32 MiB copy split over rayon's threads,
/// best of five. The `KILN_DEBUG=2` lines give each CPU kernel's rate as a fraction of it.
pub fn host_copy_gbs() -> f64 {
    static GBS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *GBS.get_or_init(|| {
        use rayon::prelude::*;
        const N: usize = 8 << 20;
        let src = vec![1f32; N];
        let mut dst = vec![0f32; N];
        let mut best = f64::INFINITY;
        for _ in 0..6 {
            let t = std::time::Instant::now();
            dst.par_chunks_mut(1 << 16)
                .zip(src.par_chunks(1 << 16))
                .for_each(|(d, s)| d.copy_from_slice(s));
            best = best.min(t.elapsed().as_secs_f64());
        }
        std::hint::black_box(&dst);
        let gbs = (2 * N * 4) as f64 / best.max(1e-9) / 1e9;
        eprintln!(
            "kiln: host copy bandwidth {gbs:.1} GB/s (32 MiB, measured once for KILN_DEBUG=2)"
        );
        gbs
    })
}

fn resolve(r: BufferRef, inputs: &[Arc<Buffer>], bufs: &ProgramOutputs) -> Result<Arc<Buffer>> {
    match r {
        BufferRef::Input(i) => inputs.get(i).cloned(),
        BufferRef::Planned(g) => bufs.get(g).and_then(|b| b.clone()),
    }
    .ok_or_else(|| KilnError::internal(format!("buffer {r:?} is not available")))
}
