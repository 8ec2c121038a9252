//! Dumps read at a glance: constants print as values where they are used, ops and
//! generators in kiln's own words (no Rust `Debug` text), targets marked, inputs say where
//! their data came from; the DOT form marks the same things.

use kiln::{RealizeOptions, Tensor};

fn program() -> (Tensor, Tensor) {
    let x = Tensor::randn_seeded([4, 8], 1);
    x.realize().unwrap();
    let data = Tensor::from_vec(vec![1.0f32; 8], [8]);
    let y = ((x.t() * 1.5 + 2.0).exp().sum(0) - data.sum(..) - Tensor::rand_seeded([4], 2)).relu();
    (x, y)
}

/// Rust `Debug` spellings that must not leak into a dump.
const DEBUG_TEXT: &[&str] = &[
    "Float(", "Int(", "Randn {", "Rand {", "Permute(", "Reshape(", "Expand(", "Full(",
];

#[test]
fn lazy_graph_text_reads_in_kilns_words() {
    let (_x, y) = program();
    let text = y.dump_text();
    for bad in DEBUG_TEXT {
        assert!(!text.contains(bad), "{bad} in:\n{text}");
    }
    // Constants inline, not as full-size tensors. (Elementwise ops over `x.t()` are recorded
    // on `x` and transposed after, so the permute follows them.)
    assert!(text.contains("mul(%0, 1.5)"), "{text}");
    assert!(text.contains("add(%1, 2.0)"), "{text}");
    assert!(!text.contains("= full"), "{text}");
    // Generators and movements in words.
    assert!(text.contains("rand seed 2"), "{text}");
    assert!(text.contains("permute [1, 0] (%3)"), "{text}");
    // Inputs say where they came from; the target is marked.
    assert!(text.contains("input, realized earlier as randn"), "{text}");
    assert!(text.contains("input, data from the program"), "{text}");
    let last = text.lines().last().unwrap();
    assert!(
        last.contains("relu(") && last.ends_with("<- target"),
        "{text}"
    );
    assert_eq!(text.matches("<- target").count(), 1, "{text}");
}

#[test]
fn lazy_graph_dot_marks_targets_and_inputs() {
    let (_x, y) = program();
    let dot = y.dump_dot();
    assert!(
        dot.starts_with("digraph lazy {") && dot.trim_end().ends_with('}'),
        "{dot}"
    );
    for bad in DEBUG_TEXT {
        assert!(!dot.contains(bad), "{bad} in:\n{dot}");
    }
    assert_eq!(dot.matches("peripheries=2").count(), 1, "{dot}");
    assert_eq!(dot.matches("shape=box").count(), 2, "{dot}");
    assert!(dot.contains("mul(%0, 1.5)"), "{dot}");
    // Every edge joins listed nodes.
    let nodes: Vec<&str> = dot
        .lines()
        .filter(|l| l.contains("[shape="))
        .map(|l| l.trim().split(' ').next().unwrap())
        .collect();
    for l in dot.lines().filter(|l| l.contains("->")) {
        let mut ends = l.trim().split(" -> ");
        let a = ends.next().unwrap();
        let b = ends.next().unwrap().split(' ').next().unwrap();
        assert!(nodes.contains(&a) && nodes.contains(&b), "{l}");
    }
}

#[test]
fn plan_dumps_show_parameters_as_values() {
    let (_x, y) = program();
    let plan = y.plan(&RealizeOptions::default()).unwrap();
    let text = plan.dump_text();
    assert!(text.contains("=1.5"), "{text}");
    for bad in DEBUG_TEXT {
        assert!(!text.contains(bad), "{bad} in:\n{text}");
    }
    let dot = plan.dump_dot();
    assert!(dot.starts_with("digraph"), "{dot}");
}
