//! The one place a tracing subscriber is built: JSON lines under systemd
//! (or with `MAAS_LOG_FORMAT=json`), human-readable otherwise. The filter
//! comes from `RUST_LOG`; without it, [`DEFAULT_FILTER`]: `info`, with the
//! cron scheduler's own start-up chatter ("Uninited", "Job creator
//! created") left out.
//!
//! JSON lines are flat ([`FlatJson`]): one object per line with
//! `timestamp`, `level`, `target`, `message`, the event's fields and the
//! fields of every span it happened in (the innermost span's value wins;
//! an event's own field wins over a span's). The field the code names
//! `request.id` is written `request_id`, so every line of a request's path
//! — submitted, each stage's attempt and the model calls inside it, its
//! callback — is `jq 'select(.request_id=="…")'` away, across daemons.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The filter without `RUST_LOG`: `info`, and only warnings from the
/// archivist's cron scheduler (tokio-cron-scheduler), which says at INFO
/// how its parts start.
pub const DEFAULT_FILTER: &str = "info,tokio_cron_scheduler=warn";

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let json = std::env::var("MAAS_LOG_FORMAT").map(|v| v == "json").unwrap_or(false)
        || std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.fmt_fields(JsonFields::new()).event_format(FlatJson).try_init()
    } else {
        builder.with_target(false).try_init()
    };
}

/// The JSON name of a field: `request.id` is `request_id`.
fn key(name: &str) -> String {
    match name {
        "request.id" => "request_id".to_owned(),
        other => other.to_owned(),
    }
}

/// One JSON object per event, span fields flattened onto it (module doc).
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        );
        line.insert("level".into(), Value::String(meta.level().as_str().to_owned()));
        line.insert("target".into(), Value::String(meta.target().to_owned()));
        event.record(&mut Fields(&mut line));
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope {
                innermost.get_or_insert_with(|| span.name());
                let ext = span.extensions();
                let Some(fields) = ext.get::<FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(fields.as_str()) {
                    for (k, v) in map {
                        line.entry(key(&k)).or_insert(v);
                    }
                }
            }
            if let Some(name) = innermost {
                line.entry("span").or_insert_with(|| Value::String(name.to_owned()));
            }
        }
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Records an event's fields into a JSON object.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(key(field.name()), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(key(field.name()), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(key(field.name()), Value::from(value));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        let v = i64::try_from(value).map_or_else(|_| Value::from(value.to_string()), Value::from);
        self.0.insert(key(field.name()), v);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        let v = u64::try_from(value).map_or_else(|_| Value::from(value.to_string()), Value::from);
        self.0.insert(key(field.name()), v);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(key(field.name()), Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(key(field.name()), Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(key(field.name()), Value::from(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(key(field.name()), Value::from(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;

        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    #[test]
    fn span_fields_are_flattened_and_request_id_is_named_once() {
        let buf = Buf::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buf.clone())
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("stage", request.id = "r-1", stage = "analyze", attempt = 2);
            let _o = outer.enter();
            let inner = tracing::info_span!("call", stage = "inner");
            let _i = inner.enter();
            tracing::info!(attempt = 3, ok = true, "llm call completed");
        });
        let text = String::from_utf8(buf.0.lock().map(|b| b.clone()).unwrap_or_default()).unwrap_or_default();
        let line: Value = serde_json::from_str(text.trim()).unwrap_or_default();
        assert_eq!(line["request_id"], "r-1", "{text}");
        assert_eq!(line["stage"], "inner", "the innermost span wins: {text}");
        assert_eq!(line["attempt"], 3, "the event's own field wins: {text}");
        assert_eq!(line["message"], "llm call completed");
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["span"], "call");
        assert_eq!(line["ok"], true);
        assert!(line.get("request.id").is_none(), "{text}");
    }
}
