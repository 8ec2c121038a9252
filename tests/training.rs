//! Training: modules, optimizers and the training loop on the lazy graph.

use kiln::nn::functional::{CrossEntropyOptions, cross_entropy, cross_entropy_with};
use kiln::nn::{Block, Embedding, Linear, Module};
use kiln::optim::{AdamW, Optimizer, Sgd, clip_grad_norm};
use kiln::{DType, KilnError, Tensor, no_grad};

#[test]
fn parameters_are_named_by_their_path() {
    let block = Block::new(8, 2, 0.0, 1).unwrap();
    let names: Vec<String> = block
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        vec![
            "ln1.weight",
            "ln1.bias",
            "attn.qkv.weight",
            "attn.qkv.bias",
            "attn.proj.weight",
            "attn.proj.bias",
            "ln2.weight",
            "ln2.bias",
            "mlp.fc.weight",
            "mlp.fc.bias",
            "mlp.proj.weight",
            "mlp.proj.bias",
        ]
    );
    assert_eq!(
        block.num_parameters(),
        2 * 8 + (8 * 24 + 24) + (64 + 8) + 2 * 8 + (8 * 32 + 32) + (32 * 8 + 8)
    );
    let x = Tensor::randn_seeded([2, 5, 8], 4);
    let y = block.forward(&x).unwrap();
    assert_eq!(y.shape(), &[2, 5, 8]);
    // Causality: changing a later position does not change earlier outputs.
    let x2 = Tensor::cat(
        &[
            &x.slice_dim(1, 0, 4, 1),
            &Tensor::randn_seeded([2, 1, 8], 9),
        ],
        1,
    );
    let y2 = block.forward(&x2).unwrap();
    let a = y.slice_dim(1, 0, 4, 1).to_vec::<f32>().unwrap();
    let b = y2.slice_dim(1, 0, 4, 1).to_vec::<f32>().unwrap();
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() < 1e-5);
    }
}

#[test]
fn a_backward_needing_an_overwritten_value_fails_clearly() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0], [2]).requires_grad_(true);
    w.realize().unwrap();
    let y = (&w * &w).sum(..);
    y.realize().unwrap();
    no_grad(|| w.add_(1.0));
    w.realize().unwrap();
    // y's backward needs the old w (d(w²)/dw = 2w), which the update overwrote.
    y.backward().unwrap();
    match w.grad().unwrap().to_vec::<f32>() {
        Err(KilnError::Overwritten { shape, .. }) => assert_eq!(shape, vec![2]),
        other => panic!("expected Overwritten, got {other:?}"),
    }
    // In-place updates of a tensor that requires grad need no_grad.
    assert!(w.try_add_(1.0).is_err());
}

#[test]
fn sgd_with_momentum_matches_the_update_rule() {
    let w = Tensor::from_vec(vec![1.0f64], [1]).requires_grad_(true);
    w.realize().unwrap();
    let mut opt = Sgd::with_momentum(vec![w.clone()], 0.1, 0.5, 0.0, false).unwrap();
    // loss = 3w: g = 3 every step. b1 = 3, w1 = 1 - 0.3 = 0.7; b2 = 0.5*3 + 3 = 4.5,
    // w2 = 0.7 - 0.45 = 0.25.
    for want in [0.7, 0.25] {
        opt.zero_grad();
        (&w * 3.0).sum(..).backward().unwrap();
        opt.step().unwrap();
        assert!((w.item::<f64>().unwrap() - want).abs() < 1e-12);
    }
}

#[test]
fn adamw_matches_the_update_rule() {
    let w = Tensor::from_vec(vec![2.0f64], [1]).requires_grad_(true);
    w.realize().unwrap();
    let (lr, b1, b2, eps, wd) = (0.1, 0.9, 0.999, 1e-8, 0.01);
    let mut opt = AdamW::new(vec![w.clone()], lr, (b1, b2), eps, wd).unwrap();
    let (mut p, mut m, mut v) = (2.0f64, 0.0f64, 0.0f64);
    for t in 1..=5 {
        opt.zero_grad();
        (&w * &w).sum(..).backward().unwrap();
        opt.step().unwrap();
        let g = 2.0 * p;
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        let (mh, vh) = (m / (1.0 - b1.powi(t)), v / (1.0 - b2.powi(t)));
        p = p * (1.0 - lr * wd) - lr * mh / (vh.sqrt() + eps);
        assert!((w.item::<f64>().unwrap() - p).abs() < 1e-12, "step {t}");
    }
}

