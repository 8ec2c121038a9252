//! Reverse-mode differentiation for the reference evaluator: the oracle for kiln's autograd.
//!
//! [`gradients`] walks the same graph [`super::evaluate`] walks, evaluates every node with
//! the reference evaluator, then runs each node's vector-Jacobian product backwards on
//! plain `f64` vectors with explicit loops. It shares nothing with `crate::autograd` (no
//! kiln tensor ops, no derivative rule of `autograd/rules.rs`): every rule here is written
//! from the op's definition, so the two implementations only agree when both are right.
//!
//! # What is differentiated
//!
//! The function the graph computes, nothing else:
//!
//! * Gradients flow into every float node the output depends on, whether or not it
//!   requires grad; `requires_grad`, `no_grad` and `detach` leave no op in the graph, so
//!   they are invisible here (a `detach()` of a lazy tensor records a reshape, which this
//!   differentiates through). A composite with its own backward rule (cross entropy) is
//!   differentiated through the primitive ops its forward recorded, which checks the rule.
//! * Integer and bool nodes carry no gradient (comparisons, arg-reductions, argsort,
//!   index tensors, float→int casts stop it).
//! * A realized node is a leaf, read from its buffer, unless it still keeps its history (a
//!   value requiring grad realized before `backward`): then its recorded op is
//!   differentiated over its kept inputs, with the buffer as its value — as kiln's
//!   backward pass does. A realized composite with a custom rule is differentiated
//!   through the forward ops it recorded, which its node keeps as long as its history.
//!
//! # Conventions at non-differentiable points (PyTorch's)
//!
//! `abs'(0) = 0`, `relu'(0) = 0`; `maximum`/`minimum` split a tie's gradient evenly
//! between the operands; `max`/`min` reductions (PyTorch's `amax`/`amin`) split it evenly
//! among every element equal to the result; `prod` and `cumprod` are exact with zeros (the
//! product of the other factors, never a division); `pow`'s exponent gradient is 0 where
//! the base is 0 and the exponent is non-negative, `x^y ln x` elsewhere (NaN for a
//! negative base), and its base gradient is 0 where the exponent is 0. An in-place write
//! (`Assign`) passes the gradient to the value written.
//!
//! Values are the reference evaluator's (each node rounded to its dtype, as kiln stores
//! it); gradients are accumulated in `f64` and rounded once, to each requested tensor's
//! dtype, at the end.

use super::{RefTensor, evaluate_all, lanes, ravel, unravel};
use crate::dtype::Scalar;
use crate::error::{KilnError, Result};
use crate::graph::{self, BinaryOp, GradFn, Graph, NodeKey, Op, ReduceOp, UnaryOp};
use crate::ops::{ScanOp, ScatterReduce};
use crate::shape::{Movement, numel};
use crate::tensor::Tensor;
use std::collections::{HashMap, HashSet};

/// The gradient of `Σ seed ⊙ output` with respect to each tensor of `wrt`, computed by the
/// reference evaluator (see the module docs). `seed` defaults to ones of the output's
/// shape (so for a one-element output, the gradient of the output itself, as
/// [`Tensor::backward`]). Each result has its tensor's shape and dtype; a tensor the
/// output does not depend on gets zeros.
///
/// Errors on a non-float output or `wrt` tensor, a seed of the wrong shape, and anything
/// the reference evaluator refuses (an index out of range, a buffer off the host).
pub fn gradients(
    output: &Tensor,
    seed: Option<&RefTensor>,
    wrt: &[&Tensor],
) -> Result<Vec<RefTensor>> {
    let keys: Vec<NodeKey> = wrt.iter().map(|t| t.node_key()).collect();
    graph::with_graph(|g| gradients_in(g, output.node_key(), seed, &keys))
}

