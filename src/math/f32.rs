//! Branch-free scalar `f32` math kernels for the CPU backend.
//!
//! Every function in this module is written so that LLVM auto-vectorizes a
//! plain element-wise loop such as
//!
//! ```ignore
//! for (o, &x) in out.iter_mut().zip(inp) {
//!     *o = exp_f32(x);
//! }
//! ```
//!
//! when the loop is compiled with `#[target_feature(enable = "avx2,fma")]` or
//! `#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]`. To make that
//! possible the kernels follow a few rules:
//!
//! * no data-dependent branches: special cases are handled with value selects
//!   (`if c { a } else { b }` on values lowers to a blend), never early returns
//!   or loops. The one exception is [`sin_f32`]/[`cos_f32`], which branch to a
//!   scalar Payne–Hanek path for `|x| > 2^18`: slice loops use
//!   [`sin_f32_run`]/[`cos_f32_run`] (a vectorized loop of the branch-free
//!   [`sin_f32_fast`]/[`cos_f32_fast`], then a fix-up of the big arguments);
//! * no libm calls (`f32::exp`, `f32::round`, ...): rounding to an integer uses
//!   the `1.5 * 2^23` magic-number trick and powers of two are assembled from
//!   exponent bits with `to_bits`/`from_bits`;
//! * no saturating float-to-int `as` casts;
//! * `f32::mul_add` everywhere a fused multiply-add helps accuracy. With the
//!   `fma` target feature enabled this is a single `vfmadd` instruction.
//!   Without it (e.g. in a loop compiled for baseline x86-64) `mul_add` still
//!   gives the same, correctly fused result, but through a libm call, so such a
//!   loop is neither vectorized nor fast: always call these kernels from code
//!   compiled with `fma` enabled when speed matters.
//!
//! The error figures quoted on each function were measured against `f64`
//! references (dense grids plus millions of pseudo-random arguments); the
//! tests at the bottom of this file re-check them with a slightly looser
//! asserted bound (given in brackets). "ulp" means a unit in the last place of
//! the exact result (its `f32` spacing; `2^-149` for subnormal results), with
//! no absolute floor.
//!
//! Subnormal *inputs* are handled like any other value (no flush-to-zero
//! assumptions), but like all x86 code they run slowly (microcode assists) on
//! the rare paths that produce or consume subnormals.

// ---------------------------------------------------------------------------
// Shared constants
// ---------------------------------------------------------------------------

/// `1.5 * 2^23`: adding and subtracting it rounds an `f32` with
/// `|v| < 2^22` to the nearest integer (ties to even), and the bit pattern of
/// `v + MAGIC` holds that integer in its low mantissa bits.
const MAGIC: f32 = 12_582_912.0;
/// `MAGIC + 254` (even, so rounding to an integer is unchanged): for the
/// integer `n` that `t = v + MAGIC_P254` rounds `v` to, the low 9 bits of
/// `t.to_bits()` hold `254 + n` (for `-254 <= n <= 257`), from which
/// [`pow2_pair`] builds `2^n` with three integer operations.
pub(crate) const MAGIC_P254: f32 = MAGIC + 254.0;
/// `2^23`: the same trick for non-negative `v < 2^23`.
const TWO_23: f32 = 8_388_608.0;

const SIGN_MASK: u32 = 0x8000_0000;

/// `log2(e)` rounded to `f32`.
pub(crate) const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// `ln 2 = LN2_HI + LN2_LO` (the high part is `ln 2` rounded to `f32`; with
/// FMA, `x - n * LN2_HI` is exact for the `n` that occur here).
pub(crate) const LN2_HI: f32 = core::f32::consts::LN_2;
pub(crate) const LN2_LO: f32 = -1.904_654_2e-9;

// exp(r) ~ 1 + r + r^2 * (E2 + E3 r + E4 r^2 + E5 r^3 + E6 r^4) on
// [-ln2/2, ln2/2]; minimax for relative error (3.3e-9 with these f32
// coefficients).
pub(crate) const E2: f32 = 0.499_999_94;
pub(crate) const E3: f32 = 0.166_665_15;
pub(crate) const E4: f32 = 0.041_668_087;
pub(crate) const E5: f32 = 0.008_369_298;
pub(crate) const E6: f32 = 0.001_383_828_2;

// ---------------------------------------------------------------------------
// exp
// ---------------------------------------------------------------------------

/// Range reduction for `exp`: returns `(r, b)` with `x = n ln2 + r`,
/// `|r| <= ln2/2 (+ tiny)`, `n` the integer `round(x * log2 e)`, and `b`
/// the bits that [`pow2_pair`] turns into `2^n`.
/// Valid for `|x| < 170` (callers clamp tighter than that).
#[inline(always)]
fn exp_reduce(x: f32) -> (f32, u32) {
    // One rounding: round-to-nearest of the exact product x * LOG2_E.
    let t = x.mul_add(LOG2_E, MAGIC_P254);
    let n = t - MAGIC_P254;
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    (r, t.to_bits())
}

/// `exp(r) - 1` for `|r| <= ln2/2`.
#[inline(always)]
fn expm1_poly(r: f32) -> f32 {
    let p = E6
        .mul_add(r, E5)
        .mul_add(r, E4)
        .mul_add(r, E3)
        .mul_add(r, E2);
    let r2 = r * r;
    p.mul_add(r2, r)
}

/// `exp(r)` for `|r| <= ln2/2` as an unevaluated sum `hi + lo` (`lo` is the
/// exact rounding error of the final addition), for callers that need more
/// than `f32` precision.
#[inline(always)]
fn exp_poly_hilo(r: f32) -> (f32, f32) {
    let t = expm1_poly(r);
    let hi = 1.0 + t;
    // Fast2Sum: exact because |t| < 1.
    let lo = (1.0 - hi) + t;
    (hi, lo)
}

/// The two normal powers of two `2^floor(n/2)` and `2^ceil(n/2)` (product
/// `2^n`) for the bits `b` returned by [`exp_reduce`], `-252 <= n <= 254`.
/// Scaling by them one after the other rounds only once even when the result
/// is subnormal or close to overflow.
#[inline(always)]
fn pow2_pair(b: u32) -> (f32, f32) {
    // The low 9 bits of b are 254 + n (bit 9 is clear); the shifts drop the
    // rest of the bits of MAGIC_P254.
    let e1 = (b >> 1) << 23; // (127 + floor(n/2)) << 23
    let e2 = (b << 23).wrapping_sub(e1); // (254 + n - 127 - floor(n/2)) << 23
    (f32::from_bits(e1), f32::from_bits(e2))
}

/// Clamp that keeps NaN (a NaN argument compares false and passes through).
#[inline(always)]
fn clamp_keep_nan(x: f32, lo: f32, hi: f32) -> f32 {
    let x = if x > hi { hi } else { x };
    if x < lo { lo } else { x }
}

/// `exp(x)` for the internal callers, with subnormal results.
/// Any `x` (NaN propagates, `-inf -> 0`, `+inf -> inf`).
#[inline(always)]
fn exp_full(x: f32) -> f32 {
    // Below -104 the result rounds to +0 (exp(-104) < 2^-150). Those lanes compute exp(0)
    // instead and are replaced by 0, so that no lane's final scaling underflows: a multiply
    // whose result underflows costs a microcode assist for the whole vector on Intel cores,
    // and masked attention feeds exp a -inf in every future position (3x the time of the
    // unmasked softmax before this). NaN compares false and keeps its path.
    let zero = x < -104.0;
    let x = if zero { 0.0 } else { x };
    // What is left is NaN or at least -104: only the upper clamp can apply.
    let x = if x > 100.0 { 100.0 } else { x };
    let (r, b) = exp_reduce(x);
    let (s1, s2) = pow2_pair(b);
    // e^r s1 = s1 + (e^r - 1) s1 rounds like 1 + (e^r - 1) (s1 is a normal
    // power of two); the final product is the only other rounding.
    let e = expm1_poly(r).mul_add(s1, s1) * s2;
    if zero { 0.0 } else { e }
}

/// `exp(hi + lo) * m` where `hi + lo` is a two-term argument (`|lo|` at most
/// an ulp or so of `hi`) with `-113 <= hi <= 0`, and `|m|` moderate.
/// The product with `m` happens before the final power-of-two scaling, so a
/// subnormal result is rounded only once.
#[inline(always)]
fn exp_hilo_times(hi: f32, lo: f32, m: f32) -> f32 {
    let (r, b) = exp_reduce(hi);
    let r = r + lo;
    let (s1, s2) = pow2_pair(b);
    // m e^r = m + m (e^r - 1) with a single rounding.
    m.mul_add(expm1_poly(r), m) * s1 * s2
}

/// Natural exponential `e^x`.
///
/// Cody–Waite reduction `x = n ln2 + r` (FMA, two-part `ln 2`), a degree-6
/// minimax polynomial for `e^r`, and scaling by `2^n` assembled from exponent
/// bits (split in two factors so that results near overflow and subnormal
/// results are produced with a single rounding). About 20 vector operations;
/// arguments below -104 take a zero lane, so `-inf` (a masked position) never
/// makes the scaling underflow, which is slow on Intel cores.
///
/// Accuracy: max error 0.99 ulp [asserted 1] for `x` in [-87.33, 88.72]
/// (normal results). Subnormal results (`x` in [-103.97, -87.34]) are not
/// flushed to zero: they come from a single rounding of the scaled value and
/// are within 1 ulp (`2^-149`) [asserted 1].
/// `x > 88.7228` gives `+inf`, `x < -103.973` gives `+0`, `exp(+inf) = inf`,
/// `exp(-inf) = 0`, `exp(NaN) = NaN`.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    exp_full(x)
}

// ---------------------------------------------------------------------------
// log
// ---------------------------------------------------------------------------

// log(1+f) ~ f - f^2/2 + f^3 * (L3 + L4 f + ... + L10 f^7) on
// [sqrt(1/2) - 1, sqrt(2) - 1]; minimax for relative error (6.1e-9).
const L3: f32 = 0.333_333_3;
const L4: f32 = -0.250_008_3;
const L5: f32 = 0.200_012_71;
const L6: f32 = -0.166_23;
const L7: f32 = 0.142_004_22;
const L8: f32 = -0.131_624_61;
const L9: f32 = 0.127_720_42;
const L10: f32 = -0.076_410_98;

/// `x = 2^e · m` for a positive normal `x`, `m` in `[sqrt(1/2), sqrt(2))`: returns `e` and
/// `f = m - 1` (exact). The bits are shifted so that the mantissa split happens at
/// `sqrt(1/2)`.
#[inline(always)]
fn log_reduce(x: f32) -> (f32, f32) {
    let ix = x.to_bits().wrapping_add(0x3F80_0000 - 0x3F35_04F3);
    let e = ((ix >> 23) as i32).wrapping_sub(127) as f32;
    let m = f32::from_bits((ix & 0x007F_FFFF).wrapping_add(0x3F35_04F3));
    (e, m - 1.0)
}

/// `log1p(f) - f + f^2/2 = f^3 (L3 + L4 f + ... + L10 f^7)` for the `f` of [`log_reduce`]
/// (`f2 = f * f`).
#[inline(always)]
fn log_tail(f: f32, f2: f32) -> f32 {
    let p = L10
        .mul_add(f, L9)
        .mul_add(f, L8)
        .mul_add(f, L7)
        .mul_add(f, L6)
        .mul_add(f, L5)
        .mul_add(f, L4)
        .mul_add(f, L3);
    (f2 * f) * p
}

/// Natural logarithm `ln x`.
///
/// `x = 2^e * m` with `m` in `[sqrt(1/2), sqrt(2))` read from the bits,
/// then `ln x = e ln2 + log1p(m - 1)` with a degree-10 minimax polynomial
/// (`m - 1` is exact).
///
/// Accuracy: max error 0.85 ulp [asserted 1] for all positive normal *and*
/// subnormal inputs (subnormals are rescaled by `2^23` first, so they are
/// handled exactly like normal numbers). Special values: `log(±0) = -inf`,
/// `log(x < 0) = NaN`, `log(-inf) = NaN`, `log(+inf) = +inf`,
/// `log(NaN) = NaN`, `log(1) = +0`.
#[inline(always)]
pub fn log_f32(x: f32) -> f32 {
    // Rescale subnormals (and, harmlessly, zero/negatives which are
    // overridden below) into the normal range.
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 8_388_608.0 } else { x };
    let ebias = if tiny { -23.0 } else { 0.0 };

    let (e, f) = log_reduce(xs);
    let e = e + ebias;
    let f2 = f * f;
    let y = log_tail(f, f2);
    let y = e.mul_add(LN2_LO, y);
    let y = (-0.5f32).mul_add(f2, y);
    let r = f + y;
    let r = e.mul_add(LN2_HI, r);

    let r = if x == f32::INFINITY { f32::INFINITY } else { r };
    let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
    // Negative numbers and NaN.
    if x >= 0.0 { r } else { f32::NAN }
}

/// `log2(e)` split in two: `LOG2_E_HI + LOG2_E_LO` (the high part is the `f32` rounding).
const LOG2_E_HI: f32 = core::f32::consts::LOG2_E;
const LOG2_E_LO: f32 = 1.925_963e-8;

/// Base-2 logarithm.
///
/// The reduction of [`log_f32`] (`x = 2^e · m`, `m` in `[sqrt(1/2), sqrt(2))`, subnormals
/// rescaled), then `log2 x = e + log1p(m - 1) · log2(e)` with the product carried in two
/// parts, so powers of two give exact integers (`log2(8) = 3`).
///
/// Accuracy: max error 1.04 ulp [asserted 1.5] on dense samples over all positive normal and
/// subnormal inputs. Special values as [`log_f32`]: `log2(±0) = -inf`, `log2(x < 0) = NaN`,
/// `log2(+inf) = +inf`, `log2(NaN) = NaN`.
#[inline(always)]
pub fn log2_f32(x: f32) -> f32 {
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 8_388_608.0 } else { x };
    let ebias = if tiny { -23.0 } else { 0.0 };
    let (e, f) = log_reduce(xs);
    let e = e + ebias;
    let f2 = f * f;
    // log1p(f) = f + y.
    let y = (-0.5f32).mul_add(f2, log_tail(f, f2));
    let hi = f * LOG2_E_HI;
    // The rounding error of `hi` (exact with FMA), the low part of log2(e), and y.
    let lo = f.mul_add(LOG2_E_HI, -hi) + f.mul_add(LOG2_E_LO, y * LOG2_E_HI);
    // e + hi as an exact sum s + t (Fast2Sum: |e| >= |hi| whenever e != 0).
    let s = e + hi;
    let t = (e - s) + hi;
    let r = s + (t + lo);
    let r = if x == f32::INFINITY { f32::INFINITY } else { r };
    let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
    if x >= 0.0 { r } else { f32::NAN }
}

