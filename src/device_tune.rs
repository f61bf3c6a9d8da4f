//! The device executor's choice, per call, of protocol (bulk or low
//! latency) and chunk size, with its reason for the INFO line; and the
//! FERROCCL_PROTO switch (NCCL's NCCL_PROTO read as an alias) that
//! narrows the choice.
//!
//! The model is the one of `tune` for algorithms: a call of `steps`
//! sequential frames of `frame` bytes each costs `steps * (latency +
//! frame / bandwidth)`. The LL protocol has the lower latency (a reader
//! polls the line it wants: no fence, no counter to read first) and half
//! the bandwidth (8 data bytes per 16-byte line); bulk the other way. The
//! numbers are placeholders until the GPU run measures them
//! (docs/device-executor.md): the choice's shape (LL below a crossover
//! that grows with the link's latency gap and bandwidth) is what the tests
//! hold. Pure: no device, no clock. Not wired yet: the launcher that runs
//! the executor in place of staging calls it (docs/device-executor.md).

use crate::coll::CollKind;
use crate::error::{Error, Result};
use ferroccl_cuda::executor::Protocol;

/// The variable that narrows the protocols (`LL`, `Simple` or `bulk`, a
/// comma list; a leading `^` excludes the listed ones).
pub(crate) const PROTO: &str = "FERROCCL_PROTO";
/// NCCL's name for it, read when [`PROTO`] is not set.
pub(crate) const NCCL_PROTO: &str = "NCCL_PROTO";

/// The variable that bounds the channels (thread blocks a rank runs a
/// call's bytes on, each over FIFOs of its own).
pub(crate) const MAX_NCHANNELS: &str = "FERROCCL_MAX_NCHANNELS";
/// NCCL's name for it, read when [`MAX_NCHANNELS`] is not set.
pub(crate) const NCCL_MAX_NCHANNELS: &str = "NCCL_MAX_NCHANNELS";
/// Channels when neither is set: a placeholder until the GPU run
/// measures what one GPU and NVLink want (NCCL takes 16 to 32 on H100
/// NVLink).
pub(crate) const DEFAULT_CHANNELS: usize = 8;
/// The most channels one may ask for.
pub(crate) const CHANNEL_LIMIT: usize = 64;
/// Bytes a channel should have of each step before a call takes one
/// more: below this, a block's share is too small to pay for itself.
pub(crate) const MIN_CHANNEL_BYTES: usize = 128 << 10;

/// FERROCCL_MAX_NCHANNELS, else NCCL_MAX_NCHANNELS, through `get`: 1 to
/// [`CHANNEL_LIMIT`]; `None` where neither is set (an empty value counts
/// as unset); anything else is an error naming the variable.
pub(crate) fn max_channels_from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<usize>> {
    for name in [MAX_NCHANNELS, NCCL_MAX_NCHANNELS] {
        let Some(value) = get(name) else { continue };
        let v = value.trim();
        if v.is_empty() {
            continue;
        }
        return match v.parse::<usize>() {
            Ok(c) if (1..=CHANNEL_LIMIT).contains(&c) => Ok(Some(c)),
            _ => Err(Error::Env(format!(
                "{name}='{value}': a channel count from 1 to {CHANNEL_LIMIT}"
            ))),
        };
    }
    Ok(None)
}

/// Bytes of payload in one LL slot (511 lines of 8 bytes after the
/// header line would be 4088; a power of two keeps slices aligned).
pub(crate) const LL_CHUNK_BYTES: usize = 4 << 10;
/// Bytes of one bulk slot: several hundred KiB, so the per-frame fence
/// and counter are paid rarely.
pub(crate) const BULK_CHUNK_BYTES: usize = 512 << 10;

/// What one protocol costs per frame on a link: placeholders for NVLink
/// on H100 until measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DeviceLink {
    /// Microseconds from a frame's last store to the reader's first use,
    /// bulk (fence, counter store, counter poll).
    pub(crate) bulk_latency_us: f64,
    /// The same for LL (the flag rides with the data).
    pub(crate) ll_latency_us: f64,
    /// Payload bandwidth of the bulk protocol, GB/s.
    pub(crate) bulk_gbps: f64,
}

impl Default for DeviceLink {
    fn default() -> Self {
        DeviceLink {
            bulk_latency_us: 4.0,
            ll_latency_us: 1.5,
            bulk_gbps: 150.0,
        }
    }
}

