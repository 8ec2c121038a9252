//! LU factorizations and triangular solves: [`lu_factor`], [`lu_factor_ex`] and [`lu`]
//! factor on the host (LAPACK's `getrf` pivoting); [`solve_triangular`] substitutes on the
//! host; [`lu_solve`] is composed of row gathers and two [`solve_triangular`]s, so its
//! gradients are theirs. Each host result carries its backward rule.

use super::decomp::{check, constant, mt, read, tracking, with_rule, with_tail};
use super::host::{self, identity, lu_rect, pivots_to_perm, triangular_solve};
use crate::autograd::composite;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::shape::broadcast_shapes;
use crate::tensor::Tensor;

/// The host LU of every matrix of `a`: packed factors, 1-based pivots, first zero pivots.
struct HostLu {
    lu: Vec<f64>,
    pivots: Vec<usize>,
    infos: Vec<Option<usize>>,
    m: usize,
    n: usize,
}

fn lu_host(op: &'static str, a: &Tensor) -> Result<HostLu> {
    let mats = read(op, a, false)?;
    let (m, n) = (mats.m, mats.n);
    let mut out = HostLu {
        lu: Vec::with_capacity(mats.data.len()),
        pivots: Vec::with_capacity(mats.count * m.min(n)),
        infos: Vec::with_capacity(mats.count),
        m,
        n,
    };
    for b in 0..mats.count {
        let (lu, pivots, info) = lu_rect(mats.get(b), m, n);
        out.lu.extend(lu);
        out.pivots.extend(pivots);
        out.infos.push(info);
    }
    Ok(out)
}

/// The constants of the LU backward rule: `P` (`m × m`), `L` (`m × k`), `U` (`k × n`) and
/// the inverses of `L`'s and `U`'s leading `k × k` blocks.
struct Factors {
    p: Tensor,
    l: Tensor,
    u: Tensor,
    linv: Tensor,
    uinv: Tensor,
}

impl Factors {
    fn new(h: &HostLu, a: &Tensor) -> Result<Factors> {
        let (m, n) = (h.m, h.n);
        let k = m.min(n);
        let count =
            h.lu.len()
                .checked_div(m * n)
                .unwrap_or_else(|| a.shape()[..a.ndim() - 2].iter().product());
        let (mut p, mut l, mut u) = (
            vec![0.0; count * m * m],
            vec![0.0; count * m * k],
            vec![0.0; count * k * n],
        );
        let (mut linv, mut uinv) = (Vec::new(), Vec::new());
        for b in 0..count {
            let lu = &h.lu[b * m * n..(b + 1) * m * n];
            let perm = pivots_to_perm(&h.pivots[b * k..(b + 1) * k], m);
            for (i, &r) in perm.iter().enumerate() {
                p[b * m * m + r * m + i] = 1.0;
            }
            for i in 0..m {
                for j in 0..k {
                    l[b * m * k + i * k + j] = match i.cmp(&j) {
                        std::cmp::Ordering::Greater => lu[i * n + j],
                        std::cmp::Ordering::Equal => 1.0,
                        std::cmp::Ordering::Less => 0.0,
                    };
                }
            }
            for i in 0..k {
                for j in i..n {
                    u[b * k * n + i * n + j] = lu[i * n + j];
                }
            }
            // The leading k × k blocks of L and U, inverted.
            let lead: Vec<f64> = (0..k * k).map(|e| lu[(e / k) * n + e % k]).collect();
            linv.extend(triangular_solve(&lead, k, &identity(k), k, false, true));
            uinv.extend(triangular_solve(&lead, k, &identity(k), k, true, false));
        }
        Ok(Factors {
            p: constant(p, &with_tail(a, &[m, m]), a)?,
            l: constant(l, &with_tail(a, &[m, k]), a)?,
            u: constant(u, &with_tail(a, &[k, n]), a)?,
            linv: constant(linv, &with_tail(a, &[k, k]), a)?,
            uinv: constant(uinv, &with_tail(a, &[k, k]), a)?,
        })
    }

