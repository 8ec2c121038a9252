//! The host algorithms behind the decompositions: one matrix at a time, in f64, row-major
//! slices. Partial-pivoting LU, Cholesky, Householder QR (LAPACK's reflector convention),
//! cyclic Jacobi for symmetric eigenproblems and one-sided Jacobi for the SVD.

/// A failed factorization, in PyTorch's words.
pub(crate) enum Failure {
    /// The LU factor's pivot `index` (1-based, as LAPACK counts) is exactly zero.
    Singular(usize),
    /// The leading minor of `order` is not positive-definite.
    NotPositiveDefinite(usize),
}

/// An LU factorization with partial pivoting, `P·A = L·U`, packed as LAPACK packs it: the
/// strict lower triangle holds `L` (unit diagonal implied), the rest `U`.
pub(crate) struct Lu {
    n: usize,
    lu: Vec<f64>,
    /// `perm[i]`: the row of `A` that became row `i`.
    perm: Vec<usize>,
    /// `+1` or `-1`: the permutation's sign.
    sign: f64,
    /// The first exactly-zero pivot (1-based), if any.
    zero_pivot: Option<usize>,
}

impl Lu {
    /// Factors the `n × n` matrix `a`.
    pub(crate) fn new(a: &[f64], n: usize) -> Lu {
        let (lu, pivots, zero_pivot) = lu_rect(a, n, n);
        let swaps = pivots
            .iter()
            .enumerate()
            .filter(|&(j, &p)| p != j + 1)
            .count();
        Lu {
            n,
            lu,
            perm: pivots_to_perm(&pivots, n),
            sign: if swaps % 2 == 0 { 1.0 } else { -1.0 },
            zero_pivot,
        }
    }

    /// The determinant: the pivots' product times the permutation's sign.
    pub(crate) fn det(&self) -> f64 {
        (0..self.n).fold(self.sign, |d, i| d * self.lu[i * self.n + i])
    }

    /// `(sign, log|det|)`: sign 0 and `-inf` for a singular matrix, as PyTorch.
    pub(crate) fn slogdet(&self) -> (f64, f64) {
        let mut sign = self.sign;
        let mut log = 0.0;
        for i in 0..self.n {
            let u = self.lu[i * self.n + i];
            if u == 0.0 {
                return (0.0, f64::NEG_INFINITY);
            }
            sign *= u.signum();
            log += u.abs().ln();
        }
        (sign, log)
    }

    /// `A⁻¹·B` for the `n × k` row-major `b`, or the singular pivot.
    pub(crate) fn solve(&self, b: &[f64], k: usize) -> Result<Vec<f64>, Failure> {
        if let Some(p) = self.zero_pivot {
            return Err(Failure::Singular(p));
        }
        let n = self.n;
        let mut x = vec![0.0; n * k];
        for i in 0..n {
            x[i * k..(i + 1) * k].copy_from_slice(&b[self.perm[i] * k..(self.perm[i] + 1) * k]);
        }
        // Forward substitution with unit L, then back substitution with U.
        for i in 0..n {
            for j in 0..i {
                let l = self.lu[i * n + j];
                if l != 0.0 {
                    for c in 0..k {
                        x[i * k + c] -= l * x[j * k + c];
                    }
                }
            }
        }
        for i in (0..n).rev() {
            for j in i + 1..n {
                let u = self.lu[i * n + j];
                if u != 0.0 {
                    for c in 0..k {
                        x[i * k + c] -= u * x[j * k + c];
                    }
                }
            }
            let d = self.lu[i * n + i];
            for c in 0..k {
                x[i * k + c] /= d;
            }
        }
        Ok(x)
    }

    /// `A⁻¹`, or the singular pivot.
    pub(crate) fn inverse(&self) -> Result<Vec<f64>, Failure> {
        self.solve(&identity(self.n), self.n)
    }
}

/// The `n × n` identity, row-major.
pub(crate) fn identity(n: usize) -> Vec<f64> {
    let mut e = vec![0.0; n * n];
    for i in 0..n {
        e[i * n + i] = 1.0;
    }
    e
}

/// The transpose of the `m × n` row-major `a`.
pub(crate) fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            t[j * m + i] = a[i * n + j];
        }
    }
    t
}

