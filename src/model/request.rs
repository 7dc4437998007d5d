//! Request-level values, parsed once at the edge (the API's handlers, the CLI) into types
//! the service takes as they are. Each rejection names the field as the client sent it.

use std::net::IpAddr;

use super::{StudyId, ValidationError};

/// How many trials one `suggest` asks for: 1 to [`SuggestCount::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuggestCount(usize);

impl SuggestCount {
    pub const MAX: usize = 1000;

    pub fn get(self) -> usize {
        self.0
    }
}

impl TryFrom<i64> for SuggestCount {
    type Error = ValidationError;
    fn try_from(count: i64) -> Result<Self, ValidationError> {
        usize::try_from(count)
            .ok()
            .filter(|c| (1..=Self::MAX).contains(c))
            .map(SuggestCount)
            .ok_or_else(|| {
                ValidationError::new("count", format!("must be between 1 and {}", Self::MAX))
            })
    }
}

/// A worker's stable name (`client_id`): 1-256 characters, none of them control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientId(String);

impl ClientId {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl TryFrom<String> for ClientId {
    type Error = ValidationError;
    fn try_from(id: String) -> Result<Self, ValidationError> {
        let length = id.chars().count();
        if !(1..=256).contains(&length) || id.chars().any(char::is_control) {
            return Err(ValidationError::new(
                "client_id",
                "must be 1-256 characters, none of them control characters",
            ));
        }
        Ok(ClientId(id))
    }
}

/// A measurement's step: 0 or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step(i64);

impl Step {
    pub fn get(self) -> i64 {
        self.0
    }
}

impl TryFrom<i64> for Step {
    type Error = ValidationError;
    fn try_from(step: i64) -> Result<Self, ValidationError> {
        if step < 0 {
            return Err(ValidationError::new("step", "must be >= 0"));
        }
        Ok(Step(step))
    }
}

/// The answer header naming the replica that owns a study (its base URL), sent by another
/// replica with its answer to a change of the study: a client may send the study's next
/// changes there itself.
pub const STUDY_REPLICA_HEADER: &str = "augur-study-replica";

/// The study a request changes: any method but GET, HEAD and OPTIONS on `/v1/studies/{id}`
/// or below it. Clients that follow [`STUDY_REPLICA_HEADER`] send such requests to the
/// study's owner; replicas decide it from the matched route (`api::access::study_changed`).
pub fn study_changed_by(method: &str, path: &str) -> Option<StudyId> {
    if ["GET", "HEAD", "OPTIONS"]
        .iter()
        .any(|m| method.eq_ignore_ascii_case(m))
    {
        return None;
    }
    let rest = path.strip_prefix("/v1/studies/")?;
    let id = rest.split(['/', '?']).next()?;
    id.parse().ok().filter(|id: &StudyId| id.get() > 0)
}

/// `localhost`, a name under `.localhost` (RFC 6761: always loopback), or a loopback address,
/// with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // [::1]:8080
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            _ => host,
        },
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outside_one_to_a_thousand_name_the_count_field() {
        for bad in [0, -1, 1001, i64::MAX] {
            assert_eq!(
                SuggestCount::try_from(bad).map_err(|e| e.field),
                Err("count".into())
            );
        }
        assert_eq!(
            SuggestCount::try_from(1000).map(SuggestCount::get),
            Ok(1000)
        );
    }

    #[test]
    fn client_ids_are_short_and_printable() {
        assert!(ClientId::try_from("worker-1/3".to_string()).is_ok());
        for bad in [
            String::new(),
            "x".repeat(257),
            "a\u{1b}[2J".into(),
            "a\nb".into(),
        ] {
            assert_eq!(
                ClientId::try_from(bad).map_err(|e| e.field),
                Err("client_id".into())
            );
        }
    }

    #[test]
    fn steps_are_not_negative() {
        assert!(Step::try_from(0).is_ok());
        assert_eq!(Step::try_from(-1).map_err(|e| e.field), Err("step".into()));
    }

    #[test]
    fn only_changes_under_one_study_name_it() {
        assert_eq!(
            study_changed_by("POST", "/v1/studies/7/suggest"),
            Some(StudyId::new(7))
        );
        assert_eq!(
            study_changed_by("POST", "/v1/studies/7/trials/3/complete"),
            Some(StudyId::new(7))
        );
        assert_eq!(
            study_changed_by("PATCH", "/v1/studies/12"),
            Some(StudyId::new(12))
        );
        assert_eq!(
            study_changed_by("DELETE", "/v1/studies/12"),
            Some(StudyId::new(12))
        );
        assert_eq!(
            study_changed_by("POST", "/v1/studies/12?x=1"),
            Some(StudyId::new(12))
        );
        assert_eq!(study_changed_by("GET", "/v1/studies/7/trials"), None);
        assert_eq!(study_changed_by("head", "/v1/studies/7"), None);
        assert_eq!(study_changed_by("POST", "/v1/studies"), None);
        assert_eq!(study_changed_by("POST", "/v1/studies/"), None);
        assert_eq!(study_changed_by("POST", "/v1/studies/abc/stop"), None);
        assert_eq!(study_changed_by("POST", "/v1/studies/-1/stop"), None);
        assert_eq!(study_changed_by("POST", "/v1/tokens"), None);
    }

    #[test]
    fn loopback_names_are_localhost_and_loopback_addresses_only() {
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "app.localhost:1",
            "127.0.0.1",
            "127.8.9.10:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1:8080",
            "[::2]:80",
            "0.0.0.0",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
