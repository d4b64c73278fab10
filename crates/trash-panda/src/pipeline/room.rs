//! Which loaded stages give memory to a stage that needs more than is free, and how much.
//!
//! A pipeline runs round and round, so a stage's next turn is known: the stage whose next turn
//! is furthest off gives first, as an optimal cache evicts. A stage that has run keeps what the
//! next one does not need: it gives back only the blocks missing (those it runs last, read again
//! ahead of its next turn). One that never ran, or one on a GPU whose RAM is wanted, goes whole.

use super::{Holds, PipelineError};

/// A loaded stage that could give memory to the stage being loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The stage's name.
    pub name: String,
    /// Its place in the pipeline (0: the first stage).
    pub index: usize,
    /// What its release frees: for the running stage, all it holds once its reads are in (it
    /// gives at its end, or as its final pass frees); for an idle one, what it holds now.
    pub whole: Holds,
    /// Bytes of resident blocks it still holds and could give back one by one.
    pub sheddable: u64,
    /// Whether it has run: one loaded ahead and never run has no blocks to keep for a next run.
    pub has_run: bool,
}

/// What one holder gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Give {
    /// This many bytes of its resident blocks, those it runs last, in the memory its blocks
    /// compute in; the rest stays loaded.
    Blocks(u64),
    /// All of it: the stage is released.
    Whole,
}

/// One holder's part of the room made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Giving {
    /// The holder's name.
    pub stage: String,
    /// What it gives.
    pub give: Give,
}

/// Who gives what so that `short` (what the stage at `here` needs beyond the free memory) is
/// free, among `holders`, in a pipeline of `stages` stages. With `keep` off, every giver goes
/// whole. A holder that holds none of the memory missing is passed over; when the holders
/// together cannot cover `short`, every one that helps gives and the shortfall stays.
pub fn make_room(
    here: usize,
    stages: usize,
    short: Holds,
    holders: &[Holder],
    keep: bool,
) -> Result<Vec<Giving>, PipelineError> {
    check(here, stages, holders)?;
    let mut order: Vec<&Holder> = holders.iter().collect();
    // The stage whose next turn is furthest off first, the runs going round the pipeline.
    order.sort_by_key(|h| std::cmp::Reverse((h.index + stages - here) % stages));
    let mut short = short;
    let mut givings = Vec::new();
    for h in order {
        if short.ram == 0 && short.vram == 0 {
            break;
        }
        if !((short.ram > 0 && h.whole.ram > 0) || (short.vram > 0 && h.whole.vram > 0)) {
            continue; // it holds none of the memory missing: releasing it would not help
        }
        // Its blocks go back in the memory they compute in (the core's one rule for it).
        let missing = h.whole.compute_part(short);
        let in_blocks = h.whole.in_compute_memory(missing);
        // A GPU stage's RAM (its pinned tier, its staging) is not given back block by block.
        let ram_wanted_of_device = h.whole.on_device() && short.ram > 0;
        let partial =
            keep && h.has_run && !ram_wanted_of_device && 0 < missing && missing < h.sheddable;
        let (give, took) = if partial {
            (Give::Blocks(missing), in_blocks)
        } else {
            (Give::Whole, h.whole)
        };
        givings.push(Giving {
            stage: h.name.clone(),
            give,
        });
        short = short.less(took);
    }
    Ok(givings)
}

