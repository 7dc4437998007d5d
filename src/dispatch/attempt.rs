//! One attempt of a trial, from launch to end: stdout lines and the hypertune file read into
//! measurements and recorded every `POLL`, the early-stopping rule asked, the timeout and
//! outside interrupts (study stopped, service shutting down) obeyed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::collect::{StdoutMetrics, parse_hypertune};
use super::executor::{JobExit, JobRequest};
use super::reporter::TrialReporter;
use super::trial::{Interrupt, TrialSetup};
use crate::model::{Measurement, TrialDirs, TrialId};
use crate::service::trial_files::{self, FileAccess};

/// How long a job asked to stop gets before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often new measurements (stdout lines, the hypertune file) are recorded and the
/// early-stopping rule asked. Those a job reports in its last moments are recorded with its
/// completion, in one step: a trivial trial costs one commit less.
const POLL: Duration = Duration::from_millis(250);

/// How an attempt ended.
pub(super) enum Attempt {
    Ended(JobExit),
    TimedOut(u64),
    EarlyStopped,
    Interrupted(Interrupt),
    LaunchFailed(String),
}

/// One launch, to its end. Also returns the measurements read but not recorded yet (those
/// since the last `POLL`), for the caller to record with the outcome.
pub(super) async fn run_attempt(
    setup: &TrialSetup,
    request: &JobRequest,
    dirs: &TrialDirs,
    timeout: Option<Duration>,
    interrupt: &mut watch::Receiver<Interrupt>,
) -> (Attempt, Vec<Measurement>) {
    let (stdout_tx, mut stdout_rx) = mpsc::unbounded_channel::<String>();
    if let Err(e) = super::executor::write_log_headers(request).await {
        return (Attempt::LaunchFailed(e.to_string()), Vec::new());
    }
    let mut job = match setup.executor.launch(request, stdout_tx).await {
        Ok(job) => job,
        Err(e) => return (Attempt::LaunchFailed(e.to_string()), Vec::new()),
    };
    // Remember the job so that a restarted service can kill a leftover (see trial.rs).
    let _ = super::trial::write_handle(dirs, job.handle().to_string()).await;
    let mut stdout_metrics =
        StdoutMetrics::with_pattern(setup.metric_pattern.clone(), setup.metric_ids.clone());
    let mut hypertune = HypertuneTail::new(dirs, setup.metric_ids.clone());
    let trial_id = request.trial_id;
    let reporter = &setup.reporter;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut poll = tokio::time::interval(POLL);
    let mut unrecorded: Vec<Measurement> = Vec::new();
    let mut stdout_open = true;
    let result = loop {
        tokio::select! {
            exit = job.wait() => break Attempt::Ended(exit),
            line = stdout_rx.recv(), if stdout_open => match line {
                Some(line) => unrecorded.extend(stdout_metrics.parse_line(&line)),
                None => stdout_open = false,
            },
            _ = poll.tick() => {
                unrecorded.extend(hypertune.read_new().await);
                if unrecorded.is_empty() {
                    continue;
                }
                // Reported while listening for an interrupt: a report that waits out an
                // outage must not keep running a job its runner was told to stop (a runner
                // that lost its lease stops its jobs before another replica reruns them).
                // What is not recorded yet stays for the outcome (reports are safe to repeat).
                let batch = unrecorded.clone();
                let reporting = async {
                    for m in batch {
                        report(&**reporter, trial_id, m).await;
                    }
                };
                tokio::select! {
                    () = reporting => unrecorded.clear(),
                    changed = interrupt.changed() => {
                        let what = if changed.is_ok() { *interrupt.borrow() } else { Interrupt::Shutdown };
                        if what != Interrupt::None {
                            job.stop(STOP_GRACE).await;
                            break Attempt::Interrupted(what);
                        }
                        continue;
                    }
                }
                if setup.early_stopping && let Ok(true) = reporter.should_stop(trial_id).await {
                    job.stop(STOP_GRACE).await;
                    break Attempt::EarlyStopped;
                }
            }
            _ = sleep_until(deadline) => {
                job.stop(STOP_GRACE).await;
                break Attempt::TimedOut(timeout.map_or(0, |t| t.as_secs()));
            }
            changed = interrupt.changed() => {
                let what = if changed.is_ok() { *interrupt.borrow() } else { Interrupt::Shutdown };
                if what != Interrupt::None {
                    job.stop(STOP_GRACE).await;
                    break Attempt::Interrupted(what);
                }
            }
        }
    };
    // Whatever the job printed or wrote last still counts.
    while let Ok(line) = stdout_rx.try_recv() {
        unrecorded.extend(stdout_metrics.parse_line(&line));
    }
    unrecorded.extend(hypertune.read_new().await);
    (result, unrecorded)
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(super) async fn report(reporter: &dyn TrialReporter, trial_id: TrialId, m: Measurement) {
    if let Err(e) = reporter.measurement(trial_id, m).await {
        tracing::warn!(%trial_id, error = %e, "could not record a measurement");
    }
}

/// Follows the hypertune file: it is rewritten whole on every report, so it is re-read
/// when it changed and only measurements not yet reported (or changed) are returned.
struct HypertuneTail {
    /// Where walking without links starts (`TrialDirs::base`).
    base: PathBuf,
    path: PathBuf,
    metric_ids: Vec<String>,
    last_text: String,
    reported: BTreeMap<i64, BTreeMap<String, u64>>,
}

impl HypertuneTail {
    fn new(dirs: &TrialDirs, metric_ids: Vec<String>) -> Self {
        Self {
            base: dirs.base.clone(),
            path: dirs.metric_file.clone(),
            metric_ids,
            last_text: String::new(),
            reported: BTreeMap::new(),
        }
    }

    /// The measurements new since the last read. The file is read on a blocking thread:
    /// every running trial reads it every `POLL`, and a slow disk must not stall the async
    /// workers that serve requests.
    async fn read_new(&mut self) -> Vec<Measurement> {
        let (base, path) = (self.base.clone(), self.path.clone());
        let read = tokio::task::spawn_blocking(move || {
            // The job's file, in the server's directory: read, never followed as a link.
            let mut text = String::new();
            trial_files::open_file(&base, &path, FileAccess::ReadJobs)
                .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
                .map(|_| text)
        })
        .await;
        let Ok(Ok(text)) = read else {
            return Vec::new();
        };
        if text == self.last_text {
            return Vec::new();
        }
        let measurements = parse_hypertune(&text, &self.metric_ids);
        self.last_text = text;
        measurements
            .into_iter()
            .filter(|m| {
                let bits: BTreeMap<String, u64> = m
                    .metrics
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_bits()))
                    .collect();
                if self.reported.get(&m.step) == Some(&bits) {
                    return false;
                }
                self.reported.insert(m.step, bits);
                true
            })
            .collect()
    }
}
