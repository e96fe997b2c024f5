//! The offline provider: deterministic, in-process, no key, no network.
//!
//! It exists so that a fresh install (and every test that is not about a
//! provider) runs the whole pipeline without credentials. Its answers are
//! labelled: the responder's text starts with `[offline]`, the analysis
//! carries `"offline": true`, the archivist's summary starts with
//! `[offline]`, and the model is reported as `offline` unless configured
//! otherwise. The same request always yields the same answer, with one
//! exception: an archivist input that contains no timestamp at all gets the
//! current time as its bucket.
//!
//! Over 500 lines because the analyzer reads the query's time itself, with
//! tables of English and Russian words (`stage` depends on `llm`, so using
//! `stage`'s reader here would be an import circle).
//!
//! What each role returns:
//! - **analyzer** — the analysis JSON of the Analyzer prompt:
//!   `needs_context`, `context_type` (`none` | `recent` | `topic` |
//!   `period`), `time_scope`, `search_keywords`, `context_found`
//!   (`lsm_record_id`, `period`, `relevance`). The query is the `user_query`
//!   (or `query`) field when the last user message is a JSON object, the
//!   text inside `<current_query>…</current_query>` when present, else the
//!   whole last user message. LSM records are JSON objects with an `id` and a
//!   `summary` (optionally `tags`, `time_bucket_start`, `time_bucket_end`)
//!   found anywhere in the system prompt or the messages — a whole message
//!   that is JSON, or a line of one. `needs_context` is true exactly when
//!   there are records; keywords are the query's distinct words of four or
//!   more letters (stop words dropped, at most 8); the record sharing the
//!   most keywords is `context_found` (ties: the first listed).
//!   `time_scope` is a date the query names, in ISO form (`in May 2023` →
//!   `2023-05`, `May 8, 2023` → `2023-05-08`, `in 2022` → `2022`,
//!   `summer 2023` → `2023-06/2023-08`), else a relative phrase it uses, as
//!   written (`last week`, `3 days ago`, `на прошлой неделе`: the request's
//!   time decides them), else `none`; every one of them is a form
//!   [`Analysis::time_range`](crate::stage::Analysis::time_range) reads.
//!   `context_type` is `period` when there is such a scope or the query asks
//!   when something happened ("when did …", "когда"), `recent` when it is
//!   about the latest conversation ("what did I just say", "earlier",
//!   "последн…"); otherwise `topic` when the record found shares a keyword,
//!   `recent` when it shares none, `none` without records.
//! - **archivist** — the Archivist prompt's JSON: `time_bucket_start` and
//!   `time_bucket_end` (the earliest and latest timestamps in the input,
//!   RFC 3339), `tags` (the five most frequent words) and `summary`.
//! - **responder** — `[offline] You asked: "<query>". …`, naming the key
//!   terms and whether a history block (`<context_from_history>`) came with
//!   the query.
//!
//! Knobs (`[llm.offline]`): `latency_ms` delays each answer (a latency at or
//! above the role timeout becomes a timeout error) and
//! `fail_when_query_contains` makes calls whose last user message contains
//! the marker fail with the retryable [`LlmError::Injected`].
//!
//! Size: the deterministic stand-in for every role (analyzer, responder,
//! archivist) with its phrase tables; about 115 lines are tests.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use super::client::Completion;
use super::config::RoleSettings;
use super::{ChatRequest, LlmError, ProviderKind, Role};

/// The offline provider with its knobs.
#[derive(Debug, Clone)]
pub(crate) struct Offline {
    latency: Duration,
    fail_marker: Option<String>,
}

impl Offline {
    pub(crate) fn new(latency: Duration, fail_marker: Option<String>) -> Offline {
        Offline { latency, fail_marker }
    }

    pub(crate) async fn chat(
        &self,
        role: Role,
        settings: &RoleSettings,
        req: &ChatRequest,
    ) -> Result<Completion, LlmError> {
        if !self.latency.is_zero() {
            if self.latency >= settings.timeout {
                tokio::time::sleep(settings.timeout).await;
                return Err(LlmError::Timeout {
                    provider: ProviderKind::Offline.as_str(),
                    message: format!(
                        "simulated latency {} ms exceeds the role timeout",
                        self.latency.as_millis()
                    ),
                });
            }
            tokio::time::sleep(self.latency).await;
        }
        if let Some(marker) = &self.fail_marker {
            if req.last_user_message().is_some_and(|m| m.contains(marker)) {
                return Err(LlmError::Injected);
            }
        }
        let text = match role {
            Role::Analyzer => analyze(req).to_string(),
            Role::Archivist => archive(req, Utc::now()).to_string(),
            Role::Responder => respond(req),
        };
        Ok(Completion {
            prompt_tokens: Some(approx_tokens(req.prompt_chars())),
            completion_tokens: Some(approx_tokens(text.len())),
            text,
            model: None,
        })
    }
}

