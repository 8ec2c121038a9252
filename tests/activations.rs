//! PyTorch's activation functions (`src/tensor/activation.rs`), their modules and
//! functional forms: random inputs with the special values (0, -0, ±large, ±inf, NaN and
//! each function's kinks) against plain f64 formulas written here, in f64 and f32 and on
//! non-contiguous views; PyTorch's documented values and derivatives at the kinks by hand;
//! typed errors.

mod common;

use common::Rng;
use kiln::nn::functional as F;
use kiln::nn::{self, Module};
use kiln::{DType, KilnError, Tensor};

/// A tensor function under test.
type Activation = Box<dyn Fn(&Tensor) -> Tensor>;
/// A formula in f64.
type Formula = fn(f64) -> f64;

const SELU_ALPHA: f64 = 1.673_263_242_354_377_284_817_042_991_671_7;
const SELU_SCALE: f64 = 1.050_700_987_355_480_493_419_334_985_294_6;

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|_| lo + (hi - lo) * (rng.next() >> 11) as f64 / (1u64 << 53) as f64)
        .collect()
}

/// Random values in `[-8, 8]` and the special ones, with `extra` (the function's kinks).
fn inputs(seed: u64, extra: &[f64]) -> Vec<f64> {
    let mut v = uniform(&mut Rng(seed), 40, -8.0, 8.0);
    v.extend([
        0.0,
        -0.0,
        1.0,
        -1.0,
        30.0,
        -30.0,
        1000.0,
        -1000.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-7,
        -1e-7,
    ]);
    v.extend_from_slice(extra);
    v
}

/// Whether `got` matches `want` for the input `x`: both NaN, equal, or within `rtol` of
/// the larger of `|want|` and `|x|` (the scale an elementwise composite's rounding has).
fn close(got: f64, want: f64, x: f64, rtol: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if got == want {
        return true;
    }
    want.is_finite() && (got - want).abs() <= rtol * (want.abs().max(x.abs()) + 1e-300)
}

/// Checks `f` against `reference` in f64 and in f32, on a contiguous tensor and on a
/// transposed and a strided view of it.
fn check(name: &str, extra: &[f64], f: impl Fn(&Tensor) -> Tensor, reference: impl Fn(f64) -> f64) {
    let xs = inputs(name.len() as u64 * 7919, extra);
    for dtype in [DType::F64, DType::F32] {
        let rtol = if dtype == DType::F64 { 1e-13 } else { 3e-6 };
        let data = Tensor::from_vec(xs.clone(), [xs.len()]).cast(dtype);
        // The values kiln sees, after rounding to `dtype`.
        let seen = data.to_vec::<f64>().unwrap();
        let got = f(&data);
        assert_eq!(got.dtype(), dtype, "{name}: dtype");
        let got = got.to_vec::<f64>().unwrap();
        for (i, (&x, &g)) in seen.iter().zip(&got).enumerate() {
            let want = reference(x);
            assert!(
                close(g, want, x, rtol),
                "{name} {dtype:?} at x[{i}] = {x:e}: got {g:e}, want {want:e}"
            );
        }
    }
    // Views: a [6, 4] block transposed, and every other row of it.
    let data: Vec<f64> = xs.iter().cycle().take(24).copied().collect();
    let base = Tensor::from_vec(data.clone(), [6, 4]);
    let t = base.t();
    let got = f(&t).to_vec::<f64>().unwrap();
    for r in 0..4 {
        for c in 0..6 {
            let (x, g) = (data[c * 4 + r], got[r * 6 + c]);
            assert!(
                close(g, reference(x), x, 1e-13),
                "{name} transposed at ({r}, {c})"
            );
        }
    }
    let s = base.slice_dim(0, 1, 6, 2);
    let got = f(&s).to_vec::<f64>().unwrap();
    for r in 0..3 {
        for c in 0..4 {
            let (x, g) = (data[(1 + 2 * r) * 4 + c], got[r * 4 + c]);
            assert!(
                close(g, reference(x), x, 1e-13),
                "{name} strided at ({r}, {c})"
            );
        }
    }
}

