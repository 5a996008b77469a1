//! Graph dumps (text, Graphviz DOT, JSON) and tensor value summaries for debugging.

use crate::graph::{Graph, Node};
use pn_ops::{DType, Op, Tensor, TensorData};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::ops::Range;

/// Output format of `pn dump`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Dot,
    Json,
}

/// Per-node annotation from a planner (die, segment, cause), shown when present.
pub type Annotate<'a> = &'a dyn Fn(&Node) -> Option<String>;

fn in_layers(n: &Node, layers: &Option<Range<usize>>) -> bool {
    match (layers, n.layer) {
        (None, _) => true,
        (Some(r), Some(l)) => r.contains(&(l as usize)),
        (Some(_), None) => false,
    }
}

/// Op with its parameters, e.g. `RmsNorm{eps=1e-6}`.
pub fn op_label(op: &Op) -> String {
    match op {
        Op::Weight { .. } => "Weight".into(),
        other => format!("{other:?}").replace(": ", "=").replace(" { ", "{").replace(" }", "}"),
    }
}

/// Bytes a node's output occupies (weights: their GGUF block bytes).
pub fn node_bytes(n: &Node) -> usize {
    let s = n.out.shape;
    match n.out.dtype {
        DType::F32 | DType::I32 => s.numel() * 4,
        DType::Weight(t) => t.row_bytes(s.0[0]).unwrap_or(0) * s.rows(),
    }
}

/// Peak bytes of live activations when the graph runs in order and each value is freed
/// after its last consumer.
pub fn activation_peak(g: &Graph) -> usize {
    let last = g.last_use();
    let (mut live, mut peak) = (0usize, 0usize);
    let mut frees: BTreeMap<usize, usize> = BTreeMap::new();
    for id in g.order() {
        let n = g.node(id);
        if !matches!(n.out.dtype, DType::Weight(_)) {
            live += node_bytes(n);
            peak = peak.max(live);
            if last[id.index()] != usize::MAX {
                *frees.entry(last[id.index()].max(id.index())).or_default() += node_bytes(n);
            }
        }
        if let Some(b) = frees.remove(&id.index()) {
            live -= b;
        }
    }
    peak
}

pub fn text(g: &Graph, layers: Option<Range<usize>>, annotate: Option<Annotate<'_>>) -> String {
    let mut s = String::new();
    let mut per_op: BTreeMap<&str, usize> = BTreeMap::new();
    let mut weight_bytes: BTreeMap<String, usize> = BTreeMap::new();
    for id in g.order() {
        let n = g.node(id);
        *per_op.entry(n.op.kind()).or_default() += 1;
        if matches!(n.op, Op::Weight { .. }) {
            let layer = layer_of_weight(&n.name).map_or("global".to_string(), |l| format!("layer {l}"));
            *weight_bytes.entry(layer).or_default() += node_bytes(n);
        }
        if !in_layers(n, &layers) || matches!(n.op, Op::Weight { .. }) && layers.is_some() {
            continue;
        }
        let ins: Vec<String> = n.inputs.iter().map(|i| format!("%{}", i.index())).collect();
        let _ = write!(s, "%{} {} {} {}", id.index(), n.name, op_label(&n.op), n.out);
        if !ins.is_empty() {
            let _ = write!(s, " <- {}", ins.join(" "));
        }
        if let Some(a) = annotate.and_then(|f| f(n)) {
            let _ = write!(s, " {a}");
        }
        s.push('\n');
    }
    let _ = writeln!(s, "\n# {} nodes", g.len());
    for (op, n) in &per_op {
        let _ = writeln!(s, "#   {op:<14} {n}");
    }
    let _ = writeln!(s, "# weight bytes");
    let mut wb: Vec<_> = weight_bytes.into_iter().collect();
    wb.sort_by_key(|(k, _)| (k != "global", k.trim_start_matches("layer ").parse::<usize>().unwrap_or(0)));
    for (k, b) in wb {
        let _ = writeln!(s, "#   {k:<10} {b}");
    }
    let _ = writeln!(s, "# activation peak {} bytes", activation_peak(g));
    s
}

