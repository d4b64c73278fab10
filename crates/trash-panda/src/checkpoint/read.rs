//! Reading one safetensors file's header: the 8-byte length field, then the JSON, never the data.
//!
//! The reads go through [`HeaderSource`] so that a file on disk and a byte slice (the fuzzer's
//! input) take exactly the same path through the length checks and the parser.

use std::io;

use super::error::HeaderError;
use super::header::{parse_header, Header, MAX_HEADER_LEN};

/// Bytes of the little-endian length field at the start of every safetensors file.
pub const LEN_FIELD: u64 = 8;

/// Something that can fill a buffer from an absolute offset without moving a cursor (`pread`).
pub trait HeaderSource {
    /// Fills `buf` entirely from `offset`, or fails (a short source is an error).
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl HeaderSource for std::fs::File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // The platform's positional read (pread, or ReadFile at an OVERLAPPED offset).
        crate::io::read_exact_at(self, buf, offset)
    }
}

impl HeaderSource for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let src = usize::try_from(offset)
            .ok()
            .and_then(|start| start.checked_add(buf.len()).map(|end| (start, end)))
            .and_then(|(start, end)| self.get(start..end))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// A validated header together with where it sits in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHeader {
    /// Bytes of JSON (padding included), as given by the length field.
    pub header_len: u64,
    /// Absolute offset of the data section: `8 + header_len`.
    pub data_start: u64,
    /// Bytes of the data section: the rest of the file.
    pub data_len: u64,
    /// The validated JSON header.
    pub header: Header,
}

/// Reads and validates the header of a safetensors file of `file_len` bytes.
pub fn read_header<S: HeaderSource + ?Sized>(
    src: &S,
    file_len: u64,
) -> Result<FileHeader, HeaderError> {
    if file_len < LEN_FIELD {
        return Err(HeaderError::FileTooShort { file_len });
    }
    let mut len_bytes = [0u8; 8];
    read_at(src, &mut len_bytes, 0)?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_LEN {
        return Err(HeaderError::HeaderTooLarge {
            header_len,
            limit: MAX_HEADER_LEN,
        });
    }
    // file_len >= LEN_FIELD was checked above.
    let available = file_len - LEN_FIELD;
    if header_len > available {
        return Err(HeaderError::HeaderBeyondFile {
            header_len,
            available,
            file_len,
        });
    }
    // header_len <= MAX_HEADER_LEN, so it fits in usize on every supported target.
    let buf_len = usize::try_from(header_len).map_err(|_| HeaderError::HeaderTooLarge {
        header_len,
        limit: MAX_HEADER_LEN,
    })?;
    let mut json = vec![0u8; buf_len];
    read_at(src, &mut json, LEN_FIELD)?;
    let data_start = LEN_FIELD + header_len;
    let data_len = available - header_len;
    let header = parse_header(&json, data_len)?;
    Ok(FileHeader {
        header_len,
        data_start,
        data_len,
        header,
    })
}

fn read_at<S: HeaderSource + ?Sized>(
    src: &S,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), HeaderError> {
    src.read_exact_at(buf, offset)
        .map_err(|source| HeaderError::Read {
            offset,
            len: buf.len() as u64,
            source,
        })
}
