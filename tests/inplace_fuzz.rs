//! Random programs of in-place updates over tensors that share buffers, against a model of
//! kiln's value semantics: every tensor handle has a value; an update changes the value of
//! the handle it is called on and of nothing else; `detach`, reshapes, transposes and
//! computations take the values their operands have when they are recorded. Updates are
//! `add_`, `mul_`, `sub_`, `div_` (by powers of two), `fill_`, `zero_` (scalars) and
//! `add_`, `copy_` (tensors). Tensors are realized at random points, alone or together.
//!
//! The oracle: every read gives the model's value, or fails with `Overwritten` (a value
//! that an in-place write through another tensor on the same buffer replaced). A wrong
//! value, or any other error, fails the test. The model does not say *when* a value is
//! gone, so a second check keeps the refusals honest: tensors that never shared a buffer
//! with anything must always read.
//!
//! A second mode (`random_updates_through_views_in_every_dtype_...`) draws a dtype per
//! program (f32, f64, f16, bf16, i32, i64), 2-D tensors up to 8×8, and aliases through
//! strided slices, flips, expands and pads as well; its model rounds every result to the
//! dtype, and it counts what it exercised so that a generator that stopped reaching a kind
//! of handle fails.
//!
//! A third mode (`values_saved_for_backward_...`) records the terms of a loss over a weight
//! that requires grad and data tensors that are aliased, combined, updated in place and
//! realized in between; after `backward`, the loss and the weight's gradient must be what
//! the values had when each term was recorded, or fail with `Overwritten` where a value a
//! term read was destroyed by a write recorded after it (PyTorch's "modified by an inplace
//! operation" error).
//!
//! `KILN_INPLACE_FUZZ_SEED` and `KILN_INPLACE_FUZZ_CASES` pick other programs.

mod common;

use kiln::{DType, KilnError, Scalar, Tensor, bf16, f16};

use common::Rng;

/// A small integer, so that sums and products stay exact in f32.
fn small(rng: &mut Rng) -> f32 {
    rng.below(7) as f32 - 3.0
}

/// A tensor handle with the value the model gives it.
struct Handle {
    t: Tensor,
    /// The variable the trace (`KILN_INPLACE_FUZZ_TRACE`) gives it.
    name: String,
    value: Vec<f32>,
    /// Made from, or used to make, a tensor that may share its buffer (an alias), or
    /// computed from such a tensor: its reads may be refused.
    may_share: bool,
}

/// What a scalar in-place update does to one element: `(old, c) -> new`.
type ScalarUpdate = fn(f32, f32) -> f32;

const SHAPES: [[usize; 2]; 3] = [[1, 4], [2, 2], [4, 1]];

fn shape_of(rng: &mut Rng) -> Vec<usize> {
    SHAPES[rng.below(SHAPES.len())].to_vec()
}

/// Reads `h`: the model's value, or a refusal where the model allows one.
fn check_read(h: &Handle, what: &str, step: usize, seed: u64) {
    let got = match rng_read(h, step) {
        Ok(v) => v,
        Err(KilnError::Overwritten { .. }) if h.may_share => return,
        Err(e) => panic!("seed {seed}, step {step}: {what}: unexpected error {e}"),
    };
    assert_eq!(
        got, h.value,
        "seed {seed}, step {step}: {what} read a wrong value"
    );
}

/// The trace's line for a read: checks the value unless the read is refused.
fn trace_read(h: &Handle, step: usize) {
    let read = match step % 3 {
        0 => format!("{}.to_vec::<f32>()", h.name),
        1 => format!("(&{} * 1.0).to_vec::<f32>()", h.name),
        _ => format!("{}.as_slice::<f32>().map(|s| s.to_vec())", h.name),
    };
    eprintln!(
        "if let Ok(v) = {read} {{ assert_eq!(v, vec!{:?}); }}",
        h.value
    );
}

/// One of the ways to read a tensor, chosen by the step number.
fn rng_read(h: &Handle, step: usize) -> kiln::Result<Vec<f32>> {
    match step % 3 {
        0 => h.t.to_vec::<f32>(),
        1 => (&h.t * 1.0).to_vec::<f32>(),
        _ => h.t.as_slice::<f32>().map(|s| s.to_vec()),
    }
}

