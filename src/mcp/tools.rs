//! The MCP tools: their arguments (whose JSON Schema the client sees), and
//! each tool over the one function its HTTP twin calls.

use std::time::Duration;

use rmcp::handler::server::tool::{InputResponses, RequestState as RoundState};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResponse, CallToolResult, InputRequiredResult, ProgressNotificationParam};
use rmcp::schemars::JsonSchema;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::elicit::{self, Channel, Resume};
use super::{Server, answer, tool_error};
use crate::app::follow::{Access, Follower, Frame, RequestState, Target};
use crate::app::input::{check_field, query_text};
use crate::app::{AppError, Caller, Code, Kind, Need};
use crate::model::{MemoryItem, Status};
use crate::repo::requests::NewRequest;
use crate::users::{self, Correction, Why};

/// How long `ask` waits for the answer unless told, and at most.
const ASK_WAIT: Duration = Duration::from_secs(120);
const ASK_MAX_WAIT: Duration = Duration::from_secs(600);
/// Most items `recall` returns.
const RECALL_MAX: usize = 100;

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RememberArgs {
    /// What the user said or a fact about them, in their words, e.g. "My
    /// sister Ana moves to Lisbon in May."
    pub content: String,
    /// The user (a UUID). Leave out when the token is bound to a user.
    pub user_id: Option<String>,
    /// The conversation thread (a UUID) to add the turn to; a new thread
    /// when left out (it is returned, pass it next time to keep turns
    /// together).
    pub thread_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RecallArgs {
    /// What to look for, in plain words ("where does my sister live",
    /// "favourite food").
    pub query: String,
    /// An optional period the memory is about: "last week", "yesterday",
    /// "in May 2023", "2023-05-08", "3 days ago", "recently"; items from it
    /// come first.
    pub when: Option<String>,
    /// At most this many items (1 to 100; default all the pipeline finds).
    pub limit: Option<u32>,
    /// The user (a UUID). Leave out when the token is bound to a user.
    pub user_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct AskArgs {
    /// The user's question, as they asked it.
    pub query: String,
    /// The user (a UUID). Leave out when the token is bound to a user.
    pub user_id: Option<String>,
    /// The conversation thread (a UUID) the question belongs to.
    pub thread_id: Option<String>,
    /// How long to wait for the answer, in seconds (default 120, at most
    /// 600); past it the result says `processing` with the request id.
    pub timeout_secs: Option<u32>,
    /// May maas ask the user a question first (true), or never (false)?
    /// Leave out for the tenant's setting. When it asks, the result says
    /// `waiting_user_input` with the `question`; the user answers it with
    /// the tool `reply`.
    pub clarify: Option<bool>,
    /// Ask for an operator's review of the answer before it is given (the
    /// tenant may require it anyway); the wait then lasts until approved.
    pub review: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReplyArgs {
    /// The request (a UUID) whose question the user answers: the
    /// `request_id` of the `ask` that returned `waiting_user_input`.
    pub request_id: String,
    /// The user's reply, as they wrote it.
    pub text: String,
    /// How long to wait for the answer, in seconds (default 120, at most
    /// 600); past it the result says `processing` with the request id.
    pub timeout_secs: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ForgetArgs {
    /// The user (a UUID) whose memory is erased. Leave out when the token
    /// is bound to a user.
    pub user_id: Option<String>,
    /// Why, recorded with the tombstone.
    pub reason: Option<String>,
}

/// What `correct` does.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(rename_all = "snake_case")]
pub enum CorrectAction {
    /// Replace a record's summary with `summary`.
    ReplaceSummary,
    /// Delete a record (a summary of turns).
    DeleteRecord,
    /// Delete a turn (one message).
    DeleteTurn,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct CorrectArgs {
    /// `replace_summary` or `delete_record` (a record's id), or
    /// `delete_turn` (a turn's id): the `kind` and `id` of a `recall` item.
    pub action: CorrectAction,
    /// The record's or turn's id.
    pub id: i64,
    /// The new summary, for `replace_summary`.
    pub summary: Option<String>,
    /// The user (a UUID). Leave out when the token is bound to a user.
    pub user_id: Option<String>,
    /// Why, recorded with the correction.
    pub reason: Option<String>,
}

/// A UUID argument named `field`, if given.
fn uuid_arg(field: &str, raw: Option<&str>) -> Result<Option<Uuid>, AppError> {
    raw.map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| {
            r.parse::<Uuid>()
                .map_err(|_| AppError::bad_request(Code::InvalidArgument, format!("{field}: {r:?} is not a UUID")))
        })
        .transpose()
}

/// One `recall` item: what it says, when, whose words, its source and score.
fn item(i: &MemoryItem) -> Value {
    let said_by = match i.message_type.as_deref() {
        Some("user_query") => "user",
        Some(_) => "assistant",
        None => "summary",
    };
    json!({
        "content": i.content,
        "date": i.created_at,
        "period_end": i.period_end,
        "said_by": said_by,
        "source": { "kind": i.kind, "id": i.id, "thread_id": i.thread_id },
        "why": i.why,
        "score": i.score,
    })
}

/// Sends progress notification `step` (the state's status and stage) when
/// the client asked for them (a progress token).
async fn progress(ctx: &RequestContext<RoleServer>, step: f64, state: &RequestState) {
    let Some(token) = ctx.meta.get_progress_token() else {
        return;
    };
    let stage = serde_json::to_value(state.stage).unwrap_or_default();
    let note = ProgressNotificationParam::new(token, step).with_message(format!(
        "{}: {}",
        state.status,
        stage.as_str().unwrap_or("")
    ));
    if let Err(e) = ctx.peer.notify_progress(note).await {
        tracing::debug!(error = %e, "mcp: a progress notification was not sent");
    }
}

/// What a tool that may ask the user ends with: its JSON, or (a client
/// asked by rounds) the question as an `input_required` result.
enum Outcome {
    Done(Value),
    Ask(InputRequiredResult),
}

/// What a wait ended with: the request's state, or the question to ask.
enum Waited {
    State(RequestState),
    Ask(InputRequiredResult),
}

/// A tool's outcome as the call's response; a refusal as its error result.
fn respond(done: Result<Outcome, AppError>) -> CallToolResponse {
    match done {
        Ok(Outcome::Done(v)) => answer(Ok(v)).into(),
        Ok(Outcome::Ask(round)) => round.into(),
        Err(refusal) => tool_error(&refusal).into(),
    }
}

/// The actor of an MCP action: `mcp:TOKEN`.
fn actor(who: &crate::app::Principal) -> String {
    format!("mcp:{}", who.token)
}

#[tool_router]
impl Server {
    #[tool(
        description = "Store something the user said, or a fact about them, in their long-term memory. \
It becomes a turn of a conversation thread (a new one unless thread_id is given); maas archives and \
indexes it like any other turn, so `recall` and `ask` find it later. Needs scope submit."
    )]
    async fn remember(
        &self,
        Parameters(a): Parameters<RememberArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(answer(self.do_remember(a, &ctx).await))
    }

    #[tool(
        description = "Search the user's long-term memory with the same plan and ranking maas's own \
pipeline uses (full text, and meaning when embeddings are on). Returns dated items, newest evidence \
with its source (a turn or a record and its id, for `correct`), who said it, and its score. Give \
`when` for a period (\"last week\", \"in May 2023\"). Needs scope read."
    )]
    async fn recall(
        &self,
        Parameters(a): Parameters<RecallArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(answer(self.do_recall(a, &ctx).await))
    }

    #[tool(
        description = "Ask maas's full pipeline a question for the user: it analyses the question, \
assembles context from the user's memory and answers with its configured model. Sends progress \
notifications while it runs; returns the answer, and the memory it used (context_sources) when the \
token may read the user's memory (scope operate or admin). The question and answer become turns of \
the user's memory. Needs scope submit."
    )]
    async fn ask(
        &self,
        Parameters(a): Parameters<AskArgs>,
        RoundState(state): RoundState,
        InputResponses(inputs): InputResponses,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let done = match elicit::resume(state.as_deref(), inputs.as_ref()) {
            Ok(resume) => self.do_ask(a, resume, &ctx).await,
            Err(e) => Err(e),
        };
        Ok(respond(done))
    }

    #[tool(
        description = "Answer the question maas asked the user (an `ask` that returned status \
waiting_user_input with a question): the reply goes back to the pipeline, which answers with it in \
context. Waits for that answer (or another state) as `ask` does. Refused with not_waiting when the \
request does not wait for a reply. Needs scope submit."
    )]
    async fn reply(
        &self,
        Parameters(a): Parameters<ReplyArgs>,
        RoundState(state): RoundState,
        InputResponses(inputs): InputResponses,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let done = match elicit::resume(state.as_deref(), inputs.as_ref()) {
            Ok(resume) => self.do_reply(a, resume, &ctx).await,
            Err(e) => Err(e),
        };
        Ok(respond(done))
    }

    #[tool(
        description = "Erase everything maas holds about the user (requests, turns, records), for good, \
leaving a tombstone: later requests for the user are refused. The erase runs in the background. \
Needs scope admin."
    )]
    async fn forget(
        &self,
        Parameters(a): Parameters<ForgetArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(answer(self.do_forget(a, &ctx).await))
    }

    #[tool(
        description = "Correct one item of the user's memory, named by the `source` of a `recall` item: \
replace a record's summary (action replace_summary with summary), delete a record (delete_record) \
or delete a turn (delete_turn). Needs scope operate."
    )]
    async fn correct(
        &self,
        Parameters(a): Parameters<CorrectArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(answer(self.do_correct(a, &ctx).await))
    }
}

