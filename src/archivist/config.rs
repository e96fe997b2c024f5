//! What the archivist makes of its configuration section: the selection
//! thresholds of [`crate::repo::archive`].
//!
//! Guarantees: the section itself ([`ArchivistConfig`]) lives with the other
//! configuration types in `crate::config` and imports nothing of the
//! archivist; this module adds only conversions, so the dependency runs one
//! way (archivist → config).

use std::time::Duration;

use crate::config::ArchivistConfig;
use crate::repo::archive::Thresholds;

impl ArchivistConfig {
    /// Who is a candidate: N, T, A and the cooldown as [`Thresholds`].
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            min_pending: self.min_pending,
            max_pending_age: Duration::from_secs(self.max_pending_age_secs),
            active_within: Duration::from_secs(self.active_within_secs),
            cooldown: Duration::from_secs(self.cooldown_secs),
        }
    }
}
