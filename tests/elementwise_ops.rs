//! The elementwise ops added after the first op table — floor, ceil, round, trunc, sign,
//! log1p, expm1, exp2, rsqrt, square, softplus, silu, tan, asin, acos, atan, sinh, cosh,
//! asinh, acosh, atanh, isnan/isinf/isfinite, remainder,
//! fmod, floor_divide, clamp with tensor bounds — and the repeat/tile views: values from
//! PyTorch 2 (CPU, computed with `torch` and pasted here, as the comments say), checked
//! against kiln's realized result and the reference evaluator, plus gradients and the
//! number of kernels `repeat` records.

use half::{bf16, f16};
use kiln::reference::{self, RefData};
use kiln::{DType, RealizeOptions, Tensor};

const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

fn f32s(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.iter().map(|&x| x as f32).collect(), [v.len()])
}

/// Bit-exact comparison of f32 results (NaN equals NaN, `-0` differs from `+0`), of both
/// kiln's realized tensor and the reference evaluator.
#[track_caller]
fn exact_f32(t: &Tensor, want: &[f64]) {
    assert_eq!(t.dtype(), DType::F32);
    let r = reference::evaluate(t).unwrap().to_f64();
    let got = t.to_vec::<f32>().unwrap();
    for (i, &w) in want.iter().enumerate() {
        let w = w as f32;
        let same = |g: f32| (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(same(got[i]), "kiln [{i}]: {:e} want {w:e}", got[i]);
        assert!(same(r[i] as f32), "reference [{i}]: {:e} want {w:e}", r[i]);
    }
}

/// f32 results within `ulps` units in the last place (infinities and NaN exactly), for
/// kiln and the reference.
#[track_caller]
fn close_f32(t: &Tensor, want: &[f64], ulps: f64) {
    assert_eq!(t.dtype(), DType::F32);
    let r = reference::evaluate(t).unwrap().to_f64();
    let got = t.to_vec::<f32>().unwrap();
    for (i, &w) in want.iter().enumerate() {
        for (who, g) in [("kiln", got[i] as f64), ("reference", r[i])] {
            if w.is_nan() || w.is_infinite() || w == 0.0 {
                assert!(
                    (g.is_nan() && w.is_nan()) || g == w,
                    "{who} [{i}]: {g:e} want {w:e}"
                );
                continue;
            }
            let ulp = ((w as f32).abs().next_up() - (w as f32).abs()) as f64;
            assert!(
                (g - w).abs() <= ulps * ulp,
                "{who} [{i}]: {g:e} want {w:e} ({} ulp)",
                (g - w).abs() / ulp
            );
        }
    }
}

/// Exact integer (or bool as 0/1) results, for kiln and the reference.
#[track_caller]
fn exact_i(t: &Tensor, dt: DType, want: &[i64]) {
    assert_eq!(t.dtype(), dt);
    let r = reference::evaluate(t).unwrap();
    assert_eq!(r.data, RefData::I(want.to_vec()), "reference");
    assert!(!dt.is_float(), "not an integer dtype");
    // `to_vec` converts exactly from every integer dtype and bool (0/1).
    let got = t.to_vec::<i64>().unwrap();
    assert_eq!(got, want, "kiln");
}

/// Realized one op per kernel, an f64 tensor agrees with the reference bit for bit.
#[track_caller]
fn unfused_agrees(t: &Tensor) {
    let want = reference::evaluate(t).unwrap().to_f64();
    t.realize_with(&RealizeOptions::unfused()).unwrap();
    let got: Vec<f64> = t.to_vec::<f64>().unwrap();
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w || (g.is_nan() && w.is_nan()), "[{i}]: {g} want {w}");
    }
}

// Inputs of the rounding tests, and PyTorch's results (torch 2, float32):
// torch.floor/ceil/round/trunc/sign(torch.tensor(X)), signs of zeros read with signbit.
const X: [f64; 14] = [
    -2.5, -1.5, -0.7, -0.5, -0.0, 0.0, 0.3, 0.5, 1.5, 2.5, 3.7, INF, -INF, NAN,
];

#[test]
fn floor_ceil_round_trunc_match_pytorch() {
    let x = f32s(&X);
    // From PyTorch.
    exact_f32(
        &x.floor(),
        &[
            -3.0, -2.0, -1.0, -1.0, -0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, INF, -INF, NAN,
        ],
    );
    exact_f32(
        &x.ceil(),
        &[
            -2.0, -1.0, -0.0, -0.0, -0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 4.0, INF, -INF, NAN,
        ],
    );
    // Half to even: -2.5 -> -2, -1.5 -> -2, 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
    exact_f32(
        &x.round(),
        &[
            -2.0, -2.0, -1.0, -0.0, -0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 4.0, INF, -INF, NAN,
        ],
    );
    exact_f32(
        &x.trunc(),
        &[
            -2.0, -1.0, -0.0, -0.0, -0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, INF, -INF, NAN,
        ],
    );
    // Large values are already integers; f64 too.
    let big = Tensor::from_vec(vec![4503599627370497.0f64, -0.49999999999999994, 2.5], [3]);
    assert_eq!(
        big.round().to_vec::<f64>().unwrap(),
        vec![4503599627370497.0, -0.0, 2.0]
    );
    assert_eq!(big.floor().to_vec::<f64>().unwrap()[1], -1.0);
    // Half types round in f32 and store the (representable) integer.
    let h = Tensor::from_vec(vec![f16::from_f32(2.5), f16::from_f32(-3.5)], [2]);
    assert_eq!(
        h.round().to_vec::<f16>().unwrap(),
        vec![f16::from_f32(2.0), f16::from_f32(-4.0)]
    );
    let b = Tensor::from_vec(vec![bf16::from_f32(1.75), bf16::from_f32(-1.75)], [2]);
    assert_eq!(
        b.trunc().to_vec::<bf16>().unwrap(),
        vec![bf16::from_f32(1.0), bf16::from_f32(-1.0)]
    );
}

