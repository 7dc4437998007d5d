//! The CLI's HTTP client: the commands that talk to a server (`study`, `trial`, `worker`)
//! go through it. API errors come back as `CliError::Api` with the server's code and field.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::error::{CliError, CliResult};
use crate::dispatch::reporter::OUTAGE_PATIENCE;
use crate::model::StudyId;
use crate::model::request::{STUDY_REPLICA_HEADER, is_loopback_host, study_changed_by};

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Ride out an outage: a 503 or 429 (after its `Retry-After`), a 500 `unanswered` (a
    /// change caught in its commit) and a dropped connection are tried again, backing off,
    /// for up to `OUTAGE_PATIENCE`. For `augur worker`, whose every call is safe to repeat
    /// (a completion sent twice is refused the second time, which it takes as done);
    /// `study create` is not.
    patient: bool,
    /// The study owners replicas named, and those that could not be reached.
    owners: Mutex<Owners>,
}

#[derive(Default)]
struct Owners {
    /// Studies whose owner a replica named in its answer to a change (`augur-study-replica`):
    /// their next changes go there, saving the hop. Reads stay on `base`.
    by_study: HashMap<StudyId, String>,
    /// Owners that refused a connection (unreachable from here, e.g. pod addresses behind a
    /// balancer): never followed again by this client.
    unreachable: HashSet<String>,
}

impl Client {
    /// A client of the server at `url`; `ca_cert` (PEM) is trusted besides the system's
    /// roots, for an https server with a certificate of its own.
    pub fn new(url: &str, token: Option<&str>, ca_cert: Option<&Path>) -> CliResult<Self> {
        let base = url.trim_end_matches('/').to_string();
        url::Url::parse(&base)
            .map_err(|e| CliError::Usage(format!("invalid --url {url:?}: {e}")))?;
        crate::serve::install_tls_provider();
        let mut builder = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            // Well below the server's idle timeout (120 s by default), after which it closes a
            // kept-alive connection: a pooled one is never picked just as the server does.
            .pool_idle_timeout(std::time::Duration::from_secs(5))
            // A replica named as a study's owner may be unreachable from here: give up on it
            // quickly (and use `base`).
            .connect_timeout(std::time::Duration::from_secs(5));
        if let Some(path) = ca_cert {
            let pem = std::fs::read(path).map_err(|e| CliError::file(path, e))?;
            let cert = reqwest::Certificate::from_pem(&pem).map_err(|e| CliError::file(path, e))?;
            builder = builder.tls_certs_merge([cert]);
        }
        let http = builder
            .build()
            .map_err(|e| CliError::Connection(format!("cannot build HTTP client: {e}")))?;
        Ok(Self {
            http,
            base,
            token: token.map(str::to_string),
            patient: false,
            owners: Mutex::default(),
        })
    }

    /// The same client (its connections shared), calling with `token` instead of its own:
    /// a pool worker reports to a leased trial with the trial's token.
    pub fn with_token(&self, token: &str) -> Client {
        Client {
            http: self.http.clone(),
            base: self.base.clone(),
            token: Some(token.to_string()),
            patient: self.patient,
            owners: Mutex::default(),
        }
    }

    /// The same client, retrying through outages (see `patient`).
    pub fn patient(mut self) -> Self {
        self.patient = true;
        self
    }

    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> CliResult<Value> {
        let (status, value) = self.call_status(method, path, body).await?;
        if status.is_success() {
            return Ok(value);
        }
        let err = &value["error"];
        Err(CliError::Api {
            status: status.as_u16(),
            code: err["code"].as_str().unwrap_or("unknown").to_string(),
            message: err["message"].as_str().unwrap_or("error").to_string(),
            field: err["field"].as_str().map(str::to_string),
        })
    }

