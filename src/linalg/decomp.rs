//! Decompositions and solvers computed on the host: the input is realized and read back
//! in f64, each matrix of the batch is factored by [`super::host`], and the result is a
//! constant tensor of the input's dtype on its device. Where the input requires grad, the
//! result carries one backward rule (the op's vector–Jacobian product, recorded from kiln
//! primitives, so it runs lazily on the input's device like any gradient).

use super::host::{self, Failure, Lu};
use crate::autograd::{composite, is_grad_enabled};
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::shape::broadcast_shapes;
use crate::tensor::Tensor;

/// A batch of `m × n` matrices read back in f64.
pub(super) struct Matrices {
    pub(super) data: Vec<f64>,
    pub(super) count: usize,
    pub(super) m: usize,
    pub(super) n: usize,
}

impl Matrices {
    pub(super) fn get(&self, b: usize) -> &[f64] {
        let size = self.m * self.n;
        &self.data[b * size..(b + 1) * size]
    }
}

/// Checks that `a` is a float32/float64 batch of matrices (square when asked), without
/// reading it; returns its matrices' `(m, n)`.
pub(super) fn check(op: &'static str, a: &Tensor, square: bool) -> Result<(usize, usize)> {
    if !matches!(a.dtype(), DType::F32 | DType::F64) {
        return Err(KilnError::UnsupportedDType {
            op,
            dtype: a.dtype(),
            detail: if a.dtype().is_half() {
                ": low precision dtypes are not supported (as in PyTorch); cast to f32".into()
            } else {
                ": expected a floating point tensor (f32 or f64)".into()
            },
        });
    }
    if a.ndim() < 2 {
        return Err(KilnError::InvalidArgument {
            op,
            shape: a.shape().to_vec(),
            reason: "the input must have at least 2 dimensions".into(),
        });
    }
    let (m, n) = (a.shape()[a.ndim() - 2], a.shape()[a.ndim() - 1]);
    if square && m != n {
        return Err(KilnError::InvalidArgument {
            op,
            shape: a.shape().to_vec(),
            reason: format!(
                "A must be batches of square matrices, but they are {m} by {n} matrices"
            ),
        });
    }
    Ok((m, n))
}

/// Checks `a` as [`check`] does and reads it.
pub(super) fn read(op: &'static str, a: &Tensor, square: bool) -> Result<Matrices> {
    let (m, n) = check(op, a, square)?;
    let count = a.shape()[..a.ndim() - 2].iter().product();
    let data = if a.numel() == 0 {
        Vec::new()
    } else {
        a.to_vec::<f64>()?
    };
    Ok(Matrices { data, count, m, n })
}

/// A constant of `shape` holding `data`, with `like`'s dtype and device.
pub(super) fn constant(data: Vec<f64>, shape: &[usize], like: &Tensor) -> Result<Tensor> {
    let t = match like.dtype() {
        DType::F64 => Tensor::try_from_vec(data, shape)?,
        _ => {
            let narrow: Vec<f32> = data.iter().map(|&v| v as f32).collect();
            Tensor::try_from_vec(narrow, shape)?.try_cast(like.dtype())?
        }
    };
    t.try_to(like.device())
}

