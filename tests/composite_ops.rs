//! PyTorch ops kiln records as compositions (`roll`, `diagonal`, `diag`, `logical_*`,
//! `linspace`): values PyTorch 2.15 printed for the same calls, random shapes against plain
//! index arithmetic, and their gradients through the parts.

mod common;

use common::Rng;
use kiln::{DType, Tensor};

/// `torch.arange(24).reshape(2, 3, 4)`
fn x24() -> Tensor {
    Tensor::arange(0, 24, 1).reshape([2, 3, 4])
}

#[test]
fn roll_diagonal_and_diag_match_pytorch() {
    let x = x24();
    // torch.roll(x, shifts=(1, -2), dims=(2, 0))
    assert_eq!(
        x.roll(&[1, -2], &[2, 0]).to_vec::<i64>().unwrap(),
        [
            3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10, 15, 12, 13, 14, 19, 16, 17, 18, 23, 20, 21, 22
        ]
    );
    // torch.roll(x, 5): the flattened tensor
    assert_eq!(
        x.roll(&[5], &[]).to_vec::<i64>().unwrap(),
        [
            19, 20, 21, 22, 23, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18
        ]
    );
    // torch.roll(x, shifts=7, dims=1): 7 mod 3
    assert_eq!(
        x.roll(&[7], &[1]).to_vec::<i64>().unwrap(),
        [
            8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 16, 17, 18, 19
        ]
    );
    // torch.diagonal(x, 1, 1, 2): shape [2, 3]
    let d = x.diagonal(1, 1, 2);
    assert_eq!(d.shape(), &[2, 3]);
    assert_eq!(d.to_vec::<i64>().unwrap(), [1, 6, 11, 13, 18, 23]);
    // torch.diagonal(x, -1, 2, 0): shape [3, 2]
    let d = x.diagonal(-1, 2, 0);
    assert_eq!(d.shape(), &[3, 2]);
    assert_eq!(d.to_vec::<i64>().unwrap(), [1, 14, 5, 18, 9, 22]);
    // torch.diagonal(x, 5, 1, 2): empty, shape [2, 0]
    assert_eq!(x.diagonal(5, 1, 2).shape(), &[2, 0]);
    // torch.diag(tensor([1.5, -2, 3]), -1)
    let v = Tensor::from_vec(vec![1.5f32, -2.0, 3.0], [3]);
    let m = v.diag(-1);
    assert_eq!(m.shape(), &[4, 4]);
    assert_eq!(
        m.to_vec::<f32>().unwrap(),
        [
            0.0, 0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, -2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0
        ]
    );
    // torch.diag(arange(12).reshape(3, 4), 2)
    let m = Tensor::arange(0, 12, 1).reshape([3, 4]);
    assert_eq!(m.diag(2).to_vec::<i64>().unwrap(), [2, 7]);
    // Errors name the op.
    for err in [
        x.try_roll(&[1, 2], &[0]).unwrap_err(),
        x.try_roll(&[1], &[3]).unwrap_err(),
        x.try_diagonal(0, 1, -2).unwrap_err(),
        x.try_diag(0).unwrap_err(),
    ] {
        let s = err.to_string();
        assert!(s.contains("roll") || s.contains("diag"), "{s}");
    }
}

#[test]
fn logical_ops_and_linspace_match_pytorch() {
    // a = [0, 1, -2, nan, 0]; b = [True, True, False, True, False]
    let a = Tensor::from_vec(vec![0.0f32, 1.0, -2.0, f32::NAN, 0.0], [5]);
    let b = Tensor::from_vec(vec![true, true, false, true, false], [5]);
    let got = |t: Tensor| t.to_vec::<bool>().unwrap();
    assert_eq!(got(a.logical_and(&b)), [false, true, false, true, false]);
    assert_eq!(got(a.logical_or(&b)), [true, true, true, true, false]);
    assert_eq!(got(a.logical_xor(&b)), [true, false, true, false, false]);
    assert_eq!(got(a.logical_not()), [true, false, false, false, true]);
    // Broadcast, integers: logical_and(arange(3)[:, None], arange(2))
    let i = Tensor::arange(0, 3, 1).reshape([3, 1]);
    let j = Tensor::arange(0, 2, 1);
    let and = i.logical_and(&j);
    assert_eq!(and.dtype(), DType::Bool);
    assert_eq!(got(and), [false, false, false, true, false, true]);
    // torch.linspace(a, b, n) (f32), bit for bit
    #[allow(clippy::type_complexity, clippy::excessive_precision)]
    let cases: Vec<(f64, f64, usize, Vec<f32>)> = vec![
        (
            0.0,
            1.0,
            7,
            vec![
                0.0,
                0.166666672,
                0.333333343,
                0.5,
                0.666666627,
                0.833333313,
                1.0,
            ],
        ),
        (
            -3.3,
            7.1,
            10,
            vec![
                -3.29999995,
                -2.14444447,
                -0.988888979,
                0.166666508,
                1.32222199,
                2.47777796,
                3.63333344,
                4.78888893,
                5.94444466,
                7.0999999,
            ],
        ),
        (2.0, -1.0, 4, vec![2.0, 1.0, 0.0, -1.0]),
        (
            0.001,
            1.0,
            50,
            vec![
                0.00100000005,
                0.0213877559,
                0.0417755097,
                0.0621632673,
                0.0825510249,
                0.102938779,
                0.123326533,
                0.143714294,
                0.164102048,
                0.184489802,
                0.204877555,
                0.225265309,
                0.245653063,
                0.266040832,
                0.286428571,
                0.306816339,
                0.327204078,
                0.347591847,
                0.367979616,
                0.388367355,
                0.408755124,
                0.429142863,
                0.449530631,
                0.46991837,
                0.490306139,
                0.510693848,
                0.531081617,
                0.551469386,
                0.571857154,
                0.592244864,
                0.612632632,
                0.633020401,
                0.65340817,
                0.673795938,
                0.694183648,
                0.714571416,
                0.734959185,
                0.755346954,
                0.775734663,
                0.796122432,
                0.816510201,
                0.836897969,
                0.857285738,
                0.877673447,
                0.898061216,
                0.918448985,
                0.938836753,
                0.959224463,
                0.979612231,
                1.0,
            ],
        ),
    ];
    for (start, end, steps, want) in cases {
        let got = Tensor::linspace(start, end, steps, DType::F32);
        let got: Vec<u32> = got
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "linspace({start}, {end}, {steps})");
    }
    // torch.linspace(-1, 3, 9, dtype=torch.float16); one and no steps
    let h = Tensor::linspace(-1.0, 3.0, 9, DType::F16);
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(
        h.to_vec::<f32>().unwrap(),
        [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    );
    assert_eq!(
        Tensor::linspace(4.0, 9.0, 1, DType::F32)
            .to_vec::<f32>()
            .unwrap(),
        [4.0]
    );
    assert_eq!(Tensor::linspace(4.0, 9.0, 0, DType::F32).shape(), &[0]);
    assert!(Tensor::try_linspace(0.0, 1.0, 3, DType::I64).is_err());
    assert!(Tensor::try_linspace(0.0, f64::INFINITY, 3, DType::F32).is_err());
}

