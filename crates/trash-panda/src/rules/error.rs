//! The one error type of the `rules` module.

/// What the rules refuse: a staged layout they cannot make. The engine reports each as the
/// `StreamError` variant of the same name, with the same message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// An engine option has a value the rules do not support (a storage dtype with no
    /// conversion).
    #[error("invalid engine option {option} = {value}: expected {expected}")]
    InvalidOptions {
        /// The option's name, as the user spells it (e.g. `storage_dtype`).
        option: &'static str,
        /// The value given, as text.
        value: String,
        /// What the option accepts, for the message.
        expected: &'static str,
    },

    /// A staging alignment the layout cannot keep.
    #[error("staging alignment {align} is not supported: expected a power of two from 64 to 4096")]
    Alignment {
        /// The alignment asked for, in bytes.
        align: usize,
    },

    /// The description of a block does not fit its files (bad file index, a range that does not
    /// hold the tensor's shape).
    #[error("block {block} ({name}): {reason}")]
    InvalidBlock {
        /// The block's index in the list the engine was given.
        block: usize,
        /// The block's name.
        name: String,
        /// What does not fit, in words.
        reason: String,
    },
}
