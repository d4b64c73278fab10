//! The GGUF container: files from the test writer read back exactly (every metadata value type,
//! nested arrays, every supported tensor type, default and custom alignment), every error with a
//! message naming the file and the entry, `Checkpoint::open` on `.gguf` files and folders, and
//! property tests on written, truncated and damaged files.

mod common;

use std::path::{Path, PathBuf};

use common::gguf_writer::{fill, tensor_bytes, Enc, GgufWriter};
use proptest::prelude::*;
use trash_panda::checkpoint::gguf::{
    dtype_ggml_type, ggml_dtype, parse_gguf, read_gguf, GgufArray, GgufError, GgufFile, GgufValue,
    GgufValueType, MAX_ARRAY_DEPTH,
};
use trash_panda::checkpoint::{Change, CheckpointError};
use trash_panda::dtype::{ALL_DTYPES, BLOCK_DTYPES};
use trash_panda::{Checkpoint, DType};

fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let r = parse_gguf(bytes, bytes.len() as u64);
    match &r {
        Ok(g) => check_invariants(bytes, g),
        // Messages are built from the input too; rendering one must not panic either.
        Err(e) => {
            let _ = e.to_string();
        }
    }
    r
}

/// The promises an accepted file makes to the readers that will trust it.
fn check_invariants(bytes: &[u8], g: &GgufFile) {
    let len = bytes.len() as u64;
    assert!(matches!(g.version, 2 | 3));
    assert!(g.alignment.is_power_of_two());
    assert!(g.data_start.is_multiple_of(g.alignment) && g.data_start <= len);
    let mut ranges = Vec::new();
    for t in &g.tensors {
        assert_eq!(ggml_dtype(t.ggml_type), Some(t.dtype), "{t:?}");
        assert!((1..=4).contains(&t.ne.len()), "{t:?}");
        assert!(t.offset.is_multiple_of(g.alignment), "{t:?}");
        assert_eq!(t.start, g.data_start + t.offset, "{t:?}");
        assert!(t.end() <= len && t.start <= t.end(), "{t:?}");
        let numel = t.ne.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        let numel = if t.ne.contains(&0) { Some(0) } else { numel };
        assert_eq!(
            numel.and_then(|n| t.dtype.bytes_for(n)),
            Some(t.nbytes),
            "{t:?}"
        );
        assert_eq!(
            t.shape()
                .iter()
                .rev()
                .map(|&d| d as u64)
                .collect::<Vec<_>>(),
            t.ne
        );
        ranges.push((t.start, t.end()));
    }
    ranges.sort();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:?}");
    let mut names: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), g.tensors.len());
    let mut keys: Vec<&str> = g.metadata.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), g.metadata.len());
}

/// The bytes of a value as the writer encodes it: equal bytes are equal values, NaN payloads
/// and signed zeros included.
fn encoded(v: &GgufValue) -> Vec<u8> {
    let mut e = Enc::default();
    e.value(v);
    e.0
}

/// The message `Checkpoint::open` gives for these bytes in a `.gguf` file, checked to start with
/// the file's path.
fn open_message(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    let e = match Checkpoint::open(&path) {
        Ok(c) => panic!("opened: {c:?}"),
        Err(e) => e,
    };
    assert!(matches!(e, CheckpointError::Gguf { .. }), "{e:?}");
    assert_eq!(e.path(), path);
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{}: ", path.display())), "{msg}");
    // read_gguf gives the same error.
    assert_eq!(read_gguf(&path).unwrap_err().to_string(), msg);
    msg
}

fn assert_contains(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} lacks {p:?}");
    }
}

const SUPPORTED: [u32; 18] = [
    0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 24, 25, 26, 27, 28, 30,
];

fn every_value_type() -> Vec<(String, GgufValue)> {
    let scalars = [
        GgufValue::U8(200),
        GgufValue::I8(-100),
        GgufValue::U16(60_000),
        GgufValue::I16(-30_000),
        GgufValue::U32(4_000_000_000),
        GgufValue::I32(-2_000_000_000),
        GgufValue::F32(-1.25),
        GgufValue::Bool(true),
        GgufValue::String("ünï\0code".into()),
        GgufValue::U64(u64::MAX),
        GgufValue::I64(i64::MIN),
        GgufValue::F64(1e300),
    ];
    let arrays = [
        GgufArray::U8(vec![0, 255]),
        GgufArray::I8(vec![-1, 1]),
        GgufArray::U16(vec![1, 65535]),
        GgufArray::I16(vec![-2]),
        GgufArray::U32(vec![]),
        GgufArray::I32(vec![-7, 7, 0]),
        GgufArray::F32(vec![f32::INFINITY, -0.0, 3.5]),
        GgufArray::Bool(vec![false, true]),
        GgufArray::String(vec!["".into(), "<s>".into(), "▁the".into()]),
        GgufArray::U64(vec![u64::MAX]),
        GgufArray::I64(vec![i64::MIN, 0]),
        GgufArray::F64(vec![f64::MIN_POSITIVE]),
        GgufArray::Array(vec![
            GgufArray::String(vec!["a".into()]),
            GgufArray::U8(vec![]),
            GgufArray::Array(vec![GgufArray::Array(vec![GgufArray::I16(vec![5])])]),
        ]),
        GgufArray::Array(vec![]),
    ];
    let mut pairs: Vec<(String, GgufValue)> = scalars
        .into_iter()
        .map(|v| (format!("test.scalar.{}", v.value_type()), v))
        .collect();
    pairs.extend(arrays.into_iter().enumerate().map(|(i, a)| {
        (
            format!("test.array.{i}.{}", a.element_type()),
            GgufValue::Array(a),
        )
    }));
    pairs
}

