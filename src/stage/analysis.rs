//! The analyzer's result, typed: what the analyze stage produces, what the
//! assemble stage reads and what decides whether the two can be fused.
//!
//! Guarantees:
//! - An [`Analysis`] exists only validated: [`Analysis::parse`] (model
//!   output) and [`Analysis::from_json`] (a stored analysis) apply the same
//!   rules — `needs_context` a boolean, `context_type` a string,
//!   `time_scope` a string (absent or null: `"none"`), `search_keywords`
//!   strings (absent or null: none), `context_found` an object or null whose
//!   `lsm_record_id` is an integer, a string holding one, or null.
//! - [`Analysis::to_json`] is exactly the JSON stored in
//!   `pipeline_runs.analysis`: the five keys, normalised as above, with
//!   every other field of `context_found` kept as the model gave it and
//!   `lsm_record_id` always present there. `from_json(&a.to_json()) == a`.
//! - [`Analysis::time_range`] is a pure function of `time_scope` and the
//!   request's time, never panics, and returns a non-empty half-open range
//!   or `None`.
//! - Nothing outside `stage` reads the analysis JSON: the dispatcher only
//!   passes it along and asks [`Pipeline::fuse_assemble`](super::Pipeline::fuse_assemble).
//!
//! Size: over 500 lines because the `time_scope` reader (`scope`) and its test
//! table belong to [`Analysis::time_range`] and to nothing else.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::llm::text::strip_fence;
use crate::model::MemoryRecord;

/// The analysis of one request's query.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    needs_context: bool,
    context_type: String,
    time_scope: String,
    search_keywords: Vec<String>,
    context_found: Option<ContextFound>,
}

/// The memory record the analyzer found relevant, if it named one.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextFound {
    record_id: Option<i64>,
    /// The object as stored: the model's fields, `lsm_record_id` normalised.
    fields: Map<String, Value>,
}

impl ContextFound {
    /// The `lsm_storage` id it refers to, if any.
    pub fn record_id(&self) -> Option<i64> {
        self.record_id
    }

    /// Every field as stored (`lsm_record_id` included; `period`,
    /// `relevance` and the like as the model gave them).
    pub fn fields(&self) -> &Map<String, Value> {
        &self.fields
    }
}

impl Analysis {
    /// Parses model output: one JSON object, possibly inside a fenced code
    /// block, validated as described in the module doc.
    pub fn parse(text: &str) -> Result<Analysis, String> {
        let body = strip_fence(text.trim());
        let v: Value = serde_json::from_str(body).map_err(|e| format!("{e} (in {} bytes)", text.len()))?;
        Analysis::from_json(&v)
    }

