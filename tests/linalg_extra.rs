//! The second batch of `kiln::linalg` (`pinv`, `lstsq`, `matrix_power`, `matrix_exp`,
//! `lu_factor`, `lu`, `lu_solve`, `solve_triangular`) against hand-written f64 loops and
//! identities (the four Penrose conditions, the normal equations, a high-order Taylor
//! series, `P·L·U = A`, back substitution), hand-computed values, PyTorch's errors, views
//! as inputs, f32 and f64, empty batches, and central finite-difference gradient checks.

mod common;
mod fd_helpers;

use common::Rng;
use fd_helpers::{assert_close, gradcheck, values};
use kiln::linalg::{self, LstsqDriver, NormOrd};
use kiln::{DType, KilnError, Tensor};

fn t64(data: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(data, shape)
}

fn read(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

/// `a (m × k) · b (k × n)`, row-major.
fn mm(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum()
        })
        .collect()
}

/// The transpose of the row-major `m × n` matrix `a`.
fn tr(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    (0..m * n).map(|idx| a[(idx % m) * n + idx / m]).collect()
}

/// `A⁻¹·B` by Gauss–Jordan elimination with partial pivoting (`A` `n × n`, `B` `n × k`).
fn solve_ref(a: &[f64], b: &[f64], n: usize, k: usize) -> Vec<f64> {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    for c in 0..n {
        let p = (c..n)
            .max_by(|&x, &y| a[x * n + c].abs().total_cmp(&a[y * n + c].abs()))
            .unwrap();
        for j in 0..n {
            a.swap(c * n + j, p * n + j);
        }
        for j in 0..k {
            b.swap(c * k + j, p * k + j);
        }
        for r in 0..n {
            if r != c {
                let f = a[r * n + c] / a[c * n + c];
                for j in 0..n {
                    a[r * n + j] -= f * a[c * n + j];
                }
                for j in 0..k {
                    b[r * k + j] -= f * b[c * k + j];
                }
            }
        }
    }
    (0..n * k).map(|i| b[i] / a[(i / k) * n + i / k]).collect()
}

/// `Σ out·w` for a fixed random weight of `out`'s shape, so every element matters.
fn weighted(out: &Tensor, seed: u64) -> Tensor {
    let mut rng = Rng(seed);
    let w = values(&mut rng, out.numel(), -1.0, 1.0);
    out.mul(t64(w, out.shape()).cast(out.dtype())).sum(..)
}

// ---------------------------------------------------------------------------------------
// pinv, lstsq

#[test]
fn pinv_satisfies_the_penrose_conditions() {
    let mut rng = Rng(0x51);
    for (m, n) in [(4, 3), (3, 5), (4, 4), (1, 3), (5, 1)] {
        let batch = 1 + rng.below(3);
        let mut a = values(&mut rng, batch * m * n, -1.0, 1.0);
        if m > 1 && n > 1 {
            // The last matrix of the batch has rank 1 (an outer product).
            let (u, v) = (
                values(&mut rng, m, -1.0, 1.0),
                values(&mut rng, n, -1.0, 1.0),
            );
            let off = (batch - 1) * m * n;
            for i in 0..m {
                for j in 0..n {
                    a[off + i * n + j] = u[i] * v[j];
                }
            }
        }
        let p = linalg::pinv(&t64(a.clone(), &[batch, m, n]), None, None, false).unwrap();
        assert_eq!(p.shape(), &[batch, n, m]);
        let p = read(&p);
        for b in 0..batch {
            let (ab, pb) = (
                &a[b * m * n..(b + 1) * m * n],
                &p[b * n * m..(b + 1) * n * m],
            );
            let ap = mm(ab, pb, m, n, m);
            let pa = mm(pb, ab, n, m, n);
            let what = format!("{m}x{n} batch {b}");
            assert_close(&format!("A·P·A {what}"), &mm(&ap, ab, m, m, n), ab, 1e-10);
            assert_close(&format!("P·A·P {what}"), &mm(&pa, pb, n, n, m), pb, 1e-10);
            assert_close(&format!("(A·P)ᵀ {what}"), &tr(&ap, m, m), &ap, 1e-10);
            assert_close(&format!("(P·A)ᵀ {what}"), &tr(&pa, n, n), &pa, 1e-10);
        }
    }
    // Full column rank: P = (AᵀA)⁻¹Aᵀ.
    let (m, n) = (5, 3);
    let a = values(&mut rng, m * n, -1.0, 1.0);
    let at = tr(&a, m, n);
    let want = solve_ref(&mm(&at, &a, n, m, n), &at, n, m);
    let got = read(&linalg::pinv(&t64(a, &[m, n]), None, None, false).unwrap());
    assert_close("pinv full column rank", &got, &want, 1e-10);
}

#[test]
fn pinv_tolerances_hermitian_and_f32() {
    let d = t64(vec![1.0, 0.0, 0.0, 1e-10], &[2, 2]);
    // Default rtol = 2·eps: 1e-10 is kept.
    let p = read(&linalg::pinv(&d, None, None, false).unwrap());
    assert_close("default rtol", &p, &[1.0, 0.0, 0.0, 1e10], 1e-12);
    // atol > 0 alone makes rtol 0; atol = 0 keeps the default rtol.
    for (atol, rtol, want) in [
        (Some(1e-8), None, 0.0),
        (Some(1e-11), None, 1e10),
        (Some(0.0), None, 1e10),
        (None, Some(1e-9), 0.0),
        (Some(1e-12), Some(1e-9), 0.0),
        (None, Some(0.0), 1e10),
    ] {
        let p = read(&linalg::pinv(&d, atol, rtol, false).unwrap());
        assert_close(
            &format!("atol {atol:?} rtol {rtol:?}"),
            &p,
            &[1.0, 0.0, 0.0, want],
            1e-12,
        );
    }
    // f32: the default rtol is 2·eps(f32) ≈ 2.4e-7, so 1e-7 is dropped.
    let f = t64(vec![1.0, 0.0, 0.0, 1e-7], &[2, 2]).cast(DType::F32);
    let p = linalg::pinv(&f, None, None, false).unwrap();
    assert_eq!(p.dtype(), DType::F32);
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 0.0, 0.0]);
    // hermitian reads the lower triangle: [[2, ·], [1, 2]] is [[2, 1], [1, 2]].
    let h = t64(vec![2.0, 99.0, 1.0, 2.0], &[2, 2]);
    let p = read(&linalg::pinv(&h, None, None, true).unwrap());
    let third = 1.0 / 3.0;
    assert_close(
        "hermitian",
        &p,
        &[2.0 * third, -third, -third, 2.0 * third],
        1e-12,
    );
    // A symmetric indefinite singular one: eigenvalues 2 and 0 and -1.
    let s = t64(vec![2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0], &[3, 3]);
    let p = read(&linalg::pinv(&s, None, None, true).unwrap());
    assert_close(
        "hermitian singular",
        &p,
        &[0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0],
        1e-12,
    );
}