// ---------------------------------------------------------------------------
// sin / cos
// ---------------------------------------------------------------------------
//
// Two paths share the polynomials:
//
// * the fast path (`sin_f32_fast`, `cos_f32_fast`): branch-free, vectorizes,
//   three-part Cody–Waite reduction; accurate for |x| <= TRIG_FAST_MAX;
// * the big-argument path (`sin_f32_big`, `cos_f32_big`): scalar,
//   Payne–Hanek reduction in exact integer arithmetic, any finite x.
//
// `sin_f32`/`cos_f32` pick one per call; `sin_f32_run`/`cos_f32_run` run the
// fast path over a whole slice and then redo only the big arguments.

/// `2/pi` rounded to `f32`.
const FRAC_2_PI: f32 = core::f32::consts::FRAC_2_PI;
/// `pi/2 = PIO2_1 + PIO2_2 + PIO2_3` (each the `f32` rounding of what is left).
const PIO2_1: f32 = core::f32::consts::FRAC_PI_2;
const PIO2_2: f32 = -4.371_139e-8;
const PIO2_3: f32 = -1.715_124_5e-15;

/// Largest `|x|` (`2^18`) that the fast sine/cosine path handles; larger
/// arguments go through the Payne–Hanek reduction.
///
/// Up to here the Cody–Waite reduction is accurate enough that the fast path
/// stays within 1.541 ulp (checked exhaustively); beyond, the rounding of
/// `x * 2/pi` and the missing bits of `pi/2` start to show (the fast path
/// alone would reach 1.57 ulp in `[2^18, 2^19)`, 2.1 ulp in `[2^20, 2^21)`,
/// 39 ulp in `[2^22, 2^23)`).
pub const TRIG_FAST_MAX: f32 = 262_144.0;

// sin(r) ~ r + r^3 (S3 + S5 r^2 + S7 r^4) and
// cos(r) ~ 1 - r^2/2 + r^4 (C4 + C6 r^2 + C8 r^4) on [0, pi/4 + 0.01];
// minimax for relative error (4.2e-9 and 3.6e-10).
const S3: f32 = -0.166_666_54;
const S5: f32 = 0.008_332_104;
const S7: f32 = -0.000_195_074_46;
const C4: f32 = 0.041_666_664;
const C6: f32 = -0.001_388_804_2;
const C8: f32 = 2.450_193_6e-5;

/// Reduces `ax >= 0` (or NaN) to `r` in about `[-pi/4, pi/4]` and the
/// quadrant `q` (only `q mod 4` is meaningful) with `ax = q pi/2 + r`.
/// Accurate for `ax <= TRIG_FAST_MAX`; larger arguments are clamped to it
/// (their results are replaced by the big-argument path).
#[inline(always)]
fn trig_reduce(ax: f32) -> (f32, u32) {
    let a = if ax > TRIG_FAST_MAX {
        TRIG_FAST_MAX
    } else {
        ax
    };
    // Round a * 2/pi to an integer with a single rounding; a >= 0 so the
    // 2^23 magic works for the whole clamped range.
    let t = a.mul_add(FRAC_2_PI, TWO_23);
    let n = t - TWO_23;
    let q = t.to_bits();
    // Three-part Cody–Waite with FMA: the first step is exact.
    let r = (-n).mul_add(PIO2_1, a);
    let r = (-n).mul_add(PIO2_2, r);
    let r = (-n).mul_add(PIO2_3, r);
    (r, q)
}

#[inline(always)]
fn sin_poly(r: f32, r2: f32) -> f32 {
    let p = S7.mul_add(r2, S5).mul_add(r2, S3);
    (r * r2).mul_add(p, r)
}

#[inline(always)]
fn cos_poly(r2: f32) -> f32 {
    // 1 + r2 (-1/2 + r2 p): the final FMA is the only rounding at full
    // magnitude.
    let p = C8.mul_add(r2, C6).mul_add(r2, C4);
    r2.mul_add(r2.mul_add(p, -0.5), 1.0)
}

/// `sin(q pi/2 + r)`, with `q` taken mod 4 from its low bits: picks the sine
/// or cosine polynomial and flips the sign bit for quadrants 2 and 3.
#[inline(always)]
fn trig_eval(r: f32, q: u32) -> f32 {
    let r2 = r * r;
    let s = sin_poly(r, r2);
    let c = cos_poly(r2);
    let v = if q & 1 == 0 { s } else { c };
    f32::from_bits(v.to_bits() ^ ((q & 2) << 30))
}

/// The fast path of [`sin_f32`]: branch-free, vectorizes, and gives exactly
/// the same bits as [`sin_f32`] for `|x| <= TRIG_FAST_MAX` (`2^18`), NaN and
/// `±inf`. Larger arguments give a value in `[-1, 1]` without meaning: use
/// it only where `|x| <= 2^18` is known (or use [`sin_f32_run`], which fixes
/// those elements up).
#[inline(always)]
pub fn sin_f32_fast(x: f32) -> f32 {
    let ax = x.abs();
    let (r, q) = trig_reduce(ax);
    let v = trig_eval(r, q);
    let v = f32::from_bits(v.to_bits() ^ (x.to_bits() & SIGN_MASK));
    if ax == f32::INFINITY { f32::NAN } else { v }
}

/// The fast path of [`cos_f32`], with the same contract as
/// [`sin_f32_fast`] (exactly [`cos_f32`] for `|x| <= 2^18`).
#[inline(always)]
pub fn cos_f32_fast(x: f32) -> f32 {
    let ax = x.abs();
    let (r, q) = trig_reduce(ax);
    let v = trig_eval(r, q.wrapping_add(1));
    if ax == f32::INFINITY { f32::NAN } else { v }
}

/// The bits of `2/pi` after the binary point, 32 per word, most significant
/// first (`2/pi = 0x0.a2f9836e_4e441529_...`), behind two zero words (the
/// "bits" of `2/pi` before its binary point) so that a window may start
/// there. 256 bits: the reduction of `f32::MAX` uses bits 103 to 206 (and
/// reads the word holding bits 225 to 256).
const TWO_OVER_PI_BITS: [u32; 10] = [
    0,
    0,
    0xA2F9_836E,
    0x4E44_1529,
    0xFC27_57D1,
    0xF534_DDC0,
    0xDB62_9599,
    0x3C43_9041,
    0xFE51_63AB,
    0xDEBB_C561,
];

/// `pi/2 * 2^-102` (the `f64` `pi/2`, scaled exactly).
const PIO2_2M102: f64 = core::f64::consts::FRAC_PI_2 * f64::from_bits((1023 - 102) << 52);

/// Payne–Hanek reduction of a finite `ax >= 2^-39` (called for
/// `ax > TRIG_FAST_MAX`): returns `(r, q)` with `ax = q pi/2 + r` (`q` mod 4),
/// `|r| <= pi/4`, and `r` accurate to at least `2^-47` relative (`2^-52`
/// unless `ax` is within `2^-25` of a multiple of `pi/2`).
///
/// `ax = m 2^e` with the 24-bit integer `m`. Of `2/pi = sum b_i 2^-i`, the
/// bits with `i <= e - 2` add multiples of 4 to `ax 2/pi` and are skipped;
/// the next 104 bits form an integer `w`, and `m w < 2^128` is exact in
/// `u128`: `ax 2/pi = m w 2^-102 + (multiple of 4) + err` with
/// `0 <= err < m 2^-102 < 2^-78`. No `f32` above `2^18` comes closer to a
/// multiple of `pi/2` than `|r| = 1.6e-9` (about `2^-29`, at
/// `16367173 * 2^72`; exhaustive search), so the quadrant is always right and
/// `r` keeps at least 47 correct bits.
#[inline(never)]
fn trig_reduce_big(ax: f32) -> (f64, u32) {
    let bits = ax.to_bits();
    let m = ((bits & 0x007F_FFFF) | 0x0080_0000) as u128;
    let e = (bits >> 23) as i32 - 150;
    debug_assert!((-62..=104).contains(&e), "trig_reduce_big({ax:e})");
    // Bit b_(e-1) sits at (0-based) position e + 62 of the table.
    let pos = (e + 62) as usize;
    let (k, off) = (pos / 32, (pos % 32) as u32);
    let word = |i: usize| TWO_OVER_PI_BITS[k + i] as u128;
    let top = (word(0) << 96) | (word(1) << 64) | (word(2) << 32) | word(3);
    // 128 bits from b_(e-1) on (the `>>` yields 0 when off == 0), then the
    // first 104 of them.
    let w = ((top << off) | (word(4) >> (32 - off))) >> 24;
    // ax 2/pi = p 2^-102 (mod 4); round to the nearest integer n. The
    // wrapping add only drops multiples of 2^26 from n.
    let p = (m * w).wrapping_add(1 << 101);
    let q = (p >> 102) as u32 & 3;
    // (ax 2/pi - n) 2^102, in [-2^101, 2^101).
    let f = (p & ((1 << 102) - 1)) as i128 - (1 << 101);
    (f as f64 * PIO2_2M102, q)
}

/// `sin(q pi/2 + r)` for an `f64` reduced argument `|r| <= pi/4`: the same
/// polynomials (same coefficients) as [`trig_eval`], evaluated in `f64`, so
/// that the only errors left are the polynomials' own (below `4.2e-9`
/// relative) and the final rounding to `f32`.
#[inline(always)]
fn trig_eval_f64(r: f64, q: u32) -> f32 {
    let r2 = r * r;
    let ps = (S7 as f64 * r2 + S5 as f64) * r2 + S3 as f64;
    let s = r + (r * r2) * ps;
    let pc = (C8 as f64 * r2 + C6 as f64) * r2 + C4 as f64;
    let c = 1.0 + r2 * (r2 * pc - 0.5);
    let v = if q & 1 == 0 { s } else { c } as f32;
    f32::from_bits(v.to_bits() ^ ((q & 2) << 30))
}

/// The big-argument path of [`sin_f32`]: any finite `|x| >= 2^-39` (used
/// for `|x| > TRIG_FAST_MAX`), `±inf` and NaN give NaN.
#[cold]
#[inline(never)]
fn sin_f32_big(x: f32) -> f32 {
    let ax = x.abs();
    if !ax.is_finite() {
        return f32::NAN;
    }
    let (r, q) = trig_reduce_big(ax);
    let v = trig_eval_f64(r, q);
    f32::from_bits(v.to_bits() ^ (x.to_bits() & SIGN_MASK))
}

/// The big-argument path of [`cos_f32`] (same domain as [`sin_f32_big`]).
#[cold]
#[inline(never)]
fn cos_f32_big(x: f32) -> f32 {
    let ax = x.abs();
    if !ax.is_finite() {
        return f32::NAN;
    }
    let (r, q) = trig_reduce_big(ax);
    trig_eval_f64(r, q.wrapping_add(1))
}

/// Sine, for every `f32`.
///
/// `|x| <= 2^18` ([`TRIG_FAST_MAX`]): reduction `|x| = q pi/2 + r` with a
/// three-part Cody–Waite `pi/2` (FMA), degree-7/8 minimax polynomials for
/// `sin r`/`cos r`, quadrant and sign fixed up with selects and sign-bit
/// flips (this is [`sin_f32_fast`]). Larger arguments: Payne–Hanek
/// reduction (the 24-bit mantissa times 104 bits of `2/pi` in exact `u128`
/// arithmetic, so the quadrant is always right and the reduced argument is
/// accurate to at least `2^-47` relative even right next to a multiple of
/// `pi/2`), then the same polynomials (same coefficients) evaluated in `f64`
/// and rounded once to `f32`.
/// Odd: `sin(-x) = -sin(x)`, `sin(-0) = -0`.
///
/// Accuracy (relative to the exact result, no floor, including arguments
/// right next to multiples of `pi/2`; checked exhaustively over all finite
/// inputs against `f64::sin`): max error 1.541 ulp [asserted 2] for
/// `|x| <= 2^18`, 0.569 ulp [asserted 0.6] for `|x| > 2^18` up to
/// `f32::MAX`. Results are always within `[-1, 1]`.
/// `sin(±inf) = NaN`, `sin(NaN) = NaN`.
///
/// The branch on `|x|` keeps a loop of `sin_f32` calls from vectorizing;
/// loops over slices should use [`sin_f32_run`] (or [`sin_f32_fast`] where
/// `|x| <= 2^18` is known).
#[inline(always)]
pub fn sin_f32(x: f32) -> f32 {
    if x.abs() > TRIG_FAST_MAX {
        sin_f32_big(x)
    } else {
        sin_f32_fast(x)
    }
}

/// Cosine, for every `f32`.
///
/// Same reductions and polynomials as [`sin_f32`] (`cos x = sin(x + pi/2)`
/// by shifting the quadrant). Even: `cos(-x) = cos(x)`.
///
/// Accuracy (relative, no floor; checked exhaustively over all finite inputs
/// against `f64::cos`): max error 1.540 ulp [asserted 2] for `|x| <= 2^18`,
/// 0.569 ulp [asserted 0.6] for `|x| > 2^18` up to `f32::MAX`.
/// `cos(±inf) = NaN`, `cos(NaN) = NaN`.
///
/// As for [`sin_f32`], loops over slices should use [`cos_f32_run`] (or
/// [`cos_f32_fast`] where `|x| <= 2^18` is known).
#[inline(always)]
pub fn cos_f32(x: f32) -> f32 {
    if x.abs() > TRIG_FAST_MAX {
        cos_f32_big(x)
    } else {
        cos_f32_fast(x)
    }
}

/// Redoes the elements with `|x| > TRIG_FAST_MAX` (`±inf` included) with the
/// big-argument path.
#[cold]
#[inline(never)]
fn trig_fixup(src: &[f32], out: &mut [f32], cos: bool) {
    for (o, &x) in out.iter_mut().zip(src) {
        if x.abs() > TRIG_FAST_MAX {
            *o = if cos { cos_f32_big(x) } else { sin_f32_big(x) };
        }
    }
}

