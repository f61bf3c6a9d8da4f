//! The shared-memory transport passes every conformance case.

use ferroccl_shm::ShmTransport;
use ferroccl_transport::conformance::Suite;

ferroccl_transport::conformance_tests!(Suite::new("shm", || Box::new(ShmTransport::new())));
