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
use kiln::{DType, Tensor, no_grad};
use std::io::Read;
use std::time::Instant;

struct Split {
    x: Vec<f32>,
    y: Vec<i64>,
    features: usize,
}

impl Split {
    fn len(&self) -> usize {
        self.y.len()
    }
}

/// The UCI digits, shuffled with a fixed seed and split 80/20.
fn digits() -> Result<(Split, Split), String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits.csv.gz");
    let file = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .map_err(|e| format!("{path}: {e}"))?;
    let mut rows: Vec<(Vec<f32>, i64)> = vec![];
    for (n, line) in text.lines().enumerate() {
        let vals: Vec<f32> = line
            .split(',')
            .map(|v| v.trim().parse::<f32>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("line {}: {e}", n + 1))?;
        if vals.len() != 65 {
            return Err(format!(
                "line {}: {} values, expected 65",
                n + 1,
                vals.len()
            ));
        }
        rows.push((
            vals[..64].iter().map(|v| v / 16.0).collect(),
            vals[64] as i64,
        ));
    }
    // Fisher–Yates with a fixed xorshift seed.
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    for i in (1..rows.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        rows.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let cut = rows.len() * 4 / 5;
    let split = |r: &[(Vec<f32>, i64)]| Split {
        x: r.iter().flat_map(|(x, _)| x.iter().copied()).collect(),
        y: r.iter().map(|(_, y)| *y).collect(),
        features: 64,
    };
    Ok((split(&rows[..cut]), split(&rows[cut..])))
}

fn idx(path: &std::path::Path) -> Result<(Vec<usize>, Vec<u8>), String> {
    let b = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if b.len() < 4 || b[0] != 0 || b[1] != 0 || b[2] != 8 {
        return Err(format!("{}: not an unsigned-byte IDX file", path.display()));
    }
    let nd = b[3] as usize;
    let head = 4 + 4 * nd;
    if b.len() < head {
        return Err(format!("{}: truncated header", path.display()));
    }
    let dims: Vec<usize> = (0..nd)
        .map(|i| {
            u32::from_be_bytes([b[4 + 4 * i], b[5 + 4 * i], b[6 + 4 * i], b[7 + 4 * i]]) as usize
        })
        .collect();
    let n: usize = dims.iter().product();
    if b.len() != head + n {
        return Err(format!(
            "{}: {} data bytes, expected {n}",
            path.display(),
            b.len() - head
        ));
    }
    Ok((dims, b[head..].to_vec()))
}

/// MNIST from IDX files.
fn mnist(dir: &str) -> Result<(Split, Split), String> {
    let load = |images: &str, labels: &str| -> Result<Split, String> {
        let d = std::path::Path::new(dir);
        let (dims, px) = idx(&d.join(images))?;
        let (_, lb) = idx(&d.join(labels))?;
        let features: usize = dims[1..].iter().product();
        Ok(Split {
            x: px.iter().map(|&v| v as f32 / 255.0).collect(),
            y: lb.iter().map(|&v| v as i64).collect(),
            features,
        })
    };
    Ok((
        load("train-images-idx3-ubyte", "train-labels-idx1-ubyte")?,
        load("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")?,
    ))
}

fn batch(s: &Split, rows: &[usize]) -> (Tensor, Tensor) {
    let f = s.features;
    let x: Vec<f32> = rows
        .iter()
        .flat_map(|&r| s.x[r * f..(r + 1) * f].iter().copied())
        .collect();
    let y: Vec<i64> = rows.iter().map(|&r| s.y[r]).collect();
    (
        Tensor::from_vec(x, [rows.len(), f]),
        Tensor::from_vec(y, [rows.len()]),
    )
}

fn accuracy(model: &Mlp, s: &Split) -> kiln::Result<f64> {
    let all: Vec<usize> = (0..s.len()).collect();
    let mut correct = 0;
    for chunk in all.chunks(1000) {
        let (x, y) = batch(s, chunk);
        let pred = no_grad(|| model.forward(&x))?.try_argmax(1)?;
        let eq = pred.try_eq(&y)?.try_cast(DType::I64)?.try_sum(..)?;
        correct += eq.item::<i64>()?;
    }
    Ok(correct as f64 / s.len() as f64)
}

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
        for i in (1..order.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            order.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut total = 0.0;
        let mut batches = 0;
        // Whole batches only: every step has one shape, so one cached plan serves them all.
        for rows in order.chunks_exact(bs) {
            let (x, y) = batch(&train, rows);
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
                accuracy(&model, &test)?,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let acc = accuracy(&model, &test)?;
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
