//! The CUDA backend. Kernels of the kernel IR are rendered to CUDA C ([`render`], always
//! built, so codegen is testable anywhere), compiled with NVRTC for the device's own
//! architecture and cached in memory and on disk ([`nvrtc`]), and launched on the device's
//! default stream; memory comes from the same caching allocator core as the CPU's, over
//! plain `cuMemAlloc` blocks; matmuls go through cuBLAS.
//!
//! With the `cuda` feature (on by default) kiln links cudarc with dynamic loading: building
//! needs no CUDA toolkit, and at run time [`availability`] says whether the driver and a GPU
//! are usable — without panicking when `libcuda` is absent.

pub mod render;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod matmul;
#[cfg(feature = "cuda")]
pub mod nvrtc;

use crate::device::Device;
use crate::dtype::Scalar;
use crate::error::{KilnError, Result};
use crate::kernel::{IrOp, Kernel, PlannedKernel, Program, Special, Step};
use crate::memory::Buffer;

/// The number of usable CUDA devices, or why there are none (probed once per process).
pub fn availability() -> std::result::Result<usize, String> {
    static PROBE: std::sync::OnceLock<std::result::Result<usize, String>> =
        std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| {
            #[cfg(feature = "cuda")]
            {
                device::availability()
            }
            #[cfg(not(feature = "cuda"))]
            {
                Err("kiln was built without the `cuda` feature".into())
            }
        })
        .clone()
}

/// True when at least one CUDA device can run kernels.
pub fn is_available() -> bool {
    availability().is_ok()
}

impl Device {
    /// True when `Device::Cuda(0)` is usable (driver present, a GPU visible).
    pub fn cuda_is_available() -> bool {
        is_available()
    }

    /// Number of usable CUDA devices (0 when there is no driver or GPU).
    pub fn cuda_device_count() -> usize {
        availability().unwrap_or(0)
    }
}

#[cfg(not(feature = "cuda"))]
fn unavailable<T>(ordinal: usize) -> Result<T> {
    Err(KilnError::DeviceUnavailable {
        device: Device::Cuda(ordinal).to_string(),
        reason: "kiln was built without the `cuda` feature".into(),
    })
}

/// A buffer of `bytes` on device `ordinal`.
pub fn allocate(ordinal: usize, bytes: usize) -> Result<Buffer> {
    #[cfg(feature = "cuda")]
    {
        device::get(ordinal)?.alloc(bytes)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = bytes;
        unavailable(ordinal)
    }
}

fn check_args(ordinal: usize, kernel: &Kernel, args: &[&Buffer]) -> Result<()> {
    if args.len() != kernel.args.len() {
        return Err(KilnError::internal("wrong number of kernel arguments"));
    }
    for (b, a) in args.iter().zip(&kernel.args) {
        if b.device() != Device::Cuda(ordinal) || b.len_bytes() < a.numel * a.dtype.size_bytes() {
            return Err(KilnError::internal(format!(
                "kernel {}: a {}-byte buffer on {} for an argument of {} bytes",
                kernel.name,
                b.len_bytes(),
                b.device(),
                a.numel * a.dtype.size_bytes()
            )));
        }
    }
    if let Some(mm) = &kernel.matmul {
        for (arg, view) in [(mm.lhs, &mm.lhs_view), (mm.rhs, &mm.rhs_view)] {
            if let Some((lo, hi)) = view.offset_bounds()
                && (lo < 0 || hi as usize >= kernel.args[arg].numel)
            {
                return Err(KilnError::internal(
                    "matmul operand view outside its buffer",
                ));
            }
        }
    }
    Ok(())
}

/// A kernel rendered for CUDA, kept with its planned kernel (rendered, and so checked,
/// even in builds without the `cuda` feature, which then cannot launch it).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
enum Rendered {
    /// A fused kernel (none for a bare matmul).
    Fused(Option<render::RenderedKernel>),
    /// A scatter: a kernel starting the output, then the atomic combining.
    Scatter {
        start: render::RenderedKernel,
        scatter: render::RenderedKernel,
    },
}