/// Whether a result computed from `inputs` needs a backward rule.
pub(super) fn tracking(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// The typed error for batch element `b` of `a`.
pub(super) fn failure(op: &'static str, a: &Tensor, b: usize, f: Failure) -> KilnError {
    let reason = match f {
        Failure::Singular(p) => format!(
            "The diagonal element {p} is zero, the inversion could not be completed because the input matrix is singular."
        ),
        Failure::NotPositiveDefinite(k) => format!(
            "The factorization could not be completed because the input is not positive-definite (the leading minor of order {k} is not positive-definite)."
        ),
    };
    KilnError::Linalg {
        op,
        shape: a.shape().to_vec(),
        batch: (a.ndim() > 2).then_some(b),
        reason,
    }
}

/// The batched matrix transpose `Xᵀ` (PyTorch's `X.mT`).
pub(super) fn mt(x: &Tensor) -> Result<Tensor> {
    x.try_transpose(-2, -1)
}

/// The shape `a` has with its last two sizes replaced by `tail`.
pub(super) fn with_tail(a: &Tensor, tail: &[usize]) -> Vec<usize> {
    let mut s = a.shape()[..a.ndim() - 2].to_vec();
    s.extend_from_slice(tail);
    s
}

/// The vector–Jacobian product of several outputs: from the inputs and one gradient per
/// output (zeros where unused), the inputs' gradients.
pub(super) type MultiRule =
    dyn Fn(&[Tensor], &[Tensor]) -> Result<Vec<Option<Tensor>>> + Send + Sync;

/// Gives the constants `outputs` the backward `rule` when an input requires grad: they are
/// packed into one flat tensor (one composite node), and each output is a view of it.
pub(super) fn with_rule<const N: usize>(
    inputs: &[&Tensor],
    outputs: [Tensor; N],
    rule: Box<MultiRule>,
) -> Result<[Tensor; N]> {
    if !tracking(inputs) {
        return Ok(outputs);
    }
    let shapes: Vec<Vec<usize>> = outputs.iter().map(|t| t.shape().to_vec()).collect();
    let flat: Vec<Tensor> = outputs
        .iter()
        .map(|t| t.try_reshape([-1]))
        .collect::<Result<_>>()?;
    let packed = Tensor::try_cat(&flat.iter().collect::<Vec<_>>(), 0)?;
    let split = move |t: &Tensor| -> Result<Vec<Tensor>> {
        let mut start = 0;
        let mut parts = Vec::with_capacity(shapes.len());
        for s in &shapes {
            let len: usize = s.iter().product();
            parts.push(
                t.try_slice_dim(0, start as isize, (start + len) as isize, 1)?
                    .try_reshape(s.iter().map(|&d| d as isize).collect::<Vec<_>>())?,
            );
            start += len;
        }
        Ok(parts)
    };
    let split_rule = split.clone();
    let packed = composite(
        inputs,
        move || Ok(packed),
        move |ins, _, g| rule(ins, &split_rule(g)?),
    )?;
    split(&packed)?
        .try_into()
        .map_err(|_| KilnError::internal("linalg: packed outputs missing"))
}

/// `diag(v)` for the batch of vectors `v` (`[..., n]` → `[..., n, n]`).
pub(super) fn diag_embed(v: &Tensor) -> Result<Tensor> {
    let n = v.shape()[v.ndim() - 1];
    Tensor::try_eye(n, v.dtype())?
        .try_to(v.device())?
        .try_mul(&v.try_unsqueeze(-2)?)
}

/// PyTorch's `torch.linalg.inv(A)`: the inverse of each square matrix of `A` (`[..., n,
/// n]`), by LU with partial pivoting in f64. A matrix with an exactly zero pivot is
/// refused with [`KilnError::Linalg`] naming the batch element, as PyTorch refuses it.
/// Gradient: `-A⁻ᵀ·G·A⁻ᵀ`.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![2.0f64, 0.0, 0.0, 4.0], [2, 2]);
/// assert_eq!(kiln::linalg::inv(&a)?.to_vec::<f64>()?, vec![0.5, 0.0, 0.0, 0.25]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn inv(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.inv";
    let mats = read(OP, a, true)?;
    let mut out = Vec::with_capacity(mats.data.len());
    for b in 0..mats.count {
        let lu = Lu::new(mats.get(b), mats.n);
        out.extend(lu.inverse().map_err(|f| failure(OP, a, b, f))?);
    }
    let y = constant(out, a.shape(), a)?;
    if !tracking(&[a]) {
        return Ok(y);
    }
    composite(
        &[a],
        move || Ok(y),
        |_, y, g| {
            let yt = mt(y)?;
            Ok(vec![Some(yt.try_matmul(g)?.try_matmul(&yt)?.try_neg()?)])
        },
    )
}

