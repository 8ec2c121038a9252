//! `Tensor::einsum` against the values PyTorch 2.15 printed for the same equations, and
//! random equations (repeated, broadcast and dropped labels; up to three operands, some read
//! through transposed views) against a plain evaluator that sums every assignment of the
//! labels.

mod common;

use common::Rng;
use kiln::{DType, Tensor};

#[test]
fn einsum_matches_pytorch() {
    // a = arange(24).reshape(2, 3, 4) * .5 - 3; b = arange(20).reshape(4, 5) * .25 - 1;
    // c = arange(9).reshape(3, 3) - 4; v = [1, -2, 3]; a0 = a[0]
    let a = Tensor::arange(0, 24, 1)
        .reshape([2, 3, 4])
        .cast(DType::F32)
        .mul(0.5)
        .sub(3.0);
    let b = Tensor::arange(0, 20, 1)
        .reshape([4, 5])
        .cast(DType::F32)
        .mul(0.25)
        .sub(1.0);
    let c = Tensor::arange(0, 9, 1)
        .reshape([3, 3])
        .cast(DType::F32)
        .sub(4.0);
    let v = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]);
    let a0 = a.slice_dim(0, 0, 1, 1).squeeze_dim(0);
    let all = [&a, &b, &c, &v, &a0];
    #[allow(clippy::type_complexity)]
    let cases: &[(&str, &[usize], &[f32], &[usize])] = &[
        (
            "bij,jk->bik",
            &[2, 3, 5],
            &[
                -4.75, -7.0, -9.25, -11.5, -13.75, 2.25, 2.0, 1.75, 1.5, 1.25, 9.25, 11.0, 12.75,
                14.5, 16.25, 16.25, 20.0, 23.75, 27.5, 31.25, 23.25, 29.0, 34.75, 40.5, 46.25,
                30.25, 38.0, 45.75, 53.5, 61.25,
            ],
            &[0, 1],
        ),
        (
            "...j,jk->...k",
            &[2, 3, 5],
            &[
                -4.75, -7.0, -9.25, -11.5, -13.75, 2.25, 2.0, 1.75, 1.5, 1.25, 9.25, 11.0, 12.75,
                14.5, 16.25, 16.25, 20.0, 23.75, 27.5, 31.25, 23.25, 29.0, 34.75, 40.5, 46.25,
                30.25, 38.0, 45.75, 53.5, 61.25,
            ],
            &[0, 1],
        ),
        (
            "bij->jb",
            &[4, 2],
            &[-3.0, 15.0, -1.5, 16.5, 0.0, 18.0, 1.5, 19.5],
            &[0],
        ),
        (
            "bij",
            &[2, 3, 4],
            &[
                -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0,
                4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 8.5,
            ],
            &[0],
        ),
        ("ii->i", &[3], &[-4.0, 0.0, 4.0], &[2]),
        ("ii", &[], &[0.0], &[2]),
        (
            "i,j->ij",
            &[3, 3],
            &[1.0, -2.0, 3.0, -2.0, 4.0, -6.0, 3.0, -6.0, 9.0],
            &[3, 3],
        ),
        ("ij,j->i", &[3], &[-4.0, 2.0, 8.0], &[2, 3]),
        ("i,i->", &[], &[14.0], &[3, 3]),
        (
            "bij,bkj->bik",
            &[2, 3, 3],
            &[
                21.5, 3.5, -14.5, 3.5, 1.5, -0.5, -14.5, -0.5, 13.5, 57.5, 87.5, 117.5, 87.5,
                133.5, 179.5, 117.5, 179.5, 241.5,
            ],
            &[0, 0],
        ),
        (
            "ij,jk,kl->il",
            &[3, 3],
            &[-72.0, -54.0, -36.0, -18.0, 0.0, 18.0, 36.0, 54.0, 72.0],
            &[2, 2, 2],
        ),
        (
            "...ij->...ji",
            &[2, 4, 3],
            &[
                -3.0, -1.0, 1.0, -2.5, -0.5, 1.5, -2.0, 0.0, 2.0, -1.5, 0.5, 2.5, 3.0, 5.0, 7.0,
                3.5, 5.5, 7.5, 4.0, 6.0, 8.0, 4.5, 6.5, 8.5,
            ],
            &[0],
        ),
        ("bij,ij->b", &[2], &[36.5, 18.5], &[0, 4]),
    ];
    for (eq, shape, want, ops) in cases {
        let operands: Vec<&Tensor> = ops.iter().map(|&i| all[i]).collect();
        let got = Tensor::try_einsum(eq, &operands).unwrap();
        assert_eq!(got.shape(), *shape, "{eq}");
        assert_eq!(got.to_vec::<f32>().unwrap(), *want, "{eq}");
    }
}

