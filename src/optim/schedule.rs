//! Learning-rate schedules.

/// Linear warmup to `base` over `warmup` steps (0-based step `s < warmup` gets
/// `base · (s + 1) / warmup`, so the first step already moves), then cosine decay to
/// `base · min_ratio` at step `total` (and constant after).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosine {
    /// The peak learning rate, reached at the end of the warmup.
    pub base: f64,
    /// Number of warmup steps.
    pub warmup: u64,
    /// The step at which the decay reaches its floor.
    pub total: u64,
    /// The floor as a fraction of `base`.
    pub min_ratio: f64,
}

impl WarmupCosine {
    /// The learning rate for 0-based `step`.
    ///
    /// ```
    /// let s = kiln::optim::WarmupCosine { base: 1.0, warmup: 10, total: 110, min_ratio: 0.1 };
    /// assert!((s.lr(4) - 0.5).abs() < 1e-12);      // warming up: (4 + 1) / 10
    /// assert!((s.lr(10) - 1.0).abs() < 1e-12);     // peak
    /// assert!((s.lr(110) - 0.1).abs() < 1e-12);    // floor
    /// ```
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.base * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let floor = self.base * self.min_ratio;
        floor + (self.base - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}