/// `blk.N.*` → N.
pub fn layer_of_weight(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A node's cluster in a `dot` dump: (label, fill colour).
pub type ClusterOf<'a> = &'a dyn Fn(&Node) -> (String, String);

pub fn dot(g: &Graph, layers: Option<Range<usize>>, cluster_of: Option<ClusterOf<'_>>) -> String {
    let mut s = String::from("digraph pantheon {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n");
    let mut clusters: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut edges = String::new();
    for id in g.order() {
        let n = g.node(id);
        if !in_layers(n, &layers) || matches!(n.op, Op::Weight { .. }) {
            continue;
        }
        let label = format!("{}\\n{} {}", dot_escape(&n.name), dot_escape(n.op.kind()), n.out);
        let line = format!("    n{} [label=\"{label}\"];", id.index());
        let (key, color) = match cluster_of {
            Some(f) => f(n),
            None => (n.layer.map_or("global".to_string(), |l| format!("layer {l}")), "white".to_string()),
        };
        clusters.entry(key).or_insert_with(|| (color, Vec::new())).1.push(line);
        for i in &n.inputs {
            let src = g.node(*i);
            if in_layers(src, &layers) && !matches!(src.op, Op::Weight { .. }) {
                // with clusters by segment, an edge between segments is a transfer
                let crosses = cluster_of.is_some_and(|f| f(src).0 != f(n).0);
                let style = if crosses { " [style=bold, color=red, label=\"transfer\"]" } else { "" };
                let _ = writeln!(edges, "  n{} -> n{}{style};", i.index(), id.index());
            }
        }
    }
    for (i, (name, (color, lines))) in clusters.iter().enumerate() {
        let _ = writeln!(s, "  subgraph cluster_{i} {{\n    label=\"{}\"; style=filled; fillcolor=\"{color}\";", dot_escape(name));
        for l in lines {
            let _ = writeln!(s, "{l}");
        }
        s.push_str("  }\n");
    }
    s.push_str(&edges);
    s.push_str("}\n");
    s
}

pub fn json(g: &Graph, layers: Option<Range<usize>>, annotate: Option<Annotate<'_>>) -> serde_json::Value {
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for id in g.order() {
        let n = g.node(id);
        if !in_layers(n, &layers) {
            continue;
        }
        let shape: Vec<usize> = n.out.shape.0[..n.out.shape.rank()].to_vec();
        let mut v = serde_json::json!({
            "id": id.index(), "name": n.name, "op": n.op.kind(), "params": op_label(&n.op),
            "dtype": n.out.dtype.to_string(), "shape": shape, "layer": n.layer,
            "inputs": n.inputs.iter().map(|i| i.index()).collect::<Vec<_>>(),
        });
        if let Some(a) = annotate.and_then(|f| f(n)) {
            v["plan"] = serde_json::Value::String(a);
        }
        nodes.push(v);
        for (slot, i) in n.inputs.iter().enumerate() {
            edges.push(serde_json::json!({"from": i.index(), "to": id.index(), "slot": slot}));
        }
    }
    serde_json::json!({"nodes": nodes, "edges": edges, "activation_peak_bytes": activation_peak(g)})
}

/// One summary line of a tensor's values: shape, min, max, mean, NaN/Inf count, first values.
pub fn summary(name: &str, t: &Tensor) -> String {
    let vals: Vec<f64> = match &t.data {
        TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
        TensorData::I32(v) => v.iter().map(|&x| x as f64).collect(),
    };
    let finite: Vec<f64> = vals.iter().copied().filter(|x| x.is_finite()).collect();
    let bad = vals.len() - finite.len();
    let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = finite.iter().sum::<f64>() / finite.len().max(1) as f64;
    let first: Vec<String> = vals.iter().take(4).map(|x| format!("{x:.5}")).collect();
    format!("{name:<32} {} min {min:.5} max {max:.5} mean {mean:.5} nan/inf {bad} [{}]", t.meta(), first.join(", "))
}
