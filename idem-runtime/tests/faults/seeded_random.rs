//! A small seeded generator (xorshift64*), so that a run can be repeated with its seed
//! (`IDEM_FAULTS_SEED`) without a dependency.

/// A seeded pseudo-random sequence.
#[derive(Debug, Clone)]
pub struct SeededRandom(u64);

impl SeededRandom {
    /// A sequence from `seed` (any value; 0 is replaced).
    pub fn new(seed: u64) -> Self {
        SeededRandom(seed.max(1) ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// An independent sequence for a task, derived from this one.
    pub fn fork(&mut self, salt: u64) -> Self {
        SeededRandom::new(self.next() ^ salt.wrapping_mul(0x2545_F491_4F6C_DD1D))
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    /// An index below `len` (which must not be 0).
    pub fn below(&mut self, len: usize) -> usize {
        (self.next() % len as u64) as usize
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.next() % 1000 < per_mille
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}
