//! Which stored programs are loaded in the device heap, and which one to evict.
//!
//! Programs are loaded lazily at their first dispatch. When the heap is full or the number of
//! loaded programs would pass `limits.max_cached_programs` (at most 32, the NPU's PDI limit),
//! the least-recently-used program that the work in hand does not use is unloaded; it is
//! reloaded on demand later.

use hsa_core::ProgramId;

#[derive(Debug, Clone, Copy)]
struct Slot {
    device_id: ProgramId,
    last_use: u64,
}

/// The loaded programs, by store id.
#[derive(Debug)]
pub struct ProgramCache {
    loaded: crate::IdMap<u64, Slot>,
    tick: u64,
    max: usize,
}

impl ProgramCache {
    pub fn new(max: usize) -> Self {
        Self {
            loaded: crate::IdMap::default(),
            tick: 0,
            max,
        }
    }

    /// The device id of a loaded program, marking it used now.
    pub fn touch(&mut self, id: u64) -> Option<ProgramId> {
        self.tick += 1;
        let tick = self.tick;
        self.loaded.get_mut(&id).map(|s| {
            s.last_use = tick;
            s.device_id
        })
    }

    pub fn insert(&mut self, id: u64, device_id: ProgramId) {
        self.tick += 1;
        self.loaded.insert(
            id,
            Slot {
                device_id,
                last_use: self.tick,
            },
        );
    }

    pub fn remove(&mut self, id: u64) -> Option<ProgramId> {
        self.loaded.remove(&id).map(|s| s.device_id)
    }

    /// Whether loading one more program would pass the limit.
    pub fn is_full(&self) -> bool {
        self.loaded.len() >= self.max
    }

    pub fn len(&self) -> usize {
        self.loaded.len()
    }

    /// The least-recently-used loaded program not in `protect`.
    pub fn victim(&self, protect: &[u64]) -> Option<u64> {
        self.loaded
            .iter()
            .filter(|(id, _)| !protect.contains(id))
            .min_by_key(|(_, s)| s.last_use)
            .map(|(id, _)| *id)
    }

    /// Every loaded program's store and device ids.
    pub fn drain(&mut self) -> Vec<(u64, ProgramId)> {
        self.loaded
            .drain()
            .map(|(id, s)| (id, s.device_id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_victim_is_the_least_recently_used_unprotected_program() {
        let mut c = ProgramCache::new(3);
        c.insert(1, ProgramId(11));
        c.insert(2, ProgramId(12));
        c.insert(3, ProgramId(13));
        assert!(c.is_full());
        assert_eq!(c.victim(&[]), Some(1));
        assert_eq!(c.touch(1), Some(ProgramId(11)));
        assert_eq!(c.victim(&[]), Some(2));
        assert_eq!(c.victim(&[2]), Some(3));
        assert_eq!(c.victim(&[1, 2, 3]), None);
        assert_eq!(c.remove(2), Some(ProgramId(12)));
        assert!(!c.is_full());
        assert_eq!(c.touch(2), None);
    }
}
