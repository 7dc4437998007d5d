//! Sending a study's changes to the replica that takes them (`service/replicas.rs` says
//! why, and which replica that is). Only with `--replica-url`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::access::study_changed;
use super::error::ApiError;
use crate::model::StudyId;
use crate::model::request::STUDY_REPLICA_HEADER;
use crate::service::{Peer, Replicas};

/// The header a replica forwards with: the replicas' secret.
pub const REPLICA_HEADER: &str = "x-augur-replica";
/// How long a forwarder waits for the owner to accept a connection before serving the
/// request itself.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A study whose changes overlapped here is routed for this long after they last did.
const HOT_FOR: Duration = Duration::from_secs(10);
/// Past this many studies tracked, the cold ones are forgotten.
const PRUNE_AT: usize = 10_000;

/// Put in a request's extensions by auth when another replica forwarded it.
#[derive(Clone, Copy)]
pub struct FromPeer;

/// This replica's routing: the live replicas and a client to reach them.
///
/// A change is any request but GET, HEAD and OPTIONS under `/v1/studies/{study}`. Only a
/// study whose changes overlap is routed: one that has two changes in flight at this
/// replica at once, and for `HOT_FOR` after it last had. A study with one client at a time
/// never meets itself on another replica, and sending its changes on would only add a hop
/// (measured: 100 studies with one client each lost a fifth of their rate to it); a study
/// with many clients behind a balancer takes turns on its row lock across replicas unless
/// its changes go to one of them. The replica a client reached checks the request first (the browser guard, the token, its
/// role, the rate limit) and then, if another replica owns the study, sends it on with the
/// replicas' secret in `x-augur-replica` and relays the answer. The owner checks the token
/// again (handlers need the caller), skips the rate limit (already taken) and never sends a
/// forwarded request further. If the owner refuses the connection, the request is served
/// here (the study's row lock keeps that correct); if it fails after it was sent, whether
/// the change was applied is unknown, and most changes are not safe to apply twice: the
/// client gets `500` with code `unanswered` (not `503`, which says nothing was done).
///
/// Every answer to a change of a study another replica owns, forwarded or served here,
/// names the owner in `augur-study-replica`: a client that follows it (ours do) sends the
/// study's next changes straight there and saves the hop, which is most of what a second
/// replica costs one busy study on a small machine (docs/scaling.md), and a client that
/// started while the study was quiet joins the others at its owner. The owner's URL is the
/// one this replica already sends the client's token to.
#[derive(Clone)]
pub struct Forwarder {
    replicas: Arc<Replicas>,
    http: reqwest::Client,
    body_limit: usize,
    overlaps: Overlaps,
}

/// Which studies' changes overlap at this replica.
#[derive(Clone, Default)]
struct Overlaps(Arc<Mutex<HashMap<StudyId, Heat>>>);

/// A study's changes at this replica: how many are in flight, and until when it is routed.
#[derive(Default)]
struct Heat {
    in_flight: u32,
    hot_until: Option<Instant>,
}

/// One change of a study in flight here; counted down when dropped.
struct InFlight {
    overlaps: Overlaps,
    study: StudyId,
}

impl Overlaps {
    /// Count a change of `study` in flight here (until the guard drops) and say whether
    /// the study's changes overlap (now, or within `HOT_FOR` of when they last did).
    fn enter(&self, study: StudyId, now: Instant) -> (InFlight, bool) {
        let guard = InFlight {
            overlaps: self.clone(),
            study,
        };
        let Ok(mut heat) = self.0.lock() else {
            return (guard, false);
        };
        if heat.len() >= PRUNE_AT {
            heat.retain(|_, h| h.in_flight > 0 || h.hot_until.is_some_and(|t| t > now));
        }
        let entry = heat.entry(study).or_default();
        entry.in_flight += 1;
        if entry.in_flight >= 2 {
            entry.hot_until = Some(now + HOT_FOR);
        }
        let hot = entry.hot_until.is_some_and(|t| t > now);
        (guard, hot)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut heat) = self.overlaps.0.lock()
            && let Some(study) = heat.get_mut(&self.study)
        {
            study.in_flight = study.in_flight.saturating_sub(1);
        }
    }
}

