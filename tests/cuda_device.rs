//! Devices: transfers are planned like any op, mixing devices is an error, a missing GPU is
//! a readable error (never a panic). When a GPU is present, expressions run on CUDA and are
//! compared against the CPU backend; otherwise those tests print why they are skipped.

use kiln::kernel::Step;
use kiln::{DType, Device, KilnError, RealizeOptions, Tensor, memory};

fn cpu_input(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let t = Tensor::try_randn(shape, seed, DType::F32)
        .unwrap()
        .cast(dtype);
    t.realize().unwrap();
    t
}

#[test]
fn availability_is_reported_without_panicking() {
    let available = Device::cuda_is_available();
    let reason = kiln::backend::cuda::availability();
    assert_eq!(available, reason.is_ok());
    if let Err(why) = reason {
        assert!(!why.is_empty());
        assert_eq!(Device::cuda_device_count(), 0);
    }
}

#[test]
fn transfers_are_planned_steps() {
    let x = cpu_input(&[8, 8], 1, DType::F32);
    let g = (x.to(Device::Cuda(0)) * 2.0).exp();
    assert_eq!(g.device(), Device::Cuda(0));
    let back = g.to(Device::Cpu);
    let plan = back.plan(&RealizeOptions::default()).unwrap();
    let transfers: Vec<_> = plan
        .steps()
        .iter()
        .filter_map(|s| match s {
            Step::Transfer { to, bytes, .. } => Some((*to, *bytes)),
            _ => None,
        })
        .collect();
    assert_eq!(transfers, vec![(Device::Cuda(0), 256), (Device::Cpu, 256)]);
    assert_eq!(plan.kernel_count(), 1, "mul and exp fuse on the device");
    let text = plan.dump_text();
    assert!(
        text.contains("transfer") && text.contains("cuda:0"),
        "{text}"
    );
}

#[test]
fn mixing_devices_is_a_typed_error() {
    let x = cpu_input(&[4], 2, DType::F32);
    let g = x.to(Device::Cuda(0));
    match x.try_add(&g) {
        Err(KilnError::DeviceMismatch { op, lhs, rhs }) => {
            assert_eq!((op, lhs, rhs), ("add", Device::Cpu, Device::Cuda(0)));
        }
        other => panic!("expected DeviceMismatch, got {other:?}"),
    }
    assert!(matches!(
        x.try_matmul(&g),
        Err(KilnError::DeviceMismatch { .. })
    ));
    let msg = x.try_add(&g).unwrap_err().to_string();
    assert!(msg.contains("cpu") && msg.contains("cuda:0"), "{msg}");
}

#[test]
fn realizing_without_a_gpu_is_an_error_not_a_panic() {
    if Device::cuda_is_available() {
        eprintln!("a GPU is present: the no-GPU error path is not exercised here");
        return;
    }
    let x = cpu_input(&[4], 3, DType::F32);
    let g = x.to(Device::Cuda(0)) + 1.0;
    match g.realize() {
        Err(KilnError::DeviceUnavailable { device, reason }) => {
            assert_eq!(device, "cuda:0");
            assert!(!reason.is_empty());
        }
        other => panic!("expected DeviceUnavailable, got {other:?}"),
    }
    assert!(g.try_to(Device::Cpu).unwrap().to_vec::<f32>().is_err());
}

/// Expressions covering elementwise chains, views, every dtype, reductions in both
/// directions, persistent reductions, generators and matmuls.
fn corpus(dev: Device) -> Vec<(String, Tensor)> {
    let mut out = vec![];
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let x = cpu_input(&[64, 96], 10, dt).to(dev);
        let y = cpu_input(&[96], 11, dt).to(dev);
        out.push((
            format!("chain {dt}"),
            ((&x * 1.5 + &y).tanh() * &x - 0.25).exp(),
        ));
        out.push((format!("softmax {dt}"), x.softmax(-1)));
        out.push((format!("softmax axis0 {dt}"), x.softmax(0)));
        out.push((
            format!("layer_norm {dt}"),
            x.layer_norm(&[96], Some(&y), None, 1e-5),
        ));
        out.push((format!("row sum {dt}"), (&x * &x).sum(1)));
        out.push((format!("col max {dt}"), x.max_keepdim(0)));
        out.push((format!("argmax {dt}"), x.argmax(1)));
        out.push((
            format!("views {dt}"),
            x.t()
                .flip([0])
                .slice(&[(1, 90, 2)])
                .pad(&[(2, 1)], 0.5)
                .gelu(),
        ));
        out.push((format!("matmul {dt}"), (x.matmul(&x.t()) + 1.0).relu()));
        out.push((
            format!("batched matmul {dt}"),
            x.reshape([4, 16, 96]).matmul(&x.t()),
        ));
    }
    for dt in [DType::I32, DType::I64, DType::U8, DType::Bool] {
        let a = Tensor::from_vec((0..256).map(|v| (v * 37 % 101) as i64).collect(), [16, 16])
            .cast(dt)
            .to(dev);
        out.push((
            format!("int ops {dt}"),
            (&a + &a.t()).maximum(&a).cast(DType::I64).sum(0),
        ));
        out.push((format!("compare {dt}"), a.gt(a.t()).cast(DType::I32)));
        if dt != DType::Bool {
            out.push((format!("int matmul {dt}"), a.matmul(&a)));
        }
    }
    out.push((
        "rand".into(),
        Tensor::try_full_on([4], 0.0, DType::F32, dev).unwrap()
            + Tensor::rand_seeded([4], 5).to(dev),
    ));
    out
}

