//! Whether reading the next stage ahead pays, measured while it happens.
//!
//! A read beside a stage's compute is not free: on a machine with few cores it takes CPU from
//! the compute (the copy or the faults of its destination, the system's own work for the read),
//! and on some machines a GB read beside compute costs the compute more than the same GB takes
//! to read with nothing beside it. There reading ahead makes the run slower than reading each
//! stage at its start. The runner times each block of the running stage while reads are in
//! flight and while none are, and compares the compute lost per GB read with what a GB takes
//! to read alone (the rate a load at a stage's start reached). When reading ahead loses, the
//! rest of the stage is read at its start, as without read-ahead.
//!
//! The comparison leans towards reading ahead: a read left for the stage's start also overlaps
//! that stage's first blocks, which this counts as nothing.

use std::collections::HashMap;
use std::fmt;

/// Busy block runs (with a quiet run of the same block to compare) needed before a verdict, at
/// least: fewer are noise.
pub const PACE_MIN_SAMPLES: usize = 8;
/// Bytes the read-ahead must have read before a verdict: less is too little to weigh.
pub const PACE_MIN_BYTES: u64 = 64 << 20;

/// What the read-ahead does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaceChoice {
    /// Not enough measured yet: it reads.
    Measuring,
    /// Reading ahead costs the compute less than it saves: it reads.
    Read,
    /// Reading ahead costs the compute more than it saves: the rest waits for the stage's start.
    Pause,
}

/// The choice, the figures behind it, and why, in a sentence for the report.
#[derive(Debug, Clone, PartialEq)]
pub struct PaceVerdict {
    /// What the read-ahead does.
    pub choice: PaceChoice,
    /// Seconds of the running stage's compute lost per GB read beside it, once measured.
    pub lost_per_gb: Option<f64>,
    /// Seconds a GB takes to read with nothing beside it, where known.
    pub alone_per_gb: Option<f64>,
    /// Why.
    pub reason: String,
}

impl fmt::Display for PaceVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The running stage's block times, with and without reads in flight, and what the read-ahead
/// has read.
#[derive(Debug, Clone, Default)]
pub struct Pace {
    /// Blocks in one pass of the running stage: the quiet runs wanted before reading.
    blocks: usize,
    /// Per block: the sum and count of its runs with no read in flight.
    quiet: HashMap<usize, (f64, u32)>,
    quiet_runs: usize,
    /// Per block: the sum and count of its runs with reads in flight.
    busy: HashMap<usize, (f64, u32)>,
    busy_runs: u32,
    /// Bytes per second of a read with nothing beside it.
    alone_rate: Option<f64>,
    /// Bytes the read-ahead has read.
    read_bytes: u64,
}

/// What the block times say so far.
enum Measured {
    NoRate,
    TooLittle { compared: u32, wanted: usize },
    Lost { per_gb: f64, alone_per_gb: f64 },
}

impl Pace {
    /// For a running stage of `blocks` blocks per pass.
    pub fn new(blocks: usize) -> Self {
        Pace {
            blocks,
            ..Pace::default()
        }
    }

    /// The rate, in bytes per second, of a read with nothing beside it (a load at a stage's
    /// start); ignored unless positive and finite.
    pub fn set_alone_rate(&mut self, bytes_per_second: f64) {
        if bytes_per_second.is_finite() && bytes_per_second > 0.0 {
            self.alone_rate = Some(bytes_per_second);
        }
    }

    /// A load at a stage's start read `bytes` in `seconds`: the fastest such load of at least
    /// [`PACE_MIN_BYTES`] is what a read takes alone (a smaller one says little of the drive).
    pub fn note_load(&mut self, bytes: u64, seconds: f64) {
        if bytes >= PACE_MIN_BYTES && seconds > 0.0 {
            let rate = bytes as f64 / seconds;
            if self.alone_rate.is_none_or(|r| rate > r) {
                self.set_alone_rate(rate);
            }
        }
    }

