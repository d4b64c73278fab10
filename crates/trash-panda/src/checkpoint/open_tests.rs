//! `Checkpoint::open` on real files: single files, indexes, folders, and every checkpoint-level
//! error variant.

use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::dtype::DType;

/// Writes a safetensors file of U8 tensors, each `(name, len)`, packed in order, with bytes
/// counting up so that ranges can be checked.
fn write_u8s(path: &Path, tensors: &[(&str, usize)], metadata: Option<&str>) {
    let mut parts = Vec::new();
    if let Some(m) = metadata {
        parts.push(format!("\"__metadata__\": {m}"));
    }
    let mut offset = 0;
    for (name, len) in tensors {
        parts.push(format!(
            "\"{name}\": {{\"dtype\": \"U8\", \"shape\": [{len}], \"data_offsets\": [{offset}, {}]}}",
            offset + len
        ));
        offset += len;
    }
    let header = format!("{{{}}}", parts.join(", "));
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend((0..offset).map(|i| i as u8));
    fs::write(path, out).unwrap();
}

fn index(dir: &Path, name: &str, map: &[(&str, &str)]) -> PathBuf {
    let entries: Vec<String> = map
        .iter()
        .map(|(t, s)| format!("\"{t}\": \"{s}\""))
        .collect();
    let text = format!(
        "{{\"metadata\": {{\"total_size\": 0}}, \"weight_map\": {{{}}}}}",
        entries.join(", ")
    );
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    path
}

fn open_err(path: &Path) -> CheckpointError {
    match Checkpoint::open(path) {
        Ok(c) => panic!("opened {}: {c:?}", path.display()),
        Err(e) => e,
    }
}

#[test]
fn single_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write_u8s(&p, &[("b", 3), ("a", 5)], Some(r#"{"format": "pt"}"#));
    let ck = Checkpoint::open(&p).unwrap();
    assert_eq!(ck.files(), std::slice::from_ref(&p));
    let names: Vec<&str> = ck.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["b", "a"]);
    let a = ck.get("a").unwrap();
    assert_eq!((a.dtype, a.shape.clone(), a.file), (DType::U8, vec![5], 0));
    let bytes = fs::read(&p).unwrap();
    assert_eq!(&bytes[a.start as usize..a.end as usize], &[3, 4, 5, 6, 7]);
    assert_eq!(ck.file_of(a), p.as_path());
    assert_eq!(ck.metadata(0).get("format").map(String::as_str), Some("pt"));
    assert!(ck.metadata(7).is_empty());
    assert_eq!(ck.total_bytes(), 8);
    assert!(ck.get("c").is_none());
}

#[test]
fn check_holds_names_a_tensor_its_file_no_longer_reaches() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write_u8s(&p, &[("b", 3), ("a", 5)], None);
    let ck = Checkpoint::open(&p).unwrap();
    let (a, b) = (ck.get("a").unwrap(), ck.get("b").unwrap());
    ck.check_holds(a).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(a.start + 2)
        .unwrap();
    // b still lies inside the file, but the file is not the one whose header was read.
    assert!(matches!(
        ck.check_holds(b),
        Err(CheckpointError::Changed {
            change: crate::io::Change::Length { .. },
            ..
        })
    ));
    let err = ck.check_holds(a).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Truncated { tensor, end, .. }
        if tensor == "a" && *end == a.end)
    );
    let msg = err.to_string();
    assert!(
        msg.contains("m.safetensors") && msg.contains("truncated"),
        "{msg}"
    );
    fs::remove_file(&p).unwrap();
    assert!(matches!(ck.check_holds(b), Err(CheckpointError::Io { .. })));
}

#[test]
fn index_and_folder_with_index() {
    let dir = tempfile::tempdir().unwrap();
    write_u8s(&dir.path().join("s2.safetensors"), &[("c", 2)], None);
    fs::create_dir(dir.path().join("sub")).unwrap();
    write_u8s(
        &dir.path().join("sub/s1.safetensors"),
        &[("a", 1), ("b", 4)],
        None,
    );
    let idx = index(
        dir.path(),
        "m.safetensors.index.json",
        &[
            ("c", "s2.safetensors"),
            ("a", "sub/s1.safetensors"),
            ("b", "sub/s1.safetensors"),
        ],
    );
    for path in [idx.as_path(), dir.path()] {
        let ck = Checkpoint::open(path).unwrap();
        assert_eq!(ck.files().len(), 2);
        assert!(ck.files()[0].ends_with("s2.safetensors"));
        assert!(ck.files()[1].ends_with("sub/s1.safetensors"));
        let names: Vec<(&str, usize)> = ck
            .tensors()
            .iter()
            .map(|t| (t.name.as_str(), t.file))
            .collect();
        assert_eq!(names, [("c", 0), ("a", 1), ("b", 1)]);
        assert_eq!(ck.file_of(ck.get("b").unwrap()), ck.files()[1].as_path());
        assert_eq!(ck.total_bytes(), 7);
    }
}

