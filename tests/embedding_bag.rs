//! `embedding_bag` / `nn::EmbeddingBag`: random bags (1-D with offsets, empty bags,
//! `include_last_offset`, 2-D input), every mode, per-sample weights and `padding_idx`
//! against a plain f64 loop over the bags; finite-difference gradients (sum and mean) for
//! the table and the per-sample weights; errors.

mod common;
mod fd_helpers;

use common::Rng;
use fd_helpers::{assert_close, gradcheck, values};
use kiln::nn::functional::{EmbeddingBagMode as Mode, embedding_bag};
use kiln::nn::{EmbeddingBag, Module};
use kiln::{KilnError, Tensor};

/// The bags by definition: ids `ids[start..end]` per bag, padding left out.
fn reference(
    w: &[f64],
    dim: usize,
    ids: &[i64],
    bags: &[(usize, usize)],
    mode: Mode,
    psw: Option<&[f64]>,
    pad: Option<i64>,
) -> Vec<f64> {
    let mut out = vec![];
    for &(s, e) in bags {
        let mut acc = vec![0.0; dim];
        let mut best = vec![f64::NEG_INFINITY; dim];
        let mut n = 0;
        for k in s..e {
            if Some(ids[k]) == pad {
                continue;
            }
            n += 1;
            let scale = psw.map_or(1.0, |p| p[k]);
            for d in 0..dim {
                let v = w[ids[k] as usize * dim + d];
                acc[d] += scale * v;
                best[d] = best[d].max(v);
            }
        }
        for d in 0..dim {
            out.push(match mode {
                Mode::Sum => acc[d],
                Mode::Mean => {
                    if n == 0 {
                        0.0
                    } else {
                        acc[d] / n as f64
                    }
                }
                Mode::Max => {
                    if n == 0 {
                        0.0
                    } else {
                        best[d]
                    }
                }
            });
        }
    }
    out
}

#[test]
fn bags_match_the_definition() {
    let mut rng = Rng(0xba9);
    for case in 0..24 {
        let mode = [Mode::Sum, Mode::Mean, Mode::Max][case % 3];
        let (count, dim) = (2 + rng.below(5), 1 + rng.below(3));
        let w = values(&mut rng, count * dim, -2.0, 2.0);
        let pad = (case % 4 == 1).then(|| rng.below(count) as i64);
        let weighted = mode == Mode::Sum && case % 2 == 0;
        let wt = Tensor::from_vec(w.clone(), [count, dim]);
        if case % 5 == 4 {
            // 2-D input: each row a bag.
            let (b, l) = (1 + rng.below(3), 1 + rng.below(4));
            let ids: Vec<i64> = (0..b * l).map(|_| rng.below(count) as i64).collect();
            let psw = weighted.then(|| values(&mut rng, b * l, -1.0, 1.0));
            let bags: Vec<(usize, usize)> = (0..b).map(|i| (i * l, (i + 1) * l)).collect();
            let want = reference(&w, dim, &ids, &bags, mode, psw.as_deref(), pad);
            let pt = psw.map(|p| Tensor::from_vec(p, [b, l]));
            let got = embedding_bag(
                &Tensor::from_vec(ids, [b, l]),
                &wt,
                None,
                mode,
                pt.as_ref(),
                false,
                pad,
            )
            .unwrap();
            assert_eq!(got.shape(), &[b, dim]);
            assert_close("2-D bags", &got.to_vec::<f64>().unwrap(), &want, 1e-12);
            continue;
        }
        let len = rng.below(8);
        let ids: Vec<i64> = (0..len).map(|_| rng.below(count) as i64).collect();
        // Sorted starts from 0, empty bags included.
        let nb = 1 + rng.below(4);
        let mut starts = vec![0usize];
        for _ in 1..nb {
            starts.push(rng.below(len + 1));
        }
        starts.sort();
        let last = case % 3 == 1;
        let bags: Vec<(usize, usize)> = (0..nb)
            .map(|i| (starts[i], starts.get(i + 1).copied().unwrap_or(len)))
            .collect();
        let mut offsets: Vec<i64> = starts.iter().map(|&s| s as i64).collect();
        if last {
            offsets.push(len as i64);
        }
        let psw = weighted.then(|| values(&mut rng, len, -1.0, 1.0));
        let want = reference(&w, dim, &ids, &bags, mode, psw.as_deref(), pad);
        let pt = psw.map(|p| Tensor::from_vec(p, [len]));
        let got = embedding_bag(
            &Tensor::from_vec(ids.clone(), [len]),
            &wt,
            Some(&Tensor::from_vec(offsets.clone(), [offsets.len()])),
            mode,
            pt.as_ref(),
            last,
            pad,
        )
        .unwrap();
        assert_eq!(got.shape(), &[nb, dim], "{offsets:?}");
        assert_close(
            &format!("{mode:?} ids {ids:?} offsets {offsets:?} pad {pad:?}"),
            &got.to_vec::<f64>().unwrap(),
            &want,
            1e-12,
        );
    }
}