/// The kernel rendered for CUDA, made (validated and rendered) on first use and kept with
/// the planned kernel.
fn rendered(pk: &PlannedKernel) -> Result<std::sync::Arc<Rendered>> {
    let kernel = &pk.kernel;
    pk.compiled.get_or_try_init(|| -> Result<Rendered> {
        kernel
            .validate()
            .map_err(|e| KilnError::internal(format!("kernel {}: {e}", kernel.name)))?;
        match &kernel.special {
            Some(Special::Scatter(_)) => {
                let (start, scatter) = render::render_scatter(kernel)?;
                return Ok(Rendered::Scatter { start, scatter });
            }
            Some(Special::Scan { .. } | Special::ArgSort { .. }) => {
                return render::render_lanes(kernel).map(|r| Rendered::Fused(Some(r)));
            }
            None => {}
        }
        let trivial = kernel.matmul.is_some()
            && kernel.ops.len() == 2
            && matches!(kernel.ops[0].op, IrOp::MatmulResult);
        Ok(Rendered::Fused(if trivial {
            None
        } else {
            Some(render::render(kernel)?)
        }))
    })
}

/// Renders the kernels among `kernels` that have not run yet and compiles their sources
/// for `arch` through the NVRTC caches, in parallel on the thread pool; returns how many
/// sources it compiled or found cached. A new plan's kernels are then compiled at once
/// instead of one at a time as each is first launched (NVRTC takes tens of milliseconds a
/// kernel). Failures are left for the launch, which reports them as it always did.
pub fn precompile(kernels: &[&PlannedKernel], arch: &str) -> usize {
    #[cfg(feature = "cuda")]
    {
        use rayon::prelude::*;
        let fresh: Vec<&PlannedKernel> = kernels
            .iter()
            .copied()
            .filter(|pk| !pk.compiled.is_set())
            .collect();
        let sources: Vec<(String, String)> = fresh
            .par_iter()
            .filter_map(|pk| rendered(pk).ok())
            .flat_map_iter(|r| match r.as_ref() {
                Rendered::Fused(Some(k)) => vec![(k.source.clone(), k.name.clone())],
                Rendered::Fused(None) => vec![],
                Rendered::Scatter { start, scatter } => vec![
                    (start.source.clone(), start.name.clone()),
                    (scatter.source.clone(), scatter.name.clone()),
                ],
            })
            .collect();
        // Two kernels may render the same source (the same kernel in two programs): compile
        // it once.
        let mut seen = std::collections::HashSet::new();
        let sources: Vec<(String, String)> = sources
            .into_iter()
            .filter(|(src, _)| seen.insert(render::source_hash(src)))
            .collect();
        sources
            .par_iter()
            .filter(|(src, name)| nvrtc::compile_cached(src, name, arch).is_ok())
            .count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (kernels, arch);
        0
    }
}

/// [`precompile`] for the CUDA kernels of `program` that have not run yet, device by device,
/// where a device has at least two (and opens; otherwise the launch reports why). Called
/// before a program runs; on a cached plan's later runs it finds nothing to do.
pub(crate) fn prepare(program: &Program) {
    let mut fresh: Vec<(usize, Vec<&PlannedKernel>)> = vec![];
    for step in &program.steps {
        if let Step::Kernel(pk) = step
            && let Device::Cuda(n) = pk.device
            && !pk.compiled.is_set()
        {
            match fresh.iter_mut().find(|(o, _)| *o == n) {
                Some((_, ks)) => ks.push(pk),
                None => fresh.push((n, vec![pk])),
            }
        }
    }
    for (ordinal, kernels) in fresh {
        if kernels.len() < 2 {
            continue;
        }
        #[cfg(feature = "cuda")]
        if let Ok(dev) = device::get(ordinal) {
            precompile(&kernels, &dev.arch);
        }
        #[cfg(not(feature = "cuda"))]
        let _ = ordinal;
    }
}

