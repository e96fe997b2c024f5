//! The local provider: a sentence-transformers BERT model (by default
//! all-MiniLM-L6-v2, 384 dimensions) run in-process on the CPU with candle.
//!
//! The model folder holds `config.json`, `tokenizer.json` and
//! `model.safetensors`, as the model's own distribution ships them
//! (`bin/eval-memory` fetches one). A text is cut at 256 tokens (the
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
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::EmbedError;

/// The default model name of the local provider.
pub const MODEL: &str = "all-MiniLM-L6-v2";
/// Longest input, in tokens.
const MAX_TOKENS: usize = 256;

/// A loaded model and its tokenizer.
pub struct Local {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
}

fn call(message: String) -> EmbedError {
    EmbedError::Call {
        provider: "local",
        message,
        retryable: false,
    }
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
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..PaddingParams::default()
        }));
        let weights = std::fs::read(dir.join("model.safetensors")).map_err(|e| fail("model.safetensors", &e))?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .map_err(|e| fail("model.safetensors", &e))?;
        let model = BertModel::load(vb, &config).map_err(|e| fail("model.safetensors", &e))?;
        Ok(Local {
            model,
            tokenizer,
            device,
        })
    }

    /// The mean-pooled vectors of `texts` (blocking: CPU work).
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let enc = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| call(format!("tokenizing: {e}")))?;
        self.forward(&enc).map_err(|e| call(format!("running the model: {e}")))
    }

    fn forward(&self, enc: &[tokenizers::Encoding]) -> candle_core::Result<Vec<Vec<f32>>> {
        let ids = enc
            .iter()
            .map(|e| Tensor::new(e.get_ids(), &self.device))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mask = enc
            .iter()
            .map(|e| Tensor::new(e.get_attention_mask(), &self.device))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let ids = Tensor::stack(&ids, 0)?;
        let mask = Tensor::stack(&mask, 0)?;
        let types = ids.zeros_like()?;
        let states = self.model.forward(&ids, &types, Some(&mask))?; // (batch, tokens, dims)
        let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (batch, tokens, 1)
        let sum = states.broadcast_mul(&m)?.sum(1)?; // (batch, dims)
        let count = m.sum(1)?.clamp(1e-9, f64::MAX)?; // (batch, 1)
        sum.broadcast_div(&count)?.to_vec2::<f32>()
    }
}
