//! What the ranks are told to meet with: the job token (random for one
//! node, derived alike on every node of several) and a free port for the
//! rendezvous when none is given. No process handling here.

use crate::error::{Error, Result};
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};

/// 64 random bits from the kernel, or (if that fails) from the clock and
/// the process id.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    mix64(t ^ (u64::from(std::process::id()) << 32))
}

/// A bijective scrambling of 64 bits (the splitmix64 finaliser).
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A token every node of a multi-node job computes alike from what they
/// share. It keeps other jobs from joining by mistake; it is no secret.
pub(crate) fn derived_token(
    master_addr: &str,
    master_port: u16,
    nnodes: usize,
    nproc: usize,
) -> u64 {
    let text = format!("ferroccl-run|{master_addr}|{master_port}|{nnodes}|{nproc}");
    // FNV-1a: fixed and the same on every platform and compiler version.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// A port on 127.0.0.1 that was free a moment ago (bind port 0, read the
/// port, close); another process may take it in between, so use it soon.
pub(crate) fn free_port() -> Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::Io(format!("cannot bind a free port on 127.0.0.1: {e}")))?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_tokens_agree_and_differ_by_job() {
        let a = derived_token("head", 29500, 2, 4);
        assert_eq!(a, derived_token("head", 29500, 2, 4));
        assert_ne!(a, derived_token("head", 29501, 2, 4));
        assert_ne!(a, derived_token("head", 29500, 2, 8));
        assert_ne!(a, derived_token("other", 29500, 2, 4));
    }
}
