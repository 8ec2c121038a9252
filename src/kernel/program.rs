//! [`Program`]: what a backend runs — kernels and transfers in order, with their buffer
//! arguments bound to input slots or planned buffers, the size and device of every planned
//! buffer, and when each is released. The planner produces it; the backends consume it and
//! nothing above it, so a cached plan is just a `Program` run again with new inputs and
//! parameters.

use super::Kernel;
use crate::device::Device;
use std::any::Any;
use std::sync::{Arc, OnceLock};

/// Where a kernel argument's memory comes from at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferRef {
    /// Input slot (a realized tensor).
    Input(usize),
    /// Planned buffer `i` (the output of the step that writes it).
    Planned(usize),
}

/// A backend's compiled form of one kernel, made on first run and kept with the kernel (so
/// a cached plan never compiles twice). Backends store their own type and downcast.
#[derive(Default)]
pub struct CompiledSlot(OnceLock<Arc<dyn Any + Send + Sync>>);

impl CompiledSlot {
    /// The compiled form, made by `make` on first use.
    pub fn get_or_try_init<T: Any + Send + Sync, E>(
        &self,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        if let Some(v) = self.0.get() {
            if let Ok(t) = Arc::clone(v).downcast::<T>() {
                return Ok(t);
            }
            // A different backend's form (cannot happen: a kernel runs on one device).
            return make().map(Arc::new);
        }
        let made: Arc<T> = Arc::new(make()?);
        let _ = self.0.set(made.clone());
        Ok(made)
    }

    /// True once a backend compiled the kernel.
    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }
}

impl Clone for CompiledSlot {
    fn clone(&self) -> Self {
        // A clone compiles again on first use (it may be modified before it runs).
        CompiledSlot::default()
    }
}

impl std::fmt::Debug for CompiledSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_set() {
            "compiled"
        } else {
            "not compiled"
        })
    }
}

/// A kernel with its arguments bound.
#[derive(Debug, Clone)]
pub struct PlannedKernel {
    /// The kernel IR (read through [`PlannedKernel::kernel`]: a backend validates it once,
    /// when it compiles it into `compiled`, so it cannot change afterwards).
    pub(crate) kernel: Kernel,
    /// One per kernel argument, in order.
    pub args: Vec<BufferRef>,
    /// The planned buffer the kernel writes (its output argument).
    pub out: usize,
    /// The device the kernel runs on.
    pub device: Device,
    /// The backend's compiled form, once made (private for the same reason as `kernel`).
    pub(crate) compiled: CompiledSlot,
}

impl PlannedKernel {
    /// A kernel bound to its arguments, not yet compiled (the backend validates it on its
    /// first run).
    pub fn new(kernel: Kernel, args: Vec<BufferRef>, out: usize, device: Device) -> Self {
        PlannedKernel {
            kernel,
            args,
            out,
            device,
            compiled: CompiledSlot::default(),
        }
    }

    /// The kernel IR.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }
}

/// One step of a program, in run order.
#[derive(Debug, Clone)]
pub enum Step {
    /// Run a kernel.
    Kernel(Box<PlannedKernel>),
    /// Copy a whole buffer to another device, into planned buffer `out`.
    Transfer {
        /// The buffer copied.
        src: BufferRef,
        /// The planned buffer that receives the copy.
        out: usize,
        /// The destination device.
        to: Device,
        /// Size of the copy in bytes.
        bytes: usize,
    },
}

impl Step {
    /// The planned buffer this step writes.
    pub fn output(&self) -> usize {
        match self {
            Step::Kernel(k) => k.out,
            Step::Transfer { out, .. } => *out,
        }
    }
}

/// Size and device of one planned buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSpec {
    /// Size in bytes.
    pub bytes: usize,
    /// The device the buffer lives on.
    pub device: Device,
    /// An in-place write: the buffer is input slot `i`'s (nothing is allocated, and the
    /// buffer's version is bumped once the step ran).
    pub input: Option<usize>,
}

/// A runnable program.
#[derive(Debug, Clone, Default)]
pub struct Program {
    /// Kernels and transfers, in run order.
    pub steps: Vec<Step>,
    /// Planned buffers, allocated just before the step that writes them.
    pub buffers: Vec<BufferSpec>,
    /// Per step: planned buffers to release after it runs (their last reader).
    pub release_after: Vec<Vec<usize>>,
    /// Input slots the program reads.
    pub n_inputs: usize,
    /// Parameter slots the program reads.
    pub n_params: usize,
}

impl Program {
    /// Number of kernels (transfers excluded).
    pub fn kernel_count(&self) -> usize {
        self.kernels().count()
    }

    /// The kernels in run order.
    pub fn kernels(&self) -> impl Iterator<Item = &PlannedKernel> {
        self.steps.iter().filter_map(|s| match s {
            Step::Kernel(k) => Some(k.as_ref()),
            Step::Transfer { .. } => None,
        })
    }
}
