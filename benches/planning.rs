//! Planning and replay: how planning time grows with graph size (a 1,000- and a 10,000-op
//! chain, planned without the cache), and what a realize costs when its plan is cached
//! (recording included) against when it must plan.
//!
//! `cargo bench --bench planning`.

use criterion::{Criterion, criterion_group, criterion_main};
use kiln::{RealizeOptions, Tensor};
use std::hint::black_box;
use std::time::Duration;

fn chain(x: &Tensor, n: usize) -> Tensor {
    let mut y = x.clone();
    for i in 0..n {
        y = match i % 4 {
            0 => &y * 0.999,
            1 => &y + 0.001,
            2 => y.tanh(),
            _ => y.abs(),
        };
    }
    y
}

/// 100 binary ops over 16-element tensors (the replay target of the plan-cache issue).
fn small_graph(a: &Tensor, b: &Tensor) -> Tensor {
    let mut x = a.clone();
    for i in 0..100 {
        x = if i % 2 == 0 { &x + b } else { &x * a };
    }
    x
}

fn benches(c: &mut Criterion) {
    let x = Tensor::rand_seeded([64], 1);
    x.realize().expect("input");
    let mut g = c.benchmark_group("plan_chain");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    for n in [1_000usize, 10_000] {
        let y = chain(&x, n);
        g.bench_function(format!("{n}_ops"), |b| {
            b.iter(|| black_box(y.plan(&RealizeOptions::default()).expect("plan")))
        });
    }
    g.finish();

    let (a, bb) = (Tensor::rand_seeded([16], 2), Tensor::rand_seeded([16], 3));
    a.realize().expect("input");
    bb.realize().expect("input");
    let mut g = c.benchmark_group("replay_100_ops");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    g.bench_function("record_and_realize_hit", |b| {
        b.iter(|| small_graph(&a, &bb).realize().expect("realize"))
    });
    g.bench_function("record_and_realize_miss", |b| {
        b.iter(|| {
            kiln::clear_cache();
            small_graph(&a, &bb).realize().expect("realize")
        })
    });
    g.finish();
}

criterion_group!(planning, benches);
criterion_main!(planning);