fn clamp_nan(x: f64, lo: f64, hi: f64) -> f64 {
    if x.is_nan() {
        x
    } else if x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
    }
}

fn softplus_ref(x: f64, beta: f64, threshold: f64) -> f64 {
    if beta * x > threshold {
        x
    } else {
        (beta * x).exp().ln_1p() / beta
    }
}

#[test]
fn leaky_relu_elu_selu_celu_against_formulas() {
    for slope in [0.01, 0.2, -0.5] {
        check(
            "leaky_relu",
            &[],
            |t| t.leaky_relu(slope),
            |x| if x > 0.0 { x } else { x * slope },
        );
    }
    for alpha in [1.0, 0.5, 2.5] {
        check(
            "elu",
            &[],
            |t| t.elu(alpha),
            |x| if x > 0.0 { x } else { alpha * x.exp_m1() },
        );
        check(
            "celu",
            &[],
            |t| t.celu(alpha),
            |x| {
                if x > 0.0 {
                    x
                } else {
                    alpha * (x / alpha).exp_m1()
                }
            },
        );
    }
    check(
        "selu",
        &[],
        |t| t.selu(),
        |x| SELU_SCALE * if x > 0.0 { x } else { SELU_ALPHA * x.exp_m1() },
    );
    assert_eq!(kiln::tensor::SELU_ALPHA, SELU_ALPHA);
    assert_eq!(kiln::tensor::SELU_SCALE, SELU_SCALE);
}

#[test]
fn hard_functions_against_formulas() {
    for (lo, hi) in [(-1.0, 1.0), (-2.5, 0.5), (0.0, 6.0)] {
        check(
            "hardtanh",
            &[lo, hi],
            |t| t.hardtanh(lo, hi),
            |x| clamp_nan(x, lo, hi),
        );
    }
    check(
        "relu6",
        &[6.0, 5.999],
        |t| t.relu6(),
        |x| clamp_nan(x, 0.0, 6.0),
    );
    check(
        "hardsigmoid",
        &[3.0, -3.0, 2.9],
        |t| t.hardsigmoid(),
        |x| clamp_nan(x + 3.0, 0.0, 6.0) / 6.0,
    );
    // PyTorch's formula, `x · relu6(x + 3) / 6`: NaN at -inf (`-inf · 0`).
    check(
        "hardswish",
        &[3.0, -3.0, -2.9],
        |t| t.hardswish(),
        |x| x * clamp_nan(x + 3.0, 0.0, 6.0) / 6.0,
    );
    for lambd in [0.5, 0.0, 2.0] {
        check(
            "softshrink",
            &[lambd, -lambd],
            |t| t.softshrink(lambd),
            |x| {
                if x.is_nan() {
                    x
                } else if x > lambd {
                    x - lambd
                } else if x < -lambd {
                    x + lambd
                } else {
                    0.0
                }
            },
        );
        check(
            "hardshrink",
            &[lambd, -lambd],
            |t| t.hardshrink(lambd),
            |x| if x >= -lambd && x <= lambd { 0.0 } else { x },
        );
    }
    for (th, v) in [(0.0, 0.0), (1.5, -7.0), (-2.0, f64::NAN)] {
        check(
            "threshold",
            &[th],
            |t| t.threshold(th, v),
            |x| if x <= th { v } else { x },
        );
    }
}

#[test]
fn smooth_functions_against_formulas() {
    check("mish", &[], |t| t.mish(), |x| x * x.exp().ln_1p().tanh());
    check(
        "log_sigmoid",
        &[50.0, -50.0, 700.0],
        |t| t.log_sigmoid(),
        |x| {
            if x.is_nan() {
                x
            } else {
                x.min(0.0) - (-x.abs()).exp().ln_1p()
            }
        },
    );
    check("softsign", &[], |t| t.softsign(), |x| x / (1.0 + x.abs()));
    check("tanhshrink", &[], |t| t.tanhshrink(), |x| x - x.tanh());
    for (beta, threshold) in [(1.0, 20.0), (2.0, 3.0), (0.5, 10.0), (1.0, 5.0)] {
        check(
            "softplus_with",
            &[threshold / beta, 2.0 * threshold / beta],
            |t| t.softplus_with(beta, threshold),
            |x| softplus_ref(x, beta, threshold),
        );
    }
}

