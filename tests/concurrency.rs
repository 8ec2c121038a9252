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
    let updates = 40;
    let done = std::sync::atomic::AtomicBool::new(false);
    let applied = std::thread::scope(|s| {
        let writer = {
            let (x, done) = (x.clone(), &done);
            s.spawn(move || {
                let mut applied = 0u32;
                for _ in 0..updates {
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
                applied
            })
        };
        // `detach` shares the buffer without a pending update of its own, so its slice is
        // taken at once, whatever the writer is doing (`x.as_slice()` would realize the
        // pending update itself first).
        let d = x.detach();
        let mut seen = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            let v = d.as_slice::<f32>().unwrap();
            let first = v[0];
            assert!(
                v.iter().all(|&e| e == first),
                "a slice saw a half-written update: {first} at 0, {:?} elsewhere",
                v.iter().find(|&&e| e != first)
            );
            seen += 1;
        }
        assert!(seen > 0);
        writer.join().unwrap()
    });
    let v = x.to_vec::<f32>().unwrap();
    assert!(
        v.iter().all(|&e| e == applied as f32),
        "{} vs {applied}",
        v[0]
    );
}
