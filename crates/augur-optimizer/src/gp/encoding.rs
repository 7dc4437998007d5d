//! Encoding of assignments as points of `[0, 1]^D` for the GP.

use crate::space::{Assignment, Parameter, ParameterKind, SearchSpace, Value};

/// Value of the feature of an inactive numeric parameter.
pub const INACTIVE: f64 = 0.5;

/// The id prefix of a context parameter (see the module's doc).
pub const CONTEXT_PREFIX: &str = "augur:";

/// Where the feature of one parameter is.
#[derive(Debug, Clone)]
struct Slot {
    offset: usize,
}

/// Maps assignments of one search space to and from feature vectors.
///
/// Every parameter of the tree, in [`SearchSpace::all_parameters`] order, owns one feature:
/// - double, integer, discrete: the parameter's scaled unit position
///   ([`ParameterKind::to_unit`], so log and reverse-log scales are honoured); integers and
///   discrete values are treated as continuous and snapped back to the nearest feasible
///   value by [`Encoder::snap`];
/// - categorical with `k` values: the category's index `0..k` as a number, compared by the
///   kernel's Hamming term (equal or not, see [`crate::gp::kernel`]), never by its size.
///
/// An inactive conditional parameter sets its feature to a fixed value ([`INACTIVE`] for
/// numbers, the extra level `k` for a categorical), so every trial has a point of the same
/// dimension and trials that share a branch are compared only on what they share.
///
/// A *context* parameter (a double whose id starts with [`CONTEXT_PREFIX`], which the
/// service's ids cannot) is an input the model learns over but the search does not choose:
/// [`Encoder::pin_context`] sets its feature to 1 (its maximum) in every candidate. A
/// multi-fidelity scheduler's GP over configuration × budget has the budget as one, so that
/// it proposes configurations by their predicted value at the full budget
/// ([`crate::multi_fidelity::history`]). Spaces without one encode as before.
#[derive(Debug, Clone)]
pub struct Encoder {
    space: SearchSpace,
    /// Feature layout per parameter id, in `all_parameters` order.
    slots: Vec<(String, ParameterKind, Slot)>,
    dim: usize,
    /// Features of the context parameters, pinned to 1 in every candidate.
    context: Vec<usize>,
}

impl Encoder {
    pub fn new(space: &SearchSpace) -> Self {
        let mut slots = Vec::new();
        let mut context = Vec::new();
        let mut offset = 0;
        for p in space.all_parameters() {
            if p.id.starts_with(CONTEXT_PREFIX) && matches!(p.kind, ParameterKind::Double { .. }) {
                context.push(offset);
            }
            slots.push((p.id.clone(), p.kind.clone(), Slot { offset }));
            offset += 1;
        }
        Encoder {
            space: space.clone(),
            slots,
            dim: offset,
            context,
        }
    }

    /// Whether the space has context parameters (see the module's doc).
    pub fn has_context(&self) -> bool {
        !self.context.is_empty()
    }

    /// Whether feature `i` is a context feature.
    pub fn is_context(&self, i: usize) -> bool {
        self.context.contains(&i)
    }

