//! Scratch buffers shared by the whole process.
//!
//! The ops of a forward pass run one after another, but on whichever pool thread the pass
//! landed on; per-thread scratch would end up duplicated on every thread over time and
//! multiply the peak RSS by the thread count. A [`Shared`] buffer is one per process: a
//! caller that finds it busy (another die's backend at the same moment, a nested call)
//! works on a fresh one instead, so nothing ever waits for it.

use std::sync::Mutex;

pub struct Shared<T>(Mutex<T>);

impl<T: Default> Shared<T> {
    pub const fn new(t: T) -> Shared<T> {
        Shared(Mutex::new(t))
    }

    /// Runs `f` with the shared buffer, or with a fresh one when it is in use.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        match self.0.try_lock() {
            Ok(mut t) => f(&mut t),
            Err(_) => f(&mut T::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Shared;

    #[test]
    fn busy_buffer_gives_a_fresh_one() {
        static S: Shared<Vec<u8>> = Shared::new(Vec::new());
        S.with(|a| {
            a.push(1);
            // nested: the shared one is taken, so this one is fresh
            S.with(|b| assert!(b.is_empty()));
        });
        S.with(|a| assert_eq!(a, &[1]));
    }
}
