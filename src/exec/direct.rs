//! Collectives directly between windows: each rank moves one share of the
//! data, reading and writing the other ranks' buffers itself (they lie in
//! windows every rank maps), so each byte is copied once:
//!
//! - allreduce: rank r reduces piece r of every input, in rank order, and
//!   writes the result into piece r of every output;
//! - allgather: rank r writes its input into block r of every output;
//! - reduce-scatter: rank r reduces block r of every input, in rank order,
//!   into its own output;
//! - broadcast: rank r copies piece r of the root's input into piece r of
//!   every output (the root's own too, out of place);
//! - reduce: rank r reduces piece r of every input, in rank order, into
//!   piece r of the root's output;
//! - all-to-all: rank r writes block j of its input into block r of rank
//!   j's output, for every j.
//!
//! Only rank r touches piece (block) r of any buffer, so in place needs no
//! copy. Out of place with streaming stores (the planner's
//! `plan::direct_store`), allreduce, allgather and reduce-scatter run fused
//! where they can: each 64-byte line of the result is computed in registers
//! and streamed to every rank's output at once. A broadcast with streaming
//! stores (in place as out) streams its piece of the root's buffer to every
//! written output the same way. The check-in (`checkin`)
//! decided the path and waits for completion; this module only moves bytes
//! and checks what the peers announced against their mappings here.

use super::checkin::{Ctx, Place};
use super::io::HostIo;
use super::Call;
use crate::algo::{partition, Operand, Prim, Step};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::reduce::{reduce_into, reduce_to, store, Store};
use crate::window::Parts;
use ferroccl_transport::SharedRegion;

/// Elements reduced per block: a block of each input and the result stay
/// in L1 while the result is written to every output.
const BLOCK_BYTES: usize = 8192;

/// Run `f` on a buffer of `len` elements that starts on a cache line,
/// taken from a scratch area this thread keeps (its contents are whatever
/// the last call left: `f` writes before it reads). A call between windows
/// used to allocate and zero its 8 KiB block buffer every time, about a
/// tenth of a 2-rank 32 KiB broadcast's time (docs/performance-log.md,
/// "Calls between windows without allocations or locked lookups"). A
/// nested call (none today) gets a buffer of its own.
pub(super) fn with_scratch<T: Element, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let bytes = len * std::mem::size_of::<T>();
    SCRATCH.with(|cell| {
        let mut held = cell.try_borrow_mut().ok();
        let mut own = Vec::new();
        let area: &mut Vec<u64> = held.as_deref_mut().unwrap_or(&mut own);
        // Room for the line's alignment too.
        let words = bytes.div_ceil(8) + 8;
        if area.len() < words {
            area.resize(words, 0);
        }
        let skip = (area.as_ptr() as usize).wrapping_neg() % 64;
        f(bytemuck::cast_slice_mut(
            &mut bytemuck::cast_slice_mut::<u64, u8>(area)[skip..skip + bytes],
        ))
    })
}

/// Which collective a fused streaming pass does (`Kernel::spread_streaming`).
#[derive(Clone, Copy)]
enum Fused {
    AllReduce,
    AllGather,
    ReduceScatter,
}

/// Run `f` on the peers' parts of windows `input` and `output` (one set
/// when they are the same window), under the lock of the communicator's
/// registry of windows for the whole call: the thread that calls takes it
/// without a locked instruction (`window::Live`).
fn with_maps<R>(
    ctx: &Ctx<'_>,
    call: &Call,
    (input, output): (u64, u64),
    f: impl FnOnce(&mut Maps<'_>) -> Result<R>,
) -> Result<R> {
    let mut live = ctx.windows.lock();
    let (input, output) = live.parts(input, output).map_err(|id| {
        Error::Io(format!(
            "{}: window {id} is not mapped on this rank",
            call.during()
        ))
    })?;
    f(&mut Maps { input, output })
}

/// Allreduce between windows `input` and `output` (`in_len`/`out_len`
/// elements per rank).
pub(super) fn all_reduce<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    (input, output): (u64, u64),
    (in_len, out_len): (usize, usize),
) -> Result<()> {
    with_maps(ctx, k.call, (input, output), |maps| {
        k.check_peers(maps, (in_len, None), (out_len, None))?;
        let (off, len) = partition(k.call.fingerprint.count as usize, ctx.size, ctx.rank);
        k.reduce_and_spread(io, maps, off, len)
    })
}