/// Why no client for the other replicas could be made.
#[derive(Debug, thiserror::Error)]
pub enum ForwarderError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Certificate {
        path: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("cannot build the replicas' HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

impl Forwarder {
    /// `trust`: a PEM certificate to trust besides the system's roots (the replicas'
    /// own `--tls-cert`, when they serve HTTPS with a certificate of their own).
    pub fn new(
        replicas: Arc<Replicas>,
        body_limit: usize,
        trust: Option<&Path>,
    ) -> Result<Self, ForwarderError> {
        crate::serve::install_tls_provider();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // Well below the replicas' idle timeout (120 s by default), after which the owner
            // closes a kept-alive connection: a pooled one is never picked just as it does.
            .pool_idle_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = trust {
            let shown = path.display().to_string();
            let pem = std::fs::read(path).map_err(|source| ForwarderError::Read {
                path: shown.clone(),
                source,
            })?;
            let cert = reqwest::Certificate::from_pem(&pem).map_err(|source| {
                ForwarderError::Certificate {
                    path: shown,
                    source,
                }
            })?;
            builder = builder.tls_certs_merge([cert]);
        }
        let http = builder.build().map_err(ForwarderError::Client)?;
        Ok(Self {
            replicas,
            http,
            body_limit,
            overlaps: Overlaps::default(),
        })
    }

    /// Whether a request carries the replicas' secret.
    pub fn is_from_peer(&self, headers: &HeaderMap) -> bool {
        headers
            .get(REPLICA_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| self.replicas.is_secret(v))
    }
}

/// Middleware (inside auth): serve the request here, or send it to the study's owner.
pub async fn to_study_owner(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(forwarder) = state.forwarder.as_ref() else {
        return next.run(request).await;
    };
    if request.extensions().get::<FromPeer>().is_some() {
        return next.run(request).await;
    }
    // Decided by the matched route, not the raw path: a change under `/v1/studies/{study}`.
    let changed = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .and_then(|m| study_changed(request.method(), m.as_str(), request.uri().path()));
    let Some(study) = changed else {
        return next.run(request).await;
    };
    // Counted while it is served, here or by the owner.
    let (_in_flight, overlapping) = forwarder.overlaps.enter(study, Instant::now());
    let Some(owner) = forwarder.replicas.owner(study) else {
        return next.run(request).await;
    };
    if !overlapping {
        // Served here, without a hop; a client that follows the owner named goes there.
        let mut response = next.run(request).await;
        name_owner(&mut response, &owner);
        return response;
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, forwarder.body_limit).await {
        Ok(body) => body,
        Err(_) => return ApiError::PayloadTooLarge.into_response(),
    };
    match forward(forwarder, &owner, &parts, body.clone()).await {
        Ok(mut response) => {
            metrics::counter!("augur_forwarded_requests_total", "outcome" => "forwarded")
                .increment(1);
            name_owner(&mut response, &owner);
            response
        }
        Err(Failure::Unreachable(error)) => {
            tracing::warn!(owner = %owner.url, %error, "replica unreachable; serving its study here");
            metrics::counter!("augur_forwarded_requests_total", "outcome" => "served_here")
                .increment(1);
            forwarder.replicas.mark_down(&owner);
            next.run(Request::from_parts(parts, Body::from(body))).await
        }
        Err(Failure::Lost(error)) => {
            tracing::warn!(owner = %owner.url, %error, "forwarded request lost");
            metrics::counter!("augur_forwarded_requests_total", "outcome" => "lost").increment(1);
            ApiError::Unanswered(format!(
                "the replica serving this study took the change and its answer was lost \
                 ({error}); whether it was applied is unknown"
            ))
            .into_response()
        }
    }
}

/// Name the study's owner in an answer given by another replica: clients that follow it
/// send the study's next changes there themselves, saving the hop (the owner checks them as
/// it checks any client's).
fn name_owner(response: &mut Response, owner: &Peer) {
    if let Ok(url) = HeaderValue::from_str(&owner.url) {
        response.headers_mut().insert(STUDY_REPLICA_HEADER, url);
    }
}

enum Failure {
    /// Not sent: the owner did not accept a connection.
    Unreachable(reqwest::Error),
    /// Sent, and no whole answer came back: it may or may not have been applied.
    Lost(reqwest::Error),
}

async fn forward(
    forwarder: &Forwarder,
    owner: &Peer,
    parts: &axum::http::request::Parts,
    body: Bytes,
) -> Result<Response, Failure> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("{}{path}", owner.url.trim_end_matches('/'));
    let mut headers = parts.headers.clone();
    strip_hop_by_hop(&mut headers);
    // The guard has judged the client's origin here; the owner sees a replica, not a page.
    headers.remove(header::ORIGIN);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    // The secret is hex, always a valid header value; were it not, the owner would see no
    // secret and treat the request as a client's.
    if let Ok(secret) = HeaderValue::from_str(forwarder.replicas.secret()) {
        headers.insert(REPLICA_HEADER, secret);
    }
    let sent = forwarder
        .http
        .request(parts.method.clone(), url)
        .headers(headers)
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) if e.is_connect() => return Err(Failure::Unreachable(e)),
        Err(e) => return Err(Failure::Lost(e)),
    };
    let status = answer.status();
    let mut headers = answer.headers().clone();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    let body = answer.bytes().await.map_err(Failure::Lost)?;
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Ok(response)
}

/// Headers about one connection, which a proxy must not pass on (RFC 9110 §7.6.1).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_study_is_routed_once_its_changes_overlap_and_for_a_while_after() {
        let overlaps = Overlaps::default();
        let t0 = Instant::now();
        let (first, hot) = overlaps.enter(StudyId::new(1), t0);
        assert!(!hot, "one change alone is served where it arrives");
        let (second, hot) = overlaps.enter(StudyId::new(1), t0);
        assert!(hot, "a second change while the first is in flight");
        let (_other, hot) = overlaps.enter(StudyId::new(2), t0);
        assert!(!hot, "another study is not affected");
        drop((first, second));
        let (_, hot) = overlaps.enter(StudyId::new(1), t0 + HOT_FOR / 2);
        assert!(hot, "still routed after the overlap ended");
        let (_, hot) = overlaps.enter(StudyId::new(1), t0 + HOT_FOR + Duration::from_millis(1));
        assert!(
            !hot,
            "cold again once HOT_FOR has passed without an overlap"
        );
    }
}
