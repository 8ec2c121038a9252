//! Typed elementwise and reduction loops over runs. Every function here is
//! `#[inline(always)]` so that it is compiled inside the SIMD-enabled task functions of
//! [`super::exec`] and its loops vectorize with the features detected at run time. The ops
//! themselves come from the op tables ([`crate::ops`]): each table arm hands a scalar
//! definition to the [`Map`]/[`Map2`] impls below, which build one loop per op.

use super::exec::f16_to_f32;
use crate::dtype::DType;
use crate::math::f32 as math;
use crate::ops::{BinaryOp, Map, Map2, Num, ReduceOp, UnaryOp, max_nan, min_nan};

/// A run operand: a slice of `n` values or one value broadcast over the run.
#[derive(Clone, Copy)]
pub(crate) enum Src<'a, T> {
    Slice(&'a [T]),
    Scalar(T),
}

impl<'a, T: Copy> Src<'a, T> {
    /// Segment `k` of `len` values of a packed run (a scalar stays the scalar).
    #[inline(always)]
    pub(crate) fn segment(self, k: usize, len: usize) -> Src<'a, T> {
        match self {
            Src::Slice(x) => Src::Slice(&x[k * len..(k + 1) * len]),
            Src::Scalar(x) => Src::Scalar(x),
        }
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

/// A unary op's run: operand and output.
struct Run1<'a, 'o, T> {
    a: Src<'a, T>,
    out: &'o mut [T],
}

impl<T: Num> Map<T> for Run1<'_, '_, T> {
    #[inline(always)]
    fn map<F: Fn(T) -> T>(&mut self, f: F) {
        map1(self.a, self.out, f)
    }