/// Allgather into window `output`.
pub(super) fn all_gather<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    output: u64,
    (in_len, out_len): (usize, usize),
) -> Result<()> {
    into_outputs(k, ctx, output, out_len, |maps| k.gather(io, maps, in_len))
}

/// Run `share` on the maps of window `output`, where every rank's output
/// (`out_len` elements) lies and the inputs need not (allgather,
/// all-to-all), once the peers' announced outputs are checked.
fn into_outputs(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    output: u64,
    out_len: usize,
    share: impl FnOnce(&mut Maps<'_>) -> Result<()>,
) -> Result<()> {
    with_maps(ctx, k.call, (output, output), |maps| {
        k.check_peers(maps, (0, None), (out_len, None))?;
        share(maps)
    })
}

/// All-to-all into window `output` (`in_len` = `out_len` elements per
/// rank, a block of `in_len / size` to each rank).
pub(super) fn all_to_all<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    output: u64,
    (in_len, out_len): (usize, usize),
) -> Result<()> {
    let block = in_len / ctx.size.max(1);
    into_outputs(k, ctx, output, out_len, |maps| k.exchange(io, maps, block))
}

/// Reduce-scatter out of window `input`.
pub(super) fn reduce_scatter<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    input: u64,
    (in_len, out_len): (usize, usize),
) -> Result<()> {
    with_maps(ctx, k.call, (input, input), |maps| {
        k.check_peers(maps, (in_len, None), (0, None))?;
        k.scatter(io, maps, out_len)
    })
}

/// Broadcast from the call's root: its input in window `input`, every
/// output in window `output` (`count` elements).
pub(super) fn broadcast<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    (input, output): (u64, u64),
    count: usize,
) -> Result<()> {
    let root = k.root();
    with_maps(ctx, k.call, (input, output), |maps| {
        k.check_peers(maps, (count, Some(root)), (count, None))?;
        let (off, len) = partition(count, ctx.size, ctx.rank);
        k.copy_and_spread(io, maps, root, off, len)
    })
}

/// Reduce to the call's root: every input in window `input`, the root's
/// output in window `output` (`count` elements).
pub(super) fn reduce<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    (input, output): (u64, u64),
    count: usize,
) -> Result<()> {
    let root = k.root();
    with_maps(ctx, k.call, (input, output), |maps| {
        k.check_peers(maps, (count, None), (count, Some(root)))?;
        let (off, len) = partition(count, ctx.size, ctx.rank);
        k.reduce_blocks(io, maps, off, len, |io, maps, done, t| {
            store(k.mode, k.output(io, maps, root, off + done, t.len())?, t);
            Ok(())
        })
    })
}

/// The peers' parts of the call's input and output windows (`output`
/// `None` when both are the same window), borrowed from the registry.
struct Maps<'a> {
    input: &'a mut Parts,
    output: Option<&'a mut Parts>,
}

impl Maps<'_> {
    fn input_region(&self, peer: usize) -> Option<&dyn SharedRegion> {
        self.input.get(peer)?.as_deref()
    }

    fn output_region(&mut self, peer: usize) -> Option<&mut (dyn SharedRegion + 'static)> {
        match &mut self.output {
            Some(out) => out.get_mut(peer)?.as_deref_mut(),
            None => self.input.get_mut(peer)?.as_deref_mut(),
        }
    }
}

/// One rank's share of a direct call: who it is, what every rank
/// announced, and how to write.
pub(super) struct Kernel<'a> {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) elem: usize,
    pub(super) places: &'a [Place],
    pub(super) call: &'a Call,
    pub(super) op: ReduceOp,
    pub(super) mode: Store,
}

