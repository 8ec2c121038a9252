//! Normalization layers and distance functions (`nn::functional::{batch_norm, group_norm,
//! instance_norm, rms_norm, normalize, cosine_similarity, pairwise_distance}` and the
//! `BatchNorm*`, `GroupNorm`, `InstanceNorm*`, `RmsNorm` modules) against plain f64 loops,
//! plus module buffers: naming, checkpoints, devices, optimizers.

use std::path::PathBuf;

use kiln::nn::functional as F;
use kiln::nn::{
    BatchNorm1d, BatchNorm2d, BatchNorm3d, Conv2d, Flatten, GroupNorm, InstanceNorm1d,
    InstanceNorm2d, Linear, Module, RmsNorm, Sequential,
};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, KilnError, Tensor};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Deterministic values in `[lo, hi)`.
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// A shape of `dims` dimensions, each in `lo..=hi`, from `seed`.
fn shape(dims: usize, lo: usize, hi: usize, seed: u64) -> Vec<usize> {
    values(dims, seed, 0.0, 1.0)
        .iter()
        .map(|v| lo + (v * (hi - lo + 1) as f64) as usize)
        .collect()
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The multi-index of flat row-major position `i`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i)
}

/// A non-contiguous f64 tensor of logical shape `shape` holding `data` (row-major): a
/// permutation (by `perm`) of a buffer laid out in another order.
fn permuted(data: &[f64], shape: &[usize], perm: &[usize]) -> Tensor {
    let stored: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let mut buf = vec![0.0; data.len()];
    for (i, &v) in data.iter().enumerate() {
        let l = unravel(i, shape);
        let p: Vec<usize> = perm.iter().map(|&k| l[k]).collect();
        buf[ravel(&p, &stored)] = v;
    }
    let mut inv = vec![0isize; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i as isize;
    }
    let t = Tensor::from_vec(buf, stored.as_slice()).permute(inv.as_slice());
    assert_eq!(t.shape(), shape);
    t
}

fn get(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// Per-group mean and biased variance of `data` where `group(i)` names element `i`'s group.
fn group_stats(
    data: &[f64],
    groups: usize,
    group: impl Fn(usize) -> usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut sum = vec![0.0; groups];
    let mut count = vec![0.0; groups];
    for (i, &v) in data.iter().enumerate() {
        sum[group(i)] += v;
        count[group(i)] += 1.0;
    }
    let mean: Vec<f64> = sum.iter().zip(&count).map(|(s, c)| s / c).collect();
    let mut sq = vec![0.0; groups];
    for (i, &v) in data.iter().enumerate() {
        sq[group(i)] += (v - mean[group(i)]).powi(2);
    }
    let var = sq.iter().zip(&count).map(|(s, c)| s / c).collect();
    (mean, var)
}

/// Batch normalization by loop: returns `(output, batch mean, biased batch variance, n)`.
fn batch_norm_loop(
    data: &[f64],
    shape: &[usize],
    w: &[f64],
    b: &[f64],
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, usize) {
    let c = shape[1];
    let chan = |i: usize| unravel(i, shape)[1];
    let (mean, var) = group_stats(data, c, chan);
    let y = data
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let k = chan(i);
            (v - mean[k]) / (var[k] + eps).sqrt() * w[k] + b[k]
        })
        .collect();
    (y, mean, var, numel(shape) / c)
}

fn expect_err<T: std::fmt::Debug>(r: kiln::Result<T>, op: &str, words: &[&str]) -> KilnError {
    let e = r.expect_err("expected an error");
    let msg = e.to_string();
    assert!(msg.contains(op), "{msg:?} should name {op}");
    for w in words {
        assert!(msg.contains(w), "{msg:?} should contain {w:?}");
    }
    e
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("kiln-norm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// batch_norm
// ---------------------------------------------------------------------------------------

#[test]
fn batch_norm_training_matches_loop_and_updates_running_stats() {
    for seed in 0..4u64 {
        let dims = 2 + (seed as usize % 3);
        let s = shape(dims, 2, 4, seed + 10);
        let c = s[1];
        let data = values(numel(&s), seed, -3.0, 3.0);
        let mut perm: Vec<usize> = (0..dims).collect();
        perm.reverse();
        let x = permuted(&data, &s, &perm);
        let (w, b) = (
            values(c, seed + 100, 0.5, 2.0),
            values(c, seed + 200, -1.0, 1.0),
        );
        let (rm0, rv0) = (
            values(c, seed + 300, -1.0, 1.0),
            values(c, seed + 400, 0.5, 2.0),
        );
        let rm = Tensor::from_vec(rm0.clone(), [c]);
        let rv = Tensor::from_vec(rv0.clone(), [c]);
        let wt = Tensor::from_vec(w.clone(), [c]);
        let bt = Tensor::from_vec(b.clone(), [c]);
        let m = 0.3;
        let y = F::batch_norm(
            &x,
            Some(&rm),
            Some(&rv),
            Some(&wt),
            Some(&bt),
            true,
            m,
            1e-5,
        )
        .unwrap();
        let (want, mean, var, n) = batch_norm_loop(&data, &s, &w, &b, 1e-5);
        assert_eq!(y.shape(), &s[..]);
        assert_close(&get(&y), &want, 1e-10, "batch_norm output");
        // The running update is recorded, not run: it runs when read (below) or with an
        // optimizer's step; its variance is the unbiased one.
        assert!(!rm.is_realized() && !rv.is_realized());
        let want_rm: Vec<f64> = (0..c).map(|k| (1.0 - m) * rm0[k] + m * mean[k]).collect();
        let want_rv: Vec<f64> = (0..c)
            .map(|k| (1.0 - m) * rv0[k] + m * var[k] * n as f64 / (n - 1) as f64)
            .collect();
        assert_close(&get(&rm), &want_rm, 1e-12, "running_mean");
        assert_close(&get(&rv), &want_rv, 1e-12, "running_var");

        // Evaluation normalizes with the (now updated) running statistics.
        let y = F::batch_norm(
            &x,
            Some(&rm),
            Some(&rv),
            Some(&wt),
            Some(&bt),
            false,
            m,
            1e-5,
        )
        .unwrap();
        let want: Vec<f64> = data
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let k = unravel(i, &s)[1];
                (v - want_rm[k]) / (want_rv[k] + 1e-5).sqrt() * w[k] + b[k]
            })
            .collect();
        assert_close(&get(&y), &want, 1e-10, "batch_norm eval");
        assert_close(&get(&rm), &want_rm, 0.0, "eval leaves running_mean");
    }
}

