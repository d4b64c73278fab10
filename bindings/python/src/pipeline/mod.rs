//! `trash_panda._core` memory handover between a pipeline's stages (the core's `pipeline`):
//! what a loaded stage holds, the free memory predicted once it is released, when to plan again,
//! the allowance the next stage's early reads take from, which stages give memory to one
//! that needs more and which of its blocks a stage gives, what its loader's reads cost, and how
//! a stage leaves at its end, and the schedule of a group of stages run together. One file per
//! module of the core.

use pyo3::prelude::*;

mod allowance;
mod blocks;
mod departure;
mod group;
mod holds;
mod pace;
mod reads;
mod report;
mod room;

pub(crate) use holds::PyHolds;
pub(crate) use reads::{py_plan_reads, PyLoadReads};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<reads::PyLoadReads>()?;
    m.add_function(wrap_pyfunction!(reads::py_load_reads, m)?)?;
    m.add_function(wrap_pyfunction!(reads::py_plan_reads, m)?)?;
    m.add_class::<holds::PyHolds>()?;
    m.add_class::<holds::PyFree>()?;
    m.add_class::<holds::PyReplan>()?;
    m.add_class::<allowance::PyAllowanceStats>()?;
    m.add_class::<allowance::PyAllowance>()?;
    m.add_class::<pace::PyPaceChoice>()?;
    m.add_class::<pace::PyPaceVerdict>()?;
    m.add_class::<pace::PyPace>()?;
    m.add_class::<blocks::PyShed>()?;
    m.add_class::<blocks::PyReadCosts>()?;
    m.add_function(wrap_pyfunction!(blocks::py_give_back, m)?)?;
    m.add_function(wrap_pyfunction!(blocks::py_resident_among, m)?)?;
    m.add_function(wrap_pyfunction!(blocks::py_read_costs, m)?)?;
    m.add_class::<group::PySharing>()?;
    m.add_class::<group::PySchedule>()?;
    m.add_class::<group::PyShare>()?;
    m.add_class::<group::PyGroupRecord>()?;
    m.add_class::<report::PyArrival>()?;
    m.add_class::<report::PyDeparture>()?;
    m.add_class::<report::PyStageRecord>()?;
    m.add_class::<departure::PyLeaving>()?;
    m.add_function(wrap_pyfunction!(departure::py_depart, m)?)?;
    m.add_function(wrap_pyfunction!(holds::py_replan, m)?)?;
    m.add_function(wrap_pyfunction!(holds::py_still_fits, m)?)?;
    m.add_function(wrap_pyfunction!(holds::py_ram_floor, m)?)?;
    m.add_function(wrap_pyfunction!(report::pipeline_report, m)?)?;
    m.add_class::<room::PyHolder>()?;
    m.add_class::<room::PyGiving>()?;
    m.add_function(wrap_pyfunction!(room::py_make_room, m)?)?;
    Ok(())
}
