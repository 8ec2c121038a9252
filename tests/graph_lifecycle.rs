//! The lazy graph stays bounded: dropped handles prune nodes, realized nodes lose their
//! inputs. One test (the node count is process-wide).

use kiln::{DType, Device, Tensor, graph, memory};

fn loop_of_realizes_keeps_graph_and_memory_bounded() {
    let w = Tensor::try_randn([64, 64], 1, DType::F32).unwrap();
    w.realize().unwrap();
    let mut acc = Tensor::zeros([64]);
    acc.realize().unwrap();
    let base_nodes = graph::live_nodes();
    let mut max_nodes = 0;
    let mut max_current = 0;
    for i in 0..10_000 {
        let x = Tensor::try_rand([64], i, DType::F32).unwrap();
        let y = ((&w * 0.5).matmul(&x.unsqueeze(1)).squeeze() + &acc).tanh();
        y.realize().unwrap();
        acc = y;
        max_nodes = max_nodes.max(graph::live_nodes());
        if i > 10 {
            max_current = max_current.max(memory::stats(Device::Cpu).current_bytes);
        }
    }
    assert!(acc.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    // Bounded: the graph never grows beyond one iteration's worth of nodes.
    assert!(
        max_nodes <= base_nodes + 30,
        "graph grew to {max_nodes} nodes (base {base_nodes})"
    );
    assert!(
        max_current < 1 << 20,
        "memory in use grew to {max_current} bytes"
    );
}

fn dropping_handles_prunes_unrealized_nodes() {
    let base = graph::live_nodes();
    {
        let x = Tensor::ones([4]);
        let y = (&x + 1.0).exp();
        let _z = &y * &y;
        assert!(graph::live_nodes() >= base + 4);
    }
    assert_eq!(graph::live_nodes(), base);
}

fn realized_nodes_forget_their_inputs() {
    let x = Tensor::ones([4]);
    let y = ((&x + 1.0) * 3.0).exp();
    drop(x);
    let before = graph::live_nodes();
    y.realize().unwrap();
    assert!(graph::live_nodes() < before);
    assert_eq!(y.dump_text().lines().count(), 2, "{}", y.dump_text());
}

fn tensors_move_between_threads() {
    let x = Tensor::arange(0.0, 8.0, 1.0);
    let h = std::thread::spawn(move || (&x * 2.0).sum(..).item::<f32>().unwrap());
    assert_eq!(h.join().unwrap(), 56.0);
}

#[test]
fn graph_lifecycle() {
    dropping_handles_prunes_unrealized_nodes();
    realized_nodes_forget_their_inputs();
    tensors_move_between_threads();
    loop_of_realizes_keeps_graph_and_memory_bounded();
}