/// About four bytes a token: a usage figure for metrics, not a tokenizer.
fn approx_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(4)).unwrap_or(u32::MAX)
}

const STOP_WORDS: &[&str] = &[
    "about",
    "above",
    "after",
    "again",
    "also",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "could",
    "does",
    "doing",
    "down",
    "during",
    "each",
    "from",
    "further",
    "have",
    "having",
    "here",
    "into",
    "just",
    "like",
    "more",
    "most",
    "much",
    "only",
    "other",
    "over",
    "same",
    "should",
    "some",
    "such",
    "than",
    "that",
    "their",
    "theirs",
    "them",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "under",
    "until",
    "very",
    "want",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "will",
    "with",
    "would",
    "your",
    "yours",
    "please",
    "tell",
    "know",
    "user",
    "query",
    "assistant",
    "response",
    "content",
    "message",
    "null",
    "true",
    "false",
    "когда",
    "чтобы",
    "который",
    "которые",
    "этот",
    "меня",
    "тебя",
    "можно",
    "нужно",
    "если",
];

/// Relative phrases that tie a query to a period, kept as written (the
/// request's time decides them); the longest match wins.
const RELATIVE_PHRASES: &[&str] = &[
    "day before yesterday",
    "yesterday",
    "today",
    "tonight",
    "last week",
    "last month",
    "last year",
    "this week",
    "this month",
    "this year",
    "past week",
    "past month",
    "past year",
    "previous week",
    "previous month",
    "previous year",
    "recently",
    "lately",
    "позавчера",
    "вчера",
    "сегодня",
    "на прошлой неделе",
    "на этой неделе",
    "в прошлом месяце",
    "в этом месяце",
    "в прошлом году",
    "в этом году",
    "прошлую неделю",
    "прошлый месяц",
    "прошлый год",
    "последнюю неделю",
    "последний месяц",
    "последний год",
    "недавно",
];

/// Phrases about the latest conversation: `context_type` `recent`.
const RECENCY_PHRASES: &[&str] = &[
    "just said",
    "just told",
    "just asked",
    "just mentioned",
    "did i just",
    "a moment ago",
    "earlier in this chat",
    "earlier in this conversation",
    "earlier",
    "last time",
    "previous message",
    "только что",
    "последн",
    "ранее",
];

/// Questions about when something happened: temporal, with no range.
const WHEN_PHRASES: &[&str] = &[
    "when did",
    "when was",
    "when were",
    "when is",
    "when will",
    "when do",
    "when does",
    "when had",
    "what date",
    "what year",
    "which year",
    "what month",
    "which month",
    "how long ago",
    "когда",
    "в каком году",
    "в каком месяце",
    "какого числа",
];

/// Lower-cased words of four or more letters, stop words and numbers dropped.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 4 && !w.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
}

fn distinct_words(text: &str, limit: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in words(text) {
        if out.len() == limit {
            break;
        }
        if !out.contains(&word) {
            out.push(word);
        }
    }
    out
}

/// The `limit` most frequent words; ties go to the earlier word.
fn frequent_words(text: &str, limit: usize) -> Vec<String> {
    let mut counts: HashMap<String, (usize, usize)> = HashMap::new();
    for (position, word) in words(text).enumerate() {
        counts.entry(word).or_insert((0, position)).0 += 1;
    }
    let mut ranked: Vec<_> = counts.into_iter().collect();
    ranked.sort_by(|(_, (ca, pa)), (_, (cb, pb))| cb.cmp(ca).then(pa.cmp(pb)));
    ranked.into_iter().take(limit).map(|(w, _)| w).collect()
}

/// Whitespace collapsed, at most `max` characters.
fn excerpt(text: &str, max: usize) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(text[start..end].trim())
}

fn parse_json_object(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return None;
    }
    serde_json::from_str(trimmed).ok()
}

