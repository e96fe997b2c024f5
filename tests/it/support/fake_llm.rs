//! A fake LLM provider over real HTTP, for tests, benchmarks and chaos runs.
//!
//! [`FakeLlm::start`] binds an axum server (127.0.0.1, port 0 by default) that
//! speaks three shapes:
//! - OpenAI chat completions: `POST /v1/chat/completions` (so the OpenAI base
//!   URL is [`FakeLlm::openai_base_url`], which ends in `/v1`);
//! - Anthropic Messages: `POST /v1/messages`;
//! - Gemini: `POST /v1beta/models/{model}:generateContent`;
//! - OpenAI embeddings: `POST /v1/embeddings` (recorded as [`Api::OpenAi`]),
//!   answered with a vector of 16 word counts per input (each word counted
//!   in the component its letters' byte sum picks), with a 503 while
//!   [`FakeLlm::set_embeddings_failing`] says so, and with a 400 when an
//!   input holds [`REFUSED_TEXT`].
//!
//! Each shape follows its own script, a queue of [`Reply`]s pushed with
//! [`FakeLlm::push`]: a completion with given text and usage, any status with
//! headers and body (429 with `Retry-After`, 500, 529, spend limits, token
//! limits…), any of those after a delay, or a body that is not JSON. When a
//! script is empty the server answers with the default reply: a completion
//! with a fixed text, optionally after a fixed latency ([`FakeConfig`],
//! [`FakeLlm::set_default`]).
//!
//! Streams: a request that asks for one (OpenAI and Anthropic `"stream":
//! true`, Gemini `:streamGenerateContent`) is answered in the route's
//! server-sent events: a completion word by word, a [`Reply::Stream`] piece
//! by piece (optionally paced), usage at the end, then the end event
//! (`[DONE]`, `message_stop`, the chunk with `finishReason`). A stream can
//! carry a [`StreamFault`]: a stall (a pause mid-answer), a cut connection,
//! the provider's error event mid-answer, or no end event. Error replies are
//! sent as they are, with their status.
//!
//! Every request is recorded before it is answered ([`Recorded`]: path,
//! lower-cased headers, parsed JSON body, arrival instant), so tests can
//! assert model, temperature, token limit and auth headers, and measure when
//! requests arrived. [`FakeLlm::wait_for_requests`] waits on a condition with
//! a deadline instead of sleeping.
//!
//! For chaos runs, [`FakeLlm::set_faults`] makes the default reply fail at
//! random with configured rates ([`FaultRates`]: 429 with `Retry-After`, 500,
//! a delay beyond the client timeout, a body that is not JSON), and
//! [`FakeLlm::go_down`] / [`FakeLlm::come_back`] make the provider
//! unreachable for a while (the listener is closed, idle connections are shut,
//! new ones are refused; the same port is bound again afterwards).
//!
//! The module depends only on axum, tokio, futures-util and serde_json, so a
//! benchmark or chaos binary can include it with `#[path = …] mod fake_llm;`.

#![allow(dead_code, reason = "shared harness: not every user calls every helper")]
#![allow(clippy::expect_used, reason = "test harness: failing loudly is the point")]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The API shapes the fake speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI chat completions.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Gemini generateContent.
    Gemini,
}

impl Api {
    /// All three shapes.
    pub const ALL: [Api; 3] = [Api::OpenAi, Api::Anthropic, Api::Gemini];

    /// The provider name maas uses for this shape.
    pub fn provider(self) -> &'static str {
        match self {
            Api::OpenAi => "openai",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
        }
    }
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A successful completion in the route's shape, echoing the model asked for.
    Completion {
        /// The generated text (may be empty, to test empty completions).
        text: String,
        /// Reported input tokens.
        prompt_tokens: u32,
        /// Reported output tokens.
        completion_tokens: u32,
    },
    /// Any status, headers and raw body.
    Http {
        /// HTTP status.
        status: u16,
        /// Extra response headers.
        headers: Vec<(String, String)>,
        /// The body, sent as is.
        body: String,
    },
    /// A streamed answer (to a request that asks for one; otherwise the
    /// pieces joined as one completion), with a fault if any.
    Stream {
        /// The answer's pieces, in order; each is one event.
        pieces: Vec<String>,
        /// Reported input tokens.
        prompt_tokens: u32,
        /// Reported output tokens.
        completion_tokens: u32,
        /// The pause before each piece after the first.
        pace: Duration,
        /// What goes wrong, if anything.
        fault: Option<StreamFault>,
    },
    /// Another reply, sent after a delay (e.g. longer than the client timeout).
    Delayed {
        /// How long to hold the request.
        delay: Duration,
        /// What to answer then.
        reply: Box<Reply>,
    },
}