#[test]
fn lstsq_matches_the_normal_equations() {
    let mut rng = Rng(0x52);
    // Tall, full rank: AᵀA·X = AᵀB, batched.
    let (batch, m, n, k) = (3, 6, 3, 2);
    let a = values(&mut rng, batch * m * n, -1.0, 1.0);
    let b = values(&mut rng, batch * m * k, -1.0, 1.0);
    let fit = linalg::lstsq(
        &t64(a.clone(), &[batch, m, n]),
        &t64(b.clone(), &[batch, m, k]),
        None,
        None,
    )
    .unwrap();
    assert_eq!(fit.solution.shape(), &[batch, n, k]);
    let x = read(&fit.solution);
    for i in 0..batch {
        let ai = &a[i * m * n..(i + 1) * m * n];
        let at = tr(ai, m, n);
        let want = solve_ref(
            &mm(&at, ai, n, m, n),
            &mm(&at, &b[i * m * k..(i + 1) * m * k], n, m, k),
            n,
            k,
        );
        assert_close("lstsq tall", &x[i * n * k..(i + 1) * n * k], &want, 1e-10);
    }
    // gelsy: rank only, residuals and singular values empty (PyTorch's CPU default).
    assert_eq!(fit.rank.dtype(), DType::I64);
    assert_eq!(fit.rank.to_vec::<i64>().unwrap(), vec![3, 3, 3]);
    assert_eq!(fit.residuals.shape(), &[0]);
    assert_eq!(fit.singular_values.shape(), &[0]);
    // gelsd: residuals ‖A·X - B‖² per column and the singular values.
    let fit = linalg::lstsq(
        &t64(a.clone(), &[batch, m, n]),
        &t64(b.clone(), &[batch, m, k]),
        None,
        Some(LstsqDriver::Gelsd),
    )
    .unwrap();
    assert_eq!(fit.residuals.shape(), &[batch, k]);
    let mut want_res = Vec::new();
    for i in 0..batch {
        let r = mm(
            &a[i * m * n..(i + 1) * m * n],
            &x[i * n * k..(i + 1) * n * k],
            m,
            n,
            k,
        );
        for c in 0..k {
            want_res.push(
                (0..m)
                    .map(|row| (r[row * k + c] - b[i * m * k + row * k + c]).powi(2))
                    .sum(),
            );
        }
    }
    assert_close("residuals", &read(&fit.residuals), &want_res, 1e-10);
    let sv = read(&fit.singular_values);
    assert_eq!(fit.singular_values.shape(), &[batch, n]);
    let want_sv = read(&linalg::svdvals(&t64(a.clone(), &[batch, m, n])).unwrap());
    assert_close("singular values", &sv, &want_sv, 1e-12);
    // gels: residuals, no rank.
    let fit = linalg::lstsq(
        &t64(a.clone(), &[batch, m, n]),
        &t64(b.clone(), &[batch, m, k]),
        None,
        Some(LstsqDriver::Gels),
    )
    .unwrap();
    assert_eq!(
        (fit.residuals.shape(), fit.rank.shape()),
        (&[batch, k][..], &[0][..])
    );
    // Wide: the minimum-norm solution Aᵀ(AAᵀ)⁻¹B, with a vector B.
    let (m, n) = (2, 4);
    let a = values(&mut rng, m * n, -1.0, 1.0);
    let b = values(&mut rng, m, -1.0, 1.0);
    let fit = linalg::lstsq(&t64(a.clone(), &[m, n]), &t64(b.clone(), &[m]), None, None).unwrap();
    assert_eq!(fit.solution.shape(), &[n]);
    let at = tr(&a, m, n);
    let want = mm(&at, &solve_ref(&mm(&a, &at, m, n, m), &b, m, 1), n, m, 1);
    assert_close("lstsq wide", &read(&fit.solution), &want, 1e-10);
    assert_eq!(fit.rank.to_vec::<i64>().unwrap(), vec![2]);
    // Rank deficient (two equal columns): rank 1, gelsd leaves residuals empty, and the
    // solution splits the weight evenly (least norm).
    let a = t64(vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0], &[3, 2]);
    let b = t64(vec![2.0, 4.0, 6.0], &[3, 1]);
    let fit = linalg::lstsq(&a, &b, None, Some(LstsqDriver::Gelss)).unwrap();
    assert_close("rank deficient", &read(&fit.solution), &[1.0, 1.0], 1e-12);
    assert_eq!(fit.rank.to_vec::<i64>().unwrap(), vec![1]);
    assert_eq!(fit.residuals.shape(), &[0]);
    // Batch dimensions broadcast: A [2, 1, 4, 2] with B [3, 4, 1].
    let a = values(&mut rng, 2 * 4 * 2, -1.0, 1.0);
    let b = values(&mut rng, 3 * 4, -1.0, 1.0);
    let fit = linalg::lstsq(
        &t64(a.clone(), &[2, 1, 4, 2]),
        &t64(b.clone(), &[3, 4, 1]),
        None,
        None,
    )
    .unwrap();
    assert_eq!(fit.solution.shape(), &[2, 3, 2, 1]);
    assert_eq!(fit.rank.shape(), &[2, 3]);
    let x = read(&fit.solution);
    let (ai, bi) = (&a[8..16], &b[4..8]);
    let at = tr(ai, 4, 2);
    let want = solve_ref(&mm(&at, ai, 2, 4, 2), &mm(&at, bi, 2, 4, 1), 2, 1);
    assert_close(
        "broadcast [1, 1]",
        &x[(3 + 1) * 2..(3 + 1) * 2 + 2],
        &want,
        1e-10,
    );
    // f32 in, f32 out; rcond drops a small singular value.
    let a = t64(vec![1.0, 0.0, 0.0, 1e-4, 0.0, 0.0], &[3, 2]);
    let b = t64(vec![1.0, 1.0, 1.0], &[3]);
    let fit = linalg::lstsq(&a.cast(DType::F32), &b.cast(DType::F32), None, None).unwrap();
    assert_eq!(fit.solution.dtype(), DType::F32);
    assert_close("f32", &read(&fit.solution), &[1.0, 1e4], 1e-5);
    let fit = linalg::lstsq(&a, &b, Some(1e-3), None).unwrap();
    assert_close("rcond", &read(&fit.solution), &[1.0, 0.0], 1e-12);
    assert_eq!(fit.rank.to_vec::<i64>().unwrap(), vec![1]);
}

