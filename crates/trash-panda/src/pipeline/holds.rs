//! What a loaded stage holds, the free memory predicted once it is released, and the margin past
//! which a stage planned for that prediction is planned again.

use std::fmt;

use crate::engine_config::EngineConfig;
use crate::plan::{Budgets, MinFreeRam, Plan};
use crate::rules::Tier;
use crate::stream::RamSource;
use crate::sys::{MemoryFigures, SysError};
use crate::units::format_bytes;

use super::PipelineError;

/// A prediction that misses the real free memory by less than this share of it (or
/// [`REPLAN_MARGIN_MIN`], whichever is larger) keeps its plan: the page cache and the
/// allocator's cache move free memory by this much between two readings with nothing loaded.
pub const REPLAN_MARGIN_FRACTION: f64 = 0.05;
/// The smallest margin, in bytes: 256 MiB.
pub const REPLAN_MARGIN_MIN: u64 = 256 << 20;

/// Free memory: RAM the process can use, and free VRAM where a GPU computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Free {
    /// RAM the process can use, in bytes.
    pub ram: u64,
    /// Free VRAM in bytes; `None` when the CPU computes.
    pub vram: Option<u64>,
}

/// What a loaded stage holds that its release gives back, by its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Holds {
    /// Private RAM: the host staging pool, a RAM tier read into memory, and on the CPU the
    /// resident blocks, the weights outside the blocks and the expansion buffer.
    pub ram: u64,
    /// Device memory (a GPU's): resident blocks, the weights outside the blocks, the device
    /// slots and the expansion buffer.
    pub vram: u64,
}

impl Holds {
    /// What a stage planned as `plan` and configured as `config` holds once loaded. A RAM
    /// tier read into memory holds each block as the engine lays it out (its staged bytes,
    /// tensors at aligned offsets). A mapped RAM tier and the pages of a mapped disk-tier block
    /// are the checkpoint's page cache, which the system counts as available while they are
    /// mapped, so releasing them frees nothing the prediction could count; the activations are
    /// not counted either (they are gone when a stage's last call returns, before its release).
    pub fn of(stage: &str, plan: &Plan, config: &EngineConfig) -> Result<Holds, PipelineError> {
        let budgets = budgets_of(stage, plan)?;
        let ram_tier = match config.ram_source {
            RamSource::InMemory { .. } => plan
                .blocks
                .iter()
                .filter(|b| b.tier == Tier::Ram)
                .map(|b| b.staging.ram)
                .sum(),
            RamSource::Mapped => 0,
        };
        let weights = budgets.device_used + budgets.outside;
        let at_once = Holds::at_once(stage, plan)?;
        Ok(if budgets.gpu {
            at_once.plus(Holds {
                ram: ram_tier,
                vram: weights,
            })
        } else {
            at_once.plus(Holds {
                ram: weights + ram_tier,
                vram: 0,
            })
        })
    }

    /// What a stage planned as `plan` takes as its load is set up, before the first read a
    /// stage read ahead puts behind its allowance (its blocks, its outside weights, a RAM tier
    /// held in memory): its own staging buffers and, on a GPU, its device slots and expansion
    /// buffers. A stage read ahead beside a running one takes these at once, so they must fit
    /// in the memory free now, not only at its start.
    pub fn at_once(stage: &str, plan: &Plan) -> Result<Holds, PipelineError> {
        let budgets = budgets_of(stage, plan)?;
        // A shared pool is the pipeline's: the stage's release gives none of it back.
        let staging = if budgets.shared_staging {
            0
        } else {
            budgets.host_staging
        };
        Ok(if budgets.gpu {
            Holds {
                ram: staging,
                vram: budgets.device_slot_bytes + budgets.expansion,
            }
        } else {
            Holds {
                ram: staging + budgets.expansion,
                vram: 0,
            }
        })
    }

