//! Shared device memory on a real GPU: allocate, export, import, and see
//! the same bytes through both mappings, in one process and across two.
//!
//! Without a device each test says why and passes, unless
//! FERROCCL_REQUIRE_DEVICE=1 (the GPU run), where it fails.

mod common;

use ferroccl_cuda::cudarc::driver::sys;
use ferroccl_cuda::{probe, CudaError};
use ferroccl_cuda_ipc::fdpass::{recv_exact_fds, send_fds};
use ferroccl_cuda_ipc::vmm::{self, Mapped, Mechanism, SharedAlloc};
use ferroccl_cuda_ipc::{ShareHandle, WIRE_LEN};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn devices() -> Option<usize> {
    match probe::driver() {
        Ok(d) => Some(d.devices),
        Err(CudaError::NoDevice(why))
            if std::env::var("FERROCCL_REQUIRE_DEVICE").as_deref() != Ok("1") =>
        {
            eprintln!("skipped: {why}");
            None
        }
        Err(other) => panic!("CUDA probe: {other}"),
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// `words` u32s that depend on `seed`.
fn pattern(seed: u32, words: usize) -> Vec<u32> {
    (0..words as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

/// Copy `data` to device address `dst` and wait until it has landed (in
/// `ordinal`'s primary context).
fn write(ordinal: u32, dst: u64, data: &[u32]) {
    vmm::make_current(ordinal).unwrap();
    // SAFETY: `dst` is mapped for `data`'s bytes on this device (the
    // callers pass a mapping at least that large); `data` is live.
    let rc =
        unsafe { sys::cuMemcpyHtoD_v2(dst, data.as_ptr().cast(), std::mem::size_of_val(data)) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "cuMemcpyHtoD to {dst:#x}");
    // From pageable memory the copy may return before the DMA is done:
    // wait, so that another process reading next sees the bytes.
    // SAFETY: the primary context is current on this thread.
    let rc = unsafe { sys::cuCtxSynchronize() };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "cuCtxSynchronize");
}

/// Read `words` u32s from device address `src`.
fn read(ordinal: u32, src: u64, words: usize) -> Vec<u32> {
    vmm::make_current(ordinal).unwrap();
    let mut out = vec![0u32; words];
    // SAFETY: `src` is mapped for that many bytes; `out` is live and
    // exactly that large.
    let rc = unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, words * 4) };
    assert_eq!(
        rc,
        sys::CUresult::CUDA_SUCCESS,
        "cuMemcpyDtoH from {src:#x}"
    );
    out
}

#[test]
fn support_and_granularity_are_reported() {
    let Some(n) = devices() else { return };
    for ordinal in 0..n as u32 {
        let s = vmm::support(ordinal).expect("support");
        eprintln!("device {ordinal}: {s:?}");
        if s.vmm {
            let g = vmm::granularity(ordinal).expect("granularity");
            eprintln!("device {ordinal}: VMM granularity {g}");
            assert!(g.is_power_of_two(), "{g}");
        }
    }
}

/// VMM within one process: the importer's mapping is a second address
/// for the same memory (the import works within a process too).
#[test]
fn vmm_memory_is_the_same_through_both_mappings() {
    let Some(_) = devices() else { return };
    if !vmm::support(0).unwrap().vmm_with_fd() {
        eprintln!("skipped: device 0 has no VMM with POSIX fd handles");
        return;
    }
    let owner = SharedAlloc::with_mechanism(0, 1000, &[], Mechanism::Vmm).expect("SharedAlloc");
    let g = vmm::granularity(0).unwrap();
    assert_eq!(owner.size(), g, "1000 bytes rounded up to the granularity");
    assert_eq!(owner.mechanism(), Mechanism::Vmm);
    let handle = owner.handle();
    assert_eq!(
        handle,
        ShareHandle::Fd {
            size: g as u64,
            granularity: g as u64
        }
    );
    // Through a socket, as between processes.
    let (a, b) = UnixStream::pair().unwrap();
    let fd = owner
        .export_fd()
        .unwrap()
        .expect("a VMM allocation exports an fd");
    send_fds(&a, &handle.encode(), &[fd.as_fd()], soon()).unwrap();
    drop(fd);
    let mut bytes = [0u8; WIRE_LEN];
    let fds = recv_exact_fds(&b, &mut bytes, 1, soon()).unwrap();
    let got = ShareHandle::decode(&bytes).unwrap();
    let mapped = Mapped::import(0, &got, Some(fds[0].as_fd()), &[]).expect("import");
    drop(fds); // the driver holds its own reference
    assert_eq!(mapped.size(), owner.size());
    assert_ne!(
        mapped.ptr(),
        owner.ptr(),
        "a second mapping, at its own address"
    );

    let words = owner.size() / 4;
    let p = pattern(0x1234_5678, words);
    write(0, owner.ptr(), &p);
    assert_eq!(
        read(0, mapped.ptr(), words),
        p,
        "owner writes, importer reads"
    );
    let q = pattern(0x9abc_def0, words);
    write(0, mapped.ptr(), &q);
    assert_eq!(
        read(0, owner.ptr(), words),
        q,
        "importer writes, owner reads"
    );

    // The imported handle keeps the memory alive after the owner is gone.
    drop(owner);
    assert_eq!(read(0, mapped.ptr(), words), q);
    drop(mapped);
}

/// Legacy IPC within one process: the owner's pointer works, and opening
/// its handle here is refused with the reason (the driver would refuse
/// it too; ranks of one process share the pointer). The cross-process
/// open is `memory_crosses_to_another_process`.
#[test]
fn legacy_handles_are_refused_in_the_process_that_made_them() {
    let Some(_) = devices() else { return };
    let owner =
        SharedAlloc::with_mechanism(0, 5000, &[], Mechanism::Legacy).expect("SharedAlloc legacy");
    assert_eq!(owner.size(), ferroccl_cuda_ipc::LEGACY_GRANULARITY as usize);
    assert!(owner.export_fd().unwrap().is_none());
    let handle = ShareHandle::decode(&owner.handle().encode()).unwrap();
    assert!(matches!(handle, ShareHandle::Legacy { .. }));
    let p = pattern(7, 1024);
    write(0, owner.ptr(), &p);
    assert_eq!(read(0, owner.ptr(), 1024), p);
    match Mapped::import(0, &handle, None, &[]) {
        Err(CudaError::InvalidArgument(why)) => {
            assert!(why.contains("made by this process"), "{why}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn peer_access_between_two_devices() {
    let Some(n) = devices() else { return };
    // A device and itself: nothing to enable.
    vmm::enable_peer_access(0, 0).unwrap();
    if n < 2 {
        eprintln!("skipped (the rest): one device");
        return;
    }
    if !vmm::can_access_peer(1, 0).unwrap() {
        let e = vmm::enable_peer_access(1, 0).unwrap_err();
        eprintln!("devices 1 -> 0 cannot peer: {e}");
        assert!(matches!(e, CudaError::InvalidArgument(_)));
        return;
    }
    vmm::enable_peer_access(1, 0).unwrap();
    vmm::enable_peer_access(1, 0).expect("already enabled counts as done");
    for m in [Mechanism::Auto, Mechanism::Legacy] {
        let owner = SharedAlloc::with_mechanism(0, 4096, &[1], m).expect("with a peer");
        let p = pattern(3, 1024);
        write(0, owner.ptr(), &p);
        // Read in device 1's context.
        assert_eq!(read(1, owner.ptr(), 1024), p, "{m:?}");
    }
}

const CHILD_ENV: &str = "FERROCCL_CUDA_IPC_CHILD_SOCKET";

/// Across processes, each mechanism the device has: this test binary runs
/// again as a child (`child_process_side`) on the same device. The
/// parent allocates, writes a pattern, sends the handle (and the fd); the
/// child maps it, checks the pattern, writes another, says done; the
/// parent reads the child's pattern from its own pointer.
#[test]
fn memory_crosses_to_another_process() {
    let Some(_) = devices() else { return };
    let mut mechanisms = vec![Mechanism::Legacy];
    if vmm::support(0).unwrap().vmm_with_fd() {
        mechanisms.push(Mechanism::Vmm);
    }
    for m in mechanisms {
        let owner = SharedAlloc::with_mechanism(0, 3 << 20, &[], m).expect("SharedAlloc");
        let words = owner.size() / 4;
        write(0, owner.ptr(), &pattern(0xfeed, words));

        let (parent, child) = UnixStream::pair().unwrap();
        let mut proc = common::spawn_child(CHILD_ENV, child);
        let fd = owner.export_fd().unwrap();
        let fds: Vec<_> = fd.iter().map(|f| f.as_fd()).collect();
        send_fds(&parent, &owner.handle().encode(), &fds, soon()).unwrap();
        let mut done = [0u8; 1];
        let ack = recv_exact_fds(&parent, &mut done, 0, soon());
        let status = proc.wait().unwrap();
        assert!(status.success(), "{m:?}: child {status}");
        ack.unwrap();
        assert_eq!(done, [1]);
        assert_eq!(
            read(0, owner.ptr(), words),
            pattern(0xbeef, words),
            "{m:?}: the child's writes"
        );
        eprintln!("{m:?}: {} bytes crossed both ways", owner.size());
    }
}

/// The child's half of `memory_crosses_to_another_process`; nothing to do
/// in an ordinary run.
#[test]
fn child_process_side() {
    let Some(sock) = common::inherited_socket(CHILD_ENV) else {
        return;
    };
    let mut bytes = [0u8; WIRE_LEN];
    let fds = recv_exact_fds(&sock, &mut bytes, 1, soon()).unwrap();
    let handle = ShareHandle::decode(&bytes).unwrap();
    let mapped = Mapped::import(0, &handle, fds.first().map(|f| f.as_fd()), &[]).expect("import");
    let words = mapped.size() / 4;
    assert_eq!(read(0, mapped.ptr(), words), pattern(0xfeed, words));
    write(0, mapped.ptr(), &pattern(0xbeef, words));
    drop(mapped);
    send_fds(&sock, &[1], &[], soon()).unwrap();
}
