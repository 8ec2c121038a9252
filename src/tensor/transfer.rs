//! Moving tensors between devices. A transfer is a graph node like any other, so `realize`
//! plans it (and the work before it runs on the source device).

use super::{Tensor, unwrap_or_panic};
use crate::backend;
use crate::device::Device;
use crate::error::Result;
use crate::graph::{self, Op};

impl Tensor {
    /// This tensor on `device` (a no-op if it is already there).
    #[track_caller]
    pub fn to(&self, device: Device) -> Tensor {
        unwrap_or_panic(self.try_to(device))
    }

    /// Fallible [`Tensor::to`]. An unrealized generator (`zeros`, `rand`, `arange`...) is
    /// re-recorded on the target device instead of being computed here and copied.
    pub fn try_to(&self, device: Device) -> Result<Tensor> {
        if device == self.device {
            return Ok(self.clone());
        }
        // Re-recording a generator is only a shortcut between devices that both exist: a
        // tensor on a missing device must fail when realized, not be computed elsewhere.
        let both_usable =
            backend::check_device(self.device).is_ok() && backend::check_device(device).is_ok();
        let generator = graph::with_graph(|g| match g.node(self.key).map(|n| n.op.clone()) {
            Ok(Op::Generate(gen_)) => Some(gen_),
            _ => None,
        });
        if let Some(gen_) = generator.filter(|_| both_usable) {
            return Tensor::generate(gen_, &self.shape, self.dtype, device);
        }
        Tensor::record(
            Op::ToDevice(device),
            &[self],
            self.shape.clone(),
            self.dtype,
            device,
        )
    }
}
