//! The plan as a table people read.

use std::fmt;

use super::options::MinFreeRam;
use super::{ComputeDevice, Plan, Tier};
use crate::units::{format_bytes, format_gb};

/// `model.layers.12.` -> `("model.layers", 12)`; names without a trailing index stay whole.
fn split_index(name: &str) -> Option<(&str, u64)> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    let (list, index) = match trimmed.rsplit_once('.') {
        Some((list, index)) => (list, index),
        None => ("", trimmed),
    };
    index.parse().ok().map(|i| (list, i))
}

/// Block names compressed to ranges per list: `layers.0-11, layers.14, single_blocks.0-37`.
pub(crate) fn compress(names: &[&str]) -> String {
    let mut groups: Vec<(String, Vec<u64>)> = Vec::new();
    let mut parts: Vec<String> = Vec::new();
    let flush = |groups: &mut Vec<(String, Vec<u64>)>, parts: &mut Vec<String>| {
        for (list, indices) in groups.drain(..) {
            let mut runs: Vec<String> = Vec::new();
            let mut i = 0;
            while i < indices.len() {
                let mut j = i;
                while j + 1 < indices.len() && indices[j + 1] == indices[j] + 1 {
                    j += 1;
                }
                runs.push(if i == j {
                    indices[i].to_string()
                } else {
                    format!("{}-{}", indices[i], indices[j])
                });
                i = j + 1;
            }
            let dot = if list.is_empty() { "" } else { "." };
            parts.push(format!("{list}{dot}{}", runs.join(",")));
        }
    };
    for name in names {
        match split_index(name) {
            Some((list, index)) => match groups.last_mut() {
                Some((l, indices)) if l == list => indices.push(index),
                _ => groups.push((list.to_string(), vec![index])),
            },
            None => {
                flush(&mut groups, &mut parts);
                parts.push(name.to_string());
            }
        }
    }
    flush(&mut groups, &mut parts);
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// A plan's table without its warnings (see [`Plan::table`]).
#[derive(Debug, Clone, Copy)]
pub struct PlanTable<'a>(&'a Plan);

impl fmt::Display for PlanTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.write_table(f)
    }
}

impl Plan {
    /// The plan's table: its header, the blocks of each tier and the budgets, without the
    /// warnings that its `Display` adds (a log writes those apart).
    pub fn table(&self) -> PlanTable<'_> {
        PlanTable(self)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_table(f)?;
        if !self.warnings.is_empty() {
            writeln!(f, "warnings:")?;
            for w in &self.warnings {
                writeln!(f, "  - {}", w.message)?;
            }
        }
        Ok(())
    }
}

