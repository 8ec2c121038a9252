//! In-place updates and host slices across threads: a pending update realized from several
//! threads at once runs once, and a slice never sees a buffer half written.

use kiln::{KilnError, Tensor};
use std::sync::{Arc, Barrier};

/// Elements per tensor: enough that a kernel runs long enough for threads to overlap.
const N: usize = 1 << 18;

#[test]
fn one_pending_update_realized_from_many_threads_at_once_runs_once() {
    let x = Tensor::from_vec(vec![0.0f32; N], [N]);
    let threads = 4;
    let rounds = 30;
    for round in 1..=rounds {
        x.add_(1.0);
        let start = Arc::new(Barrier::new(threads));
        std::thread::scope(|s| {
            for _ in 0..threads {
                let (x, start) = (x.clone(), Arc::clone(&start));
                s.spawn(move || {
                    start.wait();
                    x.realize().unwrap();
                });
            }
        });
        let v = x.as_slice::<f32>().unwrap();
        let wrong = v.iter().position(|&e| e != round as f32);
        assert_eq!(
            wrong,
            None,
            "round {round}: element {:?} holds {:?}",
            wrong,
            wrong.map(|i| v[i])
        );
    }
}

#[test]
fn a_slice_taken_while_updates_run_on_another_thread_is_never_half_written() {
    let x = Tensor::from_vec(vec![0.0f32; N], [N]);
    // `detach` of a realized `x` shares the buffer without a pending update of its own,
    // so its slice is taken at once, whatever the writer is doing (`x.as_slice()` would
    // realize the pending update itself first). A write that has started since the
    // alias was made has replaced its value: that slice is refused (`Overwritten`), never
    // handed out half written.
    let updates = 40;
    let done = std::sync::atomic::AtomicBool::new(false);
    let seen = std::thread::scope(|s| {
        let writer = {
            let (x, done) = (x.clone(), &done);
            s.spawn(move || {
                let mut applied = 0;
                while applied < updates {
                    // Refused while the reader holds a slice (at recording or at the run):
                    // both are typed errors, and the value is then unchanged.
                    match x.try_add_(1.0) {
                        Ok(_) => {}
                        Err(KilnError::Borrowed { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    }
                    loop {
                        match x.realize() {
                            Ok(()) => break,
                            Err(KilnError::Borrowed { .. }) => std::thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    applied += 1;
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            })
        };
        let mut seen = 0;
        loop {
            let finished = done.load(std::sync::atomic::Ordering::Acquire);
            let v = match x.detach().as_slice::<f32>() {
                Ok(v) => v,
                Err(KilnError::Overwritten { .. }) => continue,
                Err(e) => panic!("{e}"),
            };
            let first = v[0];
            assert!(
                v.iter().all(|&e| e == first),
                "a slice saw a half-written update: {first} at 0, {:?} elsewhere",
                v.iter().find(|&&e| e != first)
            );
            drop(v);
            seen += 1;
            if finished {
                break;
            }
            std::thread::yield_now();
        }
        writer.join().unwrap();
        seen
    });
    assert!(seen > 0);
    let v = x.to_vec::<f32>().unwrap();
    assert!(
        v.iter().all(|&e| e == updates as f32),
        "{} vs {updates}",
        v[0]
    );
}

#[test]
fn updates_recorded_on_several_threads_at_once_all_apply() {
    // Each thread records `z += 1` and `x += z * 0` and realizes `x`, over and over: the
    // records interleave, realizes of one tensor overlap, and every update must land once
    // (recorded against the value it follows, never lost or planned in a cycle).
    let x = Tensor::from_vec(vec![0.0f32; N], [N]);
    let z = Tensor::from_vec(vec![0.0f32; N], [N]);
    let (threads, rounds) = (4, 50);
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (x, z) = (&x, &z);
            s.spawn(move || {
                for _ in 0..rounds {
                    z.add_(1.0);
                    x.add_(z * 0.0 + 1.0);
                    x.realize().unwrap();
                }
            });
        }
    });
    let total = (threads * rounds) as f32;
    for (name, t) in [("x", &x), ("z", &z)] {
        let v = t.to_vec::<f32>().unwrap();
        assert!(v.iter().all(|&e| e == total), "{name}: {} vs {total}", v[0]);
    }
}

#[test]
fn reads_from_rayons_global_pool_while_another_thread_updates_in_place_all_finish() {
    // Jobs on rayon's global pool take slices and realize readers of `x` while a plain
    // thread updates `x` in place. If kiln's kernels ran on that pool, a kernel waiting for
    // its parallel half could pick up one of these jobs, which waits for the buffer the
    // kernel's own realize holds: a hang. The watchdog turns a hang into a failure.
    use rayon::prelude::*;
    let (sender, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let x = Tensor::from_vec(vec![0.0f32; N], [N]);
        std::thread::scope(|s| {
            let writer = s.spawn(|| {
                for _ in 0..30 {
                    while x.try_add_(1.0).is_err() {}
                    while x.realize().is_err() {}
                }
            });
            (0..256).into_par_iter().for_each(|i| {
                if i % 2 == 0 {
                    // A slice of an alias of `x` as realized now: refused once a write
                    // has replaced that value, never half written.
                    match x.detach().as_slice::<f32>() {
                        Ok(v) => assert!(v.iter().all(|&e| e == v[0]), "a half-written buffer"),
                        Err(KilnError::Borrowed { .. } | KilnError::Overwritten { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                } else {
                    // Realizes `x`'s pending update too, which a live slice refuses; and a
                    // detached alias of a realized `x` reads a value the writer may have
                    // overwritten by the time this realizes (refused, as on one thread).
                    match (&x.detach() * 2.0).sum(..).item::<f32>() {
                        Ok(s) => assert!(s >= 0.0),
                        Err(KilnError::Borrowed { .. } | KilnError::Overwritten { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            });
            writer.join().unwrap();
        });
        sender.send(x.to_vec::<f32>().unwrap()).ok();
    });
    let v = finished
        .recv_timeout(std::time::Duration::from_secs(300))
        .expect("the threads did not finish within 300 s: a deadlock");
    assert!(v.iter().all(|&e| e == 30.0));
}

#[test]
fn updates_recorded_from_rayons_global_pool_while_their_tensor_installs_all_finish() {
    // Jobs on rayon's global pool record `x += 1` while a plain thread keeps realizing `x`.
    // An update that finds `x`'s realize installing waits for it; that wait runs other
    // queued jobs on a rayon worker, and one of them records an update too. Waiting with
    // the graph locked, that job locked it again on the same thread: a hang, which the
    // watchdog turns into a failure. Every update lands exactly once.
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const BIG: usize = 1 << 20;
    let (sender, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let x = Tensor::from_vec(vec![0.0f32; BIG], [BIG]);
        x.realize().unwrap();
        let (adds, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    x.add_(1.0);
                    adds.fetch_add(1, Ordering::Relaxed);
                    x.realize().unwrap();
                }
            });
            (0..500).into_par_iter().for_each(|_| {
                x.add_(1.0);
                adds.fetch_add(1, Ordering::Relaxed);
            });
            stop.store(true, Ordering::Relaxed);
        });
        let v = x.to_vec::<f32>().unwrap();
        sender.send((v, adds.load(Ordering::Relaxed))).ok();
    });
    let (v, adds) = finished
        .recv_timeout(std::time::Duration::from_secs(300))
        .expect("the threads did not finish within 300 s: a deadlock");
    assert!(adds >= 500);
    assert!(
        v.iter().all(|&e| e == adds as f32),
        "{} after {adds} updates",
        v[0]
    );
}
