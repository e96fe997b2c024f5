//! `pipeline_runs` rows that wait for a person (WAITING_USER_INPUT,
//! AWAITING_REVIEW): the sweep's expiry of waits whose limit passed.

use uuid::Uuid;

use super::GenericClient;
use crate::db::Error;
use crate::model::Status;

super::statements! {
    EXPIRE = "expire_waits",
}

super::row_struct! {
    /// A wait the sweep ended because its limit passed.
    #[derive(Debug, Clone)]
    pub struct Expired {
        pub id: Uuid,
        /// The waiting status it was in.
        pub was: Status,
        /// NEW (asked again without the reply), COMPLETED (the answer as it
        /// was) or FAILED, as the tenant chose.
        pub new_status: Status,
    }
}

/// Ends up to `limit` waits whose `wait_expires_at` has passed
/// (`sql/queries/expire_waits.sql`): each once, whichever daemon sweeps.
pub async fn expire_waits(client: &impl GenericClient, limit: usize) -> Result<Vec<Expired>, Error> {
    super::query_as(client, EXPIRE, &[&super::as_limit(limit)]).await
}
