//! Non-temporal ("streaming") stores of 4-byte runs, for outputs too large to stay in the
//! caches: elementwise and row kernels' f32 stores (see `program::plan_streams`) and the
//! block transpose's rows (`transpose.rs`).
//!
//! An ordinary store first reads its cache line for ownership, so writing a large output
//! moves every byte twice; a streaming store combines a whole line in a write-combining
//! buffer and sends it to memory without the read. Measured on 2 cores (Intel Xeon), 16M
//! f32 outputs: `a*b + c` 10.3 → 8.3–8.7 ms, the 8-op chain 11.3–11.9 → 9.9–10.2 ms,
//! softmax over 4096×4096 9.6–10.1 → 7.9–8.5 ms, `x.t().contiguous()` at 4096² 6.98 →
//! 4.0–4.1 ms.
//!
//! Streaming stores are weakly ordered: a thread that made them runs [`fence`] before its
//! work is reported done (the executor does at the end of each task), so whichever thread
//! reads the output next sees them.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Writes `src` to `dst..dst + src.len()`: whole 64-byte lines with streaming stores, the
/// unaligned ends with ordinary ones.
///
/// # Safety
/// `dst..dst + src.len()` is valid for writes and overlaps no live reference.
pub(super) unsafe fn store_f32(dst: *mut f32, src: &[f32]) {
    // SAFETY: f32 and u32 have the same size and alignment; the stores copy bits.
    unsafe { store_u32(dst.cast::<u32>(), bytemuck::cast_slice(src)) }
}

/// [`store_f32`] for any 4-byte values, as bits.
///
/// # Safety
/// As for [`store_f32`].
pub(super) unsafe fn store_u32(dst: *mut u32, src: &[u32]) {
    debug_assert!(
        dst.is_aligned(),
        "a 4-byte element pointer is 4-byte aligned"
    );
    let n = src.len();
    // Elements before the first 64-byte boundary (at most 15), then whole lines.
    let head = ((64 - (dst as usize) % 64) % 64 / 4).min(n);
    let body = (n - head) / 16 * 16;
    // SAFETY: every index written is below `n`, inside the caller's range; `dst + head`
    // is 64-byte aligned (or `body` is 0).
    unsafe {
        for (i, &x) in src[..head].iter().enumerate() {
            *dst.add(i) = x;
        }
        lines(dst.add(head), &src[head..head + body]);
        for (i, &x) in src[head + body..].iter().enumerate() {
            *dst.add(head + body + i) = x;
        }
    }
}

/// `src` (a multiple of 16 long) to the 64-byte aligned `dst`, one line per store group.
///
/// # Safety
/// As for [`store_f32`]; `dst` is 64-byte aligned.
unsafe fn lines(dst: *mut u32, src: &[u32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::exec::simd_level() == "avx512" {
            // SAFETY: the AVX-512 loops are in use, so AVX-512F is available; the rest is
            // this function's contract.
            unsafe { lines_avx512(dst, src) };
            return;
        }
        for (i, c) in src.chunks_exact(4).enumerate() {
            // SAFETY: SSE is part of x86-64; `dst + 4i` is 16-byte aligned (dst is
            // 64-byte aligned) and inside the caller's range.
            unsafe {
                _mm_stream_si128(
                    dst.add(4 * i).cast::<__m128i>(),
                    _mm_loadu_si128(c.as_ptr().cast::<__m128i>()),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (i, &x) in src.iter().enumerate() {
        // SAFETY: inside the caller's range.
        unsafe { *dst.add(i) = x };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn lines_avx512(dst: *mut u32, src: &[u32]) {
    for (i, c) in src.chunks_exact(16).enumerate() {
        // SAFETY: `dst + 16i` is 64-byte aligned and inside the caller's range; `c` is 16
        // readable values.
        unsafe {
            _mm512_stream_si512(
                dst.add(16 * i).cast::<__m512i>(),
                _mm512_loadu_si512(c.as_ptr().cast::<__m512i>()),
            )
        };
    }
}

/// Orders this thread's streaming stores before its later stores (a task's completion
/// flag among them).
pub(super) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64; a fence has no other effect.
    unsafe {
        _mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offset_and_length_writes_exactly_its_range() {
        let src: Vec<f32> = (0..300).map(|i| i as f32 * 0.5 - 7.0).collect();
        for off in 0..20 {
            for n in [0, 1, 15, 16, 17, 31, 64, 100, 263] {
                let mut buf = vec![f32::NAN; 320];
                // SAFETY: `off + n ≤ 283 < 320`; `buf` is not borrowed elsewhere.
                unsafe { store_f32(buf.as_mut_ptr().add(off), &src[..n]) };
                fence();
                assert!(
                    buf[..off].iter().all(|v| v.is_nan()),
                    "before, off {off} n {n}"
                );
                assert_eq!(&buf[off..off + n], &src[..n], "off {off} n {n}");
                assert!(
                    buf[off + n..].iter().all(|v| v.is_nan()),
                    "after, off {off} n {n}"
                );
            }
        }
    }
}
