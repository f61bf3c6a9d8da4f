//! A device call by the executor once it is set up: the plan with the
//! device planner's chunk and channels, the program image, the launch on
//! the communicator's stream behind the caller's gate, and the watchdog
//! that raises the abort word; a kernel's report becomes the host path's
//! named error.

use super::{Ready, ABORT_GRACE, IMAGE_PIECE, SPIN_CHECK, WATCH_SLICE};
use crate::algo::encode::{self, Layout, ProgramMeta};
use crate::coll::{self, CollCall, Plan};
use crate::comm::Inner;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::exec::{Call, DeviceIo};
use crate::plan::device as device_plan;
use ferroccl_cuda::device::{DevicePtr, Engine};
use ferroccl_cuda::error::CudaError;
use ferroccl_cuda::executor::{Control, ExecFault, ExecLaunch, CONTROL_BYTES};
use std::time::{Duration, Instant};

impl Inner {
    /// Run `call` (of `coll`) by the executor set up in `ready`: see the
    /// module docs.
    pub(in crate::comm) fn exec_run<T: Element>(
        &self,
        ready: &mut Ready,
        device: &DeviceIo,
        call: &Call,
        coll: &CollCall,
        host_plan: &Plan,
    ) -> Result<()> {
        let engine = &**device.pool.engine();
        let during = call.during();
        let err = |e: CudaError| Error::Io(format!("{during}: device executor: {e}"));
        if ready.faulted {
            return Err(Error::Io(format!(
                "{during}: the device executor faulted in an earlier call"
            )));
        }
        let elem = std::mem::size_of::<T>();
        let n = self.size;
        let bytes = coll.count * elem;
        let choice = device_plan::for_call(
            coll.kind,
            n,
            bytes,
            ready.allowed,
            ready.channels,
            &ready.geometry,
        );
        if tracing::enabled!(tracing::Level::INFO)
            && crate::comm::lock(&self.tuned).insert((
                coll.kind.code() | 0x80,
                crate::plan::tune::size_class(bytes),
            ))
        {
            let algorithm = self.algorithm_name(coll, bytes, choice.chunk_bytes * choice.channels);
            tracing::info!(
                rank = self.rank,
                "plan: {}",
                device_plan::explain(coll.kind, bytes, n, &algorithm, &choice)
            );
        }
        // The plan's frames hold `channels` pieces of a chunk each
        // (`algo::channels::split` cuts every step alike).
        let plan = self.build_plan_chunked::<T>(coll, choice.chunk_bytes * choice.channels)?;
        if (
            plan.scratch_output,
            plan.copies_input,
            plan.input_base,
            plan.output_base,
        ) != (
            host_plan.scratch_output,
            host_plan.copies_input,
            host_plan.input_base,
            host_plan.output_base,
        ) {
            return Err(Error::Io(format!(
                "{during}: the device plan lays the buffers out unlike the call's plan"
            )));
        }
        let meta = ProgramMeta {
            rank: self.rank,
            ranks: n,
            dtype: T::DTYPE,
            op: coll.op,
            layout: device.exec.layout,
            finish: coll::avg_finish(coll, &plan, self.rank, n, device.exec.layout)
                .map_err(|why| Error::Io(format!("{during}: {why}")))?,
        };
        let schedule = crate::algo::channels::split(&plan.schedule, choice.channels);
        let image = encode::encode(&schedule, &meta)
            .map_err(|e| Error::Io(format!("{during}: the schedule does not encode: {e}")))?;
        let channels = u16::from_le_bytes([image[20], image[21]]) as u32;
        if channels as usize > ready.channels {
            return Err(Error::Io(format!(
                "{during}: a program of {channels} channels; the executor is set up for {}",
                ready.channels
            )));
        }
        let (input, output) = match device.exec.layout {
            Layout::Shared { .. } => {
                let at = engine.device_address(device.exec.base);
                (at, at)
            }
            Layout::Separate => (
                engine.device_address(device.bufs.input),
                engine.device_address(device.bufs.output),
            ),
        };
        let program = ready.image_for(engine, &image, call.timeout).map_err(err)?;
        let s = ready.stream;
        let ctl = Control {
            abort: ready.abort_addr,
            spin_check: SPIN_CHECK,
            ..Control::default()
        };
        engine
            .with_pinned(ready.ctl_pinned, &mut |p| {
                p.copy_from_slice(&ctl.to_bytes())
            })
            .map_err(err)?;
        let op = coll.op;
        let launch = ExecLaunch {
            protocol: choice.protocol,
            op,
            ty: T::DTYPE,
            channels,
            program,
            input,
            output,
            conns: engine.device_address(DevicePtr::new(ready.conns)),
            ctl: engine.device_address(DevicePtr::new(ready.ctl)),
        };
        (|| {
            engine.stream_wait(s, device.ready)?;
            engine.h2d(
                s,
                DevicePtr::new(ready.ctl),
                ready.ctl_pinned,
                0,
                CONTROL_BYTES,
            )?;
            engine.launch_executor(s, &launch)?;
            if let Some((gate, value)) = device.gate {
                engine.stream_raise_gate(s, gate, value)?;
            }
            engine.d2h(
                s,
                ready.ctl_pinned,
                0,
                DevicePtr::new(ready.ctl),
                CONTROL_BYTES,
            )?;
            engine.record(ready.end, s)
        })()
        .map_err(err)?;
        let watched = self.watch_kernel(engine, ready, call);
        let mut got = [0u8; CONTROL_BYTES];
        let read = engine.with_pinned(ready.ctl_pinned, &mut |p| got.copy_from_slice(p));
        let why = match watched {
            Err(e) => {
                ready.faulted = true;
                return Err(e);
            }
            Ok(why) => why,
        };
        read.map_err(err)?;
        let ctl =
            Control::from_bytes(&got).ok_or_else(|| Error::Io(format!("{during}: control")))?;
        match ExecFault::from_code(ctl.error) {
            None if ctl.error == 0 => Ok(()),
            fault => {
                ready.faulted = true;
                Err(fault_error(fault, &ctl, why, &during, call.timeout))
            }
        }
    }

