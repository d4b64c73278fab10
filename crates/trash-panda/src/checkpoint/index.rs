//! The `*.safetensors.index.json` of a sharded checkpoint: which shard holds which tensor.

use std::path::{Component, Path};

use serde_json::Value;

use super::error::CheckpointError;
use super::json::{first_duplicate, json_kind, Node};

/// The weight map of an index, in file order: (tensor name, shard file name as written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WeightMap {
    pub entries: Vec<(String, String)>,
}

/// Parses an index file's bytes. `path` is only used to name the file in errors.
pub(crate) fn parse_index(path: &Path, bytes: &[u8]) -> Result<WeightMap, CheckpointError> {
    let top: Node<Node<Value>> =
        serde_json::from_slice(bytes).map_err(|e| CheckpointError::IndexNotJson {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
    let pairs = match top {
        Node::Object(pairs) => pairs,
        other => {
            return Err(CheckpointError::IndexNotObject {
                path: path.to_path_buf(),
                found: other.kind(),
            })
        }
    };
    // Other top-level keys (`metadata` with `total_size`, ...) are informative only.
    let mut maps = pairs.into_iter().filter(|(k, _)| k == "weight_map");
    let map = match (maps.next(), maps.next()) {
        (Some((_, map)), None) => map,
        (None, _) => {
            return Err(CheckpointError::IndexNoWeightMap {
                path: path.to_path_buf(),
            })
        }
        (Some(_), Some(_)) => {
            return Err(CheckpointError::IndexDuplicateWeightMap {
                path: path.to_path_buf(),
            })
        }
    };
    let map = match map {
        Node::Object(map) => map,
        other => {
            return Err(CheckpointError::IndexWeightMapNotObject {
                path: path.to_path_buf(),
                found: other.kind(),
            })
        }
    };
    if map.is_empty() {
        return Err(CheckpointError::IndexEmpty {
            path: path.to_path_buf(),
        });
    }
    if let Some(tensor) = first_duplicate(&map) {
        return Err(CheckpointError::IndexDuplicateTensor {
            path: path.to_path_buf(),
            tensor: tensor.to_owned(),
        });
    }
    let entries = map
        .into_iter()
        .map(|(tensor, shard)| match shard {
            Value::String(shard) => {
                if is_plain_relative(&shard) {
                    Ok((tensor, shard))
                } else {
                    Err(CheckpointError::IndexBadShardName {
                        path: path.to_path_buf(),
                        tensor,
                        shard,
                    })
                }
            }
            other => Err(CheckpointError::IndexEntryNotString {
                path: path.to_path_buf(),
                tensor,
                found: json_kind(&other),
            }),
        })
        .collect::<Result<_, _>>()?;
    Ok(WeightMap { entries })
}

/// A shard name must stay inside the index's folder: an index is data, and must not make us
/// open `/etc/passwd` or `../../secret`. Subfolders are fine.
fn is_plain_relative(name: &str) -> bool {
    let p = Path::new(name);
    p.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && p.components().any(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> CheckpointError {
        parse_index(Path::new("m.safetensors.index.json"), text.as_bytes()).unwrap_err()
    }

    #[test]
    fn reads_weight_map_in_order() {
        let text = r#"{"metadata": {"total_size": 12}, "weight_map": {"b": "s2.safetensors", "a": "sub/s1.safetensors"}}"#;
        let map = parse_index(Path::new("i.json"), text.as_bytes()).unwrap();
        assert_eq!(
            map.entries,
            vec![
                ("b".to_owned(), "s2.safetensors".to_owned()),
                ("a".to_owned(), "sub/s1.safetensors".to_owned())
            ]
        );
    }

    #[test]
    fn index_errors() {
        assert!(matches!(err("{"), CheckpointError::IndexNotJson { .. }));
        assert!(matches!(
            err("[1]"),
            CheckpointError::IndexNotObject {
                found: "an array",
                ..
            }
        ));
        assert!(matches!(
            err(r#"{"metadata": {}}"#),
            CheckpointError::IndexNoWeightMap { .. }
        ));
        assert!(matches!(
            err(r#"{"weight_map": {"a": "x"}, "weight_map": {"a": "x"}}"#),
            CheckpointError::IndexDuplicateWeightMap { .. }
        ));
        assert!(matches!(
            err(r#"{"weight_map": ["a"]}"#),
            CheckpointError::IndexWeightMapNotObject { .. }
        ));
        assert!(matches!(
            err(r#"{"weight_map": {}}"#),
            CheckpointError::IndexEmpty { .. }
        ));
        assert!(matches!(
            err(r#"{"weight_map": {"a": 3}}"#),
            CheckpointError::IndexEntryNotString { ref tensor, found: "a number", .. } if tensor == "a"
        ));
        assert!(matches!(
            err(r#"{"weight_map": {"a": "x", "a": "y"}}"#),
            CheckpointError::IndexDuplicateTensor { ref tensor, .. } if tensor == "a"
        ));
        for bad in ["", "/etc/passwd", "../x.safetensors", "a/../../x", "."] {
            let text = format!(r#"{{"weight_map": {{"a": {bad:?}}}}}"#);
            assert!(
                matches!(err(&text), CheckpointError::IndexBadShardName { .. }),
                "{bad}"
            );
        }
        let msg = err(r#"{"weight_map": {"a": 3}}"#).to_string();
        assert!(
            msg.starts_with("m.safetensors.index.json: ") && msg.contains("\"a\""),
            "{msg}"
        );
    }
}
