//! `Pace`: whether reading the next stage ahead pays, from the running stage's block times
//! (the core's `pipeline::pace`).

use std::sync::Mutex;

use pyo3::prelude::*;

use trash_panda::pipeline::{Pace, PaceChoice, PaceVerdict};

use crate::mirror::mirror_enum;

/// What the read-ahead does now.
#[pyclass(
    name = "PaceChoice",
    module = "trash_panda._core",
    eq,
    eq_int,
    frozen,
    hash
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub(crate) enum PyPaceChoice {
    /// Not enough measured yet: it reads.
    MEASURING,
    /// Reading ahead costs the compute less than it saves: it reads.
    READ,
    /// Reading ahead costs the compute more than it saves: the rest waits for the stage's start.
    PAUSE,
}

mirror_enum!(PyPaceChoice <=> PaceChoice {
    MEASURING = Measuring,
    READ = Read,
    PAUSE = Pause,
});

/// The choice, the figures behind it, and why.
#[pyclass(name = "PaceVerdict", module = "trash_panda._core", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyPaceVerdict {
    pub(crate) inner: PaceVerdict,
}

#[pymethods]
impl PyPaceVerdict {
    /// What the read-ahead does.
    #[getter]
    fn choice(&self) -> PyPaceChoice {
        self.inner.choice.into()
    }

    /// Seconds of the running stage's compute lost per GB read beside it, once measured.
    #[getter]
    fn lost_per_gb(&self) -> Option<f64> {
        self.inner.lost_per_gb
    }

    /// Seconds a GB takes to read with nothing beside it, where known.
    #[getter]
    fn alone_per_gb(&self) -> Option<f64> {
        self.inner.alone_per_gb
    }

    /// Why, in a sentence for the report.
    #[getter]
    fn reason(&self) -> &str {
        &self.inner.reason
    }

    fn __str__(&self) -> &str {
        &self.inner.reason
    }

    fn __repr__(&self) -> String {
        format!(
            "PaceVerdict({:?}, lost_per_gb={:?})",
            self.inner.choice, self.inner.lost_per_gb
        )
    }
}

/// The running stage's block times, with reads in flight and without, and what the read-ahead
/// has read: `verdict()` says whether reading ahead pays.
#[pyclass(name = "Pace", module = "trash_panda._core", frozen)]
#[derive(Debug)]
pub(crate) struct PyPace {
    inner: Mutex<Pace>,
}

impl PyPace {
    fn with<T>(&self, f: impl FnOnce(&mut Pace) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[pymethods]
impl PyPace {
    /// For a running stage of `blocks` blocks per pass.
    #[new]
    fn new(blocks: usize) -> Self {
        PyPace {
            inner: Mutex::new(Pace::new(blocks)),
        }
    }

    /// The rate, in bytes per second, of a read with nothing beside it; ignored unless positive.
    fn set_alone_rate(&self, bytes_per_second: f64) {
        self.with(|p| p.set_alone_rate(bytes_per_second));
    }

    /// A load at a stage's start read `bytes` in `seconds`: the fastest such load large enough
    /// to say something of the drive is what a read takes alone.
    fn note_load(&self, bytes: u64, seconds: f64) {
        self.with(|p| p.note_load(bytes, seconds));
    }

    /// Block `block` of the running stage computed for `seconds`, with reads in flight (`busy`)
    /// or not.
    fn ran(&self, block: usize, seconds: f64, busy: bool) {
        self.with(|p| p.ran(block, seconds, busy));
    }

    /// The read-ahead has read `bytes` so far.
    fn set_read(&self, bytes: u64) {
        self.with(|p| p.set_read(bytes));
    }

    /// Whether fewer quiet runs than one pass are known.
    #[getter]
    fn wants_quiet(&self) -> bool {
        self.with(|p| p.wants_quiet())
    }

    /// What the read-ahead should do now, without the figures and words of `verdict()`.
    #[getter]
    fn choice(&self) -> PyPaceChoice {
        self.with(|p| p.choice()).into()
    }

    /// What the read-ahead should do now, the figures behind it and why.
    fn verdict(&self) -> PyPaceVerdict {
        PyPaceVerdict {
            inner: self.with(|p| p.verdict()),
        }
    }
}
