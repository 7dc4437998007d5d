//! Search spaces: parameters, their domains and scales, conditional children, and the values
//! a trial assigns to them.
//!
//! These types are already validated: the service builds them from user input and rejects
//! bad specs with the offending field named (see `SearchSpace::validate`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One parameter value. Integers and whole discrete values are `Int`, other numbers `Float`,
/// categoricals `Str`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Value {
    Int(i64),
    Float(f64),
    Str(String),
}

/// By hand rather than `untagged`: that buffers every value before trying each variant, and
/// a 50,000-trial study reads 150,000 of them for one dashboard load.
impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ValueVisitor;
        impl serde::de::Visitor<'_> for ValueVisitor {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
                Ok(Value::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
                // Past i64::MAX only a float can hold it, as `untagged` did.
                Ok(i64::try_from(v).map_or(Value::Float(v as f64), Value::Int))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
                Ok(Value::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Value, E> {
                Ok(Value::Str(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Value, E> {
                Ok(Value::Str(v))
            }
        }
        deserializer.deserialize_any(ValueVisitor)
    }
}

impl Value {
    /// The numeric value, if this is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            Value::Str(_) => None,
        }
    }

    /// A discrete value as stored: whole numbers become `Int` so they print without a point.
    pub fn from_number(x: f64) -> Value {
        if x.fract() == 0.0 && x.abs() < 9.0e15 {
            Value::Int(x as i64)
        } else {
            Value::Float(x)
        }
    }
}

/// The values of the active parameters of one trial, by parameter id. Inactive conditional
/// parameters are absent.
pub type Assignment = BTreeMap<String, Value>;

/// How a numeric parameter is spread over its range when searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    #[default]
    Linear,
    /// Uniform in log(x): for learning rates, regularization strengths. Requires min > 0.
    Log,
    /// Dense near max: for values like momentum close to 1. Requires min > 0 as well.
    ReverseLog,
}

/// The domain of one parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ParameterKind {
    Double {
        min: f64,
        max: f64,
        scale: Scale,
    },
    Integer {
        min: i64,
        max: i64,
        scale: Scale,
    },
    /// Strictly increasing numeric values.
    Discrete {
        values: Vec<f64>,
        scale: Scale,
    },
    Categorical {
        values: Vec<String>,
    },
}

/// Parameters that are active only when their parent takes one of `when`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Child {
    /// Parent values (categorical strings, or integers/discrete numbers) that activate the
    /// child parameters.
    pub when: Vec<Value>,
    pub parameters: Vec<Parameter>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parameter {
    pub id: String,
    pub kind: ParameterKind,
    pub children: Vec<Child>,
}

/// A tree of parameters; children are conditional on their parent's value.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SearchSpace {
    pub parameters: Vec<Parameter>,
}

impl Parameter {
    /// Whether `value` (the parent's value) activates `child`.
    pub fn activates(child: &Child, value: &Value) -> bool {
        child.when.iter().any(|w| values_match(w, value))
    }
}

