//! A device-agnostic caching allocator: size classes, per-class free lists and stats.
//!
//! The allocator never returns memory to the device on `release`; blocks go to the free
//! list of their size class and are handed out again to the next request of that class.
//! Memory goes back to the device only through [`CachingAllocator::trim`] (called
//! explicitly, on an out-of-memory retry, or when the allocator is dropped).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::device::Device;
use crate::error::{KilnError, Result};

/// One raw allocation from a device. `addr` is a host pointer (CPU) or a device pointer (CUDA) as u64.
pub trait DeviceMemory: Send + Sync + 'static {
    /// The device this memory lives on.
    fn device(&self) -> Device;

    /// Allocate `bytes` (already rounded by the caller) aligned to at least `align`.
    ///
    /// # Errors
    /// `Err(())` means out of memory (or a request the device cannot represent).
    #[allow(clippy::result_unit_err)]
    fn alloc(&self, bytes: usize, align: usize) -> std::result::Result<u64, ()>;

    /// Return an allocation made by `alloc` with the same `bytes`/`align`.
    ///
    /// # Safety
    /// `addr` came from `alloc(bytes, align)` on this device, has not been freed since,
    /// and is not used afterwards.
    unsafe fn free(&self, addr: u64, bytes: usize, align: usize);

    /// Free bytes on the device if known (for error messages), else `None`.
    fn free_bytes(&self) -> Option<usize>;
}

/// How request sizes map to size classes.
///
/// Below `exact_below` a request is rounded up to a multiple of `granularity` and that is
/// its class. Above it, each power-of-two octave `[2^k, 2^(k+1))` is split into
/// `classes_per_octave` evenly spaced classes (with 4: 1.0, 1.25, 1.5, 1.75 × 2^k) and a
/// request goes to the smallest class that holds it, rounded up to `granularity`.
/// Powers of two map to themselves, so the waste above `exact_below` is bounded by
/// `1 / classes_per_octave` of the request (plus granularity). With power-of-two
/// granularity and class counts (both built-in policies) every class maps to itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundingPolicy {
    /// Every class is a multiple of this (0 is treated as 1).
    pub granularity: usize,
    /// Alignment passed to [`DeviceMemory::alloc`].
    pub align: usize,
    /// Number of classes per power-of-two octave above `exact_below` (0 is treated as 1).
    pub classes_per_octave: usize,
    /// Requests up to this size are only rounded to `granularity`.
    pub exact_below: usize,
}

impl RoundingPolicy {
    /// Host memory: 64-byte granularity and alignment (a cache line, enough for any SIMD
    /// load), 4 classes per octave above 64 KiB.
    pub const HOST: Self = Self {
        granularity: 64,
        align: 64,
        classes_per_octave: 4,
        exact_below: 64 * 1024,
    };

    /// CUDA device memory: 512-byte granularity and alignment, 4 classes per octave above 1 MiB.
    pub const CUDA: Self = Self {
        granularity: 512,
        align: 512,
        classes_per_octave: 4,
        exact_below: 1024 * 1024,
    };

    /// The size class of a `bytes` request (0 bytes → `granularity`).
    ///
    /// Returns `usize::MAX` when the class would not fit in a `usize`; use
    /// [`RoundingPolicy::try_round`] to tell that case apart.
    pub fn round(&self, bytes: usize) -> usize {
        self.try_round(bytes).unwrap_or(usize::MAX)
    }

    /// The size class of a `bytes` request, or `None` when it would overflow a `usize`.
    pub fn try_round(&self, bytes: usize) -> Option<usize> {
        let granularity = self.granularity.max(1);
        let rounded = bytes.max(1).checked_next_multiple_of(granularity)?;
        if rounded <= self.exact_below {
            return Some(rounded);
        }
        // `rounded >= 1`, so this is the largest power of two not above it.
        let octave = 1usize << (usize::BITS - 1 - rounded.leading_zeros());
        // Classes are `octave + ceil(i * octave / k)` for `i` in `0..=k`; pick the smallest
        // `i` whose class holds `rounded`. u128 keeps every product exact.
        let k = self.classes_per_octave.max(1) as u128;
        let p = octave as u128;
        let offset = (rounded - octave) as u128;
        let index = if offset == 0 {
            0
        } else {
            (offset - 1) * k / p + 1
        };
        let class = usize::try_from(p + (index * p).div_ceil(k)).ok()?;
        class.checked_next_multiple_of(granularity)
    }
}

