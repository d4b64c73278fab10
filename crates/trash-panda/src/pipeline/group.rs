//! A group: stages that run together under one budget, and the schedule of their calls (which
//! member runs, how many times, in what order) that drives their memory.
//!
//! A schedule whose members each run in one stretch ([`Sharing::Turns`]: two experts of a
//! denoiser, one for the high-noise steps and one for the rest) lets each member be planned for
//! the budget less what the others hold at its turn: the next member is read while the current
//! one runs and the current one's last call frees its blocks for it. A schedule where members
//! alternate ([`Sharing::Together`]: a ControlNet called before its denoiser at every step, a
//! draft's few tokens before each verification by its target) needs them loaded at once: they
//! are planned one after the other, each for what the ones before it hold and the least the
//! ones after it need, the member called most often first ([`Schedule::planning_order`]), since
//! a byte kept resident saves one read per call.

use std::fmt;

use super::PipelineError;

/// How the members of a group share the memory over a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Each member runs in one stretch, the next after it: one at a time is loaded for its turn.
    Turns,
    /// Members alternate: they are loaded at once and planned together.
    Together,
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sharing::Turns => "members take turns",
            Sharing::Together => "members loaded together",
        })
    }
}

/// One stretch of a schedule: `calls` calls of `member` in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calls {
    /// The member's name.
    pub member: String,
    /// How many calls in a row (at least one).
    pub calls: u32,
}

/// The calls of a group's members over one run, in order, as stretches of one member each
/// (adjacent stretches of one member are merged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    runs: Vec<Calls>,
}

impl Schedule {
    /// A schedule of `runs` for the group `group` of `members`: each stretch names a member and
    /// at least one call.
    pub fn new(
        group: &str,
        members: &[String],
        runs: Vec<Calls>,
    ) -> Result<Schedule, PipelineError> {
        if runs.is_empty() {
            return Err(PipelineError::EmptySchedule {
                group: group.to_string(),
            });
        }
        let mut merged: Vec<Calls> = Vec::with_capacity(runs.len());
        for c in runs {
            if !members.contains(&c.member) {
                return Err(PipelineError::UnknownMember {
                    group: group.to_string(),
                    member: c.member,
                    members: members.to_vec(),
                });
            }
            if c.calls == 0 {
                return Err(PipelineError::NoCalls {
                    group: group.to_string(),
                    member: c.member,
                });
            }
            match merged.last_mut() {
                Some(last) if last.member == c.member => {
                    last.calls = last.calls.checked_add(c.calls).ok_or_else(|| {
                        PipelineError::TooManyCalls {
                            group: group.to_string(),
                            member: c.member.clone(),
                        }
                    })?;
                }
                _ => merged.push(c),
            }
        }
        Ok(Schedule { runs: merged })
    }

    /// The schedule of the calls seen in one run, member by member in the order they came.
    pub fn learned(
        group: &str,
        members: &[String],
        calls: &[String],
    ) -> Result<Schedule, PipelineError> {
        Schedule::new(
            group,
            members,
            calls
                .iter()
                .map(|m| Calls {
                    member: m.clone(),
                    calls: 1,
                })
                .collect(),
        )
    }

    /// Its stretches, in order.
    pub fn runs(&self) -> &[Calls] {
        &self.runs
    }

    /// Turns when each member runs in one stretch, else together.
    pub fn sharing(&self) -> Sharing {
        let mut seen: Vec<&str> = Vec::new();
        for c in &self.runs {
            if seen.contains(&c.member.as_str()) {
                return Sharing::Together;
            }
            seen.push(&c.member);
        }
        Sharing::Turns
    }

    /// How many times `member` is called over the run.
    pub fn calls(&self, member: &str) -> u64 {
        self.runs
            .iter()
            .filter(|c| c.member == member)
            .map(|c| u64::from(c.calls))
            .sum()
    }

    /// The members called, in the order of their first call.
    pub fn order(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in &self.runs {
            if !out.contains(&c.member) {
                out.push(c.member.clone());
            }
        }
        out
    }

    /// The order in which members loaded together are planned: the member called most often
    /// first (each byte it keeps resident saves a read per call), ties in `members`' order;
    /// members the schedule does not call come last.
    pub fn planning_order(&self, members: &[String]) -> Vec<String> {
        let mut out = members.to_vec();
        // A stable sort keeps `members`' order between equals.
        out.sort_by_key(|m| std::cmp::Reverse(self.calls(m)));
        out
    }

    /// Whether the `n`-th call (counted from 1) of `member` is its last of the run.
    pub fn is_last_call(&self, member: &str, n: u64) -> bool {
        n > 0 && n == self.calls(member)
    }

