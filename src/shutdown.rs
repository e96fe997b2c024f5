//! Signals → cancellation. The first SIGTERM or SIGINT starts a graceful
//! stop (stop claiming, let running stages finish within the grace period);
//! a second one ends the process at once (leases then expire and the sweep
//! of another daemon takes the rows back).

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGTERM/SIGINT.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping gracefully"),
            _ = int.recv() => tracing::info!("SIGINT: stopping gracefully"),
        }
        t.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: exiting now");
        std::process::exit(130);
    });
    Ok(token)
}
