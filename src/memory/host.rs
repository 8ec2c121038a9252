//! Host (CPU) memory for the caching allocator, from the global Rust allocator.

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};

use super::allocator::DeviceMemory;
use crate::device::Device;

/// Size of a transparent huge page on x86-64 and aarch64 Linux.
const HUGE_PAGE: usize = 2 << 20;

/// Blocks at least this large are aligned to [`HUGE_PAGE`] and offered to the kernel for
/// transparent huge pages: one huge page and up. A training step's activations are 1–4 MiB
/// each (char_gpt: `[2048, 512]` f32 is 4 MiB); with the threshold at 8 MiB none of them
/// got huge pages, at 2 MiB 60 of its 150 MiB do, and its step ran 2–5 ms (≈ 3%) faster in
/// four alternating pairs of runs on 2 Zen 4 cores (kernels reading several cold inputs
/// gained most: the GELU derivative 1.24 → 0.83–1.0 ms).
const HUGE_MIN: usize = 2 << 20;

/// The alignment a block of `bytes` gets: `align`, raised to [`HUGE_PAGE`] for large
/// blocks on Linux (a pure function of both, so `free` rebuilds the same layout).
fn huge_align(bytes: usize, align: usize) -> usize {
    if cfg!(target_os = "linux") && bytes >= HUGE_MIN {
        align.max(HUGE_PAGE)
    } else {
        align
    }
}

