//! Every tensor op on small inputs: hand-computed values per dtype, PyTorch promotion rules,
//! movement ops with exact data, and a cross-check of most expressions against
//! `kiln::reference::evaluate` (the plain oracle).

use half::{bf16, f16};
use kiln::reference::{self, RefData};
use kiln::{DType, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
const INTS: [DType; 3] = [DType::U8, DType::I32, DType::I64];
const ALL: [DType; 8] = [
    DType::Bool,
    DType::U8,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A tensor of `dt` holding `data` converted with Rust `as` / the `half` crate.
fn make(data: &[f64], shape: &[usize], dt: DType) -> Tensor {
    match dt {
        DType::F32 => Tensor::from_vec(data.iter().map(|&x| x as f32).collect(), shape),
        DType::F64 => Tensor::from_vec(data.to_vec(), shape),
        DType::F16 => Tensor::from_vec(data.iter().map(|&x| f16::from_f64(x)).collect(), shape),
        DType::BF16 => Tensor::from_vec(data.iter().map(|&x| bf16::from_f64(x)).collect(), shape),
        DType::I32 => Tensor::from_vec(data.iter().map(|&x| x as i32).collect(), shape),
        DType::I64 => Tensor::from_vec(data.iter().map(|&x| x as i64).collect(), shape),
        DType::U8 => Tensor::from_vec(data.iter().map(|&x| x as u8).collect(), shape),
        DType::Bool => Tensor::from_vec(data.iter().map(|&x| x != 0.0).collect(), shape),
    }
}

/// Realizes and reads every element as f64 (bools as 0/1).
fn read(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F64 => t.to_vec::<f64>().unwrap(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .into_iter()
            .map(|x| x.to_f64())
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .into_iter()
            .map(|x| x.to_f64())
            .collect(),
        DType::I32 => t
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::I64 => t
            .to_vec::<i64>()
            .unwrap()
            .into_iter()
            .map(|x| x as f64)
            .collect(),
        DType::U8 => t
            .to_vec::<u8>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::Bool => t
            .to_vec::<bool>()
            .unwrap()
            .into_iter()
            .map(|b| b as u8 as f64)
            .collect(),
    }
}

/// Realizes and reads an integer or bool tensor exactly.
fn read_i(t: &Tensor) -> Vec<i64> {
    assert!(!t.dtype().is_float(), "read_i on {}", t.dtype());
    // `to_vec` converts exactly from every integer dtype and bool (0/1).
    t.to_vec::<i64>().unwrap()
}

/// `(relative, absolute)` tolerance for values of `dt`.
fn tol(dt: DType) -> (f64, f64) {
    match dt {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (2e-6, 1e-6),
        DType::F16 => (2e-3, 1e-3),
        DType::BF16 => (1.6e-2, 1e-2),
        _ => (0.0, 0.0),
    }
}

fn close(g: f64, w: f64, (rel, abs): (f64, f64)) -> bool {
    if w.is_nan() {
        return g.is_nan();
    }
    if w.is_infinite() || rel == 0.0 {
        return g == w;
    }
    (g - w).abs() <= abs + rel * w.abs()
}

fn assert_close(got: &[f64], want: &[f64], t: (f64, f64), what: &str) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: length ({got:?} vs {want:?})"
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            close(g, w, t),
            "{what}: element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// Checks dtype, shape and values of a lazy tensor: first the reference evaluator's answer,
/// then the realized result, both against `want` (rounded to the dtype first).
#[track_caller]
fn expect(t: &Tensor, dt: DType, shape: &[usize], want: &[f64]) {
    assert_eq!(t.dtype(), dt, "dtype");
    assert_eq!(t.shape(), shape, "shape");
    let want: Vec<f64> = want.iter().map(|&w| round_to(w, dt)).collect();
    let r = reference::evaluate(t).unwrap();
    assert_eq!(r.dtype, dt, "reference dtype");
    assert_eq!(r.shape, shape, "reference shape");
    assert_close(&r.to_f64(), &want, tol(dt), &format!("reference ({dt})"));
    assert_close(&read(t), &want, tol(dt), &format!("kiln ({dt})"));
}

/// Exact check of an integer/bool tensor (reference first, then realized).
#[track_caller]
fn expect_i(t: &Tensor, dt: DType, shape: &[usize], want: &[i64]) {
    assert_eq!(t.dtype(), dt, "dtype");
    assert_eq!(t.shape(), shape, "shape");
    let r = reference::evaluate(t).unwrap();
    assert_eq!(r.data, RefData::I(want.to_vec()), "reference ({dt})");
    assert_eq!(read_i(t), want, "kiln ({dt})");
}

#[track_caller]
fn expect_b(t: &Tensor, shape: &[usize], want: &[bool]) {
    let w: Vec<i64> = want.iter().map(|&b| b as i64).collect();
    expect_i(t, DType::Bool, shape, &w);
}

/// Compares the realized tensor with the reference evaluator (evaluated before realizing).
#[track_caller]
fn check_ref(t: &Tensor) {
    let r = reference::evaluate(t).unwrap();
    assert_eq!(r.shape, t.shape());
    assert_eq!(r.dtype, t.dtype());
    match &r.data {
        RefData::I(want) => assert_eq!(&read_i(t), want),
        RefData::F(want) => assert_close(&read(t), want, tol(t.dtype()), "vs reference"),
    }
}

/// `x` rounded to what a `dt` buffer stores (ints are not touched).
fn round_to(x: f64, dt: DType) -> f64 {
    match dt {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        _ => x,
    }
}

fn arange_f32(n: usize) -> Tensor {
    Tensor::arange(0.0, n as f32, 1.0)
}

fn range(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

// ---------------------------------------------------------------------------------------------
// Creation
// ---------------------------------------------------------------------------------------------

#[test]
fn creation_ops() {
    expect(
        &Tensor::arange(0.0, 5.0, 1.0),
        DType::F32,
        &[5],
        &[0., 1., 2., 3., 4.],
    );
    expect(
        &Tensor::arange(0.0, 1.0, 0.3),
        DType::F32,
        &[4],
        &[0., 0.3, 0.6, 0.9],
    );
    let t = Tensor::try_arange(5, 0, -2, DType::I32).unwrap();
    expect_i(&t, DType::I32, &[3], &[5, 3, 1]);
    let t = Tensor::try_arange(0.0, 1.0, 0.25, DType::F64).unwrap();
    expect(&t, DType::F64, &[4], &[0.0, 0.25, 0.5, 0.75]);
    let t = Tensor::try_arange(0, 0, 1, DType::I64).unwrap();
    expect_i(&t, DType::I64, &[0], &[]);

    expect(
        &Tensor::eye(3, DType::F32),
        DType::F32,
        &[3, 3],
        &[1., 0., 0., 0., 1., 0., 0., 0., 1.],
    );
    expect_b(
        &Tensor::eye(2, DType::Bool),
        &[2, 2],
        &[true, false, false, true],
    );
    expect_i(
        &Tensor::full_dtype([2], 3.7, DType::I32),
        DType::I32,
        &[2],
        &[3, 3],
    );
    expect_i(
        &Tensor::full_dtype([2], 300, DType::U8),
        DType::U8,
        &[2],
        &[44, 44],
    );
    expect(
        &Tensor::full_dtype([1], 0.1, DType::F16),
        DType::F16,
        &[1],
        &[0.0999755859375],
    );
    expect(
        &Tensor::zeros_dtype([2, 2], DType::BF16),
        DType::BF16,
        &[2, 2],
        &[0.; 4],
    );
    expect_i(
        &Tensor::ones_dtype([3], DType::I64),
        DType::I64,
        &[3],
        &[1, 1, 1],
    );
    expect_b(&Tensor::ones_dtype([2], DType::Bool), &[2], &[true, true]);
    let x = make(&[1.0, 2.0], &[2], DType::F64);
    expect(&x.zeros_like(), DType::F64, &[2], &[0., 0.]);
    expect(&x.ones_like(), DType::F64, &[2], &[1., 1.]);
    expect(&x.full_like(2.5), DType::F64, &[2], &[2.5, 2.5]);

    let s = Tensor::scalar(3.5f32);
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(s.item::<f32>().unwrap(), 3.5);
    assert_eq!(Tensor::scalar(7i64).item::<i64>().unwrap(), 7);
    assert!(Tensor::scalar(true).item::<bool>().unwrap());
    assert_eq!(Tensor::scalar(bf16::from_f32(1.5)).dtype(), DType::BF16);
    let one = Tensor::from_vec(vec![42u8], [1, 1]);
    assert_eq!(one.item::<u8>().unwrap(), 42);
}

#[test]
fn random_is_deterministic_in_range_and_matches_reference() {
    let a = Tensor::rand_seeded([4, 8], 7);
    let r = reference::evaluate(&a).unwrap().to_f64();
    let v = read(&a);
    assert_close(&v, &r, (0.0, 0.0), "rand vs reference");
    assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
    assert_eq!(read(&Tensor::rand_seeded([4, 8], 7)), v);
    assert_ne!(read(&Tensor::rand_seeded([4, 8], 8)), v);

    let n = Tensor::randn_seeded([64], 3);
    let r = reference::evaluate(&n).unwrap().to_f64();
    let v = read(&n);
    assert_close(&v, &r, (1e-5, 1e-5), "randn vs reference");
    assert!(v.iter().all(|x| x.is_finite()));
    assert!(v.iter().any(|&x| x < 0.0) && v.iter().any(|&x| x > 0.0));

    for dt in FLOATS {
        let t = Tensor::try_rand([16], 11, dt).unwrap();
        assert_eq!(t.dtype(), dt);
        let r = reference::evaluate(&t).unwrap().to_f64();
        let v = read(&t);
        assert_close(&v, &r, tol(dt), "rand");
        assert!(v.iter().all(|&x| (0.0..=1.0).contains(&x)), "{dt}: {v:?}");
        check_ref(&Tensor::try_randn([16], 12, dt).unwrap());
    }
}

// ---------------------------------------------------------------------------------------------
// Binary arithmetic
// ---------------------------------------------------------------------------------------------

#[test]
fn arithmetic_floats() {
    let a = [1.5, -2.0, 3.0, 0.25];
    let b = [0.5, 4.0, -1.0, 2.0];
    for dt in FLOATS {
        let (x, y) = (make(&a, &[4], dt), make(&b, &[4], dt));
        expect(&x.add(&y), dt, &[4], &[2.0, 2.0, 2.0, 2.25]);
        expect(&x.sub(&y), dt, &[4], &[1.0, -6.0, 4.0, -1.75]);
        expect(&x.mul(&y), dt, &[4], &[0.75, -8.0, -3.0, 0.5]);
        expect(&x.div(&y), dt, &[4], &[3.0, -0.5, -3.0, 0.125]);
        let z = make(&[1.0, -1.0, 0.0], &[3], dt);
        let zero = make(&[0.0; 3], &[3], dt);
        expect(
            &z.div(&zero),
            dt,
            &[3],
            &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN],
        );
    }
}

#[test]
fn arithmetic_ints_wrap_and_divide_as_f32() {
    for dt in [DType::I32, DType::I64] {
        let x = make(&[7.0, -7.0, 3.0, 0.0], &[4], dt);
        let y = make(&[2.0, 2.0, -4.0, 5.0], &[4], dt);
        expect_i(&x.add(&y), dt, &[4], &[9, -5, -1, 5]);
        expect_i(&x.sub(&y), dt, &[4], &[5, -9, 7, -5]);
        expect_i(&x.mul(&y), dt, &[4], &[14, -14, -12, 0]);
        expect(&x.div(&y), DType::F32, &[4], &[3.5, -3.5, -0.75, 0.0]);
    }
    let x = Tensor::from_vec(vec![i32::MAX, i32::MIN, 1 << 20], [3]);
    let y = Tensor::from_vec(vec![1i32, -1, 1 << 12], [3]);
    expect_i(
        &x.add(&y),
        DType::I32,
        &[3],
        &[i32::MIN as i64, i32::MAX as i64, (1 << 20) + (1 << 12)],
    );
    expect_i(
        &x.mul(&y),
        DType::I32,
        &[3],
        &[i32::MAX as i64, i32::MIN as i64, 0],
    );
    let x = Tensor::from_vec(vec![i64::MAX, i64::MIN], [2]);
    let y = Tensor::from_vec(vec![1i64, 1], [2]);
    expect_i(&x.add(&y), DType::I64, &[2], &[i64::MIN, i64::MIN + 1]);
    expect_i(&x.sub(&y), DType::I64, &[2], &[i64::MAX - 1, i64::MAX]);

    let x = Tensor::from_vec(vec![250u8, 3, 16, 9], [4]);
    let y = Tensor::from_vec(vec![10u8, 5, 16, 2], [4]);
    expect_i(&x.add(&y), DType::U8, &[4], &[4, 8, 32, 11]);
    expect_i(&x.sub(&y), DType::U8, &[4], &[240, 254, 0, 7]);
    expect_i(&x.mul(&y), DType::U8, &[4], &[196, 15, 0, 18]);
    expect(&x.div(&y), DType::F32, &[4], &[25.0, 0.6, 1.0, 4.5]);
    // Integer division by zero is a float division.
    let z = Tensor::from_vec(vec![1i32, -1, 0], [3]);
    expect(
        &z.div(z.zeros_like()),
        DType::F32,
        &[3],
        &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN],
    );
}

#[test]
fn arithmetic_bools() {
    let x = Tensor::from_vec(vec![true, true, false, false], [4]);
    let y = Tensor::from_vec(vec![true, false, true, false], [4]);
    expect_b(&x.add(&y), &[4], &[true, true, true, false]);
    expect_b(&x.mul(&y), &[4], &[true, false, false, false]);
    expect(
        &x.div(&y),
        DType::F32,
        &[4],
        &[1.0, f64::INFINITY, 0.0, f64::NAN],
    );
    expect_b(&x.maximum(&y), &[4], &[true, true, true, false]);
    expect_b(&x.minimum(&y), &[4], &[true, false, false, false]);
}

// ---------------------------------------------------------------------------------------------
// Unary ops
// ---------------------------------------------------------------------------------------------

#[test]
fn neg_abs_floats() {
    for dt in FLOATS {
        let x = make(&[1.5, -2.0, 0.0, f64::NAN, f64::NEG_INFINITY], &[5], dt);
        expect(
            &x.neg(),
            dt,
            &[5],
            &[-1.5, 2.0, -0.0, f64::NAN, f64::INFINITY],
        );
        expect(
            &x.abs(),
            dt,
            &[5],
            &[1.5, 2.0, 0.0, f64::NAN, f64::INFINITY],
        );
    }
    // Sign of zero survives neg and abs.
    let x = Tensor::from_vec(vec![0.0f32, -0.0], [2]);
    let n = x.neg().to_vec::<f32>().unwrap();
    assert!(n[0].is_sign_negative() && n[1].is_sign_positive(), "{n:?}");
    let a = x.abs().to_vec::<f32>().unwrap();
    assert!(a[1].is_sign_positive(), "{a:?}");
}

#[test]
fn neg_abs_relu_ints_wrap() {
    let x = Tensor::from_vec(vec![5i32, -3, 0, i32::MIN], [4]);
    expect_i(&x.neg(), DType::I32, &[4], &[-5, 3, 0, i32::MIN as i64]);
    expect_i(&x.abs(), DType::I32, &[4], &[5, 3, 0, i32::MIN as i64]);
    expect_i(&x.relu(), DType::I32, &[4], &[5, 0, 0, 0]);
    let x = Tensor::from_vec(vec![5i64, i64::MIN, -9], [3]);
    expect_i(&x.neg(), DType::I64, &[3], &[-5, i64::MIN, 9]);
    expect_i(&x.abs(), DType::I64, &[3], &[5, i64::MIN, 9]);
    expect_i(&x.relu(), DType::I64, &[3], &[5, 0, 0]);
    let x = Tensor::from_vec(vec![5u8, 0, 255], [3]);
    expect_i(&x.neg(), DType::U8, &[3], &[251, 0, 1]);
    expect_i(&x.abs(), DType::U8, &[3], &[5, 0, 255]);
    expect_i(&x.relu(), DType::U8, &[3], &[5, 0, 255]);
}

/// (op name, op, inputs, expected outputs).
type UnaryCase = (&'static str, fn(&Tensor) -> Tensor, Vec<f64>, Vec<f64>);

fn unary_cases() -> Vec<UnaryCase> {
    let e = std::f64::consts::E;
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    vec![
        (
            "exp",
            Tensor::exp,
            vec![0.0, 1.0, -1.0, 2.0, -inf],
            vec![1.0, e, 1.0 / e, e * e, 0.0],
        ),
        (
            "log",
            Tensor::log,
            vec![1.0, e, 0.5, 0.0, -1.0, inf],
            vec![0.0, 1.0, -std::f64::consts::LN_2, -inf, nan, inf],
        ),
        (
            // PyTorch documents log2(8) = 3 style exact results for powers of two.
            "log2",
            Tensor::log2,
            vec![1.0, 2.0, 8.0, 0.25, 10.0, 0.0, -1.0, inf],
            vec![0.0, 1.0, 3.0, -2.0, 10f64.log2(), -inf, nan, inf],
        ),
        (
            "sqrt",
            Tensor::sqrt,
            vec![4.0, 2.0, 0.0, -1.0, inf],
            vec![2.0, std::f64::consts::SQRT_2, 0.0, nan, inf],
        ),
        (
            "recip",
            Tensor::recip,
            vec![2.0, -4.0, 0.0, 0.5, inf],
            vec![0.5, -0.25, inf, 2.0, 0.0],
        ),
        (
            "sin",
            Tensor::sin,
            vec![0.0, 0.5, std::f64::consts::FRAC_PI_2, -3.0],
            vec![0.0, 0.479425538604203, 1.0, -0.1411200080598672],
        ),
        (
            "cos",
            Tensor::cos,
            vec![0.0, 0.5, std::f64::consts::PI, -2.0],
            vec![1.0, 0.8775825618903728, -1.0, -0.4161468365471424],
        ),
        (
            "tanh",
            Tensor::tanh,
            vec![0.0, 0.5, -1.0, 20.0, -20.0],
            vec![0.0, 0.46211715726000974, -0.7615941559557649, 1.0, -1.0],
        ),
        (
            "sigmoid",
            Tensor::sigmoid,
            vec![0.0, 2.0, -2.0, 100.0, -100.0],
            vec![
                0.5,
                0.8807970779778823,
                0.11920292202211755,
                1.0,
                3.720075976020836e-44,
            ],
        ),
        (
            "relu",
            Tensor::relu,
            vec![-1.0, 0.0, 2.5, nan, -inf],
            vec![0.0, 0.0, 2.5, nan, 0.0],
        ),
        (
            "gelu",
            Tensor::gelu,
            // gelu(0) is left out: see `gelu_of_zero_f64_terminates`.
            vec![0.5, 1.0, -1.0, 3.0, -3.0],
            vec![
                0.34573123063700656,
                0.8413447460685429,
                -0.15865525393145707,
                2.99595030590511,
                -0.004049694094890287,
            ],
        ),
    ]
}

#[test]
fn unary_float_ops_per_dtype() {
    for (name, f, x, want) in unary_cases() {
        for dt in FLOATS {
            let t = make(&x, &[x.len()], dt);
            // Inputs are rounded to dt; the expected values are close enough for every case
            // here (checked at dt's tolerance).
            let y = f(&t);
            assert_eq!(y.dtype(), dt, "{name}");
            let r = reference::evaluate(&y).unwrap().to_f64();
            let got = read(&y);
            let want: Vec<f64> = want.iter().map(|&w| round_to(w, dt)).collect();
            assert_close(&r, &want, tol(dt), &format!("{name} reference {dt}"));
            assert_close(&got, &want, tol(dt), &format!("{name} kiln {dt}"));
        }
    }
}

#[test]
fn gelu_exact_erf_form() {
    let x = Tensor::from_vec(vec![1.0f32, -1.0], [2]);
    let v = x.gelu().to_vec::<f32>().unwrap();
    assert!((v[0] - 0.8413447).abs() < 1e-6, "{v:?}");
    assert!((v[1] + 0.1586553).abs() < 1e-6, "{v:?}");
    // Far tails: exact form gives tiny negatives / x itself.
    let x = Tensor::from_vec(vec![-10.0f64, 10.0, -5.0], [3]);
    let v = x.gelu().to_vec::<f64>().unwrap();
    assert!((v[0] + 7.619853024160593e-23).abs() < 1e-30, "{v:?}");
    assert!((v[1] - 10.0).abs() < 1e-12, "{v:?}");
    assert!((v[2] + 1.4332578593959731e-6).abs() < 1e-17, "{v:?}");
    // f32 and f16 handle an exact zero.
    let x = Tensor::from_vec(vec![0.0f32, -0.0], [2]);
    assert_eq!(x.gelu().to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    let v = x.cast(DType::F16).gelu().cast(DType::F32);
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
}

/// Runs `f` on a helper thread and gives up after `secs` seconds (the thread is left behind).
fn finishes_within<T: Send + 'static>(
    secs: u64,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs)).ok()
}

