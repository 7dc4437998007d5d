//! Handing out trials. Model-based designers (`gp_bandit`) read a snapshot of the study and
//! think outside its lock, one suggestion at a time per study and process; cheap designers
//! run inside the study's batch (`state_machine.rs`), where the cap is enforced.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use augur_optimizer::{Decision, PolicyOutput, PriorStudy};

use super::design::{self, Snapshot};
use super::state_machine::{Command, Exploit, Handed, Precomputed, Reply};
use super::{
    Caller, InternalError, Service, ServiceError, ServiceResult, stored_config, unexpected,
};
use crate::model::spec::MAX_SUGGEST_VALUES;
use crate::model::{
    ClientId, StudyConfig, StudyId, StudyState, SuggestCount, Trial, TrialId, TrialState,
};
use crate::store::{StudyRecord, TrialRecord};

/// What a worker is told to wait when the cap is full.
const RETRY_AFTER_SECS: u64 = 1;

/// How often a suggestion's points may be designed again because another process handed
/// out trials meanwhile; then the batch picks quasi-random points, which never repeat.
const MAX_REDESIGNS: usize = 2;

/// How long a study's last model fit in this process took (wall clock, core held), if it
/// had one: a fit that would not end before its suggestion's deadline is not started.
pub(super) type LastFit = Option<std::time::Duration>;

/// A suggestion's model fit against its deadline: how long the study's last fit took (kept
/// in the design lock, updated when this one ends) and whether this one has started.
struct FitClock<'a> {
    deadline: tokio::time::Instant,
    last_fit: &'a mut LastFit,
    started: bool,
}

/// Most of a suggestion's time budget kept for its commit after the design.
const COMMIT_RESERVE_MAX: std::time::Duration = std::time::Duration::from_millis(250);

/// How long a suggestion may spend waiting for and running its design: the budget less a
/// reserve for the commit and the answer that follow (a tenth of it, at most
/// `COMMIT_RESERVE_MAX`), so that the answer, not only the model, arrives within the
/// budget. Measured under load (`cargo bench --bench api_throughput`'s GP row: 100
/// `gp_bandit` studies, 400 clients, 2 cores): with no reserve the answers' p99 was 2,020 ms
/// on a 2 s budget, with a twentieth 1,980 and 2,006 ms in two runs.
fn design_time(budget: std::time::Duration) -> std::time::Duration {
    budget - (budget / 10).min(COMMIT_RESERVE_MAX)
}

#[derive(Debug)]
pub struct Suggestions {
    pub trials: Vec<Trial>,
    pub study_state: StudyState,
    pub retry_after_secs: Option<u64>,
}

/// The dispatcher's suggestions, each with its first launch counted.
#[derive(Debug)]
pub struct DispatchedSuggestions {
    pub trials: Vec<super::DispatchedTrial>,
    pub study_state: StudyState,
}

/// Who asks: a worker (resumes the trials it holds, gets a lease) or the study's own
/// dispatcher (its first launches counted with these token hashes, no lease).
pub(super) enum Asker {
    Worker(Option<ClientId>),
    /// A pool worker's slot (`pools.rs`): a worker whose trial is also given, in the same
    /// batch, the token with this hash, which reports to it alone.
    PoolSlot {
        client_id: ClientId,
        token_hash: String,
    },
    Dispatcher {
        client_id: ClientId,
        launch_tokens: Vec<String>,
        /// The dispatcher's owner id: it must hold the study's runner lease.
        runner: String,
    },
}

