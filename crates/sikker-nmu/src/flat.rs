//! A flat open-addressing hash map with `u64` keys and linear probing (§6.1.2: "linear
//! probed open addressing ... extremely cache friendly").
//!
//! Hand-written rather than `std`/`hashbrown`: the NMU design wants one array of
//! `{key, value}` slots aligned to cache lines, so a hit usually costs the one line
//! that holds the slot. `hashbrown` keeps a separate control-byte array (a second line
//! per probe) and SipHash costs more than the whole probe. Deletion uses backward
//! shifting, so there are no tombstones and OTP churn never degrades probe lengths.

/// Key value that marks an empty slot; never a valid key.
pub const EMPTY: u64 = u64::MAX;

/// One slot: key and value side by side, aligned so that a slot never straddles two
/// cache lines when its size divides 64.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct Slot<V> {
    key: u64,
    val: V,
}

/// The 64-bit finaliser of MurmurHash3: a full-avalanche mix of integer keys.
#[inline(always)]
pub fn mix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// The map. Capacity is a power of two; the load factor stays at or below 5/8, which
/// keeps the expected probe length of both hits and misses close to one slot.
#[derive(Clone, Debug)]
pub struct FlatMap<V: Copy + Default> {
    slots: Vec<Slot<V>>,
    mask: usize,
    len: usize,
}

impl<V: Copy + Default> Default for FlatMap<V> {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl<V: Copy + Default> FlatMap<V> {
    /// A map that holds `n` entries without growing.
    pub fn with_capacity(n: usize) -> Self {
        let cap = (n * 8 / 5 + 1).next_power_of_two().max(8);
        FlatMap {
            slots: vec![
                Slot {
                    key: EMPTY,
                    val: V::default()
                };
                cap
            ],
            mask: cap - 1,
            len: 0,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots allocated.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of the slot array.
    pub fn memory_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot<V>>()
    }

    /// The slot array's address range, for memory advice (huge pages) by the caller.
    pub fn region(&self) -> (*const u8, usize) {
        (self.slots.as_ptr() as *const u8, self.memory_bytes())
    }

    /// Looks `key` up.
    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<&V> {
        debug_assert_ne!(key, EMPTY);
        let mut i = mix(key) as usize & self.mask;
        loop {
            let s = &self.slots[i];
            if s.key == key {
                return Some(&s.val);
            }
            if s.key == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Looks `key` up for mutation.
    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        let mut i = mix(key) as usize & self.mask;
        loop {
            if self.slots[i].key == key {
                return Some(&mut self.slots[i].val);
            }
            if self.slots[i].key == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Inserts or replaces; returns the previous value. `key` must not be [`EMPTY`].
    pub fn insert(&mut self, key: u64, val: V) -> Option<V> {
        assert_ne!(key, EMPTY, "EMPTY is not a valid key");
        if (self.len + 1) * 8 > self.slots.len() * 5 {
            self.grow();
        }
        let mut i = mix(key) as usize & self.mask;
        loop {
            let s = &mut self.slots[i];
            if s.key == key {
                return Some(std::mem::replace(&mut s.val, val));
            }
            if s.key == EMPTY {
                s.key = key;
                s.val = val;
                self.len += 1;
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes `key` with backward-shift deletion.
    pub fn remove(&mut self, key: u64) -> Option<V> {
        let mut i = mix(key) as usize & self.mask;
        loop {
            if self.slots[i].key == key {
                break;
            }
            if self.slots[i].key == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
        let out = self.slots[i].val;
        // Shift later members of the probe run back into the hole.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let k = self.slots[j].key;
            if k == EMPTY {
                break;
            }
            let home = mix(k) as usize & self.mask;
            // Move j into the hole if its home is not cyclically within (hole, j].
            let dist_hole = hole.wrapping_sub(home) & self.mask;
            let dist_j = j.wrapping_sub(home) & self.mask;
            if dist_hole <= dist_j {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole].key = EMPTY;
        self.slots[hole].val = V::default();
        self.len -= 1;
        Some(out)
    }

    /// All entries, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slots
            .iter()
            .filter(|s| s.key != EMPTY)
            .map(|s| (s.key, &s.val))
    }

    /// Removes every entry for which `keep` is false.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &V) -> bool) {
        let doomed: Vec<u64> = self
            .iter()
            .filter(|(k, v)| !keep(*k, v))
            .map(|(k, _)| k)
            .collect();
        for k in doomed {
            self.remove(k);
        }
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        let cap = (old.len() * 2).max(8);
        self.slots = vec![
            Slot {
                key: EMPTY,
                val: V::default()
            };
            cap
        ];
        self.mask = cap - 1;
        self.len = 0;
        for s in old {
            if s.key != EMPTY {
                self.insert(s.key, s.val);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn behaves_like_a_hashmap(ops in prop::collection::vec((0u8..3, 0u64..200, any::<u32>()), 0..600)) {
            let mut m: FlatMap<u32> = FlatMap::with_capacity(4);
            let mut r: HashMap<u64, u32> = HashMap::new();
            for (op, k, v) in ops {
                match op {
                    0 => prop_assert_eq!(m.insert(k, v), r.insert(k, v)),
                    1 => prop_assert_eq!(m.remove(k), r.remove(&k)),
                    _ => prop_assert_eq!(m.get(k).copied(), r.get(&k).copied()),
                }
                prop_assert_eq!(m.len(), r.len());
            }
            for (k, v) in &r {
                prop_assert_eq!(m.get(*k), Some(v));
            }
        }
    }

    #[test]
    fn slot_alignment_keeps_lines() {
        assert_eq!(std::mem::size_of::<Slot<u32>>(), 32);
        let m: FlatMap<u32> = FlatMap::with_capacity(100);
        assert_eq!(m.region().0 as usize % 32, 0);
    }
}
