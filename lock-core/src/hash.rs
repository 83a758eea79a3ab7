//! Hashing for the few tables on every lock cycle, where std's SipHash (built to resist
//! flooding by chosen keys) cost about 450 instructions per lock in callgrind: the watchdog's
//! table, keyed by acquisition ids this process counts itself (no outsider chooses them), and
//! the Redis backend's contention hint, keyed by lock names, a fixed-size table without chains
//! where a chosen collision costs one round trip more, never a wrong answer.

use std::hash::{BuildHasher, Hasher};

/// The multiplier of Fibonacci hashing (2^64 / the golden ratio, odd).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// A multiply-and-rotate hasher, 8 bytes a step (FxHash's scheme), started from a seed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(u64::try_from(n).unwrap_or(u64::MAX));
    }

    fn finish(&self) -> u64 {
        // The multiply leaves the low bits (a hash table's index) depending on the low bits of
        // the input only: fold the well-mixed high half down.
        self.0 ^ (self.0 >> 32)
    }
}

/// Builds [`FastHasher`]s from one seed: zero for keys this process chooses (ids), random for
/// names that come from outside (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FastHash(u64);

impl FastHash {
    /// With a random seed: which names collide differs from process to process.
    #[cfg(feature = "redis")]
    pub(crate) fn random() -> Self {
        FastHash(rand::random())
    }
}

impl BuildHasher for FastHash {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_spread_over_a_table_and_names_hash_by_their_bytes() {
        // Consecutive ids land in distinct slots of a small power-of-two table.
        let ids = FastHash::default();
        let slots: std::collections::HashSet<u64> =
            (1..=64u64).map(|id| ids.hash_one(id) % 64).collect();
        assert!(slots.len() > 32, "{}", slots.len());
        // Equal names hash equal; a name and its prefix (a remainder shorter than a word) do not.
        let names = FastHash(7);
        assert_eq!(names.hash_one("lock:{a}"), names.hash_one("lock:{a}"));
        assert_ne!(names.hash_one("lock:{a}"), names.hash_one("lock:{a"));
        assert_ne!(
            names.hash_one("lock:{ab}xyz"),
            names.hash_one("lock:{ab}xyw")
        );
    }
}
