//! Notifications: webhooks called when a study completes or fails, a trial fails, or a
//! completed trial becomes the study's best (`model/notification.rs` has the spec and the
//! rule on hosts).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::sync::mpsc;

use super::paging::{page_bounds, split_page};
use super::{InternalError, Page, Service, ServiceError, ServiceResult, trial_of};
use crate::model::{
    DeliveryState, DeliveryTarget, NotificationDelivery, NotificationEvent, NotificationTarget,
    NotifyHosts, StudyId, StudyState, TrialId,
};
use crate::store::{DeliveryProgress, DeliveryRecord, NewDelivery, TrialRecord};

/// Batches' news waiting for the sender; past this, news is dropped (and counted).
const QUEUE_CAPACITY: usize = 4096;
/// Webhook calls in flight at once; more wait their turn (in the sender, not the study).
const MAX_IN_FLIGHT: usize = 64;
/// The header that carries the body's signature.
pub const SIGNATURE_HEADER: &str = "x-augur-signature";

/// The operator's settings (`--notify-*`).
#[derive(Debug, Clone)]
pub struct NotifySettings {
    /// Called for studies that name no webhook of their own.
    pub default: Option<NotificationTarget>,
    /// Hosts a webhook may reach even on loopback or link-local addresses.
    pub hosts: NotifyHosts,
    /// Attempts per call, the first included (at least 1).
    pub attempts: u32,
    /// The wait before the second attempt; each next one waits twice as long (at most
    /// `MAX_BACKOFF`).
    pub first_backoff: Duration,
    /// One attempt's limit, from connecting to the end of the answer.
    pub timeout: Duration,
}

/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

impl Default for NotifySettings {
    fn default() -> Self {
        Self {
            default: None,
            hosts: NotifyHosts::default(),
            attempts: 5,
            first_backoff: Duration::from_secs(2),
            timeout: Duration::from_secs(10),
        }
    }
}

/// What a batch did that a webhook may hear of.
#[derive(Debug, Clone)]
pub(super) enum Happened {
    /// The study completed or failed.
    StudyEnded,
    TrialFailed(Box<TrialRecord>),
    /// A trial completed with a value of the study's objective: maybe a new best.
    TrialCompleted(Box<TrialRecord>),
}

/// One committed batch's news of one study.
#[derive(Debug, Clone)]
pub(super) struct StudyNews {
    pub study_id: StudyId,
    pub study_name: String,
    /// The study's state after the batch.
    pub state: StudyState,
    pub state_reason: Option<String>,
    /// The study's own webhooks.
    pub targets: Vec<NotificationTarget>,
    pub happened: Vec<Happened>,
}

/// Where committed batches put their news: a bounded queue, read by the sender once it is
/// started ([`Service::start_notifications`]); until then news is not kept.
///
/// Never in the study's way: a committed batch (`group_commit.rs`, after the commit, as the
/// audit trail is written after a change) offers what happened to a bounded queue without
/// waiting ([`Notifier::offer`]; a full queue drops the news, logged and counted in
/// `augur_notifications_dropped_total`). One background task reads the queue, decides which
/// webhooks hear of it (the study's own `notifications`, or the server's default
/// `--notify-url` for a study that names none), whether a completion is a new best (the
/// service's best-trial logic, read after the commit: a burst of completions may fold into
/// its latest best), and hands each call to a task of its own. Each call is a JSON POST with
/// a Slack-compatible `text`, signed with HMAC-SHA256 of the exact body
/// (`X-Augur-Signature: sha256=<hex>`), retried with exponential backoff on no answer, a 5xx,
/// 408 or 429 (at most `attempts`), never following a redirect, and refused when its host
/// resolves to a loopback, link-local or unspecified address the operator did not allow
/// (checked on the resolved addresses themselves, so a name that rebinds to 127.0.0.1 is
/// refused too). Every call and its attempts are stored (`notification_deliveries`) and
/// listed by `GET /v1/studies/{study}/notifications`.
#[derive(Clone, Default)]
pub(super) struct Notifier {
    /// The sender's queue, and whether the server has a default webhook (without one, a
    /// study that names none has nobody to tell).
    queue: Arc<OnceLock<(mpsc::Sender<StudyNews>, bool)>>,
    /// News queued or being handled, and calls not yet done (delivered or given up): what
    /// [`Service::settle_notifications`] waits for.
    outstanding: Arc<AtomicUsize>,
}