#[test]
fn every_value_type_and_tensor_type_round_trips() {
    let mut w = GgufWriter::new();
    w.metadata = every_value_type();
    for &id in &SUPPORTED {
        let dtype = ggml_dtype(id).unwrap();
        let row = dtype.block_elems() as u64 * 2;
        w = w.tensor(&format!("t.{}", dtype.safetensors_name()), id, &[row, 3]);
    }
    let written = w.write();
    let g = parse(&written.bytes).unwrap();
    assert_eq!(
        (g.version, g.alignment, g.data_start),
        (3, 32, written.data_start)
    );
    assert_eq!(g.metadata, w.metadata);
    for (i, t) in g.tensors.iter().enumerate() {
        let spec = &w.tensors[i];
        assert_eq!(
            (&t.name, t.ggml_type, &t.ne),
            (&spec.name, spec.ggml_type, &spec.ne)
        );
        assert_eq!(Some(t.ggml_type), dtype_ggml_type(t.dtype));
        assert_eq!(
            (t.offset, t.nbytes),
            (written.offsets[i], written.nbytes[i])
        );
        assert_eq!(t.nbytes, t.dtype.size() as u64 * 2 * 3, "{}", t.name);
        assert_eq!(t.shape(), [3, 2 * t.dtype.block_elems()]);
        assert!(t.offset.is_multiple_of(32));
        let data = &written.bytes[t.start as usize..t.end() as usize];
        assert!(
            data.iter().enumerate().all(|(j, &b)| b == fill(i, j)),
            "{}",
            t.name
        );
    }
    // Written back, the same bytes.
    assert_eq!(GgufWriter::from_file(&g).write().bytes, written.bytes);
    // Every dtype GGUF can hold has a GGML id.
    let holdable = ALL_DTYPES
        .into_iter()
        .chain(BLOCK_DTYPES)
        .filter(|&d| dtype_ggml_type(d).is_some())
        .count();
    assert_eq!(holdable, SUPPORTED.len());
}

/// A file from the `gguf` package's own writer (gguf 0.19.0), so that the reader and the test
/// writer cannot share a misreading of the format. Made with:
///
/// ```python
/// import numpy as np
/// from gguf import GGUFWriter, GGMLQuantizationType as T
/// from gguf.quants import quantize
///
/// w = GGUFWriter("gguf_reference.gguf", arch="llama")
/// w.add_custom_alignment(64)
/// w.add_name("tiny")
/// w.add_block_count(1)
/// w.add_float32("llama.rope.freq_base", 10000.0)
/// w.add_bool("x.flag", True)
/// w.add_int64("x.i64", -5)
/// w.add_token_list(["<s>", "</s>", "\u2581a"])
/// w.add_token_scores([0.0, -1.0, -2.5])
/// w.add_array("x.nested", [[1, 2], ["a"]])
/// w.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))
/// w.add_tensor("f16", np.arange(4, dtype=np.float16))
/// q = quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), T.Q8_0)
/// w.add_tensor("q8", q, raw_dtype=T.Q8_0)
/// w.add_tensor("i32", np.array([1, -1], dtype=np.int32))
/// w.write_header_to_file()
/// w.write_kv_data_to_file()
/// w.write_tensors_to_file()
/// w.close()
/// ```
#[test]
fn a_file_from_the_reference_writer() {
    let bytes = include_bytes!("data/gguf_reference.gguf");
    let g = parse(bytes).unwrap();
    assert_eq!((g.version, g.alignment, g.data_start), (3, 64, 640));
    let keys: Vec<&str> = g.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "general.architecture",
            "general.alignment",
            "general.name",
            "llama.block_count",
            "llama.rope.freq_base",
            "x.flag",
            "x.i64",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.scores",
            "x.nested",
        ]
    );
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(
        g.get("general.name").and_then(GgufValue::as_str),
        Some("tiny")
    );
    assert_eq!(g.get("llama.block_count"), Some(&GgufValue::U32(1)));
    assert_eq!(
        g.get("llama.rope.freq_base"),
        Some(&GgufValue::F32(10000.0))
    );
    assert_eq!(g.get("x.flag"), Some(&GgufValue::Bool(true)));
    assert_eq!(g.get("x.i64"), Some(&GgufValue::I64(-5)));
    let tokens = g.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array);
    assert_eq!(
        tokens.and_then(GgufArray::as_strings).unwrap(),
        ["<s>", "</s>", "\u{2581}a"]
    );
    assert_eq!(
        g.get("tokenizer.ggml.scores"),
        Some(&GgufValue::Array(GgufArray::F32(vec![0.0, -1.0, -2.5])))
    );
    assert_eq!(
        g.get("x.nested"),
        Some(&GgufValue::Array(GgufArray::Array(vec![
            GgufArray::I32(vec![1, 2]),
            GgufArray::String(vec!["a".into()]),
        ])))
    );
    let summary: Vec<(&str, DType, Vec<u64>, u64, u64)> = g
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.dtype, t.ne.clone(), t.start, t.nbytes))
        .collect();
    assert_eq!(
        summary,
        [
            ("f32", DType::F32, vec![3, 2], 640, 24),
            ("f16", DType::F16, vec![4], 704, 8),
            ("q8", DType::Q8_0, vec![32, 2], 768, 68),
            ("i32", DType::I32, vec![2], 896, 8),
        ]
    );
    let f32s: Vec<f32> = bytes[640..664]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(f32s, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(g.tensor("f32").unwrap().shape(), [2, 3]);
    // The writer back: the same bytes up to the end of the last tensor (the reference pads the
    // file to the alignment after it).
    let ours = GgufWriter::from_file(&g).write();
    assert_eq!(ours.data_start, g.data_start);
    assert_eq!(&ours.bytes[..640], &bytes[..640]);
}

