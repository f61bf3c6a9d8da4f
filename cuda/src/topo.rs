//! Which GPU a device ordinal is, in the terms its peers can compare: the
//! device's UUID, its PCI bus id in the form sysfs uses, its NUMA node;
//! and whether two devices of this process can reach each other's memory
//! (`cuDeviceCanAccessPeer`).
//!
//! It only asks the driver and reads sysfs. Which path a pair of ranks
//! takes is decided from these facts by the library (`ferroccl`'s
//! `gpu_path`), whose logic needs no GPU to be tested; nothing here
//! creates a context or allocates.
//!
//! Every function that calls the driver asks [`probe::driver`] first:
//! cudarc panics where libcuda is missing, and the probe says
//! [`CudaError::NoDevice`] instead.

use crate::error::{CudaError, Result};
use crate::probe;
use cudarc::driver::{result, sys, DriverError};
use std::ffi::{c_char, c_int, CStr};
use std::path::Path;

/// Where the kernel lists PCI devices; `<root>/<bus id>/numa_node` holds a
/// device's NUMA node (-1: the platform does not say).
pub const SYSFS_PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// One device of this process as the driver and sysfs describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceIdentity {
    /// The ordinal in this process (after `CUDA_VISIBLE_DEVICES`): it
    /// differs between processes that see different devices, so peers
    /// compare UUIDs and bus ids, never ordinals.
    pub ordinal: u32,
    /// `cuDeviceGetUuid_v2`: the same bytes in every process that sees the
    /// device (a MIG instance has its own).
    pub uuid: [u8; 16],
    /// `cuDeviceGetPCIBusId`, normalised by [`normalize_pci_bus_id`]
    /// (`0000:1b:00.0`).
    pub pci_bus_id: String,
    /// The NUMA node sysfs gives the device, `None` where it says -1 or
    /// cannot be read (containers without /sys, single-node machines).
    pub numa_node: Option<u32>,
}

fn driver_err(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        reason: format!("{e:?}"),
    }
}

/// The driver's handle of `ordinal`, after the probe and a range check:
/// `NoDevice` without a driver, `InvalidArgument` naming the visible count
/// for an ordinal beyond it.
pub fn device(ordinal: u32) -> Result<sys::CUdevice> {
    let driver = probe::driver()?;
    if ordinal as usize >= driver.devices {
        return Err(CudaError::InvalidArgument(format!(
            "CUDA device {ordinal} does not exist ({} visible)",
            driver.devices
        )));
    }
    result::device::get(ordinal as c_int).map_err(driver_err("cuDeviceGet"))
}

/// The identity of device `ordinal`: UUID, normalised PCI bus id and NUMA
/// node. `NoDevice` without a driver or device; `InvalidArgument` for an
/// ordinal this process does not see.
pub fn identity(ordinal: u32) -> Result<DeviceIdentity> {
    let dev = device(ordinal)?;
    // cudarc's wrapper calls cuDeviceGetUuid_v2 under the cuda-13000
    // feature (the first version is gone from CUDA 13's driver API).
    let uuid = result::device::get_uuid(dev).map_err(driver_err("cuDeviceGetUuid_v2"))?;
    let uuid = uuid.bytes.map(|b| b as u8);
    // "0000:00:00.0" and its NUL need 13 bytes; room for an 8-digit
    // domain and whatever a later driver adds.
    let mut buf = [0 as c_char; 64];
    // SAFETY: the driver writes at most `len` bytes, NUL included, into
    // `buf`, a live local of exactly that length; `dev` is a handle the
    // driver just returned, and cuInit has run (the probe).
    let rc = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) };
    rc.result().map_err(driver_err("cuDeviceGetPCIBusId"))?;
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    let raw = CStr::from_bytes_until_nul(&bytes)
        .map_err(|_| CudaError::Driver {
            call: "cuDeviceGetPCIBusId",
            reason: "the bus id it wrote has no terminating NUL".into(),
        })?
        .to_string_lossy()
        .into_owned();
    let pci_bus_id = normalize_pci_bus_id(&raw).map_err(|why| CudaError::Driver {
        call: "cuDeviceGetPCIBusId",
        reason: format!("it returned '{raw}', which is not a PCI bus id: {why}"),
    })?;
    let numa_node = numa_node(Path::new(SYSFS_PCI_DEVICES), &pci_bus_id);
    Ok(DeviceIdentity {
        ordinal,
        uuid,
        pci_bus_id,
        numa_node,
    })
}