/// The cofactor matrix of `a` (`C[i][j] = (-1)^(i+j)·det(minor(i, j))`), which is
/// `det(A)·A⁻ᵀ` where `A` is invertible and still the derivative of `det` where it is not
/// (then computed from the SVD, in O(n³)).
pub(crate) fn cofactors(a: &[f64], n: usize) -> Vec<f64> {
    let lu = Lu::new(a, n);
    if lu.zero_pivot.is_none() {
        let det = lu.det();
        if let Ok(inv) = lu.inverse() {
            return transpose(&inv, n, n).iter().map(|v| v * det).collect();
        }
    }
    // Singular: with A = U·S·Vᵀ, adj(A) = det(V)·V·adj(S)·det(U)·Uᵀ (adj(Q) = det(Q)·Qᵀ for
    // an orthogonal Q), adj(S) = diag(Π_{j≠i} s_j), and the cofactors are adj(A)ᵀ.
    let (u, s, vt) = svd(a, n, n);
    let sign = Lu::new(&u, n).det().signum() * Lu::new(&vt, n).det().signum();
    let others: Vec<f64> = (0..n)
        .map(|i| (0..n).filter(|&j| j != i).map(|j| s[j]).product())
        .collect();
    let mut c = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            c[i * n + j] = sign
                * (0..n)
                    .map(|k| u[i * n + k] * others[k] * vt[k * n + j])
                    .sum::<f64>();
        }
    }
    c
}

/// The lower Cholesky factor of the symmetric matrix whose lower triangle `a` holds (the
/// upper triangle is not read, as LAPACK's `uplo = 'L'`).
pub(crate) fn cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, Failure> {
    let mut l = vec![0.0; n * n];
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= l[j * n + k] * l[j * n + k];
        }
        // NaN fails too.
        if d.is_nan() || d <= 0.0 {
            return Err(Failure::NotPositiveDefinite(j + 1));
        }
        let d = d.sqrt();
        l[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= l[i * n + k] * l[j * n + k];
            }
            l[i * n + j] = s / d;
        }
    }
    Ok(l)
}

/// The inverse of the lower-triangular `l` with a nonzero diagonal.
pub(crate) fn lower_inverse(l: &[f64], n: usize) -> Vec<f64> {
    let mut x = vec![0.0; n * n];
    for c in 0..n {
        // Column c of L⁻¹: forward substitution against e_c.
        for i in c..n {
            let mut s = if i == c { 1.0 } else { 0.0 };
            for k in c..i {
                s -= l[i * n + k] * x[k * n + c];
            }
            x[i * n + c] = s / l[i * n + i];
        }
    }
    x
}

/// The reduced QR factorization of the `m × n` matrix `a`: `(Q, R)` with `Q` `m × k` and `R`
/// `k × n`, `k = min(m, n)`. Householder reflectors as LAPACK's `geqrf`/`orgqr` build
/// them (`H = I - τ·v·vᵀ`, `v[0] = 1`, `β = -sign(α)·‖x‖`), so `R`'s diagonal carries the
/// signs PyTorch's results carry.
pub(crate) fn qr(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    qr_columns(a, m, n, m.min(n))
}

/// [`qr`] with `Q`'s first `cols` columns (`min(m, n) ≤ cols ≤ m`): `cols = m` is the
/// complete `Q` of LAPACK's `orgqr` applied to the whole identity.
pub(crate) fn qr_columns(a: &[f64], m: usize, n: usize, cols: usize) -> (Vec<f64>, Vec<f64>) {
    let k = m.min(n);
    let mut r = a.to_vec();
    // Reflector j: v (length m - j, v[0] = 1) and τ.
    let mut vs: Vec<(Vec<f64>, f64)> = Vec::with_capacity(k);
    for j in 0..k {
        let alpha = r[j * n + j];
        let xnorm = (j + 1..m)
            .map(|i| r[i * n + j] * r[i * n + j])
            .sum::<f64>()
            .sqrt();
        let mut v = vec![0.0; m - j];
        v[0] = 1.0;
        if xnorm == 0.0 {
            vs.push((v, 0.0));
            continue;
        }
        let beta = -alpha.hypot(xnorm).copysign(alpha);
        let tau = (beta - alpha) / beta;
        let scale = 1.0 / (alpha - beta);
        for i in j + 1..m {
            v[i - j] = r[i * n + j] * scale;
        }
        // Apply H to columns j..n of r.
        for c in j..n {
            let dot: f64 = (j..m).map(|i| v[i - j] * r[i * n + c]).sum();
            let f = tau * dot;
            for i in j..m {
                r[i * n + c] -= f * v[i - j];
            }
        }
        // Exact zeros below the diagonal.
        r[j * n + j] = beta;
        for i in j + 1..m {
            r[i * n + j] = 0.0;
        }
        vs.push((v, tau));
    }
    // Q = H_1 … H_k applied to the first `cols` columns of the identity (backwards).
    let mut q = vec![0.0; m * cols];
    for i in 0..cols {
        q[i * cols + i] = 1.0;
    }
    for (j, (v, tau)) in vs.iter().enumerate().rev() {
        if *tau == 0.0 {
            continue;
        }
        for c in 0..cols {
            let dot: f64 = (j..m).map(|i| v[i - j] * q[i * cols + c]).sum();
            let f = tau * dot;
            for i in j..m {
                q[i * cols + c] -= f * v[i - j];
            }
        }
    }
    let mut rk = vec![0.0; k * n];
    for i in 0..k {
        for j in i..n {
            rk[i * n + j] = r[i * n + j];
        }
    }
    (q, rk)
}

