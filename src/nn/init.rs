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

/// The fans PyTorch's initializers read off a weight's shape (its
/// `_calculate_fan_in_and_fan_out`): `fan_in = shape[1]·r` and `fan_out = shape[0]·r`,
/// with `r` the product of the dimensions after the second (a convolution's receptive
/// field; 1 for a linear layer's `[out, in]`). A shape of fewer than two dimensions has
/// no fans, as in PyTorch: refused.
///
/// ```
/// use kiln::nn::init::{fans, kaiming_uniform};
/// assert_eq!(fans(&[64, 128]).unwrap(), (128, 64));
/// assert_eq!(fans(&[16, 3, 5, 5]).unwrap(), (75, 400));
/// assert!(fans(&[10]).is_err());
/// let shape = [64, 128];
/// let (fan_in, _) = fans(&shape).unwrap();
/// let w = kaiming_uniform(&shape, fan_in, 0).unwrap();
/// assert_eq!(w.shape(), &shape);
/// ```
pub fn fans(shape: &[usize]) -> Result<(usize, usize)> {
    if shape.len() < 2 {
        return Err(crate::error::KilnError::InvalidArgument {
            op: "fans",
            shape: shape.to_vec(),
            reason: "fan in and fan out need a shape of at least two dimensions".into(),
        });
    }
    let r: usize = shape[2..].iter().product();
    Ok((shape[1] * r, shape[0] * r))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// PyTorch's rule: dimension 1 is the inputs, dimension 0 the outputs, the rest a
    /// receptive field multiplying both (values from `nn.init._calculate_fan_in_and_fan_out`).
    #[test]
    fn fans_follow_pytorch() {
        assert_eq!(fans(&[3, 4]).unwrap(), (4, 3));
        assert_eq!(fans(&[3, 4, 5, 6]).unwrap(), (120, 90));
        assert_eq!(fans(&[8, 2, 7]).unwrap(), (14, 56));
        assert_eq!(fans(&[5, 0]).unwrap(), (0, 5));
        for bad in [&[][..], &[7][..]] {
            let e = fans(bad).unwrap_err().to_string();
            assert!(e.contains("fans") && e.contains("two dimensions"), "{e}");
        }
    }
}