impl Notifier {
    /// Whether news of a study with these webhooks would be sent: the sender is started and
    /// there is somebody to tell.
    pub fn listens(&self, targets: &[NotificationTarget]) -> bool {
        self.queue
            .get()
            .is_some_and(|(_, default)| *default || !targets.is_empty())
    }

    /// Hand the news on without waiting: a full queue drops it.
    pub fn offer(&self, news: Option<StudyNews>) {
        let (Some(news), Some((queue, default))) = (news, self.queue.get()) else {
            return;
        };
        if news.targets.is_empty() && !default {
            return;
        }
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        if let Err(error) = queue.try_send(news) {
            self.outstanding.fetch_sub(1, Ordering::SeqCst);
            metrics::counter!("augur_notifications_dropped_total").increment(1);
            tracing::warn!(%error, "notification queue full: news of a study dropped");
        }
    }
}

impl Service {
    /// The same service, calling webhooks by `settings` once started.
    pub fn with_notify_settings(mut self, settings: NotifySettings) -> Self {
        self.notify_settings = Arc::new(settings);
        self
    }

    /// The hosts a study's webhooks may reach (checked when a study is created).
    pub(super) fn check_notification_hosts(
        &self,
        notifications: &[crate::model::NotificationSpec],
    ) -> ServiceResult<()> {
        for (i, n) in notifications.iter().enumerate() {
            let field = format!("notifications[{i}].url");
            let url = crate::model::notification::parse_url(&n.url, &field)?;
            self.notify_settings.hosts.check_url(&url, &field)?;
        }
        Ok(())
    }

    /// Start the sender (once; later calls do nothing). The TLS provider must be installed
    /// (`serve::install_tls_provider`): the HTTP client asks for it.
    pub fn start_notifications(&self) -> Result<(), String> {
        if self.notifier.queue.get().is_some() {
            return Ok(());
        }
        let settings = self.notify_settings.clone();
        let http = http_client(&settings)?;
        let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let default = settings.default.is_some();
        if self.notifier.queue.set((sender, default)).is_err() {
            return Ok(());
        }
        tokio::spawn(run_sender(
            self.clone(),
            settings,
            http,
            receiver,
            self.notifier.outstanding.clone(),
        ));
        Ok(())
    }

    /// Wait (at most `within`) until every webhook call of the news committed so far is
    /// done, delivered or given up: for `augur run`, whose server ends with its study.
    /// Whether it settled.
    pub async fn settle_notifications(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.notifier.outstanding.load(Ordering::SeqCst) > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// A study's webhook calls, oldest first, a page at a time.
    pub async fn notification_deliveries(
        &self,
        study_id: StudyId,
        page_size: Option<i64>,
        page_token: Option<&str>,
    ) -> ServiceResult<Page<NotificationDelivery>> {
        self.study_record(study_id).await?;
        let (limit, after) = page_bounds(page_size, page_token)?;
        let records = self
            .store
            .list_deliveries(study_id, after, limit + 1)
            .await?;
        let (records, next) = split_page(records, limit, |r| r.id);
        Ok(Page {
            items: records
                .into_iter()
                .map(delivery_view)
                .collect::<ServiceResult<_>>()?,
            next_page_token: next,
        })
    }
}

fn delivery_view(r: DeliveryRecord) -> ServiceResult<NotificationDelivery> {
    let corrupt = |what: &str, value: &str| {
        ServiceError::from(InternalError::Data {
            what: format!("delivery {}: {what} {value:?}", r.id),
            source: None,
        })
    };
    Ok(NotificationDelivery {
        id: r.id,
        event: NotificationEvent::parse(&r.delivery.event)
            .ok_or_else(|| corrupt("event", &r.delivery.event))?,
        trial_id: r.delivery.trial_id,
        target: DeliveryTarget::parse(&r.delivery.target)
            .ok_or_else(|| corrupt("target", &r.delivery.target))?,
        url: r.delivery.url.clone(),
        state: DeliveryState::parse(&r.progress.state)
            .ok_or_else(|| corrupt("state", &r.progress.state))?,
        attempts: r.progress.attempts.max(0) as u32,
        last_status: r.progress.last_status.and_then(|s| u16::try_from(s).ok()),
        last_error: r.progress.last_error.clone(),
        created_at: r.delivery.created_at,
        updated_at: r.progress.updated_at,
    })
}

/// The client every call goes out through: no proxy (the resolved addresses are the ones
/// connected to), no redirect, each attempt bounded, names resolved by [`CheckedResolver`].
fn http_client(settings: &NotifySettings) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout)
        .pool_idle_timeout(Duration::from_secs(5))
        .user_agent(concat!("augur/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(CheckedResolver {
            hosts: settings.hosts.clone(),
        })
        .build()
        .map_err(|e| format!("cannot build the notifications' HTTP client: {e}"))
}