/// The protocols a communicator may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allowed {
    pub(crate) bulk: bool,
    pub(crate) ll: bool,
}

impl Default for Allowed {
    fn default() -> Self {
        Allowed {
            bulk: true,
            ll: true,
        }
    }
}

/// Reads FERROCCL_PROTO, else NCCL_PROTO. NCCL's `LL128` is accepted and
/// ignored (ferroccl has no such protocol); any other unknown name is an
/// error naming it, as is a list that leaves nothing.
pub(crate) fn allowed_from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Allowed> {
    for name in [PROTO, NCCL_PROTO] {
        let Some(value) = get(name) else { continue };
        let v = value.trim();
        if v.is_empty() {
            continue;
        }
        let (exclude, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let mut listed = Allowed {
            bulk: false,
            ll: false,
        };
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.to_ascii_lowercase().as_str() {
                "ll" => listed.ll = true,
                "simple" | "bulk" => listed.bulk = true,
                "ll128" => {}
                _ => {
                    return Err(Error::Env(format!(
                        "{name}='{value}': unknown protocol '{item}' (LL, Simple or bulk)"
                    )))
                }
            }
        }
        let allowed = if exclude {
            Allowed {
                bulk: !listed.bulk,
                ll: !listed.ll,
            }
        } else {
            listed
        };
        if !allowed.bulk && !allowed.ll {
            return Err(Error::Env(format!(
                "{name}='{value}' leaves no protocol ferroccl has (LL, Simple)"
            )));
        }
        return Ok(allowed);
    }
    Ok(Allowed::default())
}

/// One call's choice.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeviceChoice {
    pub(crate) protocol: Protocol,
    /// The frame size the planner slices by.
    pub(crate) chunk_bytes: usize,
    /// Channels the call's steps are cut into (`algo::channels`).
    pub(crate) channels: usize,
    /// Why, for the INFO line.
    pub(crate) reason: String,
}

/// Sequential frames and bytes per frame of a call of `bytes` (the
/// caller's count times the element size) on `n` ranks by its ring
/// schedule: what the protocols' costs scale with.
fn shape(kind: CollKind, n: usize, bytes: usize) -> (usize, usize) {
    let n1 = n.saturating_sub(1).max(1);
    match kind {
        // Reduce-scatter then allgather: 2 (n - 1) steps of a 1/n piece.
        CollKind::AllReduce => (2 * n1, bytes.div_ceil(n.max(1))),
        // n - 1 steps of a piece (the call's bytes per rank).
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => (n1, bytes),
        // A chain: n - 1 hops of the whole.
        CollKind::Broadcast | CollKind::Reduce => (n1, bytes),
        CollKind::SendRecv => (1, bytes),
        CollKind::Barrier => (2 * n1, 0),
    }
}

/// Modelled microseconds of a call with `protocol` and frames of at most
/// `chunk` bytes.
fn cost_us(kind: CollKind, n: usize, bytes: usize, protocol: Protocol, m: &DeviceLink) -> f64 {
    let (steps, per_step) = shape(kind, n, bytes);
    let (chunk, latency, gbps) = match protocol {
        Protocol::Bulk => (BULK_CHUNK_BYTES, m.bulk_latency_us, m.bulk_gbps),
        Protocol::LowLatency => (LL_CHUNK_BYTES, m.ll_latency_us, m.bulk_gbps / 2.0),
    };
    // Frames pipeline: the first pays the latency per step, the rest
    // stream behind it.
    let frames = per_step.div_ceil(chunk).max(1);
    steps as f64 * latency
        + (frames - 1) as f64 * latency.min(1.0)
        + (steps * per_step) as f64 / (gbps * 1e3)
}

/// The protocol and chunk of a call of `bytes` on `n` ranks, among those
/// `allowed`.
pub(crate) fn choose(
    kind: CollKind,
    n: usize,
    bytes: usize,
    allowed: Allowed,
    m: &DeviceLink,
) -> DeviceChoice {
    let bulk = cost_us(kind, n, bytes, Protocol::Bulk, m);
    let ll = cost_us(kind, n, bytes, Protocol::LowLatency, m);
    let (protocol, why) = match (allowed.bulk, allowed.ll) {
        (true, false) => (Protocol::Bulk, "LL excluded by FERROCCL_PROTO".to_string()),
        (false, true) => (
            Protocol::LowLatency,
            "bulk excluded by FERROCCL_PROTO".to_string(),
        ),
        _ if ll < bulk => (
            Protocol::LowLatency,
            format!("model: LL {ll:.1} us < bulk {bulk:.1} us"),
        ),
        _ => (
            Protocol::Bulk,
            format!("model: bulk {bulk:.1} us <= LL {ll:.1} us"),
        ),
    };
    let chunk_bytes = match protocol {
        Protocol::Bulk => BULK_CHUNK_BYTES,
        Protocol::LowLatency => LL_CHUNK_BYTES,
    };
    DeviceChoice {
        protocol,
        chunk_bytes,
        channels: 1,
        reason: format!("{kind:?} of {bytes} bytes on {n} ranks: {why}"),
    }
}

