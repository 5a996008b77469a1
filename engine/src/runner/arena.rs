//! The runner's record of the buffer slots: per die and class, the bytes reserved on the
//! die's backend for each slot of the memory plan ([`crate::planner::MemPlan::slots`]),
//! shared by every geometry (only one pass runs at a time) and reserved for the worst
//! case, so a step allocates nothing. The backend holds the buffers
//! (`Backend::reserve`); the arena keeps host tensors only as staging for uploads and
//! downloads (allocated on first use, then reused).

use crate::planner::program::{Phys, Program, CLASS_I32, N_CLASSES};
use pn_ops::{Shape, Tensor, TensorData};

#[derive(Default)]
pub(super) struct Arena {
    /// Host staging buffers, `slots[die][class][slot]`; `None` until first used, and
    /// after the graph output was handed out.
    slots: Vec<Vec<Vec<Option<Tensor>>>>,
    /// Bytes reserved on the dies' backends: `res[die][class][slot]`.
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
    /// Makes sure every buffer slot of `prog` has a staging entry. Returns the slots
    /// whose reservation must grow to `bytes` (the runner asks their backend; empty once
    /// reserved).
    pub fn reserve(&mut self, prog: &Program) -> Vec<(Phys, usize)> {
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
                let r = &mut self.res[d][c];
                if r.len() < sizes.len() {
                    r.resize(sizes.len(), 0);
                }
                for (slot, (&b, have)) in sizes.iter().zip(r.iter_mut()).enumerate() {
                    if b > *have {
                        self.grown += (*have > 0) as usize;
                        *have = b;
                        grow.push((Phys { die: d, class: c, slot }, b));
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

    pub fn get_mut(&mut self, p: Phys) -> &mut Option<Tensor> {
        &mut self.slots[p.die][p.class][p.slot]
    }

    /// The slot's buffer, taken out to be written (a fresh empty one if none).
    pub fn take(&mut self, p: Phys) -> Tensor {
        self.get_mut(p).take().unwrap_or_else(|| empty(p.class, 0))
    }

    /// Bytes reserved for `die`'s buffers on its backend, and their number.
    pub fn bytes(&self, die: usize) -> (usize, usize) {
        let Some(r) = self.res.get(die) else { return (0, 0) };
        let all = r.iter().flatten();
        (all.clone().sum(), all.count())
    }
}
