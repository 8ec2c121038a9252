//! `exp` over f32 runs with AVX-512's `vscalefps` (or by hand with AVX2), bit for bit the
//! same as [`exp_f32`](crate::math::f32::exp_f32) in fewer instructions.
//!
//! The portable `exp_f32` (auto-vectorized by the loops) assembles `2^n` from exponent bits
//! in two factors and clamps and selects around it: 22 instructions per vector in the
//! AVX-512 loop. Here the same reduction (`n = round(x·log2 e)` by the same magic-number
//! addition, `r = x - n·ln 2` with the same two-part constant) and the same polynomial give
//! `1 + (e^r - 1)` rounded once, and one `vscalefps` multiplies it by `2^n` exactly, or
//! rounds it once into the subnormal range, or overflows to infinity, as the two-factor
//! scaling does; lanes below -104 come out as +0 through the instruction's zero mask (no
//! subnormal-producing multiply, which costs a microcode assist on Intel cores: those
//! lanes compute `exp(0)`). 15 instructions: softmax and elementwise chains spend much of
//! their time in `exp`.
//!
//! With AVX2 ([`available_avx2`]) there is no `vscalefps`: [`exp8`] runs the portable
//! function's operations by hand (the same zero mask, clamp, polynomial and two-factor
//! scaling), four vectors per step so their dependency chains overlap. That is 1.13×
//! faster than one vector per step on AMD Zen 2 (0.54 vs 0.62 ns per element per core);
//! with the AVX2 loops forced on the Intel Xeon test machine (`KILN_SIMD=avx2`, two
//! alternations) softmax over 4096² went from 8.56–8.69 to 8.27–8.47 ms and the f32 chain
//! over 16M elements from 11.20–11.29 to 10.95–11.06 ms.
//!
//! Tests check every f32 input against `exp_f32`, at whichever level is in use (run them
//! with `KILN_SIMD=avx2` to cover the AVX2 path on an AVX-512 machine).

use super::ops::Src;
use crate::math::f32 as m32;
use crate::ops::BinaryOp;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Whether the CPU backend runs its AVX-512 loops (so AVX-512F is available).
pub(super) fn available() -> bool {
    super::exec::simd_level() == "avx512"
}

/// `exp` of 16 lanes; see the module docs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn exp16(x: __m512) -> __m512 {
    let s = _mm512_set1_ps;
    let zero = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, s(-104.0));
    // Those lanes compute exp(0) (their result is masked to +0), so no lane's scaling
    // underflows. `vminps` returns its second operand when either is NaN: NaN stays NaN.
    let x = _mm512_min_ps(s(100.0), _mm512_mask_mov_ps(x, zero, _mm512_setzero_ps()));
    let t = _mm512_fmadd_ps(x, s(m32::LOG2_E), s(m32::MAGIC_P254));
    let n = _mm512_sub_ps(t, s(m32::MAGIC_P254));
    let r = _mm512_fnmadd_ps(n, s(m32::LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, s(m32::LN2_LO), r);
    let p = _mm512_fmadd_ps(s(m32::E6), r, s(m32::E5));
    let p = _mm512_fmadd_ps(p, r, s(m32::E4));
    let p = _mm512_fmadd_ps(p, r, s(m32::E3));
    let p = _mm512_fmadd_ps(p, r, s(m32::E2));
    let r2 = _mm512_mul_ps(r, r);
    let em1 = _mm512_fmadd_ps(p, r2, r);
    let e = _mm512_add_ps(em1, s(1.0));
    _mm512_maskz_scalef_ps(!zero, e, n)
}

/// The lanes of `[i, i + 16)` that lie below `n`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn lanes(i: usize, n: usize) -> __mmask16 {
    let left = n - i;
    if left >= 16 {
        0xFFFF
    } else {
        ((1u32 << left) - 1) as __mmask16
    }
}

/// A run operand: 16 lanes from `i` (a slice under `mask`, or a splat scalar).
///
/// # Safety
/// AVX-512F is available; for a slice, `i < s.len()` and every lane in `mask` is below
/// `s.len() - i`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn lanes_of(a: Src<'_, f32>, i: usize, mask: __mmask16) -> __m512 {
    match a {
        // SAFETY: the contract: `i` is inside `s` and so are the masked lanes
        // (masked-off lanes are not read: AVX-512 suppresses their faults).
        Src::Slice(s) => unsafe { _mm512_maskz_loadu_ps(mask, s.as_ptr().add(i)) },
        Src::Scalar(v) => _mm512_set1_ps(v),
    }
}

