//! One CUDA device: its primary context, its caching allocator, the loaded kernels, and
//! launches and copies. All work goes to the context's default (legacy) stream, so kernels
//! run in launch order, a block released to the allocator cache can only be reused by work
//! queued after its last reader, and a synchronous copy to the host sees every earlier
//! kernel's result.

use super::nvrtc;
use super::render::{BLOCK, Launch, ParamForm, RenderedKernel, SPLIT_SCRATCH_BYTES, SPLIT_SLOTS};
use crate::device::Device;
use crate::dtype::Scalar;
use crate::error::{KilnError, Result};
use crate::memory::{self, Buffer, CachingAllocator, DeviceMemory, RoundingPolicy};
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};

/// A raw driver handle. Driver handles may be used from any thread once the owning context
/// is current there, which [`CudaDevice::bind`] ensures before every call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handle<T>(pub T);
// SAFETY: see the type's documentation; the handles are never dereferenced by Rust code.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}

pub(crate) fn driver_err(what: &str, e: impl std::fmt::Debug) -> KilnError {
    KilnError::Backend {
        backend: "cuda",
        message: format!("{what}: {e:?}"),
    }
}

/// Why the driver cannot be used, or the number of devices.
pub(crate) fn availability() -> std::result::Result<usize, String> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err("the NVIDIA driver library (libcuda.so) was not found".into());
    }
    result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    let n = result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))?;
    if n <= 0 {
        return Err("the driver reports no CUDA device".into());
    }
    Ok(n as usize)
}

/// Device memory for the caching allocator: plain `cuMemAlloc` allocations.
pub(crate) struct CudaMemory {
    ordinal: usize,
    ctx: Handle<sys::CUcontext>,
}

impl DeviceMemory for CudaMemory {
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    fn alloc(&self, bytes: usize, _align: usize) -> std::result::Result<u64, ()> {
        // SAFETY: the context is valid for the process lifetime (primary context, retained).
        unsafe {
            result::ctx::set_current(self.ctx.0).map_err(|_| ())?;
            // cuMemAlloc returns at least 256-byte aligned memory; sizes are 512-rounded.
            result::malloc_sync(bytes.max(1)).map_err(|_| ())
        }
    }

    unsafe fn free(&self, addr: u64, _bytes: usize, _align: usize) {
        // SAFETY: the caller passes an address from `alloc` that nothing uses anymore; work
        // on the default stream that read it has completed once cuMemFree returns (it
        // synchronizes).
        unsafe {
            let _ = result::ctx::set_current(self.ctx.0);
            let _ = result::free_sync(addr);
        }
    }

    fn free_bytes(&self) -> Option<usize> {
        // SAFETY: see `alloc`.
        unsafe { result::ctx::set_current(self.ctx.0).ok()? };
        result::mem_get_info().ok().map(|(free, _)| free)
    }
}

/// An initialized device.
pub(crate) struct CudaDevice {
    ctx: Handle<sys::CUcontext>,
    /// `sm_XX` from the compute capability.
    pub arch: String,
    pub sm_count: u32,
    pub allocator: Arc<CachingAllocator<CudaMemory>>,
    /// Loaded functions by [`super::render::source_hash`] of their source and of their name
    /// (one source can hold several entry points: the integer matmuls).
    functions: Mutex<HashMap<(u64, u64), Handle<sys::CUfunction>>>,
    /// The split reductions' scratch area (`SPLIT_SCRATCH_BYTES`, counters zeroed), made on
    /// first use and kept. One per device is enough because all work runs on the default
    /// stream, one kernel after another; kernels running concurrently (other streams, CUDA
    /// graphs) would each need their own.
    split_scratch: Mutex<Option<Buffer>>,
    pub(crate) cublas: Mutex<Option<Handle<cudarc::cublas::sys::cublasHandle_t>>>,
}

