//! Unit tests of what the public API cannot reach: a write cut short halfway.

use std::fs;
use std::io::{self, Write};

use super::atomic::write_atomic_with;
use super::*;

fn leftovers(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_write_cut_short_leaves_the_old_file_and_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("model_order.json");
    write_order_file(&target, Path::new("model.safetensors"), &["a.0", "a.1"]).unwrap();
    let before = fs::read(&target).unwrap();

    let new = OrderFile::new(Path::new("model.safetensors"), &["a.1", "a.0"]).unwrap();
    let err = write_atomic_with(&target, new.to_json().as_bytes(), |file, bytes| {
        file.write_all(&bytes[..bytes.len() / 2])?;
        Err(io::Error::other("the process was stopped"))
    })
    .unwrap_err();

    assert!(
        matches!(
            err,
            OrderError::Write {
                step: "writing",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("model_order.json"), "{err}");
    assert_eq!(fs::read(&target).unwrap(), before);
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    let read = read_order_file(&target, &["a.0.", "a.1."]).unwrap();
    assert_eq!(read.order().unwrap().indices, vec![0, 1]);
}

#[test]
fn a_failed_rename_removes_the_temporary() {
    let dir = tempfile::tempdir().unwrap();
    // A non-empty folder where the file should be: the rename over it fails.
    let target = dir.path().join("model_order.json");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("keep"), b"x").unwrap();
    let err = write_order_file(&target, Path::new("model.safetensors"), &["a.0"]).unwrap_err();
    assert!(
        matches!(
            err,
            OrderError::Write {
                step: "renaming",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
}

#[test]
fn long_model_block_lists_are_cut_in_messages() {
    let blocks: Vec<String> = (0..40).map(|i| format!("layers.{i}.")).collect();
    let err = full_order(&["layers.99"], &blocks).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("order names layers.99, which is not a block of the model (blocks: layers.0., layers.1."), "{text}");
    assert!(text.ends_with("... (40 blocks in all))"), "{text}");
}