/// Counters of one allocator. All byte counts use rounded class sizes unless noted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of blocks currently handed out (rounded sizes).
    pub current_bytes: usize,
    /// Maximum of `current_bytes` since creation or the last `reset_peak`.
    pub peak_bytes: usize,
    /// Bytes held from the device: handed out plus cached.
    pub reserved_bytes: usize,
    /// Bytes sitting in the free lists, ready for reuse.
    pub cached_bytes: usize,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that needed a device allocation.
    pub misses: u64,
    /// Successful device allocations.
    pub device_allocs: u64,
    /// Blocks returned to the device.
    pub device_frees: u64,
    /// Times a device allocation failed and was retried after trimming the cache.
    pub oom_retries: u64,
    /// Sum of the un-rounded sizes of the blocks currently handed out.
    pub requested_bytes: usize,
}

/// A block handed out by the allocator. Give it back with [`CachingAllocator::release`]
/// (a [`Buffer`](crate::memory::Buffer) does that on drop); a dropped `Block` is leaked.
#[derive(Debug)]
#[must_use = "a Block that is not released is leaked"]
pub struct Block {
    // Only the allocator makes blocks (the fields are not public), so `release` and
    // `Buffer` never see an address that was not handed out.
    /// Host pointer (CPU) or device pointer (CUDA).
    pub(crate) addr: u64,
    /// The rounded class size, i.e. how many bytes at `addr` belong to this block.
    pub(crate) size: usize,
    /// The size that was asked for (`requested <= size`).
    pub(crate) requested: usize,
}

impl Block {
    /// Host pointer (CPU) or device pointer (CUDA).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The rounded class size: how many bytes at [`Block::addr`] belong to this block.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The size that was asked for (at most [`Block::size`]).
    pub fn requested(&self) -> usize {
        self.requested
    }
}

/// What the allocator remembers about a block it has handed out.
#[derive(Debug, Clone, Copy)]
struct Live {
    size: usize,
    requested: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Cached blocks by class size; each list is used LIFO so the hottest block is reused.
    free: BTreeMap<usize, Vec<u64>>,
    /// Blocks currently handed out, by address. `release` only accepts these, so a
    /// forged or foreign `Block` can never reach the free lists (and then `free`).
    live: HashMap<u64, Live>,
    stats: MemoryStats,
}

impl State {
    fn hand_out(&mut self, addr: u64, size: usize, requested: usize) {
        self.live.insert(addr, Live { size, requested });
        let stats = &mut self.stats;
        stats.current_bytes = stats.current_bytes.saturating_add(size);
        stats.requested_bytes = stats.requested_bytes.saturating_add(requested);
        stats.peak_bytes = stats.peak_bytes.max(stats.current_bytes);
    }
}

/// A thread-safe bucketed caching allocator over one device.
pub struct CachingAllocator<D: DeviceMemory> {
    device: D,
    policy: RoundingPolicy,
    state: Mutex<State>,
}

