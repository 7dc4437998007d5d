//! Growing a live study's search space (`POST /v1/studies/{study}/parameters`): code that
//! reveals its parameters as it runs (Optuna's define-by-run) adds each one when it first
//! meets it, as a top-level parameter or as a child of a parameter it depends on.

use std::collections::BTreeSet;

use augur_optimizer::space::values_match;
use augur_optimizer::{Assignment, ParameterKind, Value};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ValidationError;
use super::parameters::convert_parameter;
use super::spec::{ChildInput, ParameterInput, StudyConfig, StudySpec};
use crate::model::TrialId;

/// Most trials one extension may give a value for.
pub const MAX_TRIAL_VALUES: usize = 100;

/// A parameter to add to a study's search space.
///
/// The space only grows. A parameter is added, or an existing child is activated by more of
/// its parent's values; nothing is removed, moved to another parent or redefined, so every
/// stored trial keeps the meaning it had: a trial stored before a parameter existed lacks it,
/// and the designers read that as "inactive there", as they do for a conditional parameter.
/// Adding what is already there is a no-op, so clients may repeat the call freely, and two
/// clients adding the same child under different parent values end with the union.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ParameterExtension {
    /// The parameter, as in a study spec (it may bring conditional children of its own). An
    /// id the study has already is fine when the definition is the same (then only `parent`
    /// may add values that activate it, and `trials` values); another definition is refused.
    pub parameter: ParameterInput,
    /// Absent: a top-level parameter, active in every trial from now on. Present: a child of
    /// that parameter (categorical, integer or discrete), active when it takes one of
    /// `values`; for an existing child, these values are added to those that activate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentInput>,
    /// Values of the parameter for unfinished trials handed out before it was added (in
    /// which it is now active): they run with these, and the optimizer learns from them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trials: Vec<TrialValueInput>,
}

/// The parent of a parameter being added, and the parent's values that activate it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ParentInput {
    pub id: String,
    #[schema(value_type = Vec<serde_json::Value>)]
    pub values: Vec<Value>,
}

/// The value a running trial takes for the parameter being added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TrialValueInput {
    /// The trial's id in the study.
    #[schema(value_type = i64)]
    pub id: TrialId,
    #[schema(value_type = serde_json::Value)]
    pub value: Value,
}

/// Why an extension is refused: a bad field (400), or a field at odds with the study as it
/// is (409: the parameter exists with another definition or parent, a trial has another
/// value).
#[derive(Debug, Clone, PartialEq)]
pub enum ExtensionError {
    Invalid(ValidationError),
    Conflict { field: String, message: String },
}

impl From<ValidationError> for ExtensionError {
    fn from(e: ValidationError) -> Self {
        ExtensionError::Invalid(e)
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ExtensionError {
    ExtensionError::Invalid(ValidationError::new(field, message))
}

fn conflict(field: impl Into<String>, message: impl Into<String>) -> ExtensionError {
    ExtensionError::Conflict {
        field: field.into(),
        message: message.into(),
    }
}

/// Where a parameter sits in the spec: its index among the top-level parameters, then
/// (child group, index in the group) pairs down to it.
#[derive(Debug, Clone, PartialEq)]
struct Place {
    top: usize,
    down: Vec<(usize, usize)>,
}

impl Place {
    /// The parent's place, the index of the child group this parameter is in, and its index
    /// in that group; `None` for a top-level parameter.
    fn parent(&self) -> Option<(Place, usize, usize)> {
        let mut down = self.down.clone();
        let (group, index) = down.pop()?;
        Some((
            Place {
                top: self.top,
                down,
            },
            group,
            index,
        ))
    }
}

fn find(params: &[ParameterInput], id: &str) -> Option<Place> {
    fn walk(p: &ParameterInput, id: &str, down: &mut Vec<(usize, usize)>) -> bool {
        if p.id == id {
            return true;
        }
        for (g, group) in p.children.iter().enumerate() {
            for (i, child) in group.parameters.iter().enumerate() {
                down.push((g, i));
                if walk(child, id, down) {
                    return true;
                }
                down.pop();
            }
        }
        false
    }
    params.iter().enumerate().find_map(|(top, p)| {
        let mut down = Vec::new();
        walk(p, id, &mut down).then_some(Place { top, down })
    })
}

fn at<'a>(spec: &'a StudySpec, place: &Place) -> &'a ParameterInput {
    let mut p = &spec.parameters[place.top];
    for (g, i) in &place.down {
        p = &p.children[*g].parameters[*i];
    }
    p
}

