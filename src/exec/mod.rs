//! Runs a schedule's primitives over connections.
//!
//! Each primitive works in place on slot memory: a received slot is reduced
//! straight into the next send slot or into the output, so a step is one pass
//! over its bytes. Every received frame's header is checked against this
//! rank's call (fingerprint, step tag, length) before its payload is used.
//! This layer owns the connections of a communicator; it knows nothing of
//! which collective it runs beyond the fingerprint it is handed.

mod links;
pub(crate) mod window;

pub(crate) use links::{Connector, Links, MemberWatch, WAIT_SLICE};

use crate::algo::{Operand, Prim, Schedule, Step, NO_PEER};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::fingerprint;
use crate::reduce::{
    copy_to_both, reduce_into, reduce_into_both, reduce_to, reduce_to_both, reduce_to_output,
    store, Store,
};
use ferroccl_transport::{Deadline, Fingerprint, FrameHeader, TransportError};
use std::borrow::Cow;
use std::time::Duration;

impl Call {
    /// "all_reduce #17 (float, sum, 1000 elements)", for errors; formatted
    /// only when one happens, so the fast path allocates nothing for it.
    pub(crate) fn during(&self) -> String {
        fingerprint::describe(&self.fingerprint)
    }
}

/// What the executor needs to know about the call it runs.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// Carried by every frame and checked on receipt.
    pub(crate) fingerprint: Fingerprint,

    /// Reduction operator (ignored by non-reducing primitives).
    pub(crate) op: ReduceOp,
    /// Bound of every single wait.
    pub(crate) timeout: Duration,
    /// Outputs of at least this many bytes are written with streaming
    /// stores (0: never); `Config::nt_store_bytes`.
    pub(crate) nt_store_bytes: usize,
    /// Small calls may travel inline in a check-in (not when the config
    /// forces an algorithm: then that algorithm runs).
    pub(crate) inline: bool,
}

/// The buffers of a call. Offsets in a schedule are relative to the input
/// and the output; in place, both live in one buffer at the given bases.
pub(crate) enum Io<'a, T> {
    /// Separate input and output.
    OutOfPlace { input: &'a [T], output: &'a mut [T] },
    /// One buffer; input starts at `input_base`, output at `output_base`.
    InPlace {
        buf: &'a mut [T],
        input_base: usize,
        output_base: usize,
    },
}

