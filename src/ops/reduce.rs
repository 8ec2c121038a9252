//! Reductions.

/// Reductions. Sum and prod of integers run in i64 (the API casts); arg-reductions give i64
/// indices into the reduced axes (row-major over those axes), first occurrence on ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// The sum (`sum`).
    Sum,
    /// The product (`prod`).
    Prod,
    /// The largest value, NaN if any is (PyTorch's `amax`).
    Max,
    /// The smallest value, NaN if any is (PyTorch's `amin`).
    Min,
    /// The index of the largest value (`argmax`).
    ArgMax,
    /// The index of the smallest value (`argmin`).
    ArgMin,
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: &'static [ReduceOp] = &[
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
    ];

    /// Lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }

    /// True for argmax/argmin.
    pub const fn is_arg(self) -> bool {
        matches!(self, ReduceOp::ArgMax | ReduceOp::ArgMin)
    }

    /// True when the op has an identity, so reducing zero elements is defined.
    pub const fn has_identity(self) -> bool {
        matches!(self, ReduceOp::Sum | ReduceOp::Prod)
    }
}