fn gradients_in(
    g: &Graph,
    output: NodeKey,
    seed: Option<&RefTensor>,
    wrt: &[NodeKey],
) -> Result<Vec<RefTensor>> {
    const OP: &str = "reference gradients";
    let root = g.node(output)?;
    if !root.dtype.is_float() {
        return Err(KilnError::UnsupportedDType {
            op: OP,
            dtype: root.dtype,
            detail: ": only a float output has a gradient".into(),
        });
    }
    let seed = match seed {
        Some(s) if s.shape != root.shape => {
            return Err(KilnError::ShapeMismatch {
                op: OP,
                lhs: root.shape.clone(),
                rhs: s.shape.clone(),
                detail: ": the seed must have the output's shape".into(),
            });
        }
        Some(s) => s.to_f64(),
        None => vec![1.0; numel(&root.shape)],
    };
    for &k in wrt {
        let n = g.node(k)?;
        if !n.dtype.is_float() {
            return Err(KilnError::UnsupportedDType {
                op: OP,
                dtype: n.dtype,
                detail: ": gradients exist only for float tensors".into(),
            });
        }
    }
    let wanted: HashSet<NodeKey> = wrt.iter().copied().collect();
    let order = history_order(g, output)?;
    let values = evaluate_all(g, &order)?;
    let value = |k: NodeKey| {
        values
            .get(&k)
            .ok_or_else(|| KilnError::internal("reference gradients: node not evaluated"))
    };
    let mut grads: HashMap<NodeKey, Vec<f64>> = HashMap::new();
    grads.insert(output, seed);
    for &k in order.iter().rev() {
        let gk = if wanted.contains(&k) {
            grads.get(&k).cloned()
        } else {
            grads.remove(&k)
        };
        let (Some(gk), Some(op)) = (gk, step_op(g, k)?) else {
            continue;
        };
        let inputs = g.inputs(k)?;
        let ins: Vec<&RefTensor> = inputs.iter().map(|&i| value(i)).collect::<Result<_>>()?;
        let input_grads = vjp(&op, &ins, value(k)?, &gk)?;
        if input_grads.len() != inputs.len() {
            return Err(KilnError::internal(format!(
                "reference gradients: {} gave {} gradients for {} inputs",
                op.name(),
                input_grads.len(),
                inputs.len()
            )));
        }
        for ((&i, x), gi) in inputs.iter().zip(&ins).zip(input_grads) {
            let Some(gi) = gi else { continue };
            if !x.dtype.is_float() {
                continue;
            }
            if gi.len() != numel(&x.shape) {
                return Err(KilnError::internal(format!(
                    "reference gradients: {} gave a gradient of {} elements for an input of shape {:?}",
                    op.name(),
                    gi.len(),
                    x.shape
                )));
            }
            match grads.get_mut(&i) {
                Some(acc) => acc.iter_mut().zip(&gi).for_each(|(a, v)| *a += v),
                None => {
                    grads.insert(i, gi);
                }
            }
        }
    }
    wrt.iter()
        .map(|k| {
            let n = g.node(*k)?;
            let data = grads
                .get(k)
                .cloned()
                .unwrap_or_else(|| vec![0.0; numel(&n.shape)]);
            Ok(RefTensor::from_scalars(
                n.shape.clone(),
                n.dtype,
                data.into_iter().map(Scalar::Float),
            ))
        })
        .collect()
}

/// The op whose inputs a gradient flows back through at `k`, or `None` for a leaf: a
/// generator, or a realized node without kept history. A realized composite with its own
/// backward rule is differentiated through the forward ops it recorded (which its node
/// keeps until its history is released), never with its rule.
fn step_op(g: &Graph, k: NodeKey) -> Result<Option<Op>> {
    let n = g.node(k)?;
    Ok(match &n.op {
        Op::Buffer => match n.autograd.as_ref().and_then(|a| a.grad_fn.as_ref()) {
            Some(GradFn::Op(op)) if !g.inputs(k)?.is_empty() => Some(op.clone()),
            // The composite's output is a reshape of the forward ops it recorded, kept as
            // its one input edge until its history is released.
            Some(GradFn::Custom { .. }) if g.inputs(k)?.len() == 1 => {
                Some(Op::Movement(Movement::Reshape(n.shape.clone())))
            }
            Some(GradFn::Custom { .. }) => {
                return Err(KilnError::internal(
                    "reference gradients: a realized composite lost its forward ops",
                ));
            }
            _ => None,
        },
        Op::Generate(_) => None,
        op => Some(op.clone()),
    })
}