#[test]
fn rounding_ops_keep_integers_and_reject_bool() {
    // PyTorch: floor/ceil/round/trunc of an integer tensor return it unchanged (same dtype);
    // of a bool tensor they raise ("not implemented for 'Bool'").
    let i = Tensor::from_vec(vec![-7i32, 0, 9], [3]);
    for t in [i.floor(), i.ceil(), i.round(), i.trunc()] {
        exact_i(&t, DType::I32, &[-7, 0, 9]);
    }
    let u = Tensor::from_vec(vec![0u8, 200], [2]);
    exact_i(&u.round(), DType::U8, &[0, 200]);
    let b = Tensor::from_vec(vec![true, false], [2]);
    for r in [b.try_floor(), b.try_ceil(), b.try_round(), b.try_trunc()] {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("bool"), "{e}");
    }
    assert!(b.try_floor().unwrap_err().to_string().starts_with("floor"));
}

#[test]
fn sign_matches_pytorch() {
    // torch.sign: NaN -> 0, -0.0 -> +0.0, ±inf -> ±1 (float32).
    exact_f32(
        &f32s(&X).sign(),
        &[
            -1.0, -1.0, -1.0, -1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 0.0,
        ],
    );
    // Integers keep their dtype; u8 is never negative; bool is returned as is.
    exact_i(
        &Tensor::from_vec(vec![-7i32, 0, 9], [3]).sign(),
        DType::I32,
        &[-1, 0, 1],
    );
    exact_i(
        &Tensor::from_vec(vec![-7i64, 0, 9], [3]).sign(),
        DType::I64,
        &[-1, 0, 1],
    );
    exact_i(
        &Tensor::from_vec(vec![0u8, 200], [2]).sign(),
        DType::U8,
        &[0, 1],
    );
    exact_i(
        &Tensor::from_vec(vec![true, false], [2]).sign(),
        DType::Bool,
        &[1, 0],
    );
}

#[test]
fn log1p_expm1_exp2_match_pytorch() {
    let y = f32s(&[
        -3.0, -1.0, -1e-8, 0.0, 1e-8, 0.5, 1.0, 3.0, 10.0, 20.0, 20.5, 88.0, -100.0,
    ]);
    // From PyTorch (float32).
    close_f32(
        &y.log1p(),
        &[
            NAN,
            -INF,
            -9.99999993922529e-09,
            0.0,
            9.99999993922529e-09,
            0.40546509623527527,
            0.6931471824645996,
            1.3862943649291992,
            2.397895336151123,
            3.044522523880005,
            3.0680530071258545,
            4.488636493682861,
            NAN,
        ],
        1.0,
    );
    close_f32(
        &y.expm1(),
        &[
            -0.9502129554748535,
            -0.6321205496788025,
            -9.99999993922529e-09,
            0.0,
            9.99999993922529e-09,
            0.6487212777137756,
            1.718281865119934,
            19.08553695678711,
            22025.46484375,
            485165184.0,
            799902208.0,
            1.6516362661361307e+38,
            -1.0,
        ],
        1.0,
    );
    close_f32(
        &y.exp2(),
        &[
            0.125,
            0.5,
            1.0,
            1.0,
            1.0,
            1.4142135381698608,
            2.0,
            8.0,
            1024.0,
            1048576.0,
            1482910.375,
            3.094850098213451e+26,
            7.888609052210118e-31,
        ],
        1.0,
    );
    // Integers become f32 first (PyTorch: torch.log1p(torch.tensor([1, 0])) is float32).
    let i = Tensor::from_vec(vec![1i32, 0], [2]);
    close_f32(&i.log1p(), &[0.6931471824645996, 0.0], 1.0);
    close_f32(&i.expm1(), &[1.718281865119934, 0.0], 1.0);
    close_f32(&i.exp2(), &[2.0, 1.0], 0.0);
    // Signed zeros survive log1p and expm1.
    let z = f32s(&[-0.0]);
    exact_f32(&z.log1p(), &[-0.0]);
    exact_f32(&z.expm1(), &[-0.0]);
}

#[test]
fn rsqrt_and_square_match_pytorch() {
    let z = f32s(&[0.25, 1.0, 2.0, 3.0, 100.0, 0.0, -0.0, -1.0, INF]);
    // From PyTorch (float32): torch.rsqrt.
    close_f32(
        &z.rsqrt(),
        &[
            2.0,
            1.0,
            0.7071067690849304,
            0.5773502588272095,
            0.10000000149011612,
            INF,
            -INF,
            NAN,
            0.0,
        ],
        1.0,
    );
    // torch.square: exact for floats; integers wrap; bool becomes int64.
    exact_f32(
        &f32s(&[-3.0, 1e-8, 0.5, 20.5, -100.0]).square(),
        &[9.0, 1.0000000168623835e-16, 0.25, 420.25, 10000.0],
    );
    exact_i(
        &Tensor::from_vec(vec![-3i32, 4, 65536], [3]).square(),
        DType::I32,
        &[9, 16, 0],
    );
    exact_i(
        &Tensor::from_vec(vec![3u8, 16, 200], [3]).square(),
        DType::U8,
        &[9, 0, 64],
    );
    exact_i(
        &Tensor::from_vec(vec![true, false], [2]).square(),
        DType::I64,
        &[1, 0],
    );
    // rsqrt of integers is f32 (PyTorch).
    close_f32(
        &Tensor::from_vec(vec![1i64, 0], [2]).rsqrt(),
        &[1.0, INF],
        0.0,
    );
}