/// Row-major coordinates of flat index `k` in `shape`.
fn coords(mut k: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = k % shape[d];
        k /= shape[d];
    }
    c
}

fn flat(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |a, (&i, &n)| a * n + i)
}

#[test]
fn random_rolls_and_diagonals_agree_with_index_arithmetic() {
    let mut rng = Rng(77);
    for case in 0..300 {
        let nd = 1 + rng.below(4);
        let shape: Vec<usize> = (0..nd).map(|_| rng.below(5)).collect();
        let n: usize = shape.iter().product();
        let data: Vec<i64> = (0..n as i64).collect();
        // Half the inputs are a permuted view of the same values.
        let x = if nd >= 2 && rng.below(2) == 0 {
            let mut rev = shape.clone();
            rev.reverse();
            let mut back = vec![0i64; n];
            for (k, v) in data.iter().enumerate() {
                let mut c = coords(k, &shape);
                c.reverse();
                back[flat(&c, &rev)] = *v;
            }
            let perm: Vec<isize> = (0..nd as isize).rev().collect();
            Tensor::from_vec(back, rev).permute(perm)
        } else {
            Tensor::from_vec(data.clone(), shape.clone())
        };
        // roll over a random set of dims (possibly repeated, as PyTorch allows).
        let k = rng.below(3);
        let dims: Vec<isize> = (0..k)
            .map(|_| rng.below(nd) as isize - (nd as isize) * (rng.below(2) as isize))
            .collect();
        let shifts: Vec<i64> = (0..k.max(usize::from(k == 0)))
            .map(|_| rng.below(13) as i64 - 6)
            .collect();
        let got = x.roll(&shifts, &dims).to_vec::<i64>().unwrap();
        let mut want = vec![0i64; n];
        for (src, v) in data.iter().enumerate() {
            let dst = if dims.is_empty() {
                (src as i64 + shifts[0]).rem_euclid(n.max(1) as i64) as usize
            } else {
                let mut c = coords(src, &shape);
                for (&s, &d) in shifts.iter().zip(&dims) {
                    let d = d.rem_euclid(nd as isize) as usize;
                    if shape[d] > 0 {
                        c[d] = (c[d] as i64 + s).rem_euclid(shape[d] as i64) as usize;
                    }
                }
                flat(&c, &shape)
            };
            want[dst] = *v;
        }
        assert_eq!(
            got, want,
            "case {case}: roll {shifts:?} {dims:?} of {shape:?}"
        );
        // diagonal(offset, d1, d2)
        if nd >= 2 {
            let d1 = rng.below(nd);
            let d2 = (d1 + 1 + rng.below(nd - 1)) % nd;
            let offset = rng.below(7) as i64 - 3;
            let got = x.diagonal(offset, d1 as isize, d2 as isize);
            let (r0, c0) = if offset >= 0 {
                (0, offset)
            } else {
                (-offset, 0)
            };
            let m = (shape[d1] as i64 - r0).min(shape[d2] as i64 - c0).max(0) as usize;
            let mut want_shape: Vec<usize> = (0..nd)
                .filter(|&d| d != d1 && d != d2)
                .map(|d| shape[d])
                .collect();
            want_shape.push(m);
            assert_eq!(got.shape(), want_shape.as_slice(), "case {case}");
            let total: usize = want_shape.iter().product();
            let want: Vec<i64> = (0..total)
                .map(|k| {
                    let oc = coords(k, &want_shape);
                    let mut c = vec![0; nd];
                    let mut rest = oc[..oc.len() - 1].iter();
                    for (d, slot) in c.iter_mut().enumerate() {
                        if d != d1 && d != d2 {
                            *slot = *rest.next().unwrap();
                        }
                    }
                    let i = oc[oc.len() - 1];
                    c[d1] = i + r0 as usize;
                    c[d2] = i + c0 as usize;
                    data[flat(&c, &shape)]
                })
                .collect();
            assert_eq!(
                got.to_vec::<i64>().unwrap(),
                want,
                "case {case}: diagonal({offset}, {d1}, {d2}) of {shape:?}"
            );
        }
    }
}