#[test]
fn gelu_of_zero_f64_terminates() {
    // The erf series stops when the last term is small relative to the sum, which never
    // happens when both are exactly zero. (Also hangs `reference::evaluate` of gelu(0) in any
    // dtype, while it holds the graph lock.)
    assert_eq!(
        finishes_within(10, || kiln::math::f64::erfc(0.0)),
        Some(1.0)
    );
    let got = finishes_within(10, || {
        Tensor::from_vec(vec![0.0f64], [1])
            .gelu()
            .to_vec::<f64>()
            .unwrap()
    });
    assert_eq!(got, Some(vec![0.0]));
}

#[test]
fn unary_on_large_arguments_f32() {
    let x = Tensor::from_vec(vec![100.0f32, 1000.0, -50.0], [3]);
    expect(
        &x.sin(),
        DType::F32,
        &[3],
        &[-0.5063656411097588, 0.8268795405320025, 0.26237485370392877],
    );
    expect(
        &x.cos(),
        DType::F32,
        &[3],
        &[0.8623188722876839, 0.5623790762907029, 0.9649660284921133],
    );
    expect(
        &x.exp(),
        DType::F32,
        &[3],
        &[f64::INFINITY, f64::INFINITY, 1.9287498479639178e-22],
    );
}

#[test]
fn recip_negative_zero_and_rsqrt_square_clamp() {
    let x = Tensor::from_vec(vec![-0.0f32, 4.0], [2]);
    expect(&x.recip(), DType::F32, &[2], &[f64::NEG_INFINITY, 0.25]);
    expect(&x.rsqrt(), DType::F32, &[2], &[f64::NEG_INFINITY, 0.5]);
    let x = Tensor::from_vec(vec![-3i32, 4], [2]);
    expect_i(&x.square(), DType::I32, &[2], &[9, 16]);
    let x = Tensor::from_vec(vec![-3.0f32, 0.5, 7.0, f32::NAN], [4]);
    expect(
        &x.clamp(-1.0, 2.0),
        DType::F32,
        &[4],
        &[-1.0, 0.5, 2.0, f64::NAN],
    );
    let x = Tensor::from_vec(vec![-3i32, 5, 100], [3]);
    expect_i(&x.clamp(0, 10), DType::I32, &[3], &[0, 5, 10]);
}

#[test]
fn float_unary_of_ints_and_bools_gives_f32() {
    let x = Tensor::from_vec(vec![0i32, 1, 2], [3]);
    let e = std::f64::consts::E;
    expect(&x.exp(), DType::F32, &[3], &[1.0, e, e * e]);
    let x = Tensor::from_vec(vec![4u8, 9], [2]);
    expect(&x.sqrt(), DType::F32, &[2], &[2.0, 3.0]);
    let x = Tensor::from_vec(vec![1i64, 4], [2]);
    expect(&x.log(), DType::F32, &[2], &[0.0, 4f64.ln()]);
    expect(&x.recip(), DType::F32, &[2], &[1.0, 0.25]);
    let x = Tensor::from_vec(vec![true, false], [2]);
    expect(&x.sigmoid(), DType::F32, &[2], &[0.7310585786300049, 0.5]);
    expect(&x.exp(), DType::F32, &[2], &[e, 1.0]);
    expect(&x.tanh(), DType::F32, &[2], &[0.7615941559557649, 0.0]);
}

// ---------------------------------------------------------------------------------------------
// pow
// ---------------------------------------------------------------------------------------------

#[test]
fn pow_floats() {
    for dt in FLOATS {
        let x = make(&[2.0, 3.0, -2.0, 0.0], &[4], dt);
        expect(&x.pow(3.0), dt, &[4], &[8.0, 27.0, -8.0, 0.0]);
        expect(&x.pow(2.0), dt, &[4], &[4.0, 9.0, 4.0, 0.0]);
        expect(&x.pow(2), dt, &[4], &[4.0, 9.0, 4.0, 0.0]);
        expect(&x.pow(1.0), dt, &[4], &[2.0, 3.0, -2.0, 0.0]);
        expect(&x.pow(0.0), dt, &[4], &[1.0, 1.0, 1.0, 1.0]);
        expect(
            &x.pow(-1.0),
            dt,
            &[4],
            &[0.5, 1.0 / 3.0, -0.5, f64::INFINITY],
        );
        expect(
            &x.pow(0.5),
            dt,
            &[4],
            &[std::f64::consts::SQRT_2, 3f64.sqrt(), f64::NAN, 0.0],
        );
        expect(
            &x.pow(1.5),
            dt,
            &[4],
            &[8f64.sqrt(), 27f64.sqrt(), f64::NAN, 0.0],
        );
        let e = make(&[3.0, 0.5, 2.0, 2.0], &[4], dt);
        expect(&x.pow(&e), dt, &[4], &[8.0, 3f64.sqrt(), 4.0, 0.0]);
    }
}

