//! Split parity: one die vs two CPU dies (two CpuBackend instances, own thread pools)
//! give bit-identical logits at every layer boundary; every fixture's plan is valid.

use pn_cpu::CpuBackend;
use pn_engine::graph::GraphBuilder;
use pn_engine::planner::{self, Device, Placement};
use pn_engine::runner::Die;
use pn_engine::{Geometry, Gguf, Runner};
use pn_tests::*;
use std::sync::Arc;

fn load(name: &str) -> (Arc<Gguf>, Arc<dyn pn_engine::Model>) {
    let g = Arc::new(Gguf::open(&fixture(name)).expect("fixture opens"));
    let m = pn_models::load(&g).expect("fixture model loads");
    (g, m)
}

fn split_runner(name: &str, p: Placement) -> Runner {
    let (g, m) = load(name);
    // different thread counts per die: results must not depend on them either
    let dies = p
        .named_dies()
        .into_iter()
        .enumerate()
        .map(|(i, device)| Die {
            device,
            backend: Arc::new(CpuBackend::new(2 - i)) as _,
        })
        .collect();
    Runner::with_dies(m, g, dies, p).expect("split runner builds")
}

/// Every position's logits of a ~20-token prompt, then 3 greedy decode steps.
fn trace(r: &Runner, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut st = r.new_state(64);
    let first = r.forward(&mut st, prompt, true).unwrap();
    let mut next = pn_engine::sampler::argmax(first.last()) as u32;
    let mut out = vec![first.data];
    for _ in 0..3 {
        let l = r.forward(&mut st, &[next], false).unwrap();
        next = pn_engine::sampler::argmax(l.last()) as u32;
        out.push(l.data);
    }
    out
}

fn parity(name: &str, oracle_json: &str) {
    let o = oracle(oracle_json);
    let prompt: Vec<u32> = o.tokens.iter().copied().cycle().take(20).collect();
    let one = trace(&runner(name, 2), &prompt);
    let n_layer = load(name).1.n_layer();
    assert!(n_layer >= 2, "{name}: needs layers to split");
    for split in 1..=n_layer {
        let r = split_runner(
            name,
            Placement::split(Device::cpu(0), Device::cpu(1), split),
        );
        let got = trace(&r, &prompt);
        assert!(
            got == one,
            "{name}: split at layer {split} differs from one die"
        );
        let p = r
            .plan(Geometry::one(1, false))
            .unwrap();
        assert_eq!(
            p.dies.len(),
            if split < n_layer { 2 } else { 1 },
            "{name}: split {split}"
        );
        let k = r.counters();
        if split < n_layer {
            assert!(
                k.transfer_bytes > 0 && k.replays > 0,
                "{name}: split {split}: {k:?}"
            );
        }
    }
}

#[test]
fn f16_split_at_every_layer_matches_one_die() {
    parity("tiny-f16.gguf", "tiny-f16.logits.json");
}

#[test]
fn q4_k_m_split_at_every_layer_matches_one_die() {
    parity("ktiny-q4_k_m.gguf", "ktiny-q4_k_m.logits.json");
}

#[test]
fn llama_qwen3_qwen2_split_at_every_layer_match_one_die() {
    for n in ["llama-tiny-f32", "qwen3-ktiny-q4_k_m", "qwen2-tiny-f32"] {
        parity(&format!("{n}.gguf"), &format!("{n}.logits.json"));
    }
}

#[test]
fn every_fixture_plan_is_valid() {
    let dir = fixture("");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().and_then(|x| x.to_str()) != Some("gguf") {
            continue;
        }
        let Ok(g) = Gguf::open(&path) else { continue };
        let Ok(m) = pn_models::load(&g) else { continue };
        let n_layer = m.n_layer();
        for geom in [
            Geometry::one(1, false),
            Geometry::one(7, false),
            Geometry::one(7, true),
        ] {
            let mut b = GraphBuilder::new();
            m.build(geom, &mut b).unwrap();
            let graph = b.finish();
            let placements = [
                Placement::single(Device::cpu(0)),
                Placement::two(Device::cpu(0), Device::cpu(1)),
                Placement::split(Device::cpu(0), Device::cpu(1), 1),
            ];
            for p in placements {
                let plan = planner::plan(&graph, &p, n_layer, geom)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                plan.validate(&graph).unwrap();
                for id in graph.order() {
                    assert!(!plan.annotation(id).is_empty());
                }
                let split = plan.split_layer;
                if split < n_layer {
                    // the boundary hidden state is the only computed value that crosses
                    assert_eq!(
                        plan.transfers.len(),
                        1,
                        "{}: {}",
                        path.display(),
                        plan.summary(&graph)
                    );
                    assert_eq!(
                        graph.node(plan.transfers[0].value).name,
                        format!("l_out-{}", split - 1)
                    );
                    assert_eq!(plan.segments.len(), 2);
                    for (s, die) in plan.state_die.iter().enumerate() {
                        assert_eq!(
                            *die,
                            Some(usize::from(s >= split)),
                            "state {s} lives with its layer's die"
                        );
                    }
                } else {
                    assert!(plan.transfers.is_empty() && plan.segments.len() == 1);
                }
                for d in 0..plan.dies.len() {
                    assert!(plan.mem.peak_live(d) > 0 && plan.mem.peak_live(d) <= plan.mem.naive[d]);
                }
            }
        }
        n += 1;
    }
    assert!(n >= 10, "expected the fixture models to load, found {n}");
}

#[test]
fn cli_style_resolution_feeds_the_runner() {
    let p = Placement::resolve_with(Some("cpu:0,cpu:1"), None, &|_| None).unwrap();
    let r = split_runner("tiny-f16.gguf", p);
    let n_layer = r.model().n_layer();
    let plan = r
        .plan(Geometry::one(1, false))
        .unwrap();
    assert_eq!(plan.split_layer, n_layer / 2);
    let g = r
        .graph(Geometry::one(1, false))
        .unwrap();
    assert!(plan
        .annotation(g.find("result_output").unwrap())
        .starts_with("@cpu:1 seg=1 cause=weights"));
}
