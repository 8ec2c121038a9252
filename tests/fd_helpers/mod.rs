//! Helpers shared by `tests/sampling.rs` and `tests/extra_losses.rs`: random values, a
//! relative comparison and a central finite-difference gradient check in f64.

use crate::common::Rng;
use kiln::Tensor;

/// `n` uniform values in `[lo, hi)`.
pub fn values(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| lo + (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo))
        .collect()
}

/// Every `got` within `tol·(1 + |want|)` of `want`.
pub fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{name}[{i}]: kiln {g}, reference {w}"
        );
    }
}

/// Central finite differences (step 10⁻⁶) of the scalar `f` at `x` against its autograd
/// gradient.
pub fn gradcheck(name: &str, x: &[f64], shape: &[usize], f: &dyn Fn(&Tensor) -> Tensor, tol: f64) {
    let leaf = Tensor::from_vec(x.to_vec(), shape).requires_grad_(true);
    f(&leaf).backward().unwrap();
    let got = leaf.grad().unwrap().to_vec::<f64>().unwrap();
    let h = 1e-6;
    let want: Vec<f64> = (0..x.len())
        .map(|i| {
            let mut p = x.to_vec();
            p[i] += h;
            let up = f(&Tensor::from_vec(p.clone(), shape))
                .item::<f64>()
                .unwrap();
            p[i] -= 2.0 * h;
            let down = f(&Tensor::from_vec(p, shape)).item::<f64>().unwrap();
            (up - down) / (2.0 * h)
        })
        .collect();
    assert_close(name, &got, &want, tol);
}
