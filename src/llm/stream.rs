//! Streamed answers over HTTP: the provider's server-sent events read as
//! they arrive, each text piece handed to the caller's [`DeltaSink`] and
//! added to the whole answer, which is returned at the end like a
//! non-streamed one.
//!
//! The SSE framing is `eventsource-stream`'s, over the response's body
//! chunks; what an event means is the provider module's
//! ([`ReadEvent`]: OpenAI-compatible, Anthropic, Gemini), which fills an
//! [`Answer`] (model, usage, finish reason, whether the end came).
//!
//! Guarantees:
//! - The role timeout bounds the whole exchange, from sending to the last
//!   event; a stall beyond it is a [`LlmError::Timeout`].
//! - A stream cut mid-answer, or one that stops before the provider's end
//!   event, is a retryable [`LlmError::Connect`] that does not count the
//!   endpoint as unreachable (it answered).
//! - An error event mid-stream is classified by [`classify_status`] as the
//!   HTTP status it stands for ([`error_status`]), with the event's data as
//!   the body: an `overloaded_error` event is the 529 it would have been.
//! - At most [`MAX_BODY_BYTES`] are read; a closed sink does not stop the
//!   answer (the caller still gets it whole).

use std::time::SystemTime;

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use reqwest::header::HeaderMap;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::client::{Completion, Failed, MAX_BODY_BYTES, http_error, send, transport_error};
use super::config::{Endpoint, RoleSettings};
use super::error::{classify_status, scrub};
use super::{Delta, DeltaSink, LlmError};

/// Reads one event (its type, its data) of a provider's stream into the
/// answer; returns the text it adds.
pub(crate) type ReadEvent = fn(&mut Answer, &str, &str) -> Result<Step, Fault>;

/// What a streamed answer has gathered so far, besides its text.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    /// The model the provider says answers.
    pub model: Option<String>,
    /// Reported input tokens.
    pub prompt_tokens: Option<u32>,
    /// Reported output tokens.
    pub completion_tokens: Option<u32>,
    /// Why the model stopped, when it said.
    pub finish_reason: Option<String>,
    /// A refusal instead of an answer (OpenAI).
    pub refusal: String,
    /// The provider's end of the answer came (`[DONE]`, `message_stop`, a
    /// `finishReason`).
    pub complete: bool,
}

impl Answer {
    /// Notes usage figures; one the event leaves out keeps its value.
    pub(crate) fn note_usage(&mut self, prompt: Option<u32>, completion: Option<u32>) {
        self.prompt_tokens = prompt.or(self.prompt_tokens);
        self.completion_tokens = completion.or(self.completion_tokens);
    }

    /// Keeps the first non-empty model name the stream gives.
    pub(crate) fn note_model(&mut self, model: Option<String>) {
        if self.model.is_none() {
            self.model = model.filter(|m| !m.is_empty());
        }
    }
}

/// What an event did.
#[derive(Debug)]
pub(crate) enum Step {
    /// The answer goes on with this text (often none: usage, a ping).
    Text(String),
    /// The stream is over; nothing after it is read.
    End,
}

/// An event that ends the answer in failure.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The provider's error event: the HTTP status it stands for, and the
    /// event's data (the provider's error body).
    Error {
        /// See [`error_status`].
        status: u16,
        /// The event's data.
        body: String,
    },
    /// An event that is not what the provider sends.
    Invalid(String),
}

impl Fault {
    /// The provider's error object `error`, sent as the event `data`.
    pub(crate) fn error_event(error: &Value, data: &str) -> Fault {
        Fault::Error {
            status: error_status(error),
            body: data.to_owned(),
        }
    }
}

/// An event's data as the provider's type `T`; `what` names it in the error.
pub(crate) fn decode<T: DeserializeOwned>(data: &str, what: &str) -> Result<T, Fault> {
    serde_json::from_str(data).map_err(|e| Fault::Invalid(format!("not a {what}: {e}")))
}

/// Why the body stopped before its end.
#[derive(Debug)]
enum ReadError {
    Transport(reqwest::Error),
    TooLarge,
}

/// The HTTP status an error object of an event stands for: its numeric
/// `code` when that is a status (Gemini, vLLM), else the status the
/// providers give its `type`, `code` or `status` name, else 500.
pub(crate) fn error_status(error: &Value) -> u16 {
    let numeric = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c));
    if let Some(status) = numeric {
        return status;
    }
    ["type", "code", "status"]
        .iter()
        .filter_map(|k| error.get(*k).and_then(Value::as_str))
        .find_map(|kind| match kind {
            "invalid_request_error" | "context_length_exceeded" | "INVALID_ARGUMENT" | "FAILED_PRECONDITION" => {
                Some(400)
            }
            "authentication_error" | "invalid_api_key" | "UNAUTHENTICATED" => Some(401),
            "billing_error" => Some(402),
            "permission_error" | "PERMISSION_DENIED" => Some(403),
            "not_found_error" | "model_not_found" | "NOT_FOUND" => Some(404),
            "request_too_large" => Some(413),
            "rate_limit_error" | "rate_limit_exceeded" | "insufficient_quota" | "RESOURCE_EXHAUSTED" => Some(429),
            "overloaded_error" => Some(529),
            "UNAVAILABLE" => Some(503),
            _ => None,
        })
        .unwrap_or(500)
}

