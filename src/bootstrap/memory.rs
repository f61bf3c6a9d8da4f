//! In-memory store (in progress).
