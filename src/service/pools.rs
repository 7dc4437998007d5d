//! Worker pools (DESIGN §4.4): `augur worker --pool NAME` workers take the trials of every
//! active study whose `trial_job` names the pool (`executor: pool`), shared fairly between
//! them ([`Service::lease_pool_trial`]). Workers report themselves
//! ([`Service::report_pool_worker`]): the store keeps their slots, GPUs and busy count, and
//! adds up busy and idle slot-seconds (utilisation).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use tokio::sync::Notify;

use super::state_machine::Command;
use super::suggest::Asker;
use super::{Caller, InternalError, Service, ServiceError, ServiceResult, hash_token, new_token};
use crate::model::executor::check_pool_name;
use crate::model::pool::{
    PoolDetail, PoolLease, PoolStudy, PoolSummary, PoolUsage, PoolWorker, WORKER_GONE_AFTER_SECS,
    WorkerReport,
};
use crate::model::{ClientId, Role, StudyId, StudyState};
use crate::store::{PoolWorkerRecord, PoolWorkerReport, StudyRecord};

/// The longest a lease request waits for a trial before it is answered with none.
pub const MAX_LEASE_WAIT: Duration = Duration::from_secs(30);
/// A waiting lease looks again this often even if nothing here woke it: another replica's
/// changes, and leases running out, wake nothing in this process.
const RESCAN_EVERY: Duration = Duration::from_millis(500);
/// How often a pool's full studies have their leases looked at (`expire_pool_leases`).
const EXPIRY_PROBE_EVERY: Duration = Duration::from_secs(1);
/// The usage a pool's detail shows: the last hour.
const USAGE_WINDOW_MS: i64 = 3_600_000;

/// What the pools share in this process: a wake-up for waiting leases, and the picks in
/// flight by study. Slots asking at once would otherwise all read the same counts and pick
/// the same study; a reservation counts as a running trial of its study until its suggest
/// has committed (and the study's counts show it).
#[derive(Clone, Default)]
pub(super) struct Pools {
    wakeup: Arc<Notify>,
    in_flight: Arc<Mutex<HashMap<StudyId, u64>>>,
    /// When each pool's full studies last had their leases looked at.
    probed: Arc<Mutex<HashMap<String, std::time::Instant>>>,
}

impl Pools {
    /// Something may have freed room in a pool (a trial finished, a study was created or
    /// changed): waiting leases look again.
    pub(super) fn wake(&self) {
        self.wakeup.notify_waiters();
    }

    /// The fairest of `studies` not yet `tried` with room (any with `resume`), reserved
    /// until the returned pick is dropped.
    fn reserve(&self, studies: &[StudyRecord], tried: &[StudyId], resume: bool) -> Option<Pick> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let mut candidates: Vec<Candidate> = studies
            .iter()
            .filter(|s| !tried.contains(&s.id))
            .filter_map(|study| {
                let (_, weight) = pool_of(study)?;
                let (running, handed, pending) = pending_of(study);
                let flying = in_flight.get(&study.id).copied().unwrap_or(0);
                Some(Candidate {
                    study_id: study.id,
                    weight,
                    running: running + flying,
                    handed: handed + flying,
                    pending: pending.saturating_sub(flying),
                })
            })
            .filter(|c| resume || c.pending > 0)
            .collect();
        fair_order(&mut candidates);
        let chosen = candidates.first()?.study_id;
        *in_flight.entry(chosen).or_default() += 1;
        Some(Pick {
            pools: self.clone(),
            study_id: chosen,
        })
    }

    /// Whether it is time to look at `pool`'s full studies' leases (and the time noted).
    fn probe_due(&self, pool: &str) -> bool {
        let mut probed = self.probed.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match probed.get(pool) {
            Some(at) if now.duration_since(*at) < EXPIRY_PROBE_EVERY => false,
            _ => {
                probed.insert(pool.to_string(), now);
                true
            }
        }
    }

    /// A reserved pick is done (see [`Pick`]).
    fn release(&self, study_id: StudyId) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = in_flight.get_mut(&study_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                in_flight.remove(&study_id);
            }
        }
    }
}

/// A pick in flight: it counts as a running trial of its study until dropped, when its
/// suggest has committed or found no room, or when the lease request was cancelled mid-way
/// (the worker died or hung up), which must give the room back too.
struct Pick {
    pools: Pools,
    study_id: StudyId,
}

impl Drop for Pick {
    fn drop(&mut self) {
        self.pools.release(self.study_id);
    }
}

