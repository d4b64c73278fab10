//! The one place where the binding lets go of the GIL.
//!
//! Every call that reads a file or converts a tensor goes through [`without_gil`], so a Python
//! thread that loads weights never stalls the others (tests/core_api/test_gil.py checks this).

use pyo3::marker::Ungil;
use pyo3::Python;

/// Runs `f` with the GIL released and returns its result.
pub(crate) fn without_gil<T, F>(py: Python<'_>, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    py.detach(f)
}

/// Worker threads for a conversion: the caller's choice, or every core.
pub(crate) fn threads(requested: Option<usize>) -> usize {
    requested
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
