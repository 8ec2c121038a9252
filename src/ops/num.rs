//! [`Num`]: scalar arithmetic on one compute type (u8, i32, i64, f32, f64) with PyTorch's
//! semantics — integers wrap, float max/min propagate NaN — and [`Scal`], one value of any
//! compute type. The op tables express every op through these, so the CPU loops, the
//! reference evaluator and the f64 kernels evaluate the same definition.

use crate::dtype::{ComputeType, DType, Scalar};

/// One value of any compute type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scal {
    /// A `u8` (bool and u8 values).
    U8(u8),
    /// An `i32`.
    I32(i32),
    /// An `i64`.
    I64(i64),
    /// An `f32` (f32, f16 and bf16 values).
    F32(f32),
    /// An `f64`.
    F64(f64),
}

impl Scal {
    /// A scalar in the compute type of `dtype` (already rounded to `dtype`).
    pub fn from_scalar(s: Scalar, dtype: DType) -> Scal {
        let s = s.cast(dtype);
        match dtype.compute() {
            ComputeType::U8 => Scal::U8(s.to_i64() as u8),
            ComputeType::I32 => Scal::I32(s.to_i64() as i32),
            ComputeType::I64 => Scal::I64(s.to_i64()),
            ComputeType::F32 => Scal::F32(s.to_f64() as f32),
            ComputeType::F64 => Scal::F64(s.to_f64()),
        }
    }
}

/// Arithmetic on one compute type.
pub trait Num: bytemuck::Pod + PartialOrd + Send + Sync + 'static {
    /// The compute type this is.
    const COMPUTE: ComputeType;
    /// Zero, the identity of `add`.
    const ZERO: Self;
    /// One, the identity of `mul`.
    const ONE: Self;
    /// Identity of `max` (the lowest value).
    const LOWEST: Self;
    /// Identity of `min`.
    const HIGHEST: Self;
    /// The value of a [`Scal`] of this compute type (zero for another type).
    fn get(s: Scal) -> Self;
    /// An integer converted (integers wrap to the width, floats round).
    fn from_i64(v: i64) -> Self;
    /// A float converted (floats round; integers truncate, saturating).
    fn from_f64(v: f64) -> Self;
    /// `a + b` (integers wrap).
    fn add(a: Self, b: Self) -> Self;
    /// `a - b` (integers wrap).
    fn sub(a: Self, b: Self) -> Self;
    /// `a * b` (integers wrap).
    fn mul(a: Self, b: Self) -> Self;
    /// Division (integers: truncating, 0 for a zero divisor).
    fn div(a: Self, b: Self) -> Self;
    /// `a^b` (integers: wrapping; a negative exponent gives the truncated real result).
    fn pow(a: Self, b: Self) -> Self;
    /// `-a` (integers wrap).
    fn neg(a: Self) -> Self;
    /// `|a|` (integers wrap: `abs(MIN) = MIN`).
    fn abs(a: Self) -> Self;
    /// True for NaN (never for integers).
    fn is_nan(a: Self) -> bool;
    /// `±inf` (never for integers).
    fn is_inf(a: Self) -> bool;
    /// C's `fmod` (PyTorch's `fmod`): the remainder of the division truncated toward zero,
    /// with the sign of `a`. Floats: exact; `fmod(x, ±0)`, `fmod(±inf, y)` are NaN,
    /// `fmod(x, ±inf) = x`. Integers: 0 for a zero divisor (see `docs/semantics.md`), and
    /// `MIN % -1 = 0`.
    fn fmod(a: Self, b: Self) -> Self;
    /// Python's `%` (PyTorch's `remainder`): the remainder of the floor division, with the
    /// sign of `b` (a zero result keeps `fmod`'s sign, as PyTorch). Floats: `fmod(a, b) + b`
    /// where the signs differ, one rounding. Integers: 0 for a zero divisor.
    fn remainder(a: Self, b: Self) -> Self;
    /// Python's `//` (PyTorch's `floor_divide`, `div(rounding_mode='floor')`). Floats:
    /// `a / b` for a zero divisor, else the integer `(a - fmod(a, b)) / b`, one less where
    /// the remainder's sign differs from `b`'s, rounded to the nearest integer (exactly
    /// PyTorch's algorithm, so `1 // 0.1 = 9`). Integers: wrapping (`MIN // -1 = MIN`), 0 for
    /// a zero divisor.
    fn floor_divide(a: Self, b: Self) -> Self;
    /// `f` on an f32, `g` on an f64, identity on integers (float-only ops never see them).
    fn float(self, f: impl Fn(f32) -> f32, g: impl Fn(f64) -> f64) -> Self;
    /// The two-operand [`Num::float`]: `f(a, b)` on f32, `g(a, b)` on f64, `a` on integers
    /// (float-only ops never see them).
    fn float2(a: Self, b: Self, f: impl Fn(f32, f32) -> f32, g: impl Fn(f64, f64) -> f64) -> Self;
    /// The run form of [`Num::float`]: `f` over f32 runs, `g` over f64 runs.
    #[inline(always)]
    fn float_run(
        src: &[Self],
        out: &mut [Self],
        f: impl Fn(&[f32], &mut [f32]),
        g: impl Fn(&[f64], &mut [f64]),
    ) {
        match Self::COMPUTE {
            ComputeType::F32 => f(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(out)),
            ComputeType::F64 => g(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(out)),
            _ => out.copy_from_slice(src),
        }
    }
}