    /// What a stage planned as `plan` and configured as `config` needs free at its start: what
    /// it holds, plus the free memory its plan leaves alone (the free-RAM floor; the activation
    /// reserve, in VRAM with a GPU and in RAM on the CPU; the CUDA context's floor). A shared
    /// staging pool counts here too: the plan counts it, and the pipeline's free memory
    /// ([`Free::with_shared_pool`]) has it back.
    pub fn needed(stage: &str, plan: &Plan, config: &EngineConfig) -> Result<Holds, PipelineError> {
        let mut holds = Holds::of(stage, plan, config)?;
        // `of` succeeded, so the budgets are there.
        let Some(b) = plan.budgets.as_ref() else {
            return Ok(holds);
        };
        if b.shared_staging {
            holds.ram += b.host_staging;
        }
        Ok(if b.gpu {
            holds.plus(Holds {
                ram: b.min_free_ram,
                vram: b.reserve + b.cuda_floor,
            })
        } else {
            holds.plus(Holds {
                ram: b.min_free_ram + b.reserve,
                vram: 0,
            })
        })
    }

    /// Whether a stage holding this computes its blocks in device memory (a GPU's): it holds
    /// some. Its blocks are given back, and its loader's reads are counted, in that memory; in
    /// RAM otherwise.
    pub fn on_device(self) -> bool {
        self.vram > 0
    }

    /// `n` bytes of the memory a stage holding this computes its blocks in.
    pub fn in_compute_memory(self, n: u64) -> Holds {
        if self.on_device() {
            Holds { ram: 0, vram: n }
        } else {
            Holds { ram: n, vram: 0 }
        }
    }

    /// The bytes of `part` in the memory a stage holding this computes its blocks in.
    pub fn compute_part(self, part: Holds) -> u64 {
        if self.on_device() {
            part.vram
        } else {
            part.ram
        }
    }

    /// Whether this much fits in `free` (VRAM only where `free` has it).
    pub fn fits(self, free: Free) -> bool {
        self.ram <= free.ram && free.vram.is_none_or(|v| self.vram <= v)
    }

    /// What is left of `self` once `part` is taken out (none below zero).
    pub fn less(self, part: Holds) -> Holds {
        Holds {
            ram: self.ram.saturating_sub(part.ram),
            vram: self.vram.saturating_sub(part.vram),
        }
    }

    /// What of this does not fit in `free`: what other stages must give back for it. VRAM
    /// counts only where `free` has a device.
    pub fn beyond(self, free: Free) -> Holds {
        Holds {
            ram: self.ram.saturating_sub(free.ram),
            vram: free.vram.map_or(0, |v| self.vram.saturating_sub(v)),
        }
    }

    /// The sum of two holdings.
    pub fn plus(self, other: Holds) -> Holds {
        Holds {
            ram: self.ram.saturating_add(other.ram),
            vram: self.vram.saturating_add(other.vram),
        }
    }
}

impl Free {
    /// The memory free now, as a plan made now would count it: the RAM this process can use
    /// (MemAvailable within a cgroup's limit and, on Windows, the commit headroom) and `vram`,
    /// the device's free memory as the caller measured it (None off a GPU).
    pub fn probe(vram: Option<u64>) -> Result<Free, SysError> {
        Ok(Free {
            ram: MemoryFigures::probe()?.usable_ram(),
            vram,
        })
    }

    /// The memory free once `released` is given back, from `self`, the memory free now.
    pub fn after_release(self, released: Holds) -> Free {
        Free {
            ram: self.ram.saturating_add(released.ram),
            vram: self.vram.map(|v| v.saturating_add(released.vram)),
        }
    }

    /// The memory free for planning a stage of a pipeline that holds a shared staging pool of
    /// `pool` bytes: what the machine has free, with the pool added back, since every stage's
    /// plan counts the pool as its own staging buffers (a pool taken from the machine's free
    /// memory and counted again by a plan would be counted twice). Apply before
    /// [`within`](Self::within), whose `held` leaves the pool out of each stage.
    pub fn with_shared_pool(self, pool: u64) -> Free {
        Free {
            ram: self.ram.saturating_add(pool),
            vram: self.vram,
        }
    }

    /// The memory free for a pipeline whose pool of pages keeps `kept` bytes given back by its
    /// stages for their next reads: what the machine has free, with those pages added back
    /// (the process holds them, but the next reads take them before any new page). Apply
    /// before [`within`](Self::within), whose `held` counts only the stages loaded.
    pub fn with_kept_pages(self, kept: u64) -> Free {
        Free {
            ram: self.ram.saturating_add(kept),
            vram: self.vram,
        }
    }