impl Kernel<'_> {
    pub(super) fn protocol(&self, peer: usize, detail: String) -> Error {
        Error::Protocol {
            peer,
            during: self.call.during(),
            detail,
        }
    }

    /// Check what the peers announced against their mappings here (`maps`,
    /// the call's parts, locked once for the check and the copies): their
    /// buffers lie inside their parts of the windows, at offsets aligned
    /// for the type, and an input and an output in one window are the same
    /// bytes (in place) or apart.
    /// `(elems, only)`: the elements of each input / output, and the one
    /// rank whose input / output the call uses (a broadcast's root's
    /// input, a reduce's root's output), None for every rank's.
    fn check_peers(
        &self,
        maps: &Maps<'_>,
        (in_elems, in_only): (usize, Option<usize>),
        (out_elems, out_only): (usize, Option<usize>),
    ) -> Result<()> {
        let elem = self.elem as u64;
        let ins: &Parts = maps.input;
        let outs: &Parts = maps.output.as_deref().unwrap_or(ins);
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            let p = self.places[peer];
            let span = |off: u64,
                        elems: usize,
                        regions: &[Option<Box<dyn SharedRegion>>]|
             -> Result<(u64, u64)> {
                let bytes = elems as u64 * elem;
                match regions.get(peer).and_then(Option::as_ref).map(|r| r.len()) {
                    Some(len)
                        if off.is_multiple_of(elem)
                            && off.checked_add(bytes).is_some_and(|end| end <= len as u64) =>
                    {
                        Ok((off, off + bytes))
                    }
                    Some(len) => Err(self.protocol(
                        peer,
                        format!(
                            "it announced {bytes} bytes at offset {off} of its {len}-byte part \
                             of a window"
                        ),
                    )),
                    None => Err(self.unmapped(peer)),
                }
            };
            let used = |only: Option<usize>| only.is_none_or(|r| r == peer);
            let input = (in_elems > 0 && used(in_only))
                .then(|| span(p.in_off, in_elems, ins))
                .transpose()?;
            let output = (out_elems > 0 && used(out_only))
                .then(|| span(p.out_off, out_elems, outs))
                .transpose()?;
            if let (Some((a, b)), Some((c, d))) = (input, output) {
                if p.in_win == p.out_win && !(b <= c || d <= a || (a, b) == (c, d)) {
                    return Err(self.protocol(
                        peer,
                        "its input and output overlap without being the same buffer".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Elements `start..start + len` of rank `j`'s input.
    fn input<'x, T: Element>(
        &self,
        io: &'x HostIo<'_, T>,
        maps: &'x Maps<'_>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x [T]> {
        if j == self.rank {
            return Ok(io.input(start, len));
        }
        self.peer_input(maps.input_region(j), j, start, len)
    }

    /// Elements `start..start + len` of peer `j`'s input, in `region` (its
    /// part of the input window as mapped here).
    fn peer_input<'x, T: Element>(
        &self,
        region: Option<&'x dyn SharedRegion>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x [T]> {
        let off = self.places[j].in_off as usize + start * self.elem;
        let bytes = region
            .ok_or_else(|| self.unmapped(j))?
            .slice(off, len * self.elem)
            .map_err(|e| self.protocol(j, e.to_string()))?;
        bytemuck::try_cast_slice(bytes).map_err(|e| self.protocol(j, format!("{e:?}")))
    }

    /// The root of a broadcast or reduce.
    fn root(&self) -> usize {
        self.call.fingerprint.root as usize
    }

    fn unmapped(&self, peer: usize) -> Error {
        self.protocol(peer, "its part of the window is not mapped here".into())
    }

    /// Elements `start..start + len` of rank `j`'s output.
    fn output<'x, T: Element>(
        &self,
        io: &'x mut HostIo<'_, T>,
        maps: &'x mut Maps<'_>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x mut [T]> {
        if j == self.rank {
            return Ok(io.output(start, len));
        }
        self.peer_output(maps, j, start, len)
    }

    /// Elements `start..start + len` of peer `j`'s output, in its window.
    fn peer_output<'x, T: Element>(
        &self,
        maps: &'x mut Maps<'_>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x mut [T]> {
        self.peer_output_in(maps.output_region(j), j, start, len)
    }

    /// Elements `start..start + len` of peer `j`'s output, in `region` (its
    /// part of the output window as mapped here).
    fn peer_output_in<'x, T: Element>(
        &self,
        region: Option<&'x mut (dyn SharedRegion + 'static)>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x mut [T]> {
        let off = self.places[j].out_off as usize + start * self.elem;
        let bytes = region
            .ok_or_else(|| self.unmapped(j))?
            .slice_mut(off, len * self.elem)
            .map_err(|e| self.protocol(j, e.to_string()))?;
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| self.protocol(j, format!("{e:?}")))
    }

    /// `tmp = input_0 op input_1 op ... ` over `start..start + tmp.len()`
    /// of the inputs (rank order, so every rank would get the same bits).
    fn reduce_block<T: Element>(
        &self,
        io: &HostIo<'_, T>,
        maps: &Maps<'_>,
        start: usize,
        tmp: &mut [T],
    ) -> Result<()> {
        let k = tmp.len();
        let first = self.input(io, maps, 0, start, k)?;
        if self.size == 1 {
            crate::reduce::copy(tmp, first);
            return Ok(());
        }
        reduce_to(self.op, tmp, first, self.input(io, maps, 1, start, k)?);
        for j in 2..self.size {
            reduce_into(self.op, tmp, self.input(io, maps, j, start, k)?);
        }
        Ok(())
    }

    fn block<T>(&self) -> usize {
        (BLOCK_BYTES / std::mem::size_of::<T>().max(1)).max(1)
    }

    /// The blocks of `len` elements of `T`, as (offset, elements).
    fn blocks<T>(&self, len: usize) -> impl Iterator<Item = (usize, usize)> {
        let block = self.block::<T>();
        (0..len)
            .step_by(block)
            .map(move |done| (done, block.min(len - done)))
    }

    /// Reduce elements `from..from + len` of every input block by block
    /// (through an L1-sized buffer) and hand each result to `put` with its
    /// offset from `from`.
    fn reduce_blocks<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        from: usize,
        len: usize,
        mut put: impl FnMut(&mut HostIo<'_, T>, &mut Maps<'_>, usize, &[T]) -> Result<()>,
    ) -> Result<()> {
        // The buffer starts on a cache line, so that the AVX-512 kernels'
        // 64-byte stores into it never split across two lines (no
        // difference measured at 64 MiB: memory is the limit there).
        self.through_blocks(len, |t: &mut [T], done| {
            self.reduce_block(io, maps, from + done, t)?;
            put(io, maps, done, t)
        })
    }

    /// Run `each` on the blocks of `len` elements in turn, each in a
    /// block buffer (`with_scratch`) with its offset from the first.
    fn through_blocks<T: Element>(
        &self,
        len: usize,
        mut each: impl FnMut(&mut [T], usize) -> Result<()>,
    ) -> Result<()> {
        with_scratch(self.block::<T>().min(len), |tmp: &mut [T]| {
            self.blocks::<T>(len)
                .try_for_each(|(done, k)| each(&mut tmp[..k], done))
        })
    }

    /// With streaming stores, out of place: elements `in_start..in_start +
    /// len` of every rank's input (allreduce, reduce-scatter) or of this
    /// rank's alone (allgather), combined and written into `out_start..
    /// out_start + len` of every rank's output (allreduce, allgather) or of
    /// this rank's alone (reduce-scatter), in one fused pass (see
    /// `element::reduce_to_streams`). False where that path does not apply
    /// (cached stores, an allreduce's input and output in one window,
    /// outputs that lie differently against cache lines): the block path
    /// then does the work.
    fn spread_streaming<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        kind: Fused,
        in_start: usize,
        out_start: usize,
        len: usize,
    ) -> Result<bool> {
        if self.mode != Store::Streaming || len == 0 {
            return Ok(false);
        }
        let HostIo::OutOfPlace { input, output } = io else {
            return Ok(false);
        };
        // Which maps hold the peers' inputs and outputs: an allgather's
        // input and a reduce-scatter's output need not be in a window, and
        // the window they use is the one set of maps.
        let (in_regions, out_regions): (Option<&Parts>, Option<&mut Parts>) =
            match (kind, maps.output.as_mut()) {
                (Fused::AllReduce, Some(out)) => (Some(&*maps.input), Some(&mut **out)),
                (Fused::AllReduce, None) => return Ok(false),
                (Fused::AllGather, out) => (None, Some(out.map_or(&mut *maps.input, |o| &mut **o))),
                (Fused::ReduceScatter, _) => (Some(&*maps.input), None),
            };
        let ranks = if in_regions.is_some() {
            0..self.size
        } else {
            self.rank..self.rank + 1
        };
        let mut ins: Vec<&[T]> = Vec::with_capacity(ranks.len());
        for j in ranks {
            ins.push(if j == self.rank {
                &input[in_start..in_start + len]
            } else {
                let region = in_regions.and_then(|r| r.get(j)).and_then(Option::as_deref);
                self.peer_input(region, j, in_start, len)?
            });
        }
        // Every peer's output part at once (distinct regions of one list).
        let mut outs: Vec<&mut [T]> = Vec::with_capacity(self.size);
        if let Some(out_regions) = out_regions {
            let mut regions = out_regions.iter_mut().enumerate();
            for j in (0..self.size).filter(|&j| j != self.rank) {
                let region = regions
                    .find(|(i, _)| *i == j)
                    .and_then(|(_, r)| r.as_deref_mut());
                outs.push(self.peer_output_in(region, j, out_start, len)?);
            }
        }
        outs.push(&mut output[out_start..out_start + len]);
        Ok(crate::reduce::reduce_to_streams(self.op, &ins, &mut outs))
    }

    /// Allreduce share: piece `off..off + len` of every input, reduced,
    /// into the same piece of every output.
    fn reduce_and_spread<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        off: usize,
        len: usize,
    ) -> Result<()> {
        if self.spread_streaming(io, maps, Fused::AllReduce, off, off, len)? {
            return Ok(());
        }
        self.reduce_blocks(io, maps, off, len, |io, maps, done, t| {
            // Peers first: they wait on this rank, it waits on nobody.
            for step in 1..=self.size {
                let j = (self.rank + step) % self.size;
                store(self.mode, self.output(io, maps, j, off + done, t.len())?, t);
            }
            Ok(())
        })
    }

    /// Broadcast share: piece `off..off + len` of the root's input into the
    /// same piece of every output, block by block. With ordinary stores
    /// the copies go straight from the root's input (on the root) or from
    /// this rank's output block just written (elsewhere); with streaming
    /// stores, which leave nothing in cache to copy again from, through an
    /// L1-sized buffer (the root's input and a peer's output may lie in
    /// one window's list of parts). The root's output is skipped where it
    /// is its input.
    fn copy_and_spread<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        root: usize,
        off: usize,
        len: usize,
    ) -> Result<()> {
        let r = self.places[root];
        let root_in_place = if root == self.rank {
            matches!(io, HostIo::InPlace { input_base, output_base, .. } if input_base == output_base)
        } else {
            r.in_win == r.out_win && r.in_off == r.out_off
        };
        if self.mode == Store::Cached {
            return self.copy_and_spread_direct(io, maps, (root, root_in_place), off, len);
        }
        if self.copy_and_stream(io, maps, (root, root_in_place), off, len)? {
            return Ok(());
        }
        self.through_blocks(len, |t: &mut [T], done| {
            let k = t.len();
            crate::reduce::copy(t, self.input(io, maps, root, off + done, k)?);
            // Peers first: they wait on this rank, it waits on nobody.
            for step in 1..=self.size {
                let j = (self.rank + step) % self.size;
                if j == root && root_in_place {
                    continue;
                }
                store(self.mode, self.output(io, maps, j, off + done, k)?, t);
            }
            Ok(())
        })
    }

    /// [`Self::copy_and_spread`] with streaming stores in one fused pass:
    /// the root's piece read a cache line at a time and streamed into the
    /// same piece of every output (`element::reduce_to_streams` with one
    /// input), without the block buffer's extra copy. A broadcast is in
    /// place (one buffer a rank), so the input and the outputs usually lie
    /// in one window: the root's part is read, every other part written.
    /// False (nothing written) where the outputs lie differently against
    /// cache lines, or the root's input is also an output written here
    /// (its input and output in one window, out of place).
    fn copy_and_stream<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        (root, root_in_place): (usize, bool),
        off: usize,
        len: usize,
    ) -> Result<bool> {
        if len == 0 {
            return Ok(false);
        }
        // This rank's own buffers: the root's input (on the root) and the
        // output it writes here, if any.
        let (own_in, own_out): (Option<&[T]>, Option<&mut [T]>) = match io {
            HostIo::OutOfPlace { input, output } => (
                (root == self.rank).then(|| &input[off..off + len]),
                Some(&mut output[off..off + len]),
            ),
            HostIo::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                if root == self.rank {
                    if !root_in_place {
                        return Ok(false);
                    }
                    (Some(&buf[*input_base + off..*input_base + off + len]), None)
                } else {
                    let at = *output_base + off;
                    (None, Some(&mut buf[at..at + len]))
                }
            }
        };
        // The peers' parts that are written (every rank's but this one's
        // and an in-place root's), and the root's input part when it is a
        // peer's: out of the one list of parts when input and output share
        // a window, split between the two lists otherwise.
        let written = |j: usize| j != self.rank && !(j == root && root_in_place);
        let mut root_part: Option<&dyn SharedRegion> = None;
        let mut out_parts: Vec<(usize, Option<&mut (dyn SharedRegion + 'static)>)> =
            Vec::with_capacity(self.size);
        match maps.output.as_mut() {
            Some(out) => {
                root_part = maps.input.get(root).and_then(Option::as_deref);
                for (j, r) in out.iter_mut().enumerate().filter(|(j, _)| written(*j)) {
                    out_parts.push((j, r.as_deref_mut()));
                }
            }
            None => {
                for (j, r) in maps.input.iter_mut().enumerate() {
                    if j == root && root != self.rank {
                        if written(j) {
                            // Out of place in one window: the root's part
                            // is read and written (the block path does it).
                            return Ok(false);
                        }
                        root_part = r.as_deref().map(|r| r as &dyn SharedRegion);
                    } else if written(j) {
                        out_parts.push((j, r.as_deref_mut()));
                    }
                }
            }
        }
        let input = match own_in {
            Some(i) => i,
            None => self.peer_input(root_part, root, off, len)?,
        };
        let mut outs: Vec<&mut [T]> = Vec::with_capacity(self.size);
        for (j, region) in out_parts {
            outs.push(self.peer_output_in(region, j, off, len)?);
        }
        outs.extend(own_out);
        if outs.is_empty() {
            return Ok(true);
        }
        Ok(crate::reduce::reduce_to_streams(
            self.op,
            &[input],
            &mut outs,
        ))
    }

    /// [`Self::copy_and_spread`] with ordinary stores, without the block
    /// buffer: a copy less of every block (a 2-rank broadcast between
    /// windows of 32-512 KiB 1.1-1.2x in turns; docs/performance-log.md,
    /// "Calls between windows without allocations or locked lookups").
    /// The root copies its input into every output; any other rank first
    /// into its own output, then from there (still in cache) into the
    /// others'.
    fn copy_and_spread_direct<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        (root, root_in_place): (usize, bool),
        off: usize,
        len: usize,
    ) -> Result<()> {
        for (done, k) in self.blocks::<T>(len) {
            let at = off + done;
            if root != self.rank {
                let from = self.peer_input(maps.input_region(root), root, at, k)?;
                crate::reduce::copy(io.output(at, k), from);
            }
            // Peers first: they wait on this rank, it waits on nobody.
            for step in 1..self.size {
                let j = (self.rank + step) % self.size;
                if j == root && root_in_place {
                    continue;
                }
                let dst = self.peer_output(maps, j, at, k)?;
                let src = if root == self.rank {
                    io.input(at, k)
                } else {
                    io.output_ref(at, k)
                };
                crate::reduce::copy(dst, src);
            }
            if root == self.rank && !root_in_place {
                let own = Step::local(Prim::Copy, Operand::Input, at, at, k);
                io.copy_input_to_output(Store::Cached, &own);
            }
        }
        Ok(())
    }

    /// Allgather share: this rank's input (`count` elements) into block
    /// `rank` of every output.
    fn gather<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        count: usize,
    ) -> Result<()> {
        let base = self.rank * count;
        if self.spread_streaming(io, maps, Fused::AllGather, 0, base, count)? {
            return Ok(());
        }
        for (done, k) in self.blocks::<T>(count) {
            for step in 1..self.size {
                let j = (self.rank + step) % self.size;
                let dst = self.peer_output(maps, j, base + done, k)?;
                store(self.mode, dst, io.input(done, k));
            }
            // This rank's own block while the input block is in cache
            // (nothing to do in place).
            let own = Step::local(Prim::Copy, Operand::Input, done, base + done, k);
            io.copy_input_to_output(self.mode, &own);
        }
        Ok(())
    }

    /// All-to-all share: block j of this rank's input (`count` elements a
    /// block) into block `rank` of rank j's output, the peers from the
    /// next rank on (so that no two ranks start on the same output), then
    /// its own. Each block goes in one copy: unlike an allgather's, the
    /// blocks are all different, so nothing is read twice to keep in
    /// cache.
    fn exchange<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        count: usize,
    ) -> Result<()> {
        let base = self.rank * count;
        for step in 1..self.size {
            let j = (self.rank + step) % self.size;
            let dst = self.peer_output(maps, j, base, count)?;
            store(self.mode, dst, io.input(j * count, count));
        }
        let own = Step::local(Prim::Copy, Operand::Input, base, base, count);
        io.copy_input_to_output(self.mode, &own);
        Ok(())
    }

    /// Reduce-scatter share: block `rank` of every input, reduced, into
    /// this rank's output (`count` elements).
    fn scatter<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        maps: &mut Maps<'_>,
        count: usize,
    ) -> Result<()> {
        let from = self.rank * count;
        if self.spread_streaming(io, maps, Fused::ReduceScatter, from, 0, count)? {
            return Ok(());
        }
        self.reduce_blocks(io, maps, from, count, |io, _, done, t| {
            store(self.mode, io.output(done, t.len()), t);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::with_scratch;

    /// The scratch buffer has the length asked, starts on a cache line,
    /// and a nested ask gets a buffer of its own.
    #[test]
    fn scratch_buffers_are_whole_aligned_and_apart() {
        for len in [0usize, 1, 7, 2048, 4096] {
            with_scratch(len, |outer: &mut [f64]| {
                assert_eq!(outer.len(), len);
                assert_eq!(outer.as_ptr() as usize % 64, 0);
                outer.fill(1.0);
                with_scratch(len, |inner: &mut [u8]| {
                    assert_eq!(inner.len(), len);
                    assert_eq!(inner.as_ptr() as usize % 64, 0);
                    inner.fill(7);
                });
                assert!(
                    outer.iter().all(|&x| x == 1.0),
                    "the nested buffer overlapped"
                );
            });
        }
    }
}
