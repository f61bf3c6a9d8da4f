//! The gradient side of a step: a unit's gradient reduce-scattered (or
//! only accumulated while synchronisation is off), the reductions folded
//! into the shards in order, the step's misuses named on every rank at
//! `finish_backward`, gradient clipping and the optimizer step.

use super::pool::{Pending, Pool, Pooled};
use super::unit::{Fault, Phase, Reducing};
use super::{shard_comm, Fsdp, Optimizer, Precision};
use crate::{Communicator, Error, ReduceOp, Result, Work};

impl Fsdp<'_> {
    /// Unit `u`'s gradient (`unit_len(u)` elements, of this rank's local
    /// loss) is ready: start its reduction (reduce-scatter into the
    /// gradient shards, averaged over every rank), free its gathered
    /// parameters. With synchronisation off (`set_sync(false)`) the
    /// gradient is only accumulated here. `InvalidArgument` if `u` was not
    /// gathered for backward.
    pub fn post_backward(&mut self, u: usize, grad: &[f32]) -> Result<()> {
        self.check_unit(u)?;
        if self.units[u].phase != Phase::Backward {
            return Err(self.fault(u, Fault::NotGatheredForBackward, ""));
        }
        let numel = self.units[u].layout.numel;
        let mut wrong = None;
        let zeros;
        let grad = if grad.len() == numel {
            grad
        } else {
            // Still reduce (zeros), so that every rank's collectives stay
            // the same; the step fails everywhere at finish_backward.
            let detail = format!("{} elements where the unit has {numel}", grad.len());
            wrong = Some(self.fault(u, Fault::WrongLength, &detail));
            zeros = vec![0f32; numel];
            &zeros[..]
        };
        self.free_full(u)?;
        self.units[u].phase = Phase::Idle;
        if !self.sync {
            let acc = self.units[u].acc.get_or_insert_with(|| vec![0f32; numel]);
            for (a, g) in acc.iter_mut().zip(grad) {
                *a += g;
            }
            return wrong.map_or(Ok(()), Err);
        }
        let acc = self.units[u].acc.take();
        // 16-bit sums divide by the rank count first, so that a sum over
        // many ranks cannot overflow (f16 ends at 65504); f32 after.
        let pre = self.pre_scale();
        let total = |i: usize| (grad[i] + acc.as_ref().map_or(0.0, |a| a[i])) * pre;
        let s = self.units[u].layout.shard;
        let n = self.shard_ranks;
        /// A pooled buffer of the padded unit: the gradient, then zeros.
        fn flat<T: Pooled>(
            pool: &mut Pool,
            len: usize,
            numel: usize,
            total: impl Fn(usize) -> f32,
        ) -> Vec<T> {
            let mut buf = pool.take::<T>(len);
            for (i, d) in buf[..numel].iter_mut().enumerate() {
                *d = T::from_f64(f64::from(total(i)));
            }
            buf[numel..].fill(T::from_f64(0.0));
            buf
        }
        /// Reduce-scatter over the shard's ranks, or (not sharded) an
        /// allreduce over every rank; a sum either way.
        fn reduce<T: Pooled>(
            shard_comm: Option<&Communicator>,
            comm: &Communicator,
            buf: Vec<T>,
        ) -> Result<Work<Vec<T>>> {
            match shard_comm {
                Some(c) => c.reduce_scatter_async(buf, ReduceOp::Sum),
                None => comm.all_reduce_async(buf, ReduceOp::Sum),
            }
        }
        let len = s * n;
        self.make_room(1)?;
        let by = shard_comm(self.config.strategy, self.comm, self.intra.as_ref());
        let pool = &mut self.pool;
        let work = match self.config.reduce_dtype {
            Precision::F32 => Pending::F32(reduce(by, self.comm, flat(pool, len, numel, total))?),
            Precision::F16 => Pending::F16(reduce(by, self.comm, flat(pool, len, numel, total))?),
            Precision::Bf16 => Pending::Bf16(reduce(by, self.comm, flat(pool, len, numel, total))?),
        };
        self.reducing.push(Reducing { unit: u, work });
        self.unforced += 1;
        // Fold in the reductions that are done (make_room waited for the
        // ones the limit had no room for).
        self.retire(self.reducing.len())?;
        self.note();
        wrong.map_or(Ok(()), Err)
    }

    /// Wait for every gradient reduction of this step and add the averages
    /// into the gradient shards (under `HybridShard`, after an allreduce of
    /// each shard across the groups). A unit without a gradient this step
    /// keeps a zero one. A collective (one small allreduce besides the
    /// reductions): if any rank misused the protocol in this step (a unit
    /// gathered twice, a gradient of the wrong length, ...), every rank
    /// gets `InvalidArgument` naming that rank and unit, and the step's
    /// gradients are dropped everywhere.
    pub fn finish_backward(&mut self) -> Result<()> {
        // Every rank learns every rank's first misuse of this step (one
        // small allreduce, issued after the reductions).
        let size = self.comm.size();
        let mut status = vec![0u64; size];
        status[self.rank] = self.fault.take().map_or(0, |(u, f)| f.encode(u));
        let told = self.comm.all_reduce_in_place(&mut status, ReduceOp::Sum);
        let summed = self.sum_reductions();
        told?;
        if let Some((r, (fault, u))) = status
            .iter()
            .enumerate()
            .find_map(|(r, &v)| Fault::decode(v).map(|f| (r, f)))
        {
            // The step is void on every rank: no gradient of it is kept,
            // and the next step starts with every unit idle.
            for x in 0..self.units.len() {
                self.free_full(x)?;
                let unit = &mut self.units[x];
                unit.grad.iter_mut().for_each(|g| *g = 0.0);
                unit.acc = None;
                unit.phase = Phase::Idle;
            }
            let name = self.units.get(u).map_or("?", |x| x.spec.name.as_str());
            return Err(Error::InvalidArgument(format!(
                "fsdp: rank {r} misused unit `{name}` (#{u}) in this step: {} \
                 (seen on rank {}; the step's gradients are dropped on every rank)",
                fault.what(),
                self.rank
            )));
        }
        summed
    }

    /// Wait for the step's reductions and add them into the gradient shards.
    pub(super) fn sum_reductions(&mut self) -> Result<()> {
        self.retire(0)?;
        self.unforced = 0;
        for (unit, work) in std::mem::take(&mut self.across) {
            let part = work.wait()?;
            self.fold(unit, part);
        }
        self.note();
        if !self.learned && self.sync {
            self.learned = true;
        }
        Ok(())
    }

    /// Fold finished reductions, oldest first, into the gradient shards
    /// (under `HybridShard`, start their allreduce across the groups
    /// instead), waiting while more than `keep` are in flight.
    pub(super) fn retire(&mut self, keep: usize) -> Result<()> {
        while let Some(front) = self.reducing.first() {
            if self.reducing.len() <= keep && !front.work.is_complete() {
                break;
            }
            let Reducing { unit, work } = self.reducing.remove(0);
            // This rank's block (the whole buffer, not sharded, is block 0).
            let mine = self.shard_range(unit);
            match &self.inter {
                // Sum the group's shard over the replicas, in f32: the
                // block is copied out (a shard, counted as reducing until
                // it is folded in) while the whole buffer still exists.
                Some(_) => {
                    self.pool.spare = self.room(1);
                    let whole = self.units[unit].layout.shard * self.shard_ranks;
                    self.pool.trim(self.pool.spare);
                    self.note_transient(1, work.bytes(whole) + 4 * mine.len());
                    let part = work.block(&mut self.pool, mine)?;
                    if let Some(inter) = &self.inter {
                        let sum = inter.all_reduce_async(part, ReduceOp::Sum)?;
                        self.across.push((unit, sum));
                    }
                }
                None => {
                    let scale = self.fold_scale();
                    let grad = &mut self.units[unit].grad;
                    work.add_block(&mut self.pool, mine, grad, scale)?;
                }
            }
        }
        Ok(())
    }

    /// Add a reduced sum of this rank's shard of `unit` into its gradient
    /// shard as an average, and pool the buffer.
    pub(super) fn fold(&mut self, unit: usize, part: Vec<f32>) {
        let scale = self.fold_scale();
        for (g, v) in self.units[unit].grad.iter_mut().zip(&part) {
            *g += v * scale;
        }
        self.pool.give(part);
    }

    /// What a reduced sum is multiplied by to give the average.
    pub(super) fn fold_scale(&self) -> f32 {
        1.0 / (self.world as f32 * self.pre_scale())
    }

    /// Turn gradient synchronisation off (`false`, PyTorch's `no_sync`) or
    /// back on: while off, `post_backward` only accumulates each unit's
    /// whole gradient on this rank (memory of the unit's size), and the
    /// next synchronised `post_backward` of the unit reduces the sum.
    pub fn set_sync(&mut self, sync: bool) {
        self.sync = sync;
    }

    /// Scale every gradient shard so that the norm of the whole model's
    /// gradient (over all units, all ranks' shards) is at most `max_norm`,
    /// and return the norm before scaling (`clip_grad_norm_`). A
    /// collective: every rank calls it after `finish_backward`.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64> {
        if !self.reducing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {}: clip_grad_norm before finish_backward",
                self.rank
            )));
        }
        let local: f64 = self
            .units
            .iter()
            .flat_map(|x| x.grad.iter())
            .map(|&g| f64::from(g) * f64::from(g))
            .sum();
        let mut total = [local];
        if let Some(comm) = self.shard_comm() {
            comm.all_reduce_in_place(&mut total, ReduceOp::Sum)?;
        }
        let norm = total[0].sqrt();
        if norm > max_norm && norm > 0.0 {
            let c = (max_norm / (norm + 1e-6)) as f32;
            for g in self.units.iter_mut().flat_map(|x| x.grad.iter_mut()) {
                *g *= c;
            }
        }
        Ok(norm)
    }

    /// Update every shard from its gradient shard with `optimizer` (its
    /// state is sharded the same way), then zero the gradients. Under
    /// `ShardGradOp` the updated shards are then gathered into the whole
    /// copies (issued here, waited for at the next use).
    pub fn step(&mut self, optimizer: &Optimizer) -> Result<()> {
        if !self.reducing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {}: step with gradient reductions in flight (call finish_backward)",
                self.rank
            )));
        }
        if let Some(u) = self
            .units
            .iter()
            .position(|x| x.phase != Phase::Idle && x.phase != Phase::AfterForward)
        {
            return Err(self.err(u, "step while the unit is still gathered for use"));
        }
        // Gathered copies (a prefetch that was never used, a unit kept
        // from a forward without backward) hold the old values: drop them.
        for u in 0..self.units.len() {
            self.free_full(u)?;
        }
        self.steps += 1;
        self.optimizer_steps += 1;
        let per = optimizer.state_per_element();
        for unit in &mut self.units {
            if unit.state.len() != per * unit.shard.len() {
                unit.state = vec![0f32; per * unit.shard.len()];
            }
            optimizer.update(
                &mut unit.shard,
                &unit.grad,
                &mut unit.state,
                self.optimizer_steps,
            );
            unit.grad.iter_mut().for_each(|g| *g = 0.0);
            unit.phase = Phase::Idle;
        }
        self.refresh_whole()
    }

    /// Under `ShardGradOp` and `NoShard`, bring the whole copies up to the
    /// shards; nothing otherwise.
    pub(super) fn refresh_whole(&mut self) -> Result<()> {
        if self.keeps_whole() {
            for u in 0..self.units.len() {
                // The old whole copy's buffer serves the new gather.
                self.release(u)?;
                self.start_gather(u)?;
            }
        }
        Ok(())
    }
}