#[test]
fn gpu_results_match_the_cpu_backend() {
    if let Err(why) = kiln::backend::cuda::availability() {
        eprintln!("skipping GPU differential tests: {why}");
        return;
    }
    let gpu = corpus(Device::Cuda(0));
    let cpu = corpus(Device::Cpu);
    for ((name, g), (_, c)) in gpu.iter().zip(&cpu) {
        let (g, c) = (g.to(Device::Cpu).cast(DType::F64), c.cast(DType::F64));
        let (gv, cv) = (g.to_vec::<f64>().unwrap(), c.to_vec::<f64>().unwrap());
        assert_eq!(gv.len(), cv.len(), "{name}");
        let tol = match name.rsplit(' ').next() {
            Some("f16") => 2e-2,
            Some("bf16") => 5e-2,
            Some("f64") => 1e-9,
            _ => 1e-4,
        };
        for (i, (a, b)) in gv.iter().zip(&cv).enumerate() {
            let ok = (a - b).abs() <= tol * (1.0 + b.abs()) || (a.is_nan() && b.is_nan());
            assert!(ok, "{name}: element {i}: gpu {a} vs cpu {b}");
        }
    }
}

/// Reductions large enough for the CUDA renderer's other layouts: full reductions and
/// short-row reductions split over many blocks (partials combined by the last block), column
/// reductions by blocks of 32 adjacent columns, and both at once.
fn large_reductions(dev: Device) -> Vec<(String, Tensor)> {
    let x = cpu_input(&[1 << 20], 30, DType::F32).to(dev);
    let h = cpu_input(&[1 << 20], 31, DType::F16).to(dev);
    let b = cpu_input(&[1 << 20], 32, DType::BF16).to(dev);
    let cols = cpu_input(&[4096, 300], 33, DType::F32).to(dev);
    let tall = cpu_input(&[70000, 40], 34, DType::F32).to(dev);
    let wide = cpu_input(&[8, 200000], 35, DType::F32).to(dev);
    let cube = cpu_input(&[64, 300, 64], 36, DType::F32).to(dev);
    // Many ties (the first wins) and NaNs (the first NaN wins).
    let ties = (&x * 2.0).round().clamp(-3.0, 3.0);
    let nans = x.masked_fill(&x.gt(3.5), f32::NAN);
    let col_ties = (&tall * 2.0).round().clamp(-3.0, 3.0);
    vec![
        ("sum all f32".into(), x.sum(..)),
        ("sum of squares all f32".into(), (&x * &x).sum(..)),
        ("sum all f16".into(), h.sum(..)),
        ("mean all bf16".into(), b.mean(..)),
        ("max all f32".into(), x.amax(..)),
        ("var all f32".into(), x.var(.., 1)),
        ("arg max ties".into(), ties.argmax(..).cast(DType::F32)),
        ("arg min ties".into(), ties.argmin(..).cast(DType::F32)),
        ("arg max nan".into(), nans.argmax(..).cast(DType::F32)),
        ("column sum f32".into(), cols.sum(0)),
        ("column max f32".into(), tall.amax(0)),
        (
            "arg column max ties".into(),
            col_ties.argmax(0).cast(DType::F32),
        ),
        ("column softmax f32".into(), cols.softmax(0)),
        (
            "column mean then scale f32".into(),
            tall.mean_keepdim(0) * 3.0 + 1.0,
        ),
        ("short rows sum f32".into(), wide.sum(1)),
        ("outer axes sum f32".into(), cube.sum([0, 2])),
        ("inner axis sum f32".into(), cube.sum(2)),
    ]
}

