//! `kiln::linalg` against hand-written f64 loops and identities (A·A⁻¹ = I, A·X = B, det
//! by cofactor expansion, L·Lᵀ = A, QᵀQ = I and QR = A, V·diag(λ)·Vᵀ = A, U·S·Vᵀ = A),
//! hand-computed values, the errors PyTorch raises, views as inputs, f32 and f64, batch
//! dimensions (empty ones too), and central finite-difference gradient checks in f64 for
//! every differentiable function.

mod common;

use common::Rng;
use kiln::linalg::{self, NormOrd};
use kiln::{DType, KilnError, Tensor, f16};

fn uniform(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        .collect()
}

fn t64(data: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(data, shape)
}

fn read(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x - y).abs() <= tol * (1.0 + y.abs()) || (x.is_nan() && y.is_nan()) || x == y;
        assert!(ok, "{what}: element {i}: {x} vs {y}");
    }
}

/// `count` random well-conditioned `n × n` matrices (a random matrix plus `n·I`).
fn well_conditioned(rng: &mut Rng, count: usize, n: usize) -> Vec<f64> {
    let mut a = uniform(rng, count * n * n);
    for b in 0..count {
        for i in 0..n {
            a[b * n * n + i * n + i] += n as f64;
        }
    }
    a
}

/// `a (m × k) · b (k × n)`, row-major.
fn mm(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

fn tr(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            t[j * m + i] = a[i * n + j];
        }
    }
    t
}

fn eye(n: usize) -> Vec<f64> {
    let mut e = vec![0.0; n * n];
    for i in 0..n {
        e[i * n + i] = 1.0;
    }
    e
}

/// The determinant by cofactor expansion along the first row.
fn det_cofactor(a: &[f64], n: usize) -> f64 {
    if n == 0 {
        return 1.0;
    }
    if n == 1 {
        return a[0];
    }
    let mut total = 0.0;
    for j in 0..n {
        let minor: Vec<f64> = (1..n)
            .flat_map(|r| (0..n).filter(move |&c| c != j).map(move |c| a[r * n + c]))
            .collect();
        let sign = if j % 2 == 0 { 1.0 } else { -1.0 };
        total += sign * a[j] * det_cofactor(&minor, n - 1);
    }
    total
}

/// Central finite differences in f64 of the scalar `f(x)` against its backward gradient.
fn gradcheck(what: &str, x0: &[f64], shape: &[usize], f: impl Fn(&Tensor) -> Tensor) {
    let x = t64(x0.to_vec(), shape).requires_grad_(true);
    let y = f(&x).sum(..);
    y.backward().unwrap();
    let g = read(&x.grad().expect("a gradient"));
    let h = 1e-6;
    for i in 0..x0.len() {
        let eval = |d: f64| {
            let mut xs = x0.to_vec();
            xs[i] += d;
            f(&t64(xs, shape)).sum(..).item::<f64>().unwrap()
        };
        let num = (eval(h) - eval(-h)) / (2.0 * h);
        assert!(
            (g[i] - num).abs() <= 1e-5 * (1.0 + num.abs()),
            "{what}: d/dx[{i}]: backward {} vs finite differences {num}",
            g[i]
        );
    }
}

/// `Σ out·w` for a fixed weight of `out`'s shape, so every output element matters.
fn weighted(out: &Tensor, seed: u64) -> Tensor {
    let mut rng = Rng(seed);
    let w = uniform(&mut rng, out.numel());
    out.mul(t64(w, out.shape()).cast(out.dtype())).sum(..)
}

// ---------------------------------------------------------------------------------------
// Norms

/// The vector orders every norm test runs.
const ORDERS: [f64; 8] = [
    2.0,
    1.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    3.0,
    0.5,
    -1.5,
];

fn vnorm_ref(v: &[f64], p: f64) -> f64 {
    if p == f64::INFINITY {
        return v.iter().fold(0.0, |m, x| m.max(x.abs()));
    }
    if p == f64::NEG_INFINITY {
        return v.iter().fold(f64::INFINITY, |m, x| m.min(x.abs()));
    }
    if p == 0.0 {
        return v.iter().filter(|x| **x != 0.0).count() as f64;
    }
    v.iter().map(|x| x.abs().powf(p)).sum::<f64>().powf(1.0 / p)
}