#[test]
fn folder_without_index_takes_every_file_sorted() {
    let dir = tempfile::tempdir().unwrap();
    write_u8s(&dir.path().join("b.safetensors"), &[("x", 1)], None);
    write_u8s(&dir.path().join("a.safetensors"), &[("y", 1)], None);
    fs::write(dir.path().join("README.md"), "not a shard").unwrap();
    // Two indexes: neither is used.
    index(
        dir.path(),
        "one.safetensors.index.json",
        &[("x", "b.safetensors")],
    );
    index(
        dir.path(),
        "two.safetensors.index.json",
        &[("x", "b.safetensors")],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let files: Vec<&str> = ck
        .files()
        .iter()
        .map(|f| f.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(files, ["a.safetensors", "b.safetensors"]);
    assert_eq!(ck.get("x").unwrap().file, 1);
}

#[test]
fn io_error_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("missing.safetensors");
    let e = open_err(&p);
    assert!(
        matches!(e, CheckpointError::Io { action: "open", .. }),
        "{e}"
    );
    assert!(e.to_string().starts_with(&p.display().to_string()), "{e}");
    assert_eq!(e.path(), p);
}

#[test]
fn header_error_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.safetensors");
    let header = r#"{"blocks.3.w": {"dtype": "BF16", "shape": [7, 8], "data_offsets": [0, 100]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + 100, 0);
    fs::write(&p, out).unwrap();
    let e = open_err(&p);
    assert!(
        matches!(
            e,
            CheckpointError::Header {
                kind: HeaderError::SizeMismatch { .. },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "{}: tensor \"blocks.3.w\": data_offsets [0, 100] give 100 bytes but BF16 x [7, 8] \
             needs 112",
            p.display()
        )
    );
}

#[test]
fn empty_folder() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("notes.txt"), "x").unwrap();
    assert!(matches!(
        open_err(dir.path()),
        CheckpointError::EmptyFolder { .. }
    ));
}

#[test]
fn index_level_errors_through_open() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors.index.json");
    fs::write(&p, "{not json").unwrap();
    let e = open_err(&p);
    assert!(matches!(e, CheckpointError::IndexNotJson { .. }), "{e}");
    assert!(e.to_string().starts_with(&p.display().to_string()));
    fs::write(&p, r#"{"metadata": {}}"#).unwrap();
    assert!(matches!(
        open_err(&p),
        CheckpointError::IndexNoWeightMap { .. }
    ));
}

#[test]
fn missing_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_u8s(&dir.path().join("s1.safetensors"), &[("a", 1)], None);
    let idx = index(
        dir.path(),
        "m.safetensors.index.json",
        &[("a", "s1.safetensors"), ("b", "s2.safetensors")],
    );
    let e = open_err(&idx);
    assert!(
        matches!(e, CheckpointError::MissingShard { ref tensor, ref shard, .. }
            if tensor == "b" && shard.ends_with("s2.safetensors")),
        "{e}"
    );
}

#[test]
fn index_entry_not_in_named_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_u8s(&dir.path().join("s1.safetensors"), &[("a", 1)], None);
    write_u8s(&dir.path().join("s2.safetensors"), &[("b", 1)], None);
    // "b" is really in s2 but the index says s1.
    let idx = index(
        dir.path(),
        "m.safetensors.index.json",
        &[
            ("a", "s1.safetensors"),
            ("b", "s1.safetensors"),
            ("c", "s2.safetensors"),
        ],
    );
    let e = open_err(&idx);
    assert!(
        matches!(e, CheckpointError::TensorNotInShard { ref tensor, ref shard, .. }
            if tensor == "b" && shard.ends_with("s1.safetensors")),
        "{e}"
    );
}

#[test]
fn shard_tensor_not_in_index() {
    let dir = tempfile::tempdir().unwrap();
    write_u8s(
        &dir.path().join("s1.safetensors"),
        &[("a", 1), ("extra", 2)],
        None,
    );
    let idx = index(
        dir.path(),
        "m.safetensors.index.json",
        &[("a", "s1.safetensors")],
    );
    let e = open_err(&idx);
    assert!(
        matches!(e, CheckpointError::TensorNotInIndex { ref tensor, ref shard, .. }
            if tensor == "extra" && shard.ends_with("s1.safetensors")),
        "{e}"
    );
    assert!(e.to_string().contains("s1.safetensors") && e.to_string().contains("m.safetensors"));
}

#[test]
fn duplicate_tensor_across_files() {
    let dir = tempfile::tempdir().unwrap();
    write_u8s(&dir.path().join("a.safetensors"), &[("w", 1)], None);
    write_u8s(&dir.path().join("b.safetensors"), &[("w", 1)], None);
    let e = open_err(dir.path());
    assert!(
        matches!(e, CheckpointError::DuplicateTensor { ref path, ref tensor, ref first }
            if tensor == "w" && path.ends_with("b.safetensors") && first.ends_with("a.safetensors")),
        "{e}"
    );
    // The same through an index naming both shards.
    let idx = index(
        dir.path(),
        "m.safetensors.index.json",
        &[("w", "a.safetensors"), ("v", "b.safetensors")],
    );
    assert!(matches!(
        open_err(&idx),
        CheckpointError::DuplicateTensor { .. }
    ));
}

#[test]
fn index_shard_that_is_a_folder_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("s1.safetensors")).unwrap();
    let idx = index(
        dir.path(),
        "m.safetensors.index.json",
        &[("a", "s1.safetensors")],
    );
    assert!(matches!(
        open_err(&idx),
        CheckpointError::MissingShard { .. }
    ));
}