/// Whether kernels on device `dev` can read and write memory of device
/// `peer` once peer access is enabled (`cuDeviceCanAccessPeer`). A device
/// and itself: `true` without asking the driver (kernels reach their own
/// device's memory without peer access, whatever the driver reports for
/// that pair).
pub fn can_access_peer(dev: u32, peer: u32) -> Result<bool> {
    let a = device(dev)?;
    let b = device(peer)?;
    if dev == peer {
        return Ok(true);
    }
    let mut can: c_int = 0;
    // SAFETY: writes one int through the pointer, which points at a live
    // local; both handles were just returned by the driver after cuInit.
    let rc = unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) };
    rc.result().map_err(driver_err("cuDeviceCanAccessPeer"))?;
    Ok(can != 0)
}

/// Whether contexts on device `dev` are shared through MPS (the
/// multi-process service: kernels of several processes run on the GPU at
/// once; without it they take turns), `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`.
pub fn mps_enabled(dev: u32) -> Result<bool> {
    let d = device(dev)?;
    // SAFETY: a device handle the driver returned after cuInit.
    let on = unsafe {
        result::device::get_attribute(d, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED)
    }
    .map_err(driver_err("cuDeviceGetAttribute(MPS_ENABLED)"))?;
    Ok(on != 0)
}

/// The ordinal under which this process sees the device with UUID
/// `uuid`, `None` where it does not see it (`CUDA_VISIBLE_DEVICES`): a
/// peer's ordinal is its own process's numbering, so [`can_access_peer`]
/// for a peer's GPU takes the ordinal found here. By UUID, not bus id:
/// the MIG instances of one GPU share its bus id but each has its own
/// UUID.
pub fn local_ordinal(uuid: &[u8; 16]) -> Result<Option<u32>> {
    let driver = probe::driver()?;
    for ordinal in 0..driver.devices as u32 {
        let dev = result::device::get(ordinal as c_int).map_err(driver_err("cuDeviceGet"))?;
        let found = result::device::get_uuid(dev).map_err(driver_err("cuDeviceGetUuid_v2"))?;
        if found.bytes.map(|b| b as u8) == *uuid {
            return Ok(Some(ordinal));
        }
    }
    Ok(None)
}

/// A PCI bus id in the form sysfs names devices: `dddd:bb:dd.f`, lower
/// case hex, the domain at least four digits (`0000:1b:00.0`). Accepts
/// what the driver (`0000:1B:00.0`) and NVML (`00000000:1B:00.0`) return,
/// and `bb:dd.f` (domain 0); surrounding whitespace and trailing NULs are
/// ignored. The error says what is wrong.
pub fn normalize_pci_bus_id(raw: &str) -> std::result::Result<String, String> {
    let s = raw.trim_end_matches('\0').trim();
    fn hex(
        field: &str,
        what: &str,
        max_digits: usize,
        max: u32,
    ) -> std::result::Result<u32, String> {
        if field.is_empty() || field.len() > max_digits {
            return Err(format!(
                "the {what} '{field}' must have 1 to {max_digits} hex digits"
            ));
        }
        if !field.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("the {what} '{field}' is not hexadecimal"));
        }
        let v = u32::from_str_radix(field, 16).map_err(|e| format!("the {what} '{field}': {e}"))?;
        if v > max {
            return Err(format!("the {what} {v:#x} is above {max:#x}"));
        }
        Ok(v)
    }
    let (head, function) = s
        .rsplit_once('.')
        .ok_or_else(|| "no '.' before the function".to_string())?;
    let parts: Vec<&str> = head.split(':').collect();
    let (domain, bus, dev) = match parts.as_slice() {
        [d, b, v] => (hex(d, "domain", 8, u32::MAX)?, *b, *v),
        [b, v] => (0, *b, *v),
        _ => return Err("expected domain:bus:device.function".into()),
    };
    let bus = hex(bus, "bus", 2, 0xff)?;
    let dev = hex(dev, "device", 2, 0x1f)?;
    let function = hex(function, "function", 1, 7)?;
    Ok(format!("{domain:04x}:{bus:02x}:{dev:02x}.{function:x}"))
}