/// All texts of a request: the system prompt, then the messages.
fn texts(req: &ChatRequest) -> impl Iterator<Item = &str> {
    req.system
        .as_deref()
        .into_iter()
        .chain(req.messages.iter().map(|m| m.content.as_str()))
}

/// The user's query, as described in the module docs.
fn query_of(req: &ChatRequest) -> String {
    let last = req.last_user_message().unwrap_or_default();
    if let Some(Value::Object(map)) = parse_json_object(last) {
        for key in ["user_query", "query", "current_query"] {
            if let Some(q) = map.get(key).and_then(Value::as_str) {
                return q.trim().to_owned();
            }
        }
    }
    std::iter::once(last)
        .chain(texts(req))
        .find_map(|t| between(t, "<current_query>", "</current_query>"))
        .unwrap_or(last.trim())
        .to_owned()
}

/// An LSM record as the analyzer sees it.
struct Record {
    id: Value,
    text: String,
    period: Option<String>,
}

fn collect_records(value: &Value, out: &mut Vec<Record>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| collect_records(v, out)),
        Value::Object(map) => {
            let id = map.get("id").filter(|id| id.is_number() || id.is_string());
            let summary = map.get("summary").and_then(Value::as_str);
            if let (Some(id), Some(summary)) = (id, summary) {
                if out.iter().any(|r| &r.id == id) {
                    return;
                }
                let tags = match map.get("tags") {
                    Some(Value::Array(tags)) => tags.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "),
                    Some(Value::String(tags)) => tags.clone(),
                    _ => String::new(),
                };
                let bound = |k: &str| map.get(k).and_then(Value::as_str);
                let period = match (bound("time_bucket_start"), bound("time_bucket_end")) {
                    (Some(s), Some(e)) => Some(format!("{s} – {e}")),
                    (Some(s), None) | (None, Some(s)) => Some(s.to_owned()),
                    (None, None) => None,
                };
                out.push(Record {
                    id: id.clone(),
                    text: format!("{summary} {tags}").to_lowercase(),
                    period,
                });
            } else {
                map.values().for_each(|v| collect_records(v, out));
            }
        }
        _ => {}
    }
}

fn records_of(req: &ChatRequest) -> Vec<Record> {
    let mut records = Vec::new();
    for text in texts(req) {
        if let Some(v) = parse_json_object(text) {
            collect_records(&v, &mut records);
        } else {
            for line in text.lines() {
                if let Some(v) = parse_json_object(line) {
                    collect_records(&v, &mut records);
                }
            }
        }
    }
    records
}

/// The analyzer's answer.
pub(crate) fn analyze(req: &ChatRequest) -> Value {
    let query = query_of(req);
    let keywords = distinct_words(&query, 8);
    let records = records_of(req);
    let time = time_of(&query);

    let best = records
        .iter()
        .map(|r| (r, keywords.iter().filter(|k| r.text.contains(*k)).count()))
        .fold(None::<(&Record, usize)>, |best, (r, score)| match best {
            Some((_, top)) if top >= score => best,
            _ => Some((r, score)),
        });

    let (context_type, context_found) = match best {
        None => ("none", json!({"lsm_record_id": null, "period": null, "relevance": 0.0})),
        Some((record, score)) => {
            let relevance = if keywords.is_empty() {
                0.0
            } else {
                (score as f64 / keywords.len() as f64 * 100.0).round() / 100.0
            };
            let kind = if score > 0 { "topic" } else { "recent" };
            (
                kind,
                json!({"lsm_record_id": record.id, "period": record.period, "relevance": relevance}),
            )
        }
    };
    let (context_type, time_scope) = match time {
        Some((kind, scope)) => (kind.as_str(), scope),
        None => (context_type, "none".to_owned()),
    };
    json!({
        "needs_context": !records.is_empty(),
        "context_type": context_type,
        "time_scope": time_scope,
        "search_keywords": keywords,
        "context_found": context_found,
        "offline": true,
    })
}

/// What a query says about time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum TimeKind {
    /// A period, named or asked about: `context_type` `period`.
    Period,
    /// The latest conversation: `context_type` `recent`.
    Recent,
}

impl TimeKind {
    fn as_str(self) -> &'static str {
        match self {
            TimeKind::Period => "period",
            TimeKind::Recent => "recent",
        }
    }
}

