//! The one error type of the `pipeline` module.

/// What the memory handover between stages can report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// The allowance was closed (the stage it served was dropped) while a read waited for
    /// `wanted` bytes of it.
    ///
    /// What to do: a stage's model was released while another stage waited for its memory. Release
    /// the models of a pipeline through the pipeline (`close()`), not one by one while it runs.
    #[error("the allowance of stage {stage:?} was closed while a read waited for {wanted} bytes")]
    Closed {
        /// The stage's name.
        stage: String,
        /// Bytes the waiting read asked for.
        wanted: u64,
    },

    /// A plan without budgets (a manual plan not resolved for a model) cannot say what it holds.
    ///
    /// What to do: give each stage a plan made for its model (or planning options), not a manual
    /// plan that was never resolved.
    #[error("the plan of stage {stage:?} is not resolved for a model: it has no budgets to predict from")]
    Unresolved {
        /// The stage's name.
        stage: String,
    },

    /// A stage index past the pipeline's end was given to the room-making rule.
    #[error("{what}: stage index {index} is not in a pipeline of {stages} stages")]
    NoSuchStage {
        /// Which index was wrong.
        what: String,
        /// The index given.
        index: usize,
        /// How many stages the pipeline has.
        stages: usize,
    },

    /// The stage that needs room was also named as one of the stages to take it from.
    #[error("stage {stage:?} needs room and was also offered as a stage to take it from")]
    GivesToItself {
        /// The stage's name.
        stage: String,
    },

    /// Two holders share a name or a place in the pipeline.
    #[error("stages {first:?} and {second:?} were both offered as holders (at place {index}, or under one name)")]
    HolderTwice {
        /// The first holder.
        first: String,
        /// The second, which repeats it.
        second: String,
        /// The second's place in the pipeline.
        index: usize,
    },

    /// A group's schedule names no calls.
    ///
    /// What to do: give the calls of the run, for example `[("high", 20), ("low", 20)]`.
    #[error("group {group:?}: the schedule names no calls; expected (member, calls) pairs")]
    EmptySchedule {
        /// The group's name.
        group: String,
    },

    /// A group's schedule names a stage that is not one of its members.
    ///
    /// What to do: name the group's members (the stage names given to `Group(members=...)`).
    #[error("group {group:?}: the schedule names {member:?}, not a member; expected one of {}", members.join(", "))]
    UnknownMember {
        /// The group's name.
        group: String,
        /// The name given.
        member: String,
        /// The group's members.
        members: Vec<String>,
    },

    /// A stretch of a group's schedule has no calls.
    ///
    /// What to do: leave out a member that is not called, or give it one call or more.
    #[error(
        "group {group:?}: the schedule gives {member:?} no calls; expected at least 1 per stretch"
    )]
    NoCalls {
        /// The group's name.
        group: String,
        /// The member.
        member: String,
    },

    /// A member's calls in a row overflow the count.
    ///
    /// What to do: give the calls of one run; a schedule counts up to 4294967295 calls in a row.
    #[error("group {group:?}: {member:?} has more calls in a row than a schedule counts (expected at most {})", u32::MAX)]
    TooManyCalls {
        /// The group's name.
        group: String,
        /// The member.
        member: String,
    },
}
