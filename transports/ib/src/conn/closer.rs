//! Closing one end of an RDMA connection from any thread ([`IbCloser`]):
//! a clean close, or a failure report written into the peer's `fail`
//! region on both directions.

use super::end::{End, FAIL_VALID, WR_CONTROL};
use super::{imm, MAX_REASON_BYTES};
use crate::verbs::{Device, LocalSlice, QueuePair, WriteRequest};
use ferroccl_transport::ConnectionCloser;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Closes one end of an RDMA connection from any thread.
pub struct IbCloser<D: Device, Q: QueuePair> {
    end: Arc<End<D, Q>>,
}

impl<D: Device, Q: QueuePair> IbCloser<D, Q> {
    /// The closer of `end`.
    pub(super) fn new(end: Arc<End<D, Q>>) -> Self {
        IbCloser { end }
    }
}

impl<D, Q> ConnectionCloser for IbCloser<D, Q>
where
    D: Device + Send + Sync,
    Q: QueuePair + Send + Sync,
{
    fn close_with_failure(&self, failed_rank: usize, reason: &str) {
        let end = &self.end;
        // A report the peer made first stays the first.
        if end.landed_failure().is_some() {
            end.adopt_landed_failure();
        }
        let mut cut = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        end.record_failure(failed_rank, reason[..cut].to_owned());
        let mut report = Vec::with_capacity(12 + cut);
        report.extend_from_slice(&FAIL_VALID.to_le_bytes());
        report.extend_from_slice(&(failed_rank as u32).to_le_bytes());
        report.extend_from_slice(&(cut as u32).to_le_bytes());
        report.extend_from_slice(&reason.as_bytes()[..cut]);
        if end
            .dev
            .write_region(end.regions.fail_src.handle, 0, &report)
            .is_err()
        {
            return;
        }
        // Best effort on both directions: whichever half of the peer is
        // waiting sees it.
        for qp in [end.out_qps.first(), end.in_qps.first()]
            .into_iter()
            .flatten()
        {
            let _ = qp.post_write(&WriteRequest {
                wr_id: WR_CONTROL,
                local: LocalSlice {
                    mr: end.regions.fail_src.handle,
                    offset: 0,
                    len: report.len(),
                },
                remote: end.remote.fail.at(0),
                imm: Some(imm::with_arg(imm::FAIL, 0)),
            });
        }
        end.out_bye.store(true, Ordering::Release);
        end.in_bye.store(true, Ordering::Release);
    }

    fn close(&self) {
        self.end.closed.store(true, Ordering::Release);
        self.end.bye_out();
        self.end.bye_in();
    }
}

impl<D: Device, Q: QueuePair> std::fmt::Debug for IbCloser<D, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbCloser")
            .field("rank", &self.end.rank)
            .field("peer", &self.end.peer)
            .finish()
    }
}
