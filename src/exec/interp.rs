//! The host interpreter: runs a schedule's primitives over the host data
//! path of the connections (`SlotSender`/`SlotReceiver`).
//!
//! Each primitive works in place on slot memory: a received slot is reduced
//! straight into the next send slot or into the output, so a step is one pass
//! over its bytes. Every received frame's header is checked against this
//! rank's call (`verify`: fingerprint, step tag, length) before its payload
//! is used. It knows nothing of which collective it runs beyond the
//! fingerprint it is handed, and decides nothing: the store mode comes from
//! the planner.

use super::io::HostIo;
use super::verify;
use super::{Call, Links};
use crate::algo::{Prim, Schedule, Step, NO_PEER};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::plan;
use crate::reduce::{reduce_to, store, Store};
use ferroccl_transport::{Deadline, FrameHeader, SlotSender, TransportError};
use std::borrow::Cow;

/// The largest output (bytes) a receive copies out of a slot by
/// `copy_from_shared` (`memcpy` where the calibration chose it for the
/// copy into a slot). On the EPYC VM, fast state, against the loop of
/// `copy_bytes`: the 2-rank broadcast 1.09-1.21x from 64 KiB to 4 MiB, but
/// 0.43x at 8 MiB and 0.53x at 32 MiB, where the output's lines are not in
/// cache (docs/performance-log.md, "A slot written by the transport's
/// copy").
const FROM_SHARED_MAX: usize = 4 << 20;

/// Write `len` elements computed by `make` into a slot. Slots are 8-byte
/// aligned by every transport; the fallback keeps a misaligned slot correct
/// rather than panicking.
fn fill_slot<T: Element>(slot: &mut [u8], len: usize, make: impl FnOnce(&mut [T])) {
    let bytes = len * std::mem::size_of::<T>();
    match bytemuck::try_cast_slice_mut::<u8, T>(&mut slot[..bytes]) {
        Ok(typed) => make(typed),
        Err(_) => {
            let mut tmp = vec![T::zeroed(); len];
            make(&mut tmp);
            crate::reduce::copy(&mut slot[..bytes], bytemuck::cast_slice(&tmp));
        }
    }
}

/// Check a received frame and view its payload as elements.
fn accept_frame<'b, T: Element>(
    call: &Call,
    step: &Step,
    header: &FrameHeader,
    bytes: &'b [u8],
) -> Result<Cow<'b, [T]>> {
    verify::frame(call, step, std::mem::size_of::<T>(), header)?;
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
    mut io: HostIo<'_, T>,
    call: &Call,
) -> Result<()> {
    let bytes = io.output_len() * std::mem::size_of::<T>();
    let mode = plan::slot_store(
        matches!(io, HostIo::OutOfPlace { .. }),
        bytes,
        call.nt_store_bytes,
    );
    let placed = io.extent_len() * std::mem::size_of::<T>() < call.place_below;
    for step in &schedule.steps {
        run_step(links, step, &mut io, call, (mode, placed))?;
    }
    Ok(())
}

/// Send `data` as one frame: placed along the slots where `placed`
/// (`Call::place_below`) and the transport places payloads, else by
/// `send_from_until` (which ib serves from registered memory without a
/// copy).
fn send_data(
    sender: &mut dyn SlotSender,
    header: FrameHeader,
    call: &Call,
    data: &[u8],
    placed: bool,
) -> std::result::Result<(), TransportError> {
    if placed && sender.places_payloads() {
        sender.send_sized_until(header, deadline(call), data.len(), &mut |slot| {
            ferroccl_transport::copy_into_shared(slot, data)
        })
    } else {
        sender.send_from_until(header, deadline(call), data)
    }
}

/// Fill one frame of `bytes` with `fill`: by `send_sized_until` where
/// `placed` (`Call::place_below`), which a transport that places payloads
/// places and any other serves as `send_with_until`; else from the slot's
/// start.
fn send_filled(
    sender: &mut dyn SlotSender,
    header: FrameHeader,
    call: &Call,
    bytes: usize,
    placed: bool,
    fill: &mut dyn FnMut(&mut [u8]),
) -> std::result::Result<(), TransportError> {
    if placed {
        sender.send_sized_until(header, deadline(call), bytes, fill)
    } else {
        sender.send_with_until(header, deadline(call), &mut |slot| {
            fill(&mut slot[..bytes]);
            bytes
        })
    }
}

