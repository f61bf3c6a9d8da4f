//! The deterministic randomness every rank shares: splitmix64 for the
//! sequence, and a hash of words for inputs (any element of any rank,
//! computed directly). Changing either changes what every seed replays.

/// The finaliser of splitmix64: a bijective 64-bit mix.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A hash of a few words (for inputs: any element of any rank, directly).
pub(crate) fn hash(words: &[u64]) -> u64 {
    words.iter().fold(0x05ee_d0ff_0cc1_u64, |h, &w| {
        mix(h.wrapping_add(w).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    })
}

/// splitmix64: the sequence every rank draws alike.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    /// True with probability `percent`/100.
    pub(crate) fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}
