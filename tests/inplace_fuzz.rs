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
//! `KILN_INPLACE_FUZZ_SEED` and `KILN_INPLACE_FUZZ_CASES` pick other programs.

mod common;

use kiln::{KilnError, Tensor};

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

#[test]
fn random_updates_over_shared_buffers_agree_with_value_semantics() {
    let seed0: u64 = std::env::var("KILN_INPLACE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261203);
    let cases: u64 = std::env::var("KILN_INPLACE_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    for case in 0..cases {
        run(seed0.wrapping_add(case), 40);
    }
}