/// `out[i] = sin_f32(src[i])` for slices of the same length (panics
/// otherwise), bit-for-bit.
///
/// A branch-free loop of [`sin_f32_fast`] that vectorizes (it also ORs
/// together the `|x| > 2^18` flags), then, only if some flag was set, a
/// scalar pass that recomputes those elements with the Payne–Hanek path.
#[inline(always)]
pub fn sin_f32_run(src: &[f32], out: &mut [f32]) {
    assert_eq!(src.len(), out.len(), "sin_f32_run: slice lengths differ");
    let mut big = false;
    for (o, &x) in out.iter_mut().zip(src) {
        *o = sin_f32_fast(x);
        big |= x.abs() > TRIG_FAST_MAX;
    }
    if big {
        trig_fixup(src, out, false);
    }
}

/// `out[i] = cos_f32(src[i])` for slices of the same length (panics
/// otherwise), bit-for-bit; vectorizes like [`sin_f32_run`].
#[inline(always)]
pub fn cos_f32_run(src: &[f32], out: &mut [f32]) {
    assert_eq!(src.len(), out.len(), "cos_f32_run: slice lengths differ");
    let mut big = false;
    for (o, &x) in out.iter_mut().zip(src) {
        *o = cos_f32_fast(x);
        big |= x.abs() > TRIG_FAST_MAX;
    }
    if big {
        trig_fixup(src, out, true);
    }
}

// ---------------------------------------------------------------------------
// tanh / sigmoid
// ---------------------------------------------------------------------------

/// `tanh` clamps `|x|` to this (the result is then exactly 1).
const TANH_CLAMP: f32 = 9.0;
/// `-2 log2(e)` (its rounding only shifts where `n` switches, not `h`).
const M2_LOG2_E: f32 = -2.0 * LOG2_E;
/// `MAGIC + 127`: for `t = a * M2_LOG2_E + MAGIC_P127`, `t - MAGIC_P127` is
/// `n = round(-2a log2 e)` and `t.to_bits() << 23` is the bit pattern of
/// `2^n` (for the `-26 <= n <= 0` that occur).
const MAGIC_P127: f32 = MAGIC + 127.0;
/// Half of the `f32` `ln 2` (no low part needed, see `tanh_f32`).
const HALF_LN2_HI: f32 = 0.5 * LN2_HI;

// (e^(2h) - 1) / 2 ~ h + h^2 (H0 + H1 h + ... + H4 h^4) for h in
// [-ln2/4, ln2/4]: minimax (with these f32 coefficients) for the error it
// causes in tanh, i.e. weighted by the condition number of
// -w / (1 + w) with respect to w (h < 0 occurs with n = 0, h > 0 only with
// n <= -1); 1.2e-8 relative to tanh.
const H0: f32 = 0.999_999_64;
const H1: f32 = 0.666_659_3;
const H2: f32 = 0.333_359_33;
const H3: f32 = 0.133_967_31;
const H4: f32 = 0.044_104_01;

/// Hyperbolic tangent.
///
/// One branch-free path for all inputs (about 18 vector operations, one
/// division, no select): with `a = min(|x|, 9)`, `w = (e^(-2a) - 1) / 2`
/// (in `(-1/2, 0]`) and `d = 1 + w = (e^(-2a) + 1) / 2`, `tanh a = -w / d`.
///
/// * `w` comes from the reduction `-2a = n ln2 + 2h` (`|h| <= ln2/4`), a
///   degree-6 polynomial `p ~ (e^(2h) - 1) / 2` and `w = 2^n p + (2^n - 1)/2`
///   in one FMA. For `|x| < 0.17` (`n = 0`) that is just `w = p ~ -a`, with
///   full relative accuracy, so `tanh x ~ x` stays accurate down to
///   subnormals.
/// * `d = 2^n p + (2^n + 1)/2` is one more FMA on the same exact product's
///   inputs (`(2^n + 1)/2` is exact for the `n >= -23` where it matters), so
///   numerator and denominator each carry one rounding and the quotient one
///   more. (An earlier version replaced the division with a cubic start and
///   three correction terms, eight operations; on AMD Zen 4 the division is
///   14–18% faster over a run in L1, with the same worst case.)
///
/// The sign is copied from `x` (exactly odd, `tanh(-0) = -0`; `0 - w` keeps
/// the quotient's sign bit clear at `w = 0`). For `|x| > 8.49` (`n <= -25`),
/// `(2^n - 1)/2` rounds to `-1/2` and the result is exactly `±1` (the exact
/// value rounds to `1 - 2^-24` up to `|x| = 9.01`; that costs at most 1.41
/// ulp). Monotone over all `f32`.
///
/// Accuracy: max error 1.93 ulp [asserted 2] over all finite inputs (checked
/// exhaustively against `f64::tanh`, at `|x| = 0.5137962`, where `w` carries
/// the error).
/// `tanh(±inf) = ±1`, `tanh(NaN) = NaN`.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let ax = x.abs();
    // Keeps NaN.
    let a = if ax > TANH_CLAMP { TANH_CLAMP } else { ax };

    // -2a = n ln2 + 2h: h = -a - n ln2/2 is exact (as in exp_reduce), and the
    // missing low part of ln 2 changes e^(-2a) by a relative 2e-9 |n| only.
    let t = a.mul_add(M2_LOG2_E, MAGIC_P127);
    let n = t - MAGIC_P127;
    let h = (-n).mul_add(HALF_LN2_HI, -a);
    let h2 = h * h;
    let p01 = H1.mul_add(h, H0);
    let p23 = H3.mul_add(h, H2);
    let p = H4.mul_add(h2, p23).mul_add(h2, p01).mul_add(h2, h);
    // s = 2^n; (2^n - 1) / 2 and (2^n + 1) / 2 are exact for n >= -23.
    let s = f32::from_bits(t.to_bits() << 23);
    let w = s.mul_add(p, s.mul_add(0.5, -0.5));
    let d = s.mul_add(p, s.mul_add(0.5, 0.5));
    // -w / d >= +0 (+0 for a = 0), so or-ing in the sign of x is a copysign.
    let v = (0.0 - w) / d;
    f32::from_bits(v.to_bits() | (x.to_bits() & SIGN_MASK))
}

/// Logistic sigmoid `1 / (1 + e^-x)`.
///
/// Evaluated as `1 / (1 + e)` for `x >= 0` and `e / (1 + e)` for `x < 0`,
/// with `e = exp(-|x|)`, so there is never a cancellation and large negative
/// `x` keeps full relative accuracy (`sigmoid(x) ~ e^x`, including subnormal
/// results down to `x ~ -103.9`; below that `+0`).
///
/// `e` is kept as an unevaluated `hi + lo` pair and the rounding error of
/// `1 + e` is compensated, so what is left is essentially the error of the
/// exp polynomial and of the one division.
///
/// Accuracy: max error 1.46 ulp [asserted 2] for results in the normal range
/// (`x > -87.3`); the subnormal tail is within 1 ulp of `2^-149` [asserted 1].
/// `sigmoid(+inf) = 1`, `sigmoid(-inf) = 0`, `sigmoid(NaN) = NaN`.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    let (q, inv_d, c, _, _) = sigmoid_parts(x);
    inv_d.mul_add(c, q)
}

/// The pieces of [`sigmoid_f32`]: `sigmoid(x) ~ q + inv_d · c` with `q = num / d` rounded
/// (returned with `num` and `d`, for callers that also want the division's rounding error).
#[inline(always)]
fn sigmoid_parts(x: f32) -> (f32, f32, f32, f32, f32) {
    // e = exp(-|x|) = eh + el, kept to about 2x f32 precision.
    let a = clamp_keep_nan(-x.abs(), -110.0, 0.0);
    let (r, b) = exp_reduce(a);
    let (ph, pl) = exp_poly_hilo(r);
    let (s1, s2) = pow2_pair(b);
    let eh = ph * s1 * s2;
    let el = pl * s1 * s2;

    let neg = x < 0.0;
    let num = if neg { eh } else { 1.0 };
    let num_lo = if neg { el } else { 0.0 };
    let d = 1.0 + eh;
    // d + d_err = 1 + eh + el (the first part is an exact Fast2Sum error).
    let d_err = ((1.0 - d) + eh) + el;
    let q = num / d;
    // (num + num_lo) / (d + d_err) ~ q + (num_lo - q d_err) / d, where 1/d
    // is q itself for x >= 0 and 1 - q for x < 0 (plenty accurate for this
    // tiny correction).
    let inv_d = if neg { 1.0 - q } else { q };
    (q, inv_d, (-q).mul_add(d_err, num_lo), num, d)
}

// ---------------------------------------------------------------------------
// erf / gelu
// ---------------------------------------------------------------------------

// erf(x) ~ x + x (A1 + A3 x^2 + ... + A13 x^12) on [0, 1]; minimax for
// relative error (1.4e-9).
const A1: f32 = 0.128_379_17;
const A3: f32 = -0.376_126_26;
const A5: f32 = 0.112_835_79;
const A7: f32 = -0.026_853_347;
const A9: f32 = 0.005_187_162;
const A11: f32 = -0.000_799_785_3;
const A13: f32 = 7.806_904e-5;

// erfc(t) e^(t^2) ~ sum_i B_i u^i with u = 1 / (1 + t/2), for t in
// [0.5, 10.5]; minimax for relative error (2.1e-9).
const B0: f32 = 3.498_662_2e-6;
const B1: f32 = 0.281_985_52;
const B2: f32 = 0.283_583_5;
const B3: f32 = 0.235_196_46;
const B4: f32 = 0.233_966_59;
const B5: f32 = -0.104_501_456;
const B6: f32 = 0.400_639_1;
const B7: f32 = -0.605_347_93;
const B8: f32 = 0.348_145_22;
const B9: f32 = -0.073_677_406;

/// `erf(ax) - ax` style small-argument polynomial: returns `erf(ax)` for
/// `0 <= ax <= 1`.
#[inline(always)]
fn erf_small(ax: f32) -> f32 {
    let x2 = ax * ax;
    let p = A13
        .mul_add(x2, A11)
        .mul_add(x2, A9)
        .mul_add(x2, A7)
        .mul_add(x2, A5)
        .mul_add(x2, A3)
        .mul_add(x2, A1);
    ax.mul_add(p, ax)
}

/// `erfc(t) * e^(t^2)` as a function of `u = 1 / (1 + t/2)`, valid for
/// `t` in `[0.5, 10.5]`.
#[inline(always)]
fn erfcx_poly(u: f32) -> f32 {
    B9.mul_add(u, B8)
        .mul_add(u, B7)
        .mul_add(u, B6)
        .mul_add(u, B5)
        .mul_add(u, B4)
        .mul_add(u, B3)
        .mul_add(u, B2)
        .mul_add(u, B1)
        .mul_add(u, B0)
}

/// Error function.
///
/// `|x| < 1`: `x + x P(x^2)` (degree-13 odd minimax polynomial). Otherwise
/// `1 - erfc(|x|)` with `erfc(t) = e^(-t^2) R(1 / (1 + t/2))`, where `t^2`
/// is split exactly with an FMA so that `e^(-t^2)` keeps full relative
/// accuracy. Odd, `erf(-0) = -0`.
///
/// Accuracy: max error 1.18 ulp [asserted 1.5] over all finite inputs (well
/// inside a `4 ulp` budget). `erf(±inf) = ±1`, `erf(NaN) = NaN`.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let ax = x.abs();
    let small = erf_small(ax);

    // erf rounds to exactly 1 beyond 3.84; clamping at 4 keeps e^(-t^2) out
    // of the (slow) subnormal range.
    let t = if ax > 4.0 { 4.0 } else { ax };
    let u = 1.0 / 0.5f32.mul_add(t, 1.0);
    let hi = t * t;
    let lo = t.mul_add(t, -hi);
    let erfc = exp_hilo_times(-hi, -lo, erfcx_poly(u));
    let big = 1.0 - erfc;

    let v = if ax < 1.0 { small } else { big };
    f32::from_bits(v.to_bits() | (x.to_bits() & SIGN_MASK))
}

/// `1 / sqrt(2)` rounded to `f32`.
const FRAC_1_SQRT_2: f32 = core::f32::consts::FRAC_1_SQRT_2;
/// `0.5 / sqrt(2) = HALF_FRAC_1_SQRT_2 + HALF_FRAC_1_SQRT_2_LO`
/// (`u = 1 / (1 + t/2)` with `t = |x|/sqrt 2`).
const HALF_FRAC_1_SQRT_2: f32 = 0.353_553_38;
const HALF_FRAC_1_SQRT_2_LO: f32 = 6.050_808_7e-9;
/// `2 / sqrt(pi)` rounded to `f32`.
const FRAC_2_SQRT_PI: f32 = core::f32::consts::FRAC_2_SQRT_PI;

/// Exact (erf-based, not tanh-approximated) GELU: `x Phi(x) =
/// 0.5 x (1 + erf(x / sqrt 2))`.
///
/// For `|x| < sqrt(2)/2` the small erf polynomial is used; otherwise
/// `Phi(-|x|) = erfc(|x|/sqrt 2) / 2` comes from the same `e^(-t^2) R(u)`
/// form as [`erf_f32`] (with `t^2 = x^2/2` split exactly), so for negative
/// `x` the result keeps good *relative* accuracy all the way down to the
/// subnormal range (`x ~ -13.2`), instead of suffering from `1 + erf`
/// cancellation. The rounding of `u` is corrected to first order with the
/// exact derivative of `R`.
///
/// Accuracy, for results in the normal range: relative error < 2.6e-7
/// everywhere [asserted 3.5e-7], i.e. max 4.0 ulp [asserted 5] for
/// `x < -0.71` (about 85% of those results within 1 ulp) and max 1.7 ulp for
/// `x > -0.71`. Subnormal results (`x` in about `[-14.3, -13.15]`) are
/// within 1.7 ulp of `2^-149` [asserted 2]; `x < -15` returns `-0` (the exact
/// value rounds to zero below about `-14.3`), `x > 10` returns `x`.
/// `gelu(+inf) = +inf`, `gelu(-inf) = -0`, `gelu(NaN) = NaN`.
#[inline(always)]
pub fn gelu_f32(x: f32) -> f32 {
    // Clamp (keeping NaN) so the exp below stays in range (and, on the
    // positive side where x Phi(x) rounds to x beyond 10, out of the slow
    // subnormal range); the ends are fixed up at the bottom.
    let xc = clamp_keep_nan(x, -15.0, 10.0);
    let ax = xc.abs();

    // Small region: Phi(x) = 0.5 + 0.5 erf(x / sqrt 2).
    let z = ax * FRAC_1_SQRT_2;
    let ez = erf_small(z);
    let ez = f32::from_bits(ez.to_bits() | (xc.to_bits() & SIGN_MASK));
    let small = (0.5 * xc).mul_add(ez, 0.5 * xc);

    // Large region: h = 0.5 x erfc(|x| / sqrt 2) computed as one product.
    let den = HALF_FRAC_1_SQRT_2.mul_add(ax, 1.0);
    let u = 1.0 / den;
    let rx = erfcx_poly(u);
    // The rounding of `den` and of the division shifts the `t` that `u`
    // stands for (R is quite sensitive to that); correct to first order with
    // the exact derivative R'(t) = 2 t R - 2/sqrt(pi):
    // t - t(u) = 2 (den_exact - 1/u) ~ 2 ((u den - 1) den + den_err).
    let rho = u.mul_add(den, -1.0);
    let den_err = HALF_FRAC_1_SQRT_2_LO.mul_add(ax, HALF_FRAC_1_SQRT_2.mul_add(ax, 1.0 - den));
    let dt = 2.0 * rho.mul_add(den, den_err);
    let drdt = (4.0 * (den - 1.0)).mul_add(rx, -FRAC_2_SQRT_PI);
    let rx = drdt.mul_add(dt, rx);
    let sq = xc * xc;
    let sq_lo = xc.mul_add(xc, -sq);
    let h = exp_hilo_times(-0.5 * sq, -0.5 * sq_lo, (0.5 * xc) * rx);
    // x < 0: x Phi(x) = h. x > 0: x Phi(x) = x (1 - Phi(-x)) = x - h.
    let big = if xc < 0.0 { h } else { xc - h };

    let v = if ax < FRAC_1_SQRT_2 { small } else { big };
    let v = if x > 10.0 { x } else { v };
    if x < -15.0 { -0.0 } else { v }
}

