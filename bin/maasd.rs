//! maasd: the orchestrator daemon. See `maas::daemon`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// The daemon's allocator (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs requests in `pipeline_runs` through analyzer → assembler → responder.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// TOML configuration file (environment variables override it).
    #[arg(long, env = "MAAS_CONFIG")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    maas::telemetry::init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "maasd stopped");
            eprintln!("maasd: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    if let Err(e) = maas::sys::raise_fd_limit() {
        tracing::warn!(error = %e.source, soft = e.soft, hard = e.hard, "cannot raise the open-file limit");
    }
    let cfg = maas::config::Config::load(args.config.as_deref())?;
    let shutdown = maas::shutdown::on_signals()?;
    let (sd_cfg, sd_shutdown) = (std::sync::Arc::new(cfg.clone()), shutdown.clone());
    maas::daemon::run(cfg, shutdown, move |engine| {
        tracing::info!(
            worker = engine.worker(),
            lease_secs = sd_cfg.lease_secs,
            sweep_secs = sd_cfg.sweep_secs,
            "maasd ready"
        );
        // READY=1 once listening, then the watchdog (a no-op outside systemd).
        maas::systemd::spawn(engine.clone(), sd_cfg, sd_shutdown);
    })
    .await?;
    Ok(())
}