/// The eigenvalues (ascending) and eigenvectors (columns of the row-major `n × n` result)
/// of the symmetric matrix whose lower triangle `a` holds, by cyclic Jacobi rotations.
/// Each eigenvector is normalized so that its entry of largest magnitude (the first one
/// among ties) is positive.
pub(crate) fn eigh(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut s = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            s[i * n + j] = a[i * n + j];
            s[j * n + i] = a[i * n + j];
        }
    }
    let mut v = identity(n);
    let floor = f64::EPSILON * 1e-4 * s.iter().map(|x| x * x).sum::<f64>().sqrt();
    for _sweep in 0..100 {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let apq = s[p * n + q];
                let (app, aqq) = (s[p * n + p], s[q * n + q]);
                // Negligible next to the diagonal: already converged (classic Jacobi test).
                if apq.abs() <= floor || apq.abs() <= 1e-2 * f64::EPSILON * (app * aqq).abs().sqrt()
                {
                    s[p * n + q] = 0.0;
                    s[q * n + p] = 0.0;
                    continue;
                }
                if !apq.is_finite() {
                    continue;
                }
                rotated = true;
                let rot = jacobi_rotation(app, aqq, apq);
                let (c, sn) = rot;
                // S ← Jᵀ S J with J the rotation in the (p, q) plane.
                rotate_columns(&mut s, n, n, p, q, rot);
                for k in 0..n {
                    let (spk, sqk) = (s[p * n + k], s[q * n + k]);
                    s[p * n + k] = c * spk - sn * sqk;
                    s[q * n + k] = sn * spk + c * sqk;
                }
                s[p * n + q] = 0.0;
                s[q * n + p] = 0.0;
                rotate_columns(&mut v, n, n, p, q, rot);
            }
        }
        if !rotated {
            break;
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| s[x * n + x].total_cmp(&s[y * n + y]));
    let values: Vec<f64> = order.iter().map(|&i| s[i * n + i]).collect();
    let mut vectors = vec![0.0; n * n];
    for (c, &src) in order.iter().enumerate() {
        for r in 0..n {
            vectors[r * n + c] = v[r * n + src];
        }
    }
    normalize_column_signs(&mut vectors, n, n);
    (values, vectors)
}

/// The rotation `(c, s)` that zeroes the off-diagonal entry of the symmetric 2 × 2 matrix
/// `[[app, apq], [apq, aqq]]` (the smaller of the two angles that do).
fn jacobi_rotation(app: f64, aqq: f64, apq: f64) -> (f64, f64) {
    let theta = (aqq - app) / (2.0 * apq);
    let t = if theta == 0.0 {
        1.0
    } else {
        theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt())
    };
    let c = 1.0 / (t * t + 1.0).sqrt();
    (c, t * c)
}

/// Rotates columns `p` and `q` of the row-major `rows × cols` matrix `x` by `(c, s)`.
fn rotate_columns(x: &mut [f64], rows: usize, cols: usize, p: usize, q: usize, (c, s): (f64, f64)) {
    for k in 0..rows {
        let (xp, xq) = (x[k * cols + p], x[k * cols + q]);
        x[k * cols + p] = c * xp - s * xq;
        x[k * cols + q] = s * xp + c * xq;
    }
}

