//! Notifications: the webhooks a study (`notifications` in its spec) or the server
//! (`--notify-url`) calls when a study ends or fails, a trial fails, or a better trial is
//! found; the spec's form, its validation, and which hosts a webhook may reach.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ValidationError;
use crate::model::TrialId;

/// Webhooks one study may name.
pub const MAX_NOTIFICATIONS: usize = 8;
/// The longest webhook URL, in bytes.
pub const MAX_URL_LEN: usize = 2048;
/// The longest secret, in bytes.
pub const MAX_SECRET_LEN: usize = 256;
/// What the API shows in place of a secret. A spec that gives it as its secret (a spec read
/// back and sent again) is refused: the real secret must be given.
pub const REDACTED_SECRET: &str = "[redacted]";

/// What a webhook is called for.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum NotificationEvent {
    /// The study completed (its budget spent, or study-level stopping ended it).
    StudyCompleted,
    /// The study failed (`max_failed_trials`, `fail_fast_trials`).
    StudyFailed,
    /// A trial failed.
    TrialFailed,
    /// A completed trial became the study's best (one objective; see README).
    BestImproved,
}

impl NotificationEvent {
    pub const ALL: [NotificationEvent; 4] = [
        NotificationEvent::StudyCompleted,
        NotificationEvent::StudyFailed,
        NotificationEvent::TrialFailed,
        NotificationEvent::BestImproved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotificationEvent::StudyCompleted => "study_completed",
            NotificationEvent::StudyFailed => "study_failed",
            NotificationEvent::TrialFailed => "trial_failed",
            NotificationEvent::BestImproved => "best_improved",
        }
    }

    /// The event named `name` (`study_completed`, …).
    pub fn parse(name: &str) -> Option<NotificationEvent> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }
}

fn all_events() -> Vec<NotificationEvent> {
    NotificationEvent::ALL.to_vec()
}

/// A webhook as a spec names it. Unknown fields are rejected.
#[derive(Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NotificationSpec {
    /// An `http://` or `https://` URL; redirects are not followed.
    pub url: String,
    /// What it is called for; every event when absent.
    #[serde(default = "all_events")]
    pub events: Vec<NotificationEvent>,
    /// Signs each body (HMAC-SHA256, header `X-Augur-Signature: sha256=<hex>`); unsigned
    /// when absent. Shown as `[redacted]` when the study is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

// By hand: a spec printed in a log must not print its secret.
impl std::fmt::Debug for NotificationSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotificationSpec")
            .field("url", &self.url)
            .field("events", &self.events)
            .field("secret", &self.secret.as_ref().map(|_| REDACTED_SECRET))
            .finish()
    }
}

/// A validated webhook: where, for what, signed with what.
#[derive(Clone, PartialEq)]
pub struct NotificationTarget {
    pub url: url::Url,
    pub events: BTreeSet<NotificationEvent>,
    pub secret: Option<String>,
}

impl std::fmt::Debug for NotificationTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotificationTarget")
            .field("url", &self.url.as_str())
            .field("events", &self.events)
            .field("secret", &self.secret.as_ref().map(|_| REDACTED_SECRET))
            .finish()
    }
}

impl NotificationSpec {
    /// This webhook, checked; `field` is its path (`notifications[0]`). The hosts it may
    /// reach are the server's to decide: see [`NotifyHosts::check_url`].
    pub fn validate(&self, field: &str) -> Result<NotificationTarget, ValidationError> {
        let url = parse_url(&self.url, &format!("{field}.url"))?;
        if self.events.is_empty() {
            return Err(ValidationError::new(
                format!("{field}.events"),
                "name at least one event (or leave events out for all of them)",
            ));
        }
        let mut events = BTreeSet::new();
        for (i, event) in self.events.iter().enumerate() {
            if !events.insert(*event) {
                return Err(ValidationError::new(
                    format!("{field}.events[{i}]"),
                    format!("{} is named twice", event.as_str()),
                ));
            }
        }
        if let Some(secret) = &self.secret {
            check_secret(secret, &format!("{field}.secret"))?;
        }
        Ok(NotificationTarget {
            url,
            events,
            secret: self.secret.clone(),
        })
    }

    /// The same webhook with its secret hidden, as the API shows it.
    pub fn redacted(&self) -> NotificationSpec {
        NotificationSpec {
            secret: self.secret.as_ref().map(|_| REDACTED_SECRET.to_string()),
            ..self.clone()
        }
    }
}

/// A webhook's URL: absolute, `http` or `https`, with a host, no longer than
/// [`MAX_URL_LEN`].
pub fn parse_url(raw: &str, field: &str) -> Result<url::Url, ValidationError> {
    if raw.len() > MAX_URL_LEN {
        return Err(ValidationError::new(
            field,
            format!("must be at most {MAX_URL_LEN} bytes"),
        ));
    }
    let url = url::Url::parse(raw)
        .map_err(|e| ValidationError::new(field, format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ValidationError::new(
            field,
            format!(
                "must be an http:// or https:// URL, not {}://",
                url.scheme()
            ),
        ));
    }
    if url.host().is_none() {
        return Err(ValidationError::new(field, "must name a host"));
    }
    Ok(url)
}

