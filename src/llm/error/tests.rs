use super::*;
use reqwest::header::HeaderValue;
use serde_json::json;

fn epoch_plus(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn retry_after_seconds() {
    let now = SystemTime::now();
    assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
    assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
    assert_eq!(parse_retry_after("1.5", now), Some(Duration::from_millis(1500)));
    assert_eq!(parse_retry_after("-3", now), None);
    assert_eq!(parse_retry_after("soon", now), None);
    assert_eq!(parse_retry_after("", now), None);
}

#[test]
fn retry_after_http_dates() {
    // 1994-11-06T08:49:37Z = 784111777
    let now = epoch_plus(784_111_777 - 30);
    let thirty = Some(Duration::from_secs(30));
    assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now), thirty);
    assert_eq!(parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now), thirty);
    assert_eq!(parse_retry_after("Sun Nov  6 08:49:37 1994", now), thirty);
    // A date in the past: no wait.
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", epoch_plus(784_111_777 + 5)),
        Some(Duration::ZERO)
    );
}

#[test]
fn proto_durations() {
    assert_eq!(parse_proto_duration("22s"), Some(Duration::from_secs(22)));
    assert_eq!(parse_proto_duration("1.5s"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_proto_duration("0.000001s"), Some(Duration::from_micros(1)));
    assert_eq!(parse_proto_duration("22"), None);
    assert_eq!(parse_proto_duration("-1s"), None);
    assert_eq!(parse_proto_duration("s"), None);
}

fn classify(status: u16, headers: &[(&'static str, &str)], body: &Value) -> LlmError {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.insert(*k, HeaderValue::from_str(v).unwrap());
    }
    classify_status(
        ProviderKind::OpenAi,
        status,
        &map,
        body.to_string().as_bytes(),
        SystemTime::now(),
        Some(&Secret::new("sk-secret-key-123")),
    )
}

fn openai_error(code: &str, message: &str) -> Value {
    json!({"error": {"message": message, "type": code, "code": code}})
}

#[test]
fn classification_case_by_case() {
    type Case = (
        u16,
        Vec<(&'static str, &'static str)>,
        Value,
        &'static str,
        LlmDisposition,
    );
    let cases: Vec<Case> = vec![
        (
            500,
            vec![],
            json!({"error": {"message": "boom"}}),
            "server",
            LlmDisposition::Retry,
        ),
        (503, vec![], json!({}), "server", LlmDisposition::Retry),
        (
            529,
            vec![],
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            "overloaded",
            LlmDisposition::Retry,
        ),
        (408, vec![], json!({}), "timeout", LlmDisposition::Retry),
        (
            429,
            vec![("retry-after", "7")],
            openai_error("rate_limit_exceeded", "slow down"),
            "rate_limited",
            LlmDisposition::RateLimited {
                retry_after: Some(Duration::from_secs(7)),
            },
        ),
        (
            429,
            vec![("retry-after-ms", "250"), ("retry-after", "7")],
            json!({}),
            "rate_limited",
            LlmDisposition::RateLimited {
                retry_after: Some(Duration::from_millis(250)),
            },
        ),
        (
            429,
            vec![],
            json!({}),
            "rate_limited",
            LlmDisposition::RateLimited { retry_after: None },
        ),
        (
            429,
            vec![],
            json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]}}),
            "rate_limited",
            LlmDisposition::RateLimited {
                retry_after: Some(Duration::from_millis(1500)),
            },
        ),
        (
            429,
            vec![],
            openai_error("insufficient_quota", "You exceeded your current quota"),
            "quota_exhausted",
            LlmDisposition::Fail,
        ),
        (
            429,
            vec![],
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "You have reached your API usage limits.",
            "details": {"error_code": "enforced_spend_limit_reached"}}}),
            "quota_exhausted",
            LlmDisposition::Fail,
        ),
        (
            429,
            vec![("retry-after", "22")],
            json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "22s"}]}}),
            "quota_exhausted",
            LlmDisposition::Fail,
        ),
        (
            400,
            vec![],
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "Your credit balance is too low"}}),
            "quota_exhausted",
            LlmDisposition::Fail,
        ),
        (
            402,
            vec![],
            json!({"error": {"message": "Payment required"}}),
            "quota_exhausted",
            LlmDisposition::Fail,
        ),
        (
            400,
            vec![],
            openai_error(
                "context_length_exceeded",
                "This model's maximum context length is 8192 tokens",
            ),
            "token_limit",
            LlmDisposition::TokenLimit,
        ),
        (
            400,
            vec![],
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"}}),
            "token_limit",
            LlmDisposition::TokenLimit,
        ),
        (
            400,
            vec![],
            json!({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."}}),
            "token_limit",
            LlmDisposition::TokenLimit,
        ),
        (413, vec![], json!({}), "token_limit", LlmDisposition::TokenLimit),
        (
            400,
            vec![],
            openai_error("invalid_request_error", "bad temperature"),
            "bad_request",
            LlmDisposition::Fail,
        ),
        (
            404,
            vec![],
            openai_error("model_not_found", "no such model"),
            "bad_request",
            LlmDisposition::Fail,
        ),
        (422, vec![], json!({}), "bad_request", LlmDisposition::Fail),
        (
            401,
            vec![],
            openai_error("invalid_api_key", "Incorrect API key provided: sk-secret-key-123"),
            "auth",
            LlmDisposition::Fail,
        ),
        (
            403,
            vec![],
            json!({"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "denied"}}),
            "auth",
            LlmDisposition::Fail,
        ),
        (302, vec![], json!({}), "bad_request", LlmDisposition::Fail),
    ];
    for (status, headers, body, class, disposition) in cases {
        let err = classify(status, &headers, &body);
        assert_eq!(err.class(), class, "{status} {body}");
        assert_eq!(err.disposition(), disposition, "{status} {body}");
        assert!(!err.to_string().contains("sk-secret-key-123"), "{err}");
    }
}

#[test]
fn provider_message_is_quoted_truncated_and_scrubbed() {
    let long = "x".repeat(2000);
    let err = classify(400, &[], &openai_error("invalid_request_error", &long));
    let LlmError::BadRequest { message, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(message.starts_with("invalid_request_error: xxx"));
    assert_eq!(message.chars().count(), MAX_PROVIDER_MESSAGE + 1);

    let err = classify(401, &[], &openai_error("invalid_api_key", "bad key sk-secret-key-123"));
    assert!(err.to_string().contains("bad key [REDACTED]"), "{err}");

    // Not JSON: the text itself.
    let err = classify_status(
        ProviderKind::Gemini,
        502,
        &HeaderMap::new(),
        b"<html>bad gateway</html>",
        SystemTime::now(),
        None,
    );
    assert_eq!(
        err.to_string(),
        "gemini: server error (HTTP 502): <html>bad gateway</html>"
    );
    // Empty body: the reason phrase.
    let err = classify_status(
        ProviderKind::Anthropic,
        503,
        &HeaderMap::new(),
        b"",
        SystemTime::now(),
        None,
    );
    assert_eq!(
        err.to_string(),
        "anthropic: server error (HTTP 503): Service Unavailable"
    );
}

#[test]
fn injected_failure_is_retryable() {
    assert_eq!(LlmError::Injected.class(), "server");
    assert_eq!(LlmError::Injected.disposition(), LlmDisposition::Retry);
    assert_eq!(LlmError::Injected.to_string(), "offline provider: injected failure");
}
