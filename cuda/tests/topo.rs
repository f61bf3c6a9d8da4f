//! The GPU identity probe on a real device: what each rank will publish
//! for path selection (UUID, PCI bus id, NUMA node) and peer access.
//!
//! Without a device it says why and passes, unless FERROCCL_REQUIRE_DEVICE=1
//! (the GPU run, `cuda/gpu/run.sh`), where it fails.

use ferroccl_cuda::topo::{self, normalize_pci_bus_id};
use ferroccl_cuda::{probe, CudaError};

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

#[test]
fn every_device_has_an_identity_peers_can_compare() {
    let Some(n) = devices() else { return };
    let mut seen = Vec::new();
    for ordinal in 0..n as u32 {
        let id = topo::identity(ordinal).expect("identity");
        eprintln!(
            "device {ordinal}: uuid {} bus {} numa {:?}",
            id.uuid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            id.pci_bus_id,
            id.numa_node
        );
        assert_eq!(id.ordinal, ordinal);
        assert_ne!(id.uuid, [0; 16], "device {ordinal}: the UUID is all zeros");
        // Already in the sysfs form: normalising again changes nothing.
        assert_eq!(
            normalize_pci_bus_id(&id.pci_bus_id).as_deref(),
            Ok(id.pci_bus_id.as_str()),
            "device {ordinal}"
        );
        // Where sysfs lists the device (a container may hide /sys), its
        // node must be what the file says.
        let file = std::path::Path::new(topo::SYSFS_PCI_DEVICES)
            .join(&id.pci_bus_id)
            .join("numa_node");
        match std::fs::read_to_string(&file) {
            Ok(text) => assert_eq!(id.numa_node, topo::parse_numa_node(&text), "{text:?}"),
            Err(e) => eprintln!("{}: {e}", file.display()),
        }
        // Asked twice, the driver describes the same device.
        assert_eq!(topo::identity(ordinal).expect("identity"), id);
        assert_eq!(topo::local_ordinal(&id.uuid), Ok(Some(ordinal)));
        seen.push(id);
    }
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            assert_ne!(a.uuid, b.uuid, "two devices with one UUID");
            // MIG instances of one GPU share a bus id, whole GPUs do not.
            if a.pci_bus_id == b.pci_bus_id {
                eprintln!(
                    "devices {} and {} share bus {} (MIG?)",
                    a.ordinal, b.ordinal, a.pci_bus_id
                );
            }
        }
    }
    // A UUID no device has is not found.
    assert_eq!(topo::local_ordinal(&[0; 16]), Ok(None));
}

#[test]
fn peer_access_of_a_device_and_between_devices() {
    let Some(n) = devices() else { return };
    // A device reaches its own memory: no peer access needed.
    assert_eq!(topo::can_access_peer(0, 0), Ok(true));
    for a in 0..n as u32 {
        for b in 0..n as u32 {
            let can = topo::can_access_peer(a, b).expect("cuDeviceCanAccessPeer");
            eprintln!("can_access_peer({a}, {b}) = {can}");
        }
    }
    let past = n as u32;
    assert!(matches!(
        topo::can_access_peer(0, past),
        Err(CudaError::InvalidArgument(_))
    ));
    assert!(matches!(
        topo::identity(past),
        Err(CudaError::InvalidArgument(_))
    ));
}
