//! Plain domain types and their validation: the study spec as users write it, the validated
//! configuration the service works with, trials and measurements. No IO.

pub mod annotations;
pub mod executor;
pub mod extension;
mod ids;
pub mod image;
pub mod job;
pub mod notification;
mod parameters;
pub mod pool;
pub mod request;
mod role;
pub mod spec;
pub mod study_stopping;
pub mod trial;
pub mod trial_dirs;
pub mod vertex;

pub use annotations::{AnnotationUpdate, Annotations};
pub use executor::{ExecutorName, ExecutorSpec, KubernetesOptions, SlurmOptions};
pub use extension::{ExtensionError, ParameterExtension};
pub use ids::{StudyId, TrialId, TrialKey};
pub use job::{
    ArgStyle, OutputLayout, ReplicaId, ReplicaPlan, Resources, TrialJobSpec, WorkerPoolSpec,
};
pub use notification::{
    DeliveryState, DeliveryTarget, NotificationDelivery, NotificationEvent, NotificationSpec,
    NotificationTarget, NotifyHosts,
};
pub use request::{ClientId, Step, SuggestCount};
pub use role::{AuditEvent, Role, TokenInfo};
pub use spec::{
    AlgorithmName, EarlyStoppingSpec, MeasurementSelection, MetricGoal, MetricSpecInput,
    ParameterInput, StudyConfig, StudySpec, StudyUpdate,
};
pub use study_stopping::{FinishedTrial, StopVerdict, StudyStopping, StudyStoppingSpec};
pub use trial::{
    Lineage, Measurement, Segment, Study, StudyState, Trial, TrialCounts, TrialPoint, TrialState,
};
pub use trial_dirs::{StudyDir, StudyKey, TrialDirs};

/// A bad input, with the path of the offending field (`parameters[2].min`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    pub field: String,
    pub message: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}