#[test]
fn documented_values_and_edge_cases() {
    let x = Tensor::from_vec(vec![-1000.0f64, 1000.0, 0.0], [3]);
    // log_sigmoid neither overflows nor loses its small values.
    let ls = x.log_sigmoid().to_vec::<f64>().unwrap();
    assert_eq!(ls[0], -1000.0);
    assert_eq!(ls[1], 0.0);
    assert!((ls[2] + std::f64::consts::LN_2).abs() < 1e-15);
    let small = Tensor::from_vec(vec![50.0f32], [1])
        .log_sigmoid()
        .to_vec::<f32>()
        .unwrap()[0];
    let want = -(-50.0f64).exp();
    assert!(((small as f64 - want) / want).abs() < 1e-5, "{small}");
    // elu(-inf) = -alpha; selu(-inf) = -scale·alpha; celu(-inf) = -alpha.
    let ninf = Tensor::from_vec(vec![f32::NEG_INFINITY], [1]);
    assert_eq!(ninf.elu(0.7).to_vec::<f32>().unwrap(), vec![-0.7]);
    assert_eq!(ninf.celu(3.0).to_vec::<f32>().unwrap(), vec![-3.0]);
    let s = ninf.selu().to_vec::<f32>().unwrap()[0];
    assert!((s as f64 + SELU_ALPHA * SELU_SCALE).abs() < 1e-6);
    // softsign(±inf) is NaN by PyTorch's formula; mish(-inf) is NaN (-inf · 0).
    let inf = Tensor::from_vec(vec![f32::INFINITY, f32::NEG_INFINITY], [2]);
    assert!(
        inf.softsign()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|v| v.is_nan())
    );
    let m = inf.mish().to_vec::<f32>().unwrap();
    assert_eq!(m[0], f32::INFINITY);
    assert!(m[1].is_nan());
    // hardtanh with crossed bounds: `clamp` gives the upper bound everywhere.
    let y = Tensor::from_vec(vec![-5.0f32, 0.5, 1.5, 5.0], [4]).hardtanh(2.0, 1.0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    // glu of a [2, 4] tensor along each dimension.
    let g = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 0.0, -1.0, 2.0, 1000.0], [2, 4]);
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let last = g.glu(-1).to_vec::<f64>().unwrap();
    let want = [1.0 * sig(3.0), 2.0 * sig(4.0), 0.0 * sig(2.0), -sig(1000.0)];
    for (a, b) in last.iter().zip(want) {
        assert!((a - b).abs() < 1e-15);
    }
    assert_eq!(g.glu(-1).shape(), &[2, 2]);
    let first = g.glu(0).to_vec::<f64>().unwrap();
    for c in 0..4 {
        let (a, b) = ([1.0, 2.0, 3.0, 4.0][c], [0.0, -1.0, 2.0, 1000.0][c]);
        assert!((first[c] - a * sig(b)).abs() < 1e-15);
    }
    // glu on a transposed view, and of an empty dimension.
    let gt = g.t().glu(0).to_vec::<f64>().unwrap();
    assert_eq!(gt.len(), 4);
    assert!((gt[0] - 1.0 * sig(3.0)).abs() < 1e-15);
    assert_eq!(Tensor::zeros([0, 3]).glu(0).shape(), &[0, 3]);
}

