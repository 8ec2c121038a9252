//! f16 conversions over runs, with the CPU's conversion instructions where it has them
//! (sixteen values per instruction where the AVX-512 loops are in use, eight with F16C)
//! and the portable branch-free conversions elsewhere and for the tail. All give the same
//! bits for every input: round to nearest, ties to even; overflow to infinity; f16
//! subnormals exact; a NaN keeps its sign and top payload bits and gets its quiet bit set
//! (checked over every f16 pattern and every f32 pattern near the rounding boundaries in
//! the tests below).

use super::exec::{f16_to_f32, f32_to_f16};
use crate::math::f32::round_f16;

#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
}

/// Whether the AVX-512 loops are in use (then the 16-wide conversions of AVX-512F are
/// available: half the instructions, loads and stores of the 8-wide F16C ones).
#[cfg(target_arch = "x86_64")]
fn use_avx512() -> bool {
    super::exec::simd_level() == "avx512"
}

/// Every value rounded to the nearest f16 (kept as f32).
pub(crate) fn round_f16_slice(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if use_avx512() {
            // SAFETY: the AVX-512 loops are in use, so AVX-512F was detected.
            unsafe { round_f16_avx512(v) };
            return;
        }
        if has_f16c() {
            // SAFETY: the features `round_f16c` enables were detected just above.
            unsafe { round_f16c(v) };
            return;
        }
    }
    for x in v.iter_mut() {
        *x = round_f16(*x);
    }
}

/// `dst[i]` = the f16 with bits `src[i]`, as f32 (`src.len() == dst.len()`).
pub(crate) fn widen_f16_slice(src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if use_avx512() {
            // SAFETY: the AVX-512 loops are in use, so AVX-512F was detected.
            unsafe { widen_f16_avx512(src, dst) };
            return;
        }
        if has_f16c() {
            // SAFETY: the features `widen_f16c` enables were detected just above.
            unsafe { widen_f16c(src, dst) };
            return;
        }
    }
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(h);
    }
}

/// `dst[i]` = the bits of `src[i]` rounded to f16 (`src.len() == dst.len()`).
pub(crate) fn narrow_f16_slice(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    {
        if use_avx512() {
            // SAFETY: the AVX-512 loops are in use, so AVX-512F was detected.
            unsafe { narrow_f16_avx512(src, dst) };
            return;
        }
        if has_f16c() {
            // SAFETY: the features `narrow_f16c` enables were detected just above.
            unsafe { narrow_f16c(src, dst) };
            return;
        }
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn round_f16c(v: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 8 f32, read and written through unaligned accesses.
        unsafe {
            let x = _mm256_loadu_ps(c.as_ptr());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for x in chunks.into_remainder() {
        *x = round_f16(*x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn widen_f16c(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let full = n / 8 * 8;
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= full <= n`, so 8 u16 are read from `src` and 8 f32 written to
        // `dst`, both in bounds (unaligned accesses).
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for i in full..n {
        dst[i] = f16_to_f32(src[i]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn narrow_f16c(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let full = n / 8 * 8;
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= full <= n`: 8 f32 read from `src`, 8 u16 written to `dst`.
        unsafe {
            let x = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
        }
    }
    for i in full..n {
        dst[i] = f32_to_f16(src[i]);
    }
}

/// The rounding control of every conversion to f16: to nearest, ties to even, no
/// exceptions raised (the same results as the F16C loops).
#[cfg(target_arch = "x86_64")]
const NEAREST: i32 =
    std::arch::x86_64::_MM_FROUND_TO_NEAREST_INT | std::arch::x86_64::_MM_FROUND_NO_EXC;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn round_f16_avx512(v: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = v.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 16 f32, read and written through unaligned accesses.
        unsafe {
            let x = _mm512_loadu_ps(c.as_ptr());
            let h = _mm512_cvtps_ph::<NEAREST>(x);
            _mm512_storeu_ps(c.as_mut_ptr(), _mm512_cvtph_ps(h));
        }
    }
    for x in chunks.into_remainder() {
        *x = round_f16(*x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn widen_f16_avx512(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let full = n / 16 * 16;
    for i in (0..full).step_by(16) {
        // SAFETY: `i + 16 <= full <= n`, so 16 u16 are read from `src` and 16 f32 written
        // to `dst`, both in bounds (unaligned accesses).
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
    }
    for i in full..n {
        dst[i] = f16_to_f32(src[i]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn narrow_f16_avx512(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let full = n / 16 * 16;
    for i in (0..full).step_by(16) {
        // SAFETY: `i + 16 <= full <= n`: 16 f32 read from `src`, 16 u16 written to `dst`.
        unsafe {
            let x = _mm512_loadu_ps(src.as_ptr().add(i));
            let h = _mm512_cvtps_ph::<NEAREST>(x);
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
        }
    }
    for i in full..n {
        dst[i] = f32_to_f16(src[i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 patterns around every f16 rounding boundary (the low 13 bits decide the
    /// rounding of a normal f16), across every sign, exponent and top mantissa bits.
    fn boundary_patterns() -> Vec<f32> {
        let mut v = vec![];
        for hi in 0..(1u32 << 19) {
            for lo in [0u32, 1, 0xfff, 0x1000, 0x1001, 0x1fff] {
                v.push(f32::from_bits(hi << 13 | lo));
            }
        }
        v
    }

    #[test]
    fn rounding_matches_the_portable_conversion_bit_for_bit() {
        let src = boundary_patterns();
        let mut got = src.clone();
        round_f16_slice(&mut got);
        let mut narrowed = vec![0u16; src.len()];
        narrow_f16_slice(&src, &mut narrowed);
        for (i, &x) in src.iter().enumerate() {
            let want = round_f16(x);
            assert_eq!(
                got[i].to_bits(),
                want.to_bits(),
                "round {:#010x}",
                x.to_bits()
            );
            assert_eq!(narrowed[i], f32_to_f16(x), "narrow {:#010x}", x.to_bits());
        }
    }

    /// The dispatching functions above take the 16-wide AVX-512 loops where those are in
    /// use; the 8-wide F16C loops must give the same bits too.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_eight_wide_loops_match_the_portable_conversions() {
        if !has_f16c() {
            return;
        }
        let src = boundary_patterns();
        let mut got = src.clone();
        let mut narrowed = vec![0u16; src.len()];
        // SAFETY: F16C and AVX were detected just above.
        unsafe {
            round_f16c(&mut got);
            narrow_f16c(&src, &mut narrowed);
        }
        for (i, &x) in src.iter().enumerate() {
            assert_eq!(
                got[i].to_bits(),
                round_f16(x).to_bits(),
                "{:#010x}",
                x.to_bits()
            );
            assert_eq!(narrowed[i], f32_to_f16(x), "narrow {:#010x}", x.to_bits());
        }
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        let mut wide = vec![0.0f32; halves.len()];
        // SAFETY: as above.
        unsafe { widen_f16c(&halves, &mut wide) };
        for (&h, w) in halves.iter().zip(&wide) {
            assert_eq!(w.to_bits(), f16_to_f32(h).to_bits(), "{h:#06x}");
        }
    }

    #[test]
    fn widening_matches_the_portable_conversion_for_every_pattern() {
        let src: Vec<u16> = (0..=u16::MAX).collect();
        let mut got = vec![0.0f32; src.len()];
        widen_f16_slice(&src, &mut got);
        for (&h, g) in src.iter().zip(&got) {
            assert_eq!(g.to_bits(), f16_to_f32(h).to_bits(), "{h:#06x}");
        }
    }
}
