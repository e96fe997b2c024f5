//! Streamed answers: each provider's stream format through
//! `Llm::chat_stream` against the fake provider over real HTTP (pieces in
//! order, the whole answer and its usage at the end), each stream fault's
//! error and disposition, the offline provider's pace, and the respond
//! stage's restart when it drops the history block.

use std::sync::Arc;
use std::time::Duration;

use maas::llm::{
    ChatRequest, ChatResponse, Delta, DeltaSink, Llm, LlmConfig, LlmDisposition, LlmError, ProviderKind, Role,
};
use maas::model::Prompts;
use maas::stage::{StageInput, StageOutput, responder};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::time::Instant;
use uuid::Uuid;

use crate::support::fake_llm::{Api, FakeLlm, Reply, StreamFault};

const PIECES: [&str; 5] = ["Once ", "upon", " a ", "time", "."];

/// Every role on `api` at the fake, with this timeout and a test key.
fn llm_at(fake: &FakeLlm, api: Api, timeout_secs: u64) -> Llm {
    let mut cfg = LlmConfig::default();
    cfg.responder.provider = Some(api.provider().to_owned());
    cfg.responder.model = Some("stream-model".to_owned());
    cfg.responder.timeout_secs = Some(timeout_secs);
    cfg.openai.base_url = Some(fake.openai_base_url());
    cfg.anthropic.base_url = Some(fake.base_url());
    cfg.gemini.base_url = Some(fake.base_url());
    Llm::from_config_with_env(&cfg, "offline", |name| {
        name.ends_with("_API_KEY").then(|| "sk-stream-test".to_owned())
    })
    .unwrap()
}

fn question() -> ChatRequest {
    ChatRequest::new(Some("Tell stories.".to_owned()), "Begin a story.")
}

/// A sink and everything sent to it once the sender is gone.
async fn drain(mut rx: UnboundedReceiver<Delta>) -> Vec<Delta> {
    let mut deltas = Vec::new();
    while let Some(delta) = rx.recv().await {
        deltas.push(delta);
    }
    deltas
}

/// One streamed responder call; its result and every delta it sent.
async fn stream(llm: &Llm) -> (Result<ChatResponse, LlmError>, Vec<Delta>) {
    let (tx, rx): (DeltaSink, _) = unbounded_channel();
    let result = llm.chat_stream(Role::Responder, question(), &tx).await;
    drop(tx);
    (result, drain(rx).await)
}

fn texts(pieces: &[&str]) -> Vec<Delta> {
    pieces.iter().map(|p| Delta::Text((*p).to_owned())).collect()
}

/// The fake answers the next streamed call with `reply`; the call's error
/// and deltas.
async fn fault(api: Api, reply: Reply, timeout_secs: u64) -> (LlmError, Vec<Delta>) {
    let fake = FakeLlm::start().await;
    fake.push(api, reply);
    let (result, deltas) = stream(&llm_at(&fake, api, timeout_secs)).await;
    (result.unwrap_err(), deltas)
}

async fn check_pieces_in_order_with_usage(api: Api) {
    let fake = FakeLlm::start().await;
    fake.push(api, Reply::stream(&PIECES).with_usage(21, 7));
    let (result, deltas) = stream(&llm_at(&fake, api, 5)).await;
    let answer = result.unwrap();
    assert_eq!(deltas, texts(&PIECES));
    assert_eq!(answer.text, PIECES.concat());
    assert_eq!(answer.model, "stream-model");
    assert_eq!((answer.prompt_tokens, answer.completion_tokens), (Some(21), Some(7)));

    let [sent] = <[_; 1]>::try_from(fake.requests()).unwrap();
    match api {
        Api::OpenAi => {
            assert_eq!(sent.body["stream"], true);
            assert_eq!(sent.body["stream_options"]["include_usage"], true);
        }
        Api::Anthropic => assert_eq!(sent.body["stream"], true),
        Api::Gemini => assert_eq!(sent.path, "/v1beta/models/stream-model:streamGenerateContent?alt=sse"),
    }
}

/// The first piece arrives while the provider still writes the rest.
async fn check_first_piece_before_the_last(api: Api) {
    let fake = FakeLlm::start().await;
    let pace = Duration::from_millis(150);
    fake.push(api, Reply::stream(&PIECES).paced(pace));
    let llm = Arc::new(llm_at(&fake, api, 5));
    let (tx, mut rx) = unbounded_channel();
    let started = Instant::now();
    let call = tokio::spawn({
        let llm = Arc::clone(&llm);
        async move { llm.chat_stream(Role::Responder, question(), &tx).await }
    });
    assert_eq!(rx.recv().await, Some(Delta::Text(PIECES[0].to_owned())));
    let first = started.elapsed();
    let answer = call.await.unwrap().unwrap();
    let whole = started.elapsed();
    assert!(whole >= pace * 4, "the fake paces its pieces: {whole:?}");
    assert!(
        first + pace * 3 <= whole,
        "first piece at {first:?}, answer at {whole:?}"
    );
    assert_eq!(answer.text, PIECES.concat());
}

