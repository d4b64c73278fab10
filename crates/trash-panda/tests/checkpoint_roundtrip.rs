//! Files written by the official `safetensors` writer read back through `Checkpoint::open`:
//! single files, sharded checkpoints through their index, and folders.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

use proptest::prelude::*;
use safetensors::tensor::{serialize, serialize_to_file, TensorView};
use safetensors::Dtype;
use trash_panda::checkpoint::read_header;
use trash_panda::{Checkpoint, DType};

/// Every dtype the engine knows, with the writer's name for it.
const DTYPES: [(DType, Dtype); 15] = [
    (DType::F64, Dtype::F64),
    (DType::F32, Dtype::F32),
    (DType::F16, Dtype::F16),
    (DType::BF16, Dtype::BF16),
    (DType::F8E4M3, Dtype::F8_E4M3),
    (DType::F8E5M2, Dtype::F8_E5M2),
    (DType::I64, Dtype::I64),
    (DType::I32, Dtype::I32),
    (DType::I16, Dtype::I16),
    (DType::I8, Dtype::I8),
    (DType::U64, Dtype::U64),
    (DType::U32, Dtype::U32),
    (DType::U16, Dtype::U16),
    (DType::U8, Dtype::U8),
    (DType::Bool, Dtype::BOOL),
];

#[derive(Debug, Clone)]
struct Tensor {
    dtype: usize,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Tensor {
    fn view(&self) -> TensorView<'_> {
        TensorView::new(DTYPES[self.dtype].1, self.shape.clone(), &self.data).unwrap()
    }
}

/// Scalars, zero-size dimensions, and small tensors of every dtype.
fn tensor() -> impl Strategy<Value = Tensor> {
    (0..DTYPES.len(), prop::collection::vec(0usize..5, 0..4)).prop_flat_map(|(dtype, shape)| {
        let len = shape.iter().product::<usize>() * DTYPES[dtype].0.size();
        prop::collection::vec(any::<u8>(), len).prop_map(move |data| Tensor {
            dtype,
            shape: shape.clone(),
            data,
        })
    })
}

fn tensors() -> impl Strategy<Value = BTreeMap<String, Tensor>> {
    prop::collection::btree_map("[a-z][a-z0-9_.]{0,12}", tensor(), 0..7)
}

fn metadata() -> impl Strategy<Value = Option<HashMap<String, String>>> {
    prop::option::of(prop::collection::hash_map(
        "[a-z_]{1,6}",
        "[ -~]{0,8}",
        0..3,
    ))
}

/// Checks that `ck` holds exactly `expected`, with the right bytes in the files.
fn check(ck: &Checkpoint, expected: &BTreeMap<String, Tensor>) {
    assert_eq!(ck.tensors().len(), expected.len());
    let mut contents = HashMap::new();
    for (name, t) in expected {
        let info = ck.get(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(&info.name, name);
        assert_eq!(info.dtype, DTYPES[t.dtype].0, "{name}");
        assert_eq!(info.shape, t.shape, "{name}");
        assert_eq!(info.nbytes(), t.data.len() as u64, "{name}");
        let file = ck.file_of(info);
        let bytes = contents
            .entry(file.to_path_buf())
            .or_insert_with(|| fs::read(file).unwrap());
        assert_eq!(
            &bytes[info.start as usize..info.end as usize],
            &t.data[..],
            "{name}"
        );
    }
    let total: usize = expected.values().map(|t| t.data.len()).sum();
    assert_eq!(ck.total_bytes(), total as u64);
    // Ordered by file, then by start offset.
    let keys: Vec<(usize, u64)> = ck.tensors().iter().map(|t| (t.file, t.start)).collect();
    assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
}

fn write_shards(dir: &Path, tensors: &BTreeMap<String, Tensor>, shard_of: &[usize], shards: usize) {
    let mut map = serde_json::Map::new();
    for s in 0..shards {
        let name = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        let mine: Vec<(&String, TensorView<'_>)> = tensors
            .iter()
            .zip(shard_of.iter().cycle())
            .filter(|(_, k)| **k % shards == s)
            .map(|((n, t), _)| (n, t.view()))
            .collect();
        for (n, _) in &mine {
            map.insert((*n).clone(), name.clone().into());
        }
        serialize_to_file(mine, None, &dir.join(&name)).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn single_file_round_trips(tensors in tensors(), meta in metadata()) {
        // safetensors 0.8 writes `{},"__metadata__":{}}` (invalid JSON, which its own reader
        // rejects too) for no tensors and an empty metadata map: its map length hint is 0.
        let meta = meta.filter(|m| !(m.is_empty() && tensors.is_empty()));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let views: Vec<(&String, TensorView<'_>)> =
            tensors.iter().map(|(n, t)| (n, t.view())).collect();
        serialize_to_file(views.clone(), meta.clone(), &path).unwrap();

        let ck = Checkpoint::open(&path).unwrap();
        check(&ck, &tensors);
        let want_meta: BTreeMap<String, String> = meta.clone().unwrap_or_default().into_iter().collect();
        prop_assert_eq!(ck.metadata(0), &want_meta);

        // The in-memory writer and the slice reader agree with the file path.
        let bytes = serialize(views, meta).unwrap();
        prop_assert_eq!(&bytes, &fs::read(&path).unwrap());
        let fh = read_header(&bytes[..], bytes.len() as u64).unwrap();
        prop_assert_eq!(fh.header.entries.len(), tensors.len());
        prop_assert_eq!(fh.data_start + fh.data_len, bytes.len() as u64);
    }

    #[test]
    fn sharded_round_trips(
        tensors in prop::collection::btree_map("[a-z][a-z0-9_.]{0,12}", tensor(), 1..10),
        shards in 1usize..4,
        shard_of in prop::collection::vec(0usize..4, 1..10),
    ) {
        let dir = tempfile::tempdir().unwrap();
        write_shards(dir.path(), &tensors, &shard_of, shards);

        let by_index = Checkpoint::open(dir.path().join("model.safetensors.index.json")).unwrap();
        check(&by_index, &tensors);
        let by_folder = Checkpoint::open(dir.path()).unwrap();
        check(&by_folder, &tensors);
        prop_assert_eq!(by_index.files(), by_folder.files());
        prop_assert_eq!(by_index.tensors(), by_folder.tensors());

        // Without the index, the folder's shards are read in name order.
        fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
        let no_index = Checkpoint::open(dir.path()).unwrap();
        check(&no_index, &tensors);
        prop_assert_eq!(no_index.files().len(), shards);
        let mut sorted = no_index.files().to_vec();
        sorted.sort();
        prop_assert_eq!(no_index.files(), &sorted[..]);
    }
}
