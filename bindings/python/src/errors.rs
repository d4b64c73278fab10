//! The one place where core errors become Python exceptions: every core error enum's mapping
//! is here.
//!
//! The exception classes live in `trash_panda/errors.py` (so they can inherit from both
//! `TrashPandaError` and a builtin such as `ValueError`); this module looks each up once.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use trash_panda::adapter::AdapterError;
use trash_panda::checkpoint::CheckpointError;
use trash_panda::dtype::DtypeError;
use trash_panda::engine_config::{EngineConfigError, ExpandError};
use trash_panda::io::IoError;
use trash_panda::order::OrderError;
use trash_panda::pipeline::PipelineError;
use trash_panda::plan::PlanError;
use trash_panda::profile::ProfileError;
use trash_panda::settings::SettingsError;
use trash_panda::stream::StreamError;
use trash_panda::sys::SysError;

/// The Python exception classes of `trash_panda.errors`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Checkpoint,
    Read,
    Dtype,
    Argument,
    Plan,
    System,
    Stream,
    Order,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Checkpoint => "CheckpointError",
            Kind::Read => "ReadError",
            Kind::Dtype => "DtypeError",
            Kind::Argument => "ArgumentError",
            Kind::Plan => "PlanError",
            Kind::System => "SystemProbeError",
            Kind::Stream => "StreamError",
            Kind::Order => "OrderError",
        }
    }
}

const KINDS: usize = 8;

/// The exception classes, looked up on first use.
static CLASSES: [PyOnceLock<Py<PyType>>; KINDS] = [const { PyOnceLock::new() }; KINDS];

impl Kind {
    fn class<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyType>> {
        let cell = &CLASSES[self as usize];
        cell.get_or_try_init(py, || {
            py.import("trash_panda.errors")?
                .getattr(self.class_name())?
                .cast_into::<PyType>()
                .map(Bound::unbind)
                .map_err(PyErr::from)
        })
        .map(|c| c.bind(py).clone())
    }
}

/// Builds an exception of `kind` with `message`.
pub(crate) fn raise(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match kind.class(py) {
        Ok(class) => PyErr::from_type(class, message),
        // Only reachable if the package is broken; keep the message anyway.
        Err(_) => PyRuntimeError::new_err(message),
    })
}

/// Converts a core error into the matching Python exception.
pub(crate) trait ToPyErr {
    fn to_py(self) -> PyErr;
}

impl ToPyErr for CheckpointError {
    fn to_py(self) -> PyErr {
        raise(Kind::Checkpoint, self.to_string())
    }
}

/// An adapter file that does not fit the model is a file/model mismatch, as a checkpoint's is.
impl ToPyErr for AdapterError {
    fn to_py(self) -> PyErr {
        raise(Kind::Checkpoint, self.to_string())
    }
}

impl ToPyErr for IoError {
    fn to_py(self) -> PyErr {
        raise(Kind::Read, self.to_string())
    }
}

impl ToPyErr for DtypeError {
    fn to_py(self) -> PyErr {
        raise(Kind::Dtype, self.to_string())
    }
}

impl ToPyErr for PlanError {
    fn to_py(self) -> PyErr {
        match self {
            PlanError::Checkpoint(e) => e.to_py(),
            other => raise(Kind::Plan, other.to_string()),
        }
    }
}

impl ToPyErr for SysError {
    fn to_py(self) -> PyErr {
        raise(Kind::System, self.to_string())
    }
}

impl ToPyErr for StreamError {
    fn to_py(self) -> PyErr {
        match self {
            StreamError::Read { .. } | StreamError::Open { .. } => {
                raise(Kind::Read, self.to_string())
            }
            other => raise(Kind::Stream, other.to_string()),
        }
    }
}

impl ToPyErr for ExpandError {
    fn to_py(self) -> PyErr {
        let kind = if self.is_argument() {
            Kind::Argument
        } else {
            Kind::Dtype
        };
        raise(kind, self.to_string())
    }
}

impl ToPyErr for SettingsError {
    fn to_py(self) -> PyErr {
        raise(Kind::Argument, self.to_string())
    }
}

impl ToPyErr for EngineConfigError {
    fn to_py(self) -> PyErr {
        match self {
            EngineConfigError::Setting(e) => e.to_py(),
            other => raise(Kind::Plan, other.to_string()),
        }
    }
}

impl ToPyErr for ProfileError {
    fn to_py(self) -> PyErr {
        raise(Kind::Argument, self.to_string())
    }
}

impl ToPyErr for OrderError {
    fn to_py(self) -> PyErr {
        let kind = match &self {
            OrderError::Read { .. } => Kind::Read,
            // There is no exception class for a failed write; a stage turns it into one warning.
            OrderError::Write { .. } => Kind::Order,
            OrderError::NoName { .. }
            | OrderError::UnknownBlock { .. }
            | OrderError::DuplicateBlock { .. }
            | OrderError::DuplicateModelBlock { .. }
            | OrderError::EmptyName { .. }
            | OrderError::OutsidePosition { .. }
            | OrderError::EmptyOutsideName => Kind::Argument,
        };
        raise(kind, self.to_string())
    }
}

impl ToPyErr for PipelineError {
    fn to_py(self) -> PyErr {
        match self {
            PipelineError::Closed { .. } => raise(Kind::Stream, self.to_string()),
            PipelineError::Unresolved { .. } => raise(Kind::Plan, self.to_string()),
            PipelineError::NoSuchStage { .. }
            | PipelineError::GivesToItself { .. }
            | PipelineError::HolderTwice { .. }
            | PipelineError::EmptySchedule { .. }
            | PipelineError::UnknownMember { .. }
            | PipelineError::NoCalls { .. }
            | PipelineError::TooManyCalls { .. } => raise(Kind::Argument, self.to_string()),
        }
    }
}