#[test]
fn malformed_equations_are_refused_with_the_equation_and_shapes() {
    let a = Tensor::from_vec(vec![1.0f32; 6], [2, 3]);
    let b = Tensor::from_vec(vec![1.0f32; 8], [4, 2]);
    for (eq, ops) in [
        ("ij,jk->ik", vec![&a, &b]), // j is 3 and 4
        ("ij->ik", vec![&a]),        // k in no operand
        ("ij->ii", vec![&a]),        // output label twice
        ("ijk->i", vec![&a]),        // three subscripts, two dimensions
        ("ij,jk->ik", vec![&a]),     // two operands named, one given
        ("i1->i", vec![&a]),         // not a letter
        ("ii->i", vec![&a]),         // a diagonal of a 2 × 3 operand
    ] {
        let err = Tensor::try_einsum(eq, &ops).unwrap_err().to_string();
        assert!(err.contains("einsum"), "{eq}: {err}");
    }
    let err = Tensor::try_einsum("ij,jk->ik", &[&a, &b])
        .unwrap_err()
        .to_string();
    assert!(err.contains("[2, 3]") && err.contains("[4, 2]"), "{err}");
}

/// `einsum` by summing, for every assignment of all labels, the product of the operands'
/// elements (row-major data), into the output element the output labels pick.
fn plain_einsum(
    inputs: &[Vec<char>],
    output: &[char],
    data: &[Vec<f64>],
    shapes: &[Vec<usize>],
    size: &std::collections::BTreeMap<char, usize>,
) -> Vec<f64> {
    let labels: Vec<char> = size.keys().copied().collect();
    let out_len: usize = output.iter().map(|l| size[l]).product();
    let mut out = vec![0.0; out_len];
    let total: usize = labels.iter().map(|l| size[l]).product();
    for flat in 0..total {
        let mut value = std::collections::BTreeMap::new();
        let mut rest = flat;
        for l in labels.iter().rev() {
            value.insert(*l, rest % size[l]);
            rest /= size[l];
        }
        let mut p = 1.0;
        for ((ls, d), shape) in inputs.iter().zip(data).zip(shapes) {
            let mut at = 0;
            for (l, &n) in ls.iter().zip(shape) {
                // A size-1 dimension broadcasts.
                at = at * n + if n == 1 { 0 } else { value[l] };
            }
            p *= d[at];
        }
        let mut o = 0;
        for l in output {
            o = o * size[l] + value[l];
        }
        out[o] += p;
    }
    out
}

