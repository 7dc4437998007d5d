//! Uniform random search (in each parameter's scaled space).

use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::designer::{Designer, DesignerInput, DesignerOutput, trial_seed};

pub struct RandomDesigner;

impl Designer for RandomDesigner {
    fn suggest(&self, input: &DesignerInput<'_>) -> DesignerOutput {
        let suggestions = (0..input.count as u64)
            .map(|i| {
                let mut rng =
                    StdRng::seed_from_u64(trial_seed(input.seed, input.first_trial_number + i));
                input
                    .space
                    .sample_with(|p| p.kind.from_unit(rng.random::<f64>()))
            })
            .collect();
        DesignerOutput {
            suggestions,
            state: None,
        }
    }

    fn uses_history(&self) -> bool {
        false
    }
}
