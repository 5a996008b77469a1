//! One forward pass: the plan's segments in order. Per segment: the values crossing into
//! its die and the graph inputs it reads go to its backend ([`super::moves`]), then its
//! [`crate::backend::Executable`] runs with the pass's sequence table; the graph output
//! is downloaded at the end (and the hidden rows, when [`Taps::hidden`] asks for them).

use super::arena::Arena;
use super::{Compiled, Observer, RunError, Runner, Taps};
use crate::backend::{ExecError, PassIo};
use crate::model::Geometry;
use crate::planner::debug::{self, Counters};
use crate::planner::program::{InputKind, SegProgram};
use crate::state::SeqState;
use pn_ops::{DType, LayerState, OpError, SeqSpan, Shape, Tensor, TensorData, WeightView};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Runner {
    /// Reserves every die's buffer slots for the worst-case geometry (`ubatch` tokens,
    /// all logits) on the first pass, then checks this geometry's slots against it (they
    /// grow only if larger, counted in `Arena::grown`).
    fn reserve_for(&self, c: &Compiled, arena: &mut Arena) -> Result<(), RunError> {
        let worst = if self.reserved.load(Ordering::Relaxed) {
            None
        } else {
            Some(self.compiled(Geometry::one(self.ubatch.max(1), true))?)
        };
        let mut grow = Vec::new();
        let first = worst.is_some();
        if let Some(w) = worst {
            grow = arena.reserve(&w.prog);
            arena.grown = 0;
            self.reserved.store(true, Ordering::Relaxed);
        }
        grow.extend(arena.reserve(&c.prog));
        if !grow.is_empty() {
            if let Err(e) = self.reserve_slots(&grow) {
                // not reserved: asked again by the next pass
                arena.unreserve(&grow);
                if first {
                    self.reserved.store(false, Ordering::Relaxed);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// One pass over one micro-batch: the plan's segments in order. `seqs[i]` owns the
    /// next `lens[i]` tokens (several: [`Runner::forward_multi`], crate::slots). Returns
    /// `result_output`; `taps.hidden` gets the pass's [`super::HIDDEN_NODE`] rows appended.
    pub(crate) fn eval(
        &self,
        seqs: &mut [&mut SeqState],
        lens: &[usize],
        tokens: &[u32],
        all_logits: bool,
        taps: &mut Taps<'_>,
    ) -> Result<Tensor, RunError> {
        debug_assert_eq!(lens.iter().sum::<usize>(), tokens.len());
        let c: std::sync::Arc<Compiled> = self.compiled_for((Geometry::of(lens, all_logits), taps.hidden.is_some()))?;
        let observer = &mut taps.observer;
        let (graph, plan, prog) = (&*c.graph, &*c.plan, &c.prog);
        check_states(&c, seqs)?;
        let mut guard = self.arena.lock().expect("arena lock");
        let arena: &mut Arena = &mut guard;
        self.reserve_for(&c, arena)?;
        let mut step_counts = Counters::default();
        self.place_states(plan, seqs, &mut step_counts)?;
        let phys = &prog.phys[..];
        let views: Vec<WeightView<'_>> = prog.weights.iter().map(|w| self.gguf.weight_view(w.tensor)).collect();
        let spans = SeqSpan::table(lens);
        let ids: SmallVec<[u64; 16]> = seqs.iter().map(|s| s.id()).collect();
        let step = self.profile.counters().steps;
        let step_t0 = Instant::now();
        let mut op_times: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for (si, sp) in prog.segs.iter().enumerate() {
            let t0 = Instant::now();
            let die = &self.dies[sp.die];
            let moved = self.transfers_in(sp, graph, phys, arena, &mut step_counts)?;
            for &(v, kind, node) in &sp.inputs {
                let p = phys[v as usize];
                let slot = arena.get_mut(p);
                fill_input(slot, kind, tokens, seqs, lens);
                let t = slot.as_ref().expect("filled above");
                self.upload(p, graph.node(node), t, &mut step_counts)?;
                if plan.nodes[node.index()].seg == Some(si) {
                    if let Some(obs) = observer.as_mut() {
                        obs(graph.node(node), t);
                    }
                }
            }
            let stable = plan.capture[si].stable;
            let replay = stable && c.captured[si].load(Ordering::Relaxed);
            self.run_segment(&c, si, sp, &views, &spans, &ids, seqs, observer, &mut op_times)?;
            if stable {
                c.captured[si].store(true, Ordering::Relaxed);
                *if replay { &mut step_counts.replays } else { &mut step_counts.captures } += 1;
            }
            step_counts.transfer_bytes += moved as u64;
            if self.debug >= 1 {
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                let unit = match (stable, replay) {
                    (false, _) => "",
                    (true, false) => " capture",
                    (true, true) => " replay",
                };
                eprintln!("[pn] step {step} seg {si} @{}: {} ops {ms:.3} ms, transfer in {moved} B{unit}", die.device, sp.ops.len());
            }
        }
        let p_out = phys[prog.output as usize];
        let mut out = arena.take(p_out);
        let node = graph.node(*graph.outputs.first().expect("checked by program::build"));
        self.download(p_out, node, &mut out, &mut step_counts)?;
        if let (Some(h), Some((v, id))) = (taps.hidden.as_mut(), c.hidden) {
            // staged in the arena's host buffer of that slot (reused pass after pass)
            let p = phys[v as usize];
            let mut t = arena.take(p);
            let res = self.download(p, graph.node(id), &mut t, &mut step_counts);
            if res.is_ok() {
                h.extend_from_slice(t.as_f32());
            }
            *arena.get_mut(p) = Some(t);
            res?;
        }
        for (st, &n) in seqs.iter_mut().zip(lens) {
            st.pos += n;
        }
        self.profile.add_step(&step_counts, step_t0.elapsed());
        if self.debug >= 2 {
            self.profile.add_ops(&op_times);
        }
        if self.debug >= 1 {
            let k = self.profile.counters();
            let bufs: Vec<String> = (0..self.dies.len())
                .map(|d| {
                    let (bytes, n) = arena.bytes(d);
                    format!("{} {bytes} bytes in {n} buffers", self.dies[d].device)
                })
                .collect();
            eprintln!(
                "[pn] step {step}: {} tokens, {:.3} ms; capture units: {} captured, {} replays; arena: {} (grown {}x); {}",
                tokens.len(),
                step_t0.elapsed().as_secs_f64() * 1e3,
                k.captures,
                k.replays,
                bufs.join(", "),
                arena.grown,
                step_counts.moves_line()
            );
        }
        Ok(out)
    }

    /// Runs segment `si`'s executable with the pass's sequence table; per op, the
    /// `PN_DEBUG=2` timings and the observer / `PN_DEBUG=3` value summaries.
    #[allow(clippy::too_many_arguments)]
    fn run_segment(
        &self,
        c: &Compiled,
        si: usize,
        sp: &SegProgram,
        views: &[WeightView<'_>],
        spans: &[SeqSpan],
        ids: &[u64],
        seqs: &mut [&mut SeqState],
        observer: &mut Option<Observer<'_>>,
        op_times: &mut BTreeMap<&'static str, (u64, u64)>,
    ) -> Result<(), RunError> {
        let graph = &*c.graph;
        let mut layers: SmallVec<[&mut [LayerState]; 16]> = seqs.iter_mut().map(|s| s.host_layers()).collect();
        let mut t_last = Instant::now();
        let mut timing = |i: usize| {
            let node = graph.node(sp.ops[i].node);
            let e = op_times.entry(debug::op_row(node.op.kind(), &node.name)).or_default();
            e.0 += 1;
            e.1 += t_last.elapsed().as_nanos() as u64;
            t_last = Instant::now();
        };
        let debug = self.debug;
        let want_values = debug >= 3 || observer.is_some();
        let mut observe = |i: usize, t: &Tensor| {
            let node = graph.node(sp.ops[i].node);
            if debug >= 3 {
                eprintln!("[pn] {}", crate::dump::summary(&node.name, t));
            }
            if let Some(obs) = observer.as_mut() {
                obs(node, t);
            }
        };
        let mut io = PassIo {
            weights: views,
            spans,
            ids,
            layers: &mut layers,
            timing: if debug >= 2 { Some(&mut timing) } else { None },
            observe: if want_values { Some(&mut observe) } else { None },
        };
        c.exes[si].run(&mut io).map_err(|ExecError { op, source }| RunError::Op {
            node: match op {
                Some(i) => graph.node(sp.ops[i].node).name.clone(),
                None => format!("(segment {si})"),
            },
            source,
        })
    }
}

/// The pass's one state check: every sequence's layer state against the shape its graph
/// inferred for each stateful node ([`crate::graph::Node::state`]), before any state
/// moves (on the host copies, whose shapes hold while a device owns the contents).
fn check_states(c: &Compiled, seqs: &mut [&mut SeqState]) -> Result<(), RunError> {
    for &id in &c.stateful {
        let node = c.graph.node(id);
        let (Some(l), Some(want)) = (node.op.state(), node.state) else { continue };
        for (i, st) in seqs.iter_mut().enumerate() {
            let layers = st.host_layers();
            let res = match layers.get(l) {
                Some(ls) => want.check(node.op.kind(), ls),
                None => Err(OpError::Shape { op: node.op.kind(), expected: format!("layer state {l}: {want}"), found: format!("{} layer states", layers.len()) }),
            };
            res.map_err(|source| RunError::Op { node: format!("{} (sequence {i} of the pass, layer state {l})", node.name), source })?;
        }
    }
    Ok(())
}

/// Token ids, or each sequence's positions `pos..pos+n` (`seqs[i]` owns `lens[i]`
/// consecutive tokens), written into the die's input buffer in place.
fn fill_input(
    slot: &mut Option<Tensor>,
    kind: InputKind,
    tokens: &[u32],
    seqs: &[&mut SeqState],
    lens: &[usize],
) {
    let n = tokens.len();
    let t = slot.get_or_insert_with(|| Tensor::i32(Shape::d1(n), vec![0; n]));
    if t.dtype() != DType::I32 {
        *t = Tensor::i32(Shape::d1(n), vec![0; n]);
    }
    t.shape = Shape::d1(n);
    if let TensorData::I32(v) = &mut t.data {
        v.resize(n, 0);
        match kind {
            InputKind::Tokens => v.iter_mut().zip(tokens).for_each(|(x, &id)| *x = id as i32),
            InputKind::Positions => {
                let mut i = 0;
                for (st, &len) in seqs.iter().zip(lens) {
                    for j in 0..len {
                        v[i] = (st.pos + j) as i32;
                        i += 1;
                    }
                }
            }
        }
    }
}
