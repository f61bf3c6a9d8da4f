//! Run N ranks as threads of this process over an in-memory rendezvous: the
//! workhorse of the test suite (Gloo's test base does the same).

use crate::bootstrap::MemoryStore;
use crate::comm::{Communicator, Rendezvous};
use crate::config::Config;
use std::sync::Arc;

/// Run `f` on `n` ranks, each a thread with its own communicator, and return
/// what each rank returned, in rank order. Transports are the default ones
/// (FERROCCL_TRANSPORT applies); see [`run_ranks_with`] to set the config.
pub fn run_ranks<R: Send>(n: usize, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    run_ranks_with(n, |_| {}, f)
}

/// Like [`run_ranks`], with `configure` adjusting each rank's config (for
/// example a short timeout or a forced transport).
///
/// # Panics
/// If a communicator cannot be created, or a rank's `f` panics (after every
/// rank has finished).
pub fn run_ranks_with<R: Send>(
    n: usize,
    configure: impl Fn(&mut Config) + Sync,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    let store = MemoryStore::new();
    let token = random_token();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let store = store.clone();
                let (configure, f) = (&configure, &f);
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        let mut config = Config::new(rank, n, "127.0.0.1", 0, token)
                            .expect("FERROCCL_* environment is valid");
                        configure(&mut config);
                        let rendezvous = Arc::new(
                            Rendezvous::new(store, None, rank)
                                .expect("the in-memory rendezvous takes every key"),
                        );
                        let comm = Communicator::build(config, rendezvous, (0..n).collect(), 1)
                            .unwrap_or_else(|e| {
                                panic!("rank {rank}: communicator set-up failed: {e}")
                            });
                        f(comm)
                    })
                    .expect("spawn rank thread")
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

fn random_token() -> u64 {
    crate::config::random_u64()
}
