//! Seeded parameter initializers. Each returns a realized f32 leaf that requires grad, so
//! it can be updated in place by an optimizer; the same seed gives the same values on
//! every backend.

use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// A seed for the part `label` of something seeded with `seed`: a 64-bit mix of both, so
/// that the parts of one module, and modules built from nearby seeds (`Block::new(.., i)`
/// in a loop) or from the same seed (`Embedding` and `Linear` both from 0), draw unrelated
/// values. (Adding small offsets instead made layer `i + 1`'s weight equal layer `i`'s
/// bias: each seed is one stream of values.) kiln's modules seed each parameter and
/// dropout mask this way, labelled with the field's name; a module of yours can too.
///
/// ```
/// use kiln::nn::init::derive_seed;
/// assert_ne!(derive_seed(0, "weight"), derive_seed(0, "bias"));
/// assert_ne!(derive_seed(0, "weight"), derive_seed(1, "weight"));
/// assert_eq!(derive_seed(7, "qkv"), derive_seed(7, "qkv"));
/// ```
pub fn derive_seed(seed: u64, label: &str) -> u64 {
    // FNV-1a of the label, then a splitmix64 finalizer over it and the seed.
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in label.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
    }
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(h)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn leaf(t: Tensor) -> Result<Tensor> {
    let t = crate::autograd::no_grad(|| t.try_cast(DType::F32))?;
    t.realize()?;
    t.try_requires_grad_(true)?;
    Ok(t)
}

/// Uniform in `[low, high)`.
pub fn uniform(shape: &[usize], low: f64, high: f64, seed: u64) -> Result<Tensor> {
    let u = crate::autograd::no_grad(|| {
        Tensor::try_rand(shape, seed, DType::F32)?
            .try_mul(high - low)?
            .try_add(low)
    })?;
    leaf(u)
}

/// Normal with the given mean and standard deviation.
pub fn normal(shape: &[usize], mean: f64, std: f64, seed: u64) -> Result<Tensor> {
    let n = crate::autograd::no_grad(|| {
        Tensor::try_randn(shape, seed, DType::F32)?
            .try_mul(std)?
            .try_add(mean)
    })?;
    leaf(n)
}

/// Every element `value`.
pub fn constant(shape: &[usize], value: f64) -> Result<Tensor> {
    leaf(Tensor::try_full_on(
        shape,
        value,
        DType::F32,
        crate::Device::Cpu,
    )?)
}

/// Kaiming (He) uniform for a layer with `fan_in` inputs and ReLU-like activations:
/// `U(-b, b)` with `b = sqrt(6 / fan_in)`.
pub fn kaiming_uniform(shape: &[usize], fan_in: usize, seed: u64) -> Result<Tensor> {
    let b = (6.0 / fan_in.max(1) as f64).sqrt();
    uniform(shape, -b, b, seed)
}

/// Kaiming (He) normal: `N(0, 2 / fan_in)`.
pub fn kaiming_normal(shape: &[usize], fan_in: usize, seed: u64) -> Result<Tensor> {
    normal(shape, 0.0, (2.0 / fan_in.max(1) as f64).sqrt(), seed)
}

/// Xavier (Glorot) uniform: `U(-b, b)` with `b = sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform(shape: &[usize], fan_in: usize, fan_out: usize, seed: u64) -> Result<Tensor> {
    let b = (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    uniform(shape, -b, b, seed)
}

/// Xavier (Glorot) normal: `N(0, 2 / (fan_in + fan_out))`.
pub fn xavier_normal(shape: &[usize], fan_in: usize, fan_out: usize, seed: u64) -> Result<Tensor> {
    normal(
        shape,
        0.0,
        (2.0 / (fan_in + fan_out).max(1) as f64).sqrt(),
        seed,
    )
}
