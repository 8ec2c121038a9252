//! Trains a small convolutional network on the 8×8 handwritten digits (UCI, shipped in
//! `data/`) and reports test accuracy; with a path argument it reads MNIST's IDX files
//! from that folder instead (see `mlp_digits`).
//!
//! `cargo run --release --example cnn_digits [-- MNIST_DIR]`
//!
//! The model is PyTorch's classic shape: two blocks of `Conv2d(3×3, padding 1)`, `ReLU`,
//! `MaxPool2d(2)`, then `Flatten` and a `Linear` classifier. Every training step (forward,
//! backward, AdamW) is one realize, replayed from the plan cache after the first. Prints
//! per-epoch loss, the median step time (`benches/cnn_digits_torch.py` times the same
//! model in PyTorch) and ends with `test_accuracy: <x>`.

use kiln::nn::functional::cross_entropy;
use kiln::nn::{Conv2d, ConvOptions, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
use kiln::optim::{AdamW, Optimizer};
use std::time::Instant;

#[path = "common/digits.rs"]
mod digits;
use digits::{accuracy, batch, digits, mnist, shuffle};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args().nth(1);
    let (train, test) = match &arg {
        Some(dir) => mnist(dir)?,
        None => digits()?,
    };
    let (widths, epochs, bs) = if arg.is_some() {
        ((16, 32), 2, 64)
    } else {
        ((16, 32), 15, 64)
    };
    let side = train.side;
    let same = ConvOptions {
        padding: 1.into(),
        ..Default::default()
    };
    let flat = widths.1 * (side / 4) * (side / 4);
    let model = Sequential::new()
        .push(Conv2d::with_options(1, widths.0, 3, same, 1)?)
        .push(Relu)
        .push(MaxPool2d::new(2))
        .push(Conv2d::with_options(widths.0, widths.1, 3, same, 2)?)
        .push(Relu)
        .push(MaxPool2d::new(2))
        .push(Flatten::new())
        .push(Linear::new(flat, 10, true, 3)?);
    println!(
        "data: {} train, {} test, {side}×{side} images; CNN conv{}-pool-conv{}-pool-linear, {} parameters",
        train.len(),
        test.len(),
        widths.0,
        widths.1,
        model.num_parameters()
    );
    let shape = [1, side, side];
    let start = Instant::now();
    let mut opt = AdamW::new(model.parameters(), 3e-3, (0.9, 0.999), 1e-8, 1e-4)?;
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut step_ms = vec![];
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    for epoch in 0..epochs {
        shuffle(&mut order, &mut s);
        let mut total = 0.0;
        let mut batches = 0;
        // Whole batches only: every step has one shape, so one cached plan serves them all.
        for rows in order.chunks_exact(bs) {
            let (x, y) = batch(&train, rows, &shape);
            let t = Instant::now();
            opt.zero_grad();
            let loss = cross_entropy(&model.forward(&x)?, &y)?;
            loss.backward()?;
            opt.step()?;
            total += loss.item::<f32>()? as f64;
            step_ms.push(t.elapsed().as_secs_f64() * 1e3);
            batches += 1;
        }
        println!(
            "epoch {:>3} loss {:.4} test {:.4} ({:.1} s)",
            epoch + 1,
            total / batches as f64,
            accuracy(&model, &test, &shape)?,
            start.elapsed().as_secs_f64()
        );
    }
    let acc = accuracy(&model, &test, &shape)?;
    let stats = kiln::cache_stats();
    println!(
        "time: {:.2} s; plan cache: {} hits, {} misses",
        start.elapsed().as_secs_f64(),
        stats.hits,
        stats.misses
    );
    step_ms.sort_by(f64::total_cmp);
    println!(
        "step_ms: {:.2} (median of {} training steps, batch {bs})",
        step_ms[step_ms.len() / 2],
        step_ms.len()
    );
    println!("test_accuracy: {acc:.4}");
    Ok(())
}