/// PyTorch's `torch.linalg.det(A)`: the determinant of each square matrix (`[..., n, n]`
/// → `[...]`), the product of the LU pivots (0 for a singular matrix, no error). Gradient:
/// `g·cof(A)` with the cofactor matrix computed on the host, so it is right at singular
/// matrices too.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
/// assert!((kiln::linalg::det(&a)?.item::<f32>()? + 2.0).abs() < 1e-6);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn det(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.det";
    let mats = read(OP, a, true)?;
    let dets: Vec<f64> = (0..mats.count)
        .map(|b| Lu::new(mats.get(b), mats.n).det())
        .collect();
    let y = constant(dets, &a.shape()[..a.ndim() - 2], a)?;
    if !tracking(&[a]) {
        return Ok(y);
    }
    let cof: Vec<f64> = (0..mats.count)
        .flat_map(|b| host::cofactors(mats.get(b), mats.n))
        .collect();
    let cof = constant(cof, a.shape(), a)?;
    composite(
        &[a],
        move || Ok(y),
        move |_, _, g| {
            Ok(vec![Some(
                g.try_unsqueeze(-1)?.try_unsqueeze(-1)?.try_mul(&cof)?,
            )])
        },
    )
}

/// PyTorch's `torch.linalg.slogdet(A)`: `(sign, logabsdet)` of each square matrix, with
/// `det = sign·exp(logabsdet)`; a singular matrix gives `(0, -inf)`. Only `logabsdet` has
/// a gradient, `g·A⁻ᵀ` (NaN at a singular matrix).
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]);
/// let (sign, logabs) = kiln::linalg::slogdet(&a)?;
/// assert_eq!(sign.item::<f64>()?, -1.0);
/// assert!((logabs.item::<f64>()? - 2f64.ln()).abs() < 1e-12);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn slogdet(a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.slogdet";
    let mats = read(OP, a, true)?;
    let (signs, logs): (Vec<f64>, Vec<f64>) = (0..mats.count)
        .map(|b| Lu::new(mats.get(b), mats.n).slogdet())
        .unzip();
    let batch = &a.shape()[..a.ndim() - 2];
    let sign = constant(signs, batch, a)?;
    let y = constant(logs, batch, a)?;
    if !tracking(&[a]) {
        return Ok((sign, y));
    }
    let n = mats.n;
    let inv_t: Vec<f64> = (0..mats.count)
        .flat_map(|b| match Lu::new(mats.get(b), n).inverse() {
            Ok(inv) => host::transpose(&inv, n, n),
            Err(_) => vec![f64::NAN; n * n],
        })
        .collect();
    let inv_t = constant(inv_t, a.shape(), a)?;
    let logabs = composite(
        &[a],
        move || Ok(y),
        move |_, _, g| {
            Ok(vec![Some(
                g.try_unsqueeze(-1)?.try_unsqueeze(-1)?.try_mul(&inv_t)?,
            )])
        },
    )?;
    Ok((sign, logabs))
}