#[test]
fn clipping_scales_gradients_to_the_norm() {
    let a = Tensor::from_vec(vec![0.0f32, 0.0], [2]).requires_grad_(true);
    let b = Tensor::from_vec(vec![0.0f32], [1]).requires_grad_(true);
    // Gradients (3, 0) and (4): global norm 5.
    ((&a * Tensor::from_vec(vec![3.0f32, 0.0], [2])).sum(..) + (&b * 4.0).sum(..))
        .backward()
        .unwrap();
    let norm = clip_grad_norm(&[a.clone(), b.clone()], 1.0).unwrap();
    assert!((norm.item::<f32>().unwrap() - 5.0).abs() < 1e-5);
    let ga = a.grad().unwrap().to_vec::<f32>().unwrap();
    let gb = b.grad().unwrap().to_vec::<f32>().unwrap();
    assert!((ga[0] - 0.6).abs() < 1e-5 && (gb[0] - 0.8).abs() < 1e-5);
}

#[test]
fn cross_entropy_matches_its_definition_and_gradient() {
    let logits =
        Tensor::from_vec(vec![1.0f64, 2.0, 0.5, -1.0, 0.0, 3.0], [2, 3]).requires_grad_(true);
    let t = Tensor::from_vec(vec![1i64, 2], [2]);
    let loss = cross_entropy(&logits, &t).unwrap();
    let lse = |r: &[f64]| r.iter().map(|x| x.exp()).sum::<f64>().ln();
    let want = ((lse(&[1.0, 2.0, 0.5]) - 2.0) + (lse(&[-1.0, 0.0, 3.0]) - 3.0)) / 2.0;
    assert!((loss.item::<f64>().unwrap() - want).abs() < 1e-12);
    loss.backward().unwrap();
    let g = logits.grad().unwrap().to_vec::<f64>().unwrap();
    let rows = [[1.0, 2.0, 0.5], [-1.0, 0.0, 3.0]];
    for (r, row) in rows.iter().enumerate() {
        let s: f64 = row.iter().map(|x: &f64| x.exp()).sum();
        for c in 0..3 {
            let hot = if c == [1, 2][r] { 1.0 } else { 0.0 };
            let want = (row[c].exp() / s - hot) / 2.0;
            assert!((g[r * 3 + c] - want).abs() < 1e-12);
        }
    }
    // The backward is one kernel: alone where no target can be ignored, and added to the
    // forward's kernels where the mean counts the targets not ignored (the count is a
    // forward kernel the backward reads).
    let logits2 = Tensor::randn_seeded([8, 5], 1).requires_grad_(true);
    logits2.realize().unwrap();
    let t2 = Tensor::from_vec(vec![0i64, -100, 1, 2, 3, 4, -100, 0], [8]);
    let no_ignore = CrossEntropyOptions {
        ignore_index: None,
        ..Default::default()
    };
    cross_entropy_with(&logits2, &t2.clamp(0, 4), &no_ignore)
        .unwrap()
        .backward()
        .unwrap();
    let plan = logits2.grad().unwrap().plan(&Default::default()).unwrap();
    assert_eq!(plan.kernel_count(), 1, "{}", plan.dump_text());
    let logits3 = Tensor::randn_seeded([8, 5], 1).requires_grad_(true);
    logits3.realize().unwrap();
    let loss = cross_entropy(&logits3, &t2).unwrap();
    let forward = kiln::plan_all(&[&loss], &Default::default()).unwrap();
    loss.backward().unwrap();
    let grad = logits3.grad().unwrap();
    let both = kiln::plan_all(&[&loss, &grad], &Default::default()).unwrap();
    // Realized together, the forward keeps `lse` and the count for the backward (so its
    // reductions no longer share one kernel): every kernel but one is a reduction, and
    // that one is the whole backward.
    let elementwise = both
        .kernels()
        .filter(|k| k.kernel().reduce_axes.is_empty())
        .count();
    assert_eq!(elementwise, 1, "{}", both.dump_text());
    assert!(both.kernel_count() <= forward.kernel_count() + 2);
    // Rows with an ignored target get no gradient.
    let g = grad.to_vec::<f32>().unwrap();
    assert!(g[5..10].iter().chain(&g[30..35]).all(|&v| v == 0.0));
    assert!(g[..5].iter().any(|&v| v != 0.0));
}

