//! Copying a warm block into its staging buffer with several threads: one thread's memcpy is a
//! fraction of what the memory (and a PCIe link behind a pinned buffer) can take.

use std::sync::atomic::{AtomicBool, Ordering};

/// Blocks smaller than this are copied by the calling thread alone: starting threads costs more.
pub const PARALLEL_COPY_MIN: usize = 4 << 20;

/// Copy threads for one fill: the cores shared among the staging workers, at least one.
pub fn copy_threads(workers: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / workers.max(1)).max(1)
}

/// Copies each `(destination, source)` pair (equal lengths, destinations disjoint) in pieces of
/// at most `chunk` bytes, spread over `threads` threads. Returns `false` if `stop` was set
/// before everything was copied.
pub fn copy_pairs(
    pairs: Vec<(&mut [u8], &[u8])>,
    threads: usize,
    chunk: usize,
    stop: &AtomicBool,
) -> bool {
    let total: usize = pairs.iter().map(|(d, _)| d.len()).sum();
    let chunk = chunk.max(1);
    let mut pieces: Vec<(&mut [u8], &[u8])> = Vec::new();
    for (d, s) in pairs {
        pieces.extend(d.chunks_mut(chunk).zip(s.chunks(chunk)));
    }
    let threads = threads.clamp(1, pieces.len().max(1));
    if threads == 1 || total < PARALLEL_COPY_MIN {
        return copy_all(pieces, stop);
    }
    // Contiguous shares of about equal bytes, so each thread streams through its own memory.
    let share = total.div_ceil(threads);
    let mut groups: Vec<Vec<(&mut [u8], &[u8])>> = Vec::with_capacity(threads);
    let mut current = Vec::new();
    let mut bytes = 0;
    for p in pieces {
        bytes += p.0.len();
        current.push(p);
        if bytes >= share {
            groups.push(std::mem::take(&mut current));
            bytes = 0;
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|g| scope.spawn(move || copy_all(g, stop)))
            .collect();
        handles.into_iter().all(|h| h.join().unwrap_or(false))
    })
}

fn copy_all(pieces: Vec<(&mut [u8], &[u8])>, stop: &AtomicBool) -> bool {
    for (d, s) in pieces {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        d.copy_from_slice(s);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_land_where_they_belong_with_any_thread_count() {
        let src: Vec<u8> = (0..(9 << 20)).map(|i| (i * 7 % 251) as u8).collect();
        for threads in [1, 2, 3, 8] {
            let mut dst = vec![0u8; src.len() + 100];
            let (a, rest) = dst.split_at_mut(3 << 20);
            let (_gap, b) = rest.split_at_mut(100);
            let pairs = vec![(a, &src[..3 << 20]), (b, &src[3 << 20..])];
            assert!(copy_pairs(pairs, threads, 1 << 20, &AtomicBool::new(false)));
            assert!(dst[..3 << 20] == src[..3 << 20], "{threads}");
            assert!(dst[(3 << 20) + 100..] == src[3 << 20..], "{threads}");
            assert!(dst[3 << 20..(3 << 20) + 100].iter().all(|&b| b == 0));
        }
        let mut dst = [0u8; 16];
        assert!(!copy_pairs(
            vec![(&mut dst[..], &src[..16])],
            2,
            4,
            &AtomicBool::new(true)
        ));
    }
}
