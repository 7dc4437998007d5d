//! Notes, tags and user attributes of studies and trials: written beside the trials, never
//! through a study's lock, since the optimizer reads none of them and any state may have
//! them (a finished study gets its note afterwards).

use std::collections::BTreeMap;

use chrono::Utc;

use super::{Caller, Service, ServiceError, ServiceResult};
use crate::model::annotations::MAX_USER_ATTRS;
use crate::model::{AnnotationUpdate, Annotations, StudyId, TrialId};

impl Service {
    /// The annotations of every trial of a study that has some, by trial id.
    pub async fn trial_annotations(
        &self,
        study_id: StudyId,
    ) -> ServiceResult<BTreeMap<TrialId, Annotations>> {
        Ok(self
            .store
            .annotations(study_id, TrialId::new(1), TrialId::new(i64::MAX))
            .await?)
    }

    /// Change a study's note, tags or user attributes: its creator's or an admin's.
    pub async fn annotate_study(
        &self,
        actor: &Caller,
        study_id: StudyId,
        update: AnnotationUpdate,
    ) -> ServiceResult<()> {
        let update = update.validate()?;
        if actor.trial_scope.is_some() {
            return Err(ServiceError::denied(
                "a trial's token may not change its study",
            ));
        }
        self.check_manager(actor, study_id).await?;
        self.write_annotations(study_id, TrialId::STUDY, &update)
            .await?;
        let detail = serde_json::to_string(&update).ok();
        self.audit(actor, "study.annotate", Some(study_id), None, detail)
            .await;
        Ok(())
    }

    /// Change a trial's note, tags or user attributes. The study's creator or an admin may
    /// change them all; whoever may report to the trial (its own token, a worker holding
    /// it) may set its user attributes, as training code does beside its metrics.
    pub async fn annotate_trial(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        update: AnnotationUpdate,
    ) -> ServiceResult<()> {
        let update = update.validate()?;
        if update.only_user_attrs() {
            self.check_reporter(actor, study_id, Some(trial_id)).await?;
        } else if actor.trial_scope.is_some() {
            let field = if update.note.is_some() {
                "note"
            } else {
                "tags"
            };
            return Err(ServiceError::PermissionDenied {
                message: "a trial's token may set its user_attrs, not its note or tags".into(),
                field: Some(field.into()),
            });
        } else {
            self.check_manager(actor, study_id).await?;
        }
        self.trial_record(study_id, trial_id).await?;
        self.write_annotations(study_id, trial_id, &update).await?;
        // Training code sets user attributes as often as it reports: like measurements, those
        // are not audited; a person's note or tags are.
        if !update.only_user_attrs() {
            let detail = serde_json::to_string(&update).ok();
            self.audit(
                actor,
                "trial.annotate",
                Some(study_id),
                Some(trial_id),
                detail,
            )
            .await;
        }
        Ok(())
    }

    async fn write_annotations(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
        update: &AnnotationUpdate,
    ) -> ServiceResult<()> {
        if update.is_empty() {
            return Ok(());
        }
        let written = self
            .store
            .annotate(study_id, trial_id, update, MAX_USER_ATTRS, Utc::now())
            .await?;
        if written {
            Ok(())
        } else {
            Err(ServiceError::invalid(
                "user_attrs",
                format!("at most {MAX_USER_ATTRS} user attributes on one study or trial"),
            ))
        }
    }
}
