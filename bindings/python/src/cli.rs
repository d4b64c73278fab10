//! `trash_panda._core.cli_main`: the `trash-panda` console command, run by the same code as the
//! native binary.

use pyo3::prelude::*;

use crate::gil::without_gil;

/// Runs the command line (argv[0] included) and returns its exit code.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    without_gil(py, || trash_panda_cli::run(argv))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli_main, m)?)
}
