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
    let mut bufs: ProgramOutputs = vec![None; program.buffers.len()];
    for (step_idx, step) in program.steps.iter().enumerate() {
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
        for &b in &program.release_after[step_idx] {
            bufs[b] = None;
        }
    }
    Ok(bufs)
}

fn resolve(r: BufferRef, inputs: &[Arc<Buffer>], bufs: &ProgramOutputs) -> Result<Arc<Buffer>> {
    match r {
        BufferRef::Input(i) => inputs.get(i).cloned(),
        BufferRef::Planned(g) => bufs.get(g).and_then(|b| b.clone()),
    }
    .ok_or_else(|| KilnError::internal(format!("buffer {r:?} is not available")))
}
