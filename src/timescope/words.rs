//! The words of time, English and Russian, lower case: months, seasons,
//! units, counts, the words that open a window and the ones that mean
//! "ago". Both the range reader and the query finder use these tables, so
//! a word one of them knows the other knows too.

/// Whether `s` is one or more ASCII digits.
pub(super) fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Words of letters and digits, ordinal suffixes dropped (`8th` → `8`).
pub(super) fn tokens(text: &str) -> Vec<&str> {
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

/// Four digits read as a year.
pub(super) fn four_digit_year(tok: &str) -> Option<i32> {
    (tok.len() == 4 && is_digits(tok)).then(|| tok.parse().ok()).flatten()
}

/// A day of a month: one or two digits, 1–31.
pub(super) fn day_of_month(tok: &str) -> Option<u32> {
    (tok.len() <= 2 && is_digits(tok))
        .then(|| tok.parse().ok())
        .flatten()
        .filter(|d| (1..=31).contains(d))
}

/// The month a word names, English or Russian (any case form).
pub(super) fn month_of(word: &str) -> Option<u32> {
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

/// The first month of the season a word names (winter: December); every
/// season lasts three months.
pub(super) fn season_of(word: &str) -> Option<u32> {
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

/// A calendar unit.
#[derive(Clone, Copy)]
pub(super) enum Unit {
    Day,
    Week,
    Month,
    Year,
}

/// The unit a word names, singular or plural (any Russian case form).
pub(super) fn unit_of(word: &str) -> Option<Unit> {
    match word {
        "day" | "days" | "день" | "дня" | "дней" | "сутки" | "суток" => Some(Unit::Day),
        "week" | "weeks" | "неделя" | "неделю" | "недели" | "недель" => Some(Unit::Week),
        "month" | "months" | "месяц" | "месяца" | "месяцев" => Some(Unit::Month),
        "year" | "years" | "год" | "года" | "лет" => Some(Unit::Year),
        _ => None,
    }
}

/// The count a word names: digits, or a number word up to twelve (`a`,
/// `couple`, `few` included).
pub(super) fn number_of(word: &str) -> Option<u32> {
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

/// Words that end `N units ago`.
pub(super) fn is_ago(word: &str) -> bool {
    matches!(word, "ago" | "назад")
}

/// Words that open a window back from today: `last 3 days`, `past week`,
/// `за последние 3 дня`.
pub(super) const WINDOW_STARTS: &[&str] = &[
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
