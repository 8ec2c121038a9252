//! The plan cache: a realize whose graph has the structure of one seen before replays the
//! cached plan — no planning, no compiling, no new memory — with the new inputs and the new
//! generator values (scalars, seeds), and gives the right results.

use kiln::{DType, Device, Tensor, backend, memory, plan};

/// A small "training step": y = relu(x * w + b) * lr, summed; `lr` and the dropout-like
/// random mask's seed change every step.
fn step(x: &Tensor, w: &Tensor, lr: f64, seed: u64) -> Tensor {
    let mask = Tensor::rand_seeded([4, 8], seed).lt(0.5).cast(DType::F32);
    ((x * w + 1.0).relu() * &mask * lr).sum(1)
}

fn expected(x: &[f32], w: &[f32], lr: f64, seed: u64) -> Vec<f32> {
    let m = Tensor::rand_seeded([4, 8], seed).to_vec::<f32>().unwrap();
    (0..4)
        .map(|r| {
            (0..8)
                .map(|c| {
                    let i = r * 8 + c;
                    let v = (x[i] * w[i] + 1.0).max(0.0) * if m[i] < 0.5 { 1.0 } else { 0.0 };
                    v * lr as f32
                })
                .sum()
        })
        .collect()
}

#[test]
fn a_repeated_structure_replays_without_planning_compiling_or_allocating() {
    let data = |s: u64| {
        let t = Tensor::randn_seeded([4, 8], s);
        t.realize().unwrap();
        t
    };
    // Warm up: the first realize plans, compiles and allocates.
    let (x0, w0) = (data(1), data(2));
    let r0 = step(&x0, &w0, 0.1, 7)
        .realize_with(&Default::default())
        .unwrap();
    assert!(!r0.cache_hit);
    let _ = step(&x0, &w0, 0.1, 7)
        .realize_with(&Default::default())
        .unwrap();
    // (The test's own helpers realize graphs too: warm them up as well.)
    let _ = expected(&[0.0; 32], &[0.0; 32], 1.0, 3);

    let plans = plan::plans_made();
    let compiled = backend::cpu::kernels_compiled();
    let stats = kiln::cache_stats();
    let mut alloc = memory::stats(Device::Cpu);
    for i in 0..20u64 {
        if i == 1 {
            // From the second step on, last step's blocks are free for this one.
            alloc = memory::stats(Device::Cpu);
        }
        let (x, w) = (data(10 + i), data(100 + i));
        let (xv, wv) = (x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        // A different learning rate and seed every step: parameters, not structure.
        let lr = 0.5 / (i + 1) as f64;
        let y = step(&x, &w, lr, 1000 + i);
        let report = y.realize_with(&Default::default()).unwrap();
        assert!(report.cache_hit, "step {i} missed the plan cache");
        let got = y.to_vec::<f32>().unwrap();
        for (g, e) in got.iter().zip(expected(&xv, &wv, lr, 1000 + i)) {
            assert!(
                (g - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "step {i}: {g} vs {e}"
            );
        }
    }
    assert_eq!(plan::plans_made(), plans, "a hit must not plan");
    assert_eq!(
        backend::cpu::kernels_compiled(),
        compiled,
        "a hit must not compile"
    );
    let after = kiln::cache_stats();
    assert!(after.hits >= stats.hits + 20);
    // Inputs made by `data` and `expected` allocate; the replayed program itself takes every
    // block from the allocator's cache. Count only misses (new memory from the system).
    let alloc_after = memory::stats(Device::Cpu);
    assert_eq!(
        alloc_after.misses, alloc.misses,
        "steady state must not reserve new memory"
    );

    // A different structure misses.
    let (x, w) = (data(5), data(6));
    let other = (&x * &w).exp().sum(0);
    assert!(!other.realize_with(&Default::default()).unwrap().cache_hit);
}
