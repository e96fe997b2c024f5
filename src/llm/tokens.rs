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

    /// A prefix of `text` (on a char boundary) within `max` tokens: the
    /// longest one, except that no more than 16 bytes (`CUT_BYTES_PER_TOKEN`)
    /// per token of the budget are kept. The work is bounded by the budget,
    /// not by the text: a text of a million characters that is one
    /// pre-tokenizer piece costs as much as one of the budget's size.
    pub fn truncate<'a>(&self, text: &'a str, max: usize) -> &'a str {
        let text = prefix(text, max.saturating_mul(CUT_BYTES_PER_TOKEN));
        let Some(bpe) = self.bpe else {
            return prefix(text, max.saturating_mul(3));
        };
        let tokens = bpe.encode_ordinary(text);
        if tokens.len() <= max {
            return text;
        }
        // The bytes of the first `keep` tokens. A piece cut short may encode
        // to more tokens than it had inside the whole text, so check and
        // keep fewer until the cut fits.
        let mut keep = max;
        loop {
            let bytes = bpe.decode_bytes(&tokens[..keep]).map_or(0, |b| b.len());
            let cut = prefix(text, bytes);
            let n = self.count(cut);
            if n <= max || keep == 0 {
                return cut;
            }
            keep = keep.saturating_sub(n - max);
        }
    }
}

/// The longest prefix of `text` of at most `bytes` bytes that ends on a
/// char boundary.
fn prefix(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The most bytes of text a token of a budget is taken to cover when a
/// text is cut ([`TokenCounter::truncate`]). Ordinary text averages about
/// four bytes per token in English and two to six in other scripts; only
/// long runs of one character or of whitespace pack more, and those are
/// cut a little shorter than their budget.
const CUT_BYTES_PER_TOKEN: usize = 16;

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

    #[test]
    fn ordinary_text_is_cut_at_its_budget() {
        for c in [TokenCounter::estimate(), TokenCounter::for_model("gpt-4o")] {
            for text in [
                "The archivist keeps what the user said, week by week. ".repeat(400),
                "Архивист хранит то, что сказал пользователь, по неделям. ".repeat(400),
            ] {
                let cut = c.truncate(&text, 1000);
                let n = c.count(cut);
                assert!((990..=1000).contains(&n), "{c:?}: {n} tokens kept of a budget of 1000");
            }
        }
    }

    #[test]
    fn a_huge_single_piece_is_cut_within_its_budget() {
        // One pre-tokenizer piece of a million characters (a poisoned
        // reply): cut to at most the budget's bytes per token, then to
        // the budget.
        let text = "h".repeat(1_000_000);
        for c in [TokenCounter::estimate(), TokenCounter::for_model("gpt-4o")] {
            let cut = c.truncate(&text, 6000);
            assert!(c.count(cut) <= 6000, "{c:?}");
            assert!(
                !cut.is_empty() && cut.len() <= 6000 * CUT_BYTES_PER_TOKEN,
                "{c:?}: {} bytes",
                cut.len()
            );
        }
    }
}
