//! One read queue per drive, for the whole process: every model reading from a drive waits in
//! the same queue (each through a lane of its own), so the drive is shared by need and priority
//! rather than by whoever asks first.
//!
//! A drive is the file's device number (`st_dev`) on Unix. Elsewhere (Windows) one queue serves
//! every file: the device of an open file is not as cheap to learn there, and a machine that
//! streams weights seldom reads two drives at once; one queue only means reads of two drives
//! share `DRIVE_IN_FLIGHT` places.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use super::{IoError, ReadQueue, DRIVE_IN_FLIGHT};

/// The queues live as long as the process: a queue is a few words, and a model loaded later
/// must find the same queue as the one running.
fn registry() -> &'static Mutex<HashMap<u64, Arc<ReadQueue>>> {
    static QUEUES: OnceLock<Mutex<HashMap<u64, Arc<ReadQueue>>>> = OnceLock::new();
    QUEUES.get_or_init(Mutex::default)
}

#[cfg(unix)]
fn drive_of(path: &Path) -> Result<u64, IoError> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.dev())
        .map_err(|source| IoError::Open {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(not(unix))]
fn drive_of(path: &Path) -> Result<u64, IoError> {
    // One key for every drive (see the module's note); the file must still exist, as on Unix.
    std::fs::metadata(path)
        .map(|_| 0)
        .map_err(|source| IoError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// The process's read queue for the drive holding `path` (made on first use with
/// [`DRIVE_IN_FLIGHT`] places).
pub fn drive_queue(path: &Path) -> Result<Arc<ReadQueue>, IoError> {
    let drive = drive_of(path)?;
    let mut queues = registry().lock().unwrap_or_else(|p| p.into_inner());
    Ok(queues
        .entry(drive)
        .or_insert_with(|| Arc::new(ReadQueue::new(DRIVE_IN_FLIGHT)))
        .clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_of_one_drive_share_a_queue() {
        let dir = std::env::temp_dir();
        let a = dir.join(format!("tp-drive-queue-a-{}", std::process::id()));
        let b = dir.join(format!("tp-drive-queue-b-{}", std::process::id()));
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let (qa, qb) = (drive_queue(&a).unwrap(), drive_queue(&b).unwrap());
        std::fs::remove_file(&a).unwrap();
        std::fs::remove_file(&b).unwrap();
        assert!(Arc::ptr_eq(&qa, &qb));
        assert_eq!(qa.depth(), DRIVE_IN_FLIGHT);
    }

    #[test]
    fn a_missing_file_names_itself() {
        let e = drive_queue(Path::new("/no/such/checkpoint.safetensors")).unwrap_err();
        assert!(e.to_string().contains("checkpoint.safetensors"), "{e}");
    }
}