#[test]
fn value_accessors_on_read_metadata() {
    let g = parse(&GgufWriter::new().write().bytes).unwrap();
    assert!(g.metadata.is_empty() && g.tensors.is_empty() && g.architecture().is_none());
    let w = GgufWriter::new()
        .meta("general.architecture", GgufValue::String("llama".into()))
        .meta("llama.block_count", GgufValue::U32(2))
        .meta("llama.rope.freq_base", GgufValue::F32(10000.0))
        .meta(
            "tokenizer.ggml.tokens",
            GgufValue::Array(GgufArray::String(vec!["<s>".into(), "a".into()])),
        );
    let g = parse(&w.write().bytes).unwrap();
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(
        g.get("llama.block_count").and_then(GgufValue::as_u64),
        Some(2)
    );
    assert_eq!(
        g.get("llama.rope.freq_base").and_then(GgufValue::as_f64),
        Some(10000.0)
    );
    let tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .unwrap();
    assert_eq!(tokens.element_type(), GgufValueType::String);
    assert_eq!(tokens.as_strings().unwrap(), ["<s>", "a"]);
    assert!(g.get("missing").is_none());
}

#[test]
fn alignment_default_and_custom() {
    let w = GgufWriter::new().tensor("a", 0, &[3]).tensor("b", 0, &[5]);
    let g = parse(&w.write().bytes).unwrap();
    assert_eq!(g.alignment, 32);
    assert_eq!((g.tensors[0].offset, g.tensors[1].offset), (0, 32));
    assert!(g.data_start.is_multiple_of(32));

    let w = GgufWriter::new()
        .with_alignment(64)
        .tensor("a", 0, &[3])
        .tensor("b", 8, &[32, 2]);
    let written = w.write();
    let g = parse(&written.bytes).unwrap();
    assert_eq!(g.alignment, 64);
    assert!(g.data_start.is_multiple_of(64));
    assert_eq!((g.tensors[0].offset, g.tensors[1].offset), (0, 64));
    assert_eq!(g.get("general.alignment"), Some(&GgufValue::U32(64)));

    // Alignment 1: tensors packed with no padding.
    let g = parse(
        &GgufWriter::new()
            .with_alignment(1)
            .tensor("a", 24, &[3])
            .tensor("b", 24, &[5])
            .write()
            .bytes,
    )
    .unwrap();
    assert_eq!((g.tensors[0].offset, g.tensors[1].offset), (0, 3));
}

#[test]
fn gaps_any_order_and_empty_tensors_are_accepted() {
    let w = GgufWriter::new()
        .tensor_at("late", 0, &[4], 128)
        .tensor_at("early", 1, &[2, 2], 0)
        .tensor_at("empty", 2, &[0, 7], 64)
        .tensor_at("empty.too", 0, &[4, 0, 2], 64);
    let g = parse(&w.write().bytes).unwrap();
    let names: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["late", "early", "empty", "empty.too"]);
    assert_eq!(g.tensor("empty").unwrap().nbytes, 0);
    assert_eq!(g.tensor("empty.too").unwrap().shape(), [2, 0, 4]);
}

