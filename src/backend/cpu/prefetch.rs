//! Software prefetch of the next run's memory, spread over the current run's compute.
//!
//! An elementwise kernel evaluates one instruction at a time over a run of up to
//! [`CHUNK`](super::program::CHUNK) elements: its loads come in a burst at the start of the
//! run, with the compute after them touching only cache-resident registers. The hardware
//! prefetchers see no misses during the compute, so every run starts by waiting for
//! memory. [`NextRun`] records, at each contiguous load, the same number of bytes right
//! after it (where the next run of a row-major walk reads) and issues prefetches for them
//! a few lines per instruction, so the reads of run `i + 1` overlap the compute of run `i`.
//! Row kernels hint the next run only in their first pass over a block of rows: later
//! passes re-read the block from cache, and hinting cached lines cost softmax and
//! layer_norm 5–15%. Their second pass instead hints the same runs of the *next* block
//! ([`NextRun::read_at`], `rows` rows on), so its loads arrive while the cached block is
//! computed on. On the Intel Xeon test machine (family 6 model 167, twenty-seventh
//! session) layer_norm over 4096² went from 5.48–5.82 to 4.74–4.81 ms in a quiet hour and
//! from 6.41–6.80 to 5.81–6.19 ms in a busy one (five alternations in one binary);
//! softmax went from 6.93–7.09 to 6.46–6.63 ms in the quiet hour but was 1–2% slower in
//! the busy one (7.66–7.89 → 7.75–8.09 ms). On AMD Zen 2 (three noisy pairs) softmax did
//! not change, so these hints follow [`in_row_reductions`].
//!
//! Only reads are hinted. Hinting the lines a run will store (tried: `prefetcht0`, as the
//! transposes still do) made single-op kernels whose data sat in the last-level cache
//! slower on the Intel Xeon test machine (`tanh` over 2M f32: 0.64 → 0.49 ms without
//! them, `exp` 0.56 → 0.41 ms, `gelu` 1.21 → 1.04 ms) and changed nothing measurable
//! elsewhere; outputs of 16 MiB and more are written with streaming stores, which need no
//! hint (`program::plan_streams`).
//!
//! Prefetches are hints: they never fault and change no value, so a guess that is wrong
//! (the next run is elsewhere, or past the end of the buffer) costs only the hint.
//!
//! The gains on Intel Xeon are in `docs/benchmarks.md`. On AMD EPYC the answer depends on
//! the generation. On Zen 3 (AVX2) earlier designs that hinted whole runs at once were
//! slower, and this one, measured there in the fifteenth session, sped up layer_norm by
//! ≈ 6%, slowed `a*b+c` and left the chain, softmax and the transpose unchanged. On Zen 4
//! (AVX-512; sixteenth session, five alternations of the bench's f32 rows) it made the
//! 8-op chain over 16M elements 25% faster (11.9–12.3 → 8.9–9.2 ms) and the transpose of
//! 4096² 10–20% faster, left `a*b+c`, softmax, layer_norm, the products and a char_gpt
//! step unchanged, but made the row sum ≈ 10% slower (best of 21: 1.54–1.73 → 1.72–2.21
//! ms, five of five pairs). So the hints are on by default on Intel CPUs and on CPUs with
//! AVX-512 ([`enabled`]), and in row reductions only on Intel CPUs ([`in_row_reductions`]).
//! `KILN_PREFETCH=1` or `=0` overrides both.

/// Cache line size assumed for stepping through a range.
pub(crate) const LINE: usize = 64;
/// Lines issued per instruction at least (more when much is pending; see [`NextRun::step`]).
const MIN_LINES_PER_STEP: usize = 16;

/// A byte range to prefetch.
#[derive(Clone, Copy, Default)]
struct Pending {
    at: usize,
    left: usize,
}

/// The ranges the next run will touch that are not prefetched yet (a few streams: a
/// kernel with more loses the hints for the rest, nothing else).
#[derive(Default)]
pub(crate) struct NextRun {
    q: [Pending; 6],
    /// Lines hinted so far (for the tests).
    issued: usize,
}

impl NextRun {
    /// Records that the next run reads the `bytes` bytes right after `[ptr, ptr + bytes)`.
    #[inline(always)]
    pub(crate) fn read_after(&mut self, ptr: *const u8, bytes: usize) {
        if bytes < LINE {
            return;
        }
        if let Some(slot) = self.q.iter_mut().find(|p| p.left == 0) {
            *slot = Pending {
                at: (ptr as usize).wrapping_add(bytes),
                left: bytes,
            };
        }
    }

    /// Records that a later run reads `[ptr, ptr + bytes)`.
    #[inline(always)]
    pub(crate) fn read_at(&mut self, ptr: *const u8, bytes: usize) {
        if bytes < LINE {
            return;
        }
        if let Some(slot) = self.q.iter_mut().find(|p| p.left == 0) {
            *slot = Pending {
                at: ptr as usize,
                left: bytes,
            };
        }
    }

    /// Issues a share of what is pending: a quarter of it, at least
    /// [`MIN_LINES_PER_STEP`] lines. Called once per evaluated instruction.
    #[inline(always)]
    pub(crate) fn step(&mut self) {
        let pending: usize = self.q.iter().map(|p| p.left).sum::<usize>() / LINE;
        if pending > 0 {
            self.issue((pending / 4).max(MIN_LINES_PER_STEP));
        }
    }

