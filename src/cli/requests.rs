//! `maasctl requests ...`: find requests, see why they failed, retry,
//! cancel, step debug requests through their stages, and reply for a user
//! to the question a request waits on.

use clap::Subcommand;
use uuid::Uuid;

use super::{CliError, Outcome, age, connect, one_line, parse_duration, parse_id, shown, since};
use crate::app::Kind;
use crate::app::review::{Reviewer, Verdict};
use crate::config::Config;
use crate::control::{self, CancelOutcome, ContinueOutcome, RetryOutcome};
use crate::model::{DeliveryState, Status};
use crate::repo::{audit, callbacks, requests, steps};

/// Runs retried per statement by `retry --all-failed`.
const RETRY_BATCH: usize = 500;

#[derive(Subcommand, Debug)]
pub enum RequestsCommand {
    /// List requests, most recently changed first.
    List {
        /// Only these statuses (repeat or comma-separate: --status FAILED,CANCELLED).
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        /// Only this user's requests (uuid).
        #[arg(long)]
        user: Option<String>,
        /// Only requests unchanged for longer than this (90s, 15m, 2h, 3d):
        /// stuck ones, or old failures.
        #[arg(long, value_parser = parse_duration)]
        older_than: Option<std::time::Duration>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one request: the run, its step history, its errors, operator
    /// actions and callback deliveries.
    Show {
        /// The request id (uuid).
        id: String,
    },
    /// Send FAILED requests back to the ready status of the stage that
    /// failed, with fresh attempts.
    Retry {
        /// Request ids (uuid).
        #[arg(required_unless_present = "all_failed", conflicts_with = "all_failed")]
        ids: Vec<String>,
        /// Every FAILED request.
        #[arg(long)]
        all_failed: bool,
        /// Why (recorded with the retry).
        #[arg(long)]
        reason: String,
    },
    /// Cancel requests that have not finished; a running stage's result is
    /// discarded.
    Cancel {
        /// Request ids (uuid).
        #[arg(required = true)]
        ids: Vec<String>,
        /// Why (recorded, and shown as the request's error).
        #[arg(long)]
        reason: String,
    },
    /// Reply for its user to the question a request waits on
    /// (WAITING_USER_INPUT): the request goes back to the analyzer with the
    /// reply, as `POST /api/query/{id}/reply` does.
    Reply {
        /// The request id (uuid).
        id: String,
        /// The user's reply.
        text: String,
    },
    /// Debug mode: release a debug request resting in ANALYZED or READY to
    /// its next stage.
    Continue {
        /// Request ids (uuid).
        #[arg(required = true)]
        ids: Vec<String>,
        /// Why (optional; recorded).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Review an answer that awaits it (AWAITING_REVIEW): approve it, edit
    /// it (the user gets your text, memory keeps it) or reject it (the
    /// request fails with the reason, or with --redo the responder answers
    /// again with the reason as your note).
    Review {
        /// The request id (uuid).
        id: String,
        /// Let the answer through as it is.
        #[arg(long, conflicts_with_all = ["edit", "reject"], required_unless_present_any = ["edit", "reject"])]
        approve: bool,
        /// Replace the answer with this text.
        #[arg(long, value_name = "TEXT", conflicts_with = "reject")]
        edit: Option<String>,
        /// Refuse the answer, for this reason.
        #[arg(long, value_name = "REASON")]
        reject: Option<String>,
        /// With --reject: send the request back to the responder with the
        /// reason as a note, instead of failing it.
        #[arg(long, requires = "reject")]
        redo: bool,
    },
}

pub async fn run(cfg: &Config, cmd: RequestsCommand, actor: &str, json: bool) -> Result<Outcome, CliError> {
    match cmd {
        RequestsCommand::List {
            status,
            user,
            older_than,
            limit,
        } => list(cfg, status, user, older_than, limit, json).await,
        RequestsCommand::Show { id } => show(cfg, &id, json).await,
        RequestsCommand::Retry {
            ids,
            all_failed,
            reason,
        } => retry(cfg, &ids, all_failed, actor, &reason, json).await,
        RequestsCommand::Cancel { ids, reason } => cancel(cfg, &ids, actor, &reason, json).await,
        RequestsCommand::Continue { ids, reason } => continue_(cfg, &ids, actor, reason.as_deref(), json).await,
        RequestsCommand::Reply { id, text } => reply(cfg, &id, actor, &text, json).await,
        RequestsCommand::Review {
            id,
            approve: _,
            edit,
            reject,
            redo,
        } => review(cfg, &id, edit, reject, redo, actor, json).await,
    }
}

fn parse_ids(ids: &[String]) -> Result<Vec<Uuid>, CliError> {
    ids.iter().map(|s| request_id(s)).collect()
}

/// A request's id: its UUID, or its chat completion's id (`chatcmpl-…`).
fn request_id(raw: &str) -> Result<Uuid, CliError> {
    crate::app::input::request_id(raw).ok_or_else(|| {
        CliError::Usage(format!(
            "{raw:?} is not a request id (expected a uuid or chatcmpl-UUID)"
        ))
    })
}

/// The statuses of `--status` (any case), as stored.
fn parse_statuses(given: &[String]) -> Result<Vec<Status>, CliError> {
    given
        .iter()
        .map(|s| s.trim().to_ascii_uppercase())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<Status>().map_err(|_| {
                CliError::Usage(format!(
                    "unknown status {s:?} (one of {})",
                    Status::ALL.map(Status::as_str).join(", ")
                ))
            })
        })
        .collect()
}