/// Flips each column of the `m × k` row-major `x` so that its entry of largest magnitude
/// (the first among ties) is positive.
fn normalize_column_signs(x: &mut [f64], m: usize, k: usize) {
    for c in 0..k {
        let mut best = 0;
        for r in 1..m {
            if x[r * k + c].abs() > x[best * k + c].abs() {
                best = r;
            }
        }
        if m > 0 && x[best * k + c] < 0.0 {
            for r in 0..m {
                x[r * k + c] = -x[r * k + c];
            }
        }
    }
}

/// The reduced SVD of the `m × n` matrix `a`: `(U, S, Vᵀ)` with `U` `m × k`, `S` (length
/// `k`, descending) and `Vᵀ` `k × n`, `k = min(m, n)`, by one-sided Jacobi rotations.
/// `U` and `V` have orthonormal columns even where singular values are zero (the missing
/// columns are completed from the standard basis). Each column of `V` is normalized so
/// that its entry of largest magnitude is positive.
pub(crate) fn svd(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    if m < n {
        // Aᵀ = V S Uᵀ.
        let (v, s, ut) = svd(&transpose(a, m, n), n, m);
        return (transpose(&ut, m, m), s, transpose(&v, n, m));
    }
    // m ≥ n: rotate the columns of W = A (m × n) until they are orthogonal; V collects the
    // rotations.
    let mut w = a.to_vec();
    let mut v = identity(n);
    for _sweep in 0..100 {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let (mut alpha, mut beta, mut gamma) = (0.0, 0.0, 0.0);
                for i in 0..m {
                    let (wp, wq) = (w[i * n + p], w[i * n + q]);
                    alpha += wp * wp;
                    beta += wq * wq;
                    gamma += wp * wq;
                }
                if gamma == 0.0 || gamma.abs() <= f64::EPSILON * (alpha * beta).sqrt() {
                    continue;
                }
                rotated = true;
                let rot = jacobi_rotation(alpha, beta, gamma);
                rotate_columns(&mut w, m, n, p, q, rot);
                rotate_columns(&mut v, n, n, p, q, rot);
            }
        }
        if !rotated {
            break;
        }
    }
    let norms: Vec<f64> = (0..n)
        .map(|c| {
            (0..m)
                .map(|i| w[i * n + c] * w[i * n + c])
                .sum::<f64>()
                .sqrt()
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| norms[y].total_cmp(&norms[x]));
    let s: Vec<f64> = order.iter().map(|&c| norms[c]).collect();
    let mut vv = vec![0.0; n * n];
    let mut u = vec![0.0; m * n];
    for (k, &c) in order.iter().enumerate() {
        for i in 0..n {
            vv[i * n + k] = v[i * n + c];
        }
        for i in 0..m {
            u[i * n + k] = w[i * n + c];
        }
    }
    // Sign-normalize V's columns, carrying each flip into U.
    for k in 0..n {
        let mut best = 0;
        for i in 1..n {
            if vv[i * n + k].abs() > vv[best * n + k].abs() {
                best = i;
            }
        }
        if vv[best * n + k] < 0.0 {
            for i in 0..n {
                vv[i * n + k] = -vv[i * n + k];
            }
            for i in 0..m {
                u[i * n + k] = -u[i * n + k];
            }
        }
    }
    // U's columns: W's columns over their norms; where a norm is (relatively) zero, a unit
    // vector orthogonal to the previous columns.
    let tiny = s.first().copied().unwrap_or(0.0) * f64::EPSILON * (m.max(n) as f64);
    let mut next_basis = 0;
    for k in 0..n {
        if s[k] > tiny && s[k] > 0.0 {
            for i in 0..m {
                u[i * n + k] /= s[k];
            }
            continue;
        }
        // Gram–Schmidt of standard basis vectors against columns 0..k.
        while next_basis < m {
            let mut col = vec![0.0; m];
            col[next_basis] = 1.0;
            next_basis += 1;
            for _ in 0..2 {
                for j in 0..k {
                    let dot: f64 = (0..m).map(|i| u[i * n + j] * col[i]).sum();
                    for i in 0..m {
                        col[i] -= dot * u[i * n + j];
                    }
                }
            }
            let norm = col.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm > 1e-6 {
                for i in 0..m {
                    u[i * n + k] = col[i] / norm;
                }
                break;
            }
        }
    }
    (u, s, transpose(&vv, n, n))
}