/// The default reply, asked for as a stream, comes word by word.
async fn check_default_reply_streams(api: Api) {
    let fake = FakeLlm::start().await;
    let (result, deltas) = stream(&llm_at(&fake, api, 5)).await;
    assert_eq!(result.unwrap().text, "fake reply");
    assert_eq!(deltas, texts(&["fake ", "reply"]));
}

/// A pause shorter than the timeout only delays the answer; one longer is a
/// timeout, after the pieces sent before it.
async fn check_stall(api: Api) {
    let short = StreamFault::Stall {
        after: 2,
        pause: Duration::from_millis(300),
    };
    let fake = FakeLlm::start().await;
    fake.push(api, Reply::stream(&PIECES).with_fault(short));
    let (result, deltas) = stream(&llm_at(&fake, api, 5)).await;
    assert_eq!(result.unwrap().text, PIECES.concat());
    assert_eq!(deltas, texts(&PIECES));

    let long = StreamFault::Stall {
        after: 2,
        pause: Duration::from_secs(5),
    };
    let started = Instant::now();
    let (err, deltas) = fault(api, Reply::stream(&PIECES).with_fault(long), 1).await;
    assert_eq!(err.class(), "timeout", "{err}");
    assert_eq!(err.disposition(), LlmDisposition::Retry);
    assert_eq!(deltas, texts(&PIECES[..2]));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the role timeout bounds the stream"
    );
}

/// A cut connection is a retryable connect error; the endpoint answered,
/// so the next call is not held back as if it were down.
async fn check_cut(api: Api) {
    let fake = FakeLlm::start().await;
    fake.push(api, Reply::stream(&PIECES).with_fault(StreamFault::Cut { after: 3 }));
    let llm = llm_at(&fake, api, 5);
    let (result, deltas) = stream(&llm).await;
    let err = result.unwrap_err();
    assert_eq!(err.class(), "connect", "{err}");
    assert!(matches!(err, LlmError::Connect { .. }), "{err:?}");
    assert_eq!(err.disposition(), LlmDisposition::Retry);
    assert_eq!(deltas, texts(&PIECES[..3]));

    let started = Instant::now();
    let next = llm.chat(Role::Responder, question()).await.unwrap();
    assert_eq!(next.text, "fake reply");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "a cut stream paused the provider"
    );
    let requests = fake.requests();
    assert!(
        requests[1].body.get("stream").is_none(),
        "chat does not ask for a stream"
    );
}

/// The provider's error event mid-answer is classified like its HTTP error.
async fn check_error_event(api: Api) {
    let (err, deltas) = fault(
        api,
        Reply::stream(&PIECES).with_fault(StreamFault::overloaded(api, 2)),
        5,
    )
    .await;
    let (class, status) = match api {
        Api::OpenAi => ("server", 500),
        Api::Anthropic => ("overloaded", 529),
        Api::Gemini => ("server", 503),
    };
    assert_eq!((err.class(), err.status()), (class, Some(status)), "{err}");
    assert!(err.to_string().contains("Overloaded"), "{err}");
    assert_eq!(err.disposition(), LlmDisposition::Retry);
    assert_eq!(deltas, texts(&PIECES[..2]));

    let kind = match api {
        Api::OpenAi => "rate_limit_exceeded",
        Api::Anthropic => "rate_limit_error",
        Api::Gemini => "RESOURCE_EXHAUSTED",
    };
    let limited = StreamFault::Error {
        after: 1,
        status: 429,
        kind: kind.to_owned(),
        message: "Rate limit reached for requests per min".to_owned(),
    };
    let (err, _) = fault(api, Reply::stream(&PIECES).with_fault(limited), 5).await;
    assert_eq!(err.class(), "rate_limited", "{err}");
    assert!(matches!(err.disposition(), LlmDisposition::RateLimited { .. }));
}

/// A stream that ends without its end event is an error, like a cut.
async fn check_no_end(api: Api) {
    let (err, deltas) = fault(api, Reply::stream(&PIECES).with_fault(StreamFault::NoEnd), 5).await;
    assert_eq!(err.class(), "connect", "{err}");
    assert!(err.to_string().contains("end event"), "{err}");
    assert_eq!(err.disposition(), LlmDisposition::Retry);
    assert_eq!(deltas, texts(&PIECES));
}

/// An error status before the stream is the same error as without a stream.
async fn check_error_status(api: Api) {
    let (err, deltas) = fault(api, Reply::token_limit(api), 5).await;
    assert_eq!(err.disposition(), LlmDisposition::TokenLimit, "{err}");
    assert!(deltas.is_empty());
}

macro_rules! stream_suite {
    ($module:ident, $api:expr) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn pieces_in_order_with_usage() {
                check_pieces_in_order_with_usage($api).await
            }
            #[tokio::test]
            async fn first_piece_before_the_last() {
                check_first_piece_before_the_last($api).await
            }
            #[tokio::test]
            async fn default_reply_streams() {
                check_default_reply_streams($api).await
            }
            #[tokio::test]
            async fn stall() {
                check_stall($api).await
            }
            #[tokio::test]
            async fn cut() {
                check_cut($api).await
            }
            #[tokio::test]
            async fn error_event() {
                check_error_event($api).await
            }
            #[tokio::test]
            async fn no_end() {
                check_no_end($api).await
            }
            #[tokio::test]
            async fn error_status() {
                check_error_status($api).await
            }
        }
    };
}

