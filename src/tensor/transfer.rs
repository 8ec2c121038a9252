//! Moving tensors between devices. A transfer is a graph node like any other, so `realize`
//! plans it (and the work before it runs on the source device).

use super::{Tensor, unwrap_or_panic};
use crate::device::Device;
use crate::error::Result;
use crate::graph::Op;

impl Tensor {
    /// This tensor on `device` (a no-op if it is already there).
    #[track_caller]
    pub fn to(&self, device: Device) -> Tensor {
        unwrap_or_panic(self.try_to(device))
    }

    /// Fallible [`Tensor::to`].
    pub fn try_to(&self, device: Device) -> Result<Tensor> {
        if device == self.device {
            return Ok(self.clone());
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