impl Reply {
    /// A completion with this text and usage 10 in / 5 out.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Completion {
            text: text.into(),
            prompt_tokens: 10,
            completion_tokens: 5,
        }
    }

    /// The same completion (or stream) with other usage figures (no effect
    /// on other replies).
    #[must_use]
    pub fn with_usage(self, prompt: u32, completion: u32) -> Reply {
        match self {
            Reply::Completion { text, .. } => Reply::Completion {
                text,
                prompt_tokens: prompt,
                completion_tokens: completion,
            },
            Reply::Stream {
                pieces, pace, fault, ..
            } => Reply::Stream {
                pieces,
                prompt_tokens: prompt,
                completion_tokens: completion,
                pace,
                fault,
            },
            other => other,
        }
    }

    /// A streamed answer in these pieces, usage 10 in / 5 out, no pace, no fault.
    pub fn stream(pieces: &[&str]) -> Reply {
        Reply::Stream {
            pieces: pieces.iter().map(|p| (*p).to_owned()).collect(),
            prompt_tokens: 10,
            completion_tokens: 5,
            pace: Duration::ZERO,
            fault: None,
        }
    }

    /// The same stream with `pace` before each piece after the first (no
    /// effect on other replies).
    #[must_use]
    pub fn paced(self, pace: Duration) -> Reply {
        match self {
            Reply::Stream {
                pieces,
                prompt_tokens,
                completion_tokens,
                fault,
                ..
            } => Reply::Stream {
                pieces,
                prompt_tokens,
                completion_tokens,
                pace,
                fault,
            },
            other => other,
        }
    }

    /// The same stream with a fault (no effect on other replies).
    #[must_use]
    pub fn with_fault(self, fault: StreamFault) -> Reply {
        match self {
            Reply::Stream {
                pieces,
                prompt_tokens,
                completion_tokens,
                pace,
                ..
            } => Reply::Stream {
                pieces,
                prompt_tokens,
                completion_tokens,
                pace,
                fault: Some(fault),
            },
            other => other,
        }
    }

    /// Any status with a raw body.
    pub fn status(status: u16, body: impl Into<String>) -> Reply {
        Reply::Http {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
        }
    }

    /// Adds a response header (no effect on completions).
    #[must_use]
    pub fn with_header(self, name: impl Into<String>, value: impl Into<String>) -> Reply {
        match self {
            Reply::Http {
                status,
                mut headers,
                body,
            } => {
                headers.push((name.into(), value.into()));
                Reply::Http { status, headers, body }
            }
            Reply::Delayed { delay, reply } => Reply::Delayed {
                delay,
                reply: Box::new(reply.with_header(name, value)),
            },
            completion => completion,
        }
    }

    /// This reply, after `delay`.
    #[must_use]
    pub fn after(self, delay: Duration) -> Reply {
        Reply::Delayed {
            delay,
            reply: Box::new(self),
        }
    }

    /// A provider-shaped error body: OpenAI `{"error":{message,type,code}}`,
    /// Anthropic `{"type":"error","error":{type,message}}`, Gemini
    /// `{"error":{code,message,status,details}}`. `kind` is the OpenAI
    /// type/code, the Anthropic error type or the Gemini status.
    pub fn error(api: Api, status: u16, kind: &str, message: &str, details: Value) -> Reply {
        Reply::status(status, error_body(api, status, kind, message, details).to_string())
    }

    /// 500 with a generic body.
    pub fn server_error() -> Reply {
        Reply::status(
            500,
            json!({"error": {"message": "internal server error", "type": "server_error"}}).to_string(),
        )
    }

    /// Anthropic's 529 overloaded.
    pub fn overloaded() -> Reply {
        Reply::status(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string(),
        )
    }

    /// 200 with a body that is not JSON.
    pub fn invalid_json() -> Reply {
        Reply::Http {
            status: 200,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: "this is not json {".into(),
        }
    }

    /// A per-minute rate limit in the provider's shape, with `Retry-After`
    /// when given (seconds or an HTTP date).
    pub fn rate_limited(api: Api, retry_after: Option<&str>) -> Reply {
        let reply = match api {
            Api::OpenAi => Reply::error(
                api,
                429,
                "rate_limit_exceeded",
                "Rate limit reached for requests per min (RPM): Limit 3, Used 3, Requested 1.",
                Value::Null,
            ),
            Api::Anthropic => Reply::error(
                api,
                429,
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
                Value::Null,
            ),
            Api::Gemini => Reply::error(
                api,
                429,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota, please check your plan and billing details.",
                json!([per_minute_violation()]),
            ),
        };
        match retry_after {
            Some(value) => reply.with_header("retry-after", value),
            None => reply,
        }
    }

    /// Gemini's 429 with the delay in the body (`RetryInfo.retryDelay`,
    /// e.g. `"22s"`) and no header.
    pub fn gemini_retry_info(delay: &str) -> Reply {
        Reply::error(
            Api::Gemini,
            429,
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details.",
            json!([
                per_minute_violation(),
                {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": "Learn more", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
            ]),
        )
    }

    /// A 429 that means the money or the daily quota is gone: OpenAI
    /// `insufficient_quota`, Anthropic `enforced_spend_limit_reached`,
    /// Gemini a per-day quota violation (with a RetryInfo, which must not
    /// make it look transient).
    pub fn spend_limit(api: Api) -> Reply {
        match api {
            Api::OpenAi => Reply::error(
                api,
                429,
                "insufficient_quota",
                "You exceeded your current quota, please check your plan and billing details.",
                Value::Null,
            ),
            Api::Anthropic => Reply::error(
                api,
                429,
                "rate_limit_error",
                "You have reached your API usage limits: your organization has crossed its monthly API usage threshold.",
                json!({"error_code": "enforced_spend_limit_reached"}),
            ),
            Api::Gemini => Reply::error(
                api,
                429,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota, please check your plan and billing details.",
                json!([
                    {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                        "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                        "quotaValue": "250"
                    }]},
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "40s"}
                ]),
            ),
        }
    }

    /// The provider's context-length error.
    pub fn token_limit(api: Api) -> Reply {
        match api {
            Api::OpenAi => Reply::error(
                api,
                400,
                "context_length_exceeded",
                "This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 tokens.",
                Value::Null,
            ),
            Api::Anthropic => Reply::error(
                api,
                400,
                "invalid_request_error",
                "prompt is too long: 208310 tokens > 200000 maximum",
                Value::Null,
            ),
            Api::Gemini => Reply::error(
                api,
                400,
                "INVALID_ARGUMENT",
                "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
                Value::Null,
            ),
        }
    }

    /// A malformed-request 400.
    pub fn bad_request(api: Api) -> Reply {
        let kind = match api {
            Api::OpenAi | Api::Anthropic => "invalid_request_error",
            Api::Gemini => "INVALID_ARGUMENT",
        };
        Reply::error(api, 400, kind, "messages: field required", Value::Null)
    }

    /// A 401 for a bad key.
    pub fn unauthorized(api: Api) -> Reply {
        let kind = match api {
            Api::OpenAi => "invalid_api_key",
            Api::Anthropic => "authentication_error",
            Api::Gemini => "UNAUTHENTICATED",
        };
        Reply::error(api, 401, kind, "invalid x-api-key", Value::Null)
    }
}

