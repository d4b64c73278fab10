//! Unit tests of the pieces the integration tests (tests/profile_*.rs) cannot reach.

use super::report::slowest;
use super::trace::copy_lanes;
use super::*;

fn run(block: usize, start: f64, end: f64) -> BlockRun {
    BlockRun {
        block,
        start,
        end,
        staged_wait: 0.0,
        gpu_wait: 0.0,
        bytes: 0,
        tier: Tier::Device,
        expanded: 0,
    }
}

fn copy(block: usize, start: f64, end: f64) -> CopyRun {
    CopyRun {
        block,
        start,
        end,
        bytes: 1,
        tier: Tier::Ram,
        worker: None,
        cold: false,
    }
}

#[test]
fn copy_lanes_reuse_a_lane_once_it_is_free() {
    // 0 and 1 overlap; 2 starts when 0 ends; 3 overlaps 1 and 2.
    let copies = [
        copy(0, 0.0, 1.0),
        copy(1, 0.5, 2.0),
        copy(2, 1.0, 3.0),
        copy(3, 1.5, 2.5),
    ];
    assert_eq!(copy_lanes(&copies), vec![0, 1, 0, 2]);
    assert!(copy_lanes(&[]).is_empty());
}

#[test]
fn slowest_breaks_ties_by_model_order() {
    let runs = [run(3, 0.0, 1.0), run(1, 1.0, 2.0), run(2, 2.0, 4.0)];
    let blocks: Vec<usize> = slowest(&runs, 2).iter().map(|r| r.block).collect();
    assert_eq!(blocks, vec![2, 1]);
}

#[test]
fn rest_never_goes_negative() {
    let mut r = run(0, 0.0, 1.0);
    r.staged_wait = 0.75;
    r.gpu_wait = 0.5;
    assert_eq!(r.rest(), 0.0);
}

#[test]
fn profile_is_send() {
    fn send<T: Send>() {}
    send::<Profile>();
}

#[test]
fn copy_tracks_give_each_worker_a_lane_and_the_rest_after() {
    let on = |worker, start, end| CopyRun {
        worker: Some(worker),
        ..copy(0, start, end)
    };
    // Worker 1's copies overlap worker 0's; worker 0's two copies (given late) overlap each other.
    let copies = [
        on(1, 0.0, 2.0),
        copy(1, 0.0, 1.0),
        on(0, 0.5, 1.5),
        on(0, 1.0, 3.0),
        on(1, 2.0, 3.0),
    ];
    let (names, tracks) = super::trace::copy_tracks(&copies);
    assert_eq!(
        names,
        vec!["worker 1", "worker 1 (lane 2)", "worker 2", "copies"]
    );
    assert_eq!(tracks, vec![2, 3, 0, 1, 2]);
    assert_eq!(super::trace::copy_tracks(&[]), (vec![], vec![]));
}

#[test]
fn a_pass_reports_what_its_expansions_wrote_against_what_it_read() {
    let mut p = Profile::new(vec!["a".into(), "b".into()], vec![Tier::Disk, Tier::Ram]).unwrap();
    for (block, tier) in [(0, Tier::Disk), (1, Tier::Ram)] {
        let mut r = run(block, block as f64, block as f64 + 1.0);
        (r.tier, r.bytes, r.expanded) = (tier, 250_000_000, 1_000_000_000);
        p.record(r).unwrap();
    }
    let passes = p.passes();
    assert_eq!(passes[0].expanded_bytes, 2_000_000_000);
    let text = p.report();
    assert!(
        text.contains("expanded 2.00 GB to the compute dtype (4.00x the 0.50 GB read"),
        "{text}"
    );
}
