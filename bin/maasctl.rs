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
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                let s_text = s.to_string();
                if !msg.contains(&s_text) {
                    msg.push_str(": ");
                    msg.push_str(&s_text);
                }
                source = s.source();
            }
            eprintln!("maasctl: {msg}");
            ExitCode::from(2)
        }
    }
}