#[test]
fn pinv_lstsq_views_empties_and_errors() {
    let mut rng = Rng(0x53);
    let a = values(&mut rng, 12, -1.0, 1.0);
    let at = t64(a.clone(), &[4, 3]);
    // A transposed view: pinv(Aᵀ) = pinv(A)ᵀ; a sliced one.
    let p = read(&linalg::pinv(&at, None, None, false).unwrap());
    let pt = read(&linalg::pinv(&at.t(), None, None, false).unwrap());
    assert_close("pinv of a transpose", &pt, &tr(&p, 3, 4), 1e-12);
    let sliced = at.slice_dim(0, 1, 4, 2);
    let contiguous = t64(vec![a[3], a[4], a[5], a[9], a[10], a[11]], &[2, 3]);
    assert_close(
        "pinv of a slice",
        &read(&linalg::pinv(&sliced, None, None, false).unwrap()),
        &read(&linalg::pinv(&contiguous, None, None, false).unwrap()),
        1e-12,
    );
    // Empty batches and empty matrices.
    let e = linalg::pinv(&t64(vec![], &[0, 3, 2]), None, None, false).unwrap();
    assert_eq!(e.shape(), &[0, 2, 3]);
    let z = linalg::pinv(&t64(vec![], &[2, 0, 3]), None, None, false).unwrap();
    assert_eq!((z.shape(), read(&z)), (&[2, 3, 0][..], vec![]));
    let fit = linalg::lstsq(
        &t64(vec![], &[0, 3, 2]),
        &t64(vec![], &[0, 3, 4]),
        None,
        None,
    )
    .unwrap();
    assert_eq!(
        (fit.solution.shape(), fit.rank.shape()),
        (&[0, 2, 4][..], &[0][..])
    );
    let fit = linalg::lstsq(
        &t64(vec![], &[3, 0]),
        &t64(vec![1.0; 6], &[3, 2]),
        None,
        Some(LstsqDriver::Gelsd),
    )
    .unwrap();
    assert_eq!(fit.solution.shape(), &[0, 2]);
    assert_eq!(fit.singular_values.shape(), &[0]);
    // Errors.
    let ints = Tensor::from_vec(vec![1i64, 0, 0, 1], [2, 2]);
    assert!(matches!(
        linalg::pinv(&ints, None, None, false).unwrap_err(),
        KilnError::UnsupportedDType {
            op: "linalg.pinv",
            dtype: DType::I64,
            ..
        }
    ));
    let half = t64(vec![1.0, 0.0, 0.0, 1.0], &[2, 2]).cast(DType::F16);
    assert!(matches!(
        linalg::pinv(&half, None, None, false).unwrap_err(),
        KilnError::UnsupportedDType {
            dtype: DType::F16,
            ..
        }
    ));
    let e = linalg::pinv(&t64(vec![1.0; 6], &[2, 3]), None, None, true).unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::InvalidArgument {
                op: "linalg.pinv",
                ..
            }
        ) && e.to_string().contains("square"),
        "{e}"
    );
    assert!(matches!(
        linalg::pinv(&t64(vec![1.0; 3], &[3]), None, None, false).unwrap_err(),
        KilnError::InvalidArgument {
            op: "linalg.pinv",
            ..
        }
    ));
    assert!(linalg::pinv(&at, Some(f64::NAN), None, false).is_err());
    let b = t64(vec![1.0; 4], &[4]);
    assert!(matches!(
        linalg::lstsq(&at, &b.cast(DType::F32), None, None).unwrap_err(),
        KilnError::DTypeMismatch {
            op: "linalg.lstsq",
            ..
        }
    ));
    let e = linalg::lstsq(&at, &t64(vec![1.0; 3], &[3]), None, None).unwrap_err();
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "linalg.lstsq", lhs, rhs, .. } if lhs == &[4, 3] && rhs == &[3]),
        "{e}"
    );
    // B may not have more dimensions than A.
    assert!(matches!(
        linalg::lstsq(&at, &t64(vec![1.0; 8], &[2, 4, 1]), None, None).unwrap_err(),
        KilnError::ShapeMismatch { .. }
    ));
    assert!(matches!(
        linalg::lstsq(&ints, &ints, None, None).unwrap_err(),
        KilnError::UnsupportedDType {
            op: "linalg.lstsq",
            ..
        }
    ));
}

#[test]
fn pinv_lstsq_gradients_match_finite_differences() {
    let mut rng = Rng(0x54);
    for (m, n) in [(4, 3), (2, 4), (3, 3)] {
        let a = values(&mut rng, 2 * m * n, -1.0, 1.0);
        gradcheck(
            &format!("pinv {m}x{n}"),
            &a,
            &[2, m, n],
            &|t| weighted(&linalg::pinv(t, None, None, false).unwrap(), 1),
            1e-5,
        );
    }
    let h = values(&mut rng, 9, -1.0, 1.0);
    gradcheck(
        "pinv hermitian",
        &h,
        &[3, 3],
        &|t| weighted(&linalg::pinv(t, None, None, true).unwrap(), 2),
        1e-5,
    );
    let a = values(&mut rng, 5 * 3, -1.0, 1.0);
    let b = values(&mut rng, 5 * 2, -1.0, 1.0);
    let bt = t64(b.clone(), &[5, 2]);
    gradcheck(
        "lstsq wrt A",
        &a,
        &[5, 3],
        &|t| weighted(&linalg::lstsq(t, &bt, None, None).unwrap().solution, 3),
        1e-5,
    );
    let a0 = t64(a.clone(), &[5, 3]);
    gradcheck(
        "lstsq wrt B",
        &b,
        &[5, 2],
        &|t| weighted(&linalg::lstsq(&a0, t, None, None).unwrap().solution, 4),
        1e-5,
    );
    gradcheck(
        "lstsq residuals",
        &a,
        &[5, 3],
        &|t| {
            weighted(
                &linalg::lstsq(t, &bt, None, Some(LstsqDriver::Gels))
                    .unwrap()
                    .residuals,
                5,
            )
        },
        1e-5,
    );
}

// ---------------------------------------------------------------------------------------
// matrix_power, matrix_exp

fn eye(n: usize) -> Vec<f64> {
    (0..n * n)
        .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
        .collect()
}

/// `A^e` for `e ≥ 0` by repeated multiplication.
fn power_ref(a: &[f64], n: usize, e: usize) -> Vec<f64> {
    (0..e).fold(eye(n), |acc, _| mm(&acc, a, n, n, n))
}

/// `exp(A)` by 80 terms of the Taylor series (no scaling: for small norms only).
fn exp_ref(a: &[f64], n: usize) -> Vec<f64> {
    let mut term = eye(n);
    let mut sum = eye(n);
    for k in 1..80 {
        term = mm(&term, a, n, n, n).iter().map(|v| v / k as f64).collect();
        for (s, t) in sum.iter_mut().zip(&term) {
            *s += t;
        }
    }
    sum
}

#[test]
fn matrix_power_matches_repeated_products() {
    let mut rng = Rng(0x61);
    let (batch, n) = (3, 4);
    let mut a = values(&mut rng, batch * n * n, -1.0, 1.0);
    for b in 0..batch {
        for i in 0..n {
            a[b * n * n + i * n + i] += 2.0;
        }
    }
    let at = t64(a.clone(), &[batch, n, n]);
    let inverse: Vec<f64> = (0..batch)
        .flat_map(|b| solve_ref(&a[b * n * n..(b + 1) * n * n], &eye(n), n, n))
        .collect();
    for e in -3i64..=7 {
        let got = read(&linalg::matrix_power(&at, e).unwrap());
        let src = if e < 0 { &inverse } else { &a };
        let want: Vec<f64> = (0..batch)
            .flat_map(|b| {
                power_ref(
                    &src[b * n * n..(b + 1) * n * n],
                    n,
                    e.unsigned_abs() as usize,
                )
            })
            .collect();
        assert_close(&format!("A^{e}"), &got, &want, 1e-10);
    }
    // n = 0: identities of A's shape, even for an empty batch.
    let z = linalg::matrix_power(&t64(vec![], &[0, 2, 2]), 0).unwrap();
    assert_eq!(z.shape(), &[0, 2, 2]);
    // Integers for n ≥ 0, f32 in f32 out, a transposed view.
    let ints = Tensor::from_vec(vec![1i64, 1, 0, 1], [2, 2]);
    assert_eq!(
        linalg::matrix_power(&ints, 3)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![1, 3, 0, 1]
    );
    assert_eq!(
        linalg::matrix_power(&ints, 0)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![1, 0, 0, 1]
    );
    let f = linalg::matrix_power(&at.cast(DType::F32), 3).unwrap();
    assert_eq!(f.dtype(), DType::F32);
    assert_close(
        "f32",
        &read(&f),
        &read(&linalg::matrix_power(&at, 3).unwrap()),
        1e-5,
    );
    let first = t64(a[..n * n].to_vec(), &[n, n]);
    assert_close(
        "transposed view",
        &read(&linalg::matrix_power(&first.t(), 3).unwrap()),
        &tr(&power_ref(&a[..n * n], n, 3), n, n),
        1e-12,
    );
    // Errors: non-square, 1-D, integer inverse, singular inverse.
    let e = linalg::matrix_power(&t64(vec![1.0; 6], &[2, 3]), 2).unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::InvalidArgument {
                op: "linalg.matrix_power",
                ..
            }
        ),
        "{e}"
    );
    assert!(linalg::matrix_power(&t64(vec![1.0; 4], &[4]), 2).is_err());
    assert!(matches!(
        linalg::matrix_power(&ints, -1).unwrap_err(),
        KilnError::UnsupportedDType {
            op: "linalg.matrix_power",
            ..
        }
    ));
    assert!(matches!(
        linalg::matrix_power(&t64(vec![1.0, 2.0, 2.0, 4.0], &[2, 2]), -1).unwrap_err(),
        KilnError::Linalg { .. }
    ));
}

