//! Typed elementwise loops over chunks. Every function here is `#[inline(always)]` so that it
//! is compiled inside the SIMD-enabled task functions of [`super::exec`] and its loops
//! vectorize with the features detected at run time.

use crate::math::f32 as math;
use crate::dtype::{ComputeType, DType, Scalar};
use crate::graph::{BinaryOp, ReduceOp, UnaryOp};

/// A run operand: a slice of `n` values or one value broadcast over the run.
#[derive(Clone, Copy)]
pub(crate) enum Src<'a, T> {
    Slice(&'a [T]),
    Scalar(T),
}

/// One value of any compute type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scal {
    U8(u8),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
}

impl Scal {
    /// A scalar in the compute type of `dtype` (already rounded to `dtype`).
    pub(crate) fn from_scalar(s: Scalar, dtype: DType) -> Scal {
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

/// Arithmetic on one compute type, with PyTorch's semantics: integers wrap, float max/min
/// propagate NaN, integer division never happens (the API casts to float first).
pub(crate) trait Num: bytemuck::Pod + PartialOrd + Send + Sync + 'static {
    const ZERO: Self;
    const ONE: Self;
    /// Identity of `max` (the lowest value).
    const LOWEST: Self;
    /// Identity of `min`.
    const HIGHEST: Self;
    fn get(s: Scal) -> Self;
    fn add(a: Self, b: Self) -> Self;
    fn sub(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn div(a: Self, b: Self) -> Self;
    fn pow(a: Self, b: Self) -> Self;
    fn neg(a: Self) -> Self;
    fn abs(a: Self) -> Self;
    fn is_nan(a: Self) -> bool;
    /// Float-only transcendental ops (integers never reach them).
    fn unary_float(op: UnaryOp, a: Self) -> Self;
}

#[inline(always)]
fn max_nan<T: Num>(a: T, b: T) -> T {
    if T::is_nan(a) || a > b { a } else { b }
}

#[inline(always)]
fn min_nan<T: Num>(a: T, b: T) -> T {
    if T::is_nan(a) || a < b { a } else { b }
}

macro_rules! int_num {
    ($t:ty, $v:ident) => {
        impl Num for $t {
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
            fn unary_float(_: UnaryOp, a: Self) -> Self {
                a
            }
        }
    };
}
int_num!(u8, U8);
int_num!(i32, I32);
int_num!(i64, I64);

impl Num for f32 {
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
        math::pow_f32(a, b)
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
    fn unary_float(op: UnaryOp, a: Self) -> Self {
        match op {
            UnaryOp::Exp => math::exp_f32(a),
            UnaryOp::Log => math::log_f32(a),
            UnaryOp::Sqrt => a.sqrt(),
            UnaryOp::Recip => 1.0 / a,
            UnaryOp::Sin => math::sin_f32(a),
            UnaryOp::Cos => math::cos_f32(a),
            UnaryOp::Tanh => math::tanh_f32(a),
            UnaryOp::Sigmoid => math::sigmoid_f32(a),
            UnaryOp::Gelu => math::gelu_f32(a),
            UnaryOp::Neg => -a,
            UnaryOp::Abs => Self::abs(a),
            UnaryOp::Relu => relu(a),
        }
    }
}

impl Num for f64 {
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
    fn unary_float(op: UnaryOp, a: Self) -> Self {
        match op {
            UnaryOp::Exp => a.exp(),
            UnaryOp::Log => a.ln(),
            UnaryOp::Sqrt => a.sqrt(),
            UnaryOp::Recip => 1.0 / a,
            UnaryOp::Sin => a.sin(),
            UnaryOp::Cos => a.cos(),
            UnaryOp::Tanh => a.tanh(),
            UnaryOp::Sigmoid => crate::math::f64::sigmoid(a),
            UnaryOp::Gelu => crate::math::f64::gelu(a),
            UnaryOp::Neg => -a,
            UnaryOp::Abs => a.abs(),
            UnaryOp::Relu => relu(a),
        }
    }
}

#[inline(always)]
fn relu<T: Num>(a: T) -> T {
    if T::is_nan(a) || a > T::ZERO {
        a
    } else {
        T::ZERO
    }
}

#[inline(always)]
fn map1<T: Copy, U: Copy>(a: Src<'_, T>, out: &mut [U], f: impl Fn(T) -> U) {
    match a {
        Src::Slice(a) => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = f(x);
            }
        }
        Src::Scalar(x) => {
            let v = f(x);
            out.fill(v);
        }
    }
}