/// What goes wrong in a streamed answer; `after` counts the pieces sent
/// before it.
#[derive(Debug, Clone)]
pub enum StreamFault {
    /// A pause after `after` pieces; the answer then goes on to its end.
    Stall {
        /// Pieces sent before the pause.
        after: usize,
        /// How long nothing is sent.
        pause: Duration,
    },
    /// The connection is closed after `after` pieces (the body never ends).
    Cut {
        /// Pieces sent before the cut.
        after: usize,
    },
    /// The provider's error event after `after` pieces, in the route's
    /// shape ([`Reply::error`]'s body: `kind` is the OpenAI type, the
    /// Anthropic error type or the Gemini status; `status` is Gemini's code).
    Error {
        /// Pieces sent before the error.
        after: usize,
        /// The HTTP status the error stands for.
        status: u16,
        /// The provider's error type.
        kind: String,
        /// The provider's message.
        message: String,
    },
    /// Every piece and the usage, then the body ends without the end event
    /// (`[DONE]`, `message_stop`; for Gemini the chunk with `finishReason`).
    NoEnd,
}

impl StreamFault {
    /// Anthropic's `overloaded_error` (529) mid-answer, after `after` pieces;
    /// in the other shapes an error of the kind that stands for a 5xx.
    pub fn overloaded(api: Api, after: usize) -> StreamFault {
        let (status, kind) = match api {
            Api::OpenAi => (500, "server_error"),
            Api::Anthropic => (529, "overloaded_error"),
            Api::Gemini => (503, "UNAVAILABLE"),
        };
        StreamFault::Error {
            after,
            status,
            kind: kind.to_owned(),
            message: "Overloaded".to_owned(),
        }
    }
}

