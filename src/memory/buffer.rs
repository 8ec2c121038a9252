//! [`Buffer`]: a block that goes back to its allocator when dropped.

use std::fmt;
use std::sync::Arc;

use super::allocator::{Block, CachingAllocator, DeviceMemory};
use crate::device::Device;

/// Something that takes blocks back: the allocator a [`Buffer`] returns its block to.
pub trait BlockOwner: Send + Sync {
    /// Take `block` back (it will not be used by the caller again).
    fn release(&self, block: Block);
    /// The device the blocks live on.
    fn device(&self) -> Device;
}

impl<D: DeviceMemory> BlockOwner for CachingAllocator<D> {
    fn release(&self, block: Block) {
        CachingAllocator::release(self, block);
    }

    fn device(&self) -> Device {
        self.device_memory().device()
    }
}

/// The owner of a vector adopted by [`Buffer::from_vec`]: releasing the block drops it.
struct AdoptedVec {
    data: std::sync::Mutex<Option<Box<dyn Send>>>,
}

impl BlockOwner for AdoptedVec {
    fn release(&self, _block: Block) {
        let mut data = self.data.lock().unwrap_or_else(|e| e.into_inner());
        drop(data.take());
    }

    fn device(&self) -> Device {
        Device::Cpu
    }
}

/// A block of memory owned by a tensor's storage; returns the block to its owner on drop.
///
/// Usually shared as `Arc<Buffer>`. `Buffer` is `Send + Sync` and never hands out `&mut`
/// access: it only exposes the address. Kernels write through raw pointers derived from
/// [`Buffer::host_ptr`] / [`Buffer::addr`], and it is their (unsafe) responsibility that
/// concurrent writers touch disjoint regions and that nobody reads a region while it is
/// being written.
pub struct Buffer {
    /// Always `Some` until `drop` takes it.
    block: Option<Block>,
    owner: Arc<dyn BlockOwner>,
    /// Bumped by every in-place write: a reader that recorded an older version reads a value
    /// that no longer exists (and is refused).
    version: std::sync::atomic::AtomicU64,
    /// Who holds the memory now ([`Access`]): host slices and running programs that read
    /// it, or one in-place writer.
    access: std::sync::atomic::AtomicU64,
}

/// The kinds of hold a buffer's access state counts: [`Access::Slice`] and [`Access::Read`]
/// share the memory with each other, [`Buffer::try_write`] excludes both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// A host slice handed to user code (`Tensor::as_slice`): it may live as long as the
    /// user likes, so an in-place write that meets one is refused, not delayed.
    Slice,
    /// A program that reads the buffer while it runs, or a copy out of it (`to_bytes`):
    /// an in-place write waits for it.
    Read,
}

/// Why [`Buffer::try_write`] did not get the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteRefused {
    /// A host slice is alive: the write must fail.
    Borrowed,
    /// A running program reads it or another writes it: the write may retry once it ends.
    Busy,
}

/// The access state's fields: host slices in the low 31 bits, running readers in the next
/// 31, a writer waiting for the readers to finish, and the writer flag on top.
const SLICE: u64 = 1;
const SLICES: u64 = (1 << 31) - 1;
const READ: u64 = 1 << 31;
const WANTED: u64 = 1 << 62;
const WRITER: u64 = 1 << 63;

/// Back-offs ([`back_off`]) during which a new reader defers to a waiting writer. Past them
/// it takes its hold anyway and clears the writer's flag, so a writer that stopped trying
/// (another thread ran its update) delays readers once, briefly, and never blocks them.
pub(crate) const DEFER_TRIES: u32 = 64;