#[inline(always)]
fn map2<T: Copy, U: Copy>(a: Src<'_, T>, b: Src<'_, T>, out: &mut [U], f: impl Fn(T, T) -> U) {
    match (a, b) {
        (Src::Slice(a), Src::Slice(b)) => {
            let n = out.len();
            let (a, b) = (&a[..n], &b[..n]);
            for i in 0..n {
                out[i] = f(a[i], b[i]);
            }
        }
        (Src::Slice(a), Src::Scalar(y)) => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        (Src::Scalar(x), Src::Slice(b)) => {
            for (o, &y) in out.iter_mut().zip(b) {
                *o = f(x, y);
            }
        }
        (Src::Scalar(x), Src::Scalar(y)) => out.fill(f(x, y)),
    }
}

/// `out = op(a)` for the value-preserving unary ops.
#[inline(always)]
pub(crate) fn unary<T: Num>(op: UnaryOp, a: Src<'_, T>, out: &mut [T]) {
    match op {
        UnaryOp::Neg => map1(a, out, T::neg),
        UnaryOp::Abs => map1(a, out, T::abs),
        UnaryOp::Relu => map1(a, out, relu),
        UnaryOp::Exp => map1(a, out, |x| T::unary_float(UnaryOp::Exp, x)),
        UnaryOp::Log => map1(a, out, |x| T::unary_float(UnaryOp::Log, x)),
        UnaryOp::Sqrt => map1(a, out, |x| T::unary_float(UnaryOp::Sqrt, x)),
        UnaryOp::Recip => map1(a, out, |x| T::unary_float(UnaryOp::Recip, x)),
        UnaryOp::Sin => map1(a, out, |x| T::unary_float(UnaryOp::Sin, x)),
        UnaryOp::Cos => map1(a, out, |x| T::unary_float(UnaryOp::Cos, x)),
        UnaryOp::Tanh => map1(a, out, |x| T::unary_float(UnaryOp::Tanh, x)),
        UnaryOp::Sigmoid => map1(a, out, |x| T::unary_float(UnaryOp::Sigmoid, x)),
        UnaryOp::Gelu => map1(a, out, |x| T::unary_float(UnaryOp::Gelu, x)),
    }
}

/// `out = op(a, b)` for the arithmetic binary ops.
#[inline(always)]
pub(crate) fn binary<T: Num>(op: BinaryOp, a: Src<'_, T>, b: Src<'_, T>, out: &mut [T]) {
    match op {
        BinaryOp::Add => map2(a, b, out, T::add),
        BinaryOp::Sub => map2(a, b, out, T::sub),
        BinaryOp::Mul => map2(a, b, out, T::mul),
        BinaryOp::Div => map2(a, b, out, T::div),
        BinaryOp::Pow => map2(a, b, out, T::pow),
        BinaryOp::Max => map2(a, b, out, max_nan),
        BinaryOp::Min => map2(a, b, out, min_nan),
        _ => {}
    }
}

/// `out = a <op> b` as 0/1 bytes.
#[inline(always)]
pub(crate) fn compare<T: Num>(op: BinaryOp, a: Src<'_, T>, b: Src<'_, T>, out: &mut [u8]) {
    match op {
        BinaryOp::Lt => map2(a, b, out, |x, y| (x < y) as u8),
        BinaryOp::Le => map2(a, b, out, |x, y| (x <= y) as u8),
        BinaryOp::Gt => map2(a, b, out, |x, y| (x > y) as u8),
        BinaryOp::Ge => map2(a, b, out, |x, y| (x >= y) as u8),
        BinaryOp::Eq => map2(a, b, out, |x, y| (x == y) as u8),
        BinaryOp::Ne => map2(a, b, out, |x, y| (x != y) as u8),
        _ => {}
    }
}

/// `out = c ? a : b`.
#[inline(always)]
pub(crate) fn select<T: Num>(c: Src<'_, u8>, a: Src<'_, T>, b: Src<'_, T>, out: &mut [T]) {
    let n = out.len();
    match (c, a, b) {
        (Src::Scalar(c), a, b) => {
            let s = if c != 0 { a } else { b };
            map1(s, out, |x| x);
        }
        (Src::Slice(c), Src::Slice(a), Src::Slice(b)) => {
            let (c, a, b) = (&c[..n], &a[..n], &b[..n]);
            for i in 0..n {
                out[i] = if c[i] != 0 { a[i] } else { b[i] };
            }
        }
        (Src::Slice(c), Src::Slice(a), Src::Scalar(b)) => {
            let (c, a) = (&c[..n], &a[..n]);
            for i in 0..n {
                out[i] = if c[i] != 0 { a[i] } else { b };
            }
        }
        (Src::Slice(c), Src::Scalar(a), Src::Slice(b)) => {
            let (c, b) = (&c[..n], &b[..n]);
            for i in 0..n {
                out[i] = if c[i] != 0 { a } else { b[i] };
            }
        }
        (Src::Slice(c), Src::Scalar(a), Src::Scalar(b)) => {
            for (o, &ci) in out.iter_mut().zip(c) {
                *o = if ci != 0 { a } else { b };
            }
        }
    }
}