impl Server {
    /// The tools, for the handler.
    pub(super) fn tools() -> rmcp::handler::server::router::tool::ToolRouter<Server> {
        Server::tool_router()
    }

    async fn do_remember(&self, a: RememberArgs, ctx: &RequestContext<RoleServer>) -> Result<Value, AppError> {
        let (who, _) = self.caller_for(ctx, Need::Submit)?;
        let thread = uuid_arg("thread_id", a.thread_id.as_deref())?;
        let user = self.user(&who, a.user_id.as_deref()).await?;
        let turn = crate::app::memory::remember(&self.app, &who, user, thread, &a.content).await?;
        Ok(json!({
            "user_id": user,
            "turn_id": turn.id,
            "thread_id": turn.thread_id,
            "created_at": turn.created_at,
        }))
    }

    async fn do_recall(&self, a: RecallArgs, ctx: &RequestContext<RoleServer>) -> Result<Value, AppError> {
        let (who, key) = self.caller_for(ctx, Need::ReadUser)?;
        let limit = match a.limit {
            None => None,
            Some(n @ 1..) if (n as usize) <= RECALL_MAX => Some(n as usize),
            Some(n) => {
                return Err(AppError::bad_request(
                    Code::InvalidArgument,
                    format!("limit: {n} is not 1 to {RECALL_MAX}"),
                ));
            }
        };
        if let Some(w) = &a.when {
            check_field("when", w)?;
        }
        let user = self.user(&who, a.user_id.as_deref()).await?;
        let place = self.app.searches.enter(key)?;
        let s = users::Search {
            query: &a.query,
            when: a.when.as_deref(),
            limit,
        };
        let found = crate::app::memory::search(&self.app, user, s, place).await?;
        Ok(json!({
            "user_id": found.user_id,
            "query": found.query,
            "time_range": found.time_range,
            "memory_version": found.memory_version,
            "items": found.hits.iter().map(item).collect::<Vec<_>>(),
        }))
    }

