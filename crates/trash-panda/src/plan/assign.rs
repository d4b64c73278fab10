//! The automatic assignment: device first, then RAM, then disk.

use super::blocks::ModelBlocks;
use super::budget::{self, staging_slots, Shape};
use super::options::{Figures, PlanOptions};
use super::{Plan, PlanError, Tier};
use crate::DType;

pub(crate) fn check_options(options: &PlanOptions) -> Result<(), PlanError> {
    if !matches!(options.compute_dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(PlanError::ComputeDtype {
            dtype: options.compute_dtype,
        });
    }
    if let Some(dtype) = options.storage_dtype {
        if !matches!(dtype, DType::BF16 | DType::F8E4M3) {
            return Err(PlanError::StorageDtype { dtype });
        }
    }
    Ok(())
}

/// Plans `model` for the memory in `figures`.
///
/// The device tier takes the first blocks in block order, as many as fit (or exactly
/// `resident_blocks`): a prefix keeps `resident_blocks=12` meaning "the first 12" and keeps the
/// streamed blocks contiguous in run order. The RAM tier then takes the remaining blocks in
/// order, first fit, so a smaller block later in the list can still use RAM a larger one could
/// not; the rest go to disk.
pub fn plan(
    model: &ModelBlocks,
    figures: &Figures,
    options: &PlanOptions,
) -> Result<Plan, PlanError> {
    check_options(options)?;
    let mut blocks: Vec<_> = model
        .blocks
        .iter()
        .map(|b| budget::block_plan(&b.name, &b.tensors, options))
        .collect();
    let outside = budget::outside_plan(&model.outside, options);
    let shape = Shape::new(figures, options, &blocks, &outside);
    let n = blocks.len();
    let slots = staging_slots(options);

    // suffix_max[k]: the largest file size among blocks[k..], what the staging pool must hold
    // when the first k blocks are resident.
    let mut suffix_max = vec![0u64; n + 1];
    for k in (0..n).rev() {
        suffix_max[k] = suffix_max[k + 1].max(blocks[k].file_bytes);
    }
    let mut prefix = vec![0u64; n + 1];
    for k in 0..n {
        prefix[k + 1] = prefix[k] + blocks[k].storage_bytes;
    }
    // Staging shrinks as more blocks become resident, so the fit is not monotonic in k: check
    // every k and keep the largest that fits.
    let fits = |k: usize| prefix[k] <= shape.device_budget(suffix_max[k] * slots);
    let resident = match options.resident_blocks {
        Some(r) => r.min(n),
        None => (0..=n).rev().find(|&k| fits(k)).unwrap_or(0),
    };
    for b in &mut blocks[..resident] {
        b.tier = Tier::Device;
    }
    let staging = suffix_max[resident] * slots;
    let mut ram_left = shape.ram_budget(staging, prefix[resident]);
    for b in &mut blocks[resident..] {
        if b.storage_bytes <= ram_left {
            b.tier = Tier::Ram;
            ram_left -= b.storage_bytes;
        } else {
            b.tier = Tier::Disk;
        }
    }
    let mut plan = Plan {
        blocks,
        outside,
        manual: false,
        resolved: true,
        figures: Some(figures.clone()),
        options: options.clone(),
        budgets: None,
        warnings: Vec::new(),
    };
    plan.recompute();
    Ok(plan)
}

impl Plan {
    /// Sets each block's bytes for its tier, then the budgets and warnings. Called after every
    /// change of tiers.
    pub(crate) fn recompute(&mut self) {
        for b in &mut self.blocks {
            b.stored_bytes = match b.tier {
                Tier::Disk => b.file_bytes,
                Tier::Device | Tier::Ram => b.storage_bytes,
            };
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
