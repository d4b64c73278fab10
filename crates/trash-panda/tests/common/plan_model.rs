//! A decoder-shaped model of block sizes for the planner tests, and small views of a plan.

use trash_panda::plan::{
    MinFreeRam, ModelBlocks, Plan, PlanOptions, TensorSizes, Tier, WarningKind,
};
use trash_panda::DType;

pub const SIDE: usize = 10_000;

/// A decoder of `n` blocks, each one `SIDE x SIDE` weight and a norm, with embedding and head.
pub fn decoder(n: usize, dtype: DType) -> ModelBlocks {
    let mut ts = vec![TensorSizes::new(
        "model.embed.weight",
        DType::BF16,
        &[SIDE, SIDE],
    )];
    for i in 0..n {
        let p = format!("model.layers.{i}.");
        if dtype.is_fp8() {
            ts.push(TensorSizes::new(
                format!("{p}mlp.weight"),
                dtype,
                &[SIDE, SIDE],
            ));
            ts.push(TensorSizes::new(
                format!("{p}mlp.weight_scale"),
                DType::F32,
                &[SIDE],
            ));
            ts.push(TensorSizes::new(
                format!("{p}mlp.input_scale"),
                DType::F32,
                &[],
            ));
            ts.push(TensorSizes::new(
                format!("{p}norm.weight"),
                DType::BF16,
                &[SIDE],
            ));
        } else {
            ts.push(TensorSizes::new(
                format!("{p}mlp.weight"),
                dtype,
                &[SIDE, SIDE],
            ));
            ts.push(TensorSizes::new(format!("{p}norm.weight"), dtype, &[SIDE]));
        }
    }
    ts.push(TensorSizes::new("model.norm.weight", DType::BF16, &[SIDE]));
    ModelBlocks::discover(ts)
}

pub fn opts() -> PlanOptions {
    PlanOptions {
        min_free_ram: MinFreeRam::Bytes(0),
        compute_dtype: Some(DType::BF16),
        ..PlanOptions::default()
    }
}

/// One letter per block: D device, R ram, K disk.
pub fn tiers(p: &Plan) -> String {
    p.blocks
        .iter()
        .map(|b| match b.tier {
            Tier::Device => 'D',
            Tier::Ram => 'R',
            Tier::Disk => 'K',
        })
        .collect()
}

pub fn kinds(p: &Plan) -> Vec<&'static str> {
    p.warnings
        .iter()
        .map(|w| match w.kind {
            WarningKind::NothingFitsOnDevice { .. } => "nothing_fits",
            WarningKind::DeviceOverBudget { .. } => "device_over",
            WarningKind::SpillsToDisk { .. } => "spills",
            WarningKind::RamOverBudget { .. } => "ram_over",
            WarningKind::CgroupBelowRam { .. } => "cgroup",
            WarningKind::BlockLargerThanDevice { .. } => "block_too_large",
            WarningKind::HeadroomNotMeasured { .. } => "headroom",
            WarningKind::SharedGpuMemory { .. } => "shared_gpu_memory",
            WarningKind::LossyStorage { .. } => "lossy_storage",
        })
        .collect()
}