#[test]
fn embedding_and_linear_learn_a_lookup() {
    // Map 4 ids to 4 classes through an embedding and a linear layer.
    let emb = Embedding::new(4, 8, 1).unwrap();
    let head = Linear::new(8, 4, true, 2).unwrap();
    let mut params = emb.parameters();
    params.extend(head.parameters());
    let mut opt = AdamW::new(params, 0.05, (0.9, 0.999), 1e-8, 0.0).unwrap();
    let ids = Tensor::from_vec(vec![0i64, 1, 2, 3], [4]);
    let targets = Tensor::from_vec(vec![3i64, 2, 1, 0], [4]);
    let mut last = f32::MAX;
    for _ in 0..60 {
        opt.zero_grad();
        let loss = cross_entropy(
            &head.forward(&emb.forward(&ids).unwrap()).unwrap(),
            &targets,
        )
        .unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        last = loss.item::<f32>().unwrap();
    }
    assert!(last < 0.05, "loss {last}");
    let pred = head.forward(&emb.forward(&ids).unwrap()).unwrap().argmax(1);
    assert_eq!(pred.to_vec::<i64>().unwrap(), vec![3, 2, 1, 0]);
    let _ = DType::F32;
}

#[test]
fn an_in_place_write_does_not_disturb_a_detached_alias_it_reads() {
    // `x.detach()` shares `x`'s buffer: the plan saw two inputs, and the kernel read the
    // transposed alias while it wrote `x` in place, so late rows read updated values (and,
    // over several threads, raced with the writes). The alias now reads the old value.
    let n = 64;
    let x0: Vec<f32> = (0..n * n).map(|i| i as f32).collect();
    let x = Tensor::from_vec(x0.clone(), [n, n]);
    x.realize().unwrap();
    // `got[i, j]` must be `f(x0[i, j], x0[j, i])` everywhere.
    let check = |t: &Tensor, f: fn(f32, f32) -> f32| {
        let got = t.to_vec::<f32>().unwrap();
        for i in 0..n {
            for j in 0..n {
                assert_eq!(
                    got[i * n + j],
                    f(x0[i * n + j], x0[j * n + i]),
                    "at ({i}, {j})"
                );
            }
        }
    };
    x.add_(x.detach().t());
    x.realize().unwrap();
    check(&x, |a, b| a + b);
    // A reshaped alias, realized (it shares the buffer too), read in place of the same layout.
    let y = Tensor::from_vec(x0.clone(), [n * n]);
    y.realize().unwrap();
    let r = y.reshape([n, n]);
    r.realize().unwrap();
    let back = r.t().reshape([n * n]);
    y.mul_(back);
    y.realize().unwrap();
    check(&y, |a, b| a * b);
}

#[test]
fn computations_recorded_on_an_alias_before_an_update_read_the_old_value() {
    // `d = x.detach()` of a realized `x` holds `x`'s buffer. A computation on `d` recorded
    // before `x += 10` is a reader of the value that write overwrites: it runs first,
    // whichever tensor is realized first. (It failed with `Overwritten`.)
    for realize_x_first in [true, false] {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
        x.realize().unwrap();
        let d = x.detach();
        let y = &d * 2.0;
        x.add_(10.0);
        if realize_x_first {
            x.realize().unwrap();
        }
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
        assert_eq!(x.to_vec::<f32>().unwrap(), vec![11.0, 12.0, 13.0, 14.0]);
    }
    // The same through a realized reshape (which shares the buffer too).
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    x.realize().unwrap();
    let r = x.reshape([2, 2]);
    r.realize().unwrap();
    let y = r.sum(1);
    x.mul_(0.0);
    x.realize().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 7.0]);
}