#[cfg(target_arch = "x86_64")]
/// What [`run`] applies to its operands before `exp`.
#[derive(Clone, Copy)]
enum Pre {
    /// `exp(x)`.
    Plain,
    /// `exp(-x)`.
    Neg,
    /// `exp(op(x, y))`.
    Bin(BinaryOp),
}

/// `out = exp(pre(x, y))` over `out.len()` elements (`y` unused unless `pre` is a binary
/// op). Slices are at least `out.len()` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn run(pre: Pre, x: Src<'_, f32>, y: Src<'_, f32>, out: &mut [f32]) {
    let n = out.len();
    let sign = _mm512_set1_epi32(i32::MIN);
    let op = |a: __m512, b: __m512| match pre {
        Pre::Plain => a,
        // The sign bit flipped: `-a` exactly, NaN included.
        Pre::Neg => _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), sign)),
        Pre::Bin(BinaryOp::Add) => _mm512_add_ps(a, b),
        Pre::Bin(BinaryOp::Sub) => _mm512_sub_ps(a, b),
        Pre::Bin(BinaryOp::Mul) => _mm512_mul_ps(a, b),
        Pre::Bin(_) => _mm512_div_ps(a, b),
    };
    let mut i = 0;
    while i < n {
        let mask = lanes(i, n);
        // SAFETY: `i < n` and `mask` covers lanes `i..min(i + 16, n)`; both slices hold at
        // least `n` values (the caller's contract).
        let v = exp16(op(unsafe { lanes_of(x, i, mask) }, unsafe {
            lanes_of(y, i, mask)
        }));
        // SAFETY: `mask` covers lanes `i..min(i + 16, n)` of `out`.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), mask, v) };
        i += 16;
    }
}

/// Whether the CPU backend runs its AVX2 loops (so AVX2 and FMA are available).
pub(super) fn available_avx2() -> bool {
    super::exec::simd_level() == "avx2"
}

/// `exp` of 8 lanes with AVX2, the same operations as the portable `exp_f32` (so the same
/// bits): the zero mask below -104, the clamp at 100, the reduction, the polynomial and the
/// two-factor scaling.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp8(x: __m256) -> __m256 {
    let s = _mm256_set1_ps;
    let zero = _mm256_cmp_ps::<_CMP_LT_OQ>(x, s(-104.0));
    let x = _mm256_andnot_ps(zero, x);
    // `vminps` returns its second operand when either is NaN: NaN stays NaN.
    let x = _mm256_min_ps(s(100.0), x);
    let t = _mm256_fmadd_ps(x, s(m32::LOG2_E), s(m32::MAGIC_P254));
    let n = _mm256_sub_ps(t, s(m32::MAGIC_P254));
    let r = _mm256_fnmadd_ps(n, s(m32::LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, s(m32::LN2_LO), r);
    let p = _mm256_fmadd_ps(s(m32::E6), r, s(m32::E5));
    let p = _mm256_fmadd_ps(p, r, s(m32::E4));
    let p = _mm256_fmadd_ps(p, r, s(m32::E3));
    let p = _mm256_fmadd_ps(p, r, s(m32::E2));
    let r2 = _mm256_mul_ps(r, r);
    let em1 = _mm256_fmadd_ps(p, r2, r);
    // The two powers of two `2^floor(n/2)` and `2^(n - floor(n/2))` from the bits of `t`.
    let b = _mm256_castps_si256(t);
    let e1 = _mm256_slli_epi32::<23>(_mm256_srli_epi32::<1>(b));
    let e2 = _mm256_sub_epi32(_mm256_slli_epi32::<23>(b), e1);
    let s1 = _mm256_castsi256_ps(e1);
    let e = _mm256_mul_ps(_mm256_fmadd_ps(em1, s1, s1), _mm256_castsi256_ps(e2));
    _mm256_andnot_ps(zero, e)
}

/// A run operand with AVX2: 8 lanes from `i` (a slice, or a splat scalar).
///
/// # Safety
/// AVX2 is available; for a slice, `i + 8 <= s.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn lanes8(a: Src<'_, f32>, i: usize) -> __m256 {
    match a {
        // SAFETY: the contract: the 8 lanes from `i` are inside `s`.
        Src::Slice(s) => unsafe { _mm256_loadu_ps(s.as_ptr().add(i)) },
        Src::Scalar(v) => _mm256_set1_ps(v),
    }
}

