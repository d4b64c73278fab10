//! What a pipeline run did, stage by stage: how each stage's weights arrived, the free memory
//! predicted for it against what it found, where its time went, and what became of it.

use std::fmt::{self, Write as _};

use super::{Free, GroupRecord, PaceVerdict, Replan, Share};
use crate::units::format_bytes;

/// How a stage's weights were there when its turn came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Still loaded from an earlier run.
    Kept,
    /// Read while the stage before it computed (some may have arrived after its start).
    ReadAhead,
    /// Read at its start (the first stage of a run, or read-ahead off).
    ReadAtStart,
    /// Read ahead, then planned and read again at its start: the free memory missed the
    /// prediction by more than the margin.
    Replanned,
}

/// What became of a stage at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// Left loaded: the stages after it did not need its memory.
    Kept,
    /// Released: a later stage needed its memory (or keeping is off).
    Released,
    /// Its blocks were freed by a final pass and given to the next stage as they went.
    FinalPass,
    /// Its block raised; it was released.
    Failed,
}

/// One stage of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRecord {
    /// The run's number, as the caller counts its runs.
    pub run: u32,
    /// The stage's name.
    pub stage: String,
    /// How its weights were there when its turn came.
    pub arrival: Arrival,
    /// The free memory its plan was made for, and what was free at its start (with what it
    /// already held counted as free); None when kept.
    pub predicted: Option<Free>,
    /// What was free at its start (see `predicted`); `None` when kept.
    pub actual: Option<Free>,
    /// Why it was planned again at its start; `None` when it was not.
    pub replan: Option<Replan>,
    /// Bytes it held when its turn came, read while the stage before it computed.
    pub read_before_start: u64,
    /// Bytes its plan holds in all.
    pub holds: u64,
    /// Its checkpoint's bytes, and those in the page cache when its load began (a stage read
    /// again after a run finds them there when RAM allowed); 0 and 0 when kept.
    pub file_bytes: u64,
    /// Bytes of its checkpoint in the page cache when its load began (see `file_bytes`).
    pub cached_at_load: u64,
    /// Seconds its calls waited for weights not read yet.
    pub waited: f64,
    /// Seconds from its start to its end.
    pub seconds: f64,
    /// Its peak activation memory, remembered for its next plan.
    pub peak: u64,
    /// What became of it at its end.
    pub departure: Departure,
    /// Kept: bytes of its blocks given back to other stages since its last run, read again
    /// at its start (behind its first blocks' compute).
    pub read_again: u64,
    /// Kept at its end: bytes of its blocks given to the next stage, by its final pass or at
    /// its end (the rest stays for the next run).
    pub given_back: u64,
    /// Loaded afresh though kept from an earlier run: its checkpoint changed on disk since that
    /// load (which file, and how). `None` otherwise.
    pub file_changed: Option<String>,
    /// What the next stage's read-ahead cost this stage's compute, and what the runner did
    /// about it ([`super::PaceVerdict`]); `None` when nothing was read beside it.
    pub beside: Option<PaceVerdict>,
    /// The warnings of the plan it was loaded by (forced tiers over the budget, blocks read
    /// from disk every pass, ...); empty when kept, as its plan was reported at its load.
    pub plan_warnings: Vec<String>,
    /// Its group and why it got its share of the group's memory; `None` outside a group.
    pub share: Option<Share>,
}

impl fmt::Display for Arrival {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arrival::Kept => "kept from the run before",
            Arrival::ReadAhead => "read ahead",
            Arrival::ReadAtStart => "read at its start",
            Arrival::Replanned => "planned again at its start",
        })
    }
}

impl fmt::Display for Departure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Departure::Kept => "kept",
            Departure::Released => "released",
            Departure::FinalPass => "freed by its final pass",
            Departure::Failed => "released after an error",
        })
    }
}

fn free(f: &Free) -> String {
    match f.vram {
        Some(v) => format!("RAM {}, VRAM {}", format_bytes(f.ram), format_bytes(v)),
        None => format!("RAM {}", format_bytes(f.ram)),
    }
}