impl DeviceChoice {
    /// The choice with its channels, at most `max`: the bulk protocol
    /// takes one per [`MIN_CHANNEL_BYTES`] of a step's bytes; LL, whose
    /// calls are small, one. The same on every rank (it reads the call's
    /// shape only).
    pub(crate) fn with_channels(
        mut self,
        kind: CollKind,
        n: usize,
        bytes: usize,
        max: usize,
    ) -> Self {
        let (_, per_step) = shape(kind, n, bytes);
        self.channels = match self.protocol {
            Protocol::LowLatency => 1,
            Protocol::Bulk => (per_step / MIN_CHANNEL_BYTES).clamp(1, max.max(1)),
        };
        self
    }
}

/// Channels the device executor cuts a bulk call into: an allreduce
/// (`all_reduce`) or a call on one block (allgather, reduce-scatter,
/// broadcast, reduce) of `bytes` on `n` ranks, at most `max`
/// (`DeviceChoice::with_channels`'s rule). Public through
/// `ferroccl::planner` so that `ferroccl-sim` splits schedules as the
/// executor does.
pub fn bulk_channels(all_reduce: bool, n: usize, bytes: usize, max: usize) -> usize {
    let kind = if all_reduce {
        CollKind::AllReduce
    } else {
        CollKind::AllGather
    };
    DeviceChoice {
        protocol: Protocol::Bulk,
        chunk_bytes: BULK_CHUNK_BYTES,
        channels: 1,
        reason: String::new(),
    }
    .with_channels(kind, n, bytes, max)
    .channels
}

