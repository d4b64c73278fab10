//! The report `stream_load` returns: what went where, how many bytes, how long; its short table,
//! and the profile's [`LoadSummary`] of it. The one type of a load's figures: the Python layer
//! fills it in through the binding and shows it as the core formats it.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::events::{LoadSummary, LoaderRun, RamRead, TierLoad};
use crate::DType;

/// What one tier (or the weights outside the blocks) took at load time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadedTier {
    /// Blocks in the tier (0 for the outside weights).
    pub blocks: u64,
    /// Tensors loaded.
    pub tensors: u64,
    /// Their bytes, as held in the tier.
    pub bytes: u64,
    /// Wall-clock seconds the tier's part of the load took.
    pub seconds: f64,
}

/// Bytes and seconds of a load, per tier. Its `Display` is a short table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// The checkpoint's file, or the folder of its shards.
    pub checkpoint: String,
    /// The compute device as torch writes it (`cuda:0`, `cpu`).
    pub device: String,
    /// torch's name of the compute dtype ("bfloat16").
    pub compute_dtype: String,
    /// Wall-clock seconds of the whole load.
    pub seconds: f64,
    /// The weights outside the blocks.
    pub outside: LoadedTier,
    /// The device tier.
    pub device_tier: LoadedTier,
    /// The RAM tier.
    pub ram: LoadedTier,
    /// The disk tier.
    pub disk: LoadedTier,
    /// "mapped", "in memory" or "in memory as `<storage dtype>`".
    pub ram_source: String,
    /// How the disk tier is read ("direct", "buffered"), when a block is on disk.
    pub disk_mode: Option<String>,
    /// Why the disk tier is read that way, in words; empty when there is nothing to say.
    pub disk_mode_reason: String,
    /// How the load itself read (past the page cache or through it) and why, in words; empty
    /// when it was not decided for this model alone (a pipeline's stage: its report says).
    #[serde(default)]
    pub reads: String,
    /// Bytes of the engine's staging pool; 0 when no block streams.
    pub staging_bytes: u64,
    /// Embedding tables left in the checkpoint's map (counted within outside or device).
    pub mapped_bytes: u64,
    /// Buffers not in the checkpoint, kept from the model's construction.
    pub kept_buffers: Vec<String>,
    /// Checkpoint tensors the model has no place for.
    pub unexpected: Vec<String>,
}

impl LoadReport {
    /// A report of nothing loaded yet, from `checkpoint` to `device`.
    pub fn new(checkpoint: String, device: String, compute_dtype: String) -> Self {
        LoadReport {
            checkpoint,
            device,
            compute_dtype,
            seconds: 0.0,
            outside: LoadedTier::default(),
            device_tier: LoadedTier::default(),
            ram: LoadedTier::default(),
            disk: LoadedTier::default(),
            ram_source: "mapped".to_string(),
            disk_mode: None,
            disk_mode_reason: String::new(),
            reads: String::new(),
            staging_bytes: 0,
            mapped_bytes: 0,
            kept_buffers: Vec::new(),
            unexpected: Vec::new(),
        }
    }

    /// The profile's figures of this load. `ram_in_memory_threads`: the readers of a RAM tier
    /// read into private memory (`TRASH_PANDA_RAM_IN_MEMORY` or a storage dtype, `storage`),
    /// `None` when it is mapped and read during the passes; `loader`: `stage(overlap=True)`'s
    /// loader thread. The weights outside the blocks count with the device tier.
    pub fn summary(
        &self,
        ram_in_memory_threads: Option<u32>,
        storage: Option<DType>,
        loader: Option<LoaderRun>,
    ) -> LoadSummary {
        let in_memory = ram_in_memory_threads.filter(|_| self.ram.blocks > 0);
        LoadSummary {
            seconds: self.seconds,
            device: TierLoad {
                bytes: self.device_tier.bytes + self.outside.bytes,
                seconds: self.device_tier.seconds + self.outside.seconds,
            },
            ram: TierLoad {
                bytes: if in_memory.is_some() {
                    0
                } else {
                    self.ram.bytes
                },
                seconds: 0.0,
            },
            disk: TierLoad::default(),
            ram_in_memory: in_memory.map(|threads| RamRead {
                bytes: self.ram.bytes,
                seconds: self.ram.seconds,
                threads,
                storage,
            }),
            loader,
        }
    }
}

fn gb(n: u64) -> String {
    format!("{:.2} GB", n as f64 / 1e9)
}

