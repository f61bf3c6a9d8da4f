//! The cluster a schedule is simulated on: its constants (read from a
//! `key = value` file a user can edit, or a shipped preset), where each
//! rank sits, and which links a transfer between two ranks crosses.
//!
//! A cluster is `hosts` hosts of `ranks_per_host` ranks (GPUs, or CPU
//! processes). Inside a host the ranks meet either through a switch (each
//! rank has a port of its own in each direction: NVLink and NVSwitch) or
//! on one shared bus (every transfer inside the host crosses it: PCIe
//! through the host bridge, or a CPU's memory bus for shared memory).
//! Between hosts a transfer leaves through the sender's NIC (rank `local %
//! nics_per_host`) and enters through the receiver's; the fabric between
//! NICs is non-blocking (full bisection), with one switch between hosts of
//! the same leaf and three (leaf, spine, leaf) otherwise.

use std::fmt;

/// Shipped presets: name, file name under `bench/sim/`, and contents.
pub const PRESETS: [(&str, &str, &str); 5] = [
    ("h100", "h100.conf", include_str!("../../sim/h100.conf")),
    ("a100", "a100.conf", include_str!("../../sim/a100.conf")),
    ("cpu", "cpu.conf", include_str!("../../sim/cpu.conf")),
    ("v100", "v100.conf", include_str!("../../sim/v100.conf")),
    (
        "summit",
        "summit.conf",
        include_str!("../../sim/summit.conf"),
    ),
];

/// How the ranks of one host reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intra {
    /// A port per rank and direction (NVSwitch): transfers between
    /// different pairs do not share a link.
    Switch,
    /// One bus per host that every transfer inside the host crosses.
    Bus,
}

/// The model's constants. Bandwidths in GB/s (10^9 bytes a second) but
/// the NIC's, in Gb/s as NICs are sold; times in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// What the preset describes (printed in the header).
    pub name: String,
    /// Ranks on one host.
    pub ranks_per_host: usize,
    /// Switch or bus inside a host.
    pub intra: Intra,
    /// Bandwidth of a rank's port in one direction (switch) or of the
    /// whole bus, GB/s.
    pub intra_gbytes_per_s: f64,
    /// From the end of a transfer inside a host to the receiver seeing it.
    pub intra_latency_us: f64,
    /// NICs on one host.
    pub nics_per_host: usize,
    /// Bandwidth of a NIC in each direction, Gb/s.
    pub nic_gbits_per_s: f64,
    /// From the end of a transfer between hosts to the receiver seeing
    /// it, switches apart.
    pub nic_latency_us: f64,
    /// Latency of one switch of the fabric.
    pub switch_latency_us: f64,
    /// Hosts under one leaf switch.
    pub hosts_per_switch: usize,
    /// Fixed cost of every step a rank runs (waiting for a slot, the
    /// bookkeeping of the executor, a kernel's synchronisation).
    pub step_us: f64,
    /// Speed of a reduction, GB/s of output, per channel: a step that
    /// combines runs at most this fast.
    pub reduce_gbytes_per_s: f64,
    /// Speed of a local copy (a receive into the output), GB/s.
    pub copy_gbytes_per_s: f64,
    /// Bytes of one slot: the planner cuts schedules into slices of at
    /// most this.
    pub chunk_bytes: usize,
    /// Slots of a connection (frames in flight per sender, receiver and
    /// channel).
    pub slots: usize,
    /// Most channels a step is cut into (`algo::channels::split`), each
    /// run by an agent of its own (a thread block) over FIFOs of its own;
    /// a call takes as many as the device executor's rule gives
    /// (`ferroccl::planner::bulk_channels`). 1: the host executor.
    pub channels: usize,
    /// Slices in flight in a ring pass (`ferroccl::algo::ring`'s
    /// "Pipelined slices"); 0: the library's rule for `slots`
    /// (`ring::pipeline_depth`). Not a model file key: `ferroccl-sim
    /// --depth` sets it (1 runs each slice's pass after the previous one,
    /// as the library did before it pipelined them).
    pub depth: usize,
}

