//! One forward pass: the plan's segments in order, each segment's ops run as one pass on
//! its die's backend ([`Backend::run_pass`]), every op writing its output into the
//! buffer slot the memory plan gives it ([`Backend::execute_into`], [`super::arena`];
//! on a resident die `Backend::execute_resident`, [`super::resident`]).

use super::arena::Arena;
use super::{no_state, Compiled, Observer, RunError, Runner};
use crate::backend::{Backend, SegmentRun};
use crate::graph::Graph;
use crate::model::Geometry;
use crate::planner::debug::Moves;
use crate::planner::program::{InputKind, Phys, SegProgram, Src};
use crate::state::SeqState;
use pn_ops::{DType, LayerState, SeqSpan, Shape, Tensor, TensorData, Value, WeightView};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What one segment's ops need, borrowed from `eval` (sent to the backend's pass thread).
pub(super) struct Pass<'a, 's> {
    pub runner: &'a Runner,
    pub graph: &'a Graph,
    pub views: &'a [WeightView<'a>],
    pub phys: &'a [Phys],
    pub arena: &'a mut Arena,
    pub seqs: &'a mut [&'s mut SeqState],
    pub lens: &'a [usize],
    /// The sequence table: sequence `i` owns tokens `spans[i]` (from `lens`).
    pub spans: &'a [SeqSpan],
    pub op_times: &'a mut BTreeMap<&'static str, (u64, u64)>,
}

impl Pass<'_, '_> {
    /// Adds one run of an op of `kind` that started at `t1` to the `PN_DEBUG=2` table.
    pub(super) fn time_op(&mut self, kind: &'static str, t1: Instant) {
        let e = self.op_times.entry(kind).or_default();
        e.0 += 1;
        e.1 += t1.elapsed().as_nanos() as u64;
    }