/// Every node `root` depends on through [`step_op`] edges, inputs before consumers.
fn history_order(g: &Graph, root: NodeKey) -> Result<Vec<NodeKey>> {
    let mut order = vec![];
    let mut seen = HashSet::new();
    let mut stack = vec![(root, false)];
    while let Some((k, expanded)) = stack.pop() {
        if expanded {
            order.push(k);
            continue;
        }
        if !seen.insert(k) {
            continue;
        }
        stack.push((k, true));
        if step_op(g, k)?.is_some() {
            for i in g.inputs(k)?.into_iter().rev() {
                if !seen.contains(&i) {
                    stack.push((i, false));
                }
            }
        }
    }
    Ok(order)
}

/// The gradients of `op`'s inputs (one entry per input, `None` where none flows) given
/// the inputs' values, the output's value and the output's gradient `g`.
fn vjp(op: &Op, ins: &[&RefTensor], out: &RefTensor, g: &[f64]) -> Result<Vec<Option<Vec<f64>>>> {
    let x = |i: usize| -> Result<&RefTensor> {
        ins.get(i)
            .copied()
            .ok_or_else(|| KilnError::internal("reference gradients: missing input"))
    };
    // Elementwise operands have the output's shape (broadcasts are recorded as expands).
    let same = |t: &RefTensor| -> Result<Vec<f64>> {
        if numel(&t.shape) == g.len() {
            Ok(t.to_f64())
        } else {
            Err(KilnError::internal(format!(
                "reference gradients: {} operand of shape {:?} for an output of shape {:?}",
                op.name(),
                t.shape,
                out.shape
            )))
        }
    };
    Ok(match op {
        Op::Unary(u) => vec![Some(unary(*u, &same(x(0)?)?, g))],
        Op::Binary(b) => {
            let (ga, gb) = binary(*b, &same(x(0)?)?, &same(x(1)?)?, g);
            vec![ga, gb]
        }
        Op::Where => {
            let c = same(x(0)?)?;
            let pick = |on: bool| -> Vec<f64> {
                c.iter()
                    .zip(g)
                    .map(|(&c, &gv)| if (c != 0.0) == on { gv } else { 0.0 })
                    .collect()
            };
            vec![None, Some(pick(true)), Some(pick(false))]
        }
        // The identity on values (the gradient is rounded to the input's dtype by the caller
        // only at the end; in between it stays f64).
        Op::Cast | Op::Contiguous | Op::ToDevice(_) => vec![Some(g.to_vec())],
        Op::Reduce { op, axes } => vec![reduce(*op, axes, x(0)?, out, g)],
        Op::Matmul => {
            let (ga, gb) = matmul(x(0)?, x(1)?, out, g)?;
            vec![Some(ga), Some(gb)]
        }
        Op::Movement(m) => vec![Some(movement(m, &x(0)?.shape, &out.shape, g))],
        // The node's value is the value written.
        Op::Assign => vec![None, Some(g.to_vec())],
        Op::Gather { axis } => vec![Some(gather(x(0)?, x(1)?, *axis, out, g)?), None],
        Op::Scatter { axis, reduce } => {
            let (gv, gi) = scatter(*reduce, x(0)?, x(1)?, ins.get(2).copied(), *axis, out, g)?;
            let mut v = vec![None, Some(gv)];
            if ins.len() > 2 {
                v.push(Some(gi));
            }
            v
        }
        Op::Scan { op, axis } => vec![Some(scan(*op, *axis, x(0)?, g))],
        Op::Buffer | Op::Generate(_) | Op::ArgSort { .. } => vec![None; ins.len()],
    })
}

