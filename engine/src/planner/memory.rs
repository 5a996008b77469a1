//! Pass 3: the memory plan. Every value that lives on a die (a computed activation, a
//! graph input materialized there, the destination of a transfer) gets an offset in that
//! die's arena. Offsets are assigned greedily, largest value first, each into the
//! best-fitting gap among the values whose lifetimes overlap it (TFLite's "greedy by
//! size"). Lifetimes are inclusive ranges of schedule steps, so an op's output never
//! shares memory with its own inputs.
//!
//! The CPU runner executes the plan through [`MemPlan::slots`]: the same lifetimes, but
//! values with disjoint lifetimes share one *buffer slot* (a persistent `Vec` that the
//! backend writes into, `HostKernels::kernel_into`) instead of an offset in one block, so
//! every output is an owned tensor the borrow checker can hand out while its inputs are
//! read. Slots are kept across steps and geometries (sized for the worst case,
//! `ubatch` tokens), so their allocations never move once reserved.

use super::place::DieIx;
use crate::graph::NodeId;
use std::fmt;

/// Alignment of every buffer in an arena (bytes).
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
    pub offset: usize,
    pub bytes: usize,
    /// First and last schedule step (inclusive) at which the buffer holds live data.
    pub start: usize,
    pub end: usize,
}

impl Buffer {
    fn live_with(&self, o: &Buffer) -> bool {
        self.die == o.die && self.start <= o.end && o.start <= self.end
    }
    fn overlaps(&self, o: &Buffer) -> bool {
        self.offset < o.offset + o.bytes && o.offset < self.offset + self.bytes
    }
}

/// Per-die arenas: one fixed block per die, reserved once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemPlan {
    pub buffers: Vec<Buffer>,
    /// Arena bytes per die (the plan's high-water mark).
    pub arena: Vec<usize>,
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
        self.bytes
            .get(die)
            .map_or(0, |c| c.iter().flatten().sum())
    }
}

/// Two simultaneously-live buffers of one die overlap.
#[derive(Clone, Debug, PartialEq)]
pub struct Overlap {
    pub a: NodeId,
    pub b: NodeId,
    pub die: DieIx,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "values %{} and %{} are live together on die {} and overlap",
            self.a.index(),
            self.b.index(),
            self.die
        )
    }
}

pub fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

impl MemPlan {
    /// Assigns offsets to `bufs` (their `offset` is ignored on input).
    pub fn assign(mut bufs: Vec<Buffer>, n_dies: usize) -> MemPlan {
        let mut order: Vec<usize> = (0..bufs.len()).collect();
        order.sort_by_key(|&i| {
            (
                std::cmp::Reverse(bufs[i].bytes),
                bufs[i].start,
                bufs[i].value.index(),
            )
        });
        let mut placed: Vec<usize> = Vec::with_capacity(bufs.len());
        let mut arena = vec![0usize; n_dies];
        let mut naive = vec![0usize; n_dies];
        for &i in &order {
            let b = bufs[i].clone();
            let mut busy: Vec<(usize, usize)> = placed
                .iter()
                .map(|&j| &bufs[j])
                .filter(|o| o.live_with(&b))
                .map(|o| (o.offset, o.offset + o.bytes))
                .collect();
            busy.sort_unstable();
            // best fit: the smallest gap that holds it, else after the last busy range
            let (mut best, mut best_gap, mut cursor) = (None, usize::MAX, 0usize);
            for &(s, e) in &busy {
                if s >= cursor + b.bytes && s - cursor < best_gap {
                    best = Some(cursor);
                    best_gap = s - cursor;
                }
                cursor = cursor.max(e);
            }
            let offset = best.unwrap_or(cursor);
            bufs[i].offset = offset;
            arena[b.die] = arena[b.die].max(offset + b.bytes);
            naive[b.die] += b.bytes;
            placed.push(i);
        }
        MemPlan {
            buffers: bufs,
            arena,
            naive,
        }
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
        let n_dies = self
            .arena
            .len()
            .max(1 + self.buffers.iter().map(|b| b.die).max().unwrap_or(0));
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

    /// No two simultaneously-live buffers of one die overlap.
    pub fn validate(&self) -> Result<(), Overlap> {
        let mut by_start: Vec<&Buffer> = self.buffers.iter().collect();
        by_start.sort_by_key(|b| (b.start, b.end));
        for (k, a) in by_start.iter().enumerate() {
            for b in &by_start[k + 1..] {
                if b.start > a.end {
                    break;
                }
                if a.live_with(b) && a.overlaps(b) {
                    return Err(Overlap {
                        a: a.value,
                        b: b.value,
                        die: a.die,
                    });
                }
            }
        }
        Ok(())
    }

    /// The buffer of `value` on `die`.
    pub fn buffer(&self, value: NodeId, die: DieIx) -> Option<&Buffer> {
        self.buffers
            .iter()
            .find(|b| b.value == value && b.die == die)
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