#[test]
fn vector_norm_matches_loops_for_every_order_and_dims() {
    let mut rng = Rng(0x11);
    let shape = [3usize, 4, 5];
    let x = uniform(&mut rng, 60);
    let xt = t64(x.clone(), &shape);
    for p in ORDERS {
        // Over everything.
        let all = linalg::vector_norm(&xt, p, .., false).unwrap();
        assert_eq!(all.shape(), &[] as &[usize]);
        close(
            &read(&all),
            &[vnorm_ref(&x, p)],
            1e-12,
            &format!("p={p} all"),
        );
        let kept = linalg::vector_norm(&xt, p, .., true).unwrap();
        assert_eq!(kept.shape(), &[1, 1, 1]);
        // Over dim 1 (and -2): [3, 5].
        let d1 = linalg::vector_norm(&xt, p, -2, false).unwrap();
        assert_eq!(d1.shape(), &[3, 5]);
        let mut want = vec![];
        for i in 0..3 {
            for k in 0..5 {
                let v: Vec<f64> = (0..4).map(|j| x[i * 20 + j * 5 + k]).collect();
                want.push(vnorm_ref(&v, p));
            }
        }
        close(&read(&d1), &want, 1e-12, &format!("p={p} dim 1"));
        // Over dims [0, 2], kept: [1, 4, 1].
        let d02 = linalg::vector_norm(&xt, p, [0, 2], true).unwrap();
        assert_eq!(d02.shape(), &[1, 4, 1]);
        let want: Vec<f64> = (0..4)
            .map(|j| {
                let v: Vec<f64> = (0..3)
                    .flat_map(|i| (0..5).map(move |k| (i, k)))
                    .map(|(i, k)| x[i * 20 + j * 5 + k])
                    .collect();
                vnorm_ref(&v, p)
            })
            .collect();
        close(&read(&d02), &want, 1e-12, &format!("p={p} dims 0, 2"));
        // f32 and f16 keep their dtype, computed close to the f64 values.
        let f = linalg::vector_norm(&xt.cast(DType::F32), p, -2, false).unwrap();
        assert_eq!(f.dtype(), DType::F32);
        close(&read(&f), &read(&d1), 1e-5, &format!("p={p} f32"));
        let h = linalg::vector_norm(&xt.cast(DType::F16), p, -2, false).unwrap();
        assert_eq!(h.dtype(), DType::F16);
        close(&read(&h), &read(&d1), 4e-3, &format!("p={p} f16"));
    }
}

