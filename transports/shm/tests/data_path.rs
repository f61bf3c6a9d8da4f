//! What the shared-memory data path adds to the conformance cases
//! (tests/conformance.rs): no segment name is left once both ranks hold
//! the mapping, before, during and after frames cross.

mod common;

use common::*;
use ferroccl_transport::conformance::{exchange, Paths};
use ferroccl_transport::AbortHandle;

#[test]
fn exchanging_frames_leaves_no_segment_names() {
    for paths in [Paths::InSlot, Paths::Caller] {
        let abort = AbortHandle::new();
        let (c0, c1, prefix) = pair_with(1000, 4, &abort.signal());
        // Both sides hold the mapping: the names are gone already.
        assert_eq!(segments(&prefix), Vec::<String>::new());
        exchange(c0, c1, 1000, 300, paths);
        assert_eq!(segments(&prefix), Vec::<String>::new());
    }
}
