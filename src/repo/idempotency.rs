//! Idempotency keys (`http_idempotency_keys`): a request submitted under a
//! key is inserted with the key in one statement, so a key names at most
//! one request while it is fresh.

use std::time::Duration;

use super::GenericClient;
use serde_json::Value;
use uuid::Uuid;

use super::requests::NewRequest;
use super::secs;
use crate::db::Error;

super::statements! {
    SUBMIT = "submit_idempotent",
    FIND = "find_idempotent",
    EXPIRE = "expire_idempotency_keys",
}

super::statement_params! {
    /// The inputs of `submit_idempotent.sql`, `$1` to `$12` in field order.
    struct SubmitParams<'a> {
        user_id: Uuid,
        thread_id: Option<Uuid>,
        query: &'a str,
        key: &'a str,
        fingerprint: &'a str,
        ttl_secs: f64,
        callback_url: Option<&'a str>,
        debug: bool,
        tenant_id: Uuid,
        metadata: Option<&'a Value>,
        stream: bool,
        clarify: Option<bool>,
        review: bool,
    }
}

/// Inserts a request under an idempotency key. `None` when the key is
/// already taken (and fresh): read its first request with [`find`].
pub async fn submit(
    client: &impl GenericClient,
    req: &NewRequest<'_>,
    key: &str,
    fingerprint: &str,
    ttl: Duration,
) -> Result<Option<Uuid>, Error> {
    let params = SubmitParams {
        user_id: req.user_id,
        thread_id: req.thread_id,
        query: req.query,
        key,
        fingerprint,
        ttl_secs: secs(ttl),
        callback_url: req.callback_url,
        debug: req.debug,
        tenant_id: req.tenant_id,
        metadata: req.metadata,
        stream: req.stream,
        clarify: req.clarify,
        review: req.review,
    };
    super::query_opt_value(client, SUBMIT, &params.params(), "id").await
}

super::row_struct! {
    /// The first request of a key.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Keyed {
        pub request_id: Uuid,
        /// What the first submission carried (see `http::api`).
        pub fingerprint: String,
    }
}

/// The first request of a key of tenant `tenant`'s user `user_id`, and its
/// fingerprint.
pub async fn find(client: &impl GenericClient, user_id: Uuid, key: &str, tenant: Uuid) -> Result<Option<Keyed>, Error> {
    super::query_opt_as(client, FIND, &[&user_id, &key, &tenant]).await
}

/// Deletes up to `limit` keys older than `ttl`; returns how many.
pub async fn expire(client: &impl GenericClient, ttl: Duration, limit: i64) -> Result<u64, Error> {
    super::execute(client, EXPIRE, &[&secs(ttl), &limit]).await
}

#[cfg(test)]
mod tests {
    use super::super::params_check::check;
    use super::*;

    #[test]
    fn submit_params_are_in_the_order_the_sql_documents() {
        check(SUBMIT, SubmitParams::NAMES);
    }
}
