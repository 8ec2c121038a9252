//! Copies between layouts that keep short rows contiguous (attention's head split and merge,
//! `[b, t, h, d] <-> [b, h, t, d]`), which the CPU backend runs as one block copy per row:
//! every element checked against an index computed here and against the reference
//! evaluator, for every element size, through slices (non-zero offsets) and for sizes that
//! split into several tasks.

use kiln::reference;
use kiln::{DType, Tensor};

/// `[b, t, h, d]` holding its own flat index.
fn iota(shape: [usize; 4]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n as i64).collect::<Vec<_>>(), shape)
}

#[track_caller]
fn check_permuted(x: &Tensor, dt: DType) {
    let s = x.shape().to_vec();
    // Realized first, so the copy kernel is a plain load and store of `dt`.
    let xc = x.cast(dt);
    xc.realize().unwrap();
    let y = xc.permute([0, 2, 1, 3]).contiguous();
    let got = y.to_vec::<i64>().unwrap();
    let src = x.to_vec::<i64>().unwrap();
    let (b, t, h, d) = (s[0], s[1], s[2], s[3]);
    let wrap = |v: i64| -> i64 {
        match dt {
            DType::U8 => v as u8 as i64,
            DType::Bool => (v != 0) as i64,
            DType::F16 => half::f16::from_f64(v as f64).to_f64() as i64,
            _ => v,
        }
    };
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                for di in 0..d {
                    let out = ((bi * h + hi) * t + ti) * d + di;
                    let inp = ((bi * t + ti) * h + hi) * d + di;
                    assert_eq!(got[out], wrap(src[inp]), "{dt:?} at {out}");
                }
            }
        }
    }
    let want = reference::evaluate(&y).unwrap().to_f64();
    assert_eq!(got.iter().map(|&v| v as f64).collect::<Vec<_>>(), want);
}

#[test]
fn head_split_and_merge_copy_every_row() {
    for dt in [
        DType::I64,
        DType::F32,
        DType::I32,
        DType::F16,
        DType::U8,
        DType::Bool,
    ] {
        check_permuted(&iota([4, 16, 4, 32]), dt);
    }
    // Large enough for several tasks; and the merge back restores the input.
    let x = iota([8, 64, 4, 32]);
    check_permuted(&x, DType::I64);
    let back = x
        .permute([0, 2, 1, 3])
        .contiguous()
        .permute([0, 2, 1, 3])
        .contiguous();
    assert_eq!(back.to_vec::<i64>().unwrap(), x.to_vec::<i64>().unwrap());
}

#[test]
fn head_split_of_a_slice_reads_from_its_offset() {
    let big = iota([4, 20, 4, 32]);
    let x = big.narrow(1, 3, 16);
    let y = x.permute([0, 2, 1, 3]).contiguous();
    let got = y.to_vec::<i64>().unwrap();
    let want = reference::evaluate(&y).unwrap().to_f64();
    assert_eq!(got.iter().map(|&v| v as f64).collect::<Vec<_>>(), want);
    // Element (b=1, h=2, t=0, d=5) is input (1, 3, 2, 5).
    let at = ((4 + 2) * 16) * 32 + 5;
    assert_eq!(got[at], (((20 + 3) * 4 + 2) * 32 + 5) as i64);
}