#[test]
fn gradients_and_module() {
    let mut rng = Rng(5);
    let (count, dim) = (4, 3);
    let w = values(&mut rng, count * dim, -1.0, 1.0);
    let ids = Tensor::from_vec(vec![0i64, 2, 2, 3, 1, 3], [6]);
    let off = Tensor::from_vec(vec![0i64, 2, 2], [3]);
    let probe = Tensor::from_vec(values(&mut rng, 3 * dim, -1.0, 1.0), [3, dim]);
    let psw = values(&mut rng, 6, -1.0, 1.0);
    let pt = Tensor::from_vec(psw.clone(), [6]);
    for mode in [Mode::Sum, Mode::Mean] {
        gradcheck(
            &format!("d weight {mode:?}"),
            &w,
            &[count, dim],
            &|t| {
                let p = (mode == Mode::Sum).then_some(&pt);
                (&embedding_bag(&ids, t, Some(&off), mode, p, false, Some(1)).unwrap() * &probe)
                    .sum(..)
            },
            1e-6,
        );
    }
    let wt = Tensor::from_vec(w.clone(), [count, dim]);
    gradcheck(
        "d per_sample_weights",
        &psw,
        &[6],
        &|t| {
            (&embedding_bag(&ids, &wt, Some(&off), Mode::Sum, Some(t), false, None).unwrap()
                * &probe)
                .sum(..)
        },
        1e-6,
    );
    // The module: 2-D input; padding row zero and left out of the mean.
    let bag = EmbeddingBag::with_padding_idx(5, 2, Mode::Mean, -1, 3).unwrap();
    assert_eq!(bag.padding_idx, Some(4));
    let x = Tensor::from_vec(vec![0i64, 4, 4, 4], [2, 2]);
    let y = bag.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let table = bag.weight.to_vec::<f32>().unwrap();
    assert_eq!(y, vec![table[0], table[1], 0.0, 0.0]);
    assert_eq!(bag.num_parameters(), 10);
}

#[test]
fn errors() {
    let w = Tensor::ones([4, 2]);
    let ids = Tensor::from_vec(vec![0i64, 1, 2], [3]);
    let off = Tensor::from_vec(vec![0i64, 2], [2]);
    let call = |ids: &Tensor, off: Option<&Tensor>, mode, psw: Option<&Tensor>, pad| {
        embedding_bag(ids, &w, off, mode, psw, false, pad)
    };
    let cases: Vec<(Result<Tensor, KilnError>, &str)> = vec![
        (
            call(&ids, None, Mode::Sum, None, None),
            "1-D without offsets",
        ),
        (
            call(
                &Tensor::from_vec(vec![0i64; 4], [2, 2]),
                Some(&off),
                Mode::Sum,
                None,
                None,
            ),
            "2-D with offsets",
        ),
        (
            call(
                &ids,
                Some(&Tensor::from_vec(vec![1i64, 2], [2])),
                Mode::Sum,
                None,
                None,
            ),
            "first offset not 0",
        ),
        (
            call(
                &ids,
                Some(&Tensor::from_vec(vec![0i64, 2, 1], [3])),
                Mode::Sum,
                None,
                None,
            ),
            "decreasing offsets",
        ),
        (
            call(&ids, Some(&off), Mode::Mean, Some(&Tensor::ones([3])), None),
            "per_sample_weights with mean",
        ),
        (
            call(&ids, Some(&off), Mode::Sum, Some(&Tensor::ones([2])), None),
            "per_sample_weights shape",
        ),
        (
            call(&ids, Some(&off), Mode::Sum, None, Some(4)),
            "padding_idx range",
        ),
    ];
    for (r, what) in cases {
        assert!(r.is_err(), "{what}");
    }
    let e = call(&Tensor::ones([3]), Some(&off), Mode::Sum, None, None);
    assert!(
        matches!(e, Err(KilnError::UnsupportedDType { .. })),
        "{e:?}"
    );
}
