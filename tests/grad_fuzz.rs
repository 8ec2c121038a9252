//! Backward fuzzing: random programs' gradients agree three ways — kiln's autograd realized
//! fused, the same realized unfused (`RealizeOptions::unfused()`), and the reference
//! evaluator's own reverse mode (`kiln::reference::grad`, written apart from
//! `src/autograd/rules.rs`, on f64 loops).
//!
//! # A case
//!
//! [`generate`] draws a seeded program: float leaves (f32 or f64, requiring grad) and a
//! list of steps over them — every unary and binary op of the op table, `where`, casts,
//! sum/prod/max/min/mean/var/logsumexp reductions (keepdim or not), matmul (batched, matrix
//! and vector forms, `x @ xᵀ`), reshape, permute, expand (after unsqueeze), slices with
//! steps, pads, flips, `contiguous`, gather, scatter_add, scatter_reduce (sum, prod with
//! exact zeros, mean, amax/amin with exact ties; with and without `include_self`; `src`
//! sometimes larger than the index), scatter (repeated indices), cumsum, cumprod (fed exact
//! zeros through masks), masked_select and masked_scatter (masks realized mid-build),
//! index_put (repeated and negative indices, with and without accumulation),
//! softmax, log_softmax, layer_norm, cross_entropy, cat and realizing an
//! intermediate before `backward` (so backward runs through a realized node's kept
//! history). Each candidate step is built and evaluated by the reference evaluator while
//! generating, and kept only if the values it reads are well conditioned: finite, bounded,
//! away from kinks and discontinuities (a unary or binary op is probed through its f64
//! definition around every operand, so an op added to the table is fuzzed with no change
//! here), with a margin to every `where` threshold and between a reduction's maximum and
//! its runner-up. Exact ties and exact zeros are allowed on purpose (quantized leaves,
//! expanded values, `x op x`, zero masks): there every implementation must follow
//! PyTorch's rules (ties split evenly, `relu'(0) = abs'(0) = 0`, zero-exact products).
//! They are allowed only between values that are the same bits in every correct
//! evaluation ([`exact`]: leaves, constants, views of them, IEEE-correctly rounded ops
//! over them); a tie or a zero that comes out of a sum, a matmul or a transcendental is
//! probed like any other value, since a last-bit difference puts it on either side.
//!
//! The loss is `Σ_k Σ w_k ⊙ out_k` over every value no later step reads, with random
//! weights `w_k` in `[-1, 1]`. The reference gradients are taken before `backward`;
//! the loss and every leaf's gradient are realized in one plan.
//!
//! # Tolerances
//!
//! For each leaf gradient element: `|got - want| <= tol * (|want| + S)`, where `S` is the
//! largest reference gradient magnitude over all leaves (at least 1): errors scale with
//! the terms summed, not with a result that happens to cancel. `tol` is `1e-9` for kiln
//! vs the reference when every value of the program is f64 and `2e-3` when any is f32;
//! fused vs unfused use `1e-12` and `1e-5`. A leaf that receives no gradient in kiln
//! (`grad()` is `None`) counts as zeros.
//!
//! # Failures
//!
//! A failing case is shrunk to the shortest prefix of its program that still fails (the
//! prefix's last value as the output) and printed as Rust code building that program,
//! with its seed. Environment: `KILN_GRAD_FUZZ_CASES` (cases per fuzz test, default 1000),
//! `KILN_GRAD_FUZZ_SEED` (the first seed), `KILN_GRAD_FUZZ_STEPS` (most steps per program,
//! default 12), `KILN_GRAD_FUZZ_PRINT=1` (print every program; with `--nocapture`).

mod common;

use kiln::nn::functional::{CrossEntropyOptions, Reduction};
use kiln::ops::{BinaryOp, UnaryOp};
use kiln::reference::{self, RefData, RefTensor, grad};
use kiln::{DType, Index, RealizeOptions, Tensor, no_grad, realize_all_with};
use std::fmt::Write as _;

// ---------------------------------------------------------------------------------------
// Random numbers

#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }

    /// splitmix64.
    fn next(&mut self) -> u64 {
        common::splitmix64(&mut self.0)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

// ---------------------------------------------------------------------------------------
// Programs

/// One value of a program. Operands are indices of earlier nodes.
#[derive(Clone, Debug)]
enum Node {
    /// A float leaf that requires grad.
    Leaf {
        data: Vec<f64>,
        shape: Vec<usize>,
        dtype: DType,
    },
    /// A float constant (masks with exact zeros).
    Const {
        data: Vec<f64>,
        shape: Vec<usize>,
        dtype: DType,
    },
    /// An i64 constant (indices, class targets).
    Index {
        data: Vec<i64>,
        shape: Vec<usize>,
    },
    Op(Step),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Red {
    Sum,
    Prod,
    Max,
    Min,
    Mean,
    Var,
    Logsumexp,
}

#[derive(Clone, Debug)]
enum Step {
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    /// `x op c`, or `c op x` when `left` (rsub, rdiv, rpow).
    Scalar {
        op: BinaryOp,
        x: usize,
        c: f64,
        left: bool,
    },
    /// `where(c > t, a, b)`.
    Where {
        c: usize,
        t: f64,
        a: usize,
        b: usize,
    },
    Cast(usize, DType),
    Reduce {
        red: Red,
        x: usize,
        axes: Vec<isize>,
        keepdim: bool,
    },
    Matmul(usize, usize),
    Reshape(usize, Vec<isize>),
    Permute(usize, Vec<isize>),
    /// `x.unsqueeze(d)` when given, then `expand(shape)`.
    Expand {
        x: usize,
        unsqueeze: Option<isize>,
        shape: Vec<usize>,
    },
    Slice(usize, Vec<(isize, isize, isize)>),
    Pad(usize, Vec<(usize, usize)>, f64),
    Flip(usize, Vec<isize>),
    Contiguous(usize),
    Gather {
        x: usize,
        dim: isize,
        index: usize,
    },
    ScatterAdd {
        x: usize,
        dim: isize,
        index: usize,
        src: usize,
    },
    ScatterReduce {
        x: usize,
        dim: isize,
        index: usize,
        src: usize,
        reduce: &'static str,
        include_self: bool,
    },
    Scatter {
        x: usize,
        dim: isize,
        index: usize,
        src: usize,
    },
    Cumsum(usize, isize),
    Cumprod(usize, isize),
    Softmax(usize, isize),
    LogSoftmax(usize, isize),
    LayerNorm {
        x: usize,
        dims: usize,
        w: Option<usize>,
        b: Option<usize>,
    },
    CrossEntropy {
        x: usize,
        targets: usize,
        /// A constant node of class weights (`opts.weight` is left `None`).
        weight: Option<usize>,
        opts: CrossEntropyOptions,
    },
    Cat(Vec<usize>, isize),
    /// `x.masked_select(c > t)` (`c` broadcasts to `x`'s shape).
    MaskedSelect {
        x: usize,
        c: usize,
        t: f64,
    },
    /// `x.masked_scatter(c > t, src)`.
    MaskedScatter {
        x: usize,
        c: usize,
        t: f64,
        src: usize,
    },
    /// `x.index_put(&[index], values, accumulate)` along `x`'s first dimension.
    IndexPut {
        x: usize,
        index: usize,
        values: usize,
        accumulate: bool,
    },
    /// `x.i(entries)`: a PyTorch subscript (integers, slices, new axes, an ellipsis and
    /// integer index tensors).
    Subscript {
        x: usize,
        entries: Vec<Sub>,
    },
    /// `x.mode(dim, keepdim).0`.
    Mode {
        x: usize,
        dim: isize,
        keepdim: bool,
    },
    /// Realizes `x` (with the run's options) before the loss is built: the identity.
    Realize(usize),
}

/// One subscript entry of [`Step::Subscript`] (`Ints` names an index node).
#[derive(Clone, Debug)]
enum Sub {
    At(i64),
    Slice(Option<i64>, Option<i64>, i64),
    New,
    Ellipsis,
    Ints(usize),
}

impl Step {
    fn operands(&self) -> Vec<usize> {
        match self {
            Step::Unary(_, x)
            | Step::Scalar { x, .. }
            | Step::Cast(x, _)
            | Step::Reduce { x, .. }
            | Step::Reshape(x, _)
            | Step::Permute(x, _)
            | Step::Expand { x, .. }
            | Step::Slice(x, _)
            | Step::Pad(x, ..)
            | Step::Flip(x, _)
            | Step::Contiguous(x)
            | Step::Cumsum(x, _)
            | Step::Cumprod(x, _)
            | Step::Softmax(x, _)
            | Step::LogSoftmax(x, _)
            | Step::Realize(x) => vec![*x],
            Step::Binary(_, a, b) | Step::Matmul(a, b) => vec![*a, *b],
            Step::Where { c, a, b, .. } => vec![*c, *a, *b],
            Step::MaskedSelect { x, c, .. } => vec![*x, *c],
            Step::MaskedScatter { x, c, src, .. } => vec![*x, *c, *src],
            Step::IndexPut {
                x, index, values, ..
            } => vec![*x, *index, *values],
            Step::Gather { x, index, .. } => vec![*x, *index],
            Step::ScatterAdd { x, index, src, .. }
            | Step::ScatterReduce { x, index, src, .. }
            | Step::Scatter { x, index, src, .. } => vec![*x, *index, *src],
            Step::LayerNorm { x, w, b, .. } => {
                let mut v = vec![*x];
                v.extend(w.iter().chain(b.iter()));
                v
            }
            Step::CrossEntropy {
                x, targets, weight, ..
            } => [*x, *targets].into_iter().chain(*weight).collect(),
            Step::Cat(xs, _) => xs.clone(),
            Step::Subscript { x, entries } => std::iter::once(*x)
                .chain(entries.iter().filter_map(|e| match e {
                    Sub::Ints(i) => Some(*i),
                    _ => None,
                }))
                .collect(),
            Step::Mode { x, .. } => vec![*x],
        }
    }
}

/// A program: nodes, the values the loss reads, and their weights.
#[derive(Clone, Debug)]
struct Program {
    nodes: Vec<Node>,
    outs: Vec<usize>,
    weights: Vec<Vec<f64>>,
    /// Some value is f32 (looser tolerances).
    low_precision: bool,
}

impl Program {
    fn leaves(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| matches!(self.nodes[i], Node::Leaf { .. }))
            .collect()
    }
}

fn float_tensor(data: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    if dtype == DType::F32 {
        Tensor::from_vec(data.iter().map(|&v| v as f32).collect::<Vec<f32>>(), shape)
    } else {
        Tensor::from_vec(data.to_vec(), shape)
    }
}

fn red_name(r: Red) -> &'static str {
    match r {
        Red::Sum => "sum",
        Red::Prod => "prod",
        Red::Max => "max",
        Red::Min => "min",
        Red::Mean => "mean",
        Red::Var => "var",
        Red::Logsumexp => "logsumexp",
    }
}

