//! `pn dump`: the model's graph as text, Graphviz DOT or JSON.

use crate::load;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use pn_engine::dump;
use pn_engine::Geometry;
use std::ops::Range;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Fmt {
    Text,
    Dot,
    Json,
}

#[derive(Args)]
pub struct DumpArgs {
    #[command(flatten)]
    opts: load::ModelOpts,
    #[arg(long, value_enum, default_value_t = Fmt::Text)]
    format: Fmt,
    /// Batch geometry: tokens per forward pass
    #[arg(long, default_value_t = 1)]
    tokens: usize,
    /// Only these layers: `A..B` (B exclusive) or `A`
    #[arg(long)]
    layers: Option<String>,
    /// Show the planner's placement: die, segment and cause per node, transfers, memory per die
    #[arg(long)]
    plan: bool,
    /// Write here instead of stdout
    #[arg(long)]
    out: Option<PathBuf>,
}

fn parse_layers(s: &str, n_layer: usize) -> Result<Range<usize>> {
    let bad = || anyhow::anyhow!("--layers: expected A..B or A with layers in 0..{n_layer}, found {s:?}");
    let r = match s.split_once("..") {
        Some((a, b)) => {
            let a: usize = if a.is_empty() { 0 } else { a.trim().parse().map_err(|_| bad())? };
            let b: usize = if b.is_empty() { n_layer } else { b.trim().parse().map_err(|_| bad())? };
            a..b
        }
        None => {
            let a: usize = s.trim().parse().map_err(|_| bad())?;
            a..a + 1
        }
    };
    if r.start >= r.end || r.end > n_layer {
        return Err(bad());
    }
    Ok(r)
}

pub fn run(a: DumpArgs) -> Result<()> {
    if a.tokens == 0 {
        bail!("--tokens: expected at least 1, found 0");
    }
    let out = a.out.as_deref().map(|p| crate::output::OutFile::create(p, "--out")).transpose()?;
    let l = load::load(&a.opts)?;
    let layers = a.layers.as_deref().map(|s| parse_layers(s, l.runner.model().n_layer())).transpose()?;
    let geom = Geometry::one(a.tokens, false);
    let g = l.runner.graph(geom)?;
    let plan = if a.plan { Some(l.runner.plan(geom)?) } else { None };
    let annotate = |n: &pn_engine::Node| plan.as_ref().and_then(|p| g.find(&n.name).map(|id| p.annotation(id)));
    let annotate: Option<dump::Annotate<'_>> = if a.plan { Some(&annotate) } else { None };
    // DOT: with --plan one cluster per segment, coloured by die
    let palette = ["#dbe9f6", "#f6e3db"];
    let by_segment = |n: &pn_engine::Node| {
        let p = plan.as_ref().expect("only used with --plan");
        let np = g.find(&n.name).map(|id| &p.nodes[id.index()]);
        match np.and_then(|np| np.seg.map(|s| (s, np.die))) {
            Some((s, die)) => (format!("segment {s} @{}", p.dies[die]), palette[die % 2].to_string()),
            None => ("unplaced".to_string(), "white".to_string()),
        }
    };
    let cluster: Option<pn_engine::dump::ClusterOf<'_>> = if a.plan { Some(&by_segment) } else { None };
    let mut text = match a.format {
        Fmt::Text => dump::text(&g, layers, annotate),
        Fmt::Dot => dump::dot(&g, layers, cluster),
        Fmt::Json => serde_json::to_string_pretty(&dump::json(&g, layers, annotate))? + "\n",
    };
    if let (Some(p), Fmt::Text) = (&plan, a.format) {
        text.push_str(&p.summary(&g));
    }
    match out {
        Some(f) => f.commit(text.as_bytes()),
        None => crate::output::print(&mut std::io::stdout().lock(), &text),
    }
}