/// One streamed HTTP exchange: send, check the status (an error status is
/// read and classified as in a whole exchange), then read the events,
/// sending each text piece to `sink`.
pub(crate) async fn exchange(
    settings: &RoleSettings,
    endpoint: &Endpoint,
    builder: reqwest::RequestBuilder,
    read_event: ReadEvent,
    sink: &DeltaSink,
) -> Result<Completion, Failed> {
    let provider = settings.provider;
    let key = Some(&endpoint.api_key);
    let transport = |e: reqwest::Error| transport_error(provider, settings.timeout, e, key);

    let response = send(settings, endpoint, builder).await?;
    if !response.status().is_success() {
        return Err(http_error(response, settings, endpoint).await.into());
    }
    // From here on the endpoint has answered.
    let broken = |error: LlmError| Failed { error, answered: true };
    let invalid = |message: String| {
        broken(LlmError::InvalidResponse {
            provider: provider.as_str(),
            message: scrub(&message, key),
        })
    };
    let mut events = std::pin::pin!(chunks(response).eventsource());
    let mut answer = Answer::default();
    let mut text = String::new();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(EventStreamError::Transport(ReadError::Transport(e))) => return Err(broken(transport(e))),
            Err(EventStreamError::Transport(ReadError::TooLarge)) => {
                return Err(invalid(format!("stream larger than {MAX_BODY_BYTES} bytes")));
            }
            Err(EventStreamError::Utf8(e)) => return Err(invalid(format!("not an event stream: {e}"))),
            Err(EventStreamError::Parser(e)) => return Err(invalid(format!("not an event stream: {e}"))),
        };
        match read_event(&mut answer, &event.event, &event.data) {
            Ok(Step::Text(piece)) if !piece.is_empty() => {
                text.push_str(&piece);
                // A caller that stopped listening still gets the whole answer.
                let _ = sink.send(Delta::Text(piece));
            }
            Ok(Step::Text(_)) => {}
            Ok(Step::End) => break,
            Err(Fault::Error { status, body }) => {
                let error = classify_status(
                    provider,
                    status,
                    &HeaderMap::new(),
                    body.as_bytes(),
                    SystemTime::now(),
                    key,
                );
                return Err(broken(error));
            }
            Err(Fault::Invalid(message)) => return Err(invalid(message)),
        }
    }
    finish(answer, text).map_err(|message| match message {
        Unfinished::Cut(message) => broken(LlmError::Connect {
            provider: provider.as_str(),
            message,
        }),
        Unfinished::Empty(message) => invalid(message),
    })
}

/// Why a stream that ended is not an answer.
enum Unfinished {
    /// It stopped before the provider's end event.
    Cut(String),
    /// It ended with no text.
    Empty(String),
}

/// The answer of a stream that ended: complete and not empty.
fn finish(answer: Answer, text: String) -> Result<Completion, Unfinished> {
    if !answer.complete {
        return Err(Unfinished::Cut(format!(
            "the stream stopped before its end event, after {} bytes of answer",
            text.len()
        )));
    }
    if text.trim().is_empty() {
        let reason = answer.finish_reason.as_deref().unwrap_or("none");
        return Err(Unfinished::Empty(if answer.refusal.is_empty() {
            format!("empty completion (finish_reason {reason})")
        } else {
            format!("the model refused: {}", answer.refusal)
        }));
    }
    Ok(Completion {
        text,
        model: answer.model,
        prompt_tokens: answer.prompt_tokens,
        completion_tokens: answer.completion_tokens,
    })
}

