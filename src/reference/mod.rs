//! The reference evaluator: the test oracle. It walks the lazy graph node by node and
//! computes each op on plain row-major vectors — movement ops by explicit index mapping, no
//! views, no fusion, floats in f64 rounded to the node's dtype after every op, integers
//! wrapped to their width. It shares nothing with the planner or the backends except the
//! counter-based random generator. It keeps every value it computes until it returns, so it
//! refuses, before computing, a graph whose values would not fit in the host's memory.

use crate::dtype::{DType, Scalar};
use crate::error::{KilnError, Result};
use crate::graph::{self, BinaryOp, Generator, Graph, NodeKey, Op, ReduceOp, UnaryOp};
use crate::memory::buffer::Access;
use crate::ops::{Applied, ScanOp, ScatterReduce};
use crate::random;
use crate::shape::{Movement, contiguous_strides, numel};
use crate::tensor::Tensor;
use std::collections::HashMap;

pub mod grad;

/// A value computed by the reference evaluator.
#[derive(Debug, Clone, PartialEq)]
pub struct RefTensor {
    /// The shape.
    pub shape: Vec<usize>,
    /// The dtype the values are rounded or wrapped to.
    pub dtype: DType,
    /// Row-major values: floats as f64 (already rounded to `dtype`), integers and bools as
    /// i64 (already wrapped; bools 0/1).
    pub data: RefData,
}

/// Element storage of a [`RefTensor`].
#[derive(Debug, Clone, PartialEq)]
pub enum RefData {
    /// Float dtypes' values, as f64.
    F(Vec<f64>),
    /// Integer and bool dtypes' values, as i64.
    I(Vec<i64>),
}