/// A secret: 1 to [`MAX_SECRET_LEN`] bytes, not the redaction marker.
pub fn check_secret(secret: &str, field: &str) -> Result<(), ValidationError> {
    if secret.is_empty() || secret.len() > MAX_SECRET_LEN {
        return Err(ValidationError::new(
            field,
            format!("must be 1-{MAX_SECRET_LEN} bytes (or leave it out: unsigned)"),
        ));
    }
    if secret == REDACTED_SECRET {
        return Err(ValidationError::new(
            field,
            "is the marker the API shows in place of a secret: give the real secret",
        ));
    }
    Ok(())
}

/// Whose webhook a delivery went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryTarget {
    /// One of the study's `notifications`.
    Study,
    /// The server's default (`--notify-url`), for studies that name none.
    Server,
}

impl DeliveryTarget {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryTarget::Study => "study",
            DeliveryTarget::Server => "server",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryTarget> {
        [DeliveryTarget::Study, DeliveryTarget::Server]
            .into_iter()
            .find(|t| t.as_str() == s)
    }
}

/// How a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Being sent, or waiting to be tried again.
    Pending,
    /// A 2xx answer came.
    Delivered,
    /// Given up: every attempt failed, or the target was refused.
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryState> {
        [
            DeliveryState::Pending,
            DeliveryState::Delivered,
            DeliveryState::Failed,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
    }
}

/// One webhook call of a study: an event sent to one URL, and how its attempts went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NotificationDelivery {
    /// Increasing: the order the events happened in.
    pub id: i64,
    pub event: NotificationEvent,
    /// The trial the event is about (`trial_failed`, `best_improved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<i64>)]
    pub trial_id: Option<TrialId>,
    pub target: DeliveryTarget,
    /// Where it was sent; for the server's default, its origin only (its path may hold a
    /// token, as Slack's do).
    pub url: String,
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempts: u32,
    /// The last answer's HTTP status, if an answer came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    /// Why the last attempt failed (no answer, a non-2xx status, a refused address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Which hosts a webhook may reach: any but loopback, link-local and unspecified
/// addresses (and `localhost`), unless the operator lists the host
/// (`--notify-allow-hosts`, names or addresses as a URL writes them).
///
/// Why: a study's spec must not make the server call its own internals. The rule is asked
/// twice: on the URL as
/// written when a spec is validated, and on the addresses its host resolves to at each send
/// (`service/notifications.rs`), so that a name that later resolves to 127.0.0.1 is refused
/// too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyHosts {
    allowed: BTreeSet<String>,
}

impl NotifyHosts {
    /// `hosts` allowed whatever they resolve to (`127.0.0.1`, `::1`, `hooks.internal`).
    pub fn allowing(hosts: impl IntoIterator<Item = String>) -> Self {
        Self {
            allowed: hosts
                .into_iter()
                .map(|h| normalized_host(h.trim()))
                .filter(|h| !h.is_empty())
                .collect(),
        }
    }

    /// Whether the operator listed the URL's host.
    pub fn allows(&self, url: &url::Url) -> bool {
        url.host_str()
            .is_some_and(|h| self.allowed.contains(&normalized_host(h)))
    }

