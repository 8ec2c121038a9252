//! Memory: caching allocators, buffers and per-device memory stats.
//!
//! Every device gets one [`CachingAllocator`]. Requests are rounded to size classes
//! (granularity-rounded for small sizes, a few evenly spaced classes per power-of-two
//! octave above a threshold, see [`RoundingPolicy`]), and released blocks go to a free list
//! per class instead of back to the device, so steady-state execution reuses the same
//! blocks without touching the system allocator or the driver. A [`Buffer`] returns its
//! block to that cache when its last reference drops; the executor's memory plan drops
//! intermediate buffers right after their last consumer runs, so a block is reusable for
//! the next op of the same graph. Cached memory goes back to the device only on
//! [`trim`] (also done automatically, once, before reporting out-of-memory) or when the
//! allocator is dropped. [`stats`] reports current, peak, reserved and cached bytes plus
//! hit/miss counts per device.
//!
//! The host allocator is built in ([`host_allocator`]); a backend for another device
//! creates its own allocator and plugs it into [`stats`], [`trim`] and [`reset_peak`]
//! with [`register_device_allocator`].

pub mod allocator;
pub mod buffer;
pub mod host;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

pub use allocator::{Block, CachingAllocator, DeviceMemory, MemoryStats, RoundingPolicy};
pub use buffer::{BlockOwner, Buffer};
pub use host::HostMemory;

use crate::device::Device;
use crate::error::{KilnError, Result};

/// The process-wide controls of one device's allocator: what [`stats`], [`trim`] and
/// [`reset_peak`] call. Implemented by every [`CachingAllocator`].
pub trait AllocatorControl: Send + Sync {
    /// The device the allocator serves.
    fn device(&self) -> Device;
    /// A snapshot of its counters.
    fn stats(&self) -> MemoryStats;
    /// Return cached memory to the device; returns bytes freed.
    fn trim(&self) -> usize;
    /// Restart peak tracking from the current usage.
    fn reset_peak(&self);
}

impl<D: DeviceMemory> AllocatorControl for CachingAllocator<D> {
    fn device(&self) -> Device {
        self.device_memory().device()
    }

    fn stats(&self) -> MemoryStats {
        CachingAllocator::stats(self)
    }

    fn trim(&self) -> usize {
        CachingAllocator::trim(self)
    }

    fn reset_peak(&self) {
        CachingAllocator::reset_peak(self);
    }
}

/// Allocators registered by backends, by device (never `Device::Cpu`).
static REGISTRY: RwLock<BTreeMap<Device, Arc<dyn AllocatorControl>>> = RwLock::new(BTreeMap::new());

/// The process-wide host allocator ([`RoundingPolicy::HOST`]), created on first use.
pub fn host_allocator() -> &'static Arc<CachingAllocator<HostMemory>> {
    static HOST: OnceLock<Arc<CachingAllocator<HostMemory>>> = OnceLock::new();
    HOST.get_or_init(|| Arc::new(CachingAllocator::new(HostMemory, RoundingPolicy::HOST)))
}

/// A host buffer of `bytes` bytes from the process-wide host allocator.
///
/// The memory is initialized (zero when fresh from the system, the previous contents when
/// recycled from the cache).
///
/// # Errors
/// [`KilnError::OutOfMemory`] when the host cannot provide the memory even after the cache
/// was trimmed, or `bytes` is too large to round to a size class.
pub fn alloc_host(bytes: usize) -> Result<Buffer> {
    let allocator = host_allocator();
    let block = allocator.allocate(bytes)?;
    Ok(Buffer::new(
        block,
        Arc::clone(allocator) as Arc<dyn BlockOwner>,
    ))
}

/// Make `allocator` the one [`stats`], [`trim`] and [`reset_peak`] use for its device
/// (`allocator.device()`). Returns the allocator it replaces, if any.
///
/// # Errors
/// [`KilnError::Internal`] for a `Device::Cpu` allocator: the host allocator is built in.
pub fn register_device_allocator(
    allocator: Arc<dyn AllocatorControl>,
) -> Result<Option<Arc<dyn AllocatorControl>>> {
    let device = allocator.device();
    if device == Device::Cpu {
        return Err(KilnError::Internal(
            "the host allocator is built in and cannot be registered or replaced".to_string(),
        ));
    }
    let mut registry = REGISTRY.write().unwrap_or_else(PoisonError::into_inner);
    Ok(registry.insert(device, allocator))
}

/// Remove the allocator registered for `device`, returning it.
pub fn unregister_device_allocator(device: Device) -> Option<Arc<dyn AllocatorControl>> {
    let mut registry = REGISTRY.write().unwrap_or_else(PoisonError::into_inner);
    registry.remove(&device)
}

/// The allocator behind `device`: the host allocator for the CPU, else the registered one.
fn control(device: Device) -> Option<Arc<dyn AllocatorControl>> {
    match device {
        Device::Cpu => Some(Arc::clone(host_allocator()) as Arc<dyn AllocatorControl>),
        Device::Cuda(_) => {
            let registry = REGISTRY.read().unwrap_or_else(PoisonError::into_inner);
            registry.get(&device).cloned()
        }
    }
}