#[test]
fn batch_norm_by_hand_and_without_stats() {
    // Channel 0 holds 1, 3 (mean 2, biased var 1); channel 1 holds 10, 30 (mean 20, var 100).
    let x = Tensor::from_vec(vec![1.0f32, 10.0, 3.0, 30.0], [2, 2]);
    let y = F::batch_norm(&x, None, None, None, None, true, 0.1, 0.0).unwrap();
    assert_eq!(get(&y), vec![-1.0, -1.0, 1.0, 1.0]);
    // The output keeps the input's dtype; a half input is computed in f32.
    assert_eq!(y.dtype(), DType::F32);
    let h = x.cast(DType::F16);
    let yh = F::batch_norm(&h, None, None, None, None, true, 0.1, 0.0).unwrap();
    assert_eq!(
        (yh.dtype(), get(&yh)),
        (DType::F16, vec![-1.0, -1.0, 1.0, 1.0])
    );
}

#[test]
fn batch_norm_errors() {
    let x = Tensor::randn_seeded([4, 3, 2], 0);
    let four = Tensor::ones([4]);
    let three = Tensor::ones([3]);
    for (name, args) in [
        ("running_mean", [Some(&four), Some(&three), None, None]),
        ("running_var", [Some(&three), Some(&four), None, None]),
        ("weight", [None, None, Some(&four), None]),
        ("bias", [None, None, None, Some(&four)]),
    ] {
        let e = expect_err(
            F::batch_norm(&x, args[0], args[1], args[2], args[3], true, 0.1, 1e-5),
            "batch_norm",
            &[name, "[3]", "[4, 3, 2]"],
        );
        assert!(matches!(e, KilnError::ShapeMismatch { .. }), "{e:?}");
    }
    // One value per channel cannot be normalized in training (PyTorch refuses it too).
    for s in [vec![1usize, 3], vec![1, 3, 1, 1]] {
        let one = Tensor::randn_seeded(s.as_slice(), 1);
        let e = expect_err(
            F::batch_norm(&one, None, None, None, None, true, 0.1, 1e-5),
            "batch_norm",
            &["more than 1 value per channel", &format!("{s:?}")],
        );
        assert!(matches!(e, KilnError::InvalidArgument { .. }));
        // Evaluation with running statistics is fine.
        F::batch_norm(
            &one,
            Some(&three),
            Some(&three),
            None,
            None,
            false,
            0.1,
            1e-5,
        )
        .unwrap();
    }
    let one = Tensor::randn_seeded([1, 3], 1);
    expect_err(
        BatchNorm1d::new(3).unwrap().forward(&one),
        "BatchNorm1d",
        &["more than 1 value per channel"],
    );
    expect_err(
        F::batch_norm(&x, None, None, None, None, false, 0.1, 1e-5),
        "batch_norm",
        &["running_mean and running_var"],
    );
    expect_err(
        F::batch_norm(&x, Some(&three), None, None, None, true, 0.1, 1e-5),
        "batch_norm",
        &["together"],
    );
    expect_err(
        F::batch_norm(&Tensor::ones([3]), None, None, None, None, true, 0.1, 1e-5),
        "batch_norm",
        &["at least 2 dimensions"],
    );
    expect_err(
        F::batch_norm(
            &Tensor::ones_dtype([4, 3], DType::I64),
            None,
            None,
            None,
            None,
            true,
            0.1,
            1e-5,
        ),
        "batch_norm",
        &["i64"],
    );
    expect_err(
        BatchNorm2d::new(3).unwrap().forward(&x),
        "BatchNorm2d",
        &["4-d", "3-d"],
    );
    expect_err(
        BatchNorm3d::new(3)
            .unwrap()
            .forward(&Tensor::randn_seeded([2, 4, 2, 2, 2], 2)),
        "BatchNorm3d",
        &["running_mean", "[3]"],
    );
    // A failed forward counts no batch.
    let bn = BatchNorm1d::new(3).unwrap();
    assert!(bn.forward(&Tensor::randn_seeded([4, 5], 3)).is_err());
    assert_eq!(
        bn.num_batches_tracked
            .as_ref()
            .unwrap()
            .item::<i64>()
            .unwrap(),
        0
    );
}

