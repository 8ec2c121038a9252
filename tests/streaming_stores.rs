//! Kernels whose f32 output is at least 16 MiB write it with streaming (non-temporal)
//! stores on x86-64: elementwise kernels (runs that start on and off cache-line
//! boundaries), elementwise kernels packing short rows, and row kernels (softmax). Every
//! element is checked against arithmetic done here, or bit for bit against the same rows
//! computed by a small kernel, whose output is written with ordinary stores; and the block
//! transpose of large 4-byte outputs.

use kiln::{Tensor, realize_all};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 128.0 - 7.5)
        .collect()
}

#[test]
fn elementwise_outputs_of_every_row_length_are_written_exactly() {
    // 4M+ elements (above the 16 MiB threshold): one long run per row, rows of 1,025 start
    // off a line boundary, and a length that leaves a tail shorter than a vector.
    for shape in [vec![(1 << 22) + 5], vec![4100, 1025], vec![2, 2_097_155]] {
        let n: usize = shape.iter().product();
        let (a, b, c) = (values(n, 1), values(n, 2), values(n, 3));
        let ta = Tensor::from_vec(a.clone(), shape.as_slice());
        let tb = Tensor::from_vec(b.clone(), shape.as_slice());
        let tc = Tensor::from_vec(c.clone(), shape.as_slice());
        let y = ta.mul(&tb).add(&tc).mul(0.5);
        let got = y.to_vec::<f32>().expect("realizes");
        assert_eq!(got.len(), n);
        for i in 0..n {
            let want = (a[i] * b[i] + c[i]) * 0.5;
            assert_eq!(got[i].to_bits(), want.to_bits(), "{shape:?} element {i}");
        }
    }
}

#[test]
fn packed_short_rows_are_written_exactly() {
    // [32771, 128] with a per-row value and a weight vector: several rows to a run.
    let (rows, cols) = (32_771, 128);
    let x = values(rows * cols, 4);
    let stat = values(rows, 5);
    let w = values(cols, 6);
    let y = Tensor::from_vec(x.clone(), [rows, cols])
        .sub(Tensor::from_vec(stat.clone(), [rows, 1]))
        .mul(Tensor::from_vec(w.clone(), [cols]));
    let got = y.to_vec::<f32>().expect("realizes");
    for r in 0..rows {
        for k in 0..cols {
            let want = (x[r * cols + k] - stat[r]) * w[k];
            assert_eq!(got[r * cols + k].to_bits(), want.to_bits(), "({r}, {k})");
        }
    }
}

#[test]
fn row_kernels_write_the_same_bits_as_small_ones() {
    // Softmax over rows of 4,100 (1,025 rows: 16.4 MiB out); rows 0..3 and the last three
    // computed on their own (a small output, ordinary stores) must match bit for bit.
    let (rows, cols) = (1025, 4100);
    let x = Tensor::from_vec(values(rows * cols, 7), [rows, cols]);
    x.realize().expect("realizes");
    let big = x.softmax(-1);
    let head = x.slice(&[(0, 3, 1)]).softmax(-1);
    let tail = x
        .slice(&[(rows as isize - 3, rows as isize, 1)])
        .softmax(-1);
    realize_all(&[&big, &head, &tail]).expect("realizes");
    let big = big.to_vec::<f32>().expect("values");
    let (head, tail) = (head.to_vec::<f32>().unwrap(), tail.to_vec::<f32>().unwrap());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&big[..3 * cols]), bits(&head));
    assert_eq!(bits(&big[(rows - 3) * cols..]), bits(&tail));
    for r in 0..rows {
        let s: f64 = big[r * cols..(r + 1) * cols]
            .iter()
            .map(|&v| v as f64)
            .sum();
        assert!((s - 1.0).abs() < 1e-4, "row {r} sums to {s}");
    }
}

#[test]
fn large_transposes_are_written_exactly() {
    // [1025, 4100] → [4100, 1025] (16.8 MB out): output rows of 1,025 start off a line
    // boundary, and the last column block is narrower than a full one. f32 and i32.
    let (r, c) = (1025, 4100);
    let x = values(r * c, 8);
    let t = Tensor::from_vec(x.clone(), [r, c]).t().contiguous();
    let got = t.to_vec::<f32>().expect("realizes");
    let xi: Vec<i32> = (0..r * c)
        .map(|i| (i as i32).wrapping_mul(2_654_435))
        .collect();
    let ti = Tensor::from_vec(xi.clone(), [r, c]).t().contiguous();
    let goti = ti.to_vec::<i32>().expect("realizes");
    for j in 0..c {
        for i in 0..r {
            assert_eq!(
                got[j * r + i].to_bits(),
                x[i * c + j].to_bits(),
                "f32 ({j}, {i})"
            );
            assert_eq!(goti[j * r + i], xi[i * c + j], "i32 ({j}, {i})");
        }
    }
}
