//! `Schedule`, `Sharing`, `Share` and `GroupRecord`: a group of stages run together and the
//! schedule of its members' calls (the core's `pipeline::group`).

use pyo3::prelude::*;

use trash_panda::pipeline::{
    Calls, GroupRecord, Schedule, ScheduleSource, Share, ShareReason, Sharing,
};

use crate::errors::ToPyErr;
use crate::mirror::mirror_enum;

/// How the members of a group share the memory over a run (the core's `Sharing`).
#[pyclass(
    name = "Sharing",
    module = "trash_panda._core",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub(crate) enum PySharing {
    /// Each member runs in one stretch: one at a time is loaded for its turn.
    TURNS,
    /// Members alternate: they are loaded at once and planned together.
    TOGETHER,
}

mirror_enum!(PySharing <=> Sharing {
    TURNS = Turns,
    TOGETHER = Together,
});

#[pymethods]
impl PySharing {
    fn __str__(&self) -> String {
        Sharing::from(*self).to_string()
    }
}

/// The calls of a group's members over one run, as stretches of one member each.
#[pyclass(name = "Schedule", module = "trash_panda._core", frozen, eq)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PySchedule {
    pub(crate) inner: Schedule,
}

#[pymethods]
impl PySchedule {
    /// ``runs``: (member, calls) pairs in order, for the group ``group`` of ``members``.
    #[new]
    fn new(group: &str, members: Vec<String>, runs: Vec<(String, u32)>) -> PyResult<Self> {
        let runs = runs
            .into_iter()
            .map(|(member, calls)| Calls { member, calls })
            .collect();
        Schedule::new(group, &members, runs)
            .map(|inner| PySchedule { inner })
            .map_err(ToPyErr::to_py)
    }

    /// The schedule of the calls seen in one run: each member's name, call by call.
    #[staticmethod]
    fn learned(group: &str, members: Vec<String>, calls: Vec<String>) -> PyResult<Self> {
        Schedule::learned(group, &members, &calls)
            .map(|inner| PySchedule { inner })
            .map_err(ToPyErr::to_py)
    }

    /// Its stretches, (member, calls) in order.
    #[getter]
    fn runs(&self) -> Vec<(String, u32)> {
        self.inner
            .runs()
            .iter()
            .map(|c| (c.member.clone(), c.calls))
            .collect()
    }

    /// Turns when each member runs in one stretch, else together.
    #[getter]
    fn sharing(&self) -> PySharing {
        self.inner.sharing().into()
    }

    /// How many times ``member`` is called over the run.
    fn calls(&self, member: &str) -> u64 {
        self.inner.calls(member)
    }

    /// The members called, in the order of their first call.
    fn order(&self) -> Vec<String> {
        self.inner.order()
    }

    /// The order members loaded together are planned in: the one called most first.
    fn planning_order(&self, members: Vec<String>) -> Vec<String> {
        self.inner.planning_order(&members)
    }

    /// Whether the ``n``-th call (from 1) of ``member`` is its last of the run.
    fn is_last_call(&self, member: &str, n: u64) -> bool {
        self.inner.is_last_call(member, n)
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("Schedule({})", self.inner)
    }
}

/// A member's place in its group and why it got its share of the memory, for its record.
#[pyclass(name = "Share", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyShare {
    pub(crate) inner: Share,
}

impl PyShare {
    fn of(group: String, reason: ShareReason) -> Self {
        PyShare {
            inner: Share { group, reason },
        }
    }
}

#[pymethods]
impl PyShare {
    /// Members take turns: planned at its turn for the budget less what the others held then.
    #[staticmethod]
    fn turn(group: String) -> Self {
        PyShare::of(group, ShareReason::Turn)
    }

    /// Loaded together and planned first (``calls`` in the run, the most; None: no schedule
    /// yet, planned in pipeline order).
    #[staticmethod]
    #[pyo3(signature = (group, calls=None))]
    fn first(group: String, calls: Option<u64>) -> Self {
        PyShare::of(group, ShareReason::First { calls })
    }

    /// Loaded together, planned for what the members ``before`` it left (``calls``: its calls
    /// in the run; None: no schedule yet).
    #[staticmethod]
    #[pyo3(signature = (group, before, calls=None))]
    fn after(group: String, before: Vec<String>, calls: Option<u64>) -> Self {
        PyShare::of(group, ShareReason::After { before, calls })
    }

    /// Kept loaded from an earlier run, as it was planned then.
    #[staticmethod]
    fn kept(group: String) -> Self {
        PyShare::of(group, ShareReason::Kept)
    }

    /// The group's name.
    #[getter]
    fn group(&self) -> &str {
        &self.inner.group
    }

    fn __str__(&self) -> String {
        self.inner.reason.to_string()
    }
}

/// One run of a group, for the pipeline's report.
#[pyclass(name = "GroupRecord", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyGroupRecord {
    pub(crate) inner: GroupRecord,
}

#[pymethods]
impl PyGroupRecord {
    /// ``schedule``: what the run's memory followed (None: none yet); ``learned_in``: the run
    /// it was learned in (None: given); ``ran``: the calls the run made; ``run_order``: the
    /// members' blocks in the order they first ran; ``reads_in_order``: the reads followed it.
    #[new]
    #[pyo3(signature = (run, group, sharing, *, schedule=None, learned_in=None, ran=None,
        run_order=Vec::new(), reads_in_order=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        run: u32,
        group: String,
        sharing: PySharing,
        schedule: Option<PySchedule>,
        learned_in: Option<u32>,
        ran: Option<PySchedule>,
        run_order: Vec<(String, usize)>,
        reads_in_order: bool,
    ) -> Self {
        let source = match (&schedule, learned_in) {
            (None, _) => ScheduleSource::Unknown,
            (Some(_), Some(run)) => ScheduleSource::Learned(run),
            (Some(_), None) => ScheduleSource::Given,
        };
        PyGroupRecord {
            inner: GroupRecord {
                run,
                group,
                schedule: schedule.map(|s| s.inner),
                source,
                sharing: sharing.into(),
                ran: ran.map(|s| s.inner),
                run_order,
                reads_in_order,
            },
        }
    }

    /// The run's number.
    #[getter]
    fn run(&self) -> u32 {
        self.inner.run
    }
    /// The group's name.
    #[getter]
    fn group(&self) -> &str {
        &self.inner.group
    }
    /// How the members shared the memory.
    #[getter]
    fn sharing(&self) -> PySharing {
        self.inner.sharing.into()
    }
    /// The schedule the run's memory followed (None: none yet).
    #[getter]
    fn schedule(&self) -> Option<PySchedule> {
        self.inner
            .schedule
            .clone()
            .map(|inner| PySchedule { inner })
    }
    /// The run it was learned in; None when it was given or there was none.
    #[getter]
    fn learned_in(&self) -> Option<u32> {
        match self.inner.source {
            ScheduleSource::Learned(run) => Some(run),
            _ => None,
        }
    }
    /// The calls the run made (None: no member was called).
    #[getter]
    fn ran(&self) -> Option<PySchedule> {
        self.inner.ran.clone().map(|inner| PySchedule { inner })
    }
    /// The members' blocks, (member, block index), in the order they first ran across members.
    #[getter]
    fn run_order(&self) -> Vec<(String, usize)> {
        self.inner.run_order.clone()
    }
    /// Whether the run's reads followed a run order across members learned before.
    #[getter]
    fn reads_in_order(&self) -> bool {
        self.inner.reads_in_order
    }
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
}