// ---- errors, each through Checkpoint::open, the message naming the file and the entry ----

#[test]
fn magic_and_version_errors() {
    let msg = open_message(b"PK\x03\x04 not gguf at all");
    assert_contains(&msg, &["PK\\x03\\x04", "not the GGUF magic"]);
    let version = |v: u32| {
        let mut e = Enc::start(v, 0, 0);
        e.pad_to(32);
        e.0
    };
    assert_contains(&open_message(&version(1)), &["version 1", "32-bit"]);
    assert_contains(&open_message(&version(3u32.swap_bytes())), &["big-endian"]);
    assert_contains(
        &open_message(&version(7)),
        &["version 7", "expected 2 or 3"],
    );
    assert_contains(
        &open_message(b"GGUF\x03\0"),
        &["file header", "the version", "needs 4 bytes"],
    );
}

#[test]
fn truncated_and_lying_counts() {
    let meta_only = GgufWriter::new()
        .meta("general.name", GgufValue::String("tiny".into()))
        .write()
        .bytes;
    // Cut inside the key's string.
    let msg = open_message(&meta_only[..40]);
    assert_contains(
        &msg,
        &[
            "metadata pair #0",
            "the key at byte 32 needs 12 bytes, but only 8 are left in the file",
        ],
    );
    // Cut inside the tensor's data.
    let full = GgufWriter::new()
        .meta("general.name", GgufValue::String("tiny".into()))
        .tensor("w", 0, &[8])
        .write()
        .bytes;
    let msg = open_message(&full[..full.len() - 1]);
    assert_contains(&msg, &["tensor \"w\"", "reach past its end"]);

    let mut e = Enc::start(3, 1 << 60, 0);
    e.pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["tensor count", "1152921504606846976"],
    );
    let mut e = Enc::start(3, 0, u64::MAX);
    e.pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["metadata count", &u64::MAX.to_string()],
    );
    let mut e = Enc::start(3, 0, 1);
    e.str("tokenizer.ggml.tokens")
        .u32(9)
        .u32(8)
        .u64(1 << 40)
        .pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &[
            "metadata key \"tokenizer.ggml.tokens\"",
            "array length",
            "1099511627776",
        ],
    );
    let mut e = Enc::start(3, 0, 1);
    e.str("k").u32(8).u64(1 << 40).pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["metadata key \"k\"", "1099511627776 bytes"],
    );
    let mut e = Enc::start(3, 1, 0);
    e.u64(1 << 50).raw(&[0; 64]);
    assert_contains(&open_message(&e.0), &["tensor info #0", "the tensor name"]);

    // The padding after the tensor infos is part of the file even with no tensor data.
    let mut e = Enc::start(3, 0, 1);
    e.pair("k", &GgufValue::U8(1));
    assert!(!e.0.len().is_multiple_of(32));
    assert_contains(
        &open_message(&e.0),
        &[
            "end of the tensor infos",
            "padding to the alignment",
            "needs 26 bytes",
        ],
    );
}

#[test]
fn strings_must_be_utf8() {
    let mut e = Enc::start(3, 0, 1);
    e.bytes_str(b"bad\xffkey").u32(0).raw(&[0]).pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["metadata pair #0", "the key", "not UTF-8"],
    );
    let mut e = Enc::start(3, 0, 1);
    e.str("general.name").u32(8).bytes_str(b"\xc3").pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["metadata key \"general.name\"", "not UTF-8"],
    );
    let mut e = Enc::start(3, 0, 1);
    e.str("tokens")
        .u32(9)
        .u32(8)
        .u64(2)
        .str("ok")
        .bytes_str(b"\x80")
        .pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["metadata key \"tokens\"", "array string", "not UTF-8"],
    );
    let mut e = Enc::start(3, 1, 0);
    e.bytes_str(b"w\xfe").u32(1).u64(4).u32(0).u64(0).pad_to(32);
    e.raw(&[0; 16]);
    assert_contains(
        &open_message(&e.0),
        &["tensor info #0", "tensor name", "not UTF-8"],
    );
}