/// Records one step on earlier tensors. `realize` is the options a `Realize` step runs
/// with (`None`: the identity, for building without running).
fn apply(step: &Step, t: &[Tensor], realize: Option<&RealizeOptions>) -> kiln::Result<Tensor> {
    Ok(match step {
        Step::Unary(u, x) => t[*x].try_unary_op(*u)?,
        Step::Binary(b, x, y) => t[*x].try_binary_op(*b, &t[*y])?,
        Step::Scalar { op, x, c, left } => match (op, left) {
            (BinaryOp::Sub, true) => t[*x].try_rsub(*c)?,
            (BinaryOp::Div, true) => t[*x].try_rdiv(*c)?,
            (BinaryOp::Pow, true) => t[*x].try_rpow(*c)?,
            _ => t[*x].try_binary_op(*op, *c)?,
        },
        Step::Where { c, t: th, a, b } => Tensor::try_where(&t[*c].try_gt(*th)?, &t[*a], &t[*b])?,
        Step::MaskedSelect { x, c, t: th } => t[*x].try_masked_select(&t[*c].try_gt(*th)?)?,
        Step::MaskedScatter { x, c, t: th, src } => {
            t[*x].try_masked_scatter(&t[*c].try_gt(*th)?, &t[*src])?
        }
        Step::IndexPut {
            x,
            index,
            values,
            accumulate,
        } => t[*x].try_index_put(&[&t[*index]], &t[*values], *accumulate)?,
        Step::Subscript { x, entries } => {
            let subs: Vec<Index> = entries
                .iter()
                .map(|e| match e {
                    Sub::At(i) => Index::At(*i),
                    Sub::Slice(a, b, s) => Index::Slice {
                        start: *a,
                        end: *b,
                        step: *s,
                    },
                    Sub::New => Index::NewAxis,
                    Sub::Ellipsis => Index::Ellipsis,
                    Sub::Ints(i) => Index::Tensor(t[*i].clone()),
                })
                .collect();
            t[*x].try_i(subs)?
        }
        Step::Mode { x, dim, keepdim } => t[*x].try_mode(*dim, *keepdim)?.0,
        Step::Cast(x, d) => t[*x].try_cast(*d)?,
        Step::Reduce {
            red,
            x,
            axes,
            keepdim,
        } => {
            let x = &t[*x];
            let a = axes.clone();
            match (red, keepdim) {
                (Red::Sum, false) => x.try_sum(a)?,
                (Red::Sum, true) => x.try_sum_keepdim(a)?,
                (Red::Prod, false) => x.try_prod(a)?,
                (Red::Prod, true) => x.try_prod_keepdim(a)?,
                (Red::Max, false) => x.try_max(a)?,
                (Red::Max, true) => x.try_max_keepdim(a)?,
                (Red::Min, false) => x.try_min(a)?,
                (Red::Min, true) => x.try_min_keepdim(a)?,
                (Red::Mean, false) => x.try_mean(a)?,
                (Red::Mean, true) => x.try_mean_keepdim(a)?,
                (Red::Var, false) => x.try_var(a, 1)?,
                (Red::Var, true) => x.try_var_keepdim(a, 1)?,
                (Red::Logsumexp, false) => x.try_logsumexp(a)?,
                (Red::Logsumexp, true) => x.try_logsumexp_keepdim(a)?,
            }
        }
        Step::Matmul(a, b) => t[*a].try_matmul(&t[*b])?,
        Step::Reshape(x, s) => t[*x].try_reshape(s)?,
        Step::Permute(x, p) => t[*x].try_permute(p)?,
        Step::Expand {
            x,
            unsqueeze,
            shape,
        } => match unsqueeze {
            Some(d) => t[*x].try_unsqueeze(*d)?.try_broadcast_to(shape)?,
            None => t[*x].try_broadcast_to(shape)?,
        },
        Step::Slice(x, r) => t[*x].try_slice(r)?,
        Step::Pad(x, p, v) => t[*x].try_pad(p, *v)?,
        Step::Flip(x, a) => t[*x].try_flip(a)?,
        Step::Contiguous(x) => t[*x].try_contiguous()?,
        Step::Gather { x, dim, index } => t[*x].try_gather(*dim, &t[*index])?,
        Step::ScatterAdd { x, dim, index, src } => {
            t[*x].try_scatter_add(*dim, &t[*index], &t[*src])?
        }
        Step::ScatterReduce {
            x,
            dim,
            index,
            src,
            reduce,
            include_self,
        } => t[*x].try_scatter_reduce(*dim, &t[*index], &t[*src], reduce, *include_self)?,
        Step::Scatter { x, dim, index, src } => t[*x].try_scatter(*dim, &t[*index], &t[*src])?,
        Step::Cumsum(x, d) => t[*x].try_cumsum(*d)?,
        Step::Cumprod(x, d) => t[*x].try_cumprod(*d)?,
        Step::Softmax(x, d) => t[*x].try_softmax(*d)?,
        Step::LogSoftmax(x, d) => t[*x].try_log_softmax(*d)?,
        Step::LayerNorm { x, dims, w, b } => {
            let s = t[*x].shape();
            let norm = s[s.len() - dims..].to_vec();
            t[*x].try_layer_norm(&norm, w.map(|i| &t[i]), b.map(|i| &t[i]), 1e-5)?
        }
        Step::CrossEntropy {
            x,
            targets,
            weight,
            opts,
        } => {
            let opts = CrossEntropyOptions {
                weight: weight.map(|w| t[w].clone()),
                ..opts.clone()
            };
            kiln::nn::functional::cross_entropy_with(&t[*x], &t[*targets], &opts)?
        }
        Step::Cat(xs, d) => {
            let refs: Vec<&Tensor> = xs.iter().map(|&i| &t[i]).collect();
            Tensor::try_cat(&refs, *d)?
        }
        Step::Realize(x) => {
            if let Some(o) = realize {
                t[*x].realize_with(o)?;
            }
            t[*x].clone()
        }
    })
}

/// Builds every node of `p` as a tensor. Leaves come from `leaves` (in order).
fn emit(
    p: &Program,
    leaves: &[Tensor],
    realize: Option<&RealizeOptions>,
) -> kiln::Result<Vec<Tensor>> {
    let mut t: Vec<Tensor> = Vec::with_capacity(p.nodes.len());
    let mut next_leaf = 0;
    for n in &p.nodes {
        let v = match n {
            Node::Leaf { .. } => {
                next_leaf += 1;
                leaves[next_leaf - 1].clone()
            }
            Node::Const { data, shape, dtype } => float_tensor(data, shape, *dtype),
            Node::Index { data, shape } => Tensor::from_vec(data.clone(), shape),
            Node::Op(s) => apply(s, &t, realize)?,
        };
        t.push(v);
    }
    Ok(t)
}

/// `Σ_k Σ w_k ⊙ t[outs[k]]`.
fn loss_of(p: &Program, t: &[Tensor]) -> kiln::Result<Tensor> {
    let mut loss: Option<Tensor> = None;
    for (&o, w) in p.outs.iter().zip(&p.weights) {
        let v = &t[o];
        let term = v
            .try_binary_op(BinaryOp::Mul, float_tensor(w, v.shape(), v.dtype()))?
            .try_sum(..)?;
        loss = Some(match loss {
            Some(l) => l.try_binary_op(BinaryOp::Add, &term)?,
            None => term,
        });
    }
    loss.ok_or_else(|| kiln::KilnError::InvalidArgument {
        op: "grad_fuzz",
        shape: vec![],
        reason: "a program without outputs".into(),
    })
}

// ---------------------------------------------------------------------------------------
// Repro printing

fn fmt_f(v: f64, dtype: DType) -> String {
    if dtype == DType::F32 {
        format!("{:?}f32", v as f32)
    } else {
        format!("{v:?}f64")
    }
}

fn fmt_shape(s: &[usize]) -> String {
    if s.is_empty() {
        "Vec::<usize>::new()".into()
    } else {
        format!("{s:?}")
    }
}

