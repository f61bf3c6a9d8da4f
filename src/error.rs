//! The error type of every public call. Each variant carries what a person
//! needs to act: which rank, which call and its sequence number, what was
//! expected and what came.

use ferroccl_transport::TransportError;

/// Result of ferroccl calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in ferroccl.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// An argument is wrong (lengths, root, peer); found before any byte moved.
    ///
    /// The call is not run, but it keeps its place in the communicator's
    /// order and the other ranks are told at once: a rank that accepted the
    /// same call ends it with [`Error::PeerFailed`] naming this rank, its
    /// call and this reason, and its communicator ends; it tells this rank,
    /// whose communicator then ends too, naming it (`async_error`, and every
    /// later call). Ranks that refused the same call go on. A
    /// point-to-point call is refused on this rank only.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Launch environment variables are missing or contradict each other.
    #[error("launch environment: {0}")]
    Env(String),
    /// The rendezvous failed (unreachable, wrong token, bad reply).
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// A peer did not answer before the deadline.
    #[error("{during}: timed out after {waited_ms} ms waiting for rank {peer} ({what})")]
    Timeout {
        /// The rank waited for.
        peer: usize,
        /// The call and its sequence number, e.g. `all_reduce #17`.
        during: String,
        /// What was awaited.
        what: String,
        /// How long the wait lasted.
        waited_ms: u64,
    },
    /// A peer died, closed its connections or was reported failed.
    #[error("{during}: rank {rank} failed: {reason}")]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
        /// The call and its sequence number.
        during: String,
        /// What is known about it.
        reason: String,
    },
    /// Two ranks called different collectives (or the same with other
    /// arguments: type, count, op, root) at the same position of the
    /// sequence.
    ///
    /// When it surfaces: a collective returns it from the call itself on
    /// every rank of the communicator, whatever its part (a broadcast root
    /// or a reduce's leaves, which only send, included: a call does not
    /// return `Ok` before every rank is known to run the same call). A
    /// rank still finishing an earlier call lets that call finish and gets
    /// the mismatch from the mismatched call when it starts it (or from
    /// [`Communicator::async_error`](crate::Communicator::async_error)
    /// before then). Send/recv are checked by the receiver only: a send
    /// returns once its data is handed to the transport, and its rank hears
    /// of a mismatched receive at its next call. The calls are described
    /// with the user's call numbers (`all_reduce #3`); the library's own
    /// agreements (set-up, `split`, `alloc_window`) are numbered apart.
    #[error("collective mismatch with rank {peer}: this rank called {local}, rank {peer} called {remote}")]
    Mismatch {
        /// The rank whose call differs.
        peer: usize,
        /// This rank's call.
        local: String,
        /// The peer's call.
        remote: String,
    },
    /// A peer sent bytes that do not decode.
    #[error("{during}: rank {peer} sent an invalid frame: {detail}")]
    Protocol {
        /// The rank that sent them.
        peer: usize,
        /// The call and its sequence number.
        during: String,
        /// What was wrong.
        detail: String,
    },
    /// Connection set-up to a peer failed.
    #[error("could not connect to rank {peer}: {detail}")]
    Connect {
        /// The rank that could not be reached.
        peer: usize,
        /// Why.
        detail: String,
    },
    /// The communicator was aborted (by `abort()` or an earlier failure).
    #[error("communicator aborted{}", .0.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Aborted(Option<String>),
    /// Local I/O failure.
    #[error("I/O error: {0}")]
    Io(String),
    /// A call on device memory where no CUDA device can be used: no driver
    /// library, a driver older than this build needs, no device, or
    /// `FERROCCL_CUDA=0`; with the reason. Nothing was issued: the call did
    /// not take a place in the communicator's order. Host calls are
    /// unaffected.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
}

impl Error {
    /// Attach the call name and sequence number to a transport error.
    pub(crate) fn from_transport(err: TransportError, during: &str) -> Self {
        match err {
            TransportError::Timeout {
                peer,
                what,
                waited_ms,
            } => Error::Timeout {
                peer,
                during: during.to_string(),
                what: what.to_string(),
                waited_ms,
            },
            TransportError::PeerClosed { peer, detail } => Error::PeerFailed {
                rank: peer,
                during: during.to_string(),
                reason: format!("connection closed ({detail})"),
            },
            TransportError::PeerFailed { rank, reason } => Error::PeerFailed {
                rank,
                during: during.to_string(),
                reason,
            },
            TransportError::Protocol { peer, detail } => Error::Protocol {
                peer,
                during: during.to_string(),
                detail,
            },
            TransportError::Connect { peer, detail } => Error::Connect { peer, detail },
            TransportError::Aborted => Error::Aborted(None),
            TransportError::Io(detail) => Error::Io(format!("{during}: {detail}")),
        }
    }

    /// The rank this error blames, if any.
    pub fn failed_rank(&self) -> Option<usize> {
        match self {
            Error::PeerFailed { rank, .. } => Some(*rank),
            Error::Timeout { peer, .. }
            | Error::Protocol { peer, .. }
            | Error::Connect { peer, .. }
            | Error::Mismatch { peer, .. } => Some(*peer),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// The library's error for an error of the CUDA glue (`ferroccl-cuda`):
/// its "no device" and "invalid argument" keep their kind, the rest are
/// I/O errors.
pub(crate) fn from_cuda(e: ferroccl_cuda::CudaError) -> Error {
    use ferroccl_cuda::CudaError;
    match e {
        CudaError::NoDevice(why) => Error::NoDevice(why),
        CudaError::InvalidArgument(why) => Error::InvalidArgument(why),
        other => Error::Io(other.to_string()),
    }
}
