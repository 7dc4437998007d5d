//! Warm start from prior studies: their trials in this study's encoding, warped together
//! with this study's values, and the lifted points of the two-task GP (see
//! [`super::model`]'s `fit_objective`).

use crate::designer::{CompletedTrial, DesignerInput, MetricSpec, Outcome};
use crate::gp::encoding::Encoder;
use crate::gp::warping::{Warping, warp_with};

use super::model::oriented;

/// Whether any prior study has a measured trial (warm start).
pub(super) fn has_prior_trials(input: &DesignerInput<'_>) -> bool {
    input
        .prior_studies
        .iter()
        .flat_map(|s| &s.completed)
        .any(|t| matches!(t.outcome, Outcome::Measured(_)))
}

/// The prior studies' part of a warm-started GP.
pub(super) struct WarmStart {
    /// Their (subsampled) points, lifted with study feature 1.
    pub(super) x: Vec<Vec<f64>>,
    /// Their best points (unlifted), to seed the acquisition search.
    pub(super) best: Vec<Vec<f64>>,
    /// Number of this study's trials the model was fitted on.
    pub(super) new_trials: usize,
}

/// `x` with the study feature appended: 0 for this study, 1 for the prior studies.
pub(super) fn lift(points: &[Vec<f64>], study: f64) -> Vec<Vec<f64>> {
    points
        .iter()
        .map(|p| {
            let mut q = Vec::with_capacity(p.len() + 1);
            q.extend_from_slice(p);
            q.push(study);
            q
        })
        .collect()
}

/// The prior studies' trials for one objective metric, ready to join this study's GP.
pub(super) struct PriorData {
    /// Their points in this study's encoding (parameters this space lacks dropped, missing
    /// ones inactive).
    pub(super) x: Vec<Vec<f64>>,
    /// Their targets, warped together with this study's values (same metric, same units:
    /// one warping puts both on one scale).
    pub(super) y: Vec<f64>,
    /// This study's targets from that joint warping, per completed trial.
    pub(super) new_targets: Vec<f64>,
}

/// The prior studies' trials and the joint warping for one objective metric; `None`
/// without at least 3 prior trials.
pub(super) fn prior_data(
    encoder: &Encoder,
    input: &DesignerInput<'_>,
    metric: &MetricSpec,
    new_values: &[Option<f64>],
    warping: Warping,
) -> Option<PriorData> {
    let mut x = Vec::new();
    let mut values: Vec<Option<f64>> = Vec::new();
    for study in input.prior_studies {
        // Trials with a value outside this space's domain are left out.
        let usable: Vec<&CompletedTrial> = study
            .completed
            .iter()
            .filter(|t| encoder.accepts(&t.parameters))
            .collect();
        let v: Vec<Option<f64>> = usable
            .iter()
            .map(|t| oriented(metric, &t.outcome))
            .collect();
        if v.iter().all(Option::is_none) {
            continue;
        }
        x.extend(usable.iter().map(|t| encoder.encode(&t.parameters)));
        values.extend(v);
    }
    if x.len() < 3 {
        return None;
    }
    let n_prior = values.len();
    values.extend_from_slice(new_values);
    let mut y = warp_with(&values, warping);
    let new_targets = y.split_off(n_prior);
    Some(PriorData { x, y, new_targets })
}