impl<T: Element> Io<'_, T> {
    fn input(&self, off: usize, len: usize) -> &[T] {
        match self {
            Io::OutOfPlace { input, .. } => &input[off..off + len],
            Io::InPlace {
                buf, input_base, ..
            } => &buf[input_base + off..input_base + off + len],
        }
    }

    fn output_ref(&self, off: usize, len: usize) -> &[T] {
        match self {
            Io::OutOfPlace { output, .. } => &output[off..off + len],
            Io::InPlace {
                buf, output_base, ..
            } => &buf[*output_base + off..*output_base + off + len],
        }
    }

    /// The step's local operand: its input, or a partial result in the
    /// output.
    fn local(&self, step: &Step) -> &[T] {
        match step.local {
            Operand::Input => self.input(step.input, step.len),
            Operand::Output => self.output_ref(step.output, step.len),
        }
    }

    fn output(&mut self, off: usize, len: usize) -> &mut [T] {
        match self {
            Io::OutOfPlace { output, .. } => &mut output[off..off + len],
            Io::InPlace {
                buf, output_base, ..
            } => &mut buf[*output_base + off..*output_base + off + len],
        }
    }

    /// The step's output, and its local operand unless that is the output
    /// itself (a partial result there, or in place at the same place). An
    /// in-place input elsewhere in the buffer comes as a copy (no schedule
    /// does that today; it stays correct anyway).
    fn output_and_input(&mut self, step: &Step) -> (&mut [T], Option<Cow<'_, [T]>>) {
        let len = step.len;
        if step.local == Operand::Output {
            return (self.output(step.output, len), None);
        }
        match self {
            Io::OutOfPlace { input, output } => (
                &mut output[step.output..step.output + len],
                Some(Cow::Borrowed(&input[step.input..step.input + len])),
            ),
            Io::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                let (i, o) = (*input_base + step.input, *output_base + step.output);
                let input = (i != o).then(|| Cow::Owned(buf[i..i + len].to_vec()));
                (&mut buf[o..o + len], input)
            }
        }
    }

    /// `output[out..] = data op input[inp..]`, whatever aliasing in place.
    fn reduce_to_output(&mut self, mode: Store, op: ReduceOp, step: &Step, data: &[T]) {
        match self.output_and_input(step) {
            (out, None) => reduce_into(op, out, data),
            (out, Some(input)) => reduce_to_output(mode, op, out, data, &input),
        }
    }

    /// `reduce_to_output`, and the result also into `copy` (a send slot) in
    /// the same pass.
    fn reduce_to_output_and_copy(
        &mut self,
        mode: Store,
        op: ReduceOp,
        step: &Step,
        data: &[T],
        copy: &mut [T],
    ) {
        match self.output_and_input(step) {
            (out, None) => reduce_into_both(mode, op, out, copy, data),
            (out, Some(input)) => reduce_to_both(mode, op, out, copy, data, &input),
        }
    }

    /// `output[out..] = output[out..] op input[inp..]`. In place with both
    /// at the same memory this is `x op x`, as the primitive says.
    fn reduce_input_into_output(&mut self, op: ReduceOp, step: &Step) {
        let len = step.len;
        match self {
            Io::OutOfPlace { input, output } => reduce_into(
                op,
                &mut output[step.output..step.output + len],
                &input[step.input..step.input + len],
            ),
            Io::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                let (i, o) = (*input_base + step.input, *output_base + step.output);
                let input = buf[i..i + len].to_vec();
                reduce_into(op, &mut buf[o..o + len], &input);
            }
        }
    }

    /// `output[out..] = input[inp..]` (a no-op when they are the same memory).
    fn copy_input_to_output(&mut self, mode: Store, step: &Step) {
        let len = step.len;
        if step.local == Operand::Output {
            return;
        }
        match self {
            Io::OutOfPlace { input, output } => store(
                mode,
                &mut output[step.output..step.output + len],
                &input[step.input..step.input + len],
            ),
            Io::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                let (i, o) = (*input_base + step.input, *output_base + step.output);
                if i != o {
                    buf.copy_within(i..i + len, o);
                }
            }
        }
    }

    /// Addresses of the input's and the output's first elements, to find
    /// the window they lie in (`window`).
    fn addresses(&self) -> (usize, usize) {
        let elem = std::mem::size_of::<T>();
        match self {
            Io::OutOfPlace { input, output } => (input.as_ptr() as usize, output.as_ptr() as usize),
            Io::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                let base = buf.as_ptr() as usize;
                (
                    base.wrapping_add(input_base * elem),
                    base.wrapping_add(output_base * elem),
                )
            }
        }
    }

    /// Elements of the output (in place: of the whole buffer).
    fn output_len(&self) -> usize {
        match self {
            Io::OutOfPlace { output, .. } => output.len(),
            Io::InPlace { buf, .. } => buf.len(),
        }
    }
}

/// Write `len` elements computed by `make` into a slot. Slots are 8-byte
/// aligned by every transport; the fallback keeps a misaligned slot correct
/// rather than panicking.
fn fill_slot<T: Element>(slot: &mut [u8], len: usize, make: impl FnOnce(&mut [T])) -> usize {
    let bytes = len * std::mem::size_of::<T>();
    match bytemuck::try_cast_slice_mut::<u8, T>(&mut slot[..bytes]) {
        Ok(typed) => make(typed),
        Err(_) => {
            let mut tmp = vec![T::zeroed(); len];
            make(&mut tmp);
            slot[..bytes].copy_from_slice(bytemuck::cast_slice(&tmp));
        }
    }
    bytes
}

