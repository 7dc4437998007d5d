//! What identifies an attempt's job to its executor: written to the trial's `job.handle` when
//! it launches, read back by a restarted service to find a leftover. One type, written and
//! parsed here only; the text is the same as before it was a type, so handles written by an
//! older version still parse.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobHandle {
    /// Local processes, one group per replica: `pgids:12,13` (older: `pgid:12`).
    ProcessGroups(Vec<i32>),
    /// A Slurm job: `slurm:4711`.
    Slurm { job_id: String },
    /// Containers by name, and the trial directory their labels carry:
    /// `containers:augur-s1-t2-a1-workerpool0-0-ab12@/runs/study-1-…/2`.
    Containers {
        names: Vec<String>,
        trial_dir: PathBuf,
    },
    /// A Kubernetes attempt's objects, by namespace and name: `kubernetes:ml/augur-s1-t2-a3`.
    Kubernetes { namespace: String, attempt: String },
}

impl fmt::Display for JobHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobHandle::ProcessGroups(groups) => {
                let groups: Vec<String> = groups.iter().map(i32::to_string).collect();
                write!(f, "pgids:{}", groups.join(","))
            }
            JobHandle::Slurm { job_id } => write!(f, "slurm:{job_id}"),
            JobHandle::Containers { names, trial_dir } => {
                write!(f, "containers:{}@{}", names.join(","), trial_dir.display())
            }
            JobHandle::Kubernetes { namespace, attempt } => {
                write!(f, "kubernetes:{namespace}/{attempt}")
            }
        }
    }
}

/// A `job.handle` that no executor wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a job handle: {0:?}")]
pub struct BadHandle(pub String);

impl FromStr for JobHandle {
    type Err = BadHandle;

    fn from_str(text: &str) -> Result<Self, BadHandle> {
        let bad = || BadHandle(text.to_string());
        let (kind, rest) = text.split_once(':').ok_or_else(bad)?;
        match kind {
            "pgids" | "pgid" => rest
                .split(',')
                .map(|g| g.parse::<i32>().ok().filter(|g| *g > 0))
                .collect::<Option<Vec<i32>>>()
                .map(JobHandle::ProcessGroups)
                .ok_or_else(bad),
            "slurm" if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(JobHandle::Slurm {
                    job_id: rest.to_string(),
                })
            }
            "containers" => {
                let (names, dir) = rest.split_once('@').ok_or_else(bad)?;
                Ok(JobHandle::Containers {
                    names: names.split(',').map(str::to_string).collect(),
                    trial_dir: PathBuf::from(dir),
                })
            }
            "kubernetes" => match rest.split_once('/') {
                Some((namespace, attempt)) if !namespace.is_empty() => Ok(JobHandle::Kubernetes {
                    namespace: namespace.to_string(),
                    attempt: attempt.to_string(),
                }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_handle_reads_back_as_written() {
        let handles = [
            JobHandle::ProcessGroups(vec![12, 13]),
            JobHandle::Slurm {
                job_id: "4711".into(),
            },
            JobHandle::Containers {
                names: vec!["augur-s1-t2-a1-workerpool0-0-ab12".into(), "b".into()],
                trial_dir: PathBuf::from("/runs/study-1-20261204T000000.000/2"),
            },
            JobHandle::Kubernetes {
                namespace: "ml".into(),
                attempt: "augur-s1-t2-a3".into(),
            },
        ];
        for handle in handles {
            assert_eq!(handle.to_string().parse::<JobHandle>(), Ok(handle.clone()));
        }
    }

    #[test]
    fn handles_of_older_versions_and_bad_ones() {
        // The text each executor wrote before the type: unchanged.
        assert_eq!(
            "pgids:12,13".parse(),
            Ok(JobHandle::ProcessGroups(vec![12, 13]))
        );
        assert_eq!("pgid:7".parse(), Ok(JobHandle::ProcessGroups(vec![7])));
        assert_eq!(
            JobHandle::Kubernetes {
                namespace: "ml".into(),
                attempt: "x".into()
            }
            .to_string(),
            "kubernetes:ml/x"
        );
        for bad in [
            "",
            "pgids:",
            "pgids:-1",
            "pgids:1,x",
            "slurm:",
            "slurm:12a",
            "kubernetes:/x",
            "containers:a",
            "ray:1",
        ] {
            assert!(bad.parse::<JobHandle>().is_err(), "{bad:?} parsed");
        }
    }
}
