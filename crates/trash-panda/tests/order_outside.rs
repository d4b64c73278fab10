//! Order files' outside modules: where the weights outside the blocks are first needed. Files
//! written before the field existed still read, a wrong field costs only itself, and what a run
//! records goes back to the file by the rules of `file_to_write`.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use proptest::prelude::*;
use trash_panda::order::{
    file_to_write, order_to_write, read_order_file, write_order_file,
    write_order_file_with_outside, OrderError, OrderFile, OrderToWrite,
};

mod order_common;
use order_common::{order_json, read_text, MODEL};

/// The modules outside `MODEL`'s blocks that hold weights.
const OUTSIDE: [&str; 3] = ["img_in", "final_layer", "final_layer.norm"];

fn positions(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(n, p)| (n.to_string(), *p)).collect()
}

/// A file as the writer before outside positions wrote it, byte for byte.
const OLD_FILE: &str = r#"{
  "blocks": [
    "single_blocks.0",
    "double_blocks.0",
    "double_blocks.1",
    "double_blocks.2",
    "single_blocks.1"
  ],
  "checkpoint": "model.safetensors",
  "format": "trash-panda-order",
  "version": 1
}
"#;

#[test]
fn an_old_order_file_without_outside_weights_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let read = read_text(dir.path(), OLD_FILE);
    let known = read.order().expect("an old file is usable");
    assert_eq!(
        known.blocks,
        [
            "single_blocks.0.",
            "double_blocks.0.",
            "double_blocks.1.",
            "double_blocks.2.",
            "single_blocks.1."
        ]
    );
    // No positions: the outside weights are all loaded before the first call, as before.
    assert!(known.outside.is_empty());
    assert!(known.outside_for(&OUTSIDE).is_empty());
    // Compact, with the fields in another order: the same.
    let read = read_text(dir.path(), &order_json(&["double_blocks.1"]));
    assert_eq!(read.order().unwrap().indices, vec![1]);
    assert!(read.order().unwrap().outside.is_empty());
}

#[test]
fn a_file_without_outside_positions_is_written_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model_order.json");
    let ran = [
        "single_blocks.0.",
        "double_blocks.0.",
        "double_blocks.1.",
        "double_blocks.2.",
        "single_blocks.1.",
    ];
    write_order_file(&path, Path::new("model.safetensors"), &ran).unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), OLD_FILE);
    write_order_file_with_outside(
        &path,
        Path::new("model.safetensors"),
        &ran,
        &BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), OLD_FILE);
}

#[test]
fn outside_positions_are_written_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model_order.json");
    let outside = positions(&[("img_in", 0), ("final_layer", 5), ("final_layer.norm", 5)]);
    write_order_file_with_outside(&path, Path::new("/m/model.safetensors"), &MODEL, &outside)
        .unwrap();
    let value: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        value["outside"],
        serde_json::json!({"img_in": 0, "final_layer": 5, "final_layer.norm": 5})
    );
    assert_eq!(value["version"], 1);
    let read = read_order_file(&path, &MODEL).unwrap();
    let known = read.order().unwrap();
    assert_eq!(known.outside, outside);
    assert_eq!(known.outside_for(&OUTSIDE), outside);
}

#[test]
fn a_wrong_outside_field_is_dropped_and_the_blocks_still_used() {
    let dir = tempfile::tempdir().unwrap();
    for field in [
        r#""outside": [0, 5]"#,
        r#""outside": {"img_in": -1}"#,
        r#""outside": {"img_in": 1.5}"#,
        r#""outside": {"img_in": "0"}"#,
        r#""outside": {"img_in": 0, "final_layer": 3}"#, // past the file's 2 blocks
        r#""outside": {"": 0}"#,
        r#""outside": null"#,
    ] {
        let text = format!(
            r#"{{"format": "trash-panda-order", "version": 1,
                "blocks": ["single_blocks.0", "double_blocks.0"], {field}}}"#
        );
        let read = read_text(dir.path(), &text);
        let known = read.order().unwrap_or_else(|| panic!("{field}: {read:?}"));
        assert_eq!(known.indices, vec![3, 0], "{field}");
        assert!(known.outside.is_empty(), "{field}: {:?}", known.outside);
    }
}

#[test]
fn a_position_equal_to_the_blocks_is_after_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"{"format": "trash-panda-order", "version": 1,
        "blocks": ["single_blocks.0", "double_blocks.0"], "outside": {"final_layer": 2}}"#;
    let read = read_text(dir.path(), text);
    assert_eq!(
        read.order().unwrap().outside,
        positions(&[("final_layer", 2)])
    );
}

#[test]
fn a_name_the_model_lacks_drops_every_position() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"{"format": "trash-panda-order", "version": 1, "blocks": ["double_blocks.0"],
        "outside": {"img_in": 0, "lm_head": 1}}"#;
    let read = read_text(dir.path(), text);
    let known = read.order().unwrap();
    assert_eq!(known.outside.len(), 2);
    assert!(known.outside_for(&OUTSIDE).is_empty());
    assert_eq!(
        known.outside_for(&["img_in", "lm_head"]),
        positions(&[("img_in", 0), ("lm_head", 1)])
    );
}

#[test]
fn a_newer_version_with_outside_positions_is_still_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"{"format": "trash-panda-order", "version": 2, "blocks": ["double_blocks.0"],
        "outside": {"img_in": 0}}"#;
    let read = read_text(dir.path(), text);
    assert_eq!(read.ignored().map(|i| i.tag()), Some("wrong-version"));
}

