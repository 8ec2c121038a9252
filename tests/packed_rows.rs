//! Elementwise kernels whose last dimension stays short (a per-row value or a weight vector
//! broadcast across it), which the CPU backend runs several rows to a run: every element
//! checked against index arithmetic done here, for spans that do and do not divide into
//! whole runs, padded and transposed operands, half types and a select.

use kiln::{DType, Tensor};

/// `[a, b, c]` with element `(i, j, k)` equal to `f(i, j, k)`.
fn tensor3(shape: [usize; 3], f: impl Fn(usize, usize, usize) -> f32) -> Tensor {
    let mut v = Vec::with_capacity(shape.iter().product());
    for i in 0..shape[0] {
        for j in 0..shape[1] {
            for k in 0..shape[2] {
                v.push(f(i, j, k));
            }
        }
    }
    Tensor::from_vec(v, shape)
}

fn x_at(i: usize, j: usize, k: usize) -> f32 {
    ((i * 131 + j * 17 + k * 7) % 97) as f32 * 0.25 - 12.0
}

fn stat_at(i: usize, j: usize) -> f32 {
    ((i * 5 + j * 3) % 11) as f32 - 5.0
}

fn w_at(k: usize) -> f32 {
    (k % 13) as f32 * 0.5 - 3.0
}

#[track_caller]
fn check(got: &Tensor, shape: [usize; 3], want: impl Fn(usize, usize, usize) -> f32) {
    assert_eq!(got.shape(), &shape[..]);
    let v = got.to_vec::<f32>().unwrap();
    let mut at = 0;
    for i in 0..shape[0] {
        for j in 0..shape[1] {
            for k in 0..shape[2] {
                let w = want(i, j, k);
                assert!(
                    v[at] == w || (v[at] - w).abs() <= 1e-6 * w.abs(),
                    "({i}, {j}, {k}): {} vs {w}",
                    v[at]
                );
                at += 1;
            }
        }
    }
}

/// `(x - stat) * w` with `stat: [a, b, 1]` and `w: [c]`: the layer-norm shape.
#[test]
fn row_values_and_weight_vectors_broadcast_over_short_rows() {
    // 50 rows of 24 pack 42 to a run: one full run and one of 8 per span; 3 spans.
    for shape in [[3usize, 50, 24], [2, 64, 128], [1, 3, 7], [4, 2, 512]] {
        let x = tensor3(shape, x_at);
        let stat = tensor3([shape[0], shape[1], 1], |i, j, _| stat_at(i, j));
        let w = Tensor::from_vec((0..shape[2]).map(w_at).collect::<Vec<_>>(), [shape[2]]);
        for t in [&x, &stat, &w] {
            t.realize().unwrap();
        }
        let y = x.sub(&stat).mul(&w).add(&w);
        check(&y, shape, |i, j, k| {
            (x_at(i, j, k) - stat_at(i, j)) * w_at(k) + w_at(k)
        });
    }
}

/// An operand padded along the short dimension (masked reads give the pad value) and one
/// read transposed, in the same packed kernel.
#[test]
fn padded_and_transposed_operands() {
    let (a, b, c) = (2usize, 40usize, 16usize);
    let stat = tensor3([a, b, 1], |i, j, _| stat_at(i, j));
    // [a, b, c - 4] padded by 1 before and 3 after along the last axis.
    let inner = tensor3([a, b, c - 4], x_at);
    // [a, c, b] read as [a, b, c].
    let t = tensor3([a, c, b], |i, k, j| x_at(i, j, k) * 2.0);
    for v in [&stat, &inner, &t] {
        v.realize().unwrap();
    }
    let padded = inner.pad(&[(0, 0), (0, 0), (1, 3)], 0.5);
    let y = padded.mul(&stat).add(t.permute([0, 2, 1]));
    check(&y, [a, b, c], |i, j, k| {
        let p = if (1..c - 3).contains(&k) {
            x_at(i, j, k - 1)
        } else {
            0.5
        };
        p * stat_at(i, j) + x_at(i, j, k) * 2.0
    });
}

