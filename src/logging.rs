//! The process's log: plain text for people or one JSON object a line for log shippers
//! (`--log-format`), on standard error, filtered by `RUST_LOG` (default `info`). Colour only on
//! a terminal, and never under `NO_COLOR` (no-color.org): a log redirected to a file holds no
//! escape bytes.

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `TIME LEVEL target: message key=value …`, as people read it.
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, `message` and the event's fields
    /// beside them (request id, model, endpoint, status, token counts, speeds).
    Json,
}

/// Installs the process's subscriber; call once, before anything logs.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(colour_wanted()).init(),
        // Fields flattened beside the message: shippers index `status`, not `fields.status`.
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Colour escapes only where a person reads them: standard error is a terminal and `NO_COLOR`
/// is unset or empty.
fn colour_wanted() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    std::io::stderr().is_terminal() && !no_color
}

/// Prints a startup line (the model summary, the address): plain on standard error in text
/// mode, whatever `RUST_LOG` says, since scripts wait for it; an info event in JSON mode, so
/// every line stays one object.
pub fn announce(format: LogFormat, line: &str) {
    match format {
        LogFormat::Text => eprintln!("{line}"),
        LogFormat::Json => tracing::info!(target: "spindle::startup", "{line}"),
    }
}