fn check(here: usize, stages: usize, holders: &[Holder]) -> Result<(), PipelineError> {
    let outside = |index: usize, what: &str| PipelineError::NoSuchStage {
        what: what.to_string(),
        index,
        stages,
    };
    if here >= stages {
        return Err(outside(here, "the stage that needs room"));
    }
    for (i, h) in holders.iter().enumerate() {
        if h.index >= stages {
            return Err(outside(h.index, &format!("holder {:?}", h.name)));
        }
        if h.index == here {
            return Err(PipelineError::GivesToItself {
                stage: h.name.clone(),
            });
        }
        if let Some(other) = holders[..i]
            .iter()
            .find(|o| o.index == h.index || o.name == h.name)
        {
            return Err(PipelineError::HolderTwice {
                first: other.name.clone(),
                second: h.name.clone(),
                index: h.index,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    fn cpu(name: &str, index: usize, held: u64, has_run: bool) -> Holder {
        Holder {
            name: name.to_string(),
            index,
            whole: Holds { ram: held, vram: 0 },
            sheddable: held,
            has_run,
        }
    }

    fn gpu(name: &str, index: usize, ram: u64, vram: u64) -> Holder {
        Holder {
            name: name.to_string(),
            index,
            whole: Holds { ram, vram },
            sheddable: vram,
            has_run: true,
        }
    }

    fn ram(bytes: u64) -> Holds {
        Holds {
            ram: bytes,
            vram: 0,
        }
    }

    fn names(givings: &[Giving]) -> Vec<(&str, Give)> {
        givings.iter().map(|g| (g.stage.as_str(), g.give)).collect()
    }

    #[test]
    fn the_stage_needed_again_last_gives_first_and_keeps_the_rest() {
        // Four stages (llm, text, transformer, vae); the transformer needs room. After it run
        // the vae, then the next run's llm and text: text's next turn is the furthest off.
        let holders = [cpu("llm", 0, 2 * GB, true), cpu("text", 1, GB, true)];
        let got = make_room(2, 4, ram(GB / 4), &holders, true).unwrap();
        assert_eq!(names(&got), [("text", Give::Blocks(GB / 4))]);
        // With the vae loaded instead of text, the llm's turn is further off than the vae's.
        let holders = [cpu("vae", 3, GB, true), cpu("llm", 0, 2 * GB, true)];
        let got = make_room(2, 4, ram(GB / 4), &holders, true).unwrap();
        assert_eq!(names(&got), [("llm", Give::Blocks(GB / 4))]);
    }

    #[test]
    fn a_holder_that_cannot_cover_the_rest_goes_whole_and_the_next_one_gives() {
        let holders = [cpu("llm", 0, 2 * GB, true), cpu("text", 1, GB / 2, true)];
        let got = make_room(2, 4, ram(GB), &holders, true).unwrap();
        assert_eq!(
            names(&got),
            [("text", Give::Whole), ("llm", Give::Blocks(GB / 2))]
        );
    }

    #[test]
    fn a_stage_that_never_ran_or_a_pipeline_that_keeps_nothing_gives_whole() {
        let got = make_room(1, 3, ram(GB / 4), &[cpu("a", 0, GB, false)], true).unwrap();
        assert_eq!(names(&got), [("a", Give::Whole)]);
        let got = make_room(1, 3, ram(GB / 4), &[cpu("a", 0, GB, true)], false).unwrap();
        assert_eq!(names(&got), [("a", Give::Whole)]);
    }

    #[test]
    fn nothing_is_taken_when_nothing_is_short_and_a_shortfall_no_one_covers_stays() {
        let holders = [cpu("a", 0, GB, true)];
        assert!(make_room(1, 2, Holds::default(), &holders, true)
            .unwrap()
            .is_empty());
        let got = make_room(1, 2, ram(3 * GB), &holders, true).unwrap();
        assert_eq!(names(&got), [("a", Give::Whole)]);
    }

    #[test]
    fn a_stage_on_the_gpu_gives_device_memory_by_blocks_and_its_ram_whole() {
        // From the third of three stages, the second's turn is the furthest off; the GPU
        // stage holds VRAM alone.
        let holders = [gpu("a", 0, GB, 4 * GB), cpu("b", 1, GB, true)];
        let vram = Holds { ram: 0, vram: GB };
        assert_eq!(
            names(&make_room(2, 3, vram, &holders, true).unwrap()),
            [("a", Give::Blocks(GB))]
        );
        // RAM wanted too: b gives its RAM by blocks first (the furthest turn), then a its VRAM.
        let both = Holds {
            ram: GB / 2,
            vram: GB,
        };
        assert_eq!(
            names(&make_room(2, 3, both, &holders, true).unwrap()),
            [("b", Give::Blocks(GB / 2)), ("a", Give::Blocks(GB))]
        );
        // The GPU stage alone: its RAM (pinned tier, staging) does not go by blocks, so all of it.
        assert_eq!(
            names(&make_room(2, 3, both, &holders[..1], true).unwrap()),
            [("a", Give::Whole)]
        );
    }

    #[test]
    fn a_holder_without_the_memory_missing_is_passed_over() {
        // b holds no device memory, a holds no RAM: only a is asked for VRAM.
        let holders = [gpu("a", 0, 0, 4 * GB), cpu("b", 2, GB, true)];
        let vram = Holds { ram: 0, vram: GB };
        assert_eq!(
            names(&make_room(1, 3, vram, &holders, true).unwrap()),
            [("a", Give::Blocks(GB))]
        );
    }

    #[test]
    fn a_holder_giving_all_its_blocks_goes_whole() {
        // Exactly what it could shed: nothing of it would be worth keeping.
        let got = make_room(1, 2, ram(GB), &[cpu("a", 0, GB, true)], true).unwrap();
        assert_eq!(names(&got), [("a", Give::Whole)]);
    }

    #[test]
    fn stages_outside_the_pipeline_or_named_twice_are_errors() {
        let err = make_room(4, 4, ram(1), &[], true).unwrap_err();
        assert!(matches!(
            err,
            PipelineError::NoSuchStage {
                index: 4,
                stages: 4,
                ..
            }
        ));
        let err = make_room(0, 2, ram(1), &[cpu("a", 2, 1, true)], true).unwrap_err();
        assert!(err.to_string().contains("holder \"a\""), "{err}");
        let err = make_room(0, 2, ram(1), &[cpu("a", 0, 1, true)], true).unwrap_err();
        assert_eq!(err, PipelineError::GivesToItself { stage: "a".into() });
        let twice = [cpu("a", 1, 1, true), cpu("b", 1, 1, true)];
        let err = make_room(0, 3, ram(1), &twice, true).unwrap_err();
        assert!(
            matches!(err, PipelineError::HolderTwice { index: 1, .. }),
            "{err}"
        );
    }

    proptest::proptest! {
        /// Whatever the holders, the givers come in order of their next turn (furthest first),
        /// each at most once; one giving by blocks gives less than it could shed and covers the
        /// rest of its memory's shortfall; and the room made covers `short` whenever every
        /// holder released whole would.
        #[test]
        fn givings_follow_the_turns_and_cover_what_they_can(
            stages in 2usize..7,
            here_seed in 0usize..7,
            sizes in proptest::collection::vec((0u64..4, 0u64..4, 0u64..5, proptest::bool::ANY), 0..6),
            short_ram in 0u64..8,
            short_vram in 0u64..8,
            keep in proptest::bool::ANY,
        ) {
            let here = here_seed % stages;
            let holders: Vec<Holder> = sizes
                .iter()
                .enumerate()
                .map(|(i, &(ram, vram, shed, has_run))| (i, ram, vram, shed, has_run))
                .filter(|&(i, ..)| i < stages && i != here)
                .map(|(i, ram, vram, shed, has_run)| Holder {
                    name: format!("s{i}"),
                    index: i,
                    whole: Holds { ram, vram },
                    sheddable: shed.min(if vram > 0 { vram } else { ram }),
                    has_run,
                })
                .collect();
            let short = Holds { ram: short_ram, vram: short_vram };
            let got = make_room(here, stages, short, &holders, keep).unwrap();
            let by_name = |n: &str| holders.iter().find(|h| h.name == n).unwrap();
            let turns: Vec<usize> = got
                .iter()
                .map(|g| (by_name(&g.stage).index + stages - here) % stages)
                .collect();
            proptest::prop_assert!(turns.windows(2).all(|w| w[0] > w[1]), "{turns:?}");
            let mut left = short;
            for g in &got {
                let h = by_name(&g.stage);
                match g.give {
                    Give::Blocks(n) => {
                        proptest::prop_assert!(keep && h.has_run && 0 < n && n < h.sheddable);
                        let mine = if h.whole.vram > 0 { left.vram } else { left.ram };
                        proptest::prop_assert_eq!(n, mine);
                        left = left.less(if h.whole.vram > 0 {
                            Holds { ram: 0, vram: n }
                        } else {
                            Holds { ram: n, vram: 0 }
                        });
                    }
                    Give::Whole => left = left.less(h.whole),
                }
            }
            let all = holders.iter().fold(Holds::default(), |a, h| a.plus(h.whole));
            if all.ram >= short.ram && all.vram >= short.vram {
                proptest::prop_assert_eq!(left, Holds::default());
            }
        }
    }
}