/// How model fits share the machine: the suggestion's time budget runs from its arrival.
/// Waiting for the study's previous suggestion (the design lock) and for a core (one fit per
/// core in the process, first come first served: `Service::design_slots`) come out of it.
/// A suggestion whose budget runs out before its fit gets a core takes no core at all, nor
/// does one that gets a core with less time left than the study's last fit took, and one
/// whose fit runs late stops that fit (it is told to, and its answer is discarded): each
/// gets quasi-random points, chosen inside the study's batch so that two of them never repeat
/// a point. The design gets the budget less a reserve for the commit (`design_time`), so
/// under load a suggestion is answered within its budget, and the cores run only fits whose
/// answer someone waits for.
impl Service {
    /// Hand out up to `count` trials, never exceeding `parallel_trials` unfinished nor
    /// `max_trials` in all (enforced in `state_machine.rs`), for `actor` to run: only the
    /// study's creator or an admin may ask (`check_reporter`), as only they may change it.
    pub async fn suggest(
        &self,
        actor: &Caller,
        study_id: StudyId,
        count: SuggestCount,
        client_id: Option<ClientId>,
    ) -> ServiceResult<Suggestions> {
        self.check_reporter(actor, study_id, None).await?;
        let parameters = self.fixed_config(study_id).await?.parameter_count;
        if count.get().saturating_mul(parameters) > MAX_SUGGEST_VALUES {
            return Err(ServiceError::invalid(
                "count",
                format!(
                    "one suggest answers at most {MAX_SUGGEST_VALUES} values: with {parameters} \
                     parameters, ask for at most {} trials at a time",
                    (MAX_SUGGEST_VALUES / parameters.max(1)).max(1)
                ),
            ));
        }
        let handed = self
            .suggest_as(study_id, count.get(), Asker::Worker(client_id))
            .await?;
        Ok(Suggestions {
            trials: self
                .handed_trial_views(study_id, handed.trials, handed.created)
                .await
                .map_err(ServiceError::after_commit)?,
            study_state: handed.study_state,
            retry_after_secs: handed.retry_later.then_some(RETRY_AFTER_SECS),
        })
    }

    /// Suggestions for the study's own dispatcher, the first launch of each counted with the
    /// token whose hash is at its position in `launch_tokens` (one per trial wanted).
    pub async fn suggest_dispatched(
        &self,
        study_id: StudyId,
        runner: &str,
        client_id: ClientId,
        launch_tokens: Vec<String>,
    ) -> ServiceResult<DispatchedSuggestions> {
        let count = launch_tokens.len();
        let asker = Asker::Dispatcher {
            client_id,
            launch_tokens,
            runner: runner.to_string(),
        };
        let handed = self.suggest_as(study_id, count, asker).await?;
        Ok(DispatchedSuggestions {
            trials: handed
                .trials
                .into_iter()
                .map(super::DispatchedTrial::from)
                .collect(),
            study_state: handed.study_state,
        })
    }

    /// The trials handed out, the study's state, and whether to ask again later.
    pub(super) async fn suggest_as(
        &self,
        study_id: StudyId,
        count: usize,
        asker: Asker,
    ) -> ServiceResult<Handed> {
        let fixed = self.fixed_config(study_id).await?;
        let (client_id, dispatched, launch_tokens, lease_tokens, runner) = match asker {
            Asker::Worker(client) => (client, false, Vec::new(), Vec::new(), None),
            Asker::PoolSlot {
                client_id,
                token_hash,
            } => (Some(client_id), false, Vec::new(), vec![token_hash], None),
            Asker::Dispatcher {
                client_id,
                launch_tokens,
                runner,
            } => (
                Some(client_id),
                true,
                launch_tokens,
                Vec::new(),
                Some(runner),
            ),
        };
        // Model-based designers read a snapshot and think outside the study's lock; the
        // design lock keeps this process's suggestions for the study one at a time, from
        // the snapshot to the commit, so each sees the trials the one before handed out.
        // Another process's (a replica's) is caught in the batch: points designed before a
        // trial that exists now come back `Stale` and are designed again.
        let deadline = tokio::time::Instant::now() + design_time(fixed.suggestion_time_budget);
        let lock = if design::uses_history(&fixed) {
            Some(self.design_lock(study_id)?)
        } else {
            None
        };
        let mut one_at_a_time = match &lock {
            Some(lock) => match tokio::time::timeout_at(deadline, lock.lock()).await {
                Ok(guard) => Some(guard),
                Err(_late) => {
                    budget_exceeded(study_id, fixed.suggestion_time_budget, "design_lock");
                    None
                }
            },
            None => None,
        };
        let resume_client = client_id.clone().filter(|_| !dispatched);
        let client_id = client_id.map(ClientId::into_string);
        for designs_left in (0..=MAX_REDESIGNS).rev() {
            // Without the design lock (none needed, or the budget ran out waiting for it),
            // or once the points came back stale too often, the batch chooses the points:
            // quasi-random ones for a model-based designer, numbered so as never to repeat.
            let precomputed = match one_at_a_time.as_mut() {
                Some(last_fit) if designs_left > 0 => {
                    self.precompute(study_id, count, resume_client.as_ref(), deadline, last_fit)
                        .await?
                }
                _ => None,
            };
            let command = Command::Suggest {
                count,
                client_id: client_id.clone(),
                precomputed,
                dispatched,
                launch_tokens: launch_tokens.clone(),
                lease_tokens: lease_tokens.clone(),
            }
            .by_runner(runner.as_deref());
            match self.commits.submit(study_id, command).await? {
                Reply::Suggested(handed) => return Ok(handed),
                Reply::Stale => {
                    metrics::counter!("augur_suggestion_redesigns_total").increment(1);
                }
                other => return Err(unexpected(other)),
            }
        }
        Err(InternalError::bug("a suggestion without precomputed points came back stale").into())
    }