/// Equality of parameter values across Int/Float representations of the same number.
pub fn values_match(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => x == y,
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

impl ParameterKind {
    /// Map a unit-interval coordinate `u` in [0, 1] to a feasible value of this parameter,
    /// honouring the scale. Integers and discrete values snap to the nearest feasible value
    /// in the scaled space; categoricals pick bucket `floor(u * k)`.
    pub fn from_unit(&self, u: f64) -> Value {
        let u = u.clamp(0.0, 1.0);
        match self {
            ParameterKind::Double { min, max, scale } => {
                Value::Float(unscale(u, *min, *max, *scale).clamp(*min, *max))
            }
            ParameterKind::Integer { min, max, scale } => {
                // Widen by half a step each side so every integer gets an equal share of the
                // linear range.
                let (lo, hi) = (*min as f64 - 0.5, *max as f64 + 0.5);
                let x = match scale {
                    Scale::Linear => lo + u * (hi - lo),
                    _ => unscale(u, *min as f64, *max as f64, *scale),
                };
                Value::Int((x.round() as i64).clamp(*min, *max))
            }
            ParameterKind::Discrete { values, scale } => {
                let (first, last) = (values[0], values[values.len() - 1]);
                if values.len() == 1 {
                    return Value::from_number(first);
                }
                let target = unscale(u, first, last, *scale);
                let t = to_unit(target, first, last, *scale);
                let nearest = values
                    .iter()
                    .copied()
                    .min_by(|a, b| {
                        let da = (to_unit(*a, first, last, *scale) - t).abs();
                        let db = (to_unit(*b, first, last, *scale) - t).abs();
                        da.total_cmp(&db)
                    })
                    .unwrap_or(first);
                Value::from_number(nearest)
            }
            ParameterKind::Categorical { values } => {
                let k = values.len();
                let i = ((u * k as f64).floor() as usize).min(k - 1);
                Value::Str(values[i].clone())
            }
        }
    }

    /// Map a value of this parameter to [0, 1] (inverse of [`Self::from_unit`] for numeric kinds;
    /// the bucket centre for categoricals). `None` if the value does not belong here.
    pub fn to_unit(&self, value: &Value) -> Option<f64> {
        match (self, value) {
            (ParameterKind::Categorical { values }, Value::Str(s)) => {
                let i = values.iter().position(|v| v == s)?;
                Some((i as f64 + 0.5) / values.len() as f64)
            }
            (ParameterKind::Categorical { .. }, _) => None,
            (_, Value::Str(_)) => None,
            (ParameterKind::Double { min, max, scale }, v) => {
                Some(to_unit(v.as_f64()?, *min, *max, *scale))
            }
            (ParameterKind::Integer { min, max, scale }, v) => {
                let x = v.as_f64()?;
                Some(match scale {
                    Scale::Linear => {
                        let (lo, hi) = (*min as f64 - 0.5, *max as f64 + 0.5);
                        ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
                    }
                    _ => to_unit(x, *min as f64, *max as f64, *scale),
                })
            }
            (ParameterKind::Discrete { values, scale }, v) => {
                let x = v.as_f64()?;
                if values.len() == 1 {
                    return Some(0.5);
                }
                Some(to_unit(x, values[0], values[values.len() - 1], *scale))
            }
        }
    }

    /// Whether `value` is a feasible value of this parameter.
    pub fn contains(&self, value: &Value) -> bool {
        match (self, value) {
            (ParameterKind::Double { min, max, .. }, v) => {
                matches!(v.as_f64(), Some(x) if x.is_finite() && x >= *min && x <= *max)
            }
            (ParameterKind::Integer { min, max, .. }, v) => matches!(
                v.as_f64(), Some(x) if x.fract() == 0.0 && x >= *min as f64 && x <= *max as f64
            ),
            (ParameterKind::Discrete { values, .. }, v) => {
                matches!(v.as_f64(), Some(x) if values.contains(&x))
            }
            (ParameterKind::Categorical { values }, Value::Str(s)) => values.contains(s),
            (ParameterKind::Categorical { .. }, _) => false,
        }
    }
}

/// Scaled position of `x` in [min, max]: linear, log, or reverse-log.
fn to_unit(x: f64, min: f64, max: f64, scale: Scale) -> f64 {
    if max <= min {
        return 0.5;
    }
    let u = match scale {
        Scale::Linear => (x - min) / (max - min),
        Scale::Log => (x.ln() - min.ln()) / (max.ln() - min.ln()),
        // Reverse log: 1 - log-position of the mirrored value (max + min - x).
        Scale::ReverseLog => 1.0 - ((max + min - x).ln() - min.ln()) / (max.ln() - min.ln()),
    };
    u.clamp(0.0, 1.0)
}

/// Inverse of [`to_unit`]. The bounds come back exactly (exp(ln(0.5)) is
/// 0.49999999999999994, which a trainer is handed as an argument), and nothing lands outside
/// them by rounding.
fn unscale(u: f64, min: f64, max: f64, scale: Scale) -> f64 {
    if u <= 0.0 {
        return min;
    }
    if u >= 1.0 {
        return max;
    }
    let x = match scale {
        Scale::Linear => min + u * (max - min),
        Scale::Log => (min.ln() + u * (max.ln() - min.ln())).exp(),
        Scale::ReverseLog => max + min - (min.ln() + (1.0 - u) * (max.ln() - min.ln())).exp(),
    };
    x.clamp(min.min(max), max.max(min))
}

impl SearchSpace {
    /// Linear doubles in [0, 1], one per id: the unit box (benchmarks and tests).
    pub fn unit_box(ids: &[&str]) -> Self {
        let parameters = ids
            .iter()
            .map(|id| Parameter {
                id: (*id).into(),
                kind: ParameterKind::Double {
                    min: 0.0,
                    max: 1.0,
                    scale: Scale::Linear,
                },
                children: Vec::new(),
            })
            .collect();
        SearchSpace { parameters }
    }

    /// Walk the tree, choosing each parameter's value with `pick(path_index, parameter)`,
    /// descending into children that the chosen value activates. Returns only active
    /// parameters, so conditional spaces work with every designer.
    pub fn sample_with(&self, mut pick: impl FnMut(&Parameter) -> Value) -> Assignment {
        let mut out = Assignment::new();
        fn walk(
            params: &[Parameter],
            out: &mut Assignment,
            pick: &mut dyn FnMut(&Parameter) -> Value,
        ) {
            for p in params {
                let v = pick(p);
                for child in &p.children {
                    if Parameter::activates(child, &v) {
                        walk(&child.parameters, out, pick);
                    }
                }
                out.insert(p.id.clone(), v);
            }
        }
        walk(&self.parameters, &mut out, &mut pick);
        out
    }

    /// Every parameter in the tree, parents before children, in spec order.
    pub fn all_parameters(&self) -> Vec<&Parameter> {
        fn walk<'a>(params: &'a [Parameter], out: &mut Vec<&'a Parameter>) {
            for p in params {
                out.push(p);
                for c in &p.children {
                    walk(&c.parameters, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.parameters, &mut out);
        out
    }

    /// Whether parameter `id` is active under `assignment`: it is a top-level parameter, or
    /// its parent is active and set to a value that activates it. A parent the assignment
    /// lacks (a trial stored before the parent was added to the space) activates nothing.
    pub fn is_active(&self, id: &str, assignment: &Assignment) -> bool {
        fn walk(params: &[Parameter], id: &str, a: &Assignment) -> bool {
            params.iter().any(|p| {
                p.id == id
                    || a.get(&p.id).is_some_and(|v| {
                        p.children
                            .iter()
                            .any(|c| Parameter::activates(c, v) && walk(&c.parameters, id, a))
                    })
            })
        }
        walk(&self.parameters, id, assignment)
    }

    /// Check that `assignment` sets exactly the active parameters, each to a feasible value.
    /// On failure, returns the id of the offending parameter and what is wrong.
    pub fn check_assignment(&self, assignment: &Assignment) -> Result<(), (String, String)> {
        fn walk<'a>(
            params: &'a [Parameter],
            a: &Assignment,
            active: &mut Vec<&'a str>,
        ) -> Result<(), (String, String)> {
            for p in params {
                let Some(v) = a.get(&p.id) else {
                    return Err((p.id.clone(), "missing value for an active parameter".into()));
                };
                if !p.kind.contains(v) {
                    return Err((
                        p.id.clone(),
                        format!("{v:?} is outside the parameter's domain"),
                    ));
                }
                active.push(&p.id);
                for child in &p.children {
                    if Parameter::activates(child, v) {
                        walk(&child.parameters, a, active)?;
                    }
                }
            }
            Ok(())
        }
        let mut active = Vec::new();
        walk(&self.parameters, assignment, &mut active)?;
        if let Some(extra) = assignment.keys().find(|k| !active.contains(&k.as_str())) {
            return Err((
                extra.clone(),
                "not an active parameter of this search space".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_bounds_of_every_scale_come_back_exactly() {
        for scale in [Scale::Linear, Scale::Log, Scale::ReverseLog] {
            for (min, max) in [(0.0003, 0.5), (1e-6, 1.0), (0.1, 0.3)] {
                if min <= 0.0 && scale != Scale::Linear {
                    continue;
                }
                assert_eq!(unscale(0.0, min, max, scale), min, "{scale:?}");
                assert_eq!(unscale(1.0, min, max, scale), max, "{scale:?}");
                let inside = unscale(0.999_999_999_999, min, max, scale);
                assert!((min..=max).contains(&inside), "{scale:?} {inside}");
            }
        }
        // What a log-scaled parameter's top bound was handed as before.
        assert_ne!((0.0003f64.ln() + (0.5f64.ln() - 0.0003f64.ln())).exp(), 0.5);
    }
    use super::*;

    #[test]
    fn a_child_is_active_only_under_an_active_parent_set_to_one_of_its_values() {
        let double = |id: &str| Parameter {
            id: id.into(),
            kind: ParameterKind::Double {
                min: 0.0,
                max: 1.0,
                scale: Scale::Linear,
            },
            children: Vec::new(),
        };
        let categorical = |id: &str, children: Vec<Child>| Parameter {
            id: id.into(),
            kind: ParameterKind::Categorical {
                values: vec!["sgd".into(), "adam".into(), "rmsprop".into()],
            },
            children,
        };
        let under = |when: &[&str], parameters| Child {
            when: when.iter().map(|w| Value::Str((*w).into())).collect(),
            parameters,
        };
        // optimizer ∈ {sgd, rmsprop} → momentum; sgd → schedule (a categorical) → decay
        let space = SearchSpace {
            parameters: vec![
                double("lr"),
                categorical(
                    "optimizer",
                    vec![
                        under(&["sgd", "rmsprop"], vec![double("momentum")]),
                        under(
                            &["sgd"],
                            vec![categorical(
                                "schedule",
                                vec![under(&["adam"], vec![double("decay")])],
                            )],
                        ),
                    ],
                ),
            ],
        };
        let a = |pairs: &[(&str, &str)]| -> Assignment {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Value::Str(v.to_string())))
                .collect()
        };
        let sgd = a(&[("optimizer", "sgd"), ("schedule", "adam")]);
        for id in ["lr", "optimizer", "momentum", "schedule", "decay"] {
            assert!(space.is_active(id, &sgd), "{id} under sgd");
        }
        let rmsprop = a(&[("optimizer", "rmsprop")]);
        assert!(space.is_active("momentum", &rmsprop));
        assert!(!space.is_active("schedule", &rmsprop));
        assert!(!space.is_active("decay", &rmsprop));
        // A trial stored before `optimizer` existed: only top-level parameters are active.
        let old = a(&[]);
        assert!(space.is_active("optimizer", &old) && space.is_active("lr", &old));
        assert!(!space.is_active("momentum", &old));
        assert!(!space.is_active("nothing", &sgd), "not in the space at all");
    }

    #[test]
    fn values_parse_by_json_type_and_round_trip() {
        let parsed: Vec<Value> =
            serde_json::from_str(r#"[3, -2, 0.1, 1.0, 1e300, "rbf", 18446744073709551615]"#)
                .expect("valid values");
        assert_eq!(
            parsed,
            [
                Value::Int(3),
                Value::Int(-2),
                Value::Float(0.1),
                Value::Float(1.0),
                Value::Float(1e300),
                Value::Str("rbf".into()),
                Value::Float(18446744073709551615.0),
            ]
        );
        let text = serde_json::to_string(&parsed[..6]).expect("serializes");
        let again: Vec<Value> = serde_json::from_str(&text).expect("parses back");
        assert_eq!(again, parsed[..6]);
        for bad in ["true", "null", "[1]", r#"{"a": 1}"#] {
            let err = serde_json::from_str::<Value>(bad)
                .expect_err(bad)
                .to_string();
            assert!(err.contains("a number or a string"), "{bad}: {err}");
        }
    }
}
