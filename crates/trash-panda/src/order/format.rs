//! The order file's JSON: what a version-1 file holds, how it is written, and how any bytes are
//! judged (a parse never panics and never errors: it names what is wrong instead).
//!
//! ```json
//! {
//!   "format": "trash-panda-order",
//!   "version": 1,
//!   "checkpoint": "model.safetensors",
//!   "blocks": ["double_blocks.0", "double_blocks.1"],
//!   "outside": {"img_in": 0, "final_layer": 2}
//! }
//! ```
//!
//! `outside` is optional (files written before it existed have none): for each module outside
//! the blocks whose weights the run used, how many blocks had started before its first use.
//! Readers that do not know it ignore it, as version 1 allows, so it needs no new version.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::OrderError;
use crate::rules::run_order::block_key;

/// The `format` field of every order file.
pub const ORDER_FORMAT: &str = "trash-panda-order";
/// The version this build reads and writes.
pub const ORDER_VERSION: u64 = 1;
/// Files larger than this are not order files (a few hundred blocks take a few kB).
pub const MAX_ORDER_FILE_BYTES: u64 = 16 << 20;

/// The content of an order file: which checkpoint it was written for (for people reading it;
/// reading does not check it), the blocks in the order they ran, without trailing dots, and
/// where the modules outside the blocks were first needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderFile {
    /// The checkpoint's file or folder name, as written; informative only.
    pub checkpoint: String,
    /// Block keys in the order they ran, without trailing dots.
    pub blocks: Vec<String>,
    /// Module name -> how many of `blocks` had started before its first use (0: before the
    /// first block; `blocks.len()`: after the last). Empty: the file says nothing, and the
    /// outside weights are all loaded before the first call.
    pub outside: BTreeMap<String, usize>,
}

/// Why the bytes of a file are not a usable order, or (for [`Ignored::UnknownBlock`] and
/// [`Ignored::Duplicate`]) why its names do not fit the model. Every case means the same to the
/// run: use the model's order and write a new file when the model is released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ignored {
    /// There is no file.
    Absent,
    /// The JSON stops early: a write that was cut short, or an empty file.
    Torn {
        /// The JSON parser's message.
        detail: String,
    },
    /// The bytes are not JSON.
    NotJson {
        /// The JSON parser's message.
        detail: String,
    },
    /// JSON, but its `format` is not [`ORDER_FORMAT`] (`found` is what was there, if anything).
    WrongFormat {
        /// A short preview of the `format` value (or of the whole JSON when it is not an
        /// object); `None` when there is no `format`.
        found: Option<String>,
    },
    /// An order file of another version (`found` as written in the file).
    WrongVersion {
        /// The `version` value as written in the file.
        found: String,
    },
    /// The right format and version, but a field is missing or of the wrong type.
    Malformed {
        /// Which field is wrong, and how.
        detail: String,
    },
    /// Larger than [`MAX_ORDER_FILE_BYTES`].
    TooLarge {
        /// The file's size, in bytes.
        bytes: u64,
    },
    /// The file names a block the model does not have.
    UnknownBlock {
        /// The name as the file gives it.
        name: String,
    },
    /// The file names a block twice.
    Duplicate {
        /// The name as the file gives it.
        name: String,
    },
}

impl Ignored {
    /// A short tag for logs and tests: `absent`, `torn`, `not-json`, `wrong-format`,
    /// `wrong-version`, `malformed`, `too-large`, `unknown-block`, `duplicate`.
    pub fn tag(&self) -> &'static str {
        match self {
            Ignored::Absent => "absent",
            Ignored::Torn { .. } => "torn",
            Ignored::NotJson { .. } => "not-json",
            Ignored::WrongFormat { .. } => "wrong-format",
            Ignored::WrongVersion { .. } => "wrong-version",
            Ignored::Malformed { .. } => "malformed",
            Ignored::TooLarge { .. } => "too-large",
            Ignored::UnknownBlock { .. } => "unknown-block",
            Ignored::Duplicate { .. } => "duplicate",
        }
    }

    /// The block name at fault, for [`Ignored::UnknownBlock`] and [`Ignored::Duplicate`].
    pub fn block(&self) -> Option<&str> {
        match self {
            Ignored::UnknownBlock { name } | Ignored::Duplicate { name } => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Ignored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ignored::Absent => write!(f, "there is no order file"),
            Ignored::Torn { detail } => write!(f, "the file is cut short ({detail})"),
            Ignored::NotJson { detail } => write!(f, "the file is not JSON ({detail})"),
            Ignored::WrongFormat { found: None } => {
                write!(f, "the file has no \"format\": \"{ORDER_FORMAT}\"")
            }
            Ignored::WrongFormat { found: Some(found) } => write!(
                f,
                "the file's format is {found}, expected \"{ORDER_FORMAT}\""
            ),
            Ignored::WrongVersion { found } => write!(
                f,
                "the file is version {found}, expected version {ORDER_VERSION}"
            ),
            Ignored::Malformed { detail } => write!(f, "{detail}"),
            Ignored::TooLarge { bytes } => write!(
                f,
                "the file is {bytes} bytes, more than an order file can be ({MAX_ORDER_FILE_BYTES})"
            ),
            Ignored::UnknownBlock { name } => {
                write!(f, "it names {name}, which is not a block of the model")
            }
            Ignored::Duplicate { name } => write!(f, "it names {name} twice"),
        }
    }
}

