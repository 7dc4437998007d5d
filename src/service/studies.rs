//! Studies: create, read, list, stop, change, delete.

use chrono::Utc;

use super::paging::{page_bounds, split_page};
use super::state_machine::{Command, Reply};
use super::{Page, Service, ServiceError, ServiceResult, not_found_study, unexpected};
use crate::model::{Study, StudySpec, StudyState, StudyUpdate};

impl Service {
    pub async fn create_study(&self, spec: StudySpec) -> ServiceResult<Study> {
        let spec = spec.with_seed(rand::random::<u32>() as u64);
        spec.validate()?;
        for (i, prior) in spec.prior_studies.iter().enumerate() {
            if self.store.get_study(*prior).await?.is_none() {
                return Err(ServiceError::invalid(
                    format!("prior_studies[{i}]"),
                    format!("no study {prior}"),
                ));
            }
        }
        let record = self.store.insert_study(&spec, Utc::now()).await?;
        self.notify(record.id);
        self.study_view(record).await
    }

    /// The study an earlier run of the same spec made (same name and spec, active or
    /// completed), or a new one: what `augur run` resumes. The spec's seed counts only when
    /// it names one.
    pub async fn find_or_create_study(&self, spec: StudySpec) -> ServiceResult<(Study, bool)> {
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
                if stored == spec && resumable {
                    return Ok((study, true));
                }
            }
            match page.next_page_token {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        Ok((self.create_study(spec).await?, false))
    }

    pub async fn get_study(&self, study_id: i64) -> ServiceResult<Study> {
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
        for record in records {
            items.push(self.study_view(record).await?);
        }
        Ok(Page {
            items,
            next_page_token: next,
        })
    }

    pub async fn delete_study(&self, study_id: i64) -> ServiceResult<()> {
        if self.store.delete_study(study_id).await? {
            self.notify(study_id);
            Ok(())
        } else {
            Err(not_found_study(study_id))
        }
    }

    pub async fn stop_study(&self, study_id: i64) -> ServiceResult<Study> {
        self.change_study(study_id, Command::Stop).await
    }

    pub async fn update_study(&self, study_id: i64, update: StudyUpdate) -> ServiceResult<Study> {
        self.change_study(study_id, Command::Update(update)).await
    }

    async fn change_study(&self, study_id: i64, command: Command) -> ServiceResult<Study> {
        match self.commits.submit(study_id, command).await? {
            Reply::Study(record) => {
                self.notify(study_id);
                self.study_view(*record).await
            }
            other => Err(unexpected(other)),
        }
    }
}