    /// The memory free within a budget: at most `ram` (and `vram`) less what the pipeline's
    /// loaded stages hold (`held`), and never more than `self`, what the machine has free.
    /// Without a budget for a memory, the machine's figure stands.
    pub fn within(self, ram: Option<u64>, vram: Option<u64>, held: Holds) -> Free {
        Free {
            ram: ram.map_or(self.ram, |cap| self.ram.min(cap.saturating_sub(held.ram))),
            vram: self
                .vram
                .map(|v| vram.map_or(v, |cap| v.min(cap.saturating_sub(held.vram)))),
        }
    }

    /// The bytes a stage read ahead may fill now, beside a running stage: the free memory its
    /// blocks compute in (VRAM with a GPU, else RAM) less the running stage's working memory
    /// (`peak`, its measured activations; on a GPU at least the `reserve` its plan set aside).
    /// The floor of free RAM is `self`'s already ([`keeping`](Self::keeping)).
    pub fn for_reads_beside(self, peak: u64, reserve: u64) -> u64 {
        match self.vram {
            Some(vram) => vram.saturating_sub(peak.max(reserve)),
            None => self.ram.saturating_sub(peak),
        }
    }

    /// Whether `need` (what a stage read ahead takes at once, [`Holds::at_once`]) fits in the
    /// memory free now beside a running stage whose working memory is `peak` (on a GPU at least
    /// its `reserve`): the memory the blocks compute in as [`for_reads_beside`](Self::for_reads_beside)
    /// counts it, and with a GPU the RAM as well.
    pub fn fits_beside(self, need: Holds, peak: u64, reserve: u64) -> bool {
        let room = self.for_reads_beside(peak, reserve);
        match self.vram {
            Some(_) => need.vram <= room && need.ram <= self.ram,
            None => need.ram <= room,
        }
    }

    /// The memory free for a pipeline's stages: `self`, what the machine has free, with
    /// `floor` bytes of RAM (see [`ram_floor`]) kept for the rest of the machine. Apply before
    /// [`within`](Self::within): the floor comes off the machine's free memory, not off the
    /// budget, whose bytes are all the stages'.
    pub fn keeping(self, floor: u64) -> Free {
        Free {
            ram: self.ram.saturating_sub(floor),
            vram: self.vram,
        }
    }

    /// The memory left free once `taken` is taken from `self` (none below zero).
    pub fn less(self, taken: Holds) -> Free {
        Free {
            ram: self.ram.saturating_sub(taken.ram),
            vram: self.vram.map(|v| v.saturating_sub(taken.vram)),
        }
    }
}

/// The budgets of a resolved plan; an error naming `stage` for one that is not.
fn budgets_of<'a>(stage: &str, plan: &'a Plan) -> Result<&'a Budgets, PipelineError> {
    plan.budgets
        .as_ref()
        .ok_or_else(|| PipelineError::Unresolved {
            stage: stage.to_string(),
        })
}

/// The RAM a pipeline leaves to the rest of the machine: the largest of its stages'
/// `min_free_ram`, `auto` resolved for a machine with `total_ram` bytes. The pipeline keeps it
/// once, from the machine's free memory ([`Free::keeping`]), and its stages plan with none:
/// each stage keeping its own inside the pipeline's budget would take the floor from the
/// budget (a 1 GB floor out of a 3 GB budget on a machine with 20 GB free), and a stage read
/// ahead would count it again beside the running one.
pub fn ram_floor(stages: &[MinFreeRam], total_ram: u64) -> u64 {
    stages
        .iter()
        .map(|m| m.resolve(total_ram))
        .max()
        .unwrap_or(0)
}

/// A stage's real free memory at its start missed the prediction it was planned for by more
/// than the margin: which memory, and by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replan {
    /// "RAM" or "VRAM".
    pub memory: &'static str,
    /// Bytes free the stage was planned for.
    pub predicted: u64,
    /// Bytes free at its start.
    pub actual: u64,
    /// The largest gap, either way, that keeps the plan, in bytes.
    pub margin: u64,
}

impl fmt::Display for Replan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (word, gap) = if self.actual < self.predicted {
            ("less", self.predicted - self.actual)
        } else {
            ("more", self.actual - self.predicted)
        };
        write!(
            f,
            "{} free at the start was {} against {} predicted: {} {} than the margin of {} allows",
            self.memory,
            format_bytes(self.actual),
            format_bytes(self.predicted),
            format_bytes(gap),
            word,
            format_bytes(self.margin),
        )
    }
}

