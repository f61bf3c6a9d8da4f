//! FERROCCL_DEBUG=WARN|INFO|TRACE (as NCCL_DEBUG): installs a `tracing`
//! subscriber writing to stderr, unless the application installed its own.

use std::sync::Once;

pub(crate) fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let level = match std::env::var("FERROCCL_DEBUG")
            .ok()
            .map(|v| v.to_ascii_uppercase())
            .as_deref()
        {
            Some("TRACE") => tracing::Level::TRACE,
            Some("DEBUG") => tracing::Level::DEBUG,
            Some("INFO") => tracing::Level::INFO,
            Some("WARN") => tracing::Level::WARN,
            Some("ERROR") => tracing::Level::ERROR,
            // Unset: stay quiet unless something is wrong.
            _ => tracing::Level::WARN,
        };
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .finish();
        // Fails when the application has its own subscriber: keep theirs.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}
