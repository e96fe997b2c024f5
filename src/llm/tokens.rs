//! Token counting for a model: the assembler's context budget and the
//! archivist's chunk budget.
//!
//! OpenAI-family models (`gpt-*`, `o1`…`o4`, `chatgpt-*`, and what
//! tiktoken knows) are counted with their real BPE tokenizer (tiktoken-rs,
//! whose ranks ship inside the crate). Other families (Claude, Gemini, local
//! models) publish no local tokenizer, so they get a conservative estimate:
//! one token per three bytes of UTF-8, rounded up. English averages about
//! four bytes per token and Cyrillic or CJK text about two to three, so the
//! estimate errs on the side of more tokens, never fewer.

use tiktoken_rs::CoreBPE;

/// Counts tokens for one model.
#[derive(Clone, Copy)]
pub struct TokenCounter {
    bpe: Option<&'static CoreBPE>,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.bpe.is_some() {
            "TokenCounter(bpe)"
        } else {
            "TokenCounter(estimate)"
        })
    }
}

impl TokenCounter {
    /// The counter for `model`: its BPE when tiktoken knows the model, else
    /// the conservative estimate. Loading a BPE takes a moment the first
    /// time, so build the counter once at start.
    pub fn for_model(model: &str) -> TokenCounter {
        TokenCounter {
            bpe: tiktoken_rs::bpe_for_model(model).ok(),
        }
    }

    /// The estimate only.
    pub fn estimate() -> TokenCounter {
        TokenCounter { bpe: None }
    }

    pub fn is_exact(&self) -> bool {
        self.bpe.is_some()
    }

    pub fn count(&self, text: &str) -> usize {
        match self.bpe {
            Some(bpe) => bpe.encode_ordinary(text).len(),
            None => text.len().div_ceil(3),
        }
    }

    /// The longest prefix of `text` (on a char boundary) within `max` tokens.
    pub fn truncate<'a>(&self, text: &'a str, max: usize) -> &'a str {
        if self.count(text) <= max {
            return text;
        }
        // Binary search over char boundaries: counting is monotone in length.
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        let (mut lo, mut hi) = (0usize, bounds.len() - 1);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.count(&text[..bounds[mid]]) <= max {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        &text[..bounds[lo]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_models_get_their_real_tokenizer() {
        let c = TokenCounter::for_model("gpt-4o");
        assert!(c.is_exact());
        // "hello world" is two tokens in o200k_base.
        assert_eq!(c.count("hello world"), 2);
        assert!(!TokenCounter::for_model("claude-sonnet-4-5").is_exact());
        assert!(!TokenCounter::for_model("offline").is_exact());
    }

    #[test]
    fn the_estimate_is_conservative() {
        let est = TokenCounter::estimate();
        let exact = TokenCounter::for_model("gpt-4o");
        for text in [
            "The quick brown fox jumps over the lazy dog, again and again.",
            "Память пользователя хранится по неделям и темам.",
            "記憶は利用者ごとに保存されます。",
        ] {
            assert!(
                est.count(text) >= exact.count(text),
                "{text}: {} < {}",
                est.count(text),
                exact.count(text)
            );
        }
    }

    #[test]
    fn truncation_respects_the_budget_and_char_boundaries() {
        for c in [TokenCounter::estimate(), TokenCounter::for_model("gpt-4o")] {
            let text = "Память — это ".repeat(50);
            let cut = c.truncate(&text, 20);
            assert!(c.count(cut) <= 20);
            assert!(cut.len() < text.len());
            assert!(text.starts_with(cut));
            assert_eq!(c.truncate("short", 20), "short");
        }
    }
}