/// Resolves a webhook's host and keeps only the addresses it may reach: a name that
/// resolves (or rebinds) to loopback, link-local or unspecified addresses is refused unless
/// the operator allows it. (Literal addresses never come here: `deliver` checks those.)
struct CheckedResolver {
    hosts: NotifyHosts,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let hosts = self.hosts.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match hosts.check_resolved(&host, a.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refused = Some(why);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let error: Box<dyn std::error::Error + Send + Sync> = match refused {
                    Some(why) => Box::new(RefusedAddress(why)),
                    None => format!("{host} resolved to no address").into(),
                };
                return Err(error);
            }
            let addrs: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// A host that resolved only to addresses a webhook may not reach: the same next time, so
/// the call is not tried again.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RefusedAddress(String);

/// Whether `error` or one of its causes is a [`RefusedAddress`].
fn is_refused_address(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<RefusedAddress>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Read the queue until every sender is gone.
async fn run_sender(
    service: Service,
    settings: Arc<NotifySettings>,
    http: reqwest::Client,
    mut receiver: mpsc::Receiver<StudyNews>,
    outstanding: Arc<AtomicUsize>,
) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    while let Some(news) = receiver.recv().await {
        // This news is handled once every call it makes has been counted.
        let _handled = Outstanding(outstanding.clone());
        let (targets, target_kind) = if !news.targets.is_empty() {
            (news.targets.clone(), DeliveryTarget::Study)
        } else if let Some(default) = &settings.default {
            (vec![default.clone()], DeliveryTarget::Server)
        } else {
            continue;
        };
        for happened in &news.happened {
            let Some(event) = service.event_of(&news, happened, &targets).await else {
                continue;
            };
            for target in targets.iter().filter(|t| t.events.contains(&event.kind)) {
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    return;
                };
                let call = Call {
                    service: service.clone(),
                    settings: settings.clone(),
                    http: http.clone(),
                    target: target.clone(),
                    target_kind,
                    event: event.clone(),
                };
                outstanding.fetch_add(1, Ordering::SeqCst);
                let done = Outstanding(outstanding.clone());
                tokio::spawn(async move {
                    call.deliver().await;
                    drop(permit);
                    drop(done);
                });
            }
        }
    }
}

/// One unit of outstanding work, counted down when dropped (also if its task panics).
struct Outstanding(Arc<AtomicUsize>);

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An event as webhooks get it.
#[derive(Debug, Clone)]
struct Event {
    kind: NotificationEvent,
    study_id: StudyId,
    trial_id: Option<TrialId>,
    at: DateTime<Utc>,
    /// The JSON body without its `delivery_id` (added per call).
    body: serde_json::Map<String, serde_json::Value>,
}

impl Service {
    /// The event `happened` is, if any webhook of `targets` may hear of it: a completion is
    /// an event only when it made the trial the study's best (read now, after the commit).
    async fn event_of(
        &self,
        news: &StudyNews,
        happened: &Happened,
        targets: &[NotificationTarget],
    ) -> Option<Event> {
        let wanted: BTreeSet<NotificationEvent> = targets
            .iter()
            .flat_map(|t| t.events.iter().copied())
            .collect();
        let (kind, trial) = match happened {
            Happened::StudyEnded => match news.state {
                StudyState::Completed => (NotificationEvent::StudyCompleted, None),
                StudyState::Failed => (NotificationEvent::StudyFailed, None),
                _ => return None,
            },
            Happened::TrialFailed(trial) => (NotificationEvent::TrialFailed, Some(trial)),
            Happened::TrialCompleted(trial) => {
                if !wanted.contains(&NotificationEvent::BestImproved) {
                    return None;
                }
                match self.is_best(news.study_id, trial.id).await {
                    Ok(true) => (NotificationEvent::BestImproved, Some(trial)),
                    Ok(false) => return None,
                    Err(error) => {
                        tracing::warn!(%error, study_id = %news.study_id, "cannot tell whether a trial is the best: no best_improved sent");
                        return None;
                    }
                }
            }
        };
        if !wanted.contains(&kind) {
            return None;
        }
        let at = Utc::now();
        let text = slack_text(kind, news, trial.map(|t| &**t));
        let mut body = serde_json::Map::new();
        body.insert("event".into(), kind.as_str().into());
        body.insert(
            "study".into(),
            serde_json::json!({
                "id": news.study_id,
                "name": news.study_name,
                "state": news.state,
                "state_reason": news.state_reason,
            }),
        );
        if let Some(trial) = trial {
            let view = trial_of((**trial).clone(), Vec::new());
            body.insert(
                "trial".into(),
                serde_json::to_value(view).unwrap_or_default(),
            );
        }
        body.insert("at".into(), at.to_rfc3339().into());
        body.insert("text".into(), text.into());
        Some(Event {
            kind,
            study_id: news.study_id,
            trial_id: trial.map(|t| t.id),
            at,
            body,
        })
    }

