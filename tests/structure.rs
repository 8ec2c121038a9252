//! The module structure: the data path reads top-down (tensor → graph → plan → kernel →
//! backend → memory) and no module imports one above it. Checked from the sources: every
//! `crate::<module>` reference outside `#[cfg(test)]` code is an edge, and the graph of
//! top-level modules must be acyclic, with the layering rules below.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn module_edges() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&root).expect("under src");
            let top = rel
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .unwrap_or_default()
                .trim_end_matches(".rs")
                .to_string();
            if top == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let mut rest = code;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != top {
                    edges.entry(top.clone()).or_default().insert(name);
                }
            }
            edges.entry(top).or_default();
        }
    }
    edges
}

fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()) {
                Some(1) => {
                    let start = path.iter().position(|x| x == m).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, edges, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if !state.contains_key(n)
            && let Some(c) = visit(n, edges, &mut state, &mut vec![])
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn modules_form_no_import_cycle() {
    let edges = module_edges();
    assert!(edges.len() > 10, "found the modules: {edges:?}");
    if let Some(c) = find_cycle(&edges) {
        panic!("import cycle: {}", c.join(" -> "));
    }
}

#[test]
fn no_module_reaches_back_up_the_data_path() {
    let edges = module_edges();
    let forbidden: &[(&str, &[&str])] = &[
        (
            "ops",
            &["graph", "plan", "kernel", "backend", "tensor", "memory"],
        ),
        (
            "math",
            &[
                "ops", "graph", "plan", "kernel", "backend", "tensor", "random",
            ],
        ),
        ("kernel", &["graph", "plan", "backend", "tensor"]),
        ("backend", &["graph", "plan", "tensor", "reference"]),
        ("plan", &["backend", "tensor"]),
        ("graph", &["plan", "kernel", "backend", "tensor"]),
        ("memory", &["graph", "plan", "kernel", "tensor"]),
        ("random", &["backend", "tensor", "plan"]),
    ];
    for (module, banned) in forbidden {
        let uses = edges.get(*module).cloned().unwrap_or_default();
        for b in *banned {
            assert!(!uses.contains(*b), "{module} imports {b}: {uses:?}");
        }
    }
}