    /// A model-based designer's points for this call, by `deadline` (past it: `None`, and the
    /// batch chooses quasi-random points); `None` too when the study is not active or needs
    /// none.
    async fn precompute(
        &self,
        study_id: StudyId,
        count: usize,
        resume_client: Option<&ClientId>,
        deadline: tokio::time::Instant,
        last_fit: &mut LastFit,
    ) -> ServiceResult<Option<Precomputed>> {
        let study = self.study_record(study_id).await?;
        if study.state != StudyState::Active {
            return Ok(None);
        }
        let config = stored_config(&study)?;
        let trials = self.store.all_trials(study_id).await?;
        // The history the design sees: trials numbered below this (read after the study, so a
        // trial made between the two reads is seen, and numbers the points after it). The
        // points are for trials numbered from it: the batch takes them only if it is still
        // the study's next number (else another process made trials meanwhile).
        let next_trial_id = trials
            .iter()
            .map(|t| t.id.next())
            .max()
            .unwrap_or(TrialId::new(1))
            .max(study.next_trial_id);
        let wanted = suggestions_needed(&trials, &config, count, resume_client);
        if wanted == 0 {
            return Ok(None);
        }
        let mut clock = FitClock {
            deadline,
            last_fit,
            started: false,
        };
        let designed = tokio::time::timeout_at(
            deadline,
            self.run_designer(&study, &config, &trials, wanted, next_trial_id, &mut clock),
        )
        .await;
        match designed {
            Ok(Ok(Some(decided))) => Ok(Some(precomputed(decided, next_trial_id))),
            // A core came free too late for a fit as long as the last one: a fit that would
            // be stopped at the deadline would only keep a core from one that can finish.
            Ok(Ok(None)) => {
                budget_exceeded(study_id, config.suggestion_time_budget, "no_time_to_fit");
                Ok(None)
            }
            Ok(Err(e)) => Err(e),
            // No core in time, or the model took too long: answer on time with quasi-random
            // points (a fit is told to stop, and what it returns is discarded).
            Err(_) => {
                let stage = if clock.started { "fit" } else { "core" };
                budget_exceeded(study_id, config.suggestion_time_budget, stage);
                Ok(None)
            }
        }
    }

    fn design_lock(&self, study_id: StudyId) -> ServiceResult<Arc<tokio::sync::Mutex<LastFit>>> {
        let mut locks = self
            .design_locks
            .lock()
            .map_err(|_| InternalError::Broken("the design lock registry"))?;
        Ok(locks.entry(study_id).or_default().clone())
    }

    async fn run_designer(
        &self,
        study: &StudyRecord,
        config: &StudyConfig,
        trials: &[TrialRecord],
        count: usize,
        first_trial: TrialId,
        clock: &mut FitClock<'_>,
    ) -> ServiceResult<Option<PolicyOutput>> {
        let policy = design::policy_for(config);
        // A scheduler ranks trials by what they measured at each rung: their curves.
        let curves = match trials.last() {
            Some(last) if policy.reads_curves() => design::curves_by_trial(
                self.store
                    .measurements(study.id, TrialId::new(1), last.id)
                    .await?,
            ),
            _ => Default::default(),
        };
        let snapshot = Snapshot {
            config: config.clone(),
            trials: design::trial_views(trials, config, curves),
            next_trial_number: design::optimizer_number(first_trial).max(1),
            previous_state: study.designer_state.clone(),
            priors: self.prior_studies(config).await?,
        };
        // The optimizer is CPU-bound: keep it off the async workers. If this future is
        // dropped (the time budget ran out), the flag tells the designer to stop: a fit
        // nobody waits for must not hold a core.
        let cancel = Arc::new(AtomicBool::new(false));
        let _stop_when_abandoned = CancelOnDrop(cancel.clone());
        // A core for this fit, held until the fit returns (also when nobody waits for it any
        // more: until it has seen the cancel flag).
        let core = self
            .design_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| InternalError::Broken("the design slots"))?;
        let started = tokio::time::Instant::now();
        if clock
            .last_fit
            .is_some_and(|took| started + took > clock.deadline)
        {
            return Ok(None);
        }
        clock.started = true;
        let output = tokio::task::spawn_blocking(move || {
            let _core = core;
            augur_optimizer::cancel::with_cancel(cancel, || policy.decide(&snapshot.view(), count))
        })
        .await
        .map_err(|e| InternalError::Task("designer", e))?;
        *clock.last_fit = Some(started.elapsed());
        if let Some(state) = &output.state {
            // A cache for warm starts: losing it costs time, never correctness.
            if let Err(error) = self.store.set_designer_state(study.id, state).await {
                tracing::warn!(study_id = %study.id, %error, "could not keep designer state");
            }
        }
        Ok(Some(output))
    }
}

