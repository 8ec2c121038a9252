//! Matrix products on the CPU. f32 and f64 go through the `gemm` crate, which reads both
//! operands through arbitrary row and column strides (a transposed or strided view costs no
//! copy). gemm is built with its `x86-v4` feature: it checks `is_x86_feature_detected!` once
//! and runs AVX-512 kernels where the CPU has them, AVX2+FMA or scalar kernels elsewhere, so
//! one binary runs on any x86-64. f16 and bf16 are widened to f32 copies in parallel,
//! multiplied by the f32 kernels and rounded once at the end (gemm's own f16 path was
//! slower here and rounds partial sums to f16 between blocks); integer products use a plain
//! wrapping loop.

use super::exec::ArgPtr;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::kernel::MatmulSpec;
use crate::shape::View;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

/// One product `out = lhs @ rhs` of a batch: base offsets (elements) and strides.
#[derive(Clone, Copy)]
struct Gemm {
    out: ArgPtr,
    oo: isize,
    lhs: ArgPtr,
    lo: isize,
    l_rs: isize,
    l_cs: isize,
    rhs: ArgPtr,
    ro: isize,
    r_rs: isize,
    r_cs: isize,
    m: usize,
    n: usize,
    k: usize,
}

/// Computes `out[b] = lhs[b] @ rhs[b]` for every batch index. `shape` is `[batch.., m, n]`.
pub(crate) fn run(mm: &MatmulSpec, shape: &[usize], dtype: DType, args: &[ArgPtr]) -> Result<()> {
    let nd = shape.len();
    let (m, n) = (shape[nd - 2], shape[nd - 1]);
    let k = mm.lhs_view.shape[nd - 1];
    let batch: usize = shape[..nd - 2].iter().product();
    let (lhs, rhs, out) = (args[mm.lhs], args[mm.rhs], args[mm.out]);
    let offsets = |v: &View, b: usize| -> isize {
        let mut rem = b;
        let mut off = v.offset;
        for d in (0..nd - 2).rev() {
            let c = rem % shape[d];
            rem /= shape[d];
            off += c as isize * v.strides[d];
        }
        off
    };
    let (ls, rs) = (&mm.lhs_view.strides, &mm.rhs_view.strides);
    let (l_rs, l_cs, r_rs, r_cs) = (ls[nd - 2], ls[nd - 1], rs[nd - 2], rs[nd - 1]);
    let threads = rayon::current_num_threads().max(1);
    let flops = 2.0 * (m * n * k) as f64;
    let parallel_batches = batch >= threads && batch > 1;
    let inner_par = if !parallel_batches && flops > 2e6 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let one = |b: usize| -> Result<()> {
        let lo = offsets(&mm.lhs_view, b);
        let ro = offsets(&mm.rhs_view, b);
        let g = Gemm {
            out,
            oo: (b * m * n) as isize,
            lhs,
            lo,
            l_rs,
            l_cs,
            rhs,
            ro,
            r_rs,
            r_cs,
            m,
            n,
            k,
        };
        // SAFETY: the operand views were checked to lie inside their buffers, so every
        // element gemm reads through (offset, row stride, column stride) is in bounds; the
        // output block [oo, oo + m·n) is inside the output buffer and written by this batch
        // index only; operands and output are distinct buffers.
        unsafe {
            match dtype {
                DType::F32 => gemm_typed::<f32>(g, inner_par),
                DType::F64 => gemm_typed::<f64>(g, inner_par),
                DType::F16 => half_gemm::<f16>(g, inner_par),
                DType::BF16 => half_gemm::<bf16>(g, inner_par),
                DType::I32 => int_gemm::<i32>(g),
                DType::I64 => int_gemm::<i64>(g),
                DType::U8 => int_gemm::<u8>(g),
                DType::Bool => {
                    return Err(KilnError::UnsupportedDType {
                        op: "matmul",
                        dtype,
                        detail: String::new(),
                    });
                }
            }
        }
        Ok(())
    };
    if parallel_batches {
        (0..batch).into_par_iter().try_for_each(one)
    } else {
        (0..batch).try_for_each(one)
    }
}

trait GemmScalar: Copy + 'static {
    const ZERO: Self;
    const ONE: Self;
}
impl GemmScalar for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}
impl GemmScalar for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