impl<D: DeviceMemory> std::fmt::Debug for CachingAllocator<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("device", &self.device.device())
            .field("policy", &self.policy)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// An empty allocator over `device` with the given size classes.
    pub fn new(device: D, policy: RoundingPolicy) -> Self {
        Self {
            device,
            policy,
            state: Mutex::new(State::default()),
        }
    }

    /// The underlying device memory.
    pub fn device_memory(&self) -> &D {
        &self.device
    }

    /// The rounding policy in use.
    pub fn policy(&self) -> RoundingPolicy {
        self.policy
    }

    /// Hand out a block of at least `bytes` bytes.
    ///
    /// Served from the free list of the request's size class when it has a block (a hit),
    /// else from the device (a miss). If the device is out of memory, all cached blocks
    /// are returned to it and the allocation is retried once.
    ///
    /// # Errors
    /// [`KilnError::OutOfMemory`] (with the request, the bytes this allocator reserves and
    /// the device's free bytes) when the retry fails too, or when `bytes` is too large to
    /// round to a size class.
    pub fn allocate(&self, bytes: usize) -> Result<Block> {
        let Some(size) = self.policy.try_round(bytes) else {
            return Err(self.out_of_memory(bytes));
        };
        {
            let mut state = self.lock();
            if let Some(addr) = state.free.get_mut(&size).and_then(Vec::pop) {
                state.stats.hits += 1;
                state.stats.cached_bytes = state.stats.cached_bytes.saturating_sub(size);
                state.hand_out(addr, size, bytes);
                return Ok(Block {
                    addr,
                    size,
                    requested: bytes,
                });
            }
            state.stats.misses += 1;
        }
        // The lock is not held while the device allocates.
        let addr = match self.device.alloc(size, self.policy.align) {
            Ok(addr) => addr,
            Err(()) => {
                self.lock().stats.oom_retries += 1;
                self.trim();
                self.device
                    .alloc(size, self.policy.align)
                    .map_err(|()| self.out_of_memory(bytes))?
            }
        };
        let mut state = self.lock();
        state.stats.device_allocs += 1;
        state.stats.reserved_bytes = state.stats.reserved_bytes.saturating_add(size);
        state.hand_out(addr, size, bytes);
        Ok(Block {
            addr,
            size,
            requested: bytes,
        })
    }

    /// Put `block` on the free list of its class for reuse (it is not freed on the device).
    ///
    /// A block this allocator does not have handed out (from another allocator) is
    /// ignored, so it can never reach the device's `free`. Code outside kiln cannot make or
    /// copy a `Block`, so a block is released at most once.
    pub fn release(&self, block: Block) {
        let mut state = self.lock();
        let size = match state.live.get(&block.addr) {
            Some(live) if live.size == block.size && live.requested == block.requested => live.size,
            _ => return,
        };
        state.live.remove(&block.addr);
        let stats = &mut state.stats;
        stats.current_bytes = stats.current_bytes.saturating_sub(size);
        stats.requested_bytes = stats.requested_bytes.saturating_sub(block.requested);
        stats.cached_bytes = stats.cached_bytes.saturating_add(size);
        state.free.entry(size).or_default().push(block.addr);
    }

    /// Return every cached block to the device; returns the number of bytes freed.
    /// Blocks currently handed out are not touched.
    pub fn trim(&self) -> usize {
        let (free, bytes) = {
            let mut state = self.lock();
            let free = std::mem::take(&mut state.free);
            let mut bytes = 0usize;
            let mut count = 0u64;
            for (size, addrs) in &free {
                bytes = bytes.saturating_add(size.saturating_mul(addrs.len()));
                count += addrs.len() as u64;
            }
            let stats = &mut state.stats;
            stats.cached_bytes = stats.cached_bytes.saturating_sub(bytes);
            stats.reserved_bytes = stats.reserved_bytes.saturating_sub(bytes);
            stats.device_frees += count;
            (free, bytes)
        };
        for (size, addrs) in free {
            for addr in addrs {
                // SAFETY: an address enters a free list only in `release`, after it was
                // matched against `live`, which holds exactly the addresses returned by
                // `self.device.alloc(size, self.policy.align)` with that same `size`. The
                // `Block` naming it was consumed by `release`, and it was taken out of the
                // free lists above under the lock, so nothing can hand it out again: it is
                // freed exactly once and never used afterwards.
                unsafe { self.device.free(addr, size, self.policy.align) };
            }
        }
        bytes
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// Restart peak tracking: `peak_bytes := current_bytes`.
    pub fn reset_peak(&self) {
        let mut state = self.lock();
        state.stats.peak_bytes = state.stats.current_bytes;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code path panics while holding the lock, and the state stays consistent
        // between statements anyway, so a poisoned lock is safe to keep using.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn out_of_memory(&self, requested: usize) -> KilnError {
        let reserved = self.lock().stats.reserved_bytes;
        KilnError::OutOfMemory {
            device: self.device.device().to_string(),
            requested,
            reserved,
            free: self.device.free_bytes().unwrap_or(0),
        }
    }
}

impl<D: DeviceMemory> Drop for CachingAllocator<D> {
    /// Cached blocks go back to the device; blocks still handed out are leaked (their
    /// owners may still hold raw pointers into them).
    fn drop(&mut self) {
        self.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;

    #[derive(Debug, Default)]
    struct FakeState {
        used: usize,
        next_addr: u64,
        live: HashMap<u64, (usize, usize)>,
        allocs: u64,
        frees: u64,
        failed_allocs: u64,
        /// Frees of unknown addresses or with a different size/align than allocated.
        bad_frees: u64,
    }

    /// A device with a byte capacity that hands out fake addresses and checks every free.
    #[derive(Debug, Clone)]
    struct FakeDevice {
        capacity: usize,
        state: Arc<Mutex<FakeState>>,
    }

    impl FakeDevice {
        fn new(capacity: usize) -> Self {
            // Each fake device gets its own address range, like separate real devices.
            static NEXT_DEVICE: AtomicU64 = AtomicU64::new(1);
            let base = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed) << 40;
            Self {
                capacity,
                state: Arc::new(Mutex::new(FakeState {
                    next_addr: base,
                    ..FakeState::default()
                })),
            }
        }

        fn with<R>(&self, f: impl FnOnce(&FakeState) -> R) -> R {
            f(&self.state.lock().unwrap())
        }

        fn live_bytes(&self) -> usize {
            self.with(|s| s.live.values().map(|&(bytes, _)| bytes).sum())
        }
    }

