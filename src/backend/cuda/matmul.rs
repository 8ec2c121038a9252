//! Matmul on CUDA: cuBLAS strided-batched GEMM for f32, f64, f16 and bf16 (half types
//! accumulate in f32), a plain kernel for integers. A transposed operand is passed to cuBLAS
//! as `transa`/`transb` with its leading dimension, not copied; an operand whose strides
//! cuBLAS cannot take (neither dimension unit-stride, or batch dimensions that are not one
//! uniform stride) is first packed into a row-major temporary by a rendered copy kernel.

use super::device::{CudaDevice, Param, driver_err};
use super::render::{self, COMMON_CUH, MATMUL_CUH};
use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::kernel::{Instr, IrOp, Kernel, KernelArg, Level, MatmulSpec};
use crate::memory::Buffer;
use crate::shape::{View, numel};
use cudarc::cublas::{result as blas, sys as bsys};
use std::ffi::c_void;

/// An operand as cuBLAS sees it: buffer address, batch stride, and a `(rows, cols)` matrix
/// with row stride `rs` and column stride `cs` (in elements).
struct Operand {
    addr: u64,
    batch_stride: i64,
    rs: i64,
    cs: i64,
    /// Unit column stride (row-major); otherwise unit row stride (column-major).
    row_major: bool,
    /// Leading dimension as cuBLAS needs it.
    ld: i64,
    /// Keeps a packed temporary alive until the GEMM is queued.
    _packed: Option<Buffer>,
}

/// One uniform stride over the flattened batch dimensions, if there is one.
fn batch_stride(v: &View, batch_dims: usize) -> Option<i64> {
    let dims: Vec<usize> = (0..batch_dims).filter(|&d| v.shape[d] > 1).collect();
    if dims.is_empty() {
        return Some(0);
    }
    for w in dims.windows(2) {
        if v.strides[w[0]] != v.strides[w[1]] * v.shape[w[1]] as isize {
            return None;
        }
    }
    Some(v.strides[*dims.last()?] as i64)
}

fn operand(
    dev: &CudaDevice,
    buf: &Buffer,
    v: &View,
    dtype: DType,
    blas_ok: bool,
) -> Result<Operand> {
    let nd = v.shape.len();
    let (rows, cols) = (v.shape[nd - 2], v.shape[nd - 1]);
    let (rs, cs) = (v.strides[nd - 2] as i64, v.strides[nd - 1] as i64);
    let sz = dtype.size_bytes() as u64;
    // Row-major: unit column stride and rows that do not overlap; column-major likewise.
    let row_ld = if rows <= 1 { cols.max(1) as i64 } else { rs };
    let col_ld = if cols <= 1 { rows.max(1) as i64 } else { cs };
    let row_major =
        (cs == 1 || cols <= 1) && row_ld >= cols.max(1) as i64 && row_ld < i32::MAX as i64;
    let col_major =
        (rs == 1 || rows <= 1) && col_ld >= rows.max(1) as i64 && col_ld < i32::MAX as i64;
    let usable = !blas_ok || row_major || col_major;
    if let (Some(bs), true, true) = (batch_stride(v, nd - 2), usable, v.offset >= 0) {
        return Ok(Operand {
            addr: buf.addr() + v.offset as u64 * sz,
            batch_stride: bs,
            rs,
            cs,
            row_major,
            ld: if row_major { row_ld } else { col_ld },
            _packed: None,
        });
    }
    // Pack into a row-major temporary.
    let shape = v.shape.clone();
    let packed = dev.alloc(numel(&shape) * dtype.size_bytes())?;
    let k = Kernel {
        name: "kiln_pack".into(),
        shape: shape.clone(),
        reduce_axes: vec![],
        args: vec![
            KernelArg {
                dtype,
                numel: buf.len_bytes() / dtype.size_bytes(),
                output: false,
                in_place: false,
            },
            KernelArg {
                dtype,
                numel: numel(&shape),
                output: true,
                in_place: false,
            },
        ],
        ops: vec![
            Instr {
                op: IrOp::Load {
                    arg: 0,
                    view: v.clone(),
                    fill: Scalar::Int(0),
                },
                dtype,
                level: Level::Elem,
            },
            Instr {
                op: IrOp::Store {
                    arg: 1,
                    view: View::contiguous(&shape),
                    src: 0,
                },
                dtype,
                level: Level::Elem,
            },
        ],
        matmul: None,
        special: None,
        fused_ops: vec!["copy".into()],
    };
    let r = render::render(&k)?;
    dev.launch(&r, &[buf, &packed], &[])?;
    Ok(Operand {
        addr: packed.addr(),
        batch_stride: (rows * cols) as i64,
        rs: cols as i64,
        cs: 1,
        row_major: true,
        ld: cols.max(1) as i64,
        _packed: Some(packed),
    })
}