/// A study of the pool as a pick sees it.
#[derive(Debug, Clone, PartialEq)]
struct Candidate {
    study_id: StudyId,
    weight: f64,
    running: u64,
    /// Trials handed out so far (created, less those waiting as requested).
    handed: u64,
    /// Whether it may take a trial now (room under its cap, something left to run).
    pending: u64,
}

/// Who goes first for a free slot: fewest running per unit of weight, then fewest handed
/// out per unit of weight (so that over time each study's throughput follows its weight),
/// then the older study.
fn fair_order(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| {
        let share = |c: &Candidate, n: u64| n as f64 / c.weight;
        share(a, a.running)
            .total_cmp(&share(b, b.running))
            .then(share(a, a.handed).total_cmp(&share(b, b.handed)))
            .then(a.study_id.cmp(&b.study_id))
    });
}

/// The pool a study's trials run in, with its weight.
fn pool_of(study: &StudyRecord) -> Option<(&str, f64)> {
    let pool = study.spec.trial_job.as_ref()?.executor.pool()?;
    Some((pool.name.as_str(), pool.weight()))
}

/// A study's trials waiting for a slot: its room under the cap, up to what it has left. A
/// paused trial (multi-fidelity) is left work too: only a suggestion, which a slot's pick
/// asks, decides its promotion or its stop, so a study whose trials are all paused must
/// still be picked.
fn pending_of(study: &StudyRecord) -> (u64, u64, u64) {
    let counts = &study.trial_counts;
    let running = counts.active + counts.stopping;
    let created = (study.next_trial_id.get() - 1).max(0) as u64;
    let unfinished = running + counts.requested;
    let cap = study.spec.parallel_trials.max(0) as u64;
    let room = cap.saturating_sub(unfinished) + counts.requested;
    let left = (study.spec.max_trials.max(0) as u64).saturating_sub(created)
        + counts.requested
        + counts.paused;
    let pending = if study.state == StudyState::Active {
        room.min(left)
    } else {
        0
    };
    (running, created.saturating_sub(counts.requested), pending)
}

