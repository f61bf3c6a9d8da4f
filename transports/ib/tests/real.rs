//! The real verbs (feature `ib`). Without an RDMA device (this machine, CI)
//! only the probe's answer can be checked; with one, a loopback: two queue
//! pairs of one port connected to each other.
#![cfg(feature = "ib")]

use std::path::Path;
use std::time::{Duration, Instant};

use ferroccl_ib::{
    probe, CompletionKind, Device, IbConfig, IbDevice, LocalSlice, ProbeError, QpState, QueuePair,
    RemoteSlice, WcError, WriteRequest,
};

/// Whether the kernel shows any RDMA device at all.
fn sysfs_has_devices() -> bool {
    std::fs::read_dir(Path::new("/sys/class/infiniband"))
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

/// The data path shares devices and queue pairs between threads.
#[test]
fn real_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<IbDevice>();
    send_sync::<ferroccl_ib::IbQp>();
    send_sync::<ferroccl_ib::PendingQp>();
}

#[test]
fn probe_answers_clearly() {
    let cfg = IbConfig::default();
    match probe(&cfg) {
        Ok(ports) => {
            assert!(!ports.is_empty());
            for p in &ports {
                assert!(p.active);
                println!("RDMA port: {} gids={}", p.describe(), p.gids.len());
            }
        }
        Err(e) => {
            println!("no RDMA port: {e}");
            if !sysfs_has_devices() {
                assert!(matches!(e, ProbeError::NoDevice(_)), "{e:?}");
                assert!(e.to_string().starts_with("no RDMA device found"), "{e}");
            } else {
                assert!(
                    matches!(
                        e,
                        ProbeError::NoActivePort { .. }
                            | ProbeError::NoDevice(_)
                            | ProbeError::Verbs { .. }
                    ),
                    "{e:?}"
                );
            }
        }
    }
}

#[test]
fn probe_reports_filter_that_matches_nothing() {
    let cfg = IbConfig::from_lookup(|name| {
        (name == "FERROCCL_IB_HCA").then(|| "=no_such_device_9".to_string())
    })
    .unwrap();
    let e = probe(&cfg).unwrap_err();
    println!("{e}");
    if sysfs_has_devices() {
        assert!(
            matches!(
                e,
                ProbeError::NoneMatched { .. } | ProbeError::NoActivePort { .. }
            ),
            "{e:?}"
        );
    } else {
        assert!(matches!(e, ProbeError::NoDevice(_)), "{e:?}");
    }
}

fn wait_for(qp: &impl QueuePair, what: &str) -> ferroccl_ib::Completion {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(c) = qp.wait(1, Duration::from_millis(100)).pop() {
            return c;
        }
        assert!(Instant::now() < deadline, "no completion for {what} in 5 s");
    }
}

#[test]
fn loopback_write_with_imm_and_remote_access_error() {
    let cfg = IbConfig::from_env().expect("IB configuration");
    let ports = match probe(&cfg) {
        Ok(p) => p,
        Err(e) => {
            println!("SKIPPED loopback (no RDMA device): {e}");
            return;
        }
    };
    let port = &ports[0];
    let dev = IbDevice::open(port, &cfg).expect("open device");
    println!("loopback on {} gid {:?}", port.describe(), dev.gid());
    let a = dev.create_qp(16).expect("create qp a");
    let b = dev.create_qp(16).expect("create qp b");
    let (ea, eb) = (a.endpoint(), b.endpoint());
    // Through the wire form, as between processes.
    let ea = ferroccl_ib::Endpoint::from_bytes(&ea.to_bytes()).unwrap();
    let eb = ferroccl_ib::Endpoint::from_bytes(&eb.to_bytes()).unwrap();
    let qa = a.connect(&eb).expect("connect a");
    let qb = b.connect(&ea).expect("connect b");
    assert_eq!(qa.state(), QpState::Ready);
    assert_eq!(qb.state(), QpState::Ready);

    const N: usize = 1 << 16;
    let src = dev.register(N).unwrap();
    let dst = dev.register(N).unwrap();
    assert_eq!(src.addr % 4096, 0, "page-aligned");
    let data: Vec<u8> = (0..N).map(|i| (i * 7 + i / 251) as u8).collect();
    dev.write_region(src.handle, 0, &data).unwrap();

    let half = N / 2;
    qa.post_write(&WriteRequest {
        wr_id: 41,
        local: LocalSlice {
            mr: src.handle,
            offset: 0,
            len: half,
        },
        remote: RemoteSlice {
            rkey: dst.rkey,
            addr: dst.addr,
        },
        imm: None,
    })
    .unwrap();
    qa.post_write(&WriteRequest {
        wr_id: 42,
        local: LocalSlice {
            mr: src.handle,
            offset: half,
            len: N - half,
        },
        remote: RemoteSlice {
            rkey: dst.rkey,
            addr: dst.addr + half as u64,
        },
        imm: Some(0xdead_beef),
    })
    .unwrap();
    for want in [41, 42] {
        let c = wait_for(&qa, "send");
        assert_eq!(c.wr_id, want);
        assert_eq!(c.kind, CompletionKind::SendDone);
        assert_eq!(c.status, Ok(()));
    }
    let c = wait_for(&qb, "receive");
    assert_eq!(c.status, Ok(()));
    assert_eq!(
        c.kind,
        CompletionKind::RecvWithImm {
            imm: 0xdead_beef,
            len: N - half
        }
    );
    let mut got = vec![0u8; N];
    dev.read_region(dst.handle, 0, &mut got).unwrap();
    assert!(got == data, "bytes differ after the loopback write");
    assert_eq!(qa.outstanding(), 0);
    println!("loopback WRITE WITH IMM: {N} bytes compared equal, imm 0xdeadbeef");

    // A wrong rkey: remote access error, queue pair in error.
    qa.post_write(&WriteRequest {
        wr_id: 43,
        local: LocalSlice {
            mr: src.handle,
            offset: 0,
            len: 64,
        },
        remote: RemoteSlice {
            rkey: dst.rkey ^ 0x00ff_ff00,
            addr: dst.addr,
        },
        imm: None,
    })
    .unwrap();
    let c = wait_for(&qa, "bad rkey");
    assert_eq!(c.wr_id, 43);
    assert!(
        matches!(c.status, Err(WcError::RemoteAccess(_))),
        "{:?}",
        c.status
    );
    assert_eq!(qa.state(), QpState::Error);
    println!("loopback wrong rkey: {:?}", c.status);
}