/// The running statistics by loop after training batches `xs` (each `(data, shape)`).
fn running_by_loop(
    xs: &[(Vec<f64>, Vec<usize>)],
    c: usize,
    momentum: Option<f64>,
) -> (Vec<f64>, Vec<f64>) {
    let (mut rm, mut rv) = (vec![0.0; c], vec![1.0; c]);
    for (step, (d, s)) in xs.iter().enumerate() {
        let (_, mean, var, n) = batch_norm_loop(d, s, &vec![1.0; c], &vec![0.0; c], 0.0);
        let m = momentum.unwrap_or(1.0 / (step + 1) as f64);
        for k in 0..c {
            rm[k] = (1.0 - m) * rm[k] + m * mean[k];
            rv[k] = (1.0 - m) * rv[k] + m * var[k] * n as f64 / (n - 1) as f64;
        }
    }
    (rm, rv)
}

#[test]
fn batch_norm_module_three_steps_train_and_eval() {
    for momentum in [Some(0.1), Some(0.5), None] {
        let c = 3;
        let mut bn = BatchNorm2d::with_options(c, 1e-5, momentum, true, true).unwrap();
        assert!(bn.is_training());
        let xs: Vec<(Vec<f64>, Vec<usize>)> = (0..3)
            .map(|i| {
                let s = vec![2 + i, c, 3, 2];
                (values(numel(&s), 50 + i as u64, -2.0 + i as f64, 4.0), s)
            })
            .collect();
        for (d, s) in &xs {
            let x = permuted(d, s, &[0, 2, 3, 1]);
            let y = bn.forward(&x).unwrap();
            let (want, ..) = batch_norm_loop(d, s, &[1.0; 3], &[0.0; 3], 1e-5);
            assert_close(&get(&y), &want, 1e-5, "training output");
        }
        let (rm, rv) = running_by_loop(&xs, c, momentum);
        let got_rm = get(bn.running_mean.as_ref().unwrap());
        let got_rv = get(bn.running_var.as_ref().unwrap());
        assert_close(
            &got_rm,
            &rm,
            1e-5,
            &format!("running_mean, momentum {momentum:?}"),
        );
        assert_close(
            &got_rv,
            &rv,
            1e-5,
            &format!("running_var, momentum {momentum:?}"),
        );
        if momentum.is_none() {
            // The cumulative average: the plain mean of the three batches' statistics.
            let means: Vec<f64> = (0..c)
                .map(|k| {
                    xs.iter()
                        .map(|(d, s)| batch_norm_loop(d, s, &[1.0; 3], &[0.0; 3], 0.0).1[k])
                        .sum::<f64>()
                        / 3.0
                })
                .collect();
            assert_close(&got_rm, &means, 1e-5, "cumulative average");
        }
        let nbt = bn.num_batches_tracked.clone().unwrap();
        assert_eq!((nbt.dtype(), nbt.shape()), (DType::I64, &[][..]));
        assert_eq!(nbt.item::<i64>().unwrap(), 3);

        // Evaluation: the running statistics normalize, and nothing moves.
        bn.set_training(false);
        let (d, s) = &xs[0];
        let x = Tensor::from_vec(d.clone(), s.as_slice()).cast(DType::F32);
        let y = bn.forward(&x).unwrap();
        let want: Vec<f64> = d
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let k = unravel(i, s)[1];
                (v - rm[k]) / (rv[k] + 1e-5).sqrt()
            })
            .collect();
        assert_close(&get(&y), &want, 1e-5, "eval output");
        assert_eq!(get(bn.running_mean.as_ref().unwrap()), got_rm);
        assert_eq!(nbt.item::<i64>().unwrap(), 3);
        // ...which differs from the training output on the same batch.
        bn.set_training(true);
        let yt = bn.forward(&x).unwrap();
        assert!(
            get(&yt)
                .iter()
                .zip(get(&y))
                .any(|(a, b)| (a - b).abs() > 1e-3)
        );
    }
}

