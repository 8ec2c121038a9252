//! The data both digit examples read: the UCI 8×8 digits shipped in `data/` (shuffled with
//! a fixed seed, split 80/20) or MNIST's IDX files, and batches of either.

// Each example uses part of it.
#![allow(dead_code)]

use kiln::nn::Module;
use kiln::{DType, Tensor, no_grad};
use std::io::Read;

/// Images (rows of `features` values in `[0, 1]`) and their labels.
pub struct Split {
    pub x: Vec<f32>,
    pub y: Vec<i64>,
    pub features: usize,
    /// Each image's height and width.
    pub side: usize,
}

impl Split {
    pub fn len(&self) -> usize {
        self.y.len()
    }
}

/// Shuffles `items` in place (Fisher–Yates) with the xorshift generator state `s`.
pub fn shuffle<T>(items: &mut [T], s: &mut u64) {
    for i in (1..items.len()).rev() {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        items.swap(i, (*s % (i as u64 + 1)) as usize);
    }
}

/// The UCI digits, shuffled with a fixed seed and split 80/20.
pub fn digits() -> Result<(Split, Split), String> {
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
    shuffle(&mut rows, &mut 0x2545_F491_4F6C_DD1D);
    let cut = rows.len() * 4 / 5;
    let split = |r: &[(Vec<f32>, i64)]| Split {
        x: r.iter().flat_map(|(x, _)| x.iter().copied()).collect(),
        y: r.iter().map(|(_, y)| *y).collect(),
        features: 64,
        side: 8,
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
pub fn mnist(dir: &str) -> Result<(Split, Split), String> {
    let load = |images: &str, labels: &str| -> Result<Split, String> {
        let d = std::path::Path::new(dir);
        let (dims, px) = idx(&d.join(images))?;
        let (_, lb) = idx(&d.join(labels))?;
        let features: usize = dims[1..].iter().product();
        Ok(Split {
            x: px.iter().map(|&v| v as f32 / 255.0).collect(),
            y: lb.iter().map(|&v| v as i64).collect(),
            features,
            side: dims[1],
        })
    };
    Ok((
        load("train-images-idx3-ubyte", "train-labels-idx1-ubyte")?,
        load("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")?,
    ))
}

/// The rows `rows` of `s` as `[rows, *shape]` images and `[rows]` labels.
pub fn batch(s: &Split, rows: &[usize], shape: &[usize]) -> (Tensor, Tensor) {
    let f = s.features;
    let x: Vec<f32> = rows
        .iter()
        .flat_map(|&r| s.x[r * f..(r + 1) * f].iter().copied())
        .collect();
    let y: Vec<i64> = rows.iter().map(|&r| s.y[r]).collect();
    (
        Tensor::from_vec(x, [&[rows.len()][..], shape].concat()),
        Tensor::from_vec(y, [rows.len()]),
    )
}

/// The fraction of `s` whose most likely class under `model` is the label; `shape` is
/// the batch shape after the row count (`[64]` for an MLP, `[1, 8, 8]` for a CNN).
pub fn accuracy(model: &dyn Module, s: &Split, shape: &[usize]) -> kiln::Result<f64> {
    let all: Vec<usize> = (0..s.len()).collect();
    let mut correct = 0;
    for chunk in all.chunks(1000) {
        let (x, y) = batch(s, chunk, shape);
        let pred = no_grad(|| model.forward(&x))?.try_argmax(1)?;
        let eq = pred.try_eq(&y)?.try_cast(DType::I64)?.try_sum(..)?;
        correct += eq.item::<i64>()?;
    }
    Ok(correct as f64 / s.len() as f64)
}
