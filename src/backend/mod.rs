//! Backends run planned steps on buffers. [`run_plan`] is device-neutral: it allocates each
//! planned buffer from its device's caching allocator just before the step that writes it,
//! runs the step on the device's backend, and drops every buffer right after its last
//! reader, as the memory plan says.

pub mod cpu;
pub mod cuda;

use crate::device::Device;
use crate::error::{KilnError, Result};
use crate::memory::{self, Buffer};
use crate::plan::{BufferRef, Plan, Step};
use std::sync::Arc;

/// Buffers left alive after a plan ran, by kernel group.
pub type PlanOutputs = Vec<Option<Arc<Buffer>>>;

fn allocate(device: Device, bytes: usize) -> Result<Buffer> {
    match device {
        Device::Cpu => memory::alloc_host(bytes),
        Device::Cuda(n) => cuda::allocate(n, bytes),
    }
}

/// Runs `plan` with `inputs` bound to its input slots; returns the planned buffers that
/// are still alive (the kept ones).
pub fn run_plan(plan: &Plan, inputs: &[Arc<Buffer>]) -> Result<PlanOutputs> {
    let groups = &plan.fusion.groups;
    let mut bufs: PlanOutputs = vec![None; groups.len()];
    for (step_idx, step) in plan.steps.iter().enumerate() {
        match step {
            Step::Kernel(pk) => {
                let root = &plan.view_graph.nodes[groups[pk.group].root];
                let bytes = plan.buffers.buffers[pk.group].bytes;
                let out = Arc::new(allocate(root.device, bytes)?);
                bufs[pk.group] = Some(out);
                let args: Vec<Arc<Buffer>> = pk
                    .args
                    .iter()
                    .map(|r| resolve(*r, inputs, &bufs))
                    .collect::<Result<_>>()?;
                let refs: Vec<&Buffer> = args.iter().map(|b| b.as_ref()).collect();
                match root.device {
                    Device::Cpu => cpu::run_kernel(&pk.kernel, &refs)?,
                    Device::Cuda(n) => cuda::run_kernel(n, &pk.kernel, &refs)?,
                }
            }
            Step::Transfer {
                src,
                group,
                to,
                bytes,
            } => {
                let from = resolve(*src, inputs, &bufs)?;
                bufs[*group] = Some(Arc::new(cuda::copy(&from, *bytes, *to)?));
            }
        }
        for &b in &plan.buffers.release_after[step_idx] {
            bufs[b] = None;
        }
    }
    Ok(bufs)
}

fn resolve(r: BufferRef, inputs: &[Arc<Buffer>], bufs: &PlanOutputs) -> Result<Arc<Buffer>> {
    match r {
        BufferRef::Input(i) => inputs.get(i).cloned(),
        BufferRef::Planned(g) => bufs.get(g).and_then(|b| b.clone()),
    }
    .ok_or_else(|| KilnError::internal(format!("buffer {r:?} is not available")))
}