#[test]
fn pow_ints_wrap_and_fast_paths() {
    let x = Tensor::from_vec(vec![2i32, 3, -2, 0], [4]);
    expect_i(&x.pow(3), DType::I32, &[4], &[8, 27, -8, 0]);
    expect_i(&x.pow(2), DType::I32, &[4], &[4, 9, 4, 0]);
    expect_i(&x.pow(0), DType::I32, &[4], &[1, 1, 1, 1]);
    let x = Tensor::from_vec(vec![2i32, 3, -2], [3]);
    // 2^31 wraps to i32::MIN; 3^31 and (-2)^31 wrap like Rust's wrapping_pow.
    expect_i(
        &x.pow(31),
        DType::I32,
        &[3],
        &[
            2i32.wrapping_pow(31) as i64,
            3i32.wrapping_pow(31) as i64,
            (-2i32).wrapping_pow(31) as i64,
        ],
    );
    let x = Tensor::from_vec(vec![3i64, 2], [2]);
    expect_i(
        &x.pow(40),
        DType::I64,
        &[2],
        &[3i64.wrapping_pow(40), 1 << 40],
    );
    expect_i(&x.pow(64), DType::I64, &[2], &[3i64.wrapping_pow(64), 0]);
    let x = Tensor::from_vec(vec![2u8, 3, 255], [3]);
    expect_i(
        &x.pow(8),
        DType::U8,
        &[3],
        &[0, 3u8.wrapping_pow(8) as i64, 1],
    );
    expect_i(&x.pow(2), DType::U8, &[3], &[4, 9, 1]);
    // Negative integer exponents in a tensor give the truncated real result (a negative
    // scalar exponent is an error, as in PyTorch: tests/hardening.rs).
    let x = Tensor::from_vec(vec![2i32, 1, -1, -3], [4]);
    let e = |v: i32| Tensor::from_vec(vec![v; 4], [4]);
    expect_i(&x.pow(e(-1)), DType::I32, &[4], &[0, 1, -1, 0]);
    expect_i(&x.pow(e(-2)), DType::I32, &[4], &[0, 1, 1, 0]);
    assert!(x.try_pow(-1).is_err());
    // A float exponent lifts to f32; 0.5 is a square root.
    let x = Tensor::from_vec(vec![4i32, 9], [2]);
    expect(&x.pow(0.5), DType::F32, &[2], &[2.0, 3.0]);
    expect(&x.pow(2.5), DType::F32, &[2], &[32.0, 243.0]);
    // Tensor exponent with integers.
    let e = Tensor::from_vec(vec![3i32, 2], [2]);
    expect_i(&x.pow(&e), DType::I32, &[2], &[64, 81]);
    // Bool base with an integer exponent promotes to i64, as in PyTorch.
    let b = Tensor::from_vec(vec![true, false], [2]);
    expect_i(&b.pow(1), DType::I64, &[2], &[1, 0]);
    expect_i(&b.pow(3), DType::I64, &[2], &[1, 0]);
}

// ---------------------------------------------------------------------------------------------
// maximum / minimum / comparisons / where
// ---------------------------------------------------------------------------------------------

#[test]
fn maximum_minimum_propagate_nan() {
    let nan = f64::NAN;
    for dt in FLOATS {
        let x = make(&[1.0, nan, 3.0, -0.5, nan], &[5], dt);
        let y = make(&[2.0, 0.0, nan, -1.0, nan], &[5], dt);
        expect(&x.maximum(&y), dt, &[5], &[2.0, nan, nan, -0.5, nan]);
        expect(&x.minimum(&y), dt, &[5], &[1.0, nan, nan, -1.0, nan]);
        expect(&x.maximum(0.0), dt, &[5], &[1.0, nan, 3.0, 0.0, nan]);
    }
    for dt in INTS {
        let x = make(&[1.0, 200.0, 7.0], &[3], dt);
        let y = make(&[2.0, 100.0, 7.0], &[3], dt);
        expect_i(&x.maximum(&y), dt, &[3], &[2, 200, 7]);
        expect_i(&x.minimum(&y), dt, &[3], &[1, 100, 7]);
    }
    let x = Tensor::from_vec(vec![-5i32, 4], [2]);
    expect_i(
        &x.maximum(Tensor::from_vec(vec![-7i32, 9], [2])),
        DType::I32,
        &[2],
        &[-5, 9],
    );
}

#[test]
fn comparisons_give_bool() {
    let nan = f64::NAN;
    for dt in FLOATS {
        let x = make(&[1.0, 2.0, nan, 3.0], &[4], dt);
        let y = make(&[2.0, 2.0, nan, 1.0], &[4], dt);
        expect_b(&x.lt(&y), &[4], &[true, false, false, false]);
        expect_b(&x.le(&y), &[4], &[true, true, false, false]);
        expect_b(&x.gt(&y), &[4], &[false, false, false, true]);
        expect_b(&x.ge(&y), &[4], &[false, true, false, true]);
        expect_b(&x.eq(&y), &[4], &[false, true, false, false]);
        expect_b(&x.ne(&y), &[4], &[true, false, true, true]);
        expect_b(&x.gt(1.5), &[4], &[false, true, false, true]);
    }
    for dt in [DType::I32, DType::I64] {
        let x = make(&[1.0, 2.0, -3.0], &[3], dt);
        let y = make(&[2.0, 2.0, -4.0], &[3], dt);
        expect_b(&x.lt(&y), &[3], &[true, false, false]);
        expect_b(&x.le(&y), &[3], &[true, true, false]);
        expect_b(&x.gt(&y), &[3], &[false, false, true]);
        expect_b(&x.ge(&y), &[3], &[false, true, true]);
        expect_b(&x.eq(&y), &[3], &[false, true, false]);
        expect_b(&x.ne(&y), &[3], &[true, false, true]);
        expect_b(&x.eq(2), &[3], &[false, true, false]);
    }
    let x = Tensor::from_vec(vec![1u8, 200], [2]);
    let y = Tensor::from_vec(vec![2u8, 100], [2]);
    expect_b(&x.lt(&y), &[2], &[true, false]);
    expect_b(&x.ge(&y), &[2], &[false, true]);
    let x = Tensor::from_vec(vec![false, true, true], [3]);
    let y = Tensor::from_vec(vec![true, true, false], [3]);
    expect_b(&x.lt(&y), &[3], &[true, false, false]);
    expect_b(&x.eq(&y), &[3], &[false, true, false]);
    // Mixed dtypes promote before comparing: 1 < 1.5, 2 == 2.0.
    let i = Tensor::from_vec(vec![1i32, 2], [2]);
    let f = Tensor::from_vec(vec![1.5f32, 2.0], [2]);
    expect_b(&i.lt(&f), &[2], &[true, false]);
    expect_b(&i.eq(&f), &[2], &[false, true]);
    expect_b(&i.lt(1.5), &[2], &[true, false]);
    // Large i64 values compare exactly (not through f32/f64).
    let a = Tensor::from_vec(vec![(1i64 << 60) + 1], [1]);
    let b = Tensor::from_vec(vec![1i64 << 60], [1]);
    expect_b(&a.gt(&b), &[1], &[true]);
    expect_b(&a.eq(&b), &[1], &[false]);
}

#[test]
fn where_tensor_and_scalar_branches() {
    let c = Tensor::from_vec(vec![true, false, true], [3]);
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let b = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], [3]);
    expect(
        &Tensor::where_(&c, &a, &b),
        DType::F32,
        &[3],
        &[1.0, 20.0, 3.0],
    );
    expect(
        &Tensor::where_(&c, &a, 0.0),
        DType::F32,
        &[3],
        &[1.0, 0.0, 3.0],
    );
    expect(
        &Tensor::where_(&c, 5.0, &b),
        DType::F32,
        &[3],
        &[5.0, 20.0, 5.0],
    );
    expect(
        &Tensor::where_(&c, 1.0, 0.0),
        DType::F32,
        &[3],
        &[1.0, 0.0, 1.0],
    );
    expect_i(&Tensor::where_(&c, 1, 2), DType::I64, &[3], &[1, 2, 1]);
    expect_b(
        &Tensor::where_(&c, false, true),
        &[3],
        &[false, true, false],
    );
    expect(
        &Tensor::where_(&c, 1, 2.5),
        DType::F32,
        &[3],
        &[1.0, 2.5, 1.0],
    );

    // Broadcast condition [3,1] against a [1,2] branch and a scalar.
    let c = Tensor::from_vec(vec![true, false, true], [3, 1]);
    let a = Tensor::from_vec(vec![1i32, 2], [1, 2]);
    expect_i(
        &Tensor::where_(&c, &a, 0),
        DType::I32,
        &[3, 2],
        &[1, 2, 0, 0, 1, 2],
    );
    let b = Tensor::from_vec(vec![7i32, 8, 9], [3]);
    expect_i(
        &Tensor::where_(&c, &b, 0),
        DType::I32,
        &[3, 3],
        &[7, 8, 9, 0, 0, 0, 7, 8, 9],
    );

    // A condition from a comparison with zero ("nonzero": NaN is nonzero); `where` itself
    // takes only bool conditions.
    let c = Tensor::from_vec(vec![0.0f32, 2.5, -1.0, f32::NAN, -0.0], [5]);
    assert!(Tensor::try_where(&c, 1, 0).is_err());
    let c = c.ne(0);
    expect_i(
        &Tensor::where_(&c, 1, 0),
        DType::I64,
        &[5],
        &[0, 1, 1, 1, 0],
    );
    let c = Tensor::from_vec(vec![0u8, 3], [2]).ne(0);
    expect_i(&Tensor::where_(&c, 1, 0), DType::I64, &[2], &[0, 1]);

    // Branches of different dtypes promote.
    let c = Tensor::from_vec(vec![true, false], [2]);
    let a = Tensor::from_vec(vec![1i32, 2], [2]);
    let b = Tensor::from_vec(vec![0.5f32, 0.25], [2]);
    expect(&Tensor::where_(&c, &a, &b), DType::F32, &[2], &[1.0, 0.25]);
    expect(&Tensor::where_(&c, &a, 2.5), DType::F32, &[2], &[1.0, 2.5]);
    let h = Tensor::from_vec(vec![f16::from_f32(0.5), f16::from_f32(1.5)], [2]);
    expect(&Tensor::where_(&c, &a, &h), DType::F16, &[2], &[1.0, 1.5]);
    let u = Tensor::from_vec(vec![200u8, 100], [2]);
    expect_i(&Tensor::where_(&c, &u, &a), DType::I32, &[2], &[200, 2]);
}

// ---------------------------------------------------------------------------------------------
// Casts
// ---------------------------------------------------------------------------------------------

/// Source values per dtype, all exactly representable in that dtype, as f64 (floats) or i64.
fn cast_sources(dt: DType) -> (Vec<f64>, Vec<i64>) {
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    match dt {
        DType::Bool => (vec![], vec![0, 1]),
        DType::U8 => (vec![], vec![0, 1, 127, 128, 200, 255]),
        DType::I32 => (
            vec![],
            vec![
                0,
                1,
                -1,
                127,
                128,
                255,
                256,
                257,
                259,
                300,
                -129,
                65504,
                65519,
                65520,
                70000,
                16_777_217,
                i32::MAX as i64,
                i32::MIN as i64,
            ],
        ),
        DType::I64 => (
            vec![],
            vec![
                0,
                -1,
                256,
                300,
                -129,
                (1 << 40) + 5,
                1 << 53,
                i64::MAX,
                i64::MIN,
                3_000_000_000,
            ],
        ),
        DType::F32 => (
            [
                0.0f32,
                -0.0,
                1.7,
                -1.7,
                2.5,
                -2.5,
                0.5,
                -0.5,
                255.9,
                256.0,
                300.7,
                -129.5,
                1e10,
                -1e10,
                3e9,
                -3e9,
                0.1,
                65519.0,
                65520.0,
                2049.0,
                2051.0,
                257.0,
                259.0,
                1e-8,
                1e-40,
                f32::MAX,
                f32::MIN_POSITIVE,
                // Just above a f16 rounding tie only by the lowest f32 bit (see
                // `reference_rounds_f32_to_bf16_to_nearest` for the bf16 one).
                1.0 + 1.0 / 2048.0 + 1.0 / 8_388_608.0,
            ]
            .iter()
            .map(|&x| x as f64)
            .chain([nan, inf, -inf])
            .collect(),
            vec![],
        ),
        DType::F64 => (
            vec![
                0.0,
                -0.0,
                1.7,
                -1.7,
                0.1,
                1e300,
                -1e300,
                3e9,
                -3e9,
                1e19,
                1e-50,
                2.5,
                256.5,
                -0.99,
                4294967296.5,
                nan,
                inf,
                -inf,
            ],
            vec![],
        ),
        DType::F16 => (
            [
                0.0,
                -0.0,
                1.5,
                -1.5,
                0.1,
                255.0,
                300.0,
                65504.0,
                -65504.0,
                5.960464477539063e-8,
            ]
            .iter()
            .map(|&x| f16::from_f64(x).to_f64())
            .chain([nan, inf, -inf])
            .collect(),
            vec![],
        ),
        DType::BF16 => (
            [
                0.0, -0.0, 1.5, -1.5, 1.7, 256.0, 300.0, 1e10, -1e10, -3e38, 1e-39, 65504.0,
            ]
            .iter()
            .map(|&x| bf16::from_f64(x).to_f64())
            .chain([nan, inf, -inf])
            .collect(),
            vec![],
        ),
    }
}