impl fmt::Display for StageRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run {} {}: {}, {:.2} s",
            self.run, self.stage, self.arrival, self.seconds
        )?;
        if self.arrival == Arrival::Kept && self.read_again > 0 {
            write!(
                f,
                ", {} of {} given back meanwhile and read again",
                format_bytes(self.read_again),
                format_bytes(self.holds)
            )?;
        }
        if self.arrival == Arrival::ReadAhead {
            write!(
                f,
                ", {} of {} in before its start",
                format_bytes(self.read_before_start),
                format_bytes(self.holds)
            )?;
        }
        if self.arrival != Arrival::Kept && self.file_bytes > 0 {
            if self.cached_at_load == 0 {
                write!(f, ", read cold")?;
            } else {
                write!(
                    f,
                    ", {} of its {} file in the page cache",
                    format_bytes(self.cached_at_load),
                    format_bytes(self.file_bytes)
                )?;
            }
        }
        if self.waited > 0.0 {
            write!(f, ", waited {:.2} s for weights", self.waited)?;
        }
        write!(f, "; {}", self.departure)?;
        if self.departure == Departure::Kept && self.given_back > 0 {
            write!(
                f,
                " but for {} of its blocks given to the next stage",
                format_bytes(self.given_back)
            )?;
        }
        if let (Some(p), Some(a)) = (&self.predicted, &self.actual) {
            write!(
                f,
                "\n    free memory predicted {}, found {}",
                free(p),
                free(a)
            )?;
        }
        if let Some(s) = &self.share {
            write!(
                f,
                "\n    in group {}: holds {}; {}",
                s.group,
                format_bytes(self.holds),
                s.reason
            )?;
        }
        if let Some(r) = &self.replan {
            write!(f, "\n    planned again: {r}")?;
        }
        if let Some(c) = &self.file_changed {
            write!(
                f,
                "\n    not kept: its checkpoint changed since it was loaded ({c}), so it was loaded again"
            )?;
        }
        if let Some(v) = &self.beside {
            write!(f, "\n    {v}")?;
        }
        for w in &self.plan_warnings {
            write!(f, "\n    its plan warns: {w}")?;
        }
        if self.peak > 0 {
            write!(f, "\n    peak activations {}", format_bytes(self.peak))?;
        }
        Ok(())
    }
}