    /// Sets every context feature of the candidate `x` to 1, its maximum.
    pub fn pin_context(&self, x: &mut [f64]) {
        for &i in &self.context {
            x[i] = 1.0;
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
                    x[slot.offset] = match value {
                        Some(Value::Str(s)) => values.iter().position(|v| v == s),
                        _ => None,
                    }
                    .unwrap_or(values.len()) as f64;
                }
                _ => {
                    x[slot.offset] = value.and_then(|v| kind.to_unit(v)).unwrap_or(INACTIVE);
                }
            }
        }
        x
    }

    /// Whether every value that `assignment` gives a parameter of this space is feasible
    /// for it (parameters it lacks, or that the space lacks, do not matter). Prior
    /// studies' trials come from other spaces: a value outside this one's domain (a log
    /// scale's non-positive value above all) would encode as NaN.
    pub fn accepts(&self, assignment: &Assignment) -> bool {
        self.slots
            .iter()
            .all(|(id, kind, _)| match assignment.get(id) {
                Some(v) => kind.contains(v),
                None => true,
            })
    }

    /// The assignment a feature vector stands for: numbers snap to the nearest feasible
    /// value, categoricals take the level of their (rounded) index (the last level for the
    /// inactive marker), and only parameters active under the chosen parent values are set.
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
                    let i = x[slot.offset].round().max(0.0) as usize;
                    let i = i.min(values.len().saturating_sub(1));
                    Value::Str(values.get(i).cloned().unwrap_or_default())
                }
                kind => kind.from_unit(x[slot.offset]),
            }
        })
    }

    /// The feature vector of the feasible point nearest to `x` (decode then encode).
    pub fn snap(&self, x: &[f64]) -> Vec<f64> {
        self.encode(&self.decode(x))
    }

    /// Per feature, whether it is categorical (for the kernel's Hamming term).
    pub fn categorical_mask(&self) -> Vec<bool> {
        self.slots
            .iter()
            .map(|(_, k, _)| matches!(k, ParameterKind::Categorical { .. }))
            .collect()
    }

    /// Per feature, the number of levels of a categorical (`None` for numeric features).
    pub fn levels(&self) -> Vec<Option<usize>> {
        self.slots
            .iter()
            .map(|(_, k, _)| match k {
                ParameterKind::Categorical { values } => Some(values.len()),
                _ => None,
            })
            .collect()
    }

    /// The feasible neighbours of the feasible point `x` that differ in one active
    /// parameter: every other level of each active categorical, and the next feasible value
    /// up and down of each active integer or discrete parameter. The acquisition search
    /// evaluates them all, since continuous moves cannot cross between levels.
    pub fn discrete_neighbours(&self, x: &[f64]) -> Vec<Vec<f64>> {
        let a = self.decode(x);
        let mut out = Vec::new();
        for (id, kind, slot) in &self.slots {
            let Some(v) = a.get(id) else { continue };
            let mut push = |u: f64| {
                let mut y = x.to_vec();
                y[slot.offset] = u;
                out.push(self.snap(&y));
            };
            match kind {
                ParameterKind::Double { .. } => {}
                ParameterKind::Categorical { values } => {
                    let current = x[slot.offset].round();
                    for i in 0..values.len() {
                        if i as f64 != current {
                            push(i as f64);
                        }
                    }
                }
                ParameterKind::Integer { min, max, .. } => {
                    let Some(i) = v.as_f64() else { continue };
                    for n in [i - 1.0, i + 1.0] {
                        if n >= *min as f64
                            && n <= *max as f64
                            && let Some(u) = kind.to_unit(&Value::Int(n as i64))
                        {
                            push(u);
                        }
                    }
                }
                ParameterKind::Discrete { values, .. } => {
                    let Some(i) = v.as_f64() else { continue };
                    let Some(pos) = values.iter().position(|w| *w == i) else {
                        continue;
                    };
                    for n in [pos.checked_sub(1), Some(pos + 1)].into_iter().flatten() {
                        if let Some(w) = values.get(n)
                            && let Some(u) = kind.to_unit(&Value::from_number(*w))
                        {
                            push(u);
                        }
                    }
                }
            }
        }
        out
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
        assert_eq!(enc.dim(), 9 + 1 + 1);
        for k in 0..200u64 {
            let a = crate::quasi_random::quasi_random_assignment(&space, 5, k);
            let x = enc.encode(&a);
            let levels = enc.levels();
            for (v, l) in x.iter().zip(&levels) {
                match l {
                    Some(k) => assert!(v.fract() == 0.0 && *v <= *k as f64),
                    None => assert!((0.0..=1.0).contains(v)),
                }
            }
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
        // `optimizer` (index 1 = adam) makes momentum inactive.
        let off = enc.dim() - 2;
        x[off] = 0.9;
        let snapped = enc.snap(&x);
        assert_eq!(&snapped[off..off + 2], &[1.0, INACTIVE]);
        let a = enc.decode(&snapped);
        assert_eq!(space.check_assignment(&a), Ok(()));
        assert!(!a.contains_key("momentum"));
        assert_eq!(enc.snap(&snapped), snapped, "snapping is idempotent");
    }

    #[test]
    fn discrete_neighbours_change_one_active_parameter_by_one_step_or_level() {
        let space = every_kind_space();
        let enc = Encoder::new(&space);
        let a = crate::quasi_random::quasi_random_assignment(&space, 5, 3);
        let x = enc.encode(&a);
        let neighbours = enc.discrete_neighbours(&x);
        // 6 integer/discrete parameters (up to 2 moves each) and one categorical of 2
        // levels (1 move).
        assert!(!neighbours.is_empty() && neighbours.len() <= 13);
        for n in &neighbours {
            let b = enc.decode(n);
            assert_eq!(space.check_assignment(&b), Ok(()));
            let changed: Vec<&String> = a
                .keys()
                .filter(|k| b.get(*k) != a.get(*k) && !k.starts_with("momentum"))
                .collect();
            assert_eq!(changed.len(), 1, "{a:?} -> {b:?}");
        }
        // Every level of the categorical is reachable in one move.
        let opt = enc.dim() - 2;
        assert!(neighbours.iter().any(|n| n[opt] != x[opt]));
    }

    #[test]
    fn categorical_features_are_marked_for_the_hamming_kernel() {
        let enc = Encoder::new(&every_kind_space());
        let mask = enc.categorical_mask();
        assert_eq!(mask.iter().filter(|c| **c).count(), 1);
        assert!(mask[enc.dim() - 2]);
        assert_eq!(enc.levels()[enc.dim() - 2], Some(2));
    }

    #[test]
    fn values_outside_the_domain_are_not_accepted() {
        let space = every_kind_space();
        let enc = Encoder::new(&space);
        let mut a = crate::quasi_random::quasi_random_assignment(&space, 5, 1);
        assert!(enc.accepts(&a));
        a.insert("unknown".into(), Value::Int(1));
        assert!(enc.accepts(&a), "other parameters do not matter");
        a.insert("d1".into(), Value::Float(-1.0));
        assert!(!enc.accepts(&a), "log scale, below the minimum");
    }

    #[test]
    fn only_context_doubles_are_pinned_and_other_spaces_have_none() {
        let mut space = every_kind_space();
        assert!(!Encoder::new(&space).has_context());
        space.parameters.push(p(
            "augur:budget",
            ParameterKind::Double {
                min: 0.0,
                max: 1.0,
                scale: Scale::Linear,
            },
        ));
        let enc = Encoder::new(&space);
        assert!(enc.has_context());
        let mut x = vec![0.25; enc.dim()];
        enc.pin_context(&mut x);
        assert_eq!(x[enc.dim() - 1], 1.0);
        assert!(x[..enc.dim() - 1].iter().all(|v| *v == 0.25), "{x:?}");
        assert!(enc.is_context(enc.dim() - 1) && !enc.is_context(0));
    }
}