#[test]
fn softplus_and_silu_match_pytorch() {
    let y = f32s(&[
        -3.0, -1.0, -1e-8, 0.0, 1e-8, 0.5, 1.0, 3.0, 10.0, 20.0, 20.5, 88.0, -100.0,
    ]);
    // From PyTorch (float32): torch.nn.functional.softplus (beta 1, threshold 20).
    close_f32(
        &y.softplus(),
        &[
            0.04858735203742981,
            0.3132616877555847,
            0.6931471824645996,
            0.6931471824645996,
            0.6931471824645996,
            0.9740769863128662,
            1.31326162815094,
            3.0485873222351074,
            10.000045776367188,
            20.0,
            20.5,
            88.0,
            3.783505853677006e-44,
        ],
        2.0,
    );
    // torch.nn.functional.silu; at -100 PyTorch's x / (1 + e^100) underflows to -0, kiln
    // keeps the subnormal -100·e^-100 (see docs/semantics.md), so that element is checked
    // apart.
    let want = [
        -0.14227761328220367,
        -0.2689414322376251,
        -4.999999969612645e-09,
        0.0,
        4.999999969612645e-09,
        0.3112296760082245,
        0.7310585975646973,
        2.857722520828247,
        9.99954605102539,
        20.0,
        20.5,
        88.0,
    ];
    let s = y.silu();
    close_f32(&s.slice(&[(0, 12, 1)]), &want, 1.0);
    let last = s.to_vec::<f32>().unwrap()[12];
    assert!(last <= 0.0 && last > -1e-40, "silu(-100) = {last:e}");
    // Special values (PyTorch): silu(-inf) = NaN, silu(inf) = inf, softplus(-inf) = 0.
    let sp = f32s(&[-INF, INF, NAN]);
    exact_f32(&sp.silu(), &[NAN, INF, NAN]);
    exact_f32(&sp.softplus(), &[0.0, INF, NAN]);
    // f64 follows the same definitions.
    let d = Tensor::from_vec(vec![-1.0f64, 0.5, 25.0], [3]);
    let sd = d.softplus().to_vec::<f64>().unwrap();
    assert!((sd[0] - 0.31326168751822286).abs() < 1e-15);
    assert!((sd[1] - 0.9740769841801067).abs() < 1e-15);
    assert_eq!(sd[2], 25.0);
}

/// `name` applied to `t` through its `Tensor` method.
fn trig(name: &str, t: &Tensor) -> Tensor {
    match name {
        "tan" => t.tan(),
        "asin" => t.asin(),
        "acos" => t.acos(),
        "atan" => t.atan(),
        "sinh" => t.sinh(),
        "cosh" => t.cosh(),
        "asinh" => t.asinh(),
        "acosh" => t.acosh(),
        "atanh" => t.atanh(),
        _ => unreachable!("not a trigonometric op: {name}"),
    }
}

