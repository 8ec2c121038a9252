//! A linear layer's forward product `x @ w.t() + b` (and any elementwise epilogue after it)
//! with a shallow depth: the CPU backend runs the epilogue on each block of rows as soon as
//! the product has finished it, on the thread that computed it. Each case checks the fused
//! result bit for bit against the unfused one (the product alone, then one kernel per op),
//! against the reference evaluator, that the fused plan is one kernel, and (where the CPU
//! runs the route: the AVX-512 loops, two or more threads) how the epilogue ran: `relu?(x @ w.t() + b)`
//! in the product kernel's registers, any other by rows, or after the product.

use kiln::backend::cpu::{epilogues_in_registers, epilogues_run_by_rows};
use kiln::{DType, RealizeOptions, Tensor, reference};
use std::sync::Mutex;

/// The route counter is global: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Whether this machine runs the routes as these tests expect (the AVX-512 loops, which
/// `KILN_NO_SIMD` or `KILN_SIMD` can turn off, and two threads).
fn route_available() -> bool {
    kiln::backend::cpu::simd_level() == "avx512" && rayon::current_num_threads() > 1
}

fn input(shape: &[usize], seed: u64) -> Tensor {
    let t = Tensor::try_randn(shape, seed, DType::F32).unwrap();
    t.realize().unwrap();
    t
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// How a fused realize runs its matmul's epilogue.
#[derive(Debug, PartialEq, Clone, Copy)]
enum Route {
    /// Applied to the sums in registers.
    Registers,
    /// On each block of rows as the product finishes it.
    Rows,
    /// After the product (or there is none).
    After,
}
use Route::{After, Registers, Rows};

/// Realizes `build()` fused and unfused (two separate recordings) and compares them with
/// each other and with the reference evaluator; returns the fused plan's kernel count.
/// `route`: how the fused realize runs its epilogue, where the routes exist.
#[track_caller]
fn check(route: Route, build: impl Fn() -> Tensor) -> usize {
    let fused = build();
    let kernels = fused
        .plan(&RealizeOptions::default())
        .unwrap()
        .kernel_count();
    let want = reference::evaluate(&fused).unwrap().to_f64();
    let (rows0, regs0) = (epilogues_run_by_rows(), epilogues_in_registers());
    fused.realize().unwrap();
    let ran = match (
        epilogues_run_by_rows() - rows0,
        epilogues_in_registers() - regs0,
    ) {
        (0, 0) => After,
        (1, 0) => Rows,
        (0, 1) => Registers,
        other => panic!("{other:?} epilogue runs for one kernel"),
    };
    if route_available() {
        assert_eq!(ran, route, "{:?}", fused.shape());
    }
    let unfused = build();
    unfused.realize_with(&RealizeOptions::unfused()).unwrap();
    let (f, u) = (bits(&fused), bits(&unfused));
    assert_eq!(f.len(), want.len());
    for (i, ((&a, &b), w)) in f.iter().zip(&u).zip(&want).enumerate() {
        assert_eq!(
            a,
            b,
            "element {i}: fused {} vs unfused {}",
            f32::from_bits(a),
            f32::from_bits(b)
        );
        let g = f32::from_bits(a) as f64;
        let tol = 1e-4 + 1e-4 * w.abs();
        assert!(
            g == *w || (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "element {i}: {g} vs reference {w}"
        );
    }
    kernels
}

#[test]
fn bias_and_activations_on_linear_products() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // (rows, depth, columns): char_gpt's layers, odd sizes (rows not a multiple of the
    // kernel's six, columns not a multiple of 16), and more columns than one panel block.
    for &(m, k, n) in &[
        (2048, 128, 384),
        (301, 96, 126),
        (160, 40, 250),
        (600, 128, 1100),
        (1000, 512, 128),
    ] {
        let x = input(&[m, k], 1);
        let w = input(&[n, k], 2);
        let b = input(&[n], 3);
        let y = input(&[m, n], 4);
        assert_eq!(check(Registers, || x.matmul(&w.t()) + &b), 1, "{m}×{k}×{n}");
        assert_eq!(check(Registers, || &b + &x.matmul(&w.t())), 1);
        assert_eq!(check(Registers, || (x.matmul(&w.t()) + &b).relu()), 1);
        assert_eq!(check(Rows, || (x.matmul(&w.t()) + &b).gelu()), 1);
        assert_eq!(check(Rows, || x.matmul(&w.t()).relu() + &b), 1);
        assert_eq!(check(Rows, || x.matmul(&w.t()) * 0.5 + &y - &b), 1);
        assert_eq!(check(Rows, || x.matmul(&w.t()) + &y), 1);
        // The product alone (no epilogue to run), and an epilogue that only scales (its
        // program runs over merged dimensions).
        assert_eq!(check(After, || x.matmul(&w.t())), 1);
        assert_eq!(check(Rows, || x.matmul(&w.t()) * 2.0), 1);
    }
}

#[test]
fn operands_read_through_slices_and_a_batch_of_one() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let big_x = input(&[3, 700, 80], 5);
    let big_w = input(&[300, 90], 6);
    let b = input(&[256], 7);
    // Row and column offsets into both operands.
    let x = big_x.narrow(0, 1, 1).narrow(1, 50, 512).narrow(2, 8, 64);
    let w = big_w.narrow(0, 20, 256).narrow(1, 5, 64);
    assert_eq!(check(Rows, || (x.matmul(&w.t()) + &b).tanh()), 1);
    // A bias read from an offset into a larger buffer (the product keeps its batch axis of
    // one here, which the registers route does not take).
    let big_b = input(&[300], 24);
    let b_off = big_b.narrow(0, 7, 256);
    assert_eq!(check(Rows, || (x.matmul(&w.t()) + &b_off).relu()), 1);
    let x2d = x.reshape([512, 64]);
    assert_eq!(check(Registers, || (x2d.matmul(&w.t()) + &b_off).relu()), 1);
    // A bias read broadcast down the rows and a per-row scale read across them.
    let s = input(&[512, 1], 8);
    let x2 = input(&[512, 64], 9);
    assert_eq!(check(Rows, || (x2.matmul(&w.t()) + &b) * &s), 1);
}