/// The NUMA node of the PCI device `bus_id` (normalised form) under the
/// sysfs directory `root` (normally [`SYSFS_PCI_DEVICES`]); `None` where
/// the file is missing or says -1.
pub fn numa_node(root: &Path, bus_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(root.join(bus_id).join("numa_node")).ok()?;
    parse_numa_node(&text)
}

/// The contents of a sysfs `numa_node` file: a node number, or -1 (the
/// platform does not say) and anything unreadable as `None`.
pub fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalise_to_the_sysfs_form() {
        for (raw, want) in [
            ("0000:1B:00.0", "0000:1b:00.0"),     // the driver
            ("00000000:1B:00.0", "0000:1b:00.0"), // NVML
            ("00000000:DB:1F.7\0\0", "0000:db:1f.7"),
            (" 0001:3d:00.1\n", "0001:3d:00.1"),
            ("1b:00.0", "0000:1b:00.0"),
            ("0:1:2.3", "0000:01:02.3"),
            ("10000:01:00.0", "10000:01:00.0"), // VMD domains have 5 digits
        ] {
            assert_eq!(normalize_pci_bus_id(raw).as_deref(), Ok(want), "{raw:?}");
        }
        for bad in [
            "",
            "0000:1b:00",        // no function
            "0000:1b:00.8",      // functions are 0..=7
            "0000:1b:20.0",      // devices are 0..=0x1f
            "0000:1g:00.0",      // not hex
            "0000:100:00.0",     // a bus is one byte
            "000000000:1b:00.0", // domain over 8 digits
            "0:0:0:0.0",
            "0000:1b:00.0.0",
            "0000:+1:00.0",
            "GPU-5f3c",
        ] {
            let err = normalize_pci_bus_id(bad).expect_err(bad);
            assert!(!err.is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn numa_node_reads_sysfs_and_minus_one_is_unknown() {
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(parse_numa_node("0"), Some(0));
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(parse_numa_node("node0"), None);
        assert_eq!(parse_numa_node(""), None);

        let root = std::env::temp_dir().join(format!("ferroccl-topo-{}", std::process::id()));
        let dev = root.join("0000:1b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "3\n").unwrap();
        let other = root.join("0000:3d:00.0");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("numa_node"), "-1\n").unwrap();
        assert_eq!(numa_node(&root, "0000:1b:00.0"), Some(3));
        assert_eq!(numa_node(&root, "0000:3d:00.0"), None);
        assert_eq!(numa_node(&root, "0000:5e:00.0"), None, "no such device");
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Without a driver every call says `NoDevice` (never a panic from
    /// cudarc); with one, an ordinal past the last is `InvalidArgument`.
    #[test]
    fn without_a_device_every_call_says_no_device() {
        match probe::driver() {
            Err(CudaError::NoDevice(_)) => {
                assert!(matches!(identity(0), Err(CudaError::NoDevice(_))));
                assert!(matches!(can_access_peer(0, 0), Err(CudaError::NoDevice(_))));
                assert!(matches!(
                    local_ordinal(&[1; 16]),
                    Err(CudaError::NoDevice(_))
                ));
            }
            Ok(d) => {
                let past = d.devices as u32;
                assert!(matches!(identity(past), Err(CudaError::InvalidArgument(_))));
                assert!(matches!(
                    can_access_peer(0, past),
                    Err(CudaError::InvalidArgument(_))
                ));
            }
            Err(other) => panic!("expected NoDevice, got {other:?}"),
        }
    }
}
