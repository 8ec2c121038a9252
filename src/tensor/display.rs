//! `Display` (realizes and prints values, PyTorch style, eliding the middle of big tensors)
//! and `Debug` (metadata only, never realizes).

use super::Tensor;
use crate::dtype::{DType, Scalar};
use std::fmt;

const EDGE: usize = 3;
const SUMMARIZE_ABOVE: usize = 1000;

fn fmt_scalar(s: Scalar, dtype: DType) -> String {
    match s {
        Scalar::Float(v) if dtype == DType::F64 => format!("{v:.6}"),
        Scalar::Float(v) => format!("{:.4}", v),
        other => other.to_string(),
    }
}

fn write_dim(out: &mut String, vals: &[String], shape: &[usize], summarize: bool, depth: usize) {
    if shape.is_empty() {
        out.push_str(&vals[0]);
        return;
    }
    let n = shape[0];
    let inner: usize = shape[1..].iter().product();
    out.push('[');
    let show: Vec<Option<usize>> = if summarize && n > 2 * EDGE {
        (0..EDGE)
            .map(Some)
            .chain(std::iter::once(None))
            .chain((n - EDGE..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (j, i) in show.iter().enumerate() {
        if j > 0 {
            out.push(',');
            if shape.len() > 1 {
                out.push('\n');
                out.push_str(&" ".repeat(depth + 8));
            } else {
                out.push(' ');
            }
        }
        match i {
            None => out.push_str("..."),
            Some(i) => write_dim(
                out,
                &vals[i * inner..(i + 1) * inner],
                &shape[1..],
                summarize,
                depth + 1,
            ),
        }
    }
    out.push(']');
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = match self.to_bytes() {
            Ok(b) => b,
            Err(e) => return write!(f, "tensor(<not realized: {e}>)"),
        };
        let sz = self.dtype.size_bytes();
        let vals: Vec<String> = bytes
            .chunks_exact(sz)
            .map(|b| fmt_scalar(Scalar::from_le_bytes(self.dtype, b), self.dtype))
            .collect();
        let mut s = String::from("tensor(");
        if self.numel() == 0 {
            s.push_str("[]");
        } else {
            write_dim(
                &mut s,
                &vals,
                &self.shape,
                self.numel() > SUMMARIZE_ABOVE,
                0,
            );
        }
        write!(f, "{s}, shape={:?}, dtype={}", self.shape, self.dtype)?;
        if self.device != crate::Device::Cpu {
            write!(f, ", device={}", self.device)?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .finish()
    }
}
