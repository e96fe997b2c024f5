//! Finding what a query says about time: [`find`].
//!
//! Guarantees: a pure function of the query; never panics; every scope it
//! returns other than `"none"` is written in a form [`range()`](super::range())
//! reads (the words it knows are the range reader's, [`super::words`]).

use chrono::NaiveDate;

use super::words::{
    WINDOW_STARTS, day_of_month, four_digit_year, is_ago, is_digits, month_of, number_of, season_of, tokens, unit_of,
};

/// What a query says about time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A period, named or asked about: `context_type` `period`.
    Period,
    /// The latest conversation: `context_type` `recent`.
    Recent,
}

impl Kind {
    /// The analysis' `context_type` for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Period => "period",
            Kind::Recent => "recent",
        }
    }
}

/// Relative phrases that tie a query to a period, kept as written (the
/// request's time decides them); the longest match wins.
pub(super) const RELATIVE_PHRASES: &[&str] = &[
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

/// Phrases about the latest conversation: [`Kind::Recent`].
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

/// The query's time, as the kind it implies and a `time_scope`: an
/// absolute date in ISO form (`2023-05-08`, `2023-05`, `2023`,
/// `2023-06/2023-08` for a season), else a relative phrase as written
/// (`last week`, `3 days ago`, `за последние 3 дня`), else `none` for the
/// latest conversation ([`Kind::Recent`]) or a "when did …" question
/// ([`Kind::Period`]). `None` when it says nothing about time.
pub fn find(query: &str) -> Option<(Kind, String)> {
    let lower = query.to_lowercase();
    if let Some(scope) = absolute_scope(&lower).or_else(|| relative_scope(&lower)) {
        return Some((Kind::Period, scope));
    }
    if RECENCY_PHRASES.iter().any(|p| lower.contains(p)) {
        return Some((Kind::Recent, "none".to_owned()));
    }
    let padded = format!(" {} ", tokens(&lower).join(" "));
    WHEN_PHRASES
        .iter()
        .any(|p| padded.contains(&format!(" {p} ")))
        .then(|| (Kind::Period, "none".to_owned()))
}

/// A year a person would name: four digits, 1900–2199.
fn year_of(tok: &str) -> Option<i32> {
    four_digit_year(tok).filter(|y| (1900..2200).contains(y))
}

/// A count as a query writes it: a number word, or at most four digits.
fn is_count(word: &str) -> bool {
    number_of(word).is_some() && !(is_digits(word) && word.len() > 4)
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
    let toks: Vec<&str> = tokens(lower).into_iter().filter(|t| !FILLERS.contains(t)).collect();
    let at = |i: usize| toks.get(i).copied().unwrap_or_default();
    for (i, tok) in toks.iter().enumerate() {
        if let Some(m) = month_of(tok) {
            let before = i.checked_sub(1).and_then(|j| day_of_month(at(j)));
            let after = day_of_month(at(i + 1)).filter(|_| before.is_none());
            let Some(y) = year_of(at(i + 1 + usize::from(after.is_some()))) else {
                continue;
            };
            match before.or(after) {
                Some(d) if NaiveDate::from_ymd_opt(y, m, d).is_some() => return Some(format!("{y:04}-{m:02}-{d:02}")),
                Some(_) => continue,
                None => return Some(format!("{y:04}-{m:02}")),
            }
        }
        if let (Some(first), Some(y)) = (season_of(tok), year_of(at(i + 1))) {
            // Three months; winter starts in December of the year before.
            let (start_year, last) = if first == 12 { (y - 1, 2) } else { (y, first + 2) };
            return Some(format!("{start_year:04}-{first:02}/{y:04}-{last:02}"));
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
    let toks = tokens(lower);
    let is_unit = |w: &str| unit_of(w).is_some();
    // `N units ago`, `неделю назад`.
    if let Some(k) = toks.iter().position(|t| is_ago(t)) {
        if k >= 1 && is_unit(toks[k - 1]) {
            let from = if k >= 2 && is_count(toks[k - 2]) { k - 2 } else { k - 1 };
            return Some(toks[from..=k].join(" "));
        }
    }
    // `last 3 days`, `за последние 3 дня`.
    for (i, tok) in toks.iter().enumerate() {
        if WINDOW_STARTS.contains(tok) {
            if let (Some(n), Some(unit)) = (toks.get(i + 1), toks.get(i + 2)) {
                if is_count(n) && is_unit(unit) {
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
