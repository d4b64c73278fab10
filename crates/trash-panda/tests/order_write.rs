//! Order files: what goes back to the file after a run (a whole pass, a partial one, none).

mod order_common;

use order_common::{order_json, read_text};
use trash_panda::order::{order_to_write, Ignored, OrderError, OrderRead};

const DOUBLE: [&str; 3] = ["double_blocks.0.", "double_blocks.1.", "double_blocks.2."];

fn to_write(read: &OrderRead, ran: &[&str]) -> Option<Vec<String>> {
    order_to_write(read, ran, &DOUBLE).unwrap()
}

#[test]
fn the_file_is_written_when_there_was_none_or_it_was_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let all = ["double_blocks.1.", "double_blocks.0.", "double_blocks.2."];
    let want: Vec<String> = all.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        to_write(&OrderRead::Ignored(Ignored::Absent), &all),
        Some(want.clone())
    );
    let bad = read_text(dir.path(), &order_json(&["nope.0"]));
    assert_eq!(to_write(&bad, &all), Some(want.clone()));

    let good = read_text(
        dir.path(),
        &order_json(&["double_blocks.1", "double_blocks.0", "double_blocks.2"]),
    );
    assert_eq!(to_write(&good, &all), None);
    assert_eq!(
        to_write(
            &good,
            &["double_blocks.1", "double_blocks.0", "double_blocks.2"]
        ),
        None
    );
    // A block that ran twice is recorded at its first place, as the file would hold it.
    assert_eq!(
        to_write(
            &good,
            &[
                "double_blocks.1",
                "double_blocks.0",
                "double_blocks.1",
                "double_blocks.2"
            ]
        ),
        None
    );
    assert_eq!(
        to_write(
            &good,
            &["double_blocks.0", "double_blocks.1", "double_blocks.2"]
        ),
        Some(DOUBLE.iter().map(|s| s.to_string()).collect())
    );
    // A file that names only the first blocks is read as that order, then the model's.
    let short = read_text(dir.path(), &order_json(&["double_blocks.1"]));
    assert_eq!(to_write(&short, &all), None);
}

#[test]
fn a_partial_pass_is_merged_into_the_known_order() {
    let dir = tempfile::tempdir().unwrap();
    let good = read_text(
        dir.path(),
        &order_json(&["double_blocks.2", "double_blocks.1", "double_blocks.0"]),
    );
    // A run stopped after its first blocks ran in the file's order leaves the file alone.
    assert_eq!(to_write(&good, &["double_blocks.2"]), None);
    assert_eq!(
        to_write(&good, &["double_blocks.2", "double_blocks.1"]),
        None
    );
    // A call of the last blocks alone puts them first: its next pass starts where they do.
    assert_eq!(
        to_write(&good, &["double_blocks.1", "double_blocks.0"]),
        Some(vec![
            "double_blocks.1.".to_string(),
            "double_blocks.0.".to_string(),
            "double_blocks.2.".to_string()
        ])
    );
    // Blocks that ran lead, in the order they ran; the rest follow in the file's order.
    assert_eq!(
        to_write(&good, &["double_blocks.0", "double_blocks.2"]),
        Some(vec![
            "double_blocks.0.".to_string(),
            "double_blocks.2.".to_string(),
            "double_blocks.1.".to_string()
        ])
    );
    // Without a file, the blocks that ran lead the model's order.
    assert_eq!(
        to_write(&OrderRead::Ignored(Ignored::Absent), &["double_blocks.2"]),
        Some(vec![
            "double_blocks.2.".to_string(),
            "double_blocks.0.".to_string(),
            "double_blocks.1.".to_string()
        ])
    );
    let err = order_to_write(&good, &["nope.3"], &DOUBLE).unwrap_err();
    assert!(matches!(err, OrderError::UnknownBlock { .. }), "{err}");
}

#[test]
fn nothing_is_written_when_nothing_ran() {
    let none: [&str; 0] = [];
    assert_eq!(to_write(&OrderRead::Ignored(Ignored::Absent), &none), None);
}
