//! kiln — a lazy graph-compiling tensor runtime.
//!
//! Tensor ops record nodes in a graph instead of running. [`Tensor::realize`] plans what is
//! needed — views collapse into stride/offset/mask metadata, elementwise chains and
//! reductions fuse into single kernels, intermediates get lifetimes and memory from a
//! bucketed caching allocator — and runs the kernels on a multi-threaded, vectorized CPU
//! backend (CUDA is the second backend).
//!
//! ```
//! use kiln::{RealizeOptions, Tensor};
//!
//! let x = Tensor::randn_seeded(&[256, 512], 0);
//! let y = (&x * 2.0 + 1.0).exp().softmax(-1).sum(1);
//! let plan = y.plan(&RealizeOptions::default()).unwrap();
//! assert_eq!(plan.kernel_count(), 1); // the whole expression is one kernel
//! let v = y.to_vec::<f32>().unwrap();
//! assert!((v[0] - 1.0).abs() < 1e-4);
//! ```
//!
//! The data path, top-down: [`tensor`] (API) → [`graph`] (lazy DAG) → [`plan`] (passes:
//! views, fusion, schedule, memory plan, lowering) → [`kernel`] (IR) → [`backend`] →
//! [`memory`] (buffers, allocators).

#![warn(missing_docs)]

pub mod autograd;
pub mod backend;
pub mod device;
pub mod dtype;
pub mod dump;
pub mod error;
pub mod graph;
pub mod io;
pub mod kernel;
pub mod linalg;
pub mod math;
pub mod memory;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod plan;
pub mod random;
pub mod reference;
pub mod shape;
pub mod tensor;

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// `docs/api.md`'s examples (one per op family), compiled and run as doctests.
#[doc = include_str!("../docs/api.md")]
#[cfg(doctest)]
pub struct ApiDoctests;

pub use autograd::{NoGradGuard, no_grad};
pub use device::Device;
pub use dtype::{DType, Element, Scalar};
pub use error::{KilnError, Result};
/// The half-precision element types of `DType::F16` and `DType::BF16` (from the `half` crate),
/// so `from_vec(vec![f16::from_f32(1.0)], [1])` needs no extra dependency.
pub use half::{bf16, f16};
/// Named tensors in the safetensors format (`kiln::safetensors::{save, load}`); the same
/// module checkpoints use.
pub use io::safetensors;
pub use plan::cache::{CacheStats, cache_stats, clear_cache};
pub use plan::{Plan, RealizeOptions};
pub use random::manual_seed;
pub use shape::{Axes, ShapeLike};
pub use tensor::{
    Index, Operand, QuantileInterpolation, RealizeReport, ScalarOperand, SliceGuard, Subscripts,
    Tensor, Unique, plan_all, realize_all, realize_all_with,
};