#[test]
fn matrix_exp_matches_taylor_series_and_closed_forms() {
    let mut rng = Rng(0x62);
    // A batch with 1-norms from about 0.1 to 6 (different numbers of squarings).
    let (batch, n) = (4, 3);
    let mut a = values(&mut rng, batch * n * n, -1.0, 1.0);
    for (b, scale) in [0.05, 0.7, 1.5, 2.5].iter().enumerate() {
        for v in &mut a[b * n * n..(b + 1) * n * n] {
            *v *= scale;
        }
    }
    let got = read(&linalg::matrix_exp(&t64(a.clone(), &[batch, n, n])).unwrap());
    let want: Vec<f64> = (0..batch)
        .flat_map(|b| exp_ref(&a[b * n * n..(b + 1) * n * n], n))
        .collect();
    assert_close("matrix_exp vs Taylor", &got, &want, 1e-13);
    // f32 agrees to f32 precision.
    let f = linalg::matrix_exp(&t64(a.clone(), &[batch, n, n]).cast(DType::F32)).unwrap();
    assert_eq!(f.dtype(), DType::F32);
    assert_close("f32", &read(&f), &want, 2e-6);
    // A diagonal matrix: exp of the diagonal, large entries too.
    let d = [10.0, -5.0, 0.3, 25.0];
    let mut dm = vec![0.0; 16];
    for i in 0..4 {
        dm[i * 4 + i] = d[i];
    }
    let got = read(&linalg::matrix_exp(&t64(dm, &[4, 4])).unwrap());
    for i in 0..4 {
        for j in 0..4 {
            let w = if i == j { d[i].exp() } else { 0.0 };
            let g = got[i * 4 + j];
            assert!(
                (g - w).abs() <= 1e-13 * w.abs(),
                "diag ({i}, {j}): {g} vs {w}"
            );
        }
    }
    // A similarity transform of that diagonal: exp(S·D·S⁻¹) = S·exp(D)·S⁻¹.
    let s = t64(vec![1.0, 0.5, 0.0, 0.2, 1.0, 0.0, 0.0, 0.3, 1.0], &[3, 3]);
    let dd = t64(vec![1.0, 0.0, 0.0, 0.0, -2.0, 0.0, 0.0, 0.0, 3.0], &[3, 3]);
    let sinv = linalg::inv(&s).unwrap();
    let got = read(&linalg::matrix_exp(&s.matmul(&dd).matmul(&sinv)).unwrap());
    let ed = t64(
        vec![
            1f64.exp(),
            0.0,
            0.0,
            0.0,
            (-2f64).exp(),
            0.0,
            0.0,
            0.0,
            3f64.exp(),
        ],
        &[3, 3],
    );
    assert_close(
        "similarity",
        &got,
        &read(&s.matmul(&ed).matmul(&sinv)),
        1e-12,
    );
    // A rotation generator: exp([[0, t], [-t, 0]]) = [[cos t, sin t], [-sin t, cos t]].
    let t = 100.0f64;
    let got = read(&linalg::matrix_exp(&t64(vec![0.0, t, -t, 0.0], &[2, 2])).unwrap());
    assert_close(
        "rotation",
        &got,
        &[t.cos(), t.sin(), -t.sin(), t.cos()],
        1e-11,
    );
    // Nilpotent, zero, a transposed view, empty batches, 0 × 0.
    let got = read(
        &linalg::matrix_exp(&t64(
            vec![0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0],
            &[3, 3],
        ))
        .unwrap(),
    );
    assert_close(
        "nilpotent",
        &got,
        &[1.0, 1.0, 3.5, 0.0, 1.0, 3.0, 0.0, 0.0, 1.0],
        1e-15,
    );
    assert_eq!(
        read(&linalg::matrix_exp(&t64(vec![0.0; 4], &[2, 2])).unwrap()),
        eye(2)
    );
    let first = t64(a[2 * n * n..3 * n * n].to_vec(), &[n, n]);
    assert_close(
        "transposed view",
        &read(&linalg::matrix_exp(&first.t()).unwrap()),
        &tr(&want[2 * n * n..3 * n * n], n, n),
        1e-13,
    );
    assert_eq!(
        linalg::matrix_exp(&t64(vec![], &[0, 3, 3]))
            .unwrap()
            .shape(),
        &[0, 3, 3]
    );
    assert_eq!(
        linalg::matrix_exp(&t64(vec![], &[2, 0, 0]))
            .unwrap()
            .shape(),
        &[2, 0, 0]
    );
    // Errors.
    let e = linalg::matrix_exp(&t64(vec![1.0; 6], &[3, 2])).unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::InvalidArgument {
                op: "linalg.matrix_exp",
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        linalg::matrix_exp(&Tensor::from_vec(vec![1i64, 0, 0, 1], [2, 2])).unwrap_err(),
        KilnError::UnsupportedDType {
            op: "linalg.matrix_exp",
            ..
        }
    ));
    assert!(linalg::matrix_exp(&t64(vec![1.0; 2], &[2])).is_err());
}

#[test]
fn matrix_power_and_exp_gradients_match_finite_differences() {
    let mut rng = Rng(0x63);
    let mut a = values(&mut rng, 2 * 9, -1.0, 1.0);
    for b in 0..2 {
        for i in 0..3 {
            a[b * 9 + i * 3 + i] += 2.0;
        }
    }
    for e in [2, 3, 5, -1, -2] {
        gradcheck(
            &format!("matrix_power {e}"),
            &a,
            &[2, 3, 3],
            &|t| weighted(&linalg::matrix_power(t, e).unwrap(), 6),
            1e-5,
        );
    }
    // One small and one large norm (different numbers of squarings).
    let mut x = values(&mut rng, 2 * 9, -1.0, 1.0);
    for v in &mut x[..9] {
        *v *= 0.2;
    }
    for v in &mut x[9..] {
        *v *= 1.5;
    }
    gradcheck(
        "matrix_exp",
        &x,
        &[2, 3, 3],
        &|t| weighted(&linalg::matrix_exp(t).unwrap(), 7),
        1e-5,
    );
}

// ---------------------------------------------------------------------------------------
// lu_factor, lu, solve_triangular, lu_solve