#[test]
fn vector_norm_edge_cases_and_errors() {
    let zero = t64(vec![0.0; 3], &[3]);
    assert_eq!(
        read(&linalg::vector_norm(&zero, 2.0, .., false).unwrap()),
        vec![0.0]
    );
    assert_eq!(
        read(&linalg::vector_norm(&zero, -1.0, .., false).unwrap()),
        vec![0.0]
    );
    // A zero element makes a negative order's norm 0.
    let v = t64(vec![0.0, 2.0], &[2]);
    assert_eq!(
        read(&linalg::vector_norm(&v, -2.0, .., false).unwrap()),
        vec![0.0]
    );
    // Empty: the 2-norm is 0; inf and negative orders have no identity.
    let empty = t64(vec![], &[2, 0]);
    assert_eq!(
        read(&linalg::vector_norm(&empty, 2.0, 1, false).unwrap()),
        vec![0.0, 0.0]
    );
    for p in [f64::INFINITY, -1.0] {
        let e = linalg::vector_norm(&empty, p, 1, false).unwrap_err();
        assert!(
            matches!(
                e,
                KilnError::InvalidArgument {
                    op: "linalg.vector_norm",
                    ..
                }
            ),
            "{e}"
        );
    }
    // 0-d input, dim 0 or -1.
    let s = Tensor::scalar(-3.0f64);
    assert_eq!(
        read(&linalg::vector_norm(&s, 2.0, 0, false).unwrap()),
        vec![3.0]
    );
    assert!(linalg::vector_norm(&s, 2.0, 1, false).is_err());
    // Integers and a NaN order are refused.
    let i = Tensor::from_vec(vec![1i64, 2], [2]);
    let e = linalg::vector_norm(&i, 2.0, .., false).unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::UnsupportedDType {
                dtype: DType::I64,
                ..
            }
        ),
        "{e}"
    );
    assert!(linalg::vector_norm(&v, f64::NAN, .., false).is_err());
    assert!(linalg::vector_norm(&v, 2.0, 3, false).is_err());
    // The gradient of the 2-norm at zero is finite: PyTorch's subgradient 0.
    for p in [2.0, 3.0, 0.5] {
        let z = t64(vec![0.0, 0.0], &[2]).requires_grad_(true);
        linalg::vector_norm(&z, p, .., false)
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(read(&z.grad().unwrap()), vec![0.0, 0.0], "p={p}");
    }
    // F.normalize still refuses a negative order under its own name.
    let e = kiln::nn::functional::normalize(&v, -1.0, 0, 1e-12).unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::InvalidArgument {
                op: "normalize",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn matrix_norm_and_norm_match_loops_and_hand_values() {
    let mut rng = Rng(0x22);
    let (b, m, n) = (2usize, 3usize, 4usize);
    let x = uniform(&mut rng, b * m * n);
    let xt = t64(x.clone(), &[b, m, n]);
    let at = |bb: usize, i: usize, j: usize| x[bb * m * n + i * n + j];
    let col_sums = |bb: usize| -> Vec<f64> {
        (0..n)
            .map(|j| (0..m).map(|i| at(bb, i, j).abs()).sum())
            .collect()
    };
    let row_sums = |bb: usize| -> Vec<f64> {
        (0..m)
            .map(|i| (0..n).map(|j| at(bb, i, j).abs()).sum())
            .collect()
    };
    let fold = |v: Vec<f64>, max: bool| {
        v.into_iter()
            .fold(if max { f64::MIN } else { f64::MAX }, |a, c| {
                if max { a.max(c) } else { a.min(c) }
            })
    };
    let cases: Vec<(NormOrd, Vec<f64>)> = vec![
        (
            NormOrd::Fro,
            (0..b)
                .map(|bb| {
                    (0..m * n)
                        .map(|i| x[bb * m * n + i].powi(2))
                        .sum::<f64>()
                        .sqrt()
                })
                .collect(),
        ),
        (
            NormOrd::P(1.0),
            (0..b).map(|bb| fold(col_sums(bb), true)).collect(),
        ),
        (
            NormOrd::P(-1.0),
            (0..b).map(|bb| fold(col_sums(bb), false)).collect(),
        ),
        (
            NormOrd::P(f64::INFINITY),
            (0..b).map(|bb| fold(row_sums(bb), true)).collect(),
        ),
        (
            NormOrd::P(f64::NEG_INFINITY),
            (0..b).map(|bb| fold(row_sums(bb), false)).collect(),
        ),
    ];
    for (ord, want) in &cases {
        let got = linalg::matrix_norm(&xt, *ord, [-2, -1], false).unwrap();
        assert_eq!(got.shape(), &[b]);
        close(&read(&got), want, 1e-12, &format!("{ord:?}"));
        // The same norm over the transposed dims of the transposed input.
        let t = linalg::matrix_norm(&xt.transpose(1, 2), *ord, [2, 1], true).unwrap();
        assert_eq!(t.shape(), &[b, 1, 1]);
        close(&read(&t), want, 1e-12, &format!("{ord:?} transposed"));
    }
    // Spectral and nuclear norms against eigenvalues of AᵀA.
    for bb in 0..b {
        let a: Vec<f64> = x[bb * m * n..(bb + 1) * m * n].to_vec();
        let ata = mm(&tr(&a, m, n), &a, n, m, n);
        let lam = read(&linalg::eigvalsh(&t64(ata, &[n, n])).unwrap());
        // The largest m eigenvalues of AᵀA are the squared singular values.
        let s: Vec<f64> = lam[n - m..]
            .iter()
            .rev()
            .map(|l| l.max(0.0).sqrt())
            .collect();
        let a_t = t64(a, &[m, n]);
        let two = linalg::matrix_norm(&a_t, NormOrd::P(2.0), [-2, -1], false).unwrap();
        close(&read(&two), &[s[0]], 1e-10, "2-norm");
        let m2 = linalg::matrix_norm(&a_t, NormOrd::P(-2.0), [-2, -1], false).unwrap();
        close(&read(&m2), &[s[m - 1]], 1e-10, "-2-norm");
        let nuc = linalg::matrix_norm(&a_t, NormOrd::Nuc, [-2, -1], false).unwrap();
        close(&read(&nuc), &[s.iter().sum::<f64>()], 1e-10, "nuclear");
    }
    let batched = linalg::matrix_norm(&xt, NormOrd::Nuc, [0, 2], true).unwrap();
    assert_eq!(batched.shape(), &[1, m, 1]);
    // Hand values and norm's dispatch.
    let a = t64(vec![1.0, -2.0, 3.0, 4.0], &[2, 2]);
    let get =
        |o: Option<NormOrd>, d: Option<&[isize]>| read(&linalg::norm(&a, o, d, false).unwrap());
    assert_eq!(get(None, None), vec![30f64.sqrt()]);
    assert_eq!(get(Some(NormOrd::P(1.0)), None), vec![6.0]);
    assert_eq!(get(Some(NormOrd::P(f64::INFINITY)), None), vec![7.0]);
    assert_eq!(get(Some(NormOrd::P(1.0)), Some(&[1])), vec![3.0, 7.0]);
    assert_eq!(get(None, Some(&[0])), vec![10f64.sqrt(), 20f64.sqrt()]);
    assert_eq!(
        get(Some(NormOrd::P(f64::NEG_INFINITY)), Some(&[1, 0])),
        vec![4.0]
    );
    // No ord, no dim: the flattened 2-norm of any rank, keepdim keeping every dim.
    let k = linalg::norm(&xt, None, None, true).unwrap();
    assert_eq!(k.shape(), &[1, 1, 1]);
    close(
        &read(&k),
        &[x.iter().map(|v| v * v).sum::<f64>().sqrt()],
        1e-12,
        "flat",
    );
    // Errors: an ord without dims on a 3-D input, a matrix ord over one dim, bad orders.
    assert!(linalg::norm(&xt, Some(NormOrd::Fro), None, false).is_err());
    assert!(linalg::norm(&a, Some(NormOrd::Fro), Some(&[0]), false).is_err());
    assert!(linalg::norm(&a, None, Some(&[0, 1, 1]), false).is_err());
    assert!(linalg::matrix_norm(&a, NormOrd::P(3.0), [-2, -1], false).is_err());
    assert!(linalg::matrix_norm(&a, NormOrd::Fro, [0, 0], false).is_err());
    assert!(linalg::matrix_norm(&t64(vec![1.0], &[1]), NormOrd::Fro, [-2, -1], false).is_err());
    // Half inputs for the entrywise orders.
    let h = linalg::matrix_norm(&a.cast(DType::F16), NormOrd::P(1.0), [-2, -1], false).unwrap();
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(h.to_vec::<f16>().unwrap(), vec![f16::from_f32(6.0)]);
}

#[test]
fn norm_gradients_match_finite_differences() {
    let mut rng = Rng(0x33);
    let x = uniform(&mut rng, 12);
    for p in ORDERS {
        gradcheck(&format!("vector_norm p={p}"), &x, &[3, 4], |t| {
            weighted(&linalg::vector_norm(t, p, 1, false).unwrap(), 7)
        });
    }
    for ord in [
        NormOrd::Fro,
        NormOrd::Nuc,
        NormOrd::P(1.0),
        NormOrd::P(-1.0),
        NormOrd::P(2.0),
        NormOrd::P(-2.0),
        NormOrd::P(f64::INFINITY),
        NormOrd::P(f64::NEG_INFINITY),
    ] {
        gradcheck(&format!("matrix_norm {ord:?}"), &x, &[3, 4], |t| {
            linalg::matrix_norm(t, ord, [-2, -1], false).unwrap()
        });
    }
}

// ---------------------------------------------------------------------------------------
// inv, solve, det, slogdet

#[test]
fn inv_solve_det_slogdet_satisfy_their_identities() {
    let mut rng = Rng(0x44);
    for (count, n) in [(1usize, 1usize), (3, 2), (2, 3), (2, 4), (1, 7)] {
        let a = well_conditioned(&mut rng, count, n);
        let at = t64(a.clone(), &[count, n, n]);
        let inv = read(&linalg::inv(&at).unwrap());
        let k = 2;
        let bv = uniform(&mut rng, count * n * k);
        let x = read(&linalg::solve(&at, &t64(bv.clone(), &[count, n, k])).unwrap());
        let det = read(&linalg::det(&at).unwrap());
        let (sign, logabs) = linalg::slogdet(&at).unwrap();
        let (sign, logabs) = (read(&sign), read(&logabs));
        for b in 0..count {
            let ab = &a[b * n * n..(b + 1) * n * n];
            close(
                &mm(ab, &inv[b * n * n..(b + 1) * n * n], n, n, n),
                &eye(n),
                1e-12,
                "A·inv(A)",
            );
            close(
                &mm(ab, &x[b * n * k..(b + 1) * n * k], n, n, k),
                &bv[b * n * k..(b + 1) * n * k],
                1e-12,
                "A·X",
            );
            if n <= 4 {
                close(&[det[b]], &[det_cofactor(ab, n)], 1e-12, "det vs cofactors");
            }
            close(&[sign[b] * logabs[b].exp()], &[det[b]], 1e-12, "slogdet");
        }
    }
    // Hand values.
    let a = t64(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]);
    close(
        &read(&linalg::det(&a).unwrap()),
        &[-2.0],
        1e-15,
        "det [[1,2],[3,4]]",
    );
    close(
        &read(&linalg::inv(&a).unwrap()),
        &[-2.0, 1.0, 1.5, -0.5],
        1e-15,
        "inv",
    );
    let (s, l) = linalg::slogdet(&a).unwrap();
    assert_eq!(read(&s), vec![-1.0]);
    close(&read(&l), &[2f64.ln()], 1e-15, "logabsdet");
    // A singular matrix: det 0, slogdet (0, -inf).
    let sing = t64(vec![1.0, 2.0, 2.0, 4.0], &[2, 2]);
    assert_eq!(read(&linalg::det(&sing).unwrap()), vec![0.0]);
    let (s, l) = linalg::slogdet(&sing).unwrap();
    assert_eq!((read(&s), read(&l)), (vec![0.0], vec![f64::NEG_INFINITY]));
}

