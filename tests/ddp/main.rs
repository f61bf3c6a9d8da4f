//! The data-parallel reducer: N thread ranks, each on its share of a global
//! batch, must end K SGD steps with the weights one process gets on the
//! whole batch (computed independently here, in f64, with no reducer), and
//! a rank whose backward goes wrong must get a clear error while the others
//! get one too instead of hanging.
//!
//! One test binary in several files: the sections share the model and the
//! training harness (model.rs), and as files of their own in tests/ each
//! would be another binary to link on CI's two cores.

// The helpers every test binary shares live beside the test files.
#[path = "../common/mod.rs"]
mod common;

mod equivalence;
mod errors;
mod examples;
mod layout;
mod model;
