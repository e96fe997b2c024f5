//! Hostile and malformed HTTP input against a real `maasd`: every such
//! request gets a 4xx with a JSON body naming the problem, nothing is
//! stored, and the daemon keeps serving.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::count;
use crate::support::daemon::Opts;
use crate::support::db::TestDb;

/// Sends a raw request and returns (status, code) after checking the body
/// is `{"error": text, "code": text}`.
async fn answer(api: &Api, method: Method, path: &str, ct: Option<&str>, body: Vec<u8>) -> (StatusCode, String) {
    let mut rb = api.http.request(method, api.url(path)).body(body);
    if let Some(ct) = ct {
        rb = rb.header("content-type", ct);
    }
    let resp = api.authed(rb).send().await.unwrap();
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let text = resp.text().await.unwrap();
    let body: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {status} body is not JSON ({e}): {text:?}"));
    if status.is_success() {
        return (status, String::new());
    }
    assert!(ct.starts_with("application/json"), "{path}: content type {ct:?}");
    let msg = body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{path}: no error text: {body}"));
    assert!(!msg.is_empty() && msg.len() < 2000, "{path}: error text {msg:?}");
    (
        status,
        body["code"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: no code: {body}"))
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_http_input_gets_a_json_4xx_naming_the_problem() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let good = json!({"user_id": user, "query": "q"}).to_string().into_bytes();

    hostile_bodies_are_refused(&api, user).await;
    other_content_types_are_refused(&api, &good).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_runs").await,
        0,
        "nothing stored"
    );
    hostile_paths_and_queries_are_refused(&api).await;
    the_daemon_still_serves(&api, &c, good).await;
}

/// Bodies of POST /api/query: bad text, bad JSON, bad fields, too big.
async fn hostile_bodies_are_refused(api: &Api, user: Uuid) {
    for (body, want, code) in hostile_bodies(user) {
        let shown = String::from_utf8_lossy(&body[..body.len().min(60)]).into_owned();
        assert_eq!(
            answer(api, Method::POST, "/api/query", Some("application/json"), body).await,
            (want, code.to_owned()),
            "{shown}"
        );
    }
}

/// Each hostile body of `user`, with the status and code it must get.
fn hostile_bodies(user: Uuid) -> Vec<(Vec<u8>, StatusCode, &'static str)> {
    vec![
        // NUL in the query: PostgreSQL text refuses it (was 500 internal).
        (
            format!(r#"{{"user_id":"{user}","query":"a\u0000b"}}"#).into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_text",
        ),
        (
            format!(r#"{{"user_id":"{user}","query":"\u0000"}}"#).into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_text",
        ),
        // A lone surrogate escaped in JSON is not text.
        (
            format!(r#"{{"user_id":"{user}","query":"a\ud800b"}}"#).into_bytes(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        // Invalid UTF-8 bytes inside the string.
        (
            [
                format!(r#"{{"user_id":"{user}","query":"a"#).as_bytes(),
                &[0xff, 0xfe, 0xc3],
                br#"b"}"#,
            ]
            .concat(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        // Deep nesting.
        (
            format!(
                r#"{{"user_id":"{user}","query":"q","x":{}1{}}}"#,
                "[".repeat(5000),
                "]".repeat(5000)
            )
            .into_bytes(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (b"".to_vec(), StatusCode::BAD_REQUEST, "malformed_json"),
        (b"null".to_vec(), StatusCode::BAD_REQUEST, "malformed_json"),
        (
            json!({"user_id": "x".repeat(100_000), "query": "q"})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_id",
        ),
        (
            json!({"user_id": user, "thread_id": [1], "query": "q"})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_id",
        ),
        (
            json!({"user_id": user, "query": {"text": "q"}})
                .to_string()
                .into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
        (
            json!({"user_id": user, "query": "é".repeat(100_001)})
                .to_string()
                .into_bytes(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "field_too_long",
        ),
        (vec![b' '; 2 << 20], StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
    ]
}

/// A good body sent as anything but JSON is 415.
async fn other_content_types_are_refused(api: &Api, good: &[u8]) {
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/jsonx"),
        None,
    ] {
        assert_eq!(
            answer(api, Method::POST, "/api/query", ct, good.to_vec()).await,
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type".to_owned()),
            "{ct:?}"
        );
    }
}

/// Malformed ids, waits and includes, unknown requests, wrong methods and
/// unknown routes.
async fn hostile_paths_and_queries_are_refused(api: &Api) {
    let id = Uuid::new_v4();
    let long = "z".repeat(4000);
    let paths: Vec<(Method, String, u16, &str)> = vec![
        (Method::GET, "/api/query/not-a-uuid/status".into(), 400, "invalid_id"),
        (Method::GET, format!("/api/query/{long}/status"), 400, "invalid_id"),
        (Method::GET, "/api/query/%FF%FE/status".into(), 400, "bad_request"),
        (Method::GET, "/api/query/%00/status".into(), 400, "invalid_id"),
        (
            Method::GET,
            format!("/api/query/{id}/status?wait=soon"),
            400,
            "invalid_wait",
        ),
        (
            Method::GET,
            format!("/api/query/{id}/status?wait=-1s"),
            400,
            "invalid_wait",
        ),
        (
            Method::GET,
            format!("/api/query/{id}/status?wait=1e400"),
            400,
            "invalid_wait",
        ),
        (
            Method::GET,
            format!("/api/query/{id}/status?wait=NaN"),
            400,
            "invalid_wait",
        ),
        (
            Method::GET,
            format!("/api/query/{id}/status?wait=%00"),
            400,
            "invalid_wait",
        ),
        (
            Method::GET,
            format!("/api/query/{id}/status?wait=%FF"),
            400,
            "invalid_wait",
        ),
        (
            Method::GET,
            format!("/api/query/{id}/status?include=%00"),
            400,
            "invalid_include",
        ),
        (Method::GET, format!("/api/query/{id}/status"), 404, "not_found"),
        (Method::GET, "/api/users/%00/memory".into(), 400, "invalid_id"),
        (Method::GET, "/api/query/x/events".into(), 400, "invalid_id"),
        (Method::POST, "/api/query/x/continue".into(), 400, "invalid_id"),
        (Method::GET, "/api/ws?user_id=%00".into(), 400, "invalid_id"),
        (
            Method::GET,
            "/api/ws?request_id=1&user_id=2".into(),
            400,
            "invalid_query",
        ),
        (Method::GET, "/api/ws?user_id=%FF".into(), 400, "invalid_id"),
        (Method::DELETE, "/api/query".into(), 405, "method_not_allowed"),
        (Method::GET, "/api/query".into(), 405, "method_not_allowed"),
        (Method::POST, "/healthz".into(), 405, "method_not_allowed"),
        (Method::GET, "/api/%FF".into(), 404, "no_route"),
    ];
    for (method, path, want, code) in paths {
        let shown: String = path.chars().take(80).collect();
        assert_eq!(
            answer(api, method, &path, None, Vec::new()).await,
            (StatusCode::from_u16(want).unwrap(), code.to_owned()),
            "{shown}"
        );
    }
}

/// After all that, a good request is stored, and no refusal reached the
/// database.
async fn the_daemon_still_serves(api: &Api, c: &tokio_postgres::Client, good: Vec<u8>) {
    assert_eq!(
        answer(api, Method::POST, "/api/query", Some("application/json"), good)
            .await
            .0,
        StatusCode::ACCEPTED
    );
    assert_eq!(count(c, "SELECT count(*) FROM pipeline_runs").await, 1);
    let log = api.d.plain_log();
    assert!(
        !log.contains("http: database error"),
        "a refusal reached the database:\n{log}"
    );
}

mod props {
    //! Property tests of the parsers of client input: they never panic, a
    //! refusal is a 4xx with a code, and what they accept is storable.

    use std::time::Duration;

    use maas::http::api::parse_wait;
    use maas::http::input::{ECHO_CHARS, MAX_QUERY_CHARS, parse_id, parse_submission};
    use proptest::prelude::*;
    use serde_json::json;

    /// The seconds a wait's text says, read apart from the parser: a
    /// number, then `ms`, `s`, `m` or no unit (seconds). `None` when the
    /// rest is not a number.
    fn written_secs(raw: &str) -> Option<f64> {
        let text = raw.trim();
        let (number, unit) = [("ms", 0.001), ("s", 1.0), ("m", 60.0)]
            .iter()
            .find_map(|(suffix, secs)| text.strip_suffix(suffix).map(|n| (n, *secs)))
            .unwrap_or((text, 1.0));
        number.trim().parse::<f64>().ok().map(|n| n * unit)
    }

    /// `got` is `secs` to the nanosecond (the float's own rounding aside).
    fn same_wait(got: Duration, secs: f64) -> bool {
        (got.as_secs_f64() - secs).abs() <= 1e-9 + secs * 1e-12
    }

    /// A valid body with random bytes spliced in, replaced or cut.
    fn bodies() -> impl Strategy<Value = Vec<u8>> {
        crate::props::mutated(
            json!({"user_id": "6f1c2d7e-0a4b-4c55-9d6e-3b2a1f0e9d8c", "thread_id": null, "query": "what did we decide?"})
                .to_string(),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        #[test]
        fn submissions_are_storable_or_a_4xx(body in bodies()) {
            match parse_submission(&body) {
                Ok(s) => {
                    prop_assert!(!s.query.contains('\0'));
                    prop_assert!(!s.query.trim().is_empty());
                    prop_assert!(s.query.chars().count() <= MAX_QUERY_CHARS);
                }
                Err(e) => {
                    prop_assert!(maas::http::error::status(e.kind).is_client_error(), "{e:?}");
                    prop_assert!(!e.message.is_empty());
                }
            }
        }

        #[test]
        fn any_query_text_is_stored_or_refused_as_invalid_text(query in "\\PC{0,40}|.{0,40}", nul in any::<bool>()) {
            let query = if nul { format!("{query}\u{0}") } else { query };
            let body = json!({"user_id": "6f1c2d7e-0a4b-4c55-9d6e-3b2a1f0e9d8c", "query": query}).to_string();
            match parse_submission(body.as_bytes()) {
                Ok(s) => prop_assert_eq!(s.query, query),
                Err(e) => prop_assert!(
                    e.code.as_str() == "empty_field" || (e.code.as_str() == "invalid_text" && query.contains('\0')),
                    "{e:?} for {query:?}"
                ),
            }
        }

        /// Whatever the text, an accepted wait is what it says: a finite,
        /// non-negative number in a known unit, to the nanosecond.
        #[test]
        fn accepted_waits_are_what_their_text_says(raw in "[0-9.eE+-]{0,12}(ms|s|m|h|)|.{0,16}") {
            if let Some(d) = parse_wait(&raw) {
                let secs = written_secs(&raw);
                prop_assert!(secs.is_some_and(|s| s.is_finite() && s >= 0.0), "{raw:?} accepted as {d:?}");
                prop_assert!(same_wait(d, secs.unwrap_or_default()), "{raw:?} read as {d:?}, says {secs:?} s");
            }
        }

        /// A number with a fraction in each unit is accepted as written; a
        /// negative one, hours and a wait too long for a `Duration` are
        /// refused.
        #[test]
        fn waits_in_each_unit_are_read_and_the_rest_refused(
            whole in 0u64..10_000_000,
            frac in 0u32..1000,
            unit in prop_oneof![Just("ms"), Just("s"), Just("m"), Just("")],
        ) {
            let text = format!("{whole}.{frac:03}{unit}");
            let secs = written_secs(&text).unwrap_or(f64::NAN);
            let got = parse_wait(&text);
            prop_assert!(got.is_some_and(|d| same_wait(d, secs)), "{text:?} read as {got:?}, says {secs} s");
            let negative = format!("-{}.{frac:03}{unit}", whole + 1);
            prop_assert_eq!(parse_wait(&negative), None, "{}", negative);
            prop_assert_eq!(parse_wait(&format!("{whole}h")), None);
            prop_assert_eq!(parse_wait(&format!("{}{unit}", "9".repeat(40))), None);
        }

        #[test]
        fn plain_seconds_round_trip(ms in 0u64..10_000_000) {
            prop_assert_eq!(parse_wait(&format!("{ms}ms")), Some(Duration::from_millis(ms)));
            prop_assert_eq!(parse_wait(&format!("{}s", ms / 1000)), Some(Duration::from_secs(ms / 1000)));
        }

        #[test]
        fn ids_parse_or_are_refused_with_a_short_echo(raw in ".{0,300}") {
            match parse_id(&raw, "request") {
                Ok(id) => prop_assert_eq!(id, raw.parse::<uuid::Uuid>().unwrap()),
                Err(e) => {
                    prop_assert_eq!(e.code.as_str(), "invalid_id");
                    prop_assert!(e.message.chars().count() < ECHO_CHARS * 10 + 64, "{}", e.message);
                }
            }
        }

        #[test]
        fn uuids_in_any_case_parse(id in any::<u128>(), upper in any::<bool>()) {
            let u = uuid::Uuid::from_u128(id);
            let s = if upper { u.to_string().to_uppercase() } else { u.to_string() };
            prop_assert_eq!(parse_id(&s, "user").ok(), Some(u));
        }
    }
}

/// A NUL in any text a user or operator route stores (a record's new
/// summary, a `reason` or `actor` in a body or a query, an operator
/// action's reason) is a 400 `invalid_text` naming the field, never a 500,
/// and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_stored_text_is_a_400_naming_the_field() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let record: i64 = c
        .query_one(
            "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, tags, summary, raw_log_ids)
             VALUES ($1, now() - interval '2 days', now() - interval '1 day', '{}', 'kept', '{}') RETURNING id",
            &[&user],
        )
        .await
        .unwrap()
        .get(0);
    let put = format!("/api/users/{user}/memory/{record}");
    let json = Some("application/json");
    for (field, body) in [
        ("summary", json!({"summary": "a\u{0}b"})),
        ("reason", json!({"summary": "new", "reason": "why\u{0}"})),
        ("actor", json!({"summary": "new", "actor": "\u{0}me"})),
    ] {
        let resp = api
            .authed(api.http.put(api.url(&put)).json(&body))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{field}");
        let got: Value = resp.json().await.unwrap();
        assert_eq!(got["code"], "invalid_text", "{field}: {got}");
        assert!(got["error"].as_str().unwrap().starts_with(field), "{field}: {got}");
    }
    for path in [
        format!("/api/users/{user}/memory/{record}?reason=a%00b"),
        format!("/api/users/{user}/memory/{record}?actor=%00"),
        format!("/api/users/{user}?reason=%00"),
    ] {
        assert_eq!(
            answer(&api, Method::DELETE, &path, None, Vec::new()).await,
            (StatusCode::BAD_REQUEST, "invalid_text".to_owned()),
            "{path}"
        );
    }
    let cancel = format!("/api/query/{}/cancel", Uuid::new_v4());
    assert_eq!(
        answer(&api, Method::POST, &cancel, json, br#"{"reason":"x\u0000"}"#.to_vec()).await,
        (StatusCode::BAD_REQUEST, "invalid_text".to_owned()),
    );
    let summary: String = c
        .query_one("SELECT summary FROM lsm_storage WHERE id = $1", &[&record])
        .await
        .unwrap()
        .get(0);
    assert_eq!(summary, "kept");
}

/// `maasctl` escapes control characters in the user-supplied text it
/// prints: a query, an answer, an error and an operator action's reason
/// and actor holding terminal escapes show as `\u{1b}`, never as the
/// escape itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maasctl_escapes_control_characters_in_what_it_prints() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let evil = "\u{1b}[2J\u{1b}]0;owned\u{7}red\u{202e}txt";
    let id: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, status, final_answer, error) \
             VALUES (gen_random_uuid(), $1, 'FAILED', $1, $1) RETURNING id",
            &[&evil],
        )
        .await
        .unwrap()
        .get(0);
    let id = id.to_string();
    let (code, out, err) = crate::support::cli::maasctl_env(
        &db.url,
        &["requests", "retry", &id, "--reason", evil],
        &[("MAAS_OPERATOR", evil)],
    );
    assert_eq!(code, 0, "{out}{err}");
    for args in [vec!["requests", "show", id.as_str()], vec!["requests", "list"]] {
        let (code, out, err) = crate::support::cli::maasctl(&db.url, &args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{202e}'),
            "{args:?}: {out:?}"
        );
        assert!(out.contains("\\u{1b}[2J"), "{args:?}: {out}");
    }
}
