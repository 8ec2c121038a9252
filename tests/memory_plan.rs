//! The memory plan and the caching allocator, measured through allocator stats. These share
//! the process-wide host allocator, so they run one after another inside one test.

use kiln::{DType, Device, RealizeOptions, Tensor, memory};

const N: usize = 1 << 24; // 16M f32 = 64 MiB
const BYTES: usize = N * 4;

fn chain(x: &Tensor, ops: usize) -> Tensor {
    let mut y = x.clone();
    for i in 0..ops {
        y = match i % 4 {
            0 => &y * 1.0001,
            1 => &y + 0.5,
            2 => y.maximum(-1.0),
            _ => &y - 0.25,
        };
    }
    y
}

fn unfused_64_op_chain_peaks_at_three_buffers() {
    let x = Tensor::try_rand([N], 7, DType::F32).unwrap();
    x.realize().unwrap();
    let y = chain(&x, 64);
    let plan = y.plan(&RealizeOptions::unfused()).unwrap();
    assert_eq!(plan.kernel_count(), 64);
    // Intermediates only (the input is not planned): two alive at any step.
    assert_eq!(plan.buffers.peak_bytes, 2 * BYTES, "{}", plan.dump_text());
    memory::reset_peak(Device::Cpu);
    let before = memory::stats(Device::Cpu);
    y.realize_with(&RealizeOptions::unfused()).unwrap();
    let after = memory::stats(Device::Cpu);
    println!(
        "unfused 64-op chain over {N} f32: allocator peak {} bytes = {:.2} tensors",
        after.peak_bytes,
        after.peak_bytes as f64 / BYTES as f64
    );
    // The input plus two ping-pong intermediates, where naive allocation would hold 65.
    assert!(
        after.peak_bytes <= 3 * BYTES,
        "peak {} > 3 tensors ({}); before: {before:?}",
        after.peak_bytes,
        3 * BYTES
    );
    // Fused, the same chain needs no intermediate at all.
    memory::reset_peak(Device::Cpu);
    let z = chain(&x, 64);
    let report = z.realize_with(&RealizeOptions::default()).unwrap();
    assert_eq!(report.kernels, 1);
    assert!(memory::stats(Device::Cpu).peak_bytes <= memory::stats(Device::Cpu).current_bytes);
    // Both agree.
    let (a, b) = (y.to_vec::<f32>().unwrap(), z.to_vec::<f32>().unwrap());
    assert_eq!(a, b);
}

fn repeated_realize_reuses_cached_blocks() {
    let x = Tensor::try_rand([1 << 20], 8, DType::F32).unwrap();
    x.realize().unwrap();
    let run = || {
        let y = chain(&x, 8);
        y.realize_with(&RealizeOptions::unfused()).unwrap();
        y.sum(..).item::<f32>().unwrap()
    };
    let first = run();
    let misses = memory::stats(Device::Cpu).misses;
    for _ in 0..5 {
        assert_eq!(run(), first);
    }
    assert_eq!(
        memory::stats(Device::Cpu).misses,
        misses,
        "a warm repeated realize must not allocate new memory"
    );
    assert!(memory::stats(Device::Cpu).hits > 0);
}

fn buffers_held_by_live_tensors_are_kept() {
    let x = Tensor::try_rand([1024], 9, DType::F32).unwrap();
    x.realize().unwrap();
    // `mid` is stored (it is a matmul operand) and a live handle points at it: it keeps its
    // buffer after the plan runs and becomes realized without recomputation.
    let mid = (&x * 2.0).reshape([32, 32]);
    let out = mid.matmul(&mid.t());
    out.realize().unwrap();
    assert!(mid.is_realized());
    assert_eq!(
        mid.to_vec::<f32>().unwrap(),
        x.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v * 2.0)
            .collect::<Vec<_>>()
    );
}

fn trim_returns_cached_memory() {
    {
        let big = Tensor::try_rand([N], 10, DType::F32).unwrap();
        big.realize().unwrap();
    }
    let before = memory::stats(Device::Cpu);
    assert!(before.cached_bytes >= BYTES, "{before:?}");
    let freed = memory::trim(Device::Cpu);
    let after = memory::stats(Device::Cpu);
    assert!(freed >= BYTES);
    assert_eq!(after.cached_bytes, 0);
    assert_eq!(after.reserved_bytes, after.current_bytes);
}

#[test]
fn memory_plan_and_allocator() {
    unfused_64_op_chain_peaks_at_three_buffers();
    repeated_realize_reuses_cached_blocks();
    buffers_held_by_live_tensors_are_kept();
    trim_returns_cached_memory();
}
