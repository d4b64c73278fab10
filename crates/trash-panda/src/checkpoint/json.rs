//! A JSON reader that keeps every key of an object, in order, duplicates included.
//!
//! `serde_json::Value` silently keeps the last of two equal keys, so a header that names a tensor
//! twice would lose one of them without a word. Safetensors headers and index files are objects
//! of objects, so a [`Node`] keeps every key at its own level and leaves deeper levels to
//! `serde_json::Value`; nesting `Node<Node<Value>>` sees duplicates two levels down.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

/// One JSON value, with objects kept as ordered lists of (key, value) pairs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node<V> {
    /// An object: every key in file order, duplicates kept.
    Object(Vec<(String, V)>),
    /// Anything else: null, bool, number, string or array.
    Other(Value),
}

impl<V> Node<V> {
    /// The JSON type name, for messages ("an object", "a string", ...).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Node::Object(_) => "an object",
            Node::Other(v) => json_kind(v),
        }
    }
}

/// The JSON type name of a value, for messages.
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The first key that appears twice, if any.
pub(crate) fn first_duplicate<V>(pairs: &[(String, V)]) -> Option<&str> {
    let mut seen = std::collections::HashSet::with_capacity(pairs.len());
    pairs
        .iter()
        .map(|(k, _)| k.as_str())
        .find(|k| !seen.insert(*k))
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Node<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor(PhantomData))
    }
}

struct NodeVisitor<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for NodeVisitor<V> {
    type Value = Node<V>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // No capacity hint from the input: a hostile size hint must not drive an allocation.
        let mut pairs = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value::<V>()?;
            pairs.push((key, value));
        }
        Ok(Node::Object(pairs))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Ok(Node::Other(Value::Array(items)))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Deserialize::deserialize(d)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::Number(v.into())))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::Number(v.into())))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        // JSON has no NaN or infinity, so `from_f64` only fails on input serde_json never yields.
        Ok(Node::Other(
            Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::String(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Node::Other(Value::String(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_duplicate_keys_at_two_levels() {
        let text = br#"{"a": {"x": 1, "x": 2}, "a": 3, "b": [1, {"y": 1, "y": 2}]}"#;
        let node: Node<Node<Value>> = serde_json::from_slice(text).unwrap();
        let Node::Object(pairs) = node else {
            panic!("not an object")
        };
        assert_eq!(first_duplicate(&pairs), Some("a"));
        let Node::Object(inner) = &pairs[0].1 else {
            panic!("inner not an object")
        };
        assert_eq!(first_duplicate(inner), Some("x"));
        assert_eq!(pairs[1].1.kind(), "a number");
        assert_eq!(pairs[2].1.kind(), "an array");
    }

    #[test]
    fn scalars_at_top_level() {
        for (text, kind) in [
            ("null", "null"),
            ("true", "a boolean"),
            ("-3", "a number"),
            ("1.5", "a number"),
            ("\"s\"", "a string"),
            ("[]", "an array"),
        ] {
            let node: Node<Value> = serde_json::from_str(text).unwrap();
            assert_eq!(node.kind(), kind, "{text}");
        }
    }
}
