//! Counter-based random numbers: every sample is a pure function of `(seed, element index)`,
//! so `rand`/`randn` are lazy, fusable and reproducible. `rand` of every dtype and `randn`
//! of f32/f16/bf16 are bit-identical on every backend (CUDA's `kernels/kiln_random.cuh`
//! repeats the CPU's `log`/`cos` polynomials operation for operation); f64 `randn` uses the
//! platform's `log`/`cos` and may differ between backends in the last bit.

use std::sync::atomic::{AtomicU64, Ordering};

/// The state of the process-wide seed sequence that unseeded `rand`/`randn` draw from.
static SEED_STATE: AtomicU64 = AtomicU64::new(0);

/// Restarts the seed sequence that [`Tensor::rand`](crate::Tensor::rand) and
/// [`Tensor::randn`](crate::Tensor::randn) draw from (PyTorch's `torch.manual_seed`): after
/// the same `manual_seed`, the same calls give the same samples.
///
/// ```
/// use kiln::{Tensor, manual_seed};
/// manual_seed(7);
/// let a = Tensor::rand([4]).to_vec::<f32>().unwrap();
/// manual_seed(7);
/// assert_eq!(Tensor::rand([4]).to_vec::<f32>().unwrap(), a);
/// ```
pub fn manual_seed(seed: u64) {
    SEED_STATE.store(seed, Ordering::Relaxed);
}

/// The next seed of the sequence (a Weyl step hashed, so consecutive seeds are unrelated).
pub(crate) fn next_seed() -> u64 {
    let s = SEED_STATE.fetch_add(1, Ordering::Relaxed);
    bits(0x6B69_6C6E, s)
}

/// 64 well-mixed bits for `(seed, index)` (the SplitMix64 finalizer over a Weyl sequence).
#[inline(always)]
pub fn bits(seed: u64, index: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0xD1B5_4A32_D192_ED03)
        .wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in `[0, 1)` with 24 random bits.
#[inline(always)]
pub fn uniform_f32(seed: u64, index: u64) -> f32 {
    (bits(seed, index) >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// Uniform in `[0, 1)` with 53 random bits.
#[inline(always)]
pub fn uniform_f64(seed: u64, index: u64) -> f64 {
    (bits(seed, index) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// Standard normal (Box–Muller over hashes of `2·index` and `2·index + 1`), f32 arithmetic.
#[inline(always)]
pub fn normal_f32(seed: u64, index: u64) -> f32 {
    use crate::math::f32::{cos_f32_fast, log_f32};
    let u1 = ((bits(seed, index.wrapping_mul(2)) >> 40) + 1) as f32 * (1.0 / 16_777_216.0);
    let u2 = uniform_f32(seed, index.wrapping_mul(2).wrapping_add(1));
    (-2.0 * log_f32(u1)).sqrt() * cos_f32_fast(std::f32::consts::TAU * u2)
}

/// Standard normal in f64 arithmetic.
#[inline(always)]
pub fn normal_f64(seed: u64, index: u64) -> f64 {
    let u1 =
        ((bits(seed, index.wrapping_mul(2)) >> 11) + 1) as f64 * (1.0 / 9_007_199_254_740_992.0);
    let u2 = uniform_f64(seed, index.wrapping_mul(2).wrapping_add(1));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_moments_are_right() {
        let n = 200_000u64;
        let (mut s, mut s2) = (0.0f64, 0.0f64);
        for i in 0..n {
            let u = uniform_f32(7, i) as f64;
            assert!((0.0..1.0).contains(&u));
            s += u;
            s2 += u * u;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.002, "{var}");
    }

    #[test]
    fn normal_moments_are_right_and_seeds_differ() {
        let n = 200_000u64;
        let (mut s, mut s2) = (0.0f64, 0.0f64);
        for i in 0..n {
            let z = normal_f32(1, i) as f64;
            assert!(z.is_finite());
            s += z;
            s2 += z * z;
        }
        assert!((s / n as f64).abs() < 0.01);
        assert!((s2 / n as f64 - 1.0).abs() < 0.02);
        assert_ne!(uniform_f32(1, 5), uniform_f32(2, 5));
    }
}