/// The body's chunks as a stream, at most [`MAX_BODY_BYTES`] in all.
fn chunks(response: reqwest::Response) -> impl Stream<Item = Result<Bytes, ReadError>> {
    futures_util::stream::unfold((response, 0usize), |(mut response, read)| async move {
        match response.chunk().await {
            Ok(Some(chunk)) if read + chunk.len() > MAX_BODY_BYTES => {
                Some((Err(ReadError::TooLarge), (response, read)))
            }
            Ok(Some(chunk)) => {
                let read = read + chunk.len();
                Some((Ok(chunk), (response, read)))
            }
            Ok(None) => None,
            Err(e) => Some((Err(ReadError::Transport(e)), (response, read))),
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use serde_json::json;

    use super::*;

    /// The pieces `events` (type, data) add, and how the answer ends.
    fn read(read_event: ReadEvent, events: &[(&str, &str)]) -> (Vec<String>, Result<Completion, String>) {
        let mut answer = Answer::default();
        let mut text = String::new();
        let mut pieces = Vec::new();
        for (event, data) in events {
            match read_event(&mut answer, event, data) {
                Ok(Step::Text(piece)) if piece.is_empty() => {}
                Ok(Step::Text(piece)) => {
                    text.push_str(&piece);
                    pieces.push(piece);
                }
                Ok(Step::End) => break,
                Err(Fault::Error { status, .. }) => return (pieces, Err(format!("HTTP {status}"))),
                Err(Fault::Invalid(message)) => return (pieces, Err(message)),
            }
        }
        let done = finish(answer, text).map_err(|u| match u {
            Unfinished::Cut(m) | Unfinished::Empty(m) => m,
        });
        (pieces, done)
    }

    #[test]
    fn anthropic_thinking_is_not_part_of_the_answer() {
        let (pieces, done) = read(
            super::super::anthropic::read_event,
            &[
                (
                    "message_start",
                    r#"{"type":"message_start","message":{"model":"claude-x","usage":{"input_tokens":9,"output_tokens":1}}}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
                ),
                (
                    "message_delta",
                    r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":4}}"#,
                ),
                ("message_stop", r#"{"type":"message_stop"}"#),
            ],
        );
        assert_eq!(pieces, ["Hi"]);
        let done = done.unwrap();
        assert_eq!(
            (done.model.as_deref(), done.prompt_tokens, done.completion_tokens),
            (Some("claude-x"), Some(9), Some(4))
        );
    }

    #[test]
    fn an_openai_refusal_is_an_invalid_answer_naming_it() {
        let (pieces, done) = read(
            super::super::openai::read_event,
            &[
                (
                    "message",
                    r#"{"model":"gpt-x","choices":[{"index":0,"delta":{"refusal":"I can't"}}]}"#,
                ),
                (
                    "message",
                    r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                ),
                ("message", "[DONE]"),
            ],
        );
        assert!(pieces.is_empty());
        assert!(done.err().is_some_and(|m| m.contains("refused: I can't")));
    }

    #[test]
    fn gemini_thoughts_are_left_out_and_a_blocked_prompt_is_invalid() {
        let (pieces, done) = read(
            super::super::gemini::read_event,
            &[
                (
                    "message",
                    r#"{"candidates":[{"content":{"parts":[{"text":"plan","thought":true},{"text":"Yes"}]}}]}"#,
                ),
                (
                    "message",
                    r#"{"candidates":[{"content":{"parts":[{"text":"."}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":2},"modelVersion":"gemini-x"}"#,
                ),
            ],
        );
        assert_eq!(pieces, ["Yes", "."]);
        assert_eq!(done.unwrap().completion_tokens, Some(2));
        let (_, blocked) = read(
            super::super::gemini::read_event,
            &[("message", r#"{"promptFeedback":{"blockReason":"SAFETY"}}"#)],
        );
        assert!(blocked.err().is_some_and(|m| m.contains("SAFETY")));
        let (_, garbage) = read(super::super::gemini::read_event, &[("message", "not json")]);
        assert!(garbage.err().is_some_and(|m| m.contains("generateContent chunk")));
    }

    #[test]
    fn error_events_stand_for_the_status_of_their_kind() {
        assert_eq!(
            error_status(&json!({"type": "overloaded_error", "message": "Overloaded"})),
            529
        );
        assert_eq!(error_status(&json!({"type": "rate_limit_error"})), 429);
        assert_eq!(error_status(&json!({"code": 503, "status": "UNAVAILABLE"})), 503);
        assert_eq!(
            error_status(&json!({"code": "rate_limit_exceeded", "type": "requests"})),
            429
        );
        assert_eq!(error_status(&json!({"type": "server_error"})), 500);
        assert_eq!(error_status(&json!({"code": 7})), 500);
    }

    #[test]
    fn a_stream_without_its_end_is_cut_and_an_empty_one_invalid() {
        let cut = finish(Answer::default(), "half".into());
        assert!(matches!(cut, Err(Unfinished::Cut(_))));
        let done = Answer {
            complete: true,
            finish_reason: Some("stop".into()),
            ..Answer::default()
        };
        assert!(matches!(finish(done, " ".into()), Err(Unfinished::Empty(m)) if m.contains("stop")));
        let done = Answer {
            complete: true,
            ..Answer::default()
        };
        assert_eq!(
            finish(done, "whole".into()).ok().map(|c| c.text).as_deref(),
            Some("whole")
        );
    }
}
