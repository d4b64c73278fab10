//! `Checkpoint::changed`: each way a file can stop being the one whose header was read.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::*;

/// A one-tensor safetensors file of `len` bytes of `fill`.
fn write(path: &Path, len: usize, fill: u8) {
    let header = format!(
        "{{\"w\": {{\"dtype\": \"U8\", \"shape\": [{len}], \"data_offsets\": [0, {len}]}}}}"
    );
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(std::iter::repeat_n(fill, len));
    fs::write(path, out).unwrap();
}

fn modified(path: &Path) -> SystemTime {
    fs::metadata(path).unwrap().modified().unwrap()
}

fn set_modified(path: &Path, t: SystemTime) {
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[test]
fn an_untouched_file_has_not_changed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write(&p, 64, 1);
    let ck = Checkpoint::open(&p).unwrap();
    assert_eq!(ck.changed(), None);
    // Reading it (as a load does) changes nothing either.
    fs::read(&p).unwrap();
    assert_eq!(ck.changed(), None);
}

#[test]
fn a_rewrite_in_place_to_the_same_length_is_seen_by_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write(&p, 64, 1);
    let was = modified(&p);
    let ck = Checkpoint::open(&p).unwrap();
    // Same file, same length, other bytes, and a time the file system's clock could not
    // confuse with the first.
    let mut f = File::options().write(true).open(&p).unwrap();
    f.write_all(&[0u8; 8]).unwrap();
    drop(f);
    set_modified(&p, was + Duration::from_secs(2));
    let change = ck.changed().unwrap();
    assert_eq!(change.change, Change::Modified);
    assert_eq!(change.path, p);
    assert!(
        change
            .to_string()
            .ends_with("m.safetensors: it was written to"),
        "{change}"
    );
}

#[test]
fn a_new_length_is_said_with_both_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write(&p, 64, 1);
    let ck = Checkpoint::open(&p).unwrap();
    let was = fs::metadata(&p).unwrap().len();
    // Rewritten through the same path (truncated and written again, as most savers do).
    write(&p, 96, 2);
    let now = fs::metadata(&p).unwrap().len();
    let change = ck.changed().unwrap();
    assert_eq!(change.change, Change::Length { was, now });
    assert!(change
        .to_string()
        .contains(&format!("its length went from {was} to {now} bytes")));
}

#[cfg(unix)]
#[test]
fn a_file_renamed_over_it_is_another_file_even_with_the_same_length_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write(&p, 64, 1);
    let was = modified(&p);
    let ck = Checkpoint::open(&p).unwrap();
    let q = dir.path().join("new.safetensors");
    write(&q, 64, 2);
    set_modified(&q, was);
    fs::rename(&q, &p).unwrap();
    assert_eq!(ck.changed().unwrap().change, Change::Replaced);
}

#[test]
fn a_removed_file_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write(&p, 64, 1);
    let ck = Checkpoint::open(&p).unwrap();
    fs::remove_file(&p).unwrap();
    let change = ck.changed().unwrap();
    assert_eq!(change.change, Change::Gone(std::io::ErrorKind::NotFound));
    assert!(
        change.to_string().contains("it can no longer be looked at"),
        "{change}"
    );
}

#[test]
fn the_shard_that_changed_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.safetensors");
    let b = dir.path().join("b.safetensors");
    write(&a, 64, 1);
    // The second shard's tensor needs a name of its own.
    let header = "{\"v\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]}}";
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend([3u8; 8]);
    fs::write(&b, &out).unwrap();
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.files().len(), 2);
    assert_eq!(ck.changed(), None);
    out.extend([4u8; 8]);
    fs::write(&b, &out).unwrap();
    assert_eq!(ck.changed().unwrap().path, b);
}

// Windows has no file identity here: a file renamed over it is told by its time, as a write.
#[cfg(unix)]
#[test]
fn check_holds_refuses_a_file_written_to_but_not_one_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.safetensors");
    write(&p, 64, 1);
    let ck = Checkpoint::open(&p).unwrap();
    let w = ck.get("w").unwrap();
    ck.check_holds(w).unwrap();
    // Replaced by a rename, even by a shorter file: a map made before still shows the old
    // file, which is whole.
    let q = dir.path().join("new.safetensors");
    write(&q, 16, 2);
    fs::rename(&q, &p).unwrap();
    ck.check_holds(w).unwrap();
    // Written to in place: a map shows the new bytes.
    let ck = Checkpoint::open(&p).unwrap();
    let w = ck.get("w").unwrap();
    let was = modified(&p);
    let mut f = File::options().write(true).open(&p).unwrap();
    f.write_all(&[0u8; 8]).unwrap();
    drop(f);
    set_modified(&p, was + Duration::from_secs(2));
    match ck.check_holds(w) {
        Err(CheckpointError::Changed {
            path,
            tensor,
            change,
        }) => {
            assert_eq!((path, tensor.as_str()), (p.clone(), "w"));
            assert_eq!(change, Change::Modified);
        }
        other => panic!("{other:?}"),
    }
    let text = ck.check_holds(w).unwrap_err().to_string();
    assert!(
        text.contains("cannot be read: the file changed after it was opened (it was written to)"),
        "{text}"
    );
}
