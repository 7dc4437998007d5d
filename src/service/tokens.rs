//! API tokens: minted here, stored as SHA-256 digests only, and checked for every request.
//! A token of a person or program carries a role (`model::Role`); a trial token (given to a
//! dispatched or pulled trial) names the one trial it may report to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::state_machine::{Command, Reply};
use super::{Service, ServiceError, ServiceResult, unexpected};
use crate::model::{Role, StudyId, TokenInfo, TrialId, TrialKey};
use crate::store::{TokenRecord, TrialToken};

/// How long a checked token is trusted without asking the database again: the bound on how
/// long a token revoked through another replica (or a trial finished there) keeps working
/// here. A replica asks the database once per token per this long.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(5);
/// `last_used_at` is written at most this often per token (a write per request would cost
/// more than the request).
const TOUCH_EVERY: chrono::Duration = chrono::Duration::seconds(60);
/// The cache drops what ran out once it holds this many tokens.
const CACHE_PRUNE_AT: usize = 10_000;
/// The name the server's configured token (`AUGUR_TOKEN`) is stored under.
const ENV_TOKEN_NAME: &str = "env";
/// The caller's name on an open server (loopback, no tokens).
pub const OPEN_CALLER: &str = "open";

/// The shortest token a server may be configured with (`--token`, `AUGUR_TOKEN`): it is an
/// admin's, and a short one can be guessed (the limit on failures only slows guessing).
pub const MIN_CONFIGURED_TOKEN_LEN: usize = 16;

/// Refuse a configured token too short to be a secret.
pub fn check_configured_token(token: &str) -> ServiceResult<()> {
    if token.trim().chars().count() < MIN_CONFIGURED_TOKEN_LEN {
        return Err(ServiceError::invalid(
            "--token",
            format!(
                "the server's token (--token or AUGUR_TOKEN) must be at least \
                 {MIN_CONFIGURED_TOKEN_LEN} characters, e.g. `openssl rand -hex 32`"
            ),
        ));
    }
    Ok(())
}

/// Hex SHA-256 of a token: what the store keeps.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random token (256 bits, hex).
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("augur_{}", hex::encode(bytes))
}

/// Who a valid token belongs to, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name, as the audit trail records it.
    pub name: String,
    pub role: Role,
    /// The one trial a trial's token may report to.
    pub trial_scope: Option<TrialKey>,
    pub expires_at: Option<DateTime<Utc>>,
}

impl Caller {
    /// Everyone on an open server (loopback, no token configured): it trusts this machine's
    /// users with everything.
    pub fn open() -> Caller {
        Caller::local(OPEN_CALLER)
    }

    /// This process itself (`augur run`, `augur token` on the database), as admin.
    pub fn local(name: &str) -> Caller {
        Caller {
            name: name.to_string(),
            role: Role::Admin,
            trial_scope: None,
            expires_at: None,
        }
    }

    /// Whether this caller may change, stop or delete a study that `created_by` created:
    /// admins every study, writers and operators their own.
    pub fn may_manage(&self, created_by: Option<&str>) -> bool {
        self.trial_scope.is_none()
            && (self.role == Role::Admin || created_by == Some(self.name.as_str()))
    }

    fn expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

impl From<TokenRecord> for Caller {
    fn from(r: TokenRecord) -> Self {
        Caller {
            name: r.name,
            // A trial token's role is never read; should a check forget its scope, it is
            // a writer, not the admin its row's default says.
            role: if r.scope.is_some() {
                Role::Writer
            } else {
                r.role
            },
            trial_scope: r.scope,
            expires_at: r.expires_at,
        }
    }
}

impl From<TokenRecord> for TokenInfo {
    fn from(r: TokenRecord) -> Self {
        TokenInfo {
            name: r.name,
            role: r.role,
            created_at: r.created_at,
            expires_at: r.expires_at,
            last_used_at: r.last_used_at,
        }
    }
}

/// A token just created: the secret (shown once) and what is stored of it.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub token: String,
    pub info: TokenInfo,
}

/// Recently checked tokens, by hash, with when each was checked.
///
/// Checked tokens are cached for [`TOKEN_CACHE_TTL`]. A token revoked, or a trial that
/// finished, in this process is forgotten at once; another replica forgets it when its
/// cached check runs out, so a revocation holds everywhere within `TOKEN_CACHE_TTL`.
#[derive(Clone, Default)]
pub(super) struct TokenCache {
    checked: Arc<Mutex<HashMap<String, (Caller, Instant)>>>,
}

impl TokenCache {
    fn get(&self, hash: &str) -> Option<Caller> {
        let cache = self.checked.lock().ok()?;
        let (caller, at) = cache.get(hash)?;
        (at.elapsed() < TOKEN_CACHE_TTL).then(|| caller.clone())
    }

