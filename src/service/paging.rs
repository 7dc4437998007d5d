//! Page tokens and change cursors: what a list's next page and a live view's next poll start
//! after.

use super::{ServiceError, ServiceResult};
use crate::model::{StudyId, Trial, TrialId};
use crate::store::ChangeCursor;

/// Page sizes: the default, and the most one request may ask for.
pub const DEFAULT_PAGE_SIZE: i64 = 100;
pub const MAX_PAGE_SIZE: i64 = 1000;

/// A page of a list, with the token of the next page when there is one.
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_page_token: Option<String>,
}

/// Trials changed since a cursor.
#[derive(Debug)]
pub struct Changes {
    pub trials: Vec<Trial>,
    pub cursor: String,
    pub has_more: bool,
}

/// What a list is paged by: the id of its items (a study's, a trial's, an audit entry's),
/// which a page token names as its integer.
pub(super) trait PageKey: Copy + std::fmt::Display {
    fn from_token(id: i64) -> Self;
}

impl PageKey for i64 {
    fn from_token(id: i64) -> Self {
        id
    }
}

impl PageKey for StudyId {
    fn from_token(id: i64) -> Self {
        StudyId::new(id)
    }
}

impl PageKey for TrialId {
    fn from_token(id: i64) -> Self {
        TrialId::new(id)
    }
}

/// `(limit, after id)` of a page request.
pub(super) fn page_bounds<K: PageKey>(
    page_size: Option<i64>,
    page_token: Option<&str>,
) -> ServiceResult<(i64, K)> {
    let limit = page_size.unwrap_or(DEFAULT_PAGE_SIZE);
    if !(1..=MAX_PAGE_SIZE).contains(&limit) {
        return Err(ServiceError::invalid(
            "page_size",
            format!("must be between 1 and {MAX_PAGE_SIZE}"),
        ));
    }
    let after = match page_token {
        None | Some("") => 0,
        Some(token) => token
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ServiceError::invalid("page_token", "not a token from a previous page")
            })?,
    };
    Ok((limit, K::from_token(after)))
}

/// Keep `limit` items; the next page token is the last kept id when more were found.
pub(super) fn split_page<T, K: PageKey>(
    mut items: Vec<T>,
    limit: i64,
    id: impl Fn(&T) -> K,
) -> (Vec<T>, Option<String>) {
    if items.len() as i64 > limit {
        items.truncate(limit as usize);
        let next = items.last().map(|t| id(t).to_string());
        (items, next)
    } else {
        (items, None)
    }
}

/// The position a `/changes` cursor (`change_seq.trial`) names; none = the start.
pub(super) fn parse_cursor(cursor: Option<&str>) -> ServiceResult<ChangeCursor> {
    let start = ChangeCursor {
        change_seq: 0,
        trial: TrialId::new(0),
    };
    match cursor {
        None | Some("") => Ok(start),
        Some(c) => c
            .split_once('.')
            .and_then(|(s, i)| {
                Some(ChangeCursor {
                    change_seq: s.parse().ok()?,
                    trial: i.parse().ok()?,
                })
            })
            .filter(|c| c.change_seq >= 0 && c.trial.get() >= 0)
            .ok_or_else(|| ServiceError::invalid("after", "not a cursor from a previous answer")),
    }
}

/// The `/changes` cursor after `after`.
pub(super) fn format_cursor(after: ChangeCursor) -> String {
    format!("{}.{}", after.change_seq, after.trial)
}

/// The `/changes` cursor past every change up to `change_seq` (e.g. a snapshot's).
pub fn cursor_after_seq(change_seq: i64) -> String {
    format_cursor(ChangeCursor {
        change_seq,
        trial: TrialId::new(i64::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_names_the_after_field() {
        let at = |change_seq, trial| ChangeCursor {
            change_seq,
            trial: TrialId::new(trial),
        };
        assert_eq!(
            parse_cursor(Some(&format_cursor(at(7, 3)))).ok(),
            Some(at(7, 3))
        );
        assert_eq!(parse_cursor(None).ok(), Some(at(0, 0)));
        for bad in ["x", "1", "-1.2", "1.x"] {
            assert!(
                matches!(parse_cursor(Some(bad)), Err(ServiceError::Invalid(e)) if e.field == "after")
            );
        }
    }
}