fn millis_to_time(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn check_pool(pool: &str) -> ServiceResult<()> {
    check_pool_name(pool).map_err(|why| ServiceError::invalid("pool", why))
}

fn check_worker(worker: &str) -> ServiceResult<()> {
    // `<worker>/<slot>` is the slot's client id, which the suggest path checks.
    ClientId::try_from(format!("{worker}/0"))
        .map_err(|e| ServiceError::invalid("worker", e.message))?;
    if worker.is_empty() || worker.len() > 200 || worker.contains('/') {
        return Err(ServiceError::invalid(
            "worker",
            "must be 1-200 characters, without '/' or control characters",
        ));
    }
    Ok(())
}

impl Service {
    /// Only operators and admins run trials: a pool study's commands run on the workers'
    /// machines, as an operator's `trial_job` does on the server's.
    fn check_pool_runner(actor: &Caller) -> ServiceResult<()> {
        if actor.role < Role::Operator || actor.trial_scope.is_some() {
            return Err(ServiceError::denied(format!(
                "a pool worker runs trials: it needs an operator or admin token, and this one \
                 is a {}",
                actor.role
            )));
        }
        Ok(())
    }

    /// Register `worker` in `pool` (the pool comes to be with its first worker), or renew
    /// it with its busy count now.
    pub async fn report_pool_worker(
        &self,
        actor: &Caller,
        pool: &str,
        worker: &str,
        report: WorkerReport,
    ) -> ServiceResult<()> {
        Self::check_pool_runner(actor)?;
        check_pool(pool)?;
        check_worker(worker)?;
        if !(1..=256).contains(&report.slots) {
            return Err(ServiceError::invalid("slots", "must be between 1 and 256"));
        }
        if report.busy > report.slots {
            return Err(ServiceError::invalid("busy", "must be at most slots"));
        }
        if report.host.is_empty()
            || report.host.len() > 255
            || report.host.chars().any(char::is_control)
        {
            return Err(ServiceError::invalid(
                "host",
                "must be 1-255 characters, none of them control characters",
            ));
        }
        if report.gpus.len() > 64 || report.gpus.iter().any(|g| g.is_empty() || g.len() > 64) {
            return Err(ServiceError::invalid(
                "gpus",
                "at most 64 GPU ids of 1-64 characters",
            ));
        }
        let record = PoolWorkerReport {
            pool: pool.to_string(),
            worker: worker.to_string(),
            host: report.host,
            slots: i64::from(report.slots),
            gpus: serde_json::to_string(&report.gpus)
                .map_err(|e| InternalError::data("a worker's GPUs", e))?,
            busy: i64::from(report.busy),
        };
        self.store
            .report_pool_worker(
                &record,
                Utc::now().timestamp_millis(),
                WORKER_GONE_AFTER_SECS * 1000,
            )
            .await?;
        Ok(())
    }

    /// The next trial of any study in `pool` for `worker`'s `slot`, waiting up to `wait`
    /// for one (`None`: none came). The studies are asked in their fair order
    /// (`fair_order`) through the suggest path, each capped there.
    ///
    /// A worker's slot asks for "the next trial of any study in the pool" (a long poll): the
    /// study with the fewest running trials per unit of weight (`trial_job.pool_weight`) goes
    /// first, the one that has been handed fewest trials breaking ties, and each is asked
    /// through the same suggest path as a pulled client (`suggest_as`), so `parallel_trials`
    /// and `max_trials` are enforced where they always are (`state_machine.rs`). A leased
    /// trial is a pulled trial: it has a lease, which a dead worker stops renewing, and then
    /// it goes back to `requested` for another worker (a lost launch counted against
    /// `max_retries`, see `StudyBatch::expire_leases`). A worker restarted with the same id
    /// asks with `resume` first and gets back the trials its slots still hold.
    pub async fn lease_pool_trial(
        &self,
        actor: &Caller,
        pool: &str,
        worker: &str,
        slot: u32,
        wait: Duration,
        resume: bool,
    ) -> ServiceResult<Option<PoolLease>> {
        Self::check_pool_runner(actor)?;
        check_pool(pool)?;
        check_worker(worker)?;
        if slot >= 256 {
            return Err(ServiceError::invalid("slot", "must be below 256"));
        }
        let client_id = ClientId::try_from(format!("{worker}/{slot}"))
            .map_err(|e| ServiceError::invalid("worker", e.message))?;
        let deadline = tokio::time::Instant::now() + wait.min(MAX_LEASE_WAIT);
        let mut resume = resume;
        loop {
            // Listen before looking, so that a wake-up between the two is not missed.
            let woken = self.pools.wakeup.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Only the first look resumes: a held trial does not go away while we wait.
            let resume_now = std::mem::take(&mut resume);
            if let Some(lease) = self
                .pick_pool_trial(actor, pool, &client_id, resume_now)
                .await?
            {
                return Ok(Some(lease));
            }
            self.expire_pool_leases(pool).await?;
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until(deadline.min(now + RESCAN_EVERY)) => {}
            }
        }
    }

    /// One pick: the pool's studies in fair order, each asked for one trial until one gives
    /// it. Picks run at once (their suggests share commits); each sees the others in flight
    /// through the pool's reservations, as if their trials were already running.
    async fn pick_pool_trial(
        &self,
        actor: &Caller,
        pool: &str,
        client_id: &ClientId,
        resume: bool,
    ) -> ServiceResult<Option<PoolLease>> {
        let mut studies = self.pool_studies(pool).await?;
        if resume {
            // A restarted worker's slot gets back the trial it still holds (the suggest
            // path answers a client with its held trials), before anything new.
            let mut holding = None;
            for study in &studies {
                if !self
                    .resumable_trials(study.id, client_id.as_str())
                    .await?
                    .is_empty()
                {
                    holding = Some(study.id);
                    break;
                }
            }
            if let Some(id) = holding {
                studies.retain(|s| s.id == id);
            }
        }
        let mut tried = Vec::new();
        loop {
            let Some(pick) = self.pools.reserve(&studies, &tried, resume) else {
                return Ok(None);
            };
            let study_id = pick.study_id;
            tried.push(study_id);
            let token = new_token();
            let asker = Asker::PoolSlot {
                client_id: client_id.clone(),
                token_hash: hash_token(&token),
            };
            let handed = self.suggest_as(study_id, 1, asker).await;
            drop(pick);
            let handed = match handed {
                Ok(handed) => handed,
                // Deleted since it was listed.
                Err(ServiceError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            let Some(trial_id) = handed.trials.first().map(|t| t.id) else {
                continue;
            };
            let trial = self
                .handed_trial_views(study_id, handed.trials, handed.created)
                .await
                .map_err(ServiceError::after_commit)?
                .into_iter()
                .find(|t| t.id == trial_id)
                .ok_or_else(|| InternalError::bug("a handed trial went missing"))?;
            // Off the lease's path: a slot waits for its trial, not for the audit trail.
            let (this, actor) = (self.clone(), actor.clone());
            let detail = Some(format!("pool {pool}, slot {}", client_id.as_str()));
            tokio::spawn(async move {
                this.audit_trial(&actor, "trial.lease", study_id, trial_id, detail)
                    .await;
            });
            metrics::counter!("augur_pool_leases_total", "pool" => pool.to_string()).increment(1);
            return Ok(Some(PoolLease {
                study_id,
                trial,
                token,
            }));
        }
    }

    /// A study whose running trials fill its cap gets no pick, and if their worker died
    /// they report nothing either: no batch would ever see their leases run out. So a slot
    /// that found nothing has such studies' leases looked at, at most once per
    /// [`EXPIRY_PROBE_EVERY`] per pool in this process.
    async fn expire_pool_leases(&self, pool: &str) -> ServiceResult<()> {
        if !self.pools.probe_due(pool) {
            return Ok(());
        }
        for study in self.pool_studies(pool).await? {
            let (running, _, pending) = pending_of(&study);
            if pending > 0 || running == 0 {
                continue;
            }
            match self.commits.submit(study.id, Command::ExpireLeases).await {
                Ok(_) | Err(ServiceError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Active studies whose trials `pool` runs.
    async fn pool_studies(&self, pool: &str) -> ServiceResult<Vec<StudyRecord>> {
        Ok(self
            .active_pool_studies()
            .await?
            .into_iter()
            .filter(|s| pool_of(s).is_some_and(|(name, _)| name == pool))
            .collect())
    }

    /// Every active study run by a pool.
    async fn active_pool_studies(&self) -> ServiceResult<Vec<StudyRecord>> {
        self.active_studies_where(|s| pool_of(s).is_some()).await
    }

    /// Every pool a worker or an active study names, in short, by name.
    pub async fn list_pools(&self) -> ServiceResult<Vec<PoolSummary>> {
        let workers = self.store.list_pool_workers(None).await?;
        let studies = self.active_pool_studies().await?;
        let mut names: Vec<String> = workers
            .iter()
            .map(|w| w.pool.clone())
            .chain(
                studies
                    .iter()
                    .filter_map(|s| Some(pool_of(s)?.0.to_string())),
            )
            .collect();
        names.sort();
        names.dedup();
        let now_ms = Utc::now().timestamp_millis();
        Ok(names
            .iter()
            .map(|name| {
                let workers: Vec<PoolWorker> = workers
                    .iter()
                    .filter(|w| &w.pool == name)
                    .map(|w| worker_view(w, now_ms))
                    .collect();
                let studies: Vec<PoolStudy> = studies
                    .iter()
                    .filter(|s| pool_of(s).is_some_and(|(n, _)| n == name))
                    .map(study_view)
                    .collect();
                summary(name, &workers, &studies)
            })
            .collect())
    }

    /// One pool in full: its workers, its studies and their queue, its last hour's usage.
    /// A name nothing uses yet is an empty pool, not an error (pools need no creating).
    pub async fn get_pool(&self, pool: &str) -> ServiceResult<PoolDetail> {
        check_pool(pool)?;
        let now_ms = Utc::now().timestamp_millis();
        let workers: Vec<PoolWorker> = self
            .store
            .list_pool_workers(Some(pool))
            .await?
            .iter()
            .map(|w| worker_view(w, now_ms))
            .collect();
        let mut studies: Vec<PoolStudy> = self
            .pool_studies(pool)
            .await?
            .iter()
            .map(study_view)
            .collect();
        studies.sort_by_key(|s| (s.pending == 0, s.study_id));
        let usage = self
            .store
            .list_pool_usage(pool, now_ms - USAGE_WINDOW_MS)
            .await?
            .into_iter()
            .map(|u| PoolUsage {
                minute: millis_to_time(u.minute_ms),
                busy_slot_secs: u.busy_slot_secs,
                idle_slot_secs: u.idle_slot_secs,
            })
            .collect();
        Ok(PoolDetail {
            summary: summary(pool, &workers, &studies),
            worker_list: workers,
            study_list: studies,
            usage,
        })
    }
}

fn worker_view(w: &PoolWorkerRecord, now_ms: i64) -> PoolWorker {
    let slots = u32::try_from(w.slots).unwrap_or(0);
    let busy = u32::try_from(w.busy).unwrap_or(0).min(slots);
    PoolWorker {
        id: w.worker.clone(),
        host: w.host.clone(),
        slots,
        gpus: serde_json::from_str(&w.gpus).unwrap_or_default(),
        busy,
        idle: slots - busy,
        live: now_ms - w.last_seen_ms <= WORKER_GONE_AFTER_SECS * 1000,
        registered_at: millis_to_time(w.registered_at_ms),
        last_seen_at: millis_to_time(w.last_seen_ms),
        busy_slot_secs: w.busy_slot_secs,
        idle_slot_secs: w.idle_slot_secs,
    }
}

fn study_view(study: &StudyRecord) -> PoolStudy {
    let (running, _, pending) = pending_of(study);
    PoolStudy {
        study_id: study.id,
        name: study.name.clone(),
        weight: pool_of(study).map_or(1.0, |(_, w)| w),
        running,
        pending,
        parallel_trials: study.spec.parallel_trials.max(0) as u64,
    }
}

fn summary(name: &str, workers: &[PoolWorker], studies: &[PoolStudy]) -> PoolSummary {
    let live = || workers.iter().filter(|w| w.live);
    let busy_slot_secs: f64 = workers.iter().map(|w| w.busy_slot_secs).sum();
    let idle_slot_secs: f64 = workers.iter().map(|w| w.idle_slot_secs).sum();
    let total = busy_slot_secs + idle_slot_secs;
    PoolSummary {
        name: name.to_string(),
        workers: live().count() as u32,
        workers_gone: workers.iter().filter(|w| !w.live).count() as u32,
        slots: live().map(|w| w.slots).sum(),
        busy_slots: live().map(|w| w.busy).sum(),
        idle_slots: live().map(|w| w.idle).sum(),
        queue_length: studies.iter().map(|s| s.pending).sum(),
        studies_waiting: studies.iter().filter(|s| s.pending > 0).count() as u32,
        studies: studies.len() as u32,
        busy_slot_secs,
        idle_slot_secs,
        utilisation: if total > 0.0 {
            busy_slot_secs / total
        } else {
            0.0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TrialId;

    fn candidate(study_id: StudyId, weight: f64, running: u64, handed: u64) -> Candidate {
        Candidate {
            study_id,
            weight,
            running,
            handed,
            pending: 1,
        }
    }

    fn order(mut c: Vec<Candidate>) -> Vec<i64> {
        fair_order(&mut c);
        c.iter().map(|c| c.study_id.get()).collect()
    }

    fn pool_study(id: i64, parallel_trials: i64) -> StudyRecord {
        let spec = serde_json::json!({
            "name": format!("s{id}"), "algorithm": "random",
            "metrics": [{"id": "loss", "goal": "minimize"}],
            "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
            "max_trials": 20, "parallel_trials": parallel_trials,
            "trial_job": {"executor": "pool", "pool": "shared", "command": ["true"]}
        });
        StudyRecord {
            id: StudyId::new(id),
            name: format!("s{id}"),
            state: StudyState::Active,
            state_reason: None,
            spec: serde_json::from_value(spec).expect("spec"),
            next_trial_id: TrialId::new(1),
            change_seq: 0,
            designer_state: None,
            created_by: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            trial_counts: Default::default(),
        }
    }

    /// A pick abandoned mid-way (its lease request cancelled: the worker died or hung up
    /// while its slot's suggest ran) must not hold its study's room for ever: a pool test
    /// once saw a study wait 60 s with one trial running under a cap of 2.
    #[test]
    fn a_pick_dropped_before_it_finished_gives_its_room_back() {
        let pools = Pools::default();
        let studies = [pool_study(1, 1)];
        let pick = pools.reserve(&studies, &[], false).expect("room for one");
        assert!(
            pools.reserve(&studies, &[], false).is_none(),
            "the cap of 1 is taken by the pick in flight"
        );
        drop(pick);
        assert!(
            pools.reserve(&studies, &[], false).is_some(),
            "the room is back once the pick is gone"
        );
    }

    #[test]
    fn the_study_with_fewest_running_trials_goes_first() {
        let c = vec![
            candidate(StudyId::new(1), 1.0, 2, 0),
            candidate(StudyId::new(2), 1.0, 0, 9),
            candidate(StudyId::new(3), 1.0, 1, 0),
        ];
        assert_eq!(order(c), [2, 3, 1]);
    }

    #[test]
    fn weight_divides_the_running_count() {
        // Study 1 runs 2 with weight 4 (0.5 per unit), study 2 runs 1 with weight 1.
        let c = vec![
            candidate(StudyId::new(2), 1.0, 1, 0),
            candidate(StudyId::new(1), 4.0, 2, 0),
        ];
        assert_eq!(order(c), [1, 2]);
    }

    #[test]
    fn ties_go_to_the_study_handed_fewest_trials_not_the_oldest() {
        let c = vec![
            candidate(StudyId::new(1), 1.0, 1, 7),
            candidate(StudyId::new(2), 1.0, 1, 5),
            candidate(StudyId::new(3), 1.0, 1, 6),
        ];
        assert_eq!(order(c), [2, 3, 1]);
    }
}
