//! The memory that moves between the stages of a pipeline, each decision a plain value the
//! runner (in Python) carries out: what a loaded stage holds and gives back when it is released
//! ([`Holds`], and in which memory its blocks compute: [`Holds::on_device`]), the free memory
//! predicted at the next stage's start ([`Free::after_release`]), when a stage planned for that
//! prediction is planned again ([`replan`]) or kept as it was loaded though the prediction
//! missed ([`still_fits`]), the allowance the next stage's early reads take their memory from
//! ([`Allowance`]), which loaded stages give memory to a stage that needs more ([`make_room`]),
//! which of its blocks a stage gives and what they hold as its plan counts them ([`give_back`],
//! [`resident_among`], [`read_costs`]), whether the stages' loads read through the page cache
//! ([`load_reads`]), whether reading the next stage ahead pays, measured as it happens
//! ([`Pace`]), how a stage leaves at its turn's end ([`depart`]), the schedule of a group of
//! stages run together ([`Schedule`]), and the report of each turn ([`StageRecord`],
//! [`GroupRecord`]).
//!
//! A stage is planned once, for the memory expected to be free when it starts; its reads begin
//! while the stage before it still computes, each taking its bytes from the allowance, which
//! starts at what is free beside the running stage and grows as that stage gives memory back.

mod allowance;
mod blocks;
mod departure;
mod error;
mod group;
mod holds;
mod pace;
mod reads;
mod report;
mod room;

pub use allowance::{Allowance, AllowanceStats};
pub use blocks::{give_back, read_costs, resident_among, ReadCosts, Shed};
pub use departure::{depart, Ending, Leaving};
pub use error::PipelineError;
pub use group::{Calls, GroupRecord, Schedule, ScheduleSource, Share, ShareReason, Sharing};
pub use holds::{
    ram_floor, replan, still_fits, Free, Holds, Replan, REPLAN_MARGIN_FRACTION, REPLAN_MARGIN_MIN,
};
pub use pace::{Pace, PaceChoice, PaceVerdict, PACE_MIN_BYTES, PACE_MIN_SAMPLES};
pub use reads::{load_reads, plan_reads, LoadReads};
pub use report::{report, Arrival, Departure, StageRecord};
pub use room::{make_room, Give, Giving, Holder};
