//! Augur's optimizers as pure functions over plain data.
//!
//! Nothing here does IO, spawns tasks or reads a clock: given the same search space, history
//! and seed, every policy returns the same decisions. The service turns stored trials into a
//! [`StudyView`], asks the study's [`Policy`] and carries out the [`Decision`]s.

pub mod cancel;
pub mod decision;
pub mod designer;
pub mod gp;
pub mod gp_bandit;
pub mod grid;
pub mod multi_fidelity;
pub mod quasi_random;
pub mod random;
pub mod space;
pub mod stopping;
pub mod test_functions;

pub use decision::{
    Decision, FullBudget, Policy, PolicyOutput, StepMeasurement, StudyView, TrialStatus, TrialView,
};
pub use designer::{
    Algorithm, CompletedTrial, Designer, DesignerInput, DesignerOutput, Goal, MetricSpec, Outcome,
    PriorStudy, designer_for, is_safe, objective_metrics, outcome_is_safe,
};
pub use gp_bandit::{
    Acquisition, BatchAcquisition, GpBanditConfig, GpBanditDesigner, PowerWarping, WarpingChoice,
};
pub use grid::{DEFAULT_GRID_RESOLUTION, grid_size};
pub use space::{Assignment, Child, Parameter, ParameterKind, Scale, SearchSpace, Value};
pub use stopping::{EarlyStopping, StoppingRule, should_stop};
