//! Group commit: every change to a study goes through a commit lane, a task that takes all
//! the commands queued while its previous transaction committed, whatever their studies, and
//! applies them in one transaction: each study's commands as one batch under that study's
//! lock (`state_machine.rs`), all committed together. Each caller gets its answer only after
//! that commit.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::notifications::Notifier;
use super::state_machine::{BatchOutcome, Command, Reply, StudyBatch};
use super::tokens::TokenCache;
use super::{InternalError, ServiceError, ServiceResult, error_chain};
use crate::model::StudyId;
use crate::store::{Store, StudiesTx, StudyLock};

/// Commit lanes per process by default: one per core, at least 2 (a lane waiting for a
/// study's lock holds up only its own studies), at most [`MAX_LANES`].
fn lane_count() -> usize {
    std::thread::available_parallelism()
        .map_or(2, usize::from)
        .clamp(2, MAX_LANES)
}
/// The most commit lanes a process may have: the PostgreSQL store's commit pool holds this
/// many connections.
pub const MAX_LANES: usize = 8;
/// How many commands one transaction applies at most.
const MAX_BATCH: usize = 512;
/// How long a lane waits on one PostgreSQL transaction, commit included, before giving it up.
/// A transaction whose packets were lost in a network cut otherwise waits out TCP's
/// retransmission back-off after the heal (seconds; `multi_node.rs` saw 4–5 s of a stalled
/// study). Ours take milliseconds, but seconds on a machine loaded far past its cores (5 s
/// was reached once in a test run at load 5 on 2 cores): the replica lease (10 s), past
/// which the replica has lost its studies anyway. Not SQLite's: it never crosses a network.
const POSTGRES_TRANSACTION_DEADLINE: Duration = Duration::from_secs(10);

/// The deadline of a lane's transactions on `store`, if they have one.
fn transaction_deadline(store: &dyn Store) -> Option<Duration> {
    (store.backend() == "postgres").then_some(POSTGRES_TRANSACTION_DEADLINE)
}

/// `step` of a transaction that began at `began`, bounded by `deadline`: past it, the step is
/// dropped (its connection with it) and the database counts as out of reach.
async fn within<T>(
    began: std::time::Instant,
    deadline: Option<Duration>,
    step: impl Future<Output = ServiceResult<T>>,
) -> ServiceResult<T> {
    let Some(deadline) = deadline else {
        return step.await;
    };
    let at = tokio::time::Instant::from_std(began + deadline);
    tokio::time::timeout_at(at, step).await.unwrap_or_else(|_| {
        Err(ServiceError::Unavailable(format!(
            "no answer from the database within {} s",
            deadline.as_secs()
        )))
    })
}

struct Job {
    study_id: StudyId,
    command: Command,
    reply: oneshot::Sender<ServiceResult<Reply>>,
}

/// The commit lanes of this process.
///
/// Why: a durable commit costs a disk flush (~4 ms here), and changes to one study are
/// serialized by its row lock anyway, so one transaction per request caps a study at a few
/// hundred changes per second, and one transaction per study and batch caps a server with many
/// busy studies alike (each batch then holds one or two commands). Sharing the flush across
/// studies spreads it over every waiting request.
///
/// A study always goes to the same lane (its id modulo the number of lanes), so its batches
/// stay in order. One lane per core (at least 2, at most 8): more lanes commit more, smaller
/// batches, and on a machine whose cores PostgreSQL shares that costs more than it overlaps
/// (measured on 2 cores, 100 studies × 64 clients: 1, 2, 3, 4 lanes gave 1,870, 1,764,
/// 1,647, 1,492 trials/s); two keep one study's lock wait from holding up every other study.
///
/// Replicas on one PostgreSQL: a lane locks its first study waiting, as one study's batcher
/// did, and every further study with `SKIP LOCKED`, so it never waits while holding locks
/// (no deadlock between replicas) and a study another replica is committing does not hold
/// up this lane's other studies: its commands go first into the lane's next transaction.
#[derive(Clone)]
pub(super) struct GroupCommit {
    store: Arc<dyn Store>,
    /// How many lanes to start.
    lane_count: usize,
    /// Started with the first command (a lane is a task: it needs the runtime).
    lanes: Arc<OnceLock<Vec<mpsc::UnboundedSender<Job>>>>,
    /// Told of the trial tokens each batch revoked or replaced.
    tokens: TokenCache,
    /// Handed each committed batch's news for webhooks.
    notifier: Notifier,
}

