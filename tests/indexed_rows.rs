//! Embedding-shaped gathers and scatters, where one index selects a whole row: the CPU
//! backend reads such a row with one bounds check (the index is the same along the run) and
//! adds an f32 gradient row into its place as one run. Values are checked against sums
//! computed here and against the reference evaluator, out-of-range indices must still be
//! errors, and a layer norm over gathered rows (whose gathered values are saved across the
//! reduction's passes) must match the reference.

use kiln::reference;
use kiln::{DType, Tensor};

/// Token ids `(7i + 3) % vocab` for `n` positions.
fn ids(n: usize, vocab: usize) -> Vec<i64> {
    (0..n).map(|i| ((i * 7 + 3) % vocab) as i64).collect()
}

fn realized(t: Tensor) -> Tensor {
    t.realize().expect("realize");
    t
}

#[test]
fn scatter_add_of_whole_rows_sums_each_row_into_its_index() {
    let (n, vocab, width) = (300, 13, 96);
    let id = ids(n, vocab);
    let g: Vec<f32> = (0..n * width)
        .map(|k| ((k % 17) as f32 - 8.0) * 0.25)
        .collect();
    let index = Tensor::from_vec(id.clone(), [n, 1]).expand([n, width]);
    let values = Tensor::from_vec(g.clone(), [n, width]);
    let out = Tensor::zeros([vocab, width]).scatter_add(0, &index, &values);
    let got = out.to_vec::<f32>().unwrap();
    let mut want = vec![0f32; vocab * width];
    for (i, &k) in id.iter().enumerate() {
        for j in 0..width {
            want[k as usize * width + j] += g[i * width + j];
        }
    }
    assert_eq!(got, want);
    let r = reference::evaluate(&out).unwrap().to_f64();
    for (a, b) in got.iter().zip(&r) {
        assert_eq!(*a as f64, *b);
    }
}

#[test]
fn a_bool_scatter_add_is_a_logical_or_and_stores_only_valid_bools() {
    // Two `true`s land on place 0: the sum is `true` (stored as 1, never 2), as the
    // reference evaluator's cast of the sum to bool gives.
    let base = Tensor::from_vec(vec![false, false, false, true], [4]);
    let index = Tensor::from_vec(vec![0i64, 0, 2, 3], [4]);
    let values = Tensor::from_vec(vec![true, true, true, false], [4]);
    let out = base.scatter_add(0, &index, &values);
    out.realize().expect("realize");
    let bytes: Vec<u8> = out.to_vec::<u8>().unwrap();
    assert_eq!(bytes, vec![1, 0, 1, 1]);
    assert_eq!(out.to_vec::<bool>().unwrap(), vec![true, false, true, true]);
    let r = reference::evaluate(&out).unwrap().to_f64();
    assert_eq!(r, vec![1.0, 0.0, 1.0, 1.0]);
}

#[test]
fn scatter_add_of_rows_reports_an_index_out_of_range() {
    let mut id = ids(200, 10);
    id[150] = 10;
    let index = Tensor::from_vec(id, [200, 1]).expand([200, 64]);
    let values = Tensor::ones([200, 64]);
    let out = Tensor::zeros([10, 64]).scatter_add(0, &index, &values);
    let err = out.realize().expect_err("index 10 of 10 rows");
    assert!(err.to_string().contains("10"), "{err}");
}

#[test]
fn embedding_rows_and_their_gradient_match_the_reference() {
    let (b, t, vocab, width) = (8, 40, 11, 128);
    let table = realized(Tensor::randn_seeded([vocab, width], 1));
    let pos = realized(Tensor::randn_seeded([t, width], 2));
    let tokens = Tensor::from_vec(ids(b * t, vocab), [b, t]);
    let x = Tensor::embedding(&tokens, &table) + &pos;
    let want = reference::evaluate(&x).unwrap().to_f64();
    let got = x.to_vec::<f64>().unwrap();
    assert_eq!(got, want);
    // A layer norm over gathered rows: the gather is saved by the first pass and read back.
    let y = (Tensor::embedding(&tokens, &table) + &pos).layer_norm(&[width], None, None, 1e-5);
    let want = reference::evaluate(&y).unwrap().to_f64();
    let got = y.to_vec::<f64>().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
    }
    // The embedding's gradient (a scatter of whole rows).
    let table = table.detach().requires_grad_(true);
    let loss = (Tensor::embedding(&tokens, &table) * &pos).sum(..);
    loss.backward().unwrap();
    let grad = table.grad().unwrap().to_vec::<f32>().unwrap();
    let p = pos.to_vec::<f32>().unwrap();
    let tk = ids(b * t, vocab);
    let mut want = vec![0f32; vocab * width];
    for (i, &k) in tk.iter().enumerate() {
        for j in 0..width {
            want[k as usize * width + j] += p[(i % t) * width + j];
        }
    }
    assert_eq!(grad, want);
}

#[test]
fn embedding_with_an_out_of_range_id_is_an_error() {
    let table = realized(Tensor::randn_seeded([5, 128], 3));
    let mut id = ids(64, 5);
    id[40] = -1;
    let tokens = Tensor::from_vec(id, [64]);
    let y = Tensor::embedding(&tokens, &table).layer_norm(&[128], None, None, 1e-5);
    assert!(y.realize().is_err());
    let z = Tensor::embedding(&tokens, &table).cast(DType::F64);
    assert!(z.realize().is_err());
}
