//! The automatic assignment: device first, then RAM, then disk.

use super::blocks::ModelBlocks;
use super::budget::{self, Budgets, Shape};
use super::options::{resolve_options, Figures, PlanOptions};
use super::{BlockPlan, OutsidePlan, Plan, PlanError, Tier};
use crate::rules::Held;

/// Plans `model` for the memory in `figures`.
///
/// The device tier takes the first blocks in block order (or exactly `resident_blocks`): a
/// prefix keeps `resident_blocks=12` meaning "the first 12" and keeps the streamed blocks
/// contiguous in run order. The RAM tier then takes the remaining blocks in order, first fit, so
/// a smaller block later in the list can still use RAM a larger one could not; the rest go to
/// disk. How many are resident and which go to RAM:
///
/// - With a GPU (and a device tier sized as a GPU's, [`Figures::on_cpu`]), `by_upper_bounds`:
///   every streamed block counted in the larger of its RAM and disk forms. Both forms are staged
///   there, so the bound is close.
/// - On the CPU, `by_exact_budgets`: the disk tier used in place holds only a mapped window
///   while the RAM tier stages whole blocks, so the upper bound can be far above any assignment
///   (a budget a little under the model's size put every block on disk). Each assignment tried
///   is judged by the budgets the plan prints for it, and the upper-bound assignment is
///   kept wherever it is as good (more resident bytes first, then more RAM-tier bytes).
pub fn plan(
    model: &ModelBlocks,
    figures: &Figures,
    options: &PlanOptions,
) -> Result<Plan, PlanError> {
    let options = &resolve_options(options, model)?;
    let gpu = figures.free_vram.is_some();
    let mut blocks: Vec<_> = model
        .blocks
        .iter()
        .map(|b| budget::block_plan(&b.name, &b.tensors, options, gpu))
        .collect();
    let outside = budget::outside_plan(model, options);
    let bounded = by_upper_bounds(
        &blocks,
        &Shape::new(figures, options, &outside),
        options,
        gpu,
    );
    let tiers = if gpu {
        bounded
    } else {
        let exact = by_exact_budgets(&mut blocks, &outside, figures, options);
        let rank_of = |tiers: &[Tier], blocks: &mut [BlockPlan]| {
            put(blocks, tiers);
            rank(&budget::compute(blocks, &outside, figures, options))
        };
        if rank_of(&exact, &mut blocks) > rank_of(&bounded, &mut blocks) {
            exact
        } else {
            bounded
        }
    };
    put(&mut blocks, &tiers);
    Ok(Plan::resolved_with(
        blocks, outside, false, figures, options,
    ))
}

/// Whether an assignment's budgets hold it: the device tier within the device budget and the RAM
/// tier within the RAM budget.
pub(crate) fn fits(b: &Budgets) -> bool {
    b.device_used <= b.device_budget && b.ram_used <= b.ram_budget
}

/// How good an assignment is: one that fits first, then more resident bytes, then more bytes in
/// the RAM tier.
fn rank(b: &Budgets) -> (bool, u64, u64) {
    (fits(b), b.device_used, b.ram_used)
}

/// Puts `blocks` in `tiers` (one each), with each block's bytes in its tier's form.
fn put(blocks: &mut [BlockPlan], tiers: &[Tier]) {
    for (b, &tier) in blocks.iter_mut().zip(tiers) {
        b.put(tier);
    }
}

impl BlockPlan {
    /// Moves the block to `tier`, its `stored_bytes` with it.
    fn put(&mut self, tier: Tier) {
        self.tier = tier;
        self.stored_bytes = match tier {
            Tier::Disk => self.file_bytes,
            Tier::Device | Tier::Ram => self.storage_bytes,
        };
    }
}

