//! A synthetic stage: 8 blocks (2 on the device, 3 in RAM, 3 on disk) run in three passes, the
//! first one cold. Times are multiples of 1/4 s from a clock at 100 s, so durations are exact and
//! ties between blocks are real ties.

use trash_panda::profile::{BlockRun, Profile, Tier};

pub const TIERS: [Tier; 8] = [
    Tier::Device,
    Tier::Device,
    Tier::Ram,
    Tier::Ram,
    Tier::Ram,
    Tier::Disk,
    Tier::Disk,
    Tier::Disk,
];

pub fn names() -> Vec<String> {
    (0..8).map(|i| format!("blocks.{i}")).collect()
}

pub fn empty() -> Profile {
    Profile::new(names(), TIERS.to_vec()).unwrap()
}

pub fn bytes(tier: Tier) -> u64 {
    match tier {
        Tier::Device => 0,
        Tier::Ram => 1_000_000_000,
        Tier::Disk => 500_000_000,
    }
}

/// Records one pass of back-to-back runs from `t`; returns when it ended.
pub fn pass(
    p: &mut Profile,
    mut t: f64,
    seconds: [f64; 8],
    staged: [f64; 8],
    gpu: [f64; 8],
) -> f64 {
    for block in 0..8 {
        let tier = TIERS[block];
        p.record(BlockRun {
            block,
            start: t,
            end: t + seconds[block],
            staged_wait: staged[block],
            gpu_wait: gpu[block],
            bytes: bytes(tier),
            tier,
            expanded: 0,
        })
        .unwrap();
        t += seconds[block];
    }
    t
}

/// Three passes with half a second between them; nothing ends a pass but a block running again.
pub fn stage() -> Profile {
    let mut p = empty();
    let cold = [0.5, 0.25, 1.5, 0.75, 2.0, 1.25, 3.0, 0.5];
    let cold_staged = [0.0, 0.0, 1.0, 0.25, 1.5, 1.0, 2.5, 0.25];
    let cold_gpu = [0.0, 0.0, 0.1, 0.1, 0.2, 0.1, 0.2, 0.0];
    let warm = [0.25; 8];
    let warm_staged = [0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.1];
    let mut t = pass(&mut p, 100.0, cold, cold_staged, cold_gpu);
    for _ in 0..2 {
        t = pass(&mut p, t + 0.5, warm, warm_staged, [0.0; 8]);
    }
    p
}