    /// Wait for the kernel's work to end, raising the abort word on
    /// `abort()`, on a failure the communicator hears of, and at the
    /// timeout: why it was raised, if it was. `Err` where the work did not
    /// end (or the engine failed).
    fn watch_kernel(
        &self,
        engine: &dyn Engine,
        ready: &Ready,
        call: &Call,
    ) -> Result<Option<Raised>> {
        let started = Instant::now();
        let mut raised: Option<(Raised, Instant)> = None;
        loop {
            let slice = match raised {
                Some(_) => WATCH_SLICE * 10,
                None => WATCH_SLICE,
            };
            match engine.host_wait(ready.end, slice) {
                Ok(()) => return Ok(raised.map(|(why, _)| why)),
                Err(CudaError::Timeout { .. }) => {}
                Err(e) => {
                    // The engine failed (a stand-in's deadlock report, a
                    // sticky CUDA error): the kernel is told to stop, so
                    // that it does not spin on for peers that will not
                    // come, and the call ends with the engine's error.
                    engine.raise_gate(ready.abort, 1);
                    return Err(Error::Io(format!(
                        "{}: device executor: {e}",
                        call.during()
                    )));
                }
            }
            match raised {
                Some((_, at)) if at.elapsed() > ABORT_GRACE => {
                    return Err(Error::Io(format!(
                        "{}: the device executor's kernel still runs {} s after its abort word \
                         was set",
                        call.during(),
                        ABORT_GRACE.as_secs()
                    )))
                }
                Some(_) => {}
                None => {
                    let why = if self.abort_signal.is_fired() || self.has_failed() {
                        Some(Raised::Failure)
                    } else if started.elapsed() >= call.timeout {
                        Some(Raised::Timeout(started.elapsed()))
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        engine.raise_gate(ready.abort, 1);
                        raised = Some((why, Instant::now()));
                    }
                }
            }
        }
    }
}

/// Why the watchdog set the abort word.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Raised {
    /// `abort()`, or a failure the communicator heard of.
    Failure,
    /// The call's timeout, after this long.
    Timeout(Duration),
}

