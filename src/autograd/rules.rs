//! One derivative rule per primitive op: given the op's inputs, its output and the gradient
//! of the output, the gradients of the inputs (vector-Jacobian products), written as kiln
//! ops so the backward pass fuses like the forward one. Every match is exhaustive: an op
//! added to the op table without a rule does not compile.
//!
//! Inputs of elementwise ops already have the output's shape (the tensor API records
//! broadcasts as `expand` movements, whose rule sums the gradient back).

use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::graph::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::ops::{ScanOp, ScatterReduce};
use crate::shape::{Movement, SliceRange};
use crate::tensor::Tensor;

/// Gradients of `op`'s inputs (`None` where none flows or `needs` says it is not wanted).
pub(super) fn vjp(
    op: &Op,
    inputs: &[Tensor],
    out: &Tensor,
    g: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let need = |i: usize| needs.get(i).copied().unwrap_or(false);
    let x = |i: usize| -> Result<&Tensor> {
        inputs
            .get(i)
            .ok_or_else(|| KilnError::internal("autograd: missing input"))
    };
    Ok(match op {
        Op::Unary(u) => vec![Some(unary(*u, x(0)?, out, g)?)],
        Op::Binary(b) => {
            let (a, bb) = binary(*b, x(0)?, x(1)?, out, g, need(0), need(1))?;
            vec![a, bb]
        }
        Op::Where => {
            let c = x(0)?;
            let zero = Tensor::try_full_on((), 0, g.dtype(), g.device())?;
            vec![
                None,
                need(1)
                    .then(|| Tensor::try_where(c, g, &zero))
                    .transpose()?,
                need(2)
                    .then(|| Tensor::try_where(c, &zero, g))
                    .transpose()?,
            ]
        }
        Op::Cast => vec![Some(g.try_cast(x(0)?.dtype())?)],
        Op::Reduce { op, axes } => vec![reduce(*op, axes, x(0)?, out, g)?],
        Op::Matmul => {
            let (a, b) = (x(0)?, x(1)?);
            vec![
                need(0)
                    .then(|| g.try_matmul(&b.try_transpose(-2, -1)?))
                    .transpose()?,
                need(1)
                    .then(|| {
                        if swaps_last_two(b) {
                            // `b` is `w.t()`: compute `w`'s gradient in `w`'s own layout,
                            // `(gᵀ·a)ᵀ`, so the permute's rule hands it on contiguous instead
                            // of as a transposed view that every later reader (clipping, the
                            // optimizer, attention's head merge) walks by columns.
                            g.try_transpose(-2, -1)?
                                .try_matmul(a)?
                                .try_transpose(-2, -1)
                        } else {
                            a.try_transpose(-2, -1)?.try_matmul(g)
                        }
                    })
                    .transpose()?,
            ]
        }
        Op::Movement(m) => vec![Some(movement(m, x(0)?, g)?)],
        Op::Contiguous => vec![Some(g.clone())],
        Op::ToDevice(_) => vec![Some(g.try_to(x(0)?.device())?)],
        // The gradient of an indexed load sums back into the table's places.
        Op::Gather { axis } => vec![Some(x(0)?.scattered(*axis, x(1)?, g)?), None],
        Op::Scatter { axis, reduce } => {
            let init = inputs.get(2);
            let (gv, gi) = scatter(*reduce, *axis, x(0)?, x(1)?, init, out, g)?;
            let mut v = vec![None, need(1).then_some(gv)];
            if init.is_some() {
                v.push(need(2).then_some(gi));
            }
            v
        }
        Op::Scan { op, axis } => vec![Some(scan(*op, *axis, x(0)?, out, g)?)],
        Op::Buffer | Op::Generate(_) | Op::Assign | Op::ArgSort { .. } => {
            vec![None; inputs.len()]
        }
    })
}

