//! Host-side tables of the resident protocol (no device calls, unit tested without a GPU):
//! buffer slots by [`SlotId`] and layer states by [`StateKey`], generic over what a slot
//! or state holds (device buffers in the backend, fakes in the tests).

use crate::opnd::value_bytes;
use pn_engine::{SlotId, SlotSpec, StateKey};
use pn_ops::{DType, TensorMeta};
use std::collections::HashMap;

/// A slot's buffer: its size in bytes.
pub trait SlotMem {
    fn bytes(&self) -> usize;
}

pub struct Slot<B> {
    pub mem: B,
    /// Bytes the runner reserved (the buffer holds at least as many).
    pub reserved: usize,
    pub dtype: DType,
    /// The i32 values last uploaded from the host (token ids, positions), while no kernel
    /// or copy has written the slot since: ops that need them on the host (attention's
    /// runs, id range checks) read them here instead of downloading.
    pub mirror: Option<Vec<i32>>,
}

/// Buffer slots: one buffer per [`SlotId`], allocated at the reserved (worst-case) size
/// and never reallocated unless a reservation grows (counted in `moved`; the runner
/// reserves the worst case first, so this stays 0).
pub struct SlotTable<B> {
    slots: HashMap<SlotId, Slot<B>>,
    /// Buffers replaced by a larger reservation.
    pub moved: u64,
}

impl<B> Default for SlotTable<B> {
    fn default() -> Self {
        SlotTable {
            slots: HashMap::new(),
            moved: 0,
        }
    }
}

impl<B: SlotMem> SlotTable<B> {
    /// Reserves (or grows) the slots of `specs`; `alloc` makes a buffer of at least the
    /// given bytes. Returns how many buffers were allocated. A slot already holding its
    /// bytes keeps its buffer (same address).
    pub fn reserve<E>(
        &mut self,
        specs: &[SlotSpec],
        mut alloc: impl FnMut(usize) -> Result<B, E>,
    ) -> Result<usize, E> {
        let mut n = 0;
        for sp in specs {
            match self.slots.get_mut(&sp.id) {
                Some(s) if s.mem.bytes() >= sp.bytes => {
                    s.reserved = s.reserved.max(sp.bytes);
                    s.dtype = sp.dtype;
                }
                old => {
                    let mem = alloc(sp.bytes)?;
                    n += 1;
                    if old.is_some() {
                        self.moved += 1;
                    }
                    let slot = Slot {
                        mem,
                        reserved: sp.bytes,
                        dtype: sp.dtype,
                        mirror: None,
                    };
                    self.slots.insert(sp.id, slot);
                }
            }
        }
        Ok(n)
    }
    /// Frees every slot of `arena`; returns how many.
    pub fn release(&mut self, arena: u64) -> usize {
        let before = self.slots.len();
        self.slots.retain(|id, _| id.arena != arena);
        before - self.slots.len()
    }
    pub fn get(&self, id: SlotId) -> Result<&Slot<B>, String> {
        self.slots
            .get(&id)
            .ok_or_else(|| format!("{id} is not reserved"))
    }
    pub fn get_mut(&mut self, id: SlotId) -> Result<&mut Slot<B>, String> {
        self.slots
            .get_mut(&id)
            .ok_or_else(|| format!("{id} is not reserved"))
    }
    /// Slot `id` about to hold (or holding) a value of `meta`: the slot and the value's
    /// bytes, which must fit the reservation.
    pub fn value(&self, id: SlotId, meta: &TensorMeta) -> Result<(&Slot<B>, usize), String> {
        let s = self.get(id)?;
        let bytes = value_bytes(meta)?;
        if bytes > s.reserved || bytes > s.mem.bytes() {
            return Err(format!(
                "{id}: a value of {meta} ({bytes} bytes) does not fit the {} bytes reserved",
                s.reserved
            ));
        }
        Ok((s, bytes))
    }
    /// The host mirror of slot `id` when it holds exactly the i32 value of `meta`.
    pub fn mirror(&self, id: SlotId, meta: &TensorMeta) -> Option<&[i32]> {
        let s = self.slots.get(&id)?;
        s.mirror
            .as_deref()
            .filter(|m| meta.dtype == DType::I32 && m.len() == meta.shape.numel())
    }
    /// Slot `id` was written on the device: its host mirror is stale.
    pub fn written(&mut self, id: SlotId) {
        if let Some(s) = self.slots.get_mut(&id) {
            s.mirror = None;
        }
    }
    pub fn len(&self) -> usize {
        self.slots.len()
    }
    /// Bytes of the buffers held.
    pub fn bytes(&self) -> usize {
        self.slots.values().map(|s| s.mem.bytes()).sum()
    }
}

