//! The automatic assignment against the rule it replaced on the CPU ([`by_upper_bounds`], still
//! the GPU's): on the CPU the chosen plan fits its own budgets whenever any plan fits, and is
//! never worse than the upper-bound rule's (more resident bytes first, then more RAM-tier
//! bytes); where the upper-bound rule's plan is as good, it is the plan. With a GPU the plan is
//! the upper-bound rule's.

use proptest::prelude::*;

use super::assign::{by_exact_budgets, by_upper_bounds, fits};
use super::budget::{self, Budgets, Shape};
use super::{
    plan, Figures, MinFreeRam, ModelBlocks, Plan, PlanOptions, TensorSizes, Tier,
    CUDA_CONTEXT_FLOOR,
};
use crate::DType;

/// The plan the upper-bound rule gives, and its budgets.
fn by_the_bound(model: &ModelBlocks, figures: &Figures, options: &PlanOptions) -> Plan {
    let mut p = plan(model, figures, options).unwrap();
    let options = &p.options;
    let gpu = figures.free_vram.is_some();
    let shape = Shape::new(figures, options, &p.outside);
    let tiers = by_upper_bounds(&p.blocks, &shape, options, gpu);
    for (b, t) in p.blocks.iter_mut().zip(tiers) {
        b.tier = t;
    }
    p.recompute();
    p
}

fn budgets(p: &Plan) -> &Budgets {
    p.budgets.as_ref().unwrap()
}

fn rank(p: &Plan) -> (bool, u64, u64) {
    let b = budgets(p);
    (fits(b), b.device_used, b.ram_used)
}

fn tiers(p: &Plan) -> Vec<Tier> {
    p.blocks.iter().map(|b| b.tier).collect()
}

/// The budgets of `p`'s blocks in `tiers`.
fn budgets_in(p: &Plan, tiers: impl Fn(usize) -> Tier) -> Budgets {
    let mut blocks = p.blocks.clone();
    for (i, b) in blocks.iter_mut().enumerate() {
        b.tier = tiers(i);
        b.stored_bytes = match b.tier {
            Tier::Disk => b.file_bytes,
            _ => b.storage_bytes,
        };
    }
    budget::compute(&blocks, &p.outside, p.figures.as_ref().unwrap(), &p.options)
}

/// The first `k` blocks resident and the others on disk.
fn prefix_on_disk(p: &Plan, k: usize) -> Budgets {
    budgets_in(p, |i| if i < k { Tier::Device } else { Tier::Disk })
}

/// A model of blocks of one to three 2-D tensors each (bf16, f32 or f8; f32 tensors of any
/// element count, so some blocks are not 64-byte aligned in their file and are staged rather
/// than used in place), all alike or not, and one outside weight.
fn model() -> impl Strategy<Value = ModelBlocks> {
    let dtype = prop_oneof![Just(DType::BF16), Just(DType::F32), Just(DType::F8E4M3)];
    let tensor = (dtype, 1usize..=4000, 1usize..=4000);
    let block = prop::collection::vec(tensor, 1..=3);
    let blocks = prop::collection::vec(block, 2..=7);
    (blocks, prop::bool::weighted(0.75), 1usize..=1000).prop_map(|(mut blocks, alike, side)| {
        if alike {
            // A model of blocks alike, as most are.
            let first = blocks[0].clone();
            blocks.iter_mut().for_each(|b| b.clone_from(&first));
        }
        let mut ts = vec![TensorSizes::new("embed.weight", DType::BF16, &[side, 64])];
        for (i, block) in blocks.into_iter().enumerate() {
            for (j, (dtype, rows, cols)) in block.into_iter().enumerate() {
                let name = format!("layers.{i}.w{j}.weight");
                ts.push(TensorSizes::new(name, dtype, &[rows, cols]));
            }
        }
        ModelBlocks::discover(ts)
    })
}