/// The permutation `perm` (row `i` of `Pᵀ·A` is row `perm[i]` of `A`) of LAPACK pivots.
fn perm_of(pivots: &[i32], m: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..m).collect();
    for (j, &p) in pivots.iter().enumerate() {
        perm.swap(j, p as usize - 1);
    }
    perm
}

#[test]
fn lu_reconstructs_with_lapack_pivots() {
    let mut rng = Rng(0x71);
    for (m, n) in [(4, 4), (5, 3), (3, 5), (1, 4), (4, 1)] {
        let batch = 2;
        let k = m.min(n);
        let a = values(&mut rng, batch * m * n, -1.0, 1.0);
        let at = t64(a.clone(), &[batch, m, n]);
        let (p, l, u) = linalg::lu(&at).unwrap();
        assert_eq!(
            (p.shape(), l.shape(), u.shape()),
            (&[batch, m, m][..], &[batch, m, k][..], &[batch, k, n][..])
        );
        let (lu, pivots) = linalg::lu_factor(&at).unwrap();
        assert_eq!(
            (lu.shape(), pivots.shape(), pivots.dtype()),
            (&[batch, m, n][..], &[batch, k][..], DType::I32)
        );
        let (p, l, u, lu) = (read(&p), read(&l), read(&u), read(&lu));
        let pivots = pivots.to_vec::<i32>().unwrap();
        for b in 0..batch {
            let what = format!("{m}x{n} batch {b}");
            let (pb, lb, ub) = (
                &p[b * m * m..(b + 1) * m * m],
                &l[b * m * k..(b + 1) * m * k],
                &u[b * k * n..(b + 1) * k * n],
            );
            let plu = mm(&mm(pb, lb, m, m, k), ub, m, k, n);
            assert_close(
                &format!("P·L·U {what}"),
                &plu,
                &a[b * m * n..(b + 1) * m * n],
                1e-12,
            );
            for i in 0..m {
                for j in 0..k {
                    let v = lb[i * k + j];
                    match i.cmp(&j) {
                        std::cmp::Ordering::Less => assert_eq!(v, 0.0, "L upper {what}"),
                        std::cmp::Ordering::Equal => assert_eq!(v, 1.0, "L diagonal {what}"),
                        // Partial pivoting: every multiplier is at most 1 in magnitude.
                        std::cmp::Ordering::Greater => {
                            assert!(v.abs() <= 1.0, "|L| {what}");
                            assert_eq!(v, lu[b * m * n + i * n + j], "packed L {what}");
                        }
                    }
                }
            }
            for i in 0..k {
                for j in 0..n {
                    let v = ub[i * n + j];
                    if j < i {
                        assert_eq!(v, 0.0, "U lower {what}");
                    } else {
                        assert_eq!(v, lu[b * m * n + i * n + j], "packed U {what}");
                    }
                }
            }
            // P from the pivots: P[perm[i]][i] = 1.
            let perm = perm_of(&pivots[b * k..(b + 1) * k], m);
            for (i, &r) in perm.iter().enumerate() {
                assert_eq!(pb[r * m + i], 1.0, "P from pivots {what}");
            }
            assert_eq!(pb.iter().sum::<f64>(), m as f64);
        }
    }
    // Hand values: [[1, 2], [3, 4]] swaps its rows.
    let (lu, pivots) = linalg::lu_factor(&t64(vec![1.0, 2.0, 3.0, 4.0], &[2, 2])).unwrap();
    assert_eq!(pivots.to_vec::<i32>().unwrap(), vec![2, 2]);
    assert_close(
        "hand LU",
        &read(&lu),
        &[3.0, 4.0, 1.0 / 3.0, 2.0 / 3.0],
        1e-15,
    );
    // A transposed view and f32.
    let a = values(&mut rng, 9, -1.0, 1.0);
    let at = t64(a.clone(), &[3, 3]);
    let (p, l, u) = linalg::lu(&at.t()).unwrap();
    assert_close(
        "lu of a view",
        &read(&p.matmul(&l).matmul(&u)),
        &tr(&a, 3, 3),
        1e-12,
    );
    let (p, l, u) = linalg::lu(&at.cast(DType::F32)).unwrap();
    assert_eq!(
        (p.dtype(), l.dtype(), u.dtype()),
        (DType::F32, DType::F32, DType::F32)
    );
    assert_close("f32 lu", &read(&p.matmul(&l).matmul(&u)), &a, 1e-6);
}

#[test]
fn lu_factor_refuses_singular_matrices_and_lu_does_not() {
    let a = t64(vec![2.0, 0.0, 0.0, 2.0, 1.0, 2.0, 2.0, 4.0], &[2, 2, 2]);
    match linalg::lu_factor(&a).unwrap_err() {
        KilnError::Linalg {
            op, batch, reason, ..
        } => {
            assert_eq!((op, batch), ("linalg.lu_factor", Some(1)));
            assert!(reason.contains("U[2,2] is zero"), "{reason}");
        }
        other => panic!("{other}"),
    }
    let (_, _, info) = linalg::lu_factor_ex(&a).unwrap();
    assert_eq!(info.to_vec::<i32>().unwrap(), vec![0, 2]);
    let (p, l, u) = linalg::lu(&a).unwrap();
    assert_close(
        "singular P·L·U",
        &read(&p.matmul(&l).matmul(&u)),
        &read(&a),
        1e-15,
    );
    // Empty batches and matrices.
    let (lu, piv) = linalg::lu_factor(&t64(vec![], &[0, 3, 2])).unwrap();
    assert_eq!((lu.shape(), piv.shape()), (&[0, 3, 2][..], &[0, 2][..]));
    let (p, l, u) = linalg::lu(&t64(vec![], &[2, 3, 0])).unwrap();
    assert_eq!(
        (p.shape(), l.shape(), u.shape()),
        (&[2, 3, 3][..], &[2, 3, 0][..], &[2, 0, 0][..])
    );
    assert_eq!(read(&p), [eye(3), eye(3)].concat());
    // Errors: dtype, rank.
    let ints = Tensor::from_vec(vec![1i64, 0, 0, 1], [2, 2]);
    assert!(matches!(
        linalg::lu(&ints).unwrap_err(),
        KilnError::UnsupportedDType {
            op: "linalg.lu",
            ..
        }
    ));
    assert!(matches!(
        linalg::lu_factor(&t64(vec![1.0; 2], &[2])).unwrap_err(),
        KilnError::InvalidArgument {
            op: "linalg.lu_factor",
            ..
        }
    ));
}

/// The triangular matrix `solve_triangular` reads from `a`.
fn triangle(a: &[f64], n: usize, upper: bool, unit: bool) -> Vec<f64> {
    (0..n * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            if i == j && unit {
                1.0
            } else if (upper && j >= i) || (!upper && j <= i) {
                a[e]
            } else {
                0.0
            }
        })
        .collect()
}