/// Check a received header against what this step expects: the same call
/// (fingerprint), the same step, the expected length.
fn check_header<T: Element>(call: &Call, step: &Step, header: &FrameHeader) -> Result<()> {
    let peer = step.recv_from;
    if header.fingerprint != call.fingerprint {
        return Err(Error::Mismatch {
            peer,
            local: fingerprint::describe(&call.fingerprint),
            remote: fingerprint::describe(&header.fingerprint),
        });
    }
    let protocol = |detail: String| Error::Protocol {
        peer,
        during: call.during(),
        detail,
    };
    if header.step != step.recv_tag {
        return Err(protocol(format!(
            "frame for step {} arrived where step {} was expected",
            header.step, step.recv_tag
        )));
    }
    let want = step.len * std::mem::size_of::<T>();
    if header.len as usize != want {
        return Err(protocol(format!(
            "frame of {} bytes where {want} were expected",
            header.len
        )));
    }
    Ok(())
}

/// Check a received frame and view its payload as elements.
fn accept_frame<'b, T: Element>(
    call: &Call,
    step: &Step,
    header: &FrameHeader,
    bytes: &'b [u8],
) -> Result<Cow<'b, [T]>> {
    check_header::<T>(call, step, header)?;
    if bytes.len() != header.len as usize {
        return Err(Error::Protocol {
            peer: step.recv_from,
            during: call.during(),
            detail: format!(
                "frame header says {} bytes but {} arrived",
                header.len,
                bytes.len()
            ),
        });
    }
    Ok(match bytemuck::try_cast_slice::<u8, T>(bytes) {
        Ok(typed) => Cow::Borrowed(typed),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec::<u8, T>(bytes)),
    })
}

/// Run `schedule` on `io` over `links`.
pub(crate) fn run<T: Element>(
    links: &mut Links,
    schedule: &Schedule,
    mut io: Io<'_, T>,
    call: &Call,
) -> Result<()> {
    // A large output of its own is written with streaming stores: it would
    // not stay in cache anyway, and ordinary stores would read every line
    // first. In place, the lines written were just read as input and are in
    // cache: streaming them out measured 30-40% slower (docs/performance.md).
    let bytes = io.output_len() * std::mem::size_of::<T>();
    let own_output = matches!(io, Io::OutOfPlace { .. });
    let mode = if own_output && call.nt_store_bytes > 0 && bytes >= call.nt_store_bytes {
        Store::Streaming
    } else {
        Store::Cached
    };
    for step in &schedule.steps {
        run_step(links, step, &mut io, call, mode)?;
    }
    Ok(())
}

