//! Tuning settings: one table with their defaults, overridden by `TRASH_PANDA_<NAME>`
//! environment variables, overridden in turn by a function's own argument.
//!
//! The environment is read when a setting is asked for, not at start-up, so a caller can change
//! a variable between two runs in one process.

use std::fmt;

use serde::Serialize;

/// The kind of value a setting holds, and so what it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// 1/0, true/false, yes/no, on/off.
    Switch,
    /// A whole number of 0 or more.
    Count,
    /// One of a fixed list of words.
    Choice(&'static [&'static str]),
    /// Free text (a path); empty means unset.
    Text,
}

/// One tuning setting.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Setting {
    /// Lower-case name; the variable is `TRASH_PANDA_` + the name in capitals.
    pub name: &'static str,
    /// What values it accepts, and so which [`Value`] variant [`parse`] returns for it.
    pub kind: Kind,
    /// The value used when neither an argument nor the environment gives one, written as a
    /// user would write it; it must parse under `kind`.
    pub default: &'static str,
    /// One line for users, shown by the CLI and on the settings page of the site.
    pub doc: &'static str,
}

/// The values of the `simd` setting, `TRASH_PANDA_SIMD`: which dtype kernels run.
pub const SIMD_CHOICES: &[&str] = &["auto", "portable", "avx2", "avx512", "neon"];

/// Every setting, with its default.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "lookahead",
        kind: Kind::Count,
        default: "2",
        doc: "streamed blocks staged ahead of the one that runs (0: read each block when it is needed)",
    },
    Setting {
        name: "pin_ram_tier",
        kind: Kind::Switch,
        default: "1",
        doc: "on CUDA, register a RAM tier held in private memory (ram_in_memory, or a storage \
              dtype) as pinned and copy its blocks to the GPU directly, with no staging copy; it \
              locks that memory",
    },
    Setting {
        name: "pinned_buffers",
        kind: Kind::Count,
        default: "0",
        doc: "staging buffers (pinned on CUDA) the planner counts and the engine allocates \
              (0: lookahead + 1)",
    },
    Setting {
        name: "max_lookahead",
        kind: Kind::Count,
        default: "0",
        doc: "the deepest the staging grows where the compute waits for blocks; the planner counts \
              staging buffers for it (0: lookahead, a fixed depth)",
    },
    Setting {
        name: "workers",
        kind: Kind::Count,
        default: "2",
        doc: "threads that fill staging buffers",
    },
    Setting {
        name: "disk_mode",
        kind: Kind::Choice(&["auto", "direct", "buffered"]),
        default: "auto",
        doc: "how the disk tier, and every load, read: direct (O_DIRECT, bypasses the page \
              cache), buffered, or auto (buffered when the disk tier fits in the page cache next to \
              the RAM tier, and a model's files beside what its plan holds, or a pipeline's beside \
              what its stages hold; else direct)",
    },
    Setting {
        name: "ram_in_memory",
        kind: Kind::Switch,
        default: "0",
        doc: "read the RAM tier into private memory at load time instead of mapping the file",
    },
    Setting {
        name: "ram_threads",
        kind: Kind::Count,
        default: "4",
        doc: "requests in flight for the reads made up front: resident blocks, the weights outside the blocks, and the RAM tier when ram_in_memory is on",
    },
    Setting {
        name: "profile",
        kind: Kind::Switch,
        default: "0",
        doc: "print a profile report when a model's hooks are removed",
    },
    Setting {
        name: "progress",
        kind: Kind::Switch,
        default: "1",
        doc: "show a progress bar on stderr for a load longer than 2 s when stderr is a terminal",
    },
    Setting {
        name: "simd",
        kind: Kind::Choice(SIMD_CHOICES),
        default: "auto",
        doc: "which compiled dtype-conversion kernels run: auto (the fastest this CPU has), \
              portable, avx2, avx512 (x86-64) or neon (aarch64); read once per process; a level \
              the CPU lacks makes every conversion fail rather than run another one",
    },
    Setting {
        name: "overlay_dir",
        kind: Kind::Text,
        default: "",
        doc: "the folder where streamed blocks with an adapter merged in are kept merged when they \
              are read from the drive or used in place, so later passes read them at the unmerged \
              cost (empty: .trash-panda-overlays beside the checkpoint)",
    },
    Setting {
        name: "overlay_limit",
        kind: Kind::Text,
        default: "auto",
        doc: "the most the overlay folder's files may take (\"20GB\"); the least recently used \
              go first (auto: twice the streamed blocks of the model that merges)",
    },
    Setting {
        name: "log",
        kind: Kind::Text,
        default: "",
        doc: "append a JSON line per run (plan, memory, timings) to this file",
    },
];

/// A setting's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Value {
    /// The value of a [`Kind::Switch`] setting.
    Switch(bool),
    /// The value of a [`Kind::Count`] setting.
    Count(u64),
    /// The value of a [`Kind::Text`] setting (trimmed; empty means unset) or of a
    /// [`Kind::Choice`] one (the chosen word, lower-case).
    Text(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Switch(b) => write!(f, "{}", u8::from(*b)),
            Value::Count(n) => write!(f, "{n}"),
            Value::Text(s) => f.write_str(s),
        }
    }
}

/// Where a rejected value came from, for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A function's own argument (also used when the table's default is what was parsed).
    Argument,
    /// The setting's `TRASH_PANDA_<NAME>` environment variable.
    Environment,
}

