//! The vocabulary shared by SQL, code, logs and the CLI: request statuses,
//! stages, step outcomes and prompt roles. Every type here maps to the
//! exact strings the database stores.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Declares a fieldless enum whose every value has one name, from one list
/// of `Variant = "name"`: the enum (a plain value: `Debug`, `Clone`, `Copy`,
/// `PartialEq`, `Eq`, `Hash`), `ALL` (every value, in that order),
/// `NAMES` (their names, in the same order), `as_str` (the name), `index`
/// (the position in `ALL`), `from_name` (exactly the names), `Display`,
/// `Serialize` and `Deserialize` (the name) and, with
/// `parse_error = ErrorType` after the list, a `FromStr` that takes exactly
/// the names and reports anything else as `ErrorType(text)`. A value cannot
/// lack a name nor be missing from `ALL`.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
        }
        $(parse_error = $err:ident;)?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// The name of every value, in the order of `ALL`.
            #[allow(dead_code)]
            pub const NAMES: [&'static str; [$($text),+].len()] = [$($text),+];

            /// The name of this value (see the type's docs for where it is used).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The position of this value in `ALL`.
            #[allow(dead_code)]
            pub fn index(self) -> usize {
                self as usize
            }

            /// The value named exactly `name` (case-sensitive), if any.
            pub fn from_name(name: &str) -> Option<$name> {
                $name::ALL.into_iter().find(|v| v.as_str() == name)
            }
        }

        impl std::fmt::Display for $name {
            // `pad`, so that widths and alignment (`{:<9}`) apply as to a string.
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let name = <std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(deserializer)?;
                $name::from_name(&name)
                    .ok_or_else(|| ::serde::de::Error::unknown_variant(&name, &$name::NAMES))
            }
        }

        $(
            impl std::str::FromStr for $name {
                type Err = $err;

                /// Exactly the names (case-sensitive).
                fn from_str(s: &str) -> Result<Self, Self::Err> {
                    $name::from_name(s).ok_or_else(|| $err(s.to_owned()))
                }
            }
        )?
    };
}
pub(crate) use named_enum;

named_enum! {
    /// Status of a request (`pipeline_runs.status`), as enforced by the
    /// `pipeline_runs_status_valid` constraint.
    pub enum Status {
        New = "NEW",
        Analyzing = "ANALYZING",
        Analyzed = "ANALYZED",
        Assembling = "ASSEMBLING",
        Ready = "READY",
        Responding = "RESPONDING",
        /// Waits for the user's reply to its question (`question`): no
        /// lease, not dispatchable, not terminal.
        WaitingUserInput = "WAITING_USER_INPUT",
        /// Its answer waits for an operator's review: no lease, not
        /// dispatchable, not terminal.
        AwaitingReview = "AWAITING_REVIEW",
        Completed = "COMPLETED",
        Failed = "FAILED",
        Cancelled = "CANCELLED",
    }
    parse_error = UnknownStatus;
}

impl Status {
    /// The stage that picks up a row in this status, if it is dispatchable.
    pub fn dispatches(self) -> Option<StageKind> {
        match self {
            Status::New => Some(StageKind::Analyze),
            Status::Analyzed => Some(StageKind::Assemble),
            Status::Ready => Some(StageKind::Respond),
            _ => None,
        }
    }

    /// The stage running while a row is in this (in-flight) status.
    pub fn in_flight_stage(self) -> Option<StageKind> {
        match self {
            Status::Analyzing => Some(StageKind::Analyze),
            Status::Assembling => Some(StageKind::Assemble),
            Status::Responding => Some(StageKind::Respond),
            _ => None,
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }

    /// A wait for a person (WAITING_USER_INPUT, AWAITING_REVIEW): the row
    /// holds no lease and no daemon works on it; a reply, a review, a
    /// cancel or the sweep's expiry ends it.
    pub fn is_waiting(self) -> bool {
        matches!(self, Status::WaitingUserInput | Status::AwaitingReview)
    }
}

/// Whether the analyzer of a request may ask its user a question, and what
/// was asked already (the claim reads it for the analyzer: `claim.sql`).
/// A request asks at most once: its question is logged once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Clarify {
    /// Asking is off for this request (its `clarify` flag, else its
    /// tenant's `hitl_clarify`): the analyzer never asks.
    #[default]
    Off,
    /// Asking is on and the request has not asked yet.
    MayAsk,
    /// The request asked `question`; `reply` is the user's reply, `None`
    /// when the wait expired without one.
    Asked { question: String, reply: Option<String> },
}