/// The query's time, as the `context_type` it implies and a `time_scope`:
/// an absolute date in ISO form (`2023-05-08`, `2023-05`, `2023`,
/// `2023-06/2023-08` for a season), else a relative phrase as written
/// (`last week`, `3 days ago`, `за последние 3 дня`), else `none` for the
/// latest conversation (`recent`) or a "when did …" question (`period`).
fn time_of(query: &str) -> Option<(TimeKind, String)> {
    let lower = query.to_lowercase();
    if let Some(scope) = absolute_scope(&lower).or_else(|| relative_scope(&lower)) {
        return Some((TimeKind::Period, scope));
    }
    if RECENCY_PHRASES.iter().any(|p| lower.contains(p)) {
        return Some((TimeKind::Recent, "none".to_owned()));
    }
    let padded = format!(" {} ", time_tokens(&lower).join(" "));
    WHEN_PHRASES
        .iter()
        .any(|p| padded.contains(&format!(" {p} ")))
        .then(|| (TimeKind::Period, "none".to_owned()))
}

/// Words of letters and digits, ordinal suffixes dropped (`8th` → `8`).
fn time_tokens(lower: &str) -> Vec<&str> {
    lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            ["st", "nd", "rd", "th"]
                .iter()
                .find_map(|s| w.strip_suffix(s).filter(|n| is_digits(n)))
                .unwrap_or(w)
        })
        .collect()
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// A year a person would name: four digits, 1900–2199.
fn year_of(tok: &str) -> Option<i32> {
    (tok.len() == 4 && is_digits(tok))
        .then(|| tok.parse().ok())
        .flatten()
        .filter(|y| (1900..2200).contains(y))
}

fn day_of(tok: &str) -> Option<u32> {
    (tok.len() <= 2 && is_digits(tok))
        .then(|| tok.parse().ok())
        .flatten()
        .filter(|d| (1..=31).contains(d))
}

/// The month a word names, English or Russian (any case form).
fn month_of(word: &str) -> Option<u32> {
    const MONTHS: [&[&str]; 12] = [
        &["january", "jan", "январь", "января", "январе"],
        &["february", "feb", "февраль", "февраля", "феврале"],
        &["march", "mar", "март", "марта", "марте"],
        &["april", "apr", "апрель", "апреля", "апреле"],
        &["may", "май", "мая", "мае"],
        &["june", "jun", "июнь", "июня", "июне"],
        &["july", "jul", "июль", "июля", "июле"],
        &["august", "aug", "август", "августа", "августе"],
        &["september", "sep", "sept", "сентябрь", "сентября", "сентябре"],
        &["october", "oct", "октябрь", "октября", "октябре"],
        &["november", "nov", "ноябрь", "ноября", "ноябре"],
        &["december", "dec", "декабрь", "декабря", "декабре"],
    ];
    MONTHS
        .iter()
        .zip(1..)
        .find_map(|(forms, m)| forms.contains(&word).then_some(m))
}

/// An absolute date in the query, in ISO form. A month needs a year beside
/// it and a bare year a preposition (`in 2022`, `в 2022`) or `году`.
fn absolute_scope(lower: &str) -> Option<String> {
    for word in lower.split_whitespace() {
        let word = word.trim_matches(|c: char| !c.is_alphanumeric());
        if let Ok(d) =
            NaiveDate::parse_from_str(word, "%Y-%m-%d").or_else(|_| NaiveDate::parse_from_str(word, "%d.%m.%Y"))
        {
            return Some(d.format("%Y-%m-%d").to_string());
        }
        if let Some((y, m)) = word.split_once('-') {
            let month = (1..=2).contains(&m.len()).then(|| m.parse::<u32>().ok()).flatten();
            if let (Some(y), Some(m)) = (year_of(y), month.filter(|m| (1..=12).contains(m))) {
                return Some(format!("{y:04}-{m:02}"));
            }
        }
    }
    const FILLERS: &[&str] = &["of", "the", "г", "го", "числа"];
    let toks: Vec<&str> = time_tokens(lower)
        .into_iter()
        .filter(|t| !FILLERS.contains(t))
        .collect();
    let at = |i: usize| toks.get(i).copied().unwrap_or_default();
    for (i, tok) in toks.iter().enumerate() {
        if let Some(m) = month_of(tok) {
            let before = i.checked_sub(1).and_then(|j| day_of(at(j)));
            let after = day_of(at(i + 1)).filter(|_| before.is_none());
            let Some(y) = year_of(at(i + 1 + usize::from(after.is_some()))) else {
                continue;
            };
            match before.or(after) {
                Some(d) if NaiveDate::from_ymd_opt(y, m, d).is_some() => return Some(format!("{y:04}-{m:02}-{d:02}")),
                Some(_) => continue,
                None => return Some(format!("{y:04}-{m:02}")),
            }
        }
        let season = match *tok {
            "spring" | "весна" | "весной" | "весну" => Some((0, 3, 5)),
            "summer" | "лето" | "летом" => Some((0, 6, 8)),
            "autumn" | "fall" | "осень" | "осенью" => Some((0, 9, 11)),
            "winter" | "зима" | "зимой" | "зиму" => Some((1, 12, 2)),
            _ => None,
        };
        if let (Some((back, first, last)), Some(y)) = (season, year_of(at(i + 1))) {
            return Some(format!("{:04}-{first:02}/{y:04}-{last:02}", y - back));
        }
        if let Some(y) = year_of(tok) {
            let before = i.checked_sub(1).map(at).unwrap_or_default();
            if matches!(before, "in" | "during" | "в" | "во") || matches!(at(i + 1), "году" | "год") {
                return Some(format!("{y:04}"));
            }
        }
    }
    None
}

