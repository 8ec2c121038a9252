//! A linear layer's forward product `x @ w.t() + b` (and any elementwise epilogue after it)
//! with a shallow depth: the CPU backend runs the epilogue on each block of rows as soon as
//! the product has finished it, on the thread that computed it. Each case checks the fused
//! result bit for bit against the unfused one (the product alone, then one kernel per op),
//! against the reference evaluator, that the fused plan is one kernel, and (where the CPU
//! runs the route: AVX-512, two or more threads) whether the epilogue ran by rows.

use kiln::backend::cpu::epilogues_run_by_rows;
use kiln::{DType, RealizeOptions, Tensor, reference};
use std::sync::Mutex;

/// The route counter is global: the tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Whether this machine runs the rows route at all (`blocked_gemm` needs AVX-512 and two
/// threads; `KILN_NO_SIMD` turns the AVX-512 loops off).
fn route_available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::env::var_os("KILN_NO_SIMD").is_none()
        && rayon::current_num_threads() > 1
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

/// Realizes `build()` fused and unfused (two separate recordings) and compares them with
/// each other and with the reference evaluator; returns the fused plan's kernel count.
/// `by_rows`: whether the fused realize runs its epilogue by rows, where the route exists.
#[track_caller]
fn check(by_rows: bool, build: impl Fn() -> Tensor) -> usize {
    let fused = build();
    let kernels = fused
        .plan(&RealizeOptions::default())
        .unwrap()
        .kernel_count();
    let want = reference::evaluate(&fused).unwrap().to_f64();
    let before = epilogues_run_by_rows();
    fused.realize().unwrap();
    let ran = epilogues_run_by_rows() - before;
    if route_available() {
        assert_eq!(
            ran,
            by_rows as u64,
            "epilogue runs by rows: {:?}",
            fused.shape()
        );
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
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
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
        assert_eq!(check(true, || x.matmul(&w.t()) + &b), 1, "{m}×{k}×{n} + b");
        assert_eq!(check(true, || (x.matmul(&w.t()) + &b).relu()), 1);
        assert_eq!(check(true, || (x.matmul(&w.t()) + &b).gelu()), 1);
        assert_eq!(check(true, || x.matmul(&w.t()) * 0.5 + &y - &b), 1);
        // The product alone (no epilogue to run), and an epilogue that only scales (its
        // program runs over merged dimensions).
        assert_eq!(check(false, || x.matmul(&w.t())), 1);
        assert_eq!(check(true, || x.matmul(&w.t()) * 2.0), 1);
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
    assert_eq!(check(true, || (x.matmul(&w.t()) + &b).tanh()), 1);
    // A bias read broadcast down the rows and a per-row scale read across them.
    let s = input(&[512, 1], 8);
    let x2 = input(&[512, 64], 9);
    assert_eq!(check(true, || (x2.matmul(&w.t()) + &b) * &s), 1);
}

#[test]
fn epilogues_the_rows_route_does_not_take_agree_too() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A row-major right operand (`x @ w`), a depth-split product (weight gradient shape), a
    // batch of products, and a product whose epilogue also reduces.
    let x = input(&[512, 128], 10);
    let w = input(&[128, 256], 11);
    let b = input(&[256], 12);
    assert_eq!(check(false, || (x.matmul(&w) + &b).relu()), 1);
    let g = input(&[2048, 64], 13);
    let h = input(&[2048, 48], 14);
    let c = input(&[48], 15);
    assert_eq!(check(false, || g.t().matmul(&h) + &c), 1);
    let xb = input(&[4, 256, 64], 16);
    let wb = input(&[96, 64], 17);
    let bb = input(&[96], 18);
    assert_eq!(check(false, || xb.matmul(&wb.t()) + &bb), 1);
    let r = input(&[300, 32], 19);
    let wr = input(&[40, 32], 20);
    check(false, || (r.matmul(&wr.t()) + 1.0).sum(1));
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
    let before = epilogues_run_by_rows();
    kiln::realize_all(&[&pre, &act]).unwrap();
    if route_available() {
        assert!(epilogues_run_by_rows() > before, "the epilogue ran by rows");
    }
    let (x2, w2, b2) = (x.detach(), w.detach(), b.detach());
    let pre_u = x2.matmul(&w2.t()) + &b2;
    let act_u = pre_u.gelu();
    pre_u.realize_with(&RealizeOptions::unfused()).unwrap();
    act_u.realize_with(&RealizeOptions::unfused()).unwrap();
    assert_eq!(bits(&pre), bits(&pre_u));
    assert_eq!(bits(&act), bits(&act_u));
}
