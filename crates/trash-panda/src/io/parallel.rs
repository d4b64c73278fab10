//! Many range reads spread over a few threads, in chunks, so one large tensor uses every reader.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::aligned::{AlignedBuf, DIRECT_ALIGN};
use super::platform;
use super::schedule::{Lane, Need, Permit};
use super::{FileReader, IoError, ReadMode, ReadStats};

/// The default chunk: large enough that O_DIRECT reaches the drive's sequential speed, small
/// enough that two threads share a 100 MB tensor evenly.
pub const DEFAULT_CHUNK_SIZE: usize = 8 << 20;

/// Read `dst.len()` bytes of the file at `offset` into `dst`.
///
/// `dst` can be any memory; when it is an [`AlignedBuf`] (or lines up with the file offset modulo
/// the alignment) direct reads land in it without a copy.
#[derive(Debug)]
pub struct ReadRequest<'a> {
    /// Offset in the file of the first byte to read.
    pub offset: u64,
    /// Where the bytes go; its length is how many are read.
    pub dst: &'a mut [u8],
}

impl<'a> ReadRequest<'a> {
    /// A request for `dst.len()` bytes at `offset`.
    pub fn new(offset: u64, dst: &'a mut [u8]) -> Self {
        ReadRequest { offset, dst }
    }
}

/// How [`read_ranges_with`] splits and spreads the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOptions {
    /// Reader threads (at least 1). With blocking reads each thread keeps one request in flight,
    /// so more threads than cores can still help a drive that likes a deeper queue.
    pub threads: usize,
    /// Largest single read, rounded up to the alignment.
    pub chunk_size: usize,
    /// The destinations are fresh memory, never touched: one more thread makes their pages
    /// present ahead of the readers ([`POPULATE_MIN`] bytes or more in all), so a reader's
    /// request is not held up by faulting its destination page by page. Where that thread
    /// cannot (not Linux, kernels before 5.14) the readers fault the pages as before.
    pub populate: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            threads: 2,
            chunk_size: DEFAULT_CHUNK_SIZE,
            populate: false,
        }
    }
}

/// Below this many bytes in all, [`ReadOptions::populate`] starts no thread: the faults of a
/// few megabytes cost less than starting one.
pub const POPULATE_MIN: usize = 16 << 20;