    fn put(&self, hash: String, caller: Caller) {
        if let Ok(mut cache) = self.checked.lock() {
            if cache.len() >= CACHE_PRUNE_AT {
                cache.retain(|_, (_, at)| at.elapsed() < TOKEN_CACHE_TTL);
            }
            cache.insert(hash, (caller, Instant::now()));
        }
    }

    fn forget(&self, gone: impl Fn(&Caller) -> bool) {
        if let Ok(mut cache) = self.checked.lock() {
            cache.retain(|_, (caller, _)| !gone(caller));
        }
    }

    /// The token of this name was revoked or replaced.
    pub(super) fn forget_name(&self, name: &str) {
        self.forget(|c| c.name == name);
    }

    /// These trials' tokens were revoked (the trials finished, or went back to `requested`)
    /// or replaced (a new launch).
    pub(super) fn forget_trials(&self, study_id: StudyId, trial_ids: &[TrialId]) {
        if !trial_ids.is_empty() {
            self.forget(|c| {
                c.trial_scope
                    .is_some_and(|k| k.study == study_id && trial_ids.contains(&k.trial))
            });
        }
    }

    /// The study was deleted with its trials' tokens.
    pub(super) fn forget_study(&self, study_id: StudyId) {
        self.forget(|c| c.trial_scope.is_some_and(|k| k.study == study_id));
    }
}

impl Service {
    /// The caller a bearer token belongs to; `None` for an unknown or expired token.
    pub async fn authenticate(&self, token: &str) -> ServiceResult<Option<Caller>> {
        let hash = hash_token(token);
        let now = Utc::now();
        if let Some(caller) = self.tokens.get(&hash) {
            return Ok((!caller.expired(now)).then_some(caller));
        }
        let Some(record) = self.store.find_token(&hash).await? else {
            return Ok(None);
        };
        let stale = record.last_used_at.is_none_or(|at| now - at >= TOUCH_EVERY);
        if stale && record.scope.is_none() {
            // Off the request's path: knowing when a token was last used is worth a write a
            // minute, not a wait on every request.
            let (store, name) = (self.store.clone(), record.name.clone());
            tokio::spawn(async move {
                if let Err(error) = store.touch_token(&name, now).await {
                    tracing::debug!(%error, "could not record a token's use");
                }
            });
        }
        let caller = Caller::from(record);
        self.tokens.put(hash, caller.clone());
        Ok((!caller.expired(now)).then_some(caller))
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
        // Deployment's pods) each register the same token. The upsert's arbiter is the
        // name; PostgreSQL checks the hash's own unique key without it, so a replica that
        // lost that race is refused although its token is now stored: look again.
        let stored = self
            .store
            .replace_token(ENV_TOKEN_NAME, &hash, None, Utc::now())
            .await;
        if let Err(e) = stored {
            let raced = e.is_unique_violation() && self.store.find_token(&hash).await?.is_some();
            if !raced {
                return Err(e.into());
            }
        }
        self.tokens.forget_name(ENV_TOKEN_NAME);
        Ok(())
    }

    /// Whether any token (other than trials') exists: with none, a loopback server is open.
    pub async fn has_api_tokens(&self) -> ServiceResult<bool> {
        Ok(self.store.count_tokens().await? > 0)
    }

    /// A new token named `name` with `role`, valid for `expires_in` (for ever when `None`),
    /// stored hashed; the secret is returned once.
    pub async fn create_token(
        &self,
        actor: &Caller,
        name: &str,
        role: Role,
        expires_in: Option<Duration>,
    ) -> ServiceResult<NewToken> {
        check_token_name(name)?;
        let now = Utc::now();
        let expires_at = match expires_in {
            None => None,
            Some(d) => Some(
                chrono::Duration::from_std(d)
                    .ok()
                    .and_then(|d| now.checked_add_signed(d))
                    .ok_or_else(|| ServiceError::invalid("expires_in", "is too far away"))?,
            ),
        };
        let token = new_token();
        let stored = self
            .store
            .insert_role_token(name, &hash_token(&token), role, expires_at, now)
            .await?;
        if !stored {
            return Err(ServiceError::Conflict {
                message: format!("a token named {name:?} exists; revoke it first"),
                field: Some("name".into()),
            });
        }
        let expiry =
            expires_at.map_or_else(|| "never expires".into(), |at| format!("expires {at}"));
        self.audit(
            actor,
            "token.create",
            None,
            None,
            Some(format!("{name} ({role}, {expiry})")),
        )
        .await;
        Ok(NewToken {
            token,
            info: TokenInfo {
                name: name.to_string(),
                role,
                created_at: now,
                expires_at,
                last_used_at: None,
            },
        })
    }

    /// Tokens of people and programs (not trials'), by name.
    pub async fn list_tokens(&self) -> ServiceResult<Vec<TokenInfo>> {
        let tokens = self.store.list_tokens().await?;
        Ok(tokens.into_iter().map(TokenInfo::from).collect())
    }