/// Gradients of a scatter's values and initial value (PyTorch's rules). `sum`: the
/// gradient at each value's place. `amax`/`amin`: shared evenly by every contributor equal
/// to the result. `prod`: the product of the place's other contributors, exact with
/// zeros (from the count of zeros and the product of the nonzero ones). Without `init`
/// the second gradient is unused.
fn scatter(
    reduce: ScatterReduce,
    axis: usize,
    idx: &Tensor,
    v: &Tensor,
    init: Option<&Tensor>,
    out: &Tensor,
    g: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let ax = axis as isize;
    let at = |t: &Tensor| t.try_gather(ax, idx);
    // `t` reduced by `r` into the output's places, from `start` or from the identity.
    let reduce_in = |r: ScatterReduce, t: &Tensor, start: Option<&Tensor>| -> Result<Tensor> {
        match start {
            Some(s) => s.scatter_reduced(axis, r, idx, t, true),
            None => out.scatter_reduced(axis, r, idx, t, false),
        }
    };
    let zero = Tensor::try_full_on((), 0, g.dtype(), g.device())?;
    Ok(match reduce {
        ScatterReduce::Sum => (at(g)?, g.clone()),
        ScatterReduce::Amax | ScatterReduce::Amin => {
            let hit_v = v.try_eq(&at(out)?)?;
            let hit_i = init.map(|i| i.try_eq(out)).transpose()?;
            let ones = hit_v.try_cast(g.dtype())?;
            let start = hit_i.as_ref().map(|h| h.try_cast(g.dtype())).transpose()?;
            let count = reduce_in(ScatterReduce::Sum, &ones, start.as_ref())?;
            let share = g.try_div(&count)?;
            let gv = Tensor::try_where(&hit_v, &at(&share)?, &zero)?;
            let gi = match hit_i {
                Some(h) => Tensor::try_where(&h, &share, &zero)?,
                None => zero.clone(),
            };
            (gv, gi)
        }
        ScatterReduce::Prod => {
            let z_v = v.try_eq(0)?;
            let one = Tensor::try_full_on((), 1, v.dtype(), v.device())?;
            let nz_v = Tensor::try_where(&z_v, &one, v)?;
            let z_i = init.map(|i| i.try_eq(0)).transpose()?;
            let nz_i = match (init, &z_i) {
                (Some(i), Some(z)) => Some(Tensor::try_where(z, &one, i)?),
                _ => None,
            };
            // Zeros per place and the product of the nonzero contributors.
            let zeros = reduce_in(
                ScatterReduce::Sum,
                &z_v.try_cast(g.dtype())?,
                z_i.as_ref()
                    .map(|z| z.try_cast(g.dtype()))
                    .transpose()?
                    .as_ref(),
            )?;
            let prod_nz = reduce_in(ScatterReduce::Prod, &nz_v, nz_i.as_ref())?;
            let gp = g.try_mul(&prod_nz)?;
            // A zero contributor gets the others' product when it is the only zero; a
            // nonzero one gets the product over itself when there is no zero.
            let rule = |z: &Tensor, nz: &Tensor, zc: &Tensor, gp: &Tensor| -> Result<Tensor> {
                let if_zero = Tensor::try_where(&zc.try_eq(1)?, gp, &zero)?;
                let if_not = Tensor::try_where(&zc.try_eq(0)?, &gp.try_div(nz)?, &zero)?;
                Tensor::try_where(z, &if_zero, &if_not)
            };
            let gv = rule(&z_v, &nz_v, &at(&zeros)?, &at(&gp)?)?;
            let gi = match (&z_i, &nz_i) {
                (Some(z), Some(nz)) => rule(z, nz, &zeros, &gp)?,
                _ => zero.clone(),
            };
            (gv, gi)
        }
    })
}

/// Whether `t` was recorded as a permute that swaps its last two axes and keeps the rest
/// (a linear layer's `w.t()`, attention's `kᵀ`).
fn swaps_last_two(t: &Tensor) -> bool {
    let nd = t.ndim();
    nd >= 2
        && crate::graph::with_graph(|g| {
            g.node(t.node_key()).is_ok_and(|n| match &n.op {
                Op::Movement(Movement::Permute(p)) => p.iter().enumerate().all(|(i, &d)| {
                    d == if i + 2 == nd {
                        nd - 1
                    } else if i + 1 == nd {
                        nd - 2
                    } else {
                        i
                    }
                }),
                _ => false,
            })
        })
}