#[test]
fn solve_takes_vectors_and_broadcasts_batches() {
    let mut rng = Rng(0x55);
    let n = 3;
    // A [2, 1, n, n], B [3, n, 2] → X [2, 3, n, 2].
    let a = well_conditioned(&mut rng, 2, n);
    let bv = uniform(&mut rng, 3 * n * 2);
    let x = linalg::solve(&t64(a.clone(), &[2, 1, n, n]), &t64(bv.clone(), &[3, n, 2])).unwrap();
    assert_eq!(x.shape(), &[2, 3, n, 2]);
    let xs = read(&x);
    for i in 0..2 {
        for j in 0..3 {
            let got = &xs[(i * 3 + j) * n * 2..(i * 3 + j + 1) * n * 2];
            close(
                &mm(&a[i * n * n..(i + 1) * n * n], got, n, n, 2),
                &bv[j * n * 2..(j + 1) * n * 2],
                1e-12,
                "broadcast",
            );
        }
    }
    // B 1-D: a vector for every matrix; B [2, n] with A [2, n, n]: a batch of vectors.
    let v = uniform(&mut rng, n);
    let x1 = linalg::solve(&t64(a.clone(), &[2, n, n]), &t64(v.clone(), &[n])).unwrap();
    assert_eq!(x1.shape(), &[2, n]);
    let x1 = read(&x1);
    for i in 0..2 {
        close(
            &mm(
                &a[i * n * n..(i + 1) * n * n],
                &x1[i * n..(i + 1) * n],
                n,
                n,
                1,
            ),
            &v,
            1e-12,
            "vector",
        );
    }
    let vb = uniform(&mut rng, 2 * n);
    let x2 = linalg::solve(&t64(a.clone(), &[2, n, n]), &t64(vb.clone(), &[2, n])).unwrap();
    assert_eq!(x2.shape(), &[2, n]);
    // B [n, 1] against A [n, n] is a matrix.
    let x3 = linalg::solve(&t64(a[..n * n].to_vec(), &[n, n]), &t64(v.clone(), &[n, 1])).unwrap();
    assert_eq!(x3.shape(), &[n, 1]);
    // Mismatched rows, dtypes.
    let e =
        linalg::solve(&t64(a[..n * n].to_vec(), &[n, n]), &t64(vec![1.0; 4], &[4])).unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::ShapeMismatch {
                op: "linalg.solve",
                ..
            }
        ),
        "{e}"
    );
    let e = linalg::solve(
        &t64(a[..n * n].to_vec(), &[n, n]),
        &Tensor::from_vec(vec![1.0f32; 3], [3]),
    )
    .unwrap_err();
    assert!(matches!(e, KilnError::DTypeMismatch { .. }), "{e}");
}