/// PyTorch's `torch.linalg.solve(A, B)`: `X` with `A·X = B`, for square `A` (`[..., n,
/// n]`) and `B` a batch of matrices (`[..., n, k]`) or of vectors (`B` 1-D, or `B.shape
/// == A.shape[:-1]`), batch dimensions broadcast; `X` has `B`'s form. LU with partial
/// pivoting in f64; a singular `A` is refused as in [`inv`]. Gradients:
/// `gB = A⁻ᵀ·G`, `gA = -gB·Xᵀ`.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![2.0f64, 1.0, 1.0, 3.0], [2, 2]);
/// let b = Tensor::from_vec(vec![3.0f64, 5.0], [2]);
/// let x = kiln::linalg::solve(&a, &b)?.to_vec::<f64>()?;
/// assert!((x[0] - 0.8).abs() < 1e-12 && (x[1] - 1.4).abs() < 1e-12);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn solve(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.solve";
    a.require_same_dtype_and_device(OP, b)?;
    // Validates A (dtype, rank, square) before B's shape is looked at.
    if a.ndim() < 2 || a.shape()[a.ndim() - 1] != a.shape()[a.ndim() - 2] {
        read(OP, &a.try_slice_dim(0, 0, 0, 1)?, true)?;
    }
    let n = a.shape()[a.ndim() - 1];
    let vector = b.ndim() == 1 || (b.ndim() + 1 == a.ndim() && b.shape() == &a.shape()[..b.ndim()]);
    let b2 = if vector {
        b.try_unsqueeze(-1)?
    } else {
        b.clone()
    };
    if b2.ndim() < 2 || b2.shape()[b2.ndim() - 2] != n {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
            detail: ": B must be a batch of vectors or of matrices with A's number of rows".into(),
        });
    }
    let k = b2.shape()[b2.ndim() - 1];
    let batch = broadcast_shapes(OP, &a.shape()[..a.ndim() - 2], &b2.shape()[..b2.ndim() - 2])?;
    let mut a_shape = batch.clone();
    a_shape.extend([n, n]);
    let mut b_shape = batch.clone();
    b_shape.extend([n, k]);
    let ab = a.try_broadcast_to(a_shape.as_slice())?;
    let bb = b2.try_broadcast_to(b_shape.as_slice())?;
    let am = read(OP, &ab, true)?;
    let bm = read(OP, &bb, false)?;
    let track = tracking(&[&ab, &bb]);
    let mut xs = Vec::with_capacity(bm.data.len());
    let mut invs = Vec::new();
    for i in 0..am.count {
        let lu = Lu::new(am.get(i), n);
        xs.extend(lu.solve(bm.get(i), k).map_err(|f| failure(OP, &ab, i, f))?);
        if track {
            invs.extend(lu.inverse().map_err(|f| failure(OP, &ab, i, f))?);
        }
    }
    let x = constant(xs, &b_shape, a)?;
    let x = if track {
        let inv = constant(invs, &a_shape, a)?;
        composite(
            &[&ab, &bb],
            move || Ok(x),
            move |_, x, g| {
                let gb = mt(&inv)?.try_matmul(g)?;
                let ga = gb.try_matmul(&mt(x)?)?.try_neg()?;
                Ok(vec![Some(ga), Some(gb)])
            },
        )?
    } else {
        x
    };
    if vector { x.try_squeeze_dim(-1) } else { Ok(x) }
}

/// PyTorch's `torch.linalg.cholesky(A)`: the lower-triangular `L` with `A = L·Lᵀ` for each
/// symmetric positive-definite matrix, reading only the lower triangle of `A`. A matrix
/// that is not positive-definite is refused with [`KilnError::Linalg`] naming the batch
/// element and the order of the failing leading minor, as PyTorch. Gradient (PyTorch's):
/// `L⁻ᵀ·Φ·L⁻¹` with `Φ = ½(T + tril(T, -1)ᵀ)`, `T = tril(Lᵀ·G)`, a symmetric matrix.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![4.0f64, 2.0, 2.0, 5.0], [2, 2]);
/// assert_eq!(kiln::linalg::cholesky(&a)?.to_vec::<f64>()?, vec![2.0, 0.0, 1.0, 2.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn cholesky(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.cholesky";
    let mats = read(OP, a, true)?;
    let n = mats.n;
    let mut ls = Vec::with_capacity(mats.data.len());
    for b in 0..mats.count {
        ls.extend(host::cholesky(mats.get(b), n).map_err(|f| failure(OP, a, b, f))?);
    }
    if !tracking(&[a]) {
        return constant(ls, a.shape(), a);
    }
    // At least 1: a 0 × 0 matrix has nothing to chunk, and `chunks(0)` would panic.
    let linv: Vec<f64> = ls
        .chunks((n * n).max(1))
        .flat_map(|l| host::lower_inverse(l, n))
        .collect();
    let linv = constant(linv, a.shape(), a)?;
    let l = constant(ls, a.shape(), a)?;
    composite(
        &[a],
        move || Ok(l),
        move |_, l, g| {
            let t = mt(l)?.try_matmul(g)?.try_tril(0)?;
            let phi = t.try_add(&mt(&t.try_tril(-1)?)?)?.try_mul(0.5)?;
            Ok(vec![Some(mt(&linv)?.try_matmul(&phi)?.try_matmul(&linv)?)])
        },
    )
}

