//! The RDMA data path over emulated verbs passes every conformance case of
//! the transport seam, with one queue pair per direction and with several
//! (frames of 64 KiB and more striped across them).

use ferroccl_ib::emu_transport;
use ferroccl_transport::conformance::Suite;

mod one_qp {
    use super::*;
    ferroccl_transport::conformance_tests!(Suite::new("ib-emu", || Box::new(
        emu_transport::transport(1)
    )));
}

mod three_qps {
    use super::*;
    ferroccl_transport::conformance_tests!(Suite::new("ib-emu", || Box::new(
        emu_transport::transport(3)
    )));
}