fn options() -> impl Strategy<Value = PlanOptions> {
    (
        0usize..=3,
        prop_oneof![Just(None), (1usize..=4).prop_map(Some)],
        prop_oneof![Just(None), (1usize..=5).prop_map(Some)],
        prop_oneof![
            Just(None),
            Just(Some(DType::BF16)),
            Just(Some(DType::F8E4M3))
        ],
        prop_oneof![Just(None), Just(Some(DType::BF16)), Just(Some(DType::F32))],
        prop_oneof![3 => Just(None), 1 => (0u64..40_000_000).prop_map(Some)],
        prop_oneof![3 => Just(0u64), 1 => 0u64..4_000_000],
        prop_oneof![3 => Just(None), 1 => (0u64..2_000_000).prop_map(Some)],
    )
        .prop_map(
            |(lookahead, staging_buffers, max_lookahead, storage, compute, max_vram, free, act)| {
                PlanOptions {
                    lookahead,
                    staging_buffers,
                    max_lookahead,
                    storage_dtype: storage,
                    compute_dtype: compute,
                    max_vram,
                    min_free_ram: MinFreeRam::Bytes(free),
                    activation_vram: act,
                    ..PlanOptions::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_cpu_plan_fits_and_is_never_worse_than_the_bound(
        model in model(),
        options in options(),
        // Budgets from nothing to a little over the whole model and its staging, most of them
        // near the model's size, where the tiers are decided.
        fraction in prop_oneof![0.0f64..1.6, 0.6f64..1.2, 0.6f64..1.2],
        forced in prop_oneof![4 => Just(None), 1 => (0usize..=8).prop_map(Some)],
    ) {
        let total: u64 = model.blocks.iter().flat_map(|b| &b.tensors).chain(&model.outside)
            .map(|t| t.file_bytes).sum();
        let ram = (total as f64 * fraction) as u64;
        let options = PlanOptions { resident_blocks: forced, ..options };
        let figures = Figures::injected(ram, None);
        let p = plan(&model, &figures, &options).unwrap();
        let bound = by_the_bound(&model, &figures, &options);
        let b = budgets(&p);
        if forced.is_none() {
            // Nothing resident and everything on disk always fits on the CPU; so must the plan,
            // and the exact assignment alone.
            prop_assert!(fits(&prefix_on_disk(&p, 0)));
            prop_assert!(fits(b), "{b:?}\n{p}");
            prop_assert!(b.device_used >= budgets(&bound).device_used);
            let exact = by_exact_budgets(&mut p.blocks.clone(), &p.outside, &figures, &p.options);
            prop_assert!(fits(&budgets_in(&p, |i| exact[i])));
            // No more blocks resident fit with the others in the form that holds least.
            let resident = p.blocks_in(Tier::Device).len();
            for k in resident + 1..=p.blocks.len() {
                prop_assert!(!fits(&prefix_on_disk(&p, k)), "{k} resident fit\n{p}");
            }
        }
        prop_assert!(rank(&p) >= rank(&bound), "{:?} < {:?}\n{p}\n{bound}", rank(&p), rank(&bound));
        if rank(&p) == rank(&bound) {
            prop_assert_eq!(tiers(&p), tiers(&bound));
        }
    }

    #[test]
    fn a_gpu_plan_is_the_bound_s(
        model in model(),
        options in options(),
        ram_fraction in 0.0f64..1.6,
        vram_fraction in 0.0f64..1.6,
        forced in prop_oneof![4 => Just(None), 1 => (0usize..=8).prop_map(Some)],
        cpu_device in any::<bool>(),
    ) {
        let total: u64 = model.blocks.iter().flat_map(|b| &b.tensors).chain(&model.outside)
            .map(|t| t.file_bytes).sum();
        let options = PlanOptions { resident_blocks: forced, headroom_vram: 0, ..options };
        let vram = CUDA_CONTEXT_FLOOR + (total as f64 * vram_fraction) as u64;
        let mut figures = Figures::injected((total as f64 * ram_fraction) as u64, Some(vram));
        if cpu_device {
            // A device tier the CPU holds, sized as a GPU's (`plan(device="cpu", vram=...)`).
            figures = figures.on_cpu();
        }
        let p = plan(&model, &figures, &options).unwrap();
        let bound = by_the_bound(&model, &figures, &options);
        prop_assert_eq!(tiers(&p), tiers(&bound));
    }
}