fn unary(u: UnaryOp, x: &[f64], g: &[f64]) -> Vec<f64> {
    use std::f64::consts::{FRAC_2_SQRT_PI, LN_2, SQRT_2};
    // The derivative at x, from the op's definition.
    let d = |x: f64| -> f64 {
        match u {
            UnaryOp::Neg => -1.0,
            UnaryOp::Abs => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            UnaryOp::Relu => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => 1.0 / x,
            UnaryOp::Log2 => 1.0 / (x * LN_2),
            UnaryOp::Sqrt => 0.5 / x.sqrt(),
            UnaryOp::Recip => -1.0 / (x * x),
            UnaryOp::Sin => x.cos(),
            UnaryOp::Cos => -x.sin(),
            UnaryOp::Tanh => {
                let c = x.cosh();
                1.0 / (c * c)
            }
            UnaryOp::Sigmoid => {
                // σ' = e^{-|x|} / (1 + e^{-|x|})², symmetric in x.
                let e = (-x.abs()).exp();
                e / ((1.0 + e) * (1.0 + e))
            }
            UnaryOp::Gelu => {
                // d/dx x·Φ(x) = Φ(x) + x·φ(x).
                let cdf = 0.5 * (1.0 + crate::math::f64::erf(x / SQRT_2));
                let pdf = (-0.5 * x * x).exp() * (0.5 * FRAC_2_SQRT_PI / SQRT_2);
                cdf + x * pdf
            }
            UnaryOp::Erf => FRAC_2_SQRT_PI * (-x * x).exp(),
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc | UnaryOp::Sign => 0.0,
            UnaryOp::Log1p => 1.0 / (1.0 + x),
            UnaryOp::Expm1 => x.exp(),
            UnaryOp::Exp2 => x.exp2() * LN_2,
            UnaryOp::Rsqrt => -0.5 / (x * x.sqrt()),
            UnaryOp::Square => 2.0 * x,
            UnaryOp::Softplus => {
                if x > 20.0 {
                    1.0
                } else {
                    1.0 / (1.0 + (-x).exp())
                }
            }
            UnaryOp::Silu => {
                let s = 1.0 / (1.0 + (-x).exp());
                s + x * s * (1.0 - s)
            }
            UnaryOp::Tan => 1.0 / (x.cos() * x.cos()),
            UnaryOp::Asin => 1.0 / (1.0 - x * x).sqrt(),
            UnaryOp::Acos => -1.0 / (1.0 - x * x).sqrt(),
            UnaryOp::Atan => 1.0 / (1.0 + x * x),
            UnaryOp::Sinh => x.cosh(),
            UnaryOp::Cosh => x.sinh(),
            UnaryOp::Asinh => 1.0 / (x * x + 1.0).sqrt(),
            UnaryOp::Acosh => 1.0 / (x * x - 1.0).sqrt(),
            UnaryOp::Atanh => 1.0 / (1.0 - x * x),
        }
    };
    x.iter().zip(g).map(|(&x, &gv)| gv * d(x)).collect()
}

type Pair = (Option<Vec<f64>>, Option<Vec<f64>>);

fn binary(b: BinaryOp, x: &[f64], y: &[f64], g: &[f64]) -> Pair {
    // Partial derivatives (∂/∂x, ∂/∂y) at one pair.
    let d = |x: f64, y: f64| -> (f64, f64) {
        match b {
            BinaryOp::Add => (1.0, 1.0),
            BinaryOp::Sub => (1.0, -1.0),
            BinaryOp::Mul => (y, x),
            BinaryOp::Div => (1.0 / y, -x / (y * y)),
            BinaryOp::Pow => {
                let dx = if y == 0.0 { 0.0 } else { y * x.powf(y - 1.0) };
                let dy = if x == 0.0 && y >= 0.0 {
                    0.0
                } else {
                    x.powf(y) * x.ln()
                };
                (dx, dy)
            }
            BinaryOp::Max | BinaryOp::Min => {
                let x_wins = if b == BinaryOp::Max { x > y } else { x < y };
                if x == y {
                    (0.5, 0.5)
                } else if x_wins {
                    (1.0, 0.0)
                } else {
                    (0.0, 1.0)
                }
            }
            BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge
            | BinaryOp::Eq
            | BinaryOp::Ne => (0.0, 0.0),
            // x - q·y with q = floor(x/y) or trunc(x/y), constant between its steps.
            BinaryOp::Remainder => (1.0, -(x / y).floor()),
            BinaryOp::Fmod => (1.0, -(x / y).trunc()),
            BinaryOp::FloorDiv => (0.0, 0.0),
            BinaryOp::Atan2 => {
                let r2 = x * x + y * y;
                (y / r2, -x / r2)
            }
        }
    };
    if b.is_comparison() {
        return (None, None);
    }
    let (mut gx, mut gy) = (Vec::with_capacity(g.len()), Vec::with_capacity(g.len()));
    for ((&xv, &yv), &gv) in x.iter().zip(y).zip(g) {
        let (dx, dy) = d(xv, yv);
        gx.push(gv * dx);
        gy.push(gv * dy);
    }
    (Some(gx), Some(gy))
}

