//! Replicas sharing one database, and which of them a study's changes go to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use sha2::{Digest, Sha256};

use super::{Service, ServiceResult};
use crate::model::StudyId;
use crate::store::ReplicaRecord;

/// A replica's lease lasts this long unless renewed: a replica killed outright is routed
/// to for at most this long (and each forwarder stops at its first refused connection).
const REPLICA_LEASE_TTL: Duration = Duration::from_secs(10);
/// How often a replica renews its lease and reads the others'.
const REPLICA_RENEW_EVERY: Duration = Duration::from_secs(2);
/// A replica that refused a connection is not routed to for this long.
const DOWN_FOR: Duration = Duration::from_secs(10);

/// Another replica, as a forwarder needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: String,
    /// Where it serves, e.g. `http://10.0.0.7:8080`.
    pub url: String,
}

/// This process's place among the replicas: its lease, the live set, the shared secret.
///
/// Every study command is applied under the study's row lock, so any replica may serve any
/// request: routing is for speed, never for correctness. Two replicas sending commands of
/// one study each commit half a batch, taking turns on the lock; sent to one replica, the
/// same commands share its commits (`group_commit.rs`). So each replica started with
/// `--replica-url` renews a lease row (`replicas`) and reads the live ones, and a study's
/// owner is the live replica that scores highest for it (rendezvous hashing): every replica
/// that sees the same live set picks the same owner, and a replica joining or leaving moves
/// only its own share of the studies. While the sets differ (for a few seconds around a
/// change), two replicas may both take a study's commands: still correct, only slower.
/// Requests are forwarded with a secret all replicas read from the database, which lets the
/// owner trust that the forwarder already admitted the request (its rate limit).
pub struct Replicas {
    service: Service,
    me: ReplicaRecord,
    secret: String,
    secret_digest: [u8; 32],
    live: RwLock<Vec<ReplicaRecord>>,
    /// Replicas that refused a connection, and when: skipped until `DOWN_FOR` has passed.
    down: Mutex<HashMap<String, Instant>>,
}

impl Service {
    /// Join the replicas on this database as `id`, reachable at `url`: take a lease, read
    /// the live set and the shared secret. Renew with [`Replicas::renew`].
    pub async fn join_replicas(&self, id: String, url: String) -> ServiceResult<Arc<Replicas>> {
        let secret = self
            .store
            .replica_secret(&crate::service::new_token())
            .await?;
        let me = ReplicaRecord { id, url };
        let replicas = Arc::new(Replicas {
            service: self.clone(),
            secret_digest: Sha256::digest(secret.as_bytes()).into(),
            secret,
            live: RwLock::new(vec![me.clone()]),
            me,
            down: Mutex::default(),
        });
        replicas.renew().await?;
        Ok(replicas)
    }
}

impl Replicas {
    /// Renew this replica's lease and read the live set.
    pub async fn renew(&self) -> ServiceResult<()> {
        let ttl = chrono::Duration::from_std(REPLICA_LEASE_TTL).unwrap_or(chrono::Duration::MAX);
        let mut live = self
            .service
            .store
            .renew_replica(&self.me, Utc::now(), ttl)
            .await?;
        if !live.iter().any(|r| r.id == self.me.id) {
            // Our own clock ran behind the database's view of expiry: we are alive.
            live.push(self.me.clone());
        }
        metrics::gauge!("augur_replicas_live").set(live.len() as f64);
        if let Ok(mut slot) = self.live.write() {
            *slot = live;
        }
        Ok(())
    }

    /// Renew every `REPLICA_RENEW_EVERY` until the process ends; an outage keeps the last
    /// live set (the leases of the others expire in the database meanwhile, not here).
    pub fn spawn_renewal(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REPLICA_RENEW_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(error) = this.renew().await {
                    tracing::warn!(%error, "cannot renew this replica's lease");
                }
            }
        })
    }

    /// Leave: the others stop routing here at their next renewal.
    pub async fn leave(&self) {
        if let Err(error) = self.service.store.remove_replica(&self.me.id).await {
            tracing::warn!(%error, "cannot remove this replica's lease");
        }
    }

    /// The replica that should take `study_id`'s changes, if it is another one.
    pub fn owner(&self, study_id: StudyId) -> Option<Peer> {
        let live = self.live.read().ok()?;
        let down = self.down.lock().ok()?;
        let owner = live
            .iter()
            .filter(|r| {
                r.id == self.me.id || down.get(&r.id).is_none_or(|at| at.elapsed() >= DOWN_FOR)
            })
            .max_by_key(|r| score(&r.id, study_id))?;
        (owner.id != self.me.id).then(|| Peer {
            id: owner.id.clone(),
            url: owner.url.clone(),
        })
    }

    /// `peer` refused a connection: route around it for a while.
    pub fn mark_down(&self, peer: &Peer) {
        if let Ok(mut down) = self.down.lock() {
            down.insert(peer.id.clone(), Instant::now());
        }
    }

    /// The secret this replica forwards with.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Whether `presented` is the replicas' secret (compared as digests, so the time taken
    /// says nothing about the secret itself).
    pub fn is_secret(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        digest == self.secret_digest
    }
}

/// A replica's rendezvous score for a study: the highest live score owns it.
fn score(replica_id: &str, study_id: StudyId) -> [u8; 8] {
    let digest = Sha256::new()
        .chain_update(replica_id.as_bytes())
        .chain_update(study_id.get().to_be_bytes())
        .finalize();
    let mut score = [0; 8];
    score.copy_from_slice(&digest[..8]);
    score
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(replicas: &[&str], studies: std::ops::Range<i64>) -> Vec<String> {
        studies
            .map(|s| {
                replicas
                    .iter()
                    .max_by_key(|r| score(r, StudyId::new(s)))
                    .map(|r| r.to_string())
                    .unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn studies_spread_over_replicas_and_a_leaving_replica_moves_only_its_own() {
        let three = owners(&["a", "b", "c"], 0..3000);
        for r in ["a", "b", "c"] {
            let share = three.iter().filter(|o| *o == r).count();
            assert!((800..1200).contains(&share), "{r} owns {share} of 3000");
        }
        let two = owners(&["a", "c"], 0..3000);
        for (before, after) in three.iter().zip(&two) {
            if before != "b" {
                assert_eq!(
                    before, after,
                    "a study not owned by the leaving replica moved"
                );
            }
        }
    }
}