fn run(seed: u64, steps: usize) {
    let trace = std::env::var_os("KILN_INPLACE_FUZZ_TRACE").is_some();
    let mut rng = Rng(seed);
    let mut hs: Vec<Handle> = vec![];
    let mut made = 0;
    let mut fresh = || {
        made += 1;
        format!("v{}", made - 1)
    };
    for step in 0..steps {
        // Keep a few tensors alive; drop one now and then (pending readers then go away).
        if hs.len() > 8 {
            let k = rng.below(hs.len());
            if trace {
                eprintln!("drop({});", hs[k].name);
            }
            hs.remove(k);
        }
        let pick = |rng: &mut Rng, hs: &[Handle]| rng.below(hs.len());
        let action = if hs.is_empty() { 0 } else { rng.below(8) };
        match action {
            // A new tensor, realized or not.
            0 => {
                let value: Vec<f32> = (0..4).map(|_| small(&mut rng)).collect();
                let t = Tensor::from_vec(value.clone(), shape_of(&mut rng));
                let realized = rng.below(2) == 0;
                if realized {
                    t.realize().unwrap();
                }
                let name = fresh();
                if trace {
                    eprintln!(
                        "let {name} = Tensor::from_vec({value:?}.map(|v: f64| v as f32).to_vec(), {:?});",
                        t.shape()
                    );
                    if realized {
                        eprintln!("{name}.realize().unwrap();");
                    }
                }
                hs.push(Handle {
                    t,
                    name,
                    value,
                    may_share: false,
                });
            }
            // An alias: `detach` or a reshape (shares the buffer once realized).
            1 => {
                let i = pick(&mut rng, &hs);
                let detach = rng.below(2) == 0;
                // A transpose of a square tensor: a view that is not a row-major reshape.
                let transpose = !detach && rng.below(2) == 0 && hs[i].t.shape() == [2, 2];
                let t = if transpose {
                    hs[i].t.t()
                } else if detach {
                    hs[i].t.detach()
                } else {
                    // A different shape: a reshape to the same shape is the tensor itself
                    // (the same handle, as `clone` gives), not another tensor.
                    let own = hs[i].t.shape().to_vec();
                    let others: Vec<&[usize; 2]> =
                        SHAPES.iter().filter(|s| s[..] != own[..]).collect();
                    hs[i]
                        .t
                        .try_reshape(others[rng.below(others.len())].to_vec())
                        .unwrap()
                };
                let name = fresh();
                if trace {
                    if transpose {
                        eprintln!("let {name} = {}.t();", hs[i].name);
                    } else if detach {
                        eprintln!("let {name} = {}.detach();", hs[i].name);
                    } else {
                        eprintln!("let {name} = {}.reshape({:?});", hs[i].name, t.shape());
                    }
                }
                hs[i].may_share = true;
                let mut value = hs[i].value.clone();
                if transpose {
                    value = vec![value[0], value[2], value[1], value[3]];
                }
                hs.push(Handle {
                    t,
                    name,
                    value,
                    may_share: true,
                });
            }
            // A computation over two tensors.
            2 => {
                let (i, j) = (pick(&mut rng, &hs), pick(&mut rng, &hs));
                let shape = hs[i].t.shape().to_vec();
                let rhs = hs[j].t.try_reshape(shape).unwrap();
                let t = hs[i].t.try_sub(&rhs).unwrap();
                let name = fresh();
                if trace {
                    eprintln!(
                        "let {name} = &{} - &{}.reshape({:?});",
                        hs[i].name,
                        hs[j].name,
                        hs[i].t.shape()
                    );
                }
                let value = hs[i]
                    .value
                    .iter()
                    .zip(&hs[j].value)
                    .map(|(a, b)| a - b)
                    .collect();
                let may_share = hs[i].may_share || hs[j].may_share;
                hs.push(Handle {
                    t,
                    name,
                    value,
                    may_share,
                });
            }
            // An in-place update.
            3 | 4 => {
                let i = pick(&mut rng, &hs);
                let c = small(&mut rng);
                let shape = hs[i].t.shape().to_vec();
                let kind = rng.below(8);
                // `div_` divides by a power of two, so values stay exact.
                let c = if kind == 4 {
                    [2.0, -2.0, 4.0, 0.5][rng.below(4)]
                } else {
                    c
                };
                let scalar_ops: [(&str, ScalarUpdate); 6] = [
                    ("add_", |v, c| v + c),
                    ("mul_", |v, c| v * c),
                    ("sub_", |v, c| v - c),
                    ("fill_", |_, c| c),
                    ("div_", |v, c| v / c),
                    ("zero_", |_, _| 0.0),
                ];
                let result = match kind {
                    0..=5 => {
                        let t = &hs[i].t;
                        let r = match kind {
                            0 => t.try_add_(c),
                            1 => t.try_mul_(c),
                            2 => t.try_sub_(c),
                            3 => t.try_fill_(c),
                            4 => t.try_div_(c),
                            _ => Ok(t.zero_()),
                        };
                        let f = scalar_ops[kind].1;
                        let r = r.map(|_| ());
                        hs[i].value.iter_mut().for_each(|v| *v = f(*v, c));
                        r
                    }
                    k => {
                        let j = pick(&mut rng, &hs);
                        if trace {
                            eprintln!(
                                "{}.{}(&{}.reshape({shape:?}));",
                                hs[i].name,
                                if k == 6 { "add_" } else { "copy_" },
                                hs[j].name
                            );
                        }
                        let src = hs[j].t.try_reshape(shape).unwrap();
                        let other = hs[j].value.clone();
                        let r = if k == 6 {
                            hs[i].t.try_add_(&src).map(|_| ())
                        } else {
                            hs[i].t.try_copy_(&src).map(|_| ())
                        };
                        for (v, o) in hs[i].value.iter_mut().zip(other) {
                            *v = if k == 6 { *v + o } else { o };
                        }
                        hs[i].may_share |= hs[j].may_share;
                        r
                    }
                };
                if trace && kind == 5 {
                    eprintln!("{}.zero_();", hs[i].name);
                } else if trace && kind < 5 {
                    eprintln!("{}.{}({c:?});", hs[i].name, scalar_ops[kind].0);
                }
                if let Err(e) = result {
                    panic!("seed {seed}, step {step}: recording an update failed: {e}");
                }
            }
            // Realize one tensor, or several together.
            5 => {
                let n = 1 + rng.below(3);
                let chosen: Vec<usize> = (0..n).map(|_| pick(&mut rng, &hs)).collect();
                let ts: Vec<&Tensor> = chosen.iter().map(|&i| &hs[i].t).collect();
                if trace {
                    let names: Vec<String> =
                        chosen.iter().map(|&i| format!("&{}", hs[i].name)).collect();
                    eprintln!("let _ = kiln::realize_all(&[{}]);", names.join(", "));
                }
                match kiln::realize_all(&ts) {
                    Ok(()) => {}
                    Err(KilnError::Overwritten { .. })
                        if chosen.iter().any(|&i| hs[i].may_share) => {}
                    Err(e) => panic!("seed {seed}, step {step}: realize: {e}"),
                }
            }
            // Read one.
            _ => {
                let i = pick(&mut rng, &hs);
                if trace {
                    trace_read(&hs[i], step);
                }
                check_read(&hs[i], &format!("tensor {i}"), step, seed);
            }
        }
    }
    for (i, h) in hs.iter().enumerate() {
        if trace {
            trace_read(h, steps);
        }
        check_read(h, &format!("tensor {i} at the end"), steps, seed);
    }
}

