//! The audit trail: who created, changed, stopped or deleted what, written after each change
//! commits.

use chrono::Utc;

use super::paging::{page_bounds, split_page};
use super::{Caller, Page, Service, ServiceResult};
use crate::model::{AuditEvent, StudyId, TrialId};
use crate::store::{AuditEntry, AuditRecord};

/// The audit trail: who (a token's name; `open` on an open server) created, changed, stopped
/// or deleted each study, added, excluded, failed or stopped trials, completed another's
/// trials (an admin), asked for a trial's token, created or revoked tokens. What a study's
/// own reporters send by the thousand is not recorded: measurements and heartbeats, the
/// creator's and the trial tokens' own completions (each would cost a write of its own on
/// the ask/tell path), suggestions (the trial names its `client_id`), and what the server's
/// own dispatcher reports.
///
/// An entry is written right after the change it records commits, not in the same
/// transaction: a crash (or a lost database) between the two loses the entry, never the
/// change. Each such loss is logged and counted (`augur_audit_write_failures_total`).
impl Service {
    /// Record that `actor` did `action`.
    pub(super) async fn audit(
        &self,
        actor: &Caller,
        action: &str,
        study_id: Option<StudyId>,
        trial_id: Option<TrialId>,
        detail: Option<String>,
    ) {
        let entry = AuditEntry {
            at: Utc::now(),
            actor: actor.name.clone(),
            action: action.to_string(),
            study_id,
            trial_id,
            detail,
        };
        if let Err(error) = self.store.insert_audit(&entry).await {
            metrics::counter!("augur_audit_write_failures_total").increment(1);
            tracing::error!(%error, actor = %entry.actor, action, ?study_id, ?trial_id, "could not write an audit entry");
        }
    }

    /// Record that `actor` changed a trial's state. The detail is cut to
    /// [`MAX_TRIAL_DETAIL`] bytes: the trail says who did what, the trial keeps the rest.
    pub(super) async fn audit_trial(
        &self,
        actor: &Caller,
        action: &str,
        study_id: StudyId,
        trial_id: TrialId,
        detail: Option<String>,
    ) {
        let detail = detail.map(|d| truncated(d, MAX_TRIAL_DETAIL));
        self.audit(actor, action, Some(study_id), Some(trial_id), detail)
            .await;
    }

    /// The audit trail, oldest first, a page at a time.
    pub async fn audit_events(
        &self,
        page_size: Option<i64>,
        page_token: Option<&str>,
    ) -> ServiceResult<Page<AuditEvent>> {
        let (limit, after) = page_bounds(page_size, page_token)?;
        let records = self.store.list_audit(after, limit + 1).await?;
        let (records, next) = split_page(records, limit, |r| r.id);
        Ok(Page {
            items: records.into_iter().map(audit_event).collect(),
            next_page_token: next,
        })
    }
}

/// The most of a trial change's detail (metrics, a reason) the trail keeps.
const MAX_TRIAL_DETAIL: usize = 512;

/// `s` cut to at most `max` bytes on a character boundary, marked with `…` when cut.
fn truncated(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
    s
}

fn audit_event(r: AuditRecord) -> AuditEvent {
    AuditEvent {
        id: r.id,
        at: r.entry.at,
        actor: r.entry.actor,
        action: r.entry.action,
        study_id: r.entry.study_id,
        trial_id: r.entry.trial_id,
        detail: r.entry.detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_details_are_cut_on_a_character_boundary_and_marked() {
        assert_eq!(truncated("short".into(), 8), "short");
        assert_eq!(truncated("ééé".into(), 3), "é…");
        assert_eq!(truncated("x".repeat(600), MAX_TRIAL_DETAIL).len(), 515);
    }
}