/// A provider-shaped error object (see [`Reply::error`]).
fn error_body(api: Api, status: u16, kind: &str, message: &str, details: Value) -> Value {
    match api {
        Api::OpenAi => {
            json!({"error": {"message": message, "type": kind, "param": null, "code": kind}})
        }
        Api::Anthropic => {
            let mut error = json!({"type": kind, "message": message});
            if !details.is_null() {
                error["details"] = details;
            }
            json!({"type": "error", "error": error, "request_id": "req_fake"})
        }
        Api::Gemini => json!({"error": {
            "code": status, "message": message, "status": kind,
            "details": if details.is_null() { json!([]) } else { details }
        }}),
    }
}

fn per_minute_violation() -> Value {
    json!({"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
        "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
        "quotaValue": "10"
    }]})
}

/// A request as the fake received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Which route.
    pub api: Api,
    /// Path and query.
    pub path: String,
    /// Headers, names lower-cased (the last value wins).
    pub headers: HashMap<String, String>,
    /// The body parsed as JSON (`Null` if it was not JSON).
    pub body: Value,
    /// When it arrived.
    pub received_at: Instant,
}

impl Recorded {
    /// A header value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }
}

/// Start-up settings of the fake.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// Where to listen. Default: 127.0.0.1 port 0 (any free port).
    pub bind: SocketAddr,
    /// Text of the default completion. Default: "fake reply".
    pub default_text: String,
    /// Latency of the default completion. Default: none.
    pub default_latency: Option<Duration>,
}

impl Default for FakeConfig {
    fn default() -> FakeConfig {
        FakeConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            default_text: "fake reply".into(),
            default_latency: None,
        }
    }
}

/// Random faults in place of the default reply (scripted replies are never
/// replaced). Each rate is a probability per request; they are tried in the
/// order of the fields and the rest of the time the default reply is sent.
#[derive(Debug, Clone, Default)]
pub struct FaultRates {
    /// A 429 in the route's shape with `Retry-After: 1`.
    pub rate_limited: f64,
    /// A 500.
    pub server_error: f64,
    /// The default reply, but only after [`FaultRates::timeout_delay`]
    /// (set it beyond the client's timeout).
    pub timeout: f64,
    /// A 200 whose body is not JSON.
    pub invalid_json: f64,
    /// A streamed answer whose connection is cut halfway (streamed calls only).
    pub stream_cut: f64,
    /// A streamed answer with the provider's error event halfway (streamed
    /// calls only).
    pub stream_error: f64,
    /// The hold of a `timeout` fault.
    pub timeout_delay: Duration,
}

/// What the fake answered, by kind (see [`FakeLlm::tally`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Successful completions (scripted or default, delayed or not).
    pub completions: u64,
    /// Random 429s.
    pub rate_limited: u64,
    /// Random 500s.
    pub server_error: u64,
    /// Random holds beyond the client timeout.
    pub timeout: u64,
    /// Random bodies that are not JSON.
    pub invalid_json: u64,
    /// Random streams cut halfway.
    pub stream_cut: u64,
    /// Random streams with an error event halfway.
    pub stream_error: u64,
}

struct Shared {
    scripts: Mutex<HashMap<Api, VecDeque<Reply>>>,
    /// Standing replies for requests whose body holds every needle.
    rules: Mutex<Vec<(Vec<String>, Reply)>>,
    default: Mutex<(String, Option<Duration>)>,
    requests: Mutex<Vec<Recorded>>,
    count: watch::Sender<usize>,
    faults: Mutex<FaultRates>,
    tally: Mutex<Tally>,
    seed: AtomicU64,
    /// `/v1/embeddings` answers 503 while set.
    embeddings_failing: std::sync::atomic::AtomicBool,
}