    /// `gA` from the gradients of `L` and `U` (PyTorch's LU rule, every shape). With
    /// `M = Pᵀ·A = L·U` square: `gM = L⁻ᵀ·(tril(Lᵀ·gL, -1) + triu(gU·Uᵀ))·U⁻ᵀ`; a wide `M`
    /// adds `U₂ = L⁻¹·M₂`'s terms, a tall one `L₂ = M₂·U⁻¹`'s.
    fn backward(&self, gl: &Tensor, gu: &Tensor) -> Result<Tensor> {
        let (m, k) = (
            self.l.shape()[self.l.ndim() - 2],
            self.l.shape()[self.l.ndim() - 1],
        );
        let n = self.u.shape()[self.u.ndim() - 1];
        let (k_, m_, n_) = (k as isize, m as isize, n as isize);
        let square = |gl: &Tensor, gu: &Tensor, l: &Tensor, u: &Tensor| -> Result<Tensor> {
            let inner = mt(l)?
                .try_matmul(gl)?
                .try_tril(-1)?
                .try_add(&gu.try_matmul(&mt(u)?)?.try_triu(0)?)?;
            mt(&self.linv)?
                .try_matmul(&inner)?
                .try_matmul(&mt(&self.uinv)?)
        };
        let gm = if m == n {
            square(gl, gu, &self.l, &self.u)?
        } else if m < n {
            let cols = |t: &Tensor, a: isize, b: isize| t.try_slice_dim(-1, a, b, 1);
            let (u1, u2) = (cols(&self.u, 0, k_)?, cols(&self.u, k_, n_)?);
            let (gu1, gu2) = (cols(gu, 0, k_)?, cols(gu, k_, n_)?);
            let gm2 = mt(&self.linv)?.try_matmul(&gu2)?;
            let gl_eff = gl.try_sub(&gm2.try_matmul(&mt(&u2)?)?)?;
            Tensor::try_cat(&[&square(&gl_eff, &gu1, &self.l, &u1)?, &gm2], -1)?
        } else {
            let rows = |t: &Tensor, a: isize, b: isize| t.try_slice_dim(-2, a, b, 1);
            let (l1, l2) = (rows(&self.l, 0, k_)?, rows(&self.l, k_, m_)?);
            let (gl1, gl2) = (rows(gl, 0, k_)?, rows(gl, k_, m_)?);
            let gm2 = gl2.try_matmul(&mt(&self.uinv)?)?;
            let gu_eff = gu.try_sub(&mt(&l2)?.try_matmul(&gm2)?)?;
            Tensor::try_cat(&[&square(&gl1, &gu_eff, &l1, &self.u)?, &gm2], -2)?
        };
        self.p.try_matmul(&gm)
    }
}

/// The packed factors as a tensor (with the backward rule when `a` requires grad) and the
/// pivots as int32.
fn packed(h: &HostLu, a: &Tensor) -> Result<(Tensor, Tensor)> {
    let k = h.m.min(h.n);
    let mut pshape = a.shape()[..a.ndim() - 2].to_vec();
    pshape.push(k);
    let pivots: Vec<i32> = h.pivots.iter().map(|&p| p as i32).collect();
    let pivots = Tensor::try_from_vec(pivots, pshape.as_slice())?.try_to(a.device())?;
    let lu = constant(h.lu.clone(), a.shape(), a)?;
    if !tracking(&[a]) {
        return Ok((lu, pivots));
    }
    let f = Factors::new(h, a)?;
    let k_ = k as isize;
    let lu = composite(
        &[a],
        move || Ok(lu),
        move |_, _, g| {
            let gl = g.try_tril(-1)?.try_slice_dim(-1, 0, k_, 1)?;
            let gu = g.try_triu(0)?.try_slice_dim(-2, 0, k_, 1)?;
            Ok(vec![Some(f.backward(&gl, &gu)?)])
        },
    )?;
    Ok((lu, pivots))
}

