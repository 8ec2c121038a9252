//! Where a tensor's buffers live.

use std::fmt;

/// A compute device. `Cpu` is the default and always available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Device {
    /// The host, run by the multi-threaded CPU backend.
    #[default]
    Cpu,
    /// The n-th CUDA GPU (needs the `cuda` feature and a usable driver at run time).
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
