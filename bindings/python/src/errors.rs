//! The one place where core errors become Python exceptions.
//!
//! The exception classes live in `trash_panda/errors.py` (so they can inherit from both
//! `TrashPandaError` and a builtin such as `ValueError`); this module looks them up by name.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;

use trash_panda::checkpoint::CheckpointError;
use trash_panda::dtype::DtypeError;
use trash_panda::io::IoError;
use trash_panda::plan::PlanError;
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
        }
    }
}

/// Builds an exception of `kind` with `message`.
pub(crate) fn raise(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        let class = py
            .import("trash_panda.errors")
            .and_then(|m| m.getattr(kind.class_name()))
            .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(class) => PyErr::from_type(class, message),
            // Only reachable if the package is broken; keep the message anyway.
            Err(_) => PyRuntimeError::new_err(message),
        }
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
