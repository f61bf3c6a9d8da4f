//! Two hosts on one machine: two network namespaces joined by a veth pair,
//! two ranks in each (through two `ferroccl-run` launchers, one per "node").
//! Ranks that share a namespace must talk over shared memory, ranks in
//! different namespaces over TCP, and every collective must check out.
//!
//! The same with the hierarchical algorithm forced (FERROCCL_ALGO=hier):
//! allreduce, allgather and reduce-scatter then run inside each host over
//! shared memory and between hosts over TCP, every type (and every op for
//! the reducing ones) against the f64 reference of `ferroccl-check`.
//!
//! Needs root and `ip netns`; where either is missing the test says so and
//! passes without running (it cannot create the hosts it is about).

mod common;

use common::process::ferroccl_run;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHECK: &str = env!("CARGO_BIN_EXE_ferroccl-check");

/// Namespaces and a veth pair that are removed on drop.
struct Hosts {
    names: [String; 2],
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    fn create(tag: &str) -> Result<Hosts, String> {
        let names = [format!("fcc{tag}a"), format!("fcc{tag}b")];
        let hosts = Hosts { names };
        let [a, b] = &hosts.names;
        let (va, vb) = (format!("{a}v"), format!("{b}v"));
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", a])?;
        ip(&["link", "set", &vb, "netns", b])?;
        for (ns, dev, addr) in [(a, &va, "10.213.7.1/24"), (b, &vb, "10.213.7.2/24")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.names {
            // Deleting a namespace deletes the veth end inside it, and so
            // the pair.
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Start one node's launcher inside namespace `ns`, with `env` set for
/// its ranks.
fn node(ns: &str, node_rank: usize, port: u16, env: &[(&str, &str)]) -> std::process::Child {
    let run = ferroccl_run();
    Command::new("ip")
        .envs(env.iter().copied())
        .args(["netns", "exec", ns, run, "-n", "2", "--nnodes", "2"])
        .args(["--node-rank", &node_rank.to_string()])
        .args([
            "--master-addr",
            "10.213.7.1",
            "--master-port",
            &port.to_string(),
        ])
        .args(["--", CHECK, "--count", "3001"])
        .env("FERROCCL_TOKEN", "0x5eed0213")
        .env("FERROCCL_TIMEOUT", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferroccl-run in a namespace")
}

fn wait(child: std::process::Child, limit: Duration) -> (bool, String) {
    let start = Instant::now();
    let mut child = child;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("collect output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `ferroccl-check` on two hosts of two ranks (namespaces tagged `tag`,
/// the rendezvous on `port`, `env` set for every rank): both nodes
/// succeed and rank 0 reports every check passed. The output of both, or
/// None where namespaces cannot be made (the test then says SKIPPED).
fn check_on_two_hosts(tag: &str, port: u16, env: &[(&str, &str)]) -> Option<String> {
    let hosts = match Hosts::create(tag) {
        Ok(h) => h,
        Err(e) => {
            eprintln!(
                "SKIPPED: cannot create network namespaces here ({e}); needs root and iproute2"
            );
            return None;
        }
    };
    let a = node(&hosts.names[0], 0, port, env);
    let b = node(&hosts.names[1], 1, port, env);
    let (ok_b, out_b) = wait(b, Duration::from_secs(120));
    let (ok_a, out_a) = wait(a, Duration::from_secs(120));
    let all = format!("{out_a}\n{out_b}");
    assert!(ok_a && ok_b, "a node failed:\n{all}");
    assert!(
        all.contains("checks passed on 4 ranks"),
        "rank 0 did not report success:\n{all}"
    );
    Some(all)
}

#[test]
fn shm_inside_each_host_and_tcp_between_them() {
    let tag = format!("{}", std::process::id() % 100_000);
    let port = 29_000 + (std::process::id() % 1000) as u16;
    let Some(all) = check_on_two_hosts(&tag, port, &[]) else {
        return;
    };
    // "[rank R] ferroccl-check: rank R transports: 1:shm 2:tcp 3:tcp"
    let mut seen = 0;
    for line in all.lines().filter(|l| l.contains(" transports: ")) {
        let rank: usize = line
            .split("ferroccl-check: rank ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("cannot parse {line}"));
        let links = line.split(" transports: ").nth(1).unwrap_or("");
        for link in links.split_whitespace() {
            let (peer, transport) = link.split_once(':').expect("peer:transport");
            let peer: usize = peer.parse().expect("peer rank");
            let same_host = rank / 2 == peer / 2;
            let want = if same_host { "shm" } else { "tcp" };
            assert_eq!(transport, want, "rank {rank} to rank {peer}: {line}");
        }
        seen += 1;
    }
    assert_eq!(seen, 4, "every rank reports its transports:\n{all}");
}

/// Hierarchical allreduce, allgather and reduce-scatter across the two
/// hosts: every check of `ferroccl-check` passes (each type and op
/// against its f64 reference), and the planner's INFO lines show that all
/// three ran hierarchical on the 4-rank communicator, while a collective
/// with no hierarchical schedule (broadcast) ran its own.
#[test]
fn hierarchical_across_two_hosts() {
    let tag = format!("{}h", std::process::id() % 100_000);
    let port = 29_500 + (std::process::id() % 400) as u16;
    let env = [("FERROCCL_ALGO", "hier"), ("FERROCCL_DEBUG", "INFO")];
    let Some(all) = check_on_two_hosts(&tag, port, &env) else {
        return;
    };
    // The 4-rank communicator's plans (`ferroccl-check` also splits off
    // communicators of one rank a host, where the ring runs).
    let plans = |kind: &str| -> Vec<&str> {
        all.lines()
            .filter(|l| l.contains("plan: ") && l.contains(&format!(" {kind} of ")))
            .filter(|l| l.contains(" on 4 ranks"))
            .collect()
    };
    for kind in ["all_reduce", "all_gather", "reduce_scatter"] {
        let lines = plans(kind);
        assert!(!lines.is_empty(), "no plan line for {kind}:\n{all}");
        for line in lines.iter().filter(|l| !l.contains(" of 0 bytes")) {
            assert!(
                line.contains("over 2 hosts") && line.contains("-> hierarchical (forced"),
                "{kind} did not run hierarchical: {line}"
            );
        }
    }
    let bcast = plans("broadcast");
    assert!(
        !bcast.is_empty()
            && bcast
                .iter()
                .all(|l| l.contains("-> ring (hierarchical forced")),
        "broadcast has no hierarchical schedule: {bcast:?}"
    );
}