    impl DeviceMemory for FakeDevice {
        fn device(&self) -> Device {
            Device::Cuda(0)
        }

        fn alloc(&self, bytes: usize, align: usize) -> std::result::Result<u64, ()> {
            let mut s = self.state.lock().unwrap();
            if bytes > self.capacity - s.used {
                s.failed_allocs += 1;
                return Err(());
            }
            let addr = s.next_addr.next_multiple_of(align as u64);
            // Leave a gap so that adjacent blocks never share an address even for 0 bytes.
            s.next_addr = addr + bytes as u64 + align as u64;
            s.used += bytes;
            s.allocs += 1;
            s.live.insert(addr, (bytes, align));
            Ok(addr)
        }

        unsafe fn free(&self, addr: u64, bytes: usize, align: usize) {
            let mut s = self.state.lock().unwrap();
            match s.live.remove(&addr) {
                Some(entry) if entry == (bytes, align) => {
                    s.used -= bytes;
                    s.frees += 1;
                }
                Some(entry) => {
                    s.live.insert(addr, entry);
                    s.bad_frees += 1;
                }
                None => s.bad_frees += 1,
            }
        }

        fn free_bytes(&self) -> Option<usize> {
            Some(self.capacity - self.state.lock().unwrap().used)
        }
    }

    /// Granularity 64, exact up to 4 KiB: easy numbers for the cache tests.
    const SMALL: RoundingPolicy = RoundingPolicy {
        granularity: 64,
        align: 64,
        classes_per_octave: 4,
        exact_below: 4 * KIB,
    };

    fn allocator(capacity: usize) -> (CachingAllocator<FakeDevice>, FakeDevice) {
        let device = FakeDevice::new(capacity);
        (CachingAllocator::new(device.clone(), SMALL), device)
    }

    /// A small deterministic generator (xorshift) for the sweep and thread tests.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn rounding_below_exact_is_granularity() {
        let host = RoundingPolicy::HOST;
        assert_eq!(host.round(0), 64);
        assert_eq!(host.round(1), 64);
        assert_eq!(host.round(64), 64);
        assert_eq!(host.round(65), 128);
        assert_eq!(host.round(1000), 1024);
        assert_eq!(host.round(64 * KIB - 1), 64 * KIB);
        assert_eq!(host.round(64 * KIB), 64 * KIB);
        // Just below the threshold nothing is bucketed: 48 KiB + 1 goes to 48 KiB + 64.
        assert_eq!(host.round(48 * KIB + 1), 48 * KIB + 64);