#[test]
fn integers_and_half_types() {
    // hardtanh, relu6 and threshold keep integer dtypes, bounds truncated as PyTorch's.
    let i = Tensor::from_vec(vec![-3i64, -1, 0, 2, 7], [5]);
    let h = i.hardtanh(-1.5, 2.9);
    assert_eq!(h.dtype(), DType::I64);
    assert_eq!(h.to_vec::<i64>().unwrap(), vec![-1, -1, 0, 2, 2]);
    assert_eq!(i.relu6().to_vec::<i64>().unwrap(), vec![0, 0, 0, 2, 6]);
    let t = Tensor::from_vec(vec![1i32, 2, 3], [3]).threshold(2.0, -5.0);
    assert_eq!(t.dtype(), DType::I32);
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![-5, -5, 3]);
    // softsign and tanhshrink of integers are f32.
    let s = i.softsign();
    assert_eq!(s.dtype(), DType::F32);
    assert_eq!(
        s.to_vec::<f32>().unwrap(),
        vec![-0.75, -0.5, 0.0, 2.0 / 3.0, 0.875]
    );
    assert_eq!(i.tanhshrink().dtype(), DType::F32);
    // f16 and bf16: computed in f32 and rounded once, so within half an ulp of the f64
    // value (plus the f32 rounding).
    let xs = [-4.0, -0.75, 0.3, 2.0, 9.0];
    for dtype in [DType::F16, DType::BF16] {
        let x = Tensor::from_vec(xs.to_vec(), [5]).cast(dtype);
        let seen = x.to_vec::<f64>().unwrap();
        let ulp = if dtype == DType::F16 {
            1.0 / 1024.0
        } else {
            1.0 / 128.0
        };
        let cases: Vec<(Tensor, Formula)> = vec![
            (x.elu(1.0), |v| if v > 0.0 { v } else { v.exp_m1() }),
            (x.mish(), |v| v * v.exp().ln_1p().tanh()),
            (x.log_sigmoid(), |v| -(-v).exp().ln_1p()),
            (x.hardswish(), |v| v * clamp_nan(v + 3.0, 0.0, 6.0) / 6.0),
        ];
        for (y, f) in cases {
            assert_eq!(y.dtype(), dtype);
            for (got, &v) in y.to_vec::<f64>().unwrap().iter().zip(&seen) {
                let want = f(v);
                assert!(
                    (got - want).abs() <= 0.5 * ulp * want.abs().max(1e-3) * 1.01,
                    "{dtype:?} at {v}: {got} vs {want}"
                );
            }
        }
    }
}

/// `(value, gradient)` of `f` at each of `xs` (f64), through `backward`.
fn value_and_grad(xs: &[f64], f: impl Fn(&Tensor) -> Tensor) -> (Vec<f64>, Vec<f64>) {
    let x = Tensor::from_vec(xs.to_vec(), [xs.len()]).requires_grad_(true);
    let y = f(&x);
    y.sum(..).backward().unwrap();
    (
        y.to_vec::<f64>().unwrap(),
        x.grad().unwrap().to_vec::<f64>().unwrap(),
    )
}

