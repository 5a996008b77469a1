//! The runner's side of the resident protocol (crate::backend): slot reservation,
//! uploads / downloads at the edges of a resident die, die-boundary transfers in all four
//! host/resident combinations, layer-state placement, and a segment's ops on slot ids.

use super::arena::Arena;
use super::eval::Pass;
use super::{no_state, Observer, RunError, Runner};
use crate::backend::{Backend, ResidentInput, SegmentRun, SlotId, SlotSpec, StateKey};
use crate::graph::{Graph, Node};
use crate::planner::debug::Moves;
use crate::planner::program::{Phys, SegProgram, Src, CLASS_I32};
use crate::planner::Plan;
use crate::state::resident::StateMoves;
use crate::state::SeqState;
use pn_ops::{DType, OpError, Tensor, TensorData};
use smallvec::SmallVec;
use std::time::Instant;

fn tensor_bytes(t: &Tensor) -> u64 {
    4 * match &t.data {
        TensorData::F32(v) => v.len(),
        TensorData::I32(v) => v.len(),
    } as u64
}

impl Runner {
    /// The backend's id of buffer slot `p`.
    pub(super) fn slot_id(&self, p: Phys) -> SlotId {
        SlotId {
            arena: self.arena_ids[p.die],
            class: p.class as u32,
            slot: p.slot as u32,
        }
    }

    fn slot_err(&self, action: &'static str, node: &str, p: Phys, source: OpError) -> RunError {
        RunError::Slot {
            action,
            node: node.to_string(),
            slot: format!("{} on {}", self.slot_id(p), self.dies[p.die].device),
            source: Box::new(source),
        }
    }

    /// Asks each resident die's backend to reserve (or grow) its slots in `grow`.
    pub(super) fn reserve_resident(&self, grow: &[(Phys, usize)]) -> Result<(), RunError> {
        for d in 0..self.dies.len() {
            let specs: Vec<SlotSpec> = grow
                .iter()
                .filter(|(p, _)| p.die == d)
                .map(|&(p, bytes)| SlotSpec {
                    id: self.slot_id(p),
                    dtype: if p.class == CLASS_I32 { DType::I32 } else { DType::F32 },
                    bytes,
                })
                .collect();
            if let Some(first) = grow.iter().find(|(p, _)| p.die == d) {
                let node = format!("{} buffer slots", specs.len());
                self.dies[d]
                    .backend
                    .reserve_slots(&specs)
                    .map_err(|e| self.slot_err("reservation", &node, first.0, e))?;
            }
        }
        Ok(())
    }

    /// Host tensor `t` (the value of `node`) → resident slot `p`.
    pub(super) fn upload(&self, p: Phys, node: &Node, t: &Tensor, m: &mut Moves) -> Result<(), RunError> {
        self.dies[p.die]
            .backend
            .upload(self.slot_id(p), t)
            .map_err(|e| self.slot_err("upload", &node.name, p, e))?;
        m.uploads += 1;
        m.upload_bytes += tensor_bytes(t);
        Ok(())
    }

    /// Resident slot `p` (the value of `node`) → host tensor `t`.
    pub(super) fn download(&self, p: Phys, node: &Node, t: &mut Tensor, m: &mut Moves) -> Result<(), RunError> {
        self.dies[p.die]
            .backend
            .download(self.slot_id(p), &node.out, t)
            .map_err(|e| self.slot_err("download", &node.name, p, e))?;
        m.downloads += 1;
        m.download_bytes += tensor_bytes(t);
        Ok(())
    }

    /// Places every layer state the plan uses on its die: uploaded to a resident die's
    /// backend (once; it stays there step after step), home for a host die.
    pub(super) fn place_states(&self, plan: &Plan, seqs: &mut [&mut SeqState], m: &mut Moves) -> Result<(), RunError> {
        let mut sm = StateMoves::default();
        for (s, die) in plan.state_die.iter().enumerate() {
            let Some(d) = *die else { continue };
            for st in seqs.iter_mut() {
                if self.resident[d] {
                    st.place(s, &self.dies[d].backend, &mut sm)?;
                } else {
                    st.bring_home(s, Some(&mut sm))?;
                }
            }
        }
        m.state_uploads += sm.uploads;
        m.state_downloads += sm.downloads;
        m.state_bytes += sm.bytes;
        Ok(())
    }

