//! Studies: create, read, list, stop, change, delete.

use chrono::{SubsecRound, Utc};

use super::paging::{page_bounds, split_page};
use super::state_machine::{Command, Reply};
use super::{Caller, Page, Service, ServiceError, ServiceResult, not_found_study, unexpected};
use crate::model::{
    ParameterExtension, Role, Study, StudyId, StudySpec, StudyState, StudyUpdate, TrialId, TrialKey,
};

impl Service {
    /// A new study, created by `actor`: a study with a `trial_job` runs commands on this
    /// server's machines, so only operators and admins may create one (and its command must
    /// be one the server allows, `--job-commands`).
    pub async fn create_study(&self, actor: &Caller, spec: StudySpec) -> ServiceResult<Study> {
        let spec = self.checked_new_spec(actor, spec).await?;
        let record = self
            .store
            // To the millisecond: the study's directory is named by it (`StudyKey`), and
            // PostgreSQL keeps microseconds, SQLite the nanoseconds.
            .insert_study(&spec, Some(&actor.name), Utc::now().trunc_subsecs(3))
            .await?;
        Ok(self.created_study(actor, record).await)
    }

    /// [`Service::create_study`] for an Optuna study: `None`, and nothing created, when an
    /// Optuna study of its name exists (the store checks and takes the name in one step).
    pub(super) async fn create_optuna_study(
        &self,
        actor: &Caller,
        spec: StudySpec,
    ) -> ServiceResult<Option<Study>> {
        let spec = self.checked_new_spec(actor, spec).await?;
        let record = self
            .store
            .insert_optuna_study(&spec, Some(&actor.name), Utc::now().trunc_subsecs(3))
            .await?;
        Ok(match record {
            Some(record) => Some(self.created_study(actor, record).await),
            None => None,
        })
    }

    /// A new study's spec, seeded and validated, if `actor` may create it.
    async fn checked_new_spec(&self, actor: &Caller, spec: StudySpec) -> ServiceResult<StudySpec> {
        let spec = spec.with_seed(rand::random::<u32>() as u64);
        spec.validate()?;
        self.check_notification_hosts(&spec.notifications)?;
        for (i, prior) in spec.prior_studies.iter().enumerate() {
            if self.store.get_study(*prior).await?.is_none() {
                return Err(ServiceError::invalid(
                    format!("prior_studies[{i}]"),
                    format!("no study {prior}"),
                ));
            }
        }
        if let Some(job) = &spec.trial_job {
            if actor.role < Role::Operator {
                return Err(ServiceError::PermissionDenied {
                    message: format!(
                        "a study with a trial_job runs commands on the server's machines: it \
                         needs an operator or admin token, and this one is a {}",
                        actor.role
                    ),
                    field: Some("trial_job".into()),
                });
            }
            // A pool's workers run its studies under their own allow-lists
            // (`augur worker --job-commands`), not on this server's machines.
            if job.executor.pool().is_none() {
                self.job_policy.check(job, actor.role)?;
            }
        }
        Ok(spec)
    }

    /// What follows a new study's insert: the dispatcher told, the audit log written.
    async fn created_study(&self, actor: &Caller, record: crate::store::StudyRecord) -> Study {
        self.notify(record.id);
        self.audit(
            actor,
            "study.create",
            Some(record.id),
            None,
            Some(record.name.clone()),
        )
        .await;
        // A new study has no best trial: nothing to read after the insert (an outage now
        // would answer 503, "nothing was done", for a study that exists).
        super::study_of(record, None)
    }