#[test]
fn gradients_at_kinks_are_pytorchs() {
    // hardtanh/relu6: 0 at the bounds themselves, 1 strictly inside.
    let (_, g) = value_and_grad(&[-1.0, -0.5, 1.0, 2.0], |t| t.hardtanh(-1.0, 1.0));
    assert_eq!(g, vec![0.0, 1.0, 0.0, 0.0]);
    let (_, g) = value_and_grad(&[0.0, 3.0, 6.0, 7.0], |t| t.relu6());
    assert_eq!(g, vec![0.0, 1.0, 0.0, 0.0]);
    // leaky_relu, elu, celu, selu at 0: the negative side's derivative.
    let (_, g) = value_and_grad(&[0.0], |t| t.leaky_relu(0.2));
    assert_eq!(g, vec![0.2]);
    let (_, g) = value_and_grad(&[0.0], |t| t.elu(0.7));
    assert_eq!(g, vec![0.7]);
    let (_, g) = value_and_grad(&[0.0], |t| t.celu(3.0));
    assert!((g[0] - 1.0).abs() < 1e-15);
    let (_, g) = value_and_grad(&[0.0], |t| t.selu());
    assert!((g[0] - SELU_ALPHA * SELU_SCALE).abs() < 1e-14);
    // hardsigmoid: 0 at ±3; hardswish: x/3 + 1/2 at ±3 (both ends included).
    let (_, g) = value_and_grad(&[-3.0, 0.0, 3.0], |t| t.hardsigmoid());
    assert_eq!(g, vec![0.0, 1.0 / 6.0, 0.0]);
    let (_, g) = value_and_grad(&[-3.0, 3.0, -4.0, 4.0], |t| t.hardswish());
    assert_eq!(g, vec![-0.5, 1.5, 0.0, 1.0]);
    // shrinks: 0 on the closed band.
    let (_, g) = value_and_grad(&[-0.5, 0.5, 0.6, -0.6], |t| t.softshrink(0.5));
    assert_eq!(g, vec![0.0, 0.0, 1.0, 1.0]);
    let (_, g) = value_and_grad(&[-0.5, 0.5, 0.6, -0.6], |t| t.hardshrink(0.5));
    assert_eq!(g, vec![0.0, 0.0, 1.0, 1.0]);
    // threshold: 0 where the value replaced x (x <= threshold).
    let (_, g) = value_and_grad(&[1.0, 1.5], |t| t.threshold(1.0, 5.0));
    assert_eq!(g, vec![0.0, 1.0]);
}

#[test]
fn no_nan_gradients_from_discarded_branches() {
    let big = [1000.0, -1000.0, 88.0, 710.0, -710.0];
    let fs: Vec<(&str, Activation)> = vec![
        ("elu", Box::new(|t| t.elu(1.0))),
        ("selu", Box::new(|t| t.selu())),
        ("celu", Box::new(|t| t.celu(0.5))),
        ("mish", Box::new(|t| t.mish())),
        ("log_sigmoid", Box::new(|t| t.log_sigmoid())),
        ("softplus_with", Box::new(|t| t.softplus_with(2.0, 5.0))),
        (
            "softplus_with 1 20",
            Box::new(|t| t.softplus_with(1.0, 20.0)),
        ),
        ("hardswish", Box::new(|t| t.hardswish())),
        ("hardsigmoid", Box::new(|t| t.hardsigmoid())),
        ("tanhshrink", Box::new(|t| t.tanhshrink())),
        ("softsign", Box::new(|t| t.softsign())),
    ];
    for (name, f) in fs {
        let (y, g) = value_and_grad(&big, &f);
        assert!(y.iter().all(|v| v.is_finite()), "{name}: values {y:?}");
        assert!(g.iter().all(|v| v.is_finite()), "{name}: gradients {g:?}");
    }
    // The exact gradients at the extremes.
    let (_, g) = value_and_grad(&[1000.0, -1000.0], |t| t.elu(1.0));
    assert_eq!(g, vec![1.0, 0.0]);
    let (_, g) = value_and_grad(&[1000.0, -1000.0], |t| t.softplus_with(2.0, 5.0));
    assert_eq!(g, vec![1.0, 0.0]);
    let (_, g) = value_and_grad(&[-1000.0, 1000.0], |t| t.log_sigmoid());
    assert_eq!(g, vec![1.0, 0.0]);
    // Infinite inputs of hardswish: gradients 0 and 1, as PyTorch's backward gives.
    let (_, g) = value_and_grad(&[f64::NEG_INFINITY, f64::INFINITY], |t| t.hardswish());
    assert_eq!(g, vec![0.0, 1.0]);
}