fn run_step<T: Element>(
    links: &mut Links,
    step: &Step,
    io: &mut HostIo<'_, T>,
    call: &Call,
    (mode, placed): (Store, bool),
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
            let sender = links.sender(step.channel, step.send_to, call)?;
            // The slot first, so that the peer can take it while this rank
            // copies its own block. The slot is written by the transport's
            // copy (`copy_into_shared`, `memcpy` where the calibration chose
            // it), which writes lines the peer's cache holds without
            // fetching them first; a fused pass that stored into the slot
            // as it went fetched each one (2-rank allgather of 128 KiB out
            // of place: 4.2 -> 3.0 us).
            let result = send_data(
                &mut **sender,
                header,
                call,
                bytemuck::cast_slice(io.local(step)),
                placed,
            )
            .map_err(|e| Error::from_transport(e, &call.during()));
            if step.prim == Prim::CopySend {
                io.copy_input_to_output(mode, step);
            }
            result
        }
        Prim::Recv => {
            let (receiver, _) =
                links.receiver_and_sender(step.channel, step.recv_from, NO_PEER, call)?;
            let mut found: Option<Error> = None;
            // Out of the slot with streaming stores, or, into an output
            // small enough to stay in cache, the way the calibration chose
            // for the copy into a slot (`copy_from_shared`); else by
            // `recv_into`'s copy.
            let own_copy = mode == Store::Streaming
                || io.output_len() * std::mem::size_of::<T>() <= FROM_SHARED_MAX;
            if own_copy && receiver.recv_into_copies() {
                let out = io.output(step.output, len);
                let result =
                    receiver.recv_with_until(
                        deadline(call),
                        &mut |h, bytes| match accept_frame::<T>(call, step, h, bytes) {
                            Ok(data) => {
                                match mode {
                                    Store::Streaming => store(mode, out, &data),
                                    Store::Cached => ferroccl_transport::copy_from_shared(
                                        bytemuck::cast_slice_mut(out),
                                        bytemuck::cast_slice(&data),
                                    ),
                                }
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
                    verify::frame(call, step, std::mem::size_of::<T>(), h).map_err(|e| {
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
                links.receiver_and_sender(step.channel, step.recv_from, step.send_to, call)?;
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
                // What a step that sends writes into the slot.
                let bytes = len * std::mem::size_of::<T>();
                match prim {
                    Prim::RecvReduceCopy => io.reduce_to_output(mode, call.op, step, data),
                    Prim::RecvReduceSend => {
                        let input = io.local(step);
                        let sender = sender.as_mut().expect("schedule step sends");
                        send_filled(&mut ***sender, header, call, bytes, placed, &mut |slot| {
                            fill_slot::<T>(slot, len, |dst| reduce_to(call.op, dst, data, input));
                        })?;
                    }
                    // Forward the received bytes themselves, then keep
                    // them (the slot first: as `CopySend`).
                    Prim::RecvCopySend => {
                        let sender = sender.as_mut().expect("schedule step sends");
                        send_data(
                            &mut ***sender,
                            header,
                            call,
                            bytemuck::cast_slice(data),
                            placed,
                        )?;
                        store(mode, io.output(step.output, len), data);
                    }
                    Prim::RecvReduceCopySend => {
                        let sender = sender.as_mut().expect("schedule step sends");
                        if sender.send_from_copies() {
                            send_filled(
                                &mut ***sender,
                                header,
                                call,
                                bytes,
                                placed,
                                &mut |slot| {
                                    fill_slot::<T>(slot, len, |dst| {
                                        io.reduce_to_output_and_copy(mode, call.op, step, data, dst)
                                    });
                                },
                            )?;
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
pub(super) fn finish_recv(
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
pub(super) fn deadline(call: &Call) -> Deadline {
    Deadline::After(call.timeout)
}