// ---------------------------------------------------------------------------
// rounding to integers
// ---------------------------------------------------------------------------

/// `x` rounded to the nearest integer, ties to even (PyTorch's `round`, IEEE
/// `roundToIntegralTiesToEven`).
///
/// For `|x| < 2^23`, `(|x| + 2^23) - 2^23` rounds `|x|` to an integer in the default
/// rounding mode (nearest, ties to even); larger magnitudes, infinities and NaN are their
/// own rounding. The sign is then copied from `x`, so `round(-0.3) = -0` (as C's `rint`).
/// Exact [every f32 checked against `f32::round_ties_even` by an ignored test].
#[inline(always)]
pub fn round_even_f32(x: f32) -> f32 {
    let a = f32::from_bits(x.to_bits() & !SIGN_MASK);
    let r = if a < TWO_23 { (a + TWO_23) - TWO_23 } else { a };
    f32::from_bits(r.to_bits() | (x.to_bits() & SIGN_MASK))
}

/// The largest integer not above `x` (`floor(-0.5) = -1`, `floor(-0) = -0`): the
/// [`round_even_f32`] of `x`, one less where that rounded up. Exact [as above].
#[inline(always)]
pub fn floor_f32(x: f32) -> f32 {
    let r = round_even_f32(x);
    if r > x { r - 1.0 } else { r }
}

/// The smallest integer not below `x`, with `x`'s sign (`ceil(-0.5) = -0`): the
/// [`round_even_f32`] of `x`, one more where that rounded down. Exact [as above].
#[inline(always)]
pub fn ceil_f32(x: f32) -> f32 {
    let r = round_even_f32(x);
    let r = if r < x { r + 1.0 } else { r };
    f32::from_bits(r.to_bits() | (x.to_bits() & SIGN_MASK))
}

/// `x` rounded toward zero, with its sign (`trunc(-0.7) = -0`): [`floor_f32`] of `|x|`.
/// Exact [as above].
#[inline(always)]
pub fn trunc_f32(x: f32) -> f32 {
    let a = f32::from_bits(x.to_bits() & !SIGN_MASK);
    let r = floor_f32(a);
    f32::from_bits(r.to_bits() | (x.to_bits() & SIGN_MASK))
}

// ---------------------------------------------------------------------------
// exp2 / expm1 / log1p
// ---------------------------------------------------------------------------

/// `2^x`.
///
/// `x = n + f` with `n` the nearest integer (`|f| <= 1/2`, exact), `2^f = e^(f ln2)` with
/// `f ln2` carried in two parts into the exp polynomial, scaled by `2^n` in two factors
/// like [`exp_f32`] (one rounding for subnormal results and near overflow). Integers give
/// exact powers of two.
///
/// Accuracy: max error 0.53 ulp [asserted 1] for normal results, subnormal results within
/// 1 ulp of `2^-149` [asserted 1] (M). `2^x` is `+inf` for `x >= 128`, `+0` for `x <= -150`;
/// `exp2(-inf) = 0`, `exp2(NaN) = NaN`.
#[inline(always)]
pub fn exp2_f32(x: f32) -> f32 {
    let x = clamp_keep_nan(x, -160.0, 160.0);
    // n = round(x); the low bits of t hold 254 + n for `pow2_pair`.
    let t = x + MAGIC_P254;
    let n = t - MAGIC_P254;
    let f = x - n;
    // f ln2 = hi + lo (the first part of lo is the exact rounding error of hi).
    let hi = f * LN2_HI;
    let lo = f.mul_add(LN2_HI, -hi) + f * LN2_LO;
    // e^(hi + lo) - 1 ~ p + lo (the lo·p term is below 1e-8 relative).
    let q = expm1_poly(hi) + lo;
    let (s1, s2) = pow2_pair(t.to_bits());
    q.mul_add(s1, s1) * s2
}

/// `e^x - 1`, accurate near 0.
///
/// Below `x = 16.9` (where `n = round(x log2 e) <= 24`): `x = n ln2 + r` as in [`exp_f32`]
/// and `e^x - 1 = 2^n p + (2^n - 1)` with `p = e^r - 1` from the polynomial, in one FMA
/// (`2^n - 1` is exact or, below `2^-24`, negligible); so `expm1(x) ~ x` keeps full
/// relative accuracy down to subnormals. Above, `exp_f32(x) - 1`.
///
/// Accuracy: max error 1.01 ulp [asserted 1.5] (M). `expm1(±0) = ±0`,
/// `expm1(-inf) = -1` (and every `x < -17.4`), `expm1(+inf) = +inf` (above 88.7228),
/// `expm1(NaN) = NaN`.
#[inline(always)]
pub fn expm1_f32(x: f32) -> f32 {
    let xc = clamp_keep_nan(x, -30.0, 100.0);
    let (r, b) = exp_reduce(xc);
    let (s1, s2) = pow2_pair(b);
    // 2^n itself for n <= 24 (both factors normal, the product exact).
    let s = s1 * s2;
    let small = s.mul_add(expm1_poly(r), s - 1.0);
    let v = if xc < 16.9 { small } else { exp_full(xc) - 1.0 };
    if x == 0.0 { x } else { v }
}

/// `ln(1 + x)`, accurate near 0.
///
/// `u = 1 + x` rounded, with its exact rounding error `c` (Fast2Sum, larger magnitude
/// first); then [`log_f32`]'s reduction of `u` with `c / u` (the first-order term of
/// `ln(u + c) - ln u`) added to the low part before the final sums. For `|x| < 2^-25`
/// that is `0 + x`.
///
/// Accuracy: max error 0.89 ulp [asserted 1] (M). `log1p(-1) = -inf`, `log1p(x < -1) = NaN`,
/// `log1p(±0) = ±0`, `log1p(+inf) = +inf`, `log1p(NaN) = NaN`.
#[inline(always)]
pub fn log1p_f32(x: f32) -> f32 {
    let u = 1.0 + x;
    let c = if x.abs() <= 1.0 {
        (1.0 - u) + x
    } else {
        (x - u) + 1.0
    };
    // u >= 2^-24 here for every x > -1: no subnormal rescaling needed.
    let (e, f) = log_reduce(u);
    let f2 = f * f;
    let y = log_tail(f, f2);
    let y = e.mul_add(LN2_LO, y);
    let y = (-0.5f32).mul_add(f2, y) + c / u;
    let r = e.mul_add(LN2_HI, f + y);
    let r = if x == f32::INFINITY { x } else { r };
    let r = if u == 0.0 { f32::NEG_INFINITY } else { r };
    let r = if x == 0.0 { x } else { r };
    // x < -1 and NaN.
    if u >= 0.0 { r } else { f32::NAN }
}

// ---------------------------------------------------------------------------
// softplus / silu
// ---------------------------------------------------------------------------

/// PyTorch's `softplus` with `beta = 1`, `threshold = 20`: `x` for `x > 20`, else
/// `ln(1 + e^x)`, computed as `max(x, 0) + log1p(e^-|x|)` (no cancellation, and the
/// `log1p` of a value below 1).
///
/// Accuracy: max error 1.6 ulp [asserted 2] (M). `softplus(+inf) = +inf`,
/// `softplus(-inf) = 0`, `softplus(NaN) = NaN`; subnormal results (x < -87.3) within
/// 1 ulp of `2^-149`.
#[inline(always)]
pub fn softplus_f32(x: f32) -> f32 {
    let l = log1p_f32(exp_full(-x.abs()));
    let v = if x > 0.0 { x + l } else { l };
    if x > 20.0 { x } else { v }
}

/// SiLU (swish) `x · sigmoid(x)`.
///
/// [`sigmoid_f32`]'s quotient `q` with its correction, to which the exact rounding error
/// of `q` itself is added (`num - q d`, by FMA); `x` times that sum is then rounded once.
///
/// Accuracy: max error 0.83 ulp [asserted 1] (M). `silu(+inf) = +inf`,
/// `silu(-inf) = NaN` (`-inf · 0`, as PyTorch's `x / (1 + e^-x)` gives), `silu(NaN) = NaN`,
/// `silu(-0) = -0`.
#[inline(always)]
pub fn silu_f32(x: f32) -> f32 {
    let (q, inv_d, c, num, d) = sigmoid_parts(x);
    let rem = (-q).mul_add(d, num);
    let v = x.mul_add(q, x * (inv_d * (c + rem)));
    if x == f32::INFINITY { x } else { v }
}

// ---------------------------------------------------------------------------
// pow
// ---------------------------------------------------------------------------

/// `x^y`, with the IEEE/C99 `powf` conventions (`pow(x, 0) = 1` even for NaN
/// `x`, `pow(1, y) = 1`, negative `x` with non-integer `y` is NaN, ...).
///
/// This one simply calls `f32::powf` (libm), whose result is within 1 ulp;
/// it is not meant to vectorize.
#[inline(always)]
pub fn pow_f32(x: f32, y: f32) -> f32 {
    x.powf(y)
}

// ---------------------------------------------------------------------------
// through f64: the trigonometric and hyperbolic functions PyTorch users call less
// often than those above, each computed in f64 and rounded once (within 1 ulp, and
// correctly rounded but for the rare double rounding), one element at a time
// ---------------------------------------------------------------------------

macro_rules! through_f64 {
    ($($(#[$doc:meta])* $name:ident = $f:path;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(x: f32) -> f32 {
            $f(x as f64) as f32
        }
    )*};
}

through_f64! {
    /// Tangent (the platform's f64 `tan`, rounded once).
    tan_f32 = f64::tan;
    /// Arcsine (NaN outside `[-1, 1]`).
    asin_f32 = f64::asin;
    /// Arccosine (NaN outside `[-1, 1]`).
    acos_f32 = f64::acos;
    /// Arctangent.
    atan_f32 = f64::atan;
    /// Hyperbolic sine (finite up to `|x|` ≈ 89.4, where f32 overflows).
    sinh_f32 = f64::sinh;
    /// Hyperbolic cosine.
    cosh_f32 = f64::cosh;
    /// Inverse hyperbolic sine ([`super::f64::asinh`]).
    asinh_f32 = super::f64::asinh;
    /// Inverse hyperbolic cosine ([`super::f64::acosh`]; NaN below 1).
    acosh_f32 = super::f64::acosh;
    /// Inverse hyperbolic tangent ([`super::f64::atanh`]; `±inf` at `±1`).
    atanh_f32 = super::f64::atanh;
}

/// `atan2(y, x)`: the f64 `atan2` rounded once.
#[inline(always)]
pub fn atan2_f32(y: f32, x: f32) -> f32 {
    (y as f64).atan2(x as f64) as f32
}

// ---------------------------------------------------------------------------
// half-precision rounding
// ---------------------------------------------------------------------------

/// Rounds `x` to the nearest IEEE binary16 value (round to nearest, ties to
/// even) and returns it as `f32`, bit-for-bit the same as
/// `half::f16::from_f32(x).to_f32()`:
///
/// * values of magnitude `>= 65520` (and `±inf`) become `±inf`;
/// * values below `2^-14` are rounded to the f16 subnormal grid (multiples of
///   `2^-24`), and below `2^-25` (ties included) to `±0`, sign kept;
/// * NaN stays NaN: quiet bit set, low 13 payload bits cleared (the same bits
///   the round trip through `half` produces).
///
/// Branch-free integer code that vectorizes.
#[inline(always)]
pub fn round_f16(x: f32) -> f32 {
    let bits = x.to_bits();
    let sign = bits & SIGN_MASK;
    let abs = (bits & !SIGN_MASK) as i32;

    // Normal f16 range: keep 10 mantissa bits, round to nearest even. A carry
    // out of the mantissa correctly bumps the exponent.
    let lsb = (abs >> 13) & 1;
    // (Wrapping: NaN patterns near 0x7FFF_FFFF overflow here; they are
    // replaced below.)
    let normal = abs.wrapping_add(0x0FFF + lsb) & !0x1FFF;
    // Above the largest f16 (65504 = 0x477FE000) means it rounded to >= 65536.
    let normal = if normal > 0x477F_E000 {
        0x7F80_0000
    } else {
        normal
    };

    // Subnormal f16 range (|x| < 2^-14): the float addition rounds to a
    // multiple of 2^-24 (the ulp of numbers in [0.5, 1)), ties to even.
    let af = f32::from_bits(abs as u32);
    let sub = ((af + 0.5) - 0.5).to_bits() as i32;

    let r = if abs < 0x3880_0000 { sub } else { normal };
    let nan = (abs | 0x0040_0000) & !0x1FFF;
    let r = if abs > 0x7F80_0000 { nan } else { r };
    f32::from_bits(r as u32 | sign)
}