stream_suite!(openai, Api::OpenAi);
stream_suite!(anthropic, Api::Anthropic);
stream_suite!(gemini, Api::Gemini);

// ---- The offline provider: word by word, at its pace. ----

fn offline(pace_ms: u64, timeout_secs: u64) -> Llm {
    let mut cfg = LlmConfig::default();
    cfg.offline.stream_pace_ms = Some(pace_ms);
    cfg.responder.timeout_secs = Some(timeout_secs);
    Llm::from_config_with_env(&cfg, "offline", |_| None).unwrap()
}

#[tokio::test]
async fn offline_streams_word_by_word_the_answer_it_gives_whole() {
    let llm = offline(0, 5);
    let whole = llm.chat(Role::Responder, question()).await.unwrap();
    let (result, deltas) = stream(&llm).await;
    let streamed = result.unwrap();
    assert_eq!(streamed.text, whole.text);
    let words: Vec<String> = whole
        .text
        .split_inclusive(char::is_whitespace)
        .map(str::to_owned)
        .collect();
    assert!(words.len() > 3, "{}", whole.text);
    assert_eq!(deltas, words.into_iter().map(Delta::Text).collect::<Vec<_>>());
}

#[tokio::test]
async fn offline_pace_spaces_the_words_and_the_timeout_bounds_it() {
    let default = LlmConfig::default().resolve("offline", &|_| None).unwrap();
    assert_eq!(default.offline_stream_pace, Duration::from_millis(20));

    let pace = Duration::from_millis(40);
    let llm = offline(40, 5);
    let (tx, mut rx) = unbounded_channel();
    let started = Instant::now();
    let call = llm.chat_stream(Role::Responder, question(), &tx);
    let (answer, first) = tokio::join!(call, async {
        let first = rx.recv().await;
        (first, started.elapsed())
    });
    let whole = started.elapsed();
    let answer = answer.unwrap();
    let words = answer.text.split_inclusive(char::is_whitespace).count();
    let words = u32::try_from(words).unwrap();
    assert!(matches!(first.0, Some(Delta::Text(_))));
    assert!(first.1 < pace, "the first word waits for nothing: {:?}", first.1);
    assert!(whole >= pace * (words - 1), "{words} words in {whole:?}");

    // Too slow for the role timeout: a timeout, like a stalled provider.
    let llm = offline(400, 1);
    let (result, deltas) = stream(&llm).await;
    let err = result.unwrap_err();
    assert_eq!(
        (err.provider(), err.class()),
        (ProviderKind::Offline.as_str(), "timeout")
    );
    assert!(!deltas.is_empty());
}

// ---- The respond stage. ----

fn respond_input(deltas: Option<DeltaSink>) -> StageInput {
    StageInput {
        request_id: Uuid::new_v4(),
        user_id: Uuid::new_v4(),
        thread_id: None,
        user_query: "Begin a story.".to_owned(),
        attempt: 1,
        analysis: None,
        context: Some(
            "<context_from_history>an old story</context_from_history>\n<current_query>Begin a story.</current_query>"
                .to_owned(),
        ),
        memory: Vec::new(),
        earlier_turns: 0,
        clarify: maas::model::Clarify::Off,
        query_embedding: None,
        retrieved: Vec::new(),
        prompts: Arc::new(Prompts::default()),
        deltas,
    }
}

/// Too long with the history: the stage says `Restart` before the second,
/// shorter call streams the answer.
#[tokio::test]
async fn the_respond_stage_restarts_the_stream_when_it_drops_the_history() {
    let fake = FakeLlm::start().await;
    fake.push(Api::Anthropic, Reply::token_limit(Api::Anthropic));
    fake.push(Api::Anthropic, Reply::stream(&PIECES));
    let llm = llm_at(&fake, Api::Anthropic, 5);
    let (tx, rx) = unbounded_channel();
    let done = responder::run(&llm, &respond_input(Some(tx))).await.unwrap();
    assert_eq!(done.output, StageOutput::Answer(PIECES.concat()));
    let mut expected = vec![Delta::Restart];
    expected.extend(texts(&PIECES));
    assert_eq!(drain(rx).await, expected);
    let sent = fake.requests();
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|r| r.body["stream"] == true));
    assert!(!sent[1].body.to_string().contains("an old story"));
}

/// Without a sink the stage asks for a whole answer, as before streaming.
#[tokio::test]
async fn the_respond_stage_without_a_sink_does_not_stream() {
    let fake = FakeLlm::start().await;
    let llm = llm_at(&fake, Api::OpenAi, 5);
    let done = responder::run(&llm, &respond_input(None)).await.unwrap();
    assert_eq!(done.output, StageOutput::Answer("fake reply".to_owned()));
    let [sent] = <[_; 1]>::try_from(fake.requests()).unwrap();
    assert!(sent.body.get("stream").is_none());
}
