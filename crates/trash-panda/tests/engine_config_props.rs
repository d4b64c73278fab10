//! A plan is a promise: for random blocks (bf16, f32, fp8 with each scale layout, with and
//! without a storage dtype), lookaheads and tiers, the engine made from the plan's
//! configuration allocates exactly the host staging the plan counts, and no block needs more
//! device slot or expansion than the plan counts; what a pipeline counts the stage as holding
//! (`pipeline::Holds`) is what the engine holds.

mod common;

use proptest::prelude::*;

use trash_panda::engine_config::{EngineConfig, EngineSettings};
use trash_panda::pipeline::Holds;
use trash_panda::plan::{plan, Figures, MinFreeRam, ModelBlocks, PlanOptions, Selector};
use trash_panda::rules::{
    expansion_layout, paired_scale, storage_conversion, Conversion, ExpansionInput, TensorSizes,
    Tier,
};
use trash_panda::stream::{Engine, RamSource, SourceTier, StreamBlock, StreamTensor};
use trash_panda::DType;

#[derive(Debug, Clone)]
struct WeightSpec {
    rows: usize,
    cols: usize,
    dtype: DType,
    /// 0 none, 1 per tensor, 2 per row, 3 per 128x128 block (fp8 only).
    scale: u8,
    /// A gap before the tensor in the file, in 8-byte steps.
    gap: u64,
}

fn weight() -> impl Strategy<Value = WeightSpec> {
    (
        prop_oneof![1usize..300, Just(1024usize)],
        1usize..300,
        prop_oneof![Just(DType::BF16), Just(DType::F32), Just(DType::F8E4M3)],
        0u8..4,
        0u64..600,
    )
        .prop_map(|(rows, cols, dtype, scale, gap)| WeightSpec {
            // A 1024-row weight is made wide enough for storage_dtype="fp8" to quantize it.
            cols: if rows == 1024 { 1024 } else { cols },
            rows,
            dtype,
            scale: if dtype.is_fp8() { scale } else { 0 },
            gap,
        })
}

/// The checkpoint's tensors, laid out one after the other with gaps from `first`.
fn tensors(blocks: &[Vec<WeightSpec>], first: u64) -> (Vec<TensorSizes>, u64) {
    let mut at = first;
    let mut out = Vec::new();
    let mut put = |name: String, dtype: DType, shape: &[usize], gap: u64, out: &mut Vec<_>| {
        at += gap * 8;
        let t = TensorSizes::new(name, dtype, shape).at(0, at);
        at += t.file_bytes;
        out.push(t);
    };
    put("embed.weight".into(), DType::BF16, &[64, 32], 0, &mut out);
    for (b, weights) in blocks.iter().enumerate() {
        for (k, w) in weights.iter().enumerate() {
            let p = format!("model.layers.{b}.w{k}");
            put(
                format!("{p}.weight"),
                w.dtype,
                &[w.rows, w.cols],
                w.gap,
                &mut out,
            );
            let grid = [w.rows.div_ceil(128), w.cols.div_ceil(128)];
            match w.scale {
                1 => put(format!("{p}.weight_scale"), DType::F32, &[1], 0, &mut out),
                2 => put(
                    format!("{p}.weight_scale"),
                    DType::F32,
                    &[w.rows],
                    0,
                    &mut out,
                ),
                3 => put(
                    format!("{p}.weight_scale_inv"),
                    DType::F32,
                    &grid,
                    0,
                    &mut out,
                ),
                _ => {}
            }
        }
        put(
            format!("model.layers.{b}.norm.weight"),
            DType::BF16,
            &[48],
            1,
            &mut out,
        );
    }
    (out, at)
}