#[test]
fn solve_triangular_inverts_the_triangle_it_reads() {
    let mut rng = Rng(0x72);
    let (batch, n, k) = (2, 4, 3);
    let mut a = values(&mut rng, batch * n * n, -1.0, 1.0);
    for b in 0..batch {
        for i in 0..n {
            a[b * n * n + i * n + i] += 2.0;
        }
    }
    let at = t64(a.clone(), &[batch, n, n]);
    for upper in [true, false] {
        for left in [true, false] {
            for unit in [false, true] {
                let shape = if left { [batch, n, k] } else { [batch, k, n] };
                let bv = values(&mut rng, batch * n * k, -1.0, 1.0);
                let x = read(
                    &linalg::solve_triangular(&at, &t64(bv.clone(), &shape), upper, left, unit)
                        .unwrap(),
                );
                for b in 0..batch {
                    let t = triangle(&a[b * n * n..(b + 1) * n * n], n, upper, unit);
                    let xb = &x[b * n * k..(b + 1) * n * k];
                    let back = if left {
                        mm(&t, xb, n, n, k)
                    } else {
                        mm(xb, &t, k, n, n)
                    };
                    let what = format!("upper {upper} left {left} unit {unit} batch {b}");
                    assert_close(&what, &back, &bv[b * n * k..(b + 1) * n * k], 1e-12);
                }
            }
        }
    }
    // Broadcast batches: A [2, 1, n, n] with B [3, n, 1].
    let bv = values(&mut rng, 3 * n, -1.0, 1.0);
    let x = linalg::solve_triangular(
        &t64(a.clone(), &[2, 1, n, n]),
        &t64(bv.clone(), &[3, n, 1]),
        false,
        true,
        false,
    )
    .unwrap();
    assert_eq!(x.shape(), &[2, 3, n, 1]);
    let t = triangle(&a[n * n..2 * n * n], n, false, false);
    assert_close(
        "broadcast",
        &mm(&t, &read(&x)[(3 + 2) * n..(3 + 2) * n + n], n, n, 1),
        &bv[2 * n..3 * n],
        1e-12,
    );
    // A transposed view of an upper matrix is lower; f32; a zero diagonal gives inf.
    let first = t64(a[..n * n].to_vec(), &[n, n]);
    let b1 = t64(bv[..n].to_vec(), &[n, 1]);
    assert_close(
        "view",
        &read(&linalg::solve_triangular(&first.t(), &b1, false, true, false).unwrap()),
        &read(
            &linalg::solve_triangular(
                &t64(tr(&a[..n * n], n, n), &[n, n]),
                &b1,
                false,
                true,
                false,
            )
            .unwrap(),
        ),
        1e-15,
    );
    let f = linalg::solve_triangular(
        &first.cast(DType::F32),
        &b1.cast(DType::F32),
        true,
        true,
        false,
    )
    .unwrap();
    assert_eq!(f.dtype(), DType::F32);
    assert_close(
        "f32",
        &read(&f),
        &read(&linalg::solve_triangular(&first, &b1, true, true, false).unwrap()),
        1e-5,
    );
    let z = linalg::solve_triangular(
        &t64(vec![0.0, 1.0, 0.0, 1.0], &[2, 2]),
        &t64(vec![1.0, 1.0], &[2, 1]),
        true,
        true,
        false,
    )
    .unwrap();
    assert!(read(&z).iter().any(|v| !v.is_finite()));
    assert_eq!(
        linalg::solve_triangular(
            &t64(vec![], &[0, 2, 2]),
            &t64(vec![], &[0, 2, 5]),
            true,
            true,
            false
        )
        .unwrap()
        .shape(),
        &[0, 2, 5]
    );
    // Errors.
    let e = linalg::solve_triangular(&first, &t64(vec![1.0; 3], &[3, 1]), true, true, false)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            KilnError::ShapeMismatch {
                op: "linalg.solve_triangular",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        linalg::solve_triangular(&first, &t64(vec![1.0; 4], &[4, 1]), true, false, false).is_err()
    );
    assert!(linalg::solve_triangular(&first, &t64(vec![1.0; 4], &[4]), true, true, false).is_err());
    assert!(matches!(
        linalg::solve_triangular(&first, &b1.cast(DType::F32), true, true, false).unwrap_err(),
        KilnError::DTypeMismatch { .. }
    ));
    assert!(matches!(
        linalg::solve_triangular(&t64(vec![1.0; 6], &[2, 3]), &b1, true, true, false).unwrap_err(),
        KilnError::InvalidArgument { .. }
    ));
}

#[test]
fn lu_solve_solves_every_form() {
    let mut rng = Rng(0x73);
    let (batch, n, k) = (2, 4, 3);
    let a = values(&mut rng, batch * n * n, -1.0, 1.0);
    let at = t64(a.clone(), &[batch, n, n]);
    let (lu, pivots) = linalg::lu_factor(&at).unwrap();
    for left in [true, false] {
        for adjoint in [false, true] {
            let shape = if left { [batch, n, k] } else { [batch, k, n] };
            let bv = values(&mut rng, batch * n * k, -1.0, 1.0);
            let x = read(
                &linalg::lu_solve(&lu, &pivots, &t64(bv.clone(), &shape), left, adjoint).unwrap(),
            );
            for b in 0..batch {
                let ab = &a[b * n * n..(b + 1) * n * n];
                let op = if adjoint { tr(ab, n, n) } else { ab.to_vec() };
                let xb = &x[b * n * k..(b + 1) * n * k];
                let back = if left {
                    mm(&op, xb, n, n, k)
                } else {
                    mm(xb, &op, k, n, n)
                };
                assert_close(
                    &format!("left {left} adjoint {adjoint}"),
                    &back,
                    &bv[b * n * k..(b + 1) * n * k],
                    1e-10,
                );
            }
        }
    }
    // B's batch broadcast against LU's.
    let bv = values(&mut rng, 3 * n, -1.0, 1.0);
    let x = linalg::lu_solve(
        &lu.unsqueeze(1),
        &pivots.unsqueeze(1),
        &t64(bv.clone(), &[3, n, 1]),
        true,
        false,
    )
    .unwrap();
    assert_eq!(x.shape(), &[batch, 3, n, 1]);
    assert_close(
        "broadcast",
        &mm(
            &a[n * n..],
            &read(&x)[(3 + 1) * n..(3 + 1) * n + n],
            n,
            n,
            1,
        ),
        &bv[n..2 * n],
        1e-10,
    );
    // Errors: pivots dtype, range, shape; B's rows.
    let b = t64(vec![1.0; batch * n], &[batch, n, 1]);
    assert!(matches!(
        linalg::lu_solve(&lu, &pivots.cast(DType::I64), &b, true, false).unwrap_err(),
        KilnError::UnsupportedDType {
            op: "linalg.lu_solve",
            ..
        }
    ));
    let bad = Tensor::from_vec(vec![5i32; batch * n], [batch, n]);
    assert!(matches!(
        linalg::lu_solve(&lu, &bad, &b, true, false).unwrap_err(),
        KilnError::InvalidArgument {
            op: "linalg.lu_solve",
            ..
        }
    ));
    let short = pivots.slice_dim(1, 0, 2, 1);
    assert!(matches!(
        linalg::lu_solve(&lu, &short, &b, true, false).unwrap_err(),
        KilnError::ShapeMismatch { .. }
    ));
    let wrong = t64(vec![1.0; batch * 3], &[batch, 3, 1]);
    assert!(matches!(
        linalg::lu_solve(&lu, &pivots, &wrong, true, false).unwrap_err(),
        KilnError::ShapeMismatch { .. }
    ));
    assert!(linalg::lu_solve(&lu, &pivots, &wrong, false, false).is_err());
}

