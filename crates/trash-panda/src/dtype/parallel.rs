//! Splitting a conversion over scoped threads.
//!
//! Work is cut into contiguous ranges of "units" (rows when scales follow rows, otherwise runs of
//! elements), so each thread owns a disjoint piece of every output and no synchronisation is
//! needed beyond the scope's join.

use std::ops::Range;

use super::level;

/// Below this many elements a conversion runs on the calling thread: spawning costs tens of
/// microseconds, about what one core needs for a million elements.
pub(crate) const PARALLEL_MIN_ELEMS: usize = 1 << 20;

/// Element runs are cut at multiples of this, so every thread but the last gets whole vectors.
pub(crate) const ELEMENT_GRAIN: usize = 256;

/// The thread count to use: `0` means every available core; small jobs get one.
pub(crate) fn effective_threads(threads: usize, elems: usize) -> usize {
    if elems < PARALLEL_MIN_ELEMS {
        return 1;
    }
    let wanted = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    // Keep at least half a threshold's worth of elements per thread.
    wanted.min(elems / (PARALLEL_MIN_ELEMS / 2)).max(1)
}

/// Cuts `units` into at most `parts` contiguous ranges whose starts are multiples of `grain`.
fn ranges(units: usize, parts: usize, grain: usize) -> Vec<Range<usize>> {
    let grains = units.div_ceil(grain);
    let parts = parts.clamp(1, grains.max(1));
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let end = if i + 1 == parts {
            units
        } else {
            (grains * (i + 1) / parts * grain).min(units)
        };
        if end > start {
            out.push(start..end);
        }
        start = end;
    }
    out
}

/// Runs `f(units, a_part, b_part)` for each range of `units`, where `a_part` and `b_part` are the
/// pieces of `a` and `b` that hold those units (`a_per_unit` and `b_per_unit` items each, passed
/// with their slices; a zero gives empty pieces). One range runs on the calling thread, the others on scoped threads.
///
/// The caller has checked that `a` and `b` hold `units` units; this is not re-validated.
pub(crate) fn split_run<A, B, F>(
    units: usize,
    grain: usize,
    threads: usize,
    (a, a_per_unit): (&mut [A], usize),
    (b, b_per_unit): (&mut [B], usize),
    f: F,
) where
    A: Send,
    B: Send,
    F: Fn(Range<usize>, &mut [A], &mut [B]) + Sync,
{
    let parts = ranges(units, threads, grain.max(1));
    if parts.len() <= 1 {
        f(0..units, a, b);
        return;
    }
    // A level forced on the caller's thread holds on its workers too.
    let forced = level::forced();
    std::thread::scope(|scope| {
        let (mut a_rest, mut b_rest) = (a, b);
        let last = parts.len() - 1;
        for (i, r) in parts.into_iter().enumerate() {
            let n = r.end - r.start;
            let (a_part, a_tail) = std::mem::take(&mut a_rest).split_at_mut(n * a_per_unit);
            let (b_part, b_tail) = std::mem::take(&mut b_rest).split_at_mut(n * b_per_unit);
            a_rest = a_tail;
            b_rest = b_tail;
            let f = &f;
            if i == last {
                f(r, a_part, b_part);
            } else {
                scope.spawn(move || level::with_forced(forced, || f(r, a_part, b_part)));
            }
        }
    });
}

/// Runs `f` over ranges of `units` on scoped threads and collects the results in range order,
/// for read-only passes such as reductions.
pub(crate) fn map_ranges<T, F>(units: usize, grain: usize, threads: usize, f: F) -> Vec<T>
where
    T: Send,
    F: Fn(Range<usize>) -> T + Sync,
{
    let parts = ranges(units, threads, grain.max(1));
    if parts.len() <= 1 {
        return vec![f(0..units)];
    }
    let forced = level::forced();
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = parts
            .into_iter()
            .map(|r| scope.spawn(move || level::with_forced(forced, || f(r))))
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(v) => v,
                Err(payload) => std::panic::resume_unwind(payload),
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_everything_once() {
        for units in [0, 1, 255, 256, 257, 1000, 1 << 20] {
            for parts in 1..9 {
                let rs = ranges(units, parts, 256);
                let mut next = 0;
                for r in &rs {
                    assert_eq!(r.start, next);
                    assert!(r.end > r.start);
                    assert!(r.start % 256 == 0);
                    next = r.end;
                }
                assert_eq!(next, units);
                assert!(rs.len() <= parts);
            }
        }
    }

    #[test]
    fn small_jobs_stay_inline() {
        assert_eq!(effective_threads(8, 1000), 1);
        assert_eq!(effective_threads(8, 1 << 24), 8);
        assert!(effective_threads(0, 1 << 24) >= 1);
        assert_eq!(effective_threads(64, PARALLEL_MIN_ELEMS), 2);
    }
}
