//! Process-wide logging through `tracing-subscriber`, as human text or one JSON object per line.
//!
//! The level comes from `RUST_LOG` (default `info`). Secrets never reach a log line because
//! they only exist as [`crate::coderd::SecretString`] (redacted `Debug`/`Display`) and the
//! session-token header is marked sensitive.
use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber writing to stderr (stdout stays free for command output).
pub fn init(format: LogFormat) -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour codes only for a terminal; in a file or a log collector they are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}
