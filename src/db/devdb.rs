//! A private PostgreSQL cluster for `bin/run`, the tests and the benchmarks,
//! made from the system's server binaries.
//!
//! - The binaries come from `pg_config --bindir`, else the newest
//!   `/usr/lib/postgresql/*/bin` (Debian keeps them off `PATH`).
//! - initdb refuses to run as root: as root, the cluster belongs to the
//!   `postgres` user and lives under the temporary directory (a project
//!   checked out under a private home may not be reachable by that user);
//!   the requested directory then holds a `DATA_DIR` file naming it.
//! - It listens on 127.0.0.1 only, with `trust` authentication for the
//!   superuser `postgres`, and no Unix socket (socket paths are short).

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::unistd::{Gid, Uid, User};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum DevDbError {
    #[error(
        "PostgreSQL server binaries not found (no pg_config, nothing under /usr/lib/postgresql); install them, e.g. `apt-get install postgresql`"
    )]
    NoBinaries,
    #[error("running as root but there is no `postgres` user to own the cluster (initdb refuses root)")]
    NoPostgresUser,
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DevDbError {
    let what = what.into();
    move |source| DevDbError::Io { what, source }
}

/// How to make a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Where the cluster belongs (its data directory, or the place of the
    /// `DATA_DIR` pointer when running as root).
    pub dir: PathBuf,
    /// Port; by default a free one is chosen at creation and kept.
    pub port: Option<u16>,
    /// fsync and synchronous_commit on (benchmarks). Off makes tests faster;
    /// a crash of PostgreSQL alone still loses nothing, only an OS crash would.
    pub durable: bool,
    pub max_connections: u32,
}

impl ClusterSpec {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ClusterSpec {
            dir: dir.into(),
            port: None,
            durable: true,
            max_connections: 200,
        }
    }
}

/// A private cluster on this machine.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub data_dir: PathBuf,
    pub port: u16,
    bindir: PathBuf,
    owner: Option<(Uid, Gid)>,
}

impl Cluster {
    /// Creates the cluster if needed and starts it if it is not running.
    pub fn ensure(spec: &ClusterSpec) -> Result<Cluster, DevDbError> {
        fs::create_dir_all(&spec.dir).map_err(io(format!("create {}", spec.dir.display())))?;
        let mut cluster = Self::locate(spec)?;
        if cluster.owner.is_some() {
            fs::write(spec.dir.join("DATA_DIR"), format!("{}\n", cluster.data_dir.display()))
                .map_err(io("write DATA_DIR pointer"))?;
        }
        if !cluster.data_dir.join("PG_VERSION").exists() {
            cluster.init(spec)?;
        }
        cluster.port = cluster.read_port()?;
        if !cluster.is_running() {
            cluster.start()?;
        }
        Ok(cluster)
    }

    /// The cluster made for `spec` earlier, if there is one (running or not).
    pub fn open(spec: &ClusterSpec) -> Result<Option<Cluster>, DevDbError> {
        if !spec.dir.exists() {
            return Ok(None);
        }
        let mut cluster = Self::locate(spec)?;
        if !cluster.data_dir.join("PG_VERSION").exists() {
            return Ok(None);
        }
        cluster.port = cluster.read_port()?;
        Ok(Some(cluster))
    }

    fn locate(spec: &ClusterSpec) -> Result<Cluster, DevDbError> {
        let bindir = find_bindir()?;
        let owner = if Uid::effective().is_root() {
            let user = User::from_name("postgres")
                .ok()
                .flatten()
                .ok_or(DevDbError::NoPostgresUser)?;
            Some((user.uid, user.gid))
        } else {
            None
        };
        let data_dir = match owner {
            None => spec.dir.join("data"),
            Some(_) => {
                let canonical = fs::canonicalize(&spec.dir).map_err(io(format!("resolve {}", spec.dir.display())))?;
                let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
                let tag: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
                std::env::temp_dir().join(format!("maas-pg-{tag}")).join("data")
            }
        };
        Ok(Cluster {
            data_dir,
            port: 0,
            bindir,
            owner,
        })
    }