/// What a backend expands for a block in its tier, by the rule it follows.
fn expansion_needed(
    tensors: &[&TensorSizes],
    tier: Tier,
    compute: DType,
    storage: Option<DType>,
    align: usize,
) -> u64 {
    let names = || tensors.iter().map(|t| t.name.as_str());
    let inputs: Vec<ExpansionInput> = tensors
        .iter()
        .filter(|t| !t.is_scale())
        .map(|t| {
            let conv = match (tier, storage) {
                (Tier::Disk, _) | (_, None) => Conversion::Keep,
                (_, Some(s)) => storage_conversion(t, s),
            };
            let (held, own) = match conv {
                Conversion::Keep => (t.dtype, false),
                Conversion::ToBf16 => (DType::BF16, false),
                Conversion::ToFp8 { .. } => (DType::F8E4M3, true),
                Conversion::ToInt8 { .. } => (DType::I8, true),
                Conversion::ToQ8_0 => (DType::Q8_0, false),
            };
            ExpansionInput {
                held,
                elements: t.numel(),
                scaled: own || paired_scale(&t.name, names()).is_some(),
                reordered: t.reordered,
            }
        })
        .collect();
    expansion_layout(&inputs, compute, align).1
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn the_engine_allocates_what_the_plan_counts(
        blocks in proptest::collection::vec(proptest::collection::vec(weight(), 1..4), 2..5),
        tiers in proptest::collection::vec(0u8..3, 5),
        lookahead in 0usize..=4,
        pinned in prop_oneof![Just(None), (1usize..=5).prop_map(Some)],
        max_look in prop_oneof![Just(None), (1usize..=6).prop_map(Some)],
        storage in prop_oneof![Just(None), Just(Some(DType::BF16)), Just(Some(DType::F8E4M3))],
        compute in prop_oneof![Just(DType::BF16), Just(DType::F32)],
        gpu in any::<bool>(),
        in_memory in any::<bool>(),
        first in 0u64..5000,
    ) {
        let dir = common::Dir::new("engine_config_props");
        let (sizes, end) = tensors(&blocks, first * 8);
        let path = dir.0.join("model.safetensors");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(end + 4096).unwrap();
        drop(file);

        let model = ModelBlocks::discover(sizes.clone());
        prop_assert_eq!(model.blocks.len(), blocks.len());
        let options = PlanOptions {
            min_free_ram: MinFreeRam::Bytes(0),
            compute_dtype: Some(compute),
            storage_dtype: storage,
            lookahead,
            staging_buffers: pinned,
            max_lookahead: max_look,
            // The plan is made with the setting the engine reads: a RAM tier read into memory
            // stages its blocks, a mapped one on the CPU runs them in place.
            ram_in_memory: in_memory,
            ..PlanOptions::default()
        };
        let figures = Figures::injected(1 << 40, gpu.then_some(1 << 40));
        let mut p = plan(&model, &figures, &options).unwrap();
        for (i, t) in tiers.iter().take(blocks.len()).enumerate() {
            let tier = [Tier::Device, Tier::Ram, Tier::Disk][*t as usize];
            p.assign(tier, &Selector::Indices(vec![i])).unwrap();
        }
        let budgets = p.budgets.clone().unwrap();
        let settings = EngineSettings::resolve(|var| {
            (in_memory && var == "TRASH_PANDA_RAM_IN_MEMORY").then(|| "1".to_string())
        })
        .unwrap();
        let config = EngineConfig::from_plan(&p, &settings).unwrap();
        let read_in = matches!(config.ram_source, RamSource::InMemory { .. });
        prop_assert!(read_in || !in_memory, "TRASH_PANDA_RAM_IN_MEMORY=1 did not read the RAM tier in");
        prop_assert_eq!(config.held, budgets.held());

        // Every block's expansion, in its tier, fits the expansion buffer.
        for (b, bp) in model.blocks.iter().zip(&p.blocks) {
            let ts: Vec<&TensorSizes> = b.tensors.iter().collect();
            let need = expansion_needed(&ts, bp.tier, compute, storage, config.align);
            prop_assert!(need <= budgets.expansion, "{} needs {need} > {}", bp.name, budgets.expansion);
        }

        let streamed: Vec<StreamBlock> = model
            .blocks
            .iter()
            .zip(&p.blocks)
            .filter(|(_, bp)| bp.tier != Tier::Device)
            .map(|(b, bp)| StreamBlock {
                name: b.name.clone(),
                tier: if bp.tier == Tier::Ram { SourceTier::Ram } else { SourceTier::Disk },
                tensors: b
                    .tensors
                    .iter()
                    .map(|t| {
                        let at = t.location.unwrap().start;
                        StreamTensor {
                            name: t.name.clone(),
                            file: 0,
                            start: at,
                            end: at + t.file_bytes,
                            dtype: t.dtype,
                            shape: t.shape.clone(),
                            rows: None,
                        }
                    })
                    .collect(),
            })
            .collect();
        if streamed.is_empty() {
            prop_assert_eq!((budgets.staging_buffers, budgets.host_staging, budgets.device_slot_bytes), (0, 0, 0));
            return Ok(());
        }
        let n = streamed.len();
        let engine = Engine::new(streamed, vec![path.clone()], config.engine_options()).unwrap();
        let buffers = engine.staging_buffers();
        prop_assert_eq!(buffers.len(), budgets.staging_buffers);
        prop_assert!(buffers.iter().all(|b| b.1 as u64 == budgets.staging_buffer_bytes));
        prop_assert_eq!(engine.staging_bytes() as u64, budgets.host_staging);
        // TRASH_PANDA_PINNED_BUFFERS when given, else one per block staged ahead at the deepest
        // the staging may grow (TRASH_PANDA_MAX_LOOKAHEAD, never below the look-ahead) plus the
        // one that runs.
        let deepest = max_look.map_or(lookahead, |m| m.max(lookahead));
        let want = pinned.unwrap_or(deepest + 1);
        prop_assert_eq!(buffers.len(), want);
        prop_assert_eq!(budgets.device_slots, if gpu { want } else { 0 });
        prop_assert_eq!(budgets.device_slot_bytes, budgets.device_slots as u64 * budgets.staging_buffer_bytes);
        // The engine grows its depth only within those buffers (one runs, the rest stage ahead),
        // never below the look-ahead, and not at all without a maximum.
        let cap = engine.max_depth();
        prop_assert!(cap <= deepest && cap >= lookahead);
        prop_assert!(cap <= (want - 1).max(lookahead));
        if max_look.is_none() {
            prop_assert_eq!(cap, lookahead);
        }
        engine.load_ram_tier().unwrap();
        // What a pipeline counts this stage as holding (and giving back on release) is what
        // the engine holds: the staging pool and the RAM tier read into memory, beside the
        // weights and buffers the binding allocates by the plan's figures.
        let images: u64 = (0..n)
            .map(|b| engine.ram_image(b).unwrap().map_or(0, |im| im.bytes().len() as u64))
            .sum();
        let holds = Holds::of("model", &p, &config).unwrap();
        let weights = budgets.device_used + budgets.outside;
        let private = engine.staging_bytes() as u64 + images;
        if gpu {
            prop_assert_eq!(holds.ram, private);
            prop_assert_eq!(holds.vram, weights + budgets.device_slot_bytes + budgets.expansion);
        } else {
            prop_assert_eq!(holds.ram, private + weights + budgets.expansion);
            prop_assert_eq!(holds.vram, 0);
        }
        // Each block is really staged within its buffer (a device slot copies these bytes).
        for b in 0..n {
            let lease = engine.acquire(b).unwrap();
            prop_assert!(lease.bytes().len() as u64 <= budgets.staging_buffer_bytes);
            prop_assert!(lease.layout().iter().all(|t| t.offset % config.align == 0));
        }
    }
}