impl Plan {
    fn write_table(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let storage = o
            .storage_dtype
            .map_or("as stored".to_string(), |d| d.to_string());
        // A device tier sized as a GPU's but held in the CPU's RAM (a simulated device) is
        // still the CPU's: the line says what computes, the budgets say how it was sized.
        let on_cpu = self.figures.as_ref().and_then(|fg| match fg.device() {
            ComputeDevice::Cpu => Some(fg.free_vram),
            ComputeDevice::Gpu => None,
        });
        let device = match (&self.figures, on_cpu) {
            (None, _) => "not resolved".to_string(),
            (Some(_), None) => "gpu".to_string(),
            (Some(_), Some(None)) => "cpu (no GPU)".to_string(),
            (Some(_), Some(Some(vram))) => {
                format!(
                    "cpu (device tier planned as a GPU with {})",
                    format_bytes(vram)
                )
            }
        };
        writeln!(
            f,
            "{} plan: {} blocks, device {device}, compute {}, storage {storage}, lookahead {}{}",
            if self.manual { "manual" } else { "automatic" },
            self.blocks.len(),
            o.compute_dtype
                .map_or_else(|| "inferred".to_owned(), |d| d.to_string()),
            o.lookahead,
            // Said only when it differs, so a plan without growth reads as it always did.
            if o.max_depth() > o.lookahead {
                format!(" (grows to {} where the compute waits)", o.max_depth())
            } else {
                String::new()
            }
        )?;
        let mut rows = vec![(
            "tier".to_string(),
            "blocks".to_string(),
            "count".to_string(),
            "GB".to_string(),
        )];
        for tier in [Tier::Device, Tier::Ram, Tier::Disk] {
            let names = self.blocks_in(tier);
            rows.push((
                tier.to_string(),
                compress(&names),
                names.len().to_string(),
                format_gb(self.tier_bytes(tier)),
            ));
        }
        if self.outside.tensors > 0 {
            let mut names = self.outside.names.join(", ");
            if self.outside.tensors > self.outside.names.len() {
                names.push_str(", ...");
            }
            rows.push((
                "outside".into(),
                names,
                format!("{} tensors", self.outside.tensors),
                format_gb(self.outside.expanded_bytes),
            ));
        }
        if o.adapter_bytes > 0 {
            rows.push((
                "adapters".into(),
                "beside the outside weights".into(),
                String::new(),
                format_gb(o.adapter_bytes),
            ));
        }
        let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).min(60);
        let w2 = rows.iter().map(|r| r.2.len()).max().unwrap_or(0);
        for (tier, blocks, count, gb) in &rows {
            writeln!(f, "{tier:<8} {blocks:<w1$}  {count:>w2$}  {gb:>7}")?;
        }
        if let Some(b) = &self.budgets {
            let reserve = if b.reserve_measured {
                format!("activation_vram {}", format_bytes(b.reserve))
            } else {
                format!("headroom_vram {} (not measured)", format_bytes(b.reserve))
            };
            let vram = if on_cpu.is_some() {
                "vram"
            } else {
                "free VRAM"
            };
            let limit = match (b.gpu, o.max_vram) {
                (true, Some(_)) => format!("min({vram}, max_vram)"),
                (true, None) => vram.to_string(),
                (false, _) => "RAM pool".to_string(),
            };
            // The CUDA runtime's own memory, only where a GPU computes (see CUDA_CONTEXT_FLOOR).
            let floor = if b.cuda_floor > 0 {
                format!(" - CUDA floor {}", format_bytes(b.cuda_floor))
            } else {
                String::new()
            };
            let mut adapters = if b.adapters > 0 {
                format!(" - adapters {}", format_bytes(b.adapters))
            } else {
                String::new()
            };
            if b.merge_work > 0 {
                adapters += &format!(" - merge work {}", format_bytes(b.merge_work));
            }
            if b.device_scratch > 0 {
                adapters += &format!(" - ggml scratch {}", format_bytes(b.device_scratch));
            }
            writeln!(
                f,
                "device budget {} = {limit} {}{floor} - {reserve} - device slots {} - expansion {} \
                 - outside {}{adapters}; used {}",
                format_bytes(b.device_budget),
                format_bytes(b.device_limit),
                format_bytes(b.device_slot_bytes),
                format_bytes(b.expansion),
                format_bytes(b.outside),
                format_bytes(b.device_used)
            )?;
            let min_free = match o.min_free_ram {
                MinFreeRam::Auto => "min_free_ram (auto)",
                MinFreeRam::Bytes(_) => "min_free_ram",
            };
            // What else the runtime holds in RAM, where it holds any.
            let mut beside = String::new();
            if b.mapped_window > 0 {
                beside += &format!(" - mapped window {}", format_bytes(b.mapped_window));
            }
            if b.loader_ring > 0 {
                beside += &format!(" - loader ring {}", format_bytes(b.loader_ring));
            }
            writeln!(
                f,
                "ram budget {} = usable RAM {} - {min_free} {} - staging {} ({} x {}){beside}{}; \
                 used {}",
                format_bytes(b.ram_budget),
                format_bytes(b.usable_ram),
                format_bytes(b.min_free_ram),
                format_bytes(b.host_staging),
                b.staging_buffers,
                format_bytes(b.staging_buffer_bytes),
                if b.gpu {
                    ""
                } else {
                    " - device tier, expansion, outside"
                },
                format_bytes(b.ram_used)
            )?;
            if b.merged_memory + b.merged_files > 0 {
                let merged = self.blocks.iter().filter(|b| b.merged).count();
                writeln!(
                    f,
                    "merged blocks ({merged}, an adapter merged in): images of {} in memory and {} \
                     in overlay files, {} of RAM beyond the blocks' own (in used)",
                    format_bytes(b.merged_memory),
                    format_bytes(b.merged_files),
                    format_bytes(b.merged_beyond)
                )?;
            }
        } else {
            writeln!(f, "no sizes yet: resolve this plan against a model")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compresses_ranges() {
        let names = [
            "model.layers.0.",
            "model.layers.1.",
            "model.layers.2.",
            "model.layers.5.",
            "model.layers.7.",
            "model.layers.8.",
            "single_blocks.3.",
            "custom",
            "0.",
            "1.",
        ];
        assert_eq!(
            compress(&names),
            "model.layers.0-2,5,7-8, single_blocks.3, custom, 0-1"
        );
        assert_eq!(compress(&[]), "-");
    }
}