#[test]
fn batch_norm_module_options_and_graph_stays_small() {
    // Without running statistics: no buffers, batch statistics in both modes.
    let mut bn = BatchNorm1d::with_options(2, 0.0, Some(0.1), false, false).unwrap();
    assert!(bn.parameters().is_empty() && bn.named_buffers().is_empty());
    let x = Tensor::from_vec(vec![1.0f32, 10.0, 3.0, 30.0], [2, 2]);
    assert_eq!(get(&bn.forward(&x).unwrap()), vec![-1.0, -1.0, 1.0, 1.0]);
    bn.set_training(false);
    assert_eq!(get(&bn.forward(&x).unwrap()), vec![-1.0, -1.0, 1.0, 1.0]);

    // BatchNorm1d over [N, C, L].
    let bn = BatchNorm1d::new(3).unwrap();
    let s = [4usize, 3, 5];
    let d = values(60, 7, -1.0, 1.0);
    let y = bn.forward(&Tensor::from_vec(d.clone(), s)).unwrap();
    let (want, ..) = batch_norm_loop(&d, &s, &[1.0; 3], &[0.0; 3], 1e-5);
    assert_close(&get(&y), &want, 1e-10, "BatchNorm1d [N, C, L]");

    // Forward passes with no optimizer step between them: each runs the update the last
    // one left pending before recording its own, so no graph builds up.
    let bn = BatchNorm1d::new(3).unwrap();
    let mut sizes = vec![];
    for step in 0..5u64 {
        let x = Tensor::randn_seeded([6, 3], step).requires_grad_(true);
        let y = bn.forward(&x).unwrap();
        y.sum(..).backward().unwrap();
        for (_, b) in bn.named_buffers() {
            assert!(!b.requires_grad());
        }
        sizes.push(bn.running_mean.as_ref().unwrap().dump_text().len());
    }
    assert!(sizes.windows(2).all(|w| w[0] == w[1]), "{sizes:?}");
    assert_eq!(
        get(bn.num_batches_tracked.as_ref().unwrap()),
        vec![5.0],
        "five counted batches"
    );
}

#[test]
fn batch_norm_in_a_model_trained_by_an_optimizer() {
    let model = Sequential::new()
        .push(Linear::new(4, 3, true, 0).unwrap())
        .push(BatchNorm1d::new(3).unwrap())
        .push(Linear::new(3, 1, true, 1).unwrap());
    let params = model.parameters();
    assert_eq!(params.len(), 6);
    let mut opt = Sgd::new(params, 0.05).unwrap();
    let mut ref_stats = (vec![0.0; 3], vec![1.0; 3]);
    for step in 0..3u64 {
        let x = Tensor::randn_seeded([8, 4], 40 + step);
        // The batch statistics the BatchNorm will see: the first layer's output now.
        let h = get(&model.layers[0].forward(&x).unwrap());
        let (_, mean, var, n) = batch_norm_loop(&h, &[8, 3], &[1.0; 3], &[0.0; 3], 0.0);
        for k in 0..3 {
            ref_stats.0[k] = 0.9 * ref_stats.0[k] + 0.1 * mean[k];
            ref_stats.1[k] = 0.9 * ref_stats.1[k] + 0.1 * var[k] * n as f64 / (n - 1) as f64;
        }
        let loss = model.forward(&x).unwrap().square().mean(..);
        opt.zero_grad();
        loss.backward().unwrap();
        opt.step().unwrap();
        // The step's plan ran the statistics' update too: it reads the activations the
        // step's writes to the first layer overwrite (so the forward ran once).
        let rm = model.named_buffers()[0].1.clone();
        assert!(rm.is_realized(), "step {step}: running_mean left pending");
    }
    let state = model.state_dict();
    let find = |name: &str| get(&state.iter().find(|(n, _)| n == name).unwrap().1);
    assert_close(&find("1.running_mean"), &ref_stats.0, 1e-5, "running_mean");
    assert_close(&find("1.running_var"), &ref_stats.1, 1e-5, "running_var");
    assert_eq!(find("1.num_batches_tracked"), vec![3.0]);
}

// ---------------------------------------------------------------------------------------
// Buffers: names, parameters, devices, checkpoints
// ---------------------------------------------------------------------------------------

fn conv_model(seed: u64) -> Sequential {
    Sequential::new()
        .push(Conv2d::new(2, 4, 3, seed).unwrap())
        .push(BatchNorm2d::new(4).unwrap())
        .push(Flatten::new())
        .push(Linear::new(4 * 2 * 2, 3, true, seed + 1).unwrap())
        .push(BatchNorm1d::new(3).unwrap())
}

