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

#[cfg(test)]
mod tests {
    #[test]
    fn trim_runs() {
        let v = vec![1u8; 64 << 20];
        drop(v);
        let _ = super::trim_heap();
    }
}