    /// The status and JSON body (`null` when empty), errors included.
    pub async fn call_status(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> CliResult<(StatusCode, Value)> {
        let started = std::time::Instant::now();
        let mut wait = std::time::Duration::from_millis(200);
        loop {
            let answer = self.call_once(method.clone(), path, body).await;
            let retry_after = match &answer {
                Ok((status, _, retry_after))
                    if *status == StatusCode::SERVICE_UNAVAILABLE
                        || *status == StatusCode::TOO_MANY_REQUESTS =>
                {
                    Some((retry_after.unwrap_or(wait), status.as_str()))
                }
                Ok((status, body, _))
                    if *status == StatusCode::INTERNAL_SERVER_ERROR
                        && body["error"]["code"] == "unanswered" =>
                {
                    Some((wait, "500 unanswered"))
                }
                Err(CliError::Connection(_)) => Some((wait, "no connection")),
                _ => None,
            };
            match retry_after {
                Some((pause, why)) if self.patient && started.elapsed() < OUTAGE_PATIENCE => {
                    tracing::warn!(%path, why, ?pause, "no answer to act on; trying again");
                    tokio::time::sleep(pause).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(5));
                }
                _ => return answer.map(|(status, value, _)| (status, value)),
            }
        }
    }

    /// One request: the status, the JSON body and the `Retry-After` the server asked for.
    /// A change of a study whose owner a replica named goes to the owner; if it refuses the
    /// connection (nothing was sent), to `base` instead.
    async fn call_once(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> CliResult<(StatusCode, Value, Option<std::time::Duration>)> {
        let study = study_changed_by(method.as_str(), path);
        let owner = study.and_then(|s| self.owner_of(s));
        let mut sent_to = owner.as_deref().unwrap_or(&self.base);
        let mut sent = self.send(sent_to, &method, path, body).await;
        if let (Err(e), Some(study), Some(owner)) = (&sent, study, &owner)
            && e.is_connect()
        {
            tracing::debug!(%owner, error = %e, "study's replica unreachable; using --url");
            self.unreachable(study, owner);
            sent_to = &self.base;
            sent = self.send(sent_to, &method, path, body).await;
        }
        let response = sent.map_err(|e| {
            if let Some(why) = tls_refusal(&e) {
                return CliError::Untrusted(format!(
                    "the server at {sent_to} was refused at the TLS handshake ({why}): give its \
                     certificate, or its CA's, with --ca-cert (AUGUR_CA_CERT)"
                ));
            }
            CliError::Connection(if e.is_connect() || e.is_timeout() {
                format!("cannot reach the Augur server at {sent_to} (is `augur serve` running? set --url or AUGUR_URL)")
            } else {
                format!("request to {sent_to} failed: {e}")
            })
        })?;
        if let (Some(study), Some(owner)) = (study, response.headers().get(STUDY_REPLICA_HEADER)) {
            self.follow(study, owner.to_str().unwrap_or_default());
        }
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|secs| std::time::Duration::from_secs(secs.clamp(1, 60)));
        let text = response
            .text()
            .await
            .map_err(|e| CliError::Connection(format!("reading the server's answer: {e}")))?;
        if status == StatusCode::NO_CONTENT || text.is_empty() {
            return Ok((status, Value::Null, retry_after));
        }
        match serde_json::from_str(&text) {
            Ok(value) => Ok((status, value, retry_after)),
            // Logs and metrics are text.
            Err(_) if status.is_success() => Ok((status, Value::String(text), retry_after)),
            Err(_) => Err(CliError::Connection(format!(
                "the server answered {status} with a body that is not JSON"
            ))),
        }
    }

    async fn send(
        &self,
        base: &str,
        method: &Method,
        path: &str,
        body: Option<&Value>,
    ) -> reqwest::Result<reqwest::Response> {
        let mut request = self.http.request(method.clone(), format!("{base}{path}"));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send().await
    }

    /// Where `study`'s changes go, when a replica named its owner.
    fn owner_of(&self, study: StudyId) -> Option<String> {
        self.owners.lock().ok()?.by_study.get(&study).cloned()
    }

