//! The per-tenant LLM token metric, `maas_llm_tenant_tokens_total{tenant,
//! kind}` (kind `prompt` or `completion`), labelled by tenant name.
//!
//! Guarantees: counted once per attempt, where the attempt's usage is
//! recorded (the same numbers as `pipeline_steps`); the claimed row carries
//! its tenant id (`claim.sql`, `finish.sql`), and the names are read from
//! `tenants` once per process and again only for an id not seen before
//! (tenants are never renamed or deleted) — off the attempt's path, so an
//! attempt never waits for the lookup.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use uuid::Uuid;

use crate::db::Pool;
use crate::repo::tenants;

/// Tenant names by id, the default tenant known from the start.
pub struct Names {
    by_id: RwLock<HashMap<Uuid, Arc<str>>>,
}

impl Names {
    pub fn new() -> Arc<Names> {
        let mut by_id = HashMap::new();
        by_id.insert(tenants::DEFAULT, Arc::from("default"));
        Arc::new(Names {
            by_id: RwLock::new(by_id),
        })
    }

    fn get(&self, id: Uuid) -> Option<Arc<str>> {
        self.by_id.read().ok()?.get(&id).cloned()
    }

    async fn load(&self, pool: &Pool) -> Result<(), crate::db::Error> {
        let client = pool.get().await?;
        let all = tenants::names(&client).await?;
        if let Ok(mut by_id) = self.by_id.write() {
            for (id, name) in all {
                by_id.insert(id, Arc::from(name.as_str()));
            }
        }
        Ok(())
    }

    /// Counts `prompt` and `completion` tokens spent for tenant `id`.
    pub fn count(self: &Arc<Self>, pool: &Pool, id: Uuid, prompt: Option<i32>, completion: Option<i32>) {
        let (prompt, completion) = (as_count(prompt), as_count(completion));
        if prompt == 0 && completion == 0 {
            return;
        }
        if let Some(name) = self.get(id) {
            crate::metrics::tenant_llm_tokens(&name, prompt, completion);
            return;
        }
        let (names, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            if let Err(e) = names.load(&pool).await {
                tracing::warn!(tenant = %id, error = %e, "metrics: cannot read tenant names; counting under the id");
            }
            let name = names.get(id).unwrap_or_else(|| Arc::from(id.to_string().as_str()));
            crate::metrics::tenant_llm_tokens(&name, prompt, completion);
        });
    }
}

fn as_count(n: Option<i32>) -> u64 {
    n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
}