#[test]
fn trigonometric_and_hyperbolic_ops_match_pytorch() {
    // PyTorch 2.15 (CPU, float32), from tests/fixtures/make_trig_values.py: NaN outside
    // asin/acos/atanh/acosh's domains, atanh(±1) = ±inf, sinh/cosh overflowing to inf
    // at 100 but not at 89, tan(±inf) = NaN.
    // The inputs: every value for tan, atan, sinh, cosh and asinh; around [-1, 1] for
    // asin, acos and atanh; around [1, inf) for acosh; then -inf, inf and NaN.
    const GENERAL: [f64; 17] = [
        -100.0,
        -3.0,
        -1.0,
        -0.5,
        -9.99999993922529e-09,
        0.0,
        9.99999993922529e-09,
        0.5,
        1.0,
        1.5,
        3.0,
        10.0,
        89.0,
        100.0,
        -INF,
        INF,
        NAN,
    ];
    const UNIT: [f64; 14] = [
        -2.0,
        -1.0,
        -0.9900000095367432,
        -0.5,
        -9.99999993922529e-09,
        0.0,
        9.99999993922529e-09,
        0.5,
        0.9900000095367432,
        1.0,
        1.5,
        -INF,
        INF,
        NAN,
    ];
    const ABOVE_ONE: [f64; 12] = [
        -1.0,
        0.5,
        1.0,
        1.000100016593933,
        1.5,
        2.0,
        10.0,
        10000000000.0,
        1.0000000150474662e+30,
        -INF,
        INF,
        NAN,
    ];
    let rows: [(&str, &[f64], &[f64]); 9] = [
        (
            "tan",
            &GENERAL,
            &[
                0.587213933467865,
                0.14254654943943024,
                -1.5574077367782593,
                -0.5463024973869324,
                -9.99999993922529e-09,
                0.0,
                9.99999993922529e-09,
                0.5463024973869324,
                1.5574077367782593,
                14.101419448852539,
                -0.14254654943943024,
                0.6483608484268188,
                1.6858253479003906,
                -0.587213933467865,
                NAN,
                NAN,
                NAN,
            ],
        ),
        (
            "atan",
            &GENERAL,
            &[
                -1.5607966184616089,
                -1.249045729637146,
                -0.7853981852531433,
                -0.46364760398864746,
                -9.99999993922529e-09,
                0.0,
                9.99999993922529e-09,
                0.46364760398864746,
                0.7853981852531433,
                0.9827936887741089,
                1.249045729637146,
                1.4711276292800903,
                1.5595608949661255,
                1.5607966184616089,
                -1.5707963705062866,
                1.5707963705062866,
                NAN,
            ],
        ),
        (
            "sinh",
            &GENERAL,
            &[
                -INF,
                -10.017874717712402,
                -1.175201177597046,
                -0.5210952758789062,
                -9.99999993922529e-09,
                0.0,
                9.99999993922529e-09,
                0.5210952758789062,
                1.175201177597046,
                2.129279375076294,
                10.017874717712402,
                11013.232421875,
                2.2448063889081578e+38,
                INF,
                -INF,
                INF,
                NAN,
            ],
        ),
        (
            "cosh",
            &GENERAL,
            &[
                INF,
                10.067662239074707,
                1.5430805683135986,
                1.1276259422302246,
                1.0,
                1.0,
                1.0,
                1.1276259422302246,
                1.5430805683135986,
                2.352409601211548,
                10.067662239074707,
                11013.232421875,
                2.2448063889081578e+38,
                INF,
                INF,
                INF,
                NAN,
            ],
        ),
        (
            "asinh",
            &GENERAL,
            &[
                -5.298342227935791,
                -1.8184465169906616,
                -0.8813735842704773,
                -0.4812118411064148,
                -9.99999993922529e-09,
                0.0,
                9.99999993922529e-09,
                0.4812118411064148,
                0.8813735842704773,
                1.19476318359375,
                1.8184465169906616,
                2.998222827911377,
                5.181815147399902,
                5.298342227935791,
                -INF,
                INF,
                NAN,
            ],
        ),
        (
            "asin",
            &UNIT,
            &[
                NAN,
                -1.5707963705062866,
                -1.4292569160461426,
                -0.5235987901687622,
                -9.99999993922529e-09,
                0.0,
                9.99999993922529e-09,
                0.5235987901687622,
                1.4292569160461426,
                1.5707963705062866,
                NAN,
                NAN,
                NAN,
                NAN,
            ],
        ),
        (
            "acos",
            &UNIT,
            &[
                NAN,
                3.1415927410125732,
                3.0000531673431396,
                2.094395160675049,
                1.5707963705062866,
                1.5707963705062866,
                1.5707963705062866,
                1.0471975803375244,
                0.14153940975666046,
                0.0,
                NAN,
                NAN,
                NAN,
                NAN,
            ],
        ),
        (
            "atanh",
            &UNIT,
            &[
                NAN,
                -INF,
                -2.646652936935425,
                -0.5493061542510986,
                -9.99999993922529e-09,
                0.0,
                9.99999993922529e-09,
                0.5493061542510986,
                2.646652936935425,
                INF,
                NAN,
                NAN,
                NAN,
                NAN,
            ],
        ),
        (
            "acosh",
            &ABOVE_ONE,
            &[
                NAN,
                NAN,
                0.0,
                0.014143191277980804,
                0.9624236822128296,
                1.316957950592041,
                2.993222951889038,
                23.718997955322266,
                69.77069854736328,
                NAN,
                INF,
                NAN,
            ],
        ),
    ];
    for (name, x, want) in rows {
        let y = trig(name, &f32s(x));
        assert_eq!(y.shape(), &[x.len()], "{name}");
        close_f32(&y, want, 2.0);
    }
    // float64 values and gradients of f(x).sum() (torch.autograd, float64).
    type GradRow<'a> = (&'a str, &'a [f64], &'a [f64], &'a [f64]);
    let rows: [GradRow; 9] = [
        (
            "tan",
            &[-0.9, -0.4, 0.1, 0.6, 0.95],
            &[
                -1.2601582175503392,
                -0.4227932187381618,
                0.10033467208545055,
                0.6841368083416923,
                1.398382589287699,
            ],
            &[
                2.587998733259648,
                1.1787541058109752,
                1.0100670464224948,
                1.4680431725279575,
                2.95547386602297,
            ],
        ),
        (
            "atan",
            &[-2.5, -0.7, 0.3, 1.2, 4.0],
            &[
                -1.1902899496825317,
                -0.6107259643892086,
                0.2914567944778671,
                0.8760580505981934,
                1.3258176636680326,
            ],
            &[
                0.13793103448275862,
                0.6711409395973155,
                0.9174311926605504,
                0.4098360655737705,
                0.058823529411764705,
            ],
        ),
        (
            "sinh",
            &[-2.5, -0.7, 0.3, 1.2, 4.0],
            &[
                -6.0502044810397875,
                -0.7585837018395334,
                0.3045202934471426,
                1.5094613554121725,
                27.28991719712775,
            ],
            &[
                6.132289479663686,
                1.255169005630943,
                1.0453385141288605,
                1.8106555673243747,
                27.308232836016487,
            ],
        ),
        (
            "cosh",
            &[-2.5, -0.7, 0.3, 1.2, 4.0],
            &[
                6.132289479663686,
                1.255169005630943,
                1.0453385141288605,
                1.8106555673243747,
                27.308232836016487,
            ],
            &[
                -6.0502044810397875,
                -0.7585837018395334,
                0.3045202934471426,
                1.5094613554121725,
                27.28991719712775,
            ],
        ),
        (
            "asinh",
            &[-2.5, -0.7, 0.3, 1.2, 4.0],
            &[
                -1.6472311463710958,
                -0.6526665660823557,
                0.29567304756342244,
                1.015973134179692,
                2.0947125472611012,
            ],
            &[
                0.3713906763541037,
                0.8192319205190405,
                0.9578262852211513,
                0.6401843996644799,
                0.24253562503633297,
            ],
        ),
        (
            "asin",
            &[-0.9, -0.4, 0.1, 0.6, 0.95],
            &[
                -1.1197695149986342,
                -0.41151684606748806,
                0.1001674211615598,
                0.6435011087932844,
                1.253235897503375,
            ],
            &[
                2.294157338705618,
                1.0910894511799618,
                1.005037815259212,
                1.25,
                3.202563076101742,
            ],
        ),
        (
            "acos",
            &[-0.9, -0.4, 0.1, 0.6, 0.95],
            &[
                2.6905658417935308,
                1.9823131728623846,
                1.4706289056333368,
                0.9272952180016122,
                0.3175604292915215,
            ],
            &[
                -2.294157338705618,
                -1.0910894511799618,
                -1.005037815259212,
                -1.25,
                -3.202563076101742,
            ],
        ),
        (
            "atanh",
            &[-0.9, -0.4, 0.1, 0.6, 0.95],
            &[
                -1.4722194895832204,
                -0.42364893019360184,
                0.10033534773107558,
                std::f64::consts::LN_2,
                1.8317808230648227,
            ],
            &[
                5.263157894736843,
                1.1904761904761905,
                1.0101010101010102,
                1.5625,
                10.256410256410254,
            ],
        ),
        (
            "acosh",
            &[1.05, 1.5, 2.0, 7.0, 100.0],
            &[
                0.314924756603848,
                0.9624236501192069,
                1.3169578969248166,
                2.6339157938496336,
                5.298292365610484,
            ],
            &[
                3.1234752377721207,
                0.8944271909999159,
                0.5773502691896258,
                0.14433756729740646,
                0.010000500037503125,
            ],
        ),
    ];
    for (name, x0, want, want_grad) in rows {
        let x = Tensor::from_vec(x0.to_vec(), [x0.len()]).requires_grad_(true);
        x.realize().unwrap();
        let y = trig(name, &x);
        y.sum(..).backward().unwrap();
        let got = y.to_vec::<f64>().unwrap();
        let grad = x.grad().unwrap().to_vec::<f64>().unwrap();
        for (what, got, want) in [("value", &got, want), ("gradient", &grad, want_grad)] {
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() <= 1e-13 * w.abs().max(1.0),
                    "{name} {what}: {got:?} want {want:?}"
                );
            }
        }
        unfused_agrees(&trig(name, &Tensor::from_vec(x0.to_vec(), [x0.len()])));
    }
    // Integers are cast to f32 first, as PyTorch does.
    let i = Tensor::from_vec(vec![0i32, 1, 2], [3]);
    assert_eq!(i.atan().dtype(), DType::F32);
    close_f32(
        &i.atan(),
        &[0.0, 0.7853981852531433, 1.1071487665176392],
        2.0,
    );
}

