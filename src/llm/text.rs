//! What every caller of a model does to its text before parsing it.
//!
//! Guarantees: [`strip_fence`] never panics and never allocates; it returns
//! a sub-slice of its input, the inside of one surrounding fenced code block
//! or the input unchanged.

/// The inside of a fenced code block (```json … ```), else the text itself.
pub fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let rest = rest.split_once('\n').map_or("", |(_, body)| body);
    rest.trim_end().strip_suffix("```").unwrap_or(rest).trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_a_fence_with_or_without_a_language() {
        assert_eq!(strip_fence("```json\n{\"a\": 1}\n```"), "{\"a\": 1}");
        assert_eq!(strip_fence("```\n{}\n```  "), "{}");
        assert_eq!(strip_fence("{}"), "{}");
        assert_eq!(strip_fence("```"), "");
        assert_eq!(strip_fence("```json\n{} no close"), "{} no close");
    }
}