#[test]
fn a_reshape_recorded_before_an_update_keeps_the_old_value_when_realized_with_it() {
    // A pending reshape of `x` is a row-major alias: realized in the plan that writes `x`
    // in place, it used to share `x`'s buffer and so showed the new value (silently). It
    // is now copied before the write. A pending reshape of `x.detach()` (another input slot
    // on the same buffer) is given the copy of the buffer the run read instead.
    for (through_detach, together) in [(false, false), (false, true), (true, false), (true, true)] {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
        x.realize().unwrap();
        let r = if through_detach {
            x.detach().reshape([2, 2])
        } else {
            x.reshape([2, 2])
        };
        x.add_(10.0);
        if together {
            kiln::realize_all(&[&x, &r]).unwrap();
        } else {
            x.realize().unwrap();
        }
        assert_eq!(r.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(r.shape(), &[2, 2]);
        assert_eq!(x.to_vec::<f32>().unwrap(), vec![11.0, 12.0, 13.0, 14.0]);
        // A second update of `x` leaves the copy alone.
        x.add_(1.0);
        x.realize().unwrap();
        assert_eq!(r.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    }
    // Between two updates of `x` in one plan: the value after the first.
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    x.realize().unwrap();
    x.add_(1.0);
    let r = x.reshape([1, 2]);
    x.add_(100.0);
    kiln::realize_all(&[&x, &r]).unwrap();
    assert_eq!(r.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![102.0, 103.0]);
    // Updates of `x` and of `x.detach()` both pending: realizing `x` runs the other one
    // first (it reads the old value too), and each tensor ends with its own value.
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    x.realize().unwrap();
    let d = x.detach();
    d.add_(1.0);
    x.add_(2.0);
    x.realize().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![3.0, 4.0]);
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
}

#[test]
fn an_alias_whose_buffer_was_overwritten_is_refused_by_every_read() {
    // Value semantics: an update changes the tensor it is called on; another tensor that
    // held the same buffer (`x.detach()`, a realized reshape of `x`, or `x` itself after
    // an update through `x.detach()`) kept the old value, which is now gone. Every read of
    // it fails the same way (reads of the buffer used to return the new contents while
    // computations on it failed).
    let is_overwritten = |r: kiln::Result<()>| matches!(r, Err(KilnError::Overwritten { .. }));
    let check = |t: &Tensor| {
        assert!(is_overwritten(t.to_vec::<f32>().map(|_| ())));
        assert!(is_overwritten(t.as_slice::<f32>().map(|_| ())));
        assert!(is_overwritten(t.to_bytes().map(|_| ())));
        assert!(is_overwritten(t.realize()));
        assert!(is_overwritten((t * 1.0).realize()));
    };
    let fresh = || {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
        x.realize().unwrap();
        x
    };
    let x = fresh();
    let d = x.detach();
    x.add_(1.0);
    x.realize().unwrap();
    check(&d);
    let x = fresh();
    let r = x.reshape([2, 2]);
    r.realize().unwrap();
    x.add_(1.0);
    x.realize().unwrap();
    check(&r);
    let x = fresh();
    let d = x.detach();
    d.add_(1.0);
    d.realize().unwrap();
    check(&x);
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    // An alias made after the update reads the new value.
    let x = fresh();
    x.add_(1.0);
    x.realize().unwrap();
    assert_eq!(
        x.detach().to_vec::<f32>().unwrap(),
        vec![2.0, 3.0, 4.0, 5.0]
    );
}

#[test]
fn in_place_corner_cases_found_by_the_in_place_fuzzer() {
    let x4 = || {
        let x = Tensor::from_vec(vec![1.0f32, -3.0, -3.0, 3.0], [2, 2]);
        x.realize().unwrap();
        x
    };
    // `x.copy_(&x)`: the value is the tensor itself (was an internal error: a cycle).
    let x = x4();
    x.copy_(&x);
    x.copy_(&x.reshape([2, 2]));
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, -3.0, -3.0, 3.0]);
    // A view recorded before two updates, read by the second: its kernel must follow the
    // first write and read what that write overwrites, so the old value is copied first
    // (was an internal error: kernel dependencies form a cycle).
    let x = x4();
    let r = x.t();
    x.add_(-2.0);
    x.add_(&r);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, -8.0, -8.0, 4.0]);
    // A realize that runs the first of two pending writes (a reader needs its value)
    // installs it; the buffer and the graph agree, and the second write runs later (every
    // read failed with `Overwritten`).
    let x = x4();
    x.add_(&x);
    let twice = &x - &x.t();
    x.add_(3.0);
    assert_eq!(twice.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 0.0, 0.0]);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![5.0, -3.0, -3.0, 9.0]);
    // `detach` of a value that is already overwritten stays refused (it showed the new
    // contents).
    let x = x4();
    let d = x.detach();
    x.add_(1.0);
    x.realize().unwrap();
    assert!(matches!(
        d.detach().to_vec::<f32>(),
        Err(KilnError::Overwritten { .. })
    ));
    // `copy_` into an unrealized tensor copies: a later update of it leaves the source
    // alone (the source was overwritten through the shared buffer).
    let src = x4();
    let y = &x4() * 1.0;
    y.copy_(&src.reshape([2, 2]));
    y.realize().unwrap();
    y.mul_(2.0);
    y.realize().unwrap();
    assert_eq!(src.to_vec::<f32>().unwrap(), vec![1.0, -3.0, -3.0, 3.0]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, -6.0, -6.0, 6.0]);
    // A pending reshape of a realized alias, updated in place with a value that reads the
    // alias's update (was a cycle).
    let x = Tensor::from_vec(vec![2.0f32, -3.0, -1.0, 3.0], [1, 4]);
    let v = x.reshape([4, 1]);
    v.realize().unwrap();
    let w = v.reshape([2, 2]);
    v.add_(w.reshape([4, 1]));
    w.add_(v.reshape([2, 2]));
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![6.0, -9.0, -3.0, 9.0]);
}

