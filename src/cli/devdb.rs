//! `maasctl dev-db ...`: the private PostgreSQL cluster that `bin/run`,
//! `bin/test` and the benchmarks use. Not for production.

use std::path::PathBuf;

use clap::Subcommand;

use super::{CliError, Outcome};
use crate::db::devdb::{Cluster, ClusterSpec, ensure_database};

#[derive(Subcommand, Debug)]
pub enum DevDbCommand {
    /// Create (if needed) and start the cluster, create the database, and
    /// print its connection string.
    Start {
        #[arg(long)]
        dir: PathBuf,
        /// Database to create.
        #[arg(long, default_value = "maas")]
        db: String,
        /// Port (default: a free one, chosen at creation and kept).
        #[arg(long)]
        port: Option<u16>,
        /// Turn fsync and synchronous_commit off (tests only).
        #[arg(long)]
        fast: bool,
        #[arg(long, default_value_t = 200)]
        max_connections: u32,
    },
    /// Stop the cluster.
    Stop {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Stop the cluster and delete its data.
    Destroy {
        #[arg(long)]
        dir: PathBuf,
    },
}

pub async fn run(cmd: DevDbCommand) -> Result<Outcome, CliError> {
    match cmd {
        DevDbCommand::Start {
            dir,
            db,
            port,
            fast,
            max_connections,
        } => {
            let spec = ClusterSpec {
                dir,
                port,
                durable: !fast,
                max_connections,
            };
            let cluster = tokio::task::spawn_blocking(move || Cluster::ensure(&spec))
                .await
                .map_err(|e| CliError::Usage(format!("dev-db start: {e}")))??;
            ensure_database(&cluster.url("postgres"), &db).await?;
            println!("{}", cluster.url(&db));
            Ok(Outcome::Ok)
        }
        DevDbCommand::Stop { dir } => {
            let spec = ClusterSpec::new(dir);
            if let Some(cluster) = existing(&spec)? {
                cluster.stop(false)?;
            }
            Ok(Outcome::Ok)
        }
        DevDbCommand::Destroy { dir } => {
            let spec = ClusterSpec::new(dir);
            if let Some(cluster) = existing(&spec)? {
                cluster.destroy()?;
            }
            Ok(Outcome::Ok)
        }
    }
}

fn existing(spec: &ClusterSpec) -> Result<Option<Cluster>, CliError> {
    Ok(Cluster::open(spec)?)
}
