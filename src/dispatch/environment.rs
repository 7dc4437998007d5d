//! A job's environment (DESIGN §4): it starts clean, never from the server's own. Jobs get
//! the allow-list of the server's variables (`model::job::INHERITED_ENV`), the names the
//! server passes on (`--job-env`), the spec's `env`, and the variables Augur sets.

use std::path::Path;

use crate::model::{StudyId, TrialDirs, TrialId};

/// The part of this process's environment a job starts from: the allow-list and the names
/// in `pass_on`. Nothing else of the server's reaches a job: not its token, not its
/// database URL.
pub fn job_base_env(pass_on: &[String]) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| crate::model::job::is_inherited_env(k) || pass_on.contains(k))
        .collect()
}

/// What identifies a trial's job to the job (and to a restarted service looking for a
/// leftover process of it).
pub struct TrialIdentity<'a> {
    pub augur_url: &'a str,
    pub study_id: StudyId,
    pub trial_id: TrialId,
    pub dirs: &'a TrialDirs,
}

/// The trial's environment, the same on every attempt but for its token (added per launch).
/// Later entries win: the spec's `env` over the inherited, Augur's own over both.
pub fn trial_env(
    base: &[(String, String)],
    spec_env: &std::collections::BTreeMap<String, String>,
    trial: &TrialIdentity<'_>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = base.to_vec();
    env.extend(spec_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let dirs = trial.dirs;
    env.extend([
        ("AUGUR_URL".to_string(), trial.augur_url.to_string()),
        ("AUGUR_STUDY_ID".to_string(), trial.study_id.to_string()),
        ("AUGUR_TRIAL_ID".to_string(), trial.trial_id.to_string()),
        ("CLOUD_ML_TRIAL_ID".to_string(), trial.trial_id.to_string()),
        (
            "CLOUD_ML_HP_METRIC_FILE".to_string(),
            dirs.metric_file.display().to_string(),
        ),
        ("AIP_MODEL_DIR".to_string(), dir_env(&dirs.model)),
        ("AIP_CHECKPOINT_DIR".to_string(), dir_env(&dirs.checkpoints)),
        ("AIP_TENSORBOARD_LOG_DIR".to_string(), dir_env(&dirs.logs)),
    ]);
    env
}

/// The path as the job sees it, with a trailing slash as Vertex AI gives directories.
fn dir_env(p: &Path) -> String {
    let s = p.display().to_string();
    if s.ends_with('/') { s } else { format!("{s}/") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn augurs_variables_win_over_the_specs_and_directories_end_with_a_slash() {
        let key = crate::model::StudyKey {
            id: StudyId::new(2),
            created_at: "2026-12-04T10:00:00Z".parse().expect("time"),
        };
        let study = crate::model::StudyDir::below("/runs".into(), key, Default::default());
        let dirs = TrialDirs::new(&study, TrialId::new(4));
        let trial = TrialIdentity {
            augur_url: "http://127.0.0.1:1",
            study_id: StudyId::new(2),
            trial_id: TrialId::new(4),
            dirs: &dirs,
        };
        let spec_env = [("AUGUR_TRIAL_ID".to_string(), "99".to_string())].into();
        let env = trial_env(&[("PATH".into(), "/bin".into())], &spec_env, &trial);
        let last = |k: &str| {
            env.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(last("AUGUR_TRIAL_ID"), Some("4"));
        assert_eq!(last("PATH"), Some("/bin"));
        assert_eq!(
            last("AIP_CHECKPOINT_DIR"),
            Some("/runs/study-2-20261204T100000.000/4/checkpoints/")
        );
    }
}
