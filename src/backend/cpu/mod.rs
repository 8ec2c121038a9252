//! The CPU backend: executes kernel IR with vectorized loops over runs of elements, rayon
//! across blocks of rows, and matmuls through the `gemm` crate.
//!
//! * [`program`] compiles a kernel (reduce axes last, dimensions coalesced, phases,
//!   registers, loop strategy);
//! * [`exec`] runs programs (SIMD level picked at run time);
//! * [`ops`] holds the typed elementwise and reduction loops, [`matmul`] the products.

mod exec;
mod matmul;
mod ops;
mod program;

pub use exec::simd_level;

use crate::device::Device;
use crate::error::{KilnError, Result};
use crate::kernel::{IrOp, Kernel};
use crate::memory::Buffer;
use exec::ArgPtr;

fn check_args(kernel: &Kernel, args: &[&Buffer]) -> Result<Vec<ArgPtr>> {
    if args.len() != kernel.args.len() {
        return Err(KilnError::internal(format!(
            "kernel {} takes {} buffers, got {}",
            kernel.name,
            kernel.args.len(),
            args.len()
        )));
    }
    kernel
        .validate()
        .map_err(|e| KilnError::internal(format!("kernel {}: {e}", kernel.name)))?;
    if let Some(mm) = &kernel.matmul {
        for (arg, view) in [(mm.lhs, &mm.lhs_view), (mm.rhs, &mm.rhs_view)] {
            let a = &kernel.args[arg];
            let fits = match view.offset_bounds() {
                Some((lo, hi)) => lo >= 0 && (hi as usize) < a.numel && view.mask.is_none(),
                None => true,
            };
            if !fits {
                return Err(KilnError::internal(
                    "matmul operand view outside its buffer",
                ));
            }
        }
    }
    args.iter()
        .zip(&kernel.args)
        .map(|(b, a)| {
            let need = a.numel * a.dtype.size_bytes();
            if b.device() != Device::Cpu || b.len_bytes() < need {
                return Err(KilnError::internal(format!(
                    "kernel {}: buffer of {} bytes on {} for an argument of {need} bytes",
                    kernel.name,
                    b.len_bytes(),
                    b.device()
                )));
            }
            Ok(ArgPtr { ptr: b.host_ptr() })
        })
        .collect()
}

/// Runs one kernel on host buffers (`args` in the kernel's argument order).
pub fn run_kernel(kernel: &Kernel, args: &[&Buffer]) -> Result<()> {
    let ptrs = check_args(kernel, args)?;
    let mut in_place = vec![];
    if let Some(mm) = &kernel.matmul {
        let dtype = kernel.args[mm.out].dtype;
        matmul::run(mm, &kernel.shape, dtype, &ptrs)?;
        let trivial = kernel.ops.len() == 2 && matches!(kernel.ops[0].op, IrOp::MatmulResult);
        if trivial {
            return Ok(());
        }
        in_place.push(mm.out);
    }
    let prog = program::compile(kernel, &in_place);
    exec::execute(&prog, &ptrs);
    Ok(())
}