    /// The values crossing into segment `sp`'s die. Host → host: a copy; resident →
    /// host: a download; host → resident: an upload; resident → resident: the
    /// destination's die-to-die hook, else a download and an upload through the
    /// destination's host staging buffer. Returns the bytes moved.
    pub(super) fn transfers_in(
        &self,
        sp: &SegProgram,
        graph: &Graph,
        phys: &[Phys],
        arena: &mut Arena,
        m: &mut Moves,
    ) -> Result<usize, RunError> {
        let mut moved = 0;
        for &(src, dst, bytes, node) in &sp.transfers {
            let (ps, pd) = (phys[src as usize], phys[dst as usize]);
            let node = graph.node(node);
            match (self.resident[ps.die], self.resident[pd.die]) {
                (false, false) => {
                    let s = arena
                        .get_mut(ps)
                        .take()
                        .expect("transfer source computed by an earlier segment");
                    super::eval::copy_into(arena.get_mut(pd), &s);
                    *arena.get_mut(ps) = Some(s);
                }
                (true, false) => {
                    let mut t = arena.take(pd);
                    let r = self.download(ps, node, &mut t, m);
                    *arena.get_mut(pd) = Some(t);
                    r?;
                }
                (false, true) => {
                    let t = arena
                        .get(ps)
                        .as_ref()
                        .expect("transfer source computed by an earlier segment");
                    self.upload(pd, node, t, m)?;
                }
                (true, true) => {
                    let (from, to) = (self.slot_id(ps), self.slot_id(pd));
                    let (bs, bd) = (&*self.dies[ps.die].backend, &*self.dies[pd.die].backend);
                    let hooked = bd
                        .copy_from(bs, from, to, &node.out)
                        .map_err(|e| self.slot_err("die-to-die copy", &node.name, pd, e))?;
                    if hooked {
                        m.device_copies += 1;
                        m.device_copy_bytes += 4 * node.out.shape.numel() as u64;
                    } else {
                        let mut t = arena.take(pd);
                        let r = self.download(ps, node, &mut t, m);
                        let r = r.and_then(|_| self.upload(pd, node, &t, m));
                        *arena.get_mut(pd) = Some(t);
                        r?;
                    }
                }
            }
            moved += bytes;
        }
        Ok(moved)
    }
}

impl Pass<'_, '_> {
    /// Runs the ops of `sp` on the resident `backend`, between its segment hooks.
    pub(super) fn run_resident(
        &mut self,
        sp: &SegProgram,
        run: &SegmentRun,
        backend: &dyn Backend,
        observer: &mut Option<Observer<'_>>,
        m: &mut Moves,
    ) -> Result<(), RunError> {
        let hook = |what: &str, source: OpError| RunError::Op {
            node: format!("({what} of segment {})", run.segment),
            source,
        };
        backend.begin_segment(run).map_err(|e| hook("start", e))?;
        let res = if observer.is_some() || self.runner.debug >= 3 {
            // The observer (tensor dumps) stays on the caller's thread.
            self.resident_ops(sp, backend, observer, m)
        } else {
            let mut res = Ok(());
            backend.run_pass(&mut || res = self.resident_ops(sp, backend, &mut None, m));
            res
        };
        // the segment is closed even when an op failed (CUDA: end the capture)
        let end = backend.end_segment(run).map_err(|e| hook("end", e));
        res.and(end)
    }

    fn resident_ops(
        &mut self,
        sp: &SegProgram,
        backend: &dyn Backend,
        observer: &mut Option<Observer<'_>>,
        m: &mut Moves,
    ) -> Result<(), RunError> {
        let (graph, runner) = (self.graph, self.runner);
        for op in &sp.ops {
            let node = graph.node(op.node);
            let p_out = self.phys[op.out as usize];
            let out = runner.slot_id(p_out);
            // op.inputs parallels node.inputs (program::build)
            let ins: SmallVec<[ResidentInput<'_>; 6]> = op
                .inputs
                .iter()
                .zip(&node.inputs)
                .map(|(s, &i)| match *s {
                    Src::Val(v) => ResidentInput::Slot(runner.slot_id(self.phys[v as usize]), graph.node(i).out),
                    Src::Weight(w) => ResidentInput::Weight(self.views[w as usize]),
                })
                .collect();
            let t1 = (runner.debug >= 2).then(Instant::now);
            let seqs = &*self.seqs;
            let res = match op.state {
                None => backend.execute_resident(&node.op, &ins, &node.out, None, out),
                Some(s) => {
                    if seqs.iter().any(|q| q.n_layers() <= s) {
                        return Err(no_state(node, s));
                    }
                    if seqs.len() == 1 {
                        backend.execute_resident(&node.op, &ins, &node.out, Some(seqs[0].key(s)), out)
                    } else {
                        let keys: SmallVec<[StateKey; 16]> = seqs.iter().map(|q| q.key(s)).collect();
                        backend.execute_multi_resident(&node.op, &ins, &node.out, &keys, self.lens, out)
                    }
                }
            };
            res.map_err(|source| RunError::Op {
                node: node.name.clone(),
                source,
            })?;
            if let Some(t1) = t1 {
                self.time_op(node.op.kind(), t1);
            }
            if observer.is_some() || runner.debug >= 3 {
                // the observer and value summaries get a downloaded copy
                let mut t = self.arena.take(p_out);
                let r = runner.download(p_out, node, &mut t, m);
                if r.is_ok() {
                    if runner.debug >= 3 {
                        eprintln!("[pn] {}", crate::dump::summary(&node.name, &t));
                    }
                    if let Some(obs) = observer.as_mut() {
                        obs(node, &t);
                    }
                }
                *self.arena.get_mut(p_out) = Some(t);
                r?;
            }
        }
        Ok(())
    }
}
