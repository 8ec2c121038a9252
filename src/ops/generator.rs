//! Generators: leaves computed from the element's row-major index, so they cost no memory
//! until a kernel reads them. A generator's numbers (the fill value, arange's start and
//! step, a seed) are *parameters*: they are not part of a graph's structure, so a plan made
//! for one value runs for any other (a training loop's learning rate or dropout seed does
//! not force re-planning).

use crate::dtype::Scalar;
use std::fmt;

/// A generator with its parameter values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Generator {
    /// Every element is the value.
    Full(Scalar),
    /// `start + i·step` (1-D).
    Arange {
        /// The first value.
        start: Scalar,
        /// The difference between consecutive values.
        step: Scalar,
    },
    /// Uniform in `[0, 1)`, a counter-based hash of `(seed, i)`.
    Rand {
        /// The seed of the random stream.
        seed: u64,
    },
    /// Standard normal, Box–Muller over two hashes of `(seed, i)`.
    Randn {
        /// The seed of the random stream.
        seed: u64,
    },
}

/// What a generator computes, without its parameter values (the structural part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GenKind {
    /// A constant ([`Generator::Full`]).
    Full,
    /// An arithmetic sequence ([`Generator::Arange`]).
    Arange,
    /// Uniform random numbers ([`Generator::Rand`]).
    Rand,
    /// Standard normal random numbers ([`Generator::Randn`]).
    Randn,
}

impl GenKind {
    /// Lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            GenKind::Full => "full",
            GenKind::Arange => "arange",
            GenKind::Rand => "rand",
            GenKind::Randn => "randn",
        }
    }

    /// How many parameters the generator takes.
    pub const fn param_count(self) -> usize {
        match self {
            GenKind::Arange => 2,
            _ => 1,
        }
    }
}

impl Generator {
    /// The structural part.
    pub const fn kind(&self) -> GenKind {
        match self {
            Generator::Full(_) => GenKind::Full,
            Generator::Arange { .. } => GenKind::Arange,
            Generator::Rand { .. } => GenKind::Rand,
            Generator::Randn { .. } => GenKind::Randn,
        }
    }

    /// Lowercase name.
    pub const fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The parameter values, `param_count()` of them (seeds as `Scalar::Int` bit patterns).
    pub fn params(&self) -> [Scalar; 2] {
        let zero = Scalar::Int(0);
        match *self {
            Generator::Full(v) => [v, zero],
            Generator::Arange { start, step } => [start, step],
            Generator::Rand { seed } | Generator::Randn { seed } => {
                [Scalar::Int(seed as i64), zero]
            }
        }
    }
}

/// A seed stored as a parameter.
pub fn seed_of(p: Scalar) -> u64 {
    p.to_i64() as u64
}

impl fmt::Display for Generator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Generator::Full(v) => write!(f, "full({v})"),
            Generator::Arange { start, step } => write!(f, "arange(start={start}, step={step})"),
            Generator::Rand { seed } => write!(f, "rand(seed={seed})"),
            Generator::Randn { seed } => write!(f, "randn(seed={seed})"),
        }
    }
}