#[test]
fn errors_name_the_op_and_the_batch_element() {
    // The second matrix of the batch is singular.
    let a = t64(vec![2.0, 0.0, 0.0, 2.0, 1.0, 2.0, 2.0, 4.0], &[2, 2, 2]);
    let e = linalg::inv(&a).unwrap_err();
    match &e {
        KilnError::Linalg {
            op, batch, reason, ..
        } => {
            assert_eq!((*op, *batch), ("linalg.inv", Some(1)));
            assert!(
                reason.contains("singular") && reason.contains("element 2"),
                "{reason}"
            );
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("(Batch element 1)"), "{e}");
    let e = linalg::solve(&a, &t64(vec![1.0; 4], &[2, 2])).unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::Linalg {
                op: "linalg.solve",
                batch: Some(1),
                ..
            }
        ),
        "{e}"
    );
    let single = linalg::inv(&t64(vec![0.0; 4], &[2, 2])).unwrap_err();
    assert!(
        matches!(single, KilnError::Linalg { batch: None, .. }),
        "{single}"
    );
    // Not positive-definite: the second batch element, leading minor of order 2.
    let b = t64(vec![4.0, 0.0, 0.0, 9.0, 1.0, 2.0, 2.0, 1.0], &[2, 2, 2]);
    match linalg::cholesky(&b).unwrap_err() {
        KilnError::Linalg {
            op: "linalg.cholesky",
            batch: Some(1),
            reason,
            ..
        } => {
            assert!(reason.contains("leading minor of order 2"), "{reason}")
        }
        other => panic!("{other}"),
    }
    // Non-square, 1-D, integer and half inputs.
    let rect = t64(vec![1.0; 6], &[2, 3]);
    for r in [
        linalg::inv(&rect),
        linalg::det(&rect),
        linalg::cholesky(&rect),
        linalg::eigh(&rect).map(|p| p.0),
    ] {
        let e = r.unwrap_err();
        assert!(
            matches!(e, KilnError::InvalidArgument { .. }) && e.to_string().contains("square"),
            "{e}"
        );
    }
    assert!(matches!(
        linalg::det(&t64(vec![1.0], &[1])).unwrap_err(),
        KilnError::InvalidArgument { .. }
    ));
    let ints = Tensor::from_vec(vec![1i64, 0, 0, 1], [2, 2]);
    for r in [
        linalg::inv(&ints),
        linalg::det(&ints),
        linalg::qr(&ints).map(|p| p.0),
        linalg::svdvals(&ints),
    ] {
        assert!(matches!(
            r.unwrap_err(),
            KilnError::UnsupportedDType {
                dtype: DType::I64,
                ..
            }
        ));
    }
    let half = t64(vec![1.0, 0.0, 0.0, 1.0], &[2, 2]).cast(DType::F16);
    assert!(matches!(
        linalg::inv(&half).unwrap_err(),
        KilnError::UnsupportedDType {
            dtype: DType::F16,
            ..
        }
    ));
    assert!(linalg::solve(&rect, &t64(vec![1.0; 2], &[2])).is_err());
}

#[test]
fn views_f32_empty_batches_and_no_grad() {
    let mut rng = Rng(0x66);
    let n = 3;
    let a = well_conditioned(&mut rng, 1, n);
    let at = t64(a.clone(), &[n, n]);
    // A transposed view: inv(Aᵀ) = inv(A)ᵀ, det(Aᵀ) = det(A).
    let inv_t = read(&linalg::inv(&at.t()).unwrap());
    close(
        &inv_t,
        &tr(&read(&linalg::inv(&at).unwrap()), n, n),
        1e-12,
        "inv of a transpose",
    );
    close(
        &read(&linalg::det(&at.t()).unwrap()),
        &read(&linalg::det(&at).unwrap()),
        1e-12,
        "det of a transpose",
    );
    // A sliced view: the leading 2 × 2 block.
    let block = at.slice_dim(0, 0, 2, 1).slice_dim(1, 0, 2, 1);
    close(
        &read(&linalg::det(&block).unwrap()),
        &[a[0] * a[4] - a[1] * a[3]],
        1e-12,
        "det of a slice",
    );
    // f32 in, f32 out, close to the f64 result.
    let f = linalg::inv(&at.cast(DType::F32)).unwrap();
    assert_eq!(f.dtype(), DType::F32);
    close(
        &read(&f),
        &read(&linalg::inv(&at).unwrap()),
        1e-6,
        "f32 inv",
    );
    let (l, v) = linalg::eigh(&at.matmul(&at.t()).cast(DType::F32)).unwrap();
    assert_eq!((l.dtype(), v.dtype()), (DType::F32, DType::F32));
    // Empty batches and 0 × 0 matrices.
    let empty = t64(vec![], &[0, n, n]);
    assert_eq!(linalg::inv(&empty).unwrap().shape(), &[0, n, n]);
    assert_eq!(linalg::det(&empty).unwrap().shape(), &[0]);
    assert_eq!(linalg::cholesky(&empty).unwrap().shape(), &[0, n, n]);
    assert_eq!(linalg::eigh(&empty).unwrap().0.shape(), &[0, n]);
    let (q, r) = linalg::qr(&t64(vec![], &[0, 4, 2])).unwrap();
    assert_eq!((q.shape(), r.shape()), (&[0, 4, 2][..], &[0, 2, 2][..]));
    assert_eq!(
        linalg::svd(&t64(vec![], &[0, 2, 5])).unwrap().2.shape(),
        &[0, 2, 5]
    );
    assert_eq!(
        linalg::solve(&empty, &t64(vec![], &[0, n]))
            .unwrap()
            .shape(),
        &[0, n]
    );
    assert_eq!(
        read(&linalg::det(&t64(vec![], &[2, 0, 0])).unwrap()),
        vec![1.0, 1.0]
    );
    // Without grad the results are plain constants.
    let g = t64(a.clone(), &[n, n]).requires_grad_(true);
    assert!(linalg::inv(&g).unwrap().requires_grad());
    let off = kiln::no_grad(|| linalg::inv(&g).unwrap());
    assert!(!off.requires_grad());
    assert!(!linalg::inv(&at).unwrap().requires_grad());
}