#[test]
fn bad_values() {
    let mut e = Enc::start(3, 0, 1);
    e.str("k").u32(13).raw(&[0; 8]).pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["metadata key \"k\"", "unknown value type 13"],
    );
    let mut e = Enc::start(3, 0, 1);
    e.str("k").u32(9).u32(99).u64(0).pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["metadata key \"k\"", "unknown value type 99"],
    );
    let mut e = Enc::start(3, 0, 1);
    e.str("flag").u32(7).raw(&[2]).pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["metadata key \"flag\"", "bool", "is 2", "0 or 1"],
    );
    let mut e = Enc::start(3, 0, 1);
    e.str("flags")
        .u32(9)
        .u32(7)
        .u64(3)
        .raw(&[1, 0, 255])
        .pad_to(32);
    assert_contains(&open_message(&e.0), &["metadata key \"flags\"", "is 255"]);

    // Nested to the limit is fine, one more level is not.
    let nested = |depth: u32| {
        let mut a = GgufArray::U8(vec![1]);
        for _ in 1..depth {
            a = GgufArray::Array(vec![a]);
        }
        GgufWriter::new()
            .meta("deep", GgufValue::Array(a))
            .write()
            .bytes
    };
    assert!(parse(&nested(MAX_ARRAY_DEPTH)).is_ok());
    assert_contains(
        &open_message(&nested(MAX_ARRAY_DEPTH + 1)),
        &["metadata key \"deep\"", "nested more than 4 deep"],
    );
}

#[test]
fn duplicate_keys_and_tensors() {
    let bytes = GgufWriter::new()
        .meta("a", GgufValue::U8(1))
        .meta("b", GgufValue::U8(1))
        .meta("a", GgufValue::String("x".into()))
        .write()
        .bytes;
    assert_contains(
        &open_message(&bytes),
        &["metadata key \"a\"", "more than once"],
    );
    let bytes = GgufWriter::new()
        .tensor("w", 0, &[4])
        .tensor("v", 0, &[4])
        .tensor("w", 1, &[4])
        .write()
        .bytes;
    assert_contains(&open_message(&bytes), &["tensor \"w\"", "more than once"]);
}

#[test]
fn alignment_errors() {
    for (value, parts) in [
        (
            GgufValue::U64(32),
            &["general.alignment", "is a u64", "expected a u32"][..],
        ),
        (GgufValue::String("32".into()), &["is a string"][..]),
        (
            GgufValue::U32(0),
            &["general.alignment", "is 0", "power of two"][..],
        ),
        (GgufValue::U32(48), &["is 48", "power of two"][..]),
    ] {
        let bytes = GgufWriter::new()
            .meta("general.alignment", value)
            .write()
            .bytes;
        assert_contains(&open_message(&bytes), parts);
    }
    // A tensor offset off the alignment the key gives.
    let w = GgufWriter::new()
        .with_alignment(64)
        .tensor_at("w", 0, &[8], 32);
    assert_contains(
        &open_message(&w.write().bytes),
        &[
            "tensor \"w\"",
            "offset 32",
            "not a multiple of the alignment 64",
        ],
    );
    let w = GgufWriter::new()
        .tensor("a", 0, &[8])
        .tensor_at("w", 0, &[8], 33);
    assert_contains(
        &open_message(&w.write().bytes),
        &["tensor \"w\"", "offset 33", "alignment 32"],
    );
}

#[test]
fn tensor_info_errors() {
    for n_dims in [0u32, 5] {
        let mut e = Enc::start(3, 1, 0);
        e.str("w").u32(n_dims).raw(&[0; 80]);
        assert_contains(
            &open_message(&e.0),
            &[
                "tensor \"w\"",
                &format!("{n_dims} dimensions"),
                "expected 1 to 4",
            ],
        );
    }
    for (id, name) in [
        (4, "Q4_2"),
        (5, "Q4_3"),
        (9, "Q8_1"),
        (15, "Q8_K"),
        (16, "IQ2_XXS"),
        (17, "IQ2_XS"),
        (18, "IQ3_XXS"),
        (19, "IQ1_S"),
        (20, "IQ4_NL"),
        (21, "IQ3_S"),
        (22, "IQ2_S"),
        (23, "IQ4_XS"),
        (29, "IQ1_M"),
        (31, "Q4_0_4_4"),
        (32, "Q4_0_4_8"),
        (33, "Q4_0_8_8"),
        (34, "TQ1_0"),
        (35, "TQ2_0"),
        (36, "IQ4_NL_4_4"),
        (37, "IQ4_NL_4_8"),
        (38, "IQ4_NL_8_8"),
        (39, "MXFP4"),
    ] {
        let bytes = GgufWriter::new()
            .tensor("blk.0.ffn_up.weight", id, &[256, 2])
            .write()
            .bytes;
        assert_contains(
            &open_message(&bytes),
            &[
                "tensor \"blk.0.ffn_up.weight\"",
                &format!("GGML type {name} ({id})"),
                "not supported",
            ],
        );
    }
    for id in [40u32, 1000, u32::MAX] {
        let bytes = GgufWriter::new().tensor("w", id, &[4]).write().bytes;
        assert_contains(
            &open_message(&bytes),
            &["tensor \"w\"", &format!("unknown GGML type {id}")],
        );
    }
    let bytes = GgufWriter::new().tensor("q", 8, &[33, 2]).write().bytes;
    assert_contains(
        &open_message(&bytes),
        &["tensor \"q\"", "rows of 33 elements", "Q8_0 blocks of 32"],
    );
    let bytes = GgufWriter::new().tensor("k", 12, &[128]).write().bytes;
    assert_contains(
        &open_message(&bytes),
        &["tensor \"k\"", "Q4_K blocks of 256"],
    );
    for ne in [vec![1u64 << 32, 1 << 32], vec![u64::MAX], vec![1 << 62, 4]] {
        let bytes = GgufWriter::new().tensor("huge", 0, &ne).write().bytes;
        assert_contains(
            &open_message(&bytes),
            &["tensor \"huge\"", "more elements or bytes than fit"],
        );
    }
}