#[test]
fn large_reductions_match_the_cpu_backend_and_repeat_exactly() {
    if let Err(why) = kiln::backend::cuda::availability() {
        eprintln!("skipping large GPU reductions: {why}");
        return;
    }
    let gpu = large_reductions(Device::Cuda(0));
    let repeat = large_reductions(Device::Cuda(0));
    let cpu = large_reductions(Device::Cpu);
    for (((name, g), (_, c)), (_, g2)) in gpu.iter().zip(&cpu).zip(&repeat) {
        let first = g.to(Device::Cpu).cast(DType::F64).to_vec::<f64>().unwrap();
        let cv = c.cast(DType::F64).to_vec::<f64>().unwrap();
        assert_eq!(first.len(), cv.len(), "{name}");
        // The same graph again (the split counters were reset) gives the same bits: the
        // partials are combined in a fixed order.
        let again = g2.to(Device::Cpu).cast(DType::F64).to_vec::<f64>().unwrap();
        let tol = if name.starts_with("arg") {
            0.0
        } else if name.ends_with("f16") || name.ends_with("bf16") {
            2e-2
        } else {
            1e-4
        };
        for (i, ((a, b), a2)) in first.iter().zip(&cv).zip(&again).enumerate() {
            let ok = (a - b).abs() <= tol * (1.0 + b.abs()) || (a.is_nan() && b.is_nan());
            assert!(ok, "{name}: element {i}: gpu {a} vs cpu {b}");
            assert!(
                a.to_bits() == a2.to_bits(),
                "{name}: element {i}: {a} then {a2}"
            );
        }
    }
}

#[test]
fn warm_repeated_realize_makes_no_new_device_allocations() {
    if let Err(why) = kiln::backend::cuda::availability() {
        eprintln!("skipping device allocator test: {why}");
        return;
    }
    let dev = Device::Cuda(0);
    let x = cpu_input(&[1 << 20], 20, DType::F32).to(dev);
    x.realize().unwrap();
    let run = || {
        let y = ((&x * 2.0).exp() + 1.0).sqrt();
        y.realize_with(&RealizeOptions::unfused()).unwrap();
    };
    run();
    let before = memory::stats(dev);
    for _ in 0..5 {
        run();
    }
    let after = memory::stats(dev);
    assert_eq!(
        after.device_allocs, before.device_allocs,
        "{before:?} -> {after:?}"
    );
    assert!(after.hits > before.hits);
    assert!(memory::trim(dev) > 0);
}

#[test]
fn the_gpu_corpus_is_valid_on_the_cpu() {
    // The same expressions the GPU comparison uses must plan and run here, so a GPU run
    // fails only on a real CPU/GPU difference.
    for (name, t) in corpus(Device::Cpu)
        .into_iter()
        .chain(large_reductions(Device::Cpu))
    {
        let v = t
            .cast(DType::F64)
            .to_vec::<f64>()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!v.is_empty(), "{name}");
    }
}

#[test]
fn generators_move_to_a_usable_device_without_a_transfer() {
    let r = Tensor::rand_seeded([64], 9).to(Device::Cuda(0));
    assert_eq!(r.device(), Device::Cuda(0));
    let plan = (&r * 2.0).plan(&RealizeOptions::default()).unwrap();
    let transfers = plan
        .steps()
        .iter()
        .filter(|s| matches!(s, Step::Transfer { .. }))
        .count();
    if Device::cuda_is_available() {
        assert_eq!(transfers, 0, "{}", plan.dump_text());
        assert_eq!(plan.kernel_count(), 1);
    } else {
        // Without the device, the generator is not silently computed elsewhere: the
        // tensor stays a transfer to cuda:0, and realizing it says the device is missing.
        assert_eq!(transfers, 1, "{}", plan.dump_text());
        match (&r * 2.0).to_vec::<f32>() {
            Err(KilnError::DeviceUnavailable { device, .. }) => assert_eq!(device, "cuda:0"),
            other => panic!("expected DeviceUnavailable, got {other:?}"),
        }
    }
}

