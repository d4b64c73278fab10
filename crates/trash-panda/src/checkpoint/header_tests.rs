//! One test per `HeaderError` variant, through the byte-slice path the fuzzer uses.

use super::header::byte_len;
use super::*;
use crate::dtype::DType;

/// A file made of a length field, this header text, and `data_len` zero bytes.
fn file(header: &str, data_len: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + data_len, 0);
    out
}

fn parse(bytes: &[u8]) -> Result<FileHeader, HeaderError> {
    read_header(bytes, bytes.len() as u64)
}

fn err(header: &str, data_len: usize) -> HeaderError {
    match parse(&file(header, data_len)) {
        Ok(h) => panic!("accepted {header}: {h:?}"),
        Err(e) => e,
    }
}

#[test]
fn valid_header_with_metadata_gaps_and_padding() {
    let header = r#"{"__metadata__": {"format": "pt"},
        "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [16, 28], "extra": 1},
        "a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "z": {"dtype": "U8", "shape": [0, 5], "data_offsets": [4, 4]}}    "#;
    let fh = parse(&file(header, 30)).unwrap();
    assert_eq!(fh.header_len, header.len() as u64);
    assert_eq!(fh.data_start, 8 + header.len() as u64);
    assert_eq!(fh.data_len, 30);
    assert_eq!(
        fh.header.metadata.get("format").map(String::as_str),
        Some("pt")
    );
    let names: Vec<&str> = fh.header.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["b", "a", "z"]);
    let b = &fh.header.entries[0];
    assert_eq!(
        (b.dtype, b.shape.clone(), b.begin, b.end),
        (DType::BF16, vec![2, 3], 16, 28)
    );
}

#[test]
fn empty_header_object_is_valid() {
    let fh = parse(&file("{}", 0)).unwrap();
    assert!(fh.header.entries.is_empty() && fh.header.metadata.is_empty());
}

#[test]
fn length_field_errors() {
    let e = parse(&[1, 2, 3]).unwrap_err();
    assert!(
        matches!(e, HeaderError::FileTooShort { file_len: 3 }),
        "{e}"
    );

    let mut big = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    big.extend_from_slice(b"{}");
    let e = parse(&big).unwrap_err();
    assert!(matches!(e, HeaderError::HeaderTooLarge { .. }), "{e}");
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    assert!(matches!(
        parse(&huge).unwrap_err(),
        HeaderError::HeaderTooLarge { .. }
    ));

    let mut beyond = 10u64.to_le_bytes().to_vec();
    beyond.extend_from_slice(b"{}");
    let e = parse(&beyond).unwrap_err();
    assert!(
        matches!(
            e,
            HeaderError::HeaderBeyondFile {
                header_len: 10,
                available: 2,
                file_len: 10
            }
        ),
        "{e}"
    );
}

