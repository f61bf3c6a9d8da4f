//! Launcher environments (in progress).