/// The first six names, and " ..." when there are more.
fn first_names(names: &[String]) -> String {
    let shown = names.iter().take(6).map(String::as_str).collect::<Vec<_>>();
    let more = if names.len() > 6 { " ..." } else { "" };
    format!("{}{more}", shown.join(", "))
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream_load {} -> {} ({}) in {:.2} s",
            self.checkpoint, self.device, self.compute_dtype, self.seconds
        )?;
        let disk_mode = self
            .disk_mode
            .as_deref()
            .filter(|m| !m.is_empty())
            .unwrap_or("-");
        let rows = [
            ("outside", &self.outside, "read to the device".to_string()),
            (
                "device",
                &self.device_tier,
                "read to the device, stored dtype".to_string(),
            ),
            (
                "ram",
                &self.ram,
                format!("{}, staged before each run", self.ram_source),
            ),
            (
                "disk",
                &self.disk,
                format!("read before each run ({disk_mode})"),
            ),
        ];
        for (name, t, how) in rows {
            let speed = if t.seconds > 0.0 {
                format!(", {:.2} GB/s", t.bytes as f64 / t.seconds / 1e9)
            } else {
                String::new()
            };
            let count = if name == "outside" {
                format!("{} tensors", t.tensors)
            } else {
                format!("{} blocks", t.blocks)
            };
            write!(
                f,
                "\n  {name:<8}{count:>12}  {:>10}  {:6.2} s{speed}  {how}",
                gb(t.bytes),
                t.seconds
            )?;
        }
        if self.mapped_bytes > 0 {
            write!(
                f,
                "\n  embedding tables {} mapped, rows read as looked up",
                gb(self.mapped_bytes)
            )?;
        }
        if self.staging_bytes > 0 {
            write!(f, "\n  staging pool {}", gb(self.staging_bytes))?;
        }
        if !self.disk_mode_reason.is_empty() {
            write!(f, "\n  disk tier: {}", self.disk_mode_reason)?;
        }
        if !self.reads.is_empty() {
            write!(f, "\n  loads: {}", self.reads)?;
        }
        if !self.kept_buffers.is_empty() {
            write!(
                f,
                "\n  buffers not in the checkpoint, kept from construction: {}",
                first_names(&self.kept_buffers)
            )?;
        }
        if !self.unexpected.is_empty() {
            write!(
                f,
                "\n  {} checkpoint tensors the model has no place for: {}",
                self.unexpected.len(),
                first_names(&self.unexpected)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_tier_and_what_was_left_out() {
        let mut r = LoadReport::new("m.safetensors".into(), "cpu".into(), "bfloat16".into());
        r.seconds = 1.5;
        r.outside = LoadedTier {
            tensors: 3,
            bytes: 2_000_000_000,
            seconds: 1.0,
            ..LoadedTier::default()
        };
        r.disk.blocks = 2;
        r.staging_bytes = 10_000_000;
        r.unexpected = (0..7).map(|i| format!("t{i}")).collect();
        let text = r.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "stream_load m.safetensors -> cpu (bfloat16) in 1.50 s"
        );
        assert_eq!(
            lines[1],
            "  outside    3 tensors     2.00 GB    1.00 s, 2.00 GB/s  read to the device"
        );
        assert_eq!(
            lines[4],
            "  disk        2 blocks     0.00 GB    0.00 s  read before each run (-)"
        );
        assert_eq!(lines[5], "  staging pool 0.01 GB");
        assert_eq!(
            lines[6],
            "  7 checkpoint tensors the model has no place for: t0, t1, t2, t3, t4, t5 ..."
        );
        assert!(!text.contains("loads:"), "{text}");
        r.reads = "direct reads: why".into();
        let text = r.to_string();
        assert_eq!(text.lines().nth(6), Some("  loads: direct reads: why"));
    }

    #[test]
    fn the_summary_counts_outside_weights_with_the_device_tier() {
        let mut r = LoadReport::new("m".into(), "cpu".into(), "bfloat16".into());
        r.outside.bytes = 1;
        r.device_tier.bytes = 2;
        r.ram = LoadedTier {
            blocks: 1,
            bytes: 5,
            seconds: 0.5,
            ..LoadedTier::default()
        };
        let mapped = r.summary(None, None, None);
        assert_eq!(mapped.device.bytes, 3);
        assert_eq!(mapped.ram.bytes, 5);
        assert!(mapped.ram_in_memory.is_none());
        let read = r.summary(Some(4), Some(DType::BF16), None);
        assert_eq!(read.ram.bytes, 0);
        let ram = read.ram_in_memory.unwrap();
        assert_eq!(
            (ram.bytes, ram.threads, ram.storage),
            (5, 4, Some(DType::BF16))
        );
    }
}