    /// Whether `trial_id` is the study's best trial now; with several objectives, whether it
    /// is on the Pareto front (`optimal_trials`).
    async fn is_best(&self, study_id: StudyId, trial_id: TrialId) -> ServiceResult<bool> {
        let study = self.study_record(study_id).await?;
        let config = super::stored_config(&study)?;
        if augur_optimizer::objective_metrics(&config.metrics).len() > 1 {
            let front = self.optimal_records(study_id, &config).await?;
            return Ok(front.iter().any(|t| t.id == trial_id));
        }
        Ok(self
            .best_trial_record(study_id, &study.spec)
            .await?
            .is_some_and(|best| best.id == trial_id))
    }
}

/// One webhook call: stored, attempted, its attempts recorded.
struct Call {
    service: Service,
    settings: Arc<NotifySettings>,
    http: reqwest::Client,
    target: NotificationTarget,
    target_kind: DeliveryTarget,
    event: Event,
}

/// How one attempt went.
enum Attempt {
    Delivered(u16),
    /// Worth trying again: no answer, a 5xx, 408 or 429.
    Retry(Option<u16>, String),
    /// Not worth trying again: another 4xx, a redirect, a refused address.
    GiveUp(Option<u16>, String),
}

impl Call {
    async fn deliver(self) {
        let store = &self.service.store;
        let shown_url = match self.target_kind {
            DeliveryTarget::Study => self.target.url.to_string(),
            // The server's default may hold a token in its path (Slack's do).
            DeliveryTarget::Server => self.target.url.origin().ascii_serialization(),
        };
        let new = NewDelivery {
            study_id: self.event.study_id,
            event: self.event.kind.as_str().into(),
            trial_id: self.event.trial_id,
            target: self.target_kind.as_str().into(),
            url: shown_url,
            created_at: self.event.at,
        };
        // Unrecorded (the database is away, the study deleted), it is still sent.
        let id = match store.insert_delivery(&new).await {
            Ok(id) => Some(id),
            Err(error) => {
                tracing::warn!(%error, study_id = %new.study_id, "cannot record a notification");
                None
            }
        };
        let mut body = self.event.body.clone();
        if let Some(id) = id {
            body.insert("delivery_id".into(), id.into());
        }
        let body = match serde_json::to_vec(&body) {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(%error, "cannot write a notification's body");
                return;
            }
        };
        let attempts = self.settings.attempts.max(1);
        let mut progress = DeliveryProgress {
            state: DeliveryState::Pending.as_str().into(),
            attempts: 0,
            last_status: None,
            last_error: None,
            updated_at: Utc::now(),
        };
        let mut backoff = self.settings.first_backoff;
        for attempt in 1..=attempts {
            let outcome = self.attempt(&body, id).await;
            progress.attempts = attempt as i32;
            progress.updated_at = Utc::now();
            let last = match outcome {
                Attempt::Delivered(status) => {
                    progress.state = DeliveryState::Delivered.as_str().into();
                    progress.last_status = Some(i32::from(status));
                    progress.last_error = None;
                    true
                }
                Attempt::Retry(status, error) => {
                    progress.last_status = status.map(i32::from);
                    progress.last_error = Some(error);
                    attempt == attempts
                }
                Attempt::GiveUp(status, error) => {
                    progress.last_status = status.map(i32::from);
                    progress.last_error = Some(error);
                    true
                }
            };
            if last && progress.state != DeliveryState::Delivered.as_str() {
                progress.state = DeliveryState::Failed.as_str().into();
                metrics::counter!("augur_notifications_failed_total").increment(1);
                tracing::warn!(
                    study_id = %self.event.study_id,
                    event = self.event.kind.as_str(),
                    error = progress.last_error.as_deref().unwrap_or_default(),
                    "a notification could not be delivered"
                );
            }
            if let Some(id) = id
                && let Err(error) = store.update_delivery(id, &progress).await
            {
                tracing::warn!(%error, delivery = id, "cannot record a notification's attempt");
            }
            if last {
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn attempt(&self, body: &[u8], id: Option<i64>) -> Attempt {
        // A literal address never reaches the resolver: checked here, as the spec's was.
        if let Err(e) = self.settings.hosts.check_url(&self.target.url, "url") {
            return Attempt::GiveUp(None, e.message);
        }
        let mut request = self
            .http
            .post(self.target.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("x-augur-event", self.event.kind.as_str())
            .body(body.to_vec());
        if let Some(id) = id {
            request = request.header("x-augur-delivery", id.to_string());
        }
        if let Some(secret) = &self.target.secret {
            request = request.header(SIGNATURE_HEADER, signature(secret, body));
        }
        match request.send().await {
            Ok(answer) => {
                let status = answer.status();
                let code = status.as_u16();
                if status.is_success() {
                    Attempt::Delivered(code)
                } else if status.is_server_error() || code == 408 || code == 429 {
                    Attempt::Retry(Some(code), format!("answered {status}"))
                } else if status.is_redirection() {
                    Attempt::GiveUp(
                        Some(code),
                        format!("answered {status}: redirects are not followed"),
                    )
                } else {
                    Attempt::GiveUp(Some(code), format!("answered {status}"))
                }
            }
            Err(error) => {
                let why = error_chain(&error);
                if is_refused_address(&error) {
                    Attempt::GiveUp(None, why)
                } else {
                    Attempt::Retry(None, why)
                }
            }
        }
    }
}

/// The error and its causes, on one line (reqwest's own says only "error sending request").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// `sha256=<hex>` of HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    // HMAC takes a key of any length: this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The `text` a Slack incoming webhook shows: one line, with `&`, `<` and `>` escaped as
/// Slack asks (a name is not a link).
fn slack_text(kind: NotificationEvent, news: &StudyNews, trial: Option<&TrialRecord>) -> String {
    let study = format!(
        "study {} ({})",
        news.study_id,
        slack_escape(&news.study_name)
    );
    let reason = news
        .state_reason
        .as_deref()
        .map(|r| format!(": {}", slack_escape(r)))
        .unwrap_or_default();
    match (kind, trial) {
        (NotificationEvent::StudyCompleted, _) => format!("Augur: {study} completed{reason}"),
        (NotificationEvent::StudyFailed, _) => format!("Augur: {study} failed{reason}"),
        (NotificationEvent::TrialFailed, Some(t)) => format!(
            "Augur: trial {} of {study} failed: {}",
            t.id,
            slack_escape(t.fail_reason.as_deref().unwrap_or("no reason given"))
        ),
        (NotificationEvent::BestImproved, Some(t)) => {
            let metrics = t
                .final_measurement
                .as_ref()
                .map(|m| {
                    m.metrics
                        .iter()
                        .map(|(k, v)| format!("{}={v}", slack_escape(k)))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            format!(
                "Augur: trial {} is the new best of {study}: {metrics}",
                t.id
            )
        }
        (kind, None) => format!("Augur: {study}: {}", kind.as_str()),
    }
}

fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_the_body_in_hex() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_unless_allowed() {
        use reqwest::dns::Resolve;
        let strict = CheckedResolver {
            hosts: NotifyHosts::default(),
        };
        let refused = strict.resolve("localhost".parse().expect("name")).await;
        let error = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("--notify-allow-hosts"), "{error}");
        let allowing = CheckedResolver {
            hosts: NotifyHosts::allowing(["localhost".to_string()]),
        };
        let found = allowing.resolve("localhost".parse().expect("name")).await;
        assert!(found.is_ok_and(|mut a| a.next().is_some()));
    }

    #[tokio::test]
    async fn a_call_to_a_name_for_loopback_fails_before_connecting_and_says_why() {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let http = http_client(&NotifySettings::default()).expect("client");
        let sent = http
            .post(format!("http://localhost:{port}/hook"))
            .send()
            .await;
        let error = sent.expect_err("refused");
        assert!(is_refused_address(&error), "{}", error_chain(&error));
        assert!(error_chain(&error).contains("--notify-allow-hosts"));
    }

    #[test]
    fn slack_text_escapes_what_slack_would_read_as_markup() {
        assert_eq!(slack_escape("a <b> & c"), "a &lt;b&gt; &amp; c");
    }
}
