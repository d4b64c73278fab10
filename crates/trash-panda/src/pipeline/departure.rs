//! How a stage leaves at its turn's end: released, freed by its final pass, released after an
//! error, or kept (whole, or but the blocks the next stage needs, which it gives back now).

use super::Departure;

/// What a stage's turn left for its end to decide from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ending {
    /// One of its blocks raised.
    pub failed: bool,
    /// A final pass ran in this turn (its blocks were freed as they ran).
    pub final_pass: bool,
    /// It is to be released at its end: a later stage needs all of it, keeping is off, or its
    /// staging pool could not be given back.
    pub release_after: bool,
    /// Whether the pipeline keeps stages between runs.
    pub keep: bool,
    /// Bytes of its blocks the next stage asked it to give back at its end.
    pub to_give: u64,
    /// Bytes its final pass freed already (they count against `to_give`).
    pub passed: u64,
    /// Bytes of resident blocks it still holds and could give back, once the final pass's are
    /// counted as given.
    pub sheddable: u64,
}

/// What becomes of the stage, and what a kept one gives back now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leaving {
    /// How it leaves.
    pub departure: Departure,
    /// Kept: bytes of its blocks to give back now, those it runs last (0: none). 0 otherwise.
    pub give: u64,
}

/// How a stage leaves: after an error, released (by its final pass when one ran) when it is
/// to be released, keeping is off, or what it must still give reaches all it could shed; kept
/// otherwise, giving back what its final pass has not freed of what was asked.
pub fn depart(end: Ending) -> Leaving {
    let give = end.to_give.saturating_sub(end.passed);
    let departure = if end.failed {
        Departure::Failed
    } else if end.release_after || !end.keep || (give > 0 && give >= end.sheddable) {
        if end.final_pass {
            Departure::FinalPass
        } else {
            Departure::Released
        }
    } else {
        Departure::Kept
    };
    Leaving {
        departure,
        give: if departure == Departure::Kept {
            give
        } else {
            0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    fn kept() -> Ending {
        Ending {
            keep: true,
            sheddable: 4 * GB,
            ..Ending::default()
        }
    }

    #[test]
    fn a_stage_nothing_asks_of_is_kept_whole() {
        assert_eq!(
            depart(kept()),
            Leaving {
                departure: Departure::Kept,
                give: 0
            }
        );
    }

    #[test]
    fn a_failed_stage_fails_whatever_else_holds() {
        for release_after in [false, true] {
            let end = Ending {
                failed: true,
                final_pass: true,
                release_after,
                to_give: GB,
                ..kept()
            };
            assert_eq!(depart(end).departure, Departure::Failed);
            assert_eq!(depart(end).give, 0);
        }
    }

    #[test]
    fn a_stage_released_says_whether_its_final_pass_freed_it() {
        let end = Ending {
            release_after: true,
            ..kept()
        };
        assert_eq!(depart(end).departure, Departure::Released);
        let end = Ending {
            final_pass: true,
            ..end
        };
        assert_eq!(depart(end).departure, Departure::FinalPass);
        let off = Ending {
            keep: false,
            ..kept()
        };
        assert_eq!(depart(off).departure, Departure::Released);
    }

    #[test]
    fn a_kept_stage_gives_what_its_final_pass_has_not() {
        let end = Ending {
            final_pass: true,
            to_give: 3 * GB,
            passed: GB,
            ..kept()
        };
        assert_eq!(
            depart(end),
            Leaving {
                departure: Departure::Kept,
                give: 2 * GB
            }
        );
        // The pass freed all that was asked: nothing more goes.
        let end = Ending {
            passed: 3 * GB,
            ..end
        };
        assert_eq!(depart(end).give, 0);
        assert_eq!(depart(end).departure, Departure::Kept);
    }

    #[test]
    fn asking_for_all_it_could_shed_releases_it() {
        let end = Ending {
            to_give: 4 * GB,
            ..kept()
        };
        assert_eq!(depart(end).departure, Departure::Released);
        let end = Ending {
            to_give: 4 * GB - 1,
            ..kept()
        };
        assert_eq!(depart(end).give, 4 * GB - 1);
        // Nothing left to shed and nothing asked: kept.
        let end = Ending {
            sheddable: 0,
            ..kept()
        };
        assert_eq!(depart(end).departure, Departure::Kept);
    }
}
