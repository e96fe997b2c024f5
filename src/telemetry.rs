//! The one place a tracing subscriber is built: JSON lines under systemd
//! (or with `MAAS_LOG_FORMAT=json`), human-readable otherwise. The filter
//! comes from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("MAAS_LOG_FORMAT").map(|v| v == "json").unwrap_or(false)
        || std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.with_target(false).try_init()
    };
}