impl CudaDevice {
    fn open(ordinal: usize) -> Result<CudaDevice> {
        let unavailable = |reason: String| KilnError::DeviceUnavailable {
            device: Device::Cuda(ordinal).to_string(),
            reason,
        };
        let count = availability().map_err(unavailable)?;
        if ordinal >= count {
            return Err(unavailable(format!("only {count} CUDA device(s) present")));
        }
        let dev = result::device::get(ordinal as i32).map_err(|e| driver_err("cuDeviceGet", e))?;
        // SAFETY: `dev` is a valid device handle; the primary context is retained for the
        // process lifetime and made current on this thread.
        let (ctx, major, minor, sms) = unsafe {
            let ctx = result::primary_ctx::retain(dev)
                .map_err(|e| driver_err("cuDevicePrimaryCtxRetain", e))?;
            result::ctx::set_current(ctx).map_err(|e| driver_err("cuCtxSetCurrent", e))?;
            let attr = |a| {
                result::device::get_attribute(dev, a)
                    .map_err(|e| driver_err("cuDeviceGetAttribute", e))
            };
            (
                ctx,
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            )
        };
        let allocator = Arc::new(CachingAllocator::new(
            CudaMemory {
                ordinal,
                ctx: Handle(ctx),
            },
            RoundingPolicy::CUDA,
        ));
        memory::register_device_allocator(allocator.clone())?;
        Ok(CudaDevice {
            ctx: Handle(ctx),
            arch: format!("sm_{major}{minor}"),
            sm_count: sms.max(1) as u32,
            allocator,
            functions: Mutex::new(HashMap::new()),
            split_scratch: Mutex::new(None),
            cublas: Mutex::new(None),
        })
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the primary context stays retained for the process lifetime.
        unsafe { result::ctx::set_current(self.ctx.0) }
            .map_err(|e| driver_err("cuCtxSetCurrent", e))
    }

    /// A buffer of `bytes` from the caching allocator.
    pub fn alloc(&self, bytes: usize) -> Result<Buffer> {
        let block = self.allocator.allocate(bytes)?;
        Ok(Buffer::new(block, self.allocator.clone()))
    }

