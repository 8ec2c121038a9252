//! Graph dumps, before and after planning, as readable text and as Graphviz DOT.
//!
//! Before: the lazy graph (every recorded op, movement ops included). After: the plan —
//! kernels with the ops each fused, the view (shape, strides, offset, mask) of every load,
//! the buffers with their sizes and lifetimes, and the kernel count.

use crate::dtype::Scalar;
use crate::graph::{Graph, NodeKey, Op, Origin};
use crate::kernel::{BufferRef, Step};
use crate::kernel::{IrOp, Kernel, Level};
use crate::ops::Generator;
use crate::plan::{Plan, PlanOp};
use crate::shape::{Movement, View};
use std::collections::HashMap;
use std::fmt::Write;

/// Human-readable byte count.
pub fn fmt_bytes(b: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < 3 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// One view as `shape=[..] strides=[..] offset=k [mask=[..]]`.
pub fn fmt_view(v: &View) -> String {
    let mut s = format!(
        "shape={:?} strides={:?} offset={}",
        v.shape, v.strides, v.offset
    );
    if let Some(m) = &v.mask {
        let parts: Vec<String> = m.iter().map(|(a, b)| format!("{a}..{b}")).collect();
        let _ = write!(s, " mask=[{}]", parts.join(", "));
    }
    s
}

/// A movement op in kiln's words: `permute [1, 0]`, `slice [0:4:2, :]`, `pad [(1, 1)] with 0`.
pub fn fmt_movement(m: &Movement) -> String {
    match m {
        Movement::Reshape(s) => format!("reshape {s:?}"),
        Movement::Permute(p) => format!("permute {p:?}"),
        Movement::Expand(s) => format!("expand {s:?}"),
        Movement::Slice(r) => {
            let parts: Vec<String> = r
                .iter()
                .map(|r| match r.step {
                    1 => format!("{}:{}", r.start, r.end),
                    st => format!("{}:{}:{st}", r.start, r.end),
                })
                .collect();
            format!("slice [{}]", parts.join(", "))
        }
        Movement::Pad { pads, value } => format!("pad {pads:?} with {value}"),
        Movement::Flip(a) => format!("flip {a:?}"),
    }
}

/// A generator in kiln's words: `full 1.5`, `arange 0 step 1`, `randn seed 7`.
pub fn fmt_generator(g: &Generator) -> String {
    match g {
        Generator::Full(v) => format!("full {v}"),
        Generator::Arange { start, step } => format!("arange {start} step {step}"),
        Generator::Rand { seed } => format!("rand seed {seed}"),
        Generator::Randn { seed } => format!("randn seed {seed}"),
    }
}

/// Where an input's data came from.
fn fmt_origin(o: &Origin) -> String {
    match o {
        Origin::Data => "data from the program".into(),
        Origin::Realized(op) => format!("realized earlier as {op}"),
        Origin::Recorded => "realized".into(),
    }
}

/// The nodes a dump lists, inputs first, with their printed ids. Constants (`full` nodes
/// that are not targets) are not listed: their users print the value in their place.
struct Listing {
    order: Vec<NodeKey>,
    ids: HashMap<NodeKey, usize>,
    constants: HashMap<NodeKey, Scalar>,
}

fn listing(g: &Graph, targets: &[NodeKey]) -> Listing {
    let all = g.lazy_subgraph(targets).unwrap_or_default();
    let mut constants = HashMap::new();
    let mut order = vec![];
    for k in all {
        match g.node(k).map(|n| &n.op) {
            Ok(Op::Generate(Generator::Full(v))) if !targets.contains(&k) => {
                constants.insert(k, *v);
            }
            _ => order.push(k),
        }
    }
    let ids = order.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    Listing {
        order,
        ids,
        constants,
    }
}

impl Listing {
    /// An operand as printed: `%3`, or a constant's value.
    fn operand(&self, k: &NodeKey) -> String {
        match (self.ids.get(k), self.constants.get(k)) {
            (Some(i), _) => format!("%{i}"),
            (None, Some(v)) => v.to_string(),
            (None, None) => "?".into(),
        }
    }

    /// A node's op and arguments: `mul(%1, 1.5)`, `permute [1, 0] (%0)`, `input`.
    fn describe(&self, g: &Graph, k: NodeKey) -> String {
        let Ok(n) = g.node(k) else {
            return "?".into();
        };
        let ins: Vec<String> = g
            .inputs(k)
            .unwrap_or_default()
            .iter()
            .map(|i| self.operand(i))
            .collect();
        match &n.op {
            Op::Buffer => format!("input, {}", fmt_origin(&n.origin)),
            Op::Generate(gen_) => fmt_generator(gen_),
            Op::Movement(m) => format!("{} ({})", fmt_movement(m), ins.join(", ")),
            op => format!("{}({})", op.name(), ins.join(", ")),
        }
    }
}

/// The lazy graph behind `targets` as text, one node per line, inputs first; constants
/// print as values where they are used, realized targets are marked.
pub fn graph_text(g: &Graph, targets: &[NodeKey]) -> String {
    let l = listing(g, targets);
    let mut s = format!("lazy graph: {} nodes", l.order.len());
    if !l.constants.is_empty() {
        let _ = write!(s, " (+{} constants shown inline)", l.constants.len());
    }
    s.push('\n');
    for &k in &l.order {
        let Ok(n) = g.node(k) else { continue };
        let _ = writeln!(
            s,
            "  %{} = {} : {:?} {}{}",
            l.ids[&k],
            l.describe(g, k),
            n.shape,
            n.dtype,
            if targets.contains(&k) {
                "  <- target"
            } else {
                ""
            }
        );
    }
    s
}

/// Escapes text for a DOT label.
fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The lazy graph behind `targets` as Graphviz DOT: inputs are boxes, movement ops notes,
/// targets drawn with a double outline; constants are folded into their users' labels.
pub fn graph_dot(g: &Graph, targets: &[NodeKey]) -> String {
    let l = listing(g, targets);
    let mut s = String::from("digraph lazy {\n  rankdir=TB;\n  node [fontname=monospace];\n");
    for &k in &l.order {
        let Ok(n) = g.node(k) else { continue };
        let shape = match n.op {
            Op::Buffer => "box",
            Op::Movement(_) => "note",
            _ => "ellipse",
        };
        let target = if targets.contains(&k) {
            ", peripheries=2, style=bold"
        } else {
            ""
        };
        let label = format!(
            "%{} {}\\n{:?} {}",
            l.ids[&k],
            dot_escape(&l.describe(g, k)),
            n.shape,
            n.dtype
        );
        let _ = writeln!(
            s,
            "  n{} [shape={shape}{target}, label=\"{label}\"];",
            l.ids[&k]
        );
        for (pos, i) in g.inputs(k).unwrap_or_default().iter().enumerate() {
            if let Some(src) = l.ids.get(i) {
                let _ = writeln!(s, "  n{src} -> n{} [label=\"{pos}\"];", l.ids[&k]);
            }
        }
    }
    s.push_str("}\n");
    s
}

fn buffer_name(plan: &Plan, r: BufferRef) -> String {
    match r {
        BufferRef::Input(i) => format!("input{i}"),
        BufferRef::Planned(g) => {
            let step = plan
                .schedule
                .order
                .iter()
                .position(|&x| x == g)
                .unwrap_or(g);
            format!("b{step}")
        }
    }
}

fn instr_text(k: &Kernel, i: usize, args: &[String], params: &[Scalar]) -> String {
    let ins = &k.ops[i];
    let lv = if ins.level == Level::Row { " row" } else { "" };
    let body = match &ins.op {
        IrOp::Load { arg, view, fill } => {
            let fill = if view.mask.is_some() {
                format!(" fill={fill}")
            } else {
                String::new()
            };
            format!("load {} [{}]{fill}", args[*arg], fmt_view(view))
        }
        IrOp::Generate {
            kind,
            params: p,
            view,
            ..
        } => {
            let vals: Vec<String> = p[..kind.param_count()]
                .iter()
                .map(|&slot| param_text(params, slot))
                .collect();
            format!("{}({}) [{}]", kind.name(), vals.join(", "), fmt_view(view))
        }
        IrOp::Gather {
            arg,
            view,
            stride,
            len,
            index,
            ..
        } => format!(
            "gather {} [{}] + %{index}·{stride} (index < {len})",
            args[*arg],
            fmt_view(view)
        ),
        IrOp::Const(c) => format!("const {c}"),
        IrOp::Param { slot } => format!("param {}", param_text(params, *slot)),
        IrOp::Valid { view } => format!("valid [{}]", fmt_view(view)),
        IrOp::Unary(u, a) => format!("{} %{a}", u.name()),
        IrOp::Binary(b, x, y) => format!("{} %{x}, %{y}", b.name()),
        IrOp::Where(c, x, y) => format!("where %{c}, %{x}, %{y}"),
        IrOp::Cast(a) => format!("cast %{a}"),
        IrOp::Reduce { op, src } => format!("reduce.{} %{src}", op.name()),
        IrOp::MatmulResult => "matmul".into(),
        IrOp::Store { arg, view, src } => {
            format!("store {} <- %{src} [{}]", args[*arg], fmt_view(view))
        }
    };
    format!("%{i} = {body} : {}{lv}", ins.dtype)
}

/// A parameter's value (`p3=1.5`), or its slot alone when the plan has no value for it.
fn param_text(params: &[Scalar], slot: usize) -> String {
    match params.get(slot) {
        Some(v) => format!("p{slot}={v}"),
        None => format!("p{slot}"),
    }
}

/// The plan as text: summary, buffers with lifetimes, then every kernel with its IR.
pub fn plan_text(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "plan ({}): kernels: {} ({} copies), planned peak {}",
        if plan.options.fuse {
            "fused"
        } else {
            "unfused"
        },
        plan.kernel_count(),
        plan.copy_count(),
        fmt_bytes(plan.buffers.peak_bytes)
    );
    let _ = writeln!(s, "buffers:");
    for (step, &g) in plan.schedule.order.iter().enumerate() {
        let b = &plan.buffers.buffers[g];
        let n = &plan.view_graph.nodes[b.node];
        let _ = writeln!(
            s,
            "  b{step}: {:?} {} {} — written by step {}, last read by step {}{}",
            n.shape,
            n.dtype,
            fmt_bytes(b.bytes),
            b.first,
            b.last,
            if b.kept { ", kept" } else { ", released after" }
        );
    }
    for (step, st) in plan.steps().iter().enumerate() {
        match st {
            Step::Kernel(pk) => {
                let k = &pk.kernel;
                let args: Vec<String> = pk.args.iter().map(|r| buffer_name(plan, *r)).collect();
                let kind = if k.matmul.is_some() {
                    "matmul"
                } else if k.is_copy() {
                    "copy"
                } else if !k.reduce_axes.is_empty() {
                    "reduce"
                } else {
                    "elementwise"
                };
                let _ = writeln!(
                    s,
                    "kernel {step} {} ({kind}): space {:?}{} — fuses [{}]",
                    k.name,
                    k.shape,
                    if k.reduce_axes.is_empty() {
                        String::new()
                    } else {
                        format!(" reduce axes {:?}", k.reduce_axes)
                    },
                    k.fused_ops.join(", ")
                );
                if let Some(mm) = &k.matmul {
                    let _ = writeln!(
                        s,
                        "    gemm {} [{}] @ {} [{}]",
                        args[mm.lhs],
                        fmt_view(&mm.lhs_view),
                        args[mm.rhs],
                        fmt_view(&mm.rhs_view)
                    );
                    if !mm.out_view.is_contiguous() {
                        // Written straight into a permuted layout of the output.
                        let _ = writeln!(s, "    into [{}]", fmt_view(&mm.out_view));
                    }
                }
                for i in 0..k.ops.len() {
                    let _ = writeln!(s, "    {}", instr_text(k, i, &args, plan.params()));
                }
            }
            Step::Transfer {
                src,
                out,
                to,
                bytes,
            } => {
                let _ = writeln!(
                    s,
                    "transfer {step}: {} -> {} on {to} ({})",
                    buffer_name(plan, *src),
                    buffer_name(plan, BufferRef::Planned(*out)),
                    fmt_bytes(*bytes)
                );
            }
        }
    }
    let _ = writeln!(s, "kernel count: {}", plan.kernel_count());
    s
}

