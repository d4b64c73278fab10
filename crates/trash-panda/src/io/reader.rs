//! Positional reads into caller buffers: buffered, or unbuffered (O_DIRECT on Linux,
//! FILE_FLAG_NO_BUFFERING on Windows, F_NOCACHE on macOS) with a transparent fallback.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use super::aligned::{align_down, align_up, AlignedBuf, DIRECT_ALIGN};
use super::{platform, IoError};

/// How a [`FileReader`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    /// `pread` through the page cache.
    Buffered,
    /// Unbuffered `pread`: straight from the drive into aligned memory, bypassing the cache
    /// (see [`FileReader::unbuffered_flag`] for what the platform uses).
    Direct,
}

impl ReadMode {
    /// `"buffered"` or `"direct"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadMode::Buffered => "buffered",
            ReadMode::Direct => "direct",
        }
    }
}

impl fmt::Display for ReadMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// States of the O_DIRECT descriptor. A refusal can only be learnt from the first read on some
// filesystems, so the state changes behind `&self` and is shared by reader threads.
const DIRECT_UNTRIED: u8 = 0;
const DIRECT_WORKS: u8 = 1;
const DIRECT_REFUSED: u8 = 2;

/// A file opened for positional reads from any number of threads at once (`&self` methods).
///
/// In [`ReadMode::Direct`] the reader falls back to buffered reads when the filesystem refuses
/// O_DIRECT, at open (EINVAL on some filesystems) or at the first read;
/// [`effective_mode`](Self::effective_mode) says which one is in use.
pub struct FileReader {
    path: PathBuf,
    size: u64,
    buffered: File,
    direct: Option<File>,
    requested: ReadMode,
    direct_state: AtomicU8,
    /// Test hook: make every O_DIRECT read fail with EINVAL, as a refusing filesystem does.
    refuse_direct_reads: bool,
}

impl FileReader {
    /// Opens `path` for reading in `mode`.
    pub fn open(path: impl AsRef<Path>, mode: ReadMode) -> Result<Self, IoError> {
        Self::open_inner(path.as_ref(), mode, false)
    }

    fn open_inner(path: &Path, mode: ReadMode, refuse_direct_reads: bool) -> Result<Self, IoError> {
        let open_err = |source| IoError::Open {
            path: path.to_owned(),
            source,
        };
        let buffered = File::open(path).map_err(open_err)?;
        let size = buffered.metadata().map_err(open_err)?.len();
        let direct = match mode {
            ReadMode::Direct => platform::open_unbuffered(path).map_err(open_err)?,
            ReadMode::Buffered => None,
        };
        let state = if direct.is_some() {
            DIRECT_UNTRIED
        } else {
            DIRECT_REFUSED
        };
        Ok(FileReader {
            path: path.to_owned(),
            size,
            buffered,
            direct,
            requested: mode,
            direct_state: AtomicU8::new(state),
            refuse_direct_reads,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file (its buffered handle), to look at its metadata.
    pub fn file(&self) -> &File {
        &self.buffered
    }

    /// The file's size when it was opened.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The mode asked for at open.
    pub fn requested_mode(&self) -> ReadMode {
        self.requested
    }

    /// The mode reads use now: `Buffered` if O_DIRECT was asked for but refused.
    pub fn effective_mode(&self) -> ReadMode {
        if self.direct_usable() {
            ReadMode::Direct
        } else {
            ReadMode::Buffered
        }
    }

    /// What this platform opens unbuffered files with: `O_DIRECT`, `FILE_FLAG_NO_BUFFERING` or
    /// `F_NOCACHE`.
    pub fn unbuffered_flag() -> &'static str {
        platform::UNBUFFERED
    }

    /// Asks the system to start reading `offset..offset + len` into the cache (advice only: it
    /// returns at once, and does nothing where the platform has no such call).
    pub fn advise_read(&self, offset: u64, len: u64) -> Result<(), IoError> {
        self.check_range(offset, usize::try_from(len).unwrap_or(usize::MAX))?;
        platform::advise_read(&self.buffered, offset, len).map_err(|(op, source)| IoError::Cache {
            path: self.path.clone(),
            op,
            source,
        })
    }

    /// The alignment of offsets, lengths and addresses that O_DIRECT reads use.
    pub fn alignment(&self) -> usize {
        DIRECT_ALIGN
    }

    /// The size an [`AlignedBuf`] needs for [`read_direct`](Self::read_direct) of `len` bytes at
    /// `offset`: the aligned superset of the range.
    pub fn direct_span(&self, offset: u64, len: usize) -> usize {
        let end = offset.saturating_add(len as u64);
        (align_up(end, DIRECT_ALIGN) - align_down(offset, DIRECT_ALIGN)) as usize
    }

    /// Fails unless `offset..offset + len` lies inside the file.
    pub fn check_range(&self, offset: u64, len: usize) -> Result<(), IoError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(IoError::OutOfRange {
                path: self.path.clone(),
                offset,
                len: len as u64,
                file_size: self.size,
            }),
        }
    }

