//! The reducer: gradients in, averaged gradients out, with each bucket's
//! collective started the moment the bucket (or its ready prefix) is full.
//!
//! Invariant that keeps ranks from hanging each other: within a step every
//! rank issues exactly the same collectives in the same order — one per
//! chunk, in layout order, then one small status allreduce (and once, a
//! broadcast of the rebuilt order). A rank whose backward went wrong (a
//! parameter marked twice, never marked, with a wrong length) still issues
//! all of them at `finish()`, zero-filling what is missing, and the status
//! allreduce tells every rank which rank failed and why, so all of them
//! return an error for the step instead of waiting on a bucket that never
//! comes.

use super::hook::{AllReduceHook, Bucket, CommHook, PendingBucket};
use super::layout::{is_permutation, Layout};
use super::{ParamSpec, ReducerConfig};
use crate::{Communicator, Element, Error, ReduceOp, Result};

/// What went wrong on this rank in a step; travels in the status allreduce
/// as `code << 32 | param` (+1, so that 0 means "nothing").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    MarkedTwice(usize),
    NeverMarked(usize),
    WrongLength { param: usize, got: usize },
    UnknownParam(usize),
}

impl Fault {
    fn encode(self) -> u64 {
        let (code, p) = match self {
            Fault::MarkedTwice(p) => (1u64, p),
            Fault::NeverMarked(p) => (2, p),
            Fault::WrongLength { param, .. } => (3, param),
            Fault::UnknownParam(p) => (4, p),
        };
        ((code << 32) | (p.min(u32::MAX as usize) as u64)) + 1
    }

    fn decode(v: u64) -> Option<Fault> {
        let v = v.checked_sub(1)?;
        let p = (v & u64::from(u32::MAX)) as usize;
        Some(match v >> 32 {
            1 => Fault::MarkedTwice(p),
            2 => Fault::NeverMarked(p),
            3 => Fault::WrongLength { param: p, got: 0 },
            _ => Fault::UnknownParam(p),
        })
    }
}

/// A chunk's buffer: here between steps, or lent to a hook while its
/// collective runs.
enum ChunkState<T: Element> {
    Idle(Bucket<T>),
    InFlight(PendingBucket<T>),
}

/// Gradient buckets for data-parallel training (PyTorch's DDP reducer).
///
/// Built from the parameter list in registration order (the order of the
/// forward pass). Backward hands each gradient to
/// [`mark_ready`](Reducer::mark_ready) as soon as it exists; a complete bucket starts
/// its allreduce at once, on the communicator's progress thread, while
/// backward goes on. [`finish`](Reducer::finish) waits for the rest and
/// leaves the averaged gradients in the buckets, readable through
/// [`grad`](Reducer::grad) (PyTorch's `gradient_as_bucket_view`).
///
/// Every rank must build its reducer with the same parameters and settings
/// (checked at construction) and mark the same steps as synchronised.
pub struct Reducer<'c, T: Element> {
    comm: &'c Communicator,
    specs: Vec<ParamSpec>,
    config: ReducerConfig,
    hook: Box<dyn CommHook<T> + 'c>,
    layout: Layout,
    chunks: Vec<ChunkState<T>>,
    /// Parameters of each chunk not yet ready in this step.
    pending: Vec<usize>,
    /// Next chunk to launch (chunks launch in layout order on every rank).
    next_launch: usize,
    /// Ready in this step (marked or declared unused).
    marked: Vec<bool>,
    /// Given a gradient since the last synchronised step (else the bucket
    /// slot holds stale data and the next gradient overwrites it).
    touched: Vec<bool>,
    /// Marked with a gradient (not declared unused) in this step.
    used: Vec<bool>,
    /// Order in which parameters became ready in this step.
    order: Vec<usize>,
    fault: Option<Fault>,
    /// A hook failed to launch a chunk in this step: launch nothing more.
    launch_error: Option<Error>,
    sync: bool,
    rebuilt: bool,
    step: u64,
    grads_valid: bool,
    globally_unused: Vec<usize>,
}

impl<T: Element> std::fmt::Debug for Reducer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reducer")
            .field("params", &self.specs.len())
            .field("buckets", &self.layout.buckets.len())
            .field("chunks", &self.layout.chunks.len())
            .field("hook", &self.hook.name())
            .field("step", &self.step)
            .finish()
    }
}