    /// Revoke the token of this name: refused at once by this process, and by every replica
    /// within [`TOKEN_CACHE_TTL`].
    pub async fn revoke_token(&self, actor: &Caller, name: &str) -> ServiceResult<()> {
        if name.starts_with(TrialToken::NAME_PREFIX) {
            return Err(ServiceError::invalid(
                "name",
                "trial tokens go when their trial finishes",
            ));
        }
        if !self.store.delete_token(name).await? {
            return Err(ServiceError::NotFound(format!("token {name:?}")));
        }
        self.tokens.forget_name(name);
        self.audit(actor, "token.revoke", None, None, Some(name.to_string()))
            .await;
        Ok(())
    }

    /// A token for a pulled trial that `client_id` holds (active or stopping), which may only
    /// report to that trial; it replaces the trial's earlier token and goes when the trial
    /// finishes or its lease runs out. `augur worker` hands it to the trial's process
    /// instead of its own. Only the trial's holder may ask: a trial is handed out only to the
    /// study's creator or an admin (`check_reporter`), and the `client_id` it was handed to,
    /// which every reader sees, proves nothing alone.
    pub async fn issue_trial_token(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        client_id: &str,
    ) -> ServiceResult<String> {
        self.check_reporter(actor, study_id, None).await?;
        let token = new_token();
        let command = Command::IssueToken {
            trial_id,
            client_id: client_id.to_string(),
            token_hash: hash_token(&token),
        };
        match self.commits.submit(study_id, command).await? {
            Reply::Issued => {
                let detail = Some(format!("for client {client_id}"));
                self.audit_trial(actor, "trial.token", study_id, trial_id, detail)
                    .await;
                Ok(token)
            }
            other => Err(unexpected(other)),
        }
    }
}

/// A token's name: what the audit trail shows of who did something, so it is printable,
/// short, and none of the names Augur gives itself.
fn check_token_name(name: &str) -> ServiceResult<()> {
    let reserved = [ENV_TOKEN_NAME, OPEN_CALLER];
    if name.trim().is_empty()
        || name.len() > 64
        || name.chars().any(|c| c.is_control() || c.is_whitespace())
        || name.starts_with(TrialToken::NAME_PREFIX)
        || name.starts_with("cli:")
        || reserved.contains(&name)
    {
        return Err(ServiceError::invalid(
            "name",
            format!(
                "must be 1-64 characters without spaces or control characters, and none of \
                 the names Augur gives itself ({:?}, {:?}, {:?}…, {:?}…: the configured \
                 token, open mode, the command line, dispatched trials)",
                ENV_TOKEN_NAME,
                OPEN_CALLER,
                "cli:",
                TrialToken::NAME_PREFIX
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_token_must_be_long_enough() {
        assert!(check_configured_token("x").is_err());
        assert!(check_configured_token("  fifteen-chars-x  ").is_err());
        assert!(check_configured_token("sixteen-chars-xy").is_ok());
    }

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

    #[test]
    fn names_augur_gives_itself_are_refused() {
        for bad in [
            "",
            " ",
            "env",
            "open",
            "trial:1:2",
            "cli:root",
            "a b",
            "a\u{1b}",
            &"x".repeat(65),
        ] {
            assert!(check_token_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_token_name("ci-pipeline").is_ok());
    }

    #[test]
    fn a_trial_token_is_never_more_than_a_writer() {
        let record = TokenRecord {
            name: "trial:1:2".into(),
            scope: Some(TrialKey::new(StudyId::new(1), TrialId::new(2))),
            role: Role::Admin,
            expires_at: None,
            created_at: Utc::now(),
            last_used_at: None,
        };
        let caller = Caller::from(record);
        assert_eq!(caller.role, Role::Writer);
        assert!(!caller.may_manage(Some("trial:1:2")));
    }

    #[test]
    fn the_cache_forgets_revoked_names_and_finished_trials() {
        let cache = TokenCache::default();
        let trial = |s, t| Caller {
            name: format!("trial:{s}:{t}"),
            role: Role::Writer,
            trial_scope: Some(TrialKey::new(StudyId::new(s), TrialId::new(t))),
            expires_at: None,
        };
        cache.put("a".into(), Caller::local("ci"));
        cache.put("b".into(), trial(1, 1));
        cache.put("c".into(), trial(1, 2));
        cache.put("d".into(), trial(2, 1));
        cache.forget_name("ci");
        cache.forget_trials(StudyId::new(1), &[TrialId::new(1)]);
        assert_eq!(cache.get("a"), None);
        assert_eq!(cache.get("b"), None);
        assert!(cache.get("c").is_some() && cache.get("d").is_some());
        cache.forget_study(StudyId::new(2));
        assert_eq!(cache.get("d"), None);
    }
}
