//! Kernel counts the planner promises, each checked against the reference evaluator too.

use kiln::{DType, RealizeOptions, Tensor, reference};

fn input(shape: &[usize], seed: u64) -> Tensor {
    let t = Tensor::try_randn(shape, seed, DType::F32).unwrap();
    t.realize().unwrap();
    t
}

fn kernels(t: &Tensor) -> usize {
    t.plan(&RealizeOptions::default()).unwrap().kernel_count()
}

fn copies(t: &Tensor) -> usize {
    t.plan(&RealizeOptions::default()).unwrap().copy_count()
}

/// Realizes `t` fused and checks it against the reference evaluator.
fn check(t: &Tensor) {
    let want = reference::evaluate(t).unwrap().to_f64();
    t.realize().unwrap();
    let got = reference::evaluate(t).unwrap().to_f64();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let tol = 1e-4 + 1e-4 * w.abs();
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn elementwise_chain_is_one_kernel() {
    let (x, y) = (input(&[64, 64], 1), input(&[64, 64], 2));
    let t = ((&x + 1.0) * &y).abs().exp().sqrt();
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn prologue_fuses_into_reduction() {
    let (x, y) = (input(&[64, 64], 3), input(&[64, 64], 4));
    let t = (&x * &y + 1.0).sum(1);
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn a_long_join_is_stored_before_a_reduction() {
    // A reduction over a `stack` of many tensors would evaluate the stack's whole `where`
    // chain at every point; the join is stored instead (an elementwise kernel, which the
    // CPU splits between its inputs), and the reduction reads it plainly. A short join
    // stays fused.
    for (steps, want_kernels) in [(32, 2), (4, 1)] {
        let parts: Vec<Tensor> = (0..steps).map(|i| input(&[16, 64], 40 + i)).collect();
        let y = Tensor::stack(&parts.iter().collect::<Vec<_>>(), 0);
        let t = (&y * &y).sum(..);
        let plan = t.plan(&RealizeOptions::default()).unwrap();
        assert_eq!(plan.kernel_count(), want_kernels, "{}", plan.dump_text());
        for k in plan.kernels() {
            let k = k.kernel();
            let wheres = k.fused_ops.iter().filter(|o| o.contains("where")).count();
            if !k.reduce_axes.is_empty() && steps > 8 {
                assert_eq!(wheres, 0, "{}: {:?}", k.name, k.fused_ops);
            }
        }
        check(&t);
        // The same rule for a sum of many padded slices (a slice's gradient over steps).
        let x = input(&[steps as usize, 16, 64], 7);
        let mut acc = x
            .slice_dim(0, 0, 1, 1)
            .pad(&[(0, steps as usize - 1), (0, 0), (0, 0)], 0.0);
        for i in 1..steps as usize {
            let p = x.slice_dim(0, i as isize, i as isize + 1, 1);
            acc = &acc + &p.pad(&[(i, steps as usize - 1 - i), (0, 0), (0, 0)], 0.0);
        }
        let t = acc.max(..);
        assert_eq!(kernels(&t), want_kernels);
        check(&t);
    }
}

#[test]
fn an_expensive_value_read_broadcast_is_stored() {
    // A sum of eight inputs (more leaves than a recomputed cone may read) broadcast over a
    // new axis of 4 would be evaluated four times per element inlined: it is stored once,
    // and the product reads it. A cheap value (two leaves) broadcast stays inlined.
    let w = input(&[16, 4, 32], 60);
    let parts: Vec<Tensor> = (0..8).map(|i| input(&[16, 32], 61 + i)).collect();
    // A fresh (pending) sum each time: realizing a plan also realizes the values it
    // stored that a handle still names.
    let sum = || {
        let mut g = parts[0].clone();
        for p in &parts[1..] {
            g = &g + p;
        }
        g.unsqueeze(1).expand([16, 4, 32])
    };
    let t = sum() * &w;
    let plan = t.plan(&RealizeOptions::default()).unwrap();
    assert_eq!(plan.kernel_count(), 2, "{}", plan.dump_text());
    check(&t);
    // The same into a reduction over the broadcast axis.
    let t = (sum() * &w).sum(1);
    assert_eq!(kernels(&t), 2);
    check(&t);
    let cheap = &parts[0] + &parts[1];
    let t = cheap.unsqueeze(1).expand([16, 4, 32]) * &w;
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn work_after_a_stored_join_fuses_into_its_reduction() {
    // A 32-input stack read by two reductions is stored once (several readers); `exp` of
    // it then reads a buffer, not 63 padded views, and fuses into the sum. Both reductions
    // run over one space: one more kernel.
    let parts: Vec<Tensor> = (0..32).map(|i| input(&[16, 64], 80 + i)).collect();
    let y = Tensor::stack(&parts.iter().collect::<Vec<_>>(), 0);
    let t = y.exp().sum(..) + y.max(..);
    let plan = t.plan(&RealizeOptions::default()).unwrap();
    assert_eq!(plan.kernel_count(), 2, "{}", plan.dump_text());
    let reducing = plan
        .kernels()
        .map(|k| k.kernel())
        .find(|k| !k.reduce_axes.is_empty())
        .unwrap();
    assert!(
        reducing.fused_ops.iter().any(|o| o == "exp"),
        "{:?}",
        reducing.fused_ops
    );
    check(&t);
}

#[test]
fn epilogue_fuses_after_reduction() {
    let x = input(&[64, 64], 5);
    let t = x.sum(1).relu() * 2.0;
    assert_eq!(kernels(&t), 1);
    check(&t);
    let bias = input(&[64], 6);
    let t = x.max(1) + &bias;
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn two_reductions_over_one_space_share_a_kernel() {
    let x = input(&[64, 64], 7);
    let t = x.sum(1) + x.max(1);
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn reduction_broadcast_back_is_one_kernel() {
    let x = input(&[64, 64], 8);
    let t = &x - x.mean_keepdim(1);
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn softmax_log_softmax_layer_norm_var_are_one_kernel_each() {
    let x = input(&[32, 100], 9);
    for t in [x.softmax(-1), x.softmax(0), x.log_softmax(-1), x.var(1, 1)] {
        assert_eq!(
            kernels(&t),
            1,
            "{}",
            t.plan(&RealizeOptions::default()).unwrap().dump_text()
        );
        check(&t);
    }
    let (w, b) = (input(&[100], 10), input(&[100], 11));
    let t = x.layer_norm(&[100], Some(&w), Some(&b), 1e-5);
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn pad_then_elementwise_is_one_kernel() {
    let x = input(&[16, 16], 12);
    let t = x.pad(&[(1, 2), (3, 0)], 0.5) + 1.0;
    assert_eq!(kernels(&t), 1);
    check(&t);
    // Padding a computed value wraps it (exp(0) != 0 in the padding).
    let t = x.exp().pad(&[(2, 2)], 0.0).sum(0);
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn cheap_value_read_through_two_views_is_recomputed() {
    let x = input(&[32, 32], 13);
    let b = (&x + 1.0).exp();
    let t = &b + b.t();
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn matmul_result_read_through_two_views_is_stored() {
    let (x, y) = (input(&[32, 32], 14), input(&[32, 32], 15));
    let d = x.matmul(&y);
    let t = &d + d.t();
    assert_eq!(kernels(&t), 2);
    check(&t);
}

#[test]
fn value_containing_a_reduction_used_by_two_kernels_is_stored_once() {
    // `c` contains a reduction and is needed by two separately stored targets: it is
    // computed once and stored, not recomputed in both.
    let x = input(&[64, 64], 16);
    let c = (&x - x.max_keepdim(1)).exp();
    let a = c.sum(0);
    let b = c.sum(1);
    let opts = RealizeOptions::default();
    let report = kiln::realize_all_with(&[&a, &b], &opts).unwrap();
    assert_eq!(
        report.kernels, 3,
        "c stored once, then one kernel per target"
    );
    let want_a = reference::evaluate(&(&x - x.max_keepdim(1)).exp().sum(0)).unwrap();
    let got_a = reference::evaluate(&a).unwrap();
    for (g, w) in got_a.to_f64().iter().zip(want_a.to_f64()) {
        assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()));
    }
}

#[test]
fn matmul_with_bias_and_relu_is_one_kernel() {
    let (x, w, bias) = (input(&[32, 48], 17), input(&[48, 16], 18), input(&[16], 19));
    let t = (x.matmul(&w) + &bias).relu();
    assert_eq!(kernels(&t), 1);
    check(&t);
}

#[test]
fn contiguous_is_a_fusion_boundary() {
    let x = input(&[32, 32], 20);
    let t = (&x + 1.0).contiguous() * 2.0;
    assert_eq!(kernels(&t), 2);
    check(&t);
}

#[test]
fn transposed_and_permuted_matmul_operands_need_no_copy() {
    let a = input(&[64, 32], 21);
    let x = input(&[4, 8, 64], 22);
    // aᵀ is a transposed view; x.permute([2,0,1]).reshape([64, 32]) merges the two trailing
    // dims, which strides can express.
    let rhs = x.permute([2, 0, 1]).reshape([64, 32]);
    let t = a.t().matmul(&rhs);
    let plan = t.plan(&RealizeOptions::default()).unwrap();
    assert_eq!(plan.kernel_count(), 1, "{}", plan.dump_text());
    assert_eq!(plan.copy_count(), 0);
    check(&t);
    // Batched, with a broadcast batch dimension and a transposed operand.
    let b = input(&[3, 16, 32], 23);
    let w = input(&[16, 32], 24);
    let t = b.matmul(&w.t());
    assert_eq!(kernels(&t), 1);
    assert_eq!(copies(&t), 0);
    check(&t);
}

#[test]
fn reshape_strides_cannot_express_becomes_one_visible_copy() {
    let x = input(&[8, 12], 25);
    let t = x.t().reshape([-1]) * 2.0;
    let plan = t.plan(&RealizeOptions::default()).unwrap();
    assert_eq!(plan.copy_count(), 1, "{}", plan.dump_text());
    assert!(plan.dump_text().contains("copy"));
    check(&t);
}

#[test]
fn unfused_runs_one_op_per_kernel() {
    let x = input(&[16, 16], 26);
    let t = ((&x + 1.0).exp() * 2.0).sum(1);
    let plan = t.plan(&RealizeOptions::unfused()).unwrap();
    assert_eq!(plan.kernel_count(), 4);
    for k in plan.kernels() {
        assert_eq!(k.kernel().fused_ops.len(), 1, "{}", plan.dump_text());
    }
}

#[test]
fn generators_fuse_as_leaves() {
    let t = (Tensor::rand_seeded([128], 1) * 2.0 + Tensor::arange(0.0, 128.0, 1.0)).sum(0);
    assert_eq!(kernels(&t), 1);
    check(&t);
    let eye = Tensor::eye(5, DType::F32);
    assert_eq!(kernels(&eye), 1);
    assert_eq!(eye.sum(1).to_vec::<f32>().unwrap(), vec![1.0; 5]);
}
