//! The HTTP embedding providers: OpenAI-compatible `POST {base}/embeddings`
//! and Gemini `POST {base}/v1beta/models/{model}:batchEmbedContents`.
//!
//! Each call is shaped as an [`Outgoing`] (so the key header is marked
//! sensitive) and posted once; this module never retries. A non-2xx answer
//! is classified by the chat path's [`classify_status`]: the error quotes
//! the status and the provider's own message, truncated and scrubbed of the
//! key, and is retryable when the chat path would retry or wait (transport
//! failures, 408, a 429 that passes with time, 5xx), not for other 4xx or
//! an exhausted quota.
//!
//! Guarantees: on success there is exactly one vector per input text, in
//! input order (OpenAI items are placed by their `index`, each of `0..n`
//! exactly once), all of the same non-zero length, every component a finite
//! `f32`. Any other reply is a non-retryable error saying what was wrong,
//! never a short or reordered result. No input makes this panic; the body
//! read is bounded. Normalisation to unit length is the caller's.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::EmbedError;
use crate::llm::ProviderKind;
use crate::llm::config::Endpoint;
use crate::llm::error::{LlmDisposition, classify_status, scrub};
use crate::llm::wire::Outgoing;
use crate::secret::Secret;

/// Reply bytes allowed per text (3072 components of pretty-printed JSON
/// fit many times over), plus 1 MiB: a misbehaving endpoint must not
/// exhaust memory.
const MAX_BODY_PER_TEXT: usize = 256 * 1024;

/// OpenAI-compatible embeddings of `texts`, in order.
pub(super) async fn openai(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    model: &str,
    texts: &[String],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let call = Outgoing {
        url: format!("{}/embeddings", endpoint.base_url),
        headers: vec![("authorization", format!("Bearer {}", endpoint.api_key.expose()))],
        body: json!({"model": model, "input": texts}),
    };
    embed(
        http,
        ProviderKind::OpenAi,
        &endpoint.api_key,
        call,
        texts.len(),
        parse_openai,
    )
    .await
}

/// Gemini `batchEmbedContents` embeddings of `texts`, in order.
pub(super) async fn gemini(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    model: &str,
    texts: &[String],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    // Accept "models/text-embedding-004" as well as the bare name.
    let model = model.strip_prefix("models/").unwrap_or(model);
    let requests: Vec<Value> = texts
        .iter()
        .map(|t| json!({"model": format!("models/{model}"), "content": {"parts": [{"text": t}]}}))
        .collect();
    let call = Outgoing {
        url: format!("{}/v1beta/models/{model}:batchEmbedContents", endpoint.base_url),
        headers: vec![("x-goog-api-key", endpoint.api_key.expose().to_owned())],
        body: json!({"requests": requests}),
    };
    embed(
        http,
        ProviderKind::Gemini,
        &endpoint.api_key,
        call,
        texts.len(),
        parse_gemini,
    )
    .await
}

type Parser = fn(&[u8], usize) -> Result<Vec<Vec<f32>>, String>;