#[test]
fn buffers_are_named_not_parameters_and_move_with_the_model() {
    let mut model = conv_model(0);
    let buffers: Vec<String> = model.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        buffers,
        [
            "1.running_mean",
            "1.running_var",
            "1.num_batches_tracked",
            "4.running_mean",
            "4.running_var",
            "4.num_batches_tracked"
        ]
    );
    let params: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        params,
        [
            "0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias", "4.weight", "4.bias"
        ]
    );
    assert_eq!(model.parameters().len(), 8);
    assert_eq!(model.state_dict().len(), 14);
    // Buffers are not parameters: nothing in `parameters()` shares a node with them.
    let keys: Vec<_> = model.parameters().iter().map(|p| p.node_key()).collect();
    for (_, b) in model.named_buffers() {
        assert!(!keys.contains(&b.node_key()));
        assert!(!b.requires_grad());
    }

    model
        .forward(&Tensor::randn_seeded([3, 2, 4, 4], 9))
        .unwrap();
    let before: Vec<Vec<f64>> = model.named_buffers().iter().map(|(_, b)| get(b)).collect();
    model.to_device(Device::Cpu).unwrap();
    let after: Vec<Vec<f64>> = model.named_buffers().iter().map(|(_, b)| get(b)).collect();
    assert_eq!(before, after);
    for (_, b) in model.named_buffers() {
        assert_eq!(b.device(), Device::Cpu);
        assert!(b.is_realized());
    }
    // An optimizer step on every parameter leaves the buffers alone.
    let x = Tensor::randn_seeded([3, 2, 4, 4], 10);
    let loss = model.forward(&x).unwrap().sum(..);
    let stats: Vec<Vec<f64>> = model.named_buffers().iter().map(|(_, b)| get(b)).collect();
    loss.backward().unwrap();
    Sgd::new(model.parameters(), 0.1).unwrap().step().unwrap();
    let now: Vec<Vec<f64>> = model.named_buffers().iter().map(|(_, b)| get(b)).collect();
    assert_eq!(stats, now);
}

#[test]
fn checkpoint_round_trip_restores_running_stats() {
    let dir = TempDir::new("ckpt");
    let path = dir.0.join("model.safetensors");
    let model = conv_model(0);
    for step in 0..2 {
        model
            .forward(&Tensor::randn_seeded([3, 2, 4, 4], 20 + step))
            .unwrap();
    }
    kiln::safetensors::save_state_dict(&model, &path).unwrap();
    // The file holds the buffers under their names.
    let names: Vec<String> = kiln::safetensors::load(&path)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for b in [
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
        "4.running_var",
    ] {
        assert!(names.iter().any(|n| n == b), "{b} missing from {names:?}");
    }

    let mut fresh = conv_model(7);
    kiln::safetensors::load_state_dict(&fresh, &path).unwrap();
    for ((na, a), (nb, b)) in model.state_dict().iter().zip(fresh.state_dict().iter()) {
        assert_eq!(na, nb);
        assert_eq!(a.dtype(), b.dtype(), "{na}");
        assert_eq!(get(a), get(b), "{na}");
    }
    let nbt = fresh
        .named_buffers()
        .into_iter()
        .find(|(n, _)| n == "1.num_batches_tracked")
        .unwrap()
        .1;
    assert_eq!(nbt.item::<i64>().unwrap(), 2);
    // The loaded model evaluates as the saved one does.
    let x = Tensor::randn_seeded([2, 2, 4, 4], 30);
    let mut model = model;
    model.set_training(false);
    fresh.set_training(false);
    assert_eq!(
        get(&model.forward(&x).unwrap()),
        get(&fresh.forward(&x).unwrap())
    );

    // The same through bytes, and the generic `load_into` with the state list.
    let bytes = kiln::safetensors::save_state_dict_to_bytes(&model).unwrap();
    let other = conv_model(8);
    kiln::safetensors::load_into_from_bytes(&other.state_dict(), &bytes).unwrap();
    assert_eq!(get(&other.state_dict()[9].1), get(&model.state_dict()[9].1));

    // A model whose BatchNorm differs: every mismatch at once, buffers included.
    let wrong = Sequential::new()
        .push(Conv2d::new(2, 4, 3, 0).unwrap())
        .push(BatchNorm2d::new(5).unwrap());
    let e = expect_err(
        kiln::safetensors::load_state_dict_from_bytes(&wrong, &bytes),
        "load_into",
        &[
            "shape mismatch for \"1.weight\"",
            "shape mismatch for \"1.running_mean\"",
            "shape mismatch for \"1.running_var\"",
            "unexpected in file: \"4.running_mean\"",
        ],
    );
    assert!(matches!(e, KilnError::InvalidArgument { .. }));
    // A model without buffers misses them.
    let plain = Sequential::new().push(Conv2d::new(2, 4, 3, 0).unwrap());
    expect_err(
        kiln::safetensors::load_state_dict_from_bytes(&plain, &bytes),
        "load_into",
        &["unexpected in file: \"1.num_batches_tracked\""],
    );
}

// ---------------------------------------------------------------------------------------
// group_norm, instance_norm, rms_norm
// ---------------------------------------------------------------------------------------