#[derive(Debug, thiserror::Error)]
#[error("unknown status {0:?}")]
pub struct UnknownStatus(pub String);

named_enum! {
    /// What an API token may do (`api_tokens.scope`, as the
    /// `api_tokens_scope_known` constraint lists them): each scope allows
    /// what the one before it does, and more (`docs/deploying.md`, "Scopes").
    pub enum Scope {
        /// Submit requests and follow them.
        Submit = "submit",
        /// Read requests, users' memory and streams.
        Read = "read",
        /// Read, and act on requests and memory (cancel, retry, correct).
        Operate = "operate",
        /// Everything, forgetting users and activating prompts included.
        Admin = "admin",
    }
    parse_error = UnknownScope;
}

#[derive(Debug, thiserror::Error)]
#[error("unknown scope {0:?} (one of submit, read, operate, admin)")]
pub struct UnknownScope(pub String);

named_enum! {
    /// One of the three stages of the fast path (`pipeline_steps.stage`).
    pub enum StageKind {
        Analyze = "analyze",
        Assemble = "assemble",
        /// The last stage: the answer. Its prompt role is
        /// [`PromptRole::Responder`] (stored `FinalResponder`), its model role
        /// `llm::Role::Responder`.
        Respond = "respond",
    }
}

impl StageKind {
    /// The status a row waits in before this stage claims it.
    pub fn ready_status(self) -> Status {
        match self {
            StageKind::Analyze => Status::New,
            StageKind::Assemble => Status::Analyzed,
            StageKind::Respond => Status::Ready,
        }
    }

    /// The status a row holds while this stage runs under a lease.
    pub fn in_flight_status(self) -> Status {
        match self {
            StageKind::Analyze => Status::Analyzing,
            StageKind::Assemble => Status::Assembling,
            StageKind::Respond => Status::Responding,
        }
    }

    /// The status a row moves to when this stage succeeds.
    pub fn done_status(self) -> Status {
        match self {
            StageKind::Analyze => Status::Analyzed,
            StageKind::Assemble => Status::Ready,
            StageKind::Respond => Status::Completed,
        }
    }

    /// The stage that runs after this one, if any.
    pub fn next(self) -> Option<StageKind> {
        match self {
            StageKind::Analyze => Some(StageKind::Assemble),
            StageKind::Assemble => Some(StageKind::Respond),
            StageKind::Respond => None,
        }
    }
}

named_enum! {
    /// How a stage attempt ended (`pipeline_steps.outcome`).
    pub enum Outcome {
        Succeeded = "succeeded",
        /// Failed for good: the row is `FAILED`.
        Failed = "failed",
        /// Failed; the row waits in its ready status until `run_after`.
        Retrying = "retrying",
        /// Turned back before any request was sent (a provider cooling down
        /// after rate limiting us); waits until `run_after`, attempt not spent.
        Deferred = "deferred",
        /// The worker stopped renewing its lease; the sweep took the row back.
        LeaseExpired = "lease_expired",
        /// Given back at shutdown without spending the attempt.
        Released = "released",
    }
}

/// One long-term memory (LSM) record, as the stages see it. It always
/// belongs to the user of the request that reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRecord {
    pub id: i64,
    pub time_bucket_start: DateTime<Utc>,
    pub time_bucket_end: DateTime<Utc>,
    #[serde(default)]
    pub tags: Vec<String>,
    pub summary: String,
}

named_enum! {
    /// What an item of a user's memory is ([`MemoryItem::kind`]).
    pub enum MemoryKind {
        /// A turn (`raw_logs`).
        Turn = "turn",
        /// A record (`lsm_storage`).
        Record = "record",
    }
}

