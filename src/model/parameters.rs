//! A study's parameters as written (`ParameterInput`) validated into the optimizer's search
//! space (`augur_optimizer::Parameter`), conditional children included. Every rejection
//! names its field, e.g. `parameters[2].children[0].parameters[1].min`.

use std::collections::BTreeSet;

use augur_optimizer::{Child, Parameter, ParameterKind, Scale, Value};

use super::ValidationError;
use super::spec::{
    ChildInput, MAX_VALUES_PER_PARAMETER, ParameterInput, ParameterType, ScaleName, check_id,
};

/// The parameters at `path` (`parameters`, or a child's `….parameters`); `ids` collects
/// every id of the study so that none repeats anywhere in the tree.
pub(super) fn convert_parameters(
    inputs: &[ParameterInput],
    path: &str,
    ids: &mut BTreeSet<String>,
) -> Result<Vec<Parameter>, ValidationError> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, p)| convert_parameter(p, &format!("{path}[{i}]"), ids))
        .collect()
}

pub(super) fn convert_parameter(
    p: &ParameterInput,
    path: &str,
    ids: &mut BTreeSet<String>,
) -> Result<Parameter, ValidationError> {
    let at = Fields(path);
    check_id(&p.id, &at.field("id"))?;
    if !ids.insert(p.id.clone()) {
        return Err(at.error("id", format!("duplicate parameter id {:?}", p.id)));
    }
    let scale = match p.scale {
        None | Some(ScaleName::Linear) => Scale::Linear,
        Some(ScaleName::Log) => Scale::Log,
        Some(ScaleName::ReverseLog) => Scale::ReverseLog,
    };
    let kind = match p.kind {
        ParameterType::Double | ParameterType::Integer => numeric_kind(p, &at, scale)?,
        ParameterType::Discrete => discrete_kind(p, &at, scale)?,
        ParameterType::Categorical => categorical_kind(p, &at)?,
    };
    let children = p
        .children
        .iter()
        .enumerate()
        .map(|(c, child)| convert_child(p, &kind, child, &format!("{path}.children[{c}]"), ids))
        .collect::<Result<_, _>>()?;
    Ok(Parameter {
        id: p.id.clone(),
        kind,
        children,
    })
}

/// A double or integer parameter: finite `min < max`, positive on a log scale, whole for
/// an integer.
fn numeric_kind(
    p: &ParameterInput,
    at: &Fields<'_>,
    scale: Scale,
) -> Result<ParameterKind, ValidationError> {
    let what = if p.kind == ParameterType::Double {
        "double"
    } else {
        "integer"
    };
    if p.values.is_some() {
        return Err(at.not_allowed("values", what));
    }
    let bound = |value: Option<f64>, name: &str| {
        let v = value.ok_or_else(|| at.error(name, "is required"))?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(at.error(name, "must be a finite number"))
        }
    };
    let (min, max) = (bound(p.min, "min")?, bound(p.max, "max")?);
    if min >= max {
        return Err(at.error("min", format!("min ({min}) must be less than max ({max})")));
    }
    if scale != Scale::Linear && min <= 0.0 {
        return Err(at.error("min", "must be > 0 on a log or reverse_log scale"));
    }
    if p.kind == ParameterType::Double {
        return Ok(ParameterKind::Double { min, max, scale });
    }
    for (name, v) in [("min", min), ("max", max)] {
        // Above 2^53 whole numbers are no longer exact in a double.
        if v.fract() != 0.0 || v.abs() > 9.0e15 {
            return Err(at.error(name, "must be a whole number for an integer parameter"));
        }
    }
    Ok(ParameterKind::Integer {
        min: min as i64,
        max: max as i64,
        scale,
    })
}

