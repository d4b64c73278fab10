//! Giving freed heap memory back to the system.

/// Asks the C allocator to return free memory at the top of its heaps to the system.
///
/// glibc keeps memory freed by large `free` calls in its arenas once its mmap threshold has grown,
/// so after a model is released the process can look as large as before. Returns whether any
/// memory was released; a no-op elsewhere than glibc (the Windows and macOS allocators give
/// large blocks back on free).
pub fn trim_heap() -> bool {
    super::platform::trim_heap()
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// Of the whole pages inside `spans`, how many are resident.
    fn resident_pages(spans: &[(usize, usize)]) -> (usize, usize) {
        let page = crate::io::page_size();
        let (mut resident, mut total) = (0, 0);
        for &(addr, len) in spans {
            let start = addr.next_multiple_of(page);
            let end = (addr + len) / page * page;
            if end <= start {
                continue;
            }
            let mut vec = vec![0u8; (end - start) / page];
            // SAFETY: [start, end) lies inside memory the heap still maps (freed chunks stay in
            // their arena; a trim only advises them away), and `vec` has one byte per page.
            let rc =
                unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) };
            assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
            resident += vec.iter().filter(|&&b| b & 1 == 1).count();
            total += vec.len();
        }
        (resident, total)
    }

    #[test]
    fn a_trim_gives_back_the_pages_of_memory_freed_inside_the_heap() {
        // Chunks below the mmap threshold come from the heap; the last one stays allocated, so
        // the others become a hole inside the heap, which glibc keeps until it is trimmed.
        const CHUNK: usize = 64 << 10;
        let mut chunks: Vec<Vec<u8>> = (0..256).map(|_| vec![1u8; CHUNK]).collect();
        let keep = chunks.pop();
        let spans: Vec<(usize, usize)> = chunks
            .iter()
            .map(|c| (c.as_ptr() as usize, c.len()))
            .collect();
        let (before, total) = resident_pages(&spans);
        assert_eq!(before, total, "every page was written");
        drop(chunks);
        assert!(super::trim_heap(), "glibc reported nothing given back");
        let (after, _) = resident_pages(&spans);
        // Other tests of this process allocate meanwhile, perhaps in the same arena.
        assert!(
            after * 4 < total,
            "{after} of {total} freed pages still resident"
        );
        drop(keep);
    }
}