impl<'c, T: Element> Reducer<'c, T> {
    /// A reducer with the default hook (allreduce, average). A collective:
    /// every rank calls it, and it fails on every rank (naming the ranks
    /// that differ) unless all pass the same parameters and settings.
    pub fn new(
        comm: &'c Communicator,
        params: &[ParamSpec],
        config: ReducerConfig,
    ) -> Result<Self> {
        Self::with_hook(comm, params, config, AllReduceHook)
    }

    /// A reducer whose buckets are reduced by `hook` (PyTorch's
    /// `register_comm_hook`).
    pub fn with_hook(
        comm: &'c Communicator,
        params: &[ParamSpec],
        config: ReducerConfig,
        hook: impl CommHook<T> + 'c,
    ) -> Result<Self> {
        if params.is_empty() {
            return Err(Error::InvalidArgument(
                "ddp: a reducer needs at least one parameter".into(),
            ));
        }
        if let Some(p) = params.iter().position(|p| p.len == 0) {
            return Err(Error::InvalidArgument(format!(
                "ddp: parameter {p} ({}) has no elements",
                params[p].name
            )));
        }
        let hook: Box<dyn CommHook<T> + 'c> = Box::new(hook);
        agree_on_model(comm, params, &config, hook.name(), T::DTYPE.name())?;

        // Backward produces gradients roughly in reverse registration order.
        let order: Vec<usize> = (0..params.len()).rev().collect();
        let n = params.len();
        let mut reducer = Reducer {
            comm,
            specs: params.to_vec(),
            config,
            hook,
            layout: Layout {
                buckets: Vec::new(),
                chunks: Vec::new(),
                slots: Vec::new(),
            },
            chunks: Vec::new(),
            pending: Vec::new(),
            next_launch: 0,
            marked: vec![false; n],
            touched: vec![false; n],
            used: vec![false; n],
            order: Vec::with_capacity(n),
            fault: None,
            launch_error: None,
            sync: true,
            rebuilt: false,
            step: 0,
            grads_valid: false,
            globally_unused: Vec::new(),
        };
        reducer.apply_layout(&order, false)?;
        Ok(reducer)
    }

