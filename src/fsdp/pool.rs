//! The buffers of the layer's collectives: [`Pending`], a flat buffer in
//! flight in the type it travels in (f32, f16, bf16), and [`Pool`], the
//! buffers of finished collectives kept for the next ones so that a step
//! does not fault whole units' memory in again. Only the owner (`Fsdp`)
//! decides how many it keeps.

use crate::{Element, Result, Work};
use half::{bf16, f16};

/// A flat buffer in flight, in the type it travels in.
pub(super) enum Pending {
    F32(Work<Vec<f32>>),
    F16(Work<Vec<f16>>),
    Bf16(Work<Vec<bf16>>),
}

impl Pending {
    pub(super) fn bytes(&self, len: usize) -> usize {
        len * match self {
            Pending::F32(_) => 4,
            Pending::F16(_) | Pending::Bf16(_) => 2,
        }
    }

    pub(super) fn is_complete(&self) -> bool {
        match self {
            Pending::F32(w) => w.is_complete(),
            Pending::F16(w) => w.is_complete(),
            Pending::Bf16(w) => w.is_complete(),
        }
    }

    /// Wait, and give the whole buffer as f32: an f32 one as it is (padded
    /// length), a 16-bit one converted into a pooled f32 buffer of `len`
    /// and handed back to the pool.
    pub(super) fn into_f32(self, pool: &mut Pool, len: usize) -> Result<Vec<f32>> {
        match self {
            Pending::F32(w) => w.wait(),
            sixteen => sixteen.block(pool, 0..len),
        }
    }

    /// Wait, add elements `range` times `scale` into `into`, and give the
    /// whole buffer back to the pool (no copy of the block is made).
    pub(super) fn add_block(
        self,
        pool: &mut Pool,
        range: std::ops::Range<usize>,
        into: &mut [f32],
        scale: f32,
    ) -> Result<()> {
        fn add<T: Pooled>(
            v: Vec<T>,
            pool: &mut Pool,
            r: std::ops::Range<usize>,
            into: &mut [f32],
            scale: f32,
        ) {
            for (g, x) in into.iter_mut().zip(&v[r]) {
                *g += x.to_f64() as f32 * scale;
            }
            pool.give(v);
        }
        match self {
            Pending::F32(w) => add(w.wait()?, pool, range, into, scale),
            Pending::F16(w) => add(w.wait()?, pool, range, into, scale),
            Pending::Bf16(w) => add(w.wait()?, pool, range, into, scale),
        }
        Ok(())
    }

    /// Wait, and give elements `range` as a pooled f32 buffer; the whole
    /// buffer goes back to the pool.
    pub(super) fn block(self, pool: &mut Pool, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        fn cut<T: Pooled>(v: Vec<T>, pool: &mut Pool, range: std::ops::Range<usize>) -> Vec<f32> {
            let mut out = pool.take::<f32>(range.len());
            for (o, x) in out.iter_mut().zip(&v[range]) {
                *o = x.to_f64() as f32;
            }
            pool.give(v);
            out
        }
        Ok(match self {
            Pending::F32(w) => cut(w.wait()?, pool, range),
            Pending::F16(w) => cut(w.wait()?, pool, range),
            Pending::Bf16(w) => cut(w.wait()?, pool, range),
        })
    }
}

/// Buffers of finished collectives, kept for the next ones. A fresh zeroed
/// buffer for every gather and reduction made the allocator hand whole
/// units' memory back to the kernel and fault it in again every step
/// (1.6 million minor page faults in a 20-step FullShard run of
/// `mlp_fsdp`, docs/performance-log.md). The owner trims it to the room its
/// limit leaves ([`Pool::trim`]); `memory()` counts it.
pub(super) struct Pool {
    pub(super) f32: Vec<Vec<f32>>,
    pub(super) f16: Vec<Vec<f16>>,
    pub(super) bf16: Vec<Vec<bf16>>,
    /// Most buffers to keep while a new one is taken (set by the owner).
    pub(super) spare: usize,
}

/// The element types the pool keeps.
pub(super) trait Pooled: Element {
    fn list(pool: &mut Pool) -> &mut Vec<Vec<Self>>;
}

impl Pooled for f32 {
    fn list(pool: &mut Pool) -> &mut Vec<Vec<Self>> {
        &mut pool.f32
    }
}

impl Pooled for f16 {
    fn list(pool: &mut Pool) -> &mut Vec<Vec<Self>> {
        &mut pool.f16
    }
}

impl Pooled for bf16 {
    fn list(pool: &mut Pool) -> &mut Vec<Vec<Self>> {
        &mut pool.bf16
    }
}

impl Pool {
    /// A buffer of `len` elements, contents unspecified (zero if new).
    /// The pool keeps at most `spare` buffers besides: it drops buffers
    /// before a new one is allocated, so the owner's count holds even then.
    pub(super) fn take<T: Pooled>(&mut self, len: usize) -> Vec<T> {
        let list = T::list(self);
        let found = list
            .iter()
            .position(|v| v.len() == len)
            .map(|i| list.swap_remove(i));
        self.trim(self.spare);
        found.unwrap_or_else(|| vec![T::from_f64(0.0); len])
    }

    pub(super) fn give<T: Pooled>(&mut self, v: Vec<T>) {
        T::list(self).push(v);
    }

    pub(super) fn len(&self) -> usize {
        self.f32.len() + self.f16.len() + self.bf16.len()
    }

    /// Keep at most `keep` buffers, dropping the smallest first (the large
    /// ones are the costly ones to fault in again).
    pub(super) fn trim(&mut self, keep: usize) {
        fn smallest<T>(list: &[Vec<T>], size: usize, kind: u8) -> Option<(usize, u8, usize)> {
            let (i, v) = list.iter().enumerate().min_by_key(|(_, v)| v.len())?;
            Some((size * v.len(), kind, i))
        }
        while self.len() > keep {
            let least = [
                smallest(&self.f32, 4, 0),
                smallest(&self.f16, 2, 1),
                smallest(&self.bf16, 2, 2),
            ]
            .into_iter()
            .flatten()
            .min();
            match least {
                Some((_, 0, i)) => drop(self.f32.swap_remove(i)),
                Some((_, 1, i)) => drop(self.f16.swap_remove(i)),
                Some((_, _, i)) => drop(self.bf16.swap_remove(i)),
                None => break,
            }
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.f32.iter().map(|v| 4 * v.capacity()).sum::<usize>()
            + self.f16.iter().map(|v| 2 * v.capacity()).sum::<usize>()
            + self.bf16.iter().map(|v| 2 * v.capacity()).sum::<usize>()
    }
}