impl Service {
    /// The finished trials of the study's `prior_studies`, for a warm start (a prior study
    /// deleted since is skipped). Their outcomes are read with this study's metrics: a prior
    /// trial without one of them counts as infeasible.
    async fn prior_studies(&self, config: &StudyConfig) -> ServiceResult<Vec<PriorStudy>> {
        let mut priors = Vec::with_capacity(config.prior_studies.len());
        for prior in &config.prior_studies {
            let trials = self.store.all_trials(*prior).await?;
            priors.push(PriorStudy {
                completed: design::completed_trials(&trials, config),
            });
        }
        Ok(priors)
    }
}

/// Sets its flag when dropped: when the designer's future is abandoned, or done.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A suggestion ran out of its time budget at `stage` (waiting for the `design_lock`, for a
/// `core`, with `no_time_to_fit` once it had one, or during the `fit`): it gets
/// quasi-random points.
fn budget_exceeded(study_id: StudyId, budget: std::time::Duration, stage: &'static str) {
    metrics::counter!("augur_suggestion_budget_exceeded_total", "stage" => stage).increment(1);
    tracing::warn!(
        %study_id,
        ?budget,
        stage,
        "suggestion time budget exceeded; using quasi-random points"
    );
}

/// How many new points a model-based designer should propose for this call: none when the
/// client resumes its trials, when requested trials are waiting, or when the cap is full.
fn suggestions_needed(
    trials: &[TrialRecord],
    config: &StudyConfig,
    count: usize,
    client_id: Option<&ClientId>,
) -> usize {
    let unfinished: Vec<&TrialRecord> = trials.iter().filter(|t| t.state.is_unfinished()).collect();
    let resumes = client_id.is_some_and(|c| {
        unfinished
            .iter()
            .any(|t| t.client_id.as_deref() == Some(c.as_str()))
    });
    if resumes {
        return 0;
    }
    let waiting = unfinished
        .iter()
        .filter(|t| t.state == TrialState::Requested)
        .count();
    let free = config.free_slots(unfinished.len() as u64) as usize;
    // A scheduler may still resume paused trials into free slots (and settle them) when no
    // new trial is left: its calls are not bounded by the trial budget.
    if config.scheduler.is_some() {
        return count.saturating_sub(waiting).min(free);
    }
    let budget = (config.trial_budget() as usize).saturating_sub(trials.len());
    count.saturating_sub(waiting).min(free).min(budget)
}

/// A policy's decisions as the batch takes them.
fn precomputed(decided: PolicyOutput, next_trial_id: TrialId) -> Precomputed {
    let mut out = Precomputed {
        next_trial_id,
        closed: decided.closed,
        ..Precomputed::default()
    };
    for decision in decided.decisions {
        match decision {
            Decision::New { parameters, budget } => {
                out.points.push(parameters);
                out.budgets.push(budget);
            }
            Decision::Resume { trial, budget } => {
                out.resumes.push((design::trial_of_number(trial), budget))
            }
            Decision::Stop { trial } => out.stops.push(design::trial_of_number(trial)),
            Decision::Exploit {
                trial,
                parent,
                parameters,
                budget,
            } => out.exploits.push(Exploit {
                trial_id: design::trial_of_number(trial),
                parent_id: design::trial_of_number(parent),
                parameters,
                budget,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_design_leaves_a_tenth_of_the_budget_for_the_commit_at_most_250_ms() {
        let ms = Duration::from_millis;
        for (budget, design) in [
            (ms(2_000), ms(1_800)),
            (ms(100), ms(90)),
            (ms(60_000), ms(59_750)),
            (ms(1), Duration::from_micros(900)),
        ] {
            assert_eq!(design_time(budget), design, "budget {budget:?}");
        }
    }
}