/// The plan as Graphviz DOT: kernels are boxes listing the ops they fuse, buffers are
/// ellipses with size and lifetime, edges carry the views kernels read through.
pub fn plan_dot(plan: &Plan) -> String {
    let mut s = String::from("digraph plan {\n  rankdir=TB;\n  node [fontname=monospace];\n");
    for (i, key) in plan.view_graph.inputs.iter().enumerate() {
        let _ = key;
        let node = plan
            .view_graph
            .nodes
            .iter()
            .find(|n| n.op == PlanOp::Input { slot: i });
        let label = node
            .map(|n| format!("input{i}\\n{:?} {}", n.shape, n.dtype))
            .unwrap_or_else(|| format!("input{i}"));
        let _ = writeln!(
            s,
            "  input{i} [shape=ellipse, style=dashed, label=\"{label}\"];"
        );
    }
    for (step, &g) in plan.schedule.order.iter().enumerate() {
        let b = &plan.buffers.buffers[g];
        let n = &plan.view_graph.nodes[b.node];
        let _ = writeln!(
            s,
            "  b{step} [shape=ellipse, label=\"b{step}\\n{:?} {}\\n{}\\nsteps {}..{}{}\"];",
            n.shape,
            n.dtype,
            fmt_bytes(b.bytes),
            b.first,
            b.last,
            if b.kept { " kept" } else { "" }
        );
    }
    for (step, st) in plan.steps().iter().enumerate() {
        match st {
            Step::Kernel(pk) => {
                let k = &pk.kernel;
                let _ = writeln!(
                    s,
                    "  k{step} [shape=box, style=filled, fillcolor=lightyellow, label=\"{}\\n{}\"];",
                    k.name,
                    k.fused_ops.join(" → ")
                );
                for ins in &k.ops {
                    match &ins.op {
                        IrOp::Load { arg, view, .. } => {
                            let _ = writeln!(
                                s,
                                "  {} -> k{step} [label=\"{}\"];",
                                buffer_name(plan, pk.args[*arg]),
                                fmt_view(view)
                            );
                        }
                        IrOp::Store { arg, .. } => {
                            let _ =
                                writeln!(s, "  k{step} -> {};", buffer_name(plan, pk.args[*arg]));
                        }
                        _ => {}
                    }
                }
                if let Some(mm) = &k.matmul {
                    for (a, v) in [(mm.lhs, &mm.lhs_view), (mm.rhs, &mm.rhs_view)] {
                        let _ = writeln!(
                            s,
                            "  {} -> k{step} [label=\"{}\"];",
                            buffer_name(plan, pk.args[a]),
                            fmt_view(v)
                        );
                    }
                }
            }
            Step::Transfer { src, out, to, .. } => {
                let _ = writeln!(
                    s,
                    "  {} -> {} [label=\"to {to}\", style=bold];",
                    buffer_name(plan, *src),
                    buffer_name(plan, BufferRef::Planned(*out))
                );
            }
        }
    }
    s.push_str("}\n");
    s
}

impl Plan {
    /// [`plan_text`].
    pub fn dump_text(&self) -> String {
        plan_text(self)
    }

    /// [`plan_dot`].
    pub fn dump_dot(&self) -> String {
        plan_dot(self)
    }
}
