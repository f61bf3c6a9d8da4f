//! ferroccl: collective communication for Rust.
#![warn(missing_docs, unreachable_pub)]

pub mod bootstrap;
mod error;
pub mod launch;

pub use error::{Error, Result};
