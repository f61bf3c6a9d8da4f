//! The in-process transport passes every conformance case.

use ferroccl_transport::conformance::Suite;
use ferroccl_transport::mem::MemTransport;

ferroccl_transport::conformance_tests!(
    Suite::new("mem", || Box::new(MemTransport)).clean_close_detail("peer dropped the connection")
);