/// Rounds `x` to the nearest bfloat16 value (round to nearest, ties to even
/// on the top 16 bits) and returns it as `f32`, bit-for-bit the same as
/// `half::bf16::from_f32(x).to_f32()` for every input, NaNs included (a NaN
/// gets its quiet bit set and its low 16 bits cleared). Values that round past
/// the largest bf16 become `±inf`.
///
/// Branch-free integer code that vectorizes.
#[inline(always)]
pub fn round_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    let r = bits.wrapping_add(0x7FFF + lsb) & 0xFFFF_0000;
    let nan = (bits | 0x0040_0000) & 0xFFFF_0000;
    let is_nan = (bits & !SIGN_MASK) > 0x7F80_0000;
    f32::from_bits(if is_nan { nan } else { r })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kernels/kiln_random.cuh` re-implements `log_f32` and `cos_f32` for `randn` on CUDA
    /// so both backends draw bit-identical samples; its constants must be these.
    #[test]
    fn cuda_random_header_uses_these_constants() {
        let header = include_str!("../../kernels/kiln_random.cuh");
        let expected: [(&str, f32); 21] = [
            ("L3", L3),
            ("L4", L4),
            ("L5", L5),
            ("L6", L6),
            ("L7", L7),
            ("L8", L8),
            ("L9", L9),
            ("L10", L10),
            ("LN2_HI", LN2_HI),
            ("LN2_LO", LN2_LO),
            ("FRAC_2_PI", FRAC_2_PI),
            ("PIO2_1", PIO2_1),
            ("PIO2_2", PIO2_2),
            ("PIO2_3", PIO2_3),
            ("S3", S3),
            ("S5", S5),
            ("S7", S7),
            ("C4", C4),
            ("C6", C6),
            ("C8", C8),
            ("TAU", core::f32::consts::TAU),
        ];
        for (name, value) in expected {
            let prefix = format!("#define KILN_RNG_{name} 0x");
            let line = header
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("kiln_random.cuh lacks KILN_RNG_{name}"));
            let hex = line[prefix.len()..].trim_end_matches('u');
            let bits = u32::from_str_radix(hex, 16).expect("hex constant");
            assert_eq!(bits, value.to_bits(), "KILN_RNG_{name}");
        }
    }

    // -- helpers ------------------------------------------------------------

    /// xorshift64* pseudo-random generator.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn next_u32(&mut self) -> u32 {
            (self.next_u64() >> 32) as u32
        }

        /// Uniform in `[lo, hi]`.
        fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
            let t = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            (lo as f64 + (hi as f64 - lo as f64) * t) as f32
        }

        /// Random bit pattern with magnitude `<= max` (log-uniform-ish: covers
        /// tiny and subnormal values too), random sign.
        fn bits_upto(&mut self, max: f32) -> f32 {
            let m = max.to_bits();
            let b = self.next_u32();
            let mag = (b & 0x7FFF_FFFF) % (m + 1);
            f32::from_bits(mag | (b & 0x8000_0000))
        }
    }

    /// Size of one f32 ulp at the magnitude of `v` (the subnormal spacing
    /// below the normal range).
    fn ulp_at(v: f64) -> f64 {
        let a = v.abs();
        if a < f32::MIN_POSITIVE as f64 {
            return f64::from_bits(((1023 - 149) as u64) << 52);
        }
        let e = ((a.to_bits() >> 52) & 0x7FF) as i64 - 1023;
        f64::from_bits(((e - 23 + 1023) as u64) << 52)
    }

    fn ulp_err(got: f32, want: f64) -> f64 {
        let g = got as f64;
        if g == want {
            return 0.0;
        }
        if want.is_nan() || g.is_nan() || g.is_infinite() || want.is_infinite() {
            return f64::INFINITY;
        }
        (g - want).abs() / ulp_at(want)
    }

    /// Running maximum of an error measure, remembering the argument.
    #[derive(Debug, Clone, Copy)]
    struct Max {
        err: f64,
        at: f32,
    }

    impl Max {
        fn new() -> Self {
            Max { err: 0.0, at: 0.0 }
        }
        fn add(&mut self, err: f64, at: f32) {
            if err > self.err || err.is_nan() {
                self.err = err;
                self.at = at;
            }
        }
    }

    /// Max ulp error of `f` against `reference` over a dense grid of `[lo, hi]`
    /// (`n_grid` points) plus `n_rand` uniform and `n_rand` bit-pattern
    /// samples inside the interval.
    fn sweep(
        lo: f32,
        hi: f32,
        n_grid: usize,
        n_rand: usize,
        seed: u64,
        f: impl Fn(f32) -> f32,
        reference: impl Fn(f64) -> f64,
    ) -> Max {
        let mut m = Max::new();
        let mut check = |x: f32| m.add(ulp_err(f(x), reference(x as f64)), x);
        for i in 0..n_grid {
            let t = i as f64 / (n_grid - 1) as f64;
            check((lo as f64 + (hi as f64 - lo as f64) * t) as f32);
        }
        let mut rng = Rng(seed);
        let amax = lo.abs().max(hi.abs());
        for _ in 0..n_rand {
            check(rng.uniform(lo, hi));
            let x = rng.bits_upto(amax);
            if x >= lo && x <= hi {
                check(x);
            }
        }
        m
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    // -- f64 references for erf / erfc --------------------------------------

    const FRAC_2_SQRT_PI_64: f64 = std::f64::consts::FRAC_2_SQRT_PI;

    /// erf for `0 <= a`, via the positive series
    /// `erf(a) = 2/sqrt(pi) e^(-a^2) sum_n 2^n a^(2n+1) / (2n+1)!!`.
    fn erf_series(a: f64) -> f64 {
        let a2 = a * a;
        let mut term = a;
        let mut sum = a;
        let mut n = 0.0;
        while term > 1e-18 * sum {
            n += 1.0;
            term *= 2.0 * a2 / (2.0 * n + 1.0);
            sum += term;
        }
        FRAC_2_SQRT_PI_64 * (-a2).exp() * sum
    }

    /// erfc for `a >= 1.5` by Laplace's continued fraction
    /// `erfc(a) = e^(-a^2) / sqrt(pi) / (a + (1/2)/(a + 1/(a + (3/2)/(a + ...))))`.
    fn erfc_cf(a: f64) -> f64 {
        // Depth that converges to ~1e-17 relative for a >= 1.5.
        let depth = (20.0 + 200.0 / (a * a)) as usize;
        let mut f = a;
        for k in (1..=depth).rev() {
            f = a + (k as f64 * 0.5) / f;
        }
        (-(a * a)).exp() * (FRAC_2_SQRT_PI_64 * 0.5) / f
    }

    /// erfc for `a >= 0`, relative accuracy ~1e-11 or better.
    fn erfc_ref(a: f64) -> f64 {
        if a < 1.5 {
            1.0 - erf_series(a)
        } else {
            erfc_cf(a)
        }
    }

    fn erf_ref(x: f64) -> f64 {
        let a = x.abs();
        let r = if a < 1.5 {
            erf_series(a)
        } else {
            1.0 - erfc_cf(a)
        };
        r.copysign(x)
    }

    fn gelu_ref(x: f64) -> f64 {
        // x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2.
        let z = x * std::f64::consts::FRAC_1_SQRT_2;
        let phi = if z <= 0.0 {
            0.5 * erfc_ref(-z)
        } else {
            1.0 - 0.5 * erfc_ref(z)
        };
        x * phi
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn erf_reference_is_self_consistent() {
        // The series and the continued fraction agree where both are usable,
        // and the series matches known values.
        for i in 0..=200 {
            let a = 1.5 + i as f64 * 0.005;
            let s = 1.0 - erf_series(a);
            let c = erfc_cf(a);
            assert!(((s - c) / c).abs() < 1e-11, "a={a} series={s} cf={c}");
        }
        assert!((erf_series(1.0) - 0.842_700_792_949_714_9).abs() < 1e-15);
        assert!((erf_series(0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
        assert!(((erfc_cf(5.0) - 1.537_459_794_428_034_8e-12) / 1.5e-12).abs() < 1e-13);
    }

    // -- exp ----------------------------------------------------------------

    #[test]
    #[cfg_attr(miri, ignore)]
    fn exp_accuracy() {
        let m = sweep(-87.33, 88.72, 1_000_000, 1_000_000, 1, exp_f32, f64::exp);
        assert!(m.err <= 1.0, "exp max ulp {m:?}");
        // Subnormal results: within 1 subnormal ulp.
        let m = sweep(-103.97, -87.34, 100_000, 100_000, 2, exp_f32, f64::exp);
        assert!(m.err <= 1.0, "exp subnormal max ulp {m:?}");
    }

    #[test]
    fn exp_special_values() {
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(88.73), f32::INFINITY);
        assert_eq!(exp_f32(1e30), f32::INFINITY);
        assert_eq!(exp_f32(f32::MAX), f32::INFINITY);
        assert!(exp_f32(88.72) > 3.39e38 && exp_f32(88.7228).is_finite());
        assert_eq!(exp_f32(-104.0), 0.0);
        assert_eq!(exp_f32(-1e30), 0.0);
        assert_eq!(exp_f32(f32::MIN), 0.0);
        assert!(exp_f32(-103.0) > 0.0);
        assert_eq!(exp_f32(1e-30), 1.0);
    }

    /// Every float from -112 to -86 (the subnormal results, and the arguments below -104
    /// that take the zero lane): within 1 ulp of `2^-149` of the exact value, +0 where that
    /// rounds to 0, and no zero lane above the point where the result stops rounding to 0.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn exp_underflow_range_every_float() {
        let (lo, hi) = ((-86.0f32).to_bits(), (-112.0f32).to_bits());
        for b in lo..=hi {
            let x = f32::from_bits(b);
            let want = (x as f64).exp();
            let got = exp_f32(x);
            assert!(
                ulp_err(got, want) <= 1.0,
                "exp({x:e}) = {got:e}, want {want:e}"
            );
            if want < 2f64.powi(-150) {
                assert_eq!(got.to_bits(), 0, "exp({x:e}) must be +0");
            }
            if want > 2f64.powi(-149) {
                assert!(got > 0.0, "exp({x:e}) = {got:e} lost a subnormal");
            }
        }
    }

    // -- log ----------------------------------------------------------------

    #[test]
    #[cfg_attr(miri, ignore)]
    fn log_accuracy() {
        let ln = |x: f64| x.ln();
        // Around 1 (where the result is small), a wider span, and random bit
        // patterns over every positive finite float (subnormals included).
        let m1 = sweep(0.5, 2.0, 1_000_000, 500_000, 3, log_f32, ln);
        let m2 = sweep(1e-6, 1e6, 200_000, 500_000, 4, log_f32, ln);
        let mut m3 = Max::new();
        let mut rng = Rng(5);
        for _ in 0..1_000_000 {
            let x = f32::from_bits(rng.next_u32() % 0x7F80_0000);
            m3.add(ulp_err(log_f32(x), (x as f64).ln()), x);
        }
        for x in [
            f32::MIN_POSITIVE,
            1e-45,
            f32::MAX,
            1.0 + f32::EPSILON,
            1.0 - f32::EPSILON / 2.0,
        ] {
            m3.add(ulp_err(log_f32(x), (x as f64).ln()), x);
        }
        for m in [m1, m2, m3] {
            assert!(m.err <= 1.0, "log max ulp {m:?}");
        }
    }

    #[test]
    fn log_special_values() {
        assert!(log_f32(f32::NAN).is_nan());
        assert!(log_f32(-1.0).is_nan());
        assert!(log_f32(-1e-45).is_nan());
        assert!(log_f32(f32::NEG_INFINITY).is_nan());
        assert_eq!(log_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(log_f32(-0.0), f32::NEG_INFINITY);
        assert_eq!(log_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(log_f32(1.0).to_bits(), 0);
        assert_eq!(log_f32(2.0), std::f32::consts::LN_2);
    }

    // -- sin / cos ----------------------------------------------------------

    fn trig_sweep(lo: f32, hi: f32, n: usize, seed: u64) -> (Max, Max) {
        let s = sweep(lo, hi, n, n, seed, sin_f32, f64::sin);
        let c = sweep(lo, hi, n, n, seed + 1, cos_f32, f64::cos);
        (s, c)
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn sin_cos_accuracy() {
        let (s, c) = trig_sweep(-1e4, 1e4, 500_000, 6);
        assert!(s.err <= 2.0, "sin max ulp {s:?}");
        assert!(c.err <= 2.0, "cos max ulp {c:?}");
        let (s, c) = trig_sweep(-10.0, 10.0, 300_000, 8);
        assert!(s.err <= 2.0, "sin max ulp {s:?}");
        assert!(c.err <= 2.0, "cos max ulp {c:?}");
        // Arguments next to multiples of pi/2 (results near 0 must keep
        // their relative accuracy).
        let mut ms = Max::new();
        let mut mc = Max::new();
        for k in 1..6_400 {
            let x0 = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
            for b in x0.to_bits() - 8..=x0.to_bits() + 8 {
                let x = f32::from_bits(b);
                for x in [x, -x] {
                    ms.add(ulp_err(sin_f32(x), (x as f64).sin()), x);
                    mc.add(ulp_err(cos_f32(x), (x as f64).cos()), x);
                }
            }
        }
        assert!(ms.err <= 2.0, "sin near k pi/2 max ulp {ms:?}");
        assert!(mc.err <= 2.0, "cos near k pi/2 max ulp {mc:?}");
        // Larger arguments: still accurate up to 1e5.
        let (s, c) = trig_sweep(-1e5, 1e5, 300_000, 10);
        assert!(s.err <= 2.0, "sin max ulp {s:?}");
        assert!(c.err <= 2.0, "cos max ulp {c:?}");
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn sin_cos_special_values_and_bounds() {
        assert!(sin_f32(f32::NAN).is_nan());
        assert!(cos_f32(f32::NAN).is_nan());
        assert!(sin_f32(f32::INFINITY).is_nan());
        assert!(sin_f32(f32::NEG_INFINITY).is_nan());
        assert!(cos_f32(f32::INFINITY).is_nan());
        assert!(cos_f32(f32::NEG_INFINITY).is_nan());
        assert_eq!(sin_f32(0.0).to_bits(), 0);
        assert_eq!(sin_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(cos_f32(0.0), 1.0);
        assert_eq!(cos_f32(-0.0), 1.0);
        assert_eq!(sin_f32(1e-30), 1e-30);
        assert_eq!(sin_f32(-1e-40), -1e-40);
        // Any finite argument, however large: a value in [-1, 1].
        let mut rng = Rng(12);
        for i in 0..1_000_000 {
            let x = if i % 2 == 0 {
                f32::from_bits(rng.next_u32() & 0xFF7F_FFFF)
            } else {
                rng.uniform(-1e9, 1e9)
            };
            let (s, c) = (sin_f32(x), cos_f32(x));
            assert!((-1.0..=1.0).contains(&s), "sin({x}) = {s}");
            assert!((-1.0..=1.0).contains(&c), "cos({x}) = {c}");
        }
        for x in [f32::MAX, f32::MIN, 1.3e7, 1.31e7, 3e38] {
            assert!((-1.0..=1.0).contains(&sin_f32(x)));
            assert!((-1.0..=1.0).contains(&cos_f32(x)));
        }
    }

    /// The hardest argument of each binade `[2^k, 2^(k+1))` for `k = 18..=127`
    /// (the `f32` closest to a multiple of `pi/2` there, from an exhaustive
    /// search), as bit patterns. The closest of all, `0x6F79BE45`
    /// (`16367173 * 2^72 ~ 7.73e28`), is `1.6e-9` away from one.
    #[rustfmt::skip]
    const TRIG_HARDEST: [u32; 110] = [
        0x4882_665E, 0x4902_665E, 0x4982_665E, 0x4A25_62AE, 0x4AA5_62AE, 0x4B25_62AE, 0x4BF3_B47B,
        0x4C23_32E9, 0x4CA3_32E9, 0x4D23_32E9, 0x4D84_7661, 0x4E13_D4A5, 0x4E93_D4A5, 0x4F0F_FD14,
        0x4FDB_D32F, 0x507F_D274, 0x50A3_E87F, 0x5123_E87F, 0x51A3_E87F, 0x5223_E87F, 0x52A3_E87F,
        0x5323_E87F, 0x53B1_46A6, 0x5431_46A6, 0x54B1_46A6, 0x5531_46A6, 0x55B1_46A6, 0x5678_7577,
        0x56F8_7577, 0x5778_7577, 0x57B8_2989, 0x5838_2989, 0x58DC_36C9, 0x596E_3D69, 0x59F7_40B9,
        0x5A7B_C261, 0x5AFE_0335, 0x5B7F_239F, 0x5BFF_B3D4, 0x5C07_BCD0, 0x5C87_BCD0, 0x5D07_BCD0,
        0x5D87_BCD0, 0x5E07_BCD0, 0x5E87_BCD0, 0x5F07_BCD0, 0x5FE4_112C, 0x6064_112C, 0x60AB_0CE1,
        0x617C_556B, 0x61D3_B126, 0x6253_B126, 0x62EC_1B4A, 0x636C_1B4A, 0x63E6_00C1, 0x642E_0733,
        0x64AE_0733, 0x652E_0733, 0x6589_8498, 0x6609_8498, 0x6689_8498, 0x6709_8498, 0x6789_8498,
        0x6809_8498, 0x6889_8498, 0x6946_E3BB, 0x69C6_E3BB, 0x6A19_76F1, 0x6A99_76F1, 0x6B19_76F1,
        0x6B99_76F1, 0x6C55_DA58, 0x6CD5_DA58, 0x6D20_63C2, 0x6D85_A877, 0x6E05_A877, 0x6E85_A877,
        0x6F79_BE45, 0x6FF9_BE45, 0x7079_BE45, 0x70F9_BE45, 0x7179_BE45, 0x71F9_BE45, 0x723F_A09A,
        0x72BF_A09A, 0x733F_A09A, 0x73E6_1C18, 0x7452_DE59, 0x74D2_DE59, 0x756F_A1DC, 0x7594_9471,
        0x7650_7CE8, 0x76A4_26EB, 0x7758_4625, 0x77D8_4625, 0x7858_4625, 0x78A8_B883, 0x7940_7F54,
        0x79C0_7F54, 0x7A10_5F7F, 0x7AFC_CBAB, 0x7B16_75C0, 0x7B96_75C0, 0x7C6C_3305, 0x7CFF_01BD,
        0x7D7F_01BD, 0x7DFF_01BD, 0x7E7F_01BD, 0x7EBD_CDA0, 0x7F3D_CDA0,
    ];

    /// Errors of `sin_f32`/`cos_f32` at `x`, split by path (fast: `|x| <= 2^18`),
    /// after checking the exact symmetries `sin(-x) = -sin(x)`, `cos(-x) = cos(x)`.
    #[derive(Debug)]
    struct TrigMax {
        sin_fast: Max,
        cos_fast: Max,
        sin_big: Max,
        cos_big: Max,
    }

    impl TrigMax {
        fn new() -> Self {
            TrigMax {
                sin_fast: Max::new(),
                cos_fast: Max::new(),
                sin_big: Max::new(),
                cos_big: Max::new(),
            }
        }
        fn check(&mut self, x: f32) {
            let (s, c) = (sin_f32(x), cos_f32(x));
            assert!(same(sin_f32(-x), -s), "sin(-x) != -sin(x) at {x:e}");
            assert!(same(cos_f32(-x), c), "cos(-x) != cos(x) at {x:e}");
            let (es, ec) = (ulp_err(s, (x as f64).sin()), ulp_err(c, (x as f64).cos()));
            if x.abs() <= TRIG_FAST_MAX {
                self.sin_fast.add(es, x);
                self.cos_fast.add(ec, x);
            } else {
                self.sin_big.add(es, x);
                self.cos_big.add(ec, x);
            }
        }
        fn assert_bounds(&self) {
            // Exhaustive maxima: 1.541 and 1.540 (fast), 0.569 and 0.569 (big).
            assert!(
                self.sin_fast.err <= 2.0,
                "sin fast path {:?}",
                self.sin_fast
            );
            assert!(
                self.cos_fast.err <= 2.0,
                "cos fast path {:?}",
                self.cos_fast
            );
            assert!(
                self.sin_big.err <= 0.6,
                "sin big arguments {:?}",
                self.sin_big
            );
            assert!(
                self.cos_big.err <= 0.6,
                "cos big arguments {:?}",
                self.cos_big
            );
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn sin_cos_accuracy_full_range() {
        let mut m = TrigMax::new();
        let mut rng = Rng(22);
        // Every binade [2^k, 2^(k+1)) from 2^-20 to f32::MAX: random
        // mantissas plus both ends.
        for k in -20..=127 {
            let b0 = ((k + 127) as u32) << 23;
            for _ in 0..3_000 {
                m.check(f32::from_bits(b0 | (rng.next_u32() >> 9)));
            }
            for d in 0..8 {
                m.check(f32::from_bits(b0 + d));
                m.check(f32::from_bits(b0 + 0x007F_FFFF - d));
            }
        }
        // Around the switch between the two paths.
        let t = TRIG_FAST_MAX.to_bits();
        for b in t - 2_000..=t + 2_000 {
            m.check(f32::from_bits(b));
        }
        // The hardest arguments (results near 0 must keep their relative
        // accuracy), their neighbours, and the hardest mantissa 16367173
        // at every scale.
        for &b in &TRIG_HARDEST {
            for b in b - 4..=b + 4 {
                m.check(f32::from_bits(b));
            }
        }
        for e in 1..=254u32 {
            m.check(f32::from_bits((e << 23) | (16_367_173 & 0x007F_FFFF)));
        }
        // Nearest floats to k pi/2 (and their neighbours) across the fast
        // range, and to random multiples beyond it.
        for i in 0..20_000u64 {
            let k = 1 + i * 8 + (rng.next_u64() % 8);
            let x0 = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
            for b in x0.to_bits() - 2..=x0.to_bits() + 2 {
                m.check(f32::from_bits(b));
            }
            let k = rng.next_u64() >> 1;
            m.check((k as f64 * std::f64::consts::FRAC_PI_2) as f32);
        }
        // Subnormals, the smallest normals and the largest values.
        for b in (1..0x0080_0000)
            .step_by(4_099)
            .chain(0x0080_0000..0x0080_0100)
        {
            m.check(f32::from_bits(b));
        }
        for b in 0x7F7F_FF00..=0x7F7F_FFFF {
            m.check(f32::from_bits(b));
        }
        m.assert_bounds();
    }

    #[test]
    fn sin_cos_special_values_full_range() {
        for x in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for f in [sin_f32, cos_f32, sin_f32_fast, cos_f32_fast] {
                assert!(f(x).is_nan());
            }
        }
        assert_eq!(sin_f32(-0.0).to_bits(), SIGN_MASK);
        assert_eq!(sin_f32(0.0).to_bits(), 0);
        assert_eq!(sin_f32(f32::from_bits(1)), f32::from_bits(1));
        assert_eq!(sin_f32(-f32::from_bits(1)), -f32::from_bits(1));
        assert_eq!(cos_f32(f32::from_bits(1)), 1.0);
        // Against values from 400-bit arithmetic: x = 16367173, f32::MAX, and
        // 16367173 * 2^72 ~ 7.73e28, the f32 closest to a multiple of pi/2
        // (1.6e-9 away).
        let x = 16_367_173.0f32;
        assert!(ulp_err(sin_f32(x), 0.079_146_807_342_318_85) <= 0.6);
        assert!(ulp_err(cos_f32(x), -0.996_862_970_968_185_7) <= 0.6);
        assert!(ulp_err(sin_f32(f32::MAX), -0.521_876_523_333_658_5) <= 0.6);
        assert!(ulp_err(cos_f32(f32::MAX), 0.853_021_039_830_304_2) <= 0.6);
        let hard = f32::from_bits(0x6F79_BE45);
        assert_eq!(hard, 16_367_173.0 * 2f32.powi(72));
        assert_eq!(sin_f32(hard), 1.0);
        assert!(ulp_err(cos_f32(hard), -1.614_769_798_247_621e-9) <= 0.6);
        // Results stay in [-1, 1] and the two paths agree on the threshold.
        for x in [f32::MAX, f32::MIN, TRIG_FAST_MAX, -TRIG_FAST_MAX] {
            assert!((-1.0..=1.0).contains(&sin_f32(x)));
            assert!((-1.0..=1.0).contains(&cos_f32(x)));
        }
        assert!(same(sin_f32(TRIG_FAST_MAX), sin_f32_fast(TRIG_FAST_MAX)));
        // sin(1e8) is no longer a clamped constant.
        assert!(ulp_err(sin_f32(1e8), (1e8f64).sin()) <= 0.6);
        assert!(ulp_err(sin_f32(1e9), (1e9f64).sin()) <= 0.6);
    }

    /// `floor(2/pi * 2^256)` recomputed with big integers (Machin's formula
    /// for pi, 352-bit fixed point) matches the table the reduction uses.
    #[test]
    fn two_over_pi_table_is_right() {
        // Little-endian u32 limbs, fixed point with F = 320 fraction bits.
        const L: usize = 12;
        fn add(a: &mut [u32], b: &[u32]) {
            let mut carry = 0u64;
            for (x, &y) in a.iter_mut().zip(b) {
                let s = *x as u64 + y as u64 + carry;
                *x = s as u32;
                carry = s >> 32;
            }
        }
        fn sub(a: &mut [u32], b: &[u32]) -> bool {
            let mut borrow = 0i64;
            for (x, &y) in a.iter_mut().zip(b) {
                let d = *x as i64 - y as i64 - borrow;
                *x = d as u32;
                borrow = (d < 0) as i64;
            }
            borrow != 0
        }
        fn div_small(a: &mut [u32], d: u64) {
            let mut rem = 0u64;
            for x in a.iter_mut().rev() {
                let cur = (rem << 32) | *x as u64;
                *x = (cur / d) as u32;
                rem = cur % d;
            }
        }
        // arctan(1/k) * 2^320 (truncation errors: a few units per term).
        fn atan_inv(k: u64) -> [u32; L] {
            let mut sum = [0u32; L];
            let mut neg = [0u32; L];
            let mut power = [0u32; L];
            power[10] = 1; // 2^320
            div_small(&mut power, k);
            let mut n = 0;
            while power.iter().any(|&w| w != 0) {
                let mut term = power;
                div_small(&mut term, 2 * n + 1);
                add(if n % 2 == 0 { &mut sum } else { &mut neg }, &term);
                div_small(&mut power, k * k);
                n += 1;
            }
            assert!(!sub(&mut sum, &neg));
            sum
        }
        // pi = 16 atan(1/5) - 4 atan(1/239).
        let (a5, a239) = (atan_inv(5), atan_inv(239));
        let mut pi = [0u32; L];
        for _ in 0..16 {
            add(&mut pi, &a5);
        }
        for _ in 0..4 {
            assert!(!sub(&mut pi, &a239));
        }
        assert_eq!(pi[10], 3);
        // t = the table's 256 bits as an integer, t pi 2^-320 vs 2^257.
        assert_eq!(TWO_OVER_PI_BITS[..2], [0, 0]);
        let t: Vec<u32> = TWO_OVER_PI_BITS[2..].iter().rev().copied().collect();
        let mut prod = [0u32; 20];
        for (i, &ti) in t.iter().enumerate() {
            let mut carry = 0u64;
            for (j, &pj) in pi.iter().enumerate() {
                let s = prod[i + j] as u64 + ti as u64 * pj as u64 + carry;
                prod[i + j] = s as u32;
                carry = s >> 32;
            }
            prod[i + L] = carry as u32;
        }
        // d = 2^(257 + 320) - t pi must lie in [0, pi 2^320) (t is the floor);
        // with margins far above the errors of the fixed-point pi.
        let mut d = [0u32; 20];
        d[18] = 2; // 2^577
        assert!(!sub(&mut d, &prod), "table exceeds 2/pi");
        assert!(
            d[11..].iter().all(|&w| w == 0) && d[10] < 3,
            "table below 2/pi by an ulp"
        );
        assert!(d[9..].iter().any(|&w| w != 0), "too close to call");
    }

    /// `kiln_rng_cos` of `kernels/kiln_random.cuh`, operation for operation.
    fn cuda_rng_cos(ax: f32) -> f32 {
        let two23 = 8_388_608.0f32;
        let t = ax.mul_add(FRAC_2_PI, two23);
        let n = t - two23;
        let q = t.to_bits().wrapping_add(1);
        let r = (-n).mul_add(PIO2_1, ax);
        let r = (-n).mul_add(PIO2_2, r);
        let r = (-n).mul_add(PIO2_3, r);
        let r2 = r * r;
        let ps = S7.mul_add(r2, S5).mul_add(r2, S3);
        let s = (r * r2).mul_add(ps, r);
        let pc = C8.mul_add(r2, C6).mul_add(r2, C4);
        let c = r2.mul_add(r2.mul_add(pc, -0.5), 1.0);
        let v = if q & 1 == 0 { s } else { c };
        f32::from_bits(v.to_bits() ^ ((q & 2) << 30))
    }

    /// `randn`'s Box–Muller cosine takes `TAU * u` for the 2^24 values
    /// `u = k 2^-24`: for every one of them `cos_f32` gives the same bits as
    /// the CUDA header's copy (so CPU and GPU normals stay identical).
    #[test]
    #[cfg_attr(miri, ignore)]
    fn cos_matches_cuda_random_header_on_box_muller_arguments() {
        for k in 0u32..1 << 24 {
            let x = core::f32::consts::TAU * (k as f32 * (1.0 / 16_777_216.0));
            let want = cuda_rng_cos(x);
            assert!(same(cos_f32(x), want), "cos_f32({x:e})");
            assert!(same(cos_f32_fast(x), want), "cos_f32_fast({x:e})");
        }
    }

    /// `sin_f32_run`/`cos_f32_run` give exactly the scalar results, with and
    /// without big arguments in the slice, in plain and in SIMD-compiled code.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn sin_cos_runs_match_scalar() {
        let mut rng = Rng(23);
        let mut xs: Vec<f32> = (0..20_000)
            .map(|i| match i % 4 {
                0 => rng.uniform(-10.0, 10.0),
                1 => rng.uniform(-3e5, 3e5),
                2 => f32::from_bits(rng.next_u32()),
                _ => rng.uniform(-1e3, 1e3),
            })
            .collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-45,
            -1e-45,
            f32::MAX,
            f32::MIN,
            TRIG_FAST_MAX,
            -TRIG_FAST_MAX,
            f32::from_bits(TRIG_FAST_MAX.to_bits() + 1),
        ]);
        let small: Vec<f32> = (0..5_000).map(|_| rng.uniform(-1e4, 1e4)).collect();

        fn check(run: impl Fn(&[f32], &mut [f32], bool), inputs: [&[f32]; 5], what: &str) {
            for input in inputs {
                for cos in [false, true] {
                    let mut out = vec![f32::NAN; input.len()];
                    run(input, &mut out, cos);
                    for (&x, &y) in input.iter().zip(&out) {
                        let want = if cos { cos_f32(x) } else { sin_f32(x) };
                        assert!(
                            same(y, want),
                            "{what} cos={cos} at {x:e}: {y:e} vs {want:e}"
                        );
                    }
                }
            }
        }
        let inputs = [&xs[..], &small[..], &xs[..1], &xs[..0], &xs[7..1_000]];
        let plain = |i: &[f32], o: &mut [f32], cos: bool| {
            if cos {
                cos_f32_run(i, o)
            } else {
                sin_f32_run(i, o)
            }
        };
        check(plain, inputs, "plain");

        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2,fma")]
            fn avx2(i: &[f32], o: &mut [f32], cos: bool) {
                if cos {
                    cos_f32_run(i, o)
                } else {
                    sin_f32_run(i, o)
                }
            }
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
            fn avx512(i: &[f32], o: &mut [f32], cos: bool) {
                if cos {
                    cos_f32_run(i, o)
                } else {
                    sin_f32_run(i, o)
                }
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: the required CPU features were detected.
                check(|i, o, c| unsafe { avx2(i, o, c) }, inputs, "avx2");
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") {
                // SAFETY: the required CPU features were detected.
                check(|i, o, c| unsafe { avx512(i, o, c) }, inputs, "avx512");
            }
        }
    }

    #[test]
    #[should_panic(expected = "slice lengths differ")]
    fn sin_run_rejects_mismatched_lengths() {
        sin_f32_run(&[1.0, 2.0], &mut [0.0]);
    }

    /// Every finite `f32 >= 0` against `f64` `sin`/`cos` (negative arguments
    /// give exactly the mirrored results: both paths work on `|x|` and apply
    /// the sign with a bit flip). About 3 minutes on two cores in release:
    /// `cargo test --release -- --ignored sin_cos_exhaustive`. Measured:
    /// fast path (`|x| <= 2^18`) max 1.541 ulp (sin, at 10687.949) and 1.540
    /// ulp (cos, at 257065.47); big arguments max 0.569 ulp (both).
    #[test]
    #[ignore]
    fn sin_cos_exhaustive() {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
        let results: Vec<TrigMax> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        let mut m = TrigMax::new();
                        let mut b = t;
                        while b < 0x7F80_0000 {
                            let x = f32::from_bits(b);
                            let (s, c) = (sin_f32(x), cos_f32(x));
                            let (es, ec) =
                                (ulp_err(s, (x as f64).sin()), ulp_err(c, (x as f64).cos()));
                            if x <= TRIG_FAST_MAX {
                                m.sin_fast.add(es, x);
                                m.cos_fast.add(ec, x);
                            } else {
                                m.sin_big.add(es, x);
                                m.cos_big.add(ec, x);
                            }
                            b += threads;
                        }
                        m
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut m = TrigMax::new();
        for r in results {
            m.sin_fast.add(r.sin_fast.err, r.sin_fast.at);
            m.cos_fast.add(r.cos_fast.err, r.cos_fast.at);
            m.sin_big.add(r.sin_big.err, r.sin_big.at);
            m.cos_big.add(r.cos_big.err, r.cos_big.at);
        }
        println!("{m:?}");
        m.assert_bounds();
    }

    // -- tanh ---------------------------------------------------------------

    #[test]
    #[cfg_attr(miri, ignore)]
    fn tanh_accuracy() {
        let m1 = sweep(-10.0, 10.0, 500_000, 500_000, 13, tanh_f32, f64::tanh);
        let m2 = sweep(-1.0, 1.0, 300_000, 300_000, 14, tanh_f32, f64::tanh);
        // Runs of consecutive floats around the arguments where the reduction
        // switches n (|x| = (k + 1/2) ln2 / 2), where the error peaks, plus
        // the worst cases found by an exhaustive search. Also monotone there.
        let mut m3 = Max::new();
        for k in 0..27 {
            let x0 = ((k as f64 + 0.5) * std::f64::consts::LN_2 / 2.0) as f32;
            let mut prev = tanh_f32(f32::from_bits(x0.to_bits() - 2001));
            for b in x0.to_bits() - 2000..=x0.to_bits() + 2000 {
                let x = f32::from_bits(b);
                let y = tanh_f32(x);
                assert!(y >= prev, "tanh not monotone at {x:e}");
                prev = y;
                m3.add(ulp_err(y, (x as f64).tanh()), x);
                m3.add(ulp_err(tanh_f32(-x), (-x as f64).tanh()), -x);
            }
        }
        for x in [0.513_796_2f32, 0.188_547_43, 0.173_291_92, 8.491_054] {
            m3.add(ulp_err(tanh_f32(x), (x as f64).tanh()), x);
        }
        for m in [m1, m2, m3] {
            assert!(m.err <= 2.0, "tanh max ulp {m:?}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn tanh_special_values() {
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(0.0).to_bits(), 0);
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh_f32(1e-20), 1e-20);
        assert_eq!(tanh_f32(-1e-40), -1e-40);
        for x in [9.0001f32, 10.0, 20.0, 1e10, f32::MAX] {
            assert_eq!(tanh_f32(x), 1.0);
            assert_eq!(tanh_f32(-x), -1.0);
        }
        // Monotone and bounded on a grid.
        let mut prev = -1.0f32;
        for i in 0..=200_000 {
            let x = -10.0 + i as f32 * 1e-4;
            let y = tanh_f32(x);
            assert!(y >= prev && y.abs() <= 1.0, "tanh({x}) = {y}");
            prev = y;
        }
    }

    // -- sigmoid ------------------------------------------------------------

    #[test]
    #[cfg_attr(miri, ignore)]
    fn sigmoid_accuracy() {
        let reference = |x: f64| 1.0 / (1.0 + (-x).exp());
        // Normal results.
        let m = sweep(
            -87.0,
            30.0,
            1_000_000,
            1_000_000,
            15,
            sigmoid_f32,
            reference,
        );
        assert!(m.err <= 2.0, "sigmoid max ulp {m:?}");
        // Subnormal tail.
        let m = sweep(-103.9, -87.4, 100_000, 100_000, 16, sigmoid_f32, reference);
        assert!(m.err <= 1.0, "sigmoid subnormal max ulp {m:?}");
    }

    #[test]
    fn sigmoid_special_values() {
        assert!(sigmoid_f32(f32::NAN).is_nan());
        assert_eq!(sigmoid_f32(f32::INFINITY), 1.0);
        assert_eq!(sigmoid_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid_f32(0.0), 0.5);
        assert_eq!(sigmoid_f32(-0.0), 0.5);
        assert_eq!(sigmoid_f32(100.0), 1.0);
        assert_eq!(sigmoid_f32(-200.0), 0.0);
        // Good relative accuracy deep in the negative tail.
        let y = sigmoid_f32(-80.0);
        let want = (-80.0f64).exp() / (1.0 + (-80.0f64).exp());
        assert!(((y as f64 - want) / want).abs() < 3e-7);
    }

    // -- erf / gelu ---------------------------------------------------------

    #[test]
    #[cfg_attr(miri, ignore)]
    fn erf_accuracy() {
        let m1 = sweep(-6.0, 6.0, 300_000, 300_000, 17, erf_f32, erf_ref);
        let m2 = sweep(-1.5, 1.5, 100_000, 100_000, 18, erf_f32, erf_ref);
        for m in [m1, m2] {
            assert!(m.err <= 1.5, "erf max ulp {m:?}");
        }
    }

    #[test]
    fn erf_special_values() {
        assert!(erf_f32(f32::NAN).is_nan());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf_f32(0.0).to_bits(), 0);
        assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erf_f32(5.0), 1.0);
        assert_eq!(erf_f32(-1e30), -1.0);
        assert_eq!(erf_f32(f32::MAX), 1.0);
        let tiny = 1e-30f32;
        assert!(ulp_err(erf_f32(tiny), erf_ref(tiny as f64)) <= 1.0);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn gelu_accuracy() {
        // Normal-range results: ulp error and relative error.
        let mut m = Max::new();
        let mut rel = Max::new();
        let mut check = |x: f32| {
            let got = gelu_f32(x);
            let want = gelu_ref(x as f64);
            if want.abs() >= f32::MIN_POSITIVE as f64 {
                m.add(ulp_err(got, want), x);
                rel.add(((got as f64 - want) / want).abs(), x);
            } else {
                // Subnormal results: within one subnormal ulp.
                assert!(ulp_err(got, want) <= 2.0, "gelu({x}) = {got}, want {want}");
            }
        };
        let mut rng = Rng(19);
        for i in 0..300_000 {
            check(-15.0 + 25.0 * i as f32 / 300_000.0);
            check(rng.uniform(-16.0, 10.0));
            check(rng.bits_upto(16.0));
        }
        assert!(m.err <= 5.0, "gelu max ulp {m:?}");
        assert!(rel.err <= 3.5e-7, "gelu max relative error {rel:?}");
    }

    #[test]
    fn gelu_special_values() {
        assert!(gelu_f32(f32::NAN).is_nan());
        assert_eq!(gelu_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(gelu_f32(0.0).to_bits(), 0);
        assert_eq!(gelu_f32(-0.0), 0.0);
        assert_eq!(gelu_f32(20.0), 20.0);
        assert_eq!(gelu_f32(1e30), 1e30);
        assert_eq!(gelu_f32(-20.0), 0.0);
        assert_eq!(gelu_f32(-1e30), 0.0);
        assert_eq!(gelu_f32(f32::MIN), 0.0);
    }

    // -- pow ----------------------------------------------------------------

    #[test]
    #[cfg_attr(miri, ignore)]
    fn pow_matches_ieee_conventions() {
        assert_eq!(pow_f32(2.0, 10.0), 1024.0);
        assert_eq!(pow_f32(-2.0, 3.0), -8.0);
        assert!(pow_f32(-2.0, 0.5).is_nan());
        assert_eq!(pow_f32(f32::NAN, 0.0), 1.0);
        assert_eq!(pow_f32(1.0, f32::NAN), 1.0);
        assert_eq!(pow_f32(0.0, -1.0), f32::INFINITY);
        assert_eq!(pow_f32(4.0, 0.5), 2.0);
        let mut rng = Rng(20);
        for _ in 0..100_000 {
            let x = rng.uniform(0.0, 100.0);
            let y = rng.uniform(-8.0, 8.0);
            let want = (x as f64).powf(y as f64);
            assert!(ulp_err(pow_f32(x, y), want) <= 1.0, "pow({x}, {y})");
        }
    }

    // -- f16 / bf16 rounding --------------------------------------------------

    /// Checks `round_f16` / `round_bf16` bit-exactly against the `half`
    /// crate on a batch of bit patterns (batched so that `half` can use its
    /// vectorized slice conversions).
    fn check_half_batch(bits: &[u32]) {
        use half::slice::HalfFloatSliceExt;
        let xs: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut h16 = vec![half::f16::ZERO; xs.len()];
        let mut hb16 = vec![half::bf16::ZERO; xs.len()];
        let mut want16 = vec![0f32; xs.len()];
        let mut wantb16 = vec![0f32; xs.len()];
        h16.convert_from_f32_slice(&xs);
        h16.convert_to_f32_slice(&mut want16);
        hb16.convert_from_f32_slice(&xs);
        hb16.convert_to_f32_slice(&mut wantb16);
        for i in 0..xs.len() {
            let x = xs[i];
            let (g16, gb16) = (round_f16(x), round_bf16(x));
            assert_eq!(
                g16.to_bits(),
                want16[i].to_bits(),
                "round_f16({x:e} = {:#010x}): {g16:e} vs {:e}",
                bits[i],
                want16[i]
            );
            assert_eq!(
                gb16.to_bits(),
                wantb16[i].to_bits(),
                "round_bf16({x:e} = {:#010x}): {gb16:e} vs {:e}",
                bits[i],
                wantb16[i]
            );
        }
        // The batched conversions agree with the scalar ones.
        for &x in xs.iter().step_by(61) {
            assert!(same(half::f16::from_f32(x).to_f32(), round_f16(x)));
            assert!(same(half::bf16::from_f32(x).to_f32(), round_bf16(x)));
        }
    }

    /// Runs `check_half_batch` over bit patterns `start, start + step, ...`
    /// up to `end` (inclusive bound `u32::MAX` allowed).
    fn check_half_range(start: u64, end: u64, step: u64) {
        let mut batch = Vec::with_capacity(1 << 16);
        let mut b = start;
        while b < end {
            batch.push(b as u32);
            if batch.len() == batch.capacity() {
                check_half_batch(&batch);
                batch.clear();
            }
            b += step;
        }
        check_half_batch(&batch);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn round_half_sampled() {
        // Every 97th bit pattern (all exponents, both signs, NaNs included).
        check_half_range(0, 1 << 32, 97);
        // Every f16 value and every midpoint between neighbours (including
        // the overflow threshold 65520 and the 2^-25 underflow tie), +-4 ulp,
        // both signs.
        let mut batch = Vec::new();
        for h in 0u16..0x7C00 {
            let lo = half::f16::from_bits(h).to_f32() as f64;
            let hi = if h == 0x7BFF {
                65536.0
            } else {
                half::f16::from_bits(h + 1).to_f32() as f64
            };
            for centre in [lo as f32, ((lo + hi) / 2.0) as f32] {
                let c = centre.to_bits();
                for bits in c.saturating_sub(4)..=c + 4 {
                    batch.push(bits);
                    batch.push(bits | SIGN_MASK);
                }
            }
        }
        // Every bf16 value and midpoint, +-4 ulp, both signs.
        for h in 0u32..=0x7F80 {
            for c in [h << 16, (h << 16) | 0x8000] {
                for bits in c.saturating_sub(4)..=c + 4 {
                    batch.push(bits);
                    batch.push(bits | SIGN_MASK);
                }
            }
        }
        batch.extend([
            0x7F80_0001,
            0x7FC0_0000,
            0x7FFF_FFFF,
            0xFFFF_FFFF,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            1,
        ]);
        check_half_batch(&batch);
    }

    #[test]
    fn round_half_special_values() {
        assert_eq!(round_f16(65519.0), 65504.0);
        assert_eq!(round_f16(65520.0), f32::INFINITY);
        assert_eq!(round_f16(-1e6), f32::NEG_INFINITY);
        assert_eq!(round_f16(f32::INFINITY), f32::INFINITY);
        assert!(round_f16(f32::NAN).is_nan());
        assert_eq!(round_f16(2f32.powi(-25)), 0.0);
        assert_eq!(round_f16(2f32.powi(-25) * 1.0001), 2f32.powi(-24));
        assert_eq!(round_f16(-1e-30).to_bits(), SIGN_MASK);
        assert_eq!(round_f16(1.0 + 2f32.powi(-11)), 1.0);
        assert_eq!(round_f16(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-9));
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
        assert_eq!(round_bf16(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert!(round_bf16(f32::NAN).is_nan());
        assert!(round_bf16(f32::from_bits(0x7F80_0001)).is_nan());
    }

    /// The kernels give bit-identical results when LLVM vectorizes them in an
    /// `avx2,fma` loop and when they are called one at a time.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(miri, ignore)]
    fn vectorized_loops_match_scalar() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        macro_rules! check {
            ($($f:ident),*) => {$({
                #[target_feature(enable = "avx2,fma")]
                unsafe fn vec_loop(a: &[f32], o: &mut [f32]) {
                    for (o, &x) in o.iter_mut().zip(a) {
                        *o = $f(x);
                    }
                }
                let mut rng = Rng(21);
                let mut xs: Vec<f32> = (0..65_536)
                    .map(|i| match i % 3 {
                        0 => rng.uniform(-20.0, 20.0),
                        1 => rng.uniform(-120.0, 120.0),
                        _ => f32::from_bits(rng.next_u32()),
                    })
                    .collect();
                xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-45, -1e-45]);
                let mut out = vec![0f32; xs.len()];
                // SAFETY: the required CPU features were detected above.
                unsafe { vec_loop(&xs, &mut out) };
                for (&x, &y) in xs.iter().zip(&out) {
                    assert!(same(y, $f(x)), "{}({x:e}): vector {y:e} vs scalar {:e}", stringify!($f), $f(x));
                }
            })*};
        }
        check!(
            exp_f32,
            log_f32,
            sin_f32,
            cos_f32,
            sin_f32_fast,
            cos_f32_fast,
            tanh_f32,
            sigmoid_f32,
            erf_f32,
            gelu_f32,
            round_f16,
            round_bf16,
            round_even_f32,
            floor_f32,
            ceil_f32,
            trunc_f32,
            exp2_f32,
            expm1_f32,
            log1p_f32,
            softplus_f32,
            silu_f32
        );
    }

    /// All 2^32 bit patterns (about a minute on two cores in release; run with
    /// `cargo test --release -- --ignored round_half_exhaustive`).
    #[test]
    #[ignore]
    fn round_half_exhaustive() {
        std::thread::scope(|s| {
            let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
            for t in 0..threads {
                s.spawn(move || {
                    check_half_range((t << 32) / threads, ((t + 1) << 32) / threads, 1)
                });
            }
        });
    }

    #[test]
    fn log2_accuracy_and_special_values() {
        for k in -149..128 {
            let x = (k as f64).exp2() as f32;
            assert_eq!(log2_f32(x), k as f32, "log2(2^{k})");
        }
        let mut worst = 0.0f64;
        let mut s = 0x1234_5678u32;
        for _ in 0..2_000_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(s & 0x7F7F_FFFF);
            if x == 0.0 {
                continue;
            }
            let want = (x as f64).log2();
            worst = worst.max(ulp_err(log2_f32(x), want));
        }
        for i in 0..200_000 {
            let x = 0.5 + i as f32 * (1.5 / 200_000.0);
            worst = worst.max(ulp_err(log2_f32(x), (x as f64).log2()));
        }
        eprintln!("log2 max error {worst:.3} ulp");
        assert!(worst <= 1.5, "log2 max error {worst} ulp");
        assert_eq!(log2_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(log2_f32(-0.0), f32::NEG_INFINITY);
        assert!(log2_f32(-1.0).is_nan() && log2_f32(f32::NAN).is_nan());
        assert_eq!(log2_f32(f32::INFINITY), f32::INFINITY);
    }

    // -- rounding to integers -----------------------------------------------

    /// `round_even_f32`, `floor_f32`, `ceil_f32` and `trunc_f32` agree bit for bit with
    /// `std` on `bits` (NaN payloads aside).
    fn check_rounding(bits: impl Iterator<Item = u32>) {
        for b in bits {
            let x = f32::from_bits(b);
            for (name, got, want) in [
                ("round", round_even_f32(x), x.round_ties_even()),
                ("floor", floor_f32(x), x.floor()),
                ("ceil", ceil_f32(x), x.ceil()),
                ("trunc", trunc_f32(x), x.trunc()),
            ] {
                assert!(same(got, want), "{name}({x:e}) = {got:e}, want {want:e}");
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn rounding_to_integers_is_exact() {
        let mut rng = Rng(31);
        check_rounding((0..2_000_000).map(|_| rng.next_u32()));
        // Every value near the small integers and halves, both signs.
        let near = (-64i32..=64).flat_map(|k| {
            let c = (k as f32 * 0.5).to_bits();
            (0..64u32).flat_map(move |d| [c.wrapping_add(d), c.wrapping_sub(d)])
        });
        check_rounding(near);
        let specials = [
            0.0f32,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            0.49999997,
            -0.49999997,
        ];
        check_rounding(specials.iter().map(|x| x.to_bits()));
        let edges = [
            TWO_23,
            -TWO_23,
            TWO_23 - 0.5,
            1e30,
            f32::MAX,
            f32::MIN,
            1e-45,
        ];
        check_rounding(edges.iter().map(|x| x.to_bits()));
        for x in [f32::INFINITY, f32::NEG_INFINITY] {
            check_rounding(std::iter::once(x.to_bits()));
        }
        for f in [round_even_f32, floor_f32, ceil_f32, trunc_f32] {
            assert!(f(f32::NAN).is_nan());
        }
        assert_eq!(round_even_f32(-0.3).to_bits(), (-0.0f32).to_bits());
        assert_eq!(ceil_f32(-0.7).to_bits(), (-0.0f32).to_bits());
        assert_eq!(floor_f32(-0.5), -1.0);
    }

    /// All 2^32 bit patterns (run with `cargo test --release -- --ignored rounding_exhaustive`).
    #[test]
    #[ignore]
    fn rounding_exhaustive() {
        std::thread::scope(|s| {
            let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
            for t in 0..threads {
                s.spawn(move || {
                    let (lo, hi) = ((t << 32) / threads, ((t + 1) << 32) / threads);
                    check_rounding((lo..hi).map(|b| b as u32));
                });
            }
        });
    }

    // -- exp2 / expm1 / log1p -----------------------------------------------

    #[test]
    #[cfg_attr(miri, ignore)]
    fn exp2_accuracy_and_special_values() {
        let m = sweep(
            -125.9,
            127.99,
            1_000_000,
            1_000_000,
            32,
            exp2_f32,
            f64::exp2,
        );
        eprintln!("exp2 max {m:?}");
        assert!(m.err <= 1.5, "exp2 max ulp {m:?}");
        let m = sweep(-2.0, 2.0, 1_000_000, 200_000, 33, exp2_f32, f64::exp2);
        eprintln!("exp2 near 0 max {m:?}");
        assert!(m.err <= 1.5, "exp2 max ulp near 0 {m:?}");
        let m = sweep(-149.9, -126.0, 100_000, 100_000, 34, exp2_f32, f64::exp2);
        eprintln!("exp2 subnormal max {m:?}");
        assert!(m.err <= 1.0, "exp2 subnormal max ulp {m:?}");
        for k in -149..128 {
            assert_eq!(exp2_f32(k as f32) as f64, (k as f64).exp2(), "exp2({k})");
        }
        assert_eq!(exp2_f32(128.0), f32::INFINITY);
        assert_eq!(exp2_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp2_f32(f32::MAX), f32::INFINITY);
        assert_eq!(exp2_f32(-150.0), 0.0);
        assert_eq!(exp2_f32(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp2_f32(f32::MIN), 0.0);
        assert!(exp2_f32(f32::NAN).is_nan());
        assert_eq!(exp2_f32(-0.0), 1.0);
        assert_eq!(exp2_f32(1e-30), 1.0);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn expm1_accuracy_and_special_values() {
        let m1 = sweep(-1.0, 1.0, 1_000_000, 1_000_000, 35, expm1_f32, f64::exp_m1);
        let m2 = sweep(
            -20.0,
            88.72,
            1_000_000,
            1_000_000,
            36,
            expm1_f32,
            f64::exp_m1,
        );
        let m3 = sweep(-1e-3, 1e-3, 100_000, 1_000_000, 37, expm1_f32, f64::exp_m1);
        // Where 2^n p and 2^n - 1 cancel most (n = 1).
        let m4 = sweep(0.34, 0.7, 4_000_000, 0, 38, expm1_f32, f64::exp_m1);
        for m in [m1, m2, m3, m4] {
            eprintln!("expm1 max {m:?}");
            assert!(m.err <= 1.5, "expm1 max ulp {m:?}");
        }
        assert_eq!(expm1_f32(0.0).to_bits(), 0);
        assert_eq!(expm1_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(expm1_f32(1e-45), 1e-45);
        assert_eq!(expm1_f32(-1e-40), -1e-40);
        assert_eq!(expm1_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(expm1_f32(-20.0), -1.0);
        assert_eq!(expm1_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(expm1_f32(88.73), f32::INFINITY);
        assert!(expm1_f32(88.72).is_finite());
        assert!(expm1_f32(f32::NAN).is_nan());
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn log1p_accuracy_and_special_values() {
        let m1 = sweep(
            -0.999_999_94,
            1.0,
            1_000_000,
            1_000_000,
            38,
            log1p_f32,
            f64::ln_1p,
        );
        let m2 = sweep(-1e-3, 1e-3, 100_000, 1_000_000, 39, log1p_f32, f64::ln_1p);
        let mut m3 = Max::new();
        let mut rng = Rng(40);
        for _ in 0..1_000_000 {
            // Every positive finite float, and every x in (-1, 0).
            let x = f32::from_bits(rng.next_u32() % 0x7F80_0000);
            m3.add(ulp_err(log1p_f32(x), (x as f64).ln_1p()), x);
            let y = -f32::from_bits(rng.next_u32() % 0x3F80_0000);
            m3.add(ulp_err(log1p_f32(y), (y as f64).ln_1p()), y);
        }
        for m in [m1, m2, m3] {
            eprintln!("log1p max {m:?}");
            assert!(m.err <= 1.0, "log1p max ulp {m:?}");
        }
        assert_eq!(log1p_f32(0.0).to_bits(), 0);
        assert_eq!(log1p_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(log1p_f32(1e-45), 1e-45);
        assert_eq!(log1p_f32(-1.0), f32::NEG_INFINITY);
        assert!(log1p_f32(-1.000_000_1).is_nan());
        assert!(log1p_f32(f32::NEG_INFINITY).is_nan());
        assert!(log1p_f32(f32::NAN).is_nan());
        assert_eq!(log1p_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(log1p_f32(f32::MAX), (f32::MAX as f64).ln_1p() as f32);
    }

    // -- softplus / silu ----------------------------------------------------

    #[test]
    #[cfg_attr(miri, ignore)]
    fn softplus_accuracy_and_special_values() {
        let reference = |x: f64| if x > 20.0 { x } else { x.exp().ln_1p() };
        let m1 = sweep(
            -87.0,
            25.0,
            1_000_000,
            1_000_000,
            41,
            softplus_f32,
            reference,
        );
        let m2 = sweep(-3.0, 3.0, 1_000_000, 200_000, 42, softplus_f32, reference);
        for m in [m1, m2] {
            eprintln!("softplus max {m:?}");
            assert!(m.err <= 2.0, "softplus max ulp {m:?}");
        }
        let m = sweep(-103.9, -87.4, 100_000, 100_000, 43, softplus_f32, reference);
        eprintln!("softplus subnormal max {m:?}");
        assert!(m.err <= 1.0, "softplus subnormal max ulp {m:?}");
        assert_eq!(softplus_f32(20.5), 20.5);
        assert_eq!(softplus_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(softplus_f32(f32::NEG_INFINITY).to_bits(), 0);
        assert!(softplus_f32(f32::NAN).is_nan());
        assert_eq!(softplus_f32(0.0), core::f32::consts::LN_2);
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn silu_accuracy_and_special_values() {
        let reference = |x: f64| x / (1.0 + (-x).exp());
        let m1 = sweep(-80.0, 80.0, 1_000_000, 1_000_000, 44, silu_f32, reference);
        let m2 = sweep(-4.0, 4.0, 1_000_000, 200_000, 45, silu_f32, reference);
        for m in [m1, m2] {
            eprintln!("silu max {m:?}");
            assert!(m.err <= 1.5, "silu max ulp {m:?}");
        }
        assert_eq!(silu_f32(f32::INFINITY), f32::INFINITY);
        assert!(silu_f32(f32::NEG_INFINITY).is_nan());
        assert!(silu_f32(f32::NAN).is_nan());
        assert_eq!(silu_f32(0.0).to_bits(), 0);
        assert_eq!(silu_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(silu_f32(1e-30), 5e-31);
    }
}
