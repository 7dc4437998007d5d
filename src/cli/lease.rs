//! A pulled trial's lease, kept by the worker that runs it (`augur worker`, `--study` or
//! `--pool`): heartbeats every third of the lease, and a worker that can no longer renew
//! it stops the trial's job itself, before the server gives the trial to another worker,
//! so that two trainers never share a trial's directories.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use tokio::sync::watch;
use tokio::time::Instant;

use super::client::Client;
use super::reaper::TrialReaper;
use crate::dispatch::trial::{Interrupt, TrialEnd, TrialSetup, run_trial};
use crate::model::TrialDirs;
use crate::service::DispatchedTrial;

/// Run a trial a worker pulled (`--study`) or leased (`--pool`) to its end: its lease kept
/// (a trial may go long without measurements), its job stopped if the lease is lost, and
/// its processes killed if the worker dies (`reaper.rs`).
pub(super) async fn run_pulled_trial(
    setup: &Arc<TrialSetup>,
    trial: DispatchedTrial,
    client: Arc<Client>,
    lease: Duration,
    interrupt: watch::Receiver<Interrupt>,
) -> TrialEnd {
    let trial_id = trial.id;
    let path = format!("/v1/studies/{}/trials/{trial_id}", setup.study_id);
    let (keeper, trial_interrupt) = LeaseKeeper::start(client, &path, lease, interrupt);
    let handle_file = TrialDirs::new(&setup.study_dir, trial_id).handle_file();
    let reaper = TrialReaper::start(&handle_file, setup.study_id, trial_id);
    let end = run_trial(setup.clone(), trial, None, trial_interrupt).await;
    if let Some(reaper) = reaper {
        reaper.disarm().await;
    }
    drop(keeper);
    end
}

/// Share of the lease after the last accepted heartbeat's sending at which the worker
/// gives the trial up: the server counts the lease from that heartbeat's arrival, later.
const HOLD_SHARE: f64 = 0.8;

/// Heartbeats for one running trial; dropping it stops them.
pub(super) struct LeaseKeeper {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LeaseKeeper {
    /// Keep the lease of the trial at `trial_path` (`/v1/studies/S/trials/T`), granted
    /// now for `lease`. The receiver is the trial's interrupt: `outer`'s, and `Shutdown`
    /// (stop the job, report nothing) once the lease is lost: no heartbeat accepted within
    /// [`HOLD_SHARE`] of the lease, or one refused (the trial is no longer this worker's).
    pub(super) fn start(
        client: Arc<Client>,
        trial_path: &str,
        lease: Duration,
        outer: watch::Receiver<Interrupt>,
    ) -> (LeaseKeeper, watch::Receiver<Interrupt>) {
        let (tx, rx) = watch::channel(*outer.borrow());
        let path = format!("{trial_path}/heartbeat");
        let task = tokio::spawn(keep(client, path, lease, outer, tx));
        (LeaseKeeper { task }, rx)
    }
}

async fn keep(
    client: Arc<Client>,
    path: String,
    lease: Duration,
    mut outer: watch::Receiver<Interrupt>,
    trial: watch::Sender<Interrupt>,
) {
    let hold = lease.mul_f64(HOLD_SHARE);
    let mut held_until = Instant::now() + hold;
    let mut next_beat = Instant::now() + lease / 3;
    loop {
        tokio::select! {
            changed = outer.changed() => {
                let what = if changed.is_ok() { *outer.borrow() } else { Interrupt::Shutdown };
                let _ = trial.send(what);
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep_until(held_until) => {
                tracing::warn!(path, lease_secs = lease.as_secs(), "no heartbeat accepted: stopping the trial before the server gives it to another worker");
                eprintln!("{path}: no heartbeat accepted for {:.1} s: stopping the trial (its lease runs out)", hold.as_secs_f64());
                let _ = trial.send(Interrupt::Shutdown);
                return;
            }
            sent = beat(&client, &path, next_beat) => match sent {
                Beat::Accepted(at) => {
                    held_until = at + hold;
                    next_beat = at + lease / 3;
                }
                Beat::Refused(status) => {
                    eprintln!("{path}: heartbeat refused ({status}): the trial is no longer this worker's; stopping it");
                    let _ = trial.send(Interrupt::Shutdown);
                    return;
                }
                // The server answered something else, or not at all: try again soon, until
                // the lease is out.
                Beat::Failed => next_beat = Instant::now() + lease / 10,
            }
        }
    }
}

enum Beat {
    /// Accepted; sent at this instant.
    Accepted(Instant),
    Refused(StatusCode),
    Failed,
}

/// One heartbeat, sent at `at`.
async fn beat(client: &Client, path: &str, at: Instant) -> Beat {
    tokio::time::sleep_until(at).await;
    let sent = Instant::now();
    match client.call_status(Method::POST, path, None).await {
        Ok((status, _)) if status.is_success() => Beat::Accepted(sent),
        // The trial ended or went to another worker (its token is no longer valid).
        Ok((status, _))
            if matches!(
                status,
                StatusCode::UNAUTHORIZED
                    | StatusCode::FORBIDDEN
                    | StatusCode::NOT_FOUND
                    | StatusCode::CONFLICT
            ) =>
        {
            Beat::Refused(status)
        }
        _ => Beat::Failed,
    }
}
