//! Grid search: placeholder until the enumeration lands.
use crate::designer::{Designer, DesignerInput, DesignerOutput};

#[derive(Default)]
pub struct GridDesigner;

impl Designer for GridDesigner {
    fn suggest(&self, input: &DesignerInput<'_>) -> DesignerOutput {
        crate::random::RandomDesigner.suggest(input)
    }
    fn uses_history(&self) -> bool {
        false
    }
}
