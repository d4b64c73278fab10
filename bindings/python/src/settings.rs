//! `trash_panda._core` settings: the table of defaults and `TRASH_PANDA_*` lookups.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};
use pyo3::IntoPyObjectExt;

use trash_panda::settings::{env_var, get, Kind, Value, SETTINGS};

/// The value of a setting: `argument` if not None, else `TRASH_PANDA_<NAME>`, else the default.
#[pyfunction]
#[pyo3(signature = (name, argument=None))]
fn setting(py: Python<'_>, name: &str, argument: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
    let raw = match argument {
        None => None,
        Some(a) if a.is_none() => None,
        // bool first: Python's True is also an int.
        Some(a) if a.is_instance_of::<PyBool>() => {
            Some(if a.extract::<bool>()? { "1" } else { "0" }.to_string())
        }
        Some(a) => Some(a.str()?.to_string()),
    };
    let value = get(name, raw.as_deref()).map_err(crate::errors::ToPyErr::to_py)?;
    match value {
        Value::Switch(b) => b.into_py_any(py),
        Value::Count(n) => n.into_py_any(py),
        Value::Text(s) => s.into_py_any(py),
    }
}

/// Every setting: name, environment variable, kind, default and what it does.
#[pyfunction]
fn settings(py: Python<'_>) -> PyResult<Vec<Py<PyDict>>> {
    SETTINGS
        .iter()
        .map(|s| {
            let d = PyDict::new(py);
            d.set_item("name", s.name)?;
            d.set_item("variable", env_var(s.name))?;
            let kind = match s.kind {
                Kind::Switch => "switch".to_string(),
                Kind::Count => "count".to_string(),
                Kind::Choice(words) => format!("choice: {}", words.join("/")),
                Kind::Text => "text".to_string(),
            };
            d.set_item("kind", kind)?;
            d.set_item("default", s.default)?;
            d.set_item("doc", s.doc)?;
            Ok(d.unbind())
        })
        .collect()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(setting, m)?)?;
    m.add_function(wrap_pyfunction!(settings, m)?)?;
    Ok(())
}
