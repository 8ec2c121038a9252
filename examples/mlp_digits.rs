//! Trains an MLP on the 8×8 handwritten digits (UCI, shipped in `data/`) and reports test
//! accuracy. With a path argument it reads MNIST instead (the four IDX files in that
//! folder: `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`,
//! `t10k-labels-idx1-ubyte`).
//!
//! `cargo run --release --example mlp_digits [-- MNIST_DIR]`
//!
//! Prints per-epoch loss and ends with `test_accuracy: <x>`.

use kiln::nn::functional::cross_entropy;
use kiln::nn::{Mlp, Module};
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
    let (hidden, epochs, bs) = if arg.is_some() {
        (256, 5, 128)
    } else {
        (128, 40, 64)
    };
    println!(
        "data: {} train, {} test, {} features; MLP {} -> {hidden} -> 10",
        train.len(),
        test.len(),
        train.features,
        train.features
    );
    let start = Instant::now();
    let model = Mlp::new(&[train.features, hidden, 10], 42)?;
    let mut opt = AdamW::new(model.parameters(), 3e-3, (0.9, 0.999), 1e-8, 1e-4)?;
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    for epoch in 0..epochs {
        shuffle(&mut order, &mut s);
        let mut total = 0.0;
        let mut batches = 0;
        // Whole batches only: every step has one shape, so one cached plan serves them all.
        for rows in order.chunks_exact(bs) {
            let (x, y) = batch(&train, rows, &[train.features]);
            opt.zero_grad();
            let loss = cross_entropy(&model.forward(&x)?, &y)?;
            loss.backward()?;
            opt.step()?;
            total += loss.item::<f32>()? as f64;
            batches += 1;
        }
        if epoch % 5 == 4 || epoch + 1 == epochs {
            println!(
                "epoch {:>3} loss {:.4} test {:.4} ({:.1} s)",
                epoch + 1,
                total / batches as f64,
                accuracy(&model, &test, &[test.features])?,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let acc = accuracy(&model, &test, &[test.features])?;
    let stats = kiln::cache_stats();
    println!(
        "time: {:.2} s; plan cache: {} hits, {} misses",
        start.elapsed().as_secs_f64(),
        stats.hits,
        stats.misses
    );
    println!("test_accuracy: {acc:.4}");
    Ok(())
}
