//! Property tests: the parsers that read what other programs send (the
//! `pipeline_events` payload, provider bodies and headers, the model's
//! analysis) never panic, whatever the input. Each gets random bytes, random
//! text, and mutations of a valid example, so the generator reaches deep into
//! the JSON as well as failing at the first byte.

use std::time::{Duration, SystemTime};

use maas::llm::parse::{self, Parsed};
use maas::llm::{ProviderKind, parse_proto_duration, parse_retry_after};
use maas::secret::Secret;
use proptest::prelude::*;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

/// Valid bodies of each provider, to mutate.
fn openai_body() -> String {
    json!({"id": "x", "object": "chat.completion", "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    .to_string()
}

fn anthropic_body() -> String {
    json!({"id": "x", "type": "message", "role": "assistant", "model": "m",
           "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 1, "output_tokens": 2}})
    .to_string()
}

fn gemini_body() -> String {
    json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
           "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 2}, "modelVersion": "m"})
    .to_string()
}

fn error_bodies() -> Vec<String> {
    vec![
        json!({"error": {"message": "Rate limit", "type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}})
            .to_string(),
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down",
               "details": {"error_code": "enforced_spend_limit_reached"}}})
        .to_string(),
        json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota",
               "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "22s"},
                           {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                            "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel"}]}]}})
        .to_string(),
    ]
}

/// A JSON value of bounded depth, with the keys the parsers look for
/// mixed in among random ones.
fn arb_json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("choices".to_owned()),
        Just("message".to_owned()),
        Just("content".to_owned()),
        Just("text".to_owned()),
        Just("usage".to_owned()),
        Just("candidates".to_owned()),
        Just("parts".to_owned()),
        Just("error".to_owned()),
        Just("details".to_owned()),
        Just("retryDelay".to_owned()),
        Just("@type".to_owned()),
        Just("id".to_owned()),
        Just("status".to_owned()),
        Just("needs_context".to_owned()),
        Just("context_found".to_owned()),
        Just("lsm_record_id".to_owned()),
        Just("search_keywords".to_owned()),
        "[a-z_]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,20}".prop_map(Value::String),
        Just(json!("NEW")),
        Just(json!("1e300s")),
        Just(json!("00000000-0000-0000-0000-000000000000")),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Bytes: random, or a valid example with random edits (truncation, a byte
/// replaced, bytes inserted).
pub(crate) fn mutated(example: String) -> impl Strategy<Value = Vec<u8>> {
    let base = example.into_bytes();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        (any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 0..8)).prop_map({
            let base = base.clone();
            move |(at, insert)| {
                let mut b = base.clone();
                let i = at.index(b.len() + 1);
                b.splice(i..i, insert);
                b
            }
        }),
        (any::<prop::sample::Index>(), any::<u8>()).prop_map({
            let base = base.clone();
            move |(at, byte)| {
                let mut b = base.clone();
                let i = at.index(b.len());
                b[i] = byte;
                b
            }
        }),
        any::<prop::sample::Index>().prop_map(move |at| base[..at.index(base.len() + 1)].to_vec()),
    ]
}

/// A parser's result is an `Ok` or an `Err` with text; reaching here means no panic.
fn no_panic(result: &Result<Parsed, String>) {
    if let Err(e) = result {
        assert!(!e.is_empty(), "an error without a message");
    }
}

fn providers() -> impl Strategy<Value = ProviderKind> {
    prop_oneof![
        Just(ProviderKind::OpenAi),
        Just(ProviderKind::Anthropic),
        Just(ProviderKind::Gemini)
    ]
}