/// Runs the product of a matmul kernel into its output buffer.
pub(crate) fn run(dev: &CudaDevice, mm: &MatmulSpec, k: &Kernel, args: &[&Buffer]) -> Result<()> {
    let dtype = k.args[mm.out].dtype;
    // Planning writes a product into a permuted layout only on the CPU.
    if mm.out_view != View::contiguous(mm.shape()) || mm.shape() != k.shape.as_slice() {
        return Err(KilnError::internal(
            "a CUDA matmul kernel must write its product row-major",
        ));
    }
    let nd = k.shape.len();
    let (m, n) = (k.shape[nd - 2], k.shape[nd - 1]);
    let kk = mm.lhs_view.shape[nd - 1];
    let batch: usize = k.shape[..nd - 2].iter().product();
    let out = args[mm.out];
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let blas_dtype = matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    let a = operand(dev, args[mm.lhs], &mm.lhs_view, dtype, blas_dtype)?;
    let b = operand(dev, args[mm.rhs], &mm.rhs_view, dtype, blas_dtype)?;
    if !blas_dtype {
        let entry = match dtype {
            DType::I32 => "kiln_matmul_i32",
            DType::I64 => "kiln_matmul_i64",
            DType::U8 => "kiln_matmul_u8",
            _ => {
                return Err(KilnError::UnsupportedDType {
                    op: "matmul",
                    dtype,
                    detail: " on CUDA".into(),
                });
            }
        };
        let source = format!("{COMMON_CUH}{MATMUL_CUH}");
        let total = (batch * m * n) as u64;
        let grid = total.div_ceil(256).min(dev.sm_count as u64 * 32).max(1) as u32;
        let p = [
            Param::Ptr(a.addr),
            Param::Ptr(b.addr),
            Param::Ptr(out.addr()),
            Param::I64(batch as i64),
            Param::I64(m as i64),
            Param::I64(n as i64),
            Param::I64(kk as i64),
            Param::I64(a.batch_stride),
            Param::I64(a.rs),
            Param::I64(a.cs),
            Param::I64(b.batch_stride),
            Param::I64(b.rs),
            Param::I64(b.cs),
        ];
        return dev.launch_raw(
            super::render::source_hash(&source),
            &source,
            entry,
            grid,
            256,
            &p,
        );
    }
    let big = [m, n, kk, batch].iter().any(|&x| x >= i32::MAX as usize);
    if big {
        return Err(KilnError::Backend {
            backend: "cuda",
            message: format!(
                "matmul of [{batch}, {m}, {kk}] @ [{kk}, {n}] exceeds cuBLAS's 32-bit sizes"
            ),
        });
    }
    // Row-major C[m,n] = A[m,k]·B[k,n] is column-major Cᵀ[n,m] = Bᵀ[n,k]·Aᵀ[k,m].
    // A row-major operand (unit column stride) read column-major is already its transpose.
    let op_ld = |o: &Operand| -> (bsys::cublasOperation_t, i32) {
        let op = if o.row_major {
            bsys::cublasOperation_t::CUBLAS_OP_N
        } else {
            bsys::cublasOperation_t::CUBLAS_OP_T
        };
        (op, o.ld as i32)
    };
    let (op_b, ld_b) = op_ld(&b);
    let (op_a, ld_a) = op_ld(&a);
    let (ty, compute) = match dtype {
        DType::F32 => (
            bsys::cudaDataType::CUDA_R_32F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::F64 => (
            bsys::cudaDataType::CUDA_R_64F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
        ),
        DType::F16 => (
            bsys::cudaDataType::CUDA_R_16F,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        _ => (
            bsys::cudaDataType::CUDA_R_16BF,
            bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
    };
    let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if dtype == DType::F64 {
        (
            &one64 as *const f64 as *const c_void,
            &zero64 as *const f64 as *const c_void,
        )
    } else {
        (
            &one32 as *const f32 as *const c_void,
            &zero32 as *const f32 as *const c_void,
        )
    };
    dev.bind()?;
    let handle = {
        let mut h = dev.cublas.lock().unwrap_or_else(|e| e.into_inner());
        match *h {
            Some(x) => x,
            None => {
                let x = blas::create_handle().map_err(|e| driver_err("cublasCreate", e))?;
                *h = Some(super::device::Handle(x));
                super::device::Handle(x)
            }
        }
    };
    // SAFETY: every pointer addresses a live device buffer that covers the strided extents
    // (operand views were bounds-checked against their buffers; packed operands are exact);
    // `alpha`/`beta` point at host scalars of the compute type; the handle belongs to this
    // device's context, which is current.
    unsafe {
        blas::gemm_strided_batched_ex(
            handle.0,
            op_b,
            op_a,
            n as i32,
            m as i32,
            kk as i32,
            alpha,
            b.addr as *const c_void,
            ty,
            ld_b.max(1),
            b.batch_stride,
            a.addr as *const c_void,
            ty,
            ld_a.max(1),
            a.batch_stride,
            beta,
            out.addr() as *mut c_void,
            ty,
            n.max(1) as i32,
            (m * n) as i64,
            batch as i32,
            compute,
            bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
        .map_err(|e| driver_err("cublasGemmStridedBatchedEx", e))
    }
}