    #[inline(always)]
    fn map_runs<F: Fn(T) -> T, R: Fn(&[T], &mut [T])>(&mut self, f: F, run: R) {
        match self.a {
            Src::Slice(a) => {
                let n = self.out.len();
                run(&a[..n], self.out)
            }
            Src::Scalar(x) => self.out.fill(f(x)),
        }
    }
}

/// A binary op's run: operands and the output (values, or bools for comparisons).
struct Run2<'a, 'o, T> {
    a: Src<'a, T>,
    b: Src<'a, T>,
    out: Out2<'o, T>,
}

enum Out2<'o, T> {
    Value(&'o mut [T]),
    Bool(&'o mut [u8]),
}

impl<T: Num> Map2<T> for Run2<'_, '_, T> {
    #[inline(always)]
    fn map2<F: Fn(T, T) -> T>(&mut self, f: F) {
        if let Out2::Value(o) = &mut self.out {
            map2(self.a, self.b, o, f)
        }
    }

    #[inline(always)]
    fn compare<F: Fn(T, T) -> bool>(&mut self, f: F) {
        if let Out2::Bool(o) = &mut self.out {
            map2(self.a, self.b, o, |x, y| f(x, y) as u8)
        }
    }
}

/// `out = op(a)`.
#[inline(always)]
pub(crate) fn unary<T: Num>(op: UnaryOp, a: Src<'_, T>, out: &mut [T]) {
    op.map(&mut Run1 { a, out })
}

/// `out = op(a, b)` for the arithmetic binary ops.
#[inline(always)]
pub(crate) fn binary<T: Num>(op: BinaryOp, a: Src<'_, T>, b: Src<'_, T>, out: &mut [T]) {
    op.map(&mut Run2 {
        a,
        b,
        out: Out2::Value(out),
    })
}

/// `out = a <op> b` as 0/1 bytes.
#[inline(always)]
pub(crate) fn compare<T: Num>(op: BinaryOp, a: Src<'_, T>, b: Src<'_, T>, out: &mut [u8]) {
    op.map(&mut Run2 {
        a,
        b,
        out: Out2::Bool(out),
    })
}

/// Loops of a three-operand function over runs, one per mix of slices and scalars.
#[inline(always)]
fn map3<T: Copy>(
    a: Src<'_, T>,
    b: Src<'_, T>,
    c: Src<'_, T>,
    out: &mut [T],
    f: impl Fn(T, T, T) -> T,
) {
    let n = out.len();
    match (a, b, c) {
        (Src::Slice(a), Src::Slice(b), Src::Slice(c)) => {
            let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
            for i in 0..n {
                out[i] = f(a[i], b[i], c[i]);
            }
        }
        (Src::Slice(a), Src::Slice(b), Src::Scalar(c)) => {
            let (a, b) = (&a[..n], &b[..n]);
            for i in 0..n {
                out[i] = f(a[i], b[i], c);
            }
        }
        (Src::Slice(a), Src::Scalar(b), Src::Slice(c)) => {
            let (a, c) = (&a[..n], &c[..n]);
            for i in 0..n {
                out[i] = f(a[i], b, c[i]);
            }
        }
        (Src::Scalar(a), Src::Slice(b), Src::Slice(c)) => {
            let (b, c) = (&b[..n], &c[..n]);
            for i in 0..n {
                out[i] = f(a, b[i], c[i]);
            }
        }
        (Src::Slice(a), Src::Scalar(b), Src::Scalar(c)) => {
            for (o, &x) in out.iter_mut().zip(&a[..n]) {
                *o = f(x, b, c);
            }
        }
        (Src::Scalar(a), Src::Slice(b), Src::Scalar(c)) => {
            for (o, &y) in out.iter_mut().zip(&b[..n]) {
                *o = f(a, y, c);
            }
        }
        (Src::Scalar(a), Src::Scalar(b), Src::Slice(c)) => {
            for (o, &z) in out.iter_mut().zip(&c[..n]) {
                *o = f(a, b, z);
            }
        }
        (Src::Scalar(a), Src::Scalar(b), Src::Scalar(c)) => out.fill(f(a, b, c)),
    }
}

/// `out = outer(inner(x, y), z)` (or `outer(z, inner(x, y))` when `z_left`) for f32 runs
/// in one loop, rounding after each op exactly as the two ops one after the other do
/// (no contraction into a fused multiply-add). `inner` and `outer` are `Add`, `Sub`, `Mul`
/// or `Div`; anything else is a no-op (the program never pairs other ops).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pair_f32(
    inner: BinaryOp,
    outer: BinaryOp,
    z_left: bool,
    x: Src<'_, f32>,
    y: Src<'_, f32>,
    z: Src<'_, f32>,
    out: &mut [f32],
) {
    macro_rules! with_outer {
        ($f:expr) => {{
            let g = $f;
            macro_rules! go {
                ($e:expr) => {
                    map3(
                        x,
                        y,
                        z,
                        out,
                        #[inline(always)]
                        |a: f32, b: f32, c: f32| $e(g(a, b), c),
                    )
                };
            }
            match (outer, z_left) {
                (BinaryOp::Add, false) => go!(|p: f32, c: f32| p + c),
                (BinaryOp::Add, true) => go!(|p: f32, c: f32| c + p),
                (BinaryOp::Sub, false) => go!(|p: f32, c: f32| p - c),
                (BinaryOp::Sub, true) => go!(|p: f32, c: f32| c - p),
                (BinaryOp::Mul, false) => go!(|p: f32, c: f32| p * c),
                (BinaryOp::Mul, true) => go!(|p: f32, c: f32| c * p),
                (BinaryOp::Div, false) => go!(|p: f32, c: f32| p / c),
                (BinaryOp::Div, true) => go!(|p: f32, c: f32| c / p),
                _ => {}
            }
        }};
    }
    match inner {
        BinaryOp::Add => with_outer!(|a: f32, b: f32| a + b),
        BinaryOp::Sub => with_outer!(|a: f32, b: f32| a - b),
        BinaryOp::Mul => with_outer!(|a: f32, b: f32| a * b),
        BinaryOp::Div => with_outer!(|a: f32, b: f32| a / b),
        _ => {}
    }
}

/// A unary op's run over `inner(x, y)` computed element by element (see
/// [`unary_of_pair`]).
struct RunOf<'a, 'o> {
    inner: BinaryOp,
    x: Src<'a, f32>,
    y: Src<'a, f32>,
    out: &'o mut [f32],
}

impl Map<f32> for RunOf<'_, '_> {
    #[inline(always)]
    fn map<F: Fn(f32) -> f32>(&mut self, f: F) {
        let (x, y) = (self.x, self.y);
        // Closures marked to inline: one left out of line would be compiled without the
        // loop's SIMD features (and `f`'s fused multiply-adds would become library calls).
        match self.inner {
            BinaryOp::Add => map2(
                x,
                y,
                self.out,
                #[inline(always)]
                |a: f32, b: f32| f(a + b),
            ),
            BinaryOp::Sub => map2(
                x,
                y,
                self.out,
                #[inline(always)]
                |a: f32, b: f32| f(a - b),
            ),
            BinaryOp::Mul => map2(
                x,
                y,
                self.out,
                #[inline(always)]
                |a: f32, b: f32| f(a * b),
            ),
            BinaryOp::Div => map2(
                x,
                y,
                self.out,
                #[inline(always)]
                |a: f32, b: f32| f(a / b),
            ),
            _ => {}
        }
    }
}

/// `out = op(inner(x, y))` for f32 runs in one loop (`exp(x - max)`), each op rounding as
/// it does alone. `op` is `Exp` and `inner` is `Add`, `Sub`, `Mul` or `Div` (anything else
/// is a no-op; the program never pairs other ops).
#[inline(always)]
pub(crate) fn unary_of_pair(
    op: UnaryOp,
    inner: BinaryOp,
    x: Src<'_, f32>,
    y: Src<'_, f32>,
    out: &mut [f32],
) {
    // Only `exp` is paired (see `plan_pairs`): one arm keeps one instance of the loops.
    if op == UnaryOp::Exp {
        UnaryOp::Exp.map(&mut RunOf { inner, x, y, out })
    }
}

/// A unary op's run over `-x` computed element by element (see [`unary_of_neg`]).
struct RunOfNeg<'a, 'o> {
    x: Src<'a, f32>,
    out: &'o mut [f32],
}

impl Map<f32> for RunOfNeg<'_, '_> {
    #[inline(always)]
    fn map<F: Fn(f32) -> f32>(&mut self, f: F) {
        map1(
            self.x,
            self.out,
            #[inline(always)]
            |a: f32| f(-a),
        )
    }
}

/// `out = op(-x)` for f32 runs in one loop (`exp(-x)`), the negation exact as alone. `op`
/// is `Exp` (anything else is a no-op; the program pairs no other op with a negation).
#[inline(always)]
pub(crate) fn unary_of_neg(op: UnaryOp, x: Src<'_, f32>, out: &mut [f32]) {
    if op == UnaryOp::Exp {
        UnaryOp::Exp.map(&mut RunOfNeg { x, out })
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
        DType::F16 => super::f16c::round_f16_slice(v),
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

/// Folds a slice with [`LANES`] independent accumulators (so the loop vectorizes), then folds
/// the lanes.
#[inline(always)]
fn fold_lanes<T: Num>(slice: &[T], id: T, f: impl Fn(T, T) -> T + Copy) -> T {
    let mut lanes = [id; LANES];
    let chunks = slice.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            lanes[i] = f(lanes[i], c[i]);
        }
    }
    let mut v = id;
    for &x in rest {
        v = f(v, x);
    }
    f(fold_tree(lanes, f), v)
}

/// The body of [`reduce_segments_f32_avx512`] and [`reduce_segments_f16_avx512`]: 32
/// lanes in two registers fed by `$load` (16 values widened to f32 from a pointer), the
/// tail through `$conv` one value at a time, the lanes folded pairwise; products (and
/// arg-reductions, never asked) take `$portable`.
#[cfg(target_arch = "x86_64")]
macro_rules! avx512_segments {
    ($op:expr, $src:expr, $len:expr, $out:expr, $load:expr, $conv:expr, $portable:path) => {{
        use std::arch::x86_64::*;
        let (op, src, len, out) = ($op, $src, $len, $out);
        macro_rules! pick {
            ($cmp:ident, $blend:ident, $a:expr, $b:expr, $pred:expr) => {{
                let (a, b) = ($a, $b);
                let k = $cmp::<_CMP_UNORD_Q>(a, a) | $cmp::<$pred>(a, b);
                $blend(k, b, a)
            }};
        }
        macro_rules! segments {
            ($f512:expr, $f256:expr, $f128:expr, $fs:expr) => {{
                let id = acc_init::<f32>(op).value;
                let full = len / LANES * LANES;
                for (o, x) in out.iter_mut().zip(src.chunks_exact(len.max(1))) {
                    let (mut a, mut b) = (_mm512_set1_ps(id), _mm512_set1_ps(id));
                    let mut i = 0;
                    while i < full {
                        // SAFETY: `i + 32 <= full <= len = x.len()`: both loads (16 values
                        // each) are in bounds.
                        let (c, d) =
                            unsafe { ($load(x.as_ptr().add(i)), $load(x.as_ptr().add(i + 16))) };
                        a = $f512(a, c);
                        b = $f512(b, d);
                        i += LANES;
                    }
                    let mut rest = id;
                    for &e in &x[full..] {
                        rest = $fs(rest, $conv(e));
                    }
                    let s16 = $f512(a, b);
                    let s8 = $f256(
                        _mm512_castps512_ps256(s16),
                        _mm512_extractf32x8_ps::<1>(s16),
                    );
                    let s4 = $f128(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
                    let s2 = $f128(s4, _mm_movehl_ps(s4, s4));
                    let s1 = $f128(s2, _mm_movehdup_ps(s2));
                    *o = $fs(_mm_cvtss_f32(s1), rest);
                }
            }};
        }
        match op {
            ReduceOp::Sum => segments!(
                _mm512_add_ps,
                _mm256_add_ps,
                _mm_add_ps,
                |a: f32, b: f32| a + b
            ),
            ReduceOp::Max => segments!(
                |a, b| pick!(_mm512_cmp_ps_mask, _mm512_mask_blend_ps, a, b, _CMP_GT_OQ),
                |a, b| pick!(_mm256_cmp_ps_mask, _mm256_mask_blend_ps, a, b, _CMP_GT_OQ),
                |a, b| pick!(_mm_cmp_ps_mask, _mm_mask_blend_ps, a, b, _CMP_GT_OQ),
                max_nan::<f32>
            ),
            ReduceOp::Min => segments!(
                |a, b| pick!(_mm512_cmp_ps_mask, _mm512_mask_blend_ps, a, b, _CMP_LT_OQ),
                |a, b| pick!(_mm256_cmp_ps_mask, _mm256_mask_blend_ps, a, b, _CMP_LT_OQ),
                |a, b| pick!(_mm_cmp_ps_mask, _mm_mask_blend_ps, a, b, _CMP_LT_OQ),
                min_nan::<f32>
            ),
            _ => $portable(op, src, len, out),
        }
    }};
}

/// [`reduce_segments_portable`] over f32 in AVX-512 registers: the same 32 lanes (two
/// registers), the same tail fold and the same pairwise lane tree as [`fold_lanes`], so the
/// same bits, without a call and the lanes' round trip through memory per segment (a
/// packed run reduces one segment per row, 16 of them for rows of 64). Products take the
/// portable path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq")]
pub(crate) fn reduce_segments_f32_avx512(op: ReduceOp, src: &[f32], len: usize, out: &mut [f32]) {
    avx512_segments!(
        op,
        src,
        len,
        out,
        |p: *const f32| _mm512_loadu_ps(p),
        |x: f32| x,
        reduce_segments_portable
    )
}

/// [`reduce_segments_f16_portable`] in AVX-512 registers, each 16 stored f16 widened by one
/// instruction (exact, as the portable conversion): the same lanes and order, so the same
/// bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq")]
pub(crate) fn reduce_segments_f16_avx512(op: ReduceOp, src: &[u16], len: usize, out: &mut [f32]) {
    avx512_segments!(
        op,
        src,
        len,
        out,
        |p: *const u16| _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
        f16_to_f32,
        reduce_segments_f16_portable
    )
}

/// The body of [`reduce_segments_f32_avx2`] and [`reduce_segments_f16_avx2`]: the 32 lanes
/// of [`fold_lanes`] in four 8-wide registers fed by `$load` (8 values widened to f32 from a
/// pointer), the tail through `$conv`, then the same pairwise tree (lane i with lane i + 16,
/// then + 8, + 4, + 2, + 1), so the same bits as the portable fold; products (and
/// arg-reductions, never asked) take `$portable`.
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_segments {
    ($op:expr, $src:expr, $len:expr, $out:expr, $load:expr, $conv:expr, $portable:path) => {{
        use std::arch::x86_64::*;
        let (op, src, len, out) = ($op, $src, $len, $out);
        // `a` where `a` is NaN or wins the comparison with `b`, else `b`: `max_nan` and
        // `min_nan` lane by lane.
        macro_rules! pick {
            ($cmp:ident, $or:ident, $blend:ident, $a:expr, $b:expr, $pred:expr) => {{
                let (a, b) = ($a, $b);
                let k = $or($cmp::<_CMP_UNORD_Q>(a, a), $cmp::<$pred>(a, b));
                $blend(b, a, k)
            }};
        }
        // A max or min: `pick` at both widths, `$fs` for the tail.
        macro_rules! picking {
            ($pred:ident, $fs:expr) => {{
                segments!(
                    |a, b| pick!(_mm256_cmp_ps, _mm256_or_ps, _mm256_blendv_ps, a, b, $pred),
                    |a, b| pick!(_mm_cmp_ps, _mm_or_ps, _mm_blendv_ps, a, b, $pred),
                    $fs
                )
            }};
        }
        macro_rules! segments {
            ($f256:expr, $f128:expr, $fs:expr) => {{
                let id = acc_init::<f32>(op).value;
                let full = len / LANES * LANES;
                for (o, x) in out.iter_mut().zip(src.chunks_exact(len.max(1))) {
                    let mut r = [_mm256_set1_ps(id); 4];
                    let mut i = 0;
                    while i < full {
                        // SAFETY: `i + 32 <= full <= len = x.len()`: the four loads (8 values
                        // each) are in bounds.
                        let c = unsafe {
                            let p = x.as_ptr().add(i);
                            [
                                $load(p),
                                $load(p.add(8)),
                                $load(p.add(16)),
                                $load(p.add(24)),
                            ]
                        };
                        for j in 0..4 {
                            r[j] = $f256(r[j], c[j]);
                        }
                        i += LANES;
                    }
                    let mut rest = id;
                    for &e in &x[full..] {
                        rest = $fs(rest, $conv(e));
                    }
                    let s8 = $f256($f256(r[0], r[2]), $f256(r[1], r[3]));
                    let s4 = $f128(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
                    let s2 = $f128(s4, _mm_movehl_ps(s4, s4));
                    let s1 = $f128(s2, _mm_movehdup_ps(s2));
                    *o = $fs(_mm_cvtss_f32(s1), rest);
                }
            }};
        }
        match op {
            ReduceOp::Sum => segments!(_mm256_add_ps, _mm_add_ps, |a: f32, b: f32| a + b),
            ReduceOp::Max => picking!(_CMP_GT_OQ, max_nan::<f32>),
            ReduceOp::Min => picking!(_CMP_LT_OQ, min_nan::<f32>),
            _ => $portable(op, src, len, out),
        }
    }};
}

/// [`reduce_segments_portable`] over f32 in AVX2 registers (four of them hold the 32
/// lanes): the same bits as the portable fold.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn reduce_segments_f32_avx2(op: ReduceOp, src: &[f32], len: usize, out: &mut [f32]) {
    avx2_segments!(
        op,
        src,
        len,
        out,
        |p: *const f32| _mm256_loadu_ps(p),
        |x: f32| x,
        reduce_segments_portable
    )
}

/// [`reduce_segments_f16_portable`] in AVX2 registers, each 8 stored f16 widened by one F16C
/// instruction (exact, as the portable conversion): the same lanes and order, so the same
/// bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn reduce_segments_f16_avx2(op: ReduceOp, src: &[u16], len: usize, out: &mut [f32]) {
    avx2_segments!(
        op,
        src,
        len,
        out,
        |p: *const u16| _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
        f16_to_f32,
        reduce_segments_f16_portable
    )
}

/// [`reduce_run_16`] over f16 bit patterns, for every `len`-long segment of `src`, into
/// `out` (one value per segment).
#[inline(always)]
pub(crate) fn reduce_segments_f16_portable(op: ReduceOp, src: &[u16], len: usize, out: &mut [f32]) {
    for (o, x) in out.iter_mut().zip(src.chunks_exact(len.max(1))) {
        *o = reduce_run_16(op, x, f16_to_f32);
    }
}

/// [`reduce_run`]'s value of every `len`-long segment of `src`, into `out` (one value per
/// segment).
#[inline(always)]
pub(crate) fn reduce_segments_portable(op: ReduceOp, src: &[f32], len: usize, out: &mut [f32]) {
    for (o, x) in out.iter_mut().zip(src.chunks_exact(len.max(1))) {
        *o = reduce_run::<f32>(op, Src::Slice(x), len, 0).value;
    }
}

/// [`fold_lanes`] over stored values converted as they are read (`conv`): the same lanes
/// and order as folding the converted run, without writing it out first.
#[inline(always)]
fn fold_lanes_from<S: Copy>(
    slice: &[S],
    conv: impl Fn(S) -> f32 + Copy,
    id: f32,
    f: impl Fn(f32, f32) -> f32 + Copy,
) -> f32 {
    let mut lanes = [id; LANES];
    let chunks = slice.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            lanes[i] = f(lanes[i], conv(c[i]));
        }
    }
    let mut v = id;
    for &x in rest {
        v = f(v, conv(x));
    }
    f(fold_tree(lanes, f), v)
}

