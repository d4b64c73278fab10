//! The plan as JSON (see docs/plan-format.md): `{"format": "trash-panda-plan", "version": 2, ...}`
//! ([`PLAN_VERSION`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Plan, PlanError};

/// The `format` field of every plan file.
pub const PLAN_FORMAT: &str = "trash-panda-plan";
/// The plan-file version this build writes and the only one it reads.
pub const PLAN_VERSION: u64 = 2;

#[derive(Serialize)]
struct Envelope<'a> {
    format: &'static str,
    version: u64,
    #[serde(flatten)]
    plan: &'a Plan,
}

#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    version: Option<u64>,
}

impl Plan {
    /// Pretty-printed JSON with the format name and version first.
    pub fn to_json(&self) -> String {
        let envelope = Envelope {
            format: PLAN_FORMAT,
            version: PLAN_VERSION,
            plan: self,
        };
        // A Plan holds only strings, numbers, bools and enums with string tags: it cannot fail.
        serde_json::to_string_pretty(&envelope).expect("a plan always serializes")
    }

    /// Reads a plan written by [`Plan::to_json`]; another format or version is an error.
    pub fn from_json(text: &str) -> Result<Plan, PlanError> {
        let json = |e: serde_json::Error| PlanError::Json {
            reason: e.to_string(),
        };
        let header: Header = serde_json::from_str(text).map_err(json)?;
        match header.format.as_deref() {
            Some(PLAN_FORMAT) => {}
            Some(other) => {
                return Err(PlanError::Json {
                    reason: format!("\"format\" is {other:?}, expected {PLAN_FORMAT:?}"),
                })
            }
            None => {
                return Err(PlanError::Json {
                    reason: format!("no \"format\": {PLAN_FORMAT:?} field"),
                })
            }
        }
        match header.version {
            Some(PLAN_VERSION) => {}
            Some(found) => {
                return Err(PlanError::Version {
                    found,
                    supported: PLAN_VERSION,
                })
            }
            None => {
                return Err(PlanError::Json {
                    reason: "no \"version\" field".into(),
                })
            }
        }
        let mut value: serde_json::Value = serde_json::from_str(text).map_err(json)?;
        if let Some(map) = value.as_object_mut() {
            map.remove("format");
            map.remove("version");
        }
        serde_json::from_value(value).map_err(json)
    }

    /// Reads a plan file written by [`Plan::to_json`]; see [`Plan::from_json`] for what is
    /// checked.
    pub fn from_json_file(path: &Path) -> Result<Plan, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|source| PlanError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Plan::from_json(&text)
    }
}