/// PyTorch's `torch.linalg.lu_factor(A)`: the LU factorization with partial pivoting of
/// each matrix of `A` (`[..., m, n]`, f32 or f64) in LAPACK's packed form, `(LU, pivots)`:
/// `LU` holds `L` below its diagonal (unit diagonal implied) and `U` on and above it,
/// `pivots` (`[..., min(m, n)]`, int32, 1-based) says row `i` was swapped with row
/// `pivots[i]` at step `i`. A matrix whose `U` has an exactly zero diagonal entry is
/// refused with [`KilnError::Linalg`], as PyTorch refuses it (use [`lu_factor_ex`] or
/// [`lu`] to factor it anyway). Gradient: that of [`lu`], through `LU`'s two triangles.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]);
/// let (lu, pivots) = kiln::linalg::lu_factor(&a)?;
/// assert_eq!(pivots.to_vec::<i32>()?, vec![2, 2]);
/// let v = lu.to_vec::<f64>()?;
/// assert_eq!(v[0..3], [3.0, 4.0, 1.0 / 3.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn lu_factor(a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.lu_factor";
    let h = lu_host(OP, a)?;
    if let Some((b, i)) = h
        .infos
        .iter()
        .enumerate()
        .find_map(|(b, info)| info.map(|i| (b, i)))
    {
        return Err(KilnError::Linalg {
            op: OP,
            shape: a.shape().to_vec(),
            batch: (a.ndim() > 2).then_some(b),
            reason: format!(
                "U[{i},{i}] is zero and using it on lu_solve would result in a division by zero. Use lu_factor_ex or lu to factor it anyway."
            ),
        });
    }
    packed(&h, a)
}

/// PyTorch's `torch.linalg.lu_factor_ex(A)`: [`lu_factor`] without the check, plus
/// `info` (`[...]`, int32): 0, or the 1-based index of the first zero on `U`'s diagonal.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 2.0, 4.0], [2, 2]);
/// let (_lu, _pivots, info) = kiln::linalg::lu_factor_ex(&a)?;
/// assert_eq!(info.to_vec::<i32>()?, vec![2]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn lu_factor_ex(a: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "linalg.lu_factor_ex";
    let h = lu_host(OP, a)?;
    let infos: Vec<i32> = h.infos.iter().map(|i| i.unwrap_or(0) as i32).collect();
    let info = Tensor::try_from_vec(infos, &a.shape()[..a.ndim() - 2])?.try_to(a.device())?;
    let (lu, pivots) = packed(&h, a)?;
    Ok((lu, pivots, info))
}

/// PyTorch's `torch.linalg.lu(A)`: `(P, L, U)` with `A = P·L·U` for each matrix of `A`
/// (`[..., m, n]`, f32 or f64): `P` `[..., m, m]` a permutation matrix (of `A`'s dtype),
/// `L` `[..., m, k]` unit lower triangular, `U` `[..., k, n]` upper triangular, `k =
/// min(m, n)`, by partial pivoting as LAPACK's `getrf` (so PyTorch's CPU pivots). Singular
/// matrices are factored without error. Gradient (PyTorch's rule, every shape): through
/// `L` and `U` (`P` has none); infinite or NaN where `U`'s leading `k × k` block is
/// singular.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]);
/// let (p, l, u) = kiln::linalg::lu(&a)?;
/// assert_eq!(p.to_vec::<f64>()?, vec![0.0, 1.0, 1.0, 0.0]);
/// assert_eq!(u.to_vec::<f64>()?[..2], [3.0, 4.0]);
/// let back = p.matmul(&l).matmul(&u).to_vec::<f64>()?;
/// assert!((back[1] - 2.0).abs() < 1e-15);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn lu(a: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "linalg.lu";
    let h = lu_host(OP, a)?;
    let f = Factors::new(&h, a)?;
    let outs = [f.p.clone(), f.l.clone(), f.u.clone()];
    let [p, l, u] = with_rule(
        &[a],
        outs,
        Box::new(move |_, g| Ok(vec![Some(f.backward(&g[1], &g[2])?)])),
    )?;
    Ok((p, l, u))
}

/// Checks `b` against the `n × n` matrices of `a` for a triangular solve (`B`'s rows on the
/// left, its columns on the right) and broadcasts the two batches.
fn broadcast_rhs(op: &'static str, a: &Tensor, b: &Tensor, left: bool) -> Result<(Tensor, Tensor)> {
    a.require_same_dtype_and_device(op, b)?;
    let (n, _) = check(op, a, true)?;
    let ok = b.ndim() >= 2 && b.shape()[b.ndim() - if left { 2 } else { 1 }] == n;
    if !ok {
        return Err(KilnError::ShapeMismatch {
            op,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
            detail: if left {
                ": B must be [..., n, k] with A's n rows (left=true)".into()
            } else {
                ": B must be [..., k, n] with A's n columns (left=false)".into()
            },
        });
    }
    let batch = broadcast_shapes(op, &a.shape()[..a.ndim() - 2], &b.shape()[..b.ndim() - 2])?;
    let mut a_shape = batch.clone();
    a_shape.extend([n, n]);
    let mut b_shape = batch;
    b_shape.extend_from_slice(&b.shape()[b.ndim() - 2..]);
    Ok((
        a.try_broadcast_to(a_shape.as_slice())?,
        b.try_broadcast_to(b_shape.as_slice())?,
    ))
}

