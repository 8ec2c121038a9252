//! Creating tensors: from data (a realized leaf), or lazily from a generator (no memory until
//! a kernel reads it).

use super::{Tensor, unwrap_or_panic};
use crate::device::Device;
use crate::dtype::{DType, Element, Scalar};
use crate::error::{KilnError, Result};
use crate::graph::{self, Generator, Op};
use crate::memory;
use crate::shape::{ShapeLike, check_shape};
use std::sync::Arc;

impl Tensor {
    /// A tensor holding `data` (row-major) with `shape`. The vector's memory becomes the
    /// tensor's buffer without a copy.
    ///
    /// ```
    /// let t = kiln::Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2]);
    /// assert_eq!(t.dtype(), kiln::DType::I32);
    /// ```
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl ShapeLike) -> Tensor {
        unwrap_or_panic(Self::try_from_vec(data, shape))
    }

    /// Like [`Tensor::from_vec`], returning an error when `data` does not fill `shape`.
    pub fn try_from_vec<T: Element>(data: Vec<T>, shape: impl ShapeLike) -> Result<Tensor> {
        let shape = shape.dims();
        let n = check_shape("from_vec", &shape, T::DTYPE)?;
        if data.len() != n {
            return Err(KilnError::DataLength {
                op: "from_vec",
                len: data.len(),
                shape,
                numel: n,
            });
        }
        if cfg!(target_endian = "big") {
            // Buffers hold little-endian bytes: convert through a copy.
            return Self::try_from_slice(&data, shape);
        }
        // The vector becomes the tensor's buffer: no copy (its memory is freed when the
        // last tensor reading it is gone).
        let buf = memory::Buffer::from_vec(data);
        let key = graph::with_graph(|g| {
            g.add_buffer(
                Arc::new(buf),
                shape.clone(),
                T::DTYPE,
                Device::Cpu,
                graph::Origin::Data,
            )
        });
        Ok(Tensor::from_node(key, shape, T::DTYPE, Device::Cpu))
    }

    /// A tensor copied from a slice.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: impl ShapeLike) -> Tensor {
        unwrap_or_panic(Self::try_from_slice(data, shape))
    }

    /// Like [`Tensor::from_slice`], returning an error when `data` does not fill `shape`.
    pub fn try_from_slice<T: Element>(data: &[T], shape: impl ShapeLike) -> Result<Tensor> {
        let shape = &shape.dims();
        let n = check_shape("from_vec", shape, T::DTYPE)?;
        if data.len() != n {
            return Err(KilnError::DataLength {
                op: "from_vec",
                len: data.len(),
                shape: shape.to_vec(),
                numel: n,
            });
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        Self::try_from_bytes(bytes, shape, T::DTYPE)
    }

    /// A tensor from raw little-endian bytes of `dtype`, row-major.
    pub fn try_from_bytes(bytes: &[u8], shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = check_shape("from_bytes", shape, dtype)?;
        if bytes.len() != n * dtype.size_bytes() {
            return Err(KilnError::DataLength {
                op: "from_bytes",
                len: bytes.len() / dtype.size_bytes().max(1),
                shape: shape.to_vec(),
                numel: n,
            });
        }
        if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(KilnError::InvalidArgument {
                op: "from_bytes",
                shape: shape.to_vec(),
                reason: "bool bytes must be 0 or 1".into(),
            });
        }
        let buf = memory::alloc_host(bytes.len())?;
        if !bytes.is_empty() {
            // SAFETY: `buf` is a fresh host allocation of at least `bytes.len()` bytes that
            // nothing else references yet; the source slice cannot overlap it.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.host_ptr(), bytes.len()) };
        }
        let key = graph::with_graph(|g| {
            g.add_buffer(
                Arc::new(buf),
                shape.to_vec(),
                dtype,
                Device::Cpu,
                graph::Origin::Data,
            )
        });
        Ok(Tensor::from_node(key, shape.to_vec(), dtype, Device::Cpu))
    }

    /// A zero-dimensional tensor holding one value.
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Self::full_dtype([0usize; 0], value.to_scalar(), T::DTYPE)
    }

    pub(crate) fn generate(
        gen_: Generator,
        shape: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        Tensor::record(Op::Generate(gen_), &[], shape.to_vec(), dtype, device)
    }

    /// Every element equal to `value`, with PyTorch's dtype for it: a float gives f32, an
    /// integer i64, a bool bool.
    ///
    /// ```
    /// use kiln::{DType, Tensor};
    /// assert_eq!(Tensor::full([2, 2], 1.5).dtype(), DType::F32);
    /// assert_eq!(Tensor::full([2], 7).dtype(), DType::I64);
    /// ```
    #[track_caller]
    pub fn full(shape: impl ShapeLike, value: impl Into<Scalar>) -> Tensor {
        let v = value.into();
        let dtype = match v {
            Scalar::Float(_) => DType::default_float(),
            Scalar::Int(_) => DType::I64,
            Scalar::Bool(_) => DType::Bool,
        };
        Self::full_dtype(shape, v, dtype)
    }

    /// Every element equal to `value`, converted to `dtype`.
    #[track_caller]
    pub fn full_dtype(shape: impl ShapeLike, value: impl Into<Scalar>, dtype: DType) -> Tensor {
        unwrap_or_panic(Self::try_full_on(shape, value, dtype, Device::Cpu))
    }

    /// Fallible [`Tensor::full`] (an element count past `usize`, or bytes past the address
    /// space, is a typed error).
    pub fn try_full(shape: impl ShapeLike, value: impl Into<Scalar>) -> Result<Tensor> {
        let v = value.into();
        let dtype = match v {
            Scalar::Float(_) => DType::default_float(),
            Scalar::Int(_) => DType::I64,
            Scalar::Bool(_) => DType::Bool,
        };
        Self::try_full_on(shape, v, dtype, Device::Cpu)
    }

    /// Fallible [`Tensor::full_dtype`].
    pub fn try_full_dtype(
        shape: impl ShapeLike,
        value: impl Into<Scalar>,
        dtype: DType,
    ) -> Result<Tensor> {
        Self::try_full_on(shape, value, dtype, Device::Cpu)
    }

    /// Fallible [`Tensor::zeros`].
    pub fn try_zeros(shape: impl ShapeLike) -> Result<Tensor> {
        Self::try_full_on(shape, 0, DType::default_float(), Device::Cpu)
    }

    /// Fallible [`Tensor::ones`].
    pub fn try_ones(shape: impl ShapeLike) -> Result<Tensor> {
        Self::try_full_on(shape, 1, DType::default_float(), Device::Cpu)
    }

    /// Fallible [`Tensor::zeros_dtype`].
    pub fn try_zeros_dtype(shape: impl ShapeLike, dtype: DType) -> Result<Tensor> {
        Self::try_full_on(shape, 0, dtype, Device::Cpu)
    }

    /// Fallible [`Tensor::ones_dtype`].
    pub fn try_ones_dtype(shape: impl ShapeLike, dtype: DType) -> Result<Tensor> {
        Self::try_full_on(shape, 1, dtype, Device::Cpu)
    }

    /// [`Tensor::full_dtype`] on a chosen device, returning errors.
    pub fn try_full_on(
        shape: impl ShapeLike,
        value: impl Into<Scalar>,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let shape = shape.dims();
        let v = value.into().cast(dtype);
        Self::generate(Generator::Full(v), &shape, dtype, device)
    }

    /// All zeros, f32 (`Tensor::zeros([2, 3])`).
    #[track_caller]
    pub fn zeros(shape: impl ShapeLike) -> Tensor {
        Self::full_dtype(shape, 0, DType::default_float())
    }

    /// All zeros of `dtype`.
    #[track_caller]
    pub fn zeros_dtype(shape: impl ShapeLike, dtype: DType) -> Tensor {
        Self::full_dtype(shape, 0, dtype)
    }

    /// All ones, f32.
    #[track_caller]
    pub fn ones(shape: impl ShapeLike) -> Tensor {
        Self::full_dtype(shape, 1, DType::default_float())
    }

    /// All ones of `dtype`.
    #[track_caller]
    pub fn ones_dtype(shape: impl ShapeLike, dtype: DType) -> Tensor {
        Self::full_dtype(shape, 1, dtype)
    }

    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Tensor {
        unwrap_or_panic(Self::try_full_on(&self.shape, 0, self.dtype, self.device))
    }

    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Tensor {
        unwrap_or_panic(Self::try_full_on(&self.shape, 1, self.dtype, self.device))
    }

    /// `value` with this tensor's shape, dtype and device.
    pub fn full_like(&self, value: impl Into<Scalar>) -> Tensor {
        unwrap_or_panic(Self::try_full_on(
            &self.shape,
            value,
            self.dtype,
            self.device,
        ))
    }

    /// `start, start+step, …` below `end` (above it for a negative step), with
    /// `torch.arange`'s dtype: i64 when every argument is an integer, f32 when any is a
    /// float. [`Tensor::try_arange`] takes an explicit dtype.
    ///
    /// ```
    /// use kiln::{DType, Tensor};
    /// let i = Tensor::arange(0, 5, 2);
    /// assert_eq!((i.dtype(), i.to_vec::<i64>().unwrap()), (DType::I64, vec![0, 2, 4]));
    /// let f = Tensor::arange(0.0, 1.0, 0.25);
    /// assert_eq!(f.to_vec::<f32>().unwrap(), vec![0.0, 0.25, 0.5, 0.75]);
    /// ```
    #[track_caller]
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
    ) -> Tensor {
        let (start, end, step) = (start.into(), end.into(), step.into());
        let any_float = [start, end, step]
            .iter()
            .any(|s| matches!(s, Scalar::Float(_)));
        let dtype = if any_float { DType::F32 } else { DType::I64 };
        unwrap_or_panic(Self::try_arange(start, end, step, dtype))
    }

    /// `start, start+step, …` below `end` (above it for a negative step) in any dtype.
    ///
    /// ```
    /// let t = kiln::Tensor::try_arange(0, 5, 2, kiln::DType::I64).unwrap();
    /// assert_eq!(t.to_vec::<i64>().unwrap(), vec![0, 2, 4]);
    /// ```
    pub fn try_arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        dtype: DType,
    ) -> Result<Tensor> {
        let (start, end, step) = (start.into(), end.into(), step.into());
        let (s, e, st) = (start.to_f64(), end.to_f64(), step.to_f64());
        if st == 0.0 || !st.is_finite() || !s.is_finite() || !e.is_finite() || (e - s) / st < 0.0 {
            return Err(KilnError::InvalidArgument {
                op: "arange",
                shape: vec![],
                reason: format!("cannot step from {start} to {end} by {step}"),
            });
        }
        let n = ((e - s) / st).ceil().max(0.0) as usize;
        Self::generate(
            Generator::Arange {
                start: start.cast(dtype),
                step: step.cast(dtype),
            },
            &[n],
            dtype,
            Device::Cpu,
        )
    }

    /// The `n × n` identity matrix (built from two aranges and a comparison, so it fuses).
    #[track_caller]
    pub fn eye(n: usize, dtype: DType) -> Tensor {
        unwrap_or_panic(Self::try_eye(n, dtype))
    }

    /// Fallible [`Tensor::eye`].
    pub fn try_eye(n: usize, dtype: DType) -> Result<Tensor> {
        crate::shape::check_shape("eye", &[n, n], dtype)?;
        let i = Self::try_arange(0, n as i64, 1, DType::I64)?;
        let rows = i.try_reshape([n as isize, 1])?;
        let cols = i.try_reshape([1, n as isize])?;
        rows.try_eq(&cols)?.try_cast(dtype)
    }

    /// Uniform samples in `[0, 1)`, f32, seeded from the process-wide sequence that
    /// [`manual_seed`](crate::manual_seed) restarts (PyTorch's `torch.rand`).
    #[track_caller]
    pub fn rand(shape: impl ShapeLike) -> Tensor {
        Self::rand_seeded(shape, crate::random::next_seed())
    }

    /// Uniform samples in `[0, 1)`, f32, reproducible from `seed` (a counter-based hash of
    /// the element index, identical on every backend).
    #[track_caller]
    pub fn rand_seeded(shape: impl ShapeLike, seed: u64) -> Tensor {
        unwrap_or_panic(Self::try_rand(shape, seed, DType::F32))
    }

    /// Uniform samples of a float dtype from `seed`.
    pub fn try_rand(shape: impl ShapeLike, seed: u64, dtype: DType) -> Result<Tensor> {
        let shape = shape.dims();
        Self::random(Generator::Rand { seed }, &shape, dtype, "rand")
    }

    /// Standard normal samples, f32, seeded from the process-wide sequence (PyTorch's
    /// `torch.randn`).
    #[track_caller]
    pub fn randn(shape: impl ShapeLike) -> Tensor {
        Self::randn_seeded(shape, crate::random::next_seed())
    }

    /// Standard normal samples, f32, reproducible from `seed`.
    #[track_caller]
    pub fn randn_seeded(shape: impl ShapeLike, seed: u64) -> Tensor {
        unwrap_or_panic(Self::try_randn(shape, seed, DType::F32))
    }

    /// Standard normal samples of a float dtype from `seed`.
    pub fn try_randn(shape: impl ShapeLike, seed: u64, dtype: DType) -> Result<Tensor> {
        let shape = shape.dims();
        Self::random(Generator::Randn { seed }, &shape, dtype, "randn")
    }

    fn random(g: Generator, shape: &[usize], dtype: DType, op: &'static str) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(KilnError::UnsupportedDType {
                op,
                dtype,
                detail: ": random samples need a float dtype".into(),
            });
        }
        Self::generate(g, shape, dtype, Device::Cpu)
    }
}
