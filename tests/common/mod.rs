//! Helpers shared by the fuzz tests (`tests/common/` is not a test target of its own).

/// One step of SplitMix64 over `state`: the fuzzers' random numbers, so that a seed names
/// a program on every machine.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded generator over [`splitmix64`]. Each test crate that includes this module uses
/// a part of it, hence the `dead_code` allowances.
#[allow(dead_code)]
pub struct Rng(pub u64);

#[allow(dead_code)]
impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
