//! Asking the user through the client: when the wait of `ask` (or of
//! `reply`) ends on a question and the client declared MCP's elicitation
//! capability, the question goes to the user as an elicitation (a form of
//! one string field, `reply`). An accepted answer is applied by the one
//! function every door's reply calls ([`crate::app::reply::reply`]) and the
//! wait goes on to the answer; a declined or cancelled one, or a client
//! without the capability, gets the question as the tool's result and the
//! request goes on waiting, answerable by `reply` or any other door.
//!
//! Two ways, as the revision the client speaks allows:
//!
//! - Revisions before 2026-07-28 (a session over HTTP, or stdio): the
//!   server sends `elicitation/create` to the client during the call and
//!   waits for its result ([`Server::elicit_inline`]).
//! - 2026-07-28 and later (HTTP or stdio), which forbid requests from the
//!   server: the call ends with an `input_required` result carrying the
//!   elicitation and, as its opaque state, the request's id; the client
//!   retries the call with the user's answer ([`Resume`]). The state is
//!   only a handle: the reply is checked as any reply is (the caller's
//!   tenant and, for a bound token, user), so a forged one reaches nothing
//!   the tool `reply` would not.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{
    ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, InputRequest,
    InputRequests, InputRequiredResult, InputResponses, ProtocolVersion,
};
use rmcp::service::RequestContext;
use uuid::Uuid;

use super::Server;
use crate::app::{AppError, Code, Principal};

/// The key of the one input request, and the name of the form's one field.
const FIELD: &str = "reply";

/// How this call's client can be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Channel {
    /// It declared no elicitation (of forms): it gets the question.
    None,
    /// A revision before 2026-07-28: asked during the call.
    Inline,
    /// 2026-07-28 or later: asked by an `input_required` result.
    Rounds,
}

/// How the client of `ctx` can be asked: the capability comes from the
/// request's own metadata or, for a session, from its `initialize`.
pub(super) fn channel(ctx: &RequestContext<RoleServer>) -> Channel {
    let forms = ctx
        .client_capabilities()
        .and_then(|c| c.elicitation)
        // No mode named: forms, as the revisions before modes meant.
        .is_some_and(|e| e.form.is_some() || e.url.is_none());
    match (forms, ctx.protocol_version()) {
        (false, _) => Channel::None,
        (true, Some(v)) if v >= ProtocolVersion::V_2026_07_28 => Channel::Rounds,
        (true, _) => Channel::Inline,
    }
}

/// The elicitation of `question`: a form of one required string, `reply`.
fn form(question: &str) -> Result<ElicitRequestParams, AppError> {
    let schema = ElicitationSchema::builder()
        .required_string_with(FIELD, |s| s.description("Your answer to the question"))
        .build()
        .map_err(|e| AppError::internal(format!("the elicitation form of a question: {e}")))?;
    Ok(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: question.to_owned(),
        requested_schema: schema,
    })
}

/// The `input_required` result asking `question` of request `id`.
pub(super) fn input_required(id: Uuid, question: &str) -> Result<InputRequiredResult, AppError> {
    let mut asks = InputRequests::new();
    asks.insert(
        FIELD.to_owned(),
        InputRequest::Elicitation(ElicitRequest::new(form(question)?)),
    );
    Ok(InputRequiredResult::new(Some(asks), Some(id.to_string())))
}

/// The user's text of an elicitation's result: `Some` when accepted,
/// `None` when declined or cancelled; an accepted form without a `reply`
/// string is refused naming the field.
fn text_of(result: &ElicitResult) -> Result<Option<String>, AppError> {
    match result.action {
        ElicitationAction::Accept => {
            let text = result
                .content
                .as_ref()
                .and_then(|c| c.get(FIELD))
                .and_then(|t| t.as_str());
            text.map(|t| Some(t.to_owned())).ok_or_else(|| {
                AppError::bad_request(
                    Code::MissingArgument,
                    format!("the accepted elicitation holds no string field {FIELD:?}"),
                )
            })
        }
        // Declined, cancelled (or an action of a later revision): not answered.
        _ => Ok(None),
    }
}

/// The retry of a call that ended `input_required`: the request it asked
/// about, and the user's text (`None`: declined or cancelled).
#[derive(Debug)]
pub(super) struct Resume {
    pub id: Uuid,
    pub text: Option<String>,
}

/// The retry a call is, if it is one: its echoed state (the request's id)
/// and the client's answer to the elicitation.
pub(super) fn resume(state: Option<&str>, responses: Option<&InputResponses>) -> Result<Option<Resume>, AppError> {
    let Some(state) = state else {
        return Ok(None);
    };
    let id = state.parse::<Uuid>().map_err(|_| {
        AppError::bad_request(
            Code::InvalidArgument,
            format!("requestState: {state:?} is not a state this server gave"),
        )
    })?;
    let Some(raw) = responses.and_then(|r| r.get(FIELD)) else {
        return Ok(Some(Resume { id, text: None }));
    };
    let result: ElicitResult = serde_json::from_value(raw.clone()).map_err(|e| {
        AppError::bad_request(
            Code::InvalidArgument,
            format!("inputResponses.{FIELD}: not an elicitation result: {e}"),
        )
    })?;
    Ok(Some(Resume {
        id,
        text: text_of(&result)?,
    }))
}

impl Server {
    /// Asks `question` of the user during the call (revisions before
    /// 2026-07-28), waiting at most `wait`: the text on accept; `None` when
    /// declined, cancelled, timed out or refused by the client (logged: the
    /// request goes on waiting for a reply by another door).
    pub(super) async fn elicit_inline(
        &self,
        ctx: &RequestContext<RoleServer>,
        question: &str,
        wait: Duration,
    ) -> Result<Option<String>, AppError> {
        let asked = ctx
            .peer
            .create_elicitation_with_timeout(form(question)?, Some(wait))
            .await;
        match asked {
            Ok(result) => text_of(&result),
            Err(e) => {
                tracing::info!(error = %e, "mcp: the elicitation of a question got no answer");
                Ok(None)
            }
        }
    }

    /// Applies the user's elicited `text` to request `id` as the tool
    /// `reply` and every other door do.
    pub(super) async fn apply_reply(&self, who: &Principal, id: Uuid, text: &str) -> Result<(), AppError> {
        let client = self.app.pool.get().await.map_err(AppError::from)?;
        crate::app::reply::reply(&client, who, id, text).await
    }
}