    /// The shortest stretch of runs that repeats to make the whole schedule, and how often.
    fn period(&self) -> (&[Calls], usize) {
        let n = self.runs.len();
        for p in 1..=n / 2 {
            if n.is_multiple_of(p) && (p..n).all(|i| self.runs[i] == self.runs[i % p]) {
                return (&self.runs[..p], n / p);
            }
        }
        (&self.runs, 1)
    }
}

/// How many stretches of a long schedule that repeats nothing its text names.
const SHOWN_RUNS: usize = 6;

fn stretches(runs: &[Calls]) -> String {
    let shown: Vec<String> = runs
        .iter()
        .take(SHOWN_RUNS)
        .map(|c| format!("{} x{}", c.member, c.calls))
        .collect();
    let mut out = shown.join(", ");
    if runs.len() > SHOWN_RUNS {
        out.push_str(&format!(", ... ({} stretches)", runs.len()));
    }
    out
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.period() {
            (one, 1) => f.write_str(&stretches(one)),
            (part, times) => write!(f, "({}) x{times}", stretches(part)),
        }
    }
}

/// Where the schedule a group ran by came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleSource {
    /// Given by the caller for the run (or with the group).
    Given,
    /// Learned from the calls of an earlier run (its number).
    Learned(u32),
    /// None yet: the members were loaded together, and this run's calls are learned.
    Unknown,
}

impl fmt::Display for ScheduleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleSource::Given => f.write_str("given"),
            ScheduleSource::Learned(run) => write!(f, "learned in run {run}"),
            ScheduleSource::Unknown => f.write_str("none yet"),
        }
    }
}

/// Why a member of a group was planned for the memory it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareReason {
    /// Members take turns: planned at its turn for the budget less what the others hold then.
    Turn,
    /// Loaded together and planned first: called most often (`calls` times in the run), less
    /// the least the members after it need.
    First {
        /// Its calls in the schedule (None: no schedule yet, planned in pipeline order).
        calls: Option<u64>,
    },
    /// Loaded together, planned for what the members before it left.
    After {
        /// The members planned before it.
        before: Vec<String>,
        /// Its calls in the schedule (None: no schedule yet).
        calls: Option<u64>,
    },
    /// Kept loaded from an earlier run, as it was planned then.
    Kept,
}

fn count_calls(n: Option<u64>) -> String {
    match n {
        None => "no schedule yet, in pipeline order".to_string(),
        Some(1) => "1 call in the run".to_string(),
        Some(n) => format!("{n} calls in the run"),
    }
}

impl fmt::Display for ShareReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShareReason::Turn => {
                f.write_str("planned at its turn for the budget less what the others held then")
            }
            ShareReason::First { calls } => write!(
                f,
                "planned first ({}): the budget less the least the others need",
                count_calls(*calls)
            ),
            ShareReason::After { before, calls } => write!(
                f,
                "planned after {} ({}): what they left",
                before.join(", "),
                count_calls(*calls)
            ),
            ShareReason::Kept => f.write_str("kept from an earlier run as it was planned then"),
        }
    }
}

/// A member's place in its group, for its stage's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The group's name.
    pub group: String,
    /// Why it got the memory it was planned for.
    pub reason: ShareReason,
}

/// One run of a group, for the pipeline's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    /// The run's number.
    pub run: u32,
    /// The group's name.
    pub group: String,
    /// The schedule the run's memory followed (None: none yet).
    pub schedule: Option<Schedule>,
    /// Where that schedule came from.
    pub source: ScheduleSource,
    /// How the members shared the memory.
    pub sharing: Sharing,
    /// The calls the run made (None: no member was called).
    pub ran: Option<Schedule>,
    /// The members' blocks in the order they first ran, across members (members loaded
    /// together); empty when none was recorded.
    pub run_order: Vec<(String, usize)>,
    /// Whether the run's reads followed `run_order` (learned in an earlier run), the read queue
    /// staging the members' blocks in it.
    pub reads_in_order: bool,
}

/// `run_order` as stretches of consecutive blocks of one member: "controlnet 0-2, unet 0-5".
fn stretches_of_blocks(order: &[(String, usize)]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let (member, first) = (&order[i].0, order[i].1);
        let mut last = first;
        while i + 1 < order.len() && order[i + 1].0 == *member && order[i + 1].1 == last + 1 {
            i += 1;
            last = order[i].1;
        }
        parts.push(if last == first {
            format!("{member} {first}")
        } else {
            format!("{member} {first}-{last}")
        });
        i += 1;
    }
    parts.join(", ")
}