#[test]
fn read_error_when_the_source_is_shorter_than_claimed() {
    let mut bytes = 20u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let e = read_header(&bytes[..], 100).unwrap_err();
    assert!(
        matches!(
            e,
            HeaderError::Read {
                offset: 8,
                len: 20,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn encoding_and_json_errors() {
    let mut bad = file("{\"a\": 1}", 0);
    bad[10] = 0xff;
    let e = parse(&bad).unwrap_err();
    assert!(matches!(e, HeaderError::NotUtf8 { offset: 2 }), "{e}");

    let e = err("{\"a\": ", 0);
    assert!(matches!(e, HeaderError::NotJson { line: 1, .. }), "{e}");
    assert!(matches!(err("{} x", 0), HeaderError::NotJson { .. }));
    assert!(matches!(err("", 0), HeaderError::NotJson { .. }));

    let e = err("[1, 2]", 0);
    assert!(
        matches!(e, HeaderError::NotObject { found: "an array" }),
        "{e}"
    );
    assert!(matches!(
        err("7", 0),
        HeaderError::NotObject { found: "a number" }
    ));
}

#[test]
fn metadata_errors() {
    assert!(matches!(
        err(r#"{"__metadata__": {}, "__metadata__": {}}"#, 0),
        HeaderError::DuplicateMetadata
    ));
    assert!(matches!(
        err(r#"{"__metadata__": ["a"]}"#, 0),
        HeaderError::MetadataNotObject { found: "an array" }
    ));
    let e = err(r#"{"__metadata__": {"k": 1}}"#, 0);
    assert!(
        matches!(e, HeaderError::MetadataValueNotString { ref key, found: "a number" } if key == "k"),
        "{e}"
    );
    let e = err(r#"{"__metadata__": {"k": "a", "k": "b"}}"#, 0);
    assert!(
        matches!(e, HeaderError::DuplicateMetadataKey { ref key } if key == "k"),
        "{e}"
    );
}

const A: &str = r#""a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}"#;

#[test]
fn duplicate_tensor_and_field() {
    let e = err(&format!("{{{A}, {A}}}"), 4);
    assert!(
        matches!(e, HeaderError::DuplicateTensor { ref tensor } if tensor == "a"),
        "{e}"
    );
    let e = err(
        r#"{"a": {"dtype": "U8", "dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}"#,
        4,
    );
    assert!(
        matches!(e, HeaderError::DuplicateField { ref tensor, ref field } if tensor == "a" && field == "dtype"),
        "{e}"
    );
}

#[test]
fn entry_shape_errors() {
    let e = err(r#"{"a": 3}"#, 0);
    assert!(
        matches!(
            e,
            HeaderError::EntryNotObject {
                found: "a number",
                ..
            }
        ),
        "{e}"
    );
    for field in ["dtype", "shape", "data_offsets"] {
        let full = [
            r#""dtype": "U8""#,
            r#""shape": [4]"#,
            r#""data_offsets": [0, 4]"#,
        ];
        let kept: Vec<&str> = full.into_iter().filter(|f| !f.contains(field)).collect();
        let e = err(&format!("{{\"a\": {{{}}}}}", kept.join(", ")), 4);
        assert!(
            matches!(e, HeaderError::MissingField { field: f, .. } if f == field),
            "{field}: {e}"
        );
    }
    let wrong = [
        (
            r#""dtype": 8, "shape": [4], "data_offsets": [0, 4]"#,
            "dtype",
        ),
        (
            r#""dtype": "U8", "shape": 4, "data_offsets": [0, 4]"#,
            "shape",
        ),
        (
            r#""dtype": "U8", "shape": [-4], "data_offsets": [0, 4]"#,
            "shape",
        ),
        (
            r#""dtype": "U8", "shape": [4.0], "data_offsets": [0, 4]"#,
            "shape",
        ),
        (
            r#""dtype": "U8", "shape": [4], "data_offsets": [0]"#,
            "data_offsets",
        ),
        (
            r#""dtype": "U8", "shape": [4], "data_offsets": [0, 4, 8]"#,
            "data_offsets",
        ),
        (
            r#""dtype": "U8", "shape": [4], "data_offsets": [0, "4"]"#,
            "data_offsets",
        ),
        (
            r#""dtype": "U8", "shape": [4], "data_offsets": {"0": 4}"#,
            "data_offsets",
        ),
    ];
    for (body, field) in wrong {
        let e = err(&format!("{{\"a\": {{{body}}}}}"), 4);
        assert!(
            matches!(e, HeaderError::WrongFieldType { field: f, .. } if f == field),
            "{body}: {e}"
        );
    }
}

#[test]
fn dtype_errors() {
    let e = err(
        r#"{"a": {"dtype": "bf16", "shape": [], "data_offsets": [0, 2]}}"#,
        2,
    );
    assert!(
        matches!(e, HeaderError::UnknownDtype { ref dtype, .. } if dtype == "bf16"),
        "{e}"
    );
    // F4 is known to the reference implementation but not to this engine.
    let e = err(
        r#"{"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}"#,
        1,
    );
    assert!(matches!(e, HeaderError::UnknownDtype { .. }), "{e}");
}

#[test]
fn offset_errors() {
    let e = err(
        r#"{"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 0]}}"#,
        4,
    );
    assert!(
        matches!(
            e,
            HeaderError::OffsetsReversed {
                begin: 4,
                end: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = err(
        r#"{"a": {"dtype": "U8", "shape": [4], "data_offsets": [1, 5]}}"#,
        4,
    );
    assert!(
        matches!(
            e,
            HeaderError::OffsetsBeyondData {
                begin: 1,
                end: 5,
                data_len: 4,
                ..
            }
        ),
        "{e}"
    );
    let e = err(
        r#"{"a": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}"#,
        0,
    );
    assert!(matches!(e, HeaderError::ShapeOverflow { .. }), "{e}");
    let e = err(
        r#"{"a": {"dtype": "U64", "shape": [2305843009213693952], "data_offsets": [0, 0]}}"#,
        0,
    );
    assert!(matches!(e, HeaderError::ShapeOverflow { .. }), "{e}");
}

#[test]
fn size_mismatch_message_names_everything() {
    let e = err(
        r#"{"blocks.3.w": {"dtype": "BF16", "shape": [7, 8], "data_offsets": [0, 100]}}"#,
        200,
    );
    assert!(matches!(
        e,
        HeaderError::SizeMismatch {
            expected: 112,
            found: 100,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        r#"tensor "blocks.3.w": data_offsets [0, 100] give 100 bytes but BF16 x [7, 8] needs 112"#
    );
}

#[test]
fn overlap_errors() {
    let e = err(
        r#"{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
            "b": {"dtype": "U8", "shape": [4], "data_offsets": [3, 7]}}"#,
        8,
    );
    assert!(
        matches!(e, HeaderError::Overlap { ref tensor, ref other, other_begin: 0, other_end: 4, .. }
            if tensor == "b" && other == "a"),
        "{e}"
    );
    // An empty tensor strictly inside another one.
    let e = err(
        r#"{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
            "b": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]}}"#,
        4,
    );
    assert!(matches!(e, HeaderError::Overlap { .. }), "{e}");
    // Touching ranges and empty tensors at a boundary are fine.
    parse(&file(
        r#"{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
            "e": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]},
            "f": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]},
            "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}"#,
        8,
    ))
    .unwrap();
}

#[test]
fn wrong_field_type_preview_is_short() {
    let long = format!("[{}]", vec!["-1"; 500].join(","));
    let e = err(
        &format!(r#"{{"a": {{"dtype": "U8", "shape": {long}, "data_offsets": [0, 0]}}}}"#),
        0,
    );
    let msg = e.to_string();
    assert!(msg.len() < 200 && msg.contains("..."), "{msg}");
}

#[test]
fn byte_len_checks_every_step() {
    assert_eq!(byte_len(DType::BF16, &[]), Some(2));
    assert_eq!(byte_len(DType::F32, &[0, usize::MAX]), Some(0));
    assert_eq!(byte_len(DType::U8, &[usize::MAX, 2]), None);
    assert_eq!(byte_len(DType::U8, &[usize::MAX, 2, 0]), Some(0));
    assert_eq!(byte_len(DType::F64, &[1 << 62]), None);
}