/// `KILN_INPLACE_FUZZ_SEED` and `KILN_INPLACE_FUZZ_CASES`, or their defaults.
fn seed_and_cases() -> (u64, u64) {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    (
        var("KILN_INPLACE_FUZZ_SEED", 20261203),
        var("KILN_INPLACE_FUZZ_CASES", 3000),
    )
}

#[test]
fn random_updates_over_shared_buffers_agree_with_value_semantics() {
    let (seed0, cases) = seed_and_cases();
    for case in 0..cases {
        run(seed0.wrapping_add(case), 40);
    }
}

// ---------------------------------------------------------------------------
// Views and dtypes: updates through slices, flips, expands, pads and transposes, in
// every dtype, against the same value semantics.
// ---------------------------------------------------------------------------

/// A 2-D value in the model, row-major; every element is held as f64, which is exact for
/// each dtype here (integers stay small; floats are rounded to the dtype after each op).
#[derive(Clone, Debug)]
struct Val {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl Val {
    fn build(rows: usize, cols: usize, f: impl Fn(usize, usize) -> f64) -> Val {
        let data = (0..rows * cols).map(|i| f(i / cols, i % cols)).collect();
        Val { rows, cols, data }
    }

    fn at(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }

    /// Equal element by element (a NaN equals a NaN; `-0` equals `+0`).
    fn same(&self, got: &[f64]) -> bool {
        got.len() == self.data.len()
            && got
                .iter()
                .zip(&self.data)
                .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()))
    }
}

/// A handle of the view-and-dtype mode.
struct ViewHandle {
    t: Tensor,
    /// How it was made: an index into [`KINDS`].
    kind: usize,
    name: String,
    value: Val,
    may_share: bool,
}

/// How a handle of the view mode was made: the view kinds of [`random_view`], then a new
/// tensor and a computation.
const KINDS: [&str; 9] = [
    "detach", "reshape", "t", "slice", "flip", "expand", "pad", "new", "computed",
];

/// What the programs exercised, per kind of handle: updates recorded on one, and reads of
/// one that were compared with the model (not refused).
#[derive(Default)]
struct Coverage {
    updated: [usize; 9],
    checked: [usize; 9],
    refused: usize,
}

/// Every dtype but `bool` and `u8` (whose values cannot go negative).
fn view_dtypes() -> Vec<DType> {
    kiln::dtype::ALL_DTYPES
        .into_iter()
        .filter(|d| !matches!(d, DType::Bool | DType::U8))
        .collect()
}