/// What Rust's `as` (and `half` for 16-bit floats) make of a value: f64 for float targets,
/// i64 for integer/bool targets.
#[derive(Debug, Clone, Copy)]
enum V {
    F(f64),
    I(i64),
}

fn rust_cast(v: V, from: DType, to: DType) -> V {
    match (v, to) {
        (V::F(x), DType::Bool) => V::I((x != 0.0) as i64),
        (V::I(i), DType::Bool) => V::I((i != 0) as i64),
        (V::F(x), DType::U8) => V::I(x as u8 as i64),
        (V::I(i), DType::U8) => V::I(i as u8 as i64),
        (V::F(x), DType::I32) => V::I(x as i32 as i64),
        (V::I(i), DType::I32) => V::I(i as i32 as i64),
        (V::F(x), DType::I64) => V::I(x as i64),
        (V::I(i), DType::I64) => V::I(i),
        (V::F(x), DType::F64) => V::F(x),
        (V::I(i), DType::F64) => V::F(i as f64),
        (V::F(x), DType::F32) => V::F(x as f32 as f64),
        (V::I(i), DType::F32) => V::F(i as f32 as f64),
        (V::F(x), DType::F16) => V::F(if from == DType::F64 {
            f16::from_f64(x).to_f64()
        } else {
            f16::from_f32(x as f32).to_f64()
        }),
        (V::I(i), DType::F16) => V::F(f16::from_f32(i as f32).to_f64()),
        (V::F(x), DType::BF16) => V::F(if from == DType::F64 {
            bf16::from_f64(x).to_f64()
        } else {
            bf16::from_f32(x as f32).to_f64()
        }),
        (V::I(i), DType::BF16) => V::F(bf16::from_f32(i as f32).to_f64()),
    }
}

fn make_i(data: &[i64], dt: DType) -> Tensor {
    let n = [data.len()];
    match dt {
        DType::Bool => Tensor::from_vec(data.iter().map(|&x| x != 0).collect(), n),
        DType::U8 => Tensor::from_vec(data.iter().map(|&x| x as u8).collect(), n),
        DType::I32 => Tensor::from_vec(data.iter().map(|&x| x as i32).collect(), n),
        DType::I64 => Tensor::from_vec(data.to_vec(), n),
        d => panic!("make_i {d}"),
    }
}