impl GroupCommit {
    pub fn new(store: Arc<dyn Store>, tokens: TokenCache, notifier: Notifier) -> Self {
        Self {
            store,
            lane_count: lane_count(),
            lanes: Arc::default(),
            tokens,
            notifier,
        }
    }

    /// The same, with `count` lanes (1 to [`MAX_LANES`]) instead of one per core; before the
    /// first command only (the lanes start with it).
    pub fn with_lanes(mut self, count: usize) -> Self {
        self.lane_count = count.clamp(1, MAX_LANES);
        self
    }

    /// Apply `command` to `study_id` in the next batch; returns once that batch committed.
    pub async fn submit(&self, study_id: StudyId, command: Command) -> ServiceResult<Reply> {
        let lanes = self.lanes.get_or_init(|| {
            (0..self.lane_count)
                .map(|_| {
                    let (sender, receiver) = mpsc::unbounded_channel();
                    let after = Announce {
                        tokens: self.tokens.clone(),
                        notifier: self.notifier.clone(),
                    };
                    tokio::spawn(run_lane(self.store.clone(), after, receiver));
                    sender
                })
                .collect()
        });
        let (reply, answer) = oneshot::channel();
        let lane = &lanes[study_id.get().rem_euclid(lanes.len() as i64) as usize];
        lane.send(Job {
            study_id,
            command,
            reply,
        })
        .map_err(|_| lane_stopped())?;
        answer.await.map_err(|_| lane_stopped())?
    }
}

fn lane_stopped() -> ServiceError {
    InternalError::Broken("the commit lane").into()
}

/// Who hears of a committed batch besides its callers.
struct Announce {
    tokens: TokenCache,
    notifier: Notifier,
}

async fn run_lane(
    store: Arc<dyn Store>,
    tokens: Announce,
    mut receiver: mpsc::UnboundedReceiver<Job>,
) {
    let mut deferred: Vec<Job> = Vec::new();
    loop {
        let mut jobs = std::mem::take(&mut deferred);
        if jobs.is_empty() {
            match receiver.recv().await {
                Some(job) => jobs.push(job),
                None => return,
            }
        }
        while jobs.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        deferred = apply_jobs(&*store, &tokens, jobs).await;
    }
}

/// One study's share of a transaction: its commands (kept to replay them alone if the shared
/// transaction fails before its commit) and where each answer goes.
struct StudyJobs {
    study_id: StudyId,
    commands: Vec<Command>,
    replies: Vec<oneshot::Sender<ServiceResult<Reply>>>,
}

impl StudyJobs {
    /// Every command of the study fails with `error`.
    fn fail(self, error: &ServiceError) {
        for reply in self.replies {
            let _ = reply.send(Err(batch_error(error)));
        }
    }

    fn into_jobs(self) -> Vec<Job> {
        let study_id = self.study_id;
        self.commands
            .into_iter()
            .zip(self.replies)
            .map(|(command, reply)| Job {
                study_id,
                command,
                reply,
            })
            .collect()
    }
}

/// The jobs by study, in the order each study first appears (the deferred ones first).
fn by_study(jobs: Vec<Job>) -> Vec<StudyJobs> {
    let mut groups: Vec<StudyJobs> = Vec::new();
    let mut index: HashMap<StudyId, usize> = HashMap::new();
    for job in jobs {
        let i = *index.entry(job.study_id).or_insert_with(|| {
            groups.push(StudyJobs {
                study_id: job.study_id,
                commands: Vec::new(),
                replies: Vec::new(),
            });
            groups.len() - 1
        });
        groups[i].commands.push(job.command);
        groups[i].replies.push(job.reply);
    }
    groups
}