    /// A replica named `study`'s owner: send its changes there from now on, unless the URL
    /// is not one to send this client's token to (see [`follows`]) or refused us before.
    fn follow(&self, study: StudyId, owner: &str) {
        let owner = owner.trim_end_matches('/');
        if !follows(&self.base, owner) {
            return;
        }
        if let Ok(mut owners) = self.owners.lock()
            && !owners.unreachable.contains(owner)
        {
            owners.by_study.insert(study, owner.to_string());
        }
    }

    /// `owner`, named for `study`, refused a connection: back to `base`, for good.
    fn unreachable(&self, study: StudyId, owner: &str) {
        if let Ok(mut owners) = self.owners.lock() {
            owners.by_study.remove(&study);
            owners.unreachable.insert(owner.to_string());
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Every trial of a study, following pages.
    pub async fn all_trials(&self, id: StudyId) -> CliResult<Vec<Value>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut path = format!("/v1/studies/{id}/trials?page_size=1000");
            if let Some(t) = &token {
                path.push_str(&format!("&page_token={t}"));
            }
            let page = self.call(Method::GET, &path, None).await?;
            if let Some(trials) = page["trials"].as_array() {
                out.extend(trials.iter().cloned());
            }
            match page["next_page_token"].as_str() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok(out),
            }
        }
    }
}

/// The TLS refusal behind a failed request (an untrusted certificate, or one for another
/// name), if that is what it was.
fn tls_refusal(e: &reqwest::Error) -> Option<String> {
    use tokio_rustls::rustls::Error as TlsError;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(tls) = err.downcast_ref::<TlsError>() {
            return Some(tls.to_string());
        }
        // rustls' error travels inside io::Errors (nested), whose `source` skips it.
        source = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

/// Whether a client of `base` follows a replica that names `owner`: an http(s) URL with no
/// credentials in it, and https if `base` is (a token sent over TLS is never sent in the
/// clear to the replica a server named). A loopback owner only from a loopback `base`:
/// replicas on one host may name `http://127.0.0.1:…`, which from another machine is that
/// machine's own port, perhaps another server with a study of the same id.
fn follows(base: &str, owner: &str) -> bool {
    let (Ok(base), Ok(owner)) = (url::Url::parse(base), url::Url::parse(owner)) else {
        return false;
    };
    let scheme_ok = match base.scheme() {
        "https" => owner.scheme() == "https",
        _ => matches!(owner.scheme(), "http" | "https"),
    };
    let loopback = |url: &url::Url| url.host_str().is_some_and(is_loopback_host);
    scheme_ok
        && owner.host().is_some()
        && (!loopback(&owner) || loopback(&base))
        && owner.username().is_empty()
        && owner.password().is_none()
        && owner.query().is_none()
        && owner.fragment().is_none()
}

#[cfg(test)]
mod tests {
    use super::follows;

    #[test]
    fn a_named_owner_is_followed_only_without_a_downgrade() {
        assert!(follows("http://balancer:8080", "http://10.0.0.7:8080"));
        assert!(follows("http://balancer:8080", "https://10.0.0.7:8443"));
        assert!(follows("https://augur.example", "https://10.0.0.7:8443"));
        // Replicas on one host: loopback owners, followed from that host only.
        assert!(follows("http://127.0.0.1:8080", "http://127.0.0.1:8081"));
        assert!(follows("http://localhost:8080", "http://[::1]:8081"));
        for elsewhere in [
            "http://127.0.0.1:8081",
            "http://127.9.9.9:8081",
            "http://localhost:8081",
            "http://LocalHost.:8081",
            "http://[::1]:8081",
        ] {
            assert!(
                !follows("http://augur.example:8080", elsewhere),
                "{elsewhere}"
            );
        }
        for bad in [
            "http://10.0.0.7:8080",
            "ftp://10.0.0.7",
            "not a url",
            "https://user:pw@10.0.0.7",
            "https://10.0.0.7/?x=1",
            "file:///etc/passwd",
        ] {
            assert!(!follows("https://augur.example", bad), "{bad}");
        }
    }
}