/// Posts `call` (for `texts` texts) and parses a 2xx body with `parse`.
async fn embed(
    http: &reqwest::Client,
    provider: ProviderKind,
    key: &Secret,
    call: Outgoing,
    texts: usize,
    parse: Parser,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    if texts == 0 {
        return Ok(Vec::new());
    }
    let name = provider.as_str();
    let transport = |e: reqwest::Error| EmbedError::Call {
        provider: name,
        message: scrub(&error_chain(&e.without_url()), Some(key)),
        retryable: true,
    };
    let mut response = call.build(http).send().await.map_err(transport)?;
    let status = response.status().as_u16();
    let limit = MAX_BODY_PER_TEXT.saturating_mul(texts).saturating_add(1 << 20);
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(invalid(name, format!("HTTP {status}: reply larger than {limit} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    if response.status().is_success() {
        return parse(&body, texts).map_err(|message| invalid(name, message));
    }
    let now = SystemTime::now();
    let error = classify_status(provider, status, response.headers(), &body, now, Some(key));
    let retryable = matches!(
        error.disposition(),
        LlmDisposition::Retry | LlmDisposition::RateLimited { .. } | LlmDisposition::Throttled { .. }
    );
    // The text without its "openai: " prefix (EmbedError adds its own),
    // with the status when the classification's wording leaves it out.
    let full = error.to_string();
    let text = full.strip_prefix(name).and_then(|t| t.strip_prefix(": "));
    let text = text.unwrap_or(&full);
    let message = if text.contains(&format!("HTTP {status}")) {
        text.to_owned()
    } else {
        format!("HTTP {status}: {text}")
    };
    Err(EmbedError::Call {
        provider: name,
        message,
        retryable,
    })
}

/// A reply this module cannot use: not retryable.
fn invalid(provider: &'static str, message: String) -> EmbedError {
    EmbedError::Call {
        provider,
        message,
        retryable: false,
    }
}

/// A transport error with its causes ("error sending request: connection refused").
fn error_chain(error: &reqwest::Error) -> String {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// `{"data": [{"index": i, "embedding": [...]}, ...]}`, placed by `index`.
fn parse_openai(body: &[u8], texts: usize) -> Result<Vec<Vec<f32>>, String> {
    let data = list(body, "data", texts)?;
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; texts];
    for (position, item) in data.iter().enumerate() {
        let index = item.get("index").and_then(Value::as_u64);
        let index = index.ok_or_else(|| format!("item {position} has no integer `index`"))?;
        let slot = usize::try_from(index).ok().and_then(|i| slots.get_mut(i));
        let slot = slot.ok_or_else(|| format!("index {index} is out of range for {texts} texts"))?;
        if slot.is_some() {
            return Err(format!("index {index} appears twice"));
        }
        *slot = Some(components(item.get("embedding"), position)?);
    }
    // As many items as texts, each index in range and distinct: all filled.
    same_lengths(slots.into_iter().flatten().collect())
}

/// `{"embeddings": [{"values": [...]}, ...]}`, in input order.
fn parse_gemini(body: &[u8], texts: usize) -> Result<Vec<Vec<f32>>, String> {
    let list = list(body, "embeddings", texts)?;
    let vectors = list.iter().enumerate().map(|(i, e)| components(e.get("values"), i));
    same_lengths(vectors.collect::<Result<_, _>>()?)
}

/// The array `field` of the JSON object `body`, holding one item per text.
fn list(body: &[u8], field: &str, texts: usize) -> Result<Vec<Value>, String> {
    let mut reply: Value = serde_json::from_slice(body).map_err(|e| format!("reply is not JSON: {e}"))?;
    let Some(Value::Array(items)) = reply.get_mut(field).map(Value::take) else {
        return Err(format!("reply has no `{field}` array"));
    };
    if items.len() != texts {
        return Err(format!("reply has {} vectors for {texts} texts", items.len()));
    }
    Ok(items)
}

/// The components of vector `i`: numbers that fit an `f32`.
fn components(vector: Option<&Value>, i: usize) -> Result<Vec<f32>, String> {
    let items = vector.and_then(Value::as_array);
    let items = items.ok_or_else(|| format!("vector {i} is not an array of numbers"))?;
    let mut out = Vec::with_capacity(items.len());
    for (j, x) in items.iter().enumerate() {
        let wide = x
            .as_f64()
            .ok_or_else(|| format!("vector {i} component {j} is not a number"))?;
        // Narrowing is the point (vectors travel as real[]); a value
        // beyond f32 becomes infinite and is refused.
        #[allow(clippy::cast_possible_truncation)]
        let narrow = wide as f32;
        if !narrow.is_finite() {
            return Err(format!("vector {i} component {j} is beyond the range of f32"));
        }
        out.push(narrow);
    }
    Ok(out)
}

/// `vectors` if they all have the same, non-zero, number of components.
fn same_lengths(vectors: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, String> {
    let dims = vectors.first().map_or(0, Vec::len);
    if !vectors.is_empty() && dims == 0 {
        return Err("vector 0 is empty".into());
    }
    match vectors.iter().enumerate().find(|(_, v)| v.len() != dims) {
        Some((i, v)) => Err(format!("vector {i} has {} components, vector 0 has {dims}", v.len())),
        None => Ok(vectors),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode, Uri};

    use super::*;

    const KEY: &str = "sk-test-key-42";

    /// What the test server received: path, headers, JSON body.
    type Seen = (String, HeaderMap, Value);
    type Got = Result<Vec<Vec<f32>>, EmbedError>;

    /// Starts a server on 127.0.0.1 answering `status` and `reply`, calls
    /// `provider` with `n` texts against it; the result and the requests.
    async fn run(provider: ProviderKind, status: u16, reply: Value, n: usize) -> (Got, Vec<Seen>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let reply = reply.to_string();
        let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let (log, reply) = (Arc::clone(&log), reply.clone());
            async move {
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                log.lock().unwrap().push((uri.path().to_owned(), headers, body));
                (StatusCode::from_u16(status).unwrap(), reply)
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let got = call(provider, base, n).await;
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        (got, seen)
    }

    async fn call(provider: ProviderKind, base: String, n: usize) -> Got {
        let http = reqwest::Client::new();
        let texts: Vec<String> = (0..n).map(|i| format!("text {i}")).collect();
        let endpoint = |base_url| Endpoint {
            base_url,
            api_key: Secret::new(KEY),
        };
        match provider {
            ProviderKind::Gemini => gemini(&http, &endpoint(base), "models/text-embedding-004", &texts).await,
            _ => openai(&http, &endpoint(format!("{base}/v1")), "text-embedding-3-small", &texts).await,
        }
    }

    fn error(got: Got) -> (String, bool) {
        match got {
            Err(EmbedError::Call { message, retryable, .. }) => (message, retryable),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn openai_orders_by_index_and_sends_model_inputs_and_key() {
        let reply = json!({"object": "list", "data": [
            {"index": 2, "embedding": [0.0, 3.0]},
            {"index": 0, "embedding": [1.0, 0.0]},
            {"index": 1, "embedding": [0.0, 2.0]},
        ]});
        let (got, seen) = run(ProviderKind::OpenAi, 200, reply, 3).await;
        assert_eq!(got.unwrap(), vec![vec![1.0, 0.0], vec![0.0, 2.0], vec![0.0, 3.0]]);
        let [(path, headers, body)] = &seen[..] else {
            panic!("{}", seen.len())
        };
        assert_eq!(path, "/v1/embeddings");
        assert_eq!(headers["authorization"], format!("Bearer {KEY}").as_str());
        let inputs = json!(["text 0", "text 1", "text 2"]);
        assert_eq!(body, &json!({"model": "text-embedding-3-small", "input": inputs}));
    }

    #[tokio::test]
    async fn gemini_keeps_order_and_sends_requests_and_key() {
        let reply = json!({"embeddings": [{"values": [1.0, 2.0]}, {"values": [3.0, 4.0]}]});
        let (got, seen) = run(ProviderKind::Gemini, 200, reply, 2).await;
        assert_eq!(got.unwrap(), vec![vec![1.0, 2.0], vec![3.0, 4.0]]);
        let [(path, headers, body)] = &seen[..] else {
            panic!("{}", seen.len())
        };
        assert_eq!(path, "/v1beta/models/text-embedding-004:batchEmbedContents");
        assert_eq!(headers["x-goog-api-key"], KEY);
        assert!(headers.get("authorization").is_none());
        let request = |t: &str| json!({"model": "models/text-embedding-004", "content": {"parts": [{"text": t}]}});
        assert_eq!(body, &json!({"requests": [request("text 0"), request("text 1")]}));
    }

    #[tokio::test]
    async fn a_429_is_retryable_and_quotes_the_provider_scrubbed() {
        let reply = json!({"error": {"message": format!("slow down, {KEY}"), "type": "rate_limit_exceeded"}});
        let (message, retryable) = error(run(ProviderKind::OpenAi, 429, reply, 1).await.0);
        assert!(retryable, "{message}");
        assert!(
            message.contains("HTTP 429") && message.contains("slow down"),
            "{message}"
        );
        assert!(!message.contains(KEY), "{message}");
        let reply = json!({"error": {"code": 429, "message": "quota per minute"}});
        let (message, retryable) = error(run(ProviderKind::Gemini, 429, reply, 1).await.0);
        assert!(retryable && message.contains("quota per minute"), "{message}");
    }

    #[tokio::test]
    async fn a_400_or_an_exhausted_quota_is_not_retryable_a_503_is() {
        let reply = json!({"error": {"message": "bad model"}});
        let (message, retryable) = error(run(ProviderKind::OpenAi, 400, reply, 1).await.0);
        assert!(
            !retryable && message.contains("HTTP 400") && message.contains("bad model"),
            "{message}"
        );
        let quota = json!({"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}});
        assert!(!error(run(ProviderKind::OpenAi, 429, quota, 1).await.0).1);
        let (message, retryable) = error(run(ProviderKind::Gemini, 503, json!({}), 1).await.0);
        assert!(retryable && message.contains("HTTP 503"), "{message}");
    }

    #[tokio::test]
    async fn malformed_replies_and_count_mismatches_are_clear_errors() {
        let got = run(ProviderKind::OpenAi, 200, json!("<html>"), 1).await.0;
        assert_eq!(error(got), ("reply has no `data` array".into(), false));
        let got = run(ProviderKind::Gemini, 200, json!({"embeddings": [{"values": [1.0]}]}), 3)
            .await
            .0;
        assert_eq!(error(got), ("reply has 1 vectors for 3 texts".into(), false));
    }

    #[tokio::test]
    async fn a_refused_connection_is_retryable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        assert!(error(call(ProviderKind::OpenAi, base, 1).await).1);
    }

    #[test]
    fn every_wrong_shape_is_named() {
        let openai = |v: Value, n| parse_openai(v.to_string().as_bytes(), n).unwrap_err();
        let gemini = |v: Value, n| parse_gemini(v.to_string().as_bytes(), n).unwrap_err();
        let not_json = parse_openai(b"{not json", 1).unwrap_err();
        assert!(not_json.starts_with("reply is not JSON"), "{not_json}");
        let item = |i: u64| json!({"index": i, "embedding": [1.0]});
        assert_eq!(openai(json!({"data": [item(0), item(0)]}), 2), "index 0 appears twice");
        let out_of_range = openai(json!({"data": [item(0), item(5)]}), 2);
        assert_eq!(out_of_range, "index 5 is out of range for 2 texts");
        let negative = openai(json!({"data": [{"index": -1}]}), 1);
        assert_eq!(negative, "item 0 has no integer `index`");
        assert_eq!(openai(json!({"data": [item(0)]}), 2), "reply has 1 vectors for 2 texts");
        let two = |a: Value, b: Value| json!({"embeddings": [{"values": a}, {"values": b}]});
        let lengths = gemini(two(json!([1.0, 2.0, 3.0, 4.0]), json!([1.0, 2.0, 3.0])), 2);
        assert_eq!(lengths, "vector 1 has 3 components, vector 0 has 4");
        let text = gemini(two(json!([1.0]), json!(["x"])), 2);
        assert_eq!(text, "vector 1 component 0 is not a number");
        let huge = gemini(two(json!([1e300]), json!([1.0])), 2);
        assert_eq!(huge, "vector 0 component 0 is beyond the range of f32");
        let null = gemini(two(json!(null), json!([1.0])), 2);
        assert_eq!(null, "vector 0 is not an array of numbers");
        assert_eq!(gemini(two(json!([]), json!([])), 2), "vector 0 is empty");
    }
}
