//! The launcher's error type. Its messages read as the library's errors of
//! the same kinds did, so what `ferroccl-run` prints is unchanged; the
//! binary tells usage errors (exit code 2) from the rest (exit code 1) by
//! the variant.

/// Result of launcher calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can stop a launch before the ranks' own exit codes decide it.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The command line or the options are wrong; the message carries the
    /// usage text where it came from the command line.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A launcher setting in the environment (`FERROCCL_RUN_GRACE_S`) is
    /// not understood.
    #[error("launch environment: {0}")]
    Env(String),
    /// The operating system refused something: a rank could not be started,
    /// no port or signal pipe could be had.
    #[error("I/O error: {0}")]
    Io(String),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}
