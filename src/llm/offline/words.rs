//! Words of a text as the offline roles use them: keywords (lower case,
//! four or more letters, stop words and numbers dropped) and excerpts.
//! Pure and deterministic.

use std::collections::HashMap;

/// Words by which a query refers to the user's own life or to what was
/// said before, English and Russian (whole words, lower case), besides the
/// first person ([`crate::person`]).
const MEMORY_WORDS: &[&str] = &[
    "our",
    "ours",
    "we",
    "us",
    "remember",
    "remind",
    "told",
    "said",
    "mentioned",
    "again",
    "before",
    "earlier",
    "last",
    "ago",
    "previous",
    "наш",
    "наша",
    "наше",
    "наши",
    "нашего",
    "нашей",
    "нашу",
    "нам",
    "мы",
    "помнишь",
    "помню",
    "напомни",
    "говорил",
    "говорила",
    "рассказывал",
    "рассказывала",
    "раньше",
    "прошлый",
    "прошлой",
    "прошлом",
];

/// Whether a query could use what the user said earlier: it speaks in the
/// first person ([`crate::person::speaks_of_self`]), refers to the user's
/// own life or to the past ([`MEMORY_WORDS`]), or names someone or
/// something (a capitalised word that does not open a sentence).
pub(super) fn could_use_memory(query: &str) -> bool {
    if crate::person::speaks_of_self(query) {
        return true;
    }
    let mut opens_sentence = true;
    for raw in query.split_whitespace() {
        let word: String = raw.chars().filter(|c| c.is_alphanumeric()).collect();
        let lower = word.to_lowercase();
        if MEMORY_WORDS.contains(&lower.as_str()) {
            return true;
        }
        let capital = word.chars().next().is_some_and(char::is_uppercase) && word.chars().count() > 1;
        if capital && !opens_sentence {
            return true;
        }
        opens_sentence = raw.ends_with(['.', '!', '?', ':']);
    }
    false
}

/// Words too common to be a keyword, English and Russian.
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

/// Lower-cased words of four or more letters, stop words and numbers dropped.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 4 && !w.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
}

/// The first `limit` distinct words, in order.
pub(super) fn distinct_words(text: &str, limit: usize) -> Vec<String> {
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
pub(super) fn frequent_words(text: &str, limit: usize) -> Vec<String> {
    let mut counts: HashMap<String, (usize, usize)> = HashMap::new();
    for (position, word) in words(text).enumerate() {
        counts.entry(word).or_insert((0, position)).0 += 1;
    }
    let mut ranked: Vec<_> = counts.into_iter().collect();
    ranked.sort_by(|(_, (ca, pa)), (_, (cb, pb))| cb.cmp(ca).then(pa.cmp(pb)));
    ranked.into_iter().take(limit).map(|(w, _)| w).collect()
}

/// Whitespace collapsed, at most `max` characters.
pub(super) fn excerpt(text: &str, max: usize) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}