#[test]
fn a_whole_pass_writes_its_outside_positions_over_an_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let read = read_text(dir.path(), OLD_FILE);
    let ran = read.order().unwrap().blocks.clone();
    let outside = positions(&[("img_in", 0), ("final_layer", 5)]);
    // The blocks' order is the file's: only the outside positions are new.
    assert_eq!(order_to_write(&read, &ran, &MODEL).unwrap(), None);
    let write = file_to_write(&read, &ran, &MODEL, &outside).unwrap();
    assert_eq!(
        write,
        Some(OrderToWrite {
            blocks: ran.clone(),
            outside: outside.clone()
        })
    );
    // Written, the same run asks for nothing more.
    let path = dir.path().join("model_order.json");
    write_order_file_with_outside(&path, Path::new("model.safetensors"), &ran, &outside).unwrap();
    let read = read_order_file(&path, &MODEL).unwrap();
    assert_eq!(file_to_write(&read, &ran, &MODEL, &outside).unwrap(), None);
    // Other positions are written again.
    let moved = positions(&[("img_in", 0), ("final_layer", 4)]);
    assert_eq!(
        file_to_write(&read, &ran, &MODEL, &moved)
            .unwrap()
            .map(|w| w.outside),
        Some(moved)
    );
}

#[test]
fn a_partial_pass_writes_no_outside_positions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model_order.json");
    let outside = positions(&[("img_in", 0), ("final_layer", 5)]);
    write_order_file_with_outside(&path, Path::new("model.safetensors"), &MODEL, &outside).unwrap();
    let read = read_order_file(&path, &MODEL).unwrap();
    // The blocks that ran keep the file's order: nothing to write, the positions stay.
    let same = ["double_blocks.0.", "double_blocks.1."];
    let recorded = positions(&[("img_in", 0), ("final_layer", 2)]);
    assert_eq!(
        file_to_write(&read, &same, &MODEL, &recorded).unwrap(),
        None
    );
    // A new order for some blocks: written without positions, which counted the old order.
    let swapped = ["double_blocks.1.", "double_blocks.0."];
    let write = file_to_write(&read, &swapped, &MODEL, &recorded)
        .unwrap()
        .unwrap();
    assert_eq!(write.blocks[..2], ["double_blocks.1.", "double_blocks.0."]);
    assert!(write.outside.is_empty());
}

#[test]
fn a_position_past_the_blocks_that_ran_is_the_callers_error() {
    let dir = tempfile::tempdir().unwrap();
    let read = read_text(dir.path(), OLD_FILE);
    let err = file_to_write(&read, &MODEL, &MODEL, &positions(&[("lm_head", 6)])).unwrap_err();
    assert!(
        matches!(&err, OrderError::OutsidePosition { name, position: 6, blocks: 5 } if name == "lm_head"),
        "{err}"
    );
    assert!(err.to_string().contains("lm_head"), "{err}");
    let err = file_to_write(&read, &MODEL, &MODEL, &positions(&[("", 0)])).unwrap_err();
    assert!(matches!(err, OrderError::EmptyOutsideName), "{err}");
    let err = OrderFile::new(Path::new("m.safetensors"), &["a.0"])
        .unwrap()
        .with_outside(&positions(&[("head", 2)]))
        .unwrap_err();
    assert!(
        matches!(err, OrderError::OutsidePosition { blocks: 1, .. }),
        "{err}"
    );
}

// ---- properties ----

fn outside_names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::hash_set("[a-z_]{1,8}(\\.[a-z0-9_]{1,4}){0,2}", 0..6)
        .prop_map(|set| set.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn outside_positions_round_trip(
        names in outside_names(),
        picks in prop::collection::vec(0usize..=5, 6),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m_order.json");
        let outside: BTreeMap<String, usize> =
            names.iter().cloned().zip(picks.iter().copied()).collect();
        write_order_file_with_outside(&path, Path::new("m.safetensors"), &MODEL, &outside).unwrap();
        let read = read_order_file(&path, &MODEL).unwrap();
        let known = read.order().expect("a written file is usable");
        prop_assert_eq!(&known.outside, &outside);
        prop_assert_eq!(known.outside_for(&names), outside.clone());
        prop_assert_eq!(file_to_write(&read, &MODEL, &MODEL, &outside).unwrap(), None);
        // Readers of the blocks alone see the file as before.
        prop_assert_eq!(order_to_write(&read, &MODEL, &MODEL).unwrap(), None);
    }

    #[test]
    fn any_outside_field_is_judged_without_panicking(
        field in r#"(\{("[a-z.]{0,4}": ?(-?[0-9]{1,3}|[0-9]\.5|"x"|null|\[\]),? ?){0,4}\}?|\[[0-9]\]|"x"|7)"#
    ) {
        let text = format!(
            r#"{{"format": "trash-panda-order", "version": 1, "blocks": ["double_blocks.0", "single_blocks.1"], "outside": {field}}}"#
        );
        if let Ok(file) = OrderFile::parse(text.as_bytes()) {
            prop_assert_eq!(file.blocks.len(), 2);
            prop_assert!(file.outside.values().all(|&p| p <= 2));
            prop_assert!(file.outside.keys().all(|n| !n.is_empty()));
        }
    }
}