#[test]
fn atan2_matches_pytorch() {
    // PyTorch 2.15 (CPU, float32), from tests/fixtures/make_trig_values.py: every
    // quadrant, signed zeros (atan2(±0, -1) = ±π), infinities, NaN.
    let y = [
        1.0, 1.0, -1.0, -1.0, 0.0, -0.0, 0.0, -0.0, INF, -INF, INF, 1.0, NAN, 3.0, -2.5,
    ];
    let x = [
        1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, -1.0, INF, INF, -INF, 0.0, 1.0, 0.5, -7.0,
    ];
    let want = [
        0.7853981852531433,
        2.356194496154785,
        -0.7853981852531433,
        -2.356194496154785,
        0.0,
        -0.0,
        3.1415927410125732,
        -3.1415927410125732,
        0.7853981852531433,
        -0.7853981852531433,
        2.356194496154785,
        1.5707963705062866,
        NAN,
        1.4056476354599,
        -2.7985687255859375,
    ];
    let a = f32s(&y).atan2(f32s(&x));
    close_f32(&a, &want, 1.0);
    let got = a.to_vec::<f32>().unwrap();
    assert!(
        got[4].is_sign_positive() && got[5].is_sign_negative(),
        "{got:?}"
    );
    // Broadcasting and a scalar operand: atan2(y, 1) = atan(y).
    let b = f32s(&[2.0, -0.5]).atan2(1.0);
    close_f32(&b, &[1.1071487665176392, -0.46364760398864746], 1.0);
    // Integers are cast to f32 first: torch.atan2(int32 [1, -2], int32 [2, 2]).
    let i = Tensor::from_vec(vec![1i32, -2], [2]).atan2(Tensor::from_vec(vec![2i32, 2], [2]));
    assert_eq!(i.dtype(), DType::F32);
    close_f32(&i, &[0.46364760398864746, -0.7853981852531433], 1.0);
    // Gradients (torch.autograd, float64) of atan2(y, x).sum().
    let y = Tensor::from_vec(vec![0.5f64, -1.5, 2.0, -0.3], [4]).requires_grad_(true);
    let x = Tensor::from_vec(vec![1.0f64, 0.7, -3.0, -0.2], [4]).requires_grad_(true);
    y.realize().unwrap();
    x.realize().unwrap();
    y.atan2(&x).sum(..).backward().unwrap();
    let want_dy = [
        0.8,
        0.25547445255474455,
        -0.23076923076923078,
        -1.5384615384615383,
    ];
    let want_dx = [
        -0.4,
        0.5474452554744527,
        -0.15384615384615385,
        2.3076923076923075,
    ];
    for (t, want) in [(&y, want_dy), (&x, want_dx)] {
        let got = t.grad().unwrap().to_vec::<f64>().unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-14 * w.abs().max(1.0),
                "{got:?} want {want:?}"
            );
        }
    }
}