/// The LU factorization with partial pivoting of the `m × n` matrix `a`, as LAPACK's
/// `getrf` computes it: `(LU, pivots, info)` with `L` (unit diagonal implied) below the
/// diagonal of `LU` and `U` on and above it, `pivots[j]` (1-based) the row swapped with
/// row `j` at step `j` (`min(m, n)` of them), and `info` the first exactly-zero pivot
/// (1-based), if any.
pub(crate) fn lu_rect(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<usize>, Option<usize>) {
    let k = m.min(n);
    let mut lu = a.to_vec();
    let mut pivots = Vec::with_capacity(k);
    let mut info = None;
    for j in 0..k {
        let mut p = j;
        for i in j + 1..m {
            if lu[i * n + j].abs() > lu[p * n + j].abs() {
                p = i;
            }
        }
        pivots.push(p + 1);
        if p != j {
            for c in 0..n {
                lu.swap(j * n + c, p * n + c);
            }
        }
        let pivot = lu[j * n + j];
        if pivot == 0.0 {
            info.get_or_insert(j + 1);
            continue;
        }
        for i in j + 1..m {
            let f = lu[i * n + j] / pivot;
            lu[i * n + j] = f;
            if f != 0.0 {
                for c in j + 1..n {
                    lu[i * n + c] -= f * lu[j * n + c];
                }
            }
        }
    }
    (lu, pivots, info)
}

/// The row permutation the 1-based LAPACK `pivots` (of an `m`-row matrix) describe:
/// `perm[i]` is the row of `A` that is row `i` of `Pᵀ·A`.
pub(crate) fn pivots_to_perm(pivots: &[usize], m: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..m).collect();
    for (j, &p) in pivots.iter().enumerate() {
        perm.swap(j, p - 1);
    }
    perm
}

/// `T⁻¹·B` for the `n × n` triangular `T` that `a` holds (its upper or lower triangle;
/// with `unit`, ones on the diagonal instead of `a`'s), `B` `n × k`, by substitution. A
/// zero on the diagonal gives infinities or NaNs, as LAPACK's `trsm`.
pub(crate) fn triangular_solve(
    a: &[f64],
    n: usize,
    b: &[f64],
    k: usize,
    upper: bool,
    unit: bool,
) -> Vec<f64> {
    let mut x = b.to_vec();
    let rows: Vec<usize> = if upper {
        (0..n).rev().collect()
    } else {
        (0..n).collect()
    };
    for &i in &rows {
        let others: Vec<usize> = if upper {
            (i + 1..n).collect()
        } else {
            (0..i).collect()
        };
        for c in 0..k {
            let mut s = x[i * k + c];
            for &j in &others {
                s -= a[i * n + j] * x[j * k + c];
            }
            x[i * k + c] = if unit { s } else { s / a[i * n + i] };
        }
    }
    x
}

/// The `m × (m - k)` row-major columns that complete the `m × k` row-major `q`
/// (orthonormal columns) to an orthogonal matrix: the standard basis vectors, in order,
/// orthogonalized (twice) against the columns so far, those that keep a norm above 10⁻³.
pub(crate) fn complete_columns(q: &[f64], m: usize, k: usize) -> Vec<f64> {
    let mut cols: Vec<Vec<f64>> = (0..k)
        .map(|c| (0..m).map(|r| q[r * k + c]).collect())
        .collect();
    for e in 0..m {
        if cols.len() >= m {
            break;
        }
        let mut v = vec![0.0; m];
        v[e] = 1.0;
        for _pass in 0..2 {
            for c in &cols {
                let d: f64 = c.iter().zip(&v).map(|(x, y)| x * y).sum();
                for (vi, ci) in v.iter_mut().zip(c) {
                    *vi -= d * ci;
                }
            }
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 1e-3 {
            cols.push(v.iter().map(|x| x / norm).collect());
        }
    }
    let extra = m - k;
    let mut out = vec![0.0; m * extra];
    for (c, col) in cols[k..].iter().enumerate() {
        for r in 0..m {
            out[r * extra + c] = col[r];
        }
    }
    out
}
