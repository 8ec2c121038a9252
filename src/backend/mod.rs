//! Backends run a [`Program`] on buffers. [`run_program`] is device-neutral: it allocates
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

/// Runs `program` with `inputs` bound to its input slots and `params` to its parameter
/// slots; returns the planned buffers that are still alive (the kept ones).
pub fn run_program(
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
    // In-place writes into a buffer that a host slice borrows are refused before anything
    // runs, so a refused program leaves every buffer as it was.
    for spec in &program.buffers {
        if let Some(b) = spec.input.and_then(|slot| inputs.get(slot))
            && b.is_borrowed()
        {
            return Err(KilnError::Borrowed {
                op: "realize",
                detail: format!(
                    "an in-place update writes a {}-byte buffer that",
                    b.len_bytes()
                ),
            });
        }
    }
    let mut bufs: ProgramOutputs = vec![None; program.buffers.len()];
    let profile = debug_level() >= 2;
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
                match pk.device {
                    Device::Cpu => cpu::run_kernel(pk, &refs, params)?,
                    Device::Cuda(n) => cuda::run_kernel(n, pk, &refs, params)?,
                }
                if spec.input.is_some()
                    && let Some(b) = &bufs[pk.out]
                {
                    // Readers that recorded the previous version now read a stale value.
                    b.bump_version();
                }
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

/// One `KILN_DEBUG=2` line: the kernel's name (its ops and space), time, bytes moved and
/// arithmetic rate.
fn print_kernel_line(pk: &crate::kernel::PlannedKernel, took: std::time::Duration) {
    let k = &pk.kernel;
    let bytes: usize = k.args.iter().map(|a| a.numel * a.dtype.size_bytes()).sum();
    let secs = took.as_secs_f64().max(1e-9);
    let flops = match &k.matmul {
        Some(mm) => {
            let nd = k.shape.len();
            2.0 * k.shape.iter().product::<usize>() as f64 * mm.lhs_view.shape[nd - 1] as f64
        }
        None => 0.0,
    };
    eprintln!(
        "kiln: kernel {} {:?} {:.3} ms {:.1} GB/s {:.1} GFLOP/s",
        k.name,
        k.shape,
        secs * 1e3,
        bytes as f64 / secs / 1e9,
        flops / secs / 1e9
    );
}

fn resolve(r: BufferRef, inputs: &[Arc<Buffer>], bufs: &ProgramOutputs) -> Result<Arc<Buffer>> {
    match r {
        BufferRef::Input(i) => inputs.get(i).cloned(),
        BufferRef::Planned(g) => bufs.get(g).and_then(|b| b.clone()),
    }
    .ok_or_else(|| KilnError::internal(format!("buffer {r:?} is not available")))
}