/// # Safety
/// Every address `g` describes lies inside its buffer, and `g.out` is not aliased.
unsafe fn gemm_typed<T: GemmScalar>(g: Gemm, par: gemm::Parallelism) {
    let Gemm {
        out,
        oo,
        lhs,
        lo,
        l_rs,
        l_cs,
        rhs,
        ro,
        r_rs,
        r_cs,
        m,
        n,
        k,
    } = g;
    // SAFETY (whole function): the caller guarantees every pointer below addresses elements
    // inside its buffer for the given strides and extents, and that `out` is not aliased.
    unsafe {
        let dst = (out.ptr as *mut T).offset(oo);
        if k == 0 {
            std::slice::from_raw_parts_mut(dst, m * n).fill(T::ZERO);
            return;
        }
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            false,
            (lhs.ptr as *const T).offset(lo),
            l_cs,
            l_rs,
            (rhs.ptr as *const T).offset(ro),
            r_cs,
            r_rs,
            T::ZERO,
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
}

/// A 16-bit float type whose products run through the f32 kernels.
trait HalfFloat: Copy + Send + Sync + 'static {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
    fn to_f32(self) -> f32;
}
impl HalfFloat for f16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}
impl HalfFloat for bf16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Elements converted per rayon task, at least.
const CONVERT_GRAIN: usize = 1 << 14;

/// The address of element `i` of the buffer behind `p`.
fn elem<T>(p: ArgPtr, i: isize) -> *mut T {
    (p.ptr as *mut T).wrapping_offset(i)
}

/// A contiguous f32 copy of the `rows × cols` operand at element `off` of `p` with strides
/// `(rs, cs)`, returned with its own (row, column) strides. The copy keeps the operand's
/// major order (row-major unless the column stride is the larger), so a transposed view is
/// read and written along memory and reaches gemm with the same orientation it had.
///
/// # Safety
/// Every element the view describes lies inside `p`'s buffer.
unsafe fn widen<H: HalfFloat>(
    p: ArgPtr,
    off: isize,
    rs: isize,
    cs: isize,
    rows: usize,
    cols: usize,
) -> (Vec<f32>, isize, isize) {
    let col_major = cs.unsigned_abs() > rs.unsigned_abs();
    let (len, line_stride, step) = if col_major {
        (rows, cs, rs)
    } else {
        (cols, rs, cs)
    };
    let mut v = vec![0f32; rows * cols];
    if let Some(per_task) = CONVERT_GRAIN.checked_div(len) {
        let min_lines = per_task.max(1);
        v.par_chunks_mut(len)
            .with_min_len(min_lines)
            .enumerate()
            .for_each(|(l, dst)| {
                let start = off + l as isize * line_stride;
                if step == 1 {
                    // SAFETY: the line's `len` elements are consecutive and in bounds.
                    let src = unsafe { std::slice::from_raw_parts(elem::<H>(p, start), len) };
                    H::widen(src, dst);
                } else {
                    for (i, d) in dst.iter_mut().enumerate() {
                        // SAFETY: in bounds per the caller's contract.
                        *d = unsafe { *elem::<H>(p, start + i as isize * step) }.to_f32();
                    }
                }
            });
    }
    if col_major {
        (v, 1, rows as isize)
    } else {
        (v, cols as isize, 1)
    }
}

/// f16 and bf16 products: both operands are widened to f32 copies (in parallel, each in its
/// own major order), multiplied by the f32 kernels, and the result is rounded back.
///
/// # Safety
/// As for [`gemm_typed`].
unsafe fn half_gemm<H: HalfFloat>(g: Gemm, par: gemm::Parallelism) {
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the operand views are in bounds per the caller's contract.
    let (mut a, a_rs, a_cs) = unsafe { widen::<H>(g.lhs, g.lo, g.l_rs, g.l_cs, m, k) };
    let (mut b, b_rs, b_cs) = unsafe { widen::<H>(g.rhs, g.ro, g.r_rs, g.r_cs, k, n) };
    let mut c = vec![0f32; m * n];
    let local = |v: &mut Vec<f32>| ArgPtr {
        ptr: v.as_mut_ptr().cast::<u8>(),
    };
    let widened = Gemm {
        out: local(&mut c),
        oo: 0,
        lhs: local(&mut a),
        lo: 0,
        l_rs: a_rs,
        l_cs: a_cs,
        rhs: local(&mut b),
        ro: 0,
        r_rs: b_rs,
        r_cs: b_cs,
        m,
        n,
        k,
    };
    // SAFETY: the three local vectors have exactly the sizes and layouts `widened`
    // describes, and `c` is aliased by nothing else.
    unsafe { gemm_typed::<f32>(widened, par) };
    // SAFETY: the output block is in bounds and written only here.
    let dst = unsafe { std::slice::from_raw_parts_mut(elem::<H>(g.out, g.oo), m * n) };
    let rows_per_task = (CONVERT_GRAIN / n).max(1);
    dst.par_chunks_mut(n)
        .zip(c.par_chunks(n))
        .with_min_len(rows_per_task)
        .for_each(|(d, s)| H::narrow(s, d));
}