#[test]
fn data_range_errors() {
    let w = GgufWriter::new().tensor("a", 0, &[8]).tensor("b", 0, &[8]);
    let full = w.write().bytes;
    let msg = open_message(&full[..full.len() - 4]);
    assert_contains(
        &msg,
        &[
            "tensor \"b\"",
            "32 bytes at data offset 32",
            "reach past its end",
        ],
    );
    // An offset whose sum with the data start overflows.
    let mut e = Enc::start(3, 1, 0);
    e.tensor_info("far", &[4], 0, u64::MAX - 31).pad_to(32);
    assert_contains(
        &open_message(&e.0),
        &["tensor \"far\"", "reach past its end"],
    );

    let bytes = GgufWriter::new()
        .tensor_at("a", 0, &[16], 0)
        .tensor_at("b", 0, &[16], 32)
        .tensor_at("c", 0, &[4], 64)
        .write()
        .bytes;
    assert_contains(
        &open_message(&bytes),
        &["tensor \"b\"", "overlap tensor \"a\""],
    );
    // An empty tensor strictly inside another counts as an overlap.
    let bytes = GgufWriter::new()
        .with_alignment(4)
        .tensor_at("a", 0, &[4], 0)
        .tensor_at("e", 0, &[0], 8)
        .write()
        .bytes;
    assert_contains(
        &open_message(&bytes),
        &["tensor \"e\"", "overlap tensor \"a\""],
    );
}

// ---- Checkpoint::open ----

fn gguf_model(path: &Path) -> GgufWriter {
    let w = GgufWriter::new()
        .meta("general.architecture", GgufValue::String("llama".into()))
        .meta("llama.block_count", GgufValue::U32(1))
        .tensor_at("blk.0.attn_q.weight", 12, &[256, 4], 1024)
        .tensor_at("token_embd.weight", 30, &[8, 16], 0)
        .tensor_at("output_norm.weight", 0, &[8], 512);
    w.write_to(path);
    w
}

#[test]
fn checkpoint_opens_a_gguf_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-Q4_K_M.gguf");
    gguf_model(&path);
    let bytes = std::fs::read(&path).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(ck.files(), std::slice::from_ref(&path));
    let names: Vec<&str> = ck.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "token_embd.weight",
            "output_norm.weight",
            "blk.0.attn_q.weight"
        ]
    );
    let q = ck.get("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.dtype, q.shape.clone(), q.file),
        (DType::Q4K, vec![4, 256], 0)
    );
    assert_eq!(q.nbytes(), 4 * 144);
    assert_eq!(q.numel(), 1024);
    let e = ck.get("token_embd.weight").unwrap();
    assert_eq!((e.dtype, e.shape.clone()), (DType::BF16, vec![16, 8]));
    let g = ck.gguf().unwrap();
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.tensors.len(), 3);
    // The tensor infos in file order, with the absolute ranges the index gives.
    for (k, t) in g.tensors.iter().enumerate() {
        let info = ck.get(&t.name).unwrap();
        assert_eq!((info.start, info.end), (t.start, t.end()));
        let data = &bytes[info.start as usize..info.end as usize];
        assert!(
            data.iter().enumerate().all(|(i, &b)| b == fill(k, i)),
            "{}",
            t.name
        );
    }
    assert!(ck.metadata(0).is_empty());
    assert_eq!(ck.total_bytes(), 4 * 144 + 16 * 8 * 2 + 8 * 4);
    assert_eq!(ck.file_of(q), path.as_path());

    // The file's stamp is kept as for a safetensors file.
    assert_eq!(ck.changed(), None);
    ck.check_holds(q).unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_len(bytes.len() as u64 - 1).unwrap();
    drop(f);
    let change = ck.changed().unwrap();
    assert!(matches!(change.change, Change::Length { .. }), "{change:?}");
    let e = ck.check_holds(q).unwrap_err();
    assert!(matches!(e, CheckpointError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("blk.0.attn_q.weight"), "{e}");
}

fn write_safetensors(path: &Path) {
    let data = [0u8; 8];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap();
    safetensors::tensor::serialize_to_file([("x", view)], None, path).unwrap();
}

