//! `maasctl` as a real process, with a clean environment: `PATH`,
//! `DATABASE_URL`, `MAAS_OPERATOR=night-shift` (the actor the audit-trail
//! tests expect) and what the caller adds; nothing else is inherited from
//! the test runner.

use std::ffi::OsStr;
use std::process::{Command, Output};

/// No extra environment, for the variants that take one.
pub const NO_ENV: &[(&str, &str)] = &[];

/// The command, ready to run or spawn.
pub fn command<V: AsRef<OsStr>>(url: &str, args: &[&str], env: &[(&str, V)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_maasctl"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", url)
        .env("MAAS_OPERATOR", "night-shift");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The command for tokio; killed when dropped.
pub fn tokio_command<V: AsRef<OsStr>>(url: &str, args: &[&str], env: &[(&str, V)]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::from(command(url, args, env));
    cmd.kill_on_drop(true);
    cmd
}

/// Runs maasctl; (exit code or -1, stdout, stderr).
pub fn maasctl(url: &str, args: &[&str]) -> (i32, String, String) {
    maasctl_env(url, args, NO_ENV)
}

/// Runs maasctl with extra environment; (exit code or -1, stdout, stderr).
pub fn maasctl_env<V: AsRef<OsStr>>(url: &str, args: &[&str], env: &[(&str, V)]) -> (i32, String, String) {
    outcome(command(url, args, env).output().unwrap())
}

/// [`maasctl_env`] without blocking the runtime, for tests whose servers
/// (a fake provider, a daemon) run on the same runtime.
pub async fn maasctl_async<V: AsRef<OsStr>>(url: &str, args: &[&str], env: &[(&str, V)]) -> (i32, String, String) {
    outcome(tokio_command(url, args, env).output().await.unwrap())
}

fn outcome(out: Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