fn header_values() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,40}",
        any::<f64>().prop_map(|f| f.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        Just("1e300".to_owned()),
        Just("Wed, 21 Oct 2015 07:28:00 GMT".to_owned()),
        Just("Sun Nov  6 08:49:37 1994".to_owned()),
        Just("Sunday, 06-Nov-94 08:49:37 GMT".to_owned()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn payload_parser_never_panics(s in ".{0,200}") {
        let _ = maas::listener::parse_payload(&s);
    }

    #[test]
    fn payload_parser_never_panics_on_json(v in arb_json()) {
        let _ = maas::listener::parse_payload(&v.to_string());
    }

    #[test]
    fn payload_parser_never_panics_on_near_misses(
        id in prop_oneof![Just(json!("00000000-0000-0000-0000-000000000001")), arb_json()],
        status in prop_oneof![Just(json!("NEW")), Just(json!("COMPLETED")), arb_json()],
        operation in arb_json(),
    ) {
        let payload = json!({"id": id, "status": status, "operation": operation}).to_string();
        let _ = maas::listener::parse_payload(&payload);
    }

    #[test]
    fn openai_parser_never_panics(body in mutated(openai_body())) {
        no_panic(&parse::openai(&body));
    }

    #[test]
    fn anthropic_parser_never_panics(body in mutated(anthropic_body())) {
        no_panic(&parse::anthropic(&body));
    }

    #[test]
    fn gemini_parser_never_panics(body in mutated(gemini_body())) {
        no_panic(&parse::gemini(&body));
    }

    #[test]
    fn provider_parsers_never_panic_on_json(v in arb_json()) {
        let body = v.to_string().into_bytes();
        no_panic(&parse::openai(&body));
        no_panic(&parse::anthropic(&body));
        no_panic(&parse::gemini(&body));
    }

    #[test]
    fn classifier_never_panics(
        provider in providers(),
        status in prop_oneof![100u16..=599, Just(429u16), Just(400u16), Just(529u16)],
        retry_after in prop::option::of(header_values()),
        retry_after_ms in prop::option::of(header_values()),
        body in prop_oneof![
            prop::sample::select(error_bodies()).prop_flat_map(mutated),
            arb_json().prop_map(|v| v.to_string().into_bytes()),
        ],
        now_secs in any::<u32>(),
    ) {
        let mut headers = HeaderMap::new();
        for (name, value) in [("retry-after", retry_after), ("retry-after-ms", retry_after_ms)] {
            if let Some(v) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
                headers.insert(HeaderName::from_static(name), v);
            }
        }
        let key = Secret::new("sk-proptest-secret");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(now_secs));
        let err = parse::classify_status(provider, status, &headers, &body, now, Some(&key));
        // Everything a caller reads from the error works, and the key is scrubbed.
        let _ = (err.class(), err.disposition(), err.status(), err.retry_after(), err.provider());
        prop_assert!(!err.to_string().contains("sk-proptest-secret"));
    }

    #[test]
    fn retry_after_never_panics(value in header_values(), now_secs in any::<u64>()) {
        let now = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(now_secs)).unwrap_or(SystemTime::UNIX_EPOCH);
        let _ = parse_retry_after(&value, now);
    }

    #[test]
    fn proto_duration_never_panics(
        value in prop_oneof![
            ".{0,20}",
            any::<f64>().prop_map(|f| format!("{f}s")),
            any::<u64>().prop_map(|n| format!("{n}s")),
            "[0-9eE.+-]{0,12}s",
        ]
    ) {
        let _ = parse_proto_duration(&value);
    }

    #[test]
    fn analysis_parser_never_panics(text in ".{0,200}") {
        let _ = maas::stage::analyzer::parse_analysis(&text);
    }

    #[test]
    fn analysis_parser_never_panics_on_json(v in arb_json(), fenced in any::<bool>()) {
        let text = if fenced { format!("```json\n{v}\n```") } else { v.to_string() };
        let _ = maas::stage::analyzer::parse_analysis(&text);
    }

    #[test]
    fn analysis_parser_never_panics_on_mutated_example(
        body in mutated(maas::llm::offline::analysis_example()),
    ) {
        let _ = maas::stage::analyzer::parse_analysis(&String::from_utf8_lossy(&body));
    }
}

#[test]
fn huge_delays_are_no_delay_rather_than_a_panic() {
    let now = SystemTime::now();
    assert_eq!(parse_proto_duration("1e300s"), None);
    assert_eq!(parse_retry_after("1e300", now), None);
    let mut headers = HeaderMap::new();
    headers.insert("retry-after-ms", HeaderValue::from_static("1e300"));
    headers.insert("retry-after", HeaderValue::from_static("2"));
    let err = parse::classify_status(ProviderKind::OpenAi, 429, &headers, b"{}", now, None);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
}

// ------------------------------------------------- the reply sanitiser --

/// Text with NULs, multi-byte characters and lone-surrogate look-alikes
/// mixed in.
fn poisoned_text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        "[a\u{0}é😀\\\\u]{0,40}",
        (0usize..3000).prop_map(|n| "\u{0}x".repeat(n)),
    ]
}

