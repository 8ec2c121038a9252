//! [`Num`]: scalar arithmetic on one compute type (u8, i32, i64, f32, f64) with PyTorch's
//! semantics — integers wrap, float max/min propagate NaN — and [`Scal`], one value of any
//! compute type. The op tables express every op through these, so the CPU loops, the
//! reference evaluator and the f64 kernels evaluate the same definition.

use crate::dtype::{ComputeType, DType, Scalar};

/// One value of any compute type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scal {
    U8(u8),
    I32(i32),
    I64(i64),
    F32(f32),
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
    const ZERO: Self;
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
    fn add(a: Self, b: Self) -> Self;
    fn sub(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    /// Division (integers: truncating, 0 for a zero divisor).
    fn div(a: Self, b: Self) -> Self;
    fn pow(a: Self, b: Self) -> Self;
    fn neg(a: Self) -> Self;
    fn abs(a: Self) -> Self;
    fn is_nan(a: Self) -> bool;
    /// `f` on an f32, `g` on an f64, identity on integers (float-only ops never see them).
    fn float(self, f: impl Fn(f32) -> f32, g: impl Fn(f64) -> f64) -> Self;
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
            fn float(self, _: impl Fn(f32) -> f32, _: impl Fn(f64) -> f64) -> Self {
                self
            }
        }
    };
}
int_num!(u8, U8, U8);
int_num!(i32, I32, I32);
int_num!(i64, I64, I64);

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
    #[inline(always)]
    fn float(self, f: impl Fn(f32) -> f32, _: impl Fn(f64) -> f64) -> Self {
        f(self)
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
    #[inline(always)]
    fn float(self, _: impl Fn(f32) -> f32, g: impl Fn(f64) -> f64) -> Self {
        g(self)
    }
}
