//! The built-in offline pipeline: deterministic, in-process, no key and no
//! network. Every answer is labelled `[offline]`. It lets `bin/run` and the
//! orchestrator tests exercise the whole state machine.

use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::json;

use super::{Pipeline, StageError, StageInput, StageOutput, StageSuccess, Usage};
use crate::config::OfflineConfig;
use crate::model::StageKind;

pub const MODEL: &str = "offline";

#[derive(Debug, Clone, Default)]
pub struct OfflinePipeline {
    cfg: OfflineConfig,
}

impl OfflinePipeline {
    pub fn new(cfg: OfflineConfig) -> Self {
        OfflinePipeline { cfg }
    }

    fn compute(&self, stage: StageKind, input: &StageInput) -> Result<StageSuccess, StageError> {
        if let Some(marker) = self.cfg.fail_when_query_contains.as_deref()
            && !marker.is_empty()
            && input.user_query.contains(marker)
        {
            return Err(StageError::retry(
                "injected",
                format!("offline provider: injected failure in {stage} (query contains the configured marker)"),
            ));
        }
        let output = match stage {
            StageKind::Analyze => StageOutput::Analysis(analyze(&input.user_query)),
            StageKind::Assemble => StageOutput::Context(format!(
                "<system>\nYou are a helpful assistant.\n</system>\n\n<current_query>\n{}\n</current_query>",
                input.user_query
            )),
            StageKind::Respond => StageOutput::Answer(format!(
                "[offline] I received your query ({} characters): {}",
                input.user_query.chars().count(),
                input.user_query.chars().take(200).collect::<String>()
            )),
        };
        Ok(StageSuccess {
            output,
            usage: Usage {
                model: Some(MODEL.into()),
                prompt_tokens: None,
                completion_tokens: None,
            },
        })
    }
}

/// A deterministic analysis in the analyzer's JSON shape.
pub fn analyze(query: &str) -> serde_json::Value {
    let mut keywords: Vec<String> = Vec::new();
    for word in query.split(|c: char| !c.is_alphanumeric()) {
        let w = word.to_lowercase();
        if w.chars().count() >= 5 && !keywords.contains(&w) {
            keywords.push(w);
        }
        if keywords.len() == 5 {
            break;
        }
    }
    json!({
        "needs_context": false,
        "context_type": "none",
        "time_scope": "none",
        "search_keywords": keywords,
        "context_found": null,
    })
}

impl Pipeline for OfflinePipeline {
    fn run<'a>(&'a self, stage: StageKind, input: &'a StageInput) -> BoxFuture<'a, Result<StageSuccess, StageError>> {
        let latency = Duration::from_millis(self.cfg.latency_ms);
        async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            self.compute(stage, input)
        }
        .boxed()
    }
}