    /// Validates a JSON value (a stored analysis, or a parsed answer).
    pub fn from_json(v: &Value) -> Result<Analysis, String> {
        let Some(obj) = v.as_object() else {
            return Err("expected a JSON object".into());
        };
        let needs_context = obj
            .get("needs_context")
            .and_then(Value::as_bool)
            .ok_or("needs_context must be true or false")?;
        let context_type = obj
            .get("context_type")
            .and_then(Value::as_str)
            .ok_or("context_type must be a string")?
            .to_owned();
        let time_scope = match obj.get("time_scope") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => "none".into(),
            Some(_) => return Err("time_scope must be a string".into()),
        };
        let search_keywords = match obj.get("search_keywords") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|k| k.as_str().map(str::to_owned).ok_or("search_keywords must be strings"))
                .collect::<Result<Vec<_>, _>>()?,
            Some(Value::Null) | None => Vec::new(),
            Some(_) => return Err("search_keywords must be an array of strings".into()),
        };
        let context_found = match obj.get("context_found") {
            None | Some(Value::Null) => None,
            Some(Value::Object(found)) => {
                let record_id = match found.get("lsm_record_id") {
                    None | Some(Value::Null) => None,
                    Some(Value::Number(n)) if n.as_i64().is_some() => n.as_i64(),
                    Some(Value::String(s)) if s.parse::<i64>().is_ok() => s.parse::<i64>().ok(),
                    Some(_) => return Err("context_found.lsm_record_id must be an integer or null".into()),
                };
                let mut fields = found.clone();
                fields.insert("lsm_record_id".into(), json!(record_id));
                Some(ContextFound { record_id, fields })
            }
            Some(_) => return Err("context_found must be an object or null".into()),
        };
        Ok(Analysis {
            needs_context,
            context_type,
            time_scope,
            search_keywords,
            context_found,
        })
    }

    /// The JSON stored in `pipeline_runs.analysis` (see the module doc).
    pub fn to_json(&self) -> Value {
        json!({
            "needs_context": self.needs_context,
            "context_type": self.context_type,
            "time_scope": self.time_scope,
            "search_keywords": self.search_keywords,
            "context_found": self.context_found.as_ref().map_or(Value::Null, |f| Value::Object(f.fields.clone())),
        })
    }

    /// Whether the query needs long-term memory.
    pub fn needs_context(&self) -> bool {
        self.needs_context
    }

    /// The kind of context the analyzer asked for (the prompt's words).
    pub fn context_type(&self) -> &str {
        &self.context_type
    }

    /// The period the query is about; `"none"` when it named none.
    pub fn time_scope(&self) -> &str {
        &self.time_scope
    }

    /// Words to search memory with; empty when it gave none.
    pub fn search_keywords(&self) -> &[String] {
        &self.search_keywords
    }

    /// The record the analyzer found relevant, if any.
    pub fn context_found(&self) -> Option<&ContextFound> {
        self.context_found.as_ref()
    }

    /// The `lsm_storage` id of the record it found, if any.
    pub fn record_id(&self) -> Option<i64> {
        self.context_found.as_ref().and_then(ContextFound::record_id)
    }

    /// Whether the assemble stage can run on `memory` (the records the
    /// claim read for the analyzer): it refers to no record, or to one of
    /// them.
    pub fn assembles_from(&self, memory: &[MemoryRecord]) -> bool {
        self.record_id().is_none_or(|id| memory.iter().any(|m| m.id == id))
    }

    /// The period `time_scope` names, as a half-open UTC range
    /// `[start, end)`; `now` is the request's time, which decides relative
    /// phrases. `None` when the scope names no period (`"none"`, `""`, a
    /// "when did …" question, anything unreadable). Never panics.
    ///
    /// Read, in English and Russian, case-insensitively, all in UTC:
    /// - ISO: `2023-05-08`, `2023-05`, `2023`, a timestamp (that second),
    ///   `08.05.2023`; ranges of any two absolute forms joined by `/`, `..`,
    ///   `–`, `—`, ` - `, `to`, `until`, `through`, `and`, `по`, `до`
    ///   (optionally after `from`, `between`, `с`): from the start of the
    ///   first to the end of the last.
    /// - Absolute phrases: `May 2023`, `in May 2023`, `May 8, 2023`,
    ///   `8th of May 2023`, `в мае 2023`, `8 мая 2023`, `in 2022`,
    ///   `summer 2023` (spring March–May, summer June–August, autumn/fall
    ///   September–November, winter December of the year before to
    ///   February); a month or day without a year is its latest occurrence
    ///   that has begun by `now`.
    /// - Relative to `now`: `today`, `yesterday`, `the day before
    ///   yesterday`; `this`/`last` `week` (weeks start on Monday), `month`,
    ///   `year`; `N days/weeks/months/years ago` (that day, week, month,
    ///   year; `a week ago`, `two months ago`); `last`/`past N days` and
    ///   `past week` (the window from N units before today to the end of
    ///   today); `recently`, `recent`, `lately` (the last 30 days); and
    ///   `сегодня`, `вчера`, `позавчера`, `на этой/прошлой неделе`,
    ///   `в этом/прошлом месяце`, `в этом/прошлом году`, `N дней/недель/
    ///   месяцев/лет назад`, `за последние N дней`, `недавно`.
    ///
    /// An absolute form with a year wins over a relative phrase in the same
    /// scope, and a relative phrase over a month or day without a year.
    pub fn time_range(&self, now: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        scope::range(&self.time_scope, now)
    }
}