#[test]
fn predicates_match_pytorch() {
    // torch.isnan / isinf / isfinite of [1, inf, -inf, nan, 0].
    let w = f32s(&[1.0, INF, -INF, NAN, 0.0]);
    exact_i(&w.isnan(), DType::Bool, &[0, 0, 0, 1, 0]);
    exact_i(&w.isinf(), DType::Bool, &[0, 1, 1, 0, 0]);
    exact_i(&w.isfinite(), DType::Bool, &[1, 0, 0, 0, 1]);
    // Half types and f64.
    let h = Tensor::from_vec(vec![f16::INFINITY, f16::NAN, f16::MAX], [3]);
    exact_i(&h.isinf(), DType::Bool, &[1, 0, 0]);
    exact_i(&h.isfinite(), DType::Bool, &[0, 0, 1]);
    let d = Tensor::from_vec(vec![f64::MAX, f64::NAN], [2]);
    exact_i(&d.isnan(), DType::Bool, &[0, 1]);
    // Integers and bool are always finite, never NaN or inf.
    for t in [
        Tensor::from_vec(vec![i32::MIN, 0], [2]),
        Tensor::from_vec(vec![true, false], [2]),
        Tensor::from_vec(vec![255u8, 0], [2]),
    ] {
        exact_i(&t.isnan(), DType::Bool, &[0, 0]);
        exact_i(&t.isinf(), DType::Bool, &[0, 0]);
        exact_i(&t.isfinite(), DType::Bool, &[1, 1]);
    }
}

// Operands of the float division tests and PyTorch's results (float32):
// torch.remainder/fmod/floor_divide(A, B), signs of zeros read with signbit.
const A: [f64; 12] = [
    5.0, -5.0, 5.0, -5.0, 5.5, -0.0, 0.0, 3.0, 1.0, INF, 2.0, NAN,
];
const B: [f64; 12] = [
    3.0, 3.0, -3.0, -3.0, 2.0, 2.0, -2.0, 0.0, 0.1, 2.0, INF, 1.0,
];

#[test]
fn float_remainder_fmod_floor_divide_match_pytorch() {
    let (a, b) = (f32s(&A), f32s(&B));
    // From PyTorch.
    exact_f32(
        &a.remainder(&b),
        &[
            2.0,
            1.0,
            -1.0,
            -2.0,
            1.5,
            -0.0,
            0.0,
            NAN,
            0.09999998658895493,
            NAN,
            2.0,
            NAN,
        ],
    );
    exact_f32(
        &a.fmod(&b),
        &[
            2.0,
            -2.0,
            2.0,
            -2.0,
            1.5,
            -0.0,
            0.0,
            NAN,
            0.09999998658895493,
            NAN,
            2.0,
            NAN,
        ],
    );
    // 1 // 0.1 is 9 (0.1f32 is above 1/10), 3 // 0 is inf.
    exact_f32(
        &a.floor_divide(&b),
        &[
            1.0, -2.0, -2.0, 1.0, 2.0, -0.0, -0.0, INF, 9.0, NAN, 0.0, NAN,
        ],
    );
    // A scalar divisor, and f64 (torch.remainder(tensor([1e-300, -1e-300, 7.5],
    // dtype=float64), tensor([3., 3., -2.]))).
    exact_f32(&f32s(&[-7.0, 7.0]).remainder(4.0), &[1.0, 3.0]);
    let d = Tensor::from_vec(vec![1e-300f64, -1e-300, 7.5], [3]);
    let e = Tensor::from_vec(vec![3.0f64, 3.0, -2.0], [3]);
    assert_eq!(
        d.remainder(&e).to_vec::<f64>().unwrap(),
        vec![1e-300, 3.0, -0.5]
    );
    unfused_agrees(&d.remainder(&e));
    unfused_agrees(&d.floor_divide(&e));
}

#[test]
fn integer_remainder_fmod_floor_divide_match_pytorch() {
    let a = Tensor::from_vec(vec![7i32, -7, 7, -7, 0, i32::MIN, i32::MIN, 5], [8]);
    let b = Tensor::from_vec(vec![3i32, 3, -3, -3, 5, -1, 3, 7], [8]);
    // From PyTorch (int32): MIN % -1 = 0, MIN // -1 wraps to MIN.
    exact_i(&a.remainder(&b), DType::I32, &[1, 2, -2, -1, 0, 0, 1, 5]);
    exact_i(&a.fmod(&b), DType::I32, &[1, -1, 1, -1, 0, 0, -2, 5]);
    exact_i(
        &a.floor_divide(&b),
        DType::I32,
        &[2, -3, -3, 2, 0, i32::MIN as i64, -715827883, 0],
    );
    let a = Tensor::from_vec(vec![7u8, 200, 3], [3]);
    let b = Tensor::from_vec(vec![3u8, 7, 250], [3]);
    exact_i(&a.remainder(&b), DType::U8, &[1, 4, 3]);
    exact_i(&a.fmod(&b), DType::U8, &[1, 4, 3]);
    exact_i(&a.floor_divide(&b), DType::U8, &[2, 28, 0]);
    // i64, with a scalar divisor (Python: -7 % 3 == 2, -7 // 3 == -3).
    let a = Tensor::from_vec(vec![-7i64, 7, i64::MIN], [3]);
    exact_i(&a.remainder(3), DType::I64, &[2, 1, 1]);
    exact_i(
        &a.floor_divide(3),
        DType::I64,
        &[-3, 2, -3074457345618258603],
    );
    exact_i(&a.fmod(-1), DType::I64, &[0, 0, 0]);
    // Integer division by zero: PyTorch raises; kiln gives 0 (docs/semantics.md).
    let z = Tensor::from_vec(vec![5i32, -5], [2]);
    exact_i(&z.remainder(0), DType::I32, &[0, 0]);
    exact_i(&z.fmod(0), DType::I32, &[0, 0]);
    exact_i(&z.floor_divide(0), DType::I32, &[0, 0]);
    // An integer and a float promote to float (PyTorch: int32 % 2.5 is float32).
    // (-5 fmod 2.5 is -0, kept: torch.remainder gives -0 too.)
    exact_f32(&z.remainder(2.5), &[0.0, -0.0]);
    // Bool is rejected, as by PyTorch.
    let t = Tensor::from_vec(vec![true], [1]);
    let e = t.try_remainder(&t).unwrap_err().to_string();
    assert!(e.starts_with("remainder") && e.contains("bool"), "{e}");
    assert!(t.try_floor_divide(&t).is_err() && t.try_fmod(&t).is_err());
}

