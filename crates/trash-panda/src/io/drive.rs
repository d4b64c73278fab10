//! The drive's own speed, measured beside a run so a profile can say whether the drive or the
//! library set the pace. Unbuffered reads go to the device whatever the page cache holds, so the
//! measurement needs no cache drop and leaves the cache as the run left it.

use std::path::PathBuf;
use std::time::Instant;

use super::{
    read_ranges_with, AlignedBuf, FileReader, IoError, ReadMode, ReadOptions, ReadRequest,
};

/// Requests in flight: the best of the standalone readers measured in BENCHMARK.md ("Cold RAM
/// tier") kept 2 to 4; a deeper queue only helps a drive that wants one.
pub const DRIVE_IN_FLIGHT: usize = 4;
/// One read's size, as `dd bs=8M`.
const DRIVE_CHUNK: usize = 8 << 20;
/// The bytes read into one buffer before it is reused: memory held while measuring.
const DRIVE_PIECE: usize = 64 << 20;
/// A slow drive (a disk with heads, a network share) stops being read after this long: the rate
/// is known by then, and a profile should not keep a user waiting.
const DRIVE_SECONDS: f64 = 1.0;

/// What [`measure_drive`] read, and how fast.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DriveRate {
    /// Bytes read.
    pub bytes: u64,
    /// Wall-clock seconds the reads took.
    pub seconds: f64,
    /// Reads kept in flight at once.
    pub in_flight: usize,
}

impl DriveRate {
    /// The rate in GB/s (10^9 bytes); 0 when no time was measured.
    pub fn gb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / 1e9 / self.seconds
        } else {
            0.0
        }
    }
}

/// Reads up to `max_bytes` from the start of `files` (in order) with unbuffered reads,
/// [`DRIVE_IN_FLIGHT`] requests in flight, stopping early once a second has passed. `Ok(None)`
/// when a file system refuses unbuffered reads (a RAM-backed one, say): a buffered read could be
/// served from memory and would be no measure of the drive.
pub fn measure_drive(files: &[PathBuf], max_bytes: u64) -> Result<Option<DriveRate>, IoError> {
    let mut readers = Vec::new();
    for path in files {
        let r = FileReader::open(path, ReadMode::Direct)?;
        if r.effective_mode() != ReadMode::Direct {
            return Ok(None);
        }
        readers.push(r);
    }
    let mut buf = AlignedBuf::new(DRIVE_PIECE)?;
    // Fresh memory is faulted in on first touch; that is not the drive's time.
    buf.prefault();
    let opts = ReadOptions {
        threads: DRIVE_IN_FLIGHT,
        chunk_size: DRIVE_CHUNK,
        populate: false,
    };
    let mut left = max_bytes;
    let mut bytes = 0u64;
    let started = Instant::now();
    for r in &readers {
        let align = r.alignment() as u64;
        // Whole aligned reads only: the tail of a file shorter than the alignment is skipped.
        let mut offset = 0u64;
        let end = r.len().min(offset + left) / align * align;
        let mut late = false;
        while offset < end && !late {
            let n = ((end - offset) as usize).min(buf.len());
            let mut req = [ReadRequest::new(offset, &mut buf[..n])];
            read_ranges_with(r, &mut req, &opts)?;
            offset += n as u64;
            late = started.elapsed().as_secs_f64() >= DRIVE_SECONDS;
        }
        bytes += offset;
        left -= offset;
        if left == 0 || late {
            break;
        }
    }
    Ok(Some(DriveRate {
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        in_flight: DRIVE_IN_FLIGHT,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_at_most_the_asked_bytes_across_files() {
        let mut a = tempfile::NamedTempFile::new().unwrap();
        a.write_all(&vec![1u8; 3 << 20]).unwrap();
        let mut b = tempfile::NamedTempFile::new().unwrap();
        b.write_all(&vec![2u8; 5 << 20]).unwrap();
        let files = [a.path().to_owned(), b.path().to_owned()];
        let Some(rate) = measure_drive(&files, 6 << 20).unwrap() else {
            // The temporary directory's file system refuses unbuffered reads: nothing to time.
            return;
        };
        assert_eq!(rate.bytes, 6 << 20);
        assert!(rate.seconds > 0.0);
        assert_eq!(rate.in_flight, DRIVE_IN_FLIGHT);
        let all = measure_drive(&files, u64::MAX).unwrap().unwrap();
        assert_eq!(all.bytes, 8 << 20);
    }

    #[test]
    fn a_missing_file_is_named() {
        let missing = PathBuf::from("/nonexistent/drive-check.safetensors");
        let err = measure_drive(&[missing], 1 << 20).unwrap_err();
        assert!(err.to_string().contains("drive-check.safetensors"), "{err}");
    }
}