impl Buffer {
    /// Wrap `block`, which `owner` handed out; it goes back to `owner` on drop.
    pub(crate) fn new(block: Block, owner: Arc<dyn BlockOwner>) -> Self {
        Self {
            block: Some(block),
            owner,
            version: std::sync::atomic::AtomicU64::new(0),
            access: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Adopts a vector's memory as a host buffer without copying: the vector is dropped when
    /// the buffer is (the allocator never sees this memory).
    pub(crate) fn from_vec<T: Send + 'static>(data: Vec<T>) -> Self {
        let bytes = std::mem::size_of_val(data.as_slice());
        // Exposed so that `host_ptr` can recover a pointer with this allocation's provenance.
        let addr = data.as_ptr().expose_provenance() as u64;
        let block = Block {
            addr,
            // Only the initialized elements: `capacity_bytes` promises initialized memory.
            size: bytes,
            requested: bytes,
        };
        Self::new(
            block,
            Arc::new(AdoptedVec {
                data: std::sync::Mutex::new(Some(Box::new(data))),
            }),
        )
    }

    /// Takes a shared hold of kind `kind` unless an in-place writer holds the buffer, or
    /// (when `defer`) one waits for the current readers to finish; returns whether it did.
    /// Every hold taken is given back with [`Buffer::unshare`]. A hold taken without
    /// deferring clears the waiting writer's flag (see [`DEFER_TRIES`]).
    pub(crate) fn try_share(&self, kind: Access, defer: bool) -> bool {
        use std::sync::atomic::Ordering;
        let one = match kind {
            Access::Slice => SLICE,
            Access::Read => READ,
        };
        let mut now = self.access.load(Ordering::Acquire);
        loop {
            let count = match kind {
                Access::Slice => now & SLICES,
                Access::Read => (now & !(WRITER | WANTED)) >> 31,
            };
            // A full counter refuses (as a writer would) rather than carry into the next
            // field: 2^31 - 1 holds of one kind on one buffer are not a real program.
            if now & WRITER != 0 || count >= SLICES || (defer && now & WANTED != 0) {
                return false;
            }
            let next = if defer {
                now + one
            } else {
                (now & !WANTED) + one
            };
            match self
                .access
                .compare_exchange_weak(now, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(seen) => now = seen,
            }
        }
    }

    /// [`Buffer::try_share`], waiting while an in-place write runs (writes are short and
    /// never wait on a shared hold, so this ends), and for a while first behind a writer
    /// that waits for the current readers.
    pub(crate) fn share(&self, kind: Access) {
        let mut tries = 0u32;
        while !self.try_share(kind, tries < DEFER_TRIES) {
            back_off(&mut tries);
        }
    }

    /// Gives back a hold taken by [`Buffer::try_share`] or [`Buffer::share`].
    pub(crate) fn unshare(&self, kind: Access) {
        let one = match kind {
            Access::Slice => SLICE,
            Access::Read => READ,
        };
        self.access
            .fetch_sub(one, std::sync::atomic::Ordering::AcqRel);
    }

    /// Takes the buffer for an in-place write: only when nobody holds it. Refused by
    /// running readers, it flags the buffer as wanted, and new readers wait behind it for a
    /// while (so a stream of overlapping reads cannot hold a write off indefinitely).
    pub(crate) fn try_write(&self) -> Result<(), WriteRefused> {
        use std::sync::atomic::Ordering;
        let mut now = self.access.load(Ordering::Acquire);
        loop {
            if now & SLICES != 0 {
                return Err(WriteRefused::Borrowed);
            }
            if now & WRITER != 0 {
                return Err(WriteRefused::Busy);
            }
            let (next, taken) = if now & !WANTED == 0 {
                (WRITER, true)
            } else {
                (now | WANTED, false)
            };
            match self
                .access
                .compare_exchange_weak(now, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if taken => return Ok(()),
                Ok(_) => return Err(WriteRefused::Busy),
                Err(seen) => now = seen,
            }
        }
    }

    /// Ends a write taken by [`Buffer::try_write`].
    pub(crate) fn end_write(&self) {
        self.access
            .fetch_and(!WRITER, std::sync::atomic::Ordering::AcqRel);
    }

    /// True while a slice borrowed from this buffer is alive: in-place writes are refused.
    pub fn is_borrowed(&self) -> bool {
        self.access.load(std::sync::atomic::Ordering::Acquire) & SLICES != 0
    }

    /// How many in-place writes the buffer has seen.
    pub fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records an in-place write; returns the new version.
    pub(crate) fn bump_version(&self) -> u64 {
        self.version
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
            + 1
    }

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.owner.device()
    }

    /// The number of bytes asked for (what the tensor uses).
    pub fn len_bytes(&self) -> usize {
        self.block.as_ref().map_or(0, |block| block.requested)
    }

    /// The size of the underlying block (its size class), at least `len_bytes`.
    pub fn capacity_bytes(&self) -> usize {
        self.block.as_ref().map_or(0, |block| block.size)
    }

    /// The block's address: a host pointer for `Device::Cpu`, a device pointer for CUDA.
    pub fn addr(&self) -> u64 {
        self.block.as_ref().map_or(0, |block| block.addr)
    }

    /// Host pointer to the first byte (only meaningful when `device() == Device::Cpu`).
    ///
    /// Host blocks come from zeroed allocations, so all `capacity_bytes()` bytes are
    /// initialized. Dereferencing is up to the caller (see the type's docs on aliasing).
    pub fn host_ptr(&self) -> *mut u8 {
        // Host addresses were exposed by `HostMemory::alloc`, so this recovers a pointer
        // with valid provenance for the block.
        std::ptr::with_exposed_provenance_mut(self.addr() as usize)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.owner.release(block);
        }
    }
}