/// Reading a `time_scope`; see [`Analysis::time_range`] for the forms.
mod scope {
    use chrono::{DateTime, Datelike, Days, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, Utc};

    type Range = (DateTime<Utc>, DateTime<Utc>);

    /// Longer scopes are not a period a model wrote; reading stays cheap.
    const MAX_CHARS: usize = 200;

    pub(super) fn range(scope: &str, now: DateTime<Utc>) -> Option<Range> {
        let text = scope.trim().to_lowercase();
        if text.chars().count() > MAX_CHARS || matches!(text.as_str(), "" | "none" | "null" | "n/a" | "нет") {
            return None;
        }
        explicit_range(&text, now).or_else(|| single(&text, now))
    }

    const SEPARATORS: &[&str] = &[
        "..",
        "/",
        "–",
        "—",
        " - ",
        " to ",
        " until ",
        " till ",
        " through ",
        " and ",
        " по ",
        " до ",
    ];

    /// Two absolute forms joined by a separator; a side without a year
    /// takes the other side's.
    fn explicit_range(text: &str, now: DateTime<Utc>) -> Option<Range> {
        let body = ["from ", "between ", "с ", "между "]
            .iter()
            .find_map(|p| text.strip_prefix(p))
            .unwrap_or(text);
        SEPARATORS.iter().find_map(|sep| {
            let (a, b) = body.split_once(sep)?;
            let (a, b) = (a.trim(), b.trim());
            let (mut left, left_year) = absolute(a, now)?;
            let (mut right, right_year) = absolute(b, now)?;
            if !left_year && right_year {
                left = absolute(&format!("{a} {}", right.0.year()), now).map_or(left, |(r, _)| r);
            } else if left_year && !right_year {
                right = absolute(&format!("{b} {}", left.0.year()), now).map_or(right, |(r, _)| r);
            }
            Some((left.0.min(right.0), left.1.max(right.1)))
        })
    }

    fn single(text: &str, now: DateTime<Utc>) -> Option<Range> {
        let abs = absolute(text, now);
        if let Some((r, true)) = abs {
            return Some(r);
        }
        relative(text, now).or(abs.map(|(r, _)| r))
    }

    fn at(d: NaiveDate) -> DateTime<Utc> {
        d.and_time(NaiveTime::MIN).and_utc()
    }

    fn days(start: NaiveDate, n: u64) -> Option<Range> {
        Some((at(start), at(start.checked_add_days(Days::new(n))?)))
    }

    fn week(d: NaiveDate) -> Option<Range> {
        days(
            d.checked_sub_days(Days::new(d.weekday().num_days_from_monday().into()))?,
            7,
        )
    }

    fn months(year: i32, month: u32, n: u32) -> Option<Range> {
        let first = NaiveDate::from_ymd_opt(year, month, 1)?;
        Some((at(first), at(first.checked_add_months(Months::new(n))?)))
    }

    fn year(y: i32) -> Option<Range> {
        months(y, 1, 12)
    }