/// Memory counters of `device`'s allocator (all zero for a device with no allocator yet).
pub fn stats(device: Device) -> MemoryStats {
    control(device).map_or_else(MemoryStats::default, |c| c.stats())
}

/// Return `device`'s cached memory to the device; returns bytes freed (0 without an allocator).
pub fn trim(device: Device) -> usize {
    control(device).map_or(0, |c| c.trim())
}

/// Restart peak tracking of `device`'s allocator: `peak_bytes := current_bytes`.
pub fn reset_peak(device: Device) {
    if let Some(control) = control(device) {
        control.reset_peak();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host memory that claims to be a GPU, to exercise the registry.
    struct PretendGpu(usize);

    impl DeviceMemory for PretendGpu {
        fn device(&self) -> Device {
            Device::Cuda(self.0)
        }

        fn alloc(&self, bytes: usize, align: usize) -> std::result::Result<u64, ()> {
            HostMemory.alloc(bytes, align)
        }

        unsafe fn free(&self, addr: u64, bytes: usize, align: usize) {
            // SAFETY: forwarded unchanged; every address came from `HostMemory::alloc`
            // with the same size and alignment, by this function's own contract.
            unsafe { HostMemory.free(addr, bytes, align) }
        }

        fn free_bytes(&self) -> Option<usize> {
            None
        }
    }

    #[test]
    fn alloc_host_gives_a_usable_cpu_buffer() {
        let buffer = alloc_host(100).unwrap();
        assert_eq!(buffer.device(), Device::Cpu);
        assert_eq!(buffer.len_bytes(), 100);
        assert_eq!(buffer.capacity_bytes(), 128);
        assert_eq!(buffer.host_ptr().align_offset(64), 0);
        // SAFETY: the buffer owns 128 initialized bytes and nothing else uses them.
        unsafe { buffer.host_ptr().write_bytes(0x5a, buffer.len_bytes()) };
        // SAFETY: as above; byte 99 was just written.
        assert_eq!(unsafe { buffer.host_ptr().add(99).read() }, 0x5a);

        // Other tests share the host allocator, so only bounds that hold regardless.
        let s = stats(Device::Cpu);
        assert!(s.current_bytes >= 128);
        assert!(s.requested_bytes >= 100);
        assert!(s.reserved_bytes >= s.current_bytes);
        assert!(s.misses + s.hits >= 1);
        reset_peak(Device::Cpu);
        let s = stats(Device::Cpu);
        assert!(s.peak_bytes >= 128);
        drop(buffer);
        // Give the block back to the system so the host cache does not outlive the test.
        trim(Device::Cpu);
        assert!(std::ptr::eq(host_allocator(), host_allocator()));

        assert!(matches!(
            alloc_host(usize::MAX),
            Err(KilnError::OutOfMemory {
                requested: usize::MAX,
                ..
            })
        ));
    }

    #[test]
    fn unregistered_devices_report_nothing() {
        let device = Device::Cuda(usize::MAX);
        assert_eq!(stats(device), MemoryStats::default());
        assert_eq!(trim(device), 0);
        reset_peak(device);
        assert!(unregister_device_allocator(device).is_none());
    }

    #[test]
    fn registered_allocators_serve_stats_trim_and_reset_peak() {
        let device = Device::Cuda(usize::MAX - 1);
        let gpu = Arc::new(CachingAllocator::new(
            PretendGpu(usize::MAX - 1),
            RoundingPolicy::CUDA,
        ));
        assert!(register_device_allocator(gpu.clone()).unwrap().is_none());

        let a = gpu.allocate(1000).unwrap();
        let b = gpu.allocate(3000).unwrap();
        gpu.release(b);
        let s = stats(device);
        assert_eq!(
            (s.current_bytes, s.cached_bytes, s.peak_bytes),
            (512 * 2, 3072, 4096)
        );
        reset_peak(device);
        assert_eq!(stats(device).peak_bytes, 1024);
        assert_eq!(trim(device), 3072);
        assert_eq!(stats(device).reserved_bytes, 1024);
        gpu.release(a);

        // Re-registering replaces and returns the previous allocator.
        let previous = register_device_allocator(gpu.clone()).unwrap().unwrap();
        assert_eq!(previous.device(), device);
        let removed = unregister_device_allocator(device).unwrap();
        assert_eq!(removed.stats().cached_bytes, 1024);
        assert_eq!(stats(device), MemoryStats::default());
    }

    #[test]
    fn the_host_allocator_cannot_be_registered() {
        let host: Arc<dyn AllocatorControl> =
            Arc::new(CachingAllocator::new(HostMemory, RoundingPolicy::HOST));
        assert!(matches!(
            register_device_allocator(host),
            Err(KilnError::Internal(_))
        ));
    }
}