    /// A connection string for database `db` as the superuser.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn log_file(&self) -> PathBuf {
        self.data_dir.join("maas-server.log")
    }

    fn init(&self, spec: &ClusterSpec) -> Result<(), DevDbError> {
        let parent = self.data_dir.parent().unwrap_or(Path::new("/"));
        fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        if self.data_dir.exists() {
            // A half-made directory from an interrupted init.
            fs::remove_dir_all(&self.data_dir).map_err(io("remove a half-initialised data directory"))?;
        }
        fs::create_dir_all(&self.data_dir).map_err(io(format!("create {}", self.data_dir.display())))?;
        if let Some((uid, gid)) = self.owner {
            nix::unistd::chown(parent, Some(uid), Some(gid))
                .and_then(|_| nix::unistd::chown(&self.data_dir, Some(uid), Some(gid)))
                .map_err(|e| DevDbError::Io {
                    what: "hand the data directory to the postgres user".into(),
                    source: e.into(),
                })?;
        }
        self.run(
            "initdb",
            &[
                "-D",
                &self.data_dir.to_string_lossy(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
        )?;
        let port = match spec.port {
            Some(p) => p,
            None => free_port()?,
        };
        let durable = if spec.durable { "on" } else { "off" };
        let settings = format!(
            "\n# maas private cluster\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = ''\n\
             max_connections = {}\nshared_buffers = 256MB\nfsync = {durable}\nsynchronous_commit = {durable}\n\
             full_page_writes = {durable}\nmax_wal_size = 2GB\nlog_min_messages = warning\nlog_min_error_statement = panic\n",
            spec.max_connections
        );
        let conf = self.data_dir.join("postgresql.conf");
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(io(format!("open {}", conf.display())))?;
        f.write_all(settings.as_bytes())
            .map_err(io(format!("write {}", conf.display())))?;
        Ok(())
    }

    fn read_port(&self) -> Result<u16, DevDbError> {
        let conf = self.data_dir.join("postgresql.conf");
        let text = fs::read_to_string(&conf).map_err(io(format!("read {}", conf.display())))?;
        text.lines()
            .rev()
            .filter_map(|l| l.trim().strip_prefix("port = "))
            .find_map(|v| v.trim().parse().ok())
            .ok_or_else(|| DevDbError::Io {
                what: format!("{} names no port", conf.display()),
                source: std::io::ErrorKind::InvalidData.into(),
            })
    }

    pub fn is_running(&self) -> bool {
        self.command("pg_ctl")
            .args(["-D", &self.data_dir.to_string_lossy(), "status"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    pub fn start(&self) -> Result<(), DevDbError> {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data_dir.to_string_lossy(),
                "-l",
                &self.log_file().to_string_lossy(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .map(drop)
    }

    /// Stops the server; `immediate` is a crash-like stop.
    pub fn stop(&self, immediate: bool) -> Result<(), DevDbError> {
        if !self.is_running() {
            return Ok(());
        }
        let mode = if immediate { "immediate" } else { "fast" };
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data_dir.to_string_lossy(),
                "-m",
                mode,
                "-w",
                "-t",
                "60",
                "stop",
            ],
        )
        .map(drop)
    }

    pub fn restart(&self, immediate: bool) -> Result<(), DevDbError> {
        self.stop(immediate)?;
        self.start()
    }

    /// Stops the server and removes its data directory.
    pub fn destroy(&self) -> Result<(), DevDbError> {
        self.stop(true)?;
        fs::remove_dir_all(&self.data_dir).map_err(io(format!("remove {}", self.data_dir.display())))
    }

    /// Turns TLS on (`ssl = on`) with a server certificate and key (PEM),
    /// from the next start (`restart` a running server). With `client_cert` = (CA PEM, role),
    /// client certificates from that CA are trusted and `role` logs in
    /// only with one (`hostssl … cert`); other roles keep `trust`.
    pub fn enable_tls(
        &self,
        cert_pem: &str,
        key_pem: &str,
        client_cert: Option<(&str, &str)>,
    ) -> Result<(), DevDbError> {
        use std::os::unix::fs::PermissionsExt;
        let mut files = vec![("server.crt", cert_pem, 0o644), ("server.key", key_pem, 0o600)];
        let mut settings =
            "\n# maas TLS\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n".to_owned();
        if let Some((ca_pem, role)) = client_cert {
            files.push(("client-ca.crt", ca_pem, 0o644));
            settings.push_str("ssl_ca_file = 'client-ca.crt'\n");
            let hba = self.data_dir.join("pg_hba.conf");
            let old = fs::read_to_string(&hba).map_err(io(format!("read {}", hba.display())))?;
            let line = format!("hostssl all {role} 127.0.0.1/32 cert\n");
            if !old.contains(&line) {
                fs::write(&hba, format!("{line}{old}")).map_err(io(format!("write {}", hba.display())))?;
            }
        }
        for (name, pem, mode) in files {
            let path = self.data_dir.join(name);
            fs::write(&path, pem).map_err(io(format!("write {}", path.display())))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(io(format!("chmod {}", path.display())))?;
            if let Some((uid, gid)) = self.owner {
                nix::unistd::chown(&path, Some(uid), Some(gid)).map_err(|e| DevDbError::Io {
                    what: format!("hand {} to the postgres user", path.display()),
                    source: e.into(),
                })?;
            }
        }
        let conf = self.data_dir.join("postgresql.conf");
        let text = fs::read_to_string(&conf).map_err(io(format!("read {}", conf.display())))?;
        if !text.contains(&settings) {
            fs::write(&conf, format!("{text}{settings}")).map_err(io(format!("write {}", conf.display())))?;
        }
        Ok(())
    }

    /// Path of one of the server's binaries (pgbench, psql, ...).
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }

    fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(name));
        cmd.current_dir("/").env("LC_ALL", "C");
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd
    }

    fn run(&self, name: &str, args: &[&str]) -> Result<Output, DevDbError> {
        let out = self
            .command(name)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(io(format!("run {name}")))?;
        if out.status.success() {
            Ok(out)
        } else {
            let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            if name == "pg_ctl"
                && let Ok(log) = fs::read_to_string(self.log_file())
            {
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                stderr.push_str("\nserver log: ");
                stderr.push_str(&tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            }
            Err(DevDbError::Command {
                command: format!("{name} {}", args.join(" ")),
                status: out.status.to_string(),
                stderr,
            })
        }
    }
}

fn find_bindir() -> Result<PathBuf, DevDbError> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() && dir.join("postgres").exists() {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b).ok_or(DevDbError::NoBinaries)
}

fn free_port() -> Result<u16, DevDbError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("find a free port"))?;
    l.local_addr().map(|a| a.port()).map_err(io("find a free port"))
}

/// Creates database `name` on the cluster at `admin_url` if it does not exist.
pub async fn ensure_database(admin_url: &str, name: &str) -> Result<(), super::Error> {
    let (client, conn) = admin_url
        .parse::<tokio_postgres::Config>()?
        .connect(tokio_postgres::NoTls)
        .await?;
    let driver = tokio::spawn(conn);
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if !exists {
        let sql = format!("CREATE DATABASE {}", quote_ident(name));
        if let Err(e) = client.batch_execute(&sql).await {
            // Another process may have created it in the meantime.
            if e.code() != Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) {
                return Err(e.into());
            }
        }
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}

/// Quotes an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
