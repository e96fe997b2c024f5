//! The `[archivist]` section: when and how the archivist works.
//!
//! Guarantees: the section is plain data with its defaults, and
//! [`ArchivistConfig::problem`] names the key of any invalid value
//! (startup fails on it); a `schedule` that passes is one
//! [`cron_schedule`] accepts. This module imports nothing of the crate, so
//! the archivist depends on the configuration and never the other way.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[archivist]`: when and how the archivist works.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ArchivistConfig {
    /// Run on `schedule` inside `maasd`. Default true. `maasctl archivist
    /// run` works either way.
    pub enabled: bool,
    /// When to run: a 6-field cron expression (seconds first), in UTC.
    /// Default `"0 0 */6 * * *"`: every 6 hours on the hour.
    pub schedule: String,
    /// N: a user with at least this many pending logs is archived. Default 20.
    pub min_pending: u64,
    /// T: a user whose oldest pending log is this old is archived however
    /// few logs are pending. Default 86400 (one day).
    pub max_pending_age_secs: u64,
    /// A: only users with a log within this many seconds are selected.
    /// Default 2592000 (30 days).
    pub active_within_secs: u64,
    /// A user is not selected again within this many seconds of being
    /// archived. Default 3600.
    pub cooldown_secs: u64,
    /// Token budget of the messages of one archivist call (counted with the
    /// archivist model's tokenizer, or a conservative estimate); a longer
    /// thread is split into chunks, one LSM record each. Default 6000.
    pub chunk_tokens: usize,
    /// Most logs of one user read, summarised and committed together; the
    /// unit of progress a crash can lose. Default 200.
    pub batch_logs: usize,
    /// Users archived at once by one run. Default 4.
    pub concurrency: usize,
    /// Lease on a user while a runner works on it; renewed every third.
    /// Default 60.
    pub lease_secs: u64,
    /// Candidates read per selection query. Default 256.
    pub page_users: usize,
    /// How often (seconds) `maasd` looks for users never archived who have
    /// `min_pending` logs pending, and archives them at once rather than at
    /// the next `schedule` tick. Default 60; 0 turns it off.
    pub first_run_poll_secs: u64,
}

impl Default for ArchivistConfig {
    fn default() -> Self {
        ArchivistConfig {
            enabled: true,
            schedule: "0 0 */6 * * *".into(),
            min_pending: 20,
            max_pending_age_secs: 86_400,
            active_within_secs: 30 * 86_400,
            cooldown_secs: 3600,
            chunk_tokens: 6000,
            batch_logs: 200,
            concurrency: 4,
            lease_secs: 60,
            page_users: 256,
            first_run_poll_secs: 60,
        }
    }
}

impl ArchivistConfig {
    /// The problem with a value, named by key.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        for (key, v) in [
            ("archivist.chunk_tokens", self.chunk_tokens),
            ("archivist.batch_logs", self.batch_logs),
            ("archivist.concurrency", self.concurrency),
            ("archivist.page_users", self.page_users),
        ] {
            if v == 0 {
                return Some((key, "must be at least 1".into()));
            }
        }
        if self.lease_secs < 3 {
            return Some(("archivist.lease_secs", "must be at least 3".into()));
        }
        if self.chunk_tokens < 64 {
            return Some(("archivist.chunk_tokens", "must be at least 64".into()));
        }
        if let Err(e) = cron_schedule(&self.schedule) {
            return Some(("archivist.schedule", e));
        }
        None
    }

    /// The lease a runner holds on a user while it works on it.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_secs)
    }
}

/// Parses a 6-field cron expression (seconds first), as tokio-cron-scheduler
/// does.
pub fn cron_schedule(expr: &str) -> Result<croner::Cron, String> {
    let fields = expr.split_whitespace().count();
    if fields != 6 {
        return Err(format!(
            "{expr:?} has {fields} fields; expected 6 (sec min hour day-of-month month day-of-week), in UTC"
        ));
    }
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .dom_and_dow(true)
        .build()
        .parse(expr)
        .map_err(|e| format!("{expr:?} is not a cron expression: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_is_valid() {
        assert_eq!(ArchivistConfig::default().problem(), None);
        let bad = ArchivistConfig {
            schedule: "0 */6 * * *".into(),
            ..ArchivistConfig::default()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("archivist.schedule"));
    }
}