async fn list(
    cfg: &Config,
    status: Vec<String>,
    user: Option<String>,
    older_than: Option<std::time::Duration>,
    limit: usize,
    json: bool,
) -> Result<Outcome, CliError> {
    let statuses = parse_statuses(&status)?;
    let filter = requests::ListFilter {
        statuses: (!statuses.is_empty()).then_some(statuses),
        user_id: user.as_deref().map(|u| parse_id(u, "user")).transpose()?,
        older_than,
        limit,
    };
    let client = connect(cfg).await?;
    let rows = requests::list(&client, &filter).await?;
    if json {
        println!("{}", serde_json::to_string(&rows).map_err(std::io::Error::other)?);
    } else if rows.is_empty() {
        println!("no requests match");
    } else {
        print_rows(&rows, limit);
    }
    Ok(Outcome::Ok)
}

/// The table of `list`: one line per request, and what its flags mean.
fn print_rows(rows: &[requests::RequestSummary], limit: usize) {
    println!(
        "{:<36}  {:<10} {:>3} {:>7} {:>7}  {:<5} error / query",
        "id", "status", "try", "age", "changed", "flags"
    );
    for r in rows {
        let flags: String = [
            (r.debug, 'd'),
            (r.held, 'H'),
            (r.has_callback, 'c'),
            (r.lease_owner.is_some(), 'L'),
        ]
        .into_iter()
        .filter_map(|(on, flag)| on.then_some(flag))
        .collect();
        let text = match &r.error {
            Some(e) => one_line(e, 90),
            None => format!("\"{}\"", one_line(&r.query, 60)),
        };
        println!(
            "{:<36}  {:<10} {:>3} {:>7} {:>7}  {:<5} {}",
            r.id,
            r.status,
            r.attempt,
            age(since(r.created_at)),
            age(since(r.updated_at)),
            if flags.is_empty() { "-".into() } else { flags },
            text
        );
    }
    println!(
        "({} shown{}; flags: d debug, H held for `requests continue`, c callback, L leased)",
        rows.len(),
        if rows.len() == limit { ", more with --limit" } else { "" }
    );
}

async fn show(cfg: &Config, id: &str, json: bool) -> Result<Outcome, CliError> {
    let id = request_id(id)?;
    let client = connect(cfg).await?;
    let Some(run) = requests::get(&client, id).await? else {
        if json {
            println!("{}", serde_json::json!({"error": "not found", "id": id}));
        } else {
            eprintln!("no request {id}");
        }
        return Ok(Outcome::Finding);
    };
    let steps = steps::for_request(&client, id).await?;
    let actions = audit::for_request(&client, id).await?;
    let callbacks = callbacks::for_request(&client, id).await?;
    if json {
        println!(
            "{}",
            serde_json::json!({"request": run, "steps": steps, "actions": actions, "callbacks": callbacks})
        );
        return Ok(Outcome::Ok);
    }
    print_request(&run);
    print_memory(&run);
    print_outputs(&run);
    print_steps(&steps);
    print_actions(&actions);
    print_callbacks(&callbacks);
    Ok(Outcome::Ok)
}