/// splitmix64 over a shared counter: a uniform number in [0, 1) without a
/// dependency on a random crate.
fn uniform(seed: &AtomicU64) -> f64 {
    let mut z = seed
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    #[allow(clippy::cast_precision_loss, reason = "53 random bits make a uniform f64")]
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    unit
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running fake provider; stops when dropped.
pub struct FakeLlm {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    app: Router,
    /// Closes the listener (graceful shutdown of the server); `None` while down.
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeLlm {
    /// Starts with the default [`FakeConfig`].
    pub async fn start() -> FakeLlm {
        FakeLlm::start_with(FakeConfig::default()).await
    }

    /// Starts with the given settings.
    pub async fn start_with(config: FakeConfig) -> FakeLlm {
        let shared = Arc::new(Shared {
            scripts: Mutex::new(HashMap::new()),
            rules: Mutex::new(Vec::new()),
            default: Mutex::new((config.default_text, config.default_latency)),
            requests: Mutex::new(Vec::new()),
            count: watch::Sender::new(0),
            faults: Mutex::new(FaultRates::default()),
            tally: Mutex::new(Tally::default()),
            seed: AtomicU64::new(u64::from(std::process::id()) << 32),
            embeddings_failing: std::sync::atomic::AtomicBool::new(false),
        });
        let app = Router::new()
            .route(
                "/v1/chat/completions",
                post(
                    |State(s): State<Arc<Shared>>, uri: Uri, headers: HeaderMap, body: Bytes| {
                        handle(s, Api::OpenAi, None, uri, headers, body)
                    },
                ),
            )
            .route(
                "/v1/embeddings",
                post(
                    |State(s): State<Arc<Shared>>, uri: Uri, headers: HeaderMap, body: Bytes| {
                        embeddings(s, uri, headers, body)
                    },
                ),
            )
            .route(
                "/v1/messages",
                post(
                    |State(s): State<Arc<Shared>>, uri: Uri, headers: HeaderMap, body: Bytes| {
                        handle(s, Api::Anthropic, None, uri, headers, body)
                    },
                ),
            )
            .route(
                "/v1beta/models/{model_action}",
                post(
                    |State(s): State<Arc<Shared>>,
                     Path(model_action): Path<String>,
                     uri: Uri,
                     headers: HeaderMap,
                     body: Bytes| {
                        let model = model_action
                            .split_once(':')
                            .map_or(model_action.clone(), |(m, _)| m.to_owned());
                        handle(s, Api::Gemini, Some(model), uri, headers, body)
                    },
                ),
            )
            .with_state(Arc::clone(&shared));
        let listener = TcpListener::bind(config.bind).await.expect("fake LLM: bind");
        let addr = listener.local_addr().expect("fake LLM: local address");
        let (stop, task) = serve(listener, app.clone());
        FakeLlm {
            addr,
            shared,
            task,
            app,
            stop: Some(stop),
        }
    }

    /// From now on, answers every request whose JSON body (as text) holds
    /// every one of `needles` with `reply`, in any shape, before the scripts
    /// and the default (the first matching rule wins). Used to poison one
    /// request among many: a needle from its query, one from its role's model.
    pub fn answer_when(&self, needles: &[&str], reply: Reply) {
        lock(&self.shared.rules).push((needles.iter().map(|n| (*n).to_owned()).collect(), reply));
    }

    /// Makes the provider unreachable: the listener is closed (new
    /// connections are refused) and idle keep-alive connections are shut;
    /// requests already being answered still finish. Returns once a new
    /// connection is refused (panics if that takes over [`SWITCH_WITHIN`]).
    pub async fn go_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
            // The server drops its listener as soon as it sees the signal.
            let deadline = tokio::time::Instant::now() + SWITCH_WITHIN;
            while tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "fake LLM: {} still accepts connections {SWITCH_WITHIN:?} after going down",
                    self.addr
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// Listens again on the same port after [`FakeLlm::go_down`] (panics
    /// if the port cannot be bound again within [`SWITCH_WITHIN`]).
    pub async fn come_back(&mut self) {
        if self.stop.is_some() {
            return;
        }
        let deadline = tokio::time::Instant::now() + SWITCH_WITHIN;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                // The old listener may take a moment to go.
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "fake LLM: cannot listen on {} again within {SWITCH_WITHIN:?}: {e}",
                        self.addr
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let (stop, task) = serve(listener, self.app.clone());
        self.task.abort();
        self.task = task;
        self.stop = Some(stop);
    }

    /// True while the provider listens.
    pub fn is_up(&self) -> bool {
        self.stop.is_some()
    }

    /// Makes `/v1/embeddings` answer 503 (true) or vectors (false).
    pub fn set_embeddings_failing(&self, failing: bool) {
        self.shared.embeddings_failing.store(failing, Ordering::SeqCst);
    }

    /// Replaces the random fault rates of the default reply.
    pub fn set_faults(&self, faults: FaultRates) {
        *lock(&self.shared.faults) = faults;
    }

    /// What the fake has answered so far, by kind.
    pub fn tally(&self) -> Tally {
        lock(&self.shared.tally).clone()
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`: the Anthropic and Gemini base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:<port>/v1`: the OpenAI base URL.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.base_url())
    }

    /// The base URL a client of `api` should use.
    pub fn base_url_for(&self, api: Api) -> String {
        match api {
            Api::OpenAi => self.openai_base_url(),
            Api::Anthropic | Api::Gemini => self.base_url(),
        }
    }

    /// Appends a reply to the script of `api`.
    pub fn push(&self, api: Api, reply: Reply) {
        lock(&self.shared.scripts).entry(api).or_default().push_back(reply);
    }

    /// Scripted replies of `api` not used yet.
    pub fn pending(&self, api: Api) -> usize {
        lock(&self.shared.scripts).get(&api).map_or(0, VecDeque::len)
    }

    /// Changes the reply used when a script is empty.
    pub fn set_default(&self, text: impl Into<String>, latency: Option<Duration>) {
        *lock(&self.shared.default) = (text.into(), latency);
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// The requests of one route.
    pub fn requests_for(&self, api: Api) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.api == api).collect()
    }

    /// How many requests arrived so far.
    pub fn request_count(&self) -> usize {
        *self.shared.count.borrow()
    }

    /// Waits until at least `n` requests have arrived, panicking after
    /// `within`; returns them.
    pub async fn wait_for_requests(&self, n: usize, within: Duration) -> Vec<Recorded> {
        let mut rx = self.shared.count.subscribe();
        tokio::time::timeout(within, rx.wait_for(|c| *c >= n))
            .await
            .unwrap_or_else(|_| panic!("fake LLM: {} of {n} requests within {within:?}", self.request_count()))
            .expect("fake LLM: counter closed");
        self.requests()
    }
}