    /// Reads exactly `dst.len()` bytes at `offset` through the page cache, whatever the mode.
    pub fn read_exact_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), IoError> {
        self.check_range(offset, dst.len())?;
        self.buffered_exact(offset, dst)
    }

    /// Reads `len` bytes at `offset` into `buf` and returns them as a slice of `buf`.
    ///
    /// In direct mode the aligned superset of the range is read (so `buf` needs
    /// [`direct_span`](Self::direct_span) bytes) and the requested part is returned. In buffered
    /// mode, or when `buf` is aligned to less than [`alignment`](Self::alignment), only the range
    /// is read, at the same place in `buf`.
    pub fn read_direct<'b>(
        &self,
        offset: u64,
        len: usize,
        buf: &'b mut AlignedBuf,
    ) -> Result<&'b [u8], IoError> {
        self.check_range(offset, len)?;
        let start = align_down(offset, DIRECT_ALIGN);
        let span = self.direct_span(offset, len);
        if buf.len() < span {
            return Err(IoError::BufferTooSmall {
                path: self.path.clone(),
                offset,
                need: span,
                have: buf.len(),
            });
        }
        let skip = (offset - start) as usize;
        let wanted_end = offset + len as u64;
        let read_direct = self.direct_usable() && buf.align() >= DIRECT_ALIGN && len > 0;
        if read_direct {
            if let Some(got) = self.direct_pread(start, &mut buf[..span], wanted_end)? {
                if start + (got as u64) < wanted_end {
                    return Err(self.eof(offset, len, start + got as u64));
                }
                return Ok(&buf[skip..skip + len]);
            }
        }
        self.buffered_exact(offset, &mut buf[skip..skip + len])?;
        Ok(&buf[skip..skip + len])
    }

    /// Reads exactly `dst.len()` bytes at `offset` into any buffer, in the reader's mode.
    ///
    /// In direct mode the aligned middle of the range goes straight into `dst` when `dst`'s
    /// address lines up with the file offset; the unaligned head and tail, or everything when it
    /// does not line up, pass through `bounce` (at least two alignment units; larger means fewer
    /// system calls for misaligned destinations).
    pub fn read_into(
        &self,
        offset: u64,
        dst: &mut [u8],
        bounce: &mut AlignedBuf,
    ) -> Result<(), IoError> {
        self.check_range(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        if !self.direct_usable() {
            return self.buffered_exact(offset, dst);
        }
        let a = DIRECT_ALIGN;
        if bounce.len() < 2 * a || bounce.align() < a {
            return Err(IoError::BufferTooSmall {
                path: self.path.clone(),
                offset,
                need: 2 * a,
                have: bounce.len(),
            });
        }
        let head = ((align_up(offset, a) - offset) as usize).min(dst.len());
        let lines_up = (dst.as_ptr() as usize + head).is_multiple_of(a);
        if !lines_up {
            return self.through_bounce(offset, dst, bounce);
        }
        let middle = (dst.len() - head) & !(a - 1);
        let (head_dst, rest) = dst.split_at_mut(head);
        let (middle_dst, tail_dst) = rest.split_at_mut(middle);
        self.through_bounce(offset, head_dst, bounce)?;
        let mid_off = offset + head as u64;
        if !middle_dst.is_empty() {
            let end = mid_off + middle as u64;
            match self.direct_pread(mid_off, middle_dst, end)? {
                Some(got) if got == middle => {}
                Some(got) => return Err(self.eof(mid_off, middle, mid_off + got as u64)),
                None => self.buffered_exact(mid_off, middle_dst)?,
            }
        }
        self.through_bounce(mid_off + middle as u64, tail_dst, bounce)
    }

    /// Copies `dst.len()` bytes at `offset` in pieces that fit `bounce` with room for alignment.
    fn through_bounce(
        &self,
        mut offset: u64,
        dst: &mut [u8],
        bounce: &mut AlignedBuf,
    ) -> Result<(), IoError> {
        let piece = bounce.len() - DIRECT_ALIGN;
        for part in dst.chunks_mut(piece) {
            let got = self.read_direct(offset, part.len(), bounce)?;
            part.copy_from_slice(got);
            offset += part.len() as u64;
        }
        Ok(())
    }

    fn direct_usable(&self) -> bool {
        self.direct_state.load(Ordering::Relaxed) != DIRECT_REFUSED
    }

    /// One O_DIRECT read of the aligned `dst` at the aligned `offset`, stopping at EOF or once
    /// `needed_end` is covered. Returns the bytes read, or `None` when O_DIRECT turned out to be
    /// refused (the reader is then buffered from now on).
    fn direct_pread(
        &self,
        offset: u64,
        dst: &mut [u8],
        needed_end: u64,
    ) -> Result<Option<usize>, IoError> {
        let Some(file) = &self.direct else {
            return Ok(None);
        };
        let mut done = 0usize;
        while done < dst.len() {
            let res = if self.refuse_direct_reads {
                Err(platform::refusal())
            } else {
                platform::read_at(file, &mut dst[done..], offset + done as u64)
            };
            match res {
                Ok(0) => break,
                Ok(n) => {
                    done += n;
                    // O_DIRECT only stops short at EOF (or a signal); an unaligned count means
                    // EOF, and another read from an unaligned offset would fail.
                    if !done.is_multiple_of(DIRECT_ALIGN) || offset + done as u64 >= needed_end {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if platform::is_refusal(&e) && self.may_fall_back() => {
                    return Ok(None);
                }
                Err(source) => {
                    return Err(IoError::Read {
                        path: self.path.clone(),
                        offset,
                        len: dst.len() as u64,
                        source,
                    })
                }
            }
        }
        self.direct_state.store(DIRECT_WORKS, Ordering::Relaxed);
        Ok(Some(done))
    }

    /// After a refusal (EINVAL; ERROR_INVALID_PARAMETER on Windows): gives up on unbuffered
    /// reads unless they have already worked for this file, in which case the refusal is a real
    /// error (a bug in our alignment) and must not be hidden.
    fn may_fall_back(&self) -> bool {
        let swapped = self.direct_state.compare_exchange(
            DIRECT_UNTRIED,
            DIRECT_REFUSED,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        matches!(swapped, Ok(_) | Err(DIRECT_REFUSED))
    }

    fn buffered_exact(&self, offset: u64, dst: &mut [u8]) -> Result<(), IoError> {
        let mut done = 0usize;
        while done < dst.len() {
            let at = offset + done as u64;
            match platform::read_at(&self.buffered, &mut dst[done..], at) {
                Ok(0) => return Err(self.eof(offset, dst.len(), at)),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(IoError::Read {
                        path: self.path.clone(),
                        offset,
                        len: dst.len() as u64,
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    fn eof(&self, offset: u64, len: usize, got_to: u64) -> IoError {
        IoError::UnexpectedEof {
            path: self.path.clone(),
            offset,
            len: len as u64,
            got_to,
        }
    }
}

impl fmt::Debug for FileReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileReader")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("requested", &self.requested)
            .field("effective", &self.effective_mode())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn data(n: usize) -> Vec<u8> {
        (0..n as u64)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect()
    }

    // Under the target dir, which is on a real disk here (unlike a tmpfs /tmp elsewhere).
    fn disk_file(bytes: &[u8]) -> tempfile::NamedTempFile {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
        f
    }

    #[test]
    fn direct_reads_unaligned_ranges() {
        let d = data(3 * 4096 + 123);
        let f = disk_file(&d);
        let r = FileReader::open(f.path(), ReadMode::Direct).unwrap();
        let mut buf = AlignedBuf::new(8 * 4096).unwrap();
        let mut bounce = AlignedBuf::new(2 * 4096).unwrap();
        for (off, len) in [
            (0, d.len()),
            (1, 5000),
            (4095, 2),
            (4096, 4096),
            (12000, 411),
        ] {
            let got = r.read_direct(off as u64, len, &mut buf).unwrap();
            assert_eq!(got, &d[off..off + len], "read_direct {off}+{len}");
            let mut v = vec![0u8; len];
            r.read_into(off as u64, &mut v, &mut bounce).unwrap();
            assert_eq!(v, &d[off..off + len], "read_into {off}+{len}");
        }
        assert_eq!(r.requested_mode(), ReadMode::Direct);
    }

    #[test]
    fn refusal_at_first_read_falls_back_to_buffered() {
        let d = data(10_000);
        let f = disk_file(&d);
        let r = FileReader::open_inner(f.path(), ReadMode::Direct, true).unwrap();
        let mut buf = AlignedBuf::new(16384).unwrap();
        assert_eq!(r.read_direct(17, 9000, &mut buf).unwrap(), &d[17..9017]);
        assert_eq!(r.effective_mode(), ReadMode::Buffered);
        let mut v = vec![0; 9999];
        r.read_into(1, &mut v, &mut buf).unwrap();
        assert_eq!(v, &d[1..]);
    }

    #[test]
    fn errors_name_file_and_range() {
        let f = disk_file(&data(100));
        let r = FileReader::open(f.path(), ReadMode::Direct).unwrap();
        let mut buf = AlignedBuf::new(4096).unwrap();
        let e = r.read_direct(90, 20, &mut buf).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("90..110") && msg.contains("100 bytes"),
            "{msg}"
        );
        assert_eq!(e.path(), Some(f.path()));
        assert!(r.read_exact_at(u64::MAX, &mut [0; 2]).is_err());
        let f2 = disk_file(&data(10_000));
        let r2 = FileReader::open(f2.path(), ReadMode::Direct).unwrap();
        let e = r2.read_direct(4000, 200, &mut buf).unwrap_err();
        assert!(
            matches!(e, IoError::BufferTooSmall { need: 8192, .. }),
            "{e}"
        );
        assert!(matches!(
            FileReader::open("/nonexistent/x", ReadMode::Buffered),
            Err(IoError::Open { .. })
        ));
    }
}
