//! The automatic assignment: device first, then RAM, then disk.

use super::blocks::ModelBlocks;
use super::budget::{self, Shape};
use super::options::{Figures, PlanOptions};
use super::{Plan, PlanError, Tier};
use crate::rules::{infer_compute_dtype, Held};
use crate::DType;

/// Checks `options` and fills in what they leave to the model (the compute dtype).
pub(crate) fn resolve_options(
    options: &PlanOptions,
    model: &ModelBlocks,
) -> Result<PlanOptions, PlanError> {
    let mut options = options.clone();
    let compute = *options.compute_dtype.get_or_insert_with(|| {
        infer_compute_dtype(
            model
                .blocks
                .iter()
                .flat_map(|b| &b.tensors)
                .chain(&model.outside),
        )
    });
    if !matches!(compute, DType::F32 | DType::F16 | DType::BF16) {
        return Err(PlanError::ComputeDtype { dtype: compute });
    }
    if let Some(dtype) = options.storage_dtype {
        if !matches!(dtype, DType::BF16 | DType::F8E4M3) {
            return Err(PlanError::StorageDtype { dtype });
        }
    }
    Ok(options)
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
    let options = &resolve_options(options, model)?;
    let gpu = figures.free_vram.is_some();
    let mut blocks: Vec<_> = model
        .blocks
        .iter()
        .map(|b| budget::block_plan(&b.name, &b.tensors, options, gpu))
        .collect();
    let outside = budget::outside_plan(&model.outside, options);
    let shape = Shape::new(figures, options, &outside);
    let n = blocks.len();

    // What the runtime holds when the first k blocks are resident. The tiers of the others are
    // not known yet, so each counts with the larger of its RAM and disk figures; the budgets of
    // the final assignment are exact (`recompute`).
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
    for b in &mut blocks[..resident] {
        b.tier = Tier::Device;
    }
    let mut ram_left = shape.ram_budget(&held(resident), prefix[resident]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::TensorSizes;

    fn t(name: &str, dtype: DType, n: usize) -> TensorSizes {
        TensorSizes::new(name, dtype, &[n])
    }

    /// The cases where the Python copy of this rule (bytes, f64 ignored, f32 when no float)
    /// answered differently; Python now asks this function.
    #[test]
    fn compute_dtype_counts_elements_and_votes_for_the_compute_dtype() {
        // More f32 bytes (24) than bf16 bytes (20), more bf16 elements (10 against 6).
        let mixed = [t("a", DType::BF16, 10), t("b", DType::F32, 6)];
        assert_eq!(infer_compute_dtype(&mixed), DType::BF16);
        // f64 weights compute in f32, alone or beside fewer bf16 elements.
        assert_eq!(infer_compute_dtype(&[t("a", DType::F64, 4)]), DType::F32);
        let f64_bf16 = [t("a", DType::F64, 10), t("b", DType::BF16, 9)];
        assert_eq!(infer_compute_dtype(&f64_bf16), DType::F32);
        // No float weights (none at all, or integers only): bf16.
        assert_eq!(infer_compute_dtype(&[]), DType::BF16);
        assert_eq!(infer_compute_dtype(&[t("ids", DType::I64, 9)]), DType::BF16);
        // fp8 weights with f32 scales (per row, here more elements than the bf16 norms) and
        // f32 weights fewer than the fp8 ones: bf16.
        let fp8 = [
            t("l.0.w.weight", DType::F8E4M3, 64),
            t("l.0.w.weight_scale", DType::F32, 32),
            t("l.0.w.weight_scale_inv", DType::F32, 32),
            t("l.0.norm.weight", DType::BF16, 8),
            t("l.0.router.weight", DType::F32, 16),
        ];
        assert_eq!(infer_compute_dtype(&fp8), DType::BF16);
        let e5m2 = [t("w", DType::F8E5M2, 64), t("v", DType::F16, 63)];
        assert_eq!(infer_compute_dtype(&e5m2), DType::BF16);
    }
}