#[test]
fn prelu_function_and_module() {
    // One slope per channel (dimension 1) of a [2, 3, 2] input.
    let xs: Vec<f64> = uniform(&mut Rng(5), 12, -3.0, 3.0);
    let x = Tensor::from_vec(xs.clone(), [2, 3, 2]);
    let w = [0.1, -0.5, 2.0];
    let y = x
        .prelu(&Tensor::from_vec(w.to_vec(), [3]))
        .to_vec::<f64>()
        .unwrap();
    for (i, (&v, &got)) in xs.iter().zip(&y).enumerate() {
        let c = (i / 2) % 3;
        let want = if v > 0.0 { v } else { w[c] * v };
        assert_eq!(got, want, "at {i}");
    }
    // One shared slope, 0-d or one element; a 1-d or 0-d input.
    let v = Tensor::from_vec(vec![-2.0f32, 0.0, 3.0], [3]);
    let one = Tensor::from_vec(vec![0.25f32], [1]);
    assert_eq!(v.prelu(&one).to_vec::<f32>().unwrap(), vec![-0.5, 0.0, 3.0]);
    let scalar = Tensor::from_vec(vec![0.5f32], ());
    assert_eq!(
        v.prelu(&scalar).to_vec::<f32>().unwrap(),
        vec![-1.0, 0.0, 3.0]
    );
    let s = Tensor::from_vec(vec![-4.0f32], ()).prelu(&one);
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![-1.0]);

    // The module: PyTorch's init 0.25, parameter `weight` of shape [num_parameters].
    let m = nn::Prelu::default();
    let params = m.named_parameters();
    assert_eq!(params.len(), 1);
    assert_eq!(params[0].0, "weight");
    assert_eq!(params[0].1.shape(), &[1]);
    assert!(params[0].1.requires_grad());
    assert_eq!(params[0].1.to_vec::<f32>().unwrap(), vec![0.25]);
    let m3 = nn::Prelu::new(3, 0.1).unwrap();
    assert_eq!(m3.weight.shape(), &[3]);
    assert_eq!(m3.num_parameters(), 3);
    assert_eq!(m3.weight.to_vec::<f32>().unwrap(), vec![0.1; 3]);
    // Gradients reach the slopes: Σ x over the non-positive elements of each channel.
    let x = Tensor::from_vec(vec![-1.0f32, 2.0, -3.0, -4.0, 5.0, 0.0], [2, 3]);
    m3.forward(&x).unwrap().sum(..).backward().unwrap();
    let gw = m3.weight.grad().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(gw, vec![-5.0, 0.0, -3.0]);
    // Module output equals the function's.
    let xm = Tensor::from_vec(vec![-1.0f32, 2.0, -3.0], [1, 3]);
    assert_eq!(
        m3.forward(&xm).unwrap().to_vec::<f32>().unwrap(),
        F::prelu(&xm, &m3.weight).unwrap().to_vec::<f32>().unwrap()
    );
}

