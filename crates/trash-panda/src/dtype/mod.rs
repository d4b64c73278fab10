//! Element types and the conversion kernels between them.

mod kind;

pub use kind::{DType, ACCEPTED_DTYPE_NAMES, ALL_DTYPES};

/// Errors of the dtype module.
#[derive(Debug, thiserror::Error)]
pub enum DtypeError {
    #[error("unknown dtype {name:?}: expected one of {accepted}")]
    UnknownName {
        name: String,
        accepted: &'static str,
    },
}
