//! `trash_panda._core.profile_report`: the profile of a run, from the hooks' timings.

use pyo3::prelude::*;

use trash_panda::plan::Tier;
use trash_panda::profile::{
    clock_seconds, BlockRun, DeviceCopy, LoadSummary, MemoryPoint, Profile,
};

use crate::engine_stats::{PyEngineStats, PyStaging};
use crate::errors::{raise, Kind, ToPyErr};
use crate::io::PyDriveRate;
use crate::plan::TierArg;

/// A block run: (block, start, end, staged wait, gpu wait, bytes, tier).
type RunArg = (usize, f64, f64, f64, f64, u64, TierArg, u64);

/// Seconds on the clock the engine's workers time their stagings with; block runs timed with it
/// line up with the stagings in the trace.
#[pyfunction]
fn clock() -> f64 {
    clock_seconds()
}

/// Builds the profile of a run and returns (report text, Chrome trace JSON, log line).
/// `load` is a LoadSummary, `engine` the engine's statistics and `memory` a list of memory
/// points, each as JSON. `stagings` are the engine's (`Engine.stagings()`), drawn on the trace's
/// worker lanes; `engine_blocks[i]` is the index in `blocks` of the engine's block `i` (the
/// engine only numbers streamed blocks), the same index when not given.
#[pyfunction]
#[pyo3(signature = (
    blocks, runs, load=None, engine=None, memory=None, device_copies=None, link=None,
    stagings=None, engine_blocks=None, drive=None
))]
#[allow(clippy::too_many_arguments)]
fn profile_report(
    blocks: Vec<(String, TierArg)>,
    runs: Vec<RunArg>,
    load: Option<&str>,
    engine: Option<PyRef<'_, PyEngineStats>>,
    memory: Option<&str>,
    device_copies: Option<Vec<(f64, u64, f64)>>,
    link: Option<f64>,
    stagings: Option<Vec<PyRef<'_, PyStaging>>>,
    engine_blocks: Option<Vec<usize>>,
    drive: Option<PyRef<'_, PyDriveRate>>,
) -> PyResult<(String, String, String)> {
    let tiers: Vec<Tier> = blocks.iter().map(|(_, t)| t.0).collect();
    let names = blocks.into_iter().map(|(n, _)| n).collect();
    let mut profile = Profile::new(names, tiers).map_err(ToPyErr::to_py)?;
    for (block, start, end, staged_wait, gpu_wait, bytes, t, expanded) in runs {
        profile
            .record(BlockRun {
                block,
                start,
                end,
                staged_wait,
                gpu_wait,
                bytes,
                tier: t.0,
                expanded,
            })
            .map_err(ToPyErr::to_py)?;
    }
    let parse_err =
        |what: &str, e: serde_json::Error| raise(Kind::Argument, format!("profile {what}: {e}"));
    if let Some(text) = load {
        let summary: LoadSummary = serde_json::from_str(text).map_err(|e| parse_err("load", e))?;
        profile.set_load(summary).map_err(ToPyErr::to_py)?;
    }
    for (at, bytes, seconds) in device_copies.unwrap_or_default() {
        profile
            .record_device_copy(DeviceCopy { at, bytes, seconds })
            .map_err(ToPyErr::to_py)?;
    }
    for staging in stagings.unwrap_or_default() {
        let block = match &engine_blocks {
            None => staging.block(),
            Some(map) => *map.get(staging.block()).ok_or_else(|| {
                raise(
                    Kind::Argument,
                    format!(
                        "profile stagings: engine block {} is not in engine_blocks ({} blocks)",
                        staging.block(),
                        map.len()
                    ),
                )
            })?,
        };
        profile
            .record_copy(staging.copy_run(block))
            .map_err(ToPyErr::to_py)?;
    }
    if let Some(link) = link {
        profile.set_link(link).map_err(ToPyErr::to_py)?;
    }
    if let Some(d) = drive {
        profile.set_drive(d.inner).map_err(ToPyErr::to_py)?;
    }
    if let Some(stats) = engine {
        profile
            .set_engine(stats.summary())
            .map_err(ToPyErr::to_py)?;
    }
    if let Some(text) = memory {
        let points: Vec<MemoryPoint> =
            serde_json::from_str(text).map_err(|e| parse_err("memory", e))?;
        profile.set_memory_points(points);
    }
    Ok((
        profile.report(),
        profile.to_trace_json(),
        profile.to_log_line(),
    ))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(profile_report, m)?)?;
    m.add_function(wrap_pyfunction!(clock, m)?)
}