/// The request's state: who, when, the lease, debug mode, the query.
fn print_request(run: &requests::Request) {
    println!("request   {}", run.id);
    println!("status    {}", run.status);
    println!("user      {}", run.user_id);
    if let Some(t) = run.thread_id {
        println!("thread    {t}");
    }
    println!("created   {}", run.created_at.to_rfc3339());
    println!("updated   {}", run.updated_at.to_rfc3339());
    println!("attempt   {} (of the current stage)", run.attempt);
    if let (Some(owner), Some(until)) = (&run.lease_owner, run.lease_expires_at) {
        println!("lease     held by {owner} until {}", until.to_rfc3339());
    }
    if run.run_after > run.updated_at {
        println!("waiting   until {} (backoff)", run.run_after.to_rfc3339());
    }
    match (run.debug, run.held) {
        (true, true) => println!(
            "debug     yes; HELD in {}: `maasctl requests continue {}` releases the next stage",
            run.status, run.id
        ),
        (true, false) => println!("debug     yes (rests in ANALYZED and READY until continued)"),
        (false, _) => {}
    }
    if let Some(url) = &run.callback_url {
        println!("callback  {}", shown(url));
    }
    if let Some(m) = &run.metadata {
        println!("metadata  {m}");
    }
    println!("query     {}", one_line(&run.user_query, 200));
    if let Some(a) = &run.analysis_result {
        println!("analysis  {}", one_line(&a.to_string(), 200));
    }
    if let Some(c) = &run.final_context_payload {
        println!("context   {} characters", c.chars().count());
    }
}

/// The memory items in the request's context, each with its score and why.
fn print_memory(run: &requests::Request) {
    let Some(sources) = run.context_sources.as_ref().and_then(|v| v.as_array()) else {
        return;
    };
    println!("memory    {} items in the context", sources.len());
    for s in sources {
        let score = s["score"]
            .as_f64()
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        println!(
            "  {:<6} {:>10}  score {:>8}  {}",
            s["kind"].as_str().unwrap_or("?"),
            s["id"],
            score,
            s["why"].as_str().unwrap_or("?")
        );
    }
}

/// The answer or the error.
fn print_outputs(run: &requests::Request) {
    if let Some(a) = &run.final_answer {
        println!("answer    {}", one_line(a, 500));
    }
    if let Some(e) = &run.error {
        println!("error     {}", one_line(e, 2000));
    }
}

/// The step history, one line per finished attempt.
fn print_steps(steps: &[steps::Step]) {
    println!();
    println!(
        "{:<9} {:>7} {:<14} {:>9} {:<24} {:<28} error",
        "stage", "attempt", "outcome", "ms", "started", "worker"
    );
    for s in steps {
        let err = match (&s.error_class, &s.error_message) {
            (Some(c), Some(m)) => format!("{c}: {}", one_line(m, 160)),
            (Some(c), None) => c.clone(),
            _ => String::new(),
        };
        println!(
            "{:<9} {:>7} {:<14} {:>9} {:<24} {:<28} {}",
            s.stage,
            s.attempt,
            s.outcome,
            s.latency_ms.map(|l| l.to_string()).unwrap_or_else(|| "-".into()),
            s.started_at.format("%Y-%m-%d %H:%M:%S%.3f"),
            shown(&s.worker),
            err
        );
    }
    if steps.is_empty() {
        println!("(no finished stage attempts yet)");
    }
}

/// The operator actions on the request, if any.
fn print_actions(actions: &[audit::Action]) {
    if actions.is_empty() {
        return;
    }
    println!();
    println!("operator actions:");
    for a in actions {
        println!(
            "  {}  {:<8} by {:<12} {} -> {}{}",
            a.at.format("%Y-%m-%d %H:%M:%S"),
            a.action,
            shown(&a.actor),
            a.from_status.as_deref().unwrap_or("-"),
            a.to_status.as_deref().unwrap_or("-"),
            a.reason
                .as_deref()
                .map(|r| format!("  ({})", one_line(r, 120)))
                .unwrap_or_default()
        );
    }
}