#[test]
fn clamp_with_tensor_bounds_matches_pytorch() {
    // torch.clamp(x, lo, hi) with NaN in each place and min > max (the result is max).
    let x = f32s(&[1.0, NAN, 5.0, -3.0, 2.0, 2.0]);
    let lo = f32s(&[0.0, 0.0, NAN, 0.0, 3.0, 2.0]);
    let hi = f32s(&[4.0, 4.0, 4.0, NAN, 1.0, 2.0]);
    exact_f32(&x.clamp_tensor(&lo, &hi), &[1.0, NAN, NAN, NAN, 1.0, 2.0]);
    // Broadcast bounds, and a scalar for one of them.
    let m = Tensor::from_vec(vec![-2.0f32, 0.5, 9.0, 3.0, -7.0, 1.0], [2, 3]);
    let lo = Tensor::from_vec(vec![-1.0f32, 1.0], [2, 1]);
    let hi = Tensor::from_vec(vec![2.0f32, 0.0, 5.0], [3]);
    exact_f32(
        &m.clamp_tensor(&lo, &hi).reshape([-1]),
        &[-1.0, 0.0, 5.0, 2.0, 0.0, 1.0],
    );
    exact_f32(
        &m.clamp_tensor(&lo, 1.5).reshape([-1]),
        &[-1.0, 0.5, 1.5, 1.5, 1.0, 1.0],
    );
    // Integers promote with the bounds (PyTorch: int32 with int64 bounds is int64).
    let i = Tensor::from_vec(vec![1i32, 5, 9], [3]);
    let t = i.clamp_tensor(
        Tensor::from_vec(vec![2i64, 2, 2], [3]),
        Tensor::from_vec(vec![6i64, 6, 6], [3]),
    );
    exact_i(&t, DType::I64, &[2, 5, 6]);
    // Shapes that do not broadcast: an error naming clamp.
    let e = m
        .try_clamp_tensor(f32s(&[1.0, 2.0]), &hi)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("clamp"), "{e}");
}

#[test]
fn repeat_and_tile_match_pytorch() {
    let x = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]);
    // From PyTorch: x.repeat(2, 3), x.repeat(2, 1, 2), x.tile((2,)), x.tile((2, 1, 1)).
    let r = x.repeat([2, 3]);
    assert_eq!(r.shape(), &[4, 6]);
    exact_i(
        &r.reshape([-1]),
        DType::I64,
        &[
            1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4,
        ],
    );
    let r = x.repeat([2, 1, 2]);
    assert_eq!(r.shape(), &[2, 2, 4]);
    exact_i(
        &r.reshape([-1]),
        DType::I64,
        &[1, 2, 1, 2, 3, 4, 3, 4, 1, 2, 1, 2, 3, 4, 3, 4],
    );
    let t = x.tile([2]);
    assert_eq!(t.shape(), &[2, 4]);
    exact_i(&t.reshape([-1]), DType::I64, &[1, 2, 1, 2, 3, 4, 3, 4]);
    assert_eq!(x.tile([2, 1, 1]).shape(), &[2, 2, 2]);
    // 1-d, 0-d, zero repeats.
    let v = f32s(&[1.0, 2.0, 3.0]);
    exact_f32(&v.repeat([2]), &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    let s = Tensor::from_vec(vec![5.0f32], ());
    exact_f32(&s.repeat([3]), &[5.0, 5.0, 5.0]);
    assert_eq!(s.tile([2, 2]).shape(), &[2, 2]);
    assert_eq!(x.repeat([0, 2]).shape(), &[0, 4]);
    assert_eq!(x.repeat([1, 1]).to_vec::<i64>().unwrap(), vec![1, 2, 3, 4]);
    // Fewer repeat counts than dimensions: an error naming repeat (tile pads instead).
    let e = x.try_repeat([2]).unwrap_err().to_string();
    assert!(e.starts_with("repeat"), "{e}");
    // Through a transposed view.
    exact_i(
        &x.t().repeat([1, 2]).reshape([-1]),
        DType::I64,
        &[1, 3, 1, 3, 2, 4, 2, 4],
    );
}

#[test]
fn repeat_records_views_and_one_copy() {
    // `repeat` is reshape(expand(reshape(x))): the last reshape cannot be a view, so the
    // planner stores the expanded value once — the same plan as any reshape that needs a
    // copy (`x.t().reshape(-1)`) — and nothing else.
    let counts = |t: &Tensor| {
        let plan = t.plan(&RealizeOptions::default()).unwrap();
        (plan.kernel_count(), plan.copy_count())
    };
    let x = Tensor::randn([64, 32]);
    assert_eq!(counts(&x.repeat([3, 2])), counts(&x.t().reshape([-1])));
    assert_eq!(counts(&x.repeat([3, 2])), (2, 1));
    assert_eq!(counts(&x.tile([3, 2])), (2, 1));
    // A consumer reads the stored copy (one kernel for it, as after any copying reshape).
    assert_eq!(counts(&(x.repeat([3, 2]) * 2.0).exp()).0, 2);
    // Repeating only along new leading dimensions is a broadcast: no copy at all.
    let w = x.repeat([4, 1, 1]);
    assert_eq!(counts(&w).1, 0);
    let got = w.to_vec::<f32>().unwrap();
    let base = x.to_vec::<f32>().unwrap();
    assert_eq!(&got[..base.len()], &base[..]);
    assert_eq!(&got[3 * base.len()..], &base[..]);
}