#[test]
fn modules_and_functional_forms_match_the_methods() {
    let xs: Vec<f64> = inputs(11, &[3.0, -3.0, 0.5, -0.5]);
    let x = Tensor::from_vec(xs.clone(), [xs.len()]).cast(DType::F32);
    let same = |name: &str, a: Tensor, b: Tensor| {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        for (p, q) in a.iter().zip(&b) {
            assert!(
                p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                "{name}"
            );
        }
    };
    let run = |m: &dyn Module| m.forward(&x).unwrap();
    same(
        "LeakyRelu",
        run(&nn::LeakyRelu::default()),
        x.leaky_relu(0.01),
    );
    same(
        "LeakyRelu(0.3)",
        run(&nn::LeakyRelu::new(0.3)),
        F::leaky_relu(&x, 0.3).unwrap(),
    );
    same("Elu", run(&nn::Elu::default()), F::elu(&x, 1.0).unwrap());
    same("Elu(2)", run(&nn::Elu::new(2.0)), x.elu(2.0));
    same("Selu", run(&nn::Selu), F::selu(&x).unwrap());
    same("Celu", run(&nn::Celu::default()), F::celu(&x, 1.0).unwrap());
    same("Celu(0.5)", run(&nn::Celu::new(0.5)), x.celu(0.5));
    same(
        "Hardtanh",
        run(&nn::Hardtanh::default()),
        F::hardtanh(&x, -1.0, 1.0).unwrap(),
    );
    same(
        "Hardtanh(-2, 3)",
        run(&nn::Hardtanh::new(-2.0, 3.0)),
        x.hardtanh(-2.0, 3.0),
    );
    same("Relu6", run(&nn::Relu6), F::relu6(&x).unwrap());
    same(
        "Hardsigmoid",
        run(&nn::Hardsigmoid),
        F::hardsigmoid(&x).unwrap(),
    );
    same("Hardswish", run(&nn::Hardswish), F::hardswish(&x).unwrap());
    same("Mish", run(&nn::Mish), F::mish(&x).unwrap());
    same(
        "LogSigmoid",
        run(&nn::LogSigmoid),
        F::logsigmoid(&x).unwrap(),
    );
    same("Softsign", run(&nn::Softsign), F::softsign(&x).unwrap());
    same("Softplus", run(&nn::Softplus::default()), x.softplus());
    same(
        "Softplus(2, 5)",
        run(&nn::Softplus::new(2.0, 5.0)),
        F::softplus(&x, 2.0, 5.0).unwrap(),
    );
    same(
        "Tanhshrink",
        run(&nn::Tanhshrink),
        F::tanhshrink(&x).unwrap(),
    );
    same(
        "Softshrink",
        run(&nn::Softshrink::default()),
        F::softshrink(&x, 0.5).unwrap(),
    );
    same(
        "Hardshrink",
        run(&nn::Hardshrink::default()),
        F::hardshrink(&x, 0.5).unwrap(),
    );
    same(
        "Hardshrink(1)",
        run(&nn::Hardshrink::new(1.0)),
        x.hardshrink(1.0),
    );
    same(
        "Threshold",
        run(&nn::Threshold::new(0.5, -1.0)),
        F::threshold(&x, 0.5, -1.0).unwrap(),
    );
    let x2 = Tensor::from_vec(xs[..48].to_vec(), [4, 12]).cast(DType::F32);
    same(
        "Glu",
        nn::Glu::default().forward(&x2).unwrap(),
        F::glu(&x2, -1).unwrap(),
    );
    same("Glu(0)", nn::Glu::new(0).forward(&x2).unwrap(), x2.glu(0));
    // Parameterless modules have no parameters.
    assert_eq!(nn::Mish.num_parameters(), 0);
    assert_eq!(nn::Glu::default().named_parameters().len(), 0);
    // PyTorch's defaults.
    assert_eq!(nn::LeakyRelu::default().negative_slope, 0.01);
    assert_eq!(nn::Softplus::default().beta, 1.0);
    assert_eq!(nn::Softplus::default().threshold, 20.0);
    assert_eq!(nn::Glu::default().dim, -1);
    assert_eq!(nn::Softshrink::default().lambd, 0.5);
    // In a Sequential, each activation fuses with its neighbours.
    let model = nn::Sequential::new()
        .push(nn::Linear::new(12, 6, true, 0).unwrap())
        .push(nn::Mish)
        .push(nn::Glu::default())
        .push(nn::Prelu::new(1, 0.25).unwrap());
    assert_eq!(model.forward(&x2).unwrap().shape(), &[4, 3]);
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, vec!["0.weight", "0.bias", "3.weight"]);
}