/// PyTorch's `torch.linalg.eigh(A)` with `UPLO='L'`: the eigenvalues (ascending, `[...,
/// n]`) and orthonormal eigenvectors (the columns of `[..., n, n]`) of each symmetric
/// matrix whose lower triangle `A` holds, by cyclic Jacobi rotations in f64. Each
/// eigenvector's sign is chosen so that its entry of largest magnitude is positive
/// (LAPACK's sign is arbitrary; only sign-invariant functions of the vectors compare).
/// Gradient (PyTorch's): `V·(diag(gλ) + F∘skew(Vᵀ·gV)/2)·Vᵀ` with `F_ij = 1/(λ_j - λ_i)`
/// off the diagonal: undefined for repeated eigenvalues when the vectors are used (kiln
/// takes exactly-equal pairs' terms as 0, so a loss of the eigenvalues alone stays right).
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![2.0f64, 1.0, 1.0, 2.0], [2, 2]);
/// let (values, _vectors) = kiln::linalg::eigh(&a)?;
/// let v = values.to_vec::<f64>()?;
/// assert!((v[0] - 1.0).abs() < 1e-12 && (v[1] - 3.0).abs() < 1e-12);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn eigh(a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.eigh";
    let (values, vectors, n) = eigh_host(OP, a)?;
    let track = tracking(&[a]);
    let f = track.then(|| inverse_gaps(&values, n, false));
    let l = constant(values, &a.shape()[..a.ndim() - 1], a)?;
    let v = constant(vectors, a.shape(), a)?;
    let Some(f) = f else {
        return Ok((l, v));
    };
    let f = constant(f, a.shape(), a)?;
    let vc = v.clone();
    let [l, v] = with_rule(
        &[a],
        [l, v],
        Box::new(move |_, g| {
            let k = mt(&vc)?.try_matmul(&g[1])?;
            let skew = k.try_sub(&mt(&k)?)?.try_mul(0.5)?;
            let inner = f.try_mul(&skew)?.try_add(&diag_embed(&g[0])?)?;
            Ok(vec![Some(vc.try_matmul(&inner)?.try_matmul(&mt(&vc)?)?)])
        }),
    )?;
    Ok((l, v))
}

/// The eigenvalues and eigenvectors of every matrix of `a`, flattened over the batch, and `n`.
fn eigh_host(op: &'static str, a: &Tensor) -> Result<(Vec<f64>, Vec<f64>, usize)> {
    let mats = read(op, a, true)?;
    let n = mats.n;
    let mut values = Vec::with_capacity(mats.count * n);
    let mut vectors = Vec::with_capacity(mats.data.len());
    for b in 0..mats.count {
        let (l, v) = host::eigh(mats.get(b), n);
        values.extend(l);
        vectors.extend(v);
    }
    Ok((values, vectors, n))
}

/// For each batch of `n` values `λ` (squared when `squared`), the `n × n` matrix with
/// `1/(λ_j - λ_i)` off the diagonal and 0 on it. Where two values are exactly equal the
/// entry is 0 too (the term is infinite in theory): the packed gradient cannot tell an
/// unused output from a zero gradient, and `inf·0` would turn a loss of the values alone
/// into NaN.
fn inverse_gaps(values: &[f64], n: usize, squared: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(values.len() * n);
    if n == 0 {
        return out;
    }
    for l in values.chunks(n) {
        let sq = |x: f64| if squared { x * x } else { x };
        for i in 0..n {
            for j in 0..n {
                let gap = sq(l[j]) - sq(l[i]);
                out.push(if i == j || gap == 0.0 { 0.0 } else { 1.0 / gap });
            }
        }
    }
    out
}

