//! The one error type of the `pipeline` module.

/// What the memory handover between stages can report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// The allowance was closed (the stage it served was dropped) while a read waited for
    /// `wanted` bytes of it.
    #[error("the allowance of stage {stage:?} was closed while a read waited for {wanted} bytes")]
    Closed {
        /// The stage's name.
        stage: String,
        /// Bytes the waiting read asked for.
        wanted: u64,
    },

    /// A plan without budgets (a manual plan not resolved for a model) cannot say what it holds.
    #[error("the plan of stage {stage:?} is not resolved for a model: it has no budgets to predict from")]
    Unresolved {
        /// The stage's name.
        stage: String,
    },
}
