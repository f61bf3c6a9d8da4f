//! The background reader of one socket: a thread that drains the socket
//! into free slots while the consumer is away, so that two ranks blocked
//! in big writes to each other cannot deadlock (see the parent module's
//! docs for when it reads and when it keeps off). It only reads; it never
//! writes a socket and never touches the sending half.

use super::{
    clean_goodbye, no_goodbye, ConnShared, Inbound, GRACE, LONG_PRESENCE, PARK_LONG, PARK_SHORT,
};
use crate::latch::wait_timeout;
use crate::wire::{self, Progress, POLL_SLICE};
use ferroccl_transport::{lock, TransportError};
use std::sync::atomic::Ordering;

/// The background reader of socket `index`: drains it into free slots
/// while the consumer is away (see the module docs).
pub(super) fn run_background_reader(shared: &ConnShared, index: usize) {
    let peer = shared.peer;
    let rx = &shared.rx[index];
    let mut st = lock(&rx.state);
    loop {
        if shared.rx_dropped.load(Ordering::SeqCst)
            || st.ended
            || shared.fatal_set.load(Ordering::SeqCst)
        {
            return;
        }
        if st.present {
            let long = st.since.elapsed() >= LONG_PRESENCE;
            st.bg_waiting = long;
            st = wait_timeout(&rx.wake, st, if long { PARK_LONG } else { PARK_SHORT });
            st.bg_waiting = false;
            continue;
        }
        if (st.partial.is_pending() && st.free.is_empty()) || st.partial.reads_into_caller() {
            // A data frame waits for a slot; the consumer releases one.
            st.bg_waiting = true;
            st = wait_timeout(&rx.wake, st, PARK_LONG);
            st.bg_waiting = false;
            continue;
        }
        let away = st.since.elapsed();
        if away < GRACE {
            drop(st);
            std::thread::sleep(GRACE - away);
            st = lock(&rx.state);
            continue;
        }
        let progress = st
            .partial
            .advance(&mut &rx.socket, shared.chunk_bytes, None);
        match progress {
            Ok(Progress::WouldBlock) => {
                drop(st);
                wire::poll_ready(&rx.socket, false, POLL_SLICE);
                st = lock(&rx.state);
            }
            Ok(Progress::Header(_)) => {
                if let Some(slot) = st.free.pop() {
                    st.partial.set_payload(Some(slot));
                }
            }
            Ok(Progress::Frame(header, Some(slot))) => {
                st.queue.push_back(Inbound::Frame(header, slot));
            }
            Ok(Progress::Frame(_, None)) => {
                // Never read into a caller's buffer here: see above.
                debug_assert!(false, "background reader finished a caller's frame");
            }
            Ok(Progress::Failure { rank, reason }) => {
                tracing::warn!(peer, failed_rank = rank, "peer reports a failure: {reason}");
                st.ended = true;
                shared.set_fatal(TransportError::PeerFailed { rank, reason });
                return;
            }
            Ok(Progress::Goodbye) => {
                // Only the peer's sending half is gone: its receiving half
                // may still read what we send.
                st.ended = true;
                st.queue.push_back(Inbound::End(clean_goodbye(peer)));
                return;
            }
            Ok(Progress::Eof) => {
                st.ended = true;
                if shared.fatal_set.load(Ordering::SeqCst) {
                    return;
                }
                let err = no_goodbye(peer);
                shared.broken(&err);
                st.queue.push_back(Inbound::End(err));
                return;
            }
            Err(e) => {
                st.ended = true;
                let err = e.into_transport(peer);
                shared.broken(&err);
                st.queue.push_back(Inbound::End(err));
                return;
            }
        }
    }
}