#[test]
fn group_norm_matches_loop() {
    for seed in 0..4u64 {
        let dims = 2 + (seed as usize % 3);
        let mut s = shape(dims, 2, 4, seed + 20);
        let groups = 1 + seed as usize % 3;
        s[1] = groups * (1 + seed as usize % 2);
        let c = s[1];
        let data = values(numel(&s), seed + 1, -2.0, 3.0);
        let perm: Vec<usize> = (0..dims).rev().collect();
        let x = permuted(&data, &s, &perm);
        let (w, b) = (
            values(c, seed + 5, 0.5, 2.0),
            values(c, seed + 6, -1.0, 1.0),
        );
        let y = F::group_norm(
            &x,
            groups,
            Some(&Tensor::from_vec(w.clone(), [c])),
            Some(&Tensor::from_vec(b.clone(), [c])),
            1e-5,
        )
        .unwrap();
        let per = c / groups;
        let group = |i: usize| {
            let idx = unravel(i, &s);
            idx[0] * groups + idx[1] / per
        };
        let (mean, var) = group_stats(&data, s[0] * groups, group);
        let want: Vec<f64> = data
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let k = unravel(i, &s)[1];
                (v - mean[group(i)]) / (var[group(i)] + 1e-5).sqrt() * w[k] + b[k]
            })
            .collect();
        assert_close(&get(&y), &want, 1e-10, "group_norm");
    }
    // The module: weight 1, bias 0; mode does not matter.
    let mut gn = GroupNorm::new(2, 4).unwrap();
    let x = Tensor::from_vec(vec![1.0f32, 3.0, 5.0, 7.0], [1, 4]);
    let y1 = get(&gn.forward(&x).unwrap());
    gn.set_training(false);
    assert_eq!(get(&gn.forward(&x).unwrap()), y1);
    assert_close(&y1, &[-1.0, 1.0, -1.0, 1.0], 1e-4, "GroupNorm by hand");
    assert_eq!(gn.parameters().len(), 2);
    assert!(gn.named_buffers().is_empty());
    assert!(
        GroupNorm::with_options(2, 4, 1e-5, false)
            .unwrap()
            .parameters()
            .is_empty()
    );
    expect_err(
        GroupNorm::new(3, 4),
        "GroupNorm",
        &["4 channels", "3 groups"],
    );
    expect_err(
        GroupNorm::new(2, 4).unwrap().forward(&Tensor::ones([2, 6])),
        "GroupNorm",
        &["4 channels"],
    );
    expect_err(
        F::group_norm(&Tensor::ones([2, 6]), 4, None, None, 1e-5),
        "group_norm",
        &["6 channels"],
    );
    expect_err(
        F::group_norm(&Tensor::ones([2, 6]), 0, None, None, 1e-5),
        "group_norm",
        &["0 groups"],
    );
    expect_err(
        F::group_norm(
            &Tensor::ones([2, 6]),
            2,
            Some(&Tensor::ones([4])),
            None,
            1e-5,
        ),
        "group_norm",
        &["weight", "[6]"],
    );
}

#[test]
fn instance_norm_matches_loop() {
    for seed in 0..3u64 {
        let dims = 3 + (seed as usize % 2);
        let s = shape(dims, 2, 4, seed + 30);
        let c = s[1];
        let data = values(numel(&s), seed + 2, -2.0, 2.0);
        let perm: Vec<usize> = (0..dims).rev().collect();
        let x = permuted(&data, &s, &perm);
        let w = values(c, seed + 7, 0.5, 2.0);
        let y = F::instance_norm(&x, Some(&Tensor::from_vec(w.clone(), [c])), None, 1e-5).unwrap();
        let group = |i: usize| {
            let idx = unravel(i, &s);
            idx[0] * c + idx[1]
        };
        let (mean, var) = group_stats(&data, s[0] * c, group);
        let want: Vec<f64> = data
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                (v - mean[group(i)]) / (var[group(i)] + 1e-5).sqrt() * w[unravel(i, &s)[1]]
            })
            .collect();
        assert_close(&get(&y), &want, 1e-10, "instance_norm");
    }
    // Modules: batched and unbatched agree; no parameters by default.
    let norm = InstanceNorm2d::new(2).unwrap();
    assert!(norm.parameters().is_empty());
    let x = Tensor::randn_seeded([2, 3, 3], 4);
    let unbatched = get(&norm.forward(&x).unwrap());
    let batched = get(&norm.forward(&x.unsqueeze(0)).unwrap());
    assert_eq!(unbatched, batched);
    assert_eq!(
        InstanceNorm1d::with_options(3, 1e-5, true, false)
            .unwrap()
            .parameters()
            .len(),
        2
    );
    expect_err(
        InstanceNorm1d::with_options(3, 1e-5, false, true),
        "InstanceNorm1d",
        &["track_running_stats"],
    );
    expect_err(
        F::instance_norm(&Tensor::ones([2, 3, 1]), None, None, 1e-5),
        "instance_norm",
        &["more than 1 spatial element"],
    );
    expect_err(
        InstanceNorm2d::new(2)
            .unwrap()
            .forward(&Tensor::ones([2, 3])),
        "InstanceNorm2d",
        &["4-d", "2-d"],
    );
}