/// One transaction for all `jobs`; each gets its own result, sent only after the commit.
/// Returns the jobs of studies another transaction held, for the next round.
async fn apply_jobs(store: &dyn Store, tokens: &Announce, jobs: Vec<Job>) -> Vec<Job> {
    metrics::histogram!("augur_group_commit_batch_size").record(jobs.len() as f64);
    let groups = by_study(jobs);
    let started = std::time::Instant::now();
    let deadline = transaction_deadline(store);
    let mut deferred = Vec::new();
    let mut applied: Vec<(StudyJobs, BatchOutcome)> = Vec::new();
    let mut tx: Box<dyn StudiesTx> = match store.begin_studies().await {
        Ok(tx) => tx,
        Err(error) => {
            let error = ServiceError::from(error);
            for group in groups {
                group.fail(&error);
            }
            return deferred;
        }
    };
    // The studies after the first are locked and read together (PostgreSQL: two statements
    // for all of them instead of two each), once the first is done.
    let mut rest: Vec<StudyId> = groups.iter().skip(1).map(|g| g.study_id).collect();
    let mut groups = groups.into_iter();
    let mut first = true;
    while let Some(group) = groups.next() {
        let prefetch = if first {
            Vec::new()
        } else {
            std::mem::take(&mut rest)
        };
        // Only the first lock may wait: this transaction holds none yet.
        let step = within(
            started,
            deadline,
            apply_group(tx, &group, first, &prefetch, &tokens.notifier),
        )
        .await;
        first = false;
        tx = match step {
            Ok(GroupStep::Applied(back, outcome)) => {
                applied.push((group, outcome));
                back
            }
            Ok(GroupStep::Missing(back)) => {
                tracing::debug!(study_id = %group.study_id, "no such study");
                let missing = ServiceError::NotFound(format!("study {}", group.study_id));
                group.fail(&missing);
                back
            }
            Ok(GroupStep::Busy(back)) => {
                deferred.extend(group.into_jobs());
                back
            }
            // The transaction is lost (and, dropped, rolled back): replay every study alone.
            Err(error) => {
                let rest = std::iter::once(group).chain(groups);
                replay_alone(store, tokens, applied, rest.collect(), error).await;
                return deferred;
            }
        };
    }
    let sent = within(started, deadline, async { Ok(tx.send_writes().await?) }).await;
    if let Err(error) = sent {
        // Refused before the commit, so nothing of it was written: replay study by study.
        drop(tx);
        replay_alone(store, tokens, applied, Vec::new(), error).await;
        return deferred;
    }
    let studies = applied.len();
    let committed = within(started, deadline, async { Ok(tx.commit().await?) }).await;
    // How long this lane's studies stayed locked, commit included: with the batch size, what
    // bounds a study's throughput.
    metrics::histogram!("augur_group_commit_seconds").record(started.elapsed().as_secs_f64());
    metrics::histogram!("augur_group_commit_studies").record(studies as f64);
    match committed {
        Ok(()) => {
            for (group, outcome) in applied {
                announce(tokens, group, outcome);
            }
        }
        Err(error) => {
            // Whether the commit reached the disk is unknown: nothing may be replayed, and
            // no caller may hear that nothing was done.
            let error = error.during_commit();
            log_failure(&error);
            for (group, _) in applied {
                group.fail(&error);
            }
        }
    }
    deferred
}

/// What became of one study's share of a shared transaction; the transaction comes back.
enum GroupStep {
    Applied(Box<dyn StudiesTx>, BatchOutcome),
    Missing(Box<dyn StudiesTx>),
    /// Another transaction holds the study: its commands go into the next round.
    Busy(Box<dyn StudiesTx>),
}

