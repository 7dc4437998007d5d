//! Group commit: every change to a study goes through that study's batcher, a task that
//! takes all the commands queued while the previous transaction committed and applies them
//! in one transaction. Each caller gets its answer only after that commit.
//!
//! Why: a durable commit costs a disk flush (~4 ms here), and changes to one study are
//! serialized by its row lock anyway, so one transaction per request caps a study at a few
//! hundred changes per second. Batching spreads one flush over every waiting request.
//! Across replicas the study row lock still serializes the batches, so the cap holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::state_machine::{Command, Reply, StudyBatch};
use super::tokens::TokenCache;
use super::{ServiceError, ServiceResult};
use crate::store::Store;

/// How many commands one transaction applies at most.
const MAX_BATCH: usize = 256;
/// A batcher with nothing to do for this long exits; the next command starts a new one.
const IDLE: Duration = Duration::from_secs(30);

struct Job {
    command: Command,
    reply: oneshot::Sender<ServiceResult<Reply>>,
}

type Senders = Arc<Mutex<HashMap<i64, mpsc::UnboundedSender<Job>>>>;

#[derive(Clone)]
pub(super) struct GroupCommit {
    store: Arc<dyn Store>,
    senders: Senders,
    /// Told of the trial tokens each batch revoked or replaced.
    tokens: TokenCache,
}

impl GroupCommit {
    pub fn new(store: Arc<dyn Store>, tokens: TokenCache) -> Self {
        Self {
            store,
            senders: Arc::default(),
            tokens,
        }
    }

    /// Apply `command` to `study_id` in the next batch; returns once that batch committed.
    pub async fn submit(&self, study_id: i64, command: Command) -> ServiceResult<Reply> {
        let (reply, answer) = oneshot::channel();
        let mut job = Job { command, reply };
        loop {
            let sender = {
                let mut senders = self.senders.lock().map_err(|_| poisoned())?;
                senders
                    .entry(study_id)
                    .or_insert_with(|| self.spawn_batcher(study_id))
                    .clone()
            };
            match sender.send(job) {
                Ok(()) => break,
                // That batcher just went idle and closed: forget it and start another.
                Err(mpsc::error::SendError(returned)) => {
                    job = returned;
                    let mut senders = self.senders.lock().map_err(|_| poisoned())?;
                    if senders
                        .get(&study_id)
                        .is_some_and(|s| s.same_channel(&sender))
                    {
                        senders.remove(&study_id);
                    }
                }
            }
        }
        answer
            .await
            .map_err(|_| ServiceError::Internal("the study's batcher stopped".into()))?
    }

    fn spawn_batcher(&self, study_id: i64) -> mpsc::UnboundedSender<Job> {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run_batcher(
            self.store.clone(),
            self.senders.clone(),
            self.tokens.clone(),
            study_id,
            receiver,
        ));
        sender
    }
}

fn poisoned() -> ServiceError {
    ServiceError::Internal("batcher registry lock poisoned".into())
}

async fn run_batcher(
    store: Arc<dyn Store>,
    senders: Senders,
    tokens: TokenCache,
    study_id: i64,
    mut receiver: mpsc::UnboundedReceiver<Job>,
) {
    loop {
        let first = match tokio::time::timeout(IDLE, receiver.recv()).await {
            Ok(Some(job)) => job,
            Ok(None) => return,
            Err(_idle) => {
                // Unregister under the registry lock, then refuse new sends; anything that
                // slipped in before the close is still applied below.
                if let Ok(mut map) = senders.lock() {
                    map.remove(&study_id);
                }
                receiver.close();
                let mut rest = Vec::new();
                while let Ok(job) = receiver.try_recv() {
                    rest.push(job);
                }
                if !rest.is_empty() {
                    apply_batch(&*store, &tokens, study_id, rest).await;
                }
                return;
            }
        };
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        apply_batch(&*store, &tokens, study_id, jobs).await;
    }
}

/// One transaction for all `jobs`; each gets its own result, sent only after the commit.
async fn apply_batch(store: &dyn Store, tokens: &TokenCache, study_id: i64, jobs: Vec<Job>) {
    metrics::histogram!("augur_group_commit_batch_size").record(jobs.len() as f64);
    let (commands, replies): (Vec<_>, Vec<_>) =
        jobs.into_iter().map(|j| (j.command, j.reply)).unzip();
    let started = std::time::Instant::now();
    let outcome = StudyBatch::run(store, study_id, commands).await;
    // How long the study stayed locked for this batch, commit included: with the batch size,
    // what bounds one study's throughput.
    metrics::histogram!("augur_group_commit_seconds").record(started.elapsed().as_secs_f64());
    match outcome {
        Ok(outcome) => {
            // Before anyone hears of the commit: a finished trial's token is refused from
            // the moment its completion is acknowledged.
            tokens.forget_trials(study_id, &outcome.tokens_changed);
            for (reply, result) in replies.into_iter().zip(outcome.replies) {
                let _ = reply.send(result);
            }
        }
        Err(error) => {
            // A study deleted (or never created) is the caller's 404, not a failed transaction.
            if matches!(error, ServiceError::NotFound(_)) {
                tracing::debug!(study_id, %error, "no such study");
            } else if matches!(error, ServiceError::Unavailable(_)) {
                tracing::warn!(study_id, %error, "study transaction failed: database unavailable");
            } else {
                tracing::error!(study_id, %error, "study transaction failed");
            }
            let message = error.to_string();
            for reply in replies {
                let _ = reply.send(Err(match &error {
                    ServiceError::NotFound(what) => ServiceError::NotFound(what.clone()),
                    // Nothing of the batch is known to be written: ask again later.
                    ServiceError::Unavailable(why) => ServiceError::Unavailable(why.clone()),
                    _ => ServiceError::Internal(message.clone()),
                }));
            }
        }
    }
}