#[test]
fn typed_errors() {
    let ints = Tensor::from_vec(vec![1i64, -2], [2]);
    let bools = Tensor::from_vec(vec![true, false], [2]);
    let float_only: Vec<(&str, kiln::Result<Tensor>)> = vec![
        ("leaky_relu", ints.try_leaky_relu(0.01)),
        ("elu", ints.try_elu(1.0)),
        ("selu", ints.try_selu()),
        ("celu", ints.try_celu(1.0)),
        ("hardsigmoid", ints.try_hardsigmoid()),
        ("hardswish", ints.try_hardswish()),
        ("mish", ints.try_mish()),
        ("log_sigmoid", ints.try_log_sigmoid()),
        ("softplus", ints.try_softplus_with(2.0, 20.0)),
        ("glu", ints.try_glu(-1)),
        ("prelu", ints.try_prelu(&ints)),
        ("softshrink", ints.try_softshrink(0.5)),
        ("hardshrink", ints.try_hardshrink(0.5)),
        ("hardtanh", bools.try_hardtanh(-1.0, 1.0)),
        ("relu6", bools.try_relu6()),
        ("threshold", bools.try_threshold(0.0, 0.0)),
        ("softsign", bools.try_softsign()),
        ("tanhshrink", bools.try_tanhshrink()),
    ];
    for (name, r) in float_only {
        match r {
            Err(KilnError::UnsupportedDType { op, .. }) => assert_eq!(op, name),
            other => panic!("{name}: expected UnsupportedDType, got {other:?}"),
        }
    }
    // glu: an odd length, a 0-d tensor, a bad axis.
    let odd = Tensor::zeros([2, 5]);
    match odd.try_glu(1) {
        Err(KilnError::InvalidArgument { op, shape, reason }) => {
            assert_eq!(op, "glu");
            assert_eq!(shape, vec![2, 5]);
            assert!(reason.contains('5'), "{reason}");
        }
        other => panic!("glu odd: {other:?}"),
    }
    let msg = std::panic::catch_unwind(|| Tensor::zeros([3]).glu(0))
        .err()
        .and_then(|e| e.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("glu") && msg.contains("[3]"), "{msg}");
    assert!(matches!(
        Tensor::zeros(()).try_glu(0),
        Err(KilnError::InvalidArgument { op: "glu", .. })
    ));
    assert!(matches!(
        odd.try_glu(2),
        Err(KilnError::InvalidAxis { op: "glu", .. })
    ));
    // prelu: slopes that are not the channel count, a 2-d weight, another dtype, a 0-d
    // input with several slopes, a 1-d input with several slopes (PyTorch: one channel).
    let x = Tensor::zeros([2, 3, 4]);
    for w in [
        Tensor::zeros([4]),
        Tensor::zeros([1, 3]),
        Tensor::zeros([2]),
    ] {
        assert!(matches!(
            x.try_prelu(&w),
            Err(KilnError::InvalidArgument { op: "prelu", .. })
        ));
    }
    assert!(matches!(
        x.try_prelu(&Tensor::zeros([3]).cast(DType::F64)),
        Err(KilnError::DTypeMismatch { op: "prelu", .. })
    ));
    assert!(matches!(
        Tensor::zeros(()).try_prelu(&Tensor::zeros([2])),
        Err(KilnError::InvalidArgument { op: "prelu", .. })
    ));
    assert!(matches!(
        Tensor::zeros([3]).try_prelu(&Tensor::zeros([3])),
        Err(KilnError::InvalidArgument { op: "prelu", .. })
    ));
    // A module with the wrong slope count fails the same way.
    assert!(matches!(
        nn::Prelu::new(5, 0.25).unwrap().forward(&x),
        Err(KilnError::InvalidArgument { op: "prelu", .. })
    ));
    // celu with alpha 0, softshrink with a negative lambd, u8 hardtanh with negative bounds.
    let f = Tensor::zeros([2]);
    assert!(matches!(
        f.try_celu(0.0),
        Err(KilnError::InvalidArgument { op: "celu", .. })
    ));
    assert!(matches!(
        nn::Celu::new(0.0).forward(&f),
        Err(KilnError::InvalidArgument { op: "celu", .. })
    ));
    assert!(matches!(
        f.try_softshrink(-0.1),
        Err(KilnError::InvalidArgument {
            op: "softshrink",
            ..
        })
    ));
    assert!(matches!(
        Tensor::from_vec(vec![1u8], [1]).try_hardtanh(-1.0, 1.0),
        Err(KilnError::InvalidArgument { op: "hardtanh", .. })
    ));
    assert_eq!(
        Tensor::from_vec(vec![1u8, 9], [2])
            .relu6()
            .to_vec::<u8>()
            .unwrap(),
        vec![1, 6]
    );
}
