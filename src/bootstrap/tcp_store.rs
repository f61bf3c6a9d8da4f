//! TCP store (in progress).