#[test]
fn inv_det_slogdet_solve_gradients_match_finite_differences() {
    let mut rng = Rng(0x77);
    let n = 3;
    let a = well_conditioned(&mut rng, 2, n);
    let shape = [2, n, n];
    gradcheck("inv", &a, &shape, |t| weighted(&linalg::inv(t).unwrap(), 1));
    gradcheck("det", &a, &shape, |t| weighted(&linalg::det(t).unwrap(), 2));
    gradcheck("slogdet", &a, &shape, |t| {
        weighted(&linalg::slogdet(t).unwrap().1, 3)
    });
    // det at a singular matrix: the cofactor gradient.
    gradcheck(
        "det singular",
        &[1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 1.0, 0.0, 1.0],
        &[3, 3],
        |t| linalg::det(t).unwrap(),
    );
    // Rank 1 (every 2 × 2 minor vanishes, so the gradient of a 3 × 3 det is 0 there).
    gradcheck("det rank 1", &[1.0, 2.0, 2.0, 4.0], &[2, 2], |t| {
        linalg::det(t).unwrap()
    });
    let rank1 = [1.0, 2.0, 3.0, 2.0, 4.0, 6.0, -1.0, -2.0, -3.0];
    gradcheck("det rank 1 of 3", &rank1, &[3, 3], |t| {
        linalg::det(t).unwrap()
    });
    let bv = uniform(&mut rng, 2 * n * 2);
    let bt = t64(bv.clone(), &[2, n, 2]);
    gradcheck("solve wrt A", &a, &shape, |t| {
        weighted(&linalg::solve(t, &bt).unwrap(), 4)
    });
    let a0 = t64(a.clone(), &shape);
    gradcheck("solve wrt B", &bv, &[2, n, 2], |t| {
        weighted(&linalg::solve(&a0, t).unwrap(), 5)
    });
    // A vector right-hand side broadcast over A's batch, and A broadcast over B's batch.
    gradcheck("solve vector B", &bv[..n], &[n], |t| {
        weighted(&linalg::solve(&a0, t).unwrap(), 6)
    });
    let b3 = t64(uniform(&mut rng, 3 * n), &[3, 1, n, 1]);
    gradcheck("solve broadcast A", &a[..n * n], &[n, n], |t| {
        weighted(&linalg::solve(t, &b3).unwrap(), 7)
    });
}

// ---------------------------------------------------------------------------------------
// cholesky, eigh, qr, svd

/// `count` random symmetric positive-definite matrices `X·Xᵀ + n·I`.
fn spd(rng: &mut Rng, count: usize, n: usize) -> Vec<f64> {
    let x = uniform(rng, count * n * n);
    let mut out = vec![];
    for b in 0..count {
        let xb = &x[b * n * n..(b + 1) * n * n];
        let mut a = mm(xb, &tr(xb, n, n), n, n, n);
        for i in 0..n {
            a[i * n + i] += n as f64;
        }
        out.extend(a);
    }
    out
}

#[test]
fn cholesky_reconstructs_and_reads_the_lower_triangle() {
    let mut rng = Rng(0x88);
    for (count, n) in [(1usize, 1usize), (3, 3), (2, 5)] {
        let a = spd(&mut rng, count, n);
        let l = read(&linalg::cholesky(&t64(a.clone(), &[count, n, n])).unwrap());
        for b in 0..count {
            let lb = &l[b * n * n..(b + 1) * n * n];
            for i in 0..n {
                assert!(lb[i * n + i] > 0.0);
                for j in i + 1..n {
                    assert_eq!(lb[i * n + j], 0.0, "upper entry");
                }
            }
            close(
                &mm(lb, &tr(lb, n, n), n, n, n),
                &a[b * n * n..(b + 1) * n * n],
                1e-12,
                "L·Lᵀ",
            );
        }
    }
    // Hand value, and garbage above the diagonal is not read.
    let a = t64(vec![4.0, 99.0, 2.0, 5.0], &[2, 2]);
    assert_eq!(
        read(&linalg::cholesky(&a).unwrap()),
        vec![2.0, 0.0, 1.0, 2.0]
    );
    let f = linalg::cholesky(&a.cast(DType::F32)).unwrap();
    assert_eq!(f.to_vec::<f32>().unwrap(), vec![2.0, 0.0, 1.0, 2.0]);
}