/// Records a request (path, lower-cased headers, JSON body) and counts it.
fn record(shared: &Shared, api: Api, uri: &Uri, headers: &HeaderMap, body: Value) {
    let headers = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    lock(&shared.requests).push(Recorded {
        api,
        path: uri
            .path_and_query()
            .map_or_else(|| uri.path().to_owned(), ToString::to_string),
        headers,
        body,
        received_at: Instant::now(),
    });
    shared.count.send_modify(|c| *c += 1);
}

/// How long [`FakeLlm::go_down`] waits for the listener to close and
/// [`FakeLlm::come_back`] for the port to be free again.
pub const SWITCH_WITHIN: Duration = Duration::from_secs(10);

/// An embeddings input holding this is refused with a 400 (like a text too
/// long for the model).
pub const REFUSED_TEXT: &str = "EMBED-REFUSED";

/// `POST /v1/embeddings`: 16 word counts per input, in input order.
async fn embeddings(shared: Arc<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let inputs: Vec<String> = body
        .get("input")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    record(&shared, Api::OpenAi, &uri, &headers, body);
    if shared.embeddings_failing.load(Ordering::SeqCst) {
        return json_response(
            503,
            &json!({"error": {"message": "embeddings are down", "type": "server_error"}}),
        );
    }
    if inputs.iter().any(|t| t.contains(REFUSED_TEXT)) {
        return json_response(
            400,
            &json!({"error": {"message": "this input is too long for the model", "type": "invalid_request_error"}}),
        );
    }
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let mut v = [0.0f64; 16];
            for word in text
                .to_lowercase()
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
            {
                let slot = word.bytes().map(usize::from).sum::<usize>() % 16;
                v[slot] += 1.0;
            }
            v[15] += 0.01;
            json!({"object": "embedding", "index": i, "embedding": v.to_vec()})
        })
        .collect();
    json_response(200, &json!({"object": "list", "data": data, "model": "fake-embedding"}))
}

fn json_response(status: u16, body: &Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("fake LLM: response")
}

async fn handle(
    shared: Arc<Shared>,
    api: Api,
    path_model: Option<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let text = body.to_string();
    let streamed = match api {
        Api::Gemini => uri.path().contains(":streamGenerateContent"),
        Api::OpenAi | Api::Anthropic => body.get("stream").and_then(Value::as_bool) == Some(true),
    };
    let model = path_model
        .or_else(|| body.get("model").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "unknown-model".to_owned());
    record(&shared, api, &uri, &headers, body);

    let ruled = lock(&shared.rules)
        .iter()
        .find(|(needles, _)| needles.iter().all(|n| text.contains(n.as_str())))
        .map(|(_, reply)| reply.clone());
    let scripted = ruled.or_else(|| lock(&shared.scripts).get_mut(&api).and_then(VecDeque::pop_front));
    let mut reply = scripted.unwrap_or_else(|| {
        let (text, latency) = lock(&shared.default).clone();
        let reply = Reply::text(text);
        let reply = match latency {
            Some(delay) => reply.after(delay),
            None => reply,
        };
        random_fault(&shared, api, reply, streamed)
    });
    loop {
        match reply {
            Reply::Delayed { delay, reply: next } => {
                tokio::time::sleep(delay).await;
                reply = *next;
            }
            Reply::Completion {
                text,
                prompt_tokens,
                completion_tokens,
            } if streamed => {
                let pieces = text.split_inclusive(char::is_whitespace).map(str::to_owned).collect();
                reply = Reply::Stream {
                    pieces,
                    prompt_tokens,
                    completion_tokens,
                    pace: Duration::ZERO,
                    fault: None,
                };
            }
            Reply::Stream {
                pieces,
                prompt_tokens,
                completion_tokens,
                ..
            } if !streamed => {
                reply = Reply::Completion {
                    text: pieces.concat(),
                    prompt_tokens,
                    completion_tokens,
                };
            }
            Reply::Stream {
                pieces,
                prompt_tokens,
                completion_tokens,
                pace,
                fault,
            } => {
                // A stream cut or ended by an error is no completion.
                if !matches!(fault, Some(StreamFault::Cut { .. } | StreamFault::Error { .. })) {
                    lock(&shared.tally).completions += 1;
                }
                let usage = (prompt_tokens, completion_tokens);
                return stream_response(sse_frames(api, &model, &pieces, usage, pace, fault.as_ref()));
            }
            Reply::Completion {
                text,
                prompt_tokens,
                completion_tokens,
            } => {
                lock(&shared.tally).completions += 1;
                let body = completion_body(api, &model, &text, prompt_tokens, completion_tokens);
                return respond(
                    200,
                    &[("content-type".into(), "application/json".into())],
                    body.to_string(),
                );
            }
            Reply::Http { status, headers, body } => return respond(status, &headers, body),
        }
    }
}