fn margin(predicted: u64) -> u64 {
    ((predicted as f64 * REPLAN_MARGIN_FRACTION) as u64).max(REPLAN_MARGIN_MIN)
}

/// Whether a stage planned for `predicted` must be planned again for `actual`, the memory free at
/// its start: when either memory differs by more than the margin, either way (less could break
/// the plan, more is speed left unused). VRAM first, as a GPU's plan is shaped by it.
pub fn replan(predicted: Free, actual: Free) -> Option<Replan> {
    let check = |memory, predicted: u64, actual: u64| {
        let margin = margin(predicted);
        (predicted.abs_diff(actual) > margin).then_some(Replan {
            memory,
            predicted,
            actual,
            margin,
        })
    };
    let vram = match (predicted.vram, actual.vram) {
        (Some(p), Some(a)) => check("VRAM", p, a),
        _ => None,
    };
    vram.or_else(|| check("RAM", predicted.ram, actual.ram))
}

/// Whether a stage read ahead by plan `loaded`, whose start found `actual` free past the
/// prediction's margin ([`replan`]), is kept as it was loaded: `fresh`, a plan made for
/// `actual`, puts every block in the same tier as `loaded` does, and what `loaded` needs at its
/// start (configured as `config`) fits `actual`. A reload would then read the same blocks into
/// the same tiers again (more memory than predicted often changes nothing in a plan that has
/// every block resident already).
pub fn still_fits(
    stage: &str,
    loaded: &Plan,
    fresh: &Plan,
    config: &EngineConfig,
    actual: Free,
) -> Result<bool, PipelineError> {
    let same_tiers = loaded.blocks.len() == fresh.blocks.len()
        && loaded
            .blocks
            .iter()
            .zip(&fresh.blocks)
            .all(|(a, b)| a.name == b.name && a.tier == b.tier);
    Ok(same_tiers && Holds::needed(stage, loaded, config)?.fits(actual))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    fn planned(ram: u64) -> (Plan, EngineConfig) {
        use crate::dtype::DType;
        use crate::engine_config::EngineSettings;
        use crate::plan::{plan, Figures, ModelBlocks, PlanOptions};
        use crate::rules::TensorSizes;

        let mut ts = vec![TensorSizes::new("embed.weight", DType::F32, &[256, 256])];
        for i in 0..4 {
            ts.push(TensorSizes::new(
                format!("layers.{i}.w.weight"),
                DType::F32,
                &[1024, 1024],
            ));
        }
        let options = PlanOptions {
            min_free_ram: MinFreeRam::Bytes(0),
            ..PlanOptions::default()
        };
        let p = plan(
            &ModelBlocks::discover(ts),
            &Figures::injected(ram, None),
            &options,
        )
        .unwrap();
        let settings = EngineSettings::resolve(|_| None).unwrap();
        let config = EngineConfig::from_plan(&p, &settings).unwrap();
        (p, config)
    }

    #[test]
    fn a_stage_still_fits_when_a_fresh_plan_moves_no_block_and_its_needs_fit() {
        let (loaded, config) = planned(GB);
        assert!(loaded.blocks.iter().all(|b| b.tier == Tier::Device));
        let need = Holds::needed("s", &loaded, &config).unwrap();
        let free = |ram| Free { ram, vram: None };
        // More memory than predicted: the same tiers, and it fits.
        let (more, _) = planned(2 * GB);
        assert!(still_fits("s", &loaded, &more, &config, free(2 * GB)).unwrap());
        // The same tiers, but less free than the loaded plan needs.
        assert!(!still_fits("s", &loaded, &loaded, &config, free(need.ram - 1)).unwrap());
        assert!(still_fits("s", &loaded, &loaded, &config, free(need.ram)).unwrap());
        // A fresh plan that moves a block: planned again, however much is free.
        let mut moved = loaded.clone();
        moved.blocks[3].tier = Tier::Ram;
        assert!(!still_fits("s", &loaded, &moved, &config, free(2 * GB)).unwrap());
        let mut fewer = loaded.clone();
        fewer.blocks.pop();
        assert!(!still_fits("s", &loaded, &fewer, &config, free(2 * GB)).unwrap());
        // A plan with no budgets cannot say what it needs.
        let mut unresolved = loaded.clone();
        unresolved.budgets = None;
        assert!(matches!(
            still_fits("s", &unresolved, &loaded, &config, free(2 * GB)),
            Err(PipelineError::Unresolved { .. })
        ));
    }

    #[test]
    fn early_reads_leave_the_running_stage_its_working_memory() {
        let cpu = Free {
            ram: 4 * GB,
            vram: None,
        };
        assert_eq!(cpu.for_reads_beside(GB, 0), 3 * GB);
        assert_eq!(cpu.keeping(GB / 2).for_reads_beside(GB, 0), 2 * GB + GB / 2);
        assert_eq!(cpu.for_reads_beside(5 * GB, 0), 0);
        // On a GPU, VRAM: the larger of the peak and the reserve; RAM's floor is not its.
        let gpu = Free {
            ram: GB,
            vram: Some(8 * GB),
        };
        assert_eq!(gpu.keeping(4 * GB).for_reads_beside(GB, 2 * GB), 6 * GB);
        assert_eq!(gpu.for_reads_beside(3 * GB, 2 * GB), 5 * GB);
        assert_eq!(gpu.for_reads_beside(9 * GB, 0), 0);
    }

    #[test]
    fn what_a_load_takes_at_once_fits_beside_the_running_stage_or_waits() {
        let cpu = Free {
            ram: 4 * GB,
            vram: None,
        };
        let staging = Holds { ram: GB, vram: 0 };
        assert!(cpu.fits_beside(staging, 3 * GB, 0));
        assert!(!cpu.fits_beside(staging, 3 * GB + 1, 0));
        // With a GPU: device slots in the VRAM beside the reserve, staging in RAM.
        let gpu = Free {
            ram: GB,
            vram: Some(8 * GB),
        };
        let slots = Holds {
            ram: GB,
            vram: 2 * GB,
        };
        assert!(gpu.fits_beside(slots, GB, 6 * GB));
        assert!(!gpu.fits_beside(slots, 7 * GB, 0));
        assert!(!gpu.fits_beside(
            Holds {
                ram: 2 * GB,
                vram: 0
            },
            0,
            0
        ));
    }

    #[test]
    fn the_floor_comes_off_the_machine_not_the_budget() {
        let machine = Free {
            ram: 20 * GB,
            vram: None,
        };
        let floor = ram_floor(&[MinFreeRam::Auto, MinFreeRam::Bytes(GB / 2)], 24 * GB);
        assert_eq!(floor, MinFreeRam::Auto.resolve(24 * GB));
        let held = Holds { ram: GB, vram: 0 };
        // A budget well below the machine's free memory: all of it is the stages'.
        assert_eq!(
            machine.keeping(floor).within(Some(3 * GB), None, held).ram,
            2 * GB
        );
        // The machine binds: its free memory less the floor.
        let tight = Free {
            ram: 3 * GB,
            vram: None,
        };
        assert_eq!(
            tight.keeping(floor).within(Some(8 * GB), None, held).ram,
            3 * GB - floor
        );
        // The largest floor of the stages; none asked for, none kept.
        assert_eq!(
            ram_floor(&[MinFreeRam::Bytes(0), MinFreeRam::Bytes(5 * GB)], 24 * GB),
            5 * GB
        );
        assert_eq!(ram_floor(&[MinFreeRam::Bytes(0)], 24 * GB), 0);
        assert_eq!(tight.keeping(9 * GB).ram, 0);
    }

    #[test]
    fn the_margin_is_a_share_with_a_floor() {
        assert_eq!(margin(GB), REPLAN_MARGIN_MIN);
        assert_eq!(margin(100 * GB), 5 * GB);
    }

    #[test]
    fn within_the_margin_keeps_the_plan_either_way() {
        let p = Free {
            ram: 20 * GB,
            vram: Some(10 * GB),
        };
        let near = Free {
            ram: 20 * GB - GB / 2,
            vram: Some(10 * GB + 100_000_000),
        };
        assert_eq!(replan(p, near), None);
    }

    #[test]
    fn vram_is_checked_before_ram_and_both_ways() {
        let p = Free {
            ram: 20 * GB,
            vram: Some(10 * GB),
        };
        let less = Free {
            ram: 10 * GB,
            vram: Some(8 * GB),
        };
        let r = replan(p, less).unwrap();
        assert_eq!((r.memory, r.predicted, r.actual), ("VRAM", 10 * GB, 8 * GB));
        assert!(r.to_string().contains("less than the margin"), "{r}");
        let more = Free {
            ram: 30 * GB,
            vram: Some(10 * GB),
        };
        let r = replan(p, more).unwrap();
        assert_eq!(r.memory, "RAM");
        assert!(r.to_string().contains("more than the margin"), "{r}");
    }

    #[test]
    fn vram_is_ignored_where_one_side_has_no_gpu() {
        let p = Free {
            ram: GB,
            vram: None,
        };
        let a = Free {
            ram: GB,
            vram: Some(GB),
        };
        assert_eq!(replan(p, a), None);
    }

    #[test]
    fn a_budget_caps_what_is_free_less_what_is_held() {
        let machine = Free {
            ram: 20 * GB,
            vram: Some(10 * GB),
        };
        let held = Holds {
            ram: 3 * GB,
            vram: GB,
        };
        let f = machine.within(Some(8 * GB), None, held);
        assert_eq!(
            f,
            Free {
                ram: 5 * GB,
                vram: Some(10 * GB)
            }
        );
        let f = machine.within(Some(40 * GB), Some(4 * GB), held);
        assert_eq!(
            f,
            Free {
                ram: 20 * GB,
                vram: Some(3 * GB)
            }
        );
        assert_eq!(machine.within(Some(GB), None, held).ram, 0);
        assert_eq!(machine.within(None, None, held), machine);
        assert_eq!(
            held.less(Holds {
                ram: GB,
                vram: 2 * GB
            }),
            Holds {
                ram: 2 * GB,
                vram: 0
            }
        );
    }

    #[test]
    fn a_stage_computes_in_vram_when_it_holds_some() {
        let gpu = Holds { ram: 5, vram: 7 };
        let cpu = Holds { ram: 5, vram: 0 };
        assert!(gpu.on_device() && !cpu.on_device());
        assert_eq!(gpu.in_compute_memory(3), Holds { ram: 0, vram: 3 });
        assert_eq!(cpu.in_compute_memory(3), Holds { ram: 3, vram: 0 });
        let part = Holds { ram: 2, vram: 4 };
        assert_eq!((gpu.compute_part(part), cpu.compute_part(part)), (4, 2));
        assert_eq!((gpu.compute_part(gpu), cpu.compute_part(cpu)), (7, 5));
    }

    #[test]
    fn beyond_is_what_does_not_fit() {
        let h = Holds { ram: 5, vram: 7 };
        assert_eq!(
            h.beyond(Free { ram: 3, vram: None }),
            Holds { ram: 2, vram: 0 }
        );
        assert_eq!(
            h.beyond(Free {
                ram: 9,
                vram: Some(4)
            }),
            Holds { ram: 0, vram: 3 }
        );
        // What fits is a holding of nothing: fits() and beyond() agree.
        let free = Free {
            ram: 5,
            vram: Some(7),
        };
        assert!(h.fits(free) && h.beyond(free) == Holds::default());
    }

    #[test]
    fn fits_checks_vram_only_where_there_is_some() {
        let h = Holds { ram: 5, vram: 7 };
        assert!(h.fits(Free { ram: 5, vram: None }));
        assert!(h.fits(Free {
            ram: 5,
            vram: Some(7)
        }));
        assert!(!h.fits(Free {
            ram: 4,
            vram: Some(7)
        }));
        assert!(!h.fits(Free {
            ram: 5,
            vram: Some(6)
        }));
    }

    #[test]
    fn release_adds_what_the_stage_held() {
        let now = Free {
            ram: GB,
            vram: Some(2 * GB),
        };
        let held = Holds { ram: 3, vram: 5 };
        assert_eq!(
            now.after_release(held.plus(held)),
            Free {
                ram: GB + 6,
                vram: Some(2 * GB + 10)
            }
        );
        let cpu = Free { ram: 7, vram: None };
        assert_eq!(cpu.after_release(held).vram, None);
        assert_eq!(cpu.less(held), Free { ram: 4, vram: None });
        assert_eq!(cpu.less(Holds { ram: 9, vram: 0 }).ram, 0);
        assert_eq!(now.less(held).after_release(held), now);
    }
}