#[test]
fn folders_with_gguf_files() {
    let dir = tempfile::tempdir().unwrap();
    let one: PathBuf = dir.path().join("model.gguf");
    gguf_model(&one);
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.files(), std::slice::from_ref(&one));
    assert!(ck.gguf().is_some());

    // A safetensors checkpoint beside it is what the folder opens as.
    let st = dir.path().join("model.safetensors");
    write_safetensors(&st);
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.files(), std::slice::from_ref(&st));
    assert!(ck.gguf().is_none());
    std::fs::remove_file(&st).unwrap();

    // Two GGUF files: which one is the caller's choice.
    gguf_model(&dir.path().join("model-Q8_0.gguf"));
    let e = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(e, CheckpointError::SeveralGguf { count: 2, .. }),
        "{e}"
    );
    assert_eq!(e.path(), dir.path());
    assert_contains(&e.to_string(), &["2 *.gguf files", "give the one to open"]);

    let empty = tempfile::tempdir().unwrap();
    let e = Checkpoint::open(empty.path()).unwrap_err();
    assert!(matches!(e, CheckpointError::EmptyFolder { .. }), "{e}");
}

#[test]
fn read_gguf_names_a_missing_file() {
    let e = read_gguf("/nonexistent/model.gguf").unwrap_err();
    assert!(matches!(e, CheckpointError::Io { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/model.gguf"), "{e}");
}

// ---- properties ----

fn floats32() -> impl Strategy<Value = f32> {
    any::<u32>().prop_map(f32::from_bits)
}

fn floats64() -> impl Strategy<Value = f64> {
    any::<u64>().prop_map(f64::from_bits)
}

fn text() -> impl Strategy<Value = String> {
    "(?s).{0,8}"
}

fn array(depth: u32) -> BoxedStrategy<GgufArray> {
    use prop::collection::vec;
    let leaf = prop_oneof![
        vec(any::<u8>(), 0..4).prop_map(GgufArray::U8),
        vec(any::<i8>(), 0..4).prop_map(GgufArray::I8),
        vec(any::<u16>(), 0..4).prop_map(GgufArray::U16),
        vec(any::<i16>(), 0..4).prop_map(GgufArray::I16),
        vec(any::<u32>(), 0..4).prop_map(GgufArray::U32),
        vec(any::<i32>(), 0..4).prop_map(GgufArray::I32),
        vec(floats32(), 0..4).prop_map(GgufArray::F32),
        vec(any::<bool>(), 0..4).prop_map(GgufArray::Bool),
        vec(text(), 0..4).prop_map(GgufArray::String),
        vec(any::<u64>(), 0..4).prop_map(GgufArray::U64),
        vec(any::<i64>(), 0..4).prop_map(GgufArray::I64),
        vec(floats64(), 0..4).prop_map(GgufArray::F64),
    ];
    if depth >= MAX_ARRAY_DEPTH {
        leaf.boxed()
    } else {
        prop_oneof![4 => leaf, 1 => vec(array(depth + 1), 0..3).prop_map(GgufArray::Array)].boxed()
    }
}

fn value() -> impl Strategy<Value = GgufValue> {
    prop_oneof![
        any::<u8>().prop_map(GgufValue::U8),
        any::<i8>().prop_map(GgufValue::I8),
        any::<u16>().prop_map(GgufValue::U16),
        any::<i16>().prop_map(GgufValue::I16),
        any::<u32>().prop_map(GgufValue::U32),
        any::<i32>().prop_map(GgufValue::I32),
        floats32().prop_map(GgufValue::F32),
        any::<bool>().prop_map(GgufValue::Bool),
        text().prop_map(GgufValue::String),
        array(1).prop_map(GgufValue::Array),
        any::<u64>().prop_map(GgufValue::U64),
        any::<i64>().prop_map(GgufValue::I64),
        floats64().prop_map(GgufValue::F64),
    ]
}

/// A valid file's writer: random metadata, tensors of every supported type laid out in a random
/// order with random gaps, alignment 32 or a custom one.
fn valid_writer() -> impl Strategy<Value = GgufWriter> {
    let tensor = (
        prop::sample::select(SUPPORTED.to_vec()),
        0u64..3,
        prop::collection::vec(0u64..4, 0..4),
        0u64..3,
        any::<u32>(),
    );
    (
        prop::sample::select(vec![2u32, 3]),
        prop::sample::select(vec![
            None,
            Some(1u32),
            Some(8),
            Some(32),
            Some(64),
            Some(128),
        ]),
        prop::collection::btree_map("[a-z._]{1,10}", value(), 0..5),
        prop::collection::btree_map("[a-z.]{1,8}", tensor, 0..6),
    )
        .prop_map(|(version, alignment, metadata, tensors)| {
            let mut w = GgufWriter::new();
            w.version = version;
            if let Some(a) = alignment {
                w = w.with_alignment(a);
            }
            w.metadata.extend(metadata);
            // Lay the data out in the order of the random keys, the infos in name order.
            let mut specs: Vec<(String, u32, Vec<u64>, u64, u32)> = tensors
                .into_iter()
                .map(|(name, (id, blocks, outer, gap, key))| {
                    let row = ggml_dtype(id).unwrap().block_elems() as u64 * blocks;
                    let ne = std::iter::once(row).chain(outer).collect();
                    (name, id, ne, gap, key)
                })
                .collect();
            let mut order: Vec<usize> = (0..specs.len()).collect();
            order.sort_by_key(|&i| specs[i].4);
            let mut offsets = vec![0u64; specs.len()];
            let mut next = 0u64;
            for i in order {
                let (_, id, ne, gap, _) = &specs[i];
                let offset = next.next_multiple_of(w.alignment) + gap * w.alignment;
                offsets[i] = offset;
                next = offset + tensor_bytes(*id, ne);
            }
            for (i, (name, id, ne, _, _)) in specs.drain(..).enumerate() {
                w = w.tensor_at(&name, id, &ne, offsets[i]);
            }
            w
        })
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        xor: u8,
    },
    Insert {
        at: usize,
        byte: u8,
    },
    Delete {
        at: usize,
    },
    /// A u64 written over 8 bytes: counts, lengths, dimensions and offsets are u64s.
    Word {
        at: usize,
        word: u64,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let word = prop_oneof![
        any::<u64>(),
        0u64..300,
        Just(u64::MAX),
        Just(1 << 60),
        (0u32..64).prop_map(|s| 1u64 << s),
    ];
    prop_oneof![
        (any::<usize>(), 1u8..).prop_map(|(at, xor)| Mutation::Flip { at, xor }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        any::<usize>().prop_map(|at| Mutation::Delete { at }),
        (any::<usize>(), word).prop_map(|(at, word)| Mutation::Word { at, word }),
    ]
}

/// Applies a mutation inside the first `span` bytes (the header: mutating tensor data changes
/// nothing the reader looks at).
fn apply(file: &mut Vec<u8>, m: &Mutation, span: usize) {
    let span = span.min(file.len());
    if span == 0 {
        return;
    }
    match *m {
        Mutation::Flip { at, xor } => file[at % span] ^= xor,
        Mutation::Insert { at, byte } => file.insert(at % (span + 1), byte),
        Mutation::Delete { at } => {
            file.remove(at % span);
        }
        Mutation::Word { at, word } => {
            let i = at % span;
            let end = (i + 8).min(file.len());
            file[i..end].copy_from_slice(&word.to_le_bytes()[..end - i]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn written_files_read_back_as_written(w in valid_writer()) {
        let written = w.write();
        let g = parse(&written.bytes).unwrap();
        prop_assert_eq!(g.version, w.version);
        prop_assert_eq!(g.alignment, w.alignment);
        prop_assert_eq!(g.data_start, written.data_start);
        prop_assert_eq!(g.metadata.len(), w.metadata.len());
        for ((k, v), (wk, wv)) in g.metadata.iter().zip(&w.metadata) {
            prop_assert_eq!(k, wk);
            prop_assert_eq!(encoded(v), encoded(wv));
        }
        prop_assert_eq!(g.tensors.len(), w.tensors.len());
        for (i, (t, spec)) in g.tensors.iter().zip(&w.tensors).enumerate() {
            prop_assert_eq!(&t.name, &spec.name);
            prop_assert_eq!(t.ggml_type, spec.ggml_type);
            prop_assert_eq!(Some(t.dtype), ggml_dtype(spec.ggml_type));
            prop_assert_eq!(&t.ne, &spec.ne);
            prop_assert_eq!(t.offset, written.offsets[i]);
            prop_assert_eq!(t.nbytes, written.nbytes[i]);
            prop_assert_eq!(t.start, written.data_start + t.offset);
        }
        prop_assert_eq!(GgufWriter::from_file(&g).write().bytes, written.bytes);
    }

    #[test]
    fn every_cut_of_a_valid_file_is_an_error(
        w in valid_writer(),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = w.write().bytes;
        let keep = cut.index(bytes.len());
        let accepted = parse(&bytes[..keep]).is_ok();
        prop_assert!(!accepted, "a cut at {} of {} bytes was accepted", keep, bytes.len());
    }

    #[test]
    fn damaged_files_never_panic(
        w in valid_writer(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let written = w.write();
        let mut bytes = written.bytes.clone();
        for m in &mutations {
            apply(&mut bytes, m, written.data_start as usize);
        }
        let _ = parse(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(
        version in prop::sample::select(vec![2u32, 3]),
        counts in (0u64..4, 0u64..4),
        body in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        // Past the magic and version, so that the body reaches the metadata and tensor readers.
        let mut e = Enc::start(version, counts.0, counts.1);
        e.raw(&body);
        let _ = parse(&e.0);
        let _ = parse(&body);
    }
}
