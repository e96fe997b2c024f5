//! The process and its host: the open-file limit `maasd` and the
//! benchmarks raise at start-up, the worker id a process claims under, and
//! how CPU-bound work runs beside the runtime's tasks.

use nix::sys::resource::{Resource, getrlimit, rlim_t, setrlimit};

/// The soft open-file limit could not be raised to the hard one.
#[derive(Debug, thiserror::Error)]
#[error("cannot raise the open-file limit (RLIMIT_NOFILE) from {soft} to {hard}: {source}")]
pub struct FdLimitError {
    pub soft: rlim_t,
    pub hard: rlim_t,
    #[source]
    pub source: nix::Error,
}

/// Lifts the soft limit on open files to the hard one: many concurrent
/// provider calls and connections need many sockets. Nothing is changed
/// when the soft limit already equals the hard one, or when the limits
/// cannot be read (the process then runs with what it has).
pub fn raise_fd_limit() -> Result<(), FdLimitError> {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return Ok(());
    };
    if soft >= hard {
        return Ok(());
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|source| FdLimitError { soft, hard, source })
}

/// A name for this process in leases and step history: host, pid and a
/// random suffix, so a restarted process never reuses an old identity.
pub fn worker_id() -> String {
    // gethostname(2), not /proc/sys: systemd's ProcSubset=pid hides the latter.
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let suffix: u32 = rand::random();
    format!("{host}:{}:{:08x}", std::process::id(), suffix)
}

/// Runs CPU-bound `f` (counting the tokens of long texts, say) without
/// holding up the runtime's other tasks: on a multi-threaded runtime, as
/// `maasd`'s, this worker first hands its queued tasks (a heartbeat that
/// renews leases, a stage's timers) to another thread. On a current-thread
/// runtime (`maasctl`) or outside one, `f` just runs.
pub fn cpu_bound<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_ends_at_the_hard_one() -> Result<(), Box<dyn std::error::Error>> {
        raise_fd_limit()?;
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        assert_eq!(soft, hard);
        // A second call has nothing left to do.
        raise_fd_limit()?;
        Ok(())
    }
}