impl RefTensor {
    /// Every element as f64.
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            RefData::F(v) => v.clone(),
            RefData::I(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    fn get(&self, i: usize) -> Scalar {
        match &self.data {
            RefData::F(v) => Scalar::Float(v[i]),
            RefData::I(v) => {
                if self.dtype == DType::Bool {
                    Scalar::Bool(v[i] != 0)
                } else {
                    Scalar::Int(v[i])
                }
            }
        }
    }

    fn from_scalars(
        shape: Vec<usize>,
        dtype: DType,
        vals: impl Iterator<Item = Scalar>,
    ) -> RefTensor {
        let data = if dtype.is_float() {
            RefData::F(vals.map(|s| s.cast(dtype).to_f64()).collect())
        } else {
            RefData::I(vals.map(|s| s.cast(dtype).to_i64()).collect())
        };
        RefTensor { shape, dtype, data }
    }
}

/// Evaluates `t` from scratch (realized inputs are read from their buffers).
pub fn evaluate(t: &Tensor) -> Result<RefTensor> {
    graph::with_graph(|g| evaluate_in(g, t.node_key()))
}

fn read_buffer(g: &Graph, key: NodeKey) -> Result<RefTensor> {
    let n = g.node(key)?;
    let buf = n
        .buffer
        .as_ref()
        .ok_or_else(|| KilnError::internal("realized node without buffer"))?;
    if n.device != crate::Device::Cpu {
        return Err(KilnError::internal(
            "reference evaluator reads host buffers only",
        ));
    }
    let count = numel(&n.shape);
    let sz = n.dtype.size_bytes();
    let mut bytes = vec![0u8; count * sz];
    if buf.len_bytes() < bytes.len() {
        return Err(KilnError::internal("buffer shorter than its tensor"));
    }
    if !bytes.is_empty() {
        // This runs under the graph lock, which the realize writing the buffer needs to
        // finish: waiting here would never end, so a buffer being written is an error.
        if !buf.try_share(Access::Slice, false) {
            return Err(KilnError::Backend {
                backend: "reference",
                message: format!(
                    "a {:?} {} input is being written in place by a realize on another thread",
                    n.shape, n.dtype
                ),
            });
        }
        // SAFETY: the buffer holds at least `bytes.len()` initialized bytes (checked above;
        // allocations are zeroed) and the hold taken above keeps in-place writes out
        // until the copy is done.
        unsafe { std::ptr::copy_nonoverlapping(buf.host_ptr(), bytes.as_mut_ptr(), bytes.len()) };
        buf.unshare(Access::Slice);
    }
    let vals = bytes
        .chunks_exact(sz)
        .map(|b| Scalar::from_le_bytes(n.dtype, b));
    Ok(RefTensor::from_scalars(n.shape.clone(), n.dtype, vals))
}

fn evaluate_in(g: &Graph, target: NodeKey) -> Result<RefTensor> {
    evaluate_all(g, &[target])?
        .remove(&target)
        .ok_or_else(|| KilnError::internal("reference: target not evaluated"))
}

/// Bytes the evaluator holds per element of every value it computes (f64 or i64).
const BYTES_PER_VALUE: usize = 8;

/// Refuses, before computing anything, a graph whose values would not fit in memory: the
/// evaluator keeps every value it computes (8 bytes per element) until it returns, so a
/// graph with a huge intermediate (a slice of a huge lazy tensor) would otherwise abort
/// the process in an allocation. `TooLarge` names the first value whose size does not fit
/// in an address; `OutOfMemory` gives the total against the host's available memory.
fn check_memory(g: &Graph, order: &[NodeKey]) -> Result<()> {
    let mut total = 0usize;
    for &k in order {
        let n = g.node(k)?;
        let bytes = crate::shape::checked_numel(&n.shape)
            .and_then(|e| e.checked_mul(BYTES_PER_VALUE))
            .and_then(|b| total.checked_add(b));
        let Some(sum) = bytes else {
            return Err(KilnError::TooLarge {
                op: "reference evaluation",
                shape: n.shape.clone(),
                dtype: n.dtype,
                detail: "the evaluator's values (8 bytes per element) exceed the address space"
                    .into(),
            });
        };
        total = sum;
    }
    match crate::memory::host::available_host_memory() {
        Some(free) if total > free => Err(KilnError::OutOfMemory {
            device: "cpu (reference evaluator)".into(),
            requested: total,
            reserved: 0,
            free,
        }),
        _ => Ok(()),
    }
}

/// Every node `targets` depend on, evaluated (realized nodes are read as leaves).
fn evaluate_all(g: &Graph, targets: &[NodeKey]) -> Result<HashMap<NodeKey, RefTensor>> {
    let order = g.lazy_subgraph(targets)?;
    check_memory(g, &order)?;
    let mut vals: HashMap<NodeKey, RefTensor> = HashMap::new();
    for k in order {
        let n = g.node(k)?;
        // A realized node is a leaf, even one that keeps its input edges for autograd.
        let inputs = if n.op == Op::Buffer {
            vec![]
        } else {
            g.inputs(k)?
        };
        let ins: Vec<&RefTensor> = inputs
            .iter()
            .map(|i| {
                vals.get(i)
                    .ok_or_else(|| KilnError::internal("reference: order"))
            })
            .collect::<Result<_>>()?;
        let shape = n.shape.clone();
        let dt = n.dtype;
        let out = match &n.op {
            Op::Buffer => read_buffer(g, k)?,
            Op::Generate(gen_) => generate(*gen_, &shape, dt),
            Op::Movement(m) => movement(ins[0], m, &shape),
            Op::Unary(u) => elementwise(&shape, dt, |i| unary(*u, dt, ins[0].get(i))),
            Op::Binary(b) => {
                let in_dt = ins[0].dtype;
                elementwise(&shape, dt, |i| {
                    binary(*b, in_dt, ins[0].get(i), ins[1].get(i))
                })
            }
            Op::Where => elementwise(&shape, dt, |i| {
                if ins[0].get(i).to_f64() != 0.0 {
                    ins[1].get(i)
                } else {
                    ins[2].get(i)
                }
            }),
            Op::Cast => elementwise(&shape, dt, |i| ins[0].get(i)),
            Op::Reduce { op, axes } => reduce(ins[0], *op, axes, &shape, dt),
            Op::Matmul => matmul(ins[0], ins[1], &shape, dt),
            Op::Contiguous | Op::ToDevice(_) => ins[0].clone(),
            Op::Assign => ins[1].clone(),
            Op::Gather { axis } => gather(ins[0], ins[1], *axis, &shape)?,
            Op::Scatter { axis, reduce } => scatter(
                ins[0],
                ins[1],
                ins.get(2).copied(),
                *axis,
                *reduce,
                &shape,
                dt,
            )?,
            Op::Scan { op, axis } => scan(ins[0], *op, *axis, dt),
            Op::ArgSort { axis, descending } => argsort(ins[0], *axis, *descending),
        };
        vals.insert(k, out);
    }
    Ok(vals)
}

fn elementwise(shape: &[usize], dt: DType, f: impl Fn(usize) -> Scalar) -> RefTensor {
    RefTensor::from_scalars(shape.to_vec(), dt, (0..numel(shape)).map(f))
}

fn generate(g: Generator, shape: &[usize], dt: DType) -> RefTensor {
    elementwise(shape, dt, |i| match g {
        Generator::Full(v) => v,
        Generator::Arange { start, step } => {
            if dt.is_float() {
                let v = start.to_f64() + i as f64 * step.to_f64();
                // Computed in f64, rounded once to the dtype (f32 for half types first, as
                // the backends store arange values).
                if dt == DType::F64 {
                    Scalar::Float(v)
                } else {
                    Scalar::Float(v as f32 as f64)
                }
            } else {
                Scalar::Int(
                    start
                        .to_i64()
                        .wrapping_add((i as i64).wrapping_mul(step.to_i64())),
                )
            }
        }
        Generator::Rand { seed } => {
            if dt == DType::F64 {
                Scalar::Float(random::uniform_f64(seed, i as u64))
            } else {
                Scalar::Float(random::uniform_f32(seed, i as u64) as f64)
            }
        }
        Generator::Randn { seed } => {
            if dt == DType::F64 {
                Scalar::Float(random::normal_f64(seed, i as u64))
            } else {
                Scalar::Float(random::normal_f32(seed, i as u64) as f64)
            }
        }
    })
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = flat % shape[d].max(1);
        flat /= shape[d].max(1);
    }
    c
}