#[test]
fn lu_and_triangular_gradients_match_finite_differences() {
    let mut rng = Rng(0x74);
    for (m, n) in [(3, 3), (4, 2), (2, 4)] {
        let a = values(&mut rng, m * n, -1.0, 1.0);
        gradcheck(
            &format!("lu L {m}x{n}"),
            &a,
            &[m, n],
            &|t| {
                let (_, l, u) = linalg::lu(t).unwrap();
                weighted(&l, 8).add(weighted(&u, 9))
            },
            1e-5,
        );
        gradcheck(
            &format!("lu_factor {m}x{n}"),
            &a,
            &[m, n],
            &|t| weighted(&linalg::lu_factor(t).unwrap().0, 10),
            1e-5,
        );
    }
    let n = 3;
    let mut a = values(&mut rng, 2 * n * n, -1.0, 1.0);
    for b in 0..2 {
        for i in 0..n {
            a[b * n * n + i * n + i] += 2.0;
        }
    }
    let bv = values(&mut rng, 2 * n * 2, -1.0, 1.0);
    for (upper, left, unit) in [
        (true, true, false),
        (false, true, true),
        (true, false, true),
        (false, false, false),
    ] {
        let shape = if left { [2, n, 2] } else { [2, 2, n] };
        let bt = t64(bv.clone(), &shape);
        gradcheck(
            &format!("solve_triangular A {upper} {left} {unit}"),
            &a,
            &[2, n, n],
            &|t| {
                weighted(
                    &linalg::solve_triangular(t, &bt, upper, left, unit).unwrap(),
                    11,
                )
            },
            1e-5,
        );
        let a0 = t64(a.clone(), &[2, n, n]);
        gradcheck(
            &format!("solve_triangular B {upper} {left} {unit}"),
            &bv,
            &shape,
            &|t| {
                weighted(
                    &linalg::solve_triangular(&a0, t, upper, left, unit).unwrap(),
                    12,
                )
            },
            1e-5,
        );
    }
    let (lu, pivots) = linalg::lu_factor(&t64(a.clone(), &[2, n, n])).unwrap();
    let luv = read(&lu);
    for (left, adjoint) in [(true, false), (true, true), (false, false), (false, true)] {
        let shape = if left { [2, n, 2] } else { [2, 2, n] };
        let bt = t64(bv.clone(), &shape);
        gradcheck(
            &format!("lu_solve LU {left} {adjoint}"),
            &luv,
            &[2, n, n],
            &|t| {
                weighted(
                    &linalg::lu_solve(t, &pivots, &bt, left, adjoint).unwrap(),
                    13,
                )
            },
            1e-5,
        );
        gradcheck(
            &format!("lu_solve B {left} {adjoint}"),
            &bv,
            &shape,
            &|t| {
                weighted(
                    &linalg::lu_solve(&lu, &pivots, t, left, adjoint).unwrap(),
                    14,
                )
            },
            1e-5,
        );
    }
}

// ---------------------------------------------------------------------------------------
// svd_full, qr_mode, matrix_rank, cond

/// `QᵀQ = I` for the `m × m` matrix `q`.
fn assert_orthogonal(what: &str, q: &[f64], m: usize) {
    assert_close(what, &mm(&tr(q, m, m), q, m, m, m), &eye(m), 1e-12);
}

#[test]
fn svd_full_and_qr_complete_complete_the_bases() {
    let mut rng = Rng(0x81);
    for (m, n) in [(4, 2), (2, 4), (3, 3)] {
        let batch = 2;
        let k = m.min(n);
        let a = values(&mut rng, batch * m * n, -1.0, 1.0);
        let at = t64(a.clone(), &[batch, m, n]);
        let (u, s, vh) = linalg::svd_full(&at).unwrap();
        assert_eq!(
            (u.shape(), s.shape(), vh.shape()),
            (&[batch, m, m][..], &[batch, k][..], &[batch, n, n][..])
        );
        let (ur, sr, vhr) = linalg::svd(&at).unwrap();
        assert_close("S", &read(&s), &read(&sr), 0.0);
        let (q, r) = linalg::qr_mode(&at, linalg::QrMode::Complete).unwrap();
        assert_eq!(
            (q.shape(), r.shape()),
            (&[batch, m, m][..], &[batch, m, n][..])
        );
        let (qr_, rr) = linalg::qr(&at).unwrap();
        let (u, vh, ur, vhr, q, r, qr_, rr) = (
            read(&u),
            read(&vh),
            read(&ur),
            read(&vhr),
            read(&q),
            read(&r),
            read(&qr_),
            read(&rr),
        );
        for b in 0..batch {
            let what = format!("{m}x{n} batch {b}");
            let ub = &u[b * m * m..(b + 1) * m * m];
            let vb = &vh[b * n * n..(b + 1) * n * n];
            assert_orthogonal(&format!("U {what}"), ub, m);
            assert_orthogonal(&format!("Vh {what}"), &tr(vb, n, n), n);
            // The leading columns / rows are the reduced factors.
            for i in 0..m {
                for j in 0..k {
                    assert_eq!(ub[i * m + j], ur[b * m * k + i * k + j], "U lead {what}");
                }
            }
            assert_eq!(
                &vb[..k * n],
                &vhr[b * k * n..(b + 1) * k * n],
                "Vh lead {what}"
            );
            let qb = &q[b * m * m..(b + 1) * m * m];
            let rb = &r[b * m * n..(b + 1) * m * n];
            assert_orthogonal(&format!("Q {what}"), qb, m);
            assert_close(
                &format!("Q·R {what}"),
                &mm(qb, rb, m, m, n),
                &a[b * m * n..(b + 1) * m * n],
                1e-12,
            );
            for i in 0..m {
                for j in 0..n {
                    if j < i {
                        assert_eq!(rb[i * n + j], 0.0, "R lower {what}");
                    }
                }
                for j in 0..k {
                    assert_eq!(qb[i * m + j], qr_[b * m * k + i * k + j], "Q lead {what}");
                }
            }
            assert_eq!(
                &rb[..k * n],
                &rr[b * k * n..(b + 1) * k * n],
                "R lead {what}"
            );
        }
    }
    // LAPACK's reflector for [3, 4, 0]ᵀ: Q = H = I - τ·v·vᵀ, τ = 1.6, v = [1, 0.5, 0].
    let (q, r) =
        linalg::qr_mode(&t64(vec![3.0, 4.0, 0.0], &[3, 1]), linalg::QrMode::Complete).unwrap();
    assert_close(
        "hand Q",
        &read(&q),
        &[-0.6, -0.8, 0.0, -0.8, 0.6, 0.0, 0.0, 0.0, 1.0],
        1e-15,
    );
    assert_close("hand R", &read(&r), &[-5.0, 0.0, 0.0], 1e-15);
    // Mode 'r': R alone, Q empty.
    let at = t64(values(&mut rng, 6, -1.0, 1.0), &[3, 2]);
    let (q, r) = linalg::qr_mode(&at, linalg::QrMode::R).unwrap();
    assert_eq!(q.shape(), &[0]);
    assert_eq!(read(&r), read(&linalg::qr(&at).unwrap().1));
    // Empty matrices and batches; errors.
    let (u, s, vh) = linalg::svd_full(&t64(vec![], &[2, 3, 0])).unwrap();
    assert_eq!(
        (u.shape(), s.shape(), vh.shape()),
        (&[2, 3, 3][..], &[2, 0][..], &[2, 0, 0][..])
    );
    assert_eq!(read(&u), [eye(3), eye(3)].concat());
    let (q, r) = linalg::qr_mode(&t64(vec![], &[0, 4, 2]), linalg::QrMode::Complete).unwrap();
    assert_eq!((q.shape(), r.shape()), (&[0, 4, 4][..], &[0, 4, 2][..]));
    let ints = Tensor::from_vec(vec![1i64, 0, 0, 1], [2, 2]);
    assert!(matches!(
        linalg::svd_full(&ints).unwrap_err(),
        KilnError::UnsupportedDType {
            op: "linalg.svd",
            ..
        }
    ));
    assert!(matches!(
        linalg::qr_mode(&t64(vec![1.0; 3], &[3]), linalg::QrMode::R).unwrap_err(),
        KilnError::InvalidArgument {
            op: "linalg.qr",
            ..
        }
    ));
}