fn at_mut<'a>(spec: &'a mut StudySpec, place: &Place) -> &'a mut ParameterInput {
    let mut p = &mut spec.parameters[place.top];
    for (g, i) in &place.down {
        p = &mut p.children[*g].parameters[*i];
    }
    p
}

/// A parameter's domain, its children left out.
fn domain(p: &ParameterInput, path: &str) -> Result<ParameterKind, ValidationError> {
    let alone = ParameterInput {
        children: Vec::new(),
        ..p.clone()
    };
    Ok(convert_parameter(&alone, path, &mut BTreeSet::new())?.kind)
}

/// The first field in which two domains differ (`parameter.` + it), for a 409 to name.
fn first_difference(have: &ParameterKind, want: &ParameterKind) -> &'static str {
    use ParameterKind as K;
    // The first field that differs, in the order a spec writes them; `type` when none does
    // (the same domain of another type).
    let first = |differs: &[(bool, &'static str)]| {
        differs
            .iter()
            .find(|(d, _)| *d)
            .map_or("type", |(_, field)| *field)
    };
    match (have, want) {
        (
            K::Double { min, max, scale },
            K::Double {
                min: m,
                max: x,
                scale: s,
            },
        ) => first(&[(min != m, "min"), (max != x, "max"), (scale != s, "scale")]),
        (
            K::Integer { min, max, scale },
            K::Integer {
                min: m,
                max: x,
                scale: s,
            },
        ) => first(&[(min != m, "min"), (max != x, "max"), (scale != s, "scale")]),
        (
            K::Discrete { values, scale },
            K::Discrete {
                values: v,
                scale: s,
            },
        ) => first(&[(values != v, "values"), (scale != s, "scale")]),
        (K::Categorical { .. }, K::Categorical { .. }) => "values",
        _ => "type",
    }
}

/// The parent's values as the spec keeps them (whole numbers as integers), each checked
/// against the parent's domain and given once.
fn parent_values(parent: &ParentInput, kind: &ParameterKind) -> Result<Vec<Value>, ExtensionError> {
    if matches!(kind, ParameterKind::Double { .. }) {
        return Err(invalid(
            "parent.id",
            format!(
                "{:?} is a double parameter, which cannot have conditional children: name a \
                 categorical, integer or discrete one",
                parent.id
            ),
        ));
    }
    if parent.values.is_empty() {
        return Err(invalid(
            "parent.values",
            "must name at least one value of the parent",
        ));
    }
    let mut out: Vec<Value> = Vec::with_capacity(parent.values.len());
    for (j, v) in parent.values.iter().enumerate() {
        if !kind.contains(v) {
            return Err(invalid(
                format!("parent.values[{j}]"),
                format!("{v:?} is not a value of parent parameter {:?}", parent.id),
            ));
        }
        let v = match v.as_f64() {
            Some(x) => Value::from_number(x),
            None => v.clone(),
        };
        if !out.iter().any(|w| values_match(w, &v)) {
            out.push(v);
        }
    }
    Ok(out)
}

fn same_values(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().all(|v| b.iter().any(|w| values_match(v, w)))
}

/// Put `child` among `parent`'s children activated by exactly `when`: into the group with
/// those values, or a new one.
fn adopt(parent: &mut ParameterInput, when: Vec<Value>, child: ParameterInput) {
    match parent
        .children
        .iter_mut()
        .find(|g| same_values(&g.when, &when))
    {
        Some(group) => group.parameters.push(child),
        None => parent.children.push(ChildInput {
            when,
            parameters: vec![child],
        }),
    }
}

impl StudySpec {
    /// The spec and config with `extension`'s parameter in the space, or `None` when the
    /// space has it already as asked. Its `trials` are not looked at here (see
    /// [`trial_value`], which needs the trials).
    pub fn extend_space(
        &self,
        extension: &ParameterExtension,
    ) -> Result<Option<(StudySpec, StudyConfig)>, ExtensionError> {
        let config = self.validate()?;
        if extension.trials.len() > MAX_TRIAL_VALUES {
            return Err(invalid(
                "trials",
                format!("at most {MAX_TRIAL_VALUES} trials at a time"),
            ));
        }
        let new = &extension.parameter;
        let mut next = self.clone();
        match find(&self.parameters, &new.id) {
            Some(place) => {
                if !self.grow_existing(&mut next, &place, extension)? {
                    return Ok(None);
                }
            }
            None => {
                // Its subtree is checked with every id of the study taken: none may repeat.
                let mut ids: BTreeSet<String> = config
                    .space
                    .all_parameters()
                    .into_iter()
                    .map(|p| p.id.clone())
                    .collect();
                convert_parameter(new, "parameter", &mut ids)?;
                match &extension.parent {
                    None => next.parameters.push(new.clone()),
                    Some(parent) => {
                        let place = find(&self.parameters, &parent.id).ok_or_else(|| {
                            invalid(
                                "parent.id",
                                format!("study has no parameter {:?}", parent.id),
                            )
                        })?;
                        let kind = domain(at(self, &place), "parent")?;
                        let when = parent_values(parent, &kind)?;
                        adopt(at_mut(&mut next, &place), when, new.clone());
                    }
                }
            }
        }
        // The whole spec again: what a parameter alone cannot break (the study's count of
        // parameters) is named after the request's field.
        let config = next
            .validate()
            .map_err(|e| invalid("parameter", e.message))?;
        Ok(Some((next, config)))
    }

