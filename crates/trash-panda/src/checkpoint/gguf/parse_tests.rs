//! The GGUF reader on bytes laid out by hand from the format's description (not by the test
//! writer of the integration tests, so that the two cannot share a misreading), and the limits
//! that need a file longer than a test can write.

use std::io::{self, Read};

use super::*;

/// Little-endian bytes, appended field by field.
#[derive(Default)]
struct Bytes(Vec<u8>);

impl Bytes {
    fn start(version: u32, tensors: u64, pairs: u64) -> Bytes {
        let mut b = Bytes::default();
        b.raw(b"GGUF").u32(version).u64(tensors).u64(pairs);
        b
    }
    fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
    fn pad_to(&mut self, alignment: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self
    }
}

fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    parse_gguf(bytes, bytes.len() as u64)
}

fn err(bytes: &[u8]) -> GgufError {
    match parse(bytes) {
        Ok(g) => panic!("accepted: {g:?}"),
        Err(e) => e,
    }
}

#[test]
fn a_file_laid_out_by_hand() {
    let mut b = Bytes::start(3, 2, 3);
    b.str("general.architecture").u32(8).str("llama");
    b.str("llama.context_length").u32(4).u32(4096);
    // An array of 2 arrays: [u8: 1 2] and an empty string array.
    b.str("x.nested").u32(9).u32(9).u64(2);
    b.u32(0).u64(2).raw(&[1, 2]);
    b.u32(8).u64(0);
    // A 2 x 3 f16 weight (ne = [3, 2]) at offset 0, and a Q8_0 row of 64 at offset 32.
    b.str("w").u32(2).u64(3).u64(2).u32(1).u64(0);
    b.str("q").u32(1).u64(64).u32(8).u64(32);
    let infos_end = b.0.len() as u64;
    b.pad_to(32);
    let data_start = b.0.len() as u64;
    b.raw(&[0xAA; 32]).raw(&[0xBB; 68]);

    let g = parse(&b.0).unwrap();
    assert_eq!((g.version, g.alignment, g.data_start), (3, 32, data_start));
    assert_eq!(data_start, infos_end.next_multiple_of(32));
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(
        g.get("llama.context_length").and_then(GgufValue::as_u64),
        Some(4096)
    );
    let keys: Vec<&str> = g.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        ["general.architecture", "llama.context_length", "x.nested"]
    );
    assert_eq!(
        g.get("x.nested"),
        Some(&GgufValue::Array(GgufArray::Array(vec![
            GgufArray::U8(vec![1, 2]),
            GgufArray::String(vec![]),
        ])))
    );

    let w = g.tensor("w").unwrap();
    assert_eq!(
        (w.dtype, w.ggml_type, w.ne.clone()),
        (DType::F16, 1, vec![3, 2])
    );
    assert_eq!(w.shape(), [2, 3]);
    assert_eq!(
        (w.start, w.nbytes, w.end()),
        (data_start, 12, data_start + 12)
    );
    let q = g.tensor("q").unwrap();
    assert_eq!(
        (q.dtype, q.offset, q.start, q.nbytes),
        (DType::Q8_0, 32, data_start + 32, 68)
    );
    assert_eq!(q.numel(), 64);
}

#[test]
fn every_scalar_type_reads_little_endian() {
    let mut b = Bytes::start(2, 0, 13);
    let scalars: [(u32, &[u8], GgufValue); 12] = [
        (0, &[0xFE], GgufValue::U8(0xFE)),
        (1, &[0xFE], GgufValue::I8(-2)),
        (2, &[0x34, 0x12], GgufValue::U16(0x1234)),
        (3, &[0xFE, 0xFF], GgufValue::I16(-2)),
        (4, &[4, 3, 2, 1], GgufValue::U32(0x0102_0304)),
        (5, &[0xFF; 4], GgufValue::I32(-1)),
        (6, &1.5f32.to_le_bytes(), GgufValue::F32(1.5)),
        (7, &[1], GgufValue::Bool(true)),
        (
            10,
            &[8, 7, 6, 5, 4, 3, 2, 1],
            GgufValue::U64(0x0102_0304_0506_0708),
        ),
        (11, &[0xFF; 8], GgufValue::I64(-1)),
        (12, &(-0.25f64).to_le_bytes(), GgufValue::F64(-0.25)),
        (7, &[0], GgufValue::Bool(false)),
    ];
    for (i, (code, bytes, _)) in scalars.iter().enumerate() {
        b.str(&format!("k{i}")).u32(*code).raw(bytes);
    }
    b.str("s").u32(8).str("héllo");
    b.pad_to(32);
    let g = parse(&b.0).unwrap();
    for (i, (_, _, want)) in scalars.iter().enumerate() {
        assert_eq!(g.get(&format!("k{i}")), Some(want), "k{i}");
    }
    assert_eq!(g.get("s").and_then(GgufValue::as_str), Some("héllo"));
    assert!(g.tensors.is_empty());
}

#[test]
fn magic_and_versions() {
    assert!(matches!(
        err(b"GGML\x03\0\0\0"),
        GgufError::NotGguf { found } if &found == b"GGML"
    ));
    let e = err(b"GG");
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                offset: 0,
                need: 4,
                left: 2,
                ..
            }
        ),
        "{e}"
    );
    let version = |v: u32| {
        let mut b = Bytes::start(v, 0, 0);
        b.pad_to(32);
        parse(&b.0)
    };
    assert!(matches!(version(1), Err(GgufError::VersionOne)));
    assert!(matches!(
        version(3u32.swap_bytes()),
        Err(GgufError::BigEndian { version: 3 })
    ));
    assert!(matches!(
        version(2u32.swap_bytes()),
        Err(GgufError::BigEndian { version: 2 })
    ));
    assert!(matches!(
        version(4),
        Err(GgufError::UnknownVersion { version: 4 })
    ));
    assert!(matches!(
        version(0),
        Err(GgufError::UnknownVersion { version: 0 })
    ));
    assert_eq!(version(2).unwrap().version, 2);
    let e = version(1).unwrap_err().to_string();
    assert!(e.contains("version 1"), "{e}");
    let e = version(3u32.swap_bytes()).unwrap_err().to_string();
    assert!(e.contains("big-endian"), "{e}");
}