/// Lock `group`'s study in `tx` (waiting for it only when `wait`), after reading ahead the
/// studies of `prefetch`, and apply its commands. An error loses the transaction.
async fn apply_group(
    mut tx: Box<dyn StudiesTx>,
    group: &StudyJobs,
    wait: bool,
    prefetch: &[StudyId],
    notifier: &Notifier,
) -> ServiceResult<GroupStep> {
    if !prefetch.is_empty() {
        tx.prefetch(prefetch).await?;
    }
    let locked = match tx.lock_study(group.study_id, wait).await? {
        StudyLock::Locked(locked) => locked,
        StudyLock::Missing(back) => return Ok(GroupStep::Missing(back)),
        StudyLock::Busy(back) => return Ok(GroupStep::Busy(back)),
    };
    let (outcome, locked) =
        StudyBatch::apply_locked(locked, group.commands.clone(), notifier).await?;
    Ok(GroupStep::Applied(locked.release().await?, outcome))
}

/// Answer each command of a committed study batch.
fn announce(after: &Announce, group: StudyJobs, outcome: BatchOutcome) {
    // Before anyone hears of the commit: a finished trial's token is refused from the moment
    // its completion is acknowledged.
    after
        .tokens
        .forget_trials(group.study_id, &outcome.tokens_changed);
    for (reply, result) in group.replies.into_iter().zip(outcome.replies) {
        let _ = reply.send(result);
    }
    // Never waits: webhooks are called by a task of their own.
    after.notifier.offer(outcome.news);
}

/// A shared transaction failed before its commit (so nothing of it was written): apply each
/// study's commands in a transaction of its own, so that one study's failure (`error`, of the
/// last study tried) is that study's alone; unless the database is out of reach.
async fn replay_alone(
    store: &dyn Store,
    tokens: &Announce,
    applied: Vec<(StudyJobs, BatchOutcome)>,
    rest: Vec<StudyJobs>,
    error: ServiceError,
) {
    log_failure(&error);
    let groups = applied.into_iter().map(|(group, _)| group).chain(rest);
    // The database is out of reach: a transaction per study would only wait for it once per
    // study. Everyone hears it at once and asks again later.
    if matches!(error, ServiceError::Unavailable(_)) {
        for group in groups {
            group.fail(&error);
        }
        return;
    }
    for group in groups {
        let result = StudyBatch::run(
            store,
            group.study_id,
            group.commands.clone(),
            &tokens.notifier,
        )
        .await;
        match result {
            Ok(outcome) => announce(tokens, group, outcome),
            Err(error) => {
                log_failure(&error);
                group.fail(&error);
            }
        }
    }
}

fn log_failure(error: &ServiceError) {
    match error {
        ServiceError::NotFound(_) => tracing::debug!(%error, "no such study"),
        ServiceError::Unavailable(_) | ServiceError::Unanswered(_) => {
            tracing::warn!(%error, "study transaction failed: database unavailable")
        }
        _ => tracing::error!(%error, "study transaction failed"),
    }
}

/// The error every command of a failed batch answers.
fn batch_error(error: &ServiceError) -> ServiceError {
    match error {
        // A study deleted (or never created) is the caller's 404, not a failed transaction.
        ServiceError::NotFound(what) => ServiceError::NotFound(what.clone()),
        // Nothing of the batch is known to be written: ask again later.
        ServiceError::Unavailable(why) => ServiceError::Unavailable(why.clone()),
        ServiceError::Unanswered(why) => ServiceError::Unanswered(why.clone()),
        other => InternalError::Batch(error_chain(other)).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_step_past_the_deadline_answers_that_the_database_is_out_of_reach() {
        let began = std::time::Instant::now();
        let hung = std::future::pending::<ServiceResult<()>>();
        let answer = within(began, Some(Duration::from_millis(50)), hung).await;
        let Err(ServiceError::Unavailable(why)) = answer else {
            panic!("expected 503 unavailable, got {answer:?}");
        };
        assert!(why.contains("no answer from the database"), "{why}");
        assert!(began.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_step_that_answers_in_time_is_left_alone() {
        let began = std::time::Instant::now();
        let quick = async { Ok::<_, ServiceError>(7) };
        let bounded = within(began, Some(Duration::from_secs(5)), quick).await;
        assert!(matches!(bounded, Ok(7)));
        let slow = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, ServiceError>(8)
        };
        assert!(matches!(within(began, None, slow).await, Ok(8)));
    }
}