#[test]
fn rms_norm_matches_loop_and_machine_epsilon() {
    let s = [3usize, 4, 5];
    let data = values(60, 3, -2.0, 2.0);
    let x = permuted(&data, &s, &[2, 0, 1]);
    let w = values(20, 4, 0.5, 1.5);
    let y = F::rms_norm(
        &x,
        &[4, 5],
        Some(&Tensor::from_vec(w.clone(), [4, 5])),
        Some(1e-3),
    )
    .unwrap();
    let want: Vec<f64> = data
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let row = &data[i / 20 * 20..i / 20 * 20 + 20];
            let ms = row.iter().map(|a| a * a).sum::<f64>() / 20.0;
            v / (ms + 1e-3).sqrt() * w[i % 20]
        })
        .collect();
    assert_close(&get(&y), &want, 1e-12, "rms_norm");

    // eps None is torch.finfo(dtype).eps: it matters for tiny inputs.
    let tiny = [1e-4f64, 0.0];
    let ms = 0.5e-8;
    let x32 = Tensor::from_vec(vec![1e-4f32, 0.0], [2]);
    let got = get(&F::rms_norm(&x32, &[2], None, None).unwrap())[0];
    let want = 1e-4 / (ms + f64::from(f32::EPSILON)).sqrt();
    assert!((got - want).abs() < 1e-5 * want, "{got} vs {want}");
    let x64 = Tensor::from_vec(tiny.to_vec(), [2]);
    let got = get(&F::rms_norm(&x64, &[2], None, None).unwrap())[0];
    let want = 1e-4 / (ms + f64::EPSILON).sqrt();
    assert!((got - want).abs() < 1e-12 * want, "{got} vs {want}");
    // The module.
    let norm = RmsNorm::new(&[2]).unwrap();
    assert_eq!(get(&norm.forward(&x64).unwrap())[0], got);
    assert!(
        RmsNorm::with_options(&[2], Some(1e-6), false)
            .unwrap()
            .parameters()
            .is_empty()
    );
    expect_err(
        F::rms_norm(&x64, &[3], None, None),
        "rms_norm",
        &["trailing"],
    );
    expect_err(
        F::rms_norm(&x64, &[2], Some(&Tensor::ones([3])), None),
        "rms_norm",
        &["weight"],
    );
}

// ---------------------------------------------------------------------------------------
// normalize, cosine_similarity, pairwise_distance
// ---------------------------------------------------------------------------------------

fn pnorm(v: &[f64], p: f64) -> f64 {
    if p.is_infinite() {
        v.iter().fold(0.0, |m, a| m.max(a.abs()))
    } else {
        v.iter().map(|a| a.abs().powf(p)).sum::<f64>().powf(1.0 / p)
    }
}

/// The vectors of `data` (shape `s`) along `dim`, and their flat positions.
fn lines(s: &[usize], dim: usize) -> Vec<Vec<usize>> {
    let mut out = vec![];
    for i in 0..numel(s) {
        let idx = unravel(i, s);
        if idx[dim] != 0 {
            continue;
        }
        out.push(
            (0..s[dim])
                .map(|k| {
                    let mut j = idx.clone();
                    j[dim] = k;
                    ravel(&j, s)
                })
                .collect(),
        );
    }
    out
}

#[test]
fn normalize_matches_loop() {
    let s = [3usize, 4, 2];
    let mut data = values(24, 8, -2.0, 2.0);
    // One zero vector along dim 1, and one smaller than eps.
    for k in 0..4 {
        data[ravel(&[1, k, 0], &s)] = 0.0;
        data[ravel(&[2, k, 1], &s)] = 1e-4;
    }
    let x = permuted(&data, &s, &[1, 2, 0]);
    for p in [2.0, 1.0, 3.0, f64::INFINITY] {
        let eps = 1e-2;
        let y = get(&F::normalize(&x, p, 1, eps).unwrap());
        let mut want = vec![0.0; 24];
        for line in lines(&s, 1) {
            let v: Vec<f64> = line.iter().map(|&i| data[i]).collect();
            let n = pnorm(&v, p).max(eps);
            for &i in &line {
                want[i] = data[i] / n;
            }
        }
        assert_close(&y, &want, 1e-12, &format!("normalize p={p}"));
        assert_eq!(y[ravel(&[1, 0, 0], &s)], 0.0);
        assert_close(
            &[y[ravel(&[2, 0, 1], &s)]],
            &[1e-2],
            1e-12,
            "below eps: x / eps",
        );
    }
    // Negative dims count from the end; a bad dim or p is refused.
    assert_eq!(
        get(&F::normalize(&x, 2.0, -2, 1e-12).unwrap()),
        get(&F::normalize(&x, 2.0, 1, 1e-12).unwrap())
    );
    expect_err(F::normalize(&x, 2.0, 3, 1e-12), "normalize", &["axis 3"]);
    expect_err(F::normalize(&x, -1.0, 1, 1e-12), "normalize", &["p"]);
    // A zero vector has a finite (zero) gradient.
    let z = Tensor::zeros([2, 3]).requires_grad_(true);
    F::normalize(&z, 2.0, 1, 1e-12)
        .unwrap()
        .sum(..)
        .backward()
        .unwrap();
    assert!(get(&z.grad().unwrap()).iter().all(|g| g.is_finite()));
}

