//! TCP transport (work in progress).
