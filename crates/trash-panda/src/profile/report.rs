//! The text report printed by `TRASH_PANDA_PROFILE=1` when a stage's hooks are removed. Its lines
//! are the ones "Reading the profile" in the README explains; keep the two in step.

use std::fmt::Write;

use super::passes::gbps;
use super::{BlockRun, DriveRate, EngineSummary, LoadSummary, MemoryPoint, Profile, TierLoad};
use crate::units::{format_bytes, format_gb};

/// How many blocks of the first pass the report breaks down.
pub const SLOWEST_BLOCKS: usize = 6;

/// A load of fewer bytes is over before the drive gets going: its rate says nothing of the drive.
const RATED_BYTES: u64 = 64 << 20;

/// Live tensors past this many bytes at a memory point get their biggest holders named.
const ALIVE_NAMING_BYTES: u64 = 100_000_000;
const HOLDERS_NAMED: usize = 3;

impl Profile {
    /// The report, one line per figure, ending with a newline. Same events, same text.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let drive = self.drive().map(DriveRate::gb_per_s);
        if let Some(d) = self.drive() {
            let _ = writeln!(
                out,
                "drive reference: {:.2} GB/s (unbuffered reads of {} GB of the checkpoint, {} in flight, measured at release)",
                d.gb_per_s(),
                gb(d.bytes),
                d.in_flight,
            );
        }
        if let Some(load) = &self.load {
            load_lines(&mut out, load, drive);
        }
        let passes = self.passes();
        if passes.is_empty() {
            out.push_str("no block ran\n");
        }
        for p in &passes {
            let _ = writeln!(
                out,
                "pass {}: {:.2} s, waited {:.2} s ({:.1}%), ram {} GB at {:.2} GB/s, disk {} GB at {:.2} GB/s",
                p.index + 1,
                p.seconds,
                p.waited_seconds,
                p.waited_percent(),
                gb(p.ram_bytes),
                p.ram_gbps,
                gb(p.disk_bytes),
                p.disk_gbps,
            );
            if p.expanded_bytes > 0 {
                let read = p.ram_bytes + p.disk_bytes;
                let ratio = if read > 0 {
                    format!(
                        " ({:.2}x the {} GB read from the tiers)",
                        p.expanded_bytes as f64 / read as f64,
                        gb(read)
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "  expanded {} GB to the compute dtype{ratio}",
                    gb(p.expanded_bytes)
                );
            }
            if let (0, Some(d)) = (p.index, drive) {
                let shares: Vec<String> = [
                    ("ram", p.ram_bytes, p.ram_gbps),
                    ("disk", p.disk_bytes, p.disk_gbps),
                ]
                .into_iter()
                .filter(|&(_, bytes, _)| bytes > 0)
                .map(|(tier, _, rate)| format!("{tier} {}", of_drive(rate, d)))
                .collect();
                if !shares.is_empty() {
                    let _ = writeln!(out, "  first pass against the drive: {}", shares.join(", "));
                }
            }
            let (bytes, seconds) = self.device_copied(p.start, p.start + p.seconds);
            if bytes > 0 && seconds > 0.0 {
                let rate = gbps(bytes, seconds);
                let share = self.link().map_or(String::new(), |link| {
                    format!(
                        ", {:.0}% of the pinned link's {:.2} GB/s",
                        100.0 * rate * 1e9 / link,
                        link / 1e9
                    )
                });
                let _ = writeln!(
                    out,
                    "  copies to the device: {} GB in {seconds:.2} s of copy engine time, {rate:.2} GB/s{share}",
                    gb(bytes)
                );
            }
        }
        if let Some(first) = self.runs().next() {
            out.push_str("first pass, main thread time by block:\n");
            for run in slowest(first, SLOWEST_BLOCKS) {
                let _ = writeln!(
                    out,
                    "  {} ({}): {:.2} s = staged {:.2} s + gpu {:.2} s + rest {:.2} s",
                    self.names[run.block],
                    run.tier,
                    run.seconds(),
                    run.staged_wait,
                    run.gpu_wait,
                    run.rest(),
                );
            }
        }
        if let Some(engine) = &self.engine {
            engine_lines(&mut out, engine, drive);
        }
        if !self.memory.is_empty() {
            out.push_str("memory while releasing:\n");
            for point in &self.memory {
                memory_lines(&mut out, point);
            }
        }
        out
    }
}

/// The `n` longest runs, longest first; equal times keep model order so the text is stable.
pub(crate) fn slowest(runs: &[BlockRun], n: usize) -> Vec<&BlockRun> {
    let mut sorted: Vec<&BlockRun> = runs.iter().collect();
    sorted.sort_by(|a, b| {
        b.seconds()
            .total_cmp(&a.seconds())
            .then(a.block.cmp(&b.block))
    });
    sorted.truncate(n);
    sorted
}