/// Reads every request with `threads` threads and the default chunk size.
pub fn read_ranges(
    reader: &FileReader,
    requests: &mut [ReadRequest<'_>],
    threads: usize,
) -> Result<ReadStats, IoError> {
    let opts = ReadOptions {
        threads,
        ..ReadOptions::default()
    };
    read_ranges_with(reader, requests, &opts)
}

/// Reads every request, split into chunks of `opts.chunk_size` (chunk boundaries fall on file
/// offsets that are multiples of the chunk size, so all but a request's first and last chunk are
/// aligned), handed out in file order to `opts.threads` threads.
///
/// All ranges are checked before anything is read. On an error the other threads stop after their
/// current chunk and the first error is returned; the destinations then hold partial data.
pub fn read_ranges_with(
    reader: &FileReader,
    requests: &mut [ReadRequest<'_>],
    opts: &ReadOptions,
) -> Result<ReadStats, IoError> {
    let never = AtomicBool::new(false);
    let stats = read_ranges_until(reader, requests, opts, &never)?;
    Ok(stats.expect("never stopped"))
}

/// [`read_ranges_with`] that gives up between chunks once `stop` is set: `Ok(None)` then, with
/// the destinations partly filled.
pub fn read_ranges_until(
    reader: &FileReader,
    requests: &mut [ReadRequest<'_>],
    opts: &ReadOptions,
    stop: &AtomicBool,
) -> Result<Option<ReadStats>, IoError> {
    read_ranges_queued(reader, requests, opts, stop, None)
}

/// [`read_ranges_until`] through a lane of a read queue ([`Lane`]): each reader thread waits for a place at the
/// drive before its first chunk, and between chunks gives it to a read needed sooner than `need`.
pub fn read_ranges_queued(
    reader: &FileReader,
    requests: &mut [ReadRequest<'_>],
    opts: &ReadOptions,
    stop: &AtomicBool,
    gate: Option<(&Lane, Need)>,
) -> Result<Option<ReadStats>, IoError> {
    let started = Instant::now();
    for r in requests.iter() {
        reader.check_range(r.offset, r.dst.len())?;
    }
    let chunk_size = opts.chunk_size.max(1).next_multiple_of(DIRECT_ALIGN);
    let mut chunks = Vec::new();
    let mut bytes = 0u64;
    for r in requests.iter_mut() {
        bytes += r.dst.len() as u64;
        split(r.offset, &mut *r.dst, chunk_size, &mut chunks);
    }
    // The destinations' addresses, in the order the readers take them, for the thread that
    // makes their pages present: addresses only, since the readers hold the memory.
    let spans: Vec<(usize, usize)> = if opts.populate && bytes >= POPULATE_MIN as u64 {
        chunks
            .iter_mut()
            .map(|(_, dst)| (dst.as_mut_ptr() as usize, dst.len()))
            .collect()
    } else {
        Vec::new()
    };
    let threads = opts.threads.clamp(1, chunks.len().max(1));
    let queue = Mutex::new(chunks.into_iter());
    let failed = AtomicBool::new(false);
    let readers_done = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let work = || {
        if let Err(e) = worker(reader, &queue, &failed, stop, chunk_size, gate) {
            failed.store(true, Ordering::Relaxed);
            let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(e);
        }
    };
    if threads == 1 && spans.is_empty() {
        work();
    } else {
        std::thread::scope(|s| {
            if !spans.is_empty() {
                s.spawn(|| populate_ahead(&spans, &readers_done));
            }
            let readers: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
            let mut panicked = None;
            for r in readers {
                if let Err(p) = r.join() {
                    panicked.get_or_insert(p);
                }
            }
            readers_done.store(true, Ordering::Relaxed);
            if let Some(p) = panicked {
                std::panic::resume_unwind(p);
            }
        });
    }
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    if stop.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Some(ReadStats::new(
        bytes,
        seconds,
        reader.effective_mode(),
    )))
}

type Chunk<'a> = (u64, &'a mut [u8]);

/// Makes the pages of `spans` present, in order, until done or the readers have ended (what
/// they reached they faulted themselves). Stops at the first refusal: the platform or the
/// memory (not anonymous or file-backed writable) does not allow it, and the readers fault.
fn populate_ahead(spans: &[(usize, usize)], readers_done: &AtomicBool) {
    for &(start, len) in spans {
        if readers_done.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: each span is a destination chunk the caller lent to this call, so mapped and
        // writable until it returns, which is after this thread ends (the scope joins it).
        // Making its pages present reads and writes none of its bytes, so the readers filling
        // it at the same time see nothing of it.
        if unsafe { platform::populate_write(start as *mut u8, len) }.is_err() {
            return;
        }
    }
}

fn split<'a>(mut offset: u64, mut dst: &'a mut [u8], chunk: usize, out: &mut Vec<Chunk<'a>>) {
    while !dst.is_empty() {
        let to_boundary = chunk - (offset % chunk as u64) as usize;
        let n = to_boundary.min(dst.len());
        let (head, rest) = dst.split_at_mut(n);
        out.push((offset, head));
        offset += n as u64;
        dst = rest;
    }
}

fn worker<'a>(
    reader: &FileReader,
    queue: &Mutex<std::vec::IntoIter<Chunk<'a>>>,
    failed: &AtomicBool,
    stop: &AtomicBool,
    chunk_size: usize,
    gate: Option<(&Lane, Need)>,
) -> Result<(), IoError> {
    // The place at the drive, taken before the first chunk and held (unless a read needed sooner
    // waits) until this thread runs out of chunks.
    let mut place: Option<Permit<'_>> = None;
    // Bounce buffers are made on first need: the small one for unaligned heads and tails, the
    // big one only for destinations that do not line up with the file at all.
    let mut small: Option<AlignedBuf> = None;
    let mut big: Option<AlignedBuf> = None;
    loop {
        if failed.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
        let Some((offset, dst)) = next else {
            return Ok(());
        };
        if let Some((q, need)) = gate {
            match &mut place {
                Some(p) => p.yield_to_sooner(),
                None => place = Some(q.acquire(need)),
            }
        }
        let head = (DIRECT_ALIGN - (offset % DIRECT_ALIGN as u64) as usize) % DIRECT_ALIGN;
        let lines_up = (dst.as_ptr() as usize + head).is_multiple_of(DIRECT_ALIGN);
        // A buffered reader reads straight into `dst`. A chunk-sized bounce buffer would go
        // unused, yet it is zeroed when made, and once freed its pages stay resident in this
        // thread's heap (measured: about 5 MiB per reader thread of a resident load).
        let buffered = reader.effective_mode() == ReadMode::Buffered;
        let bounce = if buffered || lines_up || dst.len() <= DIRECT_ALIGN {
            bounce_of(&mut small, 2 * DIRECT_ALIGN)?
        } else {
            bounce_of(&mut big, chunk_size.min(dst.len()) + 2 * DIRECT_ALIGN)?
        };
        reader.read_into(offset, dst, bounce)?;
    }
}

fn bounce_of(slot: &mut Option<AlignedBuf>, len: usize) -> Result<&mut AlignedBuf, IoError> {
    if slot.as_ref().is_some_and(|b| b.len() < len) {
        *slot = None;
    }
    if slot.is_none() {
        *slot = Some(AlignedBuf::new(len)?);
    }
    Ok(slot.as_mut().expect("just filled"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_puts_boundaries_on_chunk_multiples() {
        let mut buf = vec![0u8; 100];
        let mut out = Vec::new();
        split(30, &mut buf, 32, &mut out);
        let got: Vec<(u64, usize)> = out.iter().map(|(o, d)| (*o, d.len())).collect();
        assert_eq!(got, vec![(30, 2), (32, 32), (64, 32), (96, 32), (128, 2)]);
    }
}