/// Logs a choice at INFO, the way the host tuner logs its algorithm.
pub(crate) fn log_choice(c: &DeviceChoice) {
    tracing::info!(
        "device protocol {}, chunks of {} bytes, {} channel{}: {}",
        c.protocol.name(),
        c.chunk_bytes,
        c.channels,
        if c.channels == 1 { "" } else { "s" },
        c.reason
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn max_channels_reads_either_name_ferroccl_first() {
        let get = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(max_channels_from_env(&get(&[])).unwrap(), None);
        assert_eq!(
            max_channels_from_env(&get(&[(NCCL_MAX_NCHANNELS, "4")])).unwrap(),
            Some(4)
        );
        assert_eq!(
            max_channels_from_env(&get(&[(MAX_NCHANNELS, "2"), (NCCL_MAX_NCHANNELS, "4")]))
                .unwrap(),
            Some(2)
        );
        assert_eq!(
            max_channels_from_env(&get(&[(MAX_NCHANNELS, " ")])).unwrap(),
            None
        );
        for bad in ["0", "65", "x", "-1"] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(vec![(MAX_NCHANNELS, bad)].into_boxed_slice());
            let e = max_channels_from_env(&get(pairs)).unwrap_err().to_string();
            assert!(e.contains(MAX_NCHANNELS) && e.contains(bad), "{e}");
        }
    }

    /// Bulk calls take a channel per MIN_CHANNEL_BYTES of a step, up to
    /// the bound; LL calls one; never none.
    #[test]
    fn channels_follow_the_step_size_up_to_the_bound() {
        let m = DeviceLink::default();
        let all = |bytes: usize, max: usize| {
            choose(CollKind::AllReduce, 2, bytes, Allowed::default(), &m).with_channels(
                CollKind::AllReduce,
                2,
                bytes,
                max,
            )
        };
        assert_eq!(all(8, 8).channels, 1);
        assert_eq!(all(8, 8).protocol, Protocol::LowLatency);
        // 2 ranks: a step is half the bytes.
        assert_eq!(all(4 * MIN_CHANNEL_BYTES, 8).channels, 2);
        assert_eq!(all(1 << 30, 8).channels, 8);
        assert_eq!(all(1 << 30, 3).channels, 3);
        assert_eq!(all(1 << 30, 0).channels, 1);
        let ag = choose(CollKind::AllGather, 4, 1 << 20, Allowed::default(), &m).with_channels(
            CollKind::AllGather,
            4,
            1 << 20,
            64,
        );
        assert_eq!(ag.channels, (1 << 20) / MIN_CHANNEL_BYTES);
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn small_calls_take_ll_and_large_ones_bulk() {
        let m = DeviceLink::default();
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::Broadcast,
        ] {
            for n in [2, 4, 8] {
                let small = choose(kind, n, 8, Allowed::default(), &m);
                assert_eq!(small.protocol, Protocol::LowLatency, "{small:?}");
                assert_eq!(small.chunk_bytes, LL_CHUNK_BYTES);
                assert!(small.reason.contains("model: LL"), "{small:?}");
                log_choice(&small);
                let large = choose(kind, n, 256 << 20, Allowed::default(), &m);
                assert_eq!(large.protocol, Protocol::Bulk, "{large:?}");
                assert_eq!(large.chunk_bytes, BULK_CHUNK_BYTES);
                // One crossover: once bulk wins it keeps winning.
                let mut bulk_seen = false;
                for shift in 0..30 {
                    let c = choose(kind, n, 1 << shift, Allowed::default(), &m);
                    if bulk_seen {
                        assert_eq!(
                            c.protocol,
                            Protocol::Bulk,
                            "{kind:?} n {n} 2^{shift}: {c:?}"
                        );
                    }
                    bulk_seen |= c.protocol == Protocol::Bulk;
                }
                assert!(bulk_seen);
            }
        }
    }

    #[test]
    fn a_wider_latency_gap_moves_the_crossover_up() {
        let crossover = |m: &DeviceLink| {
            (0..34)
                .find(|&s| {
                    choose(CollKind::AllReduce, 4, 1usize << s, Allowed::default(), m).protocol
                        == Protocol::Bulk
                })
                .unwrap()
        };
        let base = DeviceLink::default();
        let slow_bulk = DeviceLink {
            bulk_latency_us: 20.0,
            ..base
        };
        assert!(crossover(&slow_bulk) > crossover(&base));
    }

    #[test]
    fn the_switch_narrows_the_choice_and_names_what_is_wrong() {
        let m = DeviceLink::default();
        let a = allowed_from_env(&env(&[("FERROCCL_PROTO", "Simple")])).unwrap();
        assert_eq!(
            a,
            Allowed {
                bulk: true,
                ll: false
            }
        );
        let c = choose(CollKind::AllReduce, 2, 8, a, &m);
        assert_eq!(c.protocol, Protocol::Bulk);
        assert!(c.reason.contains("excluded"), "{c:?}");
        // NCCL's name, its exclusion syntax, and LL128 ignored.
        let a = allowed_from_env(&env(&[("NCCL_PROTO", "^LL128,Simple")])).unwrap();
        assert_eq!(
            a,
            Allowed {
                bulk: false,
                ll: true
            }
        );
        assert_eq!(
            choose(CollKind::AllReduce, 2, 1 << 30, a, &m).protocol,
            Protocol::LowLatency
        );
        // Ours wins over NCCL's.
        let a =
            allowed_from_env(&env(&[("FERROCCL_PROTO", "ll"), ("NCCL_PROTO", "Simple")])).unwrap();
        assert_eq!(
            a,
            Allowed {
                bulk: false,
                ll: true
            }
        );
        assert_eq!(allowed_from_env(&env(&[])).unwrap(), Allowed::default());
        assert_eq!(
            allowed_from_env(&env(&[("FERROCCL_PROTO", " ")])).unwrap(),
            Allowed::default()
        );
        let e = allowed_from_env(&env(&[("FERROCCL_PROTO", "LL,fast")])).unwrap_err();
        assert!(e.to_string().contains("'fast'"), "{e}");
        let e = allowed_from_env(&env(&[("NCCL_PROTO", "LL128")])).unwrap_err();
        assert!(e.to_string().contains("leaves no protocol"), "{e}");
        let e = allowed_from_env(&env(&[("FERROCCL_PROTO", "^LL,Simple")])).unwrap_err();
        assert!(e.to_string().contains("FERROCCL_PROTO"), "{e}");
    }
}
