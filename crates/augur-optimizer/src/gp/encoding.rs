//! Encoding of assignments as points of `[0, 1]^D` for the GP.
//!
//! Every parameter of the tree, in [`SearchSpace::all_parameters`] order, owns fixed
//! features:
//! - double, integer, discrete: one feature, the parameter's scaled unit position
//!   ([`ParameterKind::to_unit`], so log and reverse-log scales are honoured); integers and
//!   discrete values are treated as continuous and snapped back to the nearest feasible
//!   value by [`Encoder::snap`];
//! - categorical with `k` values: `k` one-hot features.
//!
//! An inactive conditional parameter sets its features to a fixed value ([`INACTIVE`] for
//! numbers, all zeros for one-hot), so every trial has a point of the same dimension and
//! trials that share a branch are compared only on what they share.

use crate::space::{Assignment, Parameter, ParameterKind, SearchSpace, Value};

/// Value of the feature of an inactive numeric parameter.
pub const INACTIVE: f64 = 0.5;

/// How the features of one parameter are laid out.
#[derive(Debug, Clone)]
struct Slot {
    offset: usize,
    /// Number of categories for a categorical, else 1.
    width: usize,
}

/// Maps assignments of one search space to and from feature vectors.
#[derive(Debug, Clone)]
pub struct Encoder {
    space: SearchSpace,
    /// Feature layout per parameter id, in `all_parameters` order.
    slots: Vec<(String, ParameterKind, Slot)>,
    dim: usize,
}

impl Encoder {
    pub fn new(space: &SearchSpace) -> Self {
        let mut slots = Vec::new();
        let mut offset = 0;
        for p in space.all_parameters() {
            let width = match &p.kind {
                ParameterKind::Categorical { values } => values.len().max(1),
                _ => 1,
            };
            slots.push((p.id.clone(), p.kind.clone(), Slot { offset, width }));
            offset += width;
        }
        Encoder {
            space: space.clone(),
            slots,
            dim: offset,
        }
    }

    /// Number of features `D`.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of parameters in the tree (the "d" of the search space).
    pub fn num_parameters(&self) -> usize {
        self.slots.len()
    }

    /// The feature vector of `assignment`. Values that do not belong to their parameter
    /// (which validated input never has) encode like inactive ones.
    pub fn encode(&self, assignment: &Assignment) -> Vec<f64> {
        let mut x = vec![0.0; self.dim];
        for (id, kind, slot) in &self.slots {
            let value = assignment.get(id);
            match kind {
                ParameterKind::Categorical { values } => {
                    if let Some(Value::Str(s)) = value
                        && let Some(i) = values.iter().position(|v| v == s)
                    {
                        x[slot.offset + i] = 1.0;
                    }
                }
                _ => {
                    x[slot.offset] = value.and_then(|v| kind.to_unit(v)).unwrap_or(INACTIVE);
                }
            }
        }
        x
    }

    /// The assignment a feature vector stands for: numbers snap to the nearest feasible
    /// value, categoricals take the largest one-hot feature, and only parameters active
    /// under the chosen parent values are set.
    pub fn decode(&self, x: &[f64]) -> Assignment {
        let index: std::collections::HashMap<&str, usize> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, (id, _, _))| (id.as_str(), i))
            .collect();
        self.space.sample_with(|p: &Parameter| {
            let slot = index.get(p.id.as_str()).map(|&i| &self.slots[i].2);
            let Some(slot) = slot else {
                return p.kind.from_unit(0.5);
            };
            match &p.kind {
                ParameterKind::Categorical { values } => {
                    let block = &x[slot.offset..slot.offset + slot.width];
                    let best = block
                        .iter()
                        .enumerate()
                        .max_by(|a, b| a.1.total_cmp(b.1))
                        .map(|(i, _)| i)
                        .unwrap_or(0);
                    Value::Str(values.get(best).cloned().unwrap_or_default())
                }
                kind => kind.from_unit(x[slot.offset]),
            }
        })
    }

    /// The feature vector of the feasible point nearest to `x` (decode then encode).
    pub fn snap(&self, x: &[f64]) -> Vec<f64> {
        self.encode(&self.decode(x))
    }

    /// Whether every parameter is a double (then snapping is the identity on `[0, 1]^D`).
    pub fn is_continuous(&self) -> bool {
        self.slots
            .iter()
            .all(|(_, k, _)| matches!(k, ParameterKind::Double { .. }))
            && self
                .space
                .all_parameters()
                .iter()
                .all(|p| p.children.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{Child, Scale};

    fn p(id: &str, kind: ParameterKind) -> Parameter {
        Parameter {
            id: id.into(),
            kind,
            children: vec![],
        }
    }

    fn every_kind_space() -> SearchSpace {
        let mut parameters = Vec::new();
        for (i, scale) in [Scale::Linear, Scale::Log, Scale::ReverseLog]
            .into_iter()
            .enumerate()
        {
            parameters.push(p(
                &format!("d{i}"),
                ParameterKind::Double {
                    min: 0.01,
                    max: 0.99,
                    scale,
                },
            ));
            parameters.push(p(
                &format!("i{i}"),
                ParameterKind::Integer {
                    min: 1,
                    max: 100,
                    scale,
                },
            ));
            parameters.push(p(
                &format!("q{i}"),
                ParameterKind::Discrete {
                    values: vec![1.0, 2.0, 4.5, 64.0],
                    scale,
                },
            ));
        }
        let mut opt = p(
            "optimizer",
            ParameterKind::Categorical {
                values: vec!["sgd".into(), "adam".into()],
            },
        );
        opt.children.push(Child {
            when: vec![Value::Str("sgd".into())],
            parameters: vec![p(
                "momentum",
                ParameterKind::Double {
                    min: 0.0,
                    max: 0.99,
                    scale: Scale::Linear,
                },
            )],
        });
        parameters.push(opt);
        SearchSpace { parameters }
    }

    #[test]
    fn every_type_and_scale_round_trips_through_the_encoding() {
        let space = every_kind_space();
        let enc = Encoder::new(&space);
        assert_eq!(enc.dim(), 9 + 2 + 1);
        for k in 0..200u64 {
            let a = crate::quasi_random::quasi_random_assignment(&space, 5, k);
            let x = enc.encode(&a);
            assert!(x.iter().all(|v| (0.0..=1.0).contains(v)));
            let back = enc.decode(&x);
            for (id, v) in &a {
                match (v, &back[id]) {
                    (Value::Float(a), Value::Float(b)) => {
                        assert!((a - b).abs() <= 1e-9 * a.abs().max(1.0), "{id}: {a} vs {b}")
                    }
                    (a, b) => assert_eq!(a, b, "{id}"),
                }
            }
            assert_eq!(back.len(), a.len());
        }
    }

    #[test]
    fn inactive_children_take_the_fixed_value_and_snapping_makes_points_feasible() {
        let space = every_kind_space();
        let enc = Encoder::new(&space);
        let mut x = vec![0.37; enc.dim()];
        // one-hot block of `optimizer`: prefer adam, so momentum is inactive.
        let off = enc.dim() - 3;
        x[off] = 0.2;
        x[off + 1] = 0.9;
        let snapped = enc.snap(&x);
        assert_eq!(&snapped[off..off + 3], &[0.0, 1.0, INACTIVE]);
        let a = enc.decode(&snapped);
        assert_eq!(space.check_assignment(&a), Ok(()));
        assert!(!a.contains_key("momentum"));
        assert_eq!(enc.snap(&snapped), snapped, "snapping is idempotent");
    }
}