    /// Runs the ops of `sp` on `backend`, in order.
    fn run_ops(
        &mut self,
        sp: &SegProgram,
        backend: &dyn Backend,
        observer: &mut Option<Observer<'_>>,
    ) -> Result<(), RunError> {
        let (graph, debug) = (self.graph, self.runner.debug);
        for op in &sp.ops {
            let node = graph.node(op.node);
            let p_out = self.phys[op.out as usize];
            let mut out = self.arena.take(p_out);
            let arena = &*self.arena;
            let ins: SmallVec<[Value<'_>; 6]> = op
                .inputs
                .iter()
                .map(|s| match *s {
                    Src::Val(v) => Value::Act(
                        arena
                            .get(self.phys[v as usize])
                            .as_ref()
                            .expect("inputs are computed before their consumers"),
                    ),
                    Src::Weight(w) => Value::Weight(self.views[w as usize]),
                })
                .collect();
            let t1 = (debug >= 2).then(Instant::now);
            let seqs = &mut *self.seqs;
            let meta = &node.out;
            let res = match op.state {
                None => backend.execute_into(&node.op, &ins, meta, None, &mut out),
                Some(s) if seqs.len() == 1 => {
                    let state = seqs[0].layer_mut(s).ok_or_else(|| no_state(node, s))?;
                    backend.execute_into(&node.op, &ins, meta, Some(state), &mut out)
                }
                Some(s) => {
                    if seqs.iter().any(|q| q.n_layers() <= s) {
                        return Err(no_state(node, s));
                    }
                    let mut states: SmallVec<[&mut LayerState; 16]> =
                        seqs.iter_mut().map(|q| q.layer_mut(s).expect("checked above")).collect();
                    backend.execute_seqs(&node.op, &ins, meta, self.spans, &mut states, &mut out)
                }
            };
            drop(ins);
            res.map_err(|source| RunError::Op {
                node: node.name.clone(),
                source,
            })?;
            if let Some(t1) = t1 {
                self.time_op(node.op.kind(), t1);
            }
            if debug >= 3 {
                eprintln!("[pn] {}", crate::dump::summary(&node.name, &out));
            }
            if let Some(obs) = observer.as_mut() {
                obs(node, &out);
            }
            *self.arena.get_mut(p_out) = Some(out);
        }
        Ok(())
    }
}

impl Runner {
    /// One pass over one micro-batch: the plan's segments in order. `seqs[i]` owns the
    /// next `lens[i]` tokens (several: [`Runner::forward_multi`], crate::slots). Returns
    /// `result_output`.
    pub(crate) fn eval(
        &self,
        seqs: &mut [&mut SeqState],
        lens: &[usize],
        tokens: &[u32],
        all_logits: bool,
        observer: &mut Option<Observer<'_>>,
    ) -> Result<Tensor, RunError> {
        let c: std::sync::Arc<Compiled> = self.compiled(Geometry {
            n_tokens: tokens.len(),
            all_logits,
        })?;
        let (graph, plan, prog) = (&*c.graph, &*c.plan, &c.prog);
        // Buffers are reserved once for the worst-case geometry (`ubatch` tokens, all
        // logits), then checked against this geometry's slots (they grow only if its
        // slots are larger, counted in `Arena::grown`).
        let worst = if self.reserved.load(Ordering::Relaxed) {
            None
        } else {
            Some(self.compiled(Geometry {
                n_tokens: self.ubatch.max(1),
                all_logits: true,
            })?)
        };
        let mut guard = self.arena.lock().expect("arena lock");
        let arena: &mut Arena = &mut guard;
        let mut grow = Vec::new();
        let first = worst.is_some();
        if let Some(w) = worst {
            grow = arena.reserve(&w.prog, &self.resident);
            arena.grown = 0;
            self.reserved.store(true, Ordering::Relaxed);
        }
        grow.extend(arena.reserve(prog, &self.resident));
        if !grow.is_empty() {
            if let Err(e) = self.reserve_resident(&grow) {
                // not reserved: asked again by the next pass
                arena.unreserve(&grow);
                if first {
                    self.reserved.store(false, Ordering::Relaxed);
                }
                return Err(e);
            }
        }
        let mut moves = Moves::default();
        if self.resident.contains(&true) || seqs.iter().any(|s| s.is_resident()) {
            self.place_states(plan, seqs, &mut moves)?;
        }
        let phys = &prog.phys[..];
        let views: Vec<WeightView<'_>> = prog
            .weights
            .iter()
            .map(|w| {
                let info = &self.gguf.tensors[w.tensor];
                WeightView {
                    name: &info.name,
                    ty: info.ty,
                    shape: super::weight_shape(info),
                    bytes: self.gguf.tensor_bytes(info),
                }
            })
            .collect();
        let spans = SeqSpan::table(lens);
        let step = self.profile.counters().steps;
        let step_t0 = Instant::now();
        let mut op_times: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for (si, sp) in prog.segs.iter().enumerate() {
            let t0 = Instant::now();
            let die = &self.dies[sp.die];
            let resident = self.resident[sp.die];
            let moved = self.transfers_in(sp, graph, phys, arena, &mut moves)?;
            for &(v, kind, node) in &sp.inputs {
                let p = phys[v as usize];
                let slot = arena.get_mut(p);
                fill_input(slot, kind, tokens, seqs, lens);
                if resident {
                    let t = slot.as_ref().expect("filled above");
                    self.upload(p, graph.node(node), t, &mut moves)?;
                }
                if plan.nodes[node.index()].seg == Some(si) {
                    if let (Some(obs), Some(t)) = (observer.as_mut(), slot.as_ref()) {
                        obs(graph.node(node), t);
                    }
                }
            }
            let backend = &*die.backend;
            let stable = plan.capture[si].stable;
            let replay = stable && c.captured[si].load(Ordering::Relaxed);
            let mut pass = Pass {
                runner: self,
                graph,
                views: &views,
                phys,
                arena: &mut *arena,
                seqs: &mut *seqs,
                lens,
                spans: &spans,
                op_times: &mut op_times,
            };
            if resident {
                let run = SegmentRun {
                    arena: self.arena_ids[sp.die],
                    segment: si,
                    n_tokens: tokens.len(),
                    all_logits,
                    stable,
                    replay,
                };
                pass.run_resident(sp, &run, backend, observer, &mut moves)?;
            } else if observer.is_some() || self.debug >= 3 {
                // The observer (tensor dumps) stays on the caller's thread.
                pass.run_ops(sp, backend, observer)?;
            } else {
                let mut res = Ok(());
                backend.run_pass(&mut || res = pass.run_ops(sp, backend, &mut None));
                res?;
            }
            let unit = if stable {
                c.captured[si].store(true, Ordering::Relaxed);
                let counter = if replay {
                    &self.profile.replays
                } else {
                    &self.profile.captures
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if replay {
                    " replay"
                } else {
                    " capture"
                }
            } else {
                ""
            };
            self.profile
                .transfer_bytes
                .fetch_add(moved as u64, Ordering::Relaxed);
            if self.debug >= 1 {
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                eprintln!(
                    "[pn] step {step} seg {si} @{}: {} ops {ms:.3} ms, transfer in {moved} B{unit}",
                    die.device,
                    sp.ops.len()
                );
            }
        }
        let p_out = phys[prog.output as usize];
        let out = if self.resident[p_out.die] {
            let mut t = arena.take(p_out);
            let node = graph.node(*graph.outputs.first().expect("checked by program::build"));
            self.download(p_out, node, &mut t, &mut moves)?;
            t
        } else {
            arena
                .get_mut(p_out)
                .take()
                .expect("the graph output is kept alive")
        };
        for (st, &n) in seqs.iter_mut().zip(lens) {
            st.pos += n;
        }
        self.profile.add_step(step_t0.elapsed());
        self.profile.add_moves(&moves);
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
                moves.line()
            );
        }
        Ok(out)
    }
}

/// Copies a value into another die's buffer, reusing the buffer when it has room.
pub(super) fn copy_into(dst: &mut Option<Tensor>, src: &Tensor) {
    if let Some(d) = dst.as_mut() {
        d.shape = src.shape;
        match (&mut d.data, &src.data) {
            (TensorData::F32(a), TensorData::F32(b)) => {
                a.clear();
                return a.extend_from_slice(b);
            }
            (TensorData::I32(a), TensorData::I32(b)) => {
                a.clear();
                return a.extend_from_slice(b);
            }
            _ => {}
        }
    }
    *dst = Some(src.clone());
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
