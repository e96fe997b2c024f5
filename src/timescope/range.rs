//! Reading a time scope into a half-open UTC range: [`range()`].
//!
//! Guarantees: a pure function of the scope and `now`; never panics (every
//! date step is checked); a range it returns is non-empty; a scope longer
//! than 200 characters is no period.

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, Utc};

use super::words::{
    Unit, WINDOW_STARTS, day_of_month, four_digit_year, is_ago, is_digits, month_of, number_of, season_of, tokens,
    unit_of,
};

type Range = (DateTime<Utc>, DateTime<Utc>);

/// Longer scopes are not a period a model wrote; reading stays cheap.
const MAX_CHARS: usize = 200;

/// The period `scope` names, as a half-open UTC range `[start, end)`;
/// `now` is the request's time, which decides relative phrases. `None`
/// when the scope names no period (`"none"`, `""`, a "when did …"
/// question, anything unreadable). Never panics.
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
pub fn range(scope: &str, now: DateTime<Utc>) -> Option<Range> {
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
    if let Some(k) = toks.iter().position(|t| is_ago(t)) {
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
    for (i, tok) in toks.iter().enumerate() {
        if !WINDOW_STARTS.contains(tok) {
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
