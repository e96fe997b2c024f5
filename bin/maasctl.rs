//! maasctl: the operator CLI. See `maas::cli`.

use std::process::ExitCode;

use clap::Parser;
use maas::cli::{Cli, Outcome};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        maas::telemetry::init();
    }
    match maas::cli::run(cli).await {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Finding) => ExitCode::from(1),
        Err(maas::cli::CliError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("maasctl: {}", maas::error::chain(&e));
            ExitCode::from(2)
        }
    }
}