fn same_float(g: f64, w: f64) -> bool {
    (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits()
}

#[test]
fn cast_every_pair_of_dtypes() {
    let mut failures = vec![];
    for from in ALL {
        let (fv, iv) = cast_sources(from);
        let (src, vals): (Tensor, Vec<V>) = if from.is_float() {
            (
                make(&fv, &[fv.len()], from),
                fv.iter().map(|&x| V::F(x)).collect(),
            )
        } else {
            (make_i(&iv, from), iv.iter().map(|&x| V::I(x)).collect())
        };
        for to in ALL {
            let t = src.cast(to);
            assert_eq!(t.dtype(), to);
            let want: Vec<V> = vals.iter().map(|&v| rust_cast(v, from, to)).collect();
            let r = reference::evaluate(&t).unwrap();
            if to.is_float() {
                let got = read(&t);
                let rv = r.to_f64();
                for (i, w) in want.iter().enumerate() {
                    let V::F(w) = *w else { unreachable!() };
                    if !same_float(got[i], w) {
                        failures.push(format!(
                            "{from}->{to}: {:?} gave {} want {w}",
                            vals[i], got[i]
                        ));
                    }
                    if !same_float(rv[i], w) {
                        failures.push(format!(
                            "reference {from}->{to}: {:?} gave {} want {w}",
                            vals[i], rv[i]
                        ));
                    }
                }
            } else {
                let got = read_i(&t);
                let RefData::I(rv) = &r.data else {
                    panic!("reference data kind")
                };
                for (i, w) in want.iter().enumerate() {
                    let V::I(w) = *w else { unreachable!() };
                    if got[i] != w {
                        failures.push(format!(
                            "{from}->{to}: {:?} gave {} want {w}",
                            vals[i], got[i]
                        ));
                    }
                    if rv[i] != w {
                        failures.push(format!(
                            "reference {from}->{to}: {:?} gave {} want {w}",
                            vals[i], rv[i]
                        ));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cast mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn reference_rounds_f32_to_bf16_to_nearest() {
    // 1 + 2^-8 + 2^-23 is just above the bf16 tie between 1.0 and 1.0078125: it must round up.
    let v = 1.0f32 + 1.0 / 256.0 + 1.0 / 8_388_608.0;
    assert_eq!(bf16::from_f32(v).to_f64(), 1.0078125);
    let t = Tensor::from_vec(vec![v], [1]).cast(DType::BF16);
    let r = reference::evaluate(&t).unwrap().to_f64();
    assert_eq!(t.to_vec::<bf16>().unwrap()[0].to_f64(), 1.0078125); // the backend is right
    assert_eq!(r, vec![1.0078125], "reference");
    // Same root cause: a filled constant.
    let f = Tensor::full_dtype([1], v, DType::BF16)
        .to_vec::<bf16>()
        .unwrap();
    assert_eq!(f[0].to_f64(), 1.0078125, "full");
}

#[test]
fn cast_hand_checked_values() {
    let x = Tensor::from_vec(
        vec![-1.7f32, 2.9, 300.7, f32::NAN, f32::INFINITY, -1e10],
        [6],
    );
    expect_i(
        &x.cast(DType::I32),
        DType::I32,
        &[6],
        &[-1, 2, 300, 0, i32::MAX as i64, i32::MIN as i64],
    );
    expect_i(&x.cast(DType::U8), DType::U8, &[6], &[0, 2, 255, 0, 255, 0]);
    expect_i(
        &x.cast(DType::I64),
        DType::I64,
        &[6],
        &[-1, 2, 300, 0, i64::MAX, -10_000_000_000],
    );
    expect_b(
        &x.cast(DType::Bool),
        &[6],
        &[true, true, true, true, true, true],
    );
    let x = Tensor::from_vec(vec![300i64, -1, (1 << 40) + 5, -129, 256], [5]);
    expect_i(&x.cast(DType::U8), DType::U8, &[5], &[44, 255, 5, 127, 0]);
    expect_i(
        &x.cast(DType::I32),
        DType::I32,
        &[5],
        &[300, -1, 5, -129, 256],
    );
    expect_b(&x.cast(DType::Bool), &[5], &[true, true, true, true, true]);
    let x = Tensor::from_vec(
        vec![0.1f32, 2049.0, 2051.0, 65520.0, 1e-8, 257.0, 259.0],
        [7],
    );
    let h = x.cast(DType::F16).to_vec::<f16>().unwrap();
    let h: Vec<f64> = h.iter().map(|v| v.to_f64()).collect();
    assert_eq!(
        h,
        vec![
            0.0999755859375,
            2048.0,
            2052.0,
            f64::INFINITY,
            0.0,
            257.0,
            259.0
        ]
    );
    let b = x.cast(DType::BF16).to_vec::<bf16>().unwrap();
    let b: Vec<f64> = b.iter().map(|v| v.to_f64()).collect();
    assert_eq!(
        b,
        vec![
            0.10009765625,
            2048.0,
            2048.0,
            65536.0,
            1.0011717677116394e-8,
            256.0,
            260.0
        ]
    );
    let x = Tensor::from_vec(vec![true, false], [2]);
    expect(&x.cast(DType::F16), DType::F16, &[2], &[1.0, 0.0]);
    expect_i(&x.cast(DType::U8), DType::U8, &[2], &[1, 0]);
    // cast to the same dtype is the same tensor.
    let x = Tensor::from_vec(vec![1.5f32], [1]);
    assert_eq!(x.cast(DType::F32).node_key(), x.node_key());
}

#[test]
fn cast_of_lazy_and_view_inputs_matches_reference() {
    let x = Tensor::randn_seeded([3, 4], 5) * 300.0;
    for to in ALL {
        check_ref(&x.transpose(0, 1).cast(to));
        check_ref(&x.cast(to).flip([1]).cast(DType::F64));
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

#[test]
fn sum_and_prod_per_dtype() {
    let data = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    for dt in FLOATS {
        let x = make(&data, &[2, 3], dt);
        expect(&x.sum(0), dt, &[3], &[5.0, 7.0, 9.0]);
        expect(&x.sum(1), dt, &[2], &[6.0, 15.0]);
        expect(&x.sum_keepdim(-1), dt, &[2, 1], &[6.0, 15.0]);
        expect(&x.sum(..), dt, &[], &[21.0]);
        expect(&x.sum_keepdim([0, 1]), dt, &[1, 1], &[21.0]);
        expect(&x.prod(1), dt, &[2], &[6.0, 120.0]);
        expect(&x.prod(..), dt, &[], &[720.0]);
    }
    for dt in INTS {
        let x = make(&data, &[2, 3], dt);
        expect_i(&x.sum(0), DType::I64, &[3], &[5, 7, 9]);
        expect_i(&x.sum(..), DType::I64, &[], &[21]);
        expect_i(&x.prod(1), DType::I64, &[2], &[6, 120]);
    }
    // Integers accumulate in i64: no wrap at the input width.
    let x = Tensor::from_vec(vec![i32::MAX, 1], [2]);
    expect_i(&x.sum(..), DType::I64, &[], &[1 << 31]);
    let x = Tensor::from_vec(vec![200u8, 100, 16], [3]);
    expect_i(&x.sum(0), DType::I64, &[], &[316]);
    expect_i(&x.prod(0), DType::I64, &[], &[320000]);
    // i64 itself wraps.
    let x = Tensor::from_vec(vec![i64::MAX, 1], [2]);
    expect_i(&x.sum(..), DType::I64, &[], &[i64::MIN]);
    let x = Tensor::from_vec(vec![1i64 << 62, 4], [2]);
    expect_i(&x.prod(..), DType::I64, &[], &[0]);
    // Bools count.
    let x = Tensor::from_vec(vec![true, false, true, true], [2, 2]);
    expect_i(&x.sum(1), DType::I64, &[2], &[1, 2]);
    expect_i(&x.prod(0), DType::I64, &[2], &[1, 0]);
}

#[test]
fn sum_of_many_elements_matches_reference() {
    let x = Tensor::randn_seeded([5, 300], 9);
    check_ref(&x.sum(1));
    check_ref(&x.sum(0));
    check_ref(&x.sum(..));
    let y = Tensor::try_randn([7, 50], 10, DType::F16).unwrap();
    check_ref(&y.sum(1));
    let i = (Tensor::rand_seeded([4, 100], 2) * 1000.0).cast(DType::I32);
    check_ref(&i.sum_keepdim(1));
    check_ref(&i.prod(0));
    let z = Tensor::randn_seeded([2, 3, 4], 3);
    check_ref(&z.sum([0, 2]));
    check_ref(&z.max_keepdim([0, 2]));
    check_ref(&z.permute([2, 0, 1]).sum(1));
}

#[test]
fn mean_per_float_dtype() {
    for dt in FLOATS {
        let x = make(&[1.0, 2.0, 3.0, 4.0], &[2, 2], dt);
        expect(&x.mean(-1), dt, &[2], &[1.5, 3.5]);
        expect(&x.mean_keepdim(0), dt, &[1, 2], &[2.0, 3.0]);
        expect(&x.mean(..), dt, &[], &[2.5]);
    }
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3]);
    assert!((x.mean(0).item::<f32>().unwrap() - 7.0 / 3.0).abs() < 1e-6);
}

#[test]
fn max_min_propagate_nan() {
    let nan = f64::NAN;
    for dt in FLOATS {
        let x = make(&[1.0, nan, 3.0, 4.0, 5.0, -6.0], &[2, 3], dt);
        expect(&x.max(1), dt, &[2], &[nan, 5.0]);
        expect(&x.min(1), dt, &[2], &[nan, -6.0]);
        expect(&x.max(0), dt, &[3], &[4.0, nan, 3.0]);
        expect(&x.min_keepdim(0), dt, &[1, 3], &[1.0, nan, -6.0]);
        expect(&x.max(..), dt, &[], &[nan]);
        let y = make(&[-1.0, f64::NEG_INFINITY, -3.0], &[3], dt);
        expect(&y.max(0), dt, &[], &[-1.0]);
        expect(&y.min(0), dt, &[], &[f64::NEG_INFINITY]);
    }
    // NaN in the last position of a longer row.
    let mut v = vec![1.0f32; 37];
    v[36] = f32::NAN;
    let x = Tensor::from_vec(v, [37]);
    assert!(x.max(0).item::<f32>().unwrap().is_nan());
    assert!(x.min(0).item::<f32>().unwrap().is_nan());
    // Integers keep their dtype.
    let x = Tensor::from_vec(vec![-5i32, -2, -9], [3]);
    expect_i(&x.max(0), DType::I32, &[], &[-2]);
    expect_i(&x.min(0), DType::I32, &[], &[-9]);
    let x = Tensor::from_vec(vec![7u8, 255, 0], [3]);
    expect_i(&x.max(0), DType::U8, &[], &[255]);
    expect_i(&x.min(0), DType::U8, &[], &[0]);
    let x = Tensor::from_vec(vec![i64::MIN, i64::MAX], [2]);
    expect_i(&x.max(0), DType::I64, &[], &[i64::MAX]);
    expect_i(&x.min(0), DType::I64, &[], &[i64::MIN]);
    let x = Tensor::from_vec(vec![false, true, false, false], [2, 2]);
    expect_b(&x.max(1), &[2], &[true, false]);
    expect_b(&x.min(0), &[2], &[false, false]);
}

#[test]
fn argmax_argmin_ties_and_nan() {
    let nan = f64::NAN;
    for dt in FLOATS {
        let x = make(&[1.0, 3.0, 3.0, nan, 2.0, nan, 5.0, 5.0, 1.0], &[3, 3], dt);
        expect_i(&x.argmax(1), DType::I64, &[3], &[1, 0, 0]);
        expect_i(&x.argmin(1), DType::I64, &[3], &[0, 0, 2]);
        expect_i(&x.argmax_keepdim(-1), DType::I64, &[3, 1], &[1, 0, 0]);
        expect_i(&x.argmax(0), DType::I64, &[3], &[1, 2, 1]);
        expect_i(&x.argmax(..), DType::I64, &[], &[3]);
        expect_i(&x.argmax_keepdim(..), DType::I64, &[1, 1], &[3]);
        let y = make(&[1.0, 5.0, 5.0, 2.0, -1.0, -1.0], &[2, 3], dt);
        expect_i(&y.argmax(..), DType::I64, &[], &[1]);
        expect_i(&y.argmin(..), DType::I64, &[], &[4]);
        expect_i(&y.argmax(0), DType::I64, &[3], &[1, 0, 0]);
        expect_i(&y.argmin(0), DType::I64, &[3], &[0, 1, 1]);
    }
    let x = Tensor::from_vec(vec![3i32, 7, 7, -1], [4]);
    expect_i(&x.argmax(0), DType::I64, &[], &[1]);
    expect_i(&x.argmin(..), DType::I64, &[], &[3]);
    // Large i64 values that f64 cannot tell apart (kiln only; see
    // `reference_arg_reductions_compare_i64_exactly`).
    let x = Tensor::from_vec(vec![i64::MAX - 1, i64::MAX, i64::MAX], [3]);
    assert_eq!(read_i(&x.argmax(..)), vec![1]);
    let x = Tensor::from_vec(vec![(1i64 << 60) + 1, (1 << 60) + 2, 1 << 60], [3]);
    assert_eq!(read_i(&x.argmin(..)), vec![2]);
    assert_eq!(read_i(&x.argmax(..)), vec![1]);
    let x = Tensor::from_vec(vec![9u8, 200, 200, 0, 0], [5]);
    expect_i(&x.argmax(..), DType::I64, &[], &[1]);
    expect_i(&x.argmin(..), DType::I64, &[], &[3]);
    let x = Tensor::from_vec(vec![false, true, true], [3]);
    expect_i(&x.argmax(..), DType::I64, &[], &[1]);
    expect_i(&x.argmin(..), DType::I64, &[], &[0]);
    // Longer rows: the tie/NaN rules hold past any vector width.
    let mut v = vec![0.0f32; 40];
    v[17] = 2.0;
    v[33] = 2.0;
    let x = Tensor::from_vec(v.clone(), [40]);
    expect_i(&x.argmax(..), DType::I64, &[], &[17]);
    v[25] = f32::NAN;
    v[39] = f32::NAN;
    let x = Tensor::from_vec(v, [40]);
    expect_i(&x.argmax(..), DType::I64, &[], &[25]);
}

#[test]
fn reference_arg_reductions_compare_i64_exactly() {
    let x = Tensor::from_vec(vec![(1i64 << 60) + 1, (1 << 60) + 2, 1 << 60], [3]);
    let r = reference::evaluate(&x.argmax(..)).unwrap();
    assert_eq!(r.data, RefData::I(vec![1]), "argmax");
    let r = reference::evaluate(&x.argmin(..)).unwrap();
    assert_eq!(r.data, RefData::I(vec![2]), "argmin");
}

#[test]
fn var_with_corrections() {
    for dt in FLOATS {
        let x = make(&[1.0, 2.0, 3.0, 4.0, 2.0, 2.0, 2.0, 2.0], &[2, 4], dt);
        expect(&x.var(1, 0), dt, &[2], &[1.25, 0.0]);
        expect(&x.var(1, 1), dt, &[2], &[5.0 / 3.0, 0.0]);
        expect(&x.var_keepdim(-1, 1), dt, &[2, 1], &[5.0 / 3.0, 0.0]);
        expect(&x.var(.., 0), dt, &[], &[0.6875]);
        expect(&x.var([0, 1], 1), dt, &[], &[5.5 / 7.0]);
        expect(&x.var(0, 0), dt, &[4], &[0.25, 0.0, 0.25, 1.0]);
    }
}

#[test]
fn softmax_and_log_softmax() {
    for dt in FLOATS {
        let x = make(&[1.0, 2.0, 3.0, 1000.0, 1000.0, 1000.0], &[2, 3], dt);
        let third = 1.0 / 3.0;
        expect(
            &x.softmax(-1),
            dt,
            &[2, 3],
            &[
                0.09003057317038046,
                0.24472847105479764,
                0.6652409557748219,
                third,
                third,
                third,
            ],
        );
        let s = x.softmax(1).sum(1);
        let (rel, abs) = tol(dt);
        assert_close(
            &read(&s),
            &[1.0, 1.0],
            (rel * 3.0, abs * 3.0),
            &format!("softmax rows {dt}"),
        );
        expect(&x.softmax(0), dt, &[2, 3], &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let l = x.log_softmax(1);
        let c = 3f64.ln();
        expect(
            &l,
            dt,
            &[2, 3],
            &[
                -2.4076059644443806,
                -1.4076059644443806,
                -0.4076059644443806,
                -c,
                -c,
                -c,
            ],
        );
        // logsumexp of a log_softmax row is 0.
        let lse = x.log_softmax(1).exp().sum(1).log();
        assert_close(
            &read(&lse),
            &[0.0, 0.0],
            (rel * 3.0, abs * 3.0),
            &format!("logsumexp {dt}"),
        );
    }
    let x = Tensor::from_vec(vec![f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 1.0], [2, 2]);
    expect(&x.softmax(-1), DType::F32, &[2, 2], &[0.0, 1.0, 0.0, 1.0]);
    // Integers become f32.
    let x = Tensor::from_vec(vec![1i32, 2, 3], [3]);
    expect(
        &x.softmax(0),
        DType::F32,
        &[3],
        &[0.09003057317038046, 0.24472847105479764, 0.6652409557748219],
    );
    expect(
        &x.log_softmax(0),
        DType::F32,
        &[3],
        &[
            -2.4076059644443806,
            -1.4076059644443806,
            -0.4076059644443806,
        ],
    );
    let r = Tensor::randn_seeded([4, 33], 21) * 5.0;
    check_ref(&r.softmax(1));
    check_ref(&r.log_softmax(0));
}

#[test]
fn layer_norm_with_and_without_affine() {
    let data = [1.0, 2.0, 3.0, 2.0, 4.0, 9.0];
    let eps = 1e-5;
    let normed = |row: &[f64]| -> Vec<f64> {
        let n = row.len() as f64;
        let m = row.iter().sum::<f64>() / n;
        let v = row.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
        row.iter().map(|x| (x - m) / (v + eps).sqrt()).collect()
    };
    let plain: Vec<f64> = data.chunks(3).flat_map(normed).collect();
    assert!((plain[0] + 1.2247357).abs() < 1e-6);
    let w = [1.0, 2.0, 3.0];
    let b = [0.0, 1.0, -1.0];
    let affine: Vec<f64> = plain
        .iter()
        .enumerate()
        .map(|(i, v)| v * w[i % 3] + b[i % 3])
        .collect();
    for dt in FLOATS {
        let x = make(&data, &[2, 3], dt);
        let (wt, bt) = (make(&w, &[3], dt), make(&b, &[3], dt));
        let (rel, abs) = tol(dt);
        let t = (rel * 4.0, abs * 4.0);
        let y = x.layer_norm(&[3], None, None, eps);
        assert_eq!((y.dtype(), y.shape()), (dt, &[2usize, 3][..]));
        let r = reference::evaluate(&y).unwrap().to_f64();
        assert_close(&r, &plain, t, &format!("layer_norm reference {dt}"));
        assert_close(&read(&y), &plain, t, &format!("layer_norm {dt}"));
        let y = x.layer_norm(&[3], Some(&wt), Some(&bt), eps);
        let r = reference::evaluate(&y).unwrap().to_f64();
        assert_close(&r, &affine, t, &format!("layer_norm affine reference {dt}"));
        assert_close(&read(&y), &affine, t, &format!("layer_norm affine {dt}"));
        let y = x.layer_norm(&[3], Some(&wt), None, eps);
        let want: Vec<f64> = plain
            .iter()
            .enumerate()
            .map(|(i, v)| v * w[i % 3])
            .collect();
        assert_close(&read(&y), &want, t, &format!("layer_norm weight only {dt}"));
        let y = x.layer_norm(&[3], None, Some(&bt), eps);
        let want: Vec<f64> = plain
            .iter()
            .enumerate()
            .map(|(i, v)| v + b[i % 3])
            .collect();
        assert_close(&read(&y), &want, t, &format!("layer_norm bias only {dt}"));
    }
    // Over the last two dimensions: the whole [2,3] block is one group.
    let x = make(&data, &[1, 2, 3], DType::F64);
    let want = normed(&data);
    assert_close(
        &read(&x.layer_norm(&[2, 3], None, None, eps)),
        &want,
        (1e-12, 1e-12),
        "layer_norm 2-D",
    );
    // Integer input is normalized in f32.
    let x = Tensor::from_vec(vec![1i32, 2, 3, 2, 4, 9], [2, 3]);
    let y = x.layer_norm(&[3], None, None, eps);
    assert_eq!(y.dtype(), DType::F32);
    assert_close(&read(&y), &plain, (1e-5, 1e-5), "layer_norm int");
    let r = Tensor::randn_seeded([3, 4, 8], 4);
    let w = Tensor::randn_seeded([4, 8], 5);
    let b = Tensor::randn_seeded([4, 8], 6);
    check_ref(&r.layer_norm(&[4, 8], Some(&w), Some(&b), 1e-5));
}

// ---------------------------------------------------------------------------------------------
// matmul
// ---------------------------------------------------------------------------------------------

#[test]
fn matmul_2d_per_dtype() {
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [7.0, 8.0, 9.0, 10.0, 11.0, 12.0];
    for dt in FLOATS {
        let c = make(&a, &[2, 3], dt).matmul(&make(&b, &[3, 2], dt));
        expect(&c, dt, &[2, 2], &[58.0, 64.0, 139.0, 154.0]);
    }
    for dt in [DType::I32, DType::I64, DType::U8] {
        let c = make(&a, &[2, 3], dt).matmul(&make(&b, &[3, 2], dt));
        expect_i(&c, dt, &[2, 2], &[58, 64, 139, 154]);
    }
}

#[test]
fn matmul_integer_wraps() {
    let a = Tensor::from_vec(vec![65536i32, 1], [1, 2]);
    let b = Tensor::from_vec(vec![65536i32, 5], [2, 1]);
    expect_i(&a.matmul(&b), DType::I32, &[1, 1], &[5]);
    let a = Tensor::from_vec(vec![46341i32], [1, 1]);
    expect_i(
        &a.matmul(&a),
        DType::I32,
        &[1, 1],
        &[46341i32.wrapping_mul(46341) as i64],
    );
    let a = Tensor::from_vec(vec![65536i64, 1], [1, 2]);
    let b = Tensor::from_vec(vec![65536i64, 5], [2, 1]);
    expect_i(&a.matmul(&b), DType::I64, &[1, 1], &[(1 << 32) + 5]);
    let a = Tensor::from_vec(vec![1i64 << 62, 1], [1, 2]);
    let b = Tensor::from_vec(vec![4i64, 3], [2, 1]);
    expect_i(&a.matmul(&b), DType::I64, &[1, 1], &[3]);
    let a = Tensor::from_vec(vec![16u8, 1], [1, 2]);
    let b = Tensor::from_vec(vec![16u8, 3], [2, 1]);
    expect_i(&a.matmul(&b), DType::U8, &[1, 1], &[3]);
    // A longer inner dimension that wraps partway through.
    let a = Tensor::from_vec(vec![100_000i32; 40], [1, 40]);
    let b = Tensor::from_vec(vec![100_000i32; 40], [40, 1]);
    let want = (0..40).fold(0i32, |acc, _| {
        acc.wrapping_add(100_000i32.wrapping_mul(100_000))
    });
    expect_i(&a.matmul(&b), DType::I32, &[1, 1], &[want as i64]);
}

#[test]
fn matmul_batched_and_broadcast() {
    let a = Tensor::from_vec((1..=8).map(|x| x as f32).collect(), [2, 2, 2]);
    let b = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0], [2, 2, 2]);
    expect(
        &a.matmul(&b),
        DType::F32,
        &[2, 2, 2],
        &[1., 2., 3., 4., 10., 12., 14., 16.],
    );
    let swap = Tensor::from_vec(vec![0.0f32, 1.0, 1.0, 0.0], [2, 2]);
    expect(
        &a.matmul(&swap),
        DType::F32,
        &[2, 2, 2],
        &[2., 1., 4., 3., 6., 5., 8., 7.],
    );
    expect(
        &swap.matmul(&a),
        DType::F32,
        &[2, 2, 2],
        &[3., 4., 1., 2., 7., 8., 5., 6.],
    );
    let x = Tensor::randn_seeded([2, 1, 2, 3], 1);
    let y = Tensor::randn_seeded([3, 3, 4], 2);
    let c = x.matmul(&y);
    assert_eq!(c.shape(), &[2, 3, 2, 4]);
    check_ref(&c);
    // Batched with 1-D operands on either side.
    let ones = Tensor::from_vec(vec![1.0f32, 1.0], [2]);
    expect(&a.matmul(&ones), DType::F32, &[2, 2], &[3., 7., 11., 15.]);
    expect(&ones.matmul(&a), DType::F32, &[2, 2], &[4., 6., 12., 14.]);
}

#[test]
fn matmul_vector_cases_like_pytorch() {
    let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let m = Tensor::from_vec(vec![7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0], [3, 2]);
    expect(&v.matmul(&m), DType::F32, &[2], &[58.0, 64.0]);
    let m2 = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let ones = Tensor::from_vec(vec![1.0f32, 1.0, 1.0], [3]);
    expect(&m2.matmul(&ones), DType::F32, &[2], &[6.0, 15.0]);
    let w = Tensor::from_vec(vec![4.0f32, 5.0, 6.0], [3]);
    expect(&v.matmul(&w), DType::F32, &[], &[32.0]);
    assert_eq!(v.matmul(&w).item::<f32>().unwrap(), 32.0);
    let vi = Tensor::from_vec(vec![1i64, 2, 3], [3]);
    expect_i(&vi.matmul(&vi), DType::I64, &[], &[14]);
}

#[test]
fn matmul_views_promotion_and_empty_inner() {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    expect(
        &a.t().matmul(&a),
        DType::F32,
        &[2, 2],
        &[10., 14., 14., 20.],
    );
    expect(&a.matmul(&a.t()), DType::F32, &[2, 2], &[5., 11., 11., 25.]);
    let i = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]);
    expect(&i.matmul(&a), DType::F32, &[2, 2], &[7., 10., 15., 22.]);
    let h = a.cast(DType::F16);
    expect(&i.matmul(&h), DType::F16, &[2, 2], &[7., 10., 15., 22.]);
    let bf = a.cast(DType::BF16);
    expect(&h.matmul(&bf), DType::F32, &[2, 2], &[7., 10., 15., 22.]);
    // Zero-size inner dimension: all zeros.
    let z1 = Tensor::zeros([2, 0]);
    let z2 = Tensor::zeros([0, 3]);
    expect(&z1.matmul(&z2), DType::F32, &[2, 3], &[0.0; 6]);
    let zi =
        Tensor::zeros_dtype([2, 0], DType::I32).matmul(&Tensor::zeros_dtype([0, 2], DType::I32));
    expect_i(&zi, DType::I32, &[2, 2], &[0; 4]);
    // Odd sizes through the optimized kernels, against the reference.
    let x = Tensor::randn_seeded([17, 33], 30);
    let y = Tensor::randn_seeded([33, 9], 31);
    check_ref(&x.matmul(&y));
    check_ref(&x.slice(&[(0, 17, 2)]).matmul(&x.t()));
    let xi = (Tensor::rand_seeded([5, 19], 3) * 200.0 - 100.0).cast(DType::I32);
    let yi = (Tensor::rand_seeded([19, 6], 4) * 200.0 - 100.0).cast(DType::I32);
    check_ref(&xi.matmul(&yi));
    let xh = Tensor::try_randn([6, 10], 5, DType::F16).unwrap();
    let yh = Tensor::try_randn([10, 3], 6, DType::F16).unwrap();
    check_ref(&xh.matmul(&yh));
    let xd = Tensor::try_randn([3, 5, 7], 5, DType::F64).unwrap();
    let yd = Tensor::try_randn([7, 2], 6, DType::F64).unwrap();
    check_ref(&xd.matmul(&yd));
}

// ---------------------------------------------------------------------------------------------
// Promotion
// ---------------------------------------------------------------------------------------------

#[test]
fn promotion_follows_pytorch() {
    let i = Tensor::from_vec(vec![1i32, 2], [2]);
    let h = make(&[0.5, 0.25], &[2], DType::F16);
    let bf = make(&[0.5, 0.25], &[2], DType::BF16);
    expect(&i.add(&h), DType::F16, &[2], &[1.5, 2.25]);
    expect(&h.add(&i), DType::F16, &[2], &[1.5, 2.25]);
    expect(&h.add(&bf), DType::F32, &[2], &[1.0, 0.5]);
    let u = Tensor::from_vec(vec![200u8, 255], [2]);
    let j = Tensor::from_vec(vec![100i32, 1], [2]);
    expect_i(&u.add(&j), DType::I32, &[2], &[300, 256]);
    let b = Tensor::from_vec(vec![true, false], [2]);
    expect_b(&b.add(&b), &[2], &[true, false]);
    expect_b(
        &b.mul(Tensor::from_vec(vec![true, true], [2])),
        &[2],
        &[true, false],
    );
    expect(&i.mul(2.5), DType::F32, &[2], &[2.5, 5.0]);
    expect(&(&i * 2.5), DType::F32, &[2], &[2.5, 5.0]);
    expect(&h.mul(2.0), DType::F16, &[2], &[1.0, 0.5]);
    expect(&(&h * 2.0), DType::F16, &[2], &[1.0, 0.5]);
    expect_i(&b.add(3), DType::I64, &[2], &[4, 3]);
    expect_i(&(&b + 3), DType::I64, &[2], &[4, 3]);
    expect(
        &i.exp(),
        DType::F32,
        &[2],
        &[std::f64::consts::E, std::f64::consts::E.powi(2)],
    );

    // More of the lattice.
    let l = Tensor::from_vec(vec![10i64, 20], [2]);
    expect_i(&i.add(&l), DType::I64, &[2], &[11, 22]);
    expect_i(&u.add(&b), DType::U8, &[2], &[201, 255]);
    expect_i(&u.add(1), DType::U8, &[2], &[201, 0]);
    expect_i(&i.add(3), DType::I32, &[2], &[4, 5]);
    expect(&l.add(&h), DType::F16, &[2], &[10.5, 20.25]);
    let f = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    let d = Tensor::from_vec(vec![0.5f64, 0.25], [2]);
    expect(&bf.add(&f), DType::F32, &[2], &[1.5, 2.25]);
    expect(&h.add(&d), DType::F64, &[2], &[1.0, 0.5]);
    expect(&f.add(&d), DType::F64, &[2], &[1.5, 2.25]);
    expect(&b.add(2.5), DType::F32, &[2], &[3.5, 2.5]);
    expect(&f.add(3), DType::F32, &[2], &[4.0, 5.0]);
    expect(&h.add(3), DType::F16, &[2], &[3.5, 3.25]);
    expect(&d.mul(2.0), DType::F64, &[2], &[1.0, 0.5]);
    expect_i(&b.sub(1), DType::I64, &[2], &[0, -1]);
    expect_i(&b.add(&j), DType::I32, &[2], &[101, 1]);
    expect(&b.add(&h), DType::F16, &[2], &[1.5, 0.25]);
    expect_b(&b.add(true), &[2], &[true, true]);
}

// ---------------------------------------------------------------------------------------------
// Movement ops
// ---------------------------------------------------------------------------------------------

#[test]
fn reshape_with_inferred_dim() {
    let x = arange_f32(12);
    expect(&x.reshape([-1, 6]), DType::F32, &[2, 6], &range(12));
    expect(&x.reshape([2, -1, 2]), DType::F32, &[2, 3, 2], &range(12));
    expect(
        &x.reshape([3, 4]).reshape([-1]),
        DType::F32,
        &[12],
        &range(12),
    );
    expect(
        &Tensor::scalar(5.0f32).reshape([1, 1]),
        DType::F32,
        &[1, 1],
        &[5.0],
    );
    expect(&x.slice(&[(0, 1, 1)]).reshape(()), DType::F32, &[], &[0.0]);
    // Zero-size with -1.
    let z = Tensor::zeros([0, 4]);
    assert_eq!(z.reshape([-1, 2]).shape(), &[0, 2]);
    assert_eq!(z.reshape([2, 0, 2]).shape(), &[2, 0, 2]);
}

#[test]
fn permute_transpose_t() {
    let x = arange_f32(24).reshape([2, 3, 4]);
    let p = x.permute([2, 0, 1]);
    let mut want = vec![];
    for i in 0..4 {
        for j in 0..2 {
            for k in 0..3 {
                want.push((j * 12 + k * 4 + i) as f64);
            }
        }
    }
    expect(&p, DType::F32, &[4, 2, 3], &want);
    let p = x.permute([-1, -3, -2]);
    expect(&p, DType::F32, &[4, 2, 3], &want);
    let m = arange_f32(12).reshape([3, 4]);
    let tw = [0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.];
    expect(&m.transpose(0, 1), DType::F32, &[4, 3], &tw);
    expect(&m.transpose(-1, -2), DType::F32, &[4, 3], &tw);
    expect(&m.t(), DType::F32, &[4, 3], &tw);
    expect(&m.t().t(), DType::F32, &[3, 4], &range(12));
    let v = arange_f32(3);
    expect(&v.t(), DType::F32, &[3], &[0., 1., 2.]);
    let mut want = vec![];
    for i in 0..2 {
        for k in 0..4 {
            for j in 0..3 {
                want.push((i * 12 + j * 4 + k) as f64);
            }
        }
    }
    expect(&x.transpose(1, 2), DType::F32, &[2, 4, 3], &want);
    expect(&x.t(), DType::F32, &[2, 4, 3], &want);
    // Realized input, and an integer dtype.
    let xi = Tensor::from_vec((0..6).collect::<Vec<i64>>(), [2, 3]);
    expect_i(&xi.t(), DType::I64, &[3, 2], &[0, 3, 1, 4, 2, 5]);
}

#[test]
fn expand_and_broadcast_to() {
    let c = arange_f32(3).reshape([3, 1]);
    expect(
        &c.expand([3, 4]),
        DType::F32,
        &[3, 4],
        &[0., 0., 0., 0., 1., 1., 1., 1., 2., 2., 2., 2.],
    );
    let r = arange_f32(3);
    expect(
        &r.broadcast_to([2, 3]),
        DType::F32,
        &[2, 3],
        &[0., 1., 2., 0., 1., 2.],
    );
    expect(
        &r.broadcast_to([2, 1, 3]),
        DType::F32,
        &[2, 1, 3],
        &[0., 1., 2., 0., 1., 2.],
    );
    let s = Tensor::scalar(7i32);
    expect_i(&s.broadcast_to([2, 2]), DType::I32, &[2, 2], &[7, 7, 7, 7]);
    let b = Tensor::from_vec(vec![true, false], [2, 1]);
    expect_b(
        &b.expand([2, 3]),
        &[2, 3],
        &[true, true, true, false, false, false],
    );
    assert_eq!(r.broadcast_to([0, 3]).shape(), &[0, 3]);
    expect(&r.broadcast_to([0, 3]), DType::F32, &[0, 3], &[]);
}

#[test]
fn slice_python_semantics() {
    let x = arange_f32(10);
    expect(&x.slice(&[(1, -1, 3)]), DType::F32, &[3], &[1., 4., 7.]);
    expect(&x.slice(&[(-3, 100, 1)]), DType::F32, &[3], &[7., 8., 9.]);
    expect(&x.slice(&[(-100, 2, 1)]), DType::F32, &[2], &[0., 1.]);
    expect(&x.slice(&[(5, 2, 1)]), DType::F32, &[0], &[]);
    expect(&x.slice(&[(0, 10, 4)]), DType::F32, &[3], &[0., 4., 8.]);
    expect(&x.slice(&[(9, 10, 5)]), DType::F32, &[1], &[9.]);
    expect(&x.slice(&[(-1, 10, 1)]), DType::F32, &[1], &[9.]);
    expect(&x.slice(&[(12, 20, 1)]), DType::F32, &[0], &[]);
    let m = arange_f32(12).reshape([3, 4]);
    expect(
        &m.slice(&[(1, 3, 1), (0, 4, 2)]),
        DType::F32,
        &[2, 2],
        &[4., 6., 8., 10.],
    );
    expect(
        &m.slice(&[(-1, 3, 1)]),
        DType::F32,
        &[1, 4],
        &[8., 9., 10., 11.],
    );
    expect(
        &m.slice(&[(0, 3, 2), (-3, -1, 1)]),
        DType::F32,
        &[2, 2],
        &[1., 2., 9., 10.],
    );
    // Slicing a realized integer tensor.
    let xi = Tensor::from_vec((0..10).collect::<Vec<i32>>(), [10]);
    expect_i(&xi.slice(&[(2, 9, 3)]), DType::I32, &[3], &[2, 5, 8]);
}

#[test]
fn narrow_pad_flip() {
    let m = arange_f32(12).reshape([3, 4]);
    expect(
        &m.slice_dim(1, 1, 3, 1),
        DType::F32,
        &[3, 2],
        &[1., 2., 5., 6., 9., 10.],
    );
    expect(
        &m.slice_dim(-1, 0, 4, 3),
        DType::F32,
        &[3, 2],
        &[0., 3., 4., 7., 8., 11.],
    );
    expect(
        &m.slice_dim(0, -2, 3, 1),
        DType::F32,
        &[2, 4],
        &[4., 5., 6., 7., 8., 9., 10., 11.],
    );

    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    expect(
        &x.pad(&[(1, 0), (0, 2)], 9.0),
        DType::F32,
        &[3, 4],
        &[9., 9., 9., 9., 1., 2., 9., 9., 3., 4., 9., 9.],
    );
    expect(
        &x.pad(&[(0, 1)], -1.0),
        DType::F32,
        &[3, 2],
        &[1., 2., 3., 4., -1., -1.],
    );
    expect(
        &x.pad(&[(0, 0), (1, 1)], 0.0),
        DType::F32,
        &[2, 4],
        &[0., 1., 2., 0., 0., 3., 4., 0.],
    );
    let xi = Tensor::from_vec(vec![1i32, 2], [2]);
    expect_i(&xi.pad(&[(2, 1)], 7), DType::I32, &[5], &[7, 7, 1, 2, 7]);
    expect_i(&xi.pad(&[(1, 0)], 2.7), DType::I32, &[3], &[2, 1, 2]);
    let xb = Tensor::from_vec(vec![false], [1]);
    expect_b(&xb.pad(&[(1, 1)], true), &[3], &[true, false, true]);
    let xh = make(&[1.0, 2.0], &[2], DType::F16);
    expect(
        &xh.pad(&[(1, 0)], f64::NEG_INFINITY),
        DType::F16,
        &[3],
        &[f64::NEG_INFINITY, 1.0, 2.0],
    );

    expect(
        &m.flip([0]),
        DType::F32,
        &[3, 4],
        &[8., 9., 10., 11., 4., 5., 6., 7., 0., 1., 2., 3.],
    );
    expect(
        &m.flip([-1]),
        DType::F32,
        &[3, 4],
        &[3., 2., 1., 0., 7., 6., 5., 4., 11., 10., 9., 8.],
    );
    let all: Vec<f64> = (0..12).rev().map(|i| i as f64).collect();
    expect(&m.flip([0, 1]), DType::F32, &[3, 4], &all);
    expect(
        &m.flip(Vec::<isize>::new()),
        DType::F32,
        &[3, 4],
        &range(12),
    );
}

#[test]
fn squeeze_unsqueeze_flatten_contiguous() {
    let x = arange_f32(6).reshape([1, 3, 1, 2]);
    expect(&x.squeeze(), DType::F32, &[3, 2], &range(6));
    expect(&x.squeeze_dim(0), DType::F32, &[3, 1, 2], &range(6));
    expect(&x.squeeze_dim(-2), DType::F32, &[1, 3, 2], &range(6));
    assert_eq!(x.squeeze_dim(1).shape(), &[1, 3, 1, 2]);
    let v = arange_f32(3);
    assert_eq!(v.unsqueeze(0).shape(), &[1, 3]);
    assert_eq!(v.unsqueeze(-1).shape(), &[3, 1]);
    assert_eq!(v.unsqueeze(1).shape(), &[3, 1]);
    assert_eq!(v.unsqueeze(-2).shape(), &[1, 3]);
    expect(
        &v.unsqueeze(1).expand([3, 2]),
        DType::F32,
        &[3, 2],
        &[0., 0., 1., 1., 2., 2.],
    );
    assert_eq!(Tensor::scalar(1.0f32).unsqueeze(0).shape(), &[1]);
    assert_eq!(
        Tensor::from_vec(vec![1.0f32], [1, 1]).squeeze().shape(),
        &[] as &[usize]
    );

    let y = arange_f32(24).reshape([2, 3, 4]);
    expect(&y.flatten(), DType::F32, &[24], &range(24));
    expect(&y.flatten_dims(1, 2), DType::F32, &[2, 12], &range(24));
    expect(&y.flatten_dims(0, 1), DType::F32, &[6, 4], &range(24));
    expect(&y.flatten_dims(-2, -1), DType::F32, &[2, 12], &range(24));
    assert_eq!(Tensor::scalar(2.0f32).flatten().shape(), &[1]);
    assert_eq!(Tensor::scalar(2.0f32).flatten_dims(0, 0).shape(), &[1]);
    let t = y.transpose(0, 2).flatten_dims(1, 2);
    let mut want = vec![];
    for k in 0..4 {
        for j in 0..3 {
            for i in 0..2 {
                want.push((i * 12 + j * 4 + k) as f64);
            }
        }
    }
    expect(&t, DType::F32, &[4, 6], &want);

    let m = arange_f32(6).reshape([2, 3]);
    let c = m.t().contiguous();
    expect(&c, DType::F32, &[3, 2], &[0., 3., 1., 4., 2., 5.]);
    assert!(c.is_realized());
    // Free for a realized tensor (no kernel: it shares the buffer), and a new tensor all
    // the same, so an update of it is not an update of `c`.
    let d = c.contiguous();
    assert_ne!(d.node_key(), c.node_key());
    let report = d.realize_with(&kiln::RealizeOptions::default()).unwrap();
    assert_eq!(report.kernels, 0);
    expect(&d, DType::F32, &[3, 2], &[0., 3., 1., 4., 2., 5.]);
}

#[test]
fn movement_chains() {
    // flip ∘ pad ∘ slice, 1-D.
    let x = arange_f32(6);
    let y = x.slice(&[(1, 5, 2)]).pad(&[(2, 1)], -1.0).flip([0]);
    expect(&y, DType::F32, &[5], &[-1., 3., 1., -1., -1.]);
    // ... 2-D, both axes.
    let m = arange_f32(12).reshape([3, 4]);
    let y = m
        .slice(&[(0, 3, 2), (1, 4, 1)])
        .pad(&[(1, 0), (0, 1)], 0.0)
        .flip([0, 1]);
    expect(
        &y,
        DType::F32,
        &[3, 4],
        &[0., 11., 10., 9., 0., 3., 2., 1., 0., 0., 0., 0.],
    );
    // ... on a realized integer buffer.
    let mi = Tensor::from_vec((0..12).collect::<Vec<i32>>(), [3, 4]);
    let y = mi
        .slice(&[(0, 3, 2), (1, 4, 1)])
        .pad(&[(1, 0), (0, 1)], 0)
        .flip([0, 1]);
    expect_i(
        &y,
        DType::I32,
        &[3, 4],
        &[0, 11, 10, 9, 0, 3, 2, 1, 0, 0, 0, 0],
    );
    // pad then slice into the padding, then flip.
    let y = arange_f32(3)
        .pad(&[(2, 2)], 5.0)
        .slice(&[(2, 7, 2)])
        .flip([0]);
    expect(&y, DType::F32, &[3], &[5., 2., 0.]);

    // transpose ∘ reshape that needs a copy.
    let tw = [0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.];
    expect(&m.t().reshape([12]), DType::F32, &[12], &tw);
    expect(&m.t().reshape([2, 6]), DType::F32, &[2, 6], &tw);
    let tw1: Vec<f64> = tw.iter().map(|v| v + 1.0).collect();
    expect(&(m.t().reshape([6, 2]) + 1.0), DType::F32, &[6, 2], &tw1);
    let mr = Tensor::from_vec((0..12).map(|v| v as f32).collect(), [3, 4]);
    expect(&mr.t().reshape([3, 4]), DType::F32, &[3, 4], &tw);
    expect(
        &mr.t().flatten().slice(&[(1, 12, 4)]),
        DType::F32,
        &[3],
        &[4., 9., 3.],
    );

    // expand ∘ reshape.
    let e = arange_f32(3).reshape([3, 1]).expand([3, 2]).reshape([6]);
    expect(&e, DType::F32, &[6], &[0., 0., 1., 1., 2., 2.]);
    let e = arange_f32(2).reshape([1, 2]).expand([3, 2]).reshape([2, 3]);
    expect(&e, DType::F32, &[2, 3], &[0., 1., 0., 1., 0., 1.]);
    let e = arange_f32(2)
        .reshape([2, 1])
        .expand([2, 3])
        .t()
        .reshape([6]);
    expect(&e, DType::F32, &[6], &[0., 1., 0., 1., 0., 1.]);

    // Longer chains against the reference.
    let r = Tensor::randn_seeded([4, 5, 6], 40);
    check_ref(
        &r.permute([2, 0, 1])
            .slice(&[(1, 6, 2), (-3, 4, 1)])
            .flip([1, 2])
            .pad(&[(1, 1), (0, 2)], 3.0),
    );
    check_ref(
        &r.transpose(0, 2)
            .reshape([6, 20])
            .slice_dim(1, 3, 17, 4)
            .exp(),
    );
    check_ref(&(r.slice(&[(0, 4, 3)]).reshape([-1, 6]).t() * r.sum([0, 1]).unsqueeze(1)));
    check_ref(
        &r.flip([0])
            .permute([1, 2, 0])
            .contiguous()
            .reshape([30, 4])
            .sum(0),
    );
}

// ---------------------------------------------------------------------------------------------
// Broadcasting and operators
// ---------------------------------------------------------------------------------------------

#[test]
fn broadcasting_in_binary_ops() {
    let a = Tensor::from_vec(vec![0.0f32, 10.0, 20.0], [3, 1]);
    let b = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    expect(
        &a.add(&b),
        DType::F32,
        &[3, 4],
        &[1., 2., 3., 4., 11., 12., 13., 14., 21., 22., 23., 24.],
    );
    expect(
        &b.sub(&a).slice(&[(2, 3, 1)]),
        DType::F32,
        &[1, 4],
        &[-19., -18., -17., -16.],
    );
    let s = Tensor::scalar(2.0f32);
    expect(&b.mul(&s), DType::F32, &[4], &[2., 4., 6., 8.]);
    expect(&s.mul(&b), DType::F32, &[4], &[2., 4., 6., 8.]);
    expect(&s.add(&s), DType::F32, &[], &[4.]);
    let c = Tensor::from_vec(vec![1i32, 2], [2, 1, 1]);
    let d = Tensor::from_vec(vec![10i32, 20, 30], [1, 3, 1]);
    let e = Tensor::from_vec(vec![100i32, 200], [2]);
    expect_i(
        &c.add(&d).add(&e),
        DType::I32,
        &[2, 3, 2],
        &[111, 211, 121, 221, 131, 231, 112, 212, 122, 222, 132, 232],
    );
    // Zero-size dimensions broadcast like any other size.
    let z = Tensor::zeros([0, 1]);
    let w = z.add(&b);
    assert_eq!(w.shape(), &[0, 4]);
    expect(&w, DType::F32, &[0, 4], &[]);
    let z = Tensor::zeros([2, 0]);
    expect(&z.add(Tensor::ones([1, 1])), DType::F32, &[2, 0], &[]);
    expect(&z.mul(2.0), DType::F32, &[2, 0], &[]);
}

#[test]
fn operator_overloads() {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3]);
    let b = Tensor::from_vec(vec![0.5f32, 0.5, 2.0], [3]);
    expect(&(&a + &b), DType::F32, &[3], &[1.5, 2.5, 6.0]);
    expect(&(&a - &b), DType::F32, &[3], &[0.5, 1.5, 2.0]);
    expect(&(&a * &b), DType::F32, &[3], &[0.5, 1.0, 8.0]);
    expect(&(&a / &b), DType::F32, &[3], &[2.0, 4.0, 2.0]);
    expect(&(a.clone() + b.clone()), DType::F32, &[3], &[1.5, 2.5, 6.0]);
    expect(&(a.clone() - &b), DType::F32, &[3], &[0.5, 1.5, 2.0]);
    expect(&(&a * b.clone()), DType::F32, &[3], &[0.5, 1.0, 8.0]);
    expect(&(a.clone() * 2.0), DType::F32, &[3], &[2.0, 4.0, 8.0]);
    expect(&(&a + 0.5), DType::F32, &[3], &[1.5, 2.5, 4.5]);
    expect(&(&a - 1.0), DType::F32, &[3], &[0.0, 1.0, 3.0]);
    expect(&(&a / 4.0), DType::F32, &[3], &[0.25, 0.5, 1.0]);
    expect(&(2.0 - &a), DType::F32, &[3], &[1.0, 0.0, -2.0]);
    expect(&(2.0 - a.clone()), DType::F32, &[3], &[1.0, 0.0, -2.0]);
    expect(&(1.0 / &a), DType::F32, &[3], &[1.0, 0.5, 0.25]);
    expect(&(8.0 / a.clone()), DType::F32, &[3], &[8.0, 4.0, 2.0]);
    expect(&(3.0 + &a), DType::F32, &[3], &[4.0, 5.0, 7.0]);
    expect(&(3.0 * &a), DType::F32, &[3], &[3.0, 6.0, 12.0]);
    expect(&(-&a), DType::F32, &[3], &[-1.0, -2.0, -4.0]);
    expect(&(-a.clone()), DType::F32, &[3], &[-1.0, -2.0, -4.0]);
    // i64 literals.
    expect(&(&a + 1), DType::F32, &[3], &[2.0, 3.0, 5.0]);
    let i = Tensor::from_vec(vec![1i32, 2, 3], [3]);
    expect_i(&(&i + 3), DType::I32, &[3], &[4, 5, 6]);
    expect_i(&(&i * 2), DType::I32, &[3], &[2, 4, 6]);
    expect_i(&(&i - 1), DType::I32, &[3], &[0, 1, 2]);
    expect_i(&(10 - &i), DType::I32, &[3], &[9, 8, 7]);
    expect_i(&(3 + &i), DType::I32, &[3], &[4, 5, 6]);
    expect_i(&(2 * i.clone()), DType::I32, &[3], &[2, 4, 6]);
    expect(&(&i / 2), DType::F32, &[3], &[0.5, 1.0, 1.5]);
    expect(&(6 / &i), DType::F32, &[3], &[6.0, 3.0, 2.0]);
    expect(&(&i * 0.5), DType::F32, &[3], &[0.5, 1.0, 1.5]);
    expect(&(1.0 - &i), DType::F32, &[3], &[0.0, -1.0, -2.0]);
    expect_i(&(-&i), DType::I32, &[3], &[-1, -2, -3]);
    let u = Tensor::from_vec(vec![1u8, 2], [2]);
    expect_i(&(0 - &u), DType::U8, &[2], &[255, 254]);
    // Chained expression against the reference.
    let x = Tensor::randn_seeded([3, 5], 50);
    check_ref(&((&x * 2.0 + 1.0) / (&x * &x + 1.0) - 0.5));
}

// ---------------------------------------------------------------------------------------------
// Empty tensors, Display, Debug
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_tensors() {
    let x = Tensor::zeros([0, 3]);
    x.realize().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    let y = (&x + 1.0).exp();
    y.realize().unwrap();
    assert_eq!(y.shape(), &[0, 3]);
    assert!(y.to_vec::<f32>().unwrap().is_empty());
    expect(&x.sum(0), DType::F32, &[3], &[0.0, 0.0, 0.0]);
    expect(&x.sum(1), DType::F32, &[0], &[]);
    expect(&x.prod(0), DType::F32, &[3], &[1.0, 1.0, 1.0]);
    expect(&x.max(1), DType::F32, &[0], &[]);
    let e = Tensor::from_vec(Vec::<i32>::new(), [0]);
    expect_i(&(&e * 2), DType::I32, &[0], &[]);
    let e2 = Tensor::from_vec(Vec::<i32>::new(), [2, 0]);
    expect_i(&e2.sum(1), DType::I64, &[2], &[0, 0]);
    expect_i(&e2.prod_keepdim(-1), DType::I64, &[2, 1], &[1, 1]);
    let z = Tensor::zeros_dtype([3, 0], DType::F64);
    expect(&z.sum_keepdim(1), DType::F64, &[3, 1], &[0.0; 3]);
    expect(&z.t().exp(), DType::F64, &[0, 3], &[]);
    let b = Tensor::from_vec(Vec::<bool>::new(), [0, 2]);
    expect_b(&b.eq(&b), &[0, 2], &[]);
    expect_i(&b.sum(0), DType::I64, &[2], &[0, 0]);
    // An empty slice of a non-empty tensor.
    let s = arange_f32(4).slice(&[(3, 1, 1)]);
    expect(&s, DType::F32, &[0], &[]);
    expect(
        &s.unsqueeze(1).expand([0, 2]).sum(0),
        DType::F32,
        &[2],
        &[0.0, 0.0],
    );
    assert!(format!("{s}").contains("[]"), "{s}");
}

#[test]
fn empty_reduction_to_one_element() {
    // Works when the output has several elements ([2, 0] -> [2]); panics at
    // src/backend/cpu/exec.rs set_reduce_coords when the output has exactly one.
    let x = Tensor::zeros([0]);
    assert_eq!(x.sum(0).to_vec::<f32>().unwrap(), vec![0.0]);
    assert_eq!(x.prod(0).to_vec::<f32>().unwrap(), vec![1.0]);
    let x = Tensor::zeros([0, 3]);
    assert_eq!(x.sum(..).to_vec::<f32>().unwrap(), vec![0.0]);
    let e = Tensor::from_vec(Vec::<i32>::new(), [0]);
    assert_eq!(e.sum(..).to_vec::<i64>().unwrap(), vec![0]);
    let s = Tensor::arange(0.0, 4.0, 1.0).slice(&[(3, 1, 1)]);
    assert_eq!(s.sum(0).to_vec::<f32>().unwrap(), vec![0.0]);
}

#[test]
fn display_and_debug() {
    let t = Tensor::from_vec(vec![1.5f32, -2.0, 3.25], [3]);
    let s = format!("{t}");
    assert!(
        s.contains("1.5000") && s.contains("-2.0000") && s.contains("3.2500"),
        "{s}"
    );
    assert!(s.contains("shape=[3]") && s.contains("f32"), "{s}");
    let i = Tensor::from_vec(vec![1i64, 22, 333, 4, 5, 6], [2, 3]);
    let s = format!("{i}");
    for v in ["1", "22", "333", "6"] {
        assert!(s.contains(v), "{s}");
    }
    assert!(s.contains("[2, 3]") && s.contains("i64"), "{s}");
    let b = Tensor::from_vec(vec![true, false], [2]);
    let s = format!("{b}");
    assert!(s.contains("true") && s.contains("false"), "{s}");
    let d = Tensor::from_vec(vec![0.1f64], [1]);
    assert!(format!("{d}").contains("0.100000"), "{d}");
    let h = make(&[0.5], &[], DType::F16);
    assert!(format!("{h}").contains("0.5000"), "{h}");

    // Debug never realizes; Display does.
    let lazy = (&t * 2.0).exp();
    let dbg = format!("{lazy:?}");
    assert!(
        dbg.contains("Tensor") && dbg.contains("shape") && dbg.contains("[3]"),
        "{dbg}"
    );
    assert!(!lazy.is_realized());
    let shown = format!("{lazy}");
    assert!(shown.contains("20.0855"), "{shown}");
    assert!(lazy.is_realized());

    // Large tensors are summarized.
    let big = arange_f32(5000);
    let s = format!("{big}");
    assert!(
        s.contains("...") && s.contains("4999.0000") && s.len() < 500,
        "{s}"
    );
}

#[test]
fn realizing_twice_and_reusing_nodes() {
    let x = Tensor::randn_seeded([4, 4], 60);
    let y = x.exp();
    let z = &y + &y.sum_keepdim(1);
    let zr = reference::evaluate(&z).unwrap().to_f64();
    y.realize().unwrap();
    y.realize().unwrap();
    assert_close(&read(&z), &zr, tol(DType::F32), "reuse after realize");
    assert_close(&read(&z), &zr, tol(DType::F32), "read twice");
    kiln::realize_all(&[&z, &y, &x.t()]).unwrap();
}

/// A sweep of fused expressions in every dtype, each checked against the reference.
#[test]
fn expressions_in_every_dtype_match_reference() {
    for dt in ALL {
        let base = Tensor::randn_seeded([3, 4, 5], 70) * 8.0;
        let x = base.cast(dt);
        let y = (Tensor::randn_seeded([4, 1], 71) * 8.0).cast(dt);
        let numeric = dt != DType::Bool;
        check_ref(&x.add(&y));
        check_ref(&x.mul(y.t().unsqueeze(-1).expand([1, 4, 1])));
        check_ref(&x.flip([0, 2]).maximum(&x));
        check_ref(&x.minimum(&y).slice(&[(0, 3, 2), (1, 4, 2)]));
        check_ref(&x.gt(&y));
        check_ref(&x.eq(x.flip([1])));
        check_ref(&x.sum(1));
        check_ref(&x.sum_keepdim([0, 2]));
        check_ref(&x.max(2));
        check_ref(&x.min([0, 1]));
        check_ref(&x.argmax(1));
        check_ref(&x.argmin_keepdim(-1));
        check_ref(&x.argmax(..));
        check_ref(&Tensor::where_(&base.gt(0.0), &x, &y));
        check_ref(&x.pad(&[(1, 0), (0, 2), (1, 1)], 1).permute([2, 0, 1]));
        check_ref(&x.exp().sum(2));
        check_ref(&x.div(y.add(3)));
        check_ref(&x.cast(DType::F32).softmax(1));
        if numeric {
            check_ref(&x.sub(&y));
            check_ref(&x.neg().abs().relu());
            check_ref(&x.prod(2));
            check_ref(&x.t().matmul(&x.slice(&[(0, 3, 1), (0, 4, 1), (0, 4, 1)])));
            check_ref(&(x.sum_keepdim(2) - &x).max_keepdim(1));
        }
        if dt.is_float() {
            check_ref(&x.mean(1));
            check_ref(&x.var_keepdim([0, 2], 1));
            check_ref(&x.softmax(-1));
            check_ref(&x.log_softmax(0));
            check_ref(&x.layer_norm(&[5], None, None, 1e-5));
            check_ref(&x.tanh().sigmoid().mul(x.sin().add(x.cos())));
            check_ref(&x.abs().add(1.0).log().sqrt().recip());
            check_ref(&x.gelu());
            check_ref(&x.pow(3.0));
            check_ref(&x.abs().pow(y.abs().mul(0.25)));
        }
    }
}