    /// Block `block` of the running stage computed for `seconds`, with reads in flight
    /// (`busy`) or not.
    pub fn ran(&mut self, block: usize, seconds: f64, busy: bool) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let runs = if busy {
            &mut self.busy
        } else {
            &mut self.quiet
        };
        let r = runs.entry(block).or_insert((0.0, 0));
        r.0 += seconds;
        r.1 += 1;
        if busy {
            self.busy_runs += 1;
        } else {
            self.quiet_runs += 1;
        }
    }

    /// The read-ahead has read `bytes` so far.
    pub fn set_read(&mut self, bytes: u64) {
        self.read_bytes = bytes;
    }

    /// Whether fewer quiet runs than one pass are known: the read-ahead should wait for them
    /// (a little) before its reads make every run busy.
    pub fn wants_quiet(&self) -> bool {
        self.quiet_runs < self.blocks.max(1)
    }

    /// Each busy run against its block's quiet mean, summed per block: as cheap per call as the
    /// blocks are few, so the hook may ask after every run.
    fn measure(&self) -> Measured {
        let Some(rate) = self.alone_rate else {
            return Measured::NoRate;
        };
        let (mut lost, mut compared) = (0.0, 0u32);
        for (block, &(sum, n)) in &self.busy {
            if let Some(&(q_sum, q_n)) = self.quiet.get(block) {
                lost += sum - f64::from(n) * q_sum / f64::from(q_n);
                compared += n;
            }
        }
        let wanted = PACE_MIN_SAMPLES.max(self.blocks / 2);
        if (compared as usize) < wanted || self.read_bytes < PACE_MIN_BYTES {
            return Measured::TooLittle { compared, wanted };
        }
        // Runs of blocks never seen quiet lost time too: counted at the compared runs' rate.
        let lost = lost * f64::from(self.busy_runs) / f64::from(compared);
        Measured::Lost {
            per_gb: lost.max(0.0) / (self.read_bytes as f64 / 1e9),
            alone_per_gb: 1e9 / rate,
        }
    }

    /// What the read-ahead should do now (without the figures and words of [`verdict`](Self::verdict)).
    pub fn choice(&self) -> PaceChoice {
        match self.measure() {
            Measured::Lost {
                per_gb,
                alone_per_gb,
            } if per_gb > alone_per_gb => PaceChoice::Pause,
            Measured::Lost { .. } => PaceChoice::Read,
            _ => PaceChoice::Measuring,
        }
    }

    /// What the read-ahead should do now, the figures behind it and why.
    pub fn verdict(&self) -> PaceVerdict {
        let alone_per_gb = self.alone_rate.map(|r| 1e9 / r);
        let measuring = |reason: String| PaceVerdict {
            choice: PaceChoice::Measuring,
            lost_per_gb: None,
            alone_per_gb,
            reason,
        };
        let (lost_per_gb, alone) =
            match self.measure() {
                Measured::NoRate => return measuring(
                    "read ahead: no load at a stage's start measured the drive yet, so nothing \
                     to weigh its cost against"
                        .into(),
                ),
                Measured::TooLittle { compared, wanted } => {
                    return measuring(format!(
                        "read ahead: {compared} of {wanted} block runs beside reads compared, \
                     {:.2} GB read: too little to weigh yet",
                        self.read_bytes as f64 / 1e9
                    ))
                }
                Measured::Lost {
                    per_gb,
                    alone_per_gb,
                } => (per_gb, alone_per_gb),
            };
        let (choice, reason) = if lost_per_gb > alone {
            (
                PaceChoice::Pause,
                format!(
                    "read ahead paused after {:.2} GB: each GB read beside the running stage \
                     cost its compute {lost_per_gb:.2} s, more than the {alone:.2} s a GB takes \
                     to read with nothing beside it; the rest is read at the stage's start",
                    self.read_bytes as f64 / 1e9
                ),
            )
        } else {
            (
                PaceChoice::Read,
                format!(
                    "read ahead: each GB read beside the running stage cost its compute \
                     {lost_per_gb:.2} s, less than the {alone:.2} s a GB takes to read with \
                     nothing beside it"
                ),
            )
        };
        PaceVerdict {
            choice,
            lost_per_gb: Some(lost_per_gb),
            alone_per_gb,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage of 4 blocks of 10 ms each, one quiet pass, then `passes` passes beside reads that
    /// make each block `extra` seconds slower, while `gb` GB are read; the drive reads `rate`
    /// GB/s alone.
    fn measured(extra: f64, passes: usize, gb: f64, rate: f64) -> PaceVerdict {
        let mut p = Pace::new(4);
        p.set_alone_rate(rate * 1e9);
        for b in 0..4 {
            p.ran(b, 0.010, false);
        }
        assert!(!p.wants_quiet());
        for _ in 0..passes {
            for b in 0..4 {
                p.ran(b, 0.010 + extra, true);
            }
        }
        p.set_read((gb * 1e9) as u64);
        p.verdict()
    }

    #[test]
    fn reads_that_cost_the_compute_more_than_they_take_alone_pause() {
        // 3 passes x 4 blocks x 20 ms = 0.24 s lost for 0.2 GB: 1.2 s/GB, against 0.5 s/GB alone.
        let v = measured(0.020, 3, 0.2, 2.0);
        assert_eq!(v.choice, PaceChoice::Pause, "{v}");
        assert!((v.lost_per_gb.unwrap() - 1.2).abs() < 1e-9, "{v:?}");
        assert!(
            v.reason.contains("1.20 s") && v.reason.contains("0.50 s"),
            "{v}"
        );
    }

    #[test]
    fn reads_that_cost_the_compute_less_than_they_take_alone_go_on() {
        // 12 runs x 2 ms = 0.024 s lost for 0.2 GB: 0.12 s/GB, against 0.5 s/GB alone.
        let v = measured(0.002, 3, 0.2, 2.0);
        assert_eq!(v.choice, PaceChoice::Read, "{v}");
        // Compute that ran faster beside the reads (noise) lost nothing.
        let v = measured(-0.002, 3, 0.2, 2.0);
        assert_eq!(
            (v.choice, v.lost_per_gb),
            (PaceChoice::Read, Some(0.0)),
            "{v}"
        );
    }

    #[test]
    fn too_little_measured_or_no_drive_rate_keeps_reading() {
        // One pass beside reads is 4 runs, fewer than the 8 wanted; 0.01 GB is too little read.
        assert_eq!(measured(0.020, 1, 0.2, 2.0).choice, PaceChoice::Measuring);
        assert_eq!(measured(0.020, 3, 0.01, 2.0).choice, PaceChoice::Measuring);
        let mut p = Pace::new(2);
        p.ran(0, 0.01, false);
        assert!(p.wants_quiet());
        p.ran(1, 0.01, false);
        for _ in 0..20 {
            p.ran(0, 1.0, true);
        }
        p.set_read(1 << 30);
        let v = p.verdict();
        assert_eq!(v.choice, PaceChoice::Measuring, "{v}");
        assert!(v.reason.contains("no load"), "{v}");
        // Nonsense rates and times are ignored.
        p.set_alone_rate(f64::NAN);
        p.set_alone_rate(0.0);
        p.ran(0, f64::INFINITY, false);
        assert_eq!(p.verdict().choice, PaceChoice::Measuring);
    }

    #[test]
    fn a_small_or_slower_load_says_nothing_more_of_the_drive() {
        let mut p = Pace::new(1);
        p.note_load(PACE_MIN_BYTES - 1, 0.001);
        assert!(p.verdict().reason.contains("no load"));
        p.note_load(2_000_000_000, 1.0);
        p.note_load(1_000_000_000, 1.0); // slower: the faster one stands
        assert_eq!(p.verdict().alone_per_gb, Some(0.5));
    }

    #[test]
    fn the_choice_alone_is_the_verdict_s() {
        for extra in [0.030, 0.002, -0.002] {
            for passes in [1, 3] {
                let mut p = Pace::new(4);
                p.set_alone_rate(2e9);
                for b in 0..4 {
                    p.ran(b, 0.010, false);
                }
                for _ in 0..passes {
                    for b in 0..4 {
                        p.ran(b, 0.010 + extra, true);
                    }
                }
                p.set_read(200_000_000);
                assert_eq!(p.choice(), p.verdict().choice);
            }
        }
    }

    #[test]
    fn runs_of_blocks_never_seen_quiet_count_at_the_compared_rate() {
        let mut p = Pace::new(2);
        p.set_alone_rate(1e9);
        p.ran(0, 0.01, false);
        p.ran(1, 0.01, false);
        for _ in 0..10 {
            p.ran(0, 0.11, true); // 0.1 s lost each
            p.ran(7, 5.0, true); // never quiet: counted as 0.1 s
        }
        p.set_read(1_000_000_000);
        let v = p.verdict();
        assert!((v.lost_per_gb.unwrap() - 2.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.choice, PaceChoice::Pause);
    }
}
