//! The one error type of the `profile` module.

/// A profile event or summary that cannot be right. The profile refuses it instead of folding a
/// bad figure into every statistic after it; each variant names the block where there is one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// `Profile::new` got a different number of block names and tiers.
    #[error("profile: {names} block names but {tiers} tiers")]
    LengthMismatch {
        /// Block names given.
        names: usize,
        /// Tiers given.
        tiers: usize,
    },

    /// An event names a block index the profile was not created with.
    #[error("profile: block index {block} is out of range (the model has {blocks} blocks)")]
    UnknownBlock {
        /// The index the event gives.
        block: usize,
        /// Blocks the profile was created with.
        blocks: usize,
    },

    /// An event ends before it starts (two clocks mixed, or start and end swapped).
    #[error(
        "profile: block {block} ({name}): {what} ends at {end} s, before its start at {start} s"
    )]
    EndBeforeStart {
        /// The block's index.
        block: usize,
        /// The block's name.
        name: String,
        /// Which kind of event: "run" or "copy".
        what: &'static str,
        /// Its start, in seconds on the caller's clock.
        start: f64,
        /// Its end, in seconds on the same clock.
        end: f64,
    },

    /// A time is NaN, infinite or negative where only a finite, non-negative value makes sense.
    #[error("profile: {what}: {field} is {value}, expected a finite number of seconds >= 0")]
    BadSeconds {
        /// The event or summary the time belongs to, in words.
        what: String,
        /// The field holding it.
        field: &'static str,
        /// The value given.
        value: f64,
    },
}