/// The default reply, or with the configured probabilities a fault instead
/// (the stream faults only when the call asked to stream).
fn random_fault(shared: &Shared, api: Api, default: Reply, streamed: bool) -> Reply {
    let faults = lock(&shared.faults).clone();
    let mut roll = uniform(&shared.seed);
    let mut hit = |rate: f64| {
        roll -= rate;
        roll < 0.0
    };
    let mut tally = lock(&shared.tally);
    if hit(faults.rate_limited) {
        tally.rate_limited += 1;
        Reply::rate_limited(api, Some("1"))
    } else if hit(faults.server_error) {
        tally.server_error += 1;
        Reply::server_error()
    } else if hit(faults.timeout) {
        tally.timeout += 1;
        default.after(faults.timeout_delay)
    } else if hit(faults.invalid_json) {
        tally.invalid_json += 1;
        Reply::invalid_json()
    } else if hit(if streamed { faults.stream_cut } else { 0.0 }) {
        tally.stream_cut += 1;
        halfway(default, |after| StreamFault::Cut { after })
    } else if hit(if streamed { faults.stream_error } else { 0.0 }) {
        tally.stream_error += 1;
        halfway(default, |after| StreamFault::overloaded(api, after))
    } else {
        default
    }
}

/// `reply`'s completion as a stream of its words with `fault` after half
/// of them (at least one); a delay before it is kept.
fn halfway(reply: Reply, fault: impl FnOnce(usize) -> StreamFault) -> Reply {
    match reply {
        Reply::Delayed { delay, reply } => Reply::Delayed {
            delay,
            reply: Box::new(halfway(*reply, fault)),
        },
        Reply::Completion {
            text,
            prompt_tokens,
            completion_tokens,
        } => {
            let pieces: Vec<String> = text.split_inclusive(char::is_whitespace).map(str::to_owned).collect();
            let after = (pieces.len() / 2).max(1);
            Reply::Stream {
                pieces,
                prompt_tokens,
                completion_tokens,
                pace: Duration::ZERO,
                fault: Some(fault(after)),
            }
        }
        other => other,
    }
}

/// Serves `app` on `listener` until the returned sender fires or is dropped.
fn serve(listener: TcpListener, app: Router) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        // Ends when told to (go_down), or when the task is aborted (FakeLlm dropped).
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await;
    });
    (stop, task)
}

fn completion_body(api: Api, model: &str, text: &str, prompt: u32, completion: u32) -> Value {
    match api {
        Api::OpenAi => json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        }),
        Api::Anthropic => json!({
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": completion}
        }),
        Api::Gemini => json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion},
            "modelVersion": model
        }),
    }
}

fn respond(status: u16, headers: &[(String, String)], body: String) -> Response {
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder
        .body(Body::from(body))
        .expect("fake LLM: a scripted reply has an invalid status or header")
}

/// One step of a streamed body.
enum Frame {
    /// Bytes to send.
    Send(String),
    /// A pause.
    Wait(Duration),
    /// The connection is dropped (the body ends in an error).
    Cut,
}

