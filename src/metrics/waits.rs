//! The series of waits for a person (`WAITING_USER_INPUT`: a reply;
//! `AWAITING_REVIEW`: a review), labelled by `kind` (`reply`, `review`):
//!
//! - `maas_requests_waiting{kind}` and `maas_requests_wait_overdue{kind}`
//!   (database-wide, from the partial index of waiting rows on the metrics
//!   refresh): how many wait, and how many have passed their limit without
//!   the sweep ending them (the alert `MaasReviewOverdue`);
//! - `maas_wait_seconds{kind, outcome}`: how long a wait lasted, recorded
//!   where it ends (a review: its action);
//! - `maas_wait_expiries_total{kind, status}`: waits the sweep ended on
//!   their limit, by the status they went to.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use super::Kind;
use crate::model::Status;

/// Buckets of `maas_wait_seconds`: a second to a week (a person answers
/// in minutes to days).
pub(super) const WAIT_BUCKETS: &[f64] = &[
    1.0,
    10.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    4.0 * 3600.0,
    12.0 * 3600.0,
    86400.0,
    3.0 * 86400.0,
    7.0 * 86400.0,
];

pub(super) const DESCRIPTIONS: &[(Kind, &str, &str)] = &[
    (
        Kind::Gauge,
        "maas_requests_waiting",
        "Requests waiting for a person by kind (reply, review) (database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_requests_wait_overdue",
        "Waiting requests past their limit that no sweep has ended, by kind (database-wide)",
    ),
    (
        Kind::Seconds,
        "maas_wait_seconds",
        "How long a wait for a person lasted, by kind and how it ended",
    ),
    (
        Kind::Counter,
        "maas_wait_expiries_total",
        "Waits the sweep ended on their limit, by kind and the status they went to",
    ),
];

/// The `kind` label of a waiting status; `None` for any other status.
pub fn wait_kind(status: Status) -> Option<&'static str> {
    match status {
        Status::WaitingUserInput => Some("reply"),
        Status::AwaitingReview => Some("review"),
        _ => None,
    }
}

/// Makes the wait gauges visible (at zero) before anything waits.
pub(super) fn register() {
    for kind in ["reply", "review"] {
        gauge!("maas_requests_waiting", "kind" => kind).set(0.0);
        gauge!("maas_requests_wait_overdue", "kind" => kind).set(0.0);
    }
}

/// Sets the wait gauges from (waiting status, count, past its limit) rows;
/// a status absent from the rows waits for nobody.
pub fn observe_waiting(rows: &[(Status, i64, i64)]) {
    for status in [Status::WaitingUserInput, Status::AwaitingReview] {
        let Some(kind) = wait_kind(status) else { continue };
        let (n, overdue) = rows
            .iter()
            .find(|(s, _, _)| *s == status)
            .map_or((0, 0), |(_, n, o)| (*n, *o));
        gauge!("maas_requests_waiting", "kind" => kind).set(super::oncall::float(n));
        gauge!("maas_requests_wait_overdue", "kind" => kind).set(super::oncall::float(overdue));
    }
}

/// Records a review applied after the answer waited `waited`.
pub fn observe_review(action: &'static str, waited: Duration) {
    histogram!("maas_wait_seconds", "kind" => "review", "outcome" => action).record(waited.as_secs_f64());
}

/// Counts a wait the sweep ended: it was in `was`, it went to `now`.
pub fn observe_expiry(was: Status, now: Status) {
    if let Some(kind) = wait_kind(was) {
        counter!("maas_wait_expiries_total", "kind" => kind, "status" => now.as_str()).increment(1);
    }
}
