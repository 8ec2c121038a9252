//! `scaled_dot_product_attention` against PyTorch's documented reference (its docs give the
//! computation as plain code: scores, bias from the mask or the causal triangle, softmax,
//! weights times values), written here as f64 loops over random shapes, with bool, float
//! and causal masks, a custom scale, broadcast batch dimensions, and rows masked entirely.

mod common;

use common::Rng;
use kiln::nn::functional::scaled_dot_product_attention as sdpa;
use kiln::{DType, KilnError, Tensor};

fn uniform(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        .collect()
}

/// The reference for one batch entry: `q [L, E]`, `k [S, E]`, `v [S, F]`, a bias
/// `[L, S]` (`-inf` where masked); a row masked entirely gives zeros.
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bias: &[f64],
    [l, s, e, f]: [usize; 4],
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; l * f];
    for i in 0..l {
        let scores: Vec<f64> = (0..s)
            .map(|j| {
                (0..e).map(|d| q[i * e + d] * k[j * e + d]).sum::<f64>() * scale + bias[i * s + j]
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        for c in 0..f {
            out[i * f + c] = (0..s).map(|j| w[j] / z * v[j * f + c]).sum();
        }
    }
    out
}

#[test]
fn matches_the_reference_with_every_kind_of_mask() {
    let mut rng = Rng(0x5D9A);
    for case in 0..60 {
        let (b, h) = (1 + rng.below(2), 1 + rng.below(3));
        let (l, s, e, f) = (
            1 + rng.below(5),
            1 + rng.below(5),
            1 + rng.below(4),
            1 + rng.below(4),
        );
        let kind = rng.below(4); // 0 none, 1 bool mask, 2 float mask, 3 causal
        let scale = if rng.below(2) == 0 { None } else { Some(0.3) };
        let (q, k, v) = (
            uniform(&mut rng, b * h * l * e),
            uniform(&mut rng, b * h * s * e),
            uniform(&mut rng, b * h * s * f),
        );
        // Masks are [L, S], broadcast over batch and heads.
        let keep: Vec<bool> = (0..l * s).map(|_| rng.below(3) != 0).collect();
        let add = uniform(&mut rng, l * s);
        let bias: Vec<f64> = (0..l * s)
            .map(|ij| match kind {
                1 if !keep[ij] => f64::NEG_INFINITY,
                2 => add[ij],
                3 if ij % s > ij / s => f64::NEG_INFINITY,
                _ => 0.0,
            })
            .collect();
        let mask = match kind {
            1 => Some(Tensor::from_vec(keep.clone(), [l, s])),
            2 => Some(Tensor::from_vec(add.clone(), [l, s])),
            _ => None,
        };
        let (qt, kt, vt) = (
            Tensor::from_vec(q.clone(), [b, h, l, e]),
            Tensor::from_vec(k.clone(), [b, h, s, e]),
            Tensor::from_vec(v.clone(), [b, h, s, f]),
        );
        let y = sdpa(&qt, &kt, &vt, mask.as_ref(), 0.0, 0, kind == 3, scale).unwrap();
        assert_eq!(y.shape(), &[b, h, l, f], "case {case}");
        let got = y.to_vec::<f64>().unwrap();
        let sc = scale.unwrap_or(1.0 / (e as f64).sqrt());
        for bh in 0..b * h {
            let want = reference(
                &q[bh * l * e..(bh + 1) * l * e],
                &k[bh * s * e..(bh + 1) * s * e],
                &v[bh * s * f..(bh + 1) * s * f],
                &bias,
                [l, s, e, f],
                sc,
            );
            for (i, w) in want.iter().enumerate() {
                let g = got[bh * l * f + i];
                assert!((g - w).abs() < 1e-12, "case {case} kind {kind}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn fully_masked_rows_give_zeros_and_finite_gradients() {
    let q = Tensor::from_vec(vec![0.5f64, -0.2, 0.1, 0.9], [2, 2]).requires_grad_(true);
    let k = Tensor::from_vec(vec![0.3f64, 0.4, -0.6, 0.2], [2, 2]).requires_grad_(true);
    let v = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]).requires_grad_(true);
    // The second query may see nothing.
    let mask = Tensor::from_vec(vec![true, true, false, false], [2, 2]);
    let y = sdpa(&q, &k, &v, Some(&mask), 0.0, 0, false, None).unwrap();
    let got = y.to_vec::<f64>().unwrap();
    assert_eq!(&got[2..], &[0.0, 0.0]);
    assert!(got[..2].iter().all(|x| x.is_finite() && *x != 0.0));
    y.sum(..).backward().unwrap();
    for t in [&q, &k, &v] {
        let g = t.grad().unwrap().to_vec::<f64>().unwrap();
        assert!(g.iter().all(|x| x.is_finite()), "{g:?}");
    }
    // The masked query's gradient is zero.
    let gq = q.grad().unwrap().to_vec::<f64>().unwrap();
    assert_eq!(&gq[2..], &[0.0, 0.0]);
}

#[test]
fn dropout_and_errors() {
    let q = Tensor::randn_seeded([2, 4, 8], 1);
    let k = Tensor::randn_seeded([2, 6, 8], 2);
    let v = Tensor::randn_seeded([2, 6, 3], 3);
    let plain = sdpa(&q, &k, &v, None, 0.0, 0, false, None).unwrap();
    let a = sdpa(&q, &k, &v, None, 0.5, 7, false, None).unwrap();
    let b = sdpa(&q, &k, &v, None, 0.5, 7, false, None).unwrap();
    let c = sdpa(&q, &k, &v, None, 0.5, 8, false, None).unwrap();
    assert_eq!(
        a.to_vec::<f32>().unwrap(),
        b.to_vec::<f32>().unwrap(),
        "same seed"
    );
    assert_ne!(
        a.to_vec::<f32>().unwrap(),
        c.to_vec::<f32>().unwrap(),
        "another seed"
    );
    assert_ne!(a.to_vec::<f32>().unwrap(), plain.to_vec::<f32>().unwrap());
    let mask = Tensor::ones_dtype([4, 6], DType::Bool);
    let e = sdpa(&q, &k, &v, Some(&mask), 0.0, 0, true, None).unwrap_err();
    assert!(matches!(e, KilnError::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("is_causal"), "{e}");
    assert!(sdpa(&q, &k, &v, None, 1.0, 0, false, None).is_err());
    assert!(sdpa(&Tensor::zeros([3]), &k, &v, None, 0.0, 0, false, None).is_err());
    // Mismatched feature sizes fail in the product, naming it.
    assert!(sdpa(&q, &Tensor::zeros([2, 6, 5]), &v, None, 0.0, 0, false, None).is_err());
}