/// The call's error for a kernel's report: the named errors of the host
/// path.
pub(crate) fn fault_error(
    fault: Option<ExecFault>,
    ctl: &Control,
    raised: Option<Raised>,
    during: &str,
    timeout: Duration,
) -> Error {
    let what = ExecFault::describe(ctl).unwrap_or_else(|| format!("fault code {}", ctl.error));
    let peer = ctl.peer as usize;
    match (fault, raised) {
        (Some(ExecFault::Aborted), Some(Raised::Timeout(after))) => Error::Timeout {
            peer,
            during: during.to_string(),
            what: format!(
                "a device frame on channel {} (program record {})",
                ctl.channel, ctl.record
            ),
            waited_ms: after.max(timeout).as_millis() as u64,
        },
        // The communicator's own failure (on_error puts the stored one in
        // its place) or abort().
        (Some(ExecFault::Aborted), _) => Error::Aborted(None),
        (Some(ExecFault::Tag | ExecFault::Length | ExecFault::TooBig), _) => Error::Protocol {
            peer,
            during: during.to_string(),
            detail: format!("device executor: {what}"),
        },
        _ => Error::Io(format!("{during}: device executor: {what}")),
    }
}

impl Ready {
    /// The program image in device memory, copied there on the stream.
    /// Called under a parked stream (the call's gate), so nothing here
    /// waits for other streams (the device rule): the device memory grows
    /// to the next power of two in the stream's order (`cuMemAllocAsync`,
    /// `cuMemFreeAsync`), and an image larger than the pinned buffer goes
    /// up in pieces, each waited for on this stream alone. The previous
    /// call's copy has ended: the call waited for its work.
    fn image_for(
        &mut self,
        engine: &dyn Engine,
        image: &[u8],
        timeout: Duration,
    ) -> ferroccl_cuda::error::Result<u64> {
        let (mut d, cap) = self.image;
        if cap < image.len() {
            let want = image.len().next_power_of_two();
            let grown = engine.alloc_device_async(self.stream, want)?;
            engine.free_device_async(self.stream, d)?;
            self.image = (grown, want);
            d = grown;
        }
        for (k, piece) in image.chunks(IMAGE_PIECE).enumerate() {
            if k > 0 {
                engine.host_wait(self.image_sent, timeout)?;
            }
            engine.with_pinned(self.image_pinned, &mut |m| {
                m[..piece.len()].copy_from_slice(piece)
            })?;
            let at = DevicePtr::new(d).add(k * IMAGE_PIECE);
            engine.h2d(self.stream, at, self.image_pinned, 0, piece.len())?;
            engine.record(self.image_sent, self.stream)?;
        }
        Ok(engine.device_address(DevicePtr::new(d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_reports_become_the_host_paths_errors() {
        let ctl = Control {
            error: 1,
            channel: 0,
            record: 5,
            peer: 3,
            ..Control::default()
        };
        let t = Duration::from_secs(2);
        match fault_error(
            Some(ExecFault::Aborted),
            &ctl,
            Some(Raised::Timeout(t)),
            "all_reduce #4",
            t,
        ) {
            Error::Timeout {
                peer,
                during,
                what,
                waited_ms,
            } => {
                assert_eq!(
                    (peer, during.as_str(), waited_ms),
                    (3, "all_reduce #4", 2000)
                );
                assert!(what.contains("record 5"), "{what}");
            }
            other => panic!("{other}"),
        }
        assert!(matches!(
            fault_error(
                Some(ExecFault::Aborted),
                &ctl,
                Some(Raised::Failure),
                "x",
                t
            ),
            Error::Aborted(None)
        ));
        let tag = Control {
            error: 2,
            peer: 1,
            want: 9,
            got: 10,
            ..Control::default()
        };
        match fault_error(Some(ExecFault::Tag), &tag, None, "x", t) {
            Error::Protocol {
                peer: 1, detail, ..
            } => assert!(detail.contains("tagged 10"), "{detail}"),
            other => panic!("{other}"),
        }
        let odd = Control {
            error: 99,
            ..Control::default()
        };
        assert!(fault_error(None, &odd, None, "x", t)
            .to_string()
            .contains("fault code 99"));
    }
}