    /// `extension` names a parameter the study has at `place`: the same definition, under
    /// the same parent. Adds the parent values it asks for; whether that changed anything.
    fn grow_existing(
        &self,
        next: &mut StudySpec,
        place: &Place,
        extension: &ParameterExtension,
    ) -> Result<bool, ExtensionError> {
        let new = &extension.parameter;
        let existing = at(self, place);
        let have = domain(existing, "parameter")?;
        let want = domain(new, "parameter")?;
        if have != want {
            let field = first_difference(&have, &want);
            return Err(conflict(
                format!("parameter.{field}"),
                format!(
                    "the study has parameter {:?} already, as {have:?}: a parameter's \
                     definition does not change (add it under another id)",
                    new.id
                ),
            ));
        }
        if !new.children.is_empty() && new.children != existing.children {
            return Err(conflict(
                "parameter.children",
                format!(
                    "parameter {:?} has other children in the study: add each new child with \
                     its own request, naming {:?} as its parent",
                    new.id, new.id
                ),
            ));
        }
        let Some((parent_place, group, index)) = place.parent() else {
            return match extension.parent {
                None => Ok(false),
                Some(_) => Err(conflict(
                    "parent",
                    format!(
                        "parameter {:?} is a top-level parameter of the study, active in every \
                         trial: it has no parent",
                        new.id
                    ),
                )),
            };
        };
        let parent = at(self, &parent_place);
        let asked = match &extension.parent {
            Some(asked) if asked.id == parent.id => asked,
            _ => {
                return Err(conflict(
                    "parent.id",
                    format!(
                        "parameter {:?} is a child of {:?} in the study (when it is one of {}): \
                         name that parent",
                        new.id,
                        parent.id,
                        serde_json::to_string(&parent.children[group].when).unwrap_or_default()
                    ),
                ));
            }
        };
        let kind = domain(parent, "parent")?;
        let mut when = parent.children[group].when.clone();
        let before = when.len();
        for v in parent_values(asked, &kind)? {
            if !when.iter().any(|w| values_match(w, &v)) {
                when.push(v);
            }
        }
        if when.len() == before {
            return Ok(false);
        }
        // Out of its group (others there keep their values), into the one for the union.
        let parent = at_mut(next, &parent_place);
        let moved = parent.children[group].parameters.remove(index);
        if parent.children[group].parameters.is_empty() {
            parent.children.remove(group);
        }
        adopt(parent, when, moved);
        Ok(true)
    }
}

