//! Data-parallel training of [Burn](https://burn.dev) models across
//! processes and hosts on ferroccl.
//!
//! Every rank holds a replica of the model and trains it on its own share
//! of the data; rank 0's initial weights are broadcast
//! ([`broadcast_module`]), and after each `backward()` every parameter's
//! gradient (in the order the module lists its parameters) goes through
//! ferroccl's DDP [`Reducer`](ferroccl::ddp::Reducer) (buckets, averaging,
//! fp16/bf16 compression where asked) and back into Burn's
//! `GradientsParams` for the optimizer. Two ways in:
//!
//! - a custom training loop calls [`GradientSync::sync`] between
//!   `backward()` and `optimizer.step()` ([`GradientSync::accumulate`] for
//!   micro-steps that should not communicate);
//! - a `Learner` user swaps the strategy:
//!   `TrainingStrategy::Custom(Arc::new(DataParallel::new(comm, device)))`.
//!
//! Any backend whose tensors can be read on the host works (NdArray on the
//! CPU; device backends are staged through host memory). Gradients are
//! reduced in f32. The data split per rank is the user's: rank r of n
//! takes every n-th item of the same order, the same count on every rank.
//! `docs/frameworks.md` is the guide.
#![warn(missing_docs, unreachable_pub)]

mod params;
mod strategy;
mod sync;

pub use params::broadcast_module;
pub use strategy::{Compression, DataParallel};
pub use sync::GradientSync;

/// The Burn this crate is built on (one place: the workspace's
/// `Cargo.toml`), re-exported so that users and examples name the same
/// version.
pub use burn;
/// The communicator and its errors.
pub use ferroccl::{Communicator, Error, Result};