/// A relative phrase in the query, as written with single spaces.
fn relative_scope(lower: &str) -> Option<String> {
    let toks = time_tokens(lower);
    // `N units ago`, `неделю назад`.
    if let Some(k) = toks.iter().position(|t| matches!(*t, "ago" | "назад")) {
        if k >= 1 && is_time_unit(toks[k - 1]) {
            let from = if k >= 2 && is_count(toks[k - 2]) { k - 2 } else { k - 1 };
            return Some(toks[from..=k].join(" "));
        }
    }
    // `last 3 days`, `за последние 3 дня`.
    for (i, tok) in toks.iter().enumerate() {
        if matches!(*tok, "last" | "past" | "последние" | "последних") {
            if let (Some(n), Some(unit)) = (toks.get(i + 1), toks.get(i + 2)) {
                if is_count(n) && is_time_unit(unit) {
                    return Some(toks[i..=i + 2].join(" "));
                }
            }
        }
    }
    let padded = format!(" {} ", toks.join(" "));
    RELATIVE_PHRASES
        .iter()
        .filter(|p| padded.contains(&format!(" {p} ")))
        .max_by_key(|p| p.len())
        .map(|p| (*p).to_owned())
}

fn is_time_unit(word: &str) -> bool {
    matches!(
        word,
        "day"
            | "days"
            | "week"
            | "weeks"
            | "month"
            | "months"
            | "year"
            | "years"
            | "день"
            | "дня"
            | "дней"
            | "неделю"
            | "недели"
            | "недель"
            | "месяц"
            | "месяца"
            | "месяцев"
            | "год"
            | "года"
            | "лет"
    )
}

fn is_count(word: &str) -> bool {
    (is_digits(word) && word.len() <= 4)
        || matches!(
            word,
            "a" | "an"
                | "one"
                | "two"
                | "three"
                | "four"
                | "five"
                | "six"
                | "seven"
                | "eight"
                | "nine"
                | "ten"
                | "eleven"
                | "twelve"
                | "couple"
                | "few"
                | "один"
                | "одну"
                | "два"
                | "две"
                | "три"
                | "четыре"
                | "пять"
                | "шесть"
                | "семь"
                | "восемь"
                | "девять"
                | "десять"
        )
}

/// Whether a string is nothing but a timestamp.
fn is_timestamp(s: &str) -> bool {
    let s = s.trim();
    s.len() <= 40 && s.chars().all(|c| c.is_ascii_digit() || " -:.+TtZz".contains(c)) && !find_datetimes(s).is_empty()
}