    /// Go on after a failure with the survivors' communicator `comm` (from
    /// [`Communicator::shrink`]): the step in progress is dropped (chunks
    /// in flight are waited out; they end on the old communicator's
    /// failure), and the parameters, settings, hook and bucket layout are
    /// kept; the next step averages over `comm`'s ranks. Gradients read
    /// before the next [`finish`](Reducer::finish) are not valid. A
    /// collective of `comm`: every survivor calls it, and the model is
    /// agreed again (a survivor with another model is named).
    ///
    /// Buckets in windows of the old communicator become plain buffers.
    pub fn rebind<'d>(mut self, comm: &'d Communicator) -> Result<Reducer<'d, T>>
    where
        'c: 'd,
    {
        // Errors expected: this is the failed step.
        let _ = self.wait_all();
        for c in 0..self.chunks.len() {
            let state = std::mem::replace(&mut self.chunks[c], ChunkState::Idle(Vec::new().into()));
            if let ChunkState::Idle(buf) = state {
                let plain: Bucket<T> = buf.into_vec().into();
                self.chunks[c] = ChunkState::Idle(plain);
            }
        }
        agree_on_model(
            comm,
            &self.specs,
            &self.config,
            self.hook.name(),
            T::DTYPE.name(),
        )?;
        let hook: Box<dyn CommHook<T> + 'd> = self.hook;
        let mut reducer = Reducer {
            comm,
            specs: self.specs,
            config: self.config,
            hook,
            layout: self.layout,
            chunks: self.chunks,
            pending: self.pending,
            next_launch: 0,
            marked: self.marked,
            touched: self.touched,
            used: self.used,
            order: self.order,
            fault: None,
            launch_error: None,
            sync: self.sync,
            rebuilt: self.rebuilt,
            step: self.step,
            grads_valid: false,
            globally_unused: self.globally_unused,
        };
        reducer.reset_step();
        reducer.touched.fill(false);
        Ok(reducer)
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.specs.len()
    }

    /// Parameters of each bucket, in buffer order; buckets in the order
    /// their collectives are issued. The same on every rank.
    pub fn bucket_layout(&self) -> Vec<Vec<usize>> {
        self.layout.buckets.clone()
    }

    /// Parameters of each chunk (the unit of one collective); equal to
    /// [`bucket_layout`](Self::bucket_layout) unless prefix streaming cuts
    /// large buckets.
    pub fn chunk_layout(&self) -> Vec<Vec<usize>> {
        self.layout
            .chunks
            .iter()
            .map(|c| c.params.clone())
            .collect()
    }

    /// Chunks (buckets, without prefix streaming) whose collective has
    /// started in the current step.
    pub fn launched(&self) -> usize {
        self.next_launch
    }

    /// Whether the buckets were re-packed from the observed ready order.
    pub fn is_rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// Synchronised steps and `no_sync` steps finished so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Parameters no rank gave a gradient in the last synchronised step
    /// (their averaged gradient is zero; an optimizer may skip them).
    pub fn globally_unused(&self) -> &[usize] {
        &self.globally_unused
    }

    /// Whether the next `finish()` reduces across ranks (true) or only
    /// accumulates locally (PyTorch's `no_sync`). Every rank must make the
    /// same choice for the same step.
    pub fn set_sync(&mut self, sync: bool) {
        self.sync = sync;
    }

    /// Run `f` (one or more micro-steps of backward, each closed with
    /// `finish()`) with synchronisation off: gradients accumulate in the
    /// buckets and are reduced with those of the next synchronised step.
    pub fn no_sync<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let before = self.sync;
        self.sync = false;
        let r = f(self);
        self.sync = before;
        r
    }

    /// Hand over the gradient of parameter `param` (its index in the
    /// registration order). It is copied into its bucket (added, when
    /// gradients are being accumulated); when that completes a bucket, the
    /// bucket's collective starts before this returns, without waiting for
    /// any other bucket.
    ///
    /// Errors (unknown index, wrong length, marked twice in a step) are
    /// returned here, on this rank; the step still completes on every rank
    /// at `finish()`, which then fails everywhere naming this rank.
    pub fn mark_ready(&mut self, param: usize, grad: &[T]) -> Result<()> {
        self.check_mark(param, Some(grad.len()))?;
        let slot = self.layout.slots[param];
        let accumulate = self.touched[param];
        let dst = &mut self.idle_buf(slot.chunk)[slot.offset..slot.offset + grad.len()];
        if accumulate {
            T::reduce_into(ReduceOp::Sum, dst, grad);
        } else {
            dst.copy_from_slice(grad);
        }
        self.touched[param] = true;
        self.used[param] = true;
        self.ready(param)
    }

    /// Declare that `param` gets no gradient in this step on this rank (it
    /// counts as zero in the average). Lets its bucket start without
    /// waiting for `finish()`.
    pub fn mark_unused(&mut self, param: usize) -> Result<()> {
        self.check_mark(param, None)?;
        if !self.touched[param] {
            let slot = self.layout.slots[param];
            let len = self.specs[param].len;
            self.idle_buf(slot.chunk)[slot.offset..slot.offset + len].fill(T::from_f64(0.0));
            self.touched[param] = true;
        }
        self.ready(param)
    }

    /// The gradient of `param` after the last `finish()`: the average over
    /// ranks after a synchronised step, the local accumulated sum after a
    /// `no_sync` one. During a step, only this rank's gradients handed over
    /// so far, and `None` while the parameter's bucket is in flight.
    pub fn grad(&self, param: usize) -> Option<&[T]> {
        let slot = *self.layout.slots.get(param)?;
        if !self.touched[param] && !self.grads_valid {
            return None;
        }
        match &self.chunks[slot.chunk] {
            ChunkState::Idle(buf) => Some(&buf[slot.offset..slot.offset + self.specs[param].len]),
            ChunkState::InFlight(_) => None,
        }
    }

    /// Copy every parameter's gradient (as [`grad`](Self::grad) gives it)
    /// into `out`, one slice per parameter in registration order: for
    /// callers that keep gradients in their own memory rather than reading
    /// them from the buckets.
    pub fn copy_grads_into(&self, out: &mut [&mut [T]]) -> Result<()> {
        if out.len() != self.specs.len() {
            return Err(Error::InvalidArgument(format!(
                "ddp: copy_grads_into got {} slices for {} parameters",
                out.len(),
                self.specs.len()
            )));
        }
        for (p, dst) in out.iter_mut().enumerate() {
            let src = self.grad(p).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "ddp: no gradient of parameter {p} ({}) to copy: call finish() first",
                    self.specs[p].name
                ))
            })?;
            if dst.len() != src.len() {
                return Err(Error::InvalidArgument(format!(
                    "ddp: copy_grads_into: parameter {p} ({}) has {} elements, the slice {}",
                    self.specs[p].name,
                    src.len(),
                    dst.len()
                )));
            }
            dst.copy_from_slice(src);
        }
        Ok(())
    }

    /// End the step. Synchronised: every rank's remaining buckets are
    /// launched (parameters declared or detected unused count as zero),
    /// all are waited for, and the averaged gradients are left in the
    /// buckets ([`grad`](Self::grad)). Under `no_sync`: checks the step and
    /// keeps the accumulated gradients local.
    ///
    /// Fails on every rank if any rank's step went wrong, naming the rank
    /// and the parameter; the next step starts clean.
    pub fn finish(&mut self) -> Result<()> {
        let step = self.step;
        self.step += 1;
        if !self.sync {
            return self.finish_local(step);
        }
        for p in 0..self.specs.len() {
            if self.marked[p] {
                continue;
            }
            if !self.config.find_unused_parameters && self.fault.is_none() {
                self.fault = Some(Fault::NeverMarked(p));
            }
            if !self.touched[p] {
                let slot = self.layout.slots[p];
                let len = self.specs[p].len;
                self.idle_buf(slot.chunk)[slot.offset..slot.offset + len].fill(T::from_f64(0.0));
            }
            self.marked[p] = true;
            self.pending[self.layout.slots[p].chunk] -= 1;
        }
        let launched = self.launch_ready();

        // What every rank learns from every rank: its fault, if any, and
        // which parameters it gave a gradient.
        let size = self.comm.size();
        let n = self.specs.len();
        let mut status = vec![0u64; size + n];
        status[self.comm.rank()] = self.fault.map_or(0, Fault::encode);
        for (s, &u) in status[size..].iter_mut().zip(&self.used) {
            *s = u64::from(u);
        }
        let status_result = match launched {
            Ok(()) => self.comm.all_reduce_in_place(&mut status, ReduceOp::Sum),
            Err(e) => Err(e),
        };
        let waited = self.wait_all();
        let local_fault = self.fault.take();
        let ready_order = std::mem::take(&mut self.order);
        self.reset_step();
        status_result?;
        waited?;

        if let Some(err) = self.fault_error(step, local_fault, &status[..size]) {
            // The step is void on every rank: the next one starts afresh.
            self.touched.fill(false);
            self.grads_valid = false;
            return Err(err);
        }
        self.globally_unused = (0..n).filter(|&p| status[size + p] == 0).collect();
        self.touched.fill(false);
        self.grads_valid = true;
        if self.config.rebuild_buckets && !self.rebuilt {
            self.rebuild(ready_order)?;
        }
        Ok(())
    }

    fn finish_local(&mut self, step: u64) -> Result<()> {
        if self.fault.is_none() && !self.config.find_unused_parameters {
            if let Some(p) = self.marked.iter().position(|&m| !m) {
                self.fault = Some(Fault::NeverMarked(p));
            }
        }
        let fault = self.fault.take();
        self.order.clear();
        self.reset_step();
        // Accumulated sums are valid local gradients, the last average is not.
        self.grads_valid = false;
        match fault {
            Some(f) => Err(self.describe_local(step, f)),
            None => Ok(()),
        }
    }

    /// Validate a mark; on failure remember the fault for the status
    /// exchange and return the error.
    fn check_mark(&mut self, param: usize, len: Option<usize>) -> Result<()> {
        let fault = if param >= self.specs.len() {
            Some(Fault::UnknownParam(param))
        } else if self.marked[param] {
            Some(Fault::MarkedTwice(param))
        } else {
            match len {
                Some(got) if got != self.specs[param].len => {
                    Some(Fault::WrongLength { param, got })
                }
                _ => None,
            }
        };
        match fault {
            None => Ok(()),
            Some(f) => {
                self.fault.get_or_insert(f);
                Err(self.describe_local(self.step, f))
            }
        }
    }

    fn ready(&mut self, param: usize) -> Result<()> {
        self.grads_valid = false;
        self.marked[param] = true;
        self.order.push(param);
        if !self.sync {
            return Ok(());
        }
        self.pending[self.layout.slots[param].chunk] -= 1;
        self.launch_ready()
    }

    /// Launch every chunk that is complete and whose predecessors are all
    /// launched: the prefix order is what keeps every rank's collective
    /// sequence the same.
    fn launch_ready(&mut self) -> Result<()> {
        if let Some(e) = &self.launch_error {
            return Err(e.clone());
        }
        while self.next_launch < self.chunks.len() && self.pending[self.next_launch] == 0 {
            let c = self.next_launch;
            let placeholder = ChunkState::Idle(Vec::new().into());
            let buf = match std::mem::replace(&mut self.chunks[c], placeholder) {
                ChunkState::Idle(buf) => buf,
                ChunkState::InFlight(_) => unreachable!("chunk {c} launched twice"),
            };
            match self.hook.launch(self.comm, buf) {
                Ok(pending) => self.chunks[c] = ChunkState::InFlight(pending),
                Err(e) => {
                    // The buffer went with the failed call: keep the shape,
                    // and stop launching in this step (the sequence of
                    // collectives is broken; the others learn it from the
                    // communicator, at worst by its timeout).
                    self.chunks[c] = ChunkState::Idle(self.lost_bucket(c));
                    self.launch_error = Some(e.clone());
                    return Err(e);
                }
            }
            self.next_launch += 1;
        }
        Ok(())
    }

    /// Wait for every launched chunk, in launch order, and put the buffers
    /// back. On failure the buffers that were lost are replaced by zeros so
    /// that the reducer's shape stays intact; the first error is returned.
    fn wait_all(&mut self) -> Result<()> {
        let mut first_err = None;
        for c in 0..self.chunks.len() {
            let state = std::mem::replace(&mut self.chunks[c], ChunkState::Idle(Vec::new().into()));
            let buf = match state {
                ChunkState::Idle(buf) => buf,
                ChunkState::InFlight(pending) => match pending.wait() {
                    Ok(buf) if buf.len() == self.layout.chunks[c].len => buf,
                    Ok(buf) => {
                        first_err.get_or_insert(Error::InvalidArgument(format!(
                            "ddp: comm hook `{}` returned {} elements for a bucket of {}",
                            self.hook.name(),
                            buf.len(),
                            self.layout.chunks[c].len
                        )));
                        self.lost_bucket(c)
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                        self.lost_bucket(c)
                    }
                },
            };
            self.chunks[c] = ChunkState::Idle(buf);
        }
        first_err.map_or(Ok(()), Err)
    }

    fn reset_step(&mut self) {
        self.launch_error = None;
        self.marked.fill(false);
        self.used.fill(false);
        self.order.clear();
        self.next_launch = 0;
        for (p, c) in self.pending.iter_mut().zip(&self.layout.chunks) {
            *p = c.params.len();
        }
    }

    /// The error of a step in which some rank (maybe this one) failed.
    fn fault_error(&self, step: u64, local: Option<Fault>, faults: &[u64]) -> Option<Error> {
        if let Some(f) = local {
            return Some(self.describe_local(step, f));
        }
        let (rank, fault) = faults
            .iter()
            .enumerate()
            .find_map(|(r, &v)| Fault::decode(v).map(|f| (r, f)))?;
        Some(Error::PeerFailed {
            rank,
            during: format!("ddp step {step}"),
            reason: format!(
                "{}; this step's gradients are not valid on any rank",
                self.describe(fault)
            ),
        })
    }

    fn describe(&self, fault: Fault) -> String {
        let name = |p: usize| {
            self.specs.get(p).map_or_else(
                || format!("parameter {p}"),
                |s| format!("parameter {p} ({})", s.name),
            )
        };
        match fault {
            Fault::MarkedTwice(p) => format!("{} was marked ready twice in one step", name(p)),
            Fault::NeverMarked(p) => format!(
                "{} was never marked ready (mark it, declare it with mark_unused, \
                 or enable find_unused_parameters)",
                name(p)
            ),
            Fault::WrongLength { param, got } if got > 0 => format!(
                "{} got a gradient of {got} elements, expected {}",
                name(param),
                self.specs[param].len
            ),
            Fault::WrongLength { param, .. } => {
                format!("{} got a gradient of the wrong length", name(param))
            }
            Fault::UnknownParam(p) => format!(
                "parameter index {p} does not exist (the reducer has {})",
                self.specs.len()
            ),
        }
    }

    fn describe_local(&self, step: u64, fault: Fault) -> Error {
        Error::InvalidArgument(format!(
            "ddp step {step} on rank {}: {}",
            self.comm.rank(),
            self.describe(fault)
        ))
    }

    /// Zeros in place of chunk `chunk`'s buffer, lost with a failed
    /// collective, so that the reducer keeps its shape.
    fn lost_bucket(&self, chunk: usize) -> Bucket<T> {
        vec![T::from_f64(0.0); self.layout.chunks[chunk].len].into()
    }

    fn idle_buf(&mut self, chunk: usize) -> &mut Bucket<T> {
        match &mut self.chunks[chunk] {
            ChunkState::Idle(buf) => buf,
            // A chunk launches only once all its parameters are marked, and
            // marks are checked before any write.
            ChunkState::InFlight(_) => unreachable!("write into chunk {chunk} while in flight"),
        }
    }

    /// Re-pack the buckets in rank 0's ready order, agreed by a broadcast,
    /// moving the current gradients into the new buffers.
    fn rebuild(&mut self, observed: Vec<usize>) -> Result<()> {
        let n = self.specs.len();
        let mut order: Vec<u64> = observed.iter().map(|&p| p as u64).collect();
        let mut seen = vec![false; n];
        for &p in &observed {
            seen[p] = true;
        }
        // Parameters that never became ready go last, in the current order.
        for b in &self.layout.buckets {
            order.extend(b.iter().filter(|&&p| !seen[p]).map(|&p| p as u64));
        }
        self.comm.broadcast(&mut order, 0)?;
        let order: Vec<usize> = order.iter().map(|&p| p as usize).collect();
        if !is_permutation(&order, n) {
            return Err(Error::InvalidArgument(format!(
                "ddp: rank 0 sent a bucket order that is not a permutation of {n} parameters"
            )));
        }
        self.apply_layout(&order, true)?;
        self.rebuilt = true;
        Ok(())
    }

    /// Switch to the layout for `order`, carrying the current gradients over
    /// when `keep` is set. With `ReducerConfig::windows` the new buckets
    /// are windows (a collective, here at the same point on every rank).
    fn apply_layout(&mut self, order: &[usize], keep: bool) -> Result<()> {
        let lens: Vec<usize> = self.specs.iter().map(|s| s.len).collect();
        let layout = Layout::build(
            &lens,
            std::mem::size_of::<T>(),
            order,
            self.config.first_bucket_cap_bytes,
            self.config.bucket_cap_bytes,
            self.config.prefix_chunk_bytes,
        );
        let mut chunks: Vec<Bucket<T>> = layout
            .chunks
            .iter()
            .map(|c| -> Result<Bucket<T>> {
                Ok(if self.config.windows {
                    Bucket::from_window(self.comm.alloc_window(c.len)?)
                } else {
                    vec![T::from_f64(0.0); c.len].into()
                })
            })
            .collect::<Result<_>>()?;
        if keep {
            for (p, len) in lens.iter().enumerate() {
                let (old, new) = (self.layout.slots[p], layout.slots[p]);
                if let ChunkState::Idle(src) = &self.chunks[old.chunk] {
                    chunks[new.chunk][new.offset..new.offset + len]
                        .copy_from_slice(&src[old.offset..old.offset + len]);
                }
            }
        }
        self.chunks = chunks.into_iter().map(ChunkState::Idle).collect();
        self.layout = layout;
        self.pending = self.layout.chunks.iter().map(|c| c.params.len()).collect();
        self.next_launch = 0;
        Ok(())
    }
}