/// PyTorch's `torch.linalg.solve_triangular(A, B, upper=, left=True, unitriangular=False)`:
/// `X` with `T·X = B` (`left`) or `X·T = B`, where `T` is the upper or lower triangle of
/// each `A` (`[..., n, n]`; the other triangle is not read; with `unitriangular`, ones
/// replace the diagonal too), `B` `[..., n, k]` (`[..., k, n]` on the right), batch
/// dimensions broadcast. By substitution in f64 on the host; a zero on the diagonal gives
/// infinities or NaNs, not an error (as PyTorch). Gradients: `gB = T⁻ᵀ·G` (`G·T⁻ᵀ`),
/// `gA = -gB·Xᵀ` (`-Xᵀ·gB`) restricted to the triangle read.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![2.0f64, 1.0, 0.0, 4.0], [2, 2]);
/// let b = Tensor::from_vec(vec![4.0f64, 8.0], [2, 1]);
/// let x = kiln::linalg::solve_triangular(&a, &b, true, true, false)?;
/// assert_eq!(x.to_vec::<f64>()?, vec![1.0, 2.0]);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn solve_triangular(
    a: &Tensor,
    b: &Tensor,
    upper: bool,
    left: bool,
    unitriangular: bool,
) -> Result<Tensor> {
    const OP: &str = "linalg.solve_triangular";
    let (ab, bb) = broadcast_rhs(OP, a, b, left)?;
    let am = read(OP, &ab, true)?;
    let bm = read(OP, &bb, false)?;
    let n = am.n;
    let (rows, cols) = (bm.m, bm.n);
    let track = tracking(&[&ab, &bb]);
    let mut xs = Vec::with_capacity(bm.data.len());
    let mut invs = Vec::new();
    for i in 0..am.count {
        let t = am.get(i);
        if left {
            xs.extend(triangular_solve(
                t,
                n,
                bm.get(i),
                cols,
                upper,
                unitriangular,
            ));
        } else {
            // X·T = B ⇔ Tᵀ·Xᵀ = Bᵀ.
            let tt = host::transpose(t, n, n);
            let xt = triangular_solve(
                &tt,
                n,
                &host::transpose(bm.get(i), rows, cols),
                rows,
                !upper,
                unitriangular,
            );
            xs.extend(host::transpose(&xt, n, rows));
        }
        if track {
            invs.extend(triangular_solve(
                t,
                n,
                &identity(n),
                n,
                upper,
                unitriangular,
            ));
        }
    }
    let x = constant(xs, bb.shape(), a)?;
    if !track {
        return Ok(x);
    }
    let inv = constant(invs, ab.shape(), a)?;
    let mask = move |g: Tensor| -> Result<Tensor> {
        let skip = i64::from(unitriangular);
        if upper {
            g.try_triu(skip)
        } else {
            g.try_tril(-skip)
        }
    };
    composite(
        &[&ab, &bb],
        move || Ok(x),
        move |_, x, g| {
            let inv_t = mt(&inv)?;
            let (gb, ga) = if left {
                let gb = inv_t.try_matmul(g)?;
                let ga = gb.try_matmul(&mt(x)?)?.try_neg()?;
                (gb, ga)
            } else {
                let gb = g.try_matmul(&inv_t)?;
                let ga = mt(x)?.try_matmul(&gb)?.try_neg()?;
                (gb, ga)
            };
            Ok(vec![Some(mask(ga)?), Some(gb)])
        },
    )
}

