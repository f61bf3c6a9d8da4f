//! Benchmark tooling of ferroccl: the command line and the bandwidth
//! arithmetic of `ferroccl-perf` (nccl-tests definitions), kept in a library
//! so that both are unit-tested apart from any communicator.
//!
//! Nothing here moves data; the binaries in `src/bin` do.
#![warn(missing_docs, unreachable_pub)]

pub mod coll;
pub mod options;
pub mod sim;