trait IntScalar: Copy + Send + Sync + 'static {
    fn zero() -> Self;
    fn mul_add(acc: Self, a: Self, b: Self) -> Self;
}
macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl IntScalar for $t {
            fn zero() -> Self { 0 }
            fn mul_add(acc: Self, a: Self, b: Self) -> Self { acc.wrapping_add(a.wrapping_mul(b)) }
        }
    )*};
}
int_scalar!(i32, i64, u8);

/// # Safety
/// As for [`gemm_typed`].
unsafe fn int_gemm<T: IntScalar>(g: Gemm) {
    let Gemm {
        out,
        oo,
        lhs,
        lo,
        l_rs,
        l_cs,
        rhs,
        ro,
        r_rs,
        r_cs,
        m,
        n,
        k,
    } = g;
    let (a, b) = (lhs.ptr as *const T, rhs.ptr as *const T);
    // SAFETY: the output block is in bounds and written only here.
    let dst = unsafe { std::slice::from_raw_parts_mut((out.ptr as *mut T).offset(oo), m * n) };
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::zero();
            for p in 0..k {
                // SAFETY: in bounds per the caller's contract.
                let (x, y) = unsafe {
                    (
                        *a.offset(lo + i as isize * l_rs + p as isize * l_cs),
                        *b.offset(ro + p as isize * r_rs + j as isize * r_cs),
                    )
                };
                acc = T::mul_add(acc, x, y);
            }
            dst[i * n + j] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Tensor};

    /// Largest |half product − f32 product rounded to the half type|, over the largest
    /// |f32 product|.
    fn half_vs_f32(a: &Tensor, b: &Tensor, dtype: DType) -> f32 {
        let got = a.matmul(b).cast(DType::F32).to_vec::<f32>().unwrap();
        let want = a
            .cast(DType::F32)
            .matmul(&b.cast(DType::F32))
            .cast(dtype)
            .cast(DType::F32)
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        worst / scale
    }

    #[test]
    fn half_products_match_the_rounded_f32_product_for_every_layout() {
        for (dtype, ulp) in [(DType::F16, 2f32.powi(-10)), (DType::BF16, 2f32.powi(-7))] {
            let a = Tensor::try_randn(&[37, 53], 1, dtype).unwrap();
            let b = Tensor::try_randn(&[53, 29], 2, dtype).unwrap();
            let at = Tensor::try_randn(&[53, 37], 3, dtype).unwrap();
            let bt = Tensor::try_randn(&[29, 53], 4, dtype).unwrap();
            let wide = Tensor::try_randn(&[37, 106], 5, dtype).unwrap();
            let batch = Tensor::try_randn(&[3, 37, 53], 6, dtype).unwrap();
            // Realized first, so the products read them through strided views.
            for t in [&a, &b, &at, &bt, &wide, &batch] {
                t.realize().unwrap();
            }
            let cases: [(&str, Tensor, Tensor); 6] = [
                ("a@b", a.clone(), b.clone()),
                ("a.t()@b", at.t(), b.clone()),
                ("a@b.t()", a.clone(), bt.t()),
                ("a.t()@b.t()", at.t(), bt.t()),
                (
                    "a[:, ::2]@flip(b)",
                    wide.slice(&[(0, 37, 1), (0, 106, 2)]),
                    b.flip(&[0]),
                ),
                ("batched", batch, b.clone()),
            ];
            for (name, x, y) in cases {
                let err = half_vs_f32(&x, &y, dtype);
                // Both sides round the same f32 sums; only the f32 summation order may
                // differ between layouts, which moves a result by at most one half ulp.
                assert!(err <= ulp, "{dtype:?} {name}: error {err:e} > {ulp:e}");
            }
        }
    }

    #[test]
    fn empty_and_zero_depth_half_products() {
        for dtype in [DType::F16, DType::BF16] {
            let a = Tensor::zeros(&[4, 0], dtype);
            let b = Tensor::zeros(&[0, 3], dtype);
            let c = a.matmul(&b).cast(DType::F32).to_vec::<f32>().unwrap();
            assert_eq!(c, vec![0.0; 12]);
            let e = Tensor::zeros(&[0, 5], dtype).matmul(&Tensor::zeros(&[5, 3], dtype));
            assert!(e.cast(DType::F32).to_vec::<f32>().unwrap().is_empty());
        }
    }
}