#[test]
fn eigh_decomposes_symmetric_matrices() {
    let mut rng = Rng(0x99);
    for (count, n) in [(1usize, 1usize), (2, 2), (3, 4), (1, 8)] {
        let x = uniform(&mut rng, count * n * n);
        // Symmetric from the lower triangle; the upper triangle holds other values.
        let mut sym = x.clone();
        for b in 0..count {
            for i in 0..n {
                for j in i + 1..n {
                    sym[b * n * n + i * n + j] = x[b * n * n + j * n + i];
                }
            }
        }
        let (l, v) = linalg::eigh(&t64(x.clone(), &[count, n, n])).unwrap();
        assert_eq!(
            (l.shape(), v.shape()),
            (&[count, n][..], &[count, n, n][..])
        );
        let (l, v) = (read(&l), read(&v));
        for b in 0..count {
            let lb = &l[b * n..(b + 1) * n];
            assert!(lb.windows(2).all(|w| w[0] <= w[1]), "ascending: {lb:?}");
            let vb = &v[b * n * n..(b + 1) * n * n];
            close(&mm(&tr(vb, n, n), vb, n, n, n), &eye(n), 1e-12, "VᵀV");
            let mut vl = vb.to_vec();
            for i in 0..n {
                for j in 0..n {
                    vl[i * n + j] *= lb[j];
                }
            }
            close(
                &mm(&vl, &tr(vb, n, n), n, n, n),
                &sym[b * n * n..(b + 1) * n * n],
                1e-12,
                "V·diag(λ)·Vᵀ",
            );
        }
    }
    let (l, v) = linalg::eigh(&t64(vec![2.0, 0.0, 1.0, 2.0], &[2, 2])).unwrap();
    close(&read(&l), &[1.0, 3.0], 1e-15, "hand eigenvalues");
    let h = 0.5f64.sqrt();
    // Each vector's largest entry (the first among ties) is positive.
    close(&read(&v), &[h, h, -h, h], 1e-15, "hand eigenvectors");
    close(
        &read(&linalg::eigvalsh(&t64(vec![2.0, 1.0, 1.0, 2.0], &[2, 2])).unwrap()),
        &[1.0, 3.0],
        1e-15,
        "eigvalsh",
    );
}

#[test]
fn qr_is_orthonormal_times_upper_triangular_with_lapacks_signs() {
    let mut rng = Rng(0xAA);
    for (count, m, n) in [(2usize, 4usize, 3usize), (1, 3, 3), (2, 2, 5), (1, 1, 1)] {
        let a = uniform(&mut rng, count * m * n);
        let (q, r) = linalg::qr(&t64(a.clone(), &[count, m, n])).unwrap();
        let k = m.min(n);
        assert_eq!(
            (q.shape(), r.shape()),
            (&[count, m, k][..], &[count, k, n][..])
        );
        let (q, r) = (read(&q), read(&r));
        for b in 0..count {
            let qb = &q[b * m * k..(b + 1) * m * k];
            let rb = &r[b * k * n..(b + 1) * k * n];
            close(&mm(&tr(qb, m, k), qb, k, m, k), &eye(k), 1e-12, "QᵀQ");
            close(
                &mm(qb, rb, m, k, n),
                &a[b * m * n..(b + 1) * m * n],
                1e-12,
                "QR",
            );
            for i in 0..k {
                for j in 0..i.min(n) {
                    assert_eq!(rb[i * n + j], 0.0, "R lower entry");
                }
            }
        }
    }
    // LAPACK's reflectors: a positive leading entry gives a negative R_00.
    let (q, r) = linalg::qr(&t64(vec![3.0, 1.0, 4.0, 2.0], &[2, 2])).unwrap();
    close(&read(&r), &[-5.0, -2.2, 0.0, 0.4], 1e-14, "hand R");
    close(&read(&q), &[-0.6, -0.8, -0.8, 0.6], 1e-14, "hand Q");
}

