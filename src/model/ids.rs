//! Study and trial ids as types of their own, so that a trial's id is never passed where a
//! study's is meant. They are plain integers on the wire and in the database; the raw
//! integer is taken out only where one must be written (a URL, a token's name, Optuna's
//! packed trial key, the optimizer's trial number).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A study's id: assigned by the store, from 1.
///
/// Neither id implements `utoipa::ToSchema`, on purpose: an API field of one says
/// `#[schema(value_type = i64)]`, which keeps the OpenAPI contract the integer it always was
/// (a schema of their own would add a component and a `$ref` to it).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, sqlx::Type,
)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct StudyId(i64);

/// A trial's id within its study: trials count from 1 in each study, so a trial id names a
/// trial only together with its [`StudyId`] (a [`TrialKey`]). Trial 0 stands for the study
/// itself where annotations are kept per trial (and is the default: no trial yet).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    sqlx::Type,
)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct TrialId(i64);

impl StudyId {
    pub const fn new(id: i64) -> Self {
        Self(id)
    }

    pub const fn get(self) -> i64 {
        self.0
    }
}

impl TrialId {
    /// Where annotations keep the study's own (notes, tags and user attributes of the
    /// study rather than of one of its trials).
    pub const STUDY: TrialId = TrialId(0);

    pub const fn new(id: i64) -> Self {
        Self(id)
    }

    pub const fn get(self) -> i64 {
        self.0
    }

    /// The id the study's next trial after this one gets.
    pub const fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

/// The raw integer, for where one must be written (a URL, a token's name, a log field).
impl From<StudyId> for i64 {
    fn from(id: StudyId) -> i64 {
        id.0
    }
}

impl From<TrialId> for i64 {
    fn from(id: TrialId) -> i64 {
        id.0
    }
}

/// One trial anywhere: its study and its id within that study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TrialKey {
    pub study: StudyId,
    pub trial: TrialId,
}

impl TrialKey {
    pub const fn new(study: StudyId, trial: TrialId) -> Self {
        Self { study, trial }
    }
}

impl fmt::Display for StudyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for TrialId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// `study/trial`, as logs and errors have always named a trial.
impl fmt::Display for TrialKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.study, self.trial)
    }
}

/// Parsed as the integer it is, with the integer's error: path segments and command-line
/// arguments read exactly as they did when they were `i64`.
impl FromStr for StudyId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

impl FromStr for TrialId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_plain_integers_in_json() {
        let key = (StudyId::new(7), TrialId::new(3));
        assert_eq!(serde_json::to_string(&key).ok().as_deref(), Some("[7,3]"));
        assert_eq!(
            serde_json::from_str::<(StudyId, TrialId)>("[7,3]").ok(),
            Some(key)
        );
    }

    #[test]
    fn ids_parse_and_print_as_integers() {
        assert_eq!("42".parse::<StudyId>(), Ok(StudyId::new(42)));
        assert_eq!(
            "x".parse::<TrialId>().map_err(|e| e.to_string()),
            "x".parse::<i64>()
                .map(TrialId::new)
                .map_err(|e| e.to_string())
        );
        let key = TrialKey::new(StudyId::new(7), TrialId::new(3));
        assert_eq!(key.to_string(), "7/3");
    }
}
