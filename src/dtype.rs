//! Element types, scalars and type promotion (PyTorch's rules).

use half::{bf16, f16};
use std::fmt;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Boolean, one byte per element (0 or 1).
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer (the dtype of indices).
    I64,
    /// IEEE 754 half precision (computed in f32).
    F16,
    /// bfloat16: f32's exponent range with an 8-bit significand (computed in f32).
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
}

/// Every dtype, in promotion-lattice order.
pub const ALL_DTYPES: [DType; 8] = [
    DType::Bool,
    DType::U8,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

impl DType {
    /// Bytes per element in a buffer.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Floating-point dtypes.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Integer dtypes (not bool).
    pub const fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I32 | DType::I64)
    }

    /// The 16-bit float types, computed in f32 and rounded after every op.
    pub const fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// Short lowercase name (`f32`, `bf16`, `bool`...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// The dtype floating-point results get when the inputs are integers or bools.
    pub const fn default_float() -> DType {
        DType::F32
    }

    fn category(self) -> u8 {
        if self == DType::Bool {
            0
        } else if self.is_int() {
            1
        } else {
            2
        }
    }

    /// The dtype two tensors promote to, as `torch.promote_types` does.
    ///
    /// ```
    /// use kiln::DType;
    /// assert_eq!(DType::promote(DType::I32, DType::F16), DType::F16);
    /// assert_eq!(DType::promote(DType::F16, DType::BF16), DType::F32);
    /// assert_eq!(DType::promote(DType::U8, DType::I32), DType::I32);
    /// ```
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a.category(), b.category()) {
            (0, _) => b,
            (_, 0) => a,
            (1, 1) => a.max(b),
            (1, 2) => b,
            (2, 1) => a,
            _ => match (a, b) {
                (F16, BF16) | (BF16, F16) => F32,
                _ => a.max(b),
            },
        }
    }

    /// The dtype of `tensor op scalar`: a scalar only lifts the category (bool → int → float),
    /// as PyTorch treats Python numbers.
    ///
    /// ```
    /// use kiln::{DType, Scalar};
    /// assert_eq!(DType::promote_scalar(DType::F16, Scalar::Float(2.0)), DType::F16);
    /// assert_eq!(DType::promote_scalar(DType::I32, Scalar::Float(0.5)), DType::F32);
    /// assert_eq!(DType::promote_scalar(DType::Bool, Scalar::Int(3)), DType::I64);
    /// ```
    pub fn promote_scalar(tensor: DType, scalar: Scalar) -> DType {
        let scat = match scalar {
            Scalar::Bool(_) => 0,
            Scalar::Int(_) => 1,
            Scalar::Float(_) => 2,
        };
        if tensor.category() >= scat {
            tensor
        } else if scat == 2 {
            DType::default_float()
        } else {
            DType::I64
        }
    }

    /// The dtype arithmetic on this dtype is carried out in (half types compute in f32).
    pub const fn compute(self) -> ComputeType {
        match self {
            DType::Bool | DType::U8 => ComputeType::U8,
            DType::I32 => ComputeType::I32,
            DType::I64 => ComputeType::I64,
            DType::F16 | DType::BF16 | DType::F32 => ComputeType::F32,
            DType::F64 => ComputeType::F64,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The register type a backend computes a dtype in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ComputeType {
    /// `u8`: bool and u8.
    U8,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `f32`: f32, f16 and bf16.
    F32,
    /// `f64`.
    F64,
}

/// A single number, as given by the user (a Python-like scalar: bool, integer or float).
///
/// Equality and hashing are bit-exact (`NaN == NaN`, `0.0 != -0.0`), because planning compares
/// constants structurally.
#[derive(Debug, Clone, Copy)]
pub enum Scalar {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
}

impl Scalar {
    /// The value as f64 (bools are 0/1).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }

    /// The value as i64 (floats truncate toward zero, saturating; NaN becomes 0).
    pub fn to_i64(self) -> i64 {
        match self {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(f) => f as i64,
        }
    }

    /// The value converted to `dtype`, with that dtype's rounding and wrapping applied, so
    /// that `Scalar::cast(v, d)` holds exactly the value a `d` buffer would store. Half types
    /// round through f32 (as PyTorch converts), on every backend.
    pub fn cast(self, dtype: DType) -> Scalar {
        match dtype {
            DType::Bool => Scalar::Bool(match self {
                Scalar::Bool(b) => b,
                Scalar::Int(i) => i != 0,
                Scalar::Float(f) => f != 0.0,
            }),
            DType::U8 => Scalar::Int(match self {
                Scalar::Float(f) => f as u8 as i64,
                other => other.to_i64() as u8 as i64,
            }),
            DType::I32 => Scalar::Int(match self {
                Scalar::Float(f) => f as i32 as i64,
                other => other.to_i64() as i32 as i64,
            }),
            DType::I64 => Scalar::Int(self.to_i64()),
            DType::F16 => Scalar::Float(f16::from_f32(self.to_f64() as f32).to_f64()),
            DType::BF16 => Scalar::Float(bf16::from_f32(self.to_f64() as f32).to_f64()),
            DType::F32 => Scalar::Float(self.to_f64() as f32 as f64),
            DType::F64 => Scalar::Float(self.to_f64()),
        }
    }

    /// Decodes one element of `dtype` from its little-endian buffer bytes.
    pub fn from_le_bytes(dtype: DType, b: &[u8]) -> Scalar {
        match dtype {
            DType::Bool => Scalar::Bool(b[0] != 0),
            DType::U8 => Scalar::Int(b[0] as i64),
            DType::I32 => Scalar::Int(i32::read_bytes(b) as i64),
            DType::I64 => Scalar::Int(i64::read_bytes(b)),
            DType::F16 => Scalar::Float(f16::read_bytes(b).to_f64()),
            DType::BF16 => Scalar::Float(bf16::read_bytes(b).to_f64()),
            DType::F32 => Scalar::Float(f32::read_bytes(b) as f64),
            DType::F64 => Scalar::Float(f64::read_bytes(b)),
        }
    }

    /// The natural dtype of this scalar on its own (bool, i64, f32).
    pub fn natural_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::default_float(),
        }
    }

    /// A bit-exact key for hashing and equality (planning compares constants structurally).
    pub fn key(self) -> (u8, u64) {
        match self {
            Scalar::Bool(b) => (0, b as u64),
            Scalar::Int(i) => (1, i as u64),
            Scalar::Float(f) => (2, f.to_bits()),
        }
    }
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Scalar {}
impl std::hash::Hash for Scalar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x:?}"),
        }
    }
}

