//! Real `maasd` processes for tests about processes.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub struct Maasd {
    child: Option<Child>,
    pub log: PathBuf,
}

/// Settings for a test daemon; every field becomes an environment variable.
pub struct Opts {
    pub lease_secs: u64,
    pub sweep_secs: u64,
    pub extra: Vec<(String, String)>,
    /// No `RUST_LOG`: the daemon logs with its own default filter, as
    /// `bin/run` starts it (otherwise `RUST_LOG` is `info`, or
    /// `MAAS_TEST_DAEMON_LOG`).
    pub default_log: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            lease_secs: 30,
            sweep_secs: 5,
            extra: Vec::new(),
            default_log: false,
        }
    }
}

impl Opts {
    pub fn env(mut self, k: &str, v: impl ToString) -> Self {
        self.extra.push((k.to_owned(), v.to_string()));
        self
    }

    /// Logs with the daemon's default filter ([`Opts::default_log`]).
    pub fn default_log(mut self) -> Self {
        self.default_log = true;
        self
    }
}

impl Maasd {
    pub fn spawn(database_url: &str, opts: Opts) -> Maasd {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("maasd-logs");
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join(format!("maasd-{}.log", uuid::Uuid::new_v4().simple()));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_maasd"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", database_url)
            .env("MAAS_LEASE_SECS", opts.lease_secs.to_string())
            .env("MAAS_SWEEP_SECS", opts.sweep_secs.to_string())
            .env("MAAS_HTTP_ADDR", "127.0.0.1:0")
            .env("MAAS_RETRY_BASE_MS", "50")
            .env("MAAS_LISTENER__HEALTH_SECS", "1")
            .env("MAAS_LISTENER__HEALTH_TIMEOUT_SECS", "2")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        if !opts.default_log {
            cmd.env(
                "RUST_LOG",
                std::env::var("MAAS_TEST_DAEMON_LOG").unwrap_or_else(|_| "info".into()),
            );
        }
        for (k, v) in &opts.extra {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        Maasd {
            child: Some(child),
            log,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.as_ref().unwrap().id()).unwrap())
    }

    pub fn signal(&self, sig: Signal) {
        kill(self.pid(), sig).unwrap();
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// Waits for exit (deadline), returning the exit code.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait().unwrap()
            {
                self.child = None;
                return status.code();
            }
            if tokio::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log without terminal colour codes.
    pub fn plain_log(&self) -> String {
        strip_ansi(&self.log_text())
    }

    /// The address the HTTP server bound, read from the daemon's log line
    /// `http: listening addr=...` (waits for it, with a deadline).
    pub async fn http_addr(&mut self, within: Duration) -> std::net::SocketAddr {
        self.wait_http_addr(within).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Maasd::http_addr`], or what went wrong (with the log) when the
    /// daemon exits or does not listen within `within`.
    pub async fn wait_http_addr(&mut self, within: Duration) -> Result<std::net::SocketAddr, String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let log = self.plain_log();
            if let Some(line) = log.lines().find(|l| l.contains("http: listening")) {
                // A JSON line (MAAS_LOG_FORMAT=json) names it as a field.
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(line)
                    && let Some(addr) = v["addr"].as_str()
                {
                    return addr.parse().map_err(|e| format!("{addr:?}: {e}"));
                }
                let addr = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("addr="))
                    .ok_or_else(|| format!("no addr= in {line:?}"))?;
                return addr.parse().map_err(|e| format!("{addr:?}: {e}"));
            }
            if !self.is_running() {
                return Err(format!("maasd exited before listening:\n{log}"));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("maasd did not listen within {within:?}:\n{log}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Removes ANSI escape sequences (the log's colours and italics).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Drop for Maasd {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = kill(Pid::from_raw(i32::try_from(c.id()).unwrap_or(0)), Signal::SIGCONT);
        }
        self.kill();
    }
}