/// `Σ_{j ≥ i} t_j` along `axis`: a reversed running sum.
fn suffix_sum(t: &Tensor, axis: usize) -> Result<Tensor> {
    let a = [axis as isize];
    t.try_flip(a)?.scan_axis(ScanOp::Sum, axis)?.try_flip(a)
}

/// Scan gradients. cumsum: `gx_i = Σ_{j ≥ i} g_j`. cumprod: `gx_i = Σ_{j ≥ i} g_j ·
/// Π_{k ≤ j, k ≠ i} x_k`, exact with zeros: before a lane's first zero `z` it is
/// `suffix_sum(g·y)_i / x_i` (every later product holds x_z = 0); at `z` it is
/// `suffix_sum(g·cumprod(x with x_z = 1))_z`; after `z` every product holds x_z, so 0.
fn scan(op: ScanOp, axis: usize, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    match op {
        ScanOp::Sum => suffix_sum(g, axis),
        ScanOp::Prod => {
            let is_zero = x.try_eq(0)?;
            let zeros_so_far = is_zero.try_cast(DType::I64)?.scan_axis(ScanOp::Sum, axis)?;
            let before = zeros_so_far.try_eq(0)?;
            let first_zero = Tensor::try_where(&is_zero, &zeros_so_far.try_eq(1)?, &is_zero)?;
            let safe_x = Tensor::try_where(&before, x, 1)?;
            let head = suffix_sum(&g.try_mul(y)?, axis)?.try_div(&safe_x)?;
            let x_skip = Tensor::try_where(&first_zero, 1, x)?;
            let at_zero = suffix_sum(&g.try_mul(&x_skip.scan_axis(ScanOp::Prod, axis)?)?, axis)?;
            Tensor::try_where(
                &before,
                &head,
                &Tensor::try_where(&first_zero, &at_zero, 0)?,
            )
        }
    }
}

