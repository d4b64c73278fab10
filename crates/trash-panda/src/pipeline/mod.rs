//! The memory that moves between the stages of a pipeline: what a loaded stage holds and gives
//! back when it is released ([`Holds`]), the free memory predicted at the next stage's start
//! ([`Free::after_release`]), when a stage planned for that prediction is planned again
//! ([`replan`]), the allowance the next stage's early reads take their memory from
//! ([`Allowance`]), which loaded stages give memory to a stage that needs more ([`make_room`]),
//! whether the stages' loads read through the page cache ([`load_reads`]), and how a stage leaves
//! at its turn's end ([`depart`]).
//!
//! A stage is planned once, for the memory expected to be free when it starts; its reads begin
//! while the stage before it still computes, each taking its bytes from the allowance, which
//! starts at what is free beside the running stage and grows as that stage gives memory back.

mod allowance;
mod departure;
mod error;
mod holds;
mod reads;
mod report;
mod room;

pub use allowance::{Allowance, AllowanceStats};
pub use departure::{depart, Ending, Leaving};
pub use error::PipelineError;
pub use holds::{
    ram_floor, replan, Free, Holds, Replan, REPLAN_MARGIN_FRACTION, REPLAN_MARGIN_MIN,
};
pub use reads::{load_reads, plan_reads, LoadReads};
pub use report::{report, Arrival, Departure, StageRecord};
pub use room::{make_room, Give, Giving, Holder};
