//! Scalar math shared by every layer: vectorizable `f32` kernels ([`f32`](mod@f32), used by the CPU
//! backend's loops and by the counter-based random generator) and `f64` special functions
//! ([`f64`](mod@f64), used by the f64 kernels and the reference evaluator). A leaf module: it
//! depends on nothing else in kiln.

pub mod f32;
pub mod f64;
