//! Opening a checkpoint: deciding which files it is made of, reading their headers, and building
//! one tensor index over all of them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::error::{CheckpointError, HeaderError};
use super::gguf::read_gguf_stamped;
use super::index::parse_index;
use super::read::{read_header, FileHeader};
use super::{Checkpoint, TensorInfo};
use crate::io::FileStamp;

const INDEX_SUFFIX: &str = ".safetensors.index.json";
const SHARD_SUFFIX: &str = ".safetensors";
const GGUF_SUFFIX: &str = ".gguf";

pub(crate) fn open(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let meta = fs::metadata(path).map_err(io_err(path, "open"))?;
    if meta.is_dir() {
        open_folder(path)
    } else if has_suffix(path, ".json") {
        // No safetensors file is JSON, so any .json is taken for an index, whatever its name.
        open_index(path)
    } else if has_suffix(path, GGUF_SUFFIX) {
        open_gguf(path)
    } else {
        let mut b = Builder::default();
        b.add_file(path.to_path_buf())?;
        Ok(b.finish())
    }
}

fn open_folder(dir: &Path) -> Result<Checkpoint, CheckpointError> {
    let mut indexes = Vec::new();
    let mut shards = Vec::new();
    let mut ggufs = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir, "list the folder"))? {
        let entry = entry.map_err(io_err(dir, "list the folder"))?;
        let path = entry.path();
        // Follows symlinks: a folder of links into a cache (as hub downloads are) must work.
        let is_file = fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false);
        if !is_file {
            continue;
        }
        if has_suffix(&path, INDEX_SUFFIX) {
            indexes.push(path);
        } else if has_suffix(&path, SHARD_SUFFIX) {
            shards.push(path);
        } else if has_suffix(&path, GGUF_SUFFIX) {
            ggufs.push(path);
        }
    }
    if let [index] = indexes.as_slice() {
        return open_index(index);
    }
    // A GGUF file beside a safetensors checkpoint is left alone (often a conversion of it, kept
    // next to the original): such a folder opens as it did before GGUF was read.
    if shards.is_empty() {
        return match ggufs.as_slice() {
            [] => Err(CheckpointError::EmptyFolder {
                path: dir.to_path_buf(),
            }),
            [one] => open_gguf(one),
            many => Err(CheckpointError::SeveralGguf {
                path: dir.to_path_buf(),
                count: many.len(),
            }),
        };
    }
    shards.sort();
    let mut b = Builder::default();
    for shard in shards {
        b.add_file(shard)?;
    }
    Ok(b.finish())
}

fn open_index(index: &Path) -> Result<Checkpoint, CheckpointError> {
    let bytes = fs::read(index).map_err(io_err(index, "read the index"))?;
    let map = parse_index(index, &bytes)?;
    let dir = index.parent().unwrap_or(Path::new(""));

    // Sorted shard names, each with the first tensor the index maps to it (for messages).
    let mut shard_names: BTreeMap<&str, &str> = BTreeMap::new();
    for (tensor, shard) in &map.entries {
        shard_names.entry(shard.as_str()).or_insert(tensor.as_str());
    }
    let mut b = Builder::default();
    let mut file_of_shard: HashMap<&str, usize> = HashMap::new();
    for (&name, &tensor) in &shard_names {
        let shard = dir.join(name);
        match fs::metadata(&shard) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(CheckpointError::MissingShard {
                    path: index.to_path_buf(),
                    tensor: tensor.to_owned(),
                    shard,
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CheckpointError::MissingShard {
                    path: index.to_path_buf(),
                    tensor: tensor.to_owned(),
                    shard,
                })
            }
            Err(e) => {
                return Err(CheckpointError::Io {
                    path: shard,
                    action: "open",
                    source: e,
                })
            }
        }
        file_of_shard.insert(name, b.files.len());
        b.add_file(shard)?;
    }

    for (tensor, shard) in &map.entries {
        let expected_file = file_of_shard.get(shard.as_str()).copied();
        let found_file = b.by_name.get(tensor).and_then(|&i| b.tensors.get(i));
        if found_file.map(|t| t.file) != expected_file || expected_file.is_none() {
            return Err(CheckpointError::TensorNotInShard {
                path: index.to_path_buf(),
                tensor: tensor.clone(),
                shard: dir.join(shard),
            });
        }
    }
    let listed: HashSet<&str> = map.entries.iter().map(|(t, _)| t.as_str()).collect();
    if let Some(t) = b.tensors.iter().find(|t| !listed.contains(t.name.as_str())) {
        return Err(CheckpointError::TensorNotInIndex {
            path: index.to_path_buf(),
            tensor: t.name.clone(),
            shard: b.files.get(t.file).cloned().unwrap_or_default(),
        });
    }
    Ok(b.finish())
}