    /// The study an earlier run of the same spec made (same name and spec, active or
    /// completed), or a new one: what `augur run` resumes. The spec's seed counts only when
    /// it names one.
    pub async fn find_or_create_study(
        &self,
        actor: &Caller,
        spec: StudySpec,
    ) -> ServiceResult<(Study, bool)> {
        let mut token: Option<String> = None;
        loop {
            let page = self
                .list_studies(None, Some(&spec.name), Some(100), token.as_deref())
                .await?;
            for study in page.items {
                let mut stored = study.spec.clone();
                if spec.seed.is_none() {
                    stored.seed = None;
                }
                let resumable = matches!(study.state, StudyState::Active | StudyState::Completed);
                // The stored spec is shown with its webhooks' secrets redacted.
                if stored == spec.redacted() && resumable {
                    return Ok((study, true));
                }
            }
            match page.next_page_token {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        Ok((self.create_study(actor, spec).await?, false))
    }

    pub async fn get_study(&self, study_id: StudyId) -> ServiceResult<Study> {
        let record = self.study_record(study_id).await?;
        self.study_view(record).await
    }

    pub async fn list_studies(
        &self,
        state: Option<StudyState>,
        name_contains: Option<&str>,
        page_size: Option<i64>,
        page_token: Option<&str>,
    ) -> ServiceResult<Page<Study>> {
        let (limit, after) = page_bounds(page_size, page_token)?;
        let records = self
            .store
            .list_studies(state, name_contains, after, limit + 1)
            .await?;
        let (records, next) = split_page(records, limit, |s| s.id);
        let mut items = Vec::with_capacity(records.len());
        let mut annotations = match (records.first(), records.last()) {
            (Some(first), Some(last)) => self.store.study_annotations(first.id, last.id).await?,
            _ => Default::default(),
        };
        for record in records {
            items.push(self.annotated_study_view(record, &mut annotations).await?);
        }
        Ok(Page {
            items,
            next_page_token: next,
        })
    }

    pub async fn delete_study(&self, actor: &Caller, study_id: StudyId) -> ServiceResult<()> {
        self.check_manager(actor, study_id).await?;
        if self.store.delete_study(study_id).await? {
            self.tokens.forget_study(study_id);
            self.notify(study_id);
            self.audit(actor, "study.delete", Some(study_id), None, None)
                .await;
            Ok(())
        } else {
            Err(not_found_study(study_id))
        }
    }

    pub async fn stop_study(&self, actor: &Caller, study_id: StudyId) -> ServiceResult<Study> {
        self.check_manager(actor, study_id).await?;
        let study = self.change_study(study_id, Command::Stop).await?;
        self.audit(actor, "study.stop", Some(study_id), None, None)
            .await;
        Ok(study)
    }

    /// Run a failed study again (`Command::Resume` says when it may).
    pub async fn resume_study(&self, actor: &Caller, study_id: StudyId) -> ServiceResult<Study> {
        self.check_manager(actor, study_id).await?;
        let study = self.change_study(study_id, Command::Resume).await?;
        self.audit(actor, "study.resume", Some(study_id), None, None)
            .await;
        Ok(study)
    }

    pub async fn update_study(
        &self,
        actor: &Caller,
        study_id: StudyId,
        update: StudyUpdate,
    ) -> ServiceResult<Study> {
        let mut update = update;
        let annotations = update.take_annotations();
        if !annotations.is_empty() {
            // Any state may be annotated: a finished study gets its note afterwards.
            self.annotate_study(actor, study_id, annotations).await?;
            if !update.changes_spec() {
                return self.get_study(study_id).await;
            }
        }
        self.check_manager(actor, study_id).await?;
        if let Some(notifications) = &update.notifications {
            self.check_notification_hosts(notifications)?;
        }
        let detail = serde_json::to_string(&update.redacted()).ok();
        // The answer is a `study_view`: it carries the annotations just written.
        let study = self.change_study(study_id, Command::Update(update)).await?;
        self.audit(actor, "study.update", Some(study_id), None, detail)
            .await;
        Ok(study)
    }

    /// Grow the study's search space by one parameter (see `model::extension`), as its
    /// creator or an admin may change it; for a study with a `trial_job` an operator's token
    /// too, since its parameters become the arguments of commands run on this server.
    pub async fn add_parameter(
        &self,
        actor: &Caller,
        study_id: StudyId,
        extension: ParameterExtension,
    ) -> ServiceResult<Study> {
        let study = self.study_record(study_id).await?;
        if !actor.may_manage(study.created_by.as_deref()) {
            return Err(not_its_manager(study_id, study.created_by.as_deref()));
        }
        if study.spec.trial_job.is_some() && actor.role < Role::Operator {
            return Err(ServiceError::PermissionDenied {
                message: format!(
                    "study {study_id} runs its trials as commands on the server's machines, \
                     with its parameters as arguments: growing its space needs an operator or \
                     admin token, and this one is a {}",
                    actor.role
                ),
                field: Some("parameter".into()),
            });
        }
        let detail = serde_json::to_string(&extension).ok();
        let command = Command::AddParameter(Box::new(extension));
        let changed = self.change_study(study_id, command).await;
        // Whatever the outcome: this process's copy of the space may be older than the
        // study's now, and the next use reads the stored one.
        self.forget_fixed_study(study_id);
        let study = changed?;
        self.audit(actor, "study.add_parameter", Some(study_id), None, detail)
            .await;
        Ok(study)
    }

    /// Only the study's creator or an admin may change, stop or delete it (or exclude its
    /// trials). Studies from before roles have no creator: admins' alone.
    pub(super) async fn check_manager(
        &self,
        actor: &Caller,
        study_id: StudyId,
    ) -> ServiceResult<()> {
        let study = self.study_record(study_id).await?;
        if actor.may_manage(study.created_by.as_deref()) {
            Ok(())
        } else {
            Err(not_its_manager(study_id, study.created_by.as_deref()))
        }
    }

    /// Who may ask a study for trials, add trials to it, or report to (and so end) one of
    /// its trials: the study's creator or an admin, as for any change of the study, and for
    /// `trial` also that trial's own token. Any other writer would otherwise fail the study
    /// (suggest, then fail its trials) or poison it (complete a trial with a made-up value).
    /// The creator is read once per process (`fixed_study`): a report pays no extra read.
    pub(super) async fn check_reporter(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial: Option<TrialId>,
    ) -> ServiceResult<()> {
        if let Some(scope) = actor.trial_scope {
            return if trial.is_some_and(|t| scope == TrialKey::new(study_id, t)) {
                Ok(())
            } else {
                Err(ServiceError::denied(
                    "this token may only report to its own trial",
                ))
            };
        }
        let fixed = self.fixed_study(study_id).await?;
        if actor.may_manage(fixed.created_by.as_deref()) {
            Ok(())
        } else {
            Err(not_its_manager(study_id, fixed.created_by.as_deref()))
        }
    }

    /// Whether `actor` reports to `study_id` as its own: a trial's token, or the study's
    /// creator (cached, as in `check_reporter`).
    pub(super) async fn is_own_reporter(&self, actor: &Caller, study_id: StudyId) -> bool {
        actor.trial_scope.is_some()
            || self
                .fixed_study(study_id)
                .await
                .is_ok_and(|f| f.created_by.as_deref() == Some(actor.name.as_str()))
    }

    async fn change_study(&self, study_id: StudyId, command: Command) -> ServiceResult<Study> {
        match self.commits.submit(study_id, command).await? {
            Reply::Study(record) => {
                self.notify(study_id);
                self.study_view(*record)
                    .await
                    .map_err(ServiceError::after_commit)
            }
            other => Err(unexpected(other)),
        }
    }
}

/// The refusal of a caller who neither created the study nor is an admin.
fn not_its_manager(study_id: StudyId, created_by: Option<&str>) -> ServiceError {
    ServiceError::denied(format!(
        "study {study_id} was created by {}; only its creator or an admin may change it, ask \
         it for trials or report to them (a trial also with its own token)",
        created_by.unwrap_or("an earlier version (admins only)")
    ))
}
