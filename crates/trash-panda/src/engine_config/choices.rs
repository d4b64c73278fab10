//! The runtime's choices that are not part of a plan (workers, the disk read mode, how the RAM
//! tier is read and whether it is pinned), as the engine configuration reads them from the
//! settings table ([`crate::settings`]: `TRASH_PANDA_*` over the defaults).

use serde::Serialize;

use crate::io::ReadMode;
use crate::settings::{self, SettingsError, Value};

/// `TRASH_PANDA_DISK_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskModeChoice {
    /// Decided from the plan (see [`super::disk_mode`]).
    Auto,
    /// Unbuffered reads, past the page cache.
    Direct,
    /// Plain reads through the page cache.
    Buffered,
}

impl DiskModeChoice {
    /// The mode asked for; `None` for `auto`.
    pub fn mode(self) -> Option<ReadMode> {
        match self {
            DiskModeChoice::Auto => None,
            DiskModeChoice::Direct => Some(ReadMode::Direct),
            DiskModeChoice::Buffered => Some(ReadMode::Buffered),
        }
    }
}

/// The settings of the runtime that are not part of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EngineSettings {
    /// `TRASH_PANDA_WORKERS`: threads that fill staging buffers (0 is taken as 1).
    pub workers: usize,
    /// `TRASH_PANDA_DISK_MODE`.
    pub disk_mode: DiskModeChoice,
    /// `TRASH_PANDA_RAM_IN_MEMORY`: read the RAM tier into private memory at load instead of
    /// mapping it.
    pub ram_in_memory: bool,
    /// `TRASH_PANDA_RAM_THREADS`: requests in flight for the reads made up front (0 is taken
    /// as 1).
    pub ram_threads: usize,
    /// `TRASH_PANDA_PIN_RAM_TIER`.
    pub pin_ram_tier: bool,
}

impl EngineSettings {
    /// The settings from the process environment over the defaults.
    pub fn from_env() -> Result<EngineSettings, SettingsError> {
        Self::resolve(|var| std::env::var(var).ok())
    }

    /// The settings with `env` looking variables up (a map in tests).
    pub fn resolve(env: impl Fn(&str) -> Option<String>) -> Result<EngineSettings, SettingsError> {
        let get = |name| settings::resolve(name, None, &env);
        let count = |name| {
            get(name).map(|v| match v {
                Value::Count(n) => n as usize,
                _ => 0,
            })
        };
        let disk_mode = match get("disk_mode")? {
            Value::Text(t) if t == "direct" => DiskModeChoice::Direct,
            Value::Text(t) if t == "buffered" => DiskModeChoice::Buffered,
            _ => DiskModeChoice::Auto,
        };
        Ok(EngineSettings {
            workers: count("workers")?,
            disk_mode,
            ram_in_memory: get("ram_in_memory")? == Value::Switch(true),
            pin_ram_tier: get("pin_ram_tier")? == Value::Switch(true),
            ram_threads: count("ram_threads")?,
        })
    }
}
