//! The `trash_panda._core` extension module: the core crate, module by module, for the Python
//! layer. Long calls release the GIL through `gil::without_gil`; errors become Python exceptions
//! in `errors`.

use pyo3::prelude::*;

mod adapter;
mod checkpoint;
mod cli;
mod dlpack;
mod dtype;
mod engine_config;
mod engine_stats;
mod errors;
mod gil;
mod io;
mod load_report;
mod mirror;
mod order;
mod pipeline;
mod plan;
mod profile;
mod rules;
mod settings;
mod staging_pool;
mod stream;
mod sys;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    adapter::register(m)?;
    checkpoint::register(m)?;
    dtype::register(m)?;
    engine_config::register(m)?;
    engine_stats::register(m)?;
    io::register(m)?;
    load_report::register(m)?;
    plan::register(m)?;
    profile::register(m)?;
    rules::register(m)?;
    stream::register(m)?;
    staging_pool::register(m)?;
    settings::register(m)?;
    sys::register(m)?;
    cli::register(m)?;
    order::register(m)?;
    pipeline::register(m)?;
    Ok(())
}
