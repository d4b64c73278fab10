use super::*;

fn page() -> usize {
    platform::page_size()
}

/// Fills each page of the region with its own mark.
fn mark(region: &PooledPages, first: u8) {
    let span = region.writable();
    for (i, at) in (0..region.len()).step_by(page()).enumerate() {
        // SAFETY: `at..at + page` lies in the region, which nothing else refers to.
        unsafe {
            std::ptr::write_bytes(
                span.as_mut_ptr().add(at),
                first.wrapping_add(i as u8),
                page(),
            )
        };
    }
}

/// Each page's first byte.
fn marks(region: &PooledPages) -> Vec<u8> {
    let span = region.writable();
    (0..region.len())
        .step_by(page())
        // SAFETY: inside the region.
        .map(|at| unsafe { *span.as_mut_ptr().add(at) })
        .collect()
}

#[test]
fn a_region_given_back_is_handed_out_again_with_its_pages() {
    let pool = PagePool::new();
    let a = pool.take(3 * page() - 10).unwrap();
    assert_eq!(a.len(), 3 * page());
    mark(&a, 10);
    drop(a);
    if !PagePool::keeps_pages() {
        assert_eq!(pool.idle_bytes(), 0);
        return;
    }
    assert_eq!(pool.idle_bytes(), 3 * page());
    // Smaller: cut from the kept region, its pages as they were; the rest stays kept.
    let b = pool.take(2 * page()).unwrap();
    assert_eq!(marks(&b), vec![10, 11]);
    assert_eq!(pool.idle_bytes(), page());
    assert_eq!(
        pool.stats(),
        PoolStats {
            reused: 2 * page() as u64,
            fresh: 3 * page() as u64
        }
    );
    drop(b);
    assert_eq!(pool.trim(), 3 * page());
    assert_eq!(pool.idle_bytes(), 0);
}

#[test]
fn a_region_larger_than_any_kept_is_put_together_from_them() {
    let pool = PagePool::new();
    let a = pool.take(2 * page()).unwrap();
    let b = pool.take(3 * page()).unwrap();
    mark(&a, 20);
    mark(&b, 30);
    drop(a);
    drop(b);
    let c = pool.take(6 * page()).unwrap();
    if !PagePool::moves_pages() {
        assert_eq!(pool.stats().reused, 0);
        return;
    }
    // The larger kept region first, then the smaller, then one fresh page (zeroed).
    assert_eq!(marks(&c), vec![30, 31, 32, 20, 21, 0]);
    assert_eq!(pool.stats().reused, 5 * page() as u64);
    assert_eq!(pool.idle_bytes(), 0);
    mark(&c, 40);
    drop(c);
    // Given back as the maps it spans, each of which can be cut or moved again.
    assert_eq!(pool.idle_bytes(), 6 * page());
    let d = pool.take(6 * page()).unwrap();
    let mut got = marks(&d);
    got.sort_unstable();
    assert_eq!(got, vec![40, 41, 42, 43, 44, 45]);
    assert_eq!(pool.stats().reused, 11 * page() as u64);
}

#[test]
fn a_part_of_a_kept_region_is_moved_and_the_rest_stays_kept() {
    let pool = PagePool::new();
    let a = pool.take(4 * page()).unwrap();
    let b = pool.take(page()).unwrap();
    mark(&a, 50);
    mark(&b, 60);
    drop(a);
    drop(b);
    // 3 pages fit the 4-page region: cut from it, no move.
    let c = pool.take(3 * page()).unwrap();
    if PagePool::keeps_pages() {
        assert_eq!(marks(&c), vec![50, 51, 52]);
        assert_eq!(pool.idle_bytes(), 2 * page());
    }
    if !PagePool::moves_pages() {
        return;
    }
    // 2 pages: the one left of the 4 and the other page, moved together.
    let d = pool.take(2 * page()).unwrap();
    let mut got = marks(&d);
    got.sort_unstable();
    assert_eq!(got, vec![53, 60]);
    assert_eq!(pool.idle_bytes(), 0);
    drop(c);
    drop(d);
    assert_eq!(pool.idle_bytes(), 5 * page());
}

#[test]
fn a_closed_or_dropped_pool_keeps_nothing() {
    let pool = PagePool::new();
    let a = pool.take(page()).unwrap();
    let b = pool.take(page()).unwrap();
    drop(a);
    let kept = if PagePool::keeps_pages() { page() } else { 0 };
    assert_eq!(pool.close(), kept);
    drop(b);
    assert_eq!(pool.idle_bytes(), 0);
    // A region that outlives its pool gives its pages to the system.
    let pool = PagePool::new();
    let c = pool.take(page()).unwrap();
    drop(pool);
    mark(&c, 1);
    drop(c);
}

#[test]
fn regions_from_many_threads_never_share_a_page() {
    let pool = std::sync::Arc::new(PagePool::new());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let pool = std::sync::Arc::clone(&pool);
            std::thread::spawn(move || {
                for round in 0..50u8 {
                    let pages = 1 + (round as usize * 7 + t as usize) % 5;
                    let r = pool.take(pages * page()).unwrap();
                    let m = t * 64 + round % 32;
                    let span = r.writable();
                    // SAFETY: the region is this thread's alone.
                    unsafe { std::ptr::write_bytes(span.as_mut_ptr(), m, r.len()) };
                    std::thread::yield_now();
                    // SAFETY: as above.
                    let bytes = unsafe { std::slice::from_raw_parts(span.as_mut_ptr(), r.len()) };
                    assert!(
                        bytes.iter().all(|&b| b == m),
                        "a page was handed to two regions"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = pool.stats();
    assert!(stats.reused + stats.fresh >= 200 * page() as u64);
    if PagePool::keeps_pages() {
        assert!(stats.reused > 0);
    }
}

#[test]
fn a_pool_keeps_no_more_than_the_reads_to_come_will_take() {
    if !PagePool::keeps_pages() {
        return;
    }
    let pool = PagePool::new();
    let a = pool.take(4 * page()).unwrap();
    let b = pool.take(2 * page()).unwrap();
    assert_eq!(pool.want(3 * page()), 0);
    drop(a);
    // 3 of the 4 pages kept, the last one given back.
    assert_eq!(pool.idle_bytes(), 3 * page());
    // A region handed out counts against what is wanted: 2 pages left to want.
    let c = pool.take(page()).unwrap();
    assert_eq!(pool.idle_bytes(), 2 * page());
    drop(b);
    assert_eq!(pool.idle_bytes(), 2 * page());
    // Wanting less gives back the difference at once.
    assert_eq!(pool.want(page()), page());
    assert_eq!(pool.idle_bytes(), page());
    assert_eq!(pool.want(0), page());
    assert_eq!(pool.idle_bytes(), 0);
    drop(c);
    assert_eq!(pool.idle_bytes(), 0);
}