/// A sum, product, max or min over a run of stored 16-bit floats (`conv` widens one to
/// f32), with the lanes and order of [`reduce_run`] over the widened run, so the result is
/// the same bits. Arg-reductions are not taken here (the program never asks).
#[inline(always)]
pub(crate) fn reduce_run_16(op: ReduceOp, raw: &[u16], conv: impl Fn(u16) -> f32 + Copy) -> f32 {
    let id = acc_init::<f32>(op).value;
    match op {
        ReduceOp::Sum => fold_lanes_from(raw, conv, id, |a: f32, b: f32| a + b),
        ReduceOp::Prod => fold_lanes_from(raw, conv, id, |a: f32, b: f32| a * b),
        ReduceOp::Max => fold_lanes_from(raw, conv, id, |a: f32, b: f32| max_nan(a, b)),
        ReduceOp::Min => fold_lanes_from(raw, conv, id, |a: f32, b: f32| min_nan(a, b)),
        ReduceOp::ArgMax | ReduceOp::ArgMin => id,
    }
}

/// Accumulators of [`fold_lanes`].
const LANES: usize = 32;

/// The lanes of [`fold_lanes`] folded pairwise (lane i with lane i + half, halving): five
/// dependent vector steps instead of 31 dependent scalar ones, which dominated short rows (a
/// softmax over 64 columns). The order is fixed, so results stay deterministic. Kept out of
/// line: inlined, the vectorizer laid the main loop's accumulators out for this tree's
/// narrow steps (16 two-lane registers instead of two 16-lane ones), halving the throughput
/// of every row reduction.
#[inline(never)]
fn fold_tree<T: Num>(mut lanes: [T; LANES], f: impl Fn(T, T) -> T) -> T {
    let mut half = LANES / 2;
    while half > 0 {
        for i in 0..half {
            lanes[i] = f(lanes[i], lanes[i + half]);
        }
        half /= 2;
    }
    lanes[0]
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

/// Reduce positions [`accumulate_rows`] takes at once.
pub(crate) const ACC_ROWS: usize = 8;

/// [`accumulate`] of [`ACC_ROWS`] consecutive reduce positions (`rows[0]` first) for a
/// non-arg reduction: each accumulator is loaded and stored once instead of once per row,
/// and folds the rows in the same order, so the results are the same bits. Returns
/// `false`, leaving `acc` alone, for an arg-reduction (those track indices: the caller
/// takes the rows one at a time).
#[inline(always)]
pub(crate) fn accumulate_rows<T: Num>(op: ReduceOp, rows: [&[T]; ACC_ROWS], acc: &mut [T]) -> bool {
    let n = acc.len();
    let rows = rows.map(|r| &r[..n]);
    macro_rules! fold {
        ($f:expr) => {
            for j in 0..n {
                let f = $f;
                let mut a = acc[j];
                for r in &rows {
                    a = f(a, r[j]);
                }
                acc[j] = a;
            }
        };
    }
    match op {
        ReduceOp::Sum => fold!(T::add),
        ReduceOp::Prod => fold!(T::mul),
        ReduceOp::Max => fold!(max_nan::<T>),
        ReduceOp::Min => fold!(min_nan::<T>),
        ReduceOp::ArgMax | ReduceOp::ArgMin => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lane sets that exercise the tree's order and the combining functions' edge cases:
    /// ties of ±0, NaN in either operand, infinities, values whose sum depends on order.
    fn lane_sets() -> Vec<[f32; LANES]> {
        let mut sets = vec![];
        let mut state = 0x9e37_79b9_u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let specials = [
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e30,
            -1e30,
            1e-30,
        ];
        for k in 0..400 {
            let mut l = [0.0f32; LANES];
            for x in l.iter_mut() {
                let r = next();
                *x = if k % 3 == 0 && r % 5 == 0 {
                    specials[(r as usize / 5) % specials.len()]
                } else {
                    (r as f32 / u32::MAX as f32 - 0.5) * 10f32.powi((r % 9) as i32 - 4)
                };
            }
            sets.push(l);
        }
        // Signed zeros only: which of two equal operands a step keeps shows in the sign.
        for _ in 0..64 {
            let r = next();
            sets.push(std::array::from_fn(|i| {
                if r >> i & 1 == 1 { -0.0 } else { 0.0 }
            }));
        }
        sets
    }

    type Segments<S> = fn(ReduceOp, &[S], usize, &mut [f32]);

    /// The SIMD segment loops this CPU can run, by name, behind safe wrappers.
    #[cfg(target_arch = "x86_64")]
    fn simd_segments() -> Vec<(&'static str, Segments<f32>, Segments<u16>)> {
        let mut v: Vec<(&'static str, Segments<f32>, Segments<u16>)> = vec![];
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq")
        {
            v.push((
                "avx512",
                // SAFETY (both): the features these functions enable were detected above.
                |op, x, len, out| unsafe { reduce_segments_f32_avx512(op, x, len, out) },
                |op, x, len, out| unsafe { reduce_segments_f16_avx512(op, x, len, out) },
            ));
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            v.push((
                "avx2",
                // SAFETY (both): the features these functions enable were detected above.
                |op, x, len, out| unsafe { reduce_segments_f32_avx2(op, x, len, out) },
                |op, x, len, out| unsafe { reduce_segments_f16_avx2(op, x, len, out) },
            ));
        }
        v
    }

    /// Every SIMD f32 loop this CPU has (AVX-512: two 16-wide registers; AVX2: four 8-wide
    /// ones) against the portable fold, bit for bit, over special values and every segment
    /// length class (shorter than the lanes, exact multiples, tails).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn simd_segments_match_the_portable_segments_bit_for_bit() {
        let flat: Vec<f32> = lane_sets().into_iter().flatten().collect();
        for (name, f32_loop, _) in simd_segments() {
            for len in [1usize, 7, 31, 32, 33, 64, 100, 128, 160] {
                let segs = flat.len() / len;
                let src = &flat[..segs * len];
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
                    let mut want = vec![0.0f32; segs];
                    let mut got = vec![0.0f32; segs];
                    reduce_segments_portable(op, src, len, &mut want);
                    f32_loop(op, src, len, &mut got);
                    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
                        assert!(
                            w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()),
                            "{name}: {op:?} over {len}, segment {k}: {w} vs {g}"
                        );
                    }
                }
            }
        }
    }

    /// Every SIMD f16 loop (F16C widening 16 or 8 values per instruction) against the
    /// portable fold over the same patterns, and both against the f32 fold of the widened
    /// values.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn simd_f16_segments_match_the_portable_segments_bit_for_bit() {
        let mut bits: Vec<u16> = lane_sets()
            .into_iter()
            .flatten()
            .map(|x| half::f16::from_f32(x).to_bits())
            .collect();
        // Every f16 pattern too (subnormals, infinities, NaN payloads of both signs).
        bits.extend(0..=u16::MAX);
        let wide: Vec<f32> = bits.iter().map(|&h| f16_to_f32(h)).collect();
        for (name, _, f16_loop) in simd_segments() {
            for len in [1usize, 7, 31, 32, 33, 64, 100, 128, 160] {
                let segs = bits.len() / len;
                let src = &bits[..segs * len];
                for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
                    let mut want = vec![0.0f32; segs];
                    let mut portable = vec![0.0f32; segs];
                    let mut got = vec![0.0f32; segs];
                    reduce_segments_portable(op, &wide[..segs * len], len, &mut want);
                    reduce_segments_f16_portable(op, src, len, &mut portable);
                    f16_loop(op, src, len, &mut got);
                    for (k, ((w, p), g)) in want.iter().zip(&portable).zip(&got).enumerate() {
                        let same = |a: &f32, b: &f32| {
                            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                        };
                        assert!(
                            same(w, p) && same(w, g),
                            "{name}: {op:?} over {len}, segment {k}: {w} (f32) vs {p} \
                             (portable) vs {g}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn segment_reduction_matches_the_run_reduction() {
        for len in [1usize, 31, 32, 33, 64, 100, 128] {
            let x: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.1)
                .collect();
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
                let run = reduce_run::<f32>(op, Src::Slice(&x), len, 0).value;
                let mut seg = [0.0f32; 3];
                let three: Vec<f32> = x.iter().chain(&x).chain(&x).copied().collect();
                reduce_segments_portable(op, &three, len, &mut seg);
                for v in seg {
                    assert_eq!(run.to_bits(), v.to_bits(), "{op:?} over {len}");
                }
            }
        }
    }
}