    async fn do_reply(
        &self,
        a: ReplyArgs,
        resume: Option<Resume>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Outcome, AppError> {
        let (who, key) = self.caller_for(ctx, Need::Submit)?;
        let id = uuid_arg("request_id", Some(&a.request_id))?
            .ok_or_else(|| AppError::bad_request(Code::MissingArgument, "request_id is required"))?;
        let wait = a
            .timeout_secs
            .map_or(ASK_WAIT, |s| Duration::from_secs(u64::from(s)))
            .min(ASK_MAX_WAIT);
        // The wait takes its place before the reply applies, as `ask`'s does.
        let _place = self.app.long_polls.enter(key)?;
        // A retry after the question was elicited again applies the user's
        // answer to it, not this call's text a second time.
        let ask = match resume {
            Some(r) if r.id != id => {
                return Err(AppError::bad_request(
                    Code::InvalidArgument,
                    format!("requestState names request {}, not request_id {id}", r.id),
                ));
            }
            Some(r) => self.resumed(&who, &r).await?,
            None => {
                self.apply_reply(&who, id, &a.text).await?;
                true
            }
        };
        let state = match self.wait_answer(&who, id, key, wait, ask, ctx).await? {
            Waited::State(state) => state,
            Waited::Ask(round) => return Ok(Outcome::Ask(round)),
        };
        Ok(Outcome::Done(json!({
            "request_id": id,
            "status": state.status,
            "answer": state.answer,
            "error": state.error,
            "question": state.question,
        })))
    }

    /// Submits the request `ask` names for `user`: its id.
    async fn submit(&self, who: &crate::app::Principal, a: &AskArgs, user: users::UserKey) -> Result<Uuid, AppError> {
        let thread = uuid_arg("thread_id", a.thread_id.as_deref())?;
        let req = NewRequest {
            user_id: user.shown,
            thread_id: thread,
            query: &a.query,
            callback_url: None,
            debug: false,
            tenant_id: who.tenant,
            metadata: None,
            stream: false,
            clarify: a.clarify,
            review: a.review.unwrap_or(false),
        };
        let (id, _) = crate::app::submit::enqueue(&self.app, who, &req, None).await?;
        Ok(id)
    }

    async fn do_ask(
        &self,
        a: AskArgs,
        resume: Option<Resume>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Outcome, AppError> {
        let (who, key) = self.caller_for(ctx, Need::Submit)?;
        query_text("query", &a.query)?;
        uuid_arg("thread_id", a.thread_id.as_deref())?;
        let user = self.user(&who, a.user_id.as_deref()).await?;
        let wait = a
            .timeout_secs
            .map_or(ASK_WAIT, |s| Duration::from_secs(u64::from(s)))
            .min(ASK_MAX_WAIT);
        // The wait takes its place before the request exists (over a cap,
        // the request is not made), as a long-poll's does.
        let _place = self.app.long_polls.enter(key)?;
        // A retry after the question was elicited: the request exists, and
        // the user's answer is applied to it.
        let (id, ask) = match resume {
            Some(r) => (r.id, self.resumed(&who, &r).await?),
            None => (self.submit(&who, &a, user).await?, true),
        };
        let state = match self.wait_answer(&who, id, key, wait, ask, ctx).await? {
            Waited::State(state) => state,
            Waited::Ask(round) => return Ok(Outcome::Ask(round)),
        };
        // The context is the user's memory: only with what its HTTP twin
        // (`?include=context`) needs.
        let sources = match state.is_terminal() && who.scope.allows(Need::ReadUser) {
            true => {
                let client = self.app.pool.get().await.map_err(AppError::from)?;
                crate::repo::requests::context_of(&client, id, who.tenant)
                    .await
                    .map_err(AppError::from)?
                    .and_then(|r| r.context_sources)
            }
            false => None,
        };
        let mut done = json!({
            "request_id": id,
            "user_id": user,
            "status": state.status,
            "answer": state.answer,
            "error": state.error,
        });
        if let (Some(obj), Some(sources)) = (done.as_object_mut(), sources) {
            obj.insert("context_sources".into(), sources);
        }
        // Asked back: the question is this call's result.
        if let (Some(obj), Some(q)) = (done.as_object_mut(), state.question) {
            obj.insert("question".into(), json!(q));
        }
        Ok(Outcome::Done(done))
    }

    /// Applies the answer of a retried round: whether the wait may ask
    /// again (not after the user declined: the question is the result).
    async fn resumed(&self, who: &crate::app::Principal, r: &Resume) -> Result<bool, AppError> {
        match &r.text {
            Some(text) => self.apply_reply(who, r.id, text).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// Waits for request `id`'s answer within `wait`; when it waits for
    /// the user and `ask`, asks the client (see [`elicit`]): during the
    /// call, applying each answer and waiting on, or by an `input_required`
    /// result. Declined, or a client that cannot be asked: the state with
    /// the question.
    async fn wait_answer(
        &self,
        who: &crate::app::Principal,
        id: Uuid,
        key: Caller,
        wait: Duration,
        ask: bool,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Waited, AppError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let state = self.follow(id, who.tenant, key, left, ctx).await?;
            let question = match (&state.question, state.stage) {
                (Some(q), Status::WaitingUserInput) if ask => q.clone(),
                _ => return Ok(Waited::State(state)),
            };
            match elicit::channel(ctx) {
                Channel::None => return Ok(Waited::State(state)),
                Channel::Rounds => return Ok(Waited::Ask(elicit::input_required(id, &question)?)),
                Channel::Inline => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    match self.elicit_inline(ctx, &question, left).await? {
                        Some(text) => self.apply_reply(who, id, &text).await?,
                        None => return Ok(Waited::State(state)),
                    }
                }
            }
        }
    }

    /// Follows request `id` until its terminal state or `wait`, sending a
    /// progress notification at each change when the client asked for them.
    async fn follow(
        &self,
        id: Uuid,
        tenant: Uuid,
        key: Caller,
        wait: Duration,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<RequestState, AppError> {
        // The token is checked again as an HTTP stream's is: a revoked
        // token's wait ends with `token_revoked`.
        let access = Access::watch(&self.app, key);
        let sub = self.app.hub.subscribe(Target::Request(id), 16);
        let mut follower = Follower::new(self.app.pool.clone(), sub).for_tenant(tenant);
        let mut state = follower
            .current()
            .await
            .map_err(AppError::from)?
            .pop()
            .ok_or_else(|| AppError::not_found(format!("no request {id}")))?;
        let deadline = tokio::time::Instant::now() + wait;
        let mut step = 0.0;
        loop {
            step += 1.0;
            progress(ctx, step, &state).await;
            if state.needs_caller() {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = self.app.shutdown.cancelled() => break,
                _ = ctx.ct.cancelled() => break,
                _ = access.revoked() => return Err(AppError::new(Kind::Forbidden, Code::TokenRevoked,
                    format!("the token of this call was revoked; request {id} goes on without this wait"),
                )),
                next = follower.next() => match next {
                    None => break,
                    Some(Err(e)) => return Err(AppError::from(e)),
                    Some(Ok(states)) => {
                        let newest = states.into_iter().rev().find_map(|f| match f {
                            Frame::State(s) => Some(s),
                            _ => None,
                        });
                        if let Some(last) = newest {
                            state = last;
                        }
                    }
                },
            }
        }
        Ok(state)
    }

    async fn do_forget(&self, a: ForgetArgs, ctx: &RequestContext<RoleServer>) -> Result<Value, AppError> {
        let (who, _) = self.caller_for(ctx, Need::Admin)?;
        let user = self.user(&who, a.user_id.as_deref()).await?;
        if let Some(r) = &a.reason {
            check_field("reason", r)?;
        }
        let by = actor(&who);
        let why = Why {
            actor: &by,
            reason: a.reason.as_deref(),
        };
        users::forget_in_background(&self.app.pool, user, why).await?;
        Ok(json!({ "user_id": user, "status": "erasing" }))
    }

    async fn do_correct(&self, a: CorrectArgs, ctx: &RequestContext<RoleServer>) -> Result<Value, AppError> {
        let (who, _) = self.caller_for(ctx, Need::Operate)?;
        let user = self.user(&who, a.user_id.as_deref()).await?;
        if a.id <= 0 {
            return Err(AppError::bad_request(
                Code::InvalidArgument,
                "id must be a positive integer",
            ));
        }
        let c = match (a.action, a.summary.as_deref()) {
            (CorrectAction::ReplaceSummary, Some(summary)) => {
                query_text("summary", summary)?;
                Correction::ReplaceSummary { record: a.id, summary }
            }
            (CorrectAction::ReplaceSummary, None) => {
                return Err(AppError::bad_request(
                    Code::MissingArgument,
                    "summary is required for replace_summary",
                ));
            }
            (CorrectAction::DeleteRecord, _) => Correction::DeleteRecord(a.id),
            (CorrectAction::DeleteTurn, _) => Correction::DeleteTurn(a.id),
        };
        if let Some(r) = &a.reason {
            check_field("reason", r)?;
        }
        let by = actor(&who);
        let why = Why {
            actor: &by,
            reason: a.reason.as_deref(),
        };
        let client = self.app.pool.get().await.map_err(AppError::from)?;
        let done = users::correct(&client, user, c, why).await?;
        Ok(json!({ "user_id": user, "id": done.id, "memory_version": done.memory_version }))
    }
}