/// Errors of the settings.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The name asked for is not in [`SETTINGS`] (names are matched exactly, lower-case).
    ///
    /// What to do: use a setting the message lists (the site's Settings guide has them all).
    #[error("unknown setting {name:?}: the settings are {}", names())]
    Unknown {
        /// The name as asked for.
        name: String,
    },
    /// A value given for a known setting does not parse under its [`Kind`].
    ///
    /// What to do: give the setting a value the message says it accepts; if it came from a
    /// `TRASH_PANDA_*` variable, fix or unset the variable.
    #[error("{}: {value:?} is not valid: expected {accepted}", origin(name, from))]
    BadValue {
        /// The setting's name, as in the table.
        name: &'static str,
        /// Whether the value came from an argument or the environment.
        from: Source,
        /// The value as given, untrimmed.
        value: String,
        /// What the setting's kind accepts, in words for the message.
        accepted: String,
    },
}

fn names() -> String {
    SETTINGS
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn origin(name: &str, from: &Source) -> String {
    match from {
        Source::Argument => format!("argument {name}"),
        Source::Environment => format!("environment variable {}", env_var(name)),
    }
}

/// The environment variable of a setting.
pub fn env_var(name: &str) -> String {
    format!("TRASH_PANDA_{}", name.to_ascii_uppercase())
}

/// The table entry of a setting.
pub fn find(name: &str) -> Result<&'static Setting, SettingsError> {
    SETTINGS
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| SettingsError::Unknown {
            name: name.to_string(),
        })
}

fn accepted(kind: Kind) -> String {
    match kind {
        Kind::Switch => "1/0, true/false, yes/no or on/off".to_string(),
        Kind::Count => "a whole number of 0 or more".to_string(),
        Kind::Choice(words) => format!("one of {}", words.join(", ")),
        Kind::Text => "any text".to_string(),
    }
}

/// Parses `raw` as a value of `setting`.
pub fn parse(setting: &'static Setting, raw: &str, source: Source) -> Result<Value, SettingsError> {
    let s = raw.trim();
    let lower = s.to_ascii_lowercase();
    let value = match setting.kind {
        Kind::Switch => match lower.as_str() {
            "1" | "true" | "yes" | "on" => Some(Value::Switch(true)),
            "0" | "false" | "no" | "off" => Some(Value::Switch(false)),
            _ => None,
        },
        Kind::Count => lower.parse::<u64>().ok().map(Value::Count),
        Kind::Choice(words) => words
            .iter()
            .find(|w| **w == lower)
            .map(|w| Value::Text((*w).to_string())),
        Kind::Text => Some(Value::Text(s.to_string())),
    };
    value.ok_or_else(|| SettingsError::BadValue {
        name: setting.name,
        from: source,
        value: raw.to_string(),
        accepted: accepted(setting.kind),
    })
}

/// The value of a setting: `argument` if given, else the environment variable, else the default.
/// `env` looks a variable up (`std::env::var` in real use; a map in tests).
pub fn resolve(
    name: &str,
    argument: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Value, SettingsError> {
    let setting = find(name)?;
    if let Some(raw) = argument {
        return parse(setting, raw, Source::Argument);
    }
    match env(&env_var(name)) {
        Some(raw) if !raw.trim().is_empty() => parse(setting, &raw, Source::Environment),
        _ => parse(setting, setting.default, Source::Argument),
    }
}

/// [`resolve`] against the process environment.
pub fn get(name: &str, argument: Option<&str>) -> Result<Value, SettingsError> {
    resolve(name, argument, |var| std::env::var(var).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn defaults_parse() {
        for s in SETTINGS {
            resolve(s.name, None, env(&[])).unwrap();
        }
        assert_eq!(
            resolve("lookahead", None, env(&[])).unwrap(),
            Value::Count(2)
        );
    }

    #[test]
    fn argument_beats_environment_beats_default() {
        let e = [("TRASH_PANDA_LOOKAHEAD", "0")];
        assert_eq!(
            resolve("lookahead", None, env(&e)).unwrap(),
            Value::Count(0)
        );
        assert_eq!(
            resolve("lookahead", Some("4"), env(&e)).unwrap(),
            Value::Count(4)
        );
        let blank = [("TRASH_PANDA_LOOKAHEAD", " ")];
        assert_eq!(
            resolve("lookahead", None, env(&blank)).unwrap(),
            Value::Count(2)
        );
    }

    #[test]
    fn switches_take_every_spelling() {
        for (raw, want) in [
            ("1", true),
            ("ON", true),
            ("yes", true),
            ("False", false),
            ("off", false),
            ("0", false),
        ] {
            let e = [("TRASH_PANDA_PROFILE", raw)];
            assert_eq!(
                resolve("profile", None, env(&e)).unwrap(),
                Value::Switch(want),
                "{raw}"
            );
        }
    }

    #[test]
    fn bad_values_name_the_variable_and_what_is_accepted() {
        let e = [("TRASH_PANDA_PROFILE", "maybe")];
        let msg = resolve("profile", None, env(&e)).unwrap_err().to_string();
        assert!(
            msg.contains("TRASH_PANDA_PROFILE") && msg.contains("maybe") && msg.contains("on/off"),
            "{msg}"
        );
        let msg = resolve("lookahead", Some("-1"), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("argument lookahead") && msg.contains("whole number"),
            "{msg}"
        );
        let e = [("TRASH_PANDA_DISK_MODE", "fast")];
        let msg = resolve("disk_mode", None, env(&e)).unwrap_err().to_string();
        assert!(msg.contains("auto, direct, buffered"), "{msg}");
        let msg = resolve("lookahed", None, env(&[])).unwrap_err().to_string();
        assert!(
            msg.contains("lookahed") && msg.contains("lookahead"),
            "{msg}"
        );
    }
}