/// PyTorch's `torch.linalg.eigvalsh(A)` (`UPLO='L'`): the eigenvalues of [`eigh`] alone,
/// with the gradient `V·diag(gλ)·Vᵀ` (defined for repeated eigenvalues too).
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![2.0f64, 0.0, 0.0, -1.0], [2, 2]);
/// assert_eq!(kiln::linalg::eigvalsh(&a)?.to_vec::<f64>()?, vec![-1.0, 2.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn eigvalsh(a: &Tensor) -> Result<Tensor> {
    const OP: &str = "linalg.eigvalsh";
    let (values, vectors, _) = eigh_host(OP, a)?;
    let l = constant(values, &a.shape()[..a.ndim() - 1], a)?;
    if !tracking(&[a]) {
        return Ok(l);
    }
    let v = constant(vectors, a.shape(), a)?;
    composite(
        &[a],
        move || Ok(l),
        move |_, _, g| {
            Ok(vec![Some(
                v.try_mul(&g.try_unsqueeze(-2)?)?.try_matmul(&mt(&v)?)?,
            )])
        },
    )
}

/// PyTorch's `torch.linalg.qr(A)` in its default `mode='reduced'`: `Q` (`[..., m, k]`,
/// orthonormal columns) and upper-triangular `R` (`[..., k, n]`), `k = min(m, n)`, by
/// Householder reflections built as LAPACK's `geqrf`/`orgqr` build them, so the signs
/// (of `R`'s diagonal and `Q`'s columns) are the ones PyTorch's CPU results have: `R_ii`
/// is negative where the column's leading entry was positive. Gradient (PyTorch's, for
/// every `m`, `n`): with `M = R·gRᵀ - gQᵀ·Q`, `gA = (gQ + Q·copyltu(M))·R⁻ᵀ` for `m ≥ n`;
/// infinite where `R` has a zero on its diagonal.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![3.0f64, 1.0, 4.0, 2.0], [2, 2]);
/// let (q, r) = kiln::linalg::qr(&a)?;
/// let back = q.matmul(&r).to_vec::<f64>()?;
/// assert!((back[2] - 4.0).abs() < 1e-12);
/// assert_eq!(r.to_vec::<f64>()?[2], 0.0);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn qr(a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.qr";
    let mats = read(OP, a, false)?;
    let (m, n) = (mats.m, mats.n);
    let k = m.min(n);
    let mut qs = Vec::with_capacity(mats.count * m * k);
    let mut rs = Vec::with_capacity(mats.count * k * n);
    for b in 0..mats.count {
        let (q, r) = host::qr(mats.get(b), m, n);
        qs.extend(q);
        rs.extend(r);
    }
    let track = tracking(&[a]);
    // R's leading k × k block, inverted (for the gradient).
    let rinv: Option<Vec<f64>> = track.then(|| {
        // At least 1: for k = 0 there is nothing to chunk, and `chunks(0)` would panic.
        rs.chunks((k * n).max(1))
            .take(mats.count)
            .flat_map(|r| {
                let mut lower = vec![0.0; k * k];
                for i in 0..k {
                    for j in i..k {
                        lower[j * k + i] = r[i * n + j];
                    }
                }
                host::transpose(&host::lower_inverse(&lower, k), k, k)
            })
            .collect()
    });
    let q = constant(qs, &with_tail(a, &[m, k]), a)?;
    let r = constant(rs, &with_tail(a, &[k, n]), a)?;
    let Some(rinv) = rinv else {
        return Ok((q, r));
    };
    let rinv = constant(rinv, &with_tail(a, &[k, k]), a)?;
    let (qc, rc) = (q.clone(), r.clone());
    let [q, r] = with_rule(
        &[a],
        [q, r],
        Box::new(move |ins, g| {
            let (gq, gr) = (&g[0], &g[1]);
            if m >= n {
                return Ok(vec![Some(qr_square_backward(&qc, &rc, &rinv, gq, gr)?)]);
            }
            // A = [X | Y] with X m × m: X = Q·U, Y = Q·V for R = [U | V].
            let u = rc.try_slice_dim(-1, 0, m as isize, 1)?;
            let gu = gr.try_slice_dim(-1, 0, m as isize, 1)?;
            let gv = gr.try_slice_dim(-1, m as isize, n as isize, 1)?;
            let y = ins[0].try_slice_dim(-1, m as isize, n as isize, 1)?;
            let gq2 = gq.try_add(&y.try_matmul(&mt(&gv)?)?)?;
            let gx = qr_square_backward(&qc, &u, &rinv, &gq2, &gu)?;
            let gy = qc.try_matmul(&gv)?;
            Ok(vec![Some(Tensor::try_cat(&[&gx, &gy], -1)?)])
        }),
    )?;
    Ok((q, r))
}