/// A GGUF checkpoint: one file, its tensors ordered by start offset.
fn open_gguf(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let (gguf, stamp) = read_gguf_stamped(path)?;
    let mut tensors: Vec<TensorInfo> = gguf
        .tensors
        .iter()
        .map(|t| TensorInfo {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: original_shape(&gguf, &t.name, t.numel()).unwrap_or_else(|| t.shape()),
            file: 0,
            start: t.start,
            end: t.end(),
        })
        .collect();
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    // The parser refuses duplicate names, so every name gets its own position.
    let by_name = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), i))
        .collect();
    Ok(Checkpoint {
        files: vec![path.to_path_buf()],
        metadata: vec![BTreeMap::new()],
        stamps: vec![stamp],
        tensors,
        by_name,
        gguf: Some(gguf),
    })
}

/// The metadata key under which ComfyUI-GGUF's converter (which wrote most published diffusion
/// GGUF files) records the shape of a tensor of more dimensions than GGUF holds (a video model's
/// 3-D convolution), the tensor itself being stored flattened to fewer.
pub const ORIGINAL_SHAPE_PREFIX: &str = "comfy.gguf.orig_shape.";

/// The shape the file records for tensor `name` under [`ORIGINAL_SHAPE_PREFIX`], when it is an
/// array of positive integers holding as many elements as the stored tensor.
fn original_shape(gguf: &super::gguf::GgufFile, name: &str, numel: u64) -> Option<Vec<usize>> {
    let array = gguf
        .get(&format!("{ORIGINAL_SHAPE_PREFIX}{name}"))?
        .as_array()?;
    let dims: Vec<usize> = (0..array.len())
        .map(|i| array.get(i)?.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<_>>()?;
    let count = dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))?;
    (count == numel && !dims.is_empty()).then_some(dims)
}

/// Accumulates files and their tensors; the order of `add_file` calls is the order of files.
#[derive(Default)]
struct Builder {
    files: Vec<PathBuf>,
    metadata: Vec<BTreeMap<String, String>>,
    stamps: Vec<FileStamp>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl Builder {
    fn add_file(&mut self, path: PathBuf) -> Result<(), CheckpointError> {
        let (fh, stamp) = read_file_header(&path)?;
        let file = self.files.len();
        let mut entries = fh.header.entries;
        entries.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
        for e in entries {
            let range = fh
                .data_start
                .checked_add(e.begin)
                .zip(fh.data_start.checked_add(e.end));
            // The parser keeps ranges inside the data section, which ends at the file's length,
            // so this only fails if that promise is broken.
            let Some((start, end)) = range else {
                return Err(CheckpointError::Header {
                    path,
                    kind: HeaderError::OffsetsBeyondData {
                        tensor: e.name,
                        begin: e.begin,
                        end: e.end,
                        data_len: fh.data_len,
                    },
                });
            };
            if let Some(&first) = self.by_name.get(&e.name) {
                let first = self
                    .tensors
                    .get(first)
                    .and_then(|t| self.files.get(t.file))
                    .cloned()
                    .unwrap_or_default();
                return Err(CheckpointError::DuplicateTensor {
                    path,
                    tensor: e.name,
                    first,
                });
            }
            self.by_name.insert(e.name.clone(), self.tensors.len());
            self.tensors.push(TensorInfo {
                name: e.name,
                dtype: e.dtype,
                shape: e.shape,
                file,
                start,
                end,
            });
        }
        self.files.push(path);
        self.metadata.push(fh.header.metadata);
        self.stamps.push(stamp);
        Ok(())
    }

    fn finish(self) -> Checkpoint {
        Checkpoint {
            files: self.files,
            metadata: self.metadata,
            stamps: self.stamps,
            tensors: self.tensors,
            by_name: self.by_name,
            gguf: None,
        }
    }
}

/// The file's header, and the stamp of the file it was read from (the same open file).
fn read_file_header(path: &Path) -> Result<(FileHeader, FileStamp), CheckpointError> {
    let file = File::open(path).map_err(io_err(path, "open"))?;
    let meta = file.metadata().map_err(io_err(path, "stat"))?;
    let header = read_header(&file, meta.len()).map_err(|kind| CheckpointError::Header {
        path: path.to_path_buf(),
        kind,
    })?;
    Ok((header, FileStamp::of(&meta)))
}

fn has_suffix(path: &Path, suffix: &str) -> bool {
    path.file_name()
        .map(|n| n.to_string_lossy().ends_with(suffix))
        .unwrap_or(false)
}

fn io_err<'a>(
    path: &'a Path,
    action: &'static str,
) -> impl FnOnce(io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        action,
        source,
    }
}