/// Asks Linux to back `[ptr, ptr + bytes)` with transparent huge pages (`madvise` with
/// `MADV_HUGEPAGE`), which systems in THP's default `madvise` mode only do on request.
/// A 4096 × 4096 f32 tensor then spans 32 TLB entries instead of 16,384, which is what
/// strided kernels (transposes, column reductions) pay for on every row, and a fresh
/// block faults in 2 MiB at a time. Only a hint: a refusal changes nothing.
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const MADV_HUGEPAGE: std::ffi::c_int = 14;
        unsafe extern "C" {
            fn madvise(
                addr: *mut std::ffi::c_void,
                len: usize,
                advice: std::ffi::c_int,
            ) -> std::ffi::c_int;
        }
        // SAFETY: `ptr` is the start of a live allocation of `bytes` bytes aligned to 2 MiB
        // (a multiple of the page size, as madvise requires); MADV_HUGEPAGE only changes how
        // the kernel backs the range, never its contents or accessibility, and an error
        // return is ignored.
        unsafe {
            madvise(ptr.cast(), bytes, MADV_HUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// Host memory from the global allocator.
///
/// Every allocation is zeroed, so a fresh block is initialized memory and any slice view
/// over it is valid. A block recycled by the cache keeps whatever was last written to it
/// (still initialized, but not zero).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostMemory;

impl DeviceMemory for HostMemory {
    fn device(&self) -> Device {
        Device::Cpu
    }

    /// Zeroed memory of `bytes` bytes aligned to `align`. `align` must be a power of two
    /// (else `Err(())`). A zero-byte request gets a dangling, aligned, non-null address
    /// that must not be dereferenced.
    fn alloc(&self, bytes: usize, align: usize) -> Result<u64, ()> {
        let layout = Layout::from_size_align(bytes, huge_align(bytes, align)).map_err(|_| ())?;
        if bytes == 0 {
            return Ok(std::ptr::without_provenance_mut::<u8>(align).expose_provenance() as u64);
        }
        if layout.align() >= HUGE_PAGE {
            // Advise before anything touches the pages (zeroing would fault them in as
            // small pages), then zero.
            // SAFETY: `layout` has a non-zero size (checked above) and was validated by
            // `Layout::from_size_align`, which is all `alloc` requires.
            let ptr = unsafe { alloc(layout) };
            if ptr.is_null() {
                return Err(());
            }
            advise_huge_pages(ptr, bytes);
            // SAFETY: `ptr` is valid for writes of `bytes` bytes (just allocated with that
            // size); afterwards every byte is initialized, as `alloc_zeroed` would leave it.
            unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
            return Ok(ptr.expose_provenance() as u64);
        }
        // SAFETY: `layout` has a non-zero size (checked above) and was validated by
        // `Layout::from_size_align`, which is all `alloc_zeroed` requires.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(());
        }
        Ok(ptr.expose_provenance() as u64)
    }

    unsafe fn free(&self, addr: u64, bytes: usize, align: usize) {
        if bytes == 0 {
            // Zero-byte allocations are dangling addresses, nothing to give back.
            return;
        }
        let Ok(layout) = Layout::from_size_align(bytes, huge_align(bytes, align)) else {
            // `alloc` could not have succeeded with this layout, so `addr` cannot be one of
            // ours; the caller broke the contract and there is nothing sound to free.
            return;
        };
        // The address was exposed by `alloc`, so recovering its provenance here is valid.
        let ptr = std::ptr::with_exposed_provenance_mut::<u8>(addr as usize);
        // SAFETY: by this function's contract `addr` came from `alloc(bytes, align)` on this
        // (stateless) allocator and was not freed since; that `alloc` got it from
        // `alloc_zeroed` with exactly this `layout` (same size and align, size non-zero),
        // which is what `dealloc` requires.
        unsafe { dealloc(ptr, layout) };
    }

    /// `MemAvailable` from `/proc/meminfo` on Linux, else `None`.
    fn free_bytes(&self) -> Option<usize> {
        available_host_memory()
    }
}

/// `MemAvailable` from `/proc/meminfo` on Linux, else `None`.
#[cfg(target_os = "linux")]
pub(crate) fn available_host_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let kib: usize = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// `MemAvailable` from `/proc/meminfo` on Linux, else `None`.
#[cfg(not(target_os = "linux"))]
pub(crate) fn available_host_memory() -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::KilnError;
    use crate::memory::allocator::{CachingAllocator, RoundingPolicy};

    #[test]
    fn alloc_is_zeroed_aligned_and_writable() {
        let host = HostMemory;
        for (bytes, align) in [(64, 64), (4096, 512), (100_000, 4096)] {
            let addr = host.alloc(bytes, align).unwrap();
            assert_ne!(addr, 0);
            assert_eq!(addr % align as u64, 0);
            let ptr = std::ptr::with_exposed_provenance_mut::<u8>(addr as usize);
            // SAFETY: `ptr` points to `bytes` bytes just allocated (zeroed, so initialized)
            // and nothing else refers to them.
            let slice = unsafe { std::slice::from_raw_parts_mut(ptr, bytes) };
            assert!(slice.iter().all(|&b| b == 0));
            slice.fill(0xab);
            assert_eq!(slice[bytes - 1], 0xab);
            // SAFETY: allocated above with the same size and alignment, not used after this.
            unsafe { host.free(addr, bytes, align) };
        }
    }

    /// Blocks of a huge page and up start on a huge-page boundary (on Linux), smaller ones
    /// keep the alignment asked for; both are freed with the layout they were made with.
    #[test]
    fn large_blocks_are_huge_page_aligned() {
        let host = HostMemory;
        for bytes in [HUGE_PAGE, HUGE_PAGE + 4096, 3 * HUGE_PAGE] {
            let want = if cfg!(target_os = "linux") {
                HUGE_PAGE
            } else {
                64
            };
            assert_eq!(huge_align(bytes, 64), want);
            let addr = host.alloc(bytes, 64).unwrap();
            assert_eq!(addr % want as u64, 0, "{bytes} bytes at {addr:#x}");
            // SAFETY: allocated above with the same size and alignment, not used after this.
            unsafe { host.free(addr, bytes, 64) };
        }
        assert_eq!(huge_align(HUGE_PAGE - 1, 64), 64);
    }

    #[test]
    fn bad_layouts_and_zero_sizes_do_not_crash() {
        let host = HostMemory;
        assert_eq!(host.alloc(64, 3), Err(()));
        assert_eq!(host.alloc(usize::MAX - 10, 64), Err(()));
        let addr = host.alloc(0, 64).unwrap();
        assert_eq!(addr, 64);
        // SAFETY: from `alloc(0, 64)` above; freeing a zero-size block is a no-op.
        unsafe { host.free(addr, 0, 64) };
        assert_eq!(host.device(), Device::Cpu);
        if cfg!(target_os = "linux") {
            assert!(host.free_bytes().is_some_and(|free| free > 0));
        }
    }

    #[test]
    fn caching_allocator_over_host_memory() {
        let alloc = CachingAllocator::new(HostMemory, RoundingPolicy::HOST);
        let block = alloc.allocate(1000).unwrap();
        assert_eq!(block.size, 1024);
        assert_eq!(block.addr % 64, 0);
        let ptr = std::ptr::with_exposed_provenance_mut::<u8>(block.addr as usize);
        // SAFETY: the block holds `block.size` initialized bytes owned by this test.
        unsafe { ptr.add(999).write(7) };
        let addr = block.addr;
        alloc.release(block);
        let again = alloc.allocate(1024).unwrap();
        assert_eq!(again.addr, addr);
        // SAFETY: same block, still live; recycled memory keeps its contents.
        assert_eq!(unsafe { ptr.add(999).read() }, 7);
        alloc.release(again);
        assert_eq!(alloc.trim(), 1024);

        match alloc.allocate(usize::MAX / 2) {
            Err(KilnError::OutOfMemory { device, .. }) => assert_eq!(device, "cpu"),
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
    }
}