/// The whole transport (socket set-up, queue pairs brought up, the data
/// path) over the real verbs, between two threads on this machine's first
/// port, run through conformance cases of the transport seam; skipped with
/// a line when there is no RDMA device (as here and in CI).
#[test]
fn the_transport_passes_conformance_cases_on_a_real_port() {
    use ferroccl_transport::conformance::{data_path, failure, Suite};
    let cfg = IbConfig::from_env().expect("IB settings");
    let ports = match probe(&cfg) {
        Ok(ports) => ports,
        Err(e) => {
            println!("SKIPPED transport on a real port (no RDMA device): {e}");
            return;
        }
    };
    println!("transport on {}", ports[0].describe());
    for qps in [1, 2] {
        let (ports, cfg) = (ports.clone(), cfg.clone());
        let suite = Suite::new("ib", move || {
            Box::new(ferroccl_ib::NetTransport::new(
                ferroccl_ib::verbs_fabric::VerbsFabric::new(ports.clone(), cfg.clone()),
                qps,
            ))
        })
        .configure(|c| c.bind_addr = Some("127.0.0.1".parse().unwrap()));
        data_path::frames_cross_intact_through_slot_reuse(&suite);
        data_path::large_chunks(&suite);
        data_path::the_fifo_pushes_back_and_lets_go(&suite);
        failure::dropped_connection_ends_cleanly_after_its_data(&suite);
        failure::close_with_failure_reaches_the_peer_and_pending_waits(&suite);
        println!("transport on a real port, {qps} queue pair(s): conformance cases passed");
    }
}

/// Caller memory registered where it is (`ibv_reg_mr` on a
/// [`ferroccl_ib::UserBuffer`], no access flags): a write from it lands
/// byte for byte; a peer naming its rkey is refused (no remote write
/// granted); deregistered, a write from it fails locally. Skipped without
/// an RDMA device (never run yet: none here).
#[test]
fn loopback_write_from_caller_memory() {
    let cfg = IbConfig::from_env().expect("IB configuration");
    let ports = match probe(&cfg) {
        Ok(p) => p,
        Err(e) => {
            println!("SKIPPED caller-memory loopback (no RDMA device): {e}");
            return;
        }
    };
    let dev = IbDevice::open(&ports[0], &cfg).expect("open device");
    let (a, b) = (dev.create_qp(16).unwrap(), dev.create_qp(16).unwrap());
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let qa = a.connect(&eb).expect("connect a");
    let qb = b.connect(&ea).expect("connect b");
    const N: usize = 3 << 20;
    let src =
        ferroccl_ib::UserBuffer::from_vec((0..N).map(|i| (i * 13 + i / 4093) as u8).collect());
    let mr = dev
        .register_user(ferroccl_ib::UserMemory::host(&src))
        .expect("ibv_reg_mr on caller memory");
    assert_eq!(mr.addr, src.as_ptr() as u64);
    let dst = dev.register(N).unwrap();
    let (from, len) = (12_345, N - 20_000);
    dev.present(mr.handle, from, &src[from..from + len])
        .unwrap();
    qa.post_write(&WriteRequest {
        wr_id: 1,
        local: LocalSlice {
            mr: mr.handle,
            offset: from,
            len,
        },
        remote: RemoteSlice {
            rkey: dst.rkey,
            addr: dst.addr,
        },
        imm: Some(5),
    })
    .unwrap();
    assert_eq!(wait_for(&qa, "write from caller memory").status, Ok(()));
    assert!(matches!(
        wait_for(&qb, "its immediate").kind,
        CompletionKind::RecvWithImm { imm: 5, .. }
    ));
    let mut out = vec![0u8; len];
    dev.read_region(dst.handle, 0, &mut out).unwrap();
    assert!(out == src[from..from + len], "bytes differ");
    println!("loopback from caller memory: {len} bytes compared equal");
    // No remote write into caller memory.
    qb.post_write(&WriteRequest {
        wr_id: 2,
        local: LocalSlice {
            mr: dst.handle,
            offset: 0,
            len: 64,
        },
        remote: RemoteSlice {
            rkey: mr.rkey,
            addr: mr.addr,
        },
        imm: None,
    })
    .unwrap();
    let refused = wait_for(&qb, "write into caller memory");
    println!("loopback write into caller memory: {:?}", refused.status);
    assert!(
        matches!(refused.status, Err(WcError::RemoteAccess(_))),
        "{refused:?}"
    );
    dev.deregister(mr.handle).unwrap();
}