/// The callback deliveries of the request, if any.
fn print_callbacks(callbacks: &[callbacks::CallbackView]) {
    if callbacks.is_empty() {
        return;
    }
    println!();
    println!("callbacks:");
    for c in callbacks {
        let detail = match (c.state, &c.last_error) {
            (DeliveryState::Delivered, _) => format!(
                "delivered {} (HTTP {})",
                c.delivered_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                c.last_status.unwrap_or_default()
            ),
            (DeliveryState::Pending, Some(e)) => format!(
                "next attempt {}; last: {}",
                c.next_attempt_at.to_rfc3339(),
                one_line(e, 100)
            ),
            (DeliveryState::Pending, None) => format!("next attempt {}", c.next_attempt_at.to_rfc3339()),
            (DeliveryState::Dead, e) => format!(
                "dead; last: {}",
                e.as_deref().map(|e| one_line(e, 100)).unwrap_or_default()
            ),
        };
        println!("  #{:<6} {:<18} attempts {:<3} {}", c.id, c.event, c.attempts, detail);
    }
}

async fn retry(
    cfg: &Config,
    ids: &[String],
    all_failed: bool,
    actor: &str,
    reason: &str,
    json: bool,
) -> Result<Outcome, CliError> {
    let ids = parse_ids(ids)?;
    let client = connect(cfg).await?;
    let mut retried: Vec<serde_json::Value> = Vec::new();
    let mut skipped: Vec<serde_json::Value> = Vec::new();
    if all_failed {
        for r in control::retry_all_failed(&client, actor, Some(reason), RETRY_BATCH).await? {
            retried.push(serde_json::json!({"id": r.id, "status": r.status, "stage": r.stage, "error": r.error}));
        }
    } else {
        for id in ids {
            match control::retry(&client, id, actor, Some(reason)).await? {
                RetryOutcome::Retried { status, stage } => {
                    retried.push(serde_json::json!({"id": id, "status": status, "stage": stage}));
                }
                other => skipped.push(serde_json::json!({"id": id, "result": other})),
            }
        }
    }
    if json {
        println!("{}", serde_json::json!({"retried": retried, "skipped": skipped}));
    } else {
        for r in &retried {
            println!(
                "retried {}: {} stage again from {}",
                r["id"].as_str().unwrap_or_default(),
                r["stage"].as_str().unwrap_or_default(),
                r["status"].as_str().unwrap_or_default()
            );
        }
        for s in &skipped {
            let id = s["id"].as_str().unwrap_or_default();
            match s["result"]["outcome"].as_str() {
                Some("not_found") => eprintln!("no request {id}"),
                _ => eprintln!(
                    "not retried {id}: it is {}, only FAILED requests are retried",
                    s["result"]["status"].as_str().unwrap_or("?")
                ),
            }
        }
        if all_failed && retried.is_empty() {
            println!("no FAILED requests");
        }
    }
    Ok(if skipped.is_empty() {
        Outcome::Ok
    } else {
        Outcome::Finding
    })
}

/// Runs `act` on each of `ids` in turn and prints each outcome with `say`,
/// or with `json` all of them as one array at the end. A finding when any
/// outcome is not `done`.
async fn act_on_each<T: serde::Serialize>(
    cfg: &Config,
    ids: &[String],
    json: bool,
    mut act: impl AsyncFnMut(&deadpool_postgres::Object, Uuid) -> Result<T, control::Error>,
    say: impl Fn(Uuid, &T),
    done: impl Fn(&T) -> bool,
) -> Result<Outcome, CliError> {
    let ids = parse_ids(ids)?;
    let client = connect(cfg).await?;
    let mut results = Vec::new();
    let mut finding = false;
    for id in ids {
        let outcome = act(&client, id).await?;
        if !json {
            say(id, &outcome);
        }
        finding |= !done(&outcome);
        results.push(serde_json::json!({"id": id, "result": outcome}));
    }
    if json {
        println!("{}", serde_json::Value::Array(results));
    }
    Ok(if finding { Outcome::Finding } else { Outcome::Ok })
}

async fn cancel(cfg: &Config, ids: &[String], actor: &str, reason: &str, json: bool) -> Result<Outcome, CliError> {
    act_on_each(
        cfg,
        ids,
        json,
        async |client, id| control::cancel(client, id, actor, Some(reason)).await,
        |id, outcome| match outcome {
            CancelOutcome::Cancelled { was } if was.in_flight_stage().is_some() => {
                println!("cancelled {id} (was {was}: its running stage loses its lease; a late result is discarded)")
            }
            CancelOutcome::Cancelled { was } => println!("cancelled {id} (was {was})"),
            CancelOutcome::AlreadyFinished { status } => eprintln!("not cancelled {id}: already {status}"),
            CancelOutcome::NotFound => eprintln!("no request {id}"),
        },
        |outcome| matches!(outcome, CancelOutcome::Cancelled { .. }),
    )
    .await
}

