//! What a token may do (DESIGN §3 Auth): each role can do what the one before it can, and
//! more.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::{StudyId, TrialId};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
/// What a token may do (DESIGN §3 Auth). Each role can do what the one before it can, and
/// more: `reader` every GET (the dashboard included); `writer` also ask/tell studies
/// (create, suggest, report) and changing, stopping or deleting its own studies; `operator`
/// also studies with a `trial_job` (commands on Augur's machines); `admin` also tokens, the
/// audit trail and every study. A dispatched trial's token is none of these: it may only
/// report to its own trial.
#[serde(rename_all = "snake_case")]
pub enum Role {
    Reader,
    Writer,
    Operator,
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Reader, Role::Writer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Role::parse(s)
            .ok_or_else(|| format!("{s:?} is not a role: reader, writer, operator or admin"))
    }
}

/// A token of a person or program, as `GET /v1/tokens` and `augur token list` show it (the
/// secret itself is shown once, when it is created).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    pub name: String,
    pub role: Role,
    pub created_at: DateTime<Utc>,
    /// Refused after this; absent: never.
    pub expires_at: Option<DateTime<Utc>>,
    /// Last seen, to within a minute; absent: never used.
    pub last_used_at: Option<DateTime<Utc>>,
}

/// One entry of the audit trail: who (a token's name; `open` on an open server) did what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditEvent {
    /// Increasing: the order things happened in.
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    /// `study.create`, `study.update`, `study.stop`, `study.delete`, `trial.add`,
    /// `trial.exclude`, `trial.include`, `token.create`, `token.revoke`.
    pub action: String,
    #[schema(value_type = Option<i64>)]
    pub study_id: Option<StudyId>,
    #[schema(value_type = Option<i64>)]
    pub trial_id: Option<TrialId>,
    pub detail: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_by_what_they_may_do() {
        assert!(Role::Reader < Role::Writer && Role::Writer < Role::Operator);
        assert!(Role::Operator < Role::Admin);
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
    }
}
