//! Times the training step of a CIFAR-shaped CNN on synthetic data: three blocks of 3×3
//! convolution (3→32→64→128 channels, padding 1), ReLU and 2×2 max pooling over 32×32
//! images, then a linear layer to 10 classes, cross entropy and AdamW. Prints the median
//! step time (`--forward` times the forward pass alone).
//!
//! `cargo run --release --example cnn_step -- [--batch N] [--steps N] [--forward]`
//!
//! The step's shapes are what matter here, not learning: the images are a fixed pattern
//! and the labels cycle through the classes. `docs/benchmarks.md` gives measured times.

use kiln::Tensor;
use kiln::nn::functional::cross_entropy;
use kiln::nn::{Conv2d, ConvOptions, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
use kiln::optim::{AdamW, Optimizer};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        match args.iter().position(|a| a == name) {
            Some(i) => Ok(args.get(i + 1).ok_or("missing value")?.parse()?),
            None => Ok(default),
        }
    };
    let batch = value("--batch", 32)?;
    let steps = value("--steps", 25)?.max(6);
    let forward_only = args.iter().any(|a| a == "--forward");
    let same = ConvOptions {
        padding: 1.into(),
        ..Default::default()
    };
    let model = Sequential::new()
        .push(Conv2d::with_options(3, 32, 3, same, 1)?)
        .push(Relu)
        .push(MaxPool2d::new(2))
        .push(Conv2d::with_options(32, 64, 3, same, 2)?)
        .push(Relu)
        .push(MaxPool2d::new(2))
        .push(Conv2d::with_options(64, 128, 3, same, 3)?)
        .push(Relu)
        .push(MaxPool2d::new(2))
        .push(Flatten::new())
        .push(Linear::new(128 * 4 * 4, 10, true, 4)?);
    let mut opt = AdamW::new(model.parameters(), 1e-3, (0.9, 0.999), 1e-8, 1e-4)?;
    let pixels: Vec<f32> = (0..batch * 3 * 32 * 32)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0)
        .collect();
    let x = Tensor::try_from_vec(pixels, [batch, 3, 32, 32])?;
    let y = Tensor::try_from_vec((0..batch as i64).map(|i| i % 10).collect(), [batch])?;
    let mut times = vec![];
    let mut loss_value = 0.0;
    for _ in 0..steps {
        let t = Instant::now();
        if forward_only {
            model.forward(&x)?.realize()?;
        } else {
            opt.zero_grad();
            let loss = cross_entropy(&model.forward(&x)?, &y)?;
            loss.backward()?;
            opt.step()?;
            loss_value = loss.item::<f32>()?;
        }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // The first steps plan (and warm the allocator); the rest replay cached plans.
    let mut cached = times[5..].to_vec();
    cached.sort_by(f64::total_cmp);
    println!(
        "{} batch {batch}: median {:.2} ms, min {:.2} ms over {} steps (first step {:.1} ms){}",
        if forward_only {
            "forward"
        } else {
            "training step"
        },
        cached[cached.len() / 2],
        cached[0],
        cached.len(),
        times[0],
        if forward_only {
            String::new()
        } else {
            format!(", last loss {loss_value:.4}")
        }
    );
    Ok(())
}
