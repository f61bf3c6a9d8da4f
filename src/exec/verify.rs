//! Whether a peer runs the same call as this rank, before any of its bytes
//! are used: the one check every path makes, wherever the peer's view of
//! the call arrives from. The host interpreter finds it in the header of
//! every frame; a check-in in the peer's announcement on its control page
//! (so that calls that never read a frame on the host, inline, direct
//! between windows, by cross-memory attach, compare calls before anything
//! moves); the staged executor in the headers of the frames it receives
//! into bounce buffers. The device executor's kernel checks each frame's
//! tag and length itself. Everything here is pure.

use super::Call;
use crate::algo::Step;
use crate::error::{Error, Result};
use crate::fingerprint;
use ferroccl_transport::{Fingerprint, FrameHeader};

/// `Ok` when `peer`'s view of the call (`remote`) is this rank's
/// (`local`); else the `Mismatch` that describes both.
#[inline]
pub(crate) fn same_call(peer: usize, local: &Fingerprint, remote: &Fingerprint) -> Result<()> {
    if local == remote {
        Ok(())
    } else {
        Err(mismatch(peer, local, remote))
    }
}

#[cold]
fn mismatch(peer: usize, local: &Fingerprint, remote: &Fingerprint) -> Error {
    Error::Mismatch {
        peer,
        local: fingerprint::describe(local),
        remote: fingerprint::describe(remote),
    }
}

/// Check a received frame's header against what `step` expects: the same
/// call, the same step, `step.len` elements of `elem` bytes.
#[inline]
pub(crate) fn frame(call: &Call, step: &Step, elem: usize, header: &FrameHeader) -> Result<()> {
    let peer = step.recv_from;
    same_call(peer, &call.fingerprint, &header.fingerprint)?;
    if header.step != step.recv_tag {
        return Err(protocol(
            call,
            peer,
            format!(
                "frame for step {} arrived where step {} was expected",
                header.step, step.recv_tag
            ),
        ));
    }
    let want = step.len * elem;
    if header.len as usize != want {
        return Err(protocol(
            call,
            peer,
            format!("frame of {} bytes where {want} were expected", header.len),
        ));
    }
    Ok(())
}

#[cold]
fn protocol(call: &Call, peer: usize, detail: String) -> Error {
    Error::Protocol {
        peer,
        during: call.during(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Operand, Prim};
    use crate::coll::CollKind;
    use crate::element::ReduceOp;

    fn call() -> Call {
        Call {
            kind: CollKind::AllReduce,
            fingerprint: Fingerprint {
                seq: 7,
                coll: CollKind::AllReduce.code(),
                dtype: 9,
                op: ReduceOp::Sum.code(),
                count: 100,
                root: u32::MAX,
            },
            order: 7,
            op: ReduceOp::Sum,
            timeout: std::time::Duration::from_secs(1),
            nt_store_bytes: 0,
            place_below: 0,
        }
    }

    fn step() -> Step {
        Step {
            recv_from: 2,
            recv_tag: 5,
            ..Step::local(Prim::Recv, Operand::Input, 0, 0, 10)
        }
    }

    #[test]
    fn a_frame_of_the_same_call_and_step_passes() {
        let c = call();
        let mut h = FrameHeader::data(c.fingerprint, 5);
        h.len = 40;
        frame(&c, &step(), 4, &h).unwrap();
    }

    #[test]
    fn another_call_is_a_mismatch_naming_both_and_the_peer() {
        let c = call();
        let mut other = c.fingerprint;
        other.count = 101;
        let mut h = FrameHeader::data(other, 5);
        h.len = 40;
        match frame(&c, &step(), 4, &h) {
            Err(Error::Mismatch {
                peer,
                local,
                remote,
            }) => {
                assert_eq!(peer, 2);
                assert!(local.contains("100 elements"), "{local}");
                assert!(remote.contains("101 elements"), "{remote}");
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
        // The check-in compares announcements with the same function.
        assert!(same_call(1, &c.fingerprint, &other).is_err());
        assert!(same_call(1, &c.fingerprint, &c.fingerprint).is_ok());
    }

    #[test]
    fn a_wrong_step_or_length_is_a_protocol_error() {
        let c = call();
        let mut h = FrameHeader::data(c.fingerprint, 6);
        h.len = 40;
        assert!(matches!(
            frame(&c, &step(), 4, &h),
            Err(Error::Protocol { peer: 2, .. })
        ));
        let mut h = FrameHeader::data(c.fingerprint, 5);
        h.len = 44;
        assert!(matches!(
            frame(&c, &step(), 4, &h),
            Err(Error::Protocol { peer: 2, .. })
        ));
    }
}
