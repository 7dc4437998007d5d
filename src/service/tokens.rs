//! API tokens: minted here, stored as SHA-256 digests only, and checked for every request.
//! A trial token (given to a dispatched trial) names the one trial it may report to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use sha2::{Digest, Sha256};

use super::{Service, ServiceError, ServiceResult};
use crate::store::{TokenRecord, TrialToken};

/// How long a checked token is trusted without asking the database again.
const CACHE_TTL: Duration = Duration::from_secs(30);
/// The name the server's configured token (`AUGUR_TOKEN`) is stored under.
const ENV_TOKEN_NAME: &str = "env";

/// Hex SHA-256 of a token: what the store keeps.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random token (256 bits, hex).
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("augur_{}", hex::encode(bytes))
}

/// Who a valid token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    /// `(study, trial)` for a token that may only report to one trial.
    pub trial_scope: Option<(i64, i64)>,
}

impl From<TokenRecord> for Caller {
    fn from(r: TokenRecord) -> Self {
        Caller {
            name: r.name,
            trial_scope: r.scope,
        }
    }
}

/// Recently checked tokens, by hash.
#[derive(Clone, Default)]
pub(super) struct TokenCache {
    checked: Arc<Mutex<HashMap<String, (Caller, Instant)>>>,
}

impl Service {
    /// The caller a bearer token belongs to; `None` for an unknown token.
    pub async fn authenticate(&self, token: &str) -> ServiceResult<Option<Caller>> {
        let hash = hash_token(token);
        if let Ok(cache) = self.tokens.checked.lock()
            && let Some((caller, at)) = cache.get(&hash)
            && at.elapsed() < CACHE_TTL
        {
            return Ok(Some(caller.clone()));
        }
        let found = self.store.find_token(&hash).await?.map(Caller::from);
        if let (Some(caller), Ok(mut cache)) = (&found, self.tokens.checked.lock()) {
            cache.insert(hash, (caller.clone(), Instant::now()));
        }
        Ok(found)
    }

    /// Accept `token` as the server's configured admin token, stored (hashed) under the name
    /// `env` and replacing an earlier one, so that restarting with a new AUGUR_TOKEN rotates
    /// it.
    pub async fn register_configured_token(&self, token: &str) -> ServiceResult<()> {
        let hash = hash_token(token);
        if self.store.find_token(&hash).await?.is_some() {
            return Ok(());
        }
        // One upsert, not a delete and an insert: replicas starting together (a
        // Deployment's pods) each register the same token without racing.
        Ok(self
            .store
            .replace_token(ENV_TOKEN_NAME, &hash, None, Utc::now())
            .await?)
    }

    /// Whether any token (other than trials') exists: with none, a loopback server is open.
    pub async fn has_api_tokens(&self) -> ServiceResult<bool> {
        Ok(self.store.count_tokens().await? > 0)
    }

    /// A new admin token named `name`, stored hashed; the token itself is returned once.
    pub async fn create_token(&self, name: &str) -> ServiceResult<String> {
        let reserved = TrialToken::NAME_PREFIX;
        if name.trim().is_empty()
            || name.starts_with(reserved)
            || name.chars().any(char::is_control)
        {
            return Err(ServiceError::invalid(
                "name",
                format!(
                    "must not be empty, hold control characters, nor start with {reserved:?} \
                     (the names of the tokens issued to dispatched trials)"
                ),
            ));
        }
        let token = new_token();
        self.store
            .insert_token(name, &hash_token(&token), None, Utc::now())
            .await?;
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_hash_is_sha256_hex() {
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn new_tokens_are_long_and_distinct() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert_eq!(a.len(), "augur_".len() + 64);
    }
}