named_enum! {
    /// Why the memory search found an item ([`MemoryItem::why`],
    /// `memory_search.sql`).
    pub enum FoundAs {
        /// A turn of the request's own thread.
        Thread = "thread",
        /// It matched the query.
        Hit = "hit",
        /// Next to a hit in its thread.
        Neighbour = "neighbour",
        /// A record.
        Record = "record",
    }
}

/// One item of a request's memory, as the retrieval found it: a turn
/// (`raw_logs`) or a record (`lsm_storage`), always of the request's user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryItem {
    pub kind: MemoryKind,
    /// The row's id in its table.
    pub id: i64,
    pub why: FoundAs,
    /// The score of its hit (BM25; 0 for a thread turn).
    pub score: f64,
    /// The hit whose window brought it (its own id for a hit, a thread
    /// turn or a record).
    pub hit_id: i64,
    pub thread_id: Option<uuid::Uuid>,
    /// `user_query` or `assistant_response`; `None` for a record.
    pub message_type: Option<String>,
    pub content: String,
    /// A turn's time, a record's period start.
    pub created_at: DateTime<Utc>,
    /// A record's period end.
    pub period_end: Option<DateTime<Utc>>,
}

impl MemoryItem {
    pub fn is_record(&self) -> bool {
        self.kind == MemoryKind::Record
    }
}

named_enum! {
    /// What an operator did (`operator_actions.action`, as the
    /// `operator_actions_action_valid` constraint lists them). The actions on
    /// one request are named by the statement that performs them (the
    /// `*_request.sql`, `retry_failed.sql`, `control_set.sql`); the others
    /// are bound by `repo::audit` or named by their `users_*`, `tenants_*`
    /// and `tokens_*` statements.
    pub enum OperatorAction {
        Retry = "retry",
        Cancel = "cancel",
        /// A debug request let go past the stage it rests after.
        Continue = "continue",
        Pause = "pause",
        Resume = "resume",
        PromptSet = "prompt_set",
        PromptActivate = "prompt_activate",
        MemoryDeleteRecord = "memory_delete_record",
        MemoryDeleteTurn = "memory_delete_turn",
        MemoryReplaceSummary = "memory_replace_summary",
        TenantAdd = "tenant_add",
        TenantSet = "tenant_set",
        TenantGrant = "tenant_grant",
        TenantRevoke = "tenant_revoke",
        TokenCreate = "token_create",
        TokenRevoke = "token_revoke",
        /// An archivist run asked for by an operator.
        ArchiveRun = "archive_run",
        /// An answer awaiting review let through as it was.
        ReviewApprove = "review_approve",
        /// An answer awaiting review replaced by the operator's text (the
        /// original in the detail).
        ReviewEdit = "review_edit",
        /// An answer awaiting review refused: the request failed, or went
        /// back to the responder with the reason.
        ReviewReject = "review_reject",
    }
}

named_enum! {
    /// Where a callback delivery is (`callback_outbox.state`, as the
    /// `callback_outbox_state_valid` constraint lists them).
    pub enum DeliveryState {
        /// Due at `next_attempt_at` (not delivered yet, or retried).
        Pending = "pending",
        Delivered = "delivered",
        /// Given up: its attempts ran out, or its address was refused.
        Dead = "dead",
    }
}

named_enum! {
    /// Whose system prompt a `system_prompts` row is.
    ///
    /// Inside the crate the last stage is called *respond* ([`StageKind::Respond`])
    /// and its prompt's role *responder* (this enum, `llm::Role::Responder`,
    /// [`Prompts::responder`]). Its stored name in `system_prompts.role_name`
    /// is `FinalResponder`, kept as it is for producers and operators
    /// ([`PromptRole::as_str`]); `maasctl prompts` shows that name too.
    /// Declared in the order `maasctl prompts list` shows them.
    pub enum PromptRole {
        /// The analyze stage's prompt (stored `Analyzer`).
        Analyzer = "Analyzer",
        /// The history block's introduction in the assembled context (stored
        /// `Assembler`).
        Assembler = "Assembler",
        /// The respond stage's system prompt (stored `FinalResponder`).
        Responder = "FinalResponder",
        /// The archivist's prompt (stored `Archivist`).
        Archivist = "Archivist",
    }
    parse_error = UnknownPromptRole;
}

