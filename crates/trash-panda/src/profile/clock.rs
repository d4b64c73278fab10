//! The one clock of a profile: the engine's workers and the Python hooks both read it, so a
//! worker's staging and the block run it served can be drawn on one timeline.

use std::sync::OnceLock;
use std::time::Instant;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Seconds since a process-wide epoch (the first call), on the monotonic clock. `Instant` has no
/// origin a caller outside Rust can read, so every timestamp a profile compares comes from here.
pub fn clock_seconds() -> f64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}