/// The QR gradient for `m ≥ n` (`R` square `n × n` with inverse `rinv`).
fn qr_square_backward(
    q: &Tensor,
    r: &Tensor,
    rinv: &Tensor,
    gq: &Tensor,
    gr: &Tensor,
) -> Result<Tensor> {
    let m = r.try_matmul(&mt(gr)?)?.try_sub(&mt(gq)?.try_matmul(q)?)?;
    // copyltu(M): the symmetric matrix with M's lower triangle.
    let sym = m.try_tril(0)?.try_add(&mt(&m.try_tril(-1)?)?)?;
    gq.try_add(&q.try_matmul(&sym)?)?.try_matmul(&mt(rinv)?)
}

/// The SVD of every matrix of a batch, flattened over it: `U`, `S`, `Vᵀ`, then `m`, `n`.
pub(super) type HostSvd = (Vec<f64>, Vec<f64>, Vec<f64>, usize, usize);

/// The host SVD of every matrix of `a`.
pub(super) fn svd_host(op: &'static str, a: &Tensor) -> Result<HostSvd> {
    let mats = read(op, a, false)?;
    let (m, n) = (mats.m, mats.n);
    let k = m.min(n);
    let (mut us, mut ss, mut vs) = (
        Vec::with_capacity(mats.count * m * k),
        Vec::with_capacity(mats.count * k),
        Vec::with_capacity(mats.count * k * n),
    );
    for b in 0..mats.count {
        let (u, s, vt) = host::svd(mats.get(b), m, n);
        us.extend(u);
        ss.extend(s);
        vs.extend(vt);
    }
    Ok((us, ss, vs, m, n))
}