/// A discrete parameter: strictly increasing finite numbers, positive on a log scale.
fn discrete_kind(
    p: &ParameterInput,
    at: &Fields<'_>,
    scale: Scale,
) -> Result<ParameterKind, ValidationError> {
    for (name, present) in [("min", p.min.is_some()), ("max", p.max.is_some())] {
        if present {
            return Err(at.not_allowed(name, "discrete"));
        }
    }
    let values = required_values(p, at)?;
    let mut numbers: Vec<f64> = Vec::with_capacity(values.len());
    for (j, v) in values.iter().enumerate() {
        let value_field = format!("values[{j}]");
        let x = v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| at.error(&value_field, "must be a finite number"))?;
        if numbers.last().is_some_and(|prev| x <= *prev) {
            return Err(at.error(&value_field, "discrete values must be strictly increasing"));
        }
        numbers.push(x);
    }
    if scale != Scale::Linear && numbers[0] <= 0.0 {
        return Err(at.error("values", "must all be > 0 on a log or reverse_log scale"));
    }
    Ok(ParameterKind::Discrete {
        values: numbers,
        scale,
    })
}

/// A categorical parameter: distinct, non-empty strings without control characters.
fn categorical_kind(p: &ParameterInput, at: &Fields<'_>) -> Result<ParameterKind, ValidationError> {
    let present = [
        ("min", p.min.is_some()),
        ("max", p.max.is_some()),
        ("scale", p.scale.is_some()),
    ];
    if let Some((name, _)) = present.iter().find(|(_, present)| *present) {
        return Err(at.not_allowed(name, "categorical"));
    }
    let values = required_values(p, at)?;
    let mut seen = BTreeSet::new();
    let mut strings = Vec::with_capacity(values.len());
    for (j, v) in values.iter().enumerate() {
        let value_field = format!("values[{j}]");
        let Value::Str(s) = v else {
            return Err(at.error(&value_field, "categorical values must be strings"));
        };
        if s.is_empty() {
            return Err(at.error(&value_field, "must not be empty"));
        }
        if s.chars().any(char::is_control) {
            return Err(at.error(&value_field, "must not hold control characters"));
        }
        if !seen.insert(s.clone()) {
            return Err(at.error(&value_field, format!("duplicate value {s:?}")));
        }
        strings.push(s.clone());
    }
    Ok(ParameterKind::Categorical { values: strings })
}

fn required_values<'a>(
    p: &'a ParameterInput,
    at: &Fields<'_>,
) -> Result<&'a [Value], ValidationError> {
    let values = p
        .values
        .as_deref()
        .ok_or_else(|| at.error("values", "is required"))?;
    if values.is_empty() {
        return Err(at.error("values", "must not be empty"));
    }
    if values.len() > MAX_VALUES_PER_PARAMETER {
        return Err(at.error(
            "values",
            format!(
                "may list at most {MAX_VALUES_PER_PARAMETER} values, not {}",
                values.len()
            ),
        ));
    }
    Ok(values)
}

/// Conditional children of `parent` (already converted to `kind`): each names values of its
/// parent and holds at least one parameter.
fn convert_child(
    parent: &ParameterInput,
    kind: &ParameterKind,
    child: &ChildInput,
    path: &str,
    ids: &mut BTreeSet<String>,
) -> Result<Child, ValidationError> {
    let at = Fields(path);
    if child.when.is_empty() {
        return Err(at.error("when", "must name at least one parent value"));
    }
    for (w, v) in child.when.iter().enumerate() {
        if matches!(kind, ParameterKind::Double { .. }) {
            return Err(at.error(
                &format!("when[{w}]"),
                "a double parameter cannot have conditional children",
            ));
        }
        if !kind.contains(v) {
            return Err(at.error(
                &format!("when[{w}]"),
                format!("{v:?} is not a value of parent parameter {:?}", parent.id),
            ));
        }
    }
    let parameters = convert_parameters(&child.parameters, &at.field("parameters"), ids)?;
    if parameters.is_empty() {
        return Err(at.error("parameters", "must not be empty"));
    }
    Ok(Child {
        when: child.when.clone(),
        parameters,
    })
}

/// Field paths under one parameter (or child): `parameters[2]` + `min`.
struct Fields<'a>(&'a str);

impl Fields<'_> {
    fn field(&self, name: &str) -> String {
        format!("{}.{name}", self.0)
    }

    fn error(&self, name: &str, message: impl Into<String>) -> ValidationError {
        ValidationError::new(self.field(name), message)
    }

    fn not_allowed(&self, name: &str, what: &str) -> ValidationError {
        self.error(name, format!("is not allowed for a {what} parameter"))
    }
}
