//! One element of any dtype, read from or written to a kernel argument: the scalar path
//! of the kernels that are not elementwise maps (scans, sorts, scatters). Floats are
//! widened to f64 exactly; integers and bools to i64. Writes round floats once (half types
//! through f32, as every cast to them does) and wrap integers to the dtype.

use super::exec::ArgPtr;
use crate::dtype::DType;
use half::{bf16, f16};

/// A value read for accumulation or comparison.
#[derive(Clone, Copy)]
pub(super) enum Num {
    /// A float, widened to f64 exactly.
    F(f64),
    /// An integer or bool.
    I(i64),
}

/// The element at `off` of `a`, read as `dtype`.
///
/// # Safety
/// Element `off` lies inside `a`'s buffer, which holds `dtype` values.
pub(super) unsafe fn read(a: ArgPtr, dtype: DType, off: isize) -> Num {
    // SAFETY: as the function's contract states.
    unsafe {
        match dtype {
            DType::Bool | DType::U8 => Num::I(*a.ptr.offset(off) as i64),
            DType::I32 => Num::I(*(a.ptr as *const i32).offset(off) as i64),
            DType::I64 => Num::I(*(a.ptr as *const i64).offset(off)),
            DType::F16 => Num::F(f16::from_bits(*(a.ptr as *const u16).offset(off)).to_f64()),
            DType::BF16 => Num::F(bf16::from_bits(*(a.ptr as *const u16).offset(off)).to_f64()),
            DType::F32 => Num::F(*(a.ptr as *const f32).offset(off) as f64),
            DType::F64 => Num::F(*(a.ptr as *const f64).offset(off)),
        }
    }
}

/// Writes `v` at element `off` of an output of `dtype`.
///
/// # Safety
/// `off` must be inside the output buffer, and no other thread may access that element.
pub(super) unsafe fn write(a: ArgPtr, dtype: DType, off: usize, v: Num) {
    let (f, i) = match v {
        Num::F(f) => (f, f as i64),
        Num::I(i) => (i as f64, i),
    };
    // SAFETY: as the function's contract states.
    unsafe {
        match dtype {
            DType::Bool => *a.ptr.add(off) = (i != 0) as u8,
            DType::U8 => *a.ptr.add(off) = i as u8,
            DType::I32 => *(a.ptr as *mut i32).add(off) = i as i32,
            DType::I64 => *(a.ptr as *mut i64).add(off) = i,
            DType::F16 => *(a.ptr as *mut u16).add(off) = f16::from_f32(f as f32).to_bits(),
            DType::BF16 => *(a.ptr as *mut u16).add(off) = bf16::from_f32(f as f32).to_bits(),
            DType::F32 => *(a.ptr as *mut f32).add(off) = f as f32,
            DType::F64 => *(a.ptr as *mut f64).add(off) = f,
        }
    }
}