#[test]
fn fused_chains_of_new_ops_agree_with_the_reference() {
    // Every new op inside one fused kernel, f64 (the reference's own precision).
    let x = Tensor::from_vec(
        (0..48).map(|i| i as f64 * 0.37 - 8.0).collect::<Vec<f64>>(),
        [6, 8],
    );
    let chain = || {
        (x.floor() + x.ceil() + x.round() + x.trunc() + x.sign())
            + (x.abs().log1p() + (&x * 0.25).expm1() + (&x * 0.5).exp2())
            + ((x.abs() + 1.0).rsqrt() + x.square() + x.softplus() + x.silu())
            + (x.remainder(3.0) + x.fmod(-2.5) + x.floor_divide(1.5))
    };
    unfused_agrees(&chain());
    let y = chain();
    let plan = y.plan(&RealizeOptions::default()).unwrap();
    assert_eq!(plan.kernel_count(), 1, "{}", plan.dump_text());
    let want = reference::evaluate(&y).unwrap().to_f64();
    let got = y.to_vec::<f64>().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{g} vs {w}");
    }
}

#[test]
fn gradients_match_pytorch() {
    // torch.autograd in float64 at x = [-1.5, -0.3, 0.4, 2.0, 25.0] of f(x).sum().
    let x0 = vec![-1.5f64, -0.3, 0.4, 2.0, 25.0];
    let grad_of = |f: &dyn Fn(&Tensor) -> Tensor| -> Vec<f64> {
        let x = Tensor::from_vec(x0.clone(), [5]).requires_grad_(true);
        x.realize().unwrap();
        f(&x).sum(..).backward().unwrap();
        x.grad().unwrap().to_vec::<f64>().unwrap()
    };
    type Case<'a> = (&'a str, &'a dyn Fn(&Tensor) -> Tensor, [f64; 5]);
    let cases: [Case; 10] = [
        ("floor", &|x| x.floor(), [0.0; 5]),
        ("round", &|x| x.round(), [0.0; 5]),
        ("sign", &|x| x.sign(), [0.0; 5]),
        (
            "log1p(|x|)",
            &|x| x.abs().log1p(),
            [
                -0.4,
                -0.7692307692307692,
                0.7142857142857143,
                0.3333333333333333,
                0.038461538461538464,
            ],
        ),
        (
            "expm1",
            &|x| x.expm1(),
            [
                0.2231301601484298,
                0.7408182206817179,
                1.4918246976412703,
                7.38905609893065,
                72004899337.38588,
            ],
        ),
        (
            "exp2",
            &|x| x.exp2(),
            [
                0.2450645358671368,
                0.5630104584373838,
                0.9146131880787755,
                2.772588722239781,
                23258159.936090406,
            ],
        ),
        (
            "rsqrt(|x|)",
            &|x| x.abs().rsqrt(),
            [
                0.2721655269759088,
                3.0429030972509232,
                -1.9764235376052366,
                -0.17677669529663684,
                -0.004000000000000001,
            ],
        ),
        ("square", &|x| x.square(), [-3.0, -0.6, 0.8, 4.0, 50.0]),
        (
            "softplus",
            &|x| x.softplus(),
            [
                0.18242552380635632,
                0.425557483188341,
                0.598687660112452,
                0.8807970779778824,
                1.0,
            ],
        ),
        (
            "silu",
            &|x| x.silu(),
            [
                -0.041294154299142946,
                0.3522199896811173,
                0.6947919584090636,
                1.0907842487848955,
                1.000000000333312,
            ],
        ),
    ];
    for (name, f, want) in cases {
        let got = grad_of(f);
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{name}: {got:?} want {want:?}"
            );
        }
    }
    // torch.remainder / fmod of a = [5, -5, 7.5], b = [3, 3, -2]: da = 1,
    // db = -floor(a / b) and -trunc(a / b).
    for (name, want_b) in [("remainder", [-1.0, 2.0, 4.0]), ("fmod", [-1.0, 1.0, 3.0])] {
        let a = Tensor::from_vec(vec![5.0f64, -5.0, 7.5], [3]).requires_grad_(true);
        let b = Tensor::from_vec(vec![3.0f64, 3.0, -2.0], [3]).requires_grad_(true);
        a.realize().unwrap();
        b.realize().unwrap();
        let y = if name == "remainder" {
            a.remainder(&b)
        } else {
            a.fmod(&b)
        };
        y.sum(..).backward().unwrap();
        assert_eq!(a.grad().unwrap().to_vec::<f64>().unwrap(), vec![1.0; 3]);
        assert_eq!(b.grad().unwrap().to_vec::<f64>().unwrap(), want_b.to_vec());
    }
    // clamp with tensor bounds: the gradient reaches whichever of x, lo, hi is the result.
    let x = Tensor::from_vec(vec![1.0f64, -3.0, 7.0], [3]).requires_grad_(true);
    let lo = Tensor::from_vec(vec![0.0f64, 0.0, 0.0], [3]).requires_grad_(true);
    let hi = Tensor::from_vec(vec![4.0f64, 4.0, 4.0], [3]).requires_grad_(true);
    for t in [&x, &lo, &hi] {
        t.realize().unwrap();
    }
    x.clamp_tensor(&lo, &hi).sum(..).backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 0.0, 0.0]
    );
    assert_eq!(
        lo.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![0.0, 1.0, 0.0]
    );
    assert_eq!(
        hi.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![0.0, 0.0, 1.0]
    );
}
