//! The step history (`pipeline_steps`): one row per finished stage attempt,
//! written by [`super::attempts`] (finish, reclaim); read here.

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::db::Error;
use crate::model::{Outcome, StageKind};

super::statements! {
    FOR_REQUEST = "show_steps",
}

super::row_struct! {
    /// One finished stage attempt.
    #[derive(Debug, Clone, Serialize)]
    pub struct Step {
        pub stage: StageKind,
        pub attempt: i32,
        pub worker: String,
        pub started_at: DateTime<Utc>,
        pub finished_at: DateTime<Utc>,
        pub outcome: Outcome,
        pub error_class: Option<String>,
        pub error_message: Option<String>,
        pub model: Option<String>,
        pub prompt_tokens: Option<i32>,
        pub completion_tokens: Option<i32>,
        pub latency_ms: Option<i32>,
    }
}

/// The step history of one request, in order.
pub async fn for_request(client: &impl GenericClient, id: Uuid) -> Result<Vec<Step>, Error> {
    super::query_as(client, FOR_REQUEST, &[&id]).await
}