/// Walks a JSON input: string leaves that are prose (no timestamps, no
/// message-type labels) go to `prose`; the timestamps of message objects
/// (objects with a `content` or `text` string) go to `times`. Timestamps
/// outside messages, such as the period bounds, are not the conversation's.
fn walk_archive_input<'a>(value: &'a Value, prose: &mut Vec<&'a str>, times: &mut Vec<DateTime<Utc>>) {
    match value {
        Value::String(s) if !is_timestamp(s) && !matches!(s.as_str(), "user_query" | "assistant_response") => {
            prose.push(s);
        }
        Value::Array(items) => items.iter().for_each(|v| walk_archive_input(v, prose, times)),
        Value::Object(map) => {
            let is_message = ["content", "text"]
                .iter()
                .any(|k| map.get(*k).is_some_and(Value::is_string));
            for v in map.values() {
                match v {
                    Value::String(s) if is_timestamp(s) => {
                        if is_message {
                            times.extend(find_datetimes(s));
                        }
                    }
                    _ => walk_archive_input(v, prose, times),
                }
            }
        }
        _ => {}
    }
}

/// The archivist's answer; `now` is the bucket when the input has no time.
pub(crate) fn archive(req: &ChatRequest, now: DateTime<Utc>) -> Value {
    let parsed: Vec<(Option<Value>, &str)> = req
        .messages
        .iter()
        .map(|m| (parse_json_object(&m.content), m.content.as_str()))
        .collect();
    let mut prose: Vec<&str> = Vec::new();
    let mut times: Vec<DateTime<Utc>> = Vec::new();
    for (json, text) in &parsed {
        match json {
            Some(v) => walk_archive_input(v, &mut prose, &mut times),
            None => prose.push(text),
        }
    }
    if times.is_empty() {
        times = parsed.iter().flat_map(|(_, t)| find_datetimes(t)).collect();
    }
    let joined = prose.join("\n");
    let start = times.iter().min().copied().unwrap_or(now);
    let end = times.iter().max().copied().unwrap_or(now);
    let mut tags = frequent_words(&joined, 5);
    if tags.is_empty() {
        tags.push("conversation".to_owned());
    }
    let summary = format!(
        "[offline] Conversation about {}: \"{}\"",
        tags.join(", "),
        excerpt(&joined, 200)
    );
    json!({
        "time_bucket_start": start.to_rfc3339_opts(SecondsFormat::Secs, true),
        "time_bucket_end": end.to_rfc3339_opts(SecondsFormat::Secs, true),
        "tags": tags,
        "summary": summary,
    })
}

/// The responder's answer.
pub(crate) fn respond(req: &ChatRequest) -> String {
    let query = query_of(req);
    let mut answer = format!("[offline] You asked: \"{}\".", excerpt(&query, 300));
    let keywords = distinct_words(&query, 5);
    if !keywords.is_empty() {
        answer.push_str(&format!(" Key terms: {}.", keywords.join(", ")));
    }
    let history = texts(req).find_map(|t| between(t, "<context_from_history>", "</context_from_history>"));
    match history {
        Some(h) if !h.is_empty() => answer.push_str(&format!(
            " Your earlier conversations were consulted ({} characters of history).",
            h.chars().count()
        )),
        _ => answer.push_str(" No earlier conversations were consulted."),
    }
    answer.push_str(" This answer comes from the deterministic offline provider; no language model was called.");
    answer
}

/// Timestamps written anywhere in `text`: RFC 3339, PostgreSQL's text form
/// (`2024-05-01 10:00:00.123+00`), naive date-times (taken as UTC) and bare
/// dates (midnight UTC). For each date, the longest form that parses wins.
pub(crate) fn find_datetimes(text: &str) -> Vec<DateTime<Utc>> {
    const ZONED: [&str; 2] = ["%Y-%m-%dT%H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f%#z"];
    const NAIVE: [&str; 2] = ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"];
    let bytes = text.as_bytes();
    let is_date_at = |i: usize| {
        let pattern = b"dddd-dd-dd";
        bytes.len() >= i + pattern.len()
            && pattern
                .iter()
                .zip(&bytes[i..])
                .all(|(p, b)| if *p == b'd' { b.is_ascii_digit() } else { b == p })
            && (i == 0 || !bytes[i - 1].is_ascii_digit())
    };
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !is_date_at(i) {
            i += 1;
            continue;
        }
        // The candidate: ASCII characters a timestamp can contain.
        let end = bytes[i..]
            .iter()
            .take(40)
            .position(|b| !(b.is_ascii_digit() || b" -:.+TtZz".contains(b)))
            .map_or((i + 40).min(bytes.len()), |p| i + p);
        let candidate = &text[i..end];
        let parsed = (10..=candidate.len()).rev().find_map(|len| {
            let s = candidate[..len].trim_end();
            if s.len() != len {
                return None;
            }
            DateTime::parse_from_rfc3339(s)
                .ok()
                .or_else(|| ZONED.iter().find_map(|f| DateTime::parse_from_str(s, f).ok()))
                .map(|d| d.with_timezone(&Utc))
                .or_else(|| {
                    NAIVE
                        .iter()
                        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
                        .map(|n| n.and_utc())
                })
                .or_else(|| {
                    (len == 10)
                        .then(|| NaiveDate::parse_from_str(s, "%Y-%m-%d").ok())
                        .flatten()
                        .and_then(|d| d.and_hms_opt(0, 0, 0))
                        .map(|n| n.and_utc())
                })
                .map(|d| (d, len))
        });
        match parsed {
            Some((d, len)) => {
                found.push(d);
                i += len;
            }
            None => i += 10,
        }
    }
    found
}