#[test]
fn svd_reconstructs_with_descending_singular_values() {
    let mut rng = Rng(0xBB);
    for (count, m, n) in [(2usize, 4usize, 3usize), (1, 3, 3), (2, 2, 5)] {
        let a = uniform(&mut rng, count * m * n);
        let at = t64(a.clone(), &[count, m, n]);
        let (u, s, vh) = linalg::svd(&at).unwrap();
        let k = m.min(n);
        assert_eq!(
            (u.shape(), s.shape(), vh.shape()),
            (&[count, m, k][..], &[count, k][..], &[count, k, n][..])
        );
        close(
            &read(&linalg::svdvals(&at).unwrap()),
            &read(&s),
            0.0,
            "svdvals",
        );
        let (u, s, vh) = (read(&u), read(&s), read(&vh));
        for b in 0..count {
            let (ub, sb, vb) = (
                &u[b * m * k..(b + 1) * m * k],
                &s[b * k..(b + 1) * k],
                &vh[b * k * n..(b + 1) * k * n],
            );
            assert!(
                sb.windows(2).all(|w| w[0] >= w[1]) && sb[k - 1] >= 0.0,
                "{sb:?}"
            );
            close(&mm(&tr(ub, m, k), ub, k, m, k), &eye(k), 1e-12, "UᵀU");
            close(&mm(vb, &tr(vb, k, n), k, n, k), &eye(k), 1e-12, "Vh·Vhᵀ");
            let mut us = ub.to_vec();
            for i in 0..m {
                for j in 0..k {
                    us[i * k + j] *= sb[j];
                }
            }
            close(
                &mm(&us, vb, m, k, n),
                &a[b * m * n..(b + 1) * m * n],
                1e-12,
                "U·S·Vh",
            );
        }
    }
    // Rank-deficient: U stays orthonormal.
    let (u, s, _) = linalg::svd(&t64(vec![1.0, 2.0, 2.0, 4.0, 0.0, 0.0], &[3, 2])).unwrap();
    close(&read(&s), &[5.0, 0.0], 1e-12, "rank 1");
    let u = read(&u);
    close(
        &mm(&tr(&u, 3, 2), &u, 2, 3, 2),
        &eye(2),
        1e-12,
        "rank-1 UᵀU",
    );
}

#[test]
fn decomposition_gradients_match_finite_differences() {
    let mut rng = Rng(0xCC);
    let n = 3;
    // cholesky through A = X·Xᵀ + n·I (PyTorch's gradient is for symmetric perturbations).
    let x = uniform(&mut rng, 2 * n * n);
    let eye_t = t64(eye(n), &[n, n]);
    gradcheck("cholesky", &x, &[2, n, n], |t| {
        let a = t.matmul(&t.transpose(-2, -1)) + &eye_t * n as f64;
        weighted(&linalg::cholesky(&a).unwrap(), 11)
    });
    // eigh through A = (X + Xᵀ)/2: eigenvalues, and eigenvectors via Σ vᵢᵀ·W·vᵢ (sign-free).
    let w = t64(spd(&mut rng, 1, n), &[n, n]);
    gradcheck("eigh values", &x, &[2, n, n], |t| {
        let a = (t + &t.transpose(-2, -1)) * 0.5;
        weighted(&linalg::eigh(&a).unwrap().0, 12)
    });
    gradcheck("eigh vectors", &x, &[2, n, n], |t| {
        let a = (t + &t.transpose(-2, -1)) * 0.5;
        let (l, v) = linalg::eigh(&a).unwrap();
        weighted(&l, 13) + (w.matmul(&v) * &v).sum(..)
    });
    gradcheck("eigvalsh", &x[..n * n], &[n, n], |t| {
        weighted(&linalg::eigvalsh(&((t + &t.t()) * 0.5)).unwrap(), 14)
    });
    // Repeated eigenvalues and zero singular values: a loss of the values alone keeps a
    // finite, exact gradient (V·diag(g)·Vᵀ and U·diag(g)·Vh).
    let diag = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0];
    // (Only symmetric functions of a repeated eigenvalue are differentiable: Σ λ².)
    gradcheck("eigh repeated", &diag, &[3, 3], |t| {
        let l = linalg::eigh(&((t + &t.t()) * 0.5)).unwrap().0;
        (&l * &l).sum(..)
    });
    let i3 = t64(diag.to_vec(), &[3, 3]).requires_grad_(true);
    weighted(&linalg::eigvalsh(&i3).unwrap(), 19)
        .backward()
        .unwrap();
    assert!(read(&i3.grad().unwrap()).iter().all(|g| g.is_finite()));
    let tall = [1.0, 2.0, 2.0, 4.0, 0.0, 0.0];
    // (The zero singular value has a kink: the largest alone.)
    gradcheck("svd rank 1, S only", &tall, &[3, 2], |t| {
        linalg::svd(t).unwrap().1.slice_dim(0, 0, 1, 1).sum(..)
    });
    // qr: tall, square and wide.
    for (m, nn) in [(4usize, 3usize), (3, 3), (2, 4)] {
        let a = uniform(&mut rng, 2 * m * nn);
        gradcheck(&format!("qr {m}x{nn}"), &a, &[2, m, nn], |t| {
            let (q, r) = linalg::qr(t).unwrap();
            weighted(&q, 15) + weighted(&r, 16)
        });
    }
    // svd: S weighted, U and V through sign-free quadratic forms; svdvals.
    for (m, nn) in [(4usize, 3usize), (3, 3), (2, 4)] {
        let a = uniform(&mut rng, m * nn);
        let k = m.min(nn);
        let w1 = t64(spd(&mut rng, 1, m), &[m, m]);
        let w2 = t64(spd(&mut rng, 1, nn), &[nn, nn]);
        gradcheck(&format!("svd {m}x{nn}"), &a, &[m, nn], |t| {
            let (u, s, vh) = linalg::svd(t).unwrap();
            let v = vh.t();
            weighted(&s, 17) + (w1.matmul(&u) * &u).sum(..) + (w2.matmul(&v) * &v).sum(..)
        });
        gradcheck(&format!("svdvals {m}x{nn}"), &a, &[m, nn], |t| {
            weighted(&linalg::svdvals(t).unwrap(), 18)
        });
        assert!(k > 0);
    }
}