fn fmt_isizes(v: &[isize]) -> String {
    format!(
        "vec![{}]",
        v.iter()
            .map(|a| format!("{a}isize"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn fmt_data(data: &[f64], dtype: DType) -> String {
    data.iter()
        .map(|&v| fmt_f(v, dtype))
        .collect::<Vec<_>>()
        .join(", ")
}

fn step_rust(s: &Step, shape_of: &dyn Fn(usize) -> Vec<usize>) -> String {
    let v = |i: &usize| format!("v{i}");
    match s {
        Step::Unary(u, x) => format!("{}.unary_op(UnaryOp::{u:?})", v(x)),
        Step::Binary(b, x, y) => format!("{}.binary_op(BinaryOp::{b:?}, &{})", v(x), v(y)),
        Step::Scalar { op, x, c, left } => match (op, left) {
            (BinaryOp::Sub, true) => format!("{}.rsub({c:?}f64)", v(x)),
            (BinaryOp::Div, true) => format!("{}.rdiv({c:?}f64)", v(x)),
            (BinaryOp::Pow, true) => format!("{}.rpow({c:?}f64)", v(x)),
            _ => format!("{}.binary_op(BinaryOp::{op:?}, {c:?}f64)", v(x)),
        },
        Step::Where { c, t, a, b } => {
            format!(
                "Tensor::where_(&{}.gt({t:?}f64), &{}, &{})",
                v(c),
                v(a),
                v(b)
            )
        }
        Step::MaskedSelect { x, c, t } => {
            format!("{}.masked_select(&{}.gt({t:?}f64))", v(x), v(c))
        }
        Step::MaskedScatter { x, c, t, src } => format!(
            "{}.masked_scatter(&{}.gt({t:?}f64), &{})",
            v(x),
            v(c),
            v(src)
        ),
        Step::IndexPut {
            x,
            index,
            values,
            accumulate,
        } => format!(
            "{}.index_put(&[&{}], &{}, {accumulate})",
            v(x),
            v(index),
            v(values)
        ),
        Step::Subscript { x, entries } => format!(
            "{}.i(vec![{}])",
            v(x),
            entries
                .iter()
                .map(|e| match e {
                    Sub::At(i) => format!("Index::At({i})"),
                    Sub::Slice(a, b, s) => {
                        format!("Index::Slice {{ start: {a:?}, end: {b:?}, step: {s} }}")
                    }
                    Sub::New => "Index::NewAxis".into(),
                    Sub::Ellipsis => "Index::Ellipsis".into(),
                    Sub::Ints(i) => format!("Index::Tensor({}.clone())", v(i)),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Step::Mode { x, dim, keepdim } => format!("{}.mode({dim}, {keepdim}).0", v(x)),
        Step::Cast(x, d) => format!("{}.cast(DType::{d:?})", v(x)),
        Step::Reduce {
            red,
            x,
            axes,
            keepdim,
        } => {
            let k = if *keepdim { "_keepdim" } else { "" };
            let extra = if *red == Red::Var { ", 1" } else { "" };
            format!(
                "{}.{}{k}({}{extra})",
                v(x),
                red_name(*red),
                fmt_isizes(axes)
            )
        }
        Step::Matmul(a, b) => format!("{}.matmul(&{})", v(a), v(b)),
        Step::Reshape(x, s) => format!("{}.reshape({})", v(x), fmt_isizes(s)),
        Step::Permute(x, p) => format!("{}.permute({})", v(x), fmt_isizes(p)),
        Step::Expand {
            x,
            unsqueeze,
            shape,
        } => match unsqueeze {
            Some(d) => format!("{}.unsqueeze({d}).expand({})", v(x), fmt_shape(shape)),
            None => format!("{}.expand({})", v(x), fmt_shape(shape)),
        },
        Step::Slice(x, r) => format!("{}.slice(&{r:?})", v(x)),
        Step::Pad(x, p, val) => format!("{}.pad(&{p:?}, {val:?}f64)", v(x)),
        Step::Flip(x, a) => format!("{}.flip({})", v(x), fmt_isizes(a)),
        Step::Contiguous(x) => format!("{}.contiguous()", v(x)),
        Step::Gather { x, dim, index } => format!("{}.gather({dim}, &{})", v(x), v(index)),
        Step::ScatterAdd { x, dim, index, src } => {
            format!("{}.scatter_add({dim}, &{}, &{})", v(x), v(index), v(src))
        }
        Step::ScatterReduce {
            x,
            dim,
            index,
            src,
            reduce,
            include_self,
        } => format!(
            "{}.scatter_reduce({dim}, &{}, &{}, {reduce:?}, {include_self})",
            v(x),
            v(index),
            v(src)
        ),
        Step::Scatter { x, dim, index, src } => {
            format!("{}.scatter({dim}, &{}, &{})", v(x), v(index), v(src))
        }
        Step::Cumsum(x, d) => format!("{}.cumsum({d})", v(x)),
        Step::Cumprod(x, d) => format!("{}.cumprod({d})", v(x)),
        Step::Softmax(x, d) => format!("{}.softmax({d})", v(x)),
        Step::LogSoftmax(x, d) => format!("{}.log_softmax({d})", v(x)),
        Step::LayerNorm { x, dims, w, b } => {
            let s = shape_of(*x);
            let opt = |o: &Option<usize>| match o {
                Some(i) => format!("Some(&{})", v(i)),
                None => "None".into(),
            };
            format!(
                "{}.layer_norm(&{:?}, {}, {}, 1e-5)",
                v(x),
                &s[s.len() - dims..],
                opt(w),
                opt(b)
            )
        }
        Step::CrossEntropy {
            x,
            targets,
            weight,
            opts,
        } => format!(
            "kiln::nn::functional::cross_entropy_with(&{}, &{}, &kiln::nn::functional::CrossEntropyOptions {{ weight: {}, ignore_index: {:?}, reduction: kiln::nn::functional::Reduction::{:?}, label_smoothing: {:?} }}).unwrap()",
            v(x),
            v(targets),
            weight.map_or("None".to_string(), |w| format!("Some({}.clone())", v(&w))),
            opts.ignore_index,
            opts.reduction,
            opts.label_smoothing
        ),
        Step::Cat(xs, d) => format!(
            "Tensor::cat(&[{}], {d})",
            xs.iter()
                .map(|i| format!("&{}", v(i)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Step::Realize(x) => format!("{{ {}.realize().unwrap(); {}.clone() }}", v(x), v(x)),
    }
}

/// The program as Rust code (a test body).
fn rust(p: &Program, shapes: &[Vec<usize>]) -> String {
    let mut s = String::new();
    let shape_of = |i: usize| shapes[i].clone();
    for (i, n) in p.nodes.iter().enumerate() {
        let rhs = match n {
            Node::Leaf { data, shape, dtype } => format!(
                "Tensor::from_vec(vec![{}], {}).requires_grad_(true)",
                fmt_data(data, *dtype),
                fmt_shape(shape)
            ),
            Node::Const { data, shape, dtype } => format!(
                "Tensor::from_vec(vec![{}], {})",
                fmt_data(data, *dtype),
                fmt_shape(shape)
            ),
            Node::Index { data, shape } => format!(
                "Tensor::from_vec(vec![{}], {})",
                data.iter()
                    .map(|v| format!("{v}i64"))
                    .collect::<Vec<_>>()
                    .join(", "),
                fmt_shape(shape)
            ),
            Node::Op(step) => step_rust(step, &shape_of),
        };
        let _ = writeln!(s, "let v{i} = {rhs};");
    }
    let terms: Vec<String> = p
        .outs
        .iter()
        .zip(&p.weights)
        .map(|(&o, w)| {
            let d = if p.nodes.get(o).is_some() {
                shapes[o].clone()
            } else {
                vec![]
            };
            let dtype = DType::F64;
            format!(
                "(&v{o} * &Tensor::from_vec(vec![{}], {}).cast(v{o}.dtype())).sum(..)",
                fmt_data(w, dtype),
                fmt_shape(&d)
            )
        })
        .collect();
    let _ = writeln!(s, "let loss = {};", terms.join(" + "));
    let leaves = p.leaves();
    let _ = writeln!(
        s,
        "let want = kiln::reference::grad::gradients(&loss, None, &[{}]).unwrap();",
        leaves
            .iter()
            .map(|i| format!("&v{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(s, "loss.backward().unwrap();");
    for (k, i) in leaves.iter().enumerate() {
        let _ = writeln!(
            s,
            "println!(\"v{i}: kiln {{:?}}\\n    reference {{:?}}\", v{i}.grad().map(|g| g.to_vec::<f64>().unwrap()), want[{k}].to_f64());"
        );
    }
    s
}

// ---------------------------------------------------------------------------------------
// Generation

/// Built tensors (no history) and reference values of every node so far.
struct Builder {
    p: Program,
    t: Vec<Tensor>,
    v: Vec<RefTensor>,
    /// Per node: its value is the same bits in every correct evaluation (see [`exact`]).
    exact: Vec<bool>,
    f64_only: bool,
    /// No exact ties between independent values in `scatter_reduce`'s `amax`/`amin` (no
    /// derivative exists there) and no exact zeros in its products (a perturbed zero's sign
    /// decides later kinks, such as a remainder's): for the finite-difference check.
    fd_safe: bool,
}

/// The most any value may hold in magnitude.
const LIMIT: f64 = 20.0;
/// The largest tensor a step may produce.
const MAX_NUMEL: usize = 72;

fn float_of(r: &RefTensor) -> Vec<f64> {
    r.to_f64()
}

impl Builder {
    fn len(&self) -> usize {
        self.p.nodes.len()
    }

    fn truncate(&mut self, n: usize) {
        self.p.nodes.truncate(n);
        self.t.truncate(n);
        self.v.truncate(n);
        self.exact.truncate(n);
    }

    fn shape(&self, i: usize) -> &[usize] {
        &self.v[i].shape
    }

    fn is_float(&self, i: usize) -> bool {
        self.v[i].dtype.is_float()
    }

    fn vals(&self, i: usize) -> Vec<f64> {
        float_of(&self.v[i])
    }

    /// Adds a node (built without history, evaluated by the reference); `None` when it
    /// fails to build or its values leave the conditioned range.
    fn push(&mut self, n: Node) -> Option<usize> {
        let t = no_grad(|| -> kiln::Result<Tensor> {
            Ok(match &n {
                Node::Leaf { data, shape, dtype } | Node::Const { data, shape, dtype } => {
                    float_tensor(data, shape, *dtype)
                }
                Node::Index { data, shape } => Tensor::from_vec(data.clone(), shape.as_slice()),
                Node::Op(s) => apply(s, &self.t, None)?,
            })
        });
        let t = match t {
            Ok(t) => t,
            Err(e) => {
                if std::env::var_os("KILN_GRAD_FUZZ_PRINT").is_some() {
                    eprintln!("generator: {n:?} refused: {e}");
                }
                return None;
            }
        };
        let v = reference::evaluate(&t).ok()?;
        if v.dtype.is_float() {
            let n = v.to_f64();
            if n.len() > MAX_NUMEL || n.iter().any(|x| !x.is_finite() || x.abs() > LIMIT) {
                return None;
            }
            if self.f64_only && v.dtype != DType::F64 {
                return None;
            }
        }
        let ex = match &n {
            Node::Op(s) => exact(s, &self.exact),
            _ => true,
        };
        self.p.nodes.push(n);
        self.t.push(t);
        self.v.push(v);
        self.exact.push(ex);
        Some(self.len() - 1)
    }

    /// A float value, recent ones more likely.
    fn pick_float(&self, rng: &mut Rng) -> Option<usize> {
        let fl: Vec<usize> = (0..self.len()).filter(|&i| self.is_float(i)).collect();
        if fl.is_empty() {
            return None;
        }
        Some(if rng.chance(0.5) {
            fl[fl.len() - 1]
        } else {
            fl[rng.below(fl.len())]
        })
    }

    fn leaf_dtype(&self, rng: &mut Rng) -> DType {
        if self.f64_only || rng.chance(0.5) {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// A leaf of `shape` with `like`'s dtype, values uniform in `[-2, 2)`.
    fn leaf_like(&mut self, rng: &mut Rng, like: usize, shape: Vec<usize>) -> Option<usize> {
        let dtype = self.v[like].dtype;
        let data = (0..shape.iter().product::<usize>())
            .map(|_| {
                let v = rng.range(-2.0, 2.0);
                if dtype == DType::F32 {
                    v as f32 as f64
                } else {
                    v
                }
            })
            .collect();
        self.push(Node::Leaf { data, shape, dtype })
    }

    fn leaf(&mut self, rng: &mut Rng, shape: Vec<usize>, positive: bool) -> Option<usize> {
        let dtype = self.leaf_dtype(rng);
        let n: usize = shape.iter().product();
        let quantized = !self.f64_only && !positive && rng.chance(0.2);
        let data: Vec<f64> = (0..n)
            .map(|_| {
                if positive {
                    rng.range(0.3, 2.0)
                } else if quantized {
                    rng.int(0, 6) as f64 * 0.5 - 1.5
                } else {
                    rng.range(-2.0, 2.0)
                }
            })
            .collect();
        let data = if dtype == DType::F32 {
            data.iter().map(|&v| v as f32 as f64).collect()
        } else {
            data
        };
        self.push(Node::Leaf { data, shape, dtype })
    }
}

/// Whether `s`'s value is the same bits in every correct evaluation, given which operands
/// are (`e`): leaves and constants are; movement ops, casts, `where`, gathers and copies
/// keep their operands' exactness; ops the op table calls `exact` (IEEE-correctly rounded:
/// `+ - * /`, sqrt, neg, abs, maximum, …), max/min reductions and the max/min and copying
/// scatters are exact over exact operands; sums, products of many terms, matmuls, scans
/// and transcendentals are not (their order and rounding differ between kiln's kernels and
/// the reference). Exact ties and exact zeros are allowed only between exact values: a
/// reduction that cancels to 0, or two sums that both give 1, may differ in the last bit.
fn exact(s: &Step, e: &[bool]) -> bool {
    // `where`'s condition keeps a margin from its threshold: only the picked values count.
    if let Step::Where { a, b, .. } = s {
        return e[*a] && e[*b];
    }
    s.operands().iter().all(|&i| e[i])
        && match s {
            Step::Unary(u, _) => u.info().exact,
            Step::Binary(op, ..) | Step::Scalar { op, .. } => op.info().exact,
            Step::Reduce { red, .. } => matches!(red, Red::Max | Red::Min),
            Step::ScatterReduce { reduce, .. } => matches!(*reduce, "amax" | "amin"),
            Step::IndexPut { accumulate, .. } => !accumulate,
            Step::Matmul(..)
            | Step::ScatterAdd { .. }
            | Step::Cumsum(..)
            | Step::Cumprod(..)
            | Step::Softmax(..)
            | Step::LogSoftmax(..)
            | Step::LayerNorm { .. }
            | Step::CrossEntropy { .. } => false,
            // Movement ops, casts, gathers, copies, joins and realizes copy values.
            _ => true,
        }
}

/// Whether node `x` is, or is computed from, a cross entropy. Realizing such a value
/// realizes the composite's forward ops, which record no history, so the reference could
/// not differentiate through them afterwards.
fn after_cross_entropy(b: &Builder, x: usize) -> bool {
    let mut stack = vec![x];
    let mut seen = vec![false; b.p.nodes.len()];
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        if let Node::Op(s) = &b.p.nodes[i] {
            if matches!(s, Step::CrossEntropy { .. }) {
                return true;
            }
            stack.extend(s.operands());
        }
    }
    false
}

fn random_shape(rng: &mut Rng) -> Vec<usize> {
    let rank = rng.pick(&[0, 1, 1, 2, 2, 2, 3, 3, 4]);
    let mut s: Vec<usize> = (0..rank).map(|_| rng.int(1, 4)).collect();
    while s.iter().product::<usize>() > 36 {
        let d = rng.below(s.len());
        s[d] = (s[d] / 2).max(1);
    }
    s
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = flat % shape[d].max(1);
        flat /= shape[d].max(1);
    }
    c
}

/// The flat index of `c` (an index into a broadcast of `shape`, right-aligned) in `shape`.
fn ravel_broadcast(c: &[usize], shape: &[usize]) -> usize {
    let off = c.len() - shape.len();
    let mut flat = 0;
    for (d, &n) in shape.iter().enumerate() {
        flat = flat * n + if n == 1 { 0 } else { c[off + d] };
    }
    flat
}

fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// Every pair `(x, y)` a broadcast binary op sees.
fn pairs(xv: &[f64], xs: &[usize], yv: &[f64], ys: &[usize]) -> Option<Vec<(f64, f64)>> {
    let s = broadcast(xs, ys)?;
    let n: usize = s.iter().product();
    Some(
        (0..n)
            .map(|f| {
                let c = unravel(f, &s);
                (xv[ravel_broadcast(&c, xs)], yv[ravel_broadcast(&c, ys)])
            })
            .collect(),
    )
}

/// The margin kept from kinks, thresholds and near-ties, relative to `1 + |x|`.
const MARGIN: f64 = 2e-3;

/// `f` is defined, smooth and moderately sloped around `x`, or `x` is an exact 0 (see
/// [`exact`]), where every implementation applies the same convention (`relu'(0) = 0`,
/// `ceil(0) = 0`). A 0 that is not exact is probed like any other value: a sum that cancels
/// to 0 in the reference may be `±1e-9` in kiln, on the far side of a kink or a jump.
fn smooth_at(f: &dyn Fn(f64) -> f64, x: f64, exact: bool) -> bool {
    let h = MARGIN * (1.0 + x.abs());
    let (l, m, r) = (f(x - h), f(x), f(x + h));
    if !(l.is_finite() && m.is_finite() && r.is_finite()) {
        return false;
    }
    if x == 0.0 && exact {
        return true;
    }
    let (sl, sr) = ((m - l) / h, (r - m) / h);
    sl.abs() <= MAX_SLOPE
        && sr.abs() <= MAX_SLOPE
        && (sl - sr).abs() <= 0.1 * (1.0 + sl.abs() + sr.abs())
}

/// The steepest slope a conditioned op may have at its operands.
const MAX_SLOPE: f64 = 60.0;

fn unary_ok(u: UnaryOp, xs: &[f64], exact: bool) -> bool {
    xs.iter()
        .all(|&x| smooth_at(&|t| u.apply::<f64>(t), x, exact))
}

/// Every pair `(x, y)` is a conditioned operand pair of `b`; `exact` says which operands
/// are [`exact`] values.
fn binary_ok(b: BinaryOp, ps: &[(f64, f64)], (ex, ey): (bool, bool)) -> bool {
    let f = |x: f64, y: f64| match b.apply::<f64>(x, y) {
        kiln::ops::Applied::Value(v) => v,
        kiln::ops::Applied::Bool(_) => f64::NAN,
    };
    ps.iter().all(|&(x, y)| {
        if b == BinaryOp::Pow && x <= 0.1 {
            return false;
        }
        // atan2(x, y) jumps by 2π across the negative `y` axis (by the sign of a zero `x`
        // on it) and has no derivative at the origin: keep clear of both.
        if b == BinaryOp::Atan2 && x.abs() < 0.05 && y < 0.05 {
            return false;
        }
        // d/dy of `x mod y` is `-floor(x / y)` (or `-trunc`): steep where `y` is small
        // against `x`, yet the remainder stays below `|y|`, so the probes below, a
        // `MARGIN` apart, miss it once `|y|` is under the margin.
        if matches!(b, BinaryOp::Remainder | BinaryOp::Fmod) && x.abs() > MAX_SLOPE * y.abs() {
            return false;
        }
        // An exact tie (x op x) is smooth for every op but atan2 (whose tie at the origin
        // is where it jumps, by the zeros' signs), or follows the tie rule; only between
        // exact values is it a tie in every evaluation.
        let tie = x == y && ex && ey && b != BinaryOp::Atan2;
        (tie || (smooth_at(&|t| f(t, y), x, ex) && smooth_at(&|t| f(x, t), y, ey))) && {
            let v = f(x, y);
            v.is_finite()
        }
    })
}

/// Groups of `shape`'s elements along `axes` (flat indices per group).
fn groups(shape: &[usize], axes: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let mut keyed: Vec<(Vec<usize>, usize)> = (0..n)
        .map(|f| {
            let mut c = unravel(f, shape);
            for &a in axes {
                c[a] = 0;
            }
            (c, f)
        })
        .collect();
    keyed.sort();
    let mut out: Vec<Vec<usize>> = vec![];
    let mut last: Option<Vec<usize>> = None;
    for (k, f) in keyed {
        if last.as_ref() != Some(&k) {
            out.push(vec![]);
            last = Some(k);
        }
        if let Some(g) = out.last_mut() {
            g.push(f);
        }
    }
    out
}

/// The winner of each group is either clear of the runner-up or (where `ties` allows:
/// exact values) tied with it exactly.
fn clear_extremes(vals: &[f64], gs: &[Vec<usize>], max: bool, ties: bool) -> bool {
    gs.iter().all(|g| {
        let v: Vec<f64> = g.iter().map(|&i| vals[i]).collect();
        clear_winner(&v, max, ties)
    })
}

/// The largest (`max`) or smallest of `vals` is clear of the runner-up, or (where `ties`
/// allows) tied with it exactly.
fn clear_winner(vals: &[f64], max: bool, ties: bool) -> bool {
    let mut v = vals.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if max {
        v.reverse();
    }
    let Some(&best) = v.first() else {
        return true;
    };
    if !ties && v.get(1) == Some(&best) {
        return false;
    }
    match v.iter().find(|&&x| x != best) {
        Some(&next) => (best - next).abs() > MARGIN * (1.0 + best.abs()),
        None => true,
    }
}

fn random_axes(rng: &mut Rng, rank: usize) -> Vec<usize> {
    let mut axes: Vec<usize> = (0..rank).filter(|_| rng.chance(0.5)).collect();
    if axes.is_empty() {
        axes.push(rng.below(rank));
    }
    axes
}

fn signed_axis(rng: &mut Rng, d: usize, rank: usize) -> isize {
    if rng.chance(0.3) {
        d as isize - rank as isize
    } else {
        d as isize
    }
}

/// A shape of `n` elements in 1–4 dimensions.
fn factor_shape(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut primes = vec![];
    let mut m = n;
    let mut p = 2;
    while m > 1 {
        while m.is_multiple_of(p) {
            primes.push(p);
            m /= p;
        }
        p += 1;
    }
    let rank = rng.int(1, 4);
    let mut s = vec![1usize; rank];
    for q in primes {
        let d = rng.below(rank);
        s[d] *= q;
    }
    s
}

/// A shape that broadcasts against `s`: some dimensions set to 1, maybe leading ones
/// dropped.
fn broadcastable(rng: &mut Rng, s: &[usize]) -> Vec<usize> {
    let drop = if s.is_empty() {
        0
    } else {
        rng.below(s.len() + 1)
    };
    s[drop..]
        .iter()
        .map(|&n| if rng.chance(0.35) { 1 } else { n })
        .collect()
}

/// Tries one random step; `None` (after which the caller truncates) when it does not fit.
fn propose(rng: &mut Rng, b: &mut Builder) -> Option<()> {
    let x = b.pick_float(rng)?;
    let xs = b.shape(x).to_vec();
    let rank = xs.len();
    let xv = b.vals(x);
    let kind = rng.below(116);
    let step = match kind {
        // Unary ops, every one of the table.
        0..=17 => {
            let u = rng.pick(UnaryOp::ALL);
            if !unary_ok(u, &xv, b.exact[x]) {
                return None;
            }
            Step::Unary(u, x)
        }
        // Binary ops on two tensors (broadcasting).
        18..=31 => {
            let ops: Vec<BinaryOp> = BinaryOp::ALL
                .iter()
                .copied()
                .filter(|o| !o.is_comparison())
                .collect();
            let op = rng.pick(&ops);
            let cands: Vec<usize> = (0..b.len())
                .filter(|&i| b.is_float(i) && broadcast(&xs, b.shape(i)).is_some())
                .collect();
            let y = if !cands.is_empty() && rng.chance(0.6) {
                rng.pick(&cands)
            } else {
                let s = broadcastable(rng, &xs);
                let positive = op == BinaryOp::Pow && rng.chance(0.5);
                b.leaf(rng, s, positive)?
            };
            let (l, r) = if rng.chance(0.5) { (x, y) } else { (y, x) };
            let ps = pairs(&b.vals(l), b.shape(l), &b.vals(r), b.shape(r))?;
            if !binary_ok(op, &ps, (b.exact[l], b.exact[r])) {
                return None;
            }
            Step::Binary(op, l, r)
        }
        // With a scalar, on either side.
        32..=38 => {
            let op = rng.pick(&[
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Pow,
                BinaryOp::Max,
                BinaryOp::Min,
            ]);
            let left =
                matches!(op, BinaryOp::Sub | BinaryOp::Div | BinaryOp::Pow) && rng.chance(0.5);
            let c = match (op, left) {
                (BinaryOp::Pow, false) => rng.pick(&[2.0, 3.0, 0.5, 1.5, -1.0, -0.5]),
                (BinaryOp::Pow, true) => rng.pick(&[0.5, 1.5, 2.0, 3.0]),
                (BinaryOp::Div, false) => rng.pick(&[0.5, -2.0, 3.0, 0.25]),
                _ => (rng.range(-2.0, 2.0) * 4.0).round() / 4.0,
            };
            let ps: Vec<(f64, f64)> = xv
                .iter()
                .map(|&v| if left { (c, v) } else { (v, c) })
                .collect();
            let ex = if left {
                (true, b.exact[x])
            } else {
                (b.exact[x], true)
            };
            if !binary_ok(op, &ps, ex) {
                return None;
            }
            Step::Scalar { op, x, c, left }
        }
        // where(c > t, a, b).
        39..=42 => {
            let cands: Vec<usize> = (0..b.len())
                .filter(|&i| b.is_float(i) && b.shape(i) == xs.as_slice())
                .collect();
            let c = rng.pick(&cands);
            let cv = b.vals(c);
            let t = cv[rng.below(cv.len())] + rng.range(-0.3, 0.3);
            if cv
                .iter()
                .any(|&v| (v - t).abs() <= MARGIN * (1.0 + t.abs()))
            {
                return None;
            }
            let others: Vec<usize> = (0..b.len())
                .filter(|&i| b.is_float(i) && broadcast(&xs, b.shape(i)).is_some())
                .collect();
            let o = rng.pick(&others);
            let (a, bb) = if rng.chance(0.5) { (x, o) } else { (o, x) };
            Step::Where { c, t, a, b: bb }
        }
        43..=45 => {
            if b.f64_only {
                return None;
            }
            let d = if b.v[x].dtype == DType::F32 {
                DType::F64
            } else {
                DType::F32
            };
            Step::Cast(x, d)
        }
        // Reductions.
        46..=55 => {
            if rank == 0 {
                return None;
            }
            let red = rng.pick(&[
                Red::Sum,
                Red::Sum,
                Red::Prod,
                Red::Max,
                Red::Max,
                Red::Min,
                Red::Mean,
                Red::Var,
                Red::Logsumexp,
            ]);
            let axes = random_axes(rng, rank);
            let gs = groups(&xs, &axes);
            let ok = match red {
                Red::Max | Red::Min => clear_extremes(&xv, &gs, red == Red::Max, b.exact[x]),
                Red::Prod => gs[0].len() <= 6 && xv.iter().all(|v| v.abs() <= 3.0),
                Red::Var => gs[0].len() >= 2,
                _ => true,
            };
            if !ok {
                return None;
            }
            Step::Reduce {
                red,
                x,
                axes: axes.iter().map(|&a| signed_axis(rng, a, rank)).collect(),
                keepdim: rng.chance(0.4),
            }
        }
        // Matmul: x @ new, new @ x, x @ xᵀ.
        56..=61 => {
            if rank == 0 {
                return None;
            }
            let k = xs[rank - 1];
            match rng.below(3) {
                0 => {
                    let n = rng.int(1, 4);
                    let mut s = vec![k, n];
                    if rank >= 3 && rng.chance(0.5) {
                        s = xs[..rank - 2].iter().copied().chain([k, n]).collect();
                    } else if rng.chance(0.2) {
                        s = vec![k];
                    }
                    let y = b.leaf(rng, s, false)?;
                    Step::Matmul(x, y)
                }
                1 if rank >= 2 => {
                    let m = xs[rank - 2];
                    let rows = rng.int(1, 4);
                    let y = b.leaf(rng, vec![rows, m], false)?;
                    Step::Matmul(y, x)
                }
                _ if rank >= 2 => {
                    let mut p: Vec<isize> = (0..rank as isize).collect();
                    p.swap(rank - 1, rank - 2);
                    let t = b.push(Node::Op(Step::Permute(x, p)))?;
                    Step::Matmul(x, t)
                }
                _ => return None,
            }
        }
        62..=65 => {
            let n: usize = xs.iter().product();
            let s = factor_shape(rng, n);
            let mut s: Vec<isize> = s.iter().map(|&d| d as isize).collect();
            if rng.chance(0.2) {
                let d = rng.below(s.len());
                s[d] = -1;
            }
            Step::Reshape(x, s)
        }
        66..=69 => {
            if rank < 2 {
                return None;
            }
            let mut p: Vec<isize> = (0..rank as isize).collect();
            for i in (1..rank).rev() {
                p.swap(i, rng.below(i + 1));
            }
            Step::Permute(x, p)
        }
        70..=73 => {
            let ones: Vec<usize> = (0..rank).filter(|&d| xs[d] == 1).collect();
            if !ones.is_empty() && rng.chance(0.6) {
                let mut s = xs.clone();
                for d in ones {
                    if rng.chance(0.7) {
                        s[d] = rng.int(2, 3);
                    }
                }
                Step::Expand {
                    x,
                    unsqueeze: None,
                    shape: s,
                }
            } else {
                let d = rng.below(rank + 1);
                let mut s = xs.clone();
                s.insert(d, rng.int(2, 3));
                Step::Expand {
                    x,
                    unsqueeze: Some(d as isize),
                    shape: s,
                }
            }
        }
        74..=78 => {
            if rank == 0 {
                return None;
            }
            let r: Vec<(isize, isize, isize)> = xs
                .iter()
                .map(|&n| {
                    if rng.chance(0.3) {
                        return (0, n as isize, 1);
                    }
                    let start = rng.below(n);
                    let end = rng.int(start + 1, n);
                    let step = rng.int(1, 3);
                    (start as isize, end as isize, step as isize)
                })
                .collect();
            Step::Slice(x, r)
        }
        79..=82 => {
            if rank == 0 {
                return None;
            }
            let p: Vec<(usize, usize)> = (0..rank)
                .map(|_| {
                    if rng.chance(0.5) {
                        (rng.int(0, 2), rng.int(0, 2))
                    } else {
                        (0, 0)
                    }
                })
                .collect();
            let v = if rng.chance(0.5) {
                0.0
            } else {
                rng.pick(&[0.5, -1.0, 1.25])
            };
            Step::Pad(x, p, v)
        }
        83..=85 => {
            if rank == 0 {
                return None;
            }
            let a: Vec<isize> = random_axes(rng, rank)
                .into_iter()
                .map(|a| signed_axis(rng, a, rank))
                .collect();
            Step::Flip(x, a)
        }
        86 => Step::Contiguous(x),
        // Gather and scatter_add with random (often repeated) indices.
        87..=88 => {
            if rank == 0 {
                return None;
            }
            let dim = rng.below(rank);
            let s = index_shape(rng, &xs, dim);
            let count: usize = s.iter().product();
            let data = (0..count).map(|_| rng.below(xs[dim]) as i64).collect();
            let index = b.push(Node::Index { data, shape: s })?;
            if rng.chance(0.5) {
                Step::Gather {
                    x,
                    dim: signed_axis(rng, dim, rank),
                    index,
                }
            } else {
                let is = b.shape(index).to_vec();
                let src = b.leaf(rng, is, false)?;
                Step::ScatterAdd {
                    x,
                    dim: signed_axis(rng, dim, rank),
                    index,
                    src,
                }
            }
        }
        // Scans; cumprod often sees exact zeros through a mask.
        89..=91 => {
            if rank == 0 {
                return None;
            }
            let dim = rng.below(rank);
            let d = signed_axis(rng, dim, rank);
            if rng.chance(0.5) {
                Step::Cumsum(x, d)
            } else {
                if xs[dim] > 6 || xv.iter().any(|v| v.abs() > 3.0) {
                    return None;
                }
                let x = if rng.chance(0.5) {
                    let n = xv.len();
                    let data = (0..n)
                        .map(|_| if rng.chance(0.3) { 0.0 } else { 1.0 })
                        .collect();
                    let dtype = b.v[x].dtype;
                    let m = b.push(Node::Const {
                        data,
                        shape: xs.clone(),
                        dtype,
                    })?;
                    b.push(Node::Op(Step::Binary(BinaryOp::Mul, x, m)))?
                } else {
                    x
                };
                Step::Cumprod(x, d)
            }
        }
        // Composites.
        92..=93 => {
            if rank == 0 {
                return None;
            }
            let a = rng.below(rank);
            let d = signed_axis(rng, a, rank);
            if rng.chance(0.5) {
                Step::Softmax(x, d)
            } else {
                Step::LogSoftmax(x, d)
            }
        }
        94 => {
            if rank == 0 {
                return None;
            }
            let dims = rng.int(1, rank.min(2));
            let axes: Vec<usize> = (rank - dims..rank).collect();
            let gs = groups(&xs, &axes);
            let var_ok = gs.iter().all(|g| {
                let n = g.len() as f64;
                let mean = g.iter().map(|&i| xv[i]).sum::<f64>() / n;
                let var = g.iter().map(|&i| (xv[i] - mean).powi(2)).sum::<f64>() / n;
                var > 0.05
            });
            if !var_ok {
                return None;
            }
            let norm = xs[rank - dims..].to_vec();
            let w = if rng.chance(0.6) {
                Some(b.leaf(rng, norm.clone(), false)?)
            } else {
                None
            };
            let bias = if rng.chance(0.6) {
                Some(b.leaf(rng, norm, false)?)
            } else {
                None
            };
            Step::LayerNorm {
                x,
                dims,
                w,
                b: bias,
            }
        }
        95 => {
            if rank < 2 || xs[rank - 1] < 2 {
                return None;
            }
            let ts = xs[..rank - 1].to_vec();
            let count: usize = ts.iter().product();
            let classes = xs[rank - 1];
            // Options: PyTorch's defaults, an in-range ignored class (a padding token) or
            // none; each reduction; label smoothing or not.
            let ignore = match rng.below(3) {
                0 => Some(-100),
                1 => Some(rng.below(classes) as i64),
                _ => None,
            };
            let reduction = [Reduction::Mean, Reduction::Sum, Reduction::None][rng.below(3)];
            let label_smoothing = if rng.chance(0.3) { 0.2 } else { 0.0 };
            let data = (0..count)
                .map(|_| match ignore {
                    Some(-100) if rng.chance(0.25) => -100,
                    _ => rng.below(classes) as i64,
                })
                .collect();
            // Class indices, or (PyTorch's other form) class probabilities of the logits'
            // shape that require grad themselves.
            let targets = if rng.chance(0.3) {
                let data = (0..count * classes).map(|_| rng.range(0.0, 1.0)).collect();
                let dtype = b.v[x].dtype;
                b.push(Node::Leaf {
                    data,
                    shape: xs.clone(),
                    dtype,
                })?
            } else {
                b.push(Node::Index { data, shape: ts })?
            };
            // Class weights (PyTorch's `weight=`), positive, in the logits' dtype.
            let weight = if rng.chance(0.35) {
                let data = (0..classes).map(|_| rng.range(0.25, 2.0)).collect();
                let dtype = b.v[x].dtype;
                Some(b.push(Node::Const {
                    data,
                    shape: vec![classes],
                    dtype,
                })?)
            } else {
                None
            };
            let opts = CrossEntropyOptions {
                weight: None,
                ignore_index: ignore,
                reduction,
                label_smoothing,
            };
            Step::CrossEntropy {
                x,
                targets,
                weight,
                opts,
            }
        }
        96..=97 => {
            if rank == 0 {
                return None;
            }
            let dim = rng.below(rank);
            let cands: Vec<usize> = (0..b.len())
                .filter(|&i| {
                    let s = b.shape(i);
                    b.is_float(i) && s.len() == rank && (0..rank).all(|d| d == dim || s[d] == xs[d])
                })
                .collect();
            let y = if rng.chance(0.5) {
                rng.pick(&cands)
            } else {
                let mut s = xs.clone();
                s[dim] = rng.int(1, 3);
                b.leaf(rng, s, false)?
            };
            let xs2 = if rng.chance(0.5) {
                vec![x, y]
            } else {
                vec![y, x]
            };
            Step::Cat(xs2, signed_axis(rng, dim, rank))
        }
        // scatter_reduce (each reduction, with and without include_self) and scatter, with
        // random (often repeated) indices and a src of the index's shape or larger. amax
        // and amin often meet exact ties (src values on a grid, or copies of a leaf's own
        // values), and products exact zeros; otherwise every place's winner is clear of its
        // runner-up and products have at most 6 factors of magnitude at most 3.
        98..=101 => {
            if rank == 0 {
                return None;
            }
            let dim = rng.below(rank);
            let is = index_shape(rng, &xs, dim);
            let count: usize = is.iter().product();
            let idx: Vec<i64> = (0..count).map(|_| rng.below(xs[dim]) as i64).collect();
            let ss: Vec<usize> = is
                .iter()
                .map(|&n| {
                    if rng.chance(0.2) {
                        n + rng.int(1, 2)
                    } else {
                        n
                    }
                })
                .collect();
            let reduce = rng.pick(&["sum", "prod", "mean", "amax", "amin", "scatter"]);
            let include_self = rng.chance(0.5);
            let ties = matches!(reduce, "amax" | "amin") && !b.fd_safe && rng.chance(0.6);
            let zeros = reduce == "prod" && !b.fd_safe && rng.chance(0.5);
            let x_dtype = b.v[x].dtype;
            let dtype = if ties { x_dtype } else { b.leaf_dtype(rng) };
            let mut data: Vec<f64> = (0..ss.iter().product::<usize>())
                .map(|_| {
                    if ties {
                        rng.int(0, 6) as f64 * 0.5 - 1.5
                    } else if zeros && rng.chance(0.3) {
                        0.0
                    } else if reduce == "prod" {
                        rng.range(-1.5, 1.5)
                    } else {
                        rng.range(-2.0, 2.0)
                    }
                })
                .collect();
            // Per index position: the place of x it lands on and the src element it reads.
            let at: Vec<(usize, usize)> = (0..count)
                .map(|f| {
                    let mut c = unravel(f, &is);
                    let from = ravel_broadcast(&c, &ss);
                    c[dim] = idx[f] as usize;
                    (ravel_broadcast(&c, &xs), from)
                })
                .collect();
            // (Only an exact value is the same in every evaluation.)
            if ties && b.exact[x] {
                for &(p, from) in &at {
                    if rng.chance(0.5) {
                        data[from] = xv[p];
                    }
                }
            }
            let round = |v: f64, d: DType| if d == DType::F32 { v as f32 as f64 } else { v };
            let data: Vec<f64> = data.iter().map(|&v| round(v, dtype)).collect();
            // The values each place combines, converted to x's dtype.
            let mut places: Vec<Vec<f64>> = xv
                .iter()
                .map(|&v| if include_self { vec![v] } else { vec![] })
                .collect();
            for &(p, from) in &at {
                places[p].push(round(data[from], x_dtype));
            }
            // Ties among src values (constants) are exact; with `self`, x's must be too.
            let ties_ok = !b.fd_safe && (b.exact[x] || !include_self);
            let ok = match reduce {
                "amax" | "amin" => places
                    .iter()
                    .all(|g| clear_winner(g, reduce == "amax", ties_ok)),
                "prod" => places
                    .iter()
                    .all(|g| g.len() <= 6 && g.iter().all(|v| v.abs() <= 3.0)),
                _ => true,
            };
            if !ok {
                return None;
            }
            let index = b.push(Node::Index {
                data: idx,
                shape: is,
            })?;
            let src = b.push(Node::Leaf {
                data,
                shape: ss,
                dtype,
            })?;
            let dim = signed_axis(rng, dim, rank);
            if reduce == "scatter" {
                Step::Scatter { x, dim, index, src }
            } else {
                Step::ScatterReduce {
                    x,
                    dim,
                    index,
                    src,
                    reduce,
                    include_self,
                }
            }
        }
        // masked_select and masked_scatter by `c > t` (a margin from the threshold, as for
        // `where`), `c` broadcasting to `x`'s shape; masked_scatter's `src` a fresh leaf of
        // `x`'s dtype with the selected count or one or two more elements. The mask is
        // realized while the program is built, so it must not come from a cross entropy
        // (see `after_cross_entropy`).
        102..=105 => {
            // (Not in the finite-difference check's programs: they build without history,
            // and realizing the mask can realize a shared operand, which then keeps none.)
            if b.fd_safe {
                return None;
            }
            let cands: Vec<usize> = (0..b.len())
                .filter(|&i| {
                    b.is_float(i)
                        && broadcast(&xs, b.shape(i)).as_deref() == Some(xs.as_slice())
                        && !after_cross_entropy(b, i)
                })
                .collect();
            if cands.is_empty() {
                return None;
            }
            let c = rng.pick(&cands);
            let cv = b.vals(c);
            if cv.is_empty() {
                return None;
            }
            let t = cv[rng.below(cv.len())] + rng.range(-0.3, 0.3);
            if cv
                .iter()
                .any(|&v| (v - t).abs() <= MARGIN * (1.0 + t.abs()))
            {
                return None;
            }
            let count = pairs(&xv, &xs, &cv, b.shape(c))?
                .iter()
                .filter(|&&(_, v)| v > t)
                .count();
            // (An empty selection is tested by hand; later steps need elements.)
            if count == 0 {
                return None;
            }
            if kind <= 103 {
                Step::MaskedSelect { x, c, t }
            } else {
                let n = count + rng.int(0, 2);
                let src = b.leaf_like(rng, x, vec![n])?;
                Step::MaskedScatter { x, c, t, src }
            }
        }
        // index_put along the first dimension: random (often repeated, sometimes negative)
        // indices, values of `x`'s dtype; without `accumulate` the last write wins.
        106..=107 => {
            if rank == 0 {
                return None;
            }
            let n = xs[0];
            let count = rng.int(1, 4);
            let data = (0..count)
                .map(|_| rng.below(2 * n) as i64 - n as i64)
                .collect();
            let index = b.push(Node::Index {
                data,
                shape: vec![count],
            })?;
            let mut vs = vec![count];
            vs.extend_from_slice(&xs[1..]);
            let values = b.leaf_like(rng, x, vs)?;
            Step::IndexPut {
                x,
                index,
                values,
                accumulate: rng.chance(0.5),
            }
        }
        // A subscript: integers, slices with steps, new axes, an ellipsis and integer
        // index tensors (adjacent or separated) over `x`'s dimensions.
        110..=112 => {
            if rank == 0 {
                return None;
            }
            let mut entries = Vec::new();
            let mut d = 0;
            let mut ellipsis = false;
            // Index tensors share a shape of 1 or 2 elements (broadcasting within it).
            let count = rng.int(1, 3);
            while d < rank && rng.below(4) != 0 {
                let n = xs[d] as i64;
                if n == 0 {
                    // (No position exists in an empty dimension.)
                    return None;
                }
                match rng.below(6) {
                    0 => {
                        entries.push(Sub::At(rng.below(2 * xs[d]) as i64 - n));
                        d += 1;
                    }
                    1 | 2 => {
                        let bound = |r: &mut Rng| {
                            r.chance(0.7).then(|| r.below(2 * xs[d] + 2) as i64 - n - 1)
                        };
                        let (a, z) = (bound(rng), bound(rng));
                        entries.push(Sub::Slice(a, z, rng.int(1, 3) as i64));
                        d += 1;
                    }
                    3 => entries.push(Sub::New),
                    4 if !ellipsis && d == 0 => {
                        // Only first, standing for every dimension the rest leave.
                        ellipsis = true;
                        entries.push(Sub::Ellipsis);
                        d = rank - rng.below(rank).min(1);
                    }
                    _ => {
                        let data = (0..count)
                            .map(|_| rng.below(2 * xs[d]) as i64 - n)
                            .collect();
                        let index = b.push(Node::Index {
                            data,
                            shape: vec![count],
                        })?;
                        entries.push(Sub::Ints(index));
                        d += 1;
                    }
                }
            }
            if ellipsis && d != rank {
                return None;
            }
            let step = Step::Subscript { x, entries };
            // (Later steps need elements: no empty results.)
            let shape = apply(&step, &b.t, None).ok()?.shape().to_vec();
            if shape.contains(&0) {
                return None;
            }
            step
        }
        // The mode along a dimension: it compares values for equality, so only of values
        // every evaluation computes alike, and not where finite differences would break
        // its ties.
        113..=114 => {
            if rank == 0 || !b.exact[x] || b.fd_safe {
                return None;
            }
            Step::Mode {
                x,
                dim: rng.below(rank) as isize - if rng.chance(0.5) { rank as isize } else { 0 },
                keepdim: rng.chance(0.5),
            }
        }
        // Realize an intermediate (backward then runs through its kept history).
        _ => {
            // (Nothing downstream of a cross entropy: realizing it, or a value computed from
            // it, realizes the composite's forward ops, which record no history, so the
            // reference could not differentiate through them.)
            let is_op = matches!(b.p.nodes[x], Node::Op(_)) && !after_cross_entropy(b, x);
            let already =
                b.p.nodes
                    .iter()
                    .any(|n| matches!(n, Node::Op(Step::Realize(_))));
            if !is_op || already {
                return None;
            }
            Step::Realize(x)
        }
    };
    b.push(Node::Op(step)).map(|_| ())
}

struct Config {
    max_steps: usize,
    f64_only: bool,
    /// See [`Builder::fd_safe`].
    fd_safe: bool,
}

fn generate(seed: u64, cfg: &Config) -> Program {
    let mut rng = Rng::new(seed);
    let mut b = Builder {
        p: Program {
            nodes: vec![],
            outs: vec![],
            weights: vec![],
            low_precision: false,
        },
        t: vec![],
        v: vec![],
        exact: vec![],
        f64_only: cfg.f64_only,
        fd_safe: cfg.fd_safe,
    };
    for _ in 0..rng.int(1, 3) {
        let s = random_shape(&mut rng);
        let positive = rng.chance(0.2);
        // A leaf always fits (bounded values, small shape).
        let _ = b.leaf(&mut rng, s, positive);
    }
    let steps = rng.int(3, cfg.max_steps.max(3));
    for _ in 0..steps {
        for _ in 0..40 {
            let mark = b.len();
            if propose(&mut rng, &mut b).is_some() {
                break;
            }
            b.truncate(mark);
        }
    }
    // The loss reads every float value no later step reads (at least the last one).
    let mut read = vec![false; b.len()];
    for n in &b.p.nodes {
        if let Node::Op(s) = n {
            for o in s.operands() {
                read[o] = true;
            }
        }
    }
    let mut outs: Vec<usize> = (0..b.len())
        .filter(|&i| !read[i] && b.is_float(i) && matches!(b.p.nodes[i], Node::Op(_)))
        .collect();
    if outs.is_empty() {
        outs.push(b.pick_float(&mut rng).unwrap_or(0));
    }
    let weights = outs
        .iter()
        .map(|&o| weights_for(&mut rng, b.v[o].shape.iter().product()))
        .collect();
    let low_precision = b.v.iter().any(|v| v.dtype == DType::F32);
    Program {
        outs,
        weights,
        low_precision,
        ..b.p
    }
}

fn weights_for(rng: &mut Rng, n: usize) -> Vec<f64> {
    // Multiples of 1/64: exact in every float dtype.
    (0..n)
        .map(|_| (rng.range(-1.0, 1.0) * 64.0).round() / 64.0)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Running and comparing

/// Per leaf: kiln's gradient (zeros when none flowed), as f64.
struct Run {
    loss: f64,
    grads: Vec<Vec<f64>>,
}

fn leaf_tensors(p: &Program) -> Vec<Tensor> {
    p.nodes
        .iter()
        .filter_map(|n| match n {
            Node::Leaf { data, shape, dtype } => {
                Some(float_tensor(data, shape, *dtype).requires_grad_(true))
            }
            _ => None,
        })
        .collect()
}

/// Builds `p`, takes the reference gradients when `reference` (before backward), runs
/// kiln's backward and realizes the loss and gradients in one plan with `opts`.
fn run_kiln(
    p: &Program,
    opts: &RealizeOptions,
    reference: bool,
) -> Result<(Run, Option<Run>), String> {
    let leaves = leaf_tensors(p);
    let t = emit(p, &leaves, Some(opts)).map_err(|e| format!("building the program: {e}"))?;
    let loss = loss_of(p, &t).map_err(|e| format!("building the loss: {e}"))?;
    let want = if reference {
        let refs: Vec<&Tensor> = leaves.iter().collect();
        let g =
            grad::gradients(&loss, None, &refs).map_err(|e| format!("reference gradients: {e}"))?;
        let l = reference::evaluate(&loss).map_err(|e| format!("reference loss: {e}"))?;
        Some(Run {
            loss: l.to_f64()[0],
            grads: g.iter().map(|r| r.to_f64()).collect(),
        })
    } else {
        None
    };
    if loss.requires_grad() {
        loss.backward().map_err(|e| format!("backward: {e}"))?;
    } else if loss.backward().is_ok() {
        // No leaf reaches the loss (`where(c, k, k)` of constants): PyTorch's backward
        // refuses such a loss, and so must kiln's; every gradient is then zero.
        return Err("backward of a loss that requires no grad succeeded".into());
    }
    let grads: Vec<Option<Tensor>> = leaves.iter().map(|l| l.grad()).collect();
    let mut targets: Vec<&Tensor> = vec![&loss];
    targets.extend(grads.iter().flatten());
    realize_all_with(&targets, opts).map_err(|e| format!("realize: {e}"))?;
    let mut out = vec![];
    for (l, g) in leaves.iter().zip(&grads) {
        out.push(match g {
            Some(g) => {
                if g.shape() != l.shape() || g.dtype() != l.dtype() {
                    return Err(format!(
                        "a gradient of shape {:?} ({}) for a leaf of shape {:?} ({})",
                        g.shape(),
                        g.dtype(),
                        l.shape(),
                        l.dtype()
                    ));
                }
                g.to_vec::<f64>()
                    .map_err(|e| format!("reading a gradient: {e}"))?
            }
            None => vec![0.0; l.numel()],
        });
    }
    let loss_v = loss
        .item::<f64>()
        .map_err(|e| format!("reading the loss: {e}"))?;
    Ok((
        Run {
            loss: loss_v,
            grads: out,
        },
        want,
    ))
}

/// The first element where `got` and `want` disagree beyond `tol * (|want| + scale)`.
fn first_mismatch(
    got: &Run,
    want: &Run,
    tol: f64,
    leaves: &[usize],
    what: &str,
) -> Result<(), String> {
    let scale = want
        .grads
        .iter()
        .flatten()
        .fold(1.0f64, |m, v| m.max(v.abs()));
    for (k, (g, w)) in got.grads.iter().zip(&want.grads).enumerate() {
        for (j, (&a, &b)) in g.iter().zip(w).enumerate() {
            let ok = (a - b).abs() <= tol * (b.abs() + scale) || (a.is_nan() && b.is_nan());
            if !ok {
                return Err(format!(
                    "{what}: d loss / d v{}[{j}] = {a:e} vs {b:e} (|diff| {:e}, tolerance {:e})\n  all of v{}: {g:?}\n  vs        {w:?}",
                    leaves[k],
                    (a - b).abs(),
                    tol * (b.abs() + scale),
                    leaves[k]
                ));
            }
        }
    }
    let lscale = want.loss.abs().max(1.0);
    if (got.loss - want.loss).abs() > tol * lscale * 10.0 {
        return Err(format!("{what}: the loss is {} vs {}", got.loss, want.loss));
    }
    Ok(())
}

/// Runs `p` three ways and compares.
fn check(p: &Program) -> Result<(), String> {
    let (fused, want) = run_kiln(p, &RealizeOptions::default(), true)?;
    let want = want.ok_or("no reference")?;
    let (unfused, _) = run_kiln(p, &RealizeOptions::unfused(), false)?;
    let leaves = p.leaves();
    let (tight, loose) = if p.low_precision {
        (1e-5, 2e-3)
    } else {
        (1e-12, 1e-9)
    };
    first_mismatch(&fused, &unfused, tight, &leaves, "fused vs unfused")?;
    first_mismatch(&fused, &want, loose, &leaves, "kiln vs reference")?;
    Ok(())
}

/// The value shapes of `p` (for printing).
fn shapes_of(p: &Program) -> Vec<Vec<usize>> {
    let leaves: Vec<Tensor> = p
        .nodes
        .iter()
        .filter_map(|n| match n {
            Node::Leaf { data, shape, dtype } => Some(float_tensor(data, shape, *dtype)),
            _ => None,
        })
        .collect();
    match no_grad(|| emit(p, &leaves, None)) {
        Ok(t) => t.iter().map(|t| t.shape().to_vec()).collect(),
        Err(_) => vec![vec![]; p.nodes.len()],
    }
}

/// The shortest prefix of a failing program that still fails (its last float value as
/// the output), with its error.
fn shrink(p: &Program, seed: u64) -> (Program, String) {
    let shapes = shapes_of(p);
    for end in 1..p.nodes.len() {
        if !matches!(p.nodes[end - 1], Node::Op(_)) {
            continue;
        }
        let nodes = p.nodes[..end].to_vec();
        let n: usize = shapes[end - 1].iter().product();
        let mut rng = Rng::new(seed ^ end as u64);
        let q = Program {
            nodes,
            outs: vec![end - 1],
            weights: vec![weights_for(&mut rng, n)],
            low_precision: p.low_precision,
        };
        let is_float = matches!(no_grad(|| emit(&q, &leaf_tensors_plain(&q), None)), Ok(t) if t[end - 1].dtype().is_float());
        if !is_float {
            continue;
        }
        if let Err(e) = check(&q) {
            return (q, e);
        }
    }
    let e = check(p).err().unwrap_or_default();
    (p.clone(), e)
}

fn leaf_tensors_plain(p: &Program) -> Vec<Tensor> {
    p.nodes
        .iter()
        .filter_map(|n| match n {
            Node::Leaf { data, shape, dtype } => Some(float_tensor(data, shape, *dtype)),
            _ => None,
        })
        .collect()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `cases` generated programs from `first_seed` on; panics with a repro on the first
/// failure.
fn fuzz(first_seed: u64, cases: usize, cfg: &Config) {
    let print = std::env::var_os("KILN_GRAD_FUZZ_PRINT").is_some();
    let mut ops = 0usize;
    for seed in first_seed..first_seed + cases as u64 {
        let p = generate(seed, cfg);
        ops += p.nodes.iter().filter(|n| matches!(n, Node::Op(_))).count();
        if print {
            eprintln!("--- seed {seed}\n{}", rust(&p, &shapes_of(&p)));
        }
        if let Err(first) = check(&p) {
            let (q, e) = shrink(&p, seed);
            panic!(
                "seed {seed} fails: {first}\n\nshortest failing prefix ({e}):\n\n{}\n\nrerun: KILN_GRAD_FUZZ_SEED={seed} KILN_GRAD_FUZZ_CASES=1 cargo test --release --test grad_fuzz",
                rust(&q, &shapes_of(&q))
            );
        }
    }
    eprintln!("{cases} programs, {ops} steps: gradients agree three ways");
}

fn first_seed(offset: u64) -> u64 {
    std::env::var("KILN_GRAD_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_0000)
        + offset
}

#[test]
fn fuzz_mixed_precision() {
    let cases = env_usize("KILN_GRAD_FUZZ_CASES", 1000);
    let cfg = Config {
        max_steps: env_usize("KILN_GRAD_FUZZ_STEPS", 12),
        f64_only: false,
        fd_safe: false,
    };
    fuzz(first_seed(0), cases, &cfg);
}

#[test]
fn fuzz_f64() {
    let cases = env_usize("KILN_GRAD_FUZZ_CASES", 1000);
    let cfg = Config {
        max_steps: env_usize("KILN_GRAD_FUZZ_STEPS", 12),
        f64_only: true,
        fd_safe: false,
    };
    fuzz(first_seed(1 << 32), cases, &cfg);
}

// ---------------------------------------------------------------------------------------
// The oracle checked on its own: reference gradients vs central differences of the
// reference evaluator, on generated f64 programs (without `scatter_reduce`'s exact ties and
// zeros: see `Builder::fd_safe`).

#[test]
fn reference_gradients_match_finite_differences() {
    let cases = env_usize("KILN_GRAD_FUZZ_FD_CASES", 16) as u64;
    let cfg = Config {
        max_steps: 8,
        f64_only: true,
        fd_safe: true,
    };
    for seed in 0..cases {
        let p = generate(0xFD00 + seed, &cfg);
        // No realize steps here: every evaluation is a fresh graph.
        let leaves = leaf_tensors_plain(&p);
        let t = no_grad(|| emit(&p, &leaves, None)).unwrap();
        let loss = no_grad(|| loss_of(&p, &t)).unwrap();
        let refs: Vec<&Tensor> = leaves.iter().collect();
        let want = grad::gradients(&loss, None, &refs).unwrap();
        let mut k = 0;
        for n in &p.nodes {
            let Node::Leaf { data, shape, dtype } = n else {
                continue;
            };
            let got = want[k].to_f64();
            for j in 0..data.len() {
                let h = 1e-6 * (1.0 + data[j].abs());
                let at = |delta: f64| -> f64 {
                    let mut ls = leaf_tensors_plain(&p);
                    let mut d = data.clone();
                    d[j] += delta;
                    ls[k] = float_tensor(&d, shape, *dtype);
                    let t = no_grad(|| emit(&p, &ls, None)).unwrap();
                    let l = no_grad(|| loss_of(&p, &t)).unwrap();
                    reference::evaluate(&l).unwrap().to_f64()[0]
                };
                let fd = (at(h) - at(-h)) / (2.0 * h);
                assert!(
                    (fd - got[j]).abs() <= 1e-5 * (1.0 + fd.abs()),
                    "seed {}: leaf {k} element {j}: reference gradient {} vs finite difference {fd}\n{}",
                    0xFD00 + seed,
                    got[j],
                    rust(&p, &shapes_of(&p))
                );
            }
            k += 1;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Hand-picked cases: ties, zeros, broadcasts, views, realized history, composites.

/// Runs a hand-written program three ways. `leaves` are `(data, shape, dtype)`; `f` builds
/// the value the loss weighs (with fixed weights) from the leaf tensors.
fn three_way(
    name: &str,
    leaves: &[(Vec<f64>, Vec<usize>, DType)],
    f: impl Fn(&[Tensor], &RealizeOptions) -> Tensor,
) -> Vec<Vec<f64>> {
    let run = |opts: &RealizeOptions, reference: bool| {
        let ts: Vec<Tensor> = leaves
            .iter()
            .map(|(d, s, dt)| float_tensor(d, s, *dt).requires_grad_(true))
            .collect();
        let out = f(&ts, opts);
        let mut rng = Rng::new(7);
        let w = weights_for(&mut rng, out.numel());
        let loss = (&out * &float_tensor(&w, out.shape(), out.dtype())).sum(..);
        let refs: Vec<&Tensor> = ts.iter().collect();
        let want = reference
            .then(|| grad::gradients(&loss, None, &refs))
            .transpose()
            .unwrap_or_else(|e| panic!("{name}: reference gradients: {e}"));
        loss.backward()
            .unwrap_or_else(|e| panic!("{name}: backward: {e}"));
        let gs: Vec<Option<Tensor>> = ts.iter().map(|t| t.grad()).collect();
        let targets: Vec<&Tensor> = gs.iter().flatten().collect();
        realize_all_with(&targets, opts).unwrap_or_else(|e| panic!("{name}: realize: {e}"));
        let got: Vec<Vec<f64>> = gs
            .iter()
            .zip(&ts)
            .map(|(g, t)| match g {
                Some(g) => g.to_vec::<f64>().unwrap(),
                None => vec![0.0; t.numel()],
            })
            .collect();
        (
            got,
            want.map(|w| w.iter().map(|r| r.to_f64()).collect::<Vec<_>>()),
        )
    };
    let (fused, want) = run(&RealizeOptions::default(), true);
    let (unfused, _) = run(&RealizeOptions::unfused(), false);
    let want = want.unwrap_or_default();
    let low = leaves.iter().any(|l| l.2 == DType::F32);
    let (tight, loose) = if low { (1e-5, 2e-3) } else { (1e-12, 1e-9) };
    let idx: Vec<usize> = (0..leaves.len()).collect();
    let as_run = |g: &Vec<Vec<f64>>| Run {
        loss: 0.0,
        grads: g.clone(),
    };
    if let Err(e) = first_mismatch(&as_run(&fused), &as_run(&unfused), tight, &idx, name) {
        panic!("{name}: fused vs unfused: {e}");
    }
    if let Err(e) = first_mismatch(&as_run(&fused), &as_run(&want), loose, &idx, name) {
        panic!("{name}: kiln vs reference: {e}");
    }
    want
}

fn f64s(v: &[f64]) -> Vec<f64> {
    v.to_vec()
}

/// The reference gradient of `Σ out` (weights all 1) for exact expectations.
fn reference_grad_of_sum(leaves: &[Tensor], out: &Tensor) -> Vec<Vec<f64>> {
    let loss = out.sum(..);
    let refs: Vec<&Tensor> = leaves.iter().collect();
    grad::gradients(&loss, None, &refs)
        .unwrap()
        .iter()
        .map(|r| r.to_f64())
        .collect()
}

/// Found by the backward fuzzer with seed 4000983 on an AVX2 machine: the max of an f32
/// `sigmoid`, realized before the loss. The reference evaluator compared its own sigmoid
/// against the realized result, whose last bit came from kiln's sigmoid, found no maximum
/// in two of four groups, and gave them no gradient; kiln (and PyTorch) give it to the
/// largest element. The reference now takes the maximum from its own input. Many groups,
/// through several inexact unary ops, so that some realized maximum is likely to differ in
/// its last bit on any CPU (without the fix this fails on that machine, AMD EPYC).
#[test]
fn the_reference_finds_the_maximum_of_a_realized_max_itself() {
    let mut rng = Rng::new(4000983);
    let data: Vec<f64> = (0..256).map(|_| rng.range(-2.0, 2.0)).collect();
    for u in ["sigmoid", "exp", "tanh", "gelu"] {
        let name = format!("realized max of {u}");
        three_way(
            &name,
            &[(data.clone(), vec![64, 4], DType::F32)],
            |t, opts| {
                let y = match u {
                    "sigmoid" => t[0].sigmoid(),
                    "exp" => t[0].exp(),
                    "tanh" => t[0].tanh(),
                    _ => t[0].gelu(),
                };
                let m = y.max_keepdim([-1isize]);
                realize_all_with(&[&m], opts).unwrap();
                m
            },
        );
    }
}

#[test]
fn ties_in_max_split_evenly_everywhere() {
    for dt in [DType::F64, DType::F32] {
        // amax over an axis with two- and three-way ties; maximum/minimum with ties.
        let x = (
            f64s(&[3.0, 1.0, 3.0, 3.0, 2.0, 2.0, 0.5, -1.0]),
            vec![2, 4],
            dt,
        );
        let y = (
            f64s(&[3.0, 0.0, 1.0, 3.0, 2.0, 5.0, 0.5, -1.0]),
            vec![2, 4],
            dt,
        );
        three_way("max ties", std::slice::from_ref(&x), |t, _| t[0].max(1));
        three_way("min ties", std::slice::from_ref(&x), |t, _| {
            t[0].min_keepdim(0)
        });
        three_way("max all ties", std::slice::from_ref(&x), |t, _| {
            t[0].max(..)
        });
        three_way("maximum ties", &[x.clone(), y.clone()], |t, _| {
            t[0].maximum(&t[1])
        });
        three_way("minimum ties", &[x.clone(), y.clone()], |t, _| {
            t[0].minimum(&t[1])
        });
        // x op x: both edges come from one node.
        three_way("maximum(x, x)", std::slice::from_ref(&x), |t, _| {
            t[0].maximum(&t[0])
        });
        // Ties made by an expand: max over the expanded axis.
        three_way("max over an expand", std::slice::from_ref(&x), |t, _| {
            t[0].unsqueeze(1).expand([2, 3, 4]).max(1).exp()
        });
        // The exact PyTorch values (amax splits evenly).
        let leaf = float_tensor(&x.0, &x.1, dt).requires_grad_(true);
        let got = reference_grad_of_sum(std::slice::from_ref(&leaf), &leaf.max(1));
        let third = 1.0 / 3.0;
        let want = [third, 0.0, third, third, 0.5, 0.5, 0.0, 0.0];
        for (a, b) in got[0].iter().zip(want) {
            assert!((a - b).abs() < 1e-7, "{:?}", got[0]);
        }
        leaf.max(1).sum(..).backward().unwrap();
        let k = leaf.grad().unwrap().to_vec::<f64>().unwrap();
        for (a, b) in k.iter().zip(want) {
            assert!((a - b).abs() < 1e-7, "kiln amax tie rule: {k:?}");
        }
    }
}

#[test]
fn zeros_in_cumprod_and_prod() {
    let with_zeros = f64s(&[
        2.0, 0.0, 3.0, 0.0, 5.0, 0.7, //
        0.0, 1.5, -2.0, 0.5, 1.1, 0.9, //
        1.2, -0.8, 0.6, 1.3, 0.0, 2.0, //
        1.2, -0.8, 0.6, 1.3, 0.5, 2.0,
    ]);
    for dt in [DType::F64, DType::F32] {
        let x = (with_zeros.clone(), vec![4, 6], dt);
        three_way("cumprod with zeros", std::slice::from_ref(&x), |t, _| {
            t[0].cumprod(1)
        });
        three_way(
            "cumprod of a transposed view",
            std::slice::from_ref(&x),
            |t, _| t[0].t().cumprod(1),
        );
        three_way("reversed cumprod", std::slice::from_ref(&x), |t, _| {
            t[0].flip([1]).cumprod(1).flip([1])
        });
        three_way("prod with zeros", std::slice::from_ref(&x), |t, _| {
            t[0].prod(1)
        });
        three_way("prod over both axes", std::slice::from_ref(&x), |t, _| {
            t[0].slice(&[(3, 4, 1), (0, 6, 1)]).prod(..)
        });
    }
    // The exact values: d/dx_i Π x = Π_{j≠i} x_j, even where x_i = 0.
    let leaf = Tensor::from_vec(vec![2.0f64, 0.0, 3.0, 4.0], [4]).requires_grad_(true);
    let got = reference_grad_of_sum(std::slice::from_ref(&leaf), &leaf.prod(0));
    assert_eq!(got[0], vec![0.0, 24.0, 0.0, 0.0]);
    let got = reference_grad_of_sum(std::slice::from_ref(&leaf), &leaf.cumprod(0));
    // cumprod = [2, 0, 0, 0]: d/dx0 = 1, d/dx1 = 2 + 2·3 + 2·3·4, others 0.
    assert_eq!(got[0], vec![1.0, 32.0, 0.0, 0.0]);
}

#[test]
fn ties_and_zeros_in_scatter_reduce() {
    // Place 0 takes self 1.0 and 1.0, 0.5 (a two-way tie with self), place 1 self 5.0 and
    // 2.0, place 2 self 3.0 and 3.0, 3.0 (a three-way tie).
    let idx = Tensor::from_vec(vec![0i64, 0, 2, 2, 1], [5]);
    let x = f64s(&[1.0, 5.0, 3.0]);
    let v = f64s(&[1.0, 0.5, 3.0, 3.0, 2.0]);
    // Place 0 takes self 2.0 and 0.0, 4.0 (one zero), place 1 self 0.0 and 5.0, place 2
    // self 3.0 and 0.0, 0.0 (two zeros).
    let xz = f64s(&[2.0, 0.0, 3.0]);
    let vz = f64s(&[0.0, 4.0, 0.0, 0.0, 5.0]);
    for dt in [DType::F64, DType::F32] {
        for reduce in ["amax", "amin", "prod", "mean", "sum"] {
            for include_self in [true, false] {
                let (a, b) = if reduce == "prod" {
                    (&xz, &vz)
                } else {
                    (&x, &v)
                };
                let name = format!("scatter_reduce {reduce} include_self={include_self} {dt}");
                three_way(
                    &name,
                    &[(a.clone(), vec![3], dt), (b.clone(), vec![5], dt)],
                    |t, _| t[0].scatter_reduce(0, &idx, &t[1], reduce, include_self),
                );
            }
        }
        three_way(
            "scatter with repeats",
            &[(x.clone(), vec![3], dt), (v.clone(), vec![5], dt)],
            |t, _| t[0].scatter(0, &idx, &t[1]).exp(),
        );
    }
    // The exact values (PyTorch's): ties share evenly, self included; a zero factor gets
    // the product of the others, everything else at a place with a zero gets zero.
    let expect = |reduce: &str, a: &[f64], b: &[f64], want: [&[f64]; 2]| {
        let ta = Tensor::from_vec(a.to_vec(), [3]).requires_grad_(true);
        let tb = Tensor::from_vec(b.to_vec(), [5]).requires_grad_(true);
        let out = ta.scatter_reduce(0, &idx, &tb, reduce, true);
        let got = reference_grad_of_sum(&[ta.clone(), tb.clone()], &out);
        assert_eq!(got[0], want[0], "reference {reduce}: self");
        assert_eq!(got[1], want[1], "reference {reduce}: src");
        out.sum(..).backward().unwrap();
        let k = [ta.grad().unwrap(), tb.grad().unwrap()].map(|g| g.to_vec::<f64>().unwrap());
        for (g, w) in k.iter().zip(want) {
            for (p, q) in g.iter().zip(w) {
                assert!((p - q).abs() < 1e-12, "kiln {reduce}: {k:?}");
            }
        }
    };
    let (h, t) = (0.5, 1.0 / 3.0);
    expect("amax", &x, &v, [&[h, 1.0, t], &[h, 0.0, t, t, 0.0]]);
    expect("amin", &x, &v, [&[0.0, 0.0, t], &[0.0, 1.0, t, t, 1.0]]);
    expect(
        "prod",
        &xz,
        &vz,
        [&[0.0, 5.0, 0.0], &[8.0, 0.0, 0.0, 0.0, 0.0]],
    );
}

#[test]
fn broadcasts_through_expand() {
    for dt in [DType::F64, DType::F32] {
        let col = (f64s(&[0.5, -1.0, 2.0]), vec![3, 1], dt);
        let row = (f64s(&[1.0, 0.25, -0.5, 1.5]), vec![4], DType::F64);
        three_way("broadcast mul", &[col.clone(), row.clone()], |t, _| {
            &t[0] * &t[1]
        });
        three_way("expand then reduce", std::slice::from_ref(&col), |t, _| {
            t[0].expand([3, 5]).sin().sum(0)
        });
        three_way("unsqueeze expand matmul", &[col.clone(), row], |t, _| {
            t[0].expand([3, 4]).matmul(&t[1].unsqueeze(1))
        });
        three_way(
            "scalar leaf broadcast",
            &[(vec![0.75], vec![], dt)],
            |t, _| t[0].expand([2, 3]).exp() * t[0].clone(),
        );
    }
}

#[test]
fn padded_flipped_and_strided_views() {
    let data: Vec<f64> = (0..24).map(|i| (i as f64 * 0.37).sin() * 1.5).collect();
    for dt in [DType::F64, DType::F32] {
        let x = (data.clone(), vec![4, 6], dt);
        three_way("strided slice", std::slice::from_ref(&x), |t, _| {
            t[0].slice(&[(1, 4, 2), (0, 6, 3)]).exp()
        });
        three_way("pad with a value", std::slice::from_ref(&x), |t, _| {
            t[0].pad(&[(1, 2), (0, 1)], 0.5).tanh()
        });
        three_way("flip both", std::slice::from_ref(&x), |t, _| {
            t[0].flip([0, 1]) * 1.5
        });
        three_way("views composed", std::slice::from_ref(&x), |t, _| {
            t[0].t()
                .slice(&[(1, 6, 2)])
                .flip([1])
                .pad(&[(1, 1)], 0.0)
                .exp()
                .sum(1)
        });
        three_way(
            "slice of a pad of a flip",
            std::slice::from_ref(&x),
            |t, _| {
                t[0].flip([1])
                    .pad(&[(2, 0), (1, 3)], -1.0)
                    .slice(&[(0, 6, 3), (1, 10, 4)])
                    .sigmoid()
            },
        );
        three_way(
            "reshape of a transpose",
            std::slice::from_ref(&x),
            |t, _| t[0].t().reshape([3, 8]).cumsum(1),
        );
        three_way("gather from a view", std::slice::from_ref(&x), |t, _| {
            let idx = Tensor::from_vec(vec![2i64, 0, 2, 1, 1, 0, 3, 3], [2, 4]);
            t[0].t().gather(1, &idx).exp()
        });
        three_way(
            "scatter_add with repeats",
            std::slice::from_ref(&x),
            |t, _| {
                let idx = Tensor::from_vec(vec![0i64, 2, 0, 1, 2, 2], [6]);
                let z = t[0].slice(&[(0, 1, 1), (0, 3, 1)]).reshape([3]);
                z.scatter_add(0, &idx, &t[0].slice(&[(1, 2, 1)]).reshape([6]))
                    .square()
            },
        );
    }
}

#[test]
fn backward_through_a_realized_intermediate() {
    let data: Vec<f64> = (0..12).map(|i| (i as f64 * 0.61).cos()).collect();
    for dt in [DType::F64, DType::F32] {
        three_way("realized exp", &[(data.clone(), vec![3, 4], dt)], |t, o| {
            let h = (t[0].exp() * 0.5).t();
            h.realize_with(o).unwrap();
            h.softmax(1).log()
        });
    }
}

#[test]
fn composites_with_their_own_rules() {
    let x: Vec<f64> = (0..12).map(|i| (i as f64 * 1.3).sin() * 2.0).collect();
    let w: Vec<f64> = (0..4).map(|i| 0.5 + i as f64 * 0.25).collect();
    let b: Vec<f64> = (0..4).map(|i| i as f64 * 0.1 - 0.2).collect();
    for dt in [DType::F64, DType::F32] {
        let xs = (x.clone(), vec![3, 4], dt);
        let targets = Tensor::from_vec(vec![2i64, 0, 3], [3]);
        three_way("cross_entropy", std::slice::from_ref(&xs), |t, _| {
            kiln::nn::functional::cross_entropy(&t[0], &targets).unwrap()
        });
        three_way(
            "layer_norm",
            &[
                xs.clone(),
                (w.clone(), vec![4], dt),
                (b.clone(), vec![4], DType::F64),
            ],
            |t, _| t[0].layer_norm(&[4], Some(&t[1]), Some(&t[2]), 1e-5),
        );
        three_way("softmax", std::slice::from_ref(&xs), |t, _| t[0].softmax(0));
        three_way("log_softmax", std::slice::from_ref(&xs), |t, _| {
            t[0].log_softmax(-1)
        });
        three_way("logsumexp", std::slice::from_ref(&xs), |t, _| {
            t[0].logsumexp(1)
        });
        three_way("var", std::slice::from_ref(&xs), |t, _| t[0].var([0, 1], 1));
    }
}

#[test]
fn reference_api_contract() {
    // A seed of the output's shape, a tensor the output does not read, and errors.
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3]).requires_grad_(true);
    let unused = Tensor::from_vec(vec![1.0f32, 2.0], [2]).requires_grad_(true);
    let out = &a * &a;
    let seed = RefTensor {
        shape: vec![3],
        dtype: DType::F64,
        data: RefData::F(vec![1.0, 0.5, -1.0]),
    };
    let g = grad::gradients(&out, Some(&seed), &[&a, &unused]).unwrap();
    assert_eq!(g[0].to_f64(), vec![2.0, 2.0, -6.0]);
    assert_eq!(g[1].to_f64(), vec![0.0, 0.0]);
    assert_eq!(g[1].dtype, DType::F32);
    let bad_seed = RefTensor {
        shape: vec![2],
        dtype: DType::F64,
        data: RefData::F(vec![1.0, 1.0]),
    };
    assert!(grad::gradients(&out, Some(&bad_seed), &[&a]).is_err());
    let ints = Tensor::from_vec(vec![1i64, 2, 3], [3]);
    assert!(grad::gradients(&out, None, &[&ints]).is_err());
    assert!(grad::gradients(&ints, None, &[&a]).is_err());
    // A realized composite is differentiated through the forward ops it recorded (kept
    // until its history is released), as before it was realized.
    let logits = Tensor::from_vec(vec![0.5f64, -1.0, 2.0, 0.0], [2, 2]).requires_grad_(true);
    let targets = Tensor::from_vec(vec![1i64, 0], [2]);
    let ce = kiln::nn::functional::cross_entropy(&logits, &targets).unwrap();
    let lazy = grad::gradients(&ce, None, &[&logits]).unwrap()[0].to_f64();
    ce.realize().unwrap();
    let realized = grad::gradients(&ce, None, &[&logits]).unwrap()[0].to_f64();
    assert_eq!(lazy, realized);
    // Softmax rows minus the one-hot targets, over the batch of 2.
    let want: Vec<f64> = [[0.5f64, -1.0], [2.0, 0.0]]
        .iter()
        .zip([1usize, 0])
        .flat_map(|(row, t)| {
            let z: f64 = row.iter().map(|v| v.exp()).sum();
            (0..2).map(move |j| (row[j].exp() / z - f64::from(u8::from(j == t))) / 2.0)
        })
        .collect();
    for (g, w) in realized.iter().zip(&want) {
        assert!((g - w).abs() < 1e-12, "{realized:?} vs {want:?}");
    }
    ce.backward().unwrap();
    let kiln_grad = logits.grad().unwrap().to_vec::<f64>().unwrap();
    for (g, w) in kiln_grad.iter().zip(&want) {
        assert!((g - w).abs() < 1e-12, "{kiln_grad:?} vs {want:?}");
    }
    // A realized intermediate that keeps its history is differentiated through.
    let h = logits.exp();
    h.realize().unwrap();
    let g = grad::gradients(&h.sum(..), None, &[&logits]).unwrap();
    let e: Vec<f64> = [0.5f64, -1.0, 2.0, 0.0].iter().map(|v| v.exp()).collect();
    assert_eq!(g[0].to_f64(), e);
}

/// A random index shape for `xs` along `dim`: 1 to 4 along it, at most `xs` off it.
fn index_shape(rng: &mut Rng, xs: &[usize], dim: usize) -> Vec<usize> {
    xs.iter()
        .enumerate()
        .map(|(d, &n)| {
            if d == dim {
                rng.int(1, 4)
            } else {
                rng.int(1, n)
            }
        })
        .collect()
}
