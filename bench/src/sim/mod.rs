//! `ferroccl-sim`: the library's real schedules timed on a model of a
//! cluster (docs/sim.md). `model` holds the cluster and its file format,
//! `schedules` builds what a call would run, `engine` times it, `svg`
//! draws the results.

pub mod engine;
pub mod model;
pub mod schedules;
pub mod svg;