    /// Issues everything still pending (at the end of a run, so no range goes stale).
    #[inline(always)]
    pub(crate) fn finish(&mut self) {
        self.issue(usize::MAX);
    }

    #[inline(always)]
    fn issue(&mut self, mut lines: usize) {
        for p in &mut self.q {
            if p.left == 0 || lines == 0 {
                continue;
            }
            // One tight loop per range (the counters outside it).
            let count = p.left.div_ceil(LINE).min(lines);
            for k in 0..count {
                hint(p.at.wrapping_add(k * LINE), false);
            }
            self.issued += count;
            p.at = p.at.wrapping_add(count * LINE);
            p.left = p.left.saturating_sub(count * LINE);
            lines -= count;
        }
    }
}

/// Whether the CPU backend issues software prefetch hints: `KILN_PREFETCH` (`0` or `1`)
/// when set, else on for Intel CPUs and CPUs with AVX-512 (see the module docs). Read once.
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| override_from_env().unwrap_or_else(|| is_intel() || has_avx512()))
}

/// Whether the first pass of a row reduction issues hints: as [`enabled`] when
/// `KILN_PREFETCH` is set, else on Intel CPUs only (see the module docs).
pub(crate) fn in_row_reductions() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| override_from_env().unwrap_or_else(is_intel))
}

/// `KILN_PREFETCH`: `Some(false)` for `0`, `Some(true)` for `1`, else `None`.
fn override_from_env() -> Option<bool> {
    match std::env::var("KILN_PREFETCH").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }
}

/// Whether the CPU has AVX-512 Foundation (whether or not kiln's SIMD level uses it).
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU's vendor string is `GenuineIntel`.
fn is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU and only reads identification
        // registers.
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        &v == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Hints for every line of `[addr, addr + bytes)` (the range may lie outside any buffer:
/// a hint never faults).
#[inline(always)]
pub(crate) fn hint_range(addr: usize, bytes: usize, write: bool) {
    for off in (0..bytes).step_by(LINE) {
        hint(addr.wrapping_add(off), write);
    }
}

/// One prefetch hint for the line holding `addr`: into L2 for a line that will be read,
/// into L1 for one that will be written (so the store finds it there instead of waiting).
/// `prefetchw` (the line in an exclusive state) measured slower than `prefetcht0` for the
/// written lines on the Intel Xeon test machine (transpose 6.0 -> 7.2 ms), so it is not used.
#[inline(always)]
pub(crate) fn hint(addr: usize, write: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        let p = addr as *const i8;
        // SAFETY: a prefetch is a hint that never faults and has no architectural effect:
        // it is sound for any address, inside an allocation or not (nothing is
        // dereferenced).
        unsafe {
            if write {
                _mm_prefetch::<_MM_HINT_T0>(p)
            } else {
                _mm_prefetch::<_MM_HINT_T1>(p)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (addr, write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(n: &NextRun) -> usize {
        n.q.iter().map(|p| p.left.div_ceil(LINE)).sum()
    }

    #[test]
    fn a_run_is_hinted_line_by_line_and_spread_over_steps() {
        let buf = vec![0u8; 3 * 4096];
        let mut n = NextRun::default();
        n.read_after(buf.as_ptr(), 4096);
        n.read_after(buf[4096..].as_ptr(), 4096);
        assert_eq!(
            n.q[0].at,
            buf.as_ptr() as usize + 4096,
            "the range after the run"
        );
        assert_eq!(pending(&n), 128);
        n.step();
        assert_eq!(n.issued, 32, "a quarter of what is pending");
        n.step();
        assert_eq!(n.issued, 32 + 24);
        for _ in 0..20 {
            n.step();
        }
        assert_eq!(
            n.issued, 128,
            "steps drain everything, at least 16 lines each"
        );
        assert_eq!(pending(&n), 0);
    }

    #[test]
    fn a_range_ahead_is_hinted_from_its_start() {
        let data = vec![0u8; 64 * 40];
        let base = data.as_ptr();
        let mut n = NextRun::default();
        // SAFETY: offset 64 * 8 is inside `data`.
        n.read_at(unsafe { base.add(64 * 8) }, 64 * 20);
        assert_eq!(pending(&n), 20);
        assert_eq!(n.q[0].at, base as usize + 64 * 8);
        n.finish();
        assert_eq!((n.issued, pending(&n)), (20, 0));
        // Less than a line: nothing recorded.
        n.read_at(base, LINE - 1);
        assert_eq!(pending(&n), 0);
    }

    #[test]
    fn finish_issues_the_rest_and_short_runs_are_skipped() {
        let buf = vec![0u8; 1 << 14];
        let mut n = NextRun::default();
        n.read_after(buf.as_ptr(), 32);
        assert_eq!(pending(&n), 0, "less than a line is not worth a hint");
        for k in 0..8 {
            n.read_after(buf[k * 1024..].as_ptr(), 1024);
        }
        assert_eq!(
            pending(&n),
            6 * 16,
            "six streams are kept, the rest dropped"
        );
        n.finish();
        assert_eq!(n.issued, 96);
        assert_eq!(pending(&n), 0);
        // The slots are free again.
        n.read_after(buf.as_ptr(), 1024);
        assert_eq!(pending(&n), 16);
    }
}
