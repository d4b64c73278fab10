//! Where a checkpoint's order file lives and what it is called.
//!
//! | checkpoint given as                               | order file                                  |
//! |---------------------------------------------------|---------------------------------------------|
//! | `dir/model.safetensors` (any single file)          | `dir/model_order.json`                      |
//! | `dir/model.safetensors.index.json` (any `.json`)   | `dir/model_order.json`                      |
//! | `pipe/transformer/` (a folder)                     | `pipe/transformer/transformer_order.json`   |
//!
//! With a destination folder the same name goes into that folder instead. A folder is named after
//! itself rather than after the index inside it, because diffusers folders all hold the same
//! `diffusion_pytorch_model.safetensors.index.json`, and a shared destination would then mix
//! up their files.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use super::OrderError;

/// What every order file's name ends in.
pub const ORDER_SUFFIX: &str = "_order.json";

/// The order file of `checkpoint` (a safetensors file, a sharded checkpoint's index, or a
/// folder), next to it or in `destination`. Only asks the file system whether `checkpoint` is a
/// folder; neither path has to exist otherwise.
pub fn order_file_path(
    checkpoint: &Path,
    destination: Option<&Path>,
) -> Result<PathBuf, OrderError> {
    let is_dir = fs::metadata(checkpoint).is_ok_and(|m| m.is_dir());
    let (home, stem) = if is_dir {
        (checkpoint.to_path_buf(), folder_name(checkpoint)?)
    } else {
        let parent = checkpoint.parent().unwrap_or(Path::new("")).to_path_buf();
        (parent, file_stem(checkpoint)?)
    };
    let mut name = stem;
    name.push(ORDER_SUFFIX);
    Ok(destination.map_or(home, Path::to_path_buf).join(name))
}

fn no_name(path: &Path, why: &'static str) -> OrderError {
    OrderError::NoName {
        path: path.to_path_buf(),
        why,
    }
}

/// The folder's own name; `.` or `..` are resolved first so they name the real folder.
fn folder_name(dir: &Path) -> Result<OsString, OrderError> {
    if let Some(name) = dir.file_name() {
        return Ok(name.to_os_string());
    }
    let real = fs::canonicalize(dir).map_err(|_| no_name(dir, "the folder cannot be resolved"))?;
    real.file_name()
        .map(|n| n.to_os_string())
        .ok_or_else(|| no_name(dir, "the folder has no name (a file system root)"))
}

/// `model` for `model.safetensors` and for `model.safetensors.index.json`.
fn file_stem(file: &Path) -> Result<OsString, OrderError> {
    let name = file
        .file_name()
        .ok_or_else(|| no_name(file, "the path ends without a file name"))?;
    let stem = match name.to_str() {
        Some(text) if text.ends_with(".json") => {
            let text = &text[..text.len() - ".json".len()];
            let text = text.strip_suffix(".index").unwrap_or(text);
            let text = text.strip_suffix(".safetensors").unwrap_or(text);
            OsString::from(text)
        }
        // Non-UTF-8 names cannot be an index by name; the last extension goes as for any file.
        _ => Path::new(name)
            .file_stem()
            .map(|s| s.to_os_string())
            .unwrap_or_default(),
    };
    if stem.is_empty() {
        return Err(no_name(file, "the file name is only an extension"));
    }
    Ok(stem)
}