/// The text was not one of the stored role names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown prompt role {0:?} (one of Analyzer, Assembler, FinalResponder, Archivist)")]
pub struct UnknownPromptRole(pub String);

/// The active prompt of each role (`system_prompts`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompts {
    pub analyzer: Option<String>,
    pub assembler: Option<String>,
    /// The respond stage's system prompt (stored as role `FinalResponder`).
    pub responder: Option<String>,
    pub archivist: Option<String>,
}

impl Prompts {
    /// The active prompt of `role`, if there is one.
    pub fn get(&self, role: PromptRole) -> Option<&str> {
        self.slot(role).as_deref()
    }

    /// Sets the active prompt of `role`.
    pub fn set(&mut self, role: PromptRole, text: String) {
        *self.slot_mut(role) = Some(text);
    }

    fn slot(&self, role: PromptRole) -> &Option<String> {
        match role {
            PromptRole::Analyzer => &self.analyzer,
            PromptRole::Assembler => &self.assembler,
            PromptRole::Responder => &self.responder,
            PromptRole::Archivist => &self.archivist,
        }
    }

    fn slot_mut(&mut self, role: PromptRole) -> &mut Option<String> {
        match role {
            PromptRole::Analyzer => &mut self.analyzer,
            PromptRole::Assembler => &mut self.assembler,
            PromptRole::Responder => &mut self.responder,
            PromptRole::Archivist => &mut self.archivist,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pad_like_strings_in_tables() {
        assert_eq!(format!("{:<9}|", Status::New), "NEW      |");
        assert_eq!(format!("{:>8}|", StageKind::Analyze), " analyze|");
        assert_eq!(
            format!("{:<15}|", PromptRole::Responder),
            format!("{:<15}|", PromptRole::Responder.as_str())
        );
    }

    #[test]
    fn status_round_trips_through_text() {
        for st in Status::ALL {
            assert_eq!(st.as_str().parse::<Status>().ok(), Some(st));
        }
        assert!("new".parse::<Status>().is_err());
        assert!("BOGUS".parse::<Status>().is_err());
    }

    #[test]
    fn names_are_the_serialised_form() {
        assert_eq!(
            serde_json::to_string(&Status::Analyzed).ok().as_deref(),
            Some(r#""ANALYZED""#)
        );
        assert_eq!(
            serde_json::to_string(&Outcome::LeaseExpired).ok().as_deref(),
            Some(r#""lease_expired""#)
        );
        assert_eq!(
            serde_json::from_str::<StageKind>(r#""respond""#).ok(),
            Some(StageKind::Respond)
        );
        assert!(serde_json::from_str::<StageKind>(r#""Respond""#).is_err());
        assert_eq!(Outcome::NAMES.len(), Outcome::ALL.len());
    }

    #[test]
    fn prompt_roles_keep_their_stored_names() {
        for (role, name) in PromptRole::ALL.into_iter().zip(PromptRole::NAMES) {
            assert_eq!(role.as_str(), name);
            assert_eq!(name.parse::<PromptRole>().ok(), Some(role));
        }
        assert_eq!(PromptRole::Responder.as_str(), "FinalResponder");
        assert!("Responder".parse::<PromptRole>().is_err());
        assert!("analyzer".parse::<PromptRole>().is_err());
        let mut p = Prompts::default();
        p.set(PromptRole::Responder, "R".into());
        assert_eq!(p.get(PromptRole::Responder), Some("R"));
        assert_eq!(p.responder.as_deref(), Some("R"));
        assert_eq!(p.get(PromptRole::Analyzer), None);
    }

    #[test]
    fn stages_chain_through_the_state_machine() {
        for stage in StageKind::ALL {
            assert_eq!(stage.ready_status().dispatches(), Some(stage));
            assert_eq!(stage.in_flight_status().in_flight_stage(), Some(stage));
            match stage.next() {
                Some(next) => assert_eq!(stage.done_status(), next.ready_status()),
                None => assert!(stage.done_status().is_terminal()),
            }
        }
    }
}