/// Runs one planned kernel on device `ordinal` (arguments in kernel order, all on that
/// device) with the plan's parameter values. The kernel is validated and rendered once and
/// kept with the planned kernel; NVRTC output is cached by source.
pub(crate) fn run_kernel(
    ordinal: usize,
    pk: &PlannedKernel,
    args: &[&Buffer],
    params: &[Scalar],
) -> Result<()> {
    let kernel = &pk.kernel;
    let rendered = rendered(pk)?;
    check_args(ordinal, kernel, args)?;
    #[cfg(feature = "cuda")]
    {
        let dev = device::get(ordinal)?;
        if let Some(mm) = &kernel.matmul {
            matmul::run(&dev, mm, kernel, args)?;
        }
        match rendered.as_ref() {
            Rendered::Fused(Some(r)) => dev.launch(r, args, params),
            Rendered::Fused(None) => Ok(()),
            Rendered::Scatter { start, scatter } => {
                let out = args
                    .last()
                    .ok_or_else(|| KilnError::internal("scatter without an output"))?;
                let init = match &kernel.special {
                    Some(Special::Scatter(s)) => s.init.as_ref().and_then(|(i, _)| args.get(*i)),
                    _ => None,
                };
                match init {
                    Some(init) => dev.launch(start, &[init, out], &[])?,
                    None => dev.launch(start, &[out], &[])?,
                }
                dev.launch(scatter, args, &[])
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (rendered, params);
        unavailable(ordinal)
    }
}

/// Copies a whole buffer to `to` (host↔device or device↔device through the host).
pub(crate) fn copy(src: &Buffer, bytes: usize, to: Device) -> Result<Buffer> {
    #[cfg(feature = "cuda")]
    {
        let mut host = vec![0u8; bytes];
        match src.device() {
            Device::Cpu => {
                if bytes > src.len_bytes() {
                    return Err(KilnError::internal("copy larger than its source"));
                }
                if bytes > 0 {
                    // SAFETY: a host buffer of at least `bytes` initialized bytes that no
                    // kernel writes during this copy.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.host_ptr(), host.as_mut_ptr(), bytes)
                    };
                }
            }
            Device::Cuda(n) => device::get(n)?.download(&mut host, src)?,
        }
        match to {
            Device::Cpu => {
                let dst = crate::memory::alloc_host(bytes)?;
                if bytes > 0 {
                    // SAFETY: a fresh host buffer of at least `bytes` bytes.
                    unsafe { std::ptr::copy_nonoverlapping(host.as_ptr(), dst.host_ptr(), bytes) };
                }
                Ok(dst)
            }
            Device::Cuda(n) => {
                let d = device::get(n)?;
                let dst = d.alloc(bytes)?;
                d.upload(&dst, &host)?;
                Ok(dst)
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (src, bytes);
        match to {
            Device::Cuda(n) => unavailable(n),
            Device::Cpu => unavailable(0),
        }
    }
}

/// Device-to-device copy bandwidth of device `ordinal` in GB/s (bytes read plus bytes
/// written per second), measured with `iters` copies of `bytes` each. The ceiling that
/// benchmark numbers are compared against.
pub fn copy_bandwidth_gbps(ordinal: usize, bytes: usize, iters: usize) -> Result<f64> {
    #[cfg(feature = "cuda")]
    {
        let d = device::get(ordinal)?;
        let (a, b) = (d.alloc(bytes)?, d.alloc(bytes)?);
        d.copy_device(&b, &a, bytes)?;
        d.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..iters.max(1) {
            d.copy_device(&b, &a, bytes)?;
        }
        d.synchronize()?;
        let secs = t.elapsed().as_secs_f64();
        Ok(2.0 * bytes as f64 * iters.max(1) as f64 / secs / 1e9)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (bytes, iters);
        unavailable(ordinal)
    }
}

/// The architecture kernels are compiled for on device `ordinal` (`sm_XX` from its compute
/// capability), opening the device if needed.
pub fn arch(ordinal: usize) -> Result<String> {
    #[cfg(feature = "cuda")]
    {
        Ok(device::get(ordinal)?.arch.clone())
    }
    #[cfg(not(feature = "cuda"))]
    {
        unavailable(ordinal)
    }
}

/// Waits for all work queued on device `ordinal`.
pub fn synchronize(ordinal: usize) -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        device::get(ordinal)?.synchronize()
    }
    #[cfg(not(feature = "cuda"))]
    {
        unavailable(ordinal)
    }
}