/// The tiers by upper bounds: the largest prefix of resident blocks that fits with every other
/// block counted in the larger of its RAM and disk figures (its tier is not known yet), then the
/// RAM tier first fit in what that bound leaves. Any assignment it gives fits, when its prefix
/// was not forced; on the CPU it can leave most of the budget unused (see [`plan`]).
pub(crate) fn by_upper_bounds(
    blocks: &[BlockPlan],
    shape: &Shape,
    options: &PlanOptions,
    gpu: bool,
) -> Vec<Tier> {
    let n = blocks.len();
    let mut streamed_staging = vec![None; n + 1];
    let mut streamed_expansion = vec![0u64; n + 1];
    let mut streamed_mapped = vec![0u64; n + 1];
    for k in (0..n).rev() {
        let b = &blocks[k];
        streamed_mapped[k] = streamed_mapped[k + 1].max(b.mapped);
        streamed_staging[k] = Some(
            streamed_staging[k + 1]
                .unwrap_or(0)
                .max(b.staging.streamed()),
        );
        streamed_expansion[k] = streamed_expansion[k + 1].max(b.expansion.streamed());
    }
    let mut resident_expansion = vec![0u64; n + 1];
    let mut prefix = vec![0u64; n + 1];
    for k in 0..n {
        resident_expansion[k + 1] = resident_expansion[k].max(blocks[k].expansion.device);
        prefix[k + 1] = prefix[k] + blocks[k].storage_bytes;
    }
    let held = |k: usize| {
        let expansion = resident_expansion[k].max(streamed_expansion[k]);
        Held::new(streamed_staging[k], expansion, options.buffers(), gpu)
            .with_mapped_window(streamed_mapped[k], options.max_depth())
    };
    // What the runtime holds shrinks as more blocks become resident, so the fit is not
    // monotonic in k: check every k and keep the largest that fits.
    let fits = |k: usize| prefix[k] <= shape.device_budget(&held(k));
    let resident = match options.resident_blocks {
        Some(r) => r.min(n),
        None => (0..=n).rev().find(|&k| fits(k)).unwrap_or(0),
    };
    let mut ram_left = shape.ram_budget(&held(resident), prefix[resident]);
    let mut tiers = vec![Tier::Device; resident];
    for b in &blocks[resident..] {
        if b.storage_bytes <= ram_left {
            tiers.push(Tier::Ram);
            ram_left -= b.storage_bytes;
        } else {
            tiers.push(Tier::Disk);
        }
    }
    tiers
}

/// The tiers by exact budgets, each assignment tried judged by [`budget::compute`] (the budgets
/// the plan prints). For each count of resident blocks, largest first: every streamed block in
/// RAM (the best a count can give) if that fits, else every streamed block on disk, the
/// streamed tier that usually holds least (used in place where
/// [`crate::rules::maps_disk_tier`]: a mapped window instead of whole staged blocks), then each
/// streamed block in order moved to RAM where the assignment still fits (a RAM-tier block stages
/// whole, so it may grow the staging buffers). A forced count (`resident_blocks`) is the only
/// count tried; where its device tier is over budget, a move is kept if it fits in RAM and
/// leaves the device no further over. At most `3n + 3` budget computations of `O(n)` each;
/// `blocks` are left in some assignment.
pub(crate) fn by_exact_budgets(
    blocks: &mut [BlockPlan],
    outside: &OutsidePlan,
    figures: &Figures,
    options: &PlanOptions,
) -> Vec<Tier> {
    let n = blocks.len();
    let budgets = |blocks: &[BlockPlan]| budget::compute(blocks, outside, figures, options);
    let fill = |blocks: &mut [BlockPlan], k: usize, streamed: Tier| {
        for (i, b) in blocks.iter_mut().enumerate() {
            b.put(if i < k { Tier::Device } else { streamed });
        }
        fits(&budgets(blocks))
    };
    let tiers = |blocks: &[BlockPlan]| blocks.iter().map(|b| b.tier).collect();
    let counts = match options.resident_blocks {
        Some(r) => r.min(n)..=r.min(n),
        None => 0..=n,
    };
    let mut resident = *counts.start();
    for k in counts.rev() {
        if k < n && fill(blocks, k, Tier::Ram) {
            return tiers(blocks);
        }
        if fill(blocks, k, Tier::Disk) {
            resident = k;
            break;
        }
    }
    fill(blocks, resident, Tier::Disk);
    let over = |b: &Budgets| b.device_used.saturating_sub(b.device_budget);
    let mut now = budgets(blocks);
    for i in resident..n {
        blocks[i].put(Tier::Ram);
        let next = budgets(blocks);
        if next.ram_used <= next.ram_budget && over(&next) <= over(&now) {
            now = next;
        } else {
            blocks[i].put(Tier::Disk);
        }
    }
    tiers(blocks)
}

impl Plan {
    /// A plan resolved for `figures` and `options` with its blocks in the tiers they carry: the
    /// budgets and warnings computed from them.
    pub(crate) fn resolved_with(
        blocks: Vec<BlockPlan>,
        outside: OutsidePlan,
        manual: bool,
        figures: &Figures,
        options: &PlanOptions,
    ) -> Plan {
        let mut plan = Plan {
            blocks,
            outside,
            manual,
            resolved: true,
            figures: Some(figures.clone()),
            options: options.clone(),
            budgets: None,
            warnings: Vec::new(),
        };
        plan.recompute();
        plan
    }

    /// Sets each block's bytes for its tier, then the budgets and warnings. Called after every
    /// change of tiers.
    pub(crate) fn recompute(&mut self) {
        for b in &mut self.blocks {
            b.put(b.tier);
        }
        let Some(figures) = self.figures.as_ref().filter(|_| self.resolved) else {
            self.budgets = None;
            self.warnings.clear();
            return;
        };
        let budgets = budget::compute(&self.blocks, &self.outside, figures, &self.options);
        self.warnings = super::warnings::collect(self, &budgets, figures);
        self.budgets = Some(budgets);
    }
}