fn gb(bytes: u64) -> String {
    format_gb(bytes)
}

fn plural(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// A read rate as a share of the drive's: "0.94x the drive".
fn of_drive(rate: f64, drive: f64) -> String {
    format!("{:.2}x the drive", rate / drive)
}

fn load_lines(out: &mut String, load: &LoadSummary, drive: Option<f64>) {
    let tiers: Vec<String> = [
        ("device", load.device),
        ("ram", load.ram),
        ("disk", load.disk),
    ]
    .into_iter()
    .filter(|(_, t)| *t != TierLoad::default())
    .map(|(name, t)| {
        let rate = if t.seconds > 0.0 && t.bytes > 0 {
            let r = gbps(t.bytes, t.seconds);
            match drive {
                Some(d) if t.bytes >= RATED_BYTES => format!(" at {r:.2} GB/s, {}", of_drive(r, d)),
                _ => format!(" at {r:.2} GB/s"),
            }
        } else {
            String::new()
        };
        format!("{name} {} GB in {:.2} s{rate}", gb(t.bytes), t.seconds)
    })
    .collect();
    let _ = write!(out, "stream_load took {:.2} s", load.seconds);
    if !tiers.is_empty() {
        let _ = write!(out, " ({})", tiers.join(", "));
    }
    out.push('\n');
    if let Some(read) = load.ram_in_memory {
        let storage = read.storage.map_or(String::new(), |d| format!(" as {d}"));
        let _ = writeln!(
            out,
            "read {} GB of streamed-block tensors into memory{storage} in {:.2} s ({:.2} GB/s, {})",
            gb(read.bytes),
            read.seconds,
            gbps(read.bytes, read.seconds),
            plural(read.threads as usize, "thread"),
        );
    }
    if let Some(l) = load.loader {
        let _ = writeln!(
            out,
            "loader thread: {} resident {} ({} GB) in {:.2} s ({:.2} GB/s); blocks waited {:.2} s for it",
            l.blocks,
            if l.blocks == 1 { "block" } else { "blocks" },
            gb(l.bytes),
            l.seconds,
            gbps(l.bytes, l.seconds),
            l.waited_seconds,
        );
    }
}

fn engine_lines(out: &mut String, e: &EngineSummary, drive: Option<f64>) {
    if e.ram_cold_bytes > 0 {
        // Workers read cold blocks side by side: their summed seconds over their count is the
        // wall time the drive took, so the rate compares with a standalone read of the drive.
        let wall = e.ram_cold_seconds / e.workers.max(1) as f64;
        let rate = gbps(e.ram_cold_bytes, wall);
        let reference = drive
            .map(|d| format!(", {}", of_drive(rate, d)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "ram tier read from the drive (pages not in memory): {} GB in {}, {rate:.2} GB/s with {}{reference}",
            gb(e.ram_cold_bytes),
            plural(e.ram_cold_blocks as usize, "block"),
            plural(e.workers.max(1) as usize, "worker"),
        );
    }
    let _ = writeln!(
        out,
        "worker waited for a free pinned buffer {} ({:.2} s)",
        plural(e.buffer_waits as usize, "time"),
        e.buffer_wait_seconds
    );
    let _ = writeln!(
        out,
        "blocks acquired: {} ready, {} waited for; {} staged and never used, {} out of order",
        e.hits, e.misses, e.reclaimed_unused, e.out_of_order
    );
    for p in &e.depth {
        let depth = if p.min == p.max {
            p.min.to_string()
        } else {
            format!("{}..{}", p.min, p.max)
        };
        let why: Vec<String> = p.changes.iter().map(|c| c.reason()).collect();
        let why = if why.is_empty() {
            String::new()
        } else {
            format!("; {}", why.join("; "))
        };
        let _ = writeln!(
            out,
            "staging depth, engine pass {}: {depth} blocks ahead{why}",
            p.pass + 1
        );
    }
}

fn memory_lines(out: &mut String, point: &MemoryPoint) {
    let alive: u64 = point.large_tensors.iter().map(|t| t.bytes).sum();
    let _ = writeln!(
        out,
        "  {}: free RAM {} GB, working set {} GB, private {} GB, {} of 1 MB or more alive ({} GB)",
        point.label,
        gb(point.free_ram),
        gb(point.rss),
        gb(point.private),
        plural(point.large_tensors.len(), "tensor"),
        gb(alive),
    );
    if alive > ALIVE_NAMING_BYTES {
        let mut biggest: Vec<_> = point.large_tensors.iter().collect();
        biggest.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
        for t in biggest.into_iter().take(HOLDERS_NAMED) {
            let _ = writeln!(out, "    held: {} ({})", t.name, format_bytes(t.bytes));
        }
    }
}