/// Rounds f32 values to the precision of a half dtype in place (no-op for other dtypes).
#[inline(always)]
pub(crate) fn round_to(dtype: DType, v: &mut [f32]) {
    match dtype {
        DType::F16 => {
            for x in v.iter_mut() {
                *x = math::round_f16(*x);
            }
        }
        DType::BF16 => {
            for x in v.iter_mut() {
                *x = math::round_bf16(*x);
            }
        }
        _ => {}
    }
}

/// Conversion of one value between compute types with dtype cast semantics.
pub(crate) trait CastTo<U> {
    fn cast(self, to: DType) -> U;
}

macro_rules! cast_impl {
    ($from:ty => $($to:ty),*) => {$(
        impl CastTo<$to> for $from {
            #[inline(always)]
            #[allow(clippy::unnecessary_cast)]
            fn cast(self, to: DType) -> $to {
                match to {
                    DType::Bool => ((self != (0 as $from)) as u8) as $to,
                    _ => self as $to,
                }
            }
        }
    )*};
}
cast_impl!(u8 => u8, i32, i64, f64);
cast_impl!(i32 => u8, i32, i64, f64);
cast_impl!(i64 => u8, i32, i64, f64);
cast_impl!(f32 => u8, i32, i64, f64);
cast_impl!(f64 => u8, i32, i64, f64);

macro_rules! cast_to_f32 {
    ($($from:ty),*) => {$(
        impl CastTo<f32> for $from {
            #[inline(always)]
            #[allow(clippy::unnecessary_cast)]
            fn cast(self, to: DType) -> f32 {
                match to {
                    DType::F16 => math::round_f16(self as f32),
                    DType::BF16 => math::round_bf16(self as f32),
                    _ => self as f32,
                }
            }
        }
    )*};
}
cast_to_f32!(u8, i32, i64, f64);

impl CastTo<f32> for f32 {
    #[inline(always)]
    fn cast(self, to: DType) -> f32 {
        match to {
            DType::F16 => math::round_f16(self),
            DType::BF16 => math::round_bf16(self),
            _ => self,
        }
    }
}

/// `out = cast(a)` into dtype `to`.
#[inline(always)]
pub(crate) fn cast<T: Copy + CastTo<U>, U: Copy>(a: Src<'_, T>, to: DType, out: &mut [U]) {
    map1(a, out, |x| x.cast(to))
}

/// Running state of one reduction over values of type `T`.
#[derive(Clone, Copy)]
pub(crate) struct Acc<T> {
    pub value: T,
    pub index: i64,
}

/// Identity accumulator.
#[inline(always)]
pub(crate) fn acc_init<T: Num>(op: ReduceOp) -> Acc<T> {
    let value = match op {
        ReduceOp::Sum => T::ZERO,
        ReduceOp::Prod => T::ONE,
        ReduceOp::Max | ReduceOp::ArgMax => T::LOWEST,
        ReduceOp::Min | ReduceOp::ArgMin => T::HIGHEST,
    };
    Acc { value, index: -1 }
}

/// Combines two partial accumulators (`b` covers later indices than `a`).
#[inline(always)]
pub(crate) fn acc_combine<T: Num>(op: ReduceOp, a: Acc<T>, b: Acc<T>) -> Acc<T> {
    match op {
        ReduceOp::Sum => Acc {
            value: T::add(a.value, b.value),
            index: 0,
        },
        ReduceOp::Prod => Acc {
            value: T::mul(a.value, b.value),
            index: 0,
        },
        ReduceOp::Max => Acc {
            value: max_nan(a.value, b.value),
            index: 0,
        },
        ReduceOp::Min => Acc {
            value: min_nan(a.value, b.value),
            index: 0,
        },
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            if b.index < 0 {
                return a;
            }
            if a.index < 0 {
                return b;
            }
            if arg_better(op, b.value, a.value) {
                b
            } else {
                a
            }
        }
    }
}