/// The report of every stage of every run, one entry per stage in the order they ran; a
/// group's run comes before the first of its members' records in that run.
pub fn report(records: &[StageRecord], groups: &[GroupRecord]) -> String {
    let mut out = String::from("pipeline:\n");
    let mut shown = vec![false; groups.len()];
    for r in records {
        if let Some(share) = &r.share {
            for (g, done) in groups.iter().zip(shown.iter_mut()) {
                if !*done && g.run == r.run && g.group == share.group {
                    *done = true;
                    // Writing to a String cannot fail.
                    let _ = writeln!(out, "  {g}");
                }
            }
        }
        let _ = writeln!(out, "  {r}");
    }
    // A group none of whose members ran in its run still says what it was given.
    for (g, done) in groups.iter().zip(shown) {
        if !done {
            let _ = writeln!(out, "  {g}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(arrival: Arrival) -> StageRecord {
        StageRecord {
            run: 2,
            stage: "dit".into(),
            arrival,
            predicted: Some(Free {
                ram: 12_000_000_000,
                vram: None,
            }),
            actual: Some(Free {
                ram: 11_500_000_000,
                vram: None,
            }),
            replan: None,
            read_before_start: 3_000_000_000,
            holds: 5_000_000_000,
            file_bytes: 6_000_000_000,
            cached_at_load: 0,
            waited: 0.5,
            seconds: 4.25,
            peak: 200_000_000,
            departure: Departure::Released,
            read_again: 0,
            given_back: 0,
            file_changed: None,
            beside: None,
            plan_warnings: Vec::new(),
            share: None,
        }
    }

    #[test]
    fn a_group_comes_before_its_first_member_with_each_member_s_share() {
        use crate::pipeline::{Calls, Schedule, ScheduleSource, ShareReason};
        let members = vec!["draft".to_string(), "target".to_string()];
        let schedule = Schedule::new(
            "assisted",
            &members,
            ["draft", "target"]
                .iter()
                .map(|m| Calls {
                    member: m.to_string(),
                    calls: 1,
                })
                .collect(),
        )
        .unwrap();
        let group = GroupRecord {
            run: 2,
            group: "assisted".into(),
            schedule: Some(schedule.clone()),
            source: ScheduleSource::Given,
            sharing: crate::pipeline::Sharing::Together,
            ran: Some(schedule),
            run_order: Vec::new(),
            reads_in_order: false,
        };
        let mut first = record(Arrival::ReadAtStart);
        first.stage = "draft".into();
        first.share = Some(Share {
            group: "assisted".into(),
            reason: ShareReason::First { calls: Some(1) },
        });
        let mut second = first.clone();
        second.stage = "target".into();
        second.share = Some(Share {
            group: "assisted".into(),
            reason: ShareReason::After {
                before: vec!["draft".into()],
                calls: Some(1),
            },
        });
        let text = report(&[record(Arrival::Kept), first, second], &[group]);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("run 2 group assisted: members loaded together"))
            .unwrap_or_else(|| panic!("no group line in\n{text}"));
        assert!(lines[at + 1].starts_with("run 2 draft:"), "{text}");
        assert!(
            text.contains("in group assisted: holds 5.00 GB; planned first (1 call in the run)"),
            "{text}"
        );
        assert!(
            text.contains(
                "in group assisted: holds 5.00 GB; planned after draft (1 call in the run): what they left"
            ),
            "{text}"
        );
    }

    #[test]
    fn each_stage_says_how_it_came_and_went() {
        let text = report(&[record(Arrival::ReadAhead)], &[]);
        assert!(text.starts_with("pipeline:\n"), "{text}");
        for part in [
            "run 2 dit: read ahead, 4.25 s",
            "3.00 GB of 5.00 GB in before its start, read cold",
            "waited 0.50 s for weights; released",
            "free memory predicted RAM 12.00 GB, found RAM 11.50 GB",
            "peak activations 200.00 MB",
        ] {
            assert!(text.contains(part), "{part:?} missing from\n{text}");
        }
    }

    #[test]
    fn a_stage_kept_in_part_says_what_went_and_came_back() {
        let mut r = record(Arrival::Kept);
        r.read_again = 1_500_000_000;
        r.departure = Departure::Kept;
        r.given_back = 2_000_000_000;
        let text = r.to_string();
        for part in [
            "kept from the run before, 4.25 s, 1.50 GB of 5.00 GB given back meanwhile and read again",
            "; kept but for 2.00 GB of its blocks given to the next stage",
        ] {
            assert!(text.contains(part), "{part:?} missing from\n{text}");
        }
    }

    #[test]
    fn a_stage_read_again_says_what_the_page_cache_held() {
        let mut r = record(Arrival::ReadAtStart);
        r.cached_at_load = 6_000_000_000;
        let text = r.to_string();
        assert!(
            text.contains("6.00 GB of its 6.00 GB file in the page cache"),
            "{text}"
        );
    }

    #[test]
    fn a_stage_beside_which_the_next_was_read_says_what_that_cost() {
        let mut r = record(Arrival::ReadAtStart);
        let mut pace = crate::pipeline::Pace::new(1);
        pace.set_alone_rate(2e9);
        for _ in 0..10 {
            pace.ran(0, 0.01, false);
            pace.ran(0, 0.5, true);
        }
        pace.set_read(1_000_000_000);
        r.beside = Some(pace.verdict());
        let text = report(&[r], &[]);
        assert!(text.contains("read ahead paused after 1.00 GB"), "{text}");
    }

    #[test]
    fn a_stage_whose_file_changed_says_why_it_was_not_kept() {
        let mut r = record(Arrival::ReadAtStart);
        assert!(!r.to_string().contains("changed"));
        r.file_changed = Some("/m/dit.safetensors: it was written to".into());
        let text = r.to_string();
        assert!(
            text.contains(
                "not kept: its checkpoint changed since it was loaded \
                 (/m/dit.safetensors: it was written to), so it was loaded again"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_kept_stage_has_no_read_ahead_line() {
        let mut r = record(Arrival::Kept);
        r.predicted = None;
        r.actual = None;
        r.waited = 0.0;
        r.departure = Departure::Kept;
        let text = r.to_string();
        assert!(!text.contains("in before"), "{text}");
        assert!(!text.contains("cold"), "{text}");
        assert!(!text.contains("predicted"), "{text}");
        assert!(text.contains("kept from the run before"), "{text}");
    }

    #[test]
    fn a_stage_loaded_by_a_plan_with_warnings_repeats_them() {
        let mut r = record(Arrival::ReadAhead);
        assert!(!r.to_string().contains("warns"));
        r.plan_warnings = vec!["2 block(s) (1.00 GB) do not fit in RAM".into()];
        let text = r.to_string();
        assert!(
            text.contains("\n    its plan warns: 2 block(s) (1.00 GB) do not fit in RAM"),
            "{text}"
        );
    }
}
