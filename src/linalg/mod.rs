//! `torch.linalg` for kiln: `kiln::linalg::inv(&a)` as PyTorch's `torch.linalg.inv(a)`.
//!
//! - Norms ([`vector_norm`], [`matrix_norm`], [`norm`]) are lazy compositions of
//!   elementwise ops and reductions: they fuse, run on every device and are differentiated
//!   as their parts are (the spectral and nuclear matrix norms go through [`svdvals`]).
//! - Matrix functions ([`matrix_power`], [`matrix_exp`]) are lazy matrix products, fused
//!   and differentiated as their parts are ([`matrix_exp`] reads the 1-norms back to choose
//!   how many squarings each matrix needs).
//! - Decompositions and solvers ([`inv`], [`solve`], [`det`], [`slogdet`], [`cholesky`],
//!   [`qr`], [`eigh`], [`eigvalsh`], [`svd`], [`svdvals`], [`pinv`], [`lstsq`], [`lu_factor`],
//!   [`lu_factor_ex`], [`lu`], [`solve_triangular`], [`svd_full`], [`qr_mode`],
//!   [`matrix_rank`]; [`lu_solve`] and [`cond`] are composed of the others) are computed on the host: the
//!   input is realized and read back (a synchronization point, like a `to_vec`), each
//!   matrix of the batch (`[..., m, n]`) is factored in f64, and the result is a tensor of
//!   the input's dtype (f32 or f64; half types are refused, as PyTorch's LAPACK paths refuse
//!   them) on the input's device. Where the input requires grad, the result carries one
//!   backward rule, the op's vector–Jacobian product recorded from kiln primitives (matmul,
//!   transpose, `tril`, products), so gradients stay lazy and fuse. Second derivatives
//!   through these ops are not available (kiln's backward records no history).
//!
//! Failures that depend on the data (a singular matrix for `inv`/`solve`, one that is not
//! positive-definite for `cholesky`) are [`crate::KilnError::Linalg`] errors naming the
//! batch element, returned when the op is called.

mod decomp;
mod full;
mod host;
mod lstsq;
mod lu;
mod matfn;
mod norm;
mod rank;

pub use decomp::{cholesky, det, eigh, eigvalsh, inv, qr, slogdet, solve, svd, svdvals};
pub use full::{QrMode, qr_mode, svd_full};
pub use lstsq::{Lstsq, LstsqDriver, lstsq, pinv};
pub use lu::{lu, lu_factor, lu_factor_ex, lu_solve, solve_triangular};
pub use matfn::{matrix_exp, matrix_power};
pub use norm::{NormOrd, matrix_norm, norm, vector_norm};
pub use rank::{cond, matrix_rank};

pub(crate) use norm::vector_norm_named;