/// The links of a cluster are numbered; this says which a transfer uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Path {
    /// Up to two links the transfer occupies (`usize::MAX`: none).
    pub links: [usize; 2],
    /// Bandwidth of the path, bytes per microsecond.
    pub bytes_per_us: f64,
    /// From the end of the transfer to its arrival.
    pub latency_us: f64,
}

const NONE: usize = usize::MAX;

impl Cluster {
    /// A shipped preset by name (`h100`, `a100`, `cpu`, `v100`, `summit`).
    pub fn preset(name: &str) -> Result<Cluster, String> {
        let (_, _, text) = PRESETS
            .iter()
            .find(|(n, ..)| n.eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
                format!("no preset '{name}' (presets: {})", names.join(", "))
            })?;
        Cluster::parse(text).map_err(|e| format!("preset {name}: {e}"))
    }

    /// Parse a model file: one `key = value` a line, `#` starts a
    /// comment, every key of [`Cluster`] must be given once; values are
    /// numbers (`inf` allowed for speeds), `switch`/`bus` for `intra`,
    /// and any text for `name`. Errors name the line.
    pub fn parse(text: &str) -> Result<Cluster, String> {
        let mut seen: Vec<(String, String, usize)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected key = value, got '{line}'", i + 1))?;
            let key = key.trim().to_string();
            if seen.iter().any(|(k, ..)| *k == key) {
                return Err(format!("line {}: '{key}' given twice", i + 1));
            }
            let value = value.trim().trim_matches('"').to_string();
            seen.push((key, value, i + 1));
        }
        let mut take = |key: &str| -> Result<(String, usize), String> {
            let at = seen
                .iter()
                .position(|(k, ..)| k == key)
                .ok_or_else(|| format!("missing key '{key}'"))?;
            let (_, v, line) = seen.remove(at);
            Ok((v, line))
        };
        fn num<T: std::str::FromStr>(key: &str, (v, line): (String, usize)) -> Result<T, String> {
            v.parse().map_err(|_| {
                format!("line {line}: {key} = '{v}' is not a number of the right kind")
            })
        }
        let name = take("name")?.0;
        let intra = match take("intra")? {
            (v, _) if v == "switch" => Intra::Switch,
            (v, _) if v == "bus" => Intra::Bus,
            (v, line) => return Err(format!("line {line}: intra = '{v}': switch or bus")),
        };
        let c = Cluster {
            name,
            ranks_per_host: num("ranks_per_host", take("ranks_per_host")?)?,
            intra,
            intra_gbytes_per_s: num("intra_gbytes_per_s", take("intra_gbytes_per_s")?)?,
            intra_latency_us: num("intra_latency_us", take("intra_latency_us")?)?,
            nics_per_host: num("nics_per_host", take("nics_per_host")?)?,
            nic_gbits_per_s: num("nic_gbits_per_s", take("nic_gbits_per_s")?)?,
            nic_latency_us: num("nic_latency_us", take("nic_latency_us")?)?,
            switch_latency_us: num("switch_latency_us", take("switch_latency_us")?)?,
            hosts_per_switch: num("hosts_per_switch", take("hosts_per_switch")?)?,
            step_us: num("step_us", take("step_us")?)?,
            reduce_gbytes_per_s: num("reduce_gbytes_per_s", take("reduce_gbytes_per_s")?)?,
            copy_gbytes_per_s: num("copy_gbytes_per_s", take("copy_gbytes_per_s")?)?,
            chunk_bytes: num("chunk_bytes", take("chunk_bytes")?)?,
            slots: num("slots", take("slots")?)?,
            channels: num("channels", take("channels")?)?,
            depth: 0,
        };
        if let Some((k, _, line)) = seen.first() {
            return Err(format!("line {line}: unknown key '{k}'"));
        }
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), String> {
        let positive = [
            ("intra_gbytes_per_s", self.intra_gbytes_per_s),
            ("nic_gbits_per_s", self.nic_gbits_per_s),
            ("reduce_gbytes_per_s", self.reduce_gbytes_per_s),
            ("copy_gbytes_per_s", self.copy_gbytes_per_s),
        ];
        for (k, v) in positive {
            if v.is_nan() || v <= 0.0 {
                return Err(format!("{k} = {v}: must be above 0"));
            }
        }
        for (k, v) in [
            ("intra_latency_us", self.intra_latency_us),
            ("nic_latency_us", self.nic_latency_us),
            ("switch_latency_us", self.switch_latency_us),
            ("step_us", self.step_us),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{k} = {v}: must be finite and at least 0"));
            }
        }
        for (k, v, min) in [
            ("ranks_per_host", self.ranks_per_host, 1),
            ("nics_per_host", self.nics_per_host, 1),
            ("hosts_per_switch", self.hosts_per_switch, 1),
            ("chunk_bytes", self.chunk_bytes, 8),
            ("slots", self.slots, 2),
            ("channels", self.channels, 1),
        ] {
            if v < min {
                return Err(format!("{k} = {v}: must be at least {min}"));
            }
        }
        Ok(())
    }

    /// Slices in flight in a ring pass: `depth`, or the library's rule
    /// for `slots`.
    pub fn ring_depth(&self) -> usize {
        ferroccl::algo::ring::depth_for(self.slots, self.depth)
    }

    /// The links of a cluster of `ranks` ranks: a port per rank and
    /// direction, a bus per host, a NIC per host and direction.
    pub fn link_count(&self, ranks: usize) -> usize {
        let hosts = ranks.div_ceil(self.ranks_per_host);
        2 * ranks + hosts + 2 * hosts * self.nics_per_host
    }

    /// The path of a transfer from rank `from` to rank `to` of a cluster of
    /// `ranks` ranks.
    pub fn path(&self, ranks: usize, from: usize, to: usize) -> Path {
        let g = self.ranks_per_host;
        let (hf, ht) = (from / g, to / g);
        if hf == ht {
            let links = match self.intra {
                Intra::Switch => [2 * from, 2 * to + 1],
                Intra::Bus => [2 * ranks + hf, NONE],
            };
            return Path {
                links,
                bytes_per_us: self.intra_gbytes_per_s * 1e3,
                latency_us: self.intra_latency_us,
            };
        }
        let hosts = ranks.div_ceil(g);
        let nic = |host: usize, rank: usize, dir: usize| {
            2 * ranks
                + hosts
                + 2 * (host * self.nics_per_host + (rank % g) % self.nics_per_host)
                + dir
        };
        let switches = if hf / self.hosts_per_switch == ht / self.hosts_per_switch {
            1.0
        } else {
            3.0
        };
        Path {
            links: [nic(hf, from, 0), nic(ht, to, 1)],
            bytes_per_us: self.nic_gbits_per_s / 8.0 * 1e3,
            latency_us: self.nic_latency_us + switches * self.switch_latency_us,
        }
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} ranks a host ({:?} {} GB/s, {} us), {} NIC(s) of {} Gb/s a host ({} us + {} us a switch, {} hosts a leaf), step {} us, reduce {} GB/s, copy {} GB/s, slots {} x {} B, {} channel(s)",
            self.name,
            self.ranks_per_host,
            self.intra,
            self.intra_gbytes_per_s,
            self.intra_latency_us,
            self.nics_per_host,
            self.nic_gbits_per_s,
            self.nic_latency_us,
            self.switch_latency_us,
            self.hosts_per_switch,
            self.step_us,
            self.reduce_gbytes_per_s,
            self.copy_gbytes_per_s,
            self.slots,
            self.chunk_bytes,
            self.channels
        )
    }
}