/// The body of a stream: its frames in order, as `text/event-stream`.
fn stream_response(frames: Vec<Frame>) -> Response {
    let body = futures_util::stream::unfold(frames.into_iter(), |mut frames| async move {
        loop {
            match frames.next()? {
                Frame::Send(text) => return Some((Ok(Bytes::from(text)), frames)),
                Frame::Wait(pause) => tokio::time::sleep(pause).await,
                Frame::Cut => {
                    return Some((
                        Err(std::io::Error::other("fake LLM: connection cut mid-stream")),
                        frames,
                    ));
                }
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(body))
        .expect("fake LLM: stream response")
}

/// The events of a streamed answer in `api`'s format, with the fault's
/// frames in their place.
fn sse_frames(
    api: Api,
    model: &str,
    pieces: &[String],
    (prompt, completion): (u32, u32),
    pace: Duration,
    fault: Option<&StreamFault>,
) -> Vec<Frame> {
    let event = |name: Option<&str>, data: &Value| match (api, name) {
        // Gemini separates events with CRLF pairs.
        (Api::Gemini, _) => format!("data: {data}\r\n\r\n"),
        (_, Some(name)) => format!("event: {name}\ndata: {data}\n\n"),
        (_, None) => format!("data: {data}\n\n"),
    };
    let mut frames = Vec::new();
    let StreamShape { head, piece, tail, end } = stream_shape(api, model, prompt, completion);
    frames.extend(head.iter().map(|(name, data)| Frame::Send(event(*name, data))));
    for i in 0..=pieces.len() {
        match fault {
            Some(StreamFault::Stall { after, pause }) if *after == i => frames.push(Frame::Wait(*pause)),
            Some(StreamFault::Cut { after }) if *after == i => {
                // Let what was sent leave before the connection drops.
                frames.push(Frame::Wait(Duration::from_millis(50)));
                frames.push(Frame::Cut);
                return frames;
            }
            Some(StreamFault::Error {
                after,
                status,
                kind,
                message,
            }) if *after == i => {
                let body = error_body(api, *status, kind, message, Value::Null);
                let name = (api == Api::Anthropic).then_some("error");
                frames.push(Frame::Send(event(name, &body)));
                return frames;
            }
            _ => {}
        }
        let Some(text) = pieces.get(i) else { break };
        if i > 0 && !pace.is_zero() {
            frames.push(Frame::Wait(pace));
        }
        let (name, data) = piece(text);
        frames.push(Frame::Send(event(name, &data)));
    }
    frames.extend(tail.iter().map(|(name, data)| Frame::Send(event(*name, data))));
    if !matches!(fault, Some(StreamFault::NoEnd)) {
        frames.push(Frame::Send(end.map_or_else(
            || "data: [DONE]\n\n".to_owned(),
            |(name, data)| event(name, &data),
        )));
    }
    frames
}

type Event = (Option<&'static str>, Value);

/// A format's events.
struct StreamShape<'a> {
    /// Before the answer.
    head: Vec<Event>,
    /// One piece's.
    piece: Box<dyn Fn(&str) -> Event + 'a>,
    /// After the answer: finish, usage.
    tail: Vec<Event>,
    /// The end event (`None`: OpenAI's `data: [DONE]`).
    end: Option<Event>,
}

fn stream_shape(api: Api, model: &str, prompt: u32, completion: u32) -> StreamShape<'_> {
    match api {
        Api::OpenAi => {
            let chunk = move |choices: Value| json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": choices});
            let head = vec![(
                None,
                chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}])),
            )];
            let piece = Box::new(move |text: &str| {
                (
                    None,
                    chunk(json!([{"index": 0, "delta": {"content": text}, "finish_reason": null}])),
                )
            });
            let mut usage = chunk(json!([]));
            usage["usage"] =
                json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
            let tail = vec![
                (None, chunk(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]))),
                (None, usage),
            ];
            StreamShape {
                head,
                piece,
                tail,
                end: None,
            }
        }
        Api::Anthropic => {
            let head = vec![
                (
                    Some("message_start"),
                    json!({"type": "message_start", "message": {
                    "id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [],
                    "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": prompt, "output_tokens": 1}}}),
                ),
                (
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                (Some("ping"), json!({"type": "ping"})),
            ];
            let piece = Box::new(|text: &str| {
                (
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
                )
            });
            let tail = vec![
                (
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                (
                    Some("message_delta"),
                    json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": completion}}),
                ),
            ];
            let end = Some((Some("message_stop"), json!({"type": "message_stop"})));
            StreamShape { head, piece, tail, end }
        }
        Api::Gemini => {
            let piece = Box::new(move |text: &str| {
                (
                    None,
                    json!({
                        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}],
                        "usageMetadata": {"promptTokenCount": prompt, "totalTokenCount": prompt},
                        "modelVersion": model
                    }),
                )
            });
            let end = json!({
                "candidates": [{"content": {"role": "model", "parts": [{"text": ""}]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion},
                "modelVersion": model
            });
            StreamShape {
                head: Vec::new(),
                piece,
                tail: Vec::new(),
                end: Some((None, end)),
            }
        }
    }
}
