//! Quasi-random search: placeholder until the scrambled sequence lands.
use crate::designer::{Designer, DesignerInput, DesignerOutput};

pub struct QuasiRandomDesigner;

impl Designer for QuasiRandomDesigner {
    fn suggest(&self, input: &DesignerInput<'_>) -> DesignerOutput {
        crate::random::RandomDesigner.suggest(input)
    }
    fn uses_history(&self) -> bool {
        false
    }
}
