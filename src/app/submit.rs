//! Making a request: the one submission of every door (`POST /api/query`,
//! MCP `ask`, the coming endpoints). The tenant's limits are checked and
//! the request inserted in one transaction ([`super::limits`]); under an
//! idempotency key a retry with the same fields gets the first request,
//! and the same key with different fields is refused
//! (`idempotency_key_reused`). A request for a forgotten user is refused
//! (`user_forgotten`).

use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::caller::Principal;
use super::error::{AppError, Code, Kind};
use super::{App, limits};
use crate::repo::GenericClient;
use crate::repo::idempotency;
use crate::repo::requests::{self as q, NewRequest};
use crate::repo::users::UserKey;

/// Longest idempotency key.
pub const MAX_KEY_LEN: usize = 255;

/// Submits `req` for caller `who`: checks the tenant's limits and inserts
/// (under the idempotency key, when given: a retry within
/// `http.idempotency_ttl` gets the first request) in one transaction; its id, and
/// whether it was an earlier request's replay. The one submission of
/// `POST /api/query` and of the MCP tool `ask` (and of every door that
/// makes a request).
pub async fn enqueue(
    app: &App,
    who: &Principal,
    req: &NewRequest<'_>,
    key: Option<&str>,
) -> Result<(Uuid, bool), AppError> {
    let mut client = app.pool.get().await?;
    if !who.limited {
        return insert(app, &client, req, key).await;
    }
    // Counted and inserted under the tenant's row lock (limits).
    let tx = client.transaction().await.map_err(crate::db::Error::from)?;
    limits::check_limits(&tx, who, limits::Usage::Request).await?;
    let done = insert(app, &tx, req, key).await?;
    tx.commit().await.map_err(crate::db::Error::from)?;
    Ok(done)
}

/// Submits `req` as [`enqueue`] does, with the earlier turns of its
/// conversation (`(message_type, content)`, in order) that its thread does
/// not hold yet, logged in the same transaction (none for a replay): the
/// submission of a client that sends its history with each question (the
/// OpenAI-compatible endpoint). `user` is `req`'s user as stored.
pub async fn enqueue_conversation(
    app: &App,
    who: &Principal,
    req: &NewRequest<'_>,
    key: Option<&str>,
    user: UserKey,
    earlier: &[(&str, &str)],
) -> Result<(Uuid, bool), AppError> {
    let Some(thread) = req.thread_id.filter(|_| !earlier.is_empty()) else {
        return enqueue(app, who, req, key).await;
    };
    let mut client = app.pool.get().await?;
    let tx = client.transaction().await.map_err(crate::db::Error::from)?;
    if who.limited {
        limits::check_limits(&tx, who, limits::Usage::Request).await?;
    }
    let (id, replayed) = insert(app, &tx, req, key).await?;
    if !replayed {
        let logged = crate::repo::users::log_conversation(&tx, user, thread, earlier)
            .await
            .map_err(refused)?;
        tracing::debug!(request.id = %id, logged, "app: earlier turns of the conversation logged");
    }
    tx.commit().await.map_err(crate::db::Error::from)?;
    Ok((id, replayed))
}

/// Inserts `req` (under the idempotency key, when given): its id, and
/// whether it was an earlier request's replay.
async fn insert(
    app: &App,
    client: &impl GenericClient,
    req: &NewRequest<'_>,
    key: Option<&str>,
) -> Result<(Uuid, bool), AppError> {
    let Some(key) = key else {
        return Ok((q::submit_request(client, req).await.map_err(refused)?, false));
    };
    let fp = fingerprint(req);
    let ttl = app.cfg.http.idempotency_ttl();
    // A second round only if the key expired and was deleted between the
    // two statements.
    for _ in 0..3 {
        if let Some(id) = idempotency::submit(client, req, key, &fp, ttl).await.map_err(refused)? {
            return Ok((id, false));
        }
        match idempotency::find(client, req.user_id, key, req.tenant_id).await? {
            Some(k) if k.fingerprint == fp => return Ok((k.request_id, true)),
            Some(_) => {
                return Err(AppError::unprocessable(
                    Code::IdempotencyKeyReused,
                    "this Idempotency-Key was used for a different request",
                ));
            }
            None => continue,
        }
    }
    Err(AppError::unavailable(Code::IdempotencyConflict, "try again"))
}

/// A request for a forgotten user is refused (`Gone`); other errors as usual.
fn refused(e: crate::db::Error) -> AppError {
    if crate::users::is_refusal(&e) {
        AppError::new(
            Kind::Gone,
            Code::UserForgotten,
            "this user was forgotten; requests for it are refused",
        )
    } else {
        e.into()
    }
}

/// What tells a retry from a different request under the same key (the
/// user is part of the key itself).
fn fingerprint(req: &NewRequest<'_>) -> String {
    let mut h = Sha256::new();
    h.update(req.thread_id.map(|t| t.to_string()).unwrap_or_default());
    h.update([0u8]);
    h.update(req.query.as_bytes());
    h.update([0u8]);
    h.update(req.callback_url.unwrap_or_default().as_bytes());
    h.update([0u8, u8::from(req.debug)]);
    // Only when given, so a key's fingerprint from before `metadata` holds.
    if let Some(m) = req.metadata {
        h.update([0u8]);
        h.update(m.to_string().as_bytes());
    }
    // Likewise only when asked for.
    if req.stream {
        h.update(b"\0stream");
    }
    if let Some(c) = req.clarify {
        h.update([0u8, b'c', u8::from(c)]);
    }
    if req.review {
        h.update(b"\0review");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_tells_requests_apart() {
        let t = Uuid::new_v4();
        let a = NewRequest {
            user_id: Uuid::nil(),
            thread_id: None,
            query: "q",
            callback_url: None,
            debug: false,
            tenant_id: Uuid::nil(),
            metadata: None,
            stream: false,
            clarify: None,
            review: false,
        };
        let b = NewRequest {
            thread_id: Some(t),
            ..a.clone()
        };
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_ne!(
            fingerprint(&a),
            fingerprint(&NewRequest {
                query: "q2",
                ..a.clone()
            })
        );
        assert_ne!(
            fingerprint(&a),
            fingerprint(&NewRequest {
                debug: true,
                ..a.clone()
            })
        );
        assert_ne!(
            fingerprint(&a),
            fingerprint(&NewRequest {
                callback_url: Some("https://x.example/h"),
                ..a.clone()
            })
        );
        let m = serde_json::json!({"order": 7});
        assert_ne!(
            fingerprint(&a),
            fingerprint(&NewRequest {
                metadata: Some(&m),
                ..a.clone()
            })
        );
        assert_ne!(
            fingerprint(&a),
            fingerprint(&NewRequest {
                stream: true,
                ..a.clone()
            })
        );
        assert_ne!(
            fingerprint(&a),
            fingerprint(&NewRequest {
                clarify: Some(true),
                ..a.clone()
            })
        );
        assert_ne!(
            fingerprint(&a),
            fingerprint(&NewRequest {
                review: true,
                ..a.clone()
            })
        );
    }
}