async fn continue_(
    cfg: &Config,
    ids: &[String],
    actor: &str,
    reason: Option<&str>,
    json: bool,
) -> Result<Outcome, CliError> {
    act_on_each(
        cfg,
        ids,
        json,
        async |client, id| control::continue_request(client, id, actor, reason).await,
        |id, outcome| match outcome {
            ContinueOutcome::Released { status, next } => {
                println!("continued {id}: the {next} stage will pick it up from {status}");
            }
            ContinueOutcome::NotHeld { status, debug: false } => {
                eprintln!("not held {id}: it is {status} and not in debug mode")
            }
            ContinueOutcome::NotHeld { status, debug: true } => eprintln!(
                "not held {id}: it is {status}; a debug request rests only in ANALYZED and READY \
                 after a stage succeeds"
            ),
            ContinueOutcome::NotFound => eprintln!("no request {id}"),
        },
        |outcome| matches!(outcome, ContinueOutcome::Released { .. }),
    )
    .await
}

/// `maasctl requests reply ID TEXT`: [`crate::app::reply::reply`] as an
/// administrator of the request's own tenant. A refusal (not waiting, an
/// empty text) is a finding that says why.
async fn reply(cfg: &Config, id: &str, actor: &str, text: &str, json: bool) -> Result<Outcome, CliError> {
    let id = request_id(id)?;
    let client = connect(cfg).await?;
    let Some(tenant) = requests::tenant_of(&client, id).await? else {
        eprintln!("no request {id}");
        return Ok(Outcome::Finding);
    };
    let who = crate::app::Principal {
        tenant,
        ..crate::app::Principal::default_admin(actor)
    };
    let (applied, message) = match crate::app::reply::reply(&client, &who, id, text).await {
        Ok(()) => (
            true,
            format!("replied to {id}: the analyzer picks it up with the reply"),
        ),
        Err(e) if matches!(e.kind, crate::app::Kind::Unavailable | crate::app::Kind::Internal) => {
            return Err(CliError::App(format!("reply to {id}: {}", e.detailed())));
        }
        Err(e) => (false, format!("not replied {id}: {}", e.message)),
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"id": id, "replied": applied, "message": message})
        );
    } else if applied {
        println!("{message}");
    } else {
        eprintln!("{message}");
    }
    Ok(if applied { Outcome::Ok } else { Outcome::Finding })
}

/// `requests review`: the verdict of `app::review`, as an operator of
/// every tenant.
async fn review(
    cfg: &Config,
    id: &str,
    edit: Option<String>,
    reject: Option<String>,
    redo: bool,
    actor: &str,
    json: bool,
) -> Result<Outcome, CliError> {
    let id = request_id(id)?;
    let then = redo.then_some("redo");
    let verdict = match (&edit, &reject) {
        (Some(text), _) => Verdict::from_fields("edit", Some(text), None, None),
        (None, Some(reason)) => Verdict::from_fields("reject", None, Some(reason), then),
        (None, None) => Verdict::from_fields("approve", None, None, None),
    }
    .map_err(|e| CliError::Usage(e.message))?;
    let client = connect(cfg).await?;
    match crate::app::review::review(&client, Reviewer::Operator, actor, id, &verdict).await {
        Ok(done) => {
            if json {
                println!("{}", serde_json::json!(done));
            } else {
                println!("{} {id}: it is {} now", done.action, done.status);
            }
            Ok(Outcome::Ok)
        }
        Err(e) if matches!(e.kind, Kind::NotFound | Kind::Conflict) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"request_id": id, "code": e.code.as_str(), "error": e.message})
                );
            }
            eprintln!("not reviewed: {}", e.message);
            Ok(Outcome::Finding)
        }
        Err(e) if matches!(e.kind, Kind::Invalid | Kind::Unprocessable) => {
            Err(CliError::Usage(format!("review of {id}: {}", e.message)))
        }
        Err(e) => Err(CliError::App(format!("review of {id}: {}", e.detailed()))),
    }
}