#[test]
fn ops_that_change_nothing_still_return_new_tensors() {
    // An in-place update of a result must not reach the tensor it came from, whatever the
    // shapes: a flip of a size-1 dimension returned the tensor itself, so updating the
    // "flipped" tensor updated the original (found by the in-place fuzzer's view mode).
    let source = || {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [1, 3]);
        x.realize().unwrap();
        x
    };
    type NoOp = fn(&Tensor) -> Tensor;
    let no_ops: Vec<(&str, NoOp)> = vec![
        ("reshape", |t| t.reshape([1, 3])),
        ("flatten", |t| t.reshape([3]).flatten()),
        ("permute", |t| t.permute([0, 1])),
        ("transpose", |t| t.transpose(1, 1)),
        ("t of 1-D", |t| t.reshape([3]).t()),
        ("expand", |t| t.expand([1, 3])),
        ("slice", |t| t.slice(&[(0, 1, 1), (0, 3, 1)])),
        ("slice_dim", |t| t.slice_dim(1, 0, 3, 1)),
        ("narrow", |t| t.narrow(1, 0, 3)),
        ("pad", |t| t.pad(&[(0, 0), (0, 0)], 0.0)),
        ("flip", |t| t.flip([0])),
        ("squeeze_dim", |t| t.squeeze_dim(1)),
        ("cat", |t| Tensor::cat(&[t], 0)),
        ("contiguous", |t| t.contiguous()),
        ("pow 1", |t| t.pow(1)),
    ];
    for (name, f) in no_ops {
        // `flatten` and `t` of 1-D start from a reshape: the source is that reshape.
        let base = source();
        let x = if matches!(name, "flatten" | "t of 1-D") {
            base.reshape([3])
        } else {
            base
        };
        let y = f(&x);
        y.add_(10.0);
        assert_eq!(
            x.to_vec::<f32>().unwrap(),
            vec![1.0, 2.0, 3.0],
            "{name}: source"
        );
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            vec![11.0, 12.0, 13.0],
            "{name}: result"
        );
        // And the other way round: updating the source leaves the result's value alone.
        let x = source();
        let y = f(&x);
        x.mul_(-1.0);
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            vec![1.0, 2.0, 3.0],
            "{name}: reverse"
        );
    }
    // Sorting, top-k and max/min along the one "dimension" of a 0-D tensor; the sign of a
    // bool tensor.
    let zero_d = || {
        let z = Tensor::from_vec(vec![5.0f32], ());
        z.realize().unwrap();
        z
    };
    let z = zero_d();
    z.sort(-1, false).0.add_(1.0);
    z.topk(1, -1, true).0.add_(1.0);
    z.max_dim(-1, false).0.add_(1.0);
    z.min_dim(-1, false).0.add_(1.0);
    z.sum_keepdim(..).add_(1.0);
    z.max_keepdim(..).add_(1.0);
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![5.0]);
    let b = Tensor::from_vec(vec![true, false], [2]);
    b.sign().fill_(true);
    assert_eq!(b.to_vec::<bool>().unwrap(), vec![true, false]);
    // As in PyTorch, `cast`/`to` to what the tensor already is return the tensor itself:
    // an update through them is an update of it.
    let x = source();
    x.cast(DType::F32).add_(1.0);
    x.to(kiln::Device::Cpu).add_(1.0);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![3.0, 4.0, 5.0]);
    // `copy()` (PyTorch's `clone()`) keeps the value it had, whether it is realized before
    // the update or after; Rust's `clone()` is the same tensor and sees the update.
    let x = source();
    let (early, late, same) = (x.copy(), x.copy(), x.clone());
    early.realize().unwrap();
    x.mul_(2.0);
    late.add_(1.0);
    assert_eq!(early.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(late.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
    assert_eq!(same.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    // An update of a copy leaves the source alone.
    early.zero_();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn two_in_place_updates_that_each_read_the_others_old_value_both_apply() {
    // `x += z_old` and `z += x_old`, both recorded before either runs: fused, each write's
    // kernel would read what the other overwrites (a cycle); the planner stores the reads.
    for fused in [true, false] {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
        let z = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], [3]);
        let z_old = &z * 1.0;
        let x_old = &x * 2.0;
        x.add_(&z_old);
        z.add_(&x_old);
        let options = if fused {
            kiln::RealizeOptions::default()
        } else {
            kiln::RealizeOptions::unfused()
        };
        kiln::realize_all_with(&[&z], &options).unwrap();
        assert_eq!(
            x.to_vec::<f32>().unwrap(),
            vec![11.0, 22.0, 33.0],
            "fused {fused}"
        );
        assert_eq!(
            z.to_vec::<f32>().unwrap(),
            vec![12.0, 24.0, 36.0],
            "fused {fused}"
        );
    }
}

#[test]
fn an_in_place_update_that_fails_part_way_leaves_no_reader_of_a_half_written_value() {
    // The gather's out-of-range index is found while the kernel runs: the elements before
    // it may be written already. Whatever still reads the old value must then fail clearly
    // instead of reading a half-updated buffer, and so must running the update again.
    let x = Tensor::from_vec(vec![1.0f32; 6], [6]);
    x.realize().unwrap();
    let saved = x.reshape([2, 3]);
    let d = Tensor::from_vec(vec![1.0f32; 6], [6]);
    let table = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], [3]);
    let idx = Tensor::from_vec(vec![0i64, 1, 2, 0, 1, 7], [6]);
    no_grad(|| x.add_(table.gather(0, &idx)));
    let e = x.realize().unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::IndexOutOfRange {
                index: 7,
                size: 3,
                ..
            }
        ),
        "{e:?}"
    );
    let again = x.realize();
    assert!(
        matches!(again, Err(KilnError::Overwritten { .. })),
        "the failed update ran again: {again:?}"
    );
    let old = (&saved + &d.reshape([2, 3])).to_vec::<f32>();
    assert!(
        matches!(old, Err(KilnError::Overwritten { .. })),
        "a reader of the old value read {old:?}"
    );
}