#[test]
fn epilogues_the_rows_route_does_not_take_agree_too() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A row-major right operand (`x @ w`), a depth-split product (weight gradient shape), a
    // batch of products, and a product whose epilogue also reduces.
    let x = input(&[512, 128], 10);
    let w = input(&[128, 256], 11);
    let b = input(&[256], 12);
    assert_eq!(check(After, || (x.matmul(&w) + &b).relu()), 1);
    let g = input(&[2048, 64], 13);
    let h = input(&[2048, 48], 14);
    let c = input(&[48], 15);
    assert_eq!(check(After, || g.t().matmul(&h) + &c), 1);
    let xb = input(&[4, 256, 64], 16);
    let wb = input(&[96, 64], 17);
    let bb = input(&[96], 18);
    assert_eq!(check(After, || xb.matmul(&wb.t()) + &bb), 1);
    let r = input(&[300, 32], 19);
    let wr = input(&[40, 32], 20);
    check(After, || (r.matmul(&wr.t()) + 1.0).sum(1));
}

#[test]
fn a_product_with_two_epilogue_outputs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The pre-activation and the activation both stored, as a training step keeps them.
    let x = input(&[1024, 128], 21);
    let w = input(&[512, 128], 22);
    let b = input(&[512], 23);
    let pre = x.matmul(&w.t()) + &b;
    let act = pre.gelu();
    let before = epilogues_run_by_rows() + epilogues_in_registers();
    kiln::realize_all(&[&pre, &act]).unwrap();
    if route_available() {
        let after = epilogues_run_by_rows() + epilogues_in_registers();
        assert!(after > before, "the epilogue ran by rows or in registers");
    }
    let (x2, w2, b2) = (x.detach(), w.detach(), b.detach());
    let pre_u = x2.matmul(&w2.t()) + &b2;
    let act_u = pre_u.gelu();
    pre_u.realize_with(&RealizeOptions::unfused()).unwrap();
    act_u.realize_with(&RealizeOptions::unfused()).unwrap();
    assert_eq!(bits(&pre), bits(&pre_u));
    assert_eq!(bits(&act), bits(&act_u));
}

#[test]
fn relu_in_registers_keeps_nan_and_zeroes_the_rest() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (m, k, n) = (256, 64, 128);
    let mut xv: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    xv[0] = f32::NAN; // row 0: every column NaN
    xv[k] = f32::INFINITY; // row 1: ±inf or NaN (inf · 0 never occurs: no zero weights)
    xv[2 * k..3 * k].fill(0.0); // row 2: the product is +0
    let wv: Vec<f32> = (0..n * k)
        .map(|i| ((i * 53 % 97) as f32 + 1.0) / 50.0)
        .collect();
    let mut bv: Vec<f32> = (0..n).map(|j| (j as f32 - 64.0) / 8.0).collect();
    bv[3] = f32::NEG_INFINITY;
    bv[4] = -0.0;
    bv[5] = f32::NAN;
    let x = Tensor::from_vec(xv, [m, k]);
    let w = Tensor::from_vec(wv, [n, k]);
    let b = Tensor::from_vec(bv, [n]);
    for t in [&x, &w, &b] {
        t.realize().unwrap();
    }
    assert_eq!(check(Registers, || (x.matmul(&w.t()) + &b).relu()), 1);
    let got = (x.matmul(&w.t()) + &b).relu().to_vec::<f32>().unwrap();
    assert!(got[..n].iter().all(|v| v.is_nan()), "NaN rows stay NaN");
    // Row 1: +inf, but inf + -inf and inf + NaN are NaN, which relu keeps.
    for (j, v) in got[n..2 * n].iter().enumerate() {
        if j == 3 || j == 5 {
            assert!(v.is_nan(), "column {j}: {v}");
        } else {
            assert_eq!(*v, f32::INFINITY, "column {j}");
        }
    }
    let zero_row = &got[2 * n..3 * n];
    assert_eq!(zero_row[3].to_bits(), 0, "relu(+0 + -inf) is +0");
    assert_eq!(zero_row[4].to_bits(), 0, "relu(+0 + -0) is +0");
    assert!(zero_row[5].is_nan());
    assert_eq!(zero_row[0].to_bits(), 0, "a negative sum becomes +0");
    assert_eq!(zero_row[100], (100.0 - 64.0) / 8.0);
}
