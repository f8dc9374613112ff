//! In-memory [`EntityStore`]: the reference implementation of its contract.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use outbox_core::consumer::{EntityRecord, EntityStore, Loaded, Persisted, Version};
use outbox_core::{EntityKey, Result};

/// Entities in a map behind a mutex; every persist is checked against the stored
/// version under that mutex, so the optimistic check is exact. Clones share the map.
#[derive(Debug, Clone, Default)]
pub struct MemoryEntityStore {
    entities: Arc<Mutex<HashMap<EntityKey, Loaded>>>,
}

impl MemoryEntityStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn entities(&self) -> MutexGuard<'_, HashMap<EntityKey, Loaded>> {
        self.entities.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl EntityStore for MemoryEntityStore {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        Ok(self.entities().get(key).cloned())
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        let mut entities = self.entities();
        let current = entities.get(key).map(|l| l.version);
        if current != expected {
            return Ok(Persisted::Conflict);
        }
        let version = match current {
            Some(v) => v.next()?,
            None => Version::new(1),
        };
        entities.insert(
            key.clone(),
            Loaded {
                record: record.clone(),
                version,
            },
        );
        Ok(Persisted::Stored(version))
    }
}