#[test]
fn modules_from_nearby_or_equal_seeds_draw_unrelated_parameters() {
    // Seeds made by small offsets used to collide: layer i + 1's weight began with layer
    // i's bias, and blocks[2].attn.qkv.weight equalled blocks[0].attn.proj.weight.
    let mut prefixes: Vec<(String, Vec<f32>)> = vec![];
    let mut add = |name: String, t: &Tensor| {
        let v = t.to_vec::<f32>().unwrap();
        prefixes.push((name, v[..8].to_vec()));
    };
    for i in 0..13u64 {
        for (n, p) in Block::new(8, 2, 0.0, i).unwrap().named_parameters() {
            if n.ends_with("weight") && n.starts_with("ln") {
                continue; // LayerNorm: ones and zeros
            }
            if !n.starts_with("ln") {
                add(format!("block{i}.{n}"), &p);
            }
        }
        for (n, p) in Linear::new(16, 16, true, i).unwrap().named_parameters() {
            add(format!("linear{i}.{n}"), &p);
        }
        for (n, p) in Embedding::new(16, 16, i).unwrap().named_parameters() {
            add(format!("embedding{i}.{n}"), &p);
        }
    }
    assert!(prefixes.len() > 13 * 10);
    for (a, (na, va)) in prefixes.iter().enumerate() {
        for (nb, vb) in &prefixes[a + 1..] {
            // Neither equal nor a scaled copy (the same stream under another bound).
            let ratio = va[0] / vb[0];
            let scaled = va.iter().zip(vb).all(|(x, y)| (x - ratio * y).abs() < 1e-6);
            assert!(
                !scaled,
                "{na} and {nb} share their values: {va:?} vs {vb:?}"
            );
        }
    }
    // The same seed still gives the same model.
    let a = Block::new(8, 2, 0.0, 5).unwrap().parameters();
    let b = Block::new(8, 2, 0.0, 5).unwrap().parameters();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    }
}

