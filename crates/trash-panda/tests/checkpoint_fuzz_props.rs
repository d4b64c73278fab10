//! The header reader on hostile input: arbitrary bytes, and valid files with bytes flipped,
//! inserted, deleted or cut off, or with a changed length field. It must return Ok or Err,
//! never panic, and an Ok header must only describe bytes that are in the file.

use std::collections::BTreeMap;

use proptest::prelude::*;
use safetensors::tensor::{serialize, TensorView};
use safetensors::Dtype;
use trash_panda::checkpoint::{read_header, FileHeader, HeaderError};
use trash_panda::Checkpoint;

/// The promises an accepted header makes to the readers that will trust it.
fn check_ok(file: &[u8], fh: &FileHeader) {
    let len = file.len() as u64;
    assert_eq!(fh.data_start, 8 + fh.header_len);
    assert_eq!(fh.data_start + fh.data_len, len);
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for e in &fh.header.entries {
        assert!(e.begin <= e.end && e.end <= fh.data_len, "{e:?}");
        assert!(fh.data_start + e.end <= len);
        let numel: u64 = e.shape.iter().map(|&d| d as u64).product();
        assert_eq!(e.end - e.begin, numel * e.dtype.size() as u64, "{e:?}");
        ranges.push((e.begin, e.end));
    }
    ranges.sort();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:?}");
}

fn read(file: &[u8]) -> Result<FileHeader, HeaderError> {
    let r = read_header(file, file.len() as u64);
    if let Ok(fh) = &r {
        check_ok(file, fh);
    }
    // Messages are built from the input too; rendering one must not panic either.
    if let Err(e) = &r {
        let _ = e.to_string();
    }
    r
}

/// A small valid file from the official writer.
fn valid_file() -> impl Strategy<Value = Vec<u8>> {
    let dtypes = [Dtype::U8, Dtype::BF16, Dtype::F32, Dtype::I64, Dtype::BOOL];
    prop::collection::btree_map(
        "[a-z.]{1,6}",
        (0..dtypes.len(), prop::collection::vec(0usize..4, 0..3)),
        1..5,
    )
    .prop_map(move |specs| {
        let data: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = specs
            .into_iter()
            .map(|(name, (d, shape))| {
                let n = shape.iter().product::<usize>() * dtypes[d].bitsize() / 8;
                (name, (dtypes[d], shape, vec![0xAB; n]))
            })
            .collect();
        let views = data.iter().map(|(name, (dtype, shape, bytes))| {
            (name, TensorView::new(*dtype, shape.clone(), bytes).unwrap())
        });
        let meta = Some([("format".to_owned(), "pt".to_owned())].into());
        serialize(views, meta).unwrap()
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, xor: u8 },
    Set { at: usize, byte: u8 },
    Insert { at: usize, byte: u8 },
    Delete { at: usize },
    Truncate { keep: usize },
    AddToLen { delta: i64 },
    SetLen { len: u64 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // The characters that change a JSON document's structure are the interesting ones.
    let json_byte = prop::sample::select(b"{}[]\",:0123456789-.e \\\x00\xff".to_vec());
    prop_oneof![
        (any::<usize>(), 1u8..).prop_map(|(at, xor)| Mutation::Flip { at, xor }),
        (any::<usize>(), json_byte.clone()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        (any::<usize>(), json_byte).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        any::<usize>().prop_map(|at| Mutation::Delete { at }),
        any::<usize>().prop_map(|keep| Mutation::Truncate { keep }),
        (-16i64..16).prop_map(|delta| Mutation::AddToLen { delta }),
        any::<u64>().prop_map(|len| Mutation::SetLen { len }),
    ]
}

fn apply(file: &mut Vec<u8>, m: &Mutation) {
    let pos = |at: usize, n: usize| if n == 0 { 0 } else { at % n };
    match *m {
        Mutation::Flip { at, xor } if !file.is_empty() => {
            let i = pos(at, file.len());
            file[i] ^= xor;
        }
        Mutation::Set { at, byte } if !file.is_empty() => {
            let i = pos(at, file.len());
            file[i] = byte;
        }
        Mutation::Insert { at, byte } => {
            let i = pos(at, file.len() + 1);
            file.insert(i, byte);
        }
        Mutation::Delete { at } if !file.is_empty() => {
            let i = pos(at, file.len());
            file.remove(i);
        }
        Mutation::Truncate { keep } => file.truncate(pos(keep, file.len() + 1)),
        Mutation::AddToLen { delta } if file.len() >= 8 => {
            let mut n = [0u8; 8];
            n.copy_from_slice(&file[..8]);
            let len = u64::from_le_bytes(n).wrapping_add_signed(delta);
            file[..8].copy_from_slice(&len.to_le_bytes());
        }
        Mutation::SetLen { len } if file.len() >= 8 => {
            file[..8].copy_from_slice(&len.to_le_bytes());
        }
        _ => {}
    }
}

/// Applies mutations to the length field and header only, where a change is not a no-op.
fn header_mutation(file: &[u8], m: Mutation) -> Mutation {
    let header_end = {
        let mut n = [0u8; 8];
        n.copy_from_slice(&file[..8]);
        8 + u64::from_le_bytes(n) as usize
    };
    match m {
        Mutation::Flip { at, xor } => Mutation::Flip {
            at: at % header_end,
            xor,
        },
        Mutation::Set { at, byte } => Mutation::Set {
            at: at % header_end,
            byte,
        },
        Mutation::Insert { at, byte } => Mutation::Insert {
            at: at % header_end,
            byte,
        },
        Mutation::Delete { at } => Mutation::Delete {
            at: at % header_end,
        },
        other => other,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = read(&bytes);
    }

    #[test]
    fn arbitrary_header_with_valid_length_never_panics(
        header in prop::collection::vec(prop::sample::select(b"{}[]\",: 0123456789-.eEaFUBOLdtypshfs_\\".to_vec()), 0..120),
        data_len in 0usize..64,
    ) {
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(&header);
        file.resize(file.len() + data_len, 0);
        let _ = read(&file);
    }

    #[test]
    fn mutated_files_never_panic(
        file in valid_file(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        prop_assert!(read(&file).is_ok());
        let mut mutated = file.clone();
        for m in mutations {
            let m = header_mutation(&file, m);
            apply(&mut mutated, &m);
        }
        let _ = read(&mutated);
    }
}

proptest! {
    // Through the file system: slower, so fewer cases.
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_on_disk_never_panic(
        file in valid_file(),
        mutations in prop::collection::vec(mutation(), 1..3),
    ) {
        let mut mutated = file.clone();
        for m in mutations {
            apply(&mut mutated, &header_mutation(&file, m));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        std::fs::write(&path, &mutated).unwrap();
        match Checkpoint::open(&path) {
            Ok(ck) => {
                for t in ck.tensors() {
                    prop_assert!(t.start <= t.end && t.end <= mutated.len() as u64);
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("m.safetensors")),
        }
    }
}