#[test]
fn cosine_similarity_matches_loop_and_broadcasts() {
    let (sa, sb) = ([4usize, 1, 5], [3usize, 5]);
    let a = values(20, 11, -1.0, 1.0);
    let b = values(15, 12, -1.0, 1.0);
    let x1 = permuted(&a, &sa, &[2, 1, 0]);
    let x2 = permuted(&b, &sb, &[1, 0]);
    let y = F::cosine_similarity(&x1, &x2, -1, 1e-8).unwrap();
    assert_eq!(y.shape(), &[4, 3]);
    let got = get(&y);
    for i in 0..4 {
        for j in 0..3 {
            let u = &a[i * 5..i * 5 + 5];
            let v = &b[j * 5..j * 5 + 5];
            let dot: f64 = u.iter().zip(v).map(|(p, q)| p * q).sum();
            let want = dot / (pnorm(u, 2.0).max(1e-8) * pnorm(v, 2.0).max(1e-8));
            assert!((got[i * 3 + j] - want).abs() < 1e-12, "[{i},{j}]");
        }
    }
    // Each norm is bounded separately (PyTorch's current formula): a tiny x1 against a
    // long x2 gives 1e-9·100 / (1e-8·100) = 0.1, where the older max(‖x1‖·‖x2‖, eps)
    // would give 1.
    let tiny = Tensor::from_vec(vec![1e-9f64, 0.0], [1, 2]);
    let long = Tensor::from_vec(vec![100.0f64, 0.0], [1, 2]);
    let s = F::cosine_similarity(&tiny, &long, 1, 1e-8)
        .unwrap()
        .item::<f64>()
        .unwrap();
    assert!((s - 0.1).abs() < 1e-12, "{s}");
    // Zero vectors: 0, with finite gradients.
    let z = Tensor::zeros([2, 3]).requires_grad_(true);
    let o = Tensor::ones([2, 3]).requires_grad_(true);
    let s = F::cosine_similarity(&z, &o, 1, 1e-8).unwrap();
    assert_eq!(get(&s), vec![0.0, 0.0]);
    s.sum(..).backward().unwrap();
    assert!(get(&z.grad().unwrap()).iter().all(|g| g.is_finite()));
    // Parallel and opposite vectors by hand.
    let p = Tensor::from_vec(vec![1.0f32, 2.0, -2.0, -4.0], [2, 2]);
    let q = Tensor::from_vec(vec![2.0f32, 4.0], [2]);
    assert_close(
        &get(&F::cosine_similarity(&p, &q, 1, 1e-8).unwrap()),
        &[1.0, -1.0],
        1e-6,
        "by hand",
    );
    expect_err(
        F::cosine_similarity(&p, &Tensor::ones([3]), 1, 1e-8),
        "cosine_similarity",
        &["[2, 2]", "[3]"],
    );
}

#[test]
fn pairwise_distance_matches_loop() {
    let (sa, sb) = ([3usize, 4], [4usize]);
    let a = values(12, 13, -1.0, 1.0);
    let b = values(4, 14, -1.0, 1.0);
    let x1 = permuted(&a, &sa, &[1, 0]);
    let x2 = Tensor::from_vec(b.clone(), sb);
    for p in [2.0, 1.0, 0.5, f64::INFINITY] {
        let eps = 1e-6;
        let d = F::pairwise_distance(&x1, &x2, p, eps, false).unwrap();
        assert_eq!(d.shape(), &[3]);
        let want: Vec<f64> = (0..3)
            .map(|i| {
                let diff: Vec<f64> = (0..4).map(|k| a[i * 4 + k] - b[k] + eps).collect();
                pnorm(&diff, p)
            })
            .collect();
        assert_close(&get(&d), &want, 1e-12, &format!("pairwise_distance p={p}"));
        let kept = F::pairwise_distance(&x1, &x2, p, eps, true).unwrap();
        assert_eq!(kept.shape(), &[3, 1]);
        assert_eq!(get(&kept), get(&d));
    }
    // Equal inputs are eps apart in every coordinate: ‖eps·1‖₂ = eps·√D.
    let x = Tensor::randn_seeded([2, 9], 5).cast(DType::F64);
    let d = get(&F::pairwise_distance(&x, &x, 2.0, 1e-6, false).unwrap());
    assert_close(&d, &[3e-6, 3e-6], 1e-9, "equal inputs");
    // With eps 0 the distance of equal inputs is 0, with a finite gradient.
    let y = Tensor::ones([2, 3]).requires_grad_(true);
    let z = Tensor::ones([2, 3]);
    let d = F::pairwise_distance(&y, &z, 2.0, 0.0, false).unwrap();
    assert_eq!(get(&d), vec![0.0, 0.0]);
    d.sum(..).backward().unwrap();
    assert!(get(&y.grad().unwrap()).iter().all(|g| g.is_finite()));
    expect_err(
        F::pairwise_distance(&x, &Tensor::ones([3]), 2.0, 1e-6, false),
        "pairwise_distance",
        &["[2, 9]"],
    );
    expect_err(
        F::pairwise_distance(
            &Tensor::scalar(1.0f32),
            &Tensor::scalar(2.0f32),
            2.0,
            1e-6,
            false,
        ),
        "pairwise_distance",
        &["axis -1"],
    );
}
