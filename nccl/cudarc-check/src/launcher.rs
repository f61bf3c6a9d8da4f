//! The launcher: the first process, which starts every rank as a process
//! of this program and waits for them.

use crate::timeout;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Start `world` ranks of `mode` as processes of this program, wait for
/// them (killing them past the timeout), print their output.
pub(crate) fn launch(mode: &str, world: usize) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir =
        std::env::temp_dir().join(format!("cudarc-nccl-check-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut children: Vec<(Child, PathBuf)> = Vec::new();
    for rank in 0..world {
        let log = dir.join(format!("rank{rank}.log"));
        let out = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(&exe)
            .args(["rank", mode, &rank.to_string(), &world.to_string()])
            .arg(&dir)
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting rank {rank}: {e}"))?;
        children.push((child, log));
    }
    let deadline = Instant::now() + timeout();
    let mut failed = Vec::new();
    for (rank, (child, log)) in children.iter_mut().enumerate() {
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("waiting for rank {rank}: {e}")),
            }
        };
        let text = std::fs::read_to_string(&*log).unwrap_or_default();
        println!("--- rank {rank} ({mode}):");
        print!("{text}");
        match status {
            Some(s) if s.success() => {}
            Some(s) => failed.push(format!("rank {rank} exited with {s}")),
            None => failed.push(format!("rank {rank} killed after {:?}", timeout())),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failed.is_empty() {
        println!("cudarc-nccl-check {mode} {world}: every rank OK");
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}