#[test]
fn random_draws_match_the_cpu_bit_for_bit() {
    if let Err(why) = kiln::backend::cuda::availability() {
        eprintln!("skipping GPU random-draw comparison: {why}");
        return;
    }
    let n = 1 << 20;
    for (kind, dt) in [
        ("rand", DType::F32),
        ("rand", DType::F64),
        ("rand", DType::F16),
        ("rand", DType::BF16),
        ("randn", DType::F32),
        ("randn", DType::F16),
        ("randn", DType::BF16),
        ("randn", DType::F64),
    ] {
        let draw = |dev: Device| {
            let t = if kind == "rand" {
                Tensor::try_rand([n], 77, dt)
            } else {
                Tensor::try_randn([n], 77, dt)
            }
            .unwrap()
            .to(dev);
            t.to_bytes().unwrap()
        };
        let (g, c) = (draw(Device::Cuda(0)), draw(Device::Cpu));
        if dt == DType::F64 && kind == "randn" {
            // The platform's f64 log/cos (CUDA's within 2 ulp of the exact result): allow 8.
            let words = |b: &[u8]| -> Vec<f64> {
                b.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            };
            for (i, (a, b)) in words(&g).iter().zip(words(&c)).enumerate() {
                assert!(
                    (a - b).abs() <= 8.0 * f64::EPSILON * b.abs() + 1e-15,
                    "randn f64 element {i}: gpu {a} vs cpu {b}"
                );
            }
        } else {
            let differ = g.iter().zip(&c).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ, 0,
                "{kind} {dt}: {differ} bytes differ between GPU and CPU"
            );
        }
    }
}

#[test]
fn device_out_of_memory_is_a_typed_error_with_the_numbers() {
    if let Err(why) = kiln::backend::cuda::availability() {
        eprintln!("skipping device out-of-memory test: {why}");
        return;
    }
    let dev = Device::Cuda(0);
    // 1 TiB of f32: more than any single GPU holds, so the allocator trims, retries once
    // and reports.
    let huge = Tensor::try_full_on([1 << 38], 1.0, DType::F32, dev).unwrap();
    match (&huge + 1.0).realize() {
        Err(KilnError::OutOfMemory {
            device,
            requested,
            free,
            ..
        }) => {
            assert_eq!(device, dev.to_string());
            assert!(requested >= 4 << 38, "requested {requested}");
            assert!(free < requested);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // The device is still usable afterwards.
    let small = Tensor::try_full_on([16], 2.0, DType::F32, dev).unwrap();
    assert_eq!((&small * 2.0).to_vec::<f32>().unwrap(), vec![4.0; 16]);
}

/// Every scatter reduction (with and without `include_self`) and `scatter` on the GPU
/// against the CPU backend, in each dtype CUDA scatters, with repeated places. Integer
/// results and extremes must match exactly; float sums, products and means within
/// rounding (atomics combine in any order).
#[test]
fn scatter_reductions_match_the_cpu_backend() {
    if let Err(why) = kiln::backend::cuda::availability() {
        eprintln!("skipping GPU scatter tests: {why}");
        return;
    }
    let idx = Tensor::from_vec((0..4096).map(|k| (k * 7 % 61) as i64).collect(), [64, 64]);
    for dt in [DType::F32, DType::F64, DType::I32, DType::I64] {
        let x = cpu_input(&[80, 64], 40, DType::F32);
        let v = cpu_input(&[64, 64], 41, DType::F32);
        // Integers: small values, so products of a place's values stay far from wrapping.
        let (x, v) = if dt.is_float() {
            (x.cast(dt), v.cast(dt))
        } else {
            ((x * 1.5).round().cast(dt), v.sign().cast(dt))
        };
        let run = |dev: Device, reduce: &str, s: bool| -> Vec<f64> {
            let (x, v, i) = (x.to(dev), v.to(dev), idx.to(dev));
            let y = if reduce == "scatter" {
                x.scatter(0, &i, &v)
            } else {
                x.scatter_reduce(0, &i, &v, reduce, s)
            };
            y.to(Device::Cpu).cast(DType::F64).to_vec::<f64>().unwrap()
        };
        for reduce in ["sum", "prod", "mean", "amax", "amin", "scatter"] {
            for s in [true, false] {
                let (g, c) = (run(Device::Cuda(0), reduce, s), run(Device::Cpu, reduce, s));
                let exact = !dt.is_float() || matches!(reduce, "amax" | "amin" | "scatter");
                for (k, (a, b)) in g.iter().zip(&c).enumerate() {
                    let ok = if exact {
                        a == b || (a.is_nan() && b.is_nan())
                    } else {
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs())
                    };
                    assert!(
                        ok,
                        "{reduce} include_self={s} {dt:?} [{k}]: gpu {a} vs cpu {b}"
                    );
                }
            }
        }
    }
}