fn unary(u: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    match u {
        UnaryOp::Neg => g.try_neg(),
        // abs'(0) = 0, as PyTorch.
        UnaryOp::Abs => g.try_mul(&sign(x)?),
        // relu'(0) = 0, as PyTorch.
        UnaryOp::Relu => Tensor::try_where(&x.try_gt(0)?, g, 0),
        UnaryOp::Exp => g.try_mul(y),
        UnaryOp::Log => g.try_div(x),
        UnaryOp::Log2 => g.try_div(&x.try_mul(std::f64::consts::LN_2)?),
        UnaryOp::Sqrt => g.try_div(&y.try_mul(2.0)?),
        UnaryOp::Recip => g.try_mul(&y.try_mul(y)?)?.try_neg(),
        UnaryOp::Sin => g.try_mul(&x.try_cos()?),
        UnaryOp::Cos => g.try_mul(&x.try_sin()?)?.try_neg(),
        UnaryOp::Tanh => g.try_mul(&y.try_mul(y)?.try_rsub(1.0)?),
        UnaryOp::Sigmoid => g.try_mul(&y.try_mul(&y.try_rsub(1.0)?)?),
        UnaryOp::Gelu => {
            // d/dx x·Φ(x) = Φ(x) + x·φ(x), with Φ(x) = gelu(x) / x read off the output
            // (an erf per element costs more than the rest of the rule together); Φ is
            // 1/2 to working precision where |x| is too small for the division.
            let cdf = Tensor::try_where(&x.try_abs()?.try_lt(1e-20)?, 0.5, &y.try_div(x)?)?;
            let pdf = x.try_mul(x)?.try_mul(-0.5)?.try_exp()?.try_mul(
                0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2,
            )?;
            g.try_mul(&cdf.try_add(&x.try_mul(&pdf)?)?)
        }
        // erf'(x) = 2/√π · e^(-x²)
        UnaryOp::Erf => g.try_mul(
            &x.try_mul(x)?
                .try_neg()?
                .try_exp()?
                .try_mul(std::f64::consts::FRAC_2_SQRT_PI)?,
        ),
        // Piecewise constant: a zero gradient everywhere, as PyTorch.
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc | UnaryOp::Sign => {
            zeros_like(g)
        }
        UnaryOp::Log1p => g.try_div(&x.try_add(1.0)?),
        UnaryOp::Expm1 => g.try_mul(&y.try_add(1.0)?),
        UnaryOp::Exp2 => g.try_mul(&y.try_mul(std::f64::consts::LN_2)?),
        // d/dx x^(-1/2) = -1/2 · y³ (PyTorch's rule).
        UnaryOp::Rsqrt => g.try_mul(&y.try_mul(y)?.try_mul(y)?.try_mul(-0.5)?),
        UnaryOp::Square => g.try_mul(&x.try_mul(2.0)?),
        // sigmoid(x) below the threshold, 1 above it (where softplus is x itself).
        UnaryOp::Softplus => g.try_mul(&Tensor::try_where(
            &x.try_gt(20.0)?,
            1.0,
            &x.try_sigmoid()?,
        )?),
        // d/dx x·σ(x) = σ(x)·(1 + x·(1 - σ(x))).
        UnaryOp::Silu => {
            let s = x.try_sigmoid()?;
            g.try_mul(&s.try_mul(&x.try_mul(&s.try_rsub(1.0)?)?.try_add(1.0)?)?)
        }
        // 1 + tan², read off the output (PyTorch's rule).
        UnaryOp::Tan => g.try_mul(&y.try_mul(y)?.try_add(1.0)?),
        // ±1 / sqrt(1 - x²).
        UnaryOp::Asin => g.try_mul(&x.try_mul(x)?.try_rsub(1.0)?.try_rsqrt()?),
        UnaryOp::Acos => g
            .try_mul(&x.try_mul(x)?.try_rsub(1.0)?.try_rsqrt()?)?
            .try_neg(),
        UnaryOp::Atan => g.try_div(&x.try_mul(x)?.try_add(1.0)?),
        UnaryOp::Sinh => g.try_mul(&x.try_cosh()?),
        UnaryOp::Cosh => g.try_mul(&x.try_sinh()?),
        UnaryOp::Asinh => g.try_mul(&x.try_mul(x)?.try_add(1.0)?.try_rsqrt()?),
        UnaryOp::Acosh => g.try_mul(&x.try_mul(x)?.try_sub(1.0)?.try_rsqrt()?),
        UnaryOp::Atanh => g.try_div(&x.try_mul(x)?.try_rsub(1.0)?),
    }
}

/// Zeros shaped like `g` (the gradient of a piecewise-constant op).
fn zeros_like(g: &Tensor) -> Result<Tensor> {
    Tensor::try_full_on(g.shape(), 0, g.dtype(), g.device())
}

/// `sign(x)` as x's dtype: -1, 0 or 1.
fn sign(x: &Tensor) -> Result<Tensor> {
    x.try_gt(0)?
        .try_cast(x.dtype())?
        .try_sub(&x.try_lt(0)?.try_cast(x.dtype())?)
}