        let cuda = RoundingPolicy::CUDA;
        assert_eq!(cuda.round(0), 512);
        assert_eq!(cuda.round(1), 512);
        assert_eq!(cuda.round(513), 1024);
        assert_eq!(cuda.round(MIB - 1), MIB);
        assert_eq!(cuda.round(MIB), MIB);
    }

    #[test]
    fn rounding_above_exact_uses_quarter_octave_classes() {
        let host = RoundingPolicy::HOST;
        assert_eq!(host.round(64 * KIB + 1), 80 * KIB);
        assert_eq!(host.round(80 * KIB), 80 * KIB);
        assert_eq!(host.round(80 * KIB + 1), 96 * KIB);
        assert_eq!(host.round(100 * KIB), 112 * KIB);
        assert_eq!(host.round(112 * KIB + 1), 128 * KIB);
        assert_eq!(host.round(128 * KIB + 1), 160 * KIB);
        assert_eq!(host.round(3 * MIB), 3 * MIB);
        assert_eq!(host.round(3 * MIB + 1), 3 * MIB + 512 * KIB);

        let cuda = RoundingPolicy::CUDA;
        assert_eq!(cuda.round(MIB + 1), MIB + 256 * KIB);
        assert_eq!(cuda.round(1536 * KIB), 1536 * KIB);
        assert_eq!(cuda.round(100 * MIB), 112 * MIB);

        // A class count that does not divide the octave still stays within it.
        let thirds = RoundingPolicy {
            granularity: 1,
            align: 1,
            classes_per_octave: 3,
            exact_below: 1,
        };
        assert_eq!(thirds.round(1024), 1024);
        assert_eq!(thirds.round(1025), 1024 + 342);
        assert_eq!(thirds.round(1024 + 342), 1024 + 342);
        assert_eq!(thirds.round(1024 + 343), 1024 + 683);
        assert_eq!(thirds.round(2047), 2048);
    }

    #[test]
    fn rounding_keeps_powers_of_two() {
        for policy in [RoundingPolicy::HOST, RoundingPolicy::CUDA, SMALL] {
            for shift in 0..usize::BITS - 1 {
                let bytes = 1usize << shift;
                assert_eq!(
                    policy.round(bytes),
                    bytes.max(policy.granularity),
                    "{bytes} under {policy:?}"
                );
            }
        }
        assert_eq!(RoundingPolicy::HOST.round(64 * MIB), 64 * MIB);
        assert_eq!(RoundingPolicy::CUDA.round(64 * MIB), 64 * MIB);
    }

    #[test]
    fn rounding_is_monotonic_and_never_below_request() {
        let odd = RoundingPolicy {
            granularity: 48,
            align: 16,
            classes_per_octave: 3,
            exact_below: 1000,
        };
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for (policy, classes_are_fixed) in [
            (RoundingPolicy::HOST, true),
            (RoundingPolicy::CUDA, true),
            (SMALL, true),
            (odd, false),
        ] {
            let mut sizes: Vec<usize> = (0..5000).collect();
            for shift in 10..40 {
                let p = 1usize << shift;
                sizes.extend([p - 1, p, p + 1, p + p / 4, p + p / 4 + 1, 2 * p - 1]);
            }
            sizes.extend((0..20_000).map(|_| (rng.next() % (1 << 40)) as usize));
            sizes.sort_unstable();
            let mut previous = 0;
            for bytes in sizes {
                let class = policy.round(bytes);
                assert!(class >= bytes, "{bytes} -> {class} under {policy:?}");
                assert!(class >= previous, "{bytes} -> {class} < {previous}");
                assert_eq!(class % policy.granularity, 0, "{bytes} -> {class}");
                // Waste is bounded: granularity below the threshold, a class step above.
                let granular = bytes.max(1).next_multiple_of(policy.granularity);
                let bound = if granular <= policy.exact_below {
                    policy.granularity
                } else {
                    bytes / policy.classes_per_octave + 2 * policy.granularity + 1
                };
                assert!(
                    class - bytes <= bound,
                    "{bytes} -> {class} under {policy:?}"
                );
                if classes_are_fixed {
                    assert_eq!(policy.round(class), class, "classes are fixed points");
                }
                previous = class;
            }
        }
    }

    #[test]
    fn huge_requests_fail_without_panicking() {
        let host = RoundingPolicy::HOST;
        assert_eq!(host.try_round(usize::MAX), None);
        assert_eq!(host.try_round(usize::MAX - 63), None);
        assert_eq!(host.round(usize::MAX), usize::MAX);
        // In the top octave the 1.75 class still fits, the next one (2^BITS) does not.
        let top = 1usize << (usize::BITS - 1);
        assert_eq!(host.try_round(top), Some(top));
        assert_eq!(host.try_round(top + 1), Some(top + top / 4));
        assert_eq!(
            host.try_round(top + top / 2 + top / 4),
            Some(top + top / 2 + top / 4)
        );
        assert_eq!(host.try_round(top + top / 2 + top / 4 + 1), None);

        let (alloc, device) = allocator(MIB);
        for bytes in [usize::MAX, top + top / 2 + top / 4 + 1, top, 1 << 30] {
            match alloc.allocate(bytes) {
                Err(KilnError::OutOfMemory { requested, .. }) => assert_eq!(requested, bytes),
                other => panic!("expected OutOfMemory for {bytes}, got {other:?}"),
            }
        }
        // The unroundable ones never reached the device; the other two failed twice each.
        assert_eq!(device.with(|s| s.failed_allocs), 4);
        assert_eq!(alloc.stats().current_bytes, 0);
    }

    #[test]
    fn same_class_shares_a_bucket_different_classes_do_not() {
        let (alloc, device) = allocator(MIB);
        let a = alloc.allocate(100).unwrap();
        let b = alloc.allocate(120).unwrap();
        assert_eq!((a.size, b.size), (128, 128));
        assert_eq!((a.requested, b.requested), (100, 120));
        assert_ne!(a.addr, b.addr);
        let a_addr = a.addr;
        alloc.release(a);
        // 120 bytes is the same class as 100: served by a's block.
        let c = alloc.allocate(120).unwrap();
        assert_eq!(c.addr, a_addr);
        assert_eq!(device.with(|s| s.allocs), 2);

        // 64 bytes and 65 bytes are different classes: no sharing.
        let d = alloc.allocate(64).unwrap();
        let d_addr = d.addr;
        alloc.release(d);
        let e = alloc.allocate(65).unwrap();
        assert_eq!(e.size, 128);
        assert_ne!(e.addr, d_addr);
        assert_eq!(device.with(|s| s.allocs), 4);
        // And a larger bucketed class is not used for a smaller one.
        let big = alloc.allocate(5 * KIB).unwrap();
        assert_eq!(big.size, 5 * KIB);
        alloc.release(big);
        let small = alloc.allocate(4 * KIB).unwrap();
        assert_eq!(small.size, 4 * KIB);
        assert_eq!(device.with(|s| s.allocs), 6);
        for block in [b, c, e, small] {
            alloc.release(block);
        }
    }

    #[test]
    fn reuse_hits_the_cache_and_counts_correctly() {
        let (alloc, device) = allocator(MIB);
        let a = alloc.allocate(1000).unwrap();
        assert_eq!(
            alloc.stats(),
            MemoryStats {
                current_bytes: 1024,
                peak_bytes: 1024,
                reserved_bytes: 1024,
                cached_bytes: 0,
                hits: 0,
                misses: 1,
                device_allocs: 1,
                device_frees: 0,
                oom_retries: 0,
                requested_bytes: 1000,
            }
        );
        let a_addr = a.addr;
        alloc.release(a);
        let s = alloc.stats();
        assert_eq!((s.current_bytes, s.requested_bytes), (0, 0));
        assert_eq!(
            (s.reserved_bytes, s.cached_bytes, s.peak_bytes),
            (1024, 1024, 1024)
        );

        let b = alloc.allocate(1010).unwrap();
        assert_eq!(b.addr, a_addr);
        assert_eq!(b.size, 1024);
        let s = alloc.stats();
        assert_eq!((s.hits, s.misses, s.device_allocs), (1, 1, 1));
        assert_eq!((s.current_bytes, s.requested_bytes), (1024, 1010));
        assert_eq!((s.reserved_bytes, s.cached_bytes), (1024, 0));
        assert_eq!(device.with(|s| s.allocs), 1);

        let c = alloc.allocate(3050).unwrap();
        assert_eq!(c.size, 3072);
        let s = alloc.stats();
        assert_eq!((s.hits, s.misses, s.device_allocs), (1, 2, 2));
        assert_eq!(
            (s.current_bytes, s.peak_bytes, s.reserved_bytes),
            (4096, 4096, 4096)
        );
        assert_eq!(s.requested_bytes, 4060);
        alloc.release(b);
        alloc.release(c);
        let s = alloc.stats();
        assert_eq!(
            (s.current_bytes, s.cached_bytes, s.reserved_bytes),
            (0, 4096, 4096)
        );
        assert_eq!(s.reserved_bytes, device.live_bytes());
    }

    #[test]
    fn free_lists_are_lifo() {
        let (alloc, _device) = allocator(MIB);
        let a = alloc.allocate(256).unwrap();
        let b = alloc.allocate(256).unwrap();
        let (a_addr, b_addr) = (a.addr, b.addr);
        alloc.release(a);
        alloc.release(b);
        let first = alloc.allocate(256).unwrap();
        let second = alloc.allocate(256).unwrap();
        assert_eq!((first.addr, second.addr), (b_addr, a_addr));
        alloc.release(first);
        alloc.release(second);
    }

    #[test]
    fn peak_tracks_maximum_and_resets_to_current() {
        let (alloc, _device) = allocator(MIB);
        let a = alloc.allocate(1024).unwrap();
        let b = alloc.allocate(2048).unwrap();
        alloc.release(b);
        let s = alloc.stats();
        assert_eq!((s.current_bytes, s.peak_bytes), (1024, 3072));

        alloc.reset_peak();
        assert_eq!(alloc.stats().peak_bytes, 1024);
        let c = alloc.allocate(512).unwrap();
        assert_eq!(alloc.stats().peak_bytes, 1536);
        alloc.release(c);
        alloc.release(a);
        assert_eq!(alloc.stats().peak_bytes, 1536);
        alloc.reset_peak();
        assert_eq!(alloc.stats().peak_bytes, 0);
    }

    #[test]
    fn trim_frees_cached_blocks_only() {
        let (alloc, device) = allocator(MIB);
        assert_eq!(alloc.trim(), 0);
        let kept = alloc.allocate(4090).unwrap();
        let a = alloc.allocate(100).unwrap();
        let b = alloc.allocate(100).unwrap();
        let c = alloc.allocate(10 * KIB).unwrap();
        assert_eq!(c.size, 10 * KIB);
        for block in [a, b, c] {
            alloc.release(block);
        }
        assert_eq!(alloc.stats().reserved_bytes, 4096 + 2 * 128 + 10 * KIB);

        assert_eq!(alloc.trim(), 2 * 128 + 10 * KIB);
        let s = alloc.stats();
        assert_eq!(s.device_frees, 3);
        assert_eq!(
            (s.reserved_bytes, s.cached_bytes, s.current_bytes),
            (4096, 0, 4096)
        );
        device.with(|d| {
            assert_eq!(d.frees, 3);
            assert_eq!(d.bad_frees, 0);
            assert_eq!(d.live.len(), 1);
            assert!(d.live.contains_key(&kept.addr));
        });
        assert_eq!(alloc.trim(), 0);

        // After a trim the next request is a miss again.
        let again = alloc.allocate(100).unwrap();
        assert_eq!(alloc.stats().misses, 5);
        alloc.release(again);
        alloc.release(kept);
        assert_eq!(alloc.trim(), 4096 + 128);
        assert_eq!(device.live_bytes(), 0);
        assert_eq!(alloc.stats().reserved_bytes, 0);
    }

    #[test]
    fn oom_trims_the_cache_and_retries() {
        let (alloc, device) = allocator(4 * KIB);
        let a = alloc.allocate(2 * KIB).unwrap();
        let b = alloc.allocate(2 * KIB).unwrap();
        alloc.release(a);
        alloc.release(b);
        assert_eq!(device.free_bytes(), Some(0));

        // A different class: the cache cannot serve it and the device is full of cache.
        let c = alloc.allocate(3 * KIB).unwrap();
        assert_eq!(c.size, 3 * KIB);
        let s = alloc.stats();
        assert_eq!(s.oom_retries, 1);
        assert_eq!(s.device_frees, 2);
        assert_eq!((s.device_allocs, s.misses, s.hits), (3, 3, 0));
        assert_eq!(
            (s.reserved_bytes, s.cached_bytes, s.current_bytes),
            (3 * KIB, 0, 3 * KIB)
        );
        assert_eq!(s.peak_bytes, 4 * KIB);
        device.with(|d| {
            assert_eq!(d.failed_allocs, 1);
            assert_eq!(d.bad_frees, 0);
        });
        alloc.release(c);
    }

    #[test]
    fn true_oom_reports_requested_reserved_and_free() {
        let (alloc, device) = allocator(4 * KIB);
        let held = alloc.allocate(2 * KIB).unwrap();
        let cached = alloc.allocate(1000).unwrap();
        alloc.release(cached);

        let err = alloc.allocate(3000).unwrap_err();
        // The retry trimmed the 1 KiB cached block, so 2 KiB stay reserved and free.
        assert_eq!(
            err,
            KilnError::OutOfMemory {
                device: "cuda:0".to_string(),
                requested: 3000,
                reserved: 2 * KIB,
                free: 2 * KIB,
            }
        );
        let message = err.to_string();
        assert!(message.contains("cuda:0"), "{message}");
        assert!(message.contains("requested 3000 bytes"), "{message}");
        assert!(message.contains("2048 bytes reserved"), "{message}");
        assert!(message.contains("2048 bytes free"), "{message}");

        let s = alloc.stats();
        assert_eq!(s.oom_retries, 1);
        assert_eq!((s.current_bytes, s.requested_bytes), (2 * KIB, 2 * KIB));
        assert_eq!(s.device_frees, 1);
        assert_eq!(device.with(|d| d.failed_allocs), 2);
        alloc.release(held);
    }

    #[test]
    fn zero_byte_requests_get_a_granule() {
        let (alloc, _device) = allocator(MIB);
        let a = alloc.allocate(0).unwrap();
        let b = alloc.allocate(0).unwrap();
        assert_eq!((a.size, a.requested), (64, 0));
        assert_ne!(a.addr, b.addr);
        let s = alloc.stats();
        assert_eq!((s.current_bytes, s.requested_bytes), (128, 0));
        let a_addr = a.addr;
        alloc.release(a);
        // A 1-byte request is the same class.
        let c = alloc.allocate(1).unwrap();
        assert_eq!(c.addr, a_addr);
        alloc.release(b);
        alloc.release(c);
        assert_eq!(alloc.stats().current_bytes, 0);
    }

    #[test]
    fn foreign_and_altered_blocks_are_ignored() {
        let (alloc, device) = allocator(MIB);
        let (other, _) = allocator(MIB);
        let mine = alloc.allocate(100).unwrap();
        let theirs = other.allocate(100).unwrap();
        let theirs_addr = theirs.addr;
        let before = alloc.stats();

        alloc.release(theirs);
        alloc.release(Block {
            addr: 12345,
            size: 128,
            requested: 100,
        });
        alloc.release(Block {
            addr: mine.addr,
            size: 256,
            requested: 100,
        });
        assert_eq!(alloc.stats(), before);
        assert_eq!(alloc.trim(), 0);
        assert_eq!(device.with(|d| d.bad_frees), 0);

        // The genuine block still releases normally, and the foreign address never appears.
        alloc.release(mine);
        assert_eq!(alloc.stats().cached_bytes, 128);
        let next = alloc.allocate(100).unwrap();
        assert_ne!(next.addr, theirs_addr);
        alloc.release(next);
    }

    #[test]
    fn dropping_the_allocator_frees_its_cache() {
        let device = FakeDevice::new(MIB);
        {
            let alloc = CachingAllocator::new(device.clone(), SMALL);
            let a = alloc.allocate(100).unwrap();
            let b = alloc.allocate(10 * KIB).unwrap();
            alloc.release(a);
            alloc.release(b);
            assert_eq!(device.with(|d| d.live.len()), 2);
        }
        device.with(|d| {
            assert!(d.live.is_empty());
            assert_eq!((d.frees, d.bad_frees), (2, 0));
        });
    }

    #[test]
    fn concurrent_allocate_release_keeps_stats_consistent() {
        const THREADS: usize = 8;
        const ROUNDS: usize = 2000;
        let (alloc, device) = allocator(usize::MAX);
        let alloc = Arc::new(alloc);
        let addrs = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let alloc = Arc::clone(&alloc);
                    scope.spawn(move || {
                        let mut rng = Rng(0x1234_5678 + t as u64 * 7919);
                        let mut held: Vec<Block> = Vec::new();
                        let mut seen = Vec::new();
                        for _ in 0..ROUNDS {
                            if held.len() < 8 && !rng.next().is_multiple_of(3) {
                                let bytes = (rng.next() % (20 * KIB as u64)) as usize;
                                let block = alloc.allocate(bytes).unwrap();
                                assert!(block.size >= bytes);
                                seen.push(block.addr);
                                held.push(block);
                            } else if !held.is_empty() {
                                let i = (rng.next() as usize) % held.len();
                                alloc.release(held.swap_remove(i));
                            }
                        }
                        for block in held {
                            alloc.release(block);
                        }
                        seen.len() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });

        let s = alloc.stats();
        assert_eq!(s.current_bytes, 0);
        assert_eq!(s.requested_bytes, 0);
        assert_eq!(s.hits + s.misses, addrs);
        assert_eq!(s.device_allocs, s.misses);
        assert_eq!(s.oom_retries, 0);
        assert_eq!(s.reserved_bytes, s.cached_bytes);
        assert_eq!(s.reserved_bytes, device.live_bytes());
        assert!(
            s.hits > 0,
            "with 8 blocks per thread, most requests must hit"
        );
        assert!(s.peak_bytes <= THREADS * 8 * 20 * KIB);

        assert_eq!(alloc.trim(), s.reserved_bytes);
        device.with(|d| {
            assert!(d.live.is_empty());
            assert_eq!(d.bad_frees, 0);
            assert_eq!(d.frees, d.allocs);
        });
    }
}