/// Check at construction that every rank has the same parameters and
/// settings: a difference would otherwise show up later as mismatched
/// buckets, or worse, as buckets of equal length reduced crosswise.
fn agree_on_model(
    comm: &Communicator,
    params: &[ParamSpec],
    config: &ReducerConfig,
    hook: &str,
    dtype: &str,
) -> Result<()> {
    let mut h = Fnv::new();
    h.write(dtype.as_bytes());
    h.write(hook.as_bytes());
    h.write_u64(params.len() as u64);
    for p in params {
        h.write_u64(p.len as u64);
    }
    h.write_u64(config.bucket_cap_bytes as u64);
    h.write_u64(config.first_bucket_cap_bytes as u64);
    h.write_u64(config.prefix_chunk_bytes.map_or(0, |c| c as u64 + 1));
    h.write_u64(u64::from(config.rebuild_buckets));
    h.write_u64(u64::from(config.find_unused_parameters));
    h.write_u64(u64::from(config.windows));
    let mine = [h.0];
    let mut all = vec![0u64; comm.size()];
    comm.all_gather(&mine, &mut all)?;
    let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "ddp: ranks {differ:?} built their reducer with other parameters or settings than rank 0 \
         (this rank: {} parameters of {dtype}, hook `{hook}`, {config:?})",
        params.len()
    )))
}

/// FNV-1a: stable across processes and builds (std's hasher is neither).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self.write_u64(bytes.len() as u64 | 1 << 63);
    }
    fn write_u64(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