#[allow(clippy::too_many_arguments)]
fn binary(
    b: BinaryOp,
    x: &Tensor,
    y: &Tensor,
    out: &Tensor,
    g: &Tensor,
    need_x: bool,
    need_y: bool,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let both = |a: Result<Tensor>, b: Result<Tensor>| -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((
            if need_x { Some(a?) } else { None },
            if need_y { Some(b?) } else { None },
        ))
    };
    match b {
        BinaryOp::Add => Ok((need_x.then(|| g.clone()), need_y.then(|| g.clone()))),
        BinaryOp::Sub => both(Ok(g.clone()), g.try_neg()),
        BinaryOp::Mul => both(
            if need_x { g.try_mul(y) } else { Ok(g.clone()) },
            if need_y { g.try_mul(x) } else { Ok(g.clone()) },
        ),
        BinaryOp::Div => both(
            if need_x { g.try_div(y) } else { Ok(g.clone()) },
            if need_y {
                g.try_mul(out)?.try_div(y)?.try_neg()
            } else {
                Ok(g.clone())
            },
        ),
        BinaryOp::Pow => both(
            // d/dx x^y = y·x^(y-1)
            if need_x {
                g.try_mul(&y.try_mul(&x.try_pow(&y.try_sub(1.0)?)?)?)
            } else {
                Ok(g.clone())
            },
            // d/dy x^y = x^y·ln x (0 where x <= 0, as PyTorch's masked form)
            if need_y {
                let ln = Tensor::try_where(&x.try_gt(0)?, &x.try_log()?, 0)?;
                g.try_mul(&out.try_mul(&ln)?)
            } else {
                Ok(g.clone())
            },
        ),
        // Ties split the gradient evenly (PyTorch's maximum/minimum rule).
        BinaryOp::Max | BinaryOp::Min => {
            let wins = if b == BinaryOp::Max {
                x.try_gt(y)?
            } else {
                x.try_lt(y)?
            };
            let tie = x.try_eq(y)?;
            let half = g.try_mul(0.5)?;
            let share = |win: &Tensor| -> Result<Tensor> {
                Tensor::try_where(&tie, &half, &Tensor::try_where(win, g, 0)?)
            };
            let loses = if b == BinaryOp::Max {
                x.try_lt(y)?
            } else {
                x.try_gt(y)?
            };
            both(share(&wins), share(&loses))
        }
        BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne => {
            Ok((None, None))
        }
        // x - q·y with q = floor(x / y) (remainder) or trunc(x / y) (fmod), q piecewise
        // constant: ∂/∂x = 1, ∂/∂y = -q (PyTorch's rules).
        BinaryOp::Remainder | BinaryOp::Fmod => both(
            Ok(g.clone()),
            if need_y {
                let q = if b == BinaryOp::Remainder {
                    x.try_floor_divide(y)?
                } else {
                    x.try_div(y)?.try_trunc()?
                };
                g.try_mul(&q)?.try_neg()
            } else {
                Ok(g.clone())
            },
        ),
        // Piecewise constant in both operands.
        BinaryOp::FloorDiv => both(zeros_like(g), zeros_like(g)),
        // atan2(x, y): ∂/∂x = y / (x² + y²), ∂/∂y = -x / (x² + y²).
        BinaryOp::Atan2 => {
            let r2 = x.try_mul(x)?.try_add(&y.try_mul(y)?)?;
            let gr = g.try_div(&r2)?;
            both(gr.try_mul(y), gr.try_mul(x)?.try_neg())
        }
    }
}

