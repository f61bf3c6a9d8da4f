//! The `ferroccl-run` binary, driven on small shell commands.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ferroccl-run");

/// Run ferroccl-run with `args`, without FERROCCL_TOKEN or a grace override
/// from the test's own environment unless given in `env`.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("FERROCCL_TOKEN")
        .env_remove("FERROCCL_RUN_GRACE_S")
        .env_remove("FERROCCL_HOST_CPUS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("cannot run ferroccl-run")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Split `[rank R] rest` into (R, rest).
fn split_prefixed(line: &str) -> Option<(usize, &str)> {
    let rest = line.strip_prefix("[rank ")?;
    let (r, rest) = rest.split_once("] ")?;
    Some((r.parse().ok()?, rest))
}

const PRINT_ENV: &str = "echo \"RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK \
     LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR \
     MASTER_PORT=$MASTER_PORT FERROCCL_LAUNCHER=$FERROCCL_LAUNCHER FERROCCL_TOKEN=$FERROCCL_TOKEN\"";

/// Each rank's printed variables, by the rank of its output prefix.
fn env_by_rank(out: &Output) -> BTreeMap<usize, BTreeMap<String, String>> {
    let mut by_rank = BTreeMap::new();
    for line in text(&out.stdout).lines() {
        let (r, rest) = split_prefixed(line).unwrap_or_else(|| panic!("unprefixed: {line}"));
        let vars: BTreeMap<String, String> = rest
            .split_whitespace()
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        assert!(by_rank.insert(r, vars).is_none(), "rank {r} printed twice");
    }
    by_rank
}

#[test]
fn three_ranks_get_their_environment() {
    let out = run(&["-n", "3", "--", "sh", "-c", PRINT_ENV], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let by_rank = env_by_rank(&out);
    assert_eq!(by_rank.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    let port = &by_rank[&0]["MASTER_PORT"];
    let token = &by_rank[&0]["FERROCCL_TOKEN"];
    assert!(port.parse::<u16>().unwrap() > 0);
    token.parse::<u64>().expect("token is a u64");
    for (r, v) in &by_rank {
        assert_eq!(v["RANK"], r.to_string());
        assert_eq!(v["LOCAL_RANK"], r.to_string());
        assert_eq!(v["WORLD_SIZE"], "3");
        assert_eq!(v["LOCAL_WORLD_SIZE"], "3");
        assert_eq!(v["GROUP_RANK"], "0");
        assert_eq!(v["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(&v["MASTER_PORT"], port);
        assert_eq!(v["FERROCCL_LAUNCHER"], "ferroccl-run");
        assert_eq!(&v["FERROCCL_TOKEN"], token);
    }
    // A second job gets another token.
    let again = env_by_rank(&run(&["-n", "1", "sh", "-c", PRINT_ENV], &[]));
    assert_ne!(&again[&0]["FERROCCL_TOKEN"], token);
}

const PRINT_CPUS: &str = "echo \"HOST_CPUS=$FERROCCL_HOST_CPUS\"";

/// Each rank is told the CPUs the launcher places the ranks on between
/// them: its own mask's (a rank pinned to one CPU cannot know it), one
/// where the launcher itself may run on one CPU only (`taskset -c 0`:
/// both ranks then share it), and what the user set, untouched.
#[test]
fn ranks_are_told_the_cpus_they_run_on_between_them() {
    let told = |out: &Output| -> Vec<String> {
        assert!(out.status.success(), "{}", text(&out.stderr));
        env_by_rank(out)
            .into_values()
            .map(|v| v["HOST_CPUS"].clone())
            .collect()
    };
    let all = own_cpus().len().to_string();
    let out = run(&["-n", "2", "--", "sh", "-c", PRINT_CPUS], &[]);
    assert_eq!(told(&out), vec![all.clone(), all]);

    let mut cmd = Command::new(BIN);
    cmd.args(["-n", "2", "--", "sh", "-c", PRINT_CPUS])
        .env_remove("FERROCCL_TOKEN")
        .env_remove("FERROCCL_HOST_CPUS");
    // SAFETY: runs in the child between fork and exec and only makes
    // sched_getcpu and sched_setaffinity calls on a CPU set on its stack.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(libc::sched_getcpu().max(0) as usize, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("cannot run ferroccl-run");
    assert_eq!(told(&out), vec!["1", "1"]);

    let out = run(
        &["-n", "2", "--", "sh", "-c", PRINT_CPUS],
        &[("FERROCCL_HOST_CPUS", "7")],
    );
    assert_eq!(told(&out), vec!["7", "7"]);
}

#[test]
fn second_node_of_two() {
    let args = [
        "-n",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "head.example",
        "--master-port",
        "29999",
        "--",
        "sh",
        "-c",
        PRINT_ENV,
    ];
    let out = run(&args, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("FERROCCL_TOKEN"),
        "no note about the token"
    );
    let by_rank = env_by_rank(&out);
    assert_eq!(by_rank.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
    for (r, v) in &by_rank {
        assert_eq!(v["RANK"], r.to_string());
        assert_eq!(v["LOCAL_RANK"], (r - 2).to_string());
        assert_eq!(v["WORLD_SIZE"], "4");
        assert_eq!(v["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(v["GROUP_RANK"], "1");
        assert_eq!(v["MASTER_ADDR"], "head.example");
        assert_eq!(v["MASTER_PORT"], "29999");
    }
    // Every node derives the same token (the first node runs the same
    // command with --node-rank 0).
    let mut first_node = args;
    first_node[5] = "0";
    let node0 = env_by_rank(&run(&first_node, &[]));
    assert_eq!(node0[&0]["FERROCCL_TOKEN"], by_rank[&2]["FERROCCL_TOKEN"]);
    // An explicit token is passed on as is.
    let given = env_by_rank(&run(&args, &[("FERROCCL_TOKEN", "0xabc")]));
    assert_eq!(given[&3]["FERROCCL_TOKEN"], "0xabc");
}

#[test]
fn several_nodes_need_a_master_port() {
    let out = run(&["-n", "1", "--nnodes", "2", "--", "true"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--master-port is required"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn output_is_prefixed_line_by_line() {
    let script = "i=0; while [ $i -lt 200 ]; do echo \"out-$RANK-$i\"; echo \"err-$RANK-$i\" >&2; \
                  i=$((i+1)); done; printf 'tail-%s' $RANK";
    let out = run(&["-n", "3", "sh", "-c", script], &[]);
    assert!(out.status.success());
    for (stream, name) in [(&out.stdout, "out"), (&out.stderr, "err")] {
        let mut count: BTreeMap<usize, usize> = BTreeMap::new();
        let mut tails = 0;
        for line in text(stream).lines() {
            let (r, rest) = split_prefixed(line).unwrap_or_else(|| panic!("unprefixed: {line}"));
            if rest == format!("tail-{r}") && name == "out" {
                tails += 1;
                continue;
            }
            // Whole lines only: each names its own rank and a sequence number.
            let parts: Vec<&str> = rest.split('-').collect();
            assert_eq!(parts.len(), 3, "mixed line: {line}");
            assert_eq!(parts[0], name, "{line}");
            assert_eq!(parts[1], r.to_string(), "{line}");
            assert_eq!(
                parts[2].parse::<usize>().unwrap(),
                count.get(&r).copied().unwrap_or(0)
            );
            *count.entry(r).or_default() += 1;
        }
        assert_eq!(count, (0..3).map(|r| (r, 200)).collect(), "{name}");
        if name == "out" {
            // A last line without a newline still comes out, prefixed.
            assert_eq!(tails, 3);
        }
    }
}

#[test]
fn no_prefix_passes_output_through() {
    let out = run(&["-n", "2", "--no-prefix", "sh", "-c", "echo plain"], &[]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "plain\nplain\n");
}

/// Whether a process with this pid still exists.
fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn sleeper_pids(out: &Output) -> Vec<i32> {
    text(&out.stdout)
        .lines()
        .filter_map(split_prefixed)
        .filter_map(|(_, rest)| rest.strip_prefix("pid "))
        .map(|p| p.parse().unwrap())
        .collect()
}

#[test]
fn a_failing_rank_stops_the_others() {
    let script = "if [ \"$RANK\" = 1 ]; then sleep 0.3; exit 3; fi; echo \"pid $$\"; exec sleep 60";
    let t = Instant::now();
    let out = run(&["-n", "3", "sh", "-c", script], &[]);
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        text(&out.stderr).contains("ferroccl-run: rank 1 exited with code 3"),
        "{}",
        text(&out.stderr)
    );
    let pids = sleeper_pids(&out);
    assert_eq!(pids.len(), 2, "{}", text(&out.stdout));
    for pid in pids {
        assert!(!alive(pid), "sleeper {pid} survived");
    }
}

#[test]
fn a_rank_that_ignores_sigterm_is_killed_after_the_grace() {
    let script = "if [ \"$RANK\" = 0 ]; then sleep 0.3; exit 5; fi; trap '' TERM; \
                  echo \"pid $$\"; exec sleep 60";
    let t = Instant::now();
    let out = run(
        &["-n", "2", "sh", "-c", script],
        &[("FERROCCL_RUN_GRACE_S", "0.5")],
    );
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(
        text(&out.stderr).contains("rank 1 did not stop"),
        "{}",
        text(&out.stderr)
    );
    for pid in sleeper_pids(&out) {
        assert!(!alive(pid), "sleeper {pid} survived");
    }
}

#[test]
fn a_rank_killed_by_a_signal() {
    let script = "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; exec sleep 60";
    let out = run(&["-n", "2", "sh", "-c", script], &[]);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("ferroccl-run: rank 1 was killed by signal 9"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn sigterm_to_the_launcher_reaches_every_rank() {
    let script = "trap 'echo got-TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done";
    let mut child = Command::new(BIN)
        .args(["-n", "2", "sh", "-c", script])
        .env_remove("FERROCCL_RUN_GRACE_S")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let _ = tx.send(line);
        }
    });
    let mut ready = 0;
    while ready < 2 {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("ranks never got ready");
        if line.ends_with("] ready") {
            ready += 1;
        }
    }
    // SAFETY: signalling the launcher we started; its pid is valid until we
    // reap it below.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "launcher did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    reader.join().unwrap();
    let lines: Vec<String> = rx.try_iter().collect();
    assert!(
        lines.contains(&"[rank 0] got-TERM".to_string()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"[rank 1] got-TERM".to_string()),
        "{lines:?}"
    );
    assert_eq!(status.code(), Some(7));
}

#[test]
fn bad_arguments_give_usage_errors() {
    for (args, expect) in [
        (&["--", "true"][..], "-n N"),
        (&["-n", "0", "true"][..], "not a positive number"),
        (&["-n", "two", "true"][..], "-n 'two'"),
        (&["-n", "2"][..], "no program"),
        (
            &["-n", "2", "--frobnicate", "true"][..],
            "unknown option '--frobnicate'",
        ),
        (
            &["-n", "2", "--nnodes", "2", "--node-rank", "5", "true"][..],
            "below --nnodes",
        ),
        (
            &["-n", "2", "--master-port", "99999", "true"][..],
            "not a port",
        ),
        (
            &["-n", "2", "--bind-to", "socket", "true"][..],
            "--bind-to 'socket'",
        ),
    ] {
        let out = run(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(err.contains("usage: ferroccl-run"), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn help_and_missing_program() {
    let out = run(&["--help"], &[]);
    assert!(out.status.success());
    assert!(text(&out.stdout).starts_with("usage: ferroccl-run"));
    let out = run(&["-n", "1", "/nonexistent/ferroccl-test-program"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("cannot start rank 0"), "{err}");
    let out = run(
        &["-n", "1", "sh", "-c", "exit 0"],
        &[("FERROCCL_RUN_GRACE_S", "soon")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("FERROCCL_RUN_GRACE_S='soon'"));
}

#[cfg(target_os = "linux")]
#[test]
fn ranks_do_not_outlive_a_killed_launcher() {
    let mut child = Command::new(BIN)
        .args(["-n", "2", "sh", "-c", "echo \"pid $$\"; exec sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut pids = Vec::new();
    while pids.len() < 2 {
        let line = lines.next().expect("launcher ended early").unwrap();
        let (_, rest) = split_prefixed(&line).unwrap();
        pids.push(rest.strip_prefix("pid ").unwrap().parse::<i32>().unwrap());
    }
    child.kill().unwrap(); // SIGKILL: no chance to forward anything
    child.wait().unwrap();
    let t = Instant::now();
    while pids.iter().any(|&p| alive_not_zombie(p)) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "ranks {pids:?} outlived the launcher"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` runs (a zombie waiting for init to reap it does not).
#[cfg(target_os = "linux")]
fn alive_not_zombie(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => !matches!(
            stat.rsplit_once(") ").map(|(_, s)| &s[..1]),
            Some("Z" | "X")
        ),
        Err(_) => false,
    }
}

/// Set in the environment of ranks started by `ranks_meet_over_the_tcp_store`.
const CHILD_MARK: &str = "FERROCCL_LAUNCHER_TEST_CHILD";

/// A rank of `ranks_meet_over_the_tcp_store`: this test binary, started
/// again by ferroccl-run with only this test selected.
#[test]
#[ignore = "a rank of ranks_meet_over_the_tcp_store, started by ferroccl-run"]
fn rank_main() {
    use ferroccl::bootstrap::{detect_process_env, Store, TcpStore, TcpStoreServer};
    if std::env::var(CHILD_MARK).is_err() {
        return;
    }
    let info = detect_process_env().unwrap();
    assert_eq!(info.source, "ferroccl-run");
    let token = info.token.expect("ferroccl-run sets FERROCCL_TOKEN");
    let addr = format!("{}:{}", info.master_addr, info.master_port)
        .parse()
        .unwrap();
    let server = (info.rank == 0).then(|| TcpStoreServer::start(addr, token, info.size).unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let store = TcpStore::connect(addr, token, info.rank, deadline).unwrap();
    let mine = (info.rank * 10 + 1).to_string();
    store
        .set(&format!("hello/{}", info.rank), mine.as_bytes())
        .unwrap();
    let sum: usize = (0..info.size)
        .map(|r| {
            let v = store.get(&format!("hello/{r}"), deadline).unwrap();
            String::from_utf8(v).unwrap().parse::<usize>().unwrap()
        })
        .sum();
    println!("RESULT rank={} size={} sum={sum}", info.rank, info.size);
    store.goodbye();
    drop(server);
}

#[test]
fn ranks_meet_over_the_tcp_store() {
    let exe = std::env::current_exe().unwrap();
    let out = run(
        &[
            "-n",
            "4",
            "--",
            exe.to_str().unwrap(),
            "rank_main",
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ],
        &[(CHILD_MARK, "1")],
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let expected_sum: usize = (0..4).map(|r| r * 10 + 1).sum();
    let mut seen: Vec<usize> = text(&out.stdout)
        .lines()
        .filter_map(split_prefixed)
        .filter_map(|(r, rest)| {
            // libtest may print "test rank_main ... " on the same line.
            let (_, rest) = rest.split_once("RESULT ")?;
            assert_eq!(rest, format!("rank={r} size=4 sum={expected_sum}"));
            Some(r)
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, vec![0, 1, 2, 3], "{}", text(&out.stdout));
}

/// The CPUs listed in a `Cpus_allowed_list` value ("0-3,6").
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

fn own_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    cpu_list(line)
}

/// Each rank's allowed CPUs, as it reads them from /proc.
fn cpus_by_rank(args: &[&str]) -> BTreeMap<usize, Vec<usize>> {
    let mut full = args.to_vec();
    full.extend(["--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status"]);
    let out = run(&full, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|line| {
            let (r, rest) = split_prefixed(line).unwrap();
            (r, cpu_list(rest.split_once(':').unwrap().1))
        })
        .collect()
}

#[cfg(target_os = "linux")]
#[test]
fn ranks_get_cpus_of_their_own_when_there_are_enough() {
    let cpus = own_cpus();
    let c = cpus.len();
    // As many ranks as CPUs: rank i alone on the i-th CPU (the default
    // share, and --bind-to core).
    let n = c.to_string();
    for args in [&["-n", &n][..], &["-n", &n, "--bind-to", "core"][..]] {
        let got = cpus_by_rank(args);
        for r in 0..c {
            assert_eq!(got[&r], vec![cpus[r]], "{args:?}: rank {r}");
        }
    }
    // One rank keeps every CPU (its own threads need them); --bind-to none
    // or more ranks than CPUs: no pinning at all.
    let more = (c + 1).to_string();
    for args in [
        &["-n", "1"][..],
        &["-n", &n, "--bind-to", "none"][..],
        &["-n", &more][..],
    ] {
        for (r, got) in cpus_by_rank(args) {
            assert_eq!(got, cpus, "{args:?}: rank {r}");
        }
    }
}
