//! Whom a query speaks of: its user in the first person ("I", "my", "я",
//! "мой"), English and Russian.
//!
//! Guarantees:
//! - A leaf: no crate imports, so the offline analyzer (`llm`) and the
//!   memory plan (`stage`) share one word list.
//! - Pure functions that never panic.

/// The words by which a user speaks of themself, lower case. "I'm" and
/// "I've" split at the apostrophe ([`speaks_of_self`]) give "i".
const FIRST_PERSON: &[&str] = &[
    "i",
    "me",
    "my",
    "mine",
    "myself",
    "я",
    "меня",
    "мне",
    "мной",
    "мною",
    "мой",
    "моя",
    "моё",
    "мое",
    "мои",
    "моего",
    "моей",
    "моему",
    "мою",
    "моим",
    "моих",
    "моими",
    "моём",
    "моем",
];

/// Whether `word` (lower case, letters and digits only) is one by which a
/// user speaks of themself.
fn is_first_person(word: &str) -> bool {
    FIRST_PERSON.contains(&word)
}

/// Whether `text` speaks of its user in the first person ("What did I
/// paint?", "Как зовут мою собаку?"). Words are split at every character
/// that is not a letter or digit.
pub fn speaks_of_self(text: &str) -> bool {
    text.split(|c: char| !c.is_alphanumeric())
        .any(|w| !w.is_empty() && is_first_person(&w.to_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_person_is_found_in_english_and_russian_and_nothing_else() {
        for q in [
            "What did I paint?",
            "I'm looking for that book again",
            "Which cities have I been to?",
            "Remind me: what is MY dog called?",
            "Что я говорил про Лиссабон?",
            "Как зовут мою собаку?",
            "Напомни мне, куда переезжает сестра",
        ] {
            assert!(speaks_of_self(q), "{q}");
        }
        for q in [
            "Which cities has John been to?",
            "Where is she moving?",
            "Imagine a mystery in Iris's mineshaft town",
            "Что Мойра ей ответила?",
            "",
        ] {
            assert!(!speaks_of_self(q), "{q}");
        }
    }
}