/// For every element of `x`, the flat index of the output element it reduces into.
fn reduced_index(x_shape: &[usize], axes: &[usize], out_shape: &[usize]) -> Vec<usize> {
    (0..numel(x_shape))
        .map(|flat| {
            let mut c = unravel(flat, x_shape);
            for &a in axes {
                c[a] = 0;
            }
            ravel(&c, out_shape)
        })
        .collect()
}

fn reduce(
    op: ReduceOp,
    axes: &[usize],
    x: &RefTensor,
    out: &RefTensor,
    g: &[f64],
) -> Option<Vec<f64>> {
    let to = reduced_index(&x.shape, axes, &out.shape);
    let xv = x.to_f64();
    match op {
        ReduceOp::Sum => Some(to.iter().map(|&o| g[o]).collect()),
        ReduceOp::Prod => {
            // Each element's gradient is the product of the other members of its group,
            // from prefix and suffix products (exact with zeros: no division).
            let mut groups: Vec<Vec<usize>> = vec![vec![]; g.len()];
            for (i, &o) in to.iter().enumerate() {
                groups[o].push(i);
            }
            let mut gx = vec![0.0; xv.len()];
            for (o, members) in groups.iter().enumerate() {
                let mut suffix = vec![1.0; members.len() + 1];
                for j in (0..members.len()).rev() {
                    suffix[j] = suffix[j + 1] * xv[members[j]];
                }
                let mut prefix = 1.0;
                for (j, &i) in members.iter().enumerate() {
                    gx[i] = g[o] * prefix * suffix[j + 1];
                    prefix *= xv[i];
                }
            }
            Some(gx)
        }
        ReduceOp::Max | ReduceOp::Min => {
            // amax/amin: an even split among the elements equal to the result. The result
            // is the reference's own reduction of its input, not `out`: a realized output
            // holds the last bits of kiln's forward, which may differ from the reference's
            // (kiln's f32 sigmoid against the reference's), and no element would then match.
            let ov = super::reduce(x, op, axes, &out.shape, x.dtype).to_f64();
            let mut count = vec![0usize; g.len()];
            for (i, &o) in to.iter().enumerate() {
                if xv[i] == ov[o] {
                    count[o] += 1;
                }
            }
            Some(
                to.iter()
                    .enumerate()
                    .map(|(i, &o)| {
                        if xv[i] == ov[o] {
                            g[o] / count[o] as f64
                        } else {
                            0.0
                        }
                    })
                    .collect(),
            )
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => None,
    }
}

/// `out = a @ b` over equal batch dimensions: `ga = g @ bᵀ`, `gb = aᵀ @ g`.
fn matmul(
    a: &RefTensor,
    b: &RefTensor,
    out: &RefTensor,
    g: &[f64],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let nd = out.shape.len();
    if nd < 2 || a.shape.len() != nd || b.shape.len() != nd {
        return Err(KilnError::internal(format!(
            "reference gradients: matmul of {:?} and {:?} into {:?}",
            a.shape, b.shape, out.shape
        )));
    }
    let (m, n) = (out.shape[nd - 2], out.shape[nd - 1]);
    let k = a.shape[nd - 1];
    let batch = numel(&out.shape[..nd - 2]);
    let (av, bv) = (a.to_f64(), b.to_f64());
    let mut ga = vec![0.0; av.len()];
    let mut gb = vec![0.0; bv.len()];
    for bi in 0..batch {
        let (ao, bo, go) = (bi * m * k, bi * k * n, bi * m * n);
        for i in 0..m {
            for j in 0..n {
                let gv = g[go + i * n + j];
                for p in 0..k {
                    ga[ao + i * k + p] += gv * bv[bo + p * n + j];
                    gb[bo + p * n + j] += av[ao + i * k + p] * gv;
                }
            }
        }
    }
    Ok((ga, gb))
}

/// The gradient of a movement: each output element's gradient goes back to the input
/// element it was read from (padding reads none; an expand reads one element many times).
fn movement(m: &Movement, in_shape: &[usize], out_shape: &[usize], g: &[f64]) -> Vec<f64> {
    let mut gx = vec![0.0; numel(in_shape)];
    if let Movement::Reshape(_) = m {
        gx.copy_from_slice(g);
        return gx;
    }
    for (flat, &gv) in g.iter().enumerate() {
        let c = unravel(flat, out_shape);
        let src: Option<Vec<usize>> = match m {
            Movement::Reshape(_) => None,
            Movement::Permute(perm) => {
                let mut ic = vec![0; perm.len()];
                for (i, &d) in perm.iter().enumerate() {
                    ic[d] = c[i];
                }
                Some(ic)
            }
            Movement::Expand(_) => Some(
                c.iter()
                    .zip(in_shape)
                    .map(|(&ci, &n)| if n == 1 { 0 } else { ci })
                    .collect(),
            ),
            Movement::Slice(ranges) => Some(
                c.iter()
                    .zip(ranges)
                    .map(|(&ci, r)| r.start + ci * r.step)
                    .collect(),
            ),
            Movement::Pad { pads, .. } => c
                .iter()
                .zip(pads)
                .zip(in_shape)
                .map(|((&ci, &(before, _)), &n)| {
                    (ci >= before && ci - before < n).then(|| ci - before)
                })
                .collect(),
            Movement::Flip(axes) => Some(
                c.iter()
                    .enumerate()
                    .map(|(d, &ci)| {
                        if axes.contains(&d) {
                            in_shape[d] - 1 - ci
                        } else {
                            ci
                        }
                    })
                    .collect(),
            ),
        };
        if let Some(ic) = src {
            gx[ravel(&ic, in_shape)] += gv;
        }
    }
    gx
}

/// An index tensor's element `flat`, checked against the indexed dimension's size.
fn index_at(op: &'static str, idx: &RefTensor, flat: usize, len: usize) -> Result<usize> {
    let i = idx.get(flat).to_i64();
    if i < 0 || i as usize >= len {
        return Err(KilnError::IndexOutOfRange {
            op,
            index: i,
            size: len,
        });
    }
    Ok(i as usize)
}

/// `out[c] = src[c with c[axis] = index[c]]`: the gradient sums back into the read places.
fn gather(
    src: &RefTensor,
    idx: &RefTensor,
    axis: usize,
    out: &RefTensor,
    g: &[f64],
) -> Result<Vec<f64>> {
    let mut gx = vec![0.0; numel(&src.shape)];
    for (flat, &gv) in g.iter().enumerate() {
        let mut c = unravel(flat, &out.shape);
        c[axis] = index_at("gather", idx, flat, src.shape[axis])?;
        gx[ravel(&c, &src.shape)] += gv;
    }
    Ok(gx)
}

/// A scatter's gradients from its definition: every place's contributors (the initial
/// value, then the values in the index's order) get the place's gradient (`sum`), the
/// product of the other contributors (`prod`, by multiplication alone), or an even share
/// among the contributors equal to the result (`amax`, `amin`).
fn scatter(
    reduce: ScatterReduce,
    idx: &RefTensor,
    values: &RefTensor,
    init: Option<&RefTensor>,
    axis: usize,
    out: &RefTensor,
    g: &[f64],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let n_out = numel(&out.shape);
    let vals = values.to_f64();
    let inits = init.map(|t| t.to_f64());
    let res = out.to_f64();
    // Contributors per place: `None` for the initial value, `Some(p)` for value `p`.
    let mut who: Vec<Vec<Option<usize>>> = vec![vec![]; n_out];
    if inits.is_some() {
        for w in &mut who {
            w.push(None);
        }
    }
    for flat in 0..numel(&idx.shape) {
        let mut c = unravel(flat, &idx.shape);
        c[axis] = index_at("scatter_reduce", idx, flat, out.shape[axis])?;
        who[ravel(&c, &out.shape)].push(Some(flat));
    }
    let value = |w: Option<usize>, o: usize| match (w, &inits) {
        (Some(p), _) => vals[p],
        (None, Some(i)) => i[o],
        (None, None) => 0.0,
    };
    // amax/amin: the result is the reference's own combination of the contributors, not
    // `out`: a realized output holds the last bits of kiln's forward, which may differ from
    // the reference's recomputed inputs (a layer_norm's, say), and then no contributor
    // would match it (as for the max/min reductions).
    let own = |o: usize, list: &[Option<usize>]| -> f64 {
        let pick = |a: f64, v: f64, max: bool| {
            if a.is_nan() || v.is_nan() {
                f64::NAN
            } else if max {
                a.max(v)
            } else {
                a.min(v)
            }
        };
        let vs = list.iter().map(|&w| value(w, o));
        match reduce {
            ScatterReduce::Amax => vs.fold(f64::NEG_INFINITY, |a, v| pick(a, v, true)),
            ScatterReduce::Amin => vs.fold(f64::INFINITY, |a, v| pick(a, v, false)),
            ScatterReduce::Sum | ScatterReduce::Prod => res[o],
        }
    };
    let (mut gv, mut gi) = (vec![0.0; vals.len()], vec![0.0; n_out]);
    for (o, list) in who.iter().enumerate() {
        let result = own(o, list);
        let equal = list.iter().filter(|&&w| value(w, o) == result).count() as f64;
        for (k, &w) in list.iter().enumerate() {
            let grad = match reduce {
                ScatterReduce::Sum => g[o],
                ScatterReduce::Prod => {
                    let others: f64 = list
                        .iter()
                        .enumerate()
                        .filter(|&(j, _)| j != k)
                        .map(|(_, &u)| value(u, o))
                        .product();
                    g[o] * others
                }
                ScatterReduce::Amax | ScatterReduce::Amin => {
                    if value(w, o) == result {
                        g[o] / equal
                    } else {
                        0.0
                    }
                }
            };
            match w {
                Some(p) => gv[p] = grad,
                None => gi[o] = grad,
            }
        }
    }
    Ok((gv, gi))
}

/// cumsum: `gx_i = Σ_{j ≥ i} g_j`. cumprod: `gx_i = Σ_{j ≥ i} g_j · Π_{k ≤ j, k ≠ i} x_k`,
/// each product built by multiplication alone (exact with zeros).
fn scan(op: ScanOp, axis: usize, x: &RefTensor, g: &[f64]) -> Vec<f64> {
    let xv = x.to_f64();
    let mut gx = vec![0.0; xv.len()];
    for lane in lanes(&x.shape, axis) {
        match op {
            ScanOp::Sum => {
                let mut acc = 0.0;
                for &i in lane.iter().rev() {
                    acc += g[i];
                    gx[i] = acc;
                }
            }
            ScanOp::Prod => {
                // `before` = Π_{k < i} x_k.
                let mut before = 1.0;
                for (p, &i) in lane.iter().enumerate() {
                    let mut partial = before;
                    let mut acc = g[i] * partial;
                    for &j in &lane[p + 1..] {
                        partial *= xv[j];
                        acc += g[j] * partial;
                    }
                    gx[i] = acc;
                    before *= xv[i];
                }
            }
        }
    }
    gx
}
