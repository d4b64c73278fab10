//! How the hand-written kernels store their output: plainly, or around the cache for outputs
//! too large to stay in it (the reasons and the rules are in `avx2/mod.rs`). The choice is made
//! once per job from its whole output, so a job split over threads or rows streams throughout.

/// How a kernel writes its output vectors (only the hand-written x86-64 kernels stream; the
/// others always store plainly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stores {
    /// Plain stores: the output stays in cache for whoever reads it next.
    Cached,
    /// Non-temporal stores around the cache, for outputs too large to stay there anyway.
    Streaming,
}

/// Outputs of at least this many bytes (the whole job's, not one thread's) are streamed: well
/// past a core's L2, and past what the next reader would find in L3 on a busy machine.
pub(crate) const STREAM_MIN_BYTES: usize = 8 << 20;

impl Stores {
    /// The stores for a job writing `bytes` in all.
    pub(crate) fn for_output(bytes: usize) -> Stores {
        if bytes >= STREAM_MIN_BYTES {
            Stores::Streaming
        } else {
            Stores::Cached
        }
    }

    /// Orders this thread's streaming stores before whatever it does next (joining the scope
    /// that hands the output on included): non-temporal stores are weakly ordered. Called once
    /// per thread after its share of a job.
    pub(crate) fn fence(self) {
        #[cfg(target_arch = "x86_64")]
        if self == Stores::Streaming {
            // SAFETY: sfence has no preconditions (SSE, in every x86-64 CPU).
            unsafe { core::arch::x86_64::_mm_sfence() };
        }
    }

    /// How many leading elements (of `size` output bytes each, `n` in all) to write before the
    /// vector loop so that its stores at `dst` are 32-byte aligned, as streaming stores must be;
    /// and the stores the loop then uses (cached when `dst` can never be aligned).
    // Only the x86-64 kernels stream; elsewhere its tests alone call it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn head(self, dst: *const u8, size: usize, n: usize) -> (usize, Stores) {
        if self == Stores::Cached {
            return (0, self);
        }
        let off = (dst as usize).wrapping_neg() % 32;
        if !off.is_multiple_of(size) {
            return (0, Stores::Cached);
        }
        (n.min(off / size), self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_aligns_streamed_stores_or_gives_them_up() {
        assert_eq!(Stores::for_output(STREAM_MIN_BYTES - 1), Stores::Cached);
        assert_eq!(Stores::for_output(STREAM_MIN_BYTES), Stores::Streaming);
        for addr in 4096usize..4096 + 64 {
            // The address is only compared, never read.
            let p = addr as *const u8;
            for size in [1usize, 2, 4] {
                assert_eq!(Stores::Cached.head(p, size, 1000), (0, Stores::Cached));
                match Stores::Streaming.head(p, size, 1000) {
                    (head, Stores::Streaming) => assert_eq!((addr + head * size) % 32, 0),
                    (head, Stores::Cached) => assert!(head == 0 && addr % size != 0),
                }
                // Never more than there is.
                assert!(Stores::Streaming.head(p, size, 3).0 <= 3);
            }
        }
    }
}