fn ravel(c: &[usize], shape: &[usize]) -> usize {
    c.iter()
        .zip(contiguous_strides(shape))
        .map(|(&x, s)| x * s as usize)
        .sum()
}

fn movement(x: &RefTensor, m: &Movement, shape: &[usize]) -> RefTensor {
    let pad_value = match m {
        Movement::Pad { value, .. } => Some(*value),
        _ => None,
    };
    let vals = (0..numel(shape)).map(|flat| {
        let c = unravel(flat, shape);
        let src: Option<Vec<usize>> = match m {
            Movement::Reshape(_) => return x.get(flat),
            Movement::Permute(p) => {
                let mut ic = vec![0; p.len()];
                for (i, &d) in p.iter().enumerate() {
                    ic[d] = c[i];
                }
                Some(ic)
            }
            Movement::Expand(_) => Some(
                c.iter()
                    .zip(&x.shape)
                    .map(|(&ci, &n)| if n == 1 { 0 } else { ci })
                    .collect(),
            ),
            Movement::Slice(r) => Some(
                c.iter()
                    .zip(r)
                    .map(|(&ci, r)| r.start + ci * r.step)
                    .collect(),
            ),
            Movement::Pad { pads, .. } => {
                let mut ic = vec![0; c.len()];
                let mut inside = true;
                for d in 0..c.len() {
                    let (b, _) = pads[d];
                    if c[d] < b || c[d] - b >= x.shape[d] {
                        inside = false;
                    } else {
                        ic[d] = c[d] - b;
                    }
                }
                inside.then_some(ic)
            }
            Movement::Flip(axes) => Some(
                c.iter()
                    .enumerate()
                    .map(|(d, &ci)| {
                        if axes.contains(&d) {
                            x.shape[d] - 1 - ci
                        } else {
                            ci
                        }
                    })
                    .collect(),
            ),
        };
        match src {
            Some(ic) => x.get(ravel(&ic, &x.shape)),
            None => pad_value.unwrap_or(Scalar::Int(0)),
        }
    });
    RefTensor::from_scalars(shape.to_vec(), x.dtype, vals)
}

/// Integers compute in i64 and wrap to their width when stored; floats compute in f64 and
/// round to the node's dtype when stored. The op definitions are the op tables'.
fn unary(op: UnaryOp, dt: DType, x: Scalar) -> Scalar {
    if dt.is_float() {
        Scalar::Float(op.apply(x.to_f64()))
    } else {
        Scalar::Int(op.apply(x.to_i64()))
    }
}

fn binary(op: BinaryOp, in_dt: DType, a: Scalar, b: Scalar) -> Scalar {
    let r = if in_dt.is_float() {
        let (x, y) = (a.to_f64(), b.to_f64());
        if op == BinaryOp::Pow && in_dt != DType::F64 {
            // The backends compute f32 (and half) powers in f32; so does the oracle, with
            // the platform's `powf` rather than kiln's kernel.
            Applied::Value((x as f32).powf(y as f32) as f64)
        } else {
            op.apply(x, y)
        }
        .map_value(Scalar::Float)
    } else {
        op.apply(a.to_i64(), b.to_i64()).map_value(Scalar::Int)
    };
    match r {
        Applied::Value(v) => v,
        Applied::Bool(c) => Scalar::Bool(c),
    }
}