#[test]
fn random_equations_agree_with_a_plain_evaluator() {
    let mut rng = Rng(20261203);
    let letters = ['a', 'b', 'c', 'd', 'e'];
    let mut checked = 0;
    for case in 0..400 {
        let n_ops = 1 + rng.below(3);
        let mut size = std::collections::BTreeMap::new();
        for &l in &letters {
            size.insert(l, 1 + rng.below(4));
        }
        let mut inputs: Vec<Vec<char>> = vec![];
        for _ in 0..n_ops {
            let rank = rng.below(4);
            inputs.push(
                (0..rank)
                    .map(|_| letters[rng.below(letters.len())])
                    .collect(),
            );
        }
        let mut used: Vec<char> = inputs.iter().flatten().copied().collect();
        used.sort_unstable();
        used.dedup();
        let size: std::collections::BTreeMap<char, usize> =
            used.iter().map(|l| (*l, size[l])).collect();
        // An explicit output: a random subset in random order; or the implicit one.
        let explicit = rng.below(4) != 0;
        let output: Vec<char> = if explicit {
            let mut o: Vec<char> = used.iter().filter(|_| rng.below(2) == 0).copied().collect();
            for i in (1..o.len()).rev() {
                o.swap(i, rng.below(i + 1));
            }
            o
        } else {
            used.iter()
                .filter(|l| inputs.iter().flatten().filter(|m| m == l).count() == 1)
                .copied()
                .collect()
        };
        let mut shapes = vec![];
        let mut data = vec![];
        let mut tensors = vec![];
        for ls in &inputs {
            // Some dimensions are 1 where the label is larger: they broadcast, unless the
            // label repeats in this operand (a diagonal needs equal sizes).
            let shape: Vec<usize> = ls
                .iter()
                .map(|l| {
                    let repeated = ls.iter().filter(|m| *m == l).count() > 1;
                    if !repeated && rng.below(6) == 0 {
                        1
                    } else {
                        size[l]
                    }
                })
                .collect();
            let n: usize = shape.iter().product();
            let d: Vec<f64> = (0..n).map(|_| rng.below(7) as f64 - 3.0).collect();
            // Half the operands are read through a transposed view of a contiguous copy.
            let t = if shape.len() >= 2 && rng.below(2) == 0 {
                let mut rev = shape.clone();
                rev.reverse();
                let mut back = vec![0.0f32; n];
                let strides: Vec<usize> = (0..shape.len())
                    .map(|i| shape[i + 1..].iter().product())
                    .collect();
                for (k, v) in d.iter().enumerate() {
                    // Element k of `shape` at its reversed position.
                    let mut at = 0;
                    for i in (0..shape.len()).rev() {
                        at = at * shape[i] + (k / strides[i]) % shape[i];
                    }
                    back[at] = *v as f32;
                }
                let perm: Vec<isize> = (0..shape.len() as isize).rev().collect();
                Tensor::from_vec(back, rev).permute(perm)
            } else {
                Tensor::from_vec(
                    d.iter().map(|&v| v as f32).collect::<Vec<_>>(),
                    shape.clone(),
                )
            };
            shapes.push(shape);
            data.push(d);
            tensors.push(t);
        }
        // A label's size is its largest: where every operand has it as 1, it is 1.
        let size: std::collections::BTreeMap<char, usize> = used
            .iter()
            .map(|l| {
                let n = inputs
                    .iter()
                    .zip(&shapes)
                    .flat_map(|(ls, s)| ls.iter().zip(s).filter(|(m, _)| *m == l))
                    .map(|(_, &n)| n)
                    .max()
                    .unwrap_or(1);
                (*l, n)
            })
            .collect();
        let terms: Vec<String> = inputs.iter().map(|l| l.iter().collect()).collect();
        let mut eq = terms.join(",");
        if explicit {
            eq.push_str("->");
            eq.extend(output.iter());
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let got = Tensor::try_einsum(&eq, &refs)
            .unwrap_or_else(|e| panic!("case {case} {eq} {shapes:?}: {e}"));
        let want = plain_einsum(&inputs, &output, &data, &shapes, &size);
        let want_shape: Vec<usize> = output.iter().map(|l| size[l]).collect();
        assert_eq!(
            got.shape(),
            want_shape.as_slice(),
            "case {case} {eq} {shapes:?}"
        );
        let got = got.to_vec::<f64>().unwrap();
        assert_eq!(got, want, "case {case} {eq} {shapes:?}");
        checked += 1;
    }
    assert_eq!(checked, 400);
}