impl OrderFile {
    /// The file for `checkpoint` (a file, index or folder path; only its name is kept) and the
    /// blocks in the order they ran. A block that ran more than once keeps its first place, and
    /// trailing dots are dropped.
    pub fn new<S: AsRef<str>>(checkpoint: &Path, blocks: &[S]) -> Result<Self, OrderError> {
        let checkpoint = checkpoint
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| checkpoint.to_string_lossy().into_owned());
        let mut seen = HashSet::with_capacity(blocks.len());
        let mut kept = Vec::with_capacity(blocks.len());
        for (position, b) in blocks.iter().enumerate() {
            let key = block_key(b.as_ref());
            if key.is_empty() {
                return Err(OrderError::EmptyName { position });
            }
            if seen.insert(key) {
                kept.push(key.to_string());
            }
        }
        Ok(OrderFile {
            checkpoint,
            blocks: kept,
            outside: BTreeMap::new(),
        })
    }

    /// The same file with `outside` (module name -> blocks started before its first use). A
    /// position past the file's blocks or an empty name is the caller's error.
    pub fn with_outside(mut self, outside: &BTreeMap<String, usize>) -> Result<Self, OrderError> {
        for (name, &position) in outside {
            if name.is_empty() {
                return Err(OrderError::EmptyOutsideName);
            }
            if position > self.blocks.len() {
                return Err(OrderError::OutsidePosition {
                    name: name.clone(),
                    position,
                    blocks: self.blocks.len(),
                });
            }
        }
        self.outside = outside.clone();
        Ok(self)
    }

    /// The file's text: pretty-printed, one block a line, ending in a newline. Without outside
    /// positions the text is what writers before them wrote, byte for byte.
    pub fn to_json(&self) -> String {
        let mut value = json!({
            "format": ORDER_FORMAT,
            "version": ORDER_VERSION,
            "checkpoint": self.checkpoint,
            "blocks": self.blocks,
        });
        if !self.outside.is_empty() {
            value["outside"] = json!(self.outside);
        }
        // A `Value` built from strings and integers always serializes.
        let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Judges any bytes: the order they hold, or why they hold none. Unknown extra fields are
    /// allowed, so a later version-1 writer may add some.
    pub fn parse(bytes: &[u8]) -> Result<OrderFile, Ignored> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            let detail = e.to_string();
            if e.is_eof() {
                Ignored::Torn { detail }
            } else {
                Ignored::NotJson { detail }
            }
        })?;
        let Value::Object(map) = value else {
            return Err(Ignored::WrongFormat {
                found: Some(kind_of(&value).to_string()),
            });
        };
        match map.get("format") {
            Some(Value::String(s)) if s == ORDER_FORMAT => {}
            Some(other) => {
                return Err(Ignored::WrongFormat {
                    found: Some(short(other)),
                })
            }
            None => return Err(Ignored::WrongFormat { found: None }),
        }
        match map.get("version") {
            Some(Value::Number(n)) if n.as_u64() == Some(ORDER_VERSION) => {}
            Some(other) => {
                return Err(Ignored::WrongVersion {
                    found: short(other),
                })
            }
            None => {
                return Err(Ignored::Malformed {
                    detail: "the file has no \"version\"".to_string(),
                })
            }
        }
        let blocks = blocks_field(&map)?;
        Ok(OrderFile {
            checkpoint: checkpoint_field(&map)?,
            outside: outside_field(&map, blocks.len()),
            blocks,
        })
    }
}

/// The `outside` field, or nothing when it is absent or wrong in any way (not an object, a
/// position that is not a whole number from 0 to the number of blocks, an empty name). It only
/// says when weights can be loaded later, so a wrong one costs the file's blocks nothing: the
/// outside weights are then loaded before the first call, and the run writes a right one.
fn outside_field(map: &Map<String, Value>, blocks: usize) -> BTreeMap<String, usize> {
    let Some(Value::Object(entries)) = map.get("outside") else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for (name, value) in entries {
        let position = value.as_u64().and_then(|p| usize::try_from(p).ok());
        match position {
            Some(p) if p <= blocks && !name.is_empty() => {
                out.insert(name.clone(), p);
            }
            _ => return BTreeMap::new(),
        }
    }
    out
}

fn checkpoint_field(map: &Map<String, Value>) -> Result<String, Ignored> {
    match map.get("checkpoint") {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(Ignored::Malformed {
            detail: format!("\"checkpoint\" is {}, expected a string", kind_of(other)),
        }),
    }
}

fn blocks_field(map: &Map<String, Value>) -> Result<Vec<String>, Ignored> {
    let Some(value) = map.get("blocks") else {
        return Err(Ignored::Malformed {
            detail: "the file has no \"blocks\"".to_string(),
        });
    };
    let Value::Array(items) = value else {
        return Err(Ignored::Malformed {
            detail: format!(
                "\"blocks\" is {}, expected a list of block names",
                kind_of(value)
            ),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            other => Err(Ignored::Malformed {
                detail: format!("blocks[{i}] is {}, expected a block name", kind_of(other)),
            }),
        })
        .collect()
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A field's value for a message, cut so a huge value cannot flood a log line.
fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