#[test]
fn matrix_rank_and_cond_match_their_definitions() {
    let mut rng = Rng(0x82);
    // Products of an m × r and an r × n matrix have rank r.
    let (m, n) = (5, 4);
    let mut data = Vec::new();
    for r in [0, 1, 2, 4] {
        let x = values(&mut rng, m * r, -1.0, 1.0);
        let y = values(&mut rng, r * n, -1.0, 1.0);
        data.extend(if r == 0 {
            vec![0.0; m * n]
        } else {
            mm(&x, &y, m, r, n)
        });
    }
    let at = t64(data, &[4, m, n]);
    let rank = linalg::matrix_rank(&at, None, None, false).unwrap();
    assert_eq!(rank.dtype(), DType::I64);
    assert_eq!(rank.to_vec::<i64>().unwrap(), vec![0, 1, 2, 4]);
    assert_eq!(
        linalg::matrix_rank(&at.cast(DType::F32), None, None, false)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![0, 1, 2, 4]
    );
    let d = t64(vec![1.0, 0.0, 0.0, 0.0, 1e-3, 0.0, 0.0, 0.0, 1e-9], &[3, 3]);
    for (atol, rtol, want) in [
        (None, None, 3),
        (Some(1e-6), None, 2),
        (None, Some(1e-2), 1),
        (Some(0.5), Some(1e-6), 1),
    ] {
        let got = linalg::matrix_rank(&d, atol, rtol, false)
            .unwrap()
            .to_vec::<i64>()
            .unwrap();
        assert_eq!(got, vec![want], "atol {atol:?} rtol {rtol:?}");
    }
    // hermitian reads the lower triangle: [[1, ·], [1, 1]] is [[1, 1], [1, 1]], rank 1.
    let h = t64(vec![1.0, 7.0, 1.0, 1.0], &[2, 2]);
    assert_eq!(
        linalg::matrix_rank(&h, None, None, true)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![1]
    );
    assert_eq!(
        linalg::matrix_rank(&h, None, None, false)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![2]
    );
    assert_eq!(
        linalg::matrix_rank(&t64(vec![], &[2, 0, 3]), None, None, false)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![0, 0]
    );
    assert!(linalg::matrix_rank(&t64(vec![1.0; 6], &[2, 3]), None, None, true).is_err());
    // cond against its definitions.
    let n = 3;
    let a = values(&mut rng, 2 * n * n, -1.0, 1.0);
    let at = t64(a.clone(), &[2, n, n]);
    let s = read(&linalg::svdvals(&at).unwrap());
    let c2 = read(&linalg::cond(&at, None).unwrap());
    assert_close("cond 2", &c2, &[s[0] / s[2], s[3] / s[5]], 1e-12);
    let cm2 = read(&linalg::cond(&at, Some(NormOrd::P(-2.0))).unwrap());
    assert_close("cond -2", &cm2, &[s[2] / s[0], s[5] / s[3]], 1e-12);
    let fro = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
    let col1 = |x: &[f64]| {
        (0..n)
            .map(|j| (0..n).map(|i| x[i * n + j].abs()).sum::<f64>())
            .fold(0.0, f64::max)
    };
    let row_inf = |x: &[f64]| {
        (0..n)
            .map(|i| (0..n).map(|j| x[i * n + j].abs()).sum::<f64>())
            .fold(0.0, f64::max)
    };
    for (ord, f) in [
        (NormOrd::Fro, &fro as &dyn Fn(&[f64]) -> f64),
        (NormOrd::P(1.0), &col1),
        (NormOrd::P(f64::INFINITY), &row_inf),
    ] {
        let got = read(&linalg::cond(&at, Some(ord)).unwrap());
        let want: Vec<f64> = (0..2)
            .map(|b| {
                let ab = &a[b * n * n..(b + 1) * n * n];
                f(ab) * f(&solve_ref(ab, &eye(n), n, n))
            })
            .collect();
        assert_close(&format!("cond {ord:?}"), &got, &want, 1e-10);
    }
    // Non-square for p = 2; a singular matrix in a batch is infinite only there.
    let rect = t64(vec![3.0, 0.0, 0.0, 0.0, 1.0, 0.0], &[2, 3]);
    assert_close(
        "rect",
        &read(&linalg::cond(&rect, None).unwrap()),
        &[3.0],
        1e-15,
    );
    let mixed = t64(vec![2.0, 0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0], &[2, 2, 2]);
    let got = read(&linalg::cond(&mixed, Some(NormOrd::P(1.0))).unwrap());
    assert_eq!(got[0], 2.0);
    assert!(got[1].is_infinite() && got[1] > 0.0);
    assert!(read(&linalg::cond(&mixed, None).unwrap())[1] > 1e15);
    assert!(matches!(
        linalg::cond(&rect, Some(NormOrd::Fro)).unwrap_err(),
        KilnError::InvalidArgument {
            op: "linalg.cond",
            ..
        }
    ));
    assert!(linalg::cond(&at, Some(NormOrd::P(3.0))).is_err());
    assert_eq!(
        linalg::cond(&t64(vec![], &[2, 0, 0]), None)
            .unwrap()
            .shape(),
        &[2]
    );
}

#[test]
fn complete_modes_and_cond_gradients_match_finite_differences() {
    let mut rng = Rng(0x83);
    let a = values(&mut rng, 2 * 3 * 3, -1.0, 1.0);
    for ord in [
        None,
        Some(NormOrd::Fro),
        Some(NormOrd::P(1.0)),
        Some(NormOrd::P(-2.0)),
    ] {
        gradcheck(
            &format!("cond {ord:?}"),
            &a,
            &[2, 3, 3],
            &|t| weighted(&linalg::cond(t, ord).unwrap(), 15),
            1e-5,
        );
    }
    let w = values(&mut rng, 3 * 4, -1.0, 1.0);
    gradcheck(
        "svd_full S",
        &w,
        &[4, 3],
        &|t| weighted(&linalg::svd_full(t).unwrap().1, 16),
        1e-5,
    );
    gradcheck(
        "qr 'r'",
        &w,
        &[4, 3],
        &|t| weighted(&linalg::qr_mode(t, linalg::QrMode::R).unwrap().1, 17),
        1e-5,
    );
    gradcheck(
        "qr complete wide",
        &w,
        &[3, 4],
        &|t| {
            let (q, r) = linalg::qr_mode(t, linalg::QrMode::Complete).unwrap();
            weighted(&q, 18).add(weighted(&r, 19))
        },
        1e-5,
    );
}