/// Half-precision storage widened on load and a select on a per-row condition.
#[test]
fn half_types_and_a_row_condition() {
    let shape = [3usize, 33, 40];
    let x = tensor3(shape, x_at);
    let stat = tensor3([shape[0], shape[1], 1], |i, j, _| stat_at(i, j));
    let w = Tensor::from_vec((0..shape[2]).map(w_at).collect::<Vec<_>>(), [shape[2]]);
    for dt in [DType::F16, DType::BF16] {
        let (xh, sh, wh) = (x.cast(dt), stat.cast(dt), w.cast(dt));
        for t in [&xh, &sh, &wh] {
            t.realize().unwrap();
        }
        let y = xh.mul(&wh).sub(&sh).cast(DType::F32);
        let round = |v: f32| -> f32 {
            match dt {
                DType::F16 => half::f16::from_f32(v).to_f32(),
                _ => half::bf16::from_f32(v).to_f32(),
            }
        };
        check(&y, shape, |i, j, k| {
            let xw = round(round(x_at(i, j, k)) * round(w_at(k)));
            round(xw - round(stat_at(i, j)))
        });
    }
    let cond = stat.gt(0.0);
    cond.realize().unwrap();
    let y = Tensor::where_(&cond, &x, &w);
    check(&y, shape, |i, j, k| {
        if stat_at(i, j) > 0.0 {
            x_at(i, j, k)
        } else {
            w_at(k)
        }
    });
}

/// Column reductions with a short output run (a layer norm's weight and bias gradients):
/// several reduce positions share a run and are accumulated one after the other. Sizes
/// large enough for the reduce space to split into blocks whose edges fall inside spans
/// of the last reduce dimension, and small ones that run as one item.
#[test]
fn column_sums_over_short_output_runs() {
    for (lead, span, width) in [(7usize, 300usize, 32usize), (3, 50, 24), (2, 5, 8)] {
        // Stored span-major and read permuted, so the two reduce dimensions cannot merge
        // and packed runs stop at the end of each span.
        let x = tensor3([span, lead, width], |j, i, k| x_at(i, j, k)).permute([1, 0, 2]);
        let stat = tensor3([lead, span, 1], |i, j, _| stat_at(i, j));
        let g = tensor3([lead, span, width], |i, j, k| x_at(j % 5, i + k, j));
        // (x stays a view: realizing it would store it contiguous.)
        for t in [&stat, &g] {
            t.realize().unwrap();
        }
        let wgrad = g.mul(x.sub(&stat)).sum([0, 1]);
        let bgrad = g.sum([0, 1]);
        let maxed = x.sub(&stat).max([0, 1]);
        let (wv, bv, mv) = (
            wgrad.to_vec::<f32>().unwrap(),
            bgrad.to_vec::<f32>().unwrap(),
            maxed.to_vec::<f32>().unwrap(),
        );
        for k in 0..width {
            let (mut w, mut b, mut m) = (0.0f64, 0.0f64, f64::NEG_INFINITY);
            for i in 0..lead {
                for j in 0..span {
                    let gv = x_at(j % 5, i + k, j) as f64;
                    let d = (x_at(i, j, k) - stat_at(i, j)) as f64;
                    w += gv * d;
                    b += gv;
                    m = m.max(d);
                }
            }
            let close =
                |got: f32, want: f64| (got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0);
            assert!(
                close(wv[k], w),
                "{lead}x{span}x{width} wgrad[{k}]: {} vs {w}",
                wv[k]
            );
            assert!(
                close(bv[k], b),
                "{lead}x{span}x{width} bgrad[{k}]: {} vs {b}",
                bv[k]
            );
            assert_eq!(mv[k] as f64, m, "{lead}x{span}x{width} max[{k}]");
        }
    }
}
