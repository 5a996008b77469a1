//! The runner's side of the backend protocol's data moves (crate::backend): slot
//! reservation, uploads / downloads at the edges of a die, die-boundary transfers, and
//! layer-state placement. Moves to or from host memory ([`Memory::Host`]) are copies,
//! not counted as host <-> device traffic.

use super::arena::Arena;
use super::{RunError, Runner};
use crate::backend::{Memory, SlotId, SlotSpec};
use crate::graph::{Graph, Node};
use crate::planner::debug::Counters;
use crate::planner::program::{Phys, SegProgram, CLASS_I32};
use crate::planner::Plan;
use crate::state::SeqState;
use pn_ops::{DType, OpError, Tensor, TensorData};

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

    fn on_device(&self, die: usize) -> bool {
        self.memory[die] == Memory::Device
    }

    /// Asks each die's backend to reserve (or grow) its slots in `grow`.
    pub(super) fn reserve_slots(&self, grow: &[(Phys, usize)]) -> Result<(), RunError> {
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
                    .reserve(&specs)
                    .map_err(|e| self.slot_err("reservation", &node, first.0, e))?;
            }
        }
        Ok(())
    }

    /// Host tensor `t` (the value of `node`) → slot `p`.
    pub(super) fn upload(&self, p: Phys, node: &Node, t: &Tensor, m: &mut Counters) -> Result<(), RunError> {
        self.dies[p.die]
            .backend
            .upload(self.slot_id(p), t)
            .map_err(|e| self.slot_err("upload", &node.name, p, e))?;
        if self.on_device(p.die) {
            m.uploads += 1;
            m.upload_bytes += tensor_bytes(t);
        }
        Ok(())
    }

    /// Slot `p` (the value of `node`) → host tensor `t`.
    pub(super) fn download(&self, p: Phys, node: &Node, t: &mut Tensor, m: &mut Counters) -> Result<(), RunError> {
        self.dies[p.die]
            .backend
            .download(self.slot_id(p), &node.out, t)
            .map_err(|e| self.slot_err("download", &node.name, p, e))?;
        if self.on_device(p.die) {
            m.downloads += 1;
            m.download_bytes += tensor_bytes(t);
        }
        Ok(())
    }

    /// Places every layer state the plan uses on its die: uploaded to a device die's
    /// backend (once; it stays there step after step), home for a host-memory die.
    pub(super) fn place_states(&self, plan: &Plan, seqs: &mut [&mut SeqState], m: &mut Counters) -> Result<(), RunError> {
        if !self.memory.contains(&Memory::Device) && !seqs.iter().any(|s| s.is_resident()) {
            return Ok(());
        }
        for (s, die) in plan.state_die.iter().enumerate() {
            let Some(d) = *die else { continue };
            for st in seqs.iter_mut() {
                if self.on_device(d) {
                    st.place(s, &self.dies[d].backend, m)?;
                } else {
                    st.bring_home(s, Some(&mut *m))?;
                }
            }
        }
        Ok(())
    }

    /// The values crossing into segment `sp`'s die: the destination's die-to-die copy
    /// where it can (same backend type), else a download and an upload through the
    /// destination's host staging buffer. Returns the bytes moved.
    pub(super) fn transfers_in(
        &self,
        sp: &SegProgram,
        graph: &Graph,
        phys: &[Phys],
        arena: &mut Arena,
        m: &mut Counters,
    ) -> Result<usize, RunError> {
        let mut moved = 0;
        for &(src, dst, bytes, node) in &sp.transfers {
            let (ps, pd) = (phys[src as usize], phys[dst as usize]);
            let node = graph.node(node);
            let (from, to) = (self.slot_id(ps), self.slot_id(pd));
            let (bs, bd) = (&*self.dies[ps.die].backend, &*self.dies[pd.die].backend);
            let hooked = bd
                .copy_from(bs, from, to, &node.out)
                .map_err(|e| self.slot_err("die-to-die copy", &node.name, pd, e))?;
            if hooked {
                if self.on_device(ps.die) && self.on_device(pd.die) {
                    m.device_copies += 1;
                    m.device_copy_bytes += 4 * node.out.shape.numel() as u64;
                }
            } else {
                let mut t = arena.take(pd);
                let r = self.download(ps, node, &mut t, m);
                let r = r.and_then(|_| self.upload(pd, node, &t, m));
                *arena.get_mut(pd) = Some(t);
                r?;
            }
            moved += bytes;
        }
        Ok(moved)
    }
}