#[test]
fn lying_counts_are_refused_before_anything_is_allocated() {
    for (tensors, pairs) in [
        (1u64 << 60, 0u64),
        (0, 1 << 60),
        (u64::MAX, 0),
        (0, u64::MAX),
    ] {
        let b = Bytes::start(3, tensors, pairs);
        let e = err(&b.0);
        assert!(
            matches!(e, GgufError::CountBeyondFile { offset: 8 | 16, .. }),
            "{e}"
        );
    }
    let mut b = Bytes::start(3, 0, 1);
    b.str("a").u32(9).u32(8).u64(1 << 60);
    let e = err(&b.0);
    let GgufError::CountBeyondFile {
        at: GgufPlace::Metadata { key },
        count,
        min_bytes,
        ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!((key.as_str(), *count, *min_bytes), ("a", 1 << 60, 8));
    let mut b = Bytes::start(3, 0, 1);
    b.u64(1 << 60).raw(&[0; 16]);
    let e = err(&b.0);
    let at = GgufPlace::MetadataPair { index: 0 };
    assert!(
        matches!(&e, GgufError::Truncated { at: a, need, .. } if *a == at && *need == 1 << 60),
        "{e}"
    );
}

/// A reader of endless zero bytes after `head`: a file far larger than a test can write.
struct Endless(Vec<u8>, usize);

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        for b in buf.iter_mut() {
            *b = self.0.get(self.1).copied().unwrap_or(0);
            self.1 += 1;
        }
        Ok(buf.len())
    }
}

#[test]
fn the_header_limit_bounds_what_a_large_file_makes_the_reader_hold() {
    let mut b = Bytes::start(3, 0, 1);
    b.str("a").u32(8).u64(MAX_GGUF_HEADER_LEN);
    let e = parse_gguf(Endless(b.0, 0), 1 << 40).unwrap_err();
    let limit = MAX_GGUF_HEADER_LEN;
    assert!(
        matches!(e, GgufError::HeaderTooLarge { need, limit: l, .. } if need == limit && l == limit),
        "{e}"
    );
    let mut b = Bytes::start(3, 0, 1);
    b.str("a").u32(9).u32(8).u64(MAX_GGUF_HEADER_LEN / 8);
    let e = parse_gguf(Endless(b.0, 0), 1 << 40).unwrap_err();
    assert!(matches!(e, GgufError::HeaderTooLarge { .. }), "{e}");
}

#[test]
fn a_reader_shorter_than_the_length_given_is_a_read_error() {
    let mut b = Bytes::start(3, 0, 1);
    b.str("a").u32(8).str("hello");
    let short = b.0.get(..b.0.len() - 2).unwrap();
    let e = parse_gguf(short, b.0.len() as u64).unwrap_err();
    match e {
        GgufError::Read { source, .. } => assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof),
        other => panic!("{other}"),
    }
}

#[test]
fn arrays_nest_to_the_limit_and_no_further() {
    let nested = |depth: u32| {
        let mut b = Bytes::start(3, 0, 1);
        b.str("a").u32(9);
        for _ in 1..depth {
            b.u32(9).u64(1);
        }
        b.u32(4).u64(1).u32(7);
        b.pad_to(32);
        parse(&b.0)
    };
    let g = nested(MAX_ARRAY_DEPTH).unwrap();
    let mut a = g.get("a").and_then(GgufValue::as_array).unwrap();
    for _ in 1..MAX_ARRAY_DEPTH {
        let GgufArray::Array(inner) = a else {
            panic!("{a:?}")
        };
        a = inner.first().unwrap();
    }
    assert_eq!(a, &GgufArray::U32(vec![7]));
    let e = nested(MAX_ARRAY_DEPTH + 1).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::ArrayTooDeep {
                limit: MAX_ARRAY_DEPTH,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn value_helpers() {
    assert_eq!(GgufValue::I32(-1).as_u64(), None);
    assert_eq!(GgufValue::I32(7).as_u64(), Some(7));
    assert_eq!(GgufValue::U64(u64::MAX).as_i64(), None);
    assert_eq!(GgufValue::U8(3).as_i64(), Some(3));
    assert_eq!(GgufValue::F32(0.5).as_f64(), Some(0.5));
    assert_eq!(GgufValue::U32(1).as_f64(), None);
    assert_eq!(GgufValue::Bool(true).as_bool(), Some(true));
    assert_eq!(GgufValue::String("x".into()).as_str(), Some("x"));
    let a = GgufArray::String(vec!["a".into(), "b".into()]);
    assert_eq!((a.len(), a.is_empty()), (2, false));
    assert_eq!(a.get(1), Some(GgufValue::String("b".into())));
    assert_eq!(a.get(2), None);
    assert_eq!(a.as_strings().map(<[String]>::len), Some(2));
    for (code, t) in GgufValueType::ALL.iter().enumerate() {
        assert_eq!(t.code() as usize, code);
        assert_eq!(GgufValueType::from_code(t.code()), Some(*t));
    }
    assert_eq!(GgufValueType::from_code(13), None);
}
