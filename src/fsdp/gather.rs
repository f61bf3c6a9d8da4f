//! The gathering side of a step: a unit's parameters all-gathered (in
//! `param_dtype`, without waiting), waited for and freed, every buffer
//! counted against `limit_gathered` (room is made by ending the oldest
//! reductions), and the next unit prefetched in the order the first step
//! learned, the same on every rank.

use super::pool::{Pending, Pool, Pooled};
use super::unit::{Full, Phase};
use super::{shard_comm, Fsdp, Precision};
use crate::Result;
use half::{bf16, f16};

impl Fsdp<'_> {
    /// Gather unit `u`'s parameters in `param_dtype`, without waiting.
    pub(super) fn start_gather(&mut self, u: usize) -> Result<()> {
        let dtype = self.config.param_dtype;
        let Some(comm) = shard_comm(self.config.strategy, self.comm, self.intra.as_ref()) else {
            // Not sharded: the whole copy is the shard, rounded.
            let unit = &mut self.units[u];
            let whole = unit.shard[..unit.layout.numel]
                .iter()
                .map(|&v| dtype.round(v))
                .collect();
            unit.full = Full::Ready(whole);
            return Ok(());
        };
        let (s, n) = (self.units[u].layout.shard, self.shard_ranks);
        let at = self.shard_rank * s;
        self.pool.spare = self.room(1);
        /// A pooled buffer of the whole unit with this rank's shard in
        /// place (the other blocks are overwritten by the allgather).
        fn place<T: Pooled>(pool: &mut Pool, shard: &[f32], n: usize, at: usize) -> Vec<T> {
            let mut buf = pool.take::<T>(shard.len() * n);
            for (d, v) in buf[at..at + shard.len()].iter_mut().zip(shard) {
                *d = T::from_f64(f64::from(*v));
            }
            buf
        }
        let shard = &self.units[u].shard;
        let pool = &mut self.pool;
        let pending = match dtype {
            Precision::F32 => {
                Pending::F32(comm.all_gather_async(place::<f32>(pool, shard, n, at))?)
            }
            Precision::F16 => {
                Pending::F16(comm.all_gather_async(place::<f16>(pool, shard, n, at))?)
            }
            Precision::Bf16 => {
                Pending::Bf16(comm.all_gather_async(place::<bf16>(pool, shard, n, at))?)
            }
        };
        self.units[u].full = Full::Pending(pending);
        self.note();
        Ok(())
    }

    /// Whole-unit buffers in use: gathered units, and gradient reductions
    /// in flight.
    pub(super) fn alive(&self) -> usize {
        self.gathered_units() + self.reducing.len()
    }

    /// [`Fsdp::alive`] as every rank counts it (reductions done early
    /// still count until the limit or `finish_backward` waits for them):
    /// what decides a prefetch, so that every rank issues the same
    /// collectives in the same order.
    pub(super) fn alive_on_every_rank(&self) -> usize {
        self.gathered_units() + self.unforced
    }

    /// How many pooled buffers `limit_gathered` leaves room for once
    /// `need` more are in use.
    pub(super) fn room(&self, need: usize) -> usize {
        self.config
            .limit_gathered
            .saturating_sub(self.alive() + need)
    }

    /// Wait for the oldest reductions until `need` more whole-unit buffers
    /// fit in `limit_gathered` (or none is left in flight). Units kept
    /// from forward to backward by `reshard_after_forward: false` are the
    /// caller's choice and do not take the reductions' room.
    pub(super) fn make_room(&mut self, need: usize) -> Result<()> {
        let gathered = if self.config.reshard_after_forward {
            self.gathered_units()
        } else {
            0
        };
        let keep = self.config.limit_gathered.saturating_sub(gathered + need);
        self.retire(keep)?;
        // Every rank has now waited for all but `keep` of them.
        self.unforced = self.unforced.min(keep);
        self.pool.spare = self.room(need);
        Ok(())
    }

    /// After a call: trim the pool to the room the limit leaves, and note
    /// the peaks.
    pub(super) fn note(&mut self) {
        let room = self.room(0);
        self.pool.trim(room);
        let m = self.memory();
        self.peak_gathered = self.peak_gathered.max(m.gathered);
        self.peak_gathered_units = self.peak_gathered_units.max(self.gathered_units());
        let working = m.gathered + m.reducing + m.pooled;
        self.peak_working = self.peak_working.max(working);
        let buffers = self.alive() + self.pool.len();
        self.peak_working_buffers = self.peak_working_buffers.max(buffers);
    }

    /// Note a moment inside a call when `buffers` buffers of `bytes`
    /// together exist besides what `memory()` sees (a buffer being
    /// converted or cut, and its result).
    pub(super) fn note_transient(&mut self, buffers: usize, bytes: usize) {
        let m = self.memory();
        let working = m.gathered + m.reducing + m.pooled + bytes;
        self.peak_working = self.peak_working.max(working);
        let count = self.alive() + self.pool.len() + buffers;
        self.peak_working_buffers = self.peak_working_buffers.max(count);
    }

    pub(super) fn gathered_units(&self) -> usize {
        if self.keeps_whole() {
            return 0;
        }
        self.units
            .iter()
            .filter(|x| !matches!(x.full, Full::Absent))
            .count()
    }

    /// Make sure unit `u`'s gather is issued or done, waiting for old
    /// reductions first if the limit is reached.
    pub(super) fn ensure_gathered(&mut self, u: usize) -> Result<()> {
        if matches!(self.units[u].full, Full::Absent) {
            self.make_room(1)?;
            self.start_gather(u)?;
        }
        Ok(())
    }

    /// Issue the gather of `next` ahead of its use if the limit allows.
    pub(super) fn prefetch(&mut self, next: Option<usize>) -> Result<()> {
        if self.keeps_whole() {
            return Ok(());
        }
        if let Some(v) = next {
            if matches!(self.units[v].full, Full::Absent)
                && self.units[v].phase != Phase::Backward
                && self.alive_on_every_rank() < self.config.limit_gathered
            {
                self.start_gather(v)?;
            }
        }
        Ok(())
    }

    /// The unit after `u` in `order` (or in `default` before the first
    /// step has taught one).
    pub(super) fn next_in(
        order: &[usize],
        u: usize,
        default: Option<usize>,
        learned: bool,
    ) -> Option<usize> {
        if !learned {
            return default;
        }
        let i = order.iter().position(|&x| x == u)?;
        order.get(i + 1).copied()
    }

    pub(super) fn wait_full(&mut self, u: usize) -> Result<()> {
        match std::mem::replace(&mut self.units[u].full, Full::Absent) {
            Full::Pending(p) => {
                let len = self.units[u].layout.shard * self.shard_ranks;
                // A 16-bit gather's f32 copy is one buffer more while both
                // exist (p is no longer counted as alive here): the pool
                // makes what room it can, and the moment counts in the
                // peaks.
                self.pool.spare = self.room(2);
                if !matches!(p, Pending::F32(_)) {
                    self.pool.trim(self.pool.spare);
                    self.note_transient(2, p.bytes(len) + 4 * len);
                }
                self.units[u].full = Full::Ready(p.into_f32(&mut self.pool, len)?);
                self.note();
            }
            other => self.units[u].full = other,
        }
        Ok(())
    }

    /// Free unit `u`'s gathered copy, where the strategy gathers per use.
    pub(super) fn free_full(&mut self, u: usize) -> Result<()> {
        if !self.keeps_whole() {
            self.release(u)?;
        }
        Ok(())
    }

    /// Drop unit `u`'s whole copy, whatever the strategy, its buffer to
    /// the pool (a gather still in flight ends first).
    pub(super) fn release(&mut self, u: usize) -> Result<()> {
        self.wait_full(u)?;
        if let Full::Ready(v) = std::mem::replace(&mut self.units[u].full, Full::Absent) {
            self.pool.give(v);
            self.note();
        }
        Ok(())
    }
}