/// The value to store for parameter `id` in a trial whose parameters are `assignment`,
/// under the extended `config` (`field`: the request's `trials[i]`), or `None` when the
/// trial has it already.
pub fn trial_value(
    config: &StudyConfig,
    id: &str,
    assignment: &Assignment,
    value: &Value,
    field: &str,
) -> Result<Option<Value>, ExtensionError> {
    let Some(parameter) = config
        .space
        .all_parameters()
        .into_iter()
        .find(|p| p.id == id)
    else {
        return Err(invalid(
            "parameter.id",
            format!("study has no parameter {id:?}"),
        ));
    };
    if !parameter.kind.contains(value) {
        return Err(invalid(
            format!("{field}.value"),
            format!("{value:?} is outside parameter {id:?}'s domain"),
        ));
    }
    let value = match (&parameter.kind, value.as_f64()) {
        (ParameterKind::Double { .. }, Some(x)) => Value::Float(x),
        (_, Some(x)) => Value::from_number(x),
        _ => value.clone(),
    };
    if let Some(have) = assignment.get(id) {
        return if values_match(have, &value) {
            Ok(None)
        } else {
            Err(conflict(
                format!("{field}.value"),
                format!("the trial has {id} = {have:?} already"),
            ))
        };
    }
    if !config.space.is_active(id, assignment) {
        return Err(invalid(
            format!("{field}.id"),
            format!(
                "parameter {id:?} is not active in this trial (its parent's value there does \
                 not activate it): it takes no value"
            ),
        ));
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use augur_optimizer::Child;
    use serde_json::json;

    /// The children of a spec parameter as the optimizer has them, for tests.
    fn child_ids(config: &StudyConfig, parent: &str) -> Vec<(Vec<Value>, Vec<String>)> {
        let p = config
            .space
            .all_parameters()
            .into_iter()
            .find(|p| p.id == parent)
            .expect("parent");
        p.children
            .iter()
            .map(|c: &Child| {
                (
                    c.when.clone(),
                    c.parameters.iter().map(|p| p.id.clone()).collect(),
                )
            })
            .collect()
    }

    fn spec() -> StudySpec {
        serde_json::from_value(json!({
            "name": "grow",
            "metrics": [{"id": "loss", "goal": "minimize"}],
            "parameters": [
                {"id": "lr", "type": "double", "min": 0.0001, "max": 1, "scale": "log"},
                {"id": "optimizer", "type": "categorical", "values": ["sgd", "adam", "rmsprop"]},
                {"id": "layers", "type": "integer", "min": 1, "max": 3},
            ],
            "max_trials": 20,
            "seed": 1,
        }))
        .expect("spec")
    }

    fn ext(body: serde_json::Value) -> ParameterExtension {
        serde_json::from_value(body).expect("extension")
    }

    fn momentum(parent_values: serde_json::Value) -> ParameterExtension {
        ext(json!({
            "parameter": {"id": "momentum", "type": "double", "min": 0, "max": 1},
            "parent": {"id": "optimizer", "values": parent_values},
        }))
    }

    fn grown(spec: &StudySpec, extension: &ParameterExtension) -> (StudySpec, StudyConfig) {
        spec.extend_space(extension)
            .expect("accepted")
            .expect("changed")
    }

    #[test]
    fn a_child_joins_its_parent_and_more_parent_values_widen_it_alone() {
        let (one, config) = grown(&spec(), &momentum(json!(["sgd"])));
        assert_eq!(
            child_ids(&config, "optimizer"),
            [(vec![Value::Str("sgd".into())], vec!["momentum".into()])]
        );
        // A sibling under the same value shares the group...
        let nesterov = ext(json!({
            "parameter": {"id": "nesterov", "type": "categorical", "values": ["yes", "no"]},
            "parent": {"id": "optimizer", "values": ["sgd"]},
        }));
        let (two, _) = grown(&one, &nesterov);
        // ...and is left there when momentum is widened to rmsprop.
        let (three, config) = grown(&two, &momentum(json!(["rmsprop"])));
        let s = |v: &str| Value::Str(v.into());
        assert_eq!(
            child_ids(&config, "optimizer"),
            [
                (vec![s("sgd")], vec!["nesterov".to_string()]),
                (vec![s("sgd"), s("rmsprop")], vec!["momentum".to_string()]),
            ]
        );
        // Asking again for what is there changes nothing.
        for again in [
            momentum(json!(["rmsprop", "sgd"])),
            momentum(json!(["sgd"])),
        ] {
            assert_eq!(three.extend_space(&again), Ok(None));
        }
    }

    #[test]
    fn an_integer_parent_takes_its_values_as_integers() {
        let units = ext(json!({
            "parameter": {"id": "units_2", "type": "integer", "min": 4, "max": 64},
            "parent": {"id": "layers", "values": [3.0, 2, 3]},
        }));
        let (_, config) = grown(&spec(), &units);
        assert_eq!(
            child_ids(&config, "layers"),
            [(
                vec![Value::Int(3), Value::Int(2)],
                vec!["units_2".to_string()]
            )]
        );
    }

    #[test]
    fn a_top_level_parameter_is_appended_and_repeating_it_is_a_no_op() {
        let dropout =
            ext(json!({"parameter": {"id": "dropout", "type": "double", "min": 0, "max": 0.5}}));
        let (next, config) = grown(&spec(), &dropout);
        assert_eq!(
            next.parameters.last().map(|p| p.id.as_str()),
            Some("dropout")
        );
        assert_eq!(config.parameter_count, 4);
        assert_eq!(next.extend_space(&dropout), Ok(None));
    }

    #[test]
    fn every_refusal_names_its_field() {
        let (with_momentum, _) = grown(&spec(), &momentum(json!(["sgd"])));
        let cases = [
            // another definition of an existing parameter: 409 on the field that differs
            (
                json!({"parameter": {"id": "lr", "type": "double", "min": 0.001, "max": 1, "scale": "log"}}),
                "parameter.min",
                true,
            ),
            (
                json!({"parameter": {"id": "lr", "type": "double", "min": 0.0001, "max": 1}}),
                "parameter.scale",
                true,
            ),
            (
                json!({"parameter": {"id": "lr", "type": "integer", "min": 1, "max": 2}}),
                "parameter.type",
                true,
            ),
            (
                json!({"parameter": {"id": "optimizer", "type": "categorical", "values": ["sgd"]}}),
                "parameter.values",
                true,
            ),
            // an existing parameter under another parent, or none
            (
                json!({"parameter": {"id": "lr", "type": "double", "min": 0.0001, "max": 1, "scale": "log"},
                    "parent": {"id": "optimizer", "values": ["sgd"]}}),
                "parent",
                true,
            ),
            (
                json!({"parameter": {"id": "momentum", "type": "double", "min": 0, "max": 1}}),
                "parent.id",
                true,
            ),
            (
                json!({"parameter": {"id": "momentum", "type": "double", "min": 0, "max": 1},
                    "parent": {"id": "layers", "values": [1]}}),
                "parent.id",
                true,
            ),
            // bad input
            (
                json!({"parameter": {"id": "x", "type": "double", "min": 1, "max": 0}}),
                "parameter.min",
                false,
            ),
            (
                json!({"parameter": {"id": "bad id", "type": "double", "min": 0, "max": 1}}),
                "parameter.id",
                false,
            ),
            (
                json!({"parameter": {"id": "x", "type": "double", "min": 0, "max": 1},
                    "parent": {"id": "nope", "values": ["sgd"]}}),
                "parent.id",
                false,
            ),
            (
                json!({"parameter": {"id": "x", "type": "double", "min": 0, "max": 1},
                    "parent": {"id": "lr", "values": [0.1]}}),
                "parent.id",
                false,
            ),
            (
                json!({"parameter": {"id": "x", "type": "double", "min": 0, "max": 1},
                    "parent": {"id": "optimizer", "values": []}}),
                "parent.values",
                false,
            ),
            (
                json!({"parameter": {"id": "x", "type": "double", "min": 0, "max": 1},
                    "parent": {"id": "optimizer", "values": ["sgd", "lamb"]}}),
                "parent.values[1]",
                false,
            ),
            (
                json!({"parameter": {"id": "x", "type": "double", "min": 0, "max": 1},
                    "parent": {"id": "layers", "values": [4]}}),
                "parent.values[0]",
                false,
            ),
            (
                json!({"parameter": {"id": "x", "type": "categorical", "values": ["a"],
                    "children": [{"when": ["a"], "parameters": [{"id": "lr", "type": "double", "min": 0, "max": 1}]}]}}),
                "parameter.children[0].parameters[0].id",
                false,
            ),
        ];
        for (body, field, is_conflict) in cases {
            let err = with_momentum
                .extend_space(&ext(body.clone()))
                .expect_err(&body.to_string());
            let (got, conflict) = match err {
                ExtensionError::Invalid(v) => (v.field, false),
                ExtensionError::Conflict { field, .. } => (field, true),
            };
            assert_eq!((got.as_str(), conflict), (field, is_conflict), "{body}");
        }
    }

    #[test]
    fn a_trial_takes_a_value_only_where_the_parameter_is_active() {
        let (_, config) = grown(&spec(), &momentum(json!(["sgd"])));
        let trial = |optimizer: &str| -> Assignment {
            [("optimizer".to_string(), Value::Str(optimizer.into()))].into()
        };
        let v = Value::Int(1);
        assert_eq!(
            trial_value(&config, "momentum", &trial("sgd"), &v, "trials[0]"),
            Ok(Some(Value::Float(1.0))),
            "a double's value is stored as a float"
        );
        let refused = |a: &Assignment, value: &Value| match trial_value(
            &config,
            "momentum",
            a,
            value,
            "trials[0]",
        ) {
            Err(ExtensionError::Invalid(e)) => e.field,
            Err(ExtensionError::Conflict { field, .. }) => format!("conflict {field}"),
            Ok(v) => format!("accepted {v:?}"),
        };
        assert_eq!(refused(&trial("adam"), &v), "trials[0].id");
        assert_eq!(
            refused(&trial("sgd"), &Value::Float(1.5)),
            "trials[0].value"
        );
        let mut has = trial("sgd");
        has.insert("momentum".into(), Value::Float(0.9));
        assert_eq!(
            refused(&has, &Value::Float(0.5)),
            "conflict trials[0].value"
        );
        assert_eq!(
            trial_value(&config, "momentum", &has, &Value::Float(0.9), "t"),
            Ok(None)
        );
    }
}
