//! Structured logging with tracing.

use tracing_subscriber::{EnvFilter, fmt};

use crate::config::LogFormat;

/// Installs the global tracing subscriber; an invalid filter falls back to `info`
/// with a warning rather than silencing logs.
pub fn init(filter: &str, format: LogFormat) {
    let (env_filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let builder = fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if let Some(e) = bad {
        tracing::warn!(filter, error = %e, "invalid log filter; using `info`");
    }
}