/// JSON with poisoned strings and keys, nested up to 60 levels.
fn poisoned_json() -> impl Strategy<Value = Value> {
    (arb_json(), poisoned_text(), poisoned_text(), 0usize..60).prop_map(|(v, key, s, depth)| {
        let mut deep = json!({ key: s });
        for _ in 0..depth {
            deep = json!([deep]);
        }
        json!({ "needs_context": false, "random": v, "deep": deep })
    })
}

fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(has_nul),
        Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// A claim of a request to record results for.
fn claimed() -> maas::repo::Claimed {
    maas::repo::Claimed {
        id: uuid::Uuid::nil(),
        user_id: uuid::Uuid::nil(),
        thread_id: None,
        user_query: String::new(),
        attempt: 1,
        lease_token: 1,
        analysis: None,
        context: None,
        debug: false,
        tenant_id: uuid::Uuid::nil(),
        stream: false,
        review: false,
        claimed_at: chrono::Utc::now(),
        due_for: Duration::ZERO,
        memory: Vec::new(),
        earlier_turns: 0,
        clarify: maas::model::Clarify::Off,
    }
}

/// One successful result of each stage carrying these values (the analysis
/// with its assemble stage fused), each with `model`'s usage.
fn finished(analysis: Value, answer: String, model: String, context: String) -> Vec<maas::repo::Finished> {
    use maas::repo::{Finished, FusedAssemble, Output, StepUsage};
    let usage = StepUsage {
        model: Some(model),
        ..StepUsage::default()
    };
    let fused = FusedAssemble {
        context: context.clone(),
        context_sources: None,
        tokens: None,
        latency_ms: 1,
        respond: None,
    };
    [
        Output::Analysis {
            analysis,
            fused: Some(fused),
        },
        Output::Context { context, sources: None },
        Output::Answer(answer),
    ]
    .into_iter()
    .map(|output| Finished::succeeded(&claimed(), output, usage.clone(), None))
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever a reply carries, the sanitised result has no NUL, stays
    /// within every bound the schema checks, and sanitising it again
    /// changes nothing.
    #[test]
    fn sanitised_results_are_storable_and_stable(
        analysis in poisoned_json(),
        answer in poisoned_text(),
        model in poisoned_text(),
        context in poisoned_text(),
    ) {
        use maas::sanitize;
        for mut f in finished(analysis, answer, model, context) {
            let _ = maas::dispatcher::sanitise_result(&mut f);
            let a = f.analysis().cloned().unwrap_or(Value::Null);
            prop_assert!(!has_nul(&a));
            prop_assert!(depth(&a) <= sanitize::MAX_DEPTH + 1);
            for s in [f.answer(), f.usage.model.as_deref(), f.context()] {
                prop_assert!(!s.unwrap_or("").contains('\0'));
            }
            prop_assert!(f.usage.model.as_deref().unwrap_or("").chars().count() <= sanitize::MAX_MODEL_CHARS);
            let again = maas::dispatcher::sanitise_result(&mut f);
            prop_assert!(again.found.is_empty(), "sanitising twice found {:?}", again.found);
        }
    }

    /// The analysis parser accepts a valid analysis whatever its strings
    /// hold, keeps a NUL it was given (the sanitiser's job) but never
    /// panics on one, and its output sanitises to storable JSON.
    #[test]
    fn parsed_analyses_sanitise_to_storable_json(keyword in poisoned_text(), v in arb_json()) {
        use maas::sanitize;
        let text = json!({"needs_context": false, "context_type": "none", "time_scope": "none",
                          "search_keywords": [keyword], "context_found": {"lsm_record_id": null, "extra": v}})
            .to_string();
        let parsed = maas::stage::analyzer::parse_analysis(&text);
        prop_assert!(parsed.is_ok(), "a valid analysis refused: {:?}", parsed);
        let mut parsed = parsed.unwrap_or_default();
        prop_assert_eq!(&parsed["search_keywords"], &json!([keyword]));
        let mut found = sanitize::Sanitised::default();
        sanitize::json(&mut parsed, &mut found);
        prop_assert!(!has_nul(&parsed));
        prop_assert!(!parsed.to_string().contains("\\u0000"));
    }
}