/// [`run`] with AVX2: four vectors per step (the chains of independent vectors overlap,
/// 1.13× faster than one vector per step on AMD Zen 2), the tail element by element
/// through `exp_f32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2(pre: Pre, x: Src<'_, f32>, y: Src<'_, f32>, out: &mut [f32]) {
    let n = out.len();
    let sign = _mm256_set1_ps(-0.0);
    let op = |a: __m256, b: __m256| match pre {
        Pre::Plain => a,
        // The sign bit flipped: `-a` exactly, NaN included.
        Pre::Neg => _mm256_xor_ps(a, sign),
        Pre::Bin(BinaryOp::Add) => _mm256_add_ps(a, b),
        Pre::Bin(BinaryOp::Sub) => _mm256_sub_ps(a, b),
        Pre::Bin(BinaryOp::Mul) => _mm256_mul_ps(a, b),
        Pre::Bin(_) => _mm256_div_ps(a, b),
    };
    let scalar = |a: f32, b: f32| match pre {
        Pre::Plain => a,
        Pre::Neg => -a,
        Pre::Bin(BinaryOp::Add) => a + b,
        Pre::Bin(BinaryOp::Sub) => a - b,
        Pre::Bin(BinaryOp::Mul) => a * b,
        Pre::Bin(_) => a / b,
    };
    let at = |src: Src<'_, f32>, k: usize| match src {
        Src::Slice(s) => s[k],
        Src::Scalar(v) => v,
    };
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: lanes `i..i + 32` lie below `n`, and both slices hold at least `n` values
        // (the caller's contract).
        unsafe {
            let v0 = exp8(op(lanes8(x, i), lanes8(y, i)));
            let v1 = exp8(op(lanes8(x, i + 8), lanes8(y, i + 8)));
            let v2 = exp8(op(lanes8(x, i + 16), lanes8(y, i + 16)));
            let v3 = exp8(op(lanes8(x, i + 24), lanes8(y, i + 24)));
            let o = out.as_mut_ptr().add(i);
            _mm256_storeu_ps(o, v0);
            _mm256_storeu_ps(o.add(8), v1);
            _mm256_storeu_ps(o.add(16), v2);
            _mm256_storeu_ps(o.add(24), v3);
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: as above, for lanes `i..i + 8`.
        unsafe {
            let v = exp8(op(lanes8(x, i), lanes8(y, i)));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for (k, o) in out.iter_mut().enumerate().skip(i) {
        *o = m32::exp_f32(scalar(at(x, k), at(y, k)));
    }
}

/// Whether `src` holds at least `n` values (a scalar always does).
fn covers(src: Src<'_, f32>, n: usize) -> bool {
    match src {
        Src::Slice(s) => s.len() >= n,
        Src::Scalar(_) => true,
    }
}

/// `out = exp(a)`. Returns false (and writes nothing) where the AVX-512 loops are not in
/// use; the caller then runs the portable loop.
pub(super) fn exp_run(a: Src<'_, f32>, out: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if available() && covers(a, out.len()) {
        // SAFETY: `available` means the AVX-512 loops were picked, which checked AVX-512F.
        unsafe { run(Pre::Plain, a, Src::Scalar(0.0), out) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if available_avx2() && covers(a, out.len()) {
        // SAFETY: `available_avx2` means the AVX2 loops were picked, which checked AVX2 and
        // FMA.
        unsafe { run_avx2(Pre::Plain, a, Src::Scalar(0.0), out) };
        return true;
    }
    let _ = (a, out);
    false
}

/// `out = exp(-x)`, the negation exact (NaN's sign bit flipped too). Returns false (and
/// writes nothing) where the AVX-512 loops are not in use.
pub(super) fn exp_of_neg(x: Src<'_, f32>, out: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if available() && covers(x, out.len()) {
        // SAFETY: as in `exp_run`.
        unsafe { run(Pre::Neg, x, Src::Scalar(0.0), out) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if available_avx2() && covers(x, out.len()) {
        // SAFETY: as in `exp_run`.
        unsafe { run_avx2(Pre::Neg, x, Src::Scalar(0.0), out) };
        return true;
    }
    let _ = (x, out);
    false
}

/// `out = exp(inner(x, y))` for `inner` one of `Add`, `Sub`, `Mul`, `Div`, each rounding as
/// it does alone. Returns false (and writes nothing) where the AVX-512 loops are not in use
/// or `inner` is another op.
pub(super) fn exp_of_pair(
    inner: BinaryOp,
    x: Src<'_, f32>,
    y: Src<'_, f32>,
    out: &mut [f32],
) -> bool {
    let paired = matches!(
        inner,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
    );
    #[cfg(target_arch = "x86_64")]
    if paired && available() && covers(x, out.len()) && covers(y, out.len()) {
        // SAFETY: as in `exp_run`.
        unsafe { run(Pre::Bin(inner), x, y, out) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if paired && available_avx2() && covers(x, out.len()) && covers(y, out.len()) {
        // SAFETY: as in `exp_run`.
        unsafe { run_avx2(Pre::Bin(inner), x, y, out) };
        return true;
    }
    let _ = (paired, x, y, out);
    false
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// `exp_f32` over a slice, compiled with FMA (as both SIMD levels' loops are).
    #[target_feature(enable = "avx2,fma")]
    fn reference(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = m32::exp_f32(v);
        }
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// Every f32 bit pattern: the same bits as `exp_f32` (any NaN for a NaN).
    #[test]
    fn matches_exp_f32_for_every_input() {
        if !available() && !available_avx2() {
            eprintln!("skipped: neither the AVX-512 nor the AVX2 loops are in use here");
            return;
        }
        const BLOCK: u64 = 1 << 16;
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    let (lo, hi) = ((t << 32) / threads, ((t + 1) << 32) / threads);
                    let mut x = vec![0f32; BLOCK as usize];
                    let (mut want, mut got) = (x.clone(), x.clone());
                    let mut b = lo;
                    while b < hi {
                        let len = BLOCK.min(hi - b) as usize;
                        for (k, v) in x[..len].iter_mut().enumerate() {
                            *v = f32::from_bits((b + k as u64) as u32);
                        }
                        // SAFETY: either SIMD level checked AVX2 and FMA.
                        unsafe { reference(&x[..len], &mut want[..len]) };
                        assert!(exp_run(Src::Slice(&x[..len]), &mut got[..len]));
                        for k in 0..len {
                            assert!(
                                same(got[k], want[k]),
                                "exp({:e} = {:#010x}): {:e} vs exp_f32 {:e}",
                                x[k],
                                x[k].to_bits(),
                                got[k],
                                want[k]
                            );
                        }
                        b += len as u64;
                    }
                });
            }
        });
    }

    /// `exp(-x)`: the same bits as `exp_f32(-x)`, at the edges (±0, ±inf, NaN, the
    /// underflow and overflow limits) and runs of any length, slice or scalar.
    #[test]
    fn negated_runs_match_exp_of_the_negation() {
        if !available() && !available_avx2() {
            eprintln!("skipped: neither the AVX-512 nor the AVX2 loops are in use here");
            return;
        }
        let mut x = vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        x.extend([104.0, 103.97, 104.01, -88.73, -88.72, -100.0, 1e-40, -1e-40]);
        x.extend((0..40).map(|i| (i as f32 - 20.0) * 2.3));
        for n in [0, 1, 15, 16, 17, x.len()] {
            let mut out = vec![f32::NAN; x.len() + 3];
            assert!(exp_of_neg(Src::Slice(&x), &mut out[..n]));
            for k in 0..n {
                let want = m32::exp_f32(-x[k]);
                assert!(
                    same(out[k], want),
                    "exp(-{:e}): {:e} vs {want:e}",
                    x[k],
                    out[k]
                );
            }
            assert!(out[n..].iter().all(|v| v.is_nan()), "nothing past the run");
            assert!(exp_of_neg(Src::Scalar(-3.25), &mut out[..n]));
            assert!(out[..n].iter().all(|&v| same(v, m32::exp_f32(3.25))));
        }
    }

    fn plain(op: BinaryOp, a: f32, b: f32) -> f32 {
        match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            _ => a / b,
        }
    }

    #[test]
    fn pairs_round_their_inner_op_first_and_runs_of_any_length_stop_at_their_end() {
        if !available() && !available_avx2() {
            eprintln!("skipped: neither the AVX-512 nor the AVX2 loops are in use here");
            return;
        }
        let x: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 3.7).collect();
        let y: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 0.31).collect();
        for inner in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            for n in [0, 1, 15, 16, 17, 37] {
                let mut out = [f32::NAN; 40];
                let ys = Src::Scalar(2.5);
                assert!(exp_of_pair(
                    inner,
                    Src::Slice(&x),
                    Src::Slice(&y),
                    &mut out[..n]
                ));
                for k in 0..n {
                    let v = plain(inner, x[k], y[k]);
                    assert!(same(out[k], m32::exp_f32(v)), "{inner:?} at {k}");
                }
                assert!(out[n..].iter().all(|v| v.is_nan()), "nothing past the run");
                assert!(exp_of_pair(inner, Src::Slice(&x), ys, &mut out[..n]));
                for k in 0..n {
                    let v = plain(inner, x[k], 2.5);
                    assert!(same(out[k], m32::exp_f32(v)), "{inner:?} scalar at {k}");
                }
            }
        }
        assert!(!exp_of_pair(
            BinaryOp::Max,
            Src::Slice(&x),
            Src::Slice(&y),
            &mut [0.0; 4]
        ));
    }
}