/// One wait between tries for a buffer another thread holds: a rayon worker runs pending
/// pool work (the holder's kernels may need it), other threads yield; after a while each
/// try sleeps a little so a long write is not spun on. Never call it holding the graph
/// lock: the pool work it runs may lock the graph on this thread.
pub(crate) fn back_off(tries: &mut u32) {
    *tries = tries.saturating_add(1);
    if *tries > 64 {
        std::thread::sleep(std::time::Duration::from_micros(20));
    } else if rayon::current_thread_index().is_some() {
        rayon::yield_now();
    } else {
        std::thread::yield_now();
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("device", &self.device())
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len_bytes", &self.len_bytes())
            .field("capacity_bytes", &self.capacity_bytes())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::allocator::RoundingPolicy;
    use crate::memory::host::HostMemory;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn buffer_is_send_and_sync() {
        assert_send_sync::<Buffer>();
        assert_send_sync::<Arc<Buffer>>();
    }

    #[test]
    fn dropping_a_buffer_returns_its_block() {
        let alloc = Arc::new(CachingAllocator::new(HostMemory, RoundingPolicy::HOST));
        let owner: Arc<dyn BlockOwner> = alloc.clone();
        let buffer = Buffer::new(alloc.allocate(1000).unwrap(), Arc::clone(&owner));
        assert_eq!(buffer.device(), Device::Cpu);
        assert_eq!(buffer.len_bytes(), 1000);
        assert_eq!(buffer.capacity_bytes(), 1024);
        assert_eq!(buffer.host_ptr() as usize as u64, buffer.addr());
        assert_eq!(buffer.host_ptr().align_offset(64), 0);
        assert!(format!("{buffer:?}").contains("len_bytes: 1000"));
        let addr = buffer.addr();
        let s = alloc.stats();
        assert_eq!(
            (s.current_bytes, s.requested_bytes, s.cached_bytes),
            (1024, 1000, 0)
        );

        drop(buffer);
        let s = alloc.stats();
        assert_eq!(
            (s.current_bytes, s.requested_bytes, s.cached_bytes),
            (0, 0, 1024)
        );

        let again = Buffer::new(alloc.allocate(1024).unwrap(), owner);
        assert_eq!(again.addr(), addr);
        let s = alloc.stats();
        assert_eq!((s.hits, s.misses, s.device_allocs), (1, 1, 1));
    }

    #[test]
    fn a_writer_refused_by_readers_holds_off_new_readers_until_it_writes() {
        let b = Buffer::from_vec(vec![0u8; 64]);
        assert!(b.try_share(Access::Read, true));
        // The running reader refuses the write; the writer is now waiting.
        assert_eq!(b.try_write(), Err(WriteRefused::Busy));
        // New readers that defer wait behind it; one that has waited long enough does not.
        assert!(!b.try_share(Access::Read, true));
        assert!(!b.try_share(Access::Slice, true));
        b.unshare(Access::Read);
        assert_eq!(b.try_write(), Ok(()));
        assert!(!b.try_share(Access::Read, false));
        b.end_write();
        // The write cleared the flag: readers go ahead at once again.
        assert!(b.try_share(Access::Read, true));
        b.unshare(Access::Read);
        assert_eq!(b.access.load(std::sync::atomic::Ordering::Acquire), 0);
    }

    #[test]
    fn a_writer_that_stopped_waiting_delays_readers_only_once() {
        let b = Buffer::from_vec(vec![0u8; 64]);
        assert!(b.try_share(Access::Read, true));
        assert_eq!(b.try_write(), Err(WriteRefused::Busy));
        b.unshare(Access::Read);
        // The writer never comes back. A reader that stops deferring takes its hold and
        // clears the flag; the next reader is not delayed at all.
        assert!(!b.try_share(Access::Read, true));
        b.share(Access::Read);
        b.unshare(Access::Read);
        assert!(b.try_share(Access::Slice, true));
        // A slice still refuses writes outright.
        assert_eq!(b.try_write(), Err(WriteRefused::Borrowed));
        b.unshare(Access::Slice);
        assert_eq!(b.access.load(std::sync::atomic::Ordering::Acquire), 0);
    }

    #[test]
    fn shared_buffer_is_released_by_the_last_reference() {
        let alloc = Arc::new(CachingAllocator::new(HostMemory, RoundingPolicy::HOST));
        let buffer = Arc::new(Buffer::new(alloc.allocate(256).unwrap(), alloc.clone()));
        std::thread::scope(|scope| {
            for i in 0..4 {
                let buffer = Arc::clone(&buffer);
                scope.spawn(move || {
                    // Each thread writes only its own 64-byte quarter.
                    let ptr = buffer.host_ptr();
                    // SAFETY: the block has 256 initialized bytes; quarters are disjoint and
                    // the buffer outlives the scope.
                    unsafe { ptr.add(i * 64).write_bytes(i as u8 + 1, 64) };
                });
            }
        });
        // SAFETY: all writers have finished; 256 bytes are initialized.
        let bytes = unsafe { std::slice::from_raw_parts(buffer.host_ptr(), 256) };
        assert_eq!((bytes[0], bytes[64], bytes[128], bytes[255]), (1, 2, 3, 4));
        let extra = Arc::clone(&buffer);
        drop(buffer);
        assert_eq!(alloc.stats().current_bytes, 256);
        drop(extra);
        assert_eq!(alloc.stats().current_bytes, 0);
        assert_eq!(alloc.stats().cached_bytes, 256);
    }
}
