//! A training loop in steady state: after warm-up every step replays one cached plan
//! (forward, backward and the optimizer's in-place updates together), and 1,000 steps keep
//! the graph's node count and the allocator's reserved bytes flat. Runs without the test
//! harness so nothing else shares the process-wide graph, cache and allocator counters.

use kiln::nn::functional::mse_loss;
use kiln::nn::{Mlp, Module};
use kiln::optim::{AdamW, Optimizer};
use kiln::{Device, Tensor, memory, no_grad};

fn data(n: usize, seed: u64) -> (Tensor, Tensor) {
    // y = sum of the features' squares, a smooth target an MLP can fit.
    let x = Tensor::randn_seeded([n, 4], seed);
    x.realize().expect("x");
    let y = no_grad(|| (&x * &x).sum_keepdim(1));
    y.realize().expect("y");
    (x, y)
}

fn main() {
    let model = Mlp::new(&[4, 16, 1], 7).expect("model");
    let mut opt = AdamW::new(model.parameters(), 1e-2, (0.9, 0.99), 1e-8, 0.01).expect("opt");
    let (x, y) = data(32, 1);
    let (mut nodes_at_10, mut reserved_at_10, mut plans_at_10) = (0, 0, 0);
    let (mut first_loss, mut last_loss) = (0.0, 0.0);
    let (mut nodes, mut reserved) = (0, 0);
    let mut report = kiln::RealizeReport::default();
    for step in 0..1000 {
        opt.zero_grad();
        let loss = mse_loss(&model.forward(&x).expect("forward"), &y).expect("loss");
        loss.backward().expect("backward");
        let r = opt.step_report().expect("step");
        if step == 10 {
            report = r;
        }
        // The step realized the loss with everything else.
        assert!(loss.is_realized(), "the loss was left for a second plan");
        let v = loss.item::<f32>().expect("item");
        if step == 0 {
            first_loss = v;
        }
        last_loss = v;
        if step == 10 {
            nodes_at_10 = kiln::graph::live_nodes();
            reserved_at_10 = memory::stats(Device::Cpu).reserved_bytes;
            plans_at_10 = kiln::plan::plans_made();
        }
        if step == 999 {
            nodes = kiln::graph::live_nodes();
            reserved = memory::stats(Device::Cpu).reserved_bytes;
        }
    }
    let plans = kiln::plan::plans_made();
    println!(
        "1000 steps: loss {first_loss:.4} -> {last_loss:.4}; graph nodes {nodes_at_10} -> {nodes}; reserved bytes {reserved_at_10} -> {reserved}; plans made after step 10: {}",
        plans - plans_at_10
    );
    println!(
        "one step: {} kernels, planned peak {} bytes, naive {} bytes (every intermediate kept)",
        report.kernels, report.planned_peak_bytes, report.naive_bytes
    );
    assert!(report.cache_hit && report.planned_peak_bytes < report.naive_bytes);
    assert_eq!(nodes, nodes_at_10, "graph nodes grew");
    assert_eq!(reserved, reserved_at_10, "reserved bytes grew");
    assert_eq!(plans, plans_at_10, "steps after warm-up re-planned");
    assert!(
        last_loss < first_loss * 0.2,
        "did not learn: {first_loss} -> {last_loss}"
    );
    println!("training_loop: 1 passed, 0 failed");
}