/// PyTorch's `torch.linalg.lu_solve(LU, pivots, B, left=True, adjoint=False)`: `X` with
/// `A·X = B` (`left`) or `X·A = B`, `A` (or `Aᵀ` with `adjoint`) given by [`lu_factor`]'s
/// `(LU, pivots)` (`[..., n, n]`, `[..., n]` int32), `B` `[..., n, k]` (`[..., k, n]` on
/// the right), batch dimensions broadcast. Composed of row gathers (the permutation) and
/// two [`solve_triangular`]s on `LU`'s triangles, so gradients flow to `LU` and `B` as
/// theirs do (none to `pivots`). Pivots out of `1..=n` are refused.
///
/// ```
/// use kiln::Tensor;
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]);
/// let (lu, pivots) = kiln::linalg::lu_factor(&a)?;
/// let b = Tensor::from_vec(vec![5.0f64, 11.0], [2, 1]);
/// let x = kiln::linalg::lu_solve(&lu, &pivots, &b, true, false)?.to_vec::<f64>()?;
/// assert!((x[0] - 1.0).abs() < 1e-12 && (x[1] - 2.0).abs() < 1e-12);
/// # Ok::<(), kiln::KilnError>(())
/// ```
pub fn lu_solve(
    lu: &Tensor,
    pivots: &Tensor,
    b: &Tensor,
    left: bool,
    adjoint: bool,
) -> Result<Tensor> {
    const OP: &str = "linalg.lu_solve";
    if !left {
        // X·A = B ⇔ Aᵀ·Xᵀ = Bᵀ (and X·Aᵀ = B ⇔ A·Xᵀ = Bᵀ).
        let (n, _) = check(OP, lu, true)?;
        if b.ndim() < 2 || b.shape()[b.ndim() - 1] != n {
            return Err(KilnError::ShapeMismatch {
                op: OP,
                lhs: lu.shape().to_vec(),
                rhs: b.shape().to_vec(),
                detail: ": B must be [..., k, n] with A's n columns (left=false)".into(),
            });
        }
        return mt(&lu_solve(lu, pivots, &mt(b)?, true, !adjoint)?);
    }
    let (lub, bb) = broadcast_rhs(OP, lu, b, true)?;
    let n = lu.shape()[lu.ndim() - 1];
    let mut want = lu.shape()[..lu.ndim() - 1].to_vec();
    if pivots.dtype() != DType::I32 {
        return Err(KilnError::UnsupportedDType {
            op: OP,
            dtype: pivots.dtype(),
            detail: ": pivots must be int32, as lu_factor returns them".into(),
        });
    }
    if pivots.shape() != want.as_slice() {
        return Err(KilnError::ShapeMismatch {
            op: OP,
            lhs: lu.shape().to_vec(),
            rhs: pivots.shape().to_vec(),
            detail: ": pivots must have LU's shape without its last dimension".into(),
        });
    }
    want = lub.shape()[..lub.ndim() - 1].to_vec();
    let piv: Vec<i64> = if pivots.numel() == 0 {
        Vec::new()
    } else {
        pivots.try_broadcast_to(want.as_slice())?.to_vec::<i64>()?
    };
    if let Some(&bad) = piv.iter().find(|&&p| p < 1 || p > n as i64) {
        return Err(KilnError::InvalidArgument {
            op: OP,
            shape: pivots.shape().to_vec(),
            reason: format!("pivot {bad} is out of range: pivots must be between 1 and {n}"),
        });
    }
    let k = bb.shape()[bb.ndim() - 1];
    let count = piv.len().checked_div(n).unwrap_or(0);
    // One row index per entry of B: row i of the result reads row index[i] of its input.
    let mut index = Vec::with_capacity(bb.numel());
    for c in 0..count {
        let p: Vec<usize> = piv[c * n..(c + 1) * n]
            .iter()
            .map(|&v| v as usize)
            .collect();
        let perm = pivots_to_perm(&p, n);
        let rows = if adjoint {
            let mut inverse = vec![0; n];
            for (i, &r) in perm.iter().enumerate() {
                inverse[r] = i;
            }
            inverse
        } else {
            perm
        };
        for r in rows {
            index.extend(std::iter::repeat_n(r as i64, k));
        }
    }
    let index = Tensor::try_from_vec(index, bb.shape())?.try_to(b.device())?;
    if adjoint {
        // Aᵀ·X = Uᵀ·Lᵀ·Pᵀ·X = B: X = P·L⁻ᵀ·U⁻ᵀ·B.
        let lut = mt(&lub)?;
        let z = solve_triangular(&lut, &bb, false, true, false)?;
        let w = solve_triangular(&lut, &z, true, true, true)?;
        w.try_gather(-2, &index)
    } else {
        // A·X = P·L·U·X = B: X = U⁻¹·L⁻¹·Pᵀ·B.
        let y = bb.try_gather(-2, &index)?;
        let z = solve_triangular(&lub, &y, false, true, true)?;
        solve_triangular(&lub, &z, true, true, false)
    }
}