fn reduce(
    op: ReduceOp,
    axes: &[usize],
    x: &Tensor,
    out: &Tensor,
    g: &Tensor,
) -> Result<Option<Tensor>> {
    let shape = x.shape().to_vec();
    Ok(match op {
        ReduceOp::Sum => Some(g.expand_view(&shape)?),
        // ∂/∂x_i Π x = Π_{j≠i} x_j, exact with zeros (PyTorch's rule): a group without
        // zeros gives Π x / x_i; one with a single zero gives the product of the others at
        // the zero and 0 elsewhere; one with more zeros gives 0.
        ReduceOp::Prod => {
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let is_zero = x.try_eq(0)?;
            let zeros = is_zero.try_cast(DType::I64)?.try_sum_keepdim(&axes)?;
            let safe_x = Tensor::try_where(&is_zero, 1, x)?;
            let nonzero_prod = safe_x.try_prod_keepdim(&axes)?;
            let no_zero = nonzero_prod.expand_view(&shape)?.try_div(&safe_x)?;
            let one_zero = Tensor::try_where(&is_zero, &nonzero_prod, 0)?;
            let d = Tensor::try_where(
                &zeros.try_eq(0)?,
                &no_zero,
                &Tensor::try_where(&zeros.try_eq(1)?, &one_zero, 0)?,
            )?;
            Some(g.expand_view(&shape)?.try_mul(&d)?)
        }
        // PyTorch's amax/amin rule: the gradient is split evenly among the maxima.
        ReduceOp::Max | ReduceOp::Min => {
            let hit = x.try_eq(&out.expand_view(&shape)?)?.try_cast(g.dtype())?;
            let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let count = hit.try_sum_keepdim(&axes)?;
            Some(g.try_div(&count)?.expand_view(&shape)?.try_mul(&hit)?)
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => None,
    })
}

fn movement(m: &Movement, x: &Tensor, g: &Tensor) -> Result<Tensor> {
    let shape = x.shape();
    match m {
        Movement::Reshape(_) => {
            g.try_reshape(shape.iter().map(|&d| d as isize).collect::<Vec<_>>())
        }
        Movement::Permute(p) => {
            let mut inv = vec![0isize; p.len()];
            for (i, &d) in p.iter().enumerate() {
                inv[d] = i as isize;
            }
            g.try_permute(&inv)
        }
        Movement::Expand(to) => {
            let axes: Vec<isize> = (0..to.len())
                .filter(|&d| shape[d] == 1 && to[d] != 1)
                .map(|d| d as isize)
                .collect();
            if axes.is_empty() {
                Ok(g.clone())
            } else {
                g.try_sum_keepdim(&axes)
            }
        }
        Movement::Pad { pads, .. } => {
            let ranges: Vec<(isize, isize, isize)> = pads
                .iter()
                .zip(shape)
                .map(|(&(b, _), &n)| (b as isize, (b + n) as isize, 1))
                .collect();
            g.try_slice(&ranges)
        }
        Movement::Flip(axes) => g.try_flip(axes.iter().map(|&a| a as isize).collect::<Vec<_>>()),
        Movement::Slice(ranges) => unslice(g, ranges, shape),
    }
}

/// The gradient of a slice: `g` scattered into zeros of the input's shape, built from
/// movement ops only (pads, and for a step `s` a pad of `s - 1` zeros after every element).
fn unslice(g: &Tensor, ranges: &[SliceRange], shape: &[usize]) -> Result<Tensor> {
    let nd = shape.len();
    if ranges.iter().any(|r| r.is_empty()) {
        // Nothing was selected: the gradient is all zeros.
        return Tensor::try_full_on(shape, 0, g.dtype(), g.device());
    }
    let mut t = g.clone();
    for (d, r) in ranges.iter().enumerate() {
        let n = r.len();
        let full = shape[d];
        if r.step > 1 {
            // [.., n, ..] -> [.., n, step, ..] (zeros after each element) -> [.., n*step, ..]
            let mut s: Vec<isize> = t.shape().iter().map(|&v| v as isize).collect();
            s.insert(d + 1, 1);
            let mut pads = vec![(0usize, 0usize); nd + 1];
            pads[d + 1] = (0, r.step - 1);
            let mut merged: Vec<isize> = t.shape().iter().map(|&v| v as isize).collect();
            merged[d] = (n * r.step) as isize;
            t = t.try_reshape(&s)?.try_pad(&pads, 0)?.try_reshape(&merged)?;
            // Keep the positions that exist in the input.
            let keep = (full - r.start).min(n * r.step);
            let mut ranges_d = vec![(0isize, isize::MAX, 1isize); nd];
            ranges_d[d] = (0, keep as isize, 1);
            t = t.try_slice(&ranges_d)?;
        }
        let len = t.shape()[d];
        let mut pads = vec![(0usize, 0usize); nd];
        pads[d] = (r.start, full - r.start - len);
        t = t.try_pad(&pads, 0)?;
    }
    Ok(t)
}
