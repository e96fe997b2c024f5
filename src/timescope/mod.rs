//! Time phrases, English and Russian: finding the time a query names
//! ([`find`]) and reading a `time_scope` into a UTC range ([`range()`]).
//!
//! Guarantees:
//! - A leaf: no crate imports, so the analyzers (`llm`) and the stages
//!   (`stage`) share one reader.
//! - Both are pure functions that never panic; [`range()`] returns a
//!   non-empty half-open range or `None`.
//! - One set of word tables (months, seasons, units, counts) serves both,
//!   so every scope [`find`] writes is in a form [`range()`] reads.

mod query;
mod range;
mod words;

pub use query::{Kind, find};
pub use range::range;

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::stage::Analysis;

    /// Wednesday, 15 May 2024, 12:00 UTC.
    fn now() -> DateTime<Utc> {
        chrono::NaiveDate::from_ymd_opt(2024, 5, 15)
            .and_then(|d| d.and_hms_opt(12, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or_default()
    }

    /// `[from, to)` as written: dates (midnight UTC) or RFC 3339 times.
    fn span(from: &str, to: &str) -> (DateTime<Utc>, DateTime<Utc>) {
        let parse = |s: &str| {
            DateTime::parse_from_rfc3339(s)
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or_else(|_| {
                    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
                        .map(|d| d.and_time(chrono::NaiveTime::MIN).and_utc())
                        .unwrap_or_else(|e| panic!("{s}: {e}"))
                })
        };
        (parse(from), parse(to))
    }

    #[test]
    fn time_range_reads_the_forms_analyzers_write() {
        let table: &[(&str, Option<(&str, &str)>)] = &[
            ("none", None),
            ("", None),
            ("  NONE ", None),
            ("when did I go to Paris?", None),
            ("last time", None),
            ("earlier", None),
            ("gibberish", None),
            // ISO dates, months, years, times and ranges.
            ("2023-05-08", Some(("2023-05-08", "2023-05-09"))),
            ("2023-05", Some(("2023-05-01", "2023-06-01"))),
            ("2023", Some(("2023-01-01", "2024-01-01"))),
            ("2023-12", Some(("2023-12-01", "2024-01-01"))),
            ("08.05.2023", Some(("2023-05-08", "2023-05-09"))),
            ("2023-05-01/2023-05-31", Some(("2023-05-01", "2023-06-01"))),
            ("2023-05-01..2023-05-31", Some(("2023-05-01", "2023-06-01"))),
            ("2023-05-31..2023-05-01", Some(("2023-05-01", "2023-06-01"))),
            ("2023-05/2023-07", Some(("2023-05-01", "2023-08-01"))),
            ("from 2023-05-01 to 2023-05-03", Some(("2023-05-01", "2023-05-04"))),
            (
                "2024-05-01T00:00:00Z – 2024-05-02T10:00:00Z",
                Some(("2024-05-01T00:00:00Z", "2024-05-02T10:00:01Z")),
            ),
            (
                "2024-05-01 10:00:00+00",
                Some(("2024-05-01T10:00:00Z", "2024-05-01T10:00:01Z")),
            ),
            ("around 2023-05-08", Some(("2023-05-08", "2023-05-09"))),
            // Absolute phrases.
            ("in May 2023", Some(("2023-05-01", "2023-06-01"))),
            ("May 2023", Some(("2023-05-01", "2023-06-01"))),
            ("May, 2023", Some(("2023-05-01", "2023-06-01"))),
            ("May 8, 2023", Some(("2023-05-08", "2023-05-09"))),
            ("May 8th 2023", Some(("2023-05-08", "2023-05-09"))),
            ("8 May 2023", Some(("2023-05-08", "2023-05-09"))),
            ("the 8th of May, 2023", Some(("2023-05-08", "2023-05-09"))),
            ("Sept 2022", Some(("2022-09-01", "2022-10-01"))),
            ("in 2022", Some(("2022-01-01", "2023-01-01"))),
            ("summer 2023", Some(("2023-06-01", "2023-09-01"))),
            ("winter 2023", Some(("2022-12-01", "2023-03-01"))),
            ("between May and July 2023", Some(("2023-05-01", "2023-08-01"))),
            ("May 1 to May 3, 2023", Some(("2023-05-01", "2023-05-04"))),
            ("in March", Some(("2024-03-01", "2024-04-01"))),
            ("June", Some(("2023-06-01", "2023-07-01"))),
            ("May 20", Some(("2023-05-20", "2023-05-21"))),
            ("February 30, 2023", None),
            // Relative to now (Wednesday 2024-05-15).
            ("today", Some(("2024-05-15", "2024-05-16"))),
            ("yesterday", Some(("2024-05-14", "2024-05-15"))),
            ("the day before yesterday", Some(("2024-05-13", "2024-05-14"))),
            ("last week", Some(("2024-05-06", "2024-05-13"))),
            ("Last Week", Some(("2024-05-06", "2024-05-13"))),
            ("this week", Some(("2024-05-13", "2024-05-20"))),
            ("last month", Some(("2024-04-01", "2024-05-01"))),
            ("this month", Some(("2024-05-01", "2024-06-01"))),
            ("last year", Some(("2023-01-01", "2024-01-01"))),
            ("this year", Some(("2024-01-01", "2025-01-01"))),
            ("3 days ago", Some(("2024-05-12", "2024-05-13"))),
            ("a week ago", Some(("2024-05-06", "2024-05-13"))),
            ("two weeks ago", Some(("2024-04-29", "2024-05-06"))),
            ("2 months ago", Some(("2024-03-01", "2024-04-01"))),
            ("a year ago", Some(("2023-01-01", "2024-01-01"))),
            ("last 3 days", Some(("2024-05-12", "2024-05-16"))),
            ("past week", Some(("2024-05-08", "2024-05-16"))),
            ("recently", Some(("2024-04-15", "2024-05-16"))),
            ("recent", Some(("2024-04-15", "2024-05-16"))),
            ("last week of May 2023", Some(("2023-05-01", "2023-06-01"))),
            // Russian.
            ("сегодня", Some(("2024-05-15", "2024-05-16"))),
            ("вчера", Some(("2024-05-14", "2024-05-15"))),
            ("позавчера", Some(("2024-05-13", "2024-05-14"))),
            ("на прошлой неделе", Some(("2024-05-06", "2024-05-13"))),
            ("на этой неделе", Some(("2024-05-13", "2024-05-20"))),
            ("в прошлом месяце", Some(("2024-04-01", "2024-05-01"))),
            ("в прошлом году", Some(("2023-01-01", "2024-01-01"))),
            ("В мае 2023", Some(("2023-05-01", "2023-06-01"))),
            ("8 мая 2023 года", Some(("2023-05-08", "2023-05-09"))),
            ("в 2022 году", Some(("2022-01-01", "2023-01-01"))),
            ("3 дня назад", Some(("2024-05-12", "2024-05-13"))),
            ("неделю назад", Some(("2024-05-06", "2024-05-13"))),
            ("за последние 3 дня", Some(("2024-05-12", "2024-05-16"))),
            ("недавно", Some(("2024-04-15", "2024-05-16"))),
            ("летом 2023", Some(("2023-06-01", "2023-09-01"))),
            ("с 1 мая по 3 мая 2023", Some(("2023-05-01", "2023-05-04"))),
        ];
        let mut wrong = Vec::new();
        for (scope, expected) in table {
            let got = range(scope, now());
            let expected = expected.map(|(from, to)| span(from, to));
            if got != expected {
                wrong.push(format!("{scope:?}: got {got:?}, expected {expected:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn time_range_reads_what_the_offline_analyzer_writes() {
        let queries = [
            ("What did we decide last week?", ("2024-05-06", "2024-05-13")),
            ("What did I do in May 2023?", ("2023-05-01", "2023-06-01")),
            ("What happened on May 8, 2023?", ("2023-05-08", "2023-05-09")),
            ("What did I read in 2022?", ("2022-01-01", "2023-01-01")),
            ("Where did we go in summer 2023?", ("2023-06-01", "2023-09-01")),
            ("What did I cook 3 days ago?", ("2024-05-12", "2024-05-13")),
            ("Plans from the last 10 days", ("2024-05-05", "2024-05-16")),
            ("Что мы решили на прошлой неделе?", ("2024-05-06", "2024-05-13")),
            ("Что было в мае 2023?", ("2023-05-01", "2023-06-01")),
            ("Что я писал за последние 3 дня?", ("2024-05-12", "2024-05-16")),
        ];
        for (query, (from, to)) in queries {
            let text = crate::llm::offline::analyze(&crate::llm::ChatRequest::new(None, query)).to_string();
            let a = Analysis::parse(&text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(a.context_type(), "period", "{query}");
            assert_eq!(a.time_range(now()), Some(span(from, to)), "{query}: {}", a.time_scope());
        }
        let when = crate::llm::offline::analyze(&crate::llm::ChatRequest::new(None, "When did I move?")).to_string();
        let when = Analysis::parse(&when).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((when.context_type(), when.time_range(now())), ("period", None));
    }

    #[test]
    fn time_range_never_panics() {
        let pieces = [
            "May",
            "мая",
            "2023",
            "-",
            "..",
            "/",
            "–",
            " ",
            "0",
            "31",
            "99999999999999999999",
            "4294967295",
            "ago",
            "назад",
            "last",
            "days",
            "weeks",
            "months",
            "years",
            "9999-12-31",
            "+262143-12-31",
            "2023-13",
            "2023-00",
            "T",
            "Z",
            ":",
            "from",
            "to",
            "between",
            "and",
            "summer",
            "winter",
            "8th",
            "é",
            "🙂",
            "\u{0}",
            ".",
            ",",
            "recent",
            "this",
            "week",
            "year",
            "по",
            "с",
            "2023-02-30",
            "-0001",
            "февраль",
        ];
        let extremes = [
            now(),
            DateTime::<Utc>::MAX_UTC,
            DateTime::<Utc>::MIN_UTC,
            DateTime::UNIX_EPOCH,
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            usize::try_from(seed >> 33).unwrap_or_default() % n
        };
        for _ in 0..3000 {
            let len = next(7);
            let scope: String = (0..len)
                .map(|_| pieces[next(pieces.len())])
                .collect::<Vec<_>>()
                .join(" ");
            let joined: String = (0..len).map(|_| pieces[next(pieces.len())]).collect();
            for now in extremes {
                for s in [&scope, &joined] {
                    if let Some((start, end)) = range(s, now) {
                        assert!(start < end, "{s:?} at {now}: {start} >= {end}");
                    }
                }
            }
        }
        for s in [
            "today",
            "this year",
            "last year",
            "3 years ago",
            "recently",
            "May",
            "summer",
            "last week",
        ] {
            for now in extremes {
                let _ = range(s, now);
            }
        }
    }

    #[test]
    fn every_relative_phrase_found_is_read() {
        for phrase in query::RELATIVE_PHRASES {
            assert!(range(phrase, now()).is_some(), "{phrase:?}");
            assert_eq!(find(phrase), Some((Kind::Period, (*phrase).to_owned())), "{phrase:?}");
        }
    }
}