    /// A date, a month or a timestamp in ISO form (or `dd.mm.yyyy`).
    fn iso(word: &str) -> Option<Range> {
        if let Ok(t) =
            DateTime::parse_from_rfc3339(word).or_else(|_| DateTime::parse_from_str(word, "%Y-%m-%d %H:%M:%S%.f%#z"))
        {
            let t = t.with_timezone(&Utc);
            return Some((t, t.checked_add_signed(TimeDelta::try_seconds(1)?)?));
        }
        for f in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M"] {
            if let Ok(t) = NaiveDateTime::parse_from_str(word, f) {
                let t = t.and_utc();
                return Some((t, t.checked_add_signed(TimeDelta::try_seconds(1)?)?));
            }
        }
        for f in ["%Y-%m-%d", "%d.%m.%Y"] {
            if let Ok(d) = NaiveDate::parse_from_str(word, f) {
                return days(d, 1);
            }
        }
        let (y, m) = word.split_once('-')?;
        if y.len() == 4 && (1..=2).contains(&m.len()) && is_digits(y) && is_digits(m) {
            return months(y.parse().ok()?, m.parse().ok()?, 1);
        }
        None
    }

    fn is_digits(s: &str) -> bool {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    }

    /// Words of letters and digits, ordinal suffixes dropped (`8th` → `8`).
    fn tokens(text: &str) -> Vec<&str> {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(|w| {
                ["st", "nd", "rd", "th"]
                    .iter()
                    .find_map(|s| w.strip_suffix(s).filter(|n| is_digits(n)))
                    .unwrap_or(w)
            })
            .collect()
    }

    fn four_digit_year(tok: &str) -> Option<i32> {
        (tok.len() == 4 && is_digits(tok)).then(|| tok.parse().ok()).flatten()
    }

    fn day_of_month(tok: &str) -> Option<u32> {
        (tok.len() <= 2 && is_digits(tok))
            .then(|| tok.parse().ok())
            .flatten()
            .filter(|d| (1..=31).contains(d))
    }

    /// An absolute period and whether it named its year.
    fn absolute(text: &str, now: DateTime<Utc>) -> Option<(Range, bool)> {
        if let Some(r) = iso(text).or_else(|| {
            text.split_whitespace()
                .find_map(|w| iso(w.trim_matches(|c: char| !c.is_alphanumeric())))
        }) {
            return Some((r, true));
        }
        const FILLERS: &[&str] = &[
            "of",
            "the",
            "in",
            "on",
            "during",
            "в",
            "во",
            "году",
            "г",
            "го",
            "числа",
            "year",
        ];
        let toks: Vec<&str> = tokens(text).into_iter().filter(|t| !FILLERS.contains(t)).collect();
        let today = now.date_naive();
        for (i, tok) in toks.iter().enumerate() {
            if let Some(m) = month_of(tok) {
                let before = i.checked_sub(1).and_then(|j| toks.get(j)).and_then(|t| day_of_month(t));
                let mut j = i + 1;
                let after = toks.get(j).and_then(|t| day_of_month(t)).filter(|_| before.is_none());
                if after.is_some() {
                    j += 1;
                }
                let y = toks.get(j).and_then(|t| four_digit_year(t));
                let day = before.or(after);
                let explicit = y.is_some();
                let y = y.unwrap_or_else(|| {
                    let this = NaiveDate::from_ymd_opt(today.year(), m, day.unwrap_or(1));
                    if this.is_some_and(|d| d <= today) {
                        today.year()
                    } else {
                        today.year() - 1
                    }
                });
                let r = match day {
                    Some(d) => days(NaiveDate::from_ymd_opt(y, m, d)?, 1),
                    None => months(y, m, 1),
                };
                return r.map(|r| (r, explicit));
            }
            if let Some(start) = season_of(tok) {
                let y = toks.get(i + 1).and_then(|t| four_digit_year(t));
                let first = |y: i32| if start == 12 { (y - 1, 12) } else { (y, start) };
                let explicit = y.is_some();
                let y = y.unwrap_or_else(|| {
                    let (fy, fm) = first(today.year());
                    let begun = NaiveDate::from_ymd_opt(fy, fm, 1).is_some_and(|d| d <= today);
                    if begun { today.year() } else { today.year() - 1 }
                });
                let (fy, fm) = first(y);
                return months(fy, fm, 3).map(|r| (r, explicit));
            }
        }
        let y = toks.iter().find_map(|t| four_digit_year(t))?;
        year(y).map(|r| (r, true))
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

    /// The first month of the season a word names (winter: December).
    fn season_of(word: &str) -> Option<u32> {
        const SEASONS: [(&[&str], u32); 4] = [
            (&["spring", "весна", "весной", "весну"], 3),
            (&["summer", "лето", "летом"], 6),
            (&["autumn", "fall", "осень", "осенью"], 9),
            (&["winter", "зима", "зимой", "зиму"], 12),
        ];
        SEASONS
            .iter()
            .find_map(|(forms, m)| forms.contains(&word).then_some(*m))
    }

    #[derive(Clone, Copy)]
    enum Unit {
        Day,
        Week,
        Month,
        Year,
    }

    fn unit_of(word: &str) -> Option<Unit> {
        match word {
            "day" | "days" | "день" | "дня" | "дней" | "сутки" | "суток" => Some(Unit::Day),
            "week" | "weeks" | "неделя" | "неделю" | "недели" | "недель" => Some(Unit::Week),
            "month" | "months" | "месяц" | "месяца" | "месяцев" => Some(Unit::Month),
            "year" | "years" | "год" | "года" | "лет" => Some(Unit::Year),
            _ => None,
        }
    }

    fn number_of(word: &str) -> Option<u32> {
        if is_digits(word) {
            return word.parse().ok();
        }
        const WORDS: [&[&str]; 12] = [
            &["a", "an", "one", "один", "одна", "одну"],
            &["two", "couple", "два", "две"],
            &["three", "few", "три"],
            &["four", "четыре"],
            &["five", "пять"],
            &["six", "шесть"],
            &["seven", "семь"],
            &["eight", "восемь"],
            &["nine", "девять"],
            &["ten", "десять"],
            &["eleven", "одиннадцать"],
            &["twelve", "двенадцать"],
        ];
        WORDS
            .iter()
            .zip(1..)
            .find_map(|(forms, n)| forms.contains(&word).then_some(n))
    }

    /// `today` moved back `n` units.
    fn back(today: NaiveDate, unit: Unit, n: u32) -> Option<NaiveDate> {
        match unit {
            Unit::Day => today.checked_sub_days(Days::new(n.into())),
            Unit::Week => today.checked_sub_days(Days::new(u64::from(n) * 7)),
            Unit::Month => today.checked_sub_months(Months::new(n)),
            Unit::Year => today.checked_sub_months(Months::new(n.checked_mul(12)?)),
        }
    }

    /// The calendar unit holding `d`.
    fn unit_at(d: NaiveDate, unit: Unit) -> Option<Range> {
        match unit {
            Unit::Day => days(d, 1),
            Unit::Week => week(d),
            Unit::Month => months(d.year(), d.month(), 1),
            Unit::Year => year(d.year()),
        }
    }

    /// From `n` units before today to the end of today.
    fn window(today: NaiveDate, unit: Unit, n: u32) -> Option<Range> {
        let start = back(today, unit, n)?;
        Some((at(start), at(today.checked_add_days(Days::new(1))?)))
    }

    fn relative(text: &str, now: DateTime<Utc>) -> Option<Range> {
        let toks = tokens(text);
        let padded = format!(" {} ", toks.join(" "));
        let has = |phrases: &[&str]| phrases.iter().any(|p| padded.contains(&format!(" {p} ")));
        let today = now.date_naive();
        let this = |unit| unit_at(today, unit);
        let last = |unit| back(today, unit, 1).and_then(|d| unit_at(d, unit));
        if has(&["day before yesterday", "позавчера"]) {
            return unit_at(back(today, Unit::Day, 2)?, Unit::Day);
        }
        if has(&["yesterday", "вчера"]) {
            return last(Unit::Day);
        }
        if has(&["today", "tonight", "this morning", "сегодня"]) {
            return this(Unit::Day);
        }
        let calendar: [(&[&str], &[&str], Unit); 3] = [
            (
                &[
                    "last week",
                    "previous week",
                    "прошлой неделе",
                    "прошлая неделя",
                    "прошлую неделю",
                ],
                &["this week", "этой неделе", "эта неделя", "эту неделю"],
                Unit::Week,
            ),
            (
                &["last month", "previous month", "прошлом месяце", "прошлый месяц"],
                &["this month", "этом месяце", "этот месяц"],
                Unit::Month,
            ),
            (
                &["last year", "previous year", "прошлом году", "прошлый год"],
                &["this year", "этом году", "этот год"],
                Unit::Year,
            ),
        ];
        for (previous, current, unit) in calendar {
            if has(previous) {
                return last(unit);
            }
            if has(current) {
                return this(unit);
            }
        }
        // `N units ago`: the calendar unit that many units back.
        if let Some(k) = toks.iter().position(|t| matches!(*t, "ago" | "назад")) {
            let unit = k.checked_sub(1).and_then(|j| toks.get(j)).and_then(|t| unit_of(t));
            if let Some(unit) = unit {
                let n = k
                    .checked_sub(2)
                    .and_then(|j| toks.get(j))
                    .and_then(|t| number_of(t))
                    .unwrap_or(1);
                return unit_at(back(today, unit, n)?, unit);
            }
        }
        // `last 3 days`, `past week`, `за последние 3 дня`: a window.
        const STARTS: &[&str] = &[
            "last",
            "past",
            "previous",
            "последние",
            "последних",
            "последнюю",
            "последний",
            "прошедшие",
            "прошедший",
            "прошедшую",
        ];
        for (i, tok) in toks.iter().enumerate() {
            if !STARTS.contains(tok) {
                continue;
            }
            let next = toks.get(i + 1).copied().unwrap_or_default();
            if let Some(unit) = unit_of(next) {
                return window(today, unit, 1);
            }
            if let (Some(n), Some(unit)) = (number_of(next), toks.get(i + 2).and_then(|t| unit_of(t))) {
                return window(today, unit, n);
            }
        }
        if has(&["recently", "recent", "lately", "недавно"]) {
            return window(today, Unit::Day, 30);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_stored_json() {
        let text = r#"{"needs_context": true, "context_type": "topic", "time_scope": "last week",
            "search_keywords": ["trip"], "context_found": {"lsm_record_id": "7", "period": "May"}}"#;
        let a = Analysis::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.record_id(), Some(7));
        assert_eq!(a.search_keywords(), ["trip"]);
        assert_eq!(a.time_scope(), "last week");
        assert!(a.needs_context());
        let stored = a.to_json();
        assert_eq!(stored["context_found"], json!({"lsm_record_id": 7, "period": "May"}));
        assert_eq!(Analysis::from_json(&stored).ok(), Some(a));
    }

    #[test]
    fn stored_json_keeps_its_shape() {
        let a =
            Analysis::parse(r#"{"needs_context": false, "context_type": "none"}"#).unwrap_or_else(|e| panic!("{e}"));
        // Byte for byte the JSON the analyzer has always stored.
        assert_eq!(a.to_json().to_string(), crate::llm::offline::analysis_example());
        let found = Analysis::parse(r#"{"needs_context": true, "context_type": "t", "context_found": {}}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(found.to_json()["context_found"], json!({"lsm_record_id": null}));
    }

    fn scoped(scope: &str) -> Analysis {
        Analysis::from_json(&json!({"needs_context": true, "context_type": "period", "time_scope": scope}))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Wednesday, 15 May 2024, 12:00 UTC.
    fn now() -> DateTime<Utc> {
        chrono::NaiveDate::from_ymd_opt(2024, 5, 15)
            .and_then(|d| d.and_hms_opt(12, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or_default()
    }

    /// `[from, to)` as written: dates (midnight UTC) or RFC 3339 times.
    fn range(from: &str, to: &str) -> (DateTime<Utc>, DateTime<Utc>) {
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
            let got = scoped(scope).time_range(now());
            let expected = expected.map(|(from, to)| range(from, to));
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
            assert_eq!(
                a.time_range(now()),
                Some(range(from, to)),
                "{query}: {}",
                a.time_scope()
            );
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
                    if let Some((start, end)) = scoped(s).time_range(now) {
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
                let _ = scoped(s).time_range(now);
            }
        }
    }

    #[test]
    fn assembles_from_the_memory_it_was_given() {
        let mem = |id| MemoryRecord {
            id,
            time_bucket_start: chrono::DateTime::UNIX_EPOCH,
            time_bucket_end: chrono::DateTime::UNIX_EPOCH,
            tags: Vec::new(),
            summary: String::new(),
        };
        let none =
            Analysis::parse(r#"{"needs_context": false, "context_type": "none"}"#).unwrap_or_else(|e| panic!("{e}"));
        assert!(none.assembles_from(&[]));
        let seven =
            Analysis::parse(r#"{"needs_context": true, "context_type": "t", "context_found": {"lsm_record_id": 7}}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(seven.assembles_from(&[mem(3), mem(7)]));
        assert!(!seven.assembles_from(&[mem(3)]));
    }
}
