//! The boundary of the local model runtime: what the rest of maas knows of
//! the models run in-process (their names and files, the [`LocalModel`]
//! trait, [`load`]), apart from the runtime itself ([`super::e5`],
//! [`super::local`]: candle, `tokenizers`, the 4-bit reader and the
//! SentencePiece tokenizer), which compiles only with the cargo feature
//! `local-model` (on by default).
//!
//! A build without it (`cargo build --no-default-features`) has every
//! other provider; with `provider` unset its memory search is full text
//! alone and [`super::EmbeddingConfig::fallback_note`] says why, and
//! `provider = "local"` fails at start naming the feature.

use std::path::Path;
use std::sync::Arc;

use super::EmbedError;

/// Whether this build runs local models (the `local-model` feature).
pub const BUILT: bool = cfg!(feature = "local-model");

/// The multilingual model's name, stored with every vector it makes.
pub const E5_MODEL: &str = "multilingual-e5-small";
/// The multilingual model's weights file in its folder.
pub const E5_WEIGHTS: &str = "e5-small-q4.bin";
/// The English model's name, stored with every vector it makes.
pub const MINILM_MODEL: &str = "all-MiniLM-L6-v2";

/// Whether `dir` holds the multilingual model (loaded in place of the
/// English one when both are there).
pub fn e5_present(dir: &Path) -> bool {
    dir.join(E5_WEIGHTS).is_file()
}

/// The model a local folder `dir` holds, by its files.
pub fn model_in(dir: &Path) -> &'static str {
    if e5_present(dir) { E5_MODEL } else { MINILM_MODEL }
}

/// Whether a text is a search's query or a text to be found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A search's query: `query: …` for a model trained with prefixes.
    Query,
    /// A text to be found (a turn): `passage: …`.
    Passage,
}

impl Kind {
    /// The training prefix of a model that uses them.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Query => "query: ",
            Kind::Passage => "passage: ",
        }
    }
}

/// A model run in-process: one vector per text, in order (not yet
/// normalised). Blocking: the caller runs it off the async workers.
pub trait LocalModel: Send + Sync {
    /// The vectors of `texts`, embedded as `kind`.
    fn embed(&self, texts: &[String], kind: Kind) -> Result<Vec<Vec<f32>>, EmbedError>;
}

/// Loads the model in `dir`: the multilingual one where its weights are
/// there, else the English one (a missing or broken model names the
/// folder and the file).
#[cfg(feature = "local-model")]
pub fn load(dir: &Path) -> Result<Arc<dyn LocalModel>, EmbedError> {
    if e5_present(dir) {
        Ok(Arc::new(super::e5::E5::load(dir)?))
    } else {
        Ok(Arc::new(super::local::Local::load(dir)?))
    }
}

/// A build without the runtime loads no model, and says which feature
/// would.
#[cfg(not(feature = "local-model"))]
pub fn load(dir: &Path) -> Result<Arc<dyn LocalModel>, EmbedError> {
    Err(EmbedError::Load {
        dir: dir.display().to_string(),
        reason: "this build has no local model runtime: rebuild with the cargo feature `local-model` \
                 (on by default), or choose another llm.embedding.provider"
            .into(),
    })
}

#[cfg(feature = "local-model")]
impl LocalModel for super::e5::E5 {
    fn embed(&self, texts: &[String], kind: Kind) -> Result<Vec<Vec<f32>>, EmbedError> {
        super::e5::E5::embed(self, texts, kind)
    }
}

#[cfg(feature = "local-model")]
impl LocalModel for super::local::Local {
    /// The English model was trained without prefixes: `kind` is ignored.
    fn embed(&self, texts: &[String], _kind: Kind) -> Result<Vec<Vec<f32>>, EmbedError> {
        super::local::Local::embed(self, texts)
    }
}

/// A local model's failure to embed (not worth a retry).
#[cfg(feature = "local-model")]
pub(super) fn call_error(message: String) -> EmbedError {
    EmbedError::Call {
        provider: "local",
        message,
        retryable: false,
    }
}

/// Texts a local model runs together. A call's texts are sorted by length
/// first and each group is padded to its own longest, so short texts do
/// not pay for a long one's padding.
#[cfg(feature = "local-model")]
const GROUP: usize = 8;

/// A local model's vectors of `items`, in their order: `forward` runs on
/// groups of them of similar `len`.
#[cfg(feature = "local-model")]
pub(super) fn in_groups<T>(
    items: &[T],
    len: impl Fn(&T) -> usize,
    mut forward: impl FnMut(&[&T]) -> candle_core::Result<Vec<Vec<f32>>>,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| len(&items[i]));
    let mut out = vec![Vec::new(); items.len()];
    for group in order.chunks(GROUP) {
        let members: Vec<&T> = group.iter().map(|&i| &items[i]).collect();
        let vectors = forward(&members).map_err(|e| call_error(format!("running the model: {e}")))?;
        for (&i, v) in group.iter().zip(vectors) {
            out[i] = v;
        }
    }
    Ok(out)
}

/// The mean of a group's token `states` (group, tokens, dims) over its
/// `mask` (group, tokens; 1 for a token, 0 for padding).
#[cfg(feature = "local-model")]
pub(super) fn mean_pooled(
    states: &candle_core::Tensor,
    mask: &candle_core::Tensor,
) -> candle_core::Result<Vec<Vec<f32>>> {
    let m = mask.to_dtype(candle_core::DType::F32)?.unsqueeze(2)?; // (group, tokens, 1)
    let sum = states.broadcast_mul(&m)?.sum(1)?; // (group, dims)
    let count = m.sum(1)?.clamp(1e-9, f64::MAX)?; // (group, 1)
    sum.broadcast_div(&count)?.to_vec2::<f32>()
}
