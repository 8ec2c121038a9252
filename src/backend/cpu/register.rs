//! Run registers: the storage of one value over a run of up to
//! [`CHUNK`](super::program::CHUNK) elements, aligned to a cache line.
//!
//! The interpreter evaluates an instruction by reading its operands' registers and writing
//! its own, a whole run at a time, so most of its loads and stores are register accesses;
//! row reductions also keep values for their later passes in saved buffers of the same
//! kind. A `Vec<u64>` is only 16-byte aligned by the system allocator, which made three of
//! every four 64-byte AVX-512 loads and stores straddle two cache lines. Measured with
//! registers and saved buffers aligned, against a build without them (56bec4a, whose code
//! for these kernels is the same otherwise), alternating on the Intel Xeon test machine:
//! 40 ops alternating `maximum` and `abs` over 64K elements 201–203 → 155–157 µs; layer
//! norm's forward and backward over `[32, 64, 128]` 0.48–0.52 → 0.39 ms; softmax over
//! 4096 × 4096 9.1–9.2 → 8.7–8.8 ms; the 8-op chain over 1M elements 650–680 → 620–640 µs.

use std::ops::{Deref, DerefMut};

/// Bytes a register's first element is aligned to.
const ALIGN: usize = 64;

/// A run register: `len` words (8 bytes each, any element type viewed through them) whose
/// first word is 64-byte aligned. It derefs to its words; moving it keeps the alignment
/// (the words stay where they are).
#[derive(Default)]
pub(crate) struct Register {
    /// The words, with room for the start to move up to the next aligned word.
    buf: Vec<u64>,
    /// Index in `buf` of the first aligned word.
    start: usize,
    len: usize,
}

/// Elements of `T` to allocate beyond those needed, so that an [`ALIGN`]-aligned start
/// always fits.
const fn slack<T>() -> usize {
    ALIGN / std::mem::size_of::<T>() - 1
}

/// Index of the first [`ALIGN`]-aligned element of `buf` (at most [`slack`]: `align_offset`
/// counts elements, and a `T`-aligned pointer reaches the boundary within that many).
fn aligned_start<T>(buf: &[T]) -> usize {
    buf.as_ptr().align_offset(ALIGN).min(slack::<T>())
}

impl Register {
    /// A zeroed register of `len` words.
    pub(crate) fn zeroed(len: usize) -> Register {
        let buf = vec![0u64; len + slack::<u64>()];
        let start = aligned_start(&buf);
        Register { buf, start, len }
    }
}

impl Deref for Register {
    type Target = [u64];

    #[inline(always)]
    fn deref(&self) -> &[u64] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl DerefMut for Register {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u64] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// `len` f32s of `buf` starting on a 64-byte boundary (`buf` grows as needed; what the
/// window holds is left as it was). For the products' packed operands, which the kernels
/// read a whole 64-byte vector at a time.
pub(crate) fn aligned_f32(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len + slack::<f32>() {
        buf.resize(len + slack::<f32>(), 0.0);
    }
    let start = aligned_start(buf);
    &mut buf[start..start + len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_start_on_a_cache_line_and_survive_moves() {
        for len in [0, 1, 7, 8, 1024] {
            let mut regs: Vec<Register> = (0..8).map(|_| Register::zeroed(len)).collect();
            for r in &mut regs {
                assert_eq!(r.len(), len);
                assert!(r.iter().all(|&w| w == 0));
                if len > 0 {
                    assert_eq!(r.as_ptr() as usize % ALIGN, 0);
                    r[len - 1] = 7;
                }
            }
            // Moving registers (as the interpreter's take and swap do) keeps their words.
            let moved: Vec<Register> = regs.into_iter().rev().collect();
            for r in &moved {
                if len > 0 {
                    assert_eq!(r.as_ptr() as usize % ALIGN, 0);
                    assert_eq!(r[len - 1], 7);
                }
            }
        }
        assert!(Register::default().is_empty());
    }

    #[test]
    fn aligned_f32_windows_start_on_a_cache_line() {
        let mut buf = Vec::new();
        for len in [1, 5, 64, 1000, 3] {
            let w = aligned_f32(&mut buf, len);
            assert_eq!(w.len(), len);
            assert_eq!(w.as_ptr() as usize % ALIGN, 0);
        }
    }
}
