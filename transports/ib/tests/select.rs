//! The fallback rule on this build and machine: no RDMA device here (nor
//! in CI), so `ib` falls back to TCP with a reason unless forced, and
//! forcing it is an error that says what is missing, with the feature
//! (no device) and without it (not built); a bad setting is refused when
//! the settings are read.

use ferroccl_ib::select::{select, Selected};
use ferroccl_ib::IbConfig;

#[test]
fn without_a_device_ib_falls_back_or_says_why_not() {
    if ferroccl_ib::probe(&ferroccl_ib::IbConfig::default()).is_ok() {
        println!("SKIPPED: an RDMA device is present");
        return;
    }
    let missing = if cfg!(feature = "ib") {
        "no RDMA device"
    } else {
        "built without the `ib` feature"
    };
    match select(false, &IbConfig::default()) {
        Ok(Selected::FallBack(reason)) => {
            assert!(reason.contains("using TCP"), "{reason}");
            assert!(reason.contains(missing), "{reason}");
        }
        Ok(Selected::Use(_)) => panic!("a transport without a device"),
        Err(e) => panic!("not forced, yet an error: {e}"),
    }
    match select(true, &IbConfig::default()) {
        Err(message) => {
            assert!(message.contains("FERROCCL_TRANSPORT=ib"), "{message}");
            assert!(message.contains(missing), "{message}");
        }
        Ok(_) => panic!("forced without a device, yet no error"),
    }
    // A bad setting is an error naming it, before selection (which takes
    // settings already checked).
    let bad = |k: &str| (k == "FERROCCL_IB_TIMEOUT").then(|| "99".to_string());
    match IbConfig::from_lookup(bad) {
        Err(e) => assert!(e.to_string().contains("FERROCCL_IB_TIMEOUT"), "{e}"),
        Ok(_) => panic!("FERROCCL_IB_TIMEOUT=99 accepted"),
    }
}