macro_rules! scalar_from {
    ($($t:ty => $variant:ident as $as:ty),* $(,)?) => {
        $(impl From<$t> for Scalar {
            fn from(v: $t) -> Self {
                Scalar::$variant(v as $as)
            }
        })*
    };
}
scalar_from!(f32 => Float as f64, f64 => Float as f64, i32 => Int as i64, i64 => Int as i64,
    u8 => Int as i64, usize => Int as i64, u32 => Int as i64, isize => Int as i64);

impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}
impl From<f16> for Scalar {
    fn from(v: f16) -> Self {
        Scalar::Float(v.to_f64())
    }
}
impl From<bf16> for Scalar {
    fn from(v: bf16) -> Self {
        Scalar::Float(v.to_f64())
    }
}

/// Keeps [`Element`] closed to kiln's own element types.
mod sealed {
    /// Implemented for exactly the types that implement [`super::Element`].
    pub trait Sealed {}
}

/// A Rust type that can be stored in a tensor and read back (`from_vec`, `to_vec`, `item`).
///
/// Implemented for kiln's element types only (sealed): buffers adopt a `Vec<T>` as it is
/// and `as_slice::<T>` hands its bytes out as `T`s, which is sound only where `T`'s size,
/// alignment and valid bit patterns are those of [`Element::DTYPE`].
pub trait Element:
    sealed::Sealed + Copy + Send + Sync + fmt::Debug + bytemuck::NoUninit + 'static
{
    /// The dtype a buffer of this type has.
    const DTYPE: DType;
    /// Writes the value's bytes (little-endian, the buffer layout) to `out`.
    fn write_bytes(self, out: &mut [u8]);
    /// Reads a value from its buffer bytes.
    fn read_bytes(bytes: &[u8]) -> Self;
    /// The value as a scalar.
    fn to_scalar(self) -> Scalar;
    /// The value a scalar has in this type (cast semantics).
    fn from_scalar(s: Scalar) -> Self;
}

macro_rules! element_num {
    ($($t:ty => $dt:ident, $from:expr);* $(;)?) => {
        $(impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$dt;
            fn write_bytes(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn read_bytes(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(bytes);
                <$t>::from_le_bytes(a)
            }
            fn to_scalar(self) -> Scalar {
                Scalar::from(self)
            }
            fn from_scalar(s: Scalar) -> Self {
                let f: fn(Scalar) -> $t = $from;
                f(s.cast(DType::$dt))
            }
        })*
    };
}
element_num! {
    f32 => F32, |s| s.to_f64() as f32;
    f64 => F64, |s| s.to_f64();
    i32 => I32, |s| s.to_i64() as i32;
    i64 => I64, |s| s.to_i64();
    u8 => U8, |s| s.to_i64() as u8;
    f16 => F16, |s| f16::from_f32(s.to_f64() as f32);
    bf16 => BF16, |s| bf16::from_f32(s.to_f64() as f32);
}

impl sealed::Sealed for bool {}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn write_bytes(self, out: &mut [u8]) {
        out[0] = self as u8;
    }
    fn read_bytes(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn to_scalar(self) -> Scalar {
        Scalar::Bool(self)
    }
    fn from_scalar(s: Scalar) -> Self {
        matches!(s.cast(DType::Bool), Scalar::Bool(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_is_symmetric_and_idempotent() {
        for a in ALL_DTYPES {
            assert_eq!(DType::promote(a, a), a);
            for b in ALL_DTYPES {
                assert_eq!(DType::promote(a, b), DType::promote(b, a), "{a} {b}");
            }
        }
    }

    #[test]
    fn promotion_matches_pytorch_table() {
        use DType::*;
        assert_eq!(DType::promote(Bool, U8), U8);
        assert_eq!(DType::promote(U8, I64), I64);
        assert_eq!(DType::promote(I32, I64), I64);
        assert_eq!(DType::promote(I64, F16), F16);
        assert_eq!(DType::promote(BF16, F32), F32);
        assert_eq!(DType::promote(F16, BF16), F32);
        assert_eq!(DType::promote(F32, F64), F64);
    }

    #[test]
    fn scalar_cast_wraps_and_rounds() {
        assert_eq!(Scalar::Int(300).cast(DType::U8), Scalar::Int(44));
        assert_eq!(Scalar::Float(-1.7).cast(DType::I32), Scalar::Int(-1));
        assert_eq!(
            Scalar::Float(0.1).cast(DType::F32),
            Scalar::Float(0.1f32 as f64)
        );
        assert_eq!(Scalar::Int(2).cast(DType::Bool), Scalar::Bool(true));
    }
}