/// PyTorch's `torch.linalg.svd(A, full_matrices=False)`: `(U, S, Vh)` with `A = U·diag(S)·Vh`,
/// `U` `[..., m, k]`, `S` `[..., k]` descending, `Vh` `[..., k, n]`, `k = min(m, n)`, by
/// one-sided Jacobi rotations in f64. Each column of `V` has its entry of largest
/// magnitude positive (the sign carried into `U`); where singular values are zero, `U`'s
/// columns are completed to an orthonormal set. `full_matrices=True` is [`super::svd_full`].
/// Gradient (PyTorch's formula): undefined where singular values repeat or (for `U`/`Vh`
/// of a non-square matrix) are zero, when `U` or `Vh` are used; kiln takes those terms as
/// 0 where the values are exactly equal or zero, so a loss of `S` alone has the right
/// gradient (PyTorch's would be infinite or NaN there only when `U`/`Vh` are used).
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![3.0f64, 0.0, 0.0, -4.0], [2, 2]);
/// let (_u, s, _vh) = kiln::linalg::svd(&a)?;
/// assert_eq!(s.to_vec::<f64>()?, vec![4.0, 3.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn svd(a: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "linalg.svd";
    let (us, ss, vs, m, n) = svd_host(OP, a)?;
    let k = m.min(n);
    let track = tracking(&[a]);
    let extra = track.then(|| {
        let f = inverse_gaps(&ss, k, true);
        // 0 for a zero singular value (see `inverse_gaps`).
        let sinv: Vec<f64> = ss
            .iter()
            .map(|&s| if s == 0.0 { 0.0 } else { 1.0 / s })
            .collect();
        (f, sinv)
    });
    let u = constant(us, &with_tail(a, &[m, k]), a)?;
    let mut s_shape = a.shape()[..a.ndim() - 2].to_vec();
    s_shape.push(k);
    let s = constant(ss, &s_shape, a)?;
    let vh = constant(vs, &with_tail(a, &[k, n]), a)?;
    let Some((f, sinv)) = extra else {
        return Ok((u, s, vh));
    };
    let f = constant(f, &with_tail(a, &[k, k]), a)?;
    let sinv = constant(sinv, s.shape(), a)?;
    let (uc, sc, vc) = (u.clone(), s.clone(), mt(&vh)?);
    let [u, s, vh] = with_rule(
        &[a],
        [u, s, vh],
        Box::new(move |_, g| {
            let (gu, gs, gv) = (&g[0], &g[1], mt(&g[2])?);
            let ut = mt(&uc)?;
            let vt = mt(&vc)?;
            let uu = ut.try_matmul(gu)?;
            let vv = vt.try_matmul(&gv)?;
            let ju = f.try_mul(&uu.try_sub(&mt(&uu)?)?)?;
            let jv = f.try_mul(&vv.try_sub(&mt(&vv)?)?)?;
            // (J_U)·S + S·(J_V) + diag(gS).
            let inner = ju
                .try_mul(&sc.try_unsqueeze(-2)?)?
                .try_add(&jv.try_mul(&sc.try_unsqueeze(-1)?)?)?
                .try_add(&diag_embed(gs)?)?;
            let mut ga = uc.try_matmul(&inner)?.try_matmul(&vt)?;
            if m > k {
                // (I - U·Uᵀ)·gU·S⁻¹·Vᵀ.
                let p = gu.try_sub(&uc.try_matmul(&uu)?)?;
                ga = ga.try_add(&p.try_mul(&sinv.try_unsqueeze(-2)?)?.try_matmul(&vt)?)?;
            }
            if n > k {
                // U·S⁻¹·gVᵀ·(I - V·Vᵀ).
                let p = mt(&gv)?.try_sub(&mt(&vv)?.try_matmul(&vt)?)?;
                ga = ga.try_add(&uc.try_mul(&sinv.try_unsqueeze(-2)?)?.try_matmul(&p)?)?;
            }
            Ok(vec![Some(ga)])
        }),
    )?;
    Ok((u, s, vh))
}

/// PyTorch's `torch.linalg.svdvals(A)`: the singular values of [`svd`] alone (`[..., k]`,
/// descending), with the gradient `U·diag(gS)·Vh`, defined everywhere.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![0.0f32, 2.0, 0.0, 0.0, 0.0, 1.0], [2, 3]);
/// assert_eq!(kiln::linalg::svdvals(&a)?.to_vec::<f32>()?, vec![2.0, 1.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn svdvals(a: &Tensor) -> Result<Tensor> {
    svdvals_named("linalg.svdvals", a)
}

/// [`svdvals`] with errors naming `op`.
pub(crate) fn svdvals_named(op: &'static str, a: &Tensor) -> Result<Tensor> {
    let (us, ss, vs, m, n) = svd_host(op, a)?;
    let k = m.min(n);
    let mut s_shape = a.shape()[..a.ndim() - 2].to_vec();
    s_shape.push(k);
    let s = constant(ss, &s_shape, a)?;
    if !tracking(&[a]) {
        return Ok(s);
    }
    let u = constant(us, &with_tail(a, &[m, k]), a)?;
    let vh = constant(vs, &with_tail(a, &[k, n]), a)?;
    composite(
        &[a],
        move || Ok(s),
        move |_, _, g| {
            Ok(vec![Some(
                u.try_mul(&g.try_unsqueeze(-2)?)?.try_matmul(&vh)?,
            )])
        },
    )
}