/// A valid analysis in the Analyzer prompt's shape, for fake providers in
/// benchmarks and drills that answer every role with the same text.
pub fn analysis_example() -> String {
    json!({
        "needs_context": false,
        "context_type": "none",
        "time_scope": "none",
        "search_keywords": [],
        "context_found": null,
    })
    .to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::llm::Message;

    #[test]
    fn finds_timestamps_in_every_common_form() {
        let text = r#"{"created_at":"2024-05-01T10:00:00Z"} then 2024-05-01 12:30:00.5+00 and
            2024-05-02T08:00:00 (naive), a date 2024-05-03, junk 2024-13-45, id 12024-05-01"#;
        let found: Vec<String> = find_datetimes(text)
            .iter()
            .map(|d| d.to_rfc3339_opts(SecondsFormat::Millis, true))
            .collect();
        assert_eq!(
            found,
            [
                "2024-05-01T10:00:00.000Z",
                "2024-05-01T12:30:00.500Z",
                "2024-05-02T08:00:00.000Z",
                "2024-05-03T00:00:00.000Z",
            ]
        );
    }

    #[test]
    fn analysis_without_records_needs_no_context() {
        let req = ChatRequest::new(Some("You are the analyzer.".into()), "What is the capital of France?");
        let v = analyze(&req);
        assert_eq!(v["needs_context"], false);
        assert_eq!(v["context_type"], "none");
        assert_eq!(v["search_keywords"], json!(["capital", "france"]));
        assert_eq!(v["context_found"]["lsm_record_id"], Value::Null);
        assert_eq!(analyze(&req), v, "deterministic");
    }

    #[test]
    fn analysis_picks_the_record_sharing_most_keywords() {
        let input = json!({
            "user_query": "What did we decide about the garden fence last week?",
            "lsm_records": [
                {"id": 7, "time_bucket_start": "2024-05-01T00:00:00Z", "time_bucket_end": "2024-05-02T00:00:00Z",
                 "tags": ["cooking"], "summary": "Talked about pasta."},
                {"id": 9, "time_bucket_start": "2024-05-03T00:00:00Z", "time_bucket_end": "2024-05-04T00:00:00Z",
                 "tags": ["garden"], "summary": "Decided to paint the fence green."}
            ]
        });
        let req = ChatRequest::new(None, input.to_string());
        let v = analyze(&req);
        assert_eq!(v["needs_context"], true);
        assert_eq!(v["context_type"], "period");
        assert_eq!(v["time_scope"], "last week");
        assert_eq!(v["context_found"]["lsm_record_id"], 9);
        assert_eq!(
            v["context_found"]["period"],
            "2024-05-03T00:00:00Z – 2024-05-04T00:00:00Z"
        );
        assert_eq!(
            v["search_keywords"],
            json!(["decide", "garden", "fence", "last", "week"])
        );
    }

    #[test]
    fn records_may_come_as_lines_of_the_system_prompt() {
        let mut req = ChatRequest::new(
            Some("Analyze.\nRecords:\n{\"id\": 3, \"summary\": \"User likes chamomile\", \"tags\": [\"tea\"]}".into()),
            "<current_query>Recommend herbal drinks like chamomile</current_query>",
        );
        req.messages.insert(0, Message::assistant("earlier"));
        let v = analyze(&req);
        assert_eq!(v["needs_context"], true);
        assert_eq!(v["context_type"], "topic");
        assert_eq!(v["context_found"]["lsm_record_id"], 3);
        assert_eq!(
            v["search_keywords"],
            json!(["recommend", "herbal", "drinks", "chamomile"])
        );
    }

    #[test]
    fn analysis_reads_the_querys_time() {
        let table: &[(&str, &str, &str)] = &[
            ("What did we decide last week?", "period", "last week"),
            ("What did I do in May 2023?", "period", "2023-05"),
            ("What happened on May 8, 2023?", "period", "2023-05-08"),
            ("What happened on the 8th of May 2023?", "period", "2023-05-08"),
            ("Remind me of 2023-05-08", "period", "2023-05-08"),
            ("Any notes from 2023-05?", "period", "2023-05"),
            ("What did I read in 2022?", "period", "2022"),
            ("Where did we go in summer 2023?", "period", "2023-06/2023-08"),
            ("What did I cook 3 days ago?", "period", "3 days ago"),
            ("What did I say two weeks ago?", "period", "two weeks ago"),
            ("Plans from the last 10 days", "period", "last 10 days"),
            ("Did I call mom yesterday?", "period", "yesterday"),
            ("Have I recently mentioned Lisbon?", "period", "recently"),
            ("Что я говорил вчера?", "period", "вчера"),
            ("Что мы решили на прошлой неделе?", "period", "на прошлой неделе"),
            ("Что было в мае 2023?", "period", "2023-05"),
            ("Что было 8 мая 2023 года?", "period", "2023-05-08"),
            ("Что я читал в 2022 году?", "period", "2022"),
            ("Что я писал за последние 3 дня?", "period", "последние 3 дня"),
            ("Что я сказал неделю назад?", "period", "неделю назад"),
            ("When did Caroline go to the support group?", "period", "none"),
            ("Когда я был в Лиссабоне?", "period", "none"),
            ("What did I just say?", "recent", "none"),
            ("What did we discuss earlier in this chat?", "recent", "none"),
            ("Что было в последнем сообщении?", "recent", "none"),
            ("What is the capital of France?", "none", "none"),
            ("May I ask about gardening?", "none", "none"),
            ("I paid 2022 euros for it", "none", "none"),
        ];
        let mut wrong = Vec::new();
        for (query, context_type, time_scope) in table {
            let v = analyze(&ChatRequest::new(None, *query));
            if v["context_type"] != *context_type || v["time_scope"] != *time_scope {
                wrong.push(format!("{query:?}: {} {}", v["context_type"], v["time_scope"]));
            }
            assert_eq!(analyze(&ChatRequest::new(None, *query)), v, "deterministic");
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn archive_buckets_by_the_messages_times() {
        let input = json!({
            "start_date": "2024-05-01T00:00:00Z",
            "raw_logs": [
                {"message_type": "user_query", "content": "How do I prune tomato plants?", "created_at": "2024-05-01T10:00:00Z"},
                {"message_type": "assistant_response", "content": "Prune tomato suckers weekly.", "created_at": "2024-05-01T10:00:05Z"},
                {"message_type": "user_query", "content": "And tomato watering?", "created_at": "2024-05-02T09:00:00Z"}
            ]
        });
        let req = ChatRequest::new(Some("Archivist".into()), input.to_string());
        let now = Utc::now();
        let v = archive(&req, now);
        // The period bound (start_date) is not a message time.
        assert_eq!(v["time_bucket_start"], "2024-05-01T10:00:00Z");
        assert_eq!(v["time_bucket_end"], "2024-05-02T09:00:00Z");
        assert_eq!(v["tags"], json!(["tomato", "prune", "plants", "suckers", "weekly"]));
        let summary = v["summary"].as_str().unwrap();
        assert!(summary.starts_with("[offline] Conversation about tomato"), "{summary}");
        assert!(!summary.contains("user_query"));
        assert_eq!(archive(&req, now), v, "deterministic");
    }

    #[test]
    fn respond_quotes_the_current_query() {
        let pie = "<system>Be helpful</system>\n<context_from_history>\nPeriod: May\nUser likes tea\n</context_from_history>\n<current_query>\nWhich green tea should I buy?\n</current_query>";
        let text = respond(&ChatRequest::new(None, pie));
        assert!(
            text.starts_with("[offline] You asked: \"Which green tea should I buy?\". Key terms: green."),
            "{text}"
        );
        assert!(text.contains("characters of history"));
        let plain = respond(&ChatRequest::new(None, "hello there"));
        assert!(plain.contains("No earlier conversations"));
    }
}