/// `max` that propagates NaN.
#[inline(always)]
pub fn max_nan<T: Num>(a: T, b: T) -> T {
    if T::is_nan(a) || a > b { a } else { b }
}

/// `min` that propagates NaN.
#[inline(always)]
pub fn min_nan<T: Num>(a: T, b: T) -> T {
    if T::is_nan(a) || a < b { a } else { b }
}

/// `-1`, `0` or `1` as `a` is negative, zero or positive; 0 for NaN and `±0` (PyTorch's
/// `sign`, which gives `+0` for both).
#[inline(always)]
pub fn sign<T: Num>(a: T) -> T {
    if a > T::ZERO {
        T::ONE
    } else if a < T::ZERO {
        T::neg(T::ONE)
    } else {
        T::ZERO
    }
}

/// `max(x, 0)` keeping NaN.
#[inline(always)]
pub fn relu<T: Num>(a: T) -> T {
    if T::is_nan(a) || a > T::ZERO {
        a
    } else {
        T::ZERO
    }
}

macro_rules! int_num {
    ($t:ty, $v:ident, $ct:ident) => {
        impl Num for $t {
            const COMPUTE: ComputeType = ComputeType::$ct;
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const LOWEST: Self = <$t>::MIN;
            const HIGHEST: Self = <$t>::MAX;
            #[inline(always)]
            fn get(s: Scal) -> Self {
                match s {
                    Scal::$v(x) => x,
                    _ => 0,
                }
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn sub(a: Self, b: Self) -> Self {
                a.wrapping_sub(b)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn div(a: Self, b: Self) -> Self {
                if b == 0 { 0 } else { a.wrapping_div(b) }
            }
            #[inline(always)]
            fn pow(a: Self, b: Self) -> Self {
                crate::math::f64::int_pow(a as i64, b as i64) as $t
            }
            #[inline(always)]
            fn neg(a: Self) -> Self {
                (0 as $t).wrapping_sub(a)
            }
            #[inline(always)]
            fn abs(a: Self) -> Self {
                #[allow(unused_comparisons)]
                if a < 0 { (0 as $t).wrapping_sub(a) } else { a }
            }
            #[inline(always)]
            fn is_nan(_: Self) -> bool {
                false
            }
            #[inline(always)]
            fn is_inf(_: Self) -> bool {
                false
            }
            #[inline(always)]
            fn fmod(a: Self, b: Self) -> Self {
                if b == 0 { 0 } else { a.wrapping_rem(b) }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn remainder(a: Self, b: Self) -> Self {
                let r = Self::fmod(a, b);
                // |r| < |b| and the signs differ, so the sum cannot overflow.
                if r != 0 && (r < 0) != (b < 0) {
                    r.wrapping_add(b)
                } else {
                    r
                }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn floor_divide(a: Self, b: Self) -> Self {
                if b == 0 {
                    return 0;
                }
                let q = a.wrapping_div(b);
                if a.wrapping_rem(b) != 0 && (a < 0) != (b < 0) {
                    q.wrapping_sub(1)
                } else {
                    q
                }
            }
            #[inline(always)]
            fn float(self, _: impl Fn(f32) -> f32, _: impl Fn(f64) -> f64) -> Self {
                self
            }
            #[inline(always)]
            fn float2(
                a: Self,
                _: Self,
                _: impl Fn(f32, f32) -> f32,
                _: impl Fn(f64, f64) -> f64,
            ) -> Self {
                a
            }
        }
    };
}
int_num!(u8, U8, U8);
int_num!(i32, I32, I32);
int_num!(i64, I64, I64);

/// `remainder` on floats (`f32` and `f64` alike): `fmod`, plus `b` where the signs differ.
macro_rules! float_remainder {
    ($a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        let m = a % b;
        if m != 0.0 && (b < 0.0) != (m < 0.0) {
            m + b
        } else {
            m
        }
    }};
}

/// `floor_divide` on floats: PyTorch's (and CPython's) algorithm, step for step.
macro_rules! float_floor_divide {
    ($a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        if b == 0.0 {
            a / b
        } else {
            let m = a % b;
            let mut div = (a - m) / b;
            if m != 0.0 && (b < 0.0) != (m < 0.0) {
                div -= 1.0;
            }
            if div != 0.0 {
                let f = div.floor();
                if div - f > 0.5 { f + 1.0 } else { f }
            } else {
                // A zero quotient takes the sign of the true quotient.
                (0.0 as Self).copysign(a / b)
            }
        }
    }};
}

/// The `Num` methods that read the same for `f32` and `f64`: `is_inf`, `fmod`,
/// `remainder`, `floor_divide`.
macro_rules! float_division_methods {
    () => {
        #[inline(always)]
        fn is_inf(a: Self) -> bool {
            a.is_infinite()
        }
        #[inline(always)]
        fn fmod(a: Self, b: Self) -> Self {
            a % b
        }
        #[inline(always)]
        fn remainder(a: Self, b: Self) -> Self {
            float_remainder!(a, b)
        }
        #[inline(always)]
        fn floor_divide(a: Self, b: Self) -> Self {
            float_floor_divide!(a, b)
        }
    };
}

impl Num for f32 {
    const COMPUTE: ComputeType = ComputeType::F32;
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const LOWEST: Self = f32::NEG_INFINITY;
    const HIGHEST: Self = f32::INFINITY;
    #[inline(always)]
    fn get(s: Scal) -> Self {
        match s {
            Scal::F32(x) => x,
            _ => 0.0,
        }
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        a - b
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
    #[inline(always)]
    fn div(a: Self, b: Self) -> Self {
        a / b
    }
    #[inline(always)]
    fn pow(a: Self, b: Self) -> Self {
        crate::math::f32::pow_f32(a, b)
    }
    #[inline(always)]
    fn neg(a: Self) -> Self {
        -a
    }
    #[inline(always)]
    fn abs(a: Self) -> Self {
        f32::from_bits(a.to_bits() & 0x7fff_ffff)
    }
    #[inline(always)]
    fn is_nan(a: Self) -> bool {
        a.is_nan()
    }
    float_division_methods!();
    #[inline(always)]
    fn float(self, f: impl Fn(f32) -> f32, _: impl Fn(f64) -> f64) -> Self {
        f(self)
    }
    #[inline(always)]
    fn float2(a: Self, b: Self, f: impl Fn(f32, f32) -> f32, _: impl Fn(f64, f64) -> f64) -> Self {
        f(a, b)
    }
}

impl Num for f64 {
    const COMPUTE: ComputeType = ComputeType::F64;
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const LOWEST: Self = f64::NEG_INFINITY;
    const HIGHEST: Self = f64::INFINITY;
    #[inline(always)]
    fn get(s: Scal) -> Self {
        match s {
            Scal::F64(x) => x,
            _ => 0.0,
        }
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        a - b
    }
    #[inline(always)]
    fn mul(a: Self, b: Self) -> Self {
        a * b
    }
    #[inline(always)]
    fn div(a: Self, b: Self) -> Self {
        a / b
    }
    #[inline(always)]
    fn pow(a: Self, b: Self) -> Self {
        a.powf(b)
    }
    #[inline(always)]
    fn neg(a: Self) -> Self {
        -a
    }
    #[inline(always)]
    fn abs(a: Self) -> Self {
        a.abs()
    }
    #[inline(always)]
    fn is_nan(a: Self) -> bool {
        a.is_nan()
    }
    float_division_methods!();
    #[inline(always)]
    fn float(self, _: impl Fn(f32) -> f32, g: impl Fn(f64) -> f64) -> Self {
        g(self)
    }
    #[inline(always)]
    fn float2(a: Self, b: Self, _: impl Fn(f32, f32) -> f32, g: impl Fn(f64, f64) -> f64) -> Self {
        g(a, b)
    }
}
