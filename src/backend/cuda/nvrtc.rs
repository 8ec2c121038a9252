//! NVRTC: compile rendered CUDA C to CUBIN for one real architecture, with an in-memory and
//! an on-disk cache keyed by (source hash, architecture, NVRTC version).
//!
//! The disk cache lives in `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln/cubin`, else
//! `~/.cache/kiln/cubin`; a second process finds its kernels there and skips NVRTC. NVRTC
//! runs on any x86-64 Linux machine (no GPU needed), which is how CI proves every kernel
//! compiles.

use crate::error::{KilnError, Result};
use cudarc::nvrtc::{result, sys};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Why NVRTC cannot be used here, or `Ok` with its version.
pub fn availability() -> std::result::Result<(i32, i32), String> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "the NVRTC library (libnvrtc.so.13 or .12) was not found on the loader path".into(),
        );
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; nvrtcVersion writes two ints.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {r:?}"));
    }
    Ok((major, minor))
}

pub use super::render::source_hash;

type CacheKey = (u64, String, (i32, i32));

fn memory_cache() -> &'static Mutex<HashMap<CacheKey, Arc<Vec<u8>>>> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Arc<Vec<u8>>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The on-disk cache directory.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KILN_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("kiln").join("cubin"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("kiln").join("cubin"))
}

/// Where a compile came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheHit {
    /// Found in this process's in-memory cache.
    Memory,
    /// Read from the on-disk CUBIN cache.
    Disk,
    /// Compiled by NVRTC now.
    Compiled,
}

/// Compiles `source` (entry `name`) to CUBIN for `arch` (e.g. `sm_90`), using the caches.
pub fn compile_cached(source: &str, name: &str, arch: &str) -> Result<(Arc<Vec<u8>>, CacheHit)> {
    let version = availability().map_err(|reason| KilnError::DeviceUnavailable {
        device: "nvrtc".into(),
        reason,
    })?;
    let key = (source_hash(source), arch.to_string(), version);
    if let Some(c) = memory_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok((c.clone(), CacheHit::Memory));
    }
    let file = cache_dir().map(|d| {
        d.join(format!(
            "{:016x}-{arch}-{}.{}.cubin",
            key.0, version.0, version.1
        ))
    });
    if let Some(bytes) = file.as_ref().and_then(|f| std::fs::read(f).ok()) {
        let c = Arc::new(bytes);
        memory_cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, c.clone());
        return Ok((c, CacheHit::Disk));
    }
    let cubin = Arc::new(compile(source, name, arch)?);
    if let Some(f) = &file {
        // Best effort: a cache that cannot be written only costs a recompile.
        if let Some(dir) = f.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // A temporary file of this compile's own (process and sequence number), renamed
        // into place: two threads compiling the same source never write one file at once,
        // so a reader sees a complete CUBIN or none.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = f.with_extension(format!("tmp{}-{seq}", std::process::id()));
        if std::fs::write(&tmp, cubin.as_slice()).is_ok() {
            let _ = std::fs::rename(&tmp, f);
        }
    }
    memory_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, cubin.clone());
    Ok((cubin, CacheHit::Compiled))
}

/// Compiles without caching. A compile error carries NVRTC's log and the source.
pub fn compile(source: &str, name: &str, arch: &str) -> Result<Vec<u8>> {
    availability().map_err(|reason| KilnError::DeviceUnavailable {
        device: "nvrtc".into(),
        reason,
    })?;
    let err = |msg: String| KilnError::Compile {
        kernel: name.to_string(),
        arch: arch.to_string(),
        log: msg,
        source_code: source.to_string(),
    };
    let src = CString::new(source).map_err(|_| err("source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| err("name contains a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| err(format!("{e:?}")))?;
    let options = [
        format!("--gpu-architecture={arch}"),
        "--fmad=false".to_string(),
        "--std=c++17".to_string(),
    ];
    // SAFETY: `prog` was just created and is destroyed exactly once below.
    let out = unsafe {
        match result::compile_program(prog, &options) {
            Ok(()) => cubin(prog).map_err(err),
            Err(e) => Err(err(format!("{e:?}\n{}", log(prog)))),
        }
    };
    // SAFETY: `prog` is valid and not used afterwards.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// # Safety
/// `prog` is a live, compiled program.
unsafe fn cubin(prog: sys::nvrtcProgram) -> std::result::Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: per the function contract.
    let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(format!(
            "nvrtcGetCUBINSize failed: {r:?} (was a real sm_XX architecture given?)"
        ));
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds `size` bytes, as NVRTC asked for.
    let r = unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcGetCUBIN failed: {r:?}"));
    }
    Ok(buf)
}

/// # Safety
/// `prog` is a live program.
unsafe fn log(prog: sys::nvrtcProgram) -> String {
    // SAFETY: per the function contract; the log is NUL-terminated.
    match unsafe { result::get_program_log(prog) } {
        Ok(raw) => unsafe { CStr::from_ptr(raw.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
        Err(e) => format!("(no log: {e:?})"),
    }
}