fn run_step<T: Element>(
    links: &mut Links,
    step: &Step,
    io: &mut Io<'_, T>,
    call: &Call,
    mode: Store,
) -> Result<()> {
    let header = FrameHeader::data(call.fingerprint, step.send_tag);
    let len = step.len;
    match step.prim {
        Prim::Copy => {
            io.copy_input_to_output(mode, step);
            Ok(())
        }
        Prim::Reduce => {
            io.reduce_input_into_output(call.op, step);
            Ok(())
        }
        Prim::Send | Prim::CopySend => {
            let sender = links.sender(step.send_to, call)?;
            if step.prim == Prim::CopySend && sender.send_from_copies() {
                // Output and slot in one pass over the input.
                let result = match io.output_and_input(step) {
                    (out, Some(input)) => {
                        sender.send_with_until(header, deadline(call), &mut |slot| {
                            fill_slot::<T>(slot, len, |dst| copy_to_both(mode, out, dst, &input))
                        })
                    }
                    (out, None) => {
                        sender.send_from_until(header, deadline(call), bytemuck::cast_slice(out))
                    }
                };
                return result.map_err(|e| Error::from_transport(e, &call.during()));
            }
            if step.prim == Prim::CopySend {
                io.copy_input_to_output(mode, step);
            }
            let input = io.local(step);
            sender
                .send_from_until(header, deadline(call), bytemuck::cast_slice(input))
                .map_err(|e| Error::from_transport(e, &call.during()))
        }
        Prim::Recv => {
            let (receiver, _) = links.receiver_and_sender(step.recv_from, NO_PEER, call)?;
            let mut found: Option<Error> = None;
            if mode == Store::Streaming && receiver.recv_into_copies() {
                // Out of the slot with streaming stores.
                let out = io.output(step.output, len);
                let result =
                    receiver.recv_with_until(
                        deadline(call),
                        &mut |h, bytes| match accept_frame::<T>(call, step, h, bytes) {
                            Ok(data) => {
                                store(mode, out, &data);
                                Ok(())
                            }
                            Err(e) => {
                                found = Some(e);
                                Err(TransportError::Aborted)
                            }
                        },
                    );
                return finish_recv(result, found, call);
            }
            let dst: &mut [u8] = bytemuck::cast_slice_mut(io.output(step.output, len));
            let result = receiver.recv_into_until(
                deadline(call),
                &mut |h| {
                    check_header::<T>(call, step, h).map_err(|e| {
                        found = Some(e);
                        TransportError::Aborted
                    })
                },
                dst,
            );
            finish_recv(result, found, call)
        }
        prim => {
            let (receiver, mut sender) =
                links.receiver_and_sender(step.recv_from, step.send_to, call)?;
            // An error found while consuming a frame is richer than what the
            // transport can carry; keep it here and hand the transport a
            // placeholder.
            let mut found: Option<Error> = None;
            let result = receiver.recv_with_until(deadline(call), &mut |h, bytes| {
                let data = match accept_frame::<T>(call, step, h, bytes) {
                    Ok(data) => data,
                    Err(e) => {
                        found = Some(e);
                        return Err(TransportError::Aborted);
                    }
                };
                let data: &[T] = &data;
                match prim {
                    Prim::RecvReduceCopy => io.reduce_to_output(mode, call.op, step, data),
                    Prim::RecvReduceSend => {
                        let input = io.local(step);
                        let sender = sender.as_mut().expect("schedule step sends");
                        sender.send_with_until(header, deadline(call), &mut |slot| {
                            fill_slot::<T>(slot, len, |dst| reduce_to(call.op, dst, data, input))
                        })?;
                    }
                    // Where sending copies into a slot anyway, the output
                    // and the slot are written in one pass over the data.
                    Prim::RecvCopySend => {
                        let sender = sender.as_mut().expect("schedule step sends");
                        if sender.send_from_copies() {
                            let out = io.output(step.output, len);
                            sender.send_with_until(header, deadline(call), &mut |slot| {
                                fill_slot::<T>(slot, len, |dst| copy_to_both(mode, out, dst, data))
                            })?;
                        } else {
                            io.output(step.output, len).copy_from_slice(data);
                            // Forward the received bytes themselves, not the copy.
                            sender.send_from_until(
                                header,
                                deadline(call),
                                bytemuck::cast_slice(data),
                            )?;
                        }
                    }
                    Prim::RecvReduceCopySend => {
                        let sender = sender.as_mut().expect("schedule step sends");
                        if sender.send_from_copies() {
                            sender.send_with_until(header, deadline(call), &mut |slot| {
                                fill_slot::<T>(slot, len, |dst| {
                                    io.reduce_to_output_and_copy(mode, call.op, step, data, dst)
                                })
                            })?;
                        } else {
                            io.reduce_to_output(Store::Cached, call.op, step, data);
                            let out = io.output(step.output, len);
                            sender.send_from_until(
                                header,
                                deadline(call),
                                bytemuck::cast_slice(out),
                            )?;
                        }
                    }
                    Prim::Send | Prim::CopySend | Prim::Copy | Prim::Reduce | Prim::Recv => {
                        unreachable!("handled above")
                    }
                }
                Ok(())
            });
            finish_recv(result, found, call)
        }
    }
}

/// The outcome of a receive: an error found while checking the frame wins
/// over the placeholder the transport passed through.
fn finish_recv(
    result: std::result::Result<(), TransportError>,
    found: Option<Error>,
    call: &Call,
) -> Result<()> {
    match (result, found) {
        (_, Some(err)) => Err(err),
        (Err(e), None) => Err(Error::from_transport(e, &call.during())),
        (Ok(()), None) => Ok(()),
    }
}

/// Each wait of a step ends `call.timeout` after it begins; transports that
/// can count from their first look at the clock skip it for waits that end
/// at once.
fn deadline(call: &Call) -> Deadline {
    Deadline::After(call.timeout)
}