    /// The loaded function `name` of `source`, whose [`super::render::source_hash`] is `key`
    /// (compiled through the NVRTC caches on first use).
    pub fn function(&self, key: u64, source: &str, name: &str) -> Result<Handle<sys::CUfunction>> {
        let key = (key, super::render::source_hash(name));
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(*f);
        }
        let (cubin, _) = nvrtc::compile_cached(source, name, &self.arch)?;
        self.bind()?;
        let cname = CString::new(name).map_err(|_| KilnError::internal("kernel name with NUL"))?;
        // SAFETY: `cubin` is a complete CUBIN image for this device's architecture; the
        // module stays loaded for the process lifetime (functions are cached).
        let f = unsafe {
            let module = result::module::load_data(cubin.as_ptr() as *const c_void)
                .map_err(|e| driver_err("cuModuleLoadData", e))?;
            result::module::get_function(module, cname)
                .map_err(|e| driver_err("cuModuleGetFunction", e))?
        };
        self.functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Handle(f));
        Ok(Handle(f))
    }

    /// Launches a rendered kernel over buffer arguments.
    pub fn launch(&self, k: &RenderedKernel, args: &[&Buffer], values: &[Scalar]) -> Result<()> {
        if !k.error_word {
            return self.launch_checked(k, args, values, None);
        }
        // A kernel that indexes gets a zeroed error word, read back after it ran.
        let err = self.alloc(24)?;
        self.upload(&err, &[0u8; 24])?;
        self.launch_checked(k, args, values, Some(&err))?;
        let mut word = [0u8; 24];
        self.download(&mut word, &err)?;
        let w = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&word[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        if w(0) != 0 {
            return Err(KilnError::IndexOutOfRange {
                op: crate::error::INDEXED_LOAD,
                index: w(1) as i64,
                size: w(2) as usize,
            });
        }
        Ok(())
    }

    fn launch_checked(
        &self,
        k: &RenderedKernel,
        args: &[&Buffer],
        values: &[Scalar],
        err: Option<&Buffer>,
    ) -> Result<()> {
        let (grid, block) = match k.launch {
            Launch::Elementwise { numel } => {
                if numel == 0 {
                    return Ok(());
                }
                let blocks = numel
                    .div_ceil(BLOCK as u64)
                    .min(self.sm_count as u64 * 32)
                    .max(1);
                (blocks as u32, BLOCK)
            }
            Launch::Rows {
                groups,
                block,
                splits,
            } => {
                if groups == 0 {
                    return Ok(());
                }
                // A split kernel's grid is exactly `groups * splits` (bounded by the renderer
                // through SPLIT_SLOTS); otherwise blocks loop over the groups.
                let grid = if splits > 1 {
                    groups * splits as u64
                } else {
                    groups.min(i32::MAX as u64)
                };
                (grid as u32, block)
            }
        };
        let mut params: Vec<Param> = args.iter().map(|b| Param::Ptr(b.addr())).collect();
        for &(slot, form) in &k.params {
            let v = values
                .get(slot)
                .copied()
                .ok_or_else(|| KilnError::internal("kernel parameter slot out of range"))?;
            params.push(Param::I64(match form {
                ParamForm::Float => v.to_f64().to_bits() as i64,
                ParamForm::Int => v.to_i64(),
            }));
        }
        if k.split_scratch {
            let base = self.split_scratch()?;
            params.push(Param::Ptr(base));
            params.push(Param::Ptr(base + (SPLIT_SLOTS * 16) as u64));
        }
        if let Some(e) = err {
            params.push(Param::Ptr(e.addr()));
        }
        self.launch_raw(k.hash, &k.source, &k.name, grid, block, &params)
    }

    /// The address of the split-reduction scratch area, allocated with zeroed counters on
    /// first use.
    fn split_scratch(&self) -> Result<u64> {
        let mut slot = self.split_scratch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = slot.as_ref() {
            return Ok(b.addr());
        }
        let b = self.alloc(SPLIT_SCRATCH_BYTES)?;
        self.upload(&b, &vec![0u8; SPLIT_SCRATCH_BYTES])?;
        let addr = b.addr();
        *slot = Some(b);
        Ok(addr)
    }

    /// Launches `name` from `source` (whose [`super::render::source_hash`] is `key`) with explicit
    /// parameters.
    pub fn launch_raw(
        &self,
        key: u64,
        source: &str,
        name: &str,
        grid: u32,
        block: u32,
        params: &[Param],
    ) -> Result<()> {
        let f = self.function(key, source, name)?;
        self.bind()?;
        let mut values: Vec<u64> = params
            .iter()
            .map(|p| match *p {
                Param::Ptr(a) => a,
                Param::I64(v) => v as u64,
            })
            .collect();
        let mut ptrs: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: the rendered signature takes exactly these parameters (device pointers and
        // 64-bit integers, each passed by address); every pointer addresses a live buffer of
        // at least the size its kernel argument declares (checked by the caller), and the
        // buffers stay alive until later stream work or a synchronizing free.
        unsafe {
            result::launch_kernel(
                f.0,
                (grid, 1, 1),
                (block, 1, 1),
                0,
                std::ptr::null_mut(),
                &mut ptrs,
            )
            .map_err(|e| driver_err(&format!("launch of {name}"), e))
        }
    }

    /// Copies host bytes into a device buffer.
    pub fn upload(&self, dst: &Buffer, src: &[u8]) -> Result<()> {
        if src.len() > dst.len_bytes() {
            return Err(KilnError::internal("upload larger than its buffer"));
        }
        self.bind()?;
        // SAFETY: `dst` holds at least `src.len()` bytes on this device.
        unsafe { result::memcpy_htod_sync(dst.addr(), src) }
            .map_err(|e| driver_err("cuMemcpyHtoD", e))
    }

    /// Copies a device buffer's first `dst.len()` bytes to the host (waits for earlier work).
    pub fn download(&self, dst: &mut [u8], src: &Buffer) -> Result<()> {
        if dst.len() > src.len_bytes() {
            return Err(KilnError::internal("download larger than its buffer"));
        }
        self.bind()?;
        // SAFETY: `src` holds at least `dst.len()` bytes on this device.
        unsafe { result::memcpy_dtoh_sync(dst, src.addr()) }
            .map_err(|e| driver_err("cuMemcpyDtoH", e))
    }

    /// Queues a device-to-device copy of `bytes` from `src` to `dst`.
    pub fn copy_device(&self, dst: &Buffer, src: &Buffer, bytes: usize) -> Result<()> {
        if bytes > dst.len_bytes() || bytes > src.len_bytes() {
            return Err(KilnError::internal("device copy larger than its buffers"));
        }
        self.bind()?;
        // SAFETY: both buffers live on this device and hold at least `bytes` bytes.
        unsafe { result::memcpy_dtod_async(dst.addr(), src.addr(), bytes, std::ptr::null_mut()) }
            .map_err(|e| driver_err("cuMemcpyDtoDAsync", e))
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        result::ctx::synchronize().map_err(|e| driver_err("cuCtxSynchronize", e))
    }
}

/// A kernel parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param {
    Ptr(u64),
    I64(i64),
}

/// The device for an ordinal, opened on first use.
pub(crate) fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    let map = DEVICES.get_or_init(Default::default);
    let mut m = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = m.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Arc::new(CudaDevice::open(ordinal)?);
    m.insert(ordinal, d.clone());
    Ok(d)
}