impl fmt::Display for GroupRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run {} group {}: {}", self.run, self.group, self.sharing)?;
        match &self.schedule {
            Some(s) => write!(f, " by the schedule {s} ({})", self.source)?,
            None => write!(f, " (no schedule yet: this run's calls are learned)")?,
        }
        match &self.ran {
            Some(r) if Some(r) != self.schedule.as_ref() => write!(f, "; called {r}")?,
            Some(_) => {}
            None => write!(f, "; no member was called")?,
        }
        if !self.run_order.is_empty() {
            write!(
                f,
                "\n    one run order across members (blocks): {}; {}",
                stretches_of_blocks(&self.run_order),
                if self.reads_in_order {
                    "the reads followed it"
                } else {
                    "the next run's reads follow it"
                }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn calls(pairs: &[(&str, u32)]) -> Vec<Calls> {
        pairs
            .iter()
            .map(|(m, c)| Calls {
                member: m.to_string(),
                calls: *c,
            })
            .collect()
    }

    #[test]
    fn experts_take_turns_and_a_controlnet_runs_together() {
        let members = names(&["high", "low"]);
        let s = Schedule::new(
            "experts",
            &members,
            calls(&[("high", 3), ("high", 1), ("low", 4)]),
        )
        .unwrap();
        assert_eq!(s.runs().len(), 2, "adjacent stretches merge");
        assert_eq!(s.sharing(), Sharing::Turns);
        assert!(
            s.is_last_call("high", 4) && !s.is_last_call("high", 3) && !s.is_last_call("mid", 0)
        );
        assert_eq!(s.to_string(), "high x4, low x4");

        let members = names(&["controlnet", "unet"]);
        let seen: Vec<String> = (0..6).map(|i| members[i % 2].clone()).collect();
        let s = Schedule::learned("cn", &members, &seen).unwrap();
        assert_eq!(s.sharing(), Sharing::Together);
        assert_eq!(s.to_string(), "(controlnet x1, unet x1) x3");
        assert_eq!(s.order(), members);
    }

    #[test]
    fn the_member_called_most_is_planned_first() {
        let members = names(&["target", "draft"]);
        let s = Schedule::new(
            "assisted",
            &members,
            calls(&[("draft", 4), ("target", 1), ("draft", 4), ("target", 1)]),
        )
        .unwrap();
        assert_eq!(s.calls("draft"), 8);
        assert_eq!(s.planning_order(&members), names(&["draft", "target"]));
        let tie = Schedule::new("t", &members, calls(&[("draft", 1), ("target", 1)])).unwrap();
        assert_eq!(
            tie.planning_order(&members),
            members,
            "ties keep the pipeline's order"
        );
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        let members = names(&["a", "b"]);
        let e = Schedule::new("g", &members, calls(&[("c", 1)])).unwrap_err();
        assert!(
            e.to_string().contains("\"c\"") && e.to_string().contains("a, b"),
            "{e}"
        );
        let e = Schedule::new("g", &members, calls(&[("a", 0)])).unwrap_err();
        assert!(e.to_string().contains("no calls"), "{e}");
        assert!(Schedule::new("g", &members, vec![]).is_err());
        assert!(Schedule::new("g", &members, calls(&[("a", u32::MAX), ("a", 1)])).is_err());
    }

    #[test]
    fn a_long_irregular_schedule_is_shortened() {
        let members = names(&["d", "t"]);
        let mut pairs = Vec::new();
        for k in 1..=8 {
            pairs.push(("d", k));
            pairs.push(("t", 1));
        }
        let s = Schedule::new("g", &members, calls(&pairs)).unwrap();
        assert!(s.to_string().ends_with("... (16 stretches)"), "{s}");
        let record = GroupRecord {
            run: 2,
            group: "g".into(),
            schedule: Some(s.clone()),
            source: ScheduleSource::Learned(1),
            sharing: s.sharing(),
            ran: Some(s),
            run_order: vec![
                ("d".into(), 0),
                ("d".into(), 1),
                ("t".into(), 0),
                ("t".into(), 2),
            ],
            reads_in_order: true,
        };
        assert!(record
            .to_string()
            .starts_with("run 2 group g: members loaded together by the schedule"));
        assert!(
            record.to_string().contains("(learned in run 1)"),
            "{record}"
        );
        assert!(
            record.to_string().ends_with(
                "one run order across members (blocks): d 0-1, t 0, t 2; the reads followed it"
            ),
            "{record}"
        );
    }
}