/// True if `x` (seen later) beats `best` (seen earlier): strictly better, or the first NaN.
#[inline(always)]
fn arg_better<T: Num>(op: ReduceOp, x: T, best: T) -> bool {
    if T::is_nan(best) {
        return false;
    }
    if T::is_nan(x) {
        return true;
    }
    match op {
        ReduceOp::ArgMax => x > best,
        _ => x < best,
    }
}

/// Reduces a run (`index0` is the flat reduce index of its first element).
#[inline(always)]
pub(crate) fn reduce_run<T: Num>(op: ReduceOp, src: Src<'_, T>, n: usize, index0: i64) -> Acc<T> {
    let slice = match src {
        Src::Slice(s) => &s[..n],
        Src::Scalar(v) => {
            // A value constant along the run: fold it n times (same order as a slice).
            let mut acc = acc_init::<T>(op);
            for i in 0..n {
                acc = acc_combine(
                    op,
                    acc,
                    Acc {
                        value: v,
                        index: index0 + i as i64,
                    },
                );
            }
            return acc;
        }
    };
    let id = acc_init::<T>(op).value;
    let v = match op {
        ReduceOp::Sum => fold_lanes(slice, id, T::add),
        ReduceOp::Prod => fold_lanes(slice, id, T::mul),
        ReduceOp::Max => fold_lanes(slice, id, max_nan),
        ReduceOp::Min => fold_lanes(slice, id, min_nan),
        ReduceOp::ArgMax | ReduceOp::ArgMin => return arg_run(op, slice, index0),
    };
    Acc { value: v, index: 0 }
}

/// Folds a slice with `L` independent accumulators (so the loop vectorizes), then folds
/// the lanes.
#[inline(always)]
fn fold_lanes<T: Num>(slice: &[T], id: T, f: impl Fn(T, T) -> T) -> T {
    const L: usize = 32;
    let mut lanes = [id; L];
    let chunks = slice.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..L {
            lanes[i] = f(lanes[i], c[i]);
        }
    }
    let mut v = id;
    for &x in rest {
        v = f(v, x);
    }
    let mut w = lanes[0];
    for &l in &lanes[1..] {
        w = f(w, l);
    }
    f(w, v)
}

#[inline(always)]
fn arg_run<T: Num>(op: ReduceOp, slice: &[T], index0: i64) -> Acc<T> {
    let mut best = acc_init::<T>(op);
    for (i, &x) in slice.iter().enumerate() {
        if best.index < 0 || arg_better(op, x, best.value) {
            best = Acc {
                value: x,
                index: index0 + i as i64,
            };
        }
    }
    best
}

/// Accumulates a run elementwise into per-position accumulators (column reductions):
/// `acc[i] = acc[i] ⊕ src[i]`, `idx[i]` tracking arg positions at reduce index `index`.
#[inline(always)]
pub(crate) fn accumulate<T: Num>(
    op: ReduceOp,
    src: Src<'_, T>,
    acc: &mut [T],
    idx: &mut [i64],
    index: i64,
) {
    let n = acc.len();
    match op {
        ReduceOp::Sum => match src {
            Src::Slice(s) => acc
                .iter_mut()
                .zip(&s[..n])
                .for_each(|(a, &x)| *a = T::add(*a, x)),
            Src::Scalar(x) => acc.iter_mut().for_each(|a| *a = T::add(*a, x)),
        },
        ReduceOp::Prod => match src {
            Src::Slice(s) => acc
                .iter_mut()
                .zip(&s[..n])
                .for_each(|(a, &x)| *a = T::mul(*a, x)),
            Src::Scalar(x) => acc.iter_mut().for_each(|a| *a = T::mul(*a, x)),
        },
        ReduceOp::Max => match src {
            Src::Slice(s) => acc
                .iter_mut()
                .zip(&s[..n])
                .for_each(|(a, &x)| *a = max_nan(*a, x)),
            Src::Scalar(x) => acc.iter_mut().for_each(|a| *a = max_nan(*a, x)),
        },
        ReduceOp::Min => match src {
            Src::Slice(s) => acc
                .iter_mut()
                .zip(&s[..n])
                .for_each(|(a, &x)| *a = min_nan(*a, x)),
            Src::Scalar(x) => acc.iter_mut().for_each(|a| *a = min_nan(*a, x)),
        },
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            for i in 0..n {
                let x = match src {
                    Src::Slice(s) => s[i],
                    Src::Scalar(x) => x,
                };
                if idx[i] < 0 || arg_better(op, x, acc[i]) {
                    acc[i] = x;
                    idx[i] = index;
                }
            }
        }
    }
}
