//! Buffer slots of the memory plan (`MemPlan::slots`): values that share a slot are
//! never live together, every slot holds its values, and prompts run through the
//! persistent slots give the same logits whatever geometries ran before.

use pn_engine::model::Geometry;
use pn_ops::DType;
use pn_tests::*;

#[test]
fn slots_share_only_disjoint_lifetimes() {
    let r = runner("ktiny-q4_k_m.gguf", 1);
    for (n_tokens, all_logits) in [(1, false), (7, false), (64, true)] {
        let geom = Geometry::one(n_tokens, all_logits);
        let g = r.graph(geom).unwrap();
        let p = r.plan(geom).unwrap();
        let class = |i: usize| (g.node(p.mem.buffers[i].value).out.dtype == DType::I32) as usize;
        let s = p.mem.slots(&class);
        let b = &p.mem.buffers;
        for i in 0..b.len() {
            let (ci, si) = (class(i), s.of[i]);
            assert!(s.bytes[b[i].die][ci][si] >= b[i].bytes, "slot smaller than its value");
            for j in i + 1..b.len() {
                if b[i].die == b[j].die && ci == class(j) && si == s.of[j] {
                    assert!(
                        b[i].end < b[j].start || b[j].end < b[i].start,
                        "{n_tokens} tokens: %{} and %{} share slot {si} while both live",
                        b[i].value.index(),
                        b[j].value.index()
                    );
                }
            }
        }
        let total = s.die_bytes(0);
        assert!(total >= p.mem.peak_live(0), "slots hold less than the peak live bytes");
        assert!(total < p.mem.naive[0], "no reuse");
    }
}

#[test]
fn geometry_order_does_not_change_logits() {
    let o = oracle("ktiny-q4_k_m.logits.json");
    // fresh runner: one prompt
    let a = all_logits(&runner("ktiny-q4_k_m.gguf", 2), &o.tokens);
    // a runner whose buffers were first used by other geometries and sequences
    let r = runner("ktiny-q4_k_m.gguf", 2);
    let mut st = r.new_state(64);
    r.forward(&mut st, &[5, 6, 7, 8, 9], true).unwrap();
    r.forward(&mut st, &[3], false).unwrap();
    let b = all_logits(&r, &o.tokens);
    assert!(a == b, "logits depend on what ran before");
}