/// The result of one op on exact operands, rounded to `dt` as kiln stores it. Half types
/// compute in f32 and round once more; rounding the exact result twice (f64, then the
/// dtype) gives the same value as rounding it once for `+`, `-`, `*` and `/`, because each
/// wider format has more than twice the precision plus two bits of the narrower one.
fn round_to(dt: DType, v: f64) -> f64 {
    match dt {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

/// The largest magnitude a program lets values reach before it stops multiplying them
/// (no overflow to infinity, no integer wrap-around).
fn view_limit(dt: DType) -> f64 {
    match dt {
        DType::F16 => 1e4,
        DType::I32 => 1e8,
        DType::I64 => 1e12,
        _ => 1e30,
    }
}

/// A scalar of `dt`'s kind (an integer scalar for integer tensors, which PyTorch's
/// promotion keeps integral; a float scalar would make the result a float).
fn scalar_for(dt: DType, c: f64) -> Scalar {
    if dt.is_float() {
        Scalar::Float(c)
    } else {
        Scalar::Int(c as i64)
    }
}

/// Reads `h` as f64 values, one of three ways chosen by the step number.
fn view_read(h: &ViewHandle, step: usize) -> kiln::Result<Vec<f64>> {
    match step % 3 {
        0 => h.t.to_vec::<f64>(),
        1 => Ok(h
            .t
            .try_mul(Scalar::Int(-1))?
            .to_vec::<f64>()?
            .into_iter()
            .map(|v| -v)
            .collect()),
        _ => h.t.try_cast(DType::F64)?.to_vec::<f64>(),
    }
}

fn view_check(h: &ViewHandle, what: &str, step: usize, seed: u64, cov: &mut Coverage) {
    let got = match view_read(h, step) {
        Ok(v) => v,
        Err(KilnError::Overwritten { .. }) if h.may_share => {
            cov.refused += 1;
            return;
        }
        Err(e) => panic!(
            "seed {seed}, step {step}: {what} ({}): unexpected error {e}",
            h.name
        ),
    };
    assert!(
        h.value.same(&got),
        "seed {seed}, step {step}: {what} ({}, {:?}, shape {:?}) read {got:?}, the model says {:?}",
        h.name,
        h.t.dtype(),
        h.t.shape(),
        h.value.data
    );
    assert_eq!(h.t.shape(), [h.value.rows, h.value.cols]);
    cov.checked[h.kind] += 1;
}

/// A view of `h` (realized or not) that may share its buffer, with its value in the model;
/// the Rust expression for the trace.
fn random_view(rng: &mut Rng, h: &ViewHandle) -> (Tensor, Val, String, usize) {
    let v = &h.value;
    let (r, c) = (v.rows, v.cols);
    let n = &h.name;
    loop {
        match rng.below(7) {
            0 => return (h.t.detach(), v.clone(), format!("{n}.detach()"), 0),
            1 => {
                let shapes: Vec<(usize, usize)> = (1..=r * c)
                    .filter(|&a| (r * c) % a == 0 && a != r)
                    .map(|a| (a, r * c / a))
                    .filter(|&(a, b)| a <= 8 && b <= 8)
                    .collect();
                if shapes.is_empty() {
                    continue;
                }
                let (a, b) = shapes[rng.below(shapes.len())];
                let t = h.t.try_reshape([a, b]).unwrap();
                let val = Val::build(a, b, |i, j| v.data[i * b + j]);
                return (t, val, format!("{n}.reshape([{a}, {b}])"), 1);
            }
            2 => {
                let val = Val::build(c, r, |i, j| v.at(j, i));
                return (h.t.t(), val, format!("{n}.t()"), 2);
            }
            3 => {
                let d = rng.below(2);
                let len = if d == 0 { r } else { c };
                let lo = rng.below(len);
                let hi = lo + 1 + rng.below(len - lo);
                let step = 1 + rng.below(2);
                let k = (hi - lo).div_ceil(step);
                let t =
                    h.t.try_slice_dim(d as isize, lo as isize, hi as isize, step as isize)
                        .unwrap();
                let val = if d == 0 {
                    Val::build(k, c, |i, j| v.at(lo + i * step, j))
                } else {
                    Val::build(r, k, |i, j| v.at(i, lo + j * step))
                };
                return (t, val, format!("{n}.slice_dim({d}, {lo}, {hi}, {step})"), 3);
            }
            4 => {
                let d = rng.below(2);
                let val = if d == 0 {
                    Val::build(r, c, |i, j| v.at(r - 1 - i, j))
                } else {
                    Val::build(r, c, |i, j| v.at(i, c - 1 - j))
                };
                return (
                    h.t.try_flip([d]).unwrap(),
                    val,
                    format!("{n}.flip([{d}])"),
                    4,
                );
            }
            5 => {
                let k = 2 + rng.below(2);
                let (a, b) = if r == 1 {
                    (k, c)
                } else if c == 1 {
                    (r, k)
                } else {
                    continue;
                };
                let t = h.t.try_broadcast_to([a, b]).unwrap();
                let val = Val::build(a, b, |i, j| v.at(i.min(r - 1), j.min(c - 1)));
                return (t, val, format!("{n}.expand([{a}, {b}])"), 5);
            }
            _ => {
                let p: Vec<usize> = (0..4).map(|_| rng.below(2)).collect();
                let (a, b) = (r + p[0] + p[1], c + p[2] + p[3]);
                if a > 8 || b > 8 {
                    continue;
                }
                let pads = [(p[0], p[1]), (p[2], p[3])];
                let t = h.t.try_pad(&pads, 0).unwrap();
                let val = Val::build(a, b, |i, j| {
                    let (i, j) = (i as isize - p[0] as isize, j as isize - p[2] as isize);
                    if (0..r as isize).contains(&i) && (0..c as isize).contains(&j) {
                        v.at(i as usize, j as usize)
                    } else {
                        0.0
                    }
                });
                return (t, val, format!("{n}.pad(&{pads:?}, 0)"), 6);
            }
        }
    }
}

/// A tensor source for `add_`/`copy_` into a `(rows, cols)` target: another handle
/// reshaped to the target's shape, or one that broadcasts to it.
fn pick_source(
    rng: &mut Rng,
    hs: &[ViewHandle],
    rows: usize,
    cols: usize,
) -> Option<(Tensor, Val, String, usize)> {
    let fits: Vec<usize> = (0..hs.len())
        .filter(|&j| {
            let v = &hs[j].value;
            v.rows * v.cols == rows * cols
                || ((v.rows == rows || v.rows == 1) && (v.cols == cols || v.cols == 1))
        })
        .collect();
    if fits.is_empty() {
        return None;
    }
    let j = fits[rng.below(fits.len())];
    let v = &hs[j].value;
    let broadcasts = (v.rows == rows || v.rows == 1) && (v.cols == cols || v.cols == 1);
    if broadcasts && (v.rows * v.cols != rows * cols || rng.below(2) == 0) {
        let val = Val::build(rows, cols, |i, k| {
            v.at(i.min(v.rows - 1), k.min(v.cols - 1))
        });
        Some((hs[j].t.clone(), val, format!("&{}", hs[j].name), j))
    } else {
        let t = hs[j].t.try_reshape([rows, cols]).unwrap();
        let val = Val::build(rows, cols, |i, k| v.data[i * cols + k]);
        Some((
            t,
            val,
            format!("&{}.reshape([{rows}, {cols}])", hs[j].name),
            j,
        ))
    }
}

fn run_views(seed: u64, steps: usize, cov: &mut Coverage) {
    let trace = std::env::var_os("KILN_INPLACE_FUZZ_TRACE").is_some();
    let say = |line: String| {
        if trace {
            eprintln!("{line}");
        }
    };
    let mut rng = Rng(seed ^ 0x7669_6577);
    let dtypes = view_dtypes();
    let dt = dtypes[rng.below(dtypes.len())];
    let mut hs: Vec<ViewHandle> = vec![];
    let mut made = 0;
    let mut fresh = || {
        made += 1;
        format!("v{}", made - 1)
    };
    say(format!("// seed {seed}, dtype {dt:?}"));
    for step in 0..steps {
        if hs.len() > 8 {
            let k = rng.below(hs.len());
            say(format!("drop({});", hs[k].name));
            hs.remove(k);
        }
        let action = if hs.is_empty() { 0 } else { rng.below(9) };
        match action {
            0 => {
                let (r, c) = (1 + rng.below(4), 1 + rng.below(4));
                let data: Vec<f32> = (0..r * c).map(|_| small(&mut rng)).collect();
                let t = Tensor::from_vec(data.clone(), [r, c]).cast(dt);
                let realized = rng.below(3) != 0;
                if realized {
                    t.realize().unwrap();
                }
                let name = fresh();
                say(format!(
                    "let {name} = Tensor::from_vec(vec!{data:?}, [{r}, {c}]).cast(DType::{dt:?});"
                ));
                if realized {
                    say(format!("{name}.realize().unwrap();"));
                }
                let value = Val::build(r, c, |i, j| data[i * c + j] as f64);
                hs.push(ViewHandle {
                    t,
                    kind: 7,
                    name,
                    value,
                    may_share: false,
                });
            }
            1 | 2 => {
                let i = rng.below(hs.len());
                let (t, value, expr, kind) = random_view(&mut rng, &hs[i]);
                let name = fresh();
                say(format!("let {name} = {expr};"));
                hs[i].may_share = true;
                hs.push(ViewHandle {
                    t,
                    kind,
                    name,
                    value,
                    may_share: true,
                });
            }
            3 => {
                let i = rng.below(hs.len());
                let (r, c) = (hs[i].value.rows, hs[i].value.cols);
                let name = fresh();
                let (t, value, may_share) = match pick_source(&mut rng, &hs, r, c) {
                    Some((src, sv, expr, j)) => {
                        say(format!("let {name} = &{} - {expr};", hs[i].name));
                        let value = Val::build(r, c, |a, b| {
                            round_to(dt, hs[i].value.at(a, b) - sv.at(a, b))
                        });
                        let shares = hs[i].may_share || hs[j].may_share;
                        (hs[i].t.try_sub(&src).unwrap(), value, shares)
                    }
                    None => {
                        say(format!("let {name} = &{0} + &{0};", hs[i].name));
                        let value =
                            Val::build(r, c, |a, b| round_to(dt, 2.0 * hs[i].value.at(a, b)));
                        (hs[i].t.try_add(&hs[i].t).unwrap(), value, hs[i].may_share)
                    }
                };
                hs.push(ViewHandle {
                    t,
                    kind: 8,
                    name,
                    value,
                    may_share,
                });
            }
            4..=6 => {
                let i = rng.below(hs.len());
                let (r, c) = (hs[i].value.rows, hs[i].value.cols);
                let big = hs[i].value.data.iter().fold(0f64, |m, v| m.max(v.abs()));
                let kind = rng.below(8);
                let name = hs[i].name.clone();
                cov.updated[hs[i].kind] += 1;
                let outcome: kiln::Result<()> = if kind < 6 {
                    let mut c0 = small(&mut rng) as f64;
                    if kind == 1 && big * c0.abs() > view_limit(dt) {
                        c0 = 1.0;
                    }
                    if kind == 4 {
                        c0 = [2.0, -2.0, 4.0, 0.5][rng.below(4)];
                    }
                    // A true division takes a float scalar in every dtype (PyTorch's `/`).
                    let s = if kind == 4 {
                        Scalar::Float(c0)
                    } else {
                        scalar_for(dt, c0)
                    };
                    let t = &hs[i].t;
                    let (op, r) = match kind {
                        0 => ("add_", t.try_add_(s).map(|_| ())),
                        1 => ("mul_", t.try_mul_(s).map(|_| ())),
                        2 => ("sub_", t.try_sub_(s).map(|_| ())),
                        3 => ("fill_", t.try_fill_(s).map(|_| ())),
                        4 => ("div_", t.try_div_(s).map(|_| ())),
                        _ => ("zero_", Ok(t.zero_()).map(|_| ())),
                    };
                    if kind == 5 {
                        say(format!("{name}.zero_();"));
                    } else {
                        say(format!("let _ = {name}.try_{op}(Scalar::{s:?});"));
                    }
                    if kind == 4 && !dt.is_float() {
                        // PyTorch's rule: a true division's float result cannot be
                        // stored in an integer tensor.
                        match r {
                            Err(KilnError::UnsupportedDType { op: "div_", .. }) => {}
                            other => panic!(
                                "seed {seed}, step {step}: div_ of a {dt:?} tensor gave {other:?}"
                            ),
                        }
                        Ok(())
                    } else {
                        let f = |v: f64| match kind {
                            0 => v + c0,
                            1 => v * c0,
                            2 => v - c0,
                            3 => c0,
                            4 => v / c0,
                            _ => 0.0,
                        };
                        hs[i]
                            .value
                            .data
                            .iter_mut()
                            .for_each(|v| *v = round_to(dt, f(*v)));
                        r
                    }
                } else if let Some((src, sv, expr, j)) = pick_source(&mut rng, &hs, r, c) {
                    let copy = kind == 7;
                    let op = if copy { "copy_" } else { "add_" };
                    say(format!("let _ = {name}.try_{op}({expr});"));
                    let shares = hs[j].may_share;
                    let res = if copy {
                        hs[i].t.try_copy_(&src).map(|_| ())
                    } else {
                        hs[i].t.try_add_(&src).map(|_| ())
                    };
                    let old = hs[i].value.clone();
                    hs[i].value = Val::build(r, c, |a, b| {
                        if copy {
                            sv.at(a, b)
                        } else {
                            round_to(dt, old.at(a, b) + sv.at(a, b))
                        }
                    });
                    hs[i].may_share |= shares;
                    res
                } else {
                    Ok(())
                };
                if let Err(e) = outcome {
                    panic!("seed {seed}, step {step}: recording an update of {name} failed: {e}");
                }
            }
            7 => {
                let n = 1 + rng.below(3);
                let chosen: Vec<usize> = (0..n).map(|_| rng.below(hs.len())).collect();
                let ts: Vec<&Tensor> = chosen.iter().map(|&i| &hs[i].t).collect();
                let names: Vec<String> =
                    chosen.iter().map(|&i| format!("&{}", hs[i].name)).collect();
                say(format!(
                    "let _ = kiln::realize_all(&[{}]);",
                    names.join(", ")
                ));
                match kiln::realize_all(&ts) {
                    Ok(()) => {}
                    Err(KilnError::Overwritten { .. })
                        if chosen.iter().any(|&i| hs[i].may_share) => {}
                    Err(e) => panic!("seed {seed}, step {step}: realize: {e}"),
                }
            }
            _ => {
                let i = rng.below(hs.len());
                say(format!(
                    "// read {} (mode {}): {:?}",
                    hs[i].name,
                    step % 3,
                    hs[i].value.data
                ));
                view_check(&hs[i], "a read", step, seed, cov);
            }
        }
    }
    for h in &hs {
        view_check(h, "a read at the end", steps, seed, cov);
    }
}

#[test]
fn random_updates_through_views_in_every_dtype_agree_with_value_semantics() {
    let (seed0, cases) = seed_and_cases();
    let mut cov = Coverage::default();
    for case in 0..cases {
        run_views(seed0.wrapping_add(case), 40, &mut cov);
    }
    // The programs reached every kind of handle, updated and read back (a generator that
    // stopped making one, or reads that were all refused, would test nothing).
    for (k, name) in KINDS.iter().enumerate() {
        eprintln!(
            "{name}: {} updates, {} reads compared",
            cov.updated[k], cov.checked[k]
        );
        if cases >= 1000 {
            assert!(
                cov.updated[k] > 0 && cov.checked[k] > 0,
                "no {name} handle updated and read"
            );
        }
    }
    let checked: usize = cov.checked.iter().sum();
    eprintln!("{} reads refused (overwritten)", cov.refused);
    assert!(checked > cov.refused, "most reads should be compared");
}

// ---------------------------------------------------------------------------
// Values saved for backward: data tensors used by a loss are updated in place before
// `backward` (or before its gradients are realized), as a training loop's inputs might be.
// ---------------------------------------------------------------------------

/// A data tensor of the autograd mode: a value in the model, and the values it reads.
struct DataHandle {
    t: Tensor,
    name: String,
    value: Vec<f32>,
    /// The family whose buffer an update of this tensor writes (aliases share it).
    family: usize,
    /// The values this one reads, as `(family, writes to it when the value was made)`: its
    /// own first, then those of what it was computed from. A write to a family recorded
    /// after a value of it was made destroys that value when it runs (the write's own
    /// handle takes the new value; every other holder of the old one loses it).
    reads: Vec<(usize, usize)>,
}

/// `[2, 2]` values, row-major.
fn transpose2(v: &[f32]) -> Vec<f32> {
    vec![v[0], v[2], v[1], v[3]]
}

/// One program: a weight that requires grad, data tensors that are aliased, combined,
/// updated in place and realized at random points, and terms of a loss recorded among
/// them. The loss and the weight's gradient must be what the values had when each term
/// was recorded, or fail with `Overwritten` where a value a term read was overwritten
/// since (PyTorch's "modified by an inplace operation" error); never a wrong value.
/// Returns `(compared, refused)` for the gradient.
fn run_saved(seed: u64, steps: usize) -> (usize, usize) {
    let trace = std::env::var_os("KILN_INPLACE_FUZZ_TRACE").is_some();
    let say = |line: String| {
        if trace {
            eprintln!("{line}");
        }
    };
    let mut rng = Rng(seed ^ 0x6772_6164);
    let w_val: Vec<f32> = (0..4).map(|_| small(&mut rng)).collect();
    let w = Tensor::from_vec(w_val.clone(), [2, 2]).requires_grad_(true);
    w.realize().unwrap();
    say(format!(
        "let w = Tensor::from_vec(vec!{w_val:?}, [2, 2]).requires_grad_(true);"
    ));
    // Updates so far per family.
    let mut writes: Vec<usize> = vec![];
    let mut ds: Vec<DataHandle> = vec![];
    // Terms: (loss term, its value, its gradient for w, the values it reads).
    type Term = (Tensor, f32, Vec<f32>, Vec<(usize, usize)>);
    let mut terms: Vec<Term> = vec![];
    let mut made = 0;
    let mut fresh = || {
        made += 1;
        format!("d{}", made - 1)
    };
    for step in 0..steps {
        let action = if ds.is_empty() { 0 } else { rng.below(8) };
        match action {
            0 => {
                let value: Vec<f32> = (0..4).map(|_| small(&mut rng)).collect();
                let t = Tensor::from_vec(value.clone(), [2, 2]);
                let name = fresh();
                say(format!(
                    "let {name} = Tensor::from_vec(vec!{value:?}, [2, 2]);"
                ));
                if rng.below(2) == 0 {
                    t.realize().unwrap();
                    say(format!("{name}.realize().unwrap();"));
                }
                writes.push(0);
                let family = writes.len() - 1;
                ds.push(DataHandle {
                    t,
                    name,
                    value,
                    family,
                    reads: vec![(family, 0)],
                });
            }
            // An alias: shares the buffer once realized.
            1 => {
                let i = rng.below(ds.len());
                let transpose = rng.below(2) == 0;
                let (t, value) = if transpose {
                    (ds[i].t.t(), transpose2(&ds[i].value))
                } else {
                    (ds[i].t.detach(), ds[i].value.clone())
                };
                let name = fresh();
                say(format!(
                    "let {name} = {}.{}();",
                    ds[i].name,
                    if transpose { "t" } else { "detach" }
                ));
                let (family, reads) = (ds[i].family, ds[i].reads.clone());
                ds.push(DataHandle {
                    t,
                    name,
                    value,
                    family,
                    reads,
                });
            }
            // A combination of two: a buffer of its own, reading both.
            2 => {
                let (i, j) = (rng.below(ds.len()), rng.below(ds.len()));
                let t = &ds[i].t + &ds[j].t;
                let value = ds[i]
                    .value
                    .iter()
                    .zip(&ds[j].value)
                    .map(|(a, b)| a + b)
                    .collect();
                let name = fresh();
                say(format!("let {name} = &{} + &{};", ds[i].name, ds[j].name));
                writes.push(0);
                let family = writes.len() - 1;
                let mut reads = vec![(family, 0)];
                reads.extend(&ds[i].reads);
                reads.extend(&ds[j].reads);
                ds.push(DataHandle {
                    t,
                    name,
                    value,
                    family,
                    reads,
                });
            }
            // A term of the loss.
            3 | 4 => {
                let i = rng.below(ds.len());
                let d = &ds[i];
                let (term, value, grad, expr) = match rng.below(3) {
                    0 => {
                        let v: f32 = w_val.iter().zip(&d.value).map(|(a, b)| a * b).sum();
                        (
                            (&w * &d.t).sum(..),
                            v,
                            d.value.clone(),
                            format!("(&w * &{})", d.name),
                        )
                    }
                    1 => {
                        let wt = transpose2(&w_val);
                        let v: f32 = wt.iter().zip(&d.value).map(|(a, b)| a * b).sum();
                        let g = transpose2(&d.value);
                        (
                            (&w.t() * &d.t).sum(..),
                            v,
                            g,
                            format!("(&w.t() * &{})", d.name),
                        )
                    }
                    _ => {
                        let sq: Vec<f32> = d.value.iter().map(|x| x * x).collect();
                        let v: f32 = w_val.iter().zip(&sq).map(|(a, b)| a * b).sum();
                        let t = (&w * &d.t * &d.t).sum(..);
                        (t, v, sq, format!("(&w * &{0} * &{0})", d.name))
                    }
                };
                say(format!("terms.push({expr}.sum(..));"));
                terms.push((term, value, grad, d.reads.clone()));
            }
            // An in-place update of a data tensor (never of `w`).
            5 => {
                let i = rng.below(ds.len());
                let c = small(&mut rng);
                let name = ds[i].name.clone();
                let kind = rng.below(4);
                // `add_` and `mul_` read the old value: if another handle's write already
                // destroyed it, the new value is made from a destroyed one and stays so.
                let old = ds[i].reads[0];
                if kind < 2 && old.1 != writes[old.0] {
                    ds[i].reads.push(old);
                }
                match kind {
                    0 => {
                        say(format!("{name}.add_({c:?});"));
                        ds[i].t.add_(c);
                        ds[i].value.iter_mut().for_each(|v| *v += c);
                    }
                    1 => {
                        say(format!("{name}.mul_({c:?});"));
                        ds[i].t.mul_(c);
                        ds[i].value.iter_mut().for_each(|v| *v *= c);
                    }
                    2 => {
                        say(format!("{name}.fill_({c:?});"));
                        ds[i].t.fill_(c);
                        ds[i].value.iter_mut().for_each(|v| *v = c);
                    }
                    _ => {
                        let j = rng.below(ds.len());
                        say(format!("{name}.copy_(&{});", ds[j].name));
                        ds[i].t.copy_(&ds[j].t);
                        ds[i].value = ds[j].value.clone();
                        let more = ds[j].reads.clone();
                        ds[i].reads.extend(more);
                    }
                }
                let f = ds[i].family;
                writes[f] += 1;
                ds[i].reads[0] = (f, writes[f]);
            }
            6 => {
                let n = 1 + rng.below(2);
                let chosen: Vec<usize> = (0..n).map(|_| rng.below(ds.len())).collect();
                let ts: Vec<&Tensor> = chosen.iter().map(|&i| &ds[i].t).collect();
                let names: Vec<String> =
                    chosen.iter().map(|&i| format!("&{}", ds[i].name)).collect();
                say(format!(
                    "let _ = kiln::realize_all(&[{}]);",
                    names.join(", ")
                ));
                match kiln::realize_all(&ts) {
                    Ok(()) | Err(KilnError::Overwritten { .. }) => {}
                    Err(e) => panic!("seed {seed}, step {step}: realize: {e}"),
                }
            }
            _ => {
                if ds.len() > 6 {
                    let k = rng.below(ds.len());
                    say(format!("drop({});", ds[k].name));
                    ds.remove(k);
                }
            }
        }
    }
    if terms.is_empty() {
        return (0, 0);
    }
    let stale = terms
        .iter()
        .any(|(_, _, _, reads)| reads.iter().any(|&(f, n)| writes[f] != n));
    let mut loss = terms[0].0.clone();
    for (t, ..) in &terms[1..] {
        loss = &loss + t;
    }
    let want_loss: f32 = terms.iter().map(|(_, v, ..)| v).sum();
    let mut want_grad = vec![0f32; 4];
    for (_, _, g, _) in &terms {
        for (a, b) in want_grad.iter_mut().zip(g) {
            *a += b;
        }
    }
    say("let loss = terms.iter().skip(1).fold(terms[0].clone(), |a, t| &a + t);".into());
    say(format!(
        "loss.backward().unwrap(); // loss {want_loss}, grad {want_grad:?}, refusal allowed: {stale}"
    ));
    loss.backward().unwrap();
    let grad = w.grad().expect("w has a gradient after backward");
    // Realize the loss and the gradient together, or the gradient alone.
    let together = rng.below(2) == 0;
    let got = if together {
        kiln::realize_all(&[&loss, &grad])
            .and_then(|()| Ok((loss.to_vec::<f32>()?, grad.to_vec::<f32>()?)))
    } else {
        grad.to_vec::<f32>()
            .and_then(|g| Ok((loss.to_vec::<f32>()?, g)))
    };
    match got {
        Ok((l, g)) => {
            assert_eq!(l, vec![want_loss], "seed {seed}: the loss");
            assert_eq!(g, want_grad, "seed {seed}: the weight's gradient");
            (1, 0)
        }
        Err(KilnError::Overwritten { .. }) if stale => (0, 1),
        Err(e) => panic!("seed {seed}: reading the loss and gradient: unexpected error {e}"),
    }
}

#[test]
fn values_saved_for_backward_and_updated_in_place_give_the_recorded_gradients_or_fail() {
    let (seed0, cases) = seed_and_cases();
    let (mut compared, mut refused) = (0, 0);
    for case in 0..cases {
        let (c, r) = run_saved(seed0.wrapping_add(case), 30);
        compared += c;
        refused += r;
    }
    eprintln!("gradients compared {compared}, refused (overwritten) {refused}");
    if cases >= 1000 {
        assert!(
            compared > refused && refused > 0,
            "{compared} compared, {refused} refused"
        );
    }
}
