//! The pipeline's question asked through MCP elicitation, with the official
//! Python SDK's `elicitation_callback`: over HTTP in the current revision
//! (an `input_required` result the client answers by retrying the call), in
//! a session of an older revision and over stdio (an `elicitation/create`
//! request during the call). A client that declines, or declared no
//! elicitation, gets the question and the request goes on waiting.

use serde_json::{Value, json};
use uuid::Uuid;

use super::{call, client, over_http, python, refused, token};
use crate::support::daemon::Opts;
use crate::support::db::TestDb;
use crate::support::tenants::start;

/// The vague query the offline analyzer asks about, and the reply.
const VAGUE: &str = "And that one?";
const REPLY: &str = "the bees";

/// The plan's client answers every elicitation with `action` (and, when it
/// accepts, `REPLY`).
fn answering(mut plan: Value, action: &str) -> Value {
    plan["elicit"] = json!({ "action": action, "reply": REPLY });
    plan
}

/// The replies logged for request `id`, and its context.
async fn replies_and_context(db: &TestDb, id: Uuid) -> (Vec<String>, String) {
    let c = db.client().await;
    let replies = crate::support::db::column(
        &c,
        "SELECT content FROM raw_logs WHERE request_id = $1 AND message_type = 'user_reply' ORDER BY id",
        &[&id],
    )
    .await;
    let context: Option<String> = crate::support::db::value(
        &c,
        "SELECT final_context_payload FROM pipeline_runs WHERE id = $1",
        &[&id],
    )
    .await;
    (replies, context.unwrap_or_default())
}

/// Asserts that `r`'s one step, an `ask`, got the answer in that one call
/// after one elicitation of the question, and that the reply is in the
/// request's context, logged once.
async fn answered_in_one_call(db: &TestDb, r: &Value, how: &str) {
    let s = r["steps"].as_array().unwrap_or_else(|| panic!("{how}: {r}"));
    assert_eq!(refused(&s[0]), None, "{how}: {r}");
    assert_eq!(s[0]["structured"]["status"], "completed", "{how}: {r}");
    assert!(
        s[0]["structured"]["answer"].as_str().is_some_and(|a| !a.is_empty()),
        "{how}: {r}"
    );
    let asked = r["elicited"].as_array().unwrap_or_else(|| panic!("{how}: {r}"));
    assert_eq!(asked.len(), 1, "{how}: asked once: {r}");
    assert!(
        asked[0]["message"].as_str().is_some_and(|m| m.contains(VAGUE)),
        "{how}: {r}"
    );
    assert_eq!(
        asked[0]["schema"]["properties"]["reply"]["type"], "string",
        "{how}: {r}"
    );
    let id: Uuid = s[0]["structured"]["request_id"].as_str().unwrap().parse().unwrap();
    let (replies, context) = replies_and_context(db, id).await;
    assert_eq!(replies, vec![REPLY.to_owned()], "{how}: the reply is logged once");
    assert!(context.contains(REPLY), "{how}: {context}");
}

/// A client that accepts gets the final answer in one `ask`: in the
/// current revision over HTTP, in an older revision's session, and over
/// stdio.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_elicits_gets_the_answer_in_one_ask() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let tok = token(&db, "acme", "submit", Some(user)).await;
    let ask = || json!([call("ask", json!({ "query": VAGUE, "clarify": true }))]);

    let r = client(&py, answering(over_http(&api, &tok, ask()), "accept")).await;
    answered_in_one_call(&db, &r, "current revision over HTTP").await;

    let mut legacy = answering(over_http(&api, &tok, ask()), "accept");
    legacy["mode"] = json!("legacy");
    let r = client(&py, legacy).await;
    answered_in_one_call(&db, &r, "a session of an older revision").await;

    let user_arg = user.to_string();
    let stdio = json!({
        "stdio": {
            "command": env!("CARGO_BIN_EXE_maasctl"),
            "args": ["mcp", "--user", user_arg],
            "env": { "DATABASE_URL": db.url },
        },
        "steps": ask(),
    });
    let r = client(&py, answering(stdio, "accept")).await;
    answered_in_one_call(&db, &r, "stdio").await;
}

/// A client that declines gets the question (`waiting_user_input`), the
/// request goes on waiting, and `reply` answers it; in both ways of asking.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_declines_gets_the_question_and_can_reply() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let tok = token(&db, "acme", "submit", Some(Uuid::new_v4())).await;
    for (mode, action) in [("auto", "decline"), ("legacy", "cancel")] {
        let steps = json!([
            call("ask", json!({ "query": VAGUE, "clarify": true })),
            call(
                "reply",
                json!({ "request_id": "$0.structured.request_id", "text": REPLY })
            ),
        ]);
        let mut plan = answering(over_http(&api, &tok, steps), action);
        plan["mode"] = json!(mode);
        let r = client(&py, plan).await;
        let s = r["steps"].as_array().unwrap_or_else(|| panic!("{mode}: {r}"));
        assert_eq!(s[0]["structured"]["status"], "waiting_user_input", "{mode}: {r}");
        assert!(
            s[0]["structured"]["question"]
                .as_str()
                .is_some_and(|q| q.contains(VAGUE)),
            "{mode}: {r}"
        );
        assert_eq!(r["elicited"].as_array().map(Vec::len), Some(1), "{mode}: {r}");
        assert_eq!(s[1]["structured"]["status"], "completed", "{mode}: {r}");
        let id: Uuid = s[0]["structured"]["request_id"].as_str().unwrap().parse().unwrap();
        let (replies, context) = replies_and_context(&db, id).await;
        assert_eq!(replies, vec![REPLY.to_owned()], "{mode}");
        assert!(context.contains(REPLY), "{mode}: {context}");
    }
}
