//! Pass 3: the memory plan. Every value that lives on a die (a computed activation, a
//! graph input materialized there, the destination of a transfer) is a [`Buffer`] with
//! its lifetime: an inclusive range of schedule steps, so an op's output never shares
//! memory with its own inputs.
//!
//! [`MemPlan::slots`] turns the lifetimes into *buffer slots*: values of one die and class
//! whose lifetimes are disjoint share one slot, a persistent buffer the die's backend
//! reserves and writes op outputs into (`HostKernels::kernel_into`; a device backend its
//! own buffers). Slots are kept across steps and geometries (sized for the worst case,
//! `ubatch` tokens), so a step allocates no activations.

use super::place::DieIx;
use crate::graph::NodeId;

/// Alignment of every buffer's size (bytes).
pub const ALIGN: usize = 64;

/// What a buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufKind {
    /// A computed activation on the die that computed it.
    Act,
    /// A graph input (tokens, positions) materialized on this die.
    Input,
    /// The copy of a value computed on the other die.
    TransferIn,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub value: NodeId,
    pub die: DieIx,
    pub kind: BufKind,
    pub bytes: usize,
    /// First and last schedule step (inclusive) at which the buffer holds live data.
    pub start: usize,
    pub end: usize,
}

/// The buffers of a plan, in schedule order (per segment: transfers in, inputs, nodes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemPlan {
    pub buffers: Vec<Buffer>,
    /// Sum of all buffer sizes per die (what no reuse would cost).
    pub naive: Vec<usize>,
}

/// Buffer slots: each buffer's slot (by buffer index) and each slot's size, per die.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slots {
    /// Slot of `buffers[i]` within its die and class.
    pub of: Vec<usize>,
    /// Bytes of each slot, per (die, class): `bytes[die][class][slot]`.
    pub bytes: Vec<Vec<Vec<usize>>>,
}

impl Slots {
    /// Total bytes of the slots of `die` (what the slot arena costs).
    pub fn die_bytes(&self, die: DieIx) -> usize {
        self.bytes.get(die).map_or(0, |c| c.iter().flatten().sum())
    }
}

pub fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

impl MemPlan {
    pub fn new(buffers: Vec<Buffer>, n_dies: usize) -> MemPlan {
        let mut naive = vec![0usize; n_dies];
        buffers.iter().for_each(|b| naive[b.die] += b.bytes);
        MemPlan { buffers, naive }
    }

    /// Assigns every buffer a slot: buffers of one die and one `class` (e.g. the element
    /// type, so a slot never changes type) whose lifetimes are disjoint share a slot.
    /// Greedy by size (TFLite's shared-object assignment): largest buffer first, each
    /// into the smallest existing slot that is free for its whole lifetime, else a new
    /// slot of its size, so a slot's size is that of its first (largest) buffer. Two
    /// buffers that are live together never share a slot (in particular an op's output
    /// and its inputs).
    pub fn slots(&self, class: &dyn Fn(usize) -> usize) -> Slots {
        let mut order: Vec<usize> = (0..self.buffers.len()).collect();
        order.sort_by_key(|&i| {
            let b = &self.buffers[i];
            (std::cmp::Reverse(b.bytes), b.start, i)
        });
        let n_dies = self.naive.len().max(1 + self.buffers.iter().map(|b| b.die).max().unwrap_or(0));
        let mut bytes: Vec<Vec<Vec<usize>>> = vec![Vec::new(); n_dies];
        // per (die, class, slot): the lifetimes assigned to it
        type Spans = Vec<Vec<(usize, usize)>>;
        let mut spans: Vec<Vec<Spans>> = vec![Vec::new(); n_dies];
        let mut of = vec![0usize; self.buffers.len()];
        for i in order {
            let b = &self.buffers[i];
            let c = class(i);
            if bytes[b.die].len() <= c {
                bytes[b.die].resize(c + 1, Vec::new());
                spans[b.die].resize(c + 1, Vec::new());
            }
            let (sizes, busy) = (&mut bytes[b.die][c], &mut spans[b.die][c]);
            let free = |s: &usize| busy[*s].iter().all(|&(s0, e0)| e0 < b.start || b.end < s0);
            let slot = (0..sizes.len())
                .filter(free)
                .min_by_key(|&s| (sizes[s], s))
                .unwrap_or_else(|| {
                    sizes.push(b.bytes);
                    busy.push(Vec::new());
                    sizes.len() - 1
                });
            busy[slot].push((b.start, b.end));
            of[i] = slot;
        }
        Slots { of, bytes }
    }

    /// Peak bytes live at once on `die` (a lower bound for any arena).
    pub fn peak_live(&self, die: DieIx) -> usize {
        let mut ev: Vec<(usize, i64)> = Vec::new();
        for b in self.buffers.iter().filter(|b| b.die == die) {
            ev.push((b.start, b.bytes as i64));
            ev.push((b.end + 1, -(b.bytes as i64)));
        }
        ev.sort_by_key(|&(t, d)| (t, d));
        let (mut live, mut peak) = (0i64, 0i64);
        for (_, d) in ev {
            live += d;
            peak = peak.max(live);
        }
        peak as usize
    }
}
