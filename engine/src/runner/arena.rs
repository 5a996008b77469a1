//! The runner's buffer slots: per die and class, the persistent buffers of the memory
//! plan's slots ([`crate::planner::MemPlan::slots`]), shared by every geometry (only one
//! pass runs at a time) and reserved for the worst case, so a step allocates nothing.
//!
//! On a resident die the backend holds the buffers (`Backend::reserve_slots`); the
//! arena records the bytes reserved there and keeps host tensors only as staging for
//! uploads and downloads (allocated on first use, then reused).

use crate::planner::program::{Phys, Program, CLASS_I32, N_CLASSES};
use pn_ops::{Shape, Tensor, TensorData};

#[derive(Default)]
pub(super) struct Arena {
    /// `slots[die][class][slot]`; `None` while a pass holds it (its output, being
    /// written) or after the graph output was handed out.
    slots: Vec<Vec<Vec<Option<Tensor>>>>,
    /// Bytes reserved on resident dies: `res[die][class][slot]` (empty for host dies).
    res: Vec<Vec<Vec<usize>>>,
    /// Times a reserved buffer had to grow (a geometry larger than the reservation).
    pub grown: usize,
}

fn empty(class: usize, elems: usize) -> Tensor {
    let data = if class == CLASS_I32 {
        TensorData::I32(Vec::with_capacity(elems))
    } else {
        TensorData::F32(Vec::with_capacity(elems))
    };
    Tensor {
        shape: Shape::d1(0),
        data,
    }
}

impl Arena {
    /// Makes sure every buffer slot of `prog` exists with room for its bytes. Returns the
    /// slots of resident dies (`resident[die]`) whose reservation must grow to `bytes`
    /// (the runner asks their backend; empty once reserved).
    pub fn reserve(&mut self, prog: &Program, resident: &[bool]) -> Vec<(Phys, usize)> {
        let mut grow = Vec::new();
        if self.slots.len() < prog.slot_bytes.len() {
            let n = prog.slot_bytes.len();
            self.slots.resize_with(n, || (0..N_CLASSES).map(|_| Vec::new()).collect());
            self.res.resize_with(n, || (0..N_CLASSES).map(|_| Vec::new()).collect());
        }
        for (d, classes) in prog.slot_bytes.iter().enumerate() {
            for (c, sizes) in classes.iter().enumerate() {
                let v = &mut self.slots[d][c];
                if v.len() < sizes.len() {
                    v.resize_with(sizes.len(), || None);
                }
                if resident.get(d).copied().unwrap_or(false) {
                    let r = &mut self.res[d][c];
                    if r.len() < sizes.len() {
                        r.resize(sizes.len(), 0);
                    }
                    for (slot, (&b, have)) in sizes.iter().zip(r.iter_mut()).enumerate() {
                        if v[slot].is_none() {
                            v[slot] = Some(empty(c, 0));
                        }
                        if b > *have {
                            self.grown += (*have > 0) as usize;
                            *have = b;
                            grow.push((Phys { die: d, class: c, slot }, b));
                        }
                    }
                    continue;
                }
                for (slot, &b) in v.iter_mut().zip(sizes) {
                    let elems = b.div_ceil(4);
                    match slot {
                        None => *slot = Some(empty(c, elems)),
                        Some(t) => {
                            let grew = match &mut t.data {
                                TensorData::F32(x) if x.capacity() < elems => {
                                    x.reserve_exact(elems - x.len());
                                    true
                                }
                                TensorData::I32(x) if x.capacity() < elems => {
                                    x.reserve_exact(elems - x.len());
                                    true
                                }
                                _ => false,
                            };
                            self.grown += grew as usize;
                        }
                    }
                }
            }
        }
        grow
    }

    /// Forgets reservations of resident slots the backend refused (`reserve`'s result).
    pub fn unreserve(&mut self, grow: &[(Phys, usize)]) {
        for (p, _) in grow {
            self.res[p.die][p.class][p.slot] = 0;
        }
    }

    pub fn get(&self, p: Phys) -> &Option<Tensor> {
        &self.slots[p.die][p.class][p.slot]
    }

    pub fn get_mut(&mut self, p: Phys) -> &mut Option<Tensor> {
        &mut self.slots[p.die][p.class][p.slot]
    }

    /// The slot's buffer, taken out to be written (a fresh empty one if none).
    pub fn take(&mut self, p: Phys) -> Tensor {
        self.get_mut(p).take().unwrap_or_else(|| empty(p.class, 0))
    }

    /// Bytes allocated (capacity) for `die`'s buffers, and their number (a resident
    /// die: reserved on its backend).
    pub fn bytes(&self, die: usize) -> (usize, usize) {
        if let Some(r) = self.res.get(die).filter(|r| r.iter().any(|c| !c.is_empty())) {
            let all = r.iter().flatten();
            return (all.clone().sum(), all.count());
        }
        let Some(classes) = self.slots.get(die) else {
            return (0, 0);
        };
        let mut n = 0;
        let mut bytes = 0;
        for t in classes.iter().flatten().flatten() {
            n += 1;
            bytes += 4 * match &t.data {
                TensorData::F32(x) => x.capacity(),
                TensorData::I32(x) => x.capacity(),
            };
        }
        (bytes, n)
    }
}
