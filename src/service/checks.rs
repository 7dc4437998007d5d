//! Checks of reported values against the study: metric ids, finite values, steps, elapsed
//! times. The request's own shape was checked at the edge.

use std::collections::BTreeMap;

use super::{ServiceError, ServiceResult};
use crate::model::{Measurement, Step, StudyConfig};

/// The most bytes a trial's fail or infeasible reason may hold when a caller reports it: a
/// reason rides along with every read of its trial (pages of 1,000), so an unbounded one
/// (900 KB each in a probe) made pages of a gigabyte. Refused past it (400 naming the
/// field), not cut: the caller learns its reason was not kept whole. The server's own
/// dispatcher writes its reasons itself and keeps them short.
pub const MAX_REASON_BYTES: usize = 4096;

/// A reported reason no longer than [`MAX_REASON_BYTES`].
pub(super) fn check_reason(field: &str, reason: &str) -> ServiceResult<()> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(ServiceError::invalid(
            field,
            format!(
                "is {} bytes long; at most {MAX_REASON_BYTES} are kept",
                reason.len()
            ),
        ));
    }
    Ok(())
}

/// An intermediate measurement: a step >= 0, a sane elapsed time, the study's metrics.
pub(super) fn check_measurement(
    config: &StudyConfig,
    measurement: &Measurement,
) -> ServiceResult<()> {
    Step::try_from(measurement.step)?;
    if measurement
        .elapsed_secs
        .is_some_and(|s| !(s.is_finite() && s >= 0.0))
    {
        return Err(ServiceError::invalid(
            "elapsed_secs",
            "must be a finite number >= 0",
        ));
    }
    check_metrics(config, &measurement.metrics, "metrics", false)
}

/// Every metric must be one of the study's, with a finite value; `require_all` demands
/// every metric of the study (final measurements).
pub(super) fn check_metrics(
    config: &StudyConfig,
    metrics: &BTreeMap<String, f64>,
    field: &str,
    require_all: bool,
) -> ServiceResult<()> {
    for (id, value) in metrics {
        if !config.metrics.iter().any(|m| &m.id == id) {
            return Err(ServiceError::invalid(
                format!("{field}.{id}"),
                "not a metric of this study",
            ));
        }
        if !value.is_finite() {
            return Err(ServiceError::invalid(
                format!("{field}.{id}"),
                "must be a finite number",
            ));
        }
    }
    if require_all {
        if let Some(missing) = config.metrics.iter().find(|m| !metrics.contains_key(&m.id)) {
            return Err(ServiceError::invalid(
                format!("{field}.{}", missing.id),
                "is required",
            ));
        }
    } else if metrics.is_empty() {
        return Err(ServiceError::invalid(
            field,
            "must report at least one metric",
        ));
    }
    Ok(())
}