    /// The URL as written: refused when its host is a forbidden address or a name for
    /// loopback (`localhost`, `*.localhost`), unless allowed. Names are checked again,
    /// resolved, at each send ([`NotifyHosts::check_resolved`]).
    pub fn check_url(&self, url: &url::Url, field: &str) -> Result<(), ValidationError> {
        if self.allows(url) {
            return Ok(());
        }
        let refused = match url.host() {
            Some(url::Host::Ipv4(ip)) => forbidden_address(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => forbidden_address(IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                (name == "localhost" || name.ends_with(".localhost")).then_some("loopback")
            }
            None => Some("missing"),
        };
        match refused {
            Some(kind) => Err(ValidationError::new(
                field,
                format!(
                    "{} is a {kind} address: a webhook may not call the server's own \
                     network unless the operator allows the host (--notify-allow-hosts)",
                    url.host_str().unwrap_or_default()
                ),
            )),
            None => Ok(()),
        }
    }

    /// An address `host` resolved to: refused when forbidden, unless the host is allowed.
    /// The reason, for the delivery's error.
    pub fn check_resolved(&self, host: &str, address: IpAddr) -> Result<(), String> {
        if self.allowed.contains(&normalized_host(host)) {
            return Ok(());
        }
        match forbidden_address(address) {
            Some(kind) => Err(format!(
                "{host} resolved to {address}, a {kind} address (--notify-allow-hosts allows it)"
            )),
            None => Ok(()),
        }
    }
}

/// A host as compared: lower case, without the brackets of an IPv6 literal or a final dot.
fn normalized_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// Why a webhook may not reach `address` (what kind it is), or `None`. IPv4 addresses
/// written as IPv6 (`::ffff:127.0.0.1`) are judged as IPv4.
pub fn forbidden_address(address: IpAddr) -> Option<&'static str> {
    match address.to_canonical() {
        IpAddr::V4(ip) => {
            if ip.is_loopback() {
                Some("loopback")
            } else if ip.is_link_local() {
                Some("link-local")
            } else if ip.is_unspecified() || ip.octets()[0] == 0 {
                // 0.0.0.0/8, "this network": 0.0.0.0 reaches the local host on Linux.
                Some("unspecified")
            } else if ip == Ipv4Addr::BROADCAST {
                Some("broadcast")
            } else {
                None
            }
        }
        IpAddr::V6(ip) => {
            if ip.is_loopback() {
                Some("loopback")
            } else if ip.is_unspecified() {
                Some("unspecified")
            } else if ip.is_unicast_link_local() {
                Some("link-local")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> NotificationSpec {
        NotificationSpec {
            url: url.into(),
            events: all_events(),
            secret: Some("s3cret".into()),
        }
    }

    #[test]
    fn only_http_and_https_urls_with_a_host_are_accepted() {
        assert!(spec("https://hooks.example.com/x").validate("n").is_ok());
        assert!(spec("http://10.0.0.5:8080/hook").validate("n").is_ok());
        for bad in [
            "file:///etc/passwd",
            "ftp://example.com/",
            "not a url",
            "unix:/x",
        ] {
            let err = spec(bad).validate("notifications[0]").expect_err("refused");
            assert_eq!(err.field, "notifications[0].url", "{bad}: {err}");
        }
    }

    #[test]
    fn events_must_be_named_once_and_not_be_empty() {
        let mut s = spec("https://example.com");
        s.events = vec![];
        assert_eq!(s.validate("n").expect_err("refused").field, "n.events");
        s.events = vec![
            NotificationEvent::TrialFailed,
            NotificationEvent::TrialFailed,
        ];
        assert_eq!(s.validate("n").expect_err("refused").field, "n.events[1]");
    }

    #[test]
    fn a_redacted_or_empty_secret_is_refused_and_the_secret_never_printed() {
        let mut s = spec("https://example.com");
        s.secret = Some(REDACTED_SECRET.into());
        assert_eq!(s.validate("n").expect_err("refused").field, "n.secret");
        s.secret = Some(String::new());
        assert_eq!(s.validate("n").expect_err("refused").field, "n.secret");
        let s = spec("https://example.com");
        assert!(!format!("{s:?}").contains("s3cret"));
        assert_eq!(s.redacted().secret.as_deref(), Some(REDACTED_SECRET));
        let target = s.validate("n").expect("valid");
        assert!(!format!("{target:?}").contains("s3cret"));
    }

    #[test]
    fn loopback_link_local_and_unspecified_hosts_are_refused_unless_allowed() {
        let none = NotifyHosts::default();
        for bad in [
            "http://127.0.0.1:9000/",
            "http://127.8.9.10/",
            "http://[::1]/",
            "http://localhost/",
            "http://api.LOCALHOST./",
            "http://169.254.169.254/latest/meta-data",
            "http://[fe80::1]/",
            "http://0.0.0.0/",
            "http://[::]/",
            "http://[::ffff:127.0.0.1]/",
            "http://2130706433/",
        ] {
            let url = url::Url::parse(bad).expect("url");
            let err = none.check_url(&url, "n.url").expect_err("refused");
            assert_eq!(err.field, "n.url", "{bad}");
        }
        let ok = url::Url::parse("https://hooks.slack.com/services/x").expect("url");
        assert!(none.check_url(&ok, "n.url").is_ok());
        let allowed = NotifyHosts::allowing(["127.0.0.1".to_string(), "[::1]".to_string()]);
        for url in ["http://127.0.0.1:9/", "http://[::1]:9/"] {
            let url = url::Url::parse(url).expect("url");
            assert!(allowed.check_url(&url, "n.url").is_ok(), "{url}");
        }
        let other = url::Url::parse("http://127.0.0.2/").expect("url");
        assert!(allowed.check_url(&other, "n.url").is_err());
    }

    #[test]
    fn resolved_addresses_are_checked_as_literals_are() {
        let none = NotifyHosts::default();
        let host = "rebinding.example";
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert!(none.check_resolved(host, ip("127.0.0.1")).is_err());
        assert!(none.check_resolved(host, ip("169.254.169.254")).is_err());
        assert!(none.check_resolved(host, ip("::ffff:127.0.0.1")).is_err());
        assert!(none.check_resolved(host, ip("93.184.216.34")).is_ok());
        let allowed = NotifyHosts::allowing(["Rebinding.example".to_string()]);
        assert!(allowed.check_resolved(host, ip("127.0.0.1")).is_ok());
    }
}