#[test]
fn evaluation_mode_reaches_dropout_inside_nested_modules() {
    use kiln::nn::Sequential;
    let mut model = Sequential::new()
        .push(Block::new(8, 2, 0.5, 1).unwrap())
        .push(Block::new(8, 2, 0.5, 2).unwrap());
    let x = Tensor::randn_seeded([2, 4, 8], 3);
    let run = |m: &Sequential| m.forward(&x).unwrap().to_vec::<f32>().unwrap();
    // Training: each forward draws new masks.
    assert_ne!(run(&model), run(&model));
    model.set_training(false);
    let (a, b) = (run(&model), run(&model));
    assert_eq!(a, b);
    // And evaluation equals a model built without dropout from the same seeds.
    let plain = Sequential::new()
        .push(Block::new(8, 2, 0.0, 1).unwrap())
        .push(Block::new(8, 2, 0.0, 2).unwrap());
    assert_eq!(a, run(&plain));
}

#[test]
fn optimizers_refuse_hyperparameters_pytorch_refuses() {
    let w = Tensor::zeros([2]).requires_grad_(true);
    let p = || vec![w.clone()];
    // torch.optim.SGD([w], lr=-1) raises "Invalid learning rate: -1", and so on.
    for (lr, mu, wd, nesterov) in [
        (-1.0, 0.0, 0.0, false),
        (f64::NAN, 0.0, 0.0, false),
        (0.1, -0.5, 0.0, false),
        (0.1, 0.0, -1e-4, false),
        (0.1, 0.0, 0.0, true),
    ] {
        let e = Sgd::with_momentum(p(), lr, mu, wd, nesterov).unwrap_err();
        assert!(
            matches!(e, KilnError::InvalidArgument { op: "Sgd", .. }),
            "{e}"
        );
    }
    assert!(Sgd::with_momentum(p(), 0.1, 0.9, 1e-4, true).is_ok());
    for (lr, betas, eps, wd) in [
        (-1e-3, (0.9, 0.999), 1e-8, 0.0),
        (1e-3, (1.0, 0.999), 1e-8, 0.0),
        (1e-3, (0.9, -0.1), 1e-8, 0.0),
        (1e-3, (0.9, 0.999), -1e-8, 0.0),
        (1e-3, (0.9, 0.999), 1e-8, -0.1),
        (1e-3, (0.9, f64::NAN), 1e-8, 0.0),
    ] {
        let e = AdamW::new(p(), lr, betas, eps, wd).unwrap_err();
        assert!(
            matches!(e, KilnError::InvalidArgument { op: "AdamW", .. }),
            "{e}"
        );
    }
    assert!(AdamW::new(p(), 0.0, (0.0, 0.0), 0.0, 0.0).is_ok());
}

#[test]
fn dropout_keeps_a_non_finite_input_non_finite() {
    // F.dropout(tensor([inf] * 64), 0.5): dropped elements are inf * 0 = nan, kept ones inf
    let x = Tensor::full([64], f64::INFINITY).cast(DType::F32);
    let y = kiln::nn::functional::dropout(&x, 0.5, true, 7)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let dropped = y.iter().filter(|v| v.is_nan()).count();
    assert!(dropped > 0 && dropped < 64, "{y:?}");
    assert!(y.iter().all(|v| v.is_nan() || *v == f32::INFINITY));
    // Finite inputs: dropped ones are exactly 0 (-0 for negative inputs), kept ones x / (1 - p)
    let x = Tensor::from_vec((0..64).map(|i| i as f32 - 32.0).collect::<Vec<_>>(), [64]);
    let y = kiln::nn::functional::dropout(&x, 0.5, true, 7)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for (i, v) in y.iter().enumerate() {
        let xi = i as f32 - 32.0;
        assert!(*v == 0.0 || *v == 2.0 * xi, "{i}: {v}");
    }
}