fn reduce(x: &RefTensor, op: ReduceOp, axes: &[usize], shape: &[usize], dt: DType) -> RefTensor {
    let mut groups: Vec<Vec<Scalar>> = vec![vec![]; numel(shape)];
    for flat in 0..numel(&x.shape) {
        let mut c = unravel(flat, &x.shape);
        for &a in axes {
            c[a] = 0;
        }
        groups[ravel(&c, shape)].push(x.get(flat));
    }
    let float = x.dtype.is_float();
    let vals = groups.into_iter().map(|g| match op {
        // From +0, as the backends' accumulators start: `Iterator::sum` on floats starts
        // at -0.0 (so an empty sum would be -0, and `rsqrt` of it -inf).
        ReduceOp::Sum if float => Scalar::Float(g.iter().fold(0.0, |a, s| a + s.to_f64())),
        ReduceOp::Sum => Scalar::Int(g.iter().fold(0i64, |a, s| a.wrapping_add(s.to_i64()))),
        ReduceOp::Prod if float => Scalar::Float(g.iter().map(|s| s.to_f64()).product()),
        ReduceOp::Prod => Scalar::Int(g.iter().fold(1i64, |a, s| a.wrapping_mul(s.to_i64()))),
        ReduceOp::Max | ReduceOp::Min => {
            let is_max = op == ReduceOp::Max;
            if float {
                let v: Vec<f64> = g.iter().map(|s| s.to_f64()).collect();
                if v.iter().any(|x| x.is_nan()) {
                    Scalar::Float(f64::NAN)
                } else if is_max {
                    Scalar::Float(v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
                } else {
                    Scalar::Float(v.iter().copied().fold(f64::INFINITY, f64::min))
                }
            } else {
                let it = g.iter().map(|s| s.to_i64());
                Scalar::Int(if is_max {
                    it.max().unwrap_or(0)
                } else {
                    it.min().unwrap_or(0)
                })
            }
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            // Compare in the input's own domain (i64 values do not fit f64 exactly); the
            // first NaN beats every number.
            let better = |x: Scalar, b: Scalar| -> bool {
                if float {
                    let (x, b) = (x.to_f64(), b.to_f64());
                    if b.is_nan() {
                        false
                    } else if x.is_nan() {
                        true
                    } else if op == ReduceOp::ArgMax {
                        x > b
                    } else {
                        x < b
                    }
                } else if op == ReduceOp::ArgMax {
                    x.to_i64() > b.to_i64()
                } else {
                    x.to_i64() < b.to_i64()
                }
            };
            let mut best: Option<(usize, Scalar)> = None;
            for (i, s) in g.iter().enumerate() {
                if best.is_none_or(|(_, b)| better(*s, b)) {
                    best = Some((i, *s));
                }
            }
            Scalar::Int(best.map(|b| b.0 as i64).unwrap_or(0))
        }
    });
    RefTensor::from_scalars(shape.to_vec(), dt, vals)
}

fn index_at(idx: &RefTensor, flat: usize, len: usize) -> Result<usize> {
    let i = idx.get(flat).to_i64();
    if i < 0 || i as usize >= len {
        return Err(KilnError::IndexOutOfRange {
            op: "gather",
            index: i,
            size: len,
        });
    }
    Ok(i as usize)
}

fn gather(src: &RefTensor, idx: &RefTensor, axis: usize, shape: &[usize]) -> Result<RefTensor> {
    let vals = (0..numel(shape))
        .map(|flat| {
            let mut c = unravel(flat, shape);
            c[axis] = index_at(idx, flat, src.shape[axis])?;
            Ok(src.get(ravel(&c, &src.shape)))
        })
        .collect::<Result<Vec<Scalar>>>()?;
    Ok(RefTensor::from_scalars(
        shape.to_vec(),
        src.dtype,
        vals.into_iter(),
    ))
}

/// Every lane along `axis`: the flat indices of its elements, in axis order.
fn lanes(shape: &[usize], axis: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = vec![];
    let mut seen = HashMap::new();
    for flat in 0..numel(shape) {
        let mut c = unravel(flat, shape);
        c[axis] = 0;
        let lane = *seen.entry(ravel(&c, shape)).or_insert_with(|| {
            out.push(vec![]);
            out.len() - 1
        });
        out[lane].push(flat);
    }
    out
}

fn scan(x: &RefTensor, op: ScanOp, axis: usize, dt: DType) -> RefTensor {
    let mut vals = vec![Scalar::Int(0); numel(&x.shape)];
    for lane in lanes(&x.shape, axis) {
        let (mut f, mut i) = match op {
            ScanOp::Sum => (0.0f64, 0i64),
            ScanOp::Prod => (1.0, 1),
        };
        for flat in lane {
            let v = x.get(flat);
            vals[flat] = if dt.is_float() {
                f = match op {
                    ScanOp::Sum => f + v.to_f64(),
                    ScanOp::Prod => f * v.to_f64(),
                };
                Scalar::Float(f)
            } else {
                i = match op {
                    ScanOp::Sum => i.wrapping_add(v.to_i64()),
                    ScanOp::Prod => i.wrapping_mul(v.to_i64()),
                };
                Scalar::Int(i)
            };
        }
    }
    RefTensor::from_scalars(x.shape.clone(), dt, vals.into_iter())
}

fn argsort(x: &RefTensor, axis: usize, descending: bool) -> RefTensor {
    let mut vals = vec![Scalar::Int(0); numel(&x.shape)];
    for lane in lanes(&x.shape, axis) {
        // Insertion sort: plainly stable. `before(a, b)`: a's key sorts strictly first.
        let key = |p: usize| x.get(lane[p]);
        let less = |a: Scalar, b: Scalar| {
            if x.dtype.is_float() {
                let (a, b) = (a.to_f64(), b.to_f64());
                !a.is_nan() && (b.is_nan() || a < b)
            } else {
                a.to_i64() < b.to_i64()
            }
        };
        let before = |a: usize, b: usize| {
            if descending {
                less(key(b), key(a))
            } else {
                less(key(a), key(b))
            }
        };
        let mut perm: Vec<usize> = vec![];
        for p in 0..lane.len() {
            let at = perm
                .iter()
                .position(|&q| before(p, q))
                .unwrap_or(perm.len());
            perm.insert(at, p);
        }
        for (slot, p) in lane.iter().zip(perm) {
            vals[*slot] = Scalar::Int(p as i64);
        }
    }
    RefTensor::from_scalars(x.shape.clone(), DType::I64, vals.into_iter())
}

fn scatter(
    idx: &RefTensor,
    values: &RefTensor,
    init: Option<&RefTensor>,
    axis: usize,
    reduce: ScatterReduce,
    shape: &[usize],
    dt: DType,
) -> Result<RefTensor> {
    let n = numel(shape);
    let mut places = Vec::with_capacity(numel(&idx.shape));
    for flat in 0..numel(&idx.shape) {
        let mut c = unravel(flat, &idx.shape);
        c[axis] = index_at(idx, flat, shape[axis])?;
        places.push(ravel(&c, shape));
    }
    let out = if dt.is_float() {
        let mut acc: Vec<f64> = match init {
            Some(t) => (0..n).map(|i| t.get(i).to_f64()).collect(),
            None => vec![reduce.float_identity(); n],
        };
        for (flat, &o) in places.iter().enumerate() {
            acc[o] = reduce.combine_f64(acc[o], values.get(flat).to_f64());
        }
        RefTensor::from_scalars(shape.to_vec(), dt, acc.into_iter().map(Scalar::Float))
    } else {
        let mut acc: Vec<i64> = match init {
            Some(t) => (0..n).map(|i| t.get(i).to_i64()).collect(),
            None => vec![reduce.int_identity(dt); n],
        };
        for (flat, &o) in places.iter().enumerate() {
            acc[o] = reduce.combine_i64(acc[o], values.get(flat).to_i64());
        }
        RefTensor::from_scalars(shape.to_vec(), dt, acc.into_iter().map(Scalar::Int))
    };
    Ok(out)
}

fn matmul(a: &RefTensor, b: &RefTensor, shape: &[usize], dt: DType) -> RefTensor {
    let nd = shape.len();
    let (m, n) = (shape[nd - 2], shape[nd - 1]);
    let k = a.shape[nd - 1];
    let batch: usize = shape[..nd - 2].iter().product();
    let mut out = Vec::with_capacity(numel(shape));
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let ia = |p: usize| bi * m * k + i * k + p;
                let ib = |p: usize| bi * k * n + p * n + j;
                if dt.is_float() {
                    // From +0, as in a sum (a product of depth 0 is +0).
                    let s: f64 = (0..k).fold(0.0, |acc, p| {
                        acc + a.get(ia(p)).to_f64() * b.get(ib(p)).to_f64()
                    });
                    out.push(Scalar::Float(s));
                } else {
                    let s = (0..k).fold(0i64, |acc, p| {
                        acc.wrapping_add(a.get(ia(p)).to_i64().wrapping_mul(b.get(ib(p)).to_i64()))
                    });
                    out.push(Scalar::Int(s));
                }
            }
        }
    }
    RefTensor::from_scalars(shape.to_vec(), dt, out.into_iter())
}
