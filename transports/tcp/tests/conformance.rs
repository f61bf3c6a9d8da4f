//! The TCP transport passes every conformance case, over loopback, with
//! one socket per peer and with three (frames striped across them).

use ferroccl_tcp::TcpTransport;
use ferroccl_transport::conformance::{Flow, Suite};
use std::net::{IpAddr, Ipv4Addr};

/// Loopback, `nsocks` sockets per peer. A sender waits once the socket
/// buffers are full too, well within 10,000 frames of 64 KiB; the cases
/// that fill a FIFO use socket buffers of 16 KiB, which take less than a
/// frame and keep the kernel from growing them.
fn suite(nsocks: usize) -> Suite {
    Suite::new("tcp", || Box::new(TcpTransport::new()))
        .filling_transport(|| {
            Box::new(TcpTransport::new().with_socket_buffer_bytes(Some(16 << 10)))
        })
        .configure(move |c| {
            c.bind_addr = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
            c.nsocks = nsocks;
        })
        .flow(Flow::Buffered { max_frames: 10_000 })
}

mod one_socket {
    ferroccl_transport::conformance_tests!(super::suite(1));
}

mod three_sockets {
    ferroccl_transport::conformance_tests!(super::suite(3));
}