/// Layer states by key: uploaded, forked, released.
pub struct Keyed<S> {
    map: HashMap<StateKey, S>,
}

impl<S> Default for Keyed<S> {
    fn default() -> Self {
        Keyed {
            map: HashMap::new(),
        }
    }
}

impl<S> Keyed<S> {
    /// Holds `s` under `key` (a state uploaded again replaces the older copy).
    pub fn put(&mut self, key: StateKey, s: S) -> Option<S> {
        self.map.insert(key, s)
    }
    pub fn get(&self, key: StateKey) -> Result<&S, String> {
        self.map
            .get(&key)
            .ok_or_else(|| format!("layer state {key:?} is not held"))
    }
    pub fn get_mut(&mut self, key: StateKey) -> Result<&mut S, String> {
        self.map
            .get_mut(&key)
            .ok_or_else(|| format!("layer state {key:?} is not held"))
    }
    /// `to` becomes a copy of `from`: written into the state `to` already holds where
    /// `into` can (same geometry: `Ok(true)`, the buffers and so their addresses kept, a
    /// slot's row), else a new one made by `copy`.
    pub fn fork<E: From<String>>(
        &mut self,
        from: StateKey,
        to: StateKey,
        into: impl FnOnce(&S, &mut S) -> Result<bool, E>,
        copy: impl FnOnce(&S) -> Result<S, E>,
    ) -> Result<(), E> {
        self.get(from)?;
        if from != to {
            if let Some(mut held) = self.map.remove(&to) {
                let done = into(self.get(from)?, &mut held);
                self.map.insert(to, held);
                if done? {
                    return Ok(());
                }
            }
        }
        let s = copy(self.get(from)?)?;
        self.map.insert(to, s);
        Ok(())
    }
    /// Drops `key`; whether it was held.
    pub fn release(&mut self, key: StateKey) -> bool {
        self.map.remove(&key).is_some()
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn values(&self) -> impl Iterator<Item = &S> {
        self.map.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pn_ops::Shape;

    struct Fake(usize, u32);
    impl SlotMem for Fake {
        fn bytes(&self) -> usize {
            self.0
        }
    }

    fn id(arena: u64, slot: u32) -> SlotId {
        SlotId {
            arena,
            class: 0,
            slot,
        }
    }
    fn spec(arena: u64, slot: u32, bytes: usize) -> SlotSpec {
        SlotSpec {
            id: id(arena, slot),
            dtype: DType::F32,
            bytes,
        }
    }

    #[test]
    fn slots_are_allocated_once_at_the_reserved_size() {
        let mut t = SlotTable::<Fake>::default();
        let mut serial = 0;
        let mut alloc = |b: usize| -> Result<Fake, String> {
            serial += 1;
            Ok(Fake(b, serial))
        };
        assert_eq!(
            t.reserve(&[spec(1, 0, 400), spec(1, 1, 64)], &mut alloc),
            Ok(2)
        );
        // the same or a smaller size again: same buffers
        assert_eq!(
            t.reserve(&[spec(1, 0, 400), spec(1, 1, 8)], &mut alloc),
            Ok(0)
        );
        assert_eq!(
            (
                t.get(id(1, 0)).unwrap().mem.1,
                t.get(id(1, 1)).unwrap().mem.1
            ),
            (1, 2)
        );
        assert_eq!(t.get(id(1, 1)).unwrap().reserved, 64);
        assert_eq!(t.moved, 0);
        // a larger reservation replaces the buffer (counted)
        assert_eq!(t.reserve(&[spec(1, 1, 65)], &mut alloc), Ok(1));
        assert_eq!((t.get(id(1, 1)).unwrap().mem.1, t.moved), (3, 1));
        assert_eq!(t.bytes(), 465);
        let f32s = |n| TensorMeta {
            shape: Shape::d1(n),
            dtype: DType::F32,
        };
        assert_eq!(t.value(id(1, 0), &f32s(100)).map(|(_, b)| b), Ok(400));
        assert!(
            t.value(id(1, 0), &f32s(101)).is_err(),
            "past the reservation"
        );
        assert!(t
            .value(id(2, 0), &f32s(1))
            .err()
            .unwrap()
            .contains("not reserved"));
        // a failing allocation leaves the table as it was
        assert_eq!(
            t.reserve(&[spec(3, 0, 8)], |_| Err::<Fake, _>("oom".to_string())),
            Err("oom".into())
        );
        assert!(t.get(id(3, 0)).is_err());
    }

    #[test]
    fn release_frees_one_arena() {
        let mut t = SlotTable::<Fake>::default();
        let alloc = |b| Ok::<_, String>(Fake(b, 0));
        t.reserve(&[spec(1, 0, 4), spec(1, 1, 4), spec(2, 0, 4)], alloc)
            .unwrap();
        assert_eq!(t.release(1), 2);
        assert_eq!(t.release(1), 0);
        assert_eq!(t.len(), 1);
        assert!(t.get(id(2, 0)).is_ok());
    }

    #[test]
    fn mirrors_follow_uploads_and_writes() {
        let mut t = SlotTable::<Fake>::default();
        t.reserve(&[spec(1, 0, 64)], |b| Ok::<_, String>(Fake(b, 0)))
            .unwrap();
        let i32s = |n| TensorMeta {
            shape: Shape::d1(n),
            dtype: DType::I32,
        };
        assert_eq!(t.mirror(id(1, 0), &i32s(3)), None);
        t.get_mut(id(1, 0)).unwrap().mirror = Some(vec![7, 8, 9]);
        assert_eq!(t.mirror(id(1, 0), &i32s(3)), Some(&[7, 8, 9][..]));
        assert_eq!(t.mirror(id(1, 0), &i32s(2)), None, "another value");
        let f = TensorMeta {
            shape: Shape::d1(3),
            dtype: DType::F32,
        };
        assert_eq!(t.mirror(id(1, 0), &f), None, "not i32");
        t.written(id(1, 0));
        assert_eq!(
            t.mirror(id(1, 0), &i32s(3)),
            None,
            "a kernel wrote the slot"
        );
    }

    #[test]
    fn states_by_key() {
        let k = |seq, layer| StateKey { seq, layer };
        let mut s = Keyed::<Vec<u8>>::default();
        assert!(s.put(k(1, 0), vec![1]).is_none());
        assert_eq!(
            s.put(k(1, 0), vec![2]),
            Some(vec![1]),
            "uploaded again: replaced"
        );
        s.put(k(1, 1), vec![3]);
        let same_len = |v: &Vec<u8>, d: &mut Vec<u8>| {
            let fits = v.len() == d.len();
            if fits {
                d.copy_from_slice(v);
            }
            Ok::<_, String>(fits)
        };
        s.fork(k(1, 0), k(2, 0), same_len, |v| Ok::<_, String>(v.clone()))
            .unwrap();
        s.get_mut(k(2, 0)).unwrap().push(9);
        assert_eq!(
            (s.get(k(1, 0)).unwrap(), s.get(k(2, 0)).unwrap()),
            (&vec![2], &vec![2, 9]),
            "the fork is independent"
        );
        assert!(s
            .fork(k(5, 0), k(6, 0), same_len, |v| Ok::<_, String>(v.clone()))
            .unwrap_err()
            .contains("not held"));
        // into a held state of the same geometry: in place (the same allocation); of
        // another: replaced
        let at = s.get(k(2, 0)).unwrap().as_ptr();
        s.put(k(1, 2), vec![7, 7]);
        s.fork(k(1, 2), k(2, 0), same_len, |v| Ok::<_, String>(v.clone()))
            .unwrap();
        assert_eq!(s.get(k(2, 0)).unwrap(), &vec![7, 7]);
        assert_eq!(s.get(k(2, 0)).unwrap().as_ptr(), at, "copied in place");
        s.fork(k(1, 1), k(2, 0), same_len, |v| Ok::<_, String>(v.clone()))
            .unwrap();
        assert_eq!(s.get(k(2, 0)).unwrap(), &vec![3], "another geometry: a new state");
        s.release(k(1, 2));
        assert!(s.release(k(1, 0)));
        assert!(!s.release(k(1, 0)));
        assert!(s.get(k(1, 0)).is_err());
        assert_eq!(s.len(), 2);
    }
}
