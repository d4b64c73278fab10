//! Plans pinned for whole models with injected memory figures.
//!
//! A GPU's free VRAM is written `x + CUDA_CONTEXT_FLOOR` where a scenario is about the `x` the
//! plan has for itself once the CUDA runtime's floor is set aside.

mod common;

use common::plan_model::{decoder, kinds, opts, tiers, SIDE};
use trash_panda::plan::{
    plan, Figures, MinFreeRam, ModelBlocks, PlanError, PlanOptions, Selector, TensorSizes, Tier,
    WarningKind, CUDA_CONTEXT_FLOOR,
};
use trash_panda::rules::{maps_disk_tier, LOADER_RING_BYTES};
use trash_panda::sys::{CgroupMemory, MemoryFigures, SysRoots};
use trash_panda::DType;

#[test]
fn bf16_fill_order_and_budgets() {
    let m = decoder(10, DType::BF16);
    assert_eq!(m.blocks.len(), 10);
    assert_eq!(m.outside.len(), 2);
    let block = 200_020_000;
    // A staging buffer holds the block at aligned offsets, rounded to whole pages.
    let buffer = 200_024_064;
    // 4.7 GB - 1.0 CUDA floor - 1.5 headroom - 3 x 0.2 device slots - 0.2 outside leaves 1.4 GB
    // less a little: six blocks (bf16 blocks computing in bf16 are used in place: no expansion).
    // All ten would free the slots but need 3.7002 GB beside the floor. One fits in RAM after
    // the 3-buffer staging pool and the loader's pinned ring, three go to disk.
    let vram = 3_700_000_000 + CUDA_CONTEXT_FLOOR;
    let p = plan(&m, &Figures::injected(1_000_000_000, Some(vram)), &opts()).unwrap();
    assert_eq!(tiers(&p), "DDDDDDRKKK");
    let b = p.budgets.as_ref().unwrap();
    assert_eq!((b.device_limit, b.cuda_floor), (vram, CUDA_CONTEXT_FLOOR));
    assert_eq!((b.staging_buffers, b.staging_buffer_bytes), (3, buffer));
    assert_eq!((b.device_slots, b.device_slot_bytes), (3, 3 * buffer));
    assert_eq!(b.host_staging, 3 * buffer);
    assert_eq!(b.expansion, 0);
    assert_eq!(b.outside, 200_020_000);
    assert_eq!(
        b.device_budget,
        vram - CUDA_CONTEXT_FLOOR - 1_500_000_000 - 3 * buffer - 200_020_000
    );
    assert_eq!(b.device_used, 6 * block);
    assert_eq!(b.loader_ring, LOADER_RING_BYTES);
    assert_eq!(b.ram_budget, 1_000_000_000 - 3 * buffer - LOADER_RING_BYTES);
    assert_eq!((b.ram_used, b.disk_bytes), (block, 3 * block));
    assert_eq!(kinds(&p), ["spills", "headroom"]);
    assert!(p.warnings[0].message.contains("3 block(s) (600.06 MB)"));
    // The floor is the CUDA runtime's: 3.7 GB free leaves 0.4 GB for resident blocks, one.
    let p = plan(
        &m,
        &Figures::injected(1_000_000_000, Some(3_700_000_000)),
        &opts(),
    )
    .unwrap();
    assert_eq!(tiers(&p), "DRKKKKKKKK");
    // Without a GPU there is no CUDA runtime, and no floor.
    let cpu = plan(&m, &Figures::injected(8_000_000_000, None), &opts()).unwrap();
    assert_eq!(cpu.budgets.unwrap().cuda_floor, 0);
}

#[test]
fn everything_resident_frees_the_staging() {
    // With all ten resident nothing streams, so the staging slots are free again: ten fit
    // where nine would not.
    let m = decoder(10, DType::BF16);
    let p = plan(
        &m,
        &Figures::injected(1_000_000_000, Some(4_000_000_000 + CUDA_CONTEXT_FLOOR)),
        &opts(),
    )
    .unwrap();
    assert_eq!(tiers(&p), "DDDDDDDDDD");
    let b = p.budgets.unwrap();
    assert_eq!(
        (b.staging_buffers, b.device_slot_bytes, b.host_staging),
        (0, 0, 0)
    );
}

#[test]
fn fp32_checkpoint_expands_to_bf16() {
    let m = decoder(4, DType::F32);
    let p = plan(
        &m,
        &Figures::injected(10_000_000_000, Some(3_000_000_000 + CUDA_CONTEXT_FLOOR)),
        &opts(),
    )
    .unwrap();
    let b0 = &p.blocks[0];
    assert_eq!(
        (b0.file_bytes, b0.expanded_bytes),
        (400_040_000, 200_020_000)
    );
    // 3.0 (beside the floor) - 1.5 - 0.8 staging - 0.2 expanded - 0.2 outside = 0.3 GB: nothing fits; all in RAM.
    assert_eq!(tiers(&p), "RRRR");
    assert_eq!(kinds(&p), ["nothing_fits", "headroom"]);
    // compute_dtype f32 doubles the expansion.
    let f32_opts = PlanOptions {
        compute_dtype: Some(DType::F32),
        ..opts()
    };
    let p = plan(
        &m,
        &Figures::injected(10_000_000_000, Some(3_000_000_000 + CUDA_CONTEXT_FLOOR)),
        &f32_opts,
    )
    .unwrap();
    assert_eq!(p.blocks[0].expanded_bytes, 400_040_000);
    assert_eq!(p.budgets.unwrap().outside, 400_040_000);
}

#[test]
fn fp8_with_scales_counts_fp8_and_expands_to_bf16() {
    let m = decoder(6, DType::F8E4M3);
    assert_eq!(m.blocks[0].tensors.len(), 4, "scales belong to their block");
    let stored = 100_000_000 + 40_000 + 4 + 20_000;
    let p = plan(
        &m,
        &Figures::injected(
            500_000_000 + LOADER_RING_BYTES,
            Some(2_500_000_000 + CUDA_CONTEXT_FLOOR),
        ),
        &opts(),
    )
    .unwrap();
    let b0 = &p.blocks[0];
    assert_eq!(b0.file_bytes, stored);
    // The fp8 weight is expanded into the expansion buffer; the bf16 norm is used in place.
    assert_eq!(b0.expansion.disk, 200_000_000);
    assert_eq!(
        b0.expanded_bytes,
        200_000_000 + 20_000,
        "scales dropped, bf16"
    );
    // 2.5 (beside the floor) - 1.5 - 3 x 0.1 slots - 0.2 expansion - 0.2 outside = 0.3 GB less a little: two
    // blocks of 0.1 GB (three would need 0.30018 GB; all six, with no slots, 0.60036); RAM
    // (0.5 - 0.3 staging, beside the loader's ring) holds one more.
    assert_eq!(tiers(&p), "DDRKKK");
    let b = p.budgets.as_ref().unwrap();
    assert_eq!(b.expansion, 200_000_000);
    assert_eq!(b.host_staging, 3 * b.staging_buffer_bytes);
    assert!(b.staging_buffer_bytes >= stored && b.staging_buffer_bytes.is_multiple_of(4096));
    assert_eq!(b.device_used, 2 * stored);
    assert_eq!(b.ram_budget, 500_000_000 - b.host_staging);
    assert_eq!(p.blocks[5].stored_bytes, stored, "fp8 on disk");
}

#[test]
fn storage_dtype_bf16_and_fp8() {
    let m = decoder(4, DType::F32);
    let bf16 = PlanOptions {
        storage_dtype: Some(DType::BF16),
        ..opts()
    };
    let p = plan(
        &m,
        &Figures::injected(10_000_000_000, Some(3_000_000_000)),
        &bf16,
    )
    .unwrap();
    assert_eq!(p.blocks[0].storage_bytes, 200_020_000);
    assert_eq!(p.blocks[0].stored_bytes, 200_020_000, "RAM tier in bf16");
    let fp8 = PlanOptions {
        storage_dtype: Some(DType::F8E4M3),
        ..opts()
    };
    let p = plan(
        &m,
        &Figures::injected(10_000_000_000, Some(3_000_000_000)),
        &fp8,
    )
    .unwrap();
    // The 2-D weight is 1 byte per element plus a f32 scale per row; the norm stays f32.
    assert_eq!(p.blocks[0].storage_bytes, 100_000_000 + 40_000 + 40_000);
    // int8 stores the same: a byte per element and an f32 scale per row.
    let int8 = PlanOptions {
        storage_dtype: Some(DType::I8),
        ..opts()
    };
    let p = plan(&m, &Figures::injected(10_000_000_000, None), &int8).unwrap();
    assert_eq!(p.blocks[0].storage_bytes, 100_000_000 + 40_000 + 40_000);
    // q8_0: 34 bytes per 32 weights, for rows of whole blocks only.
    let q8 = PlanOptions {
        storage_dtype: Some(DType::Q8_0),
        ..opts()
    };
    let p = plan(&m, &Figures::injected(10_000_000_000, None), &q8).unwrap();
    assert_eq!(
        p.blocks[0].storage_bytes, p.blocks[0].file_bytes,
        "10000 is not 32s"
    );
    let wide = ModelBlocks::discover(vec![
        TensorSizes::new("b.0.w", DType::F32, &[1024, 2048]),
        TensorSizes::new("b.1.w", DType::F32, &[1024, 2048]),
    ]);
    let p = plan(&wide, &Figures::injected(10_000_000_000, None), &q8).unwrap();
    assert_eq!(p.blocks[0].storage_bytes, 1024 * 2048 / 32 * 34);
    // A GPU counts the GGML expansions' scratch for blocks holding GGML blocks; the CPU does not.
    for (gpu, want) in [
        (true, trash_panda::rules::GGML_DEVICE_SCRATCH_BYTES),
        (false, 0),
    ] {
        let p = plan(
            &wide,
            &Figures::injected(10_000_000_000, gpu.then_some(20_000_000_000)),
            &q8,
        )
        .unwrap();
        let b = p.budgets.as_ref().unwrap();
        assert_eq!(b.device_scratch, want, "gpu {gpu}");
        assert!(p.blocks.iter().all(|b| b.ggml));
    }
    // Small 2-D weights are left alone.
    let small = ModelBlocks::discover(vec![
        TensorSizes::new("b.0.w", DType::F32, &[100, 100]),
        TensorSizes::new("b.1.w", DType::F32, &[100, 100]),
    ]);
    let p = plan(&small, &Figures::injected(10_000_000_000, None), &fp8).unwrap();
    assert_eq!(p.blocks[0].storage_bytes, 40_000);
    let err = plan(
        &m,
        &Figures::injected(1, None),
        &PlanOptions {
            storage_dtype: Some(DType::U8),
            ..opts()
        },
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::StorageDtype { .. }), "{err}");
    // The engine quantizes to e4m3fn only, so the planner must not count e5m2 as possible.
    let err = plan(
        &m,
        &Figures::injected(1, None),
        &PlanOptions {
            storage_dtype: Some(DType::F8E5M2),
            ..opts()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("e4m3fn"), "{err}");
    let err = plan(
        &m,
        &Figures::injected(1, None),
        &PlanOptions {
            compute_dtype: Some(DType::F8E4M3),
            ..opts()
        },
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::ComputeDtype { .. }), "{err}");
}

#[test]
fn resident_blocks_forces_and_warns() {
    let m = decoder(10, DType::BF16);
    let f = Figures::injected(10_000_000_000, Some(3_900_000_000));
    let p = plan(
        &m,
        &f,
        &PlanOptions {
            resident_blocks: Some(2),
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(tiers(&p), "DDRRRRRRRR");
    let p = plan(
        &m,
        &f,
        &PlanOptions {
            resident_blocks: Some(9),
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(tiers(&p), "DDDDDDDDDR");
    assert_eq!(kinds(&p), ["device_over", "headroom"]);
    let p = plan(
        &m,
        &f,
        &PlanOptions {
            resident_blocks: Some(99),
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(p.blocks_in(Tier::Device).len(), 10);
}

#[test]
fn max_vram_headroom_and_activation_vram() {
    let m = decoder(10, DType::BF16);
    let f = Figures::injected(10_000_000_000, Some(40_000_000_000));
    // The cap is on what the process takes on the GPU: the CUDA floor comes out of it too.
    let cap = 3_700_000_000 + CUDA_CONTEXT_FLOOR;
    let capped = plan(
        &m,
        &f,
        &PlanOptions {
            max_vram: Some(cap),
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(tiers(&capped), "DDDDDDRRRR");
    assert_eq!(capped.budgets.unwrap().device_limit, cap);
    let small_headroom = PlanOptions {
        max_vram: Some(cap),
        headroom_vram: 1_300_000_000,
        ..opts()
    };
    let p = plan(&m, &f, &small_headroom).unwrap();
    assert_eq!(tiers(&p), "DDDDDDDDDD");
    let measured = PlanOptions {
        max_vram: Some(cap),
        headroom_vram: 0,
        activation_vram: Some(1_600_000_000),
        ..opts()
    };
    let p = plan(&m, &f, &measured).unwrap();
    assert_eq!(
        tiers(&p),
        "DDDDDDRRRR",
        "the measurement replaces headroom_vram"
    );
    let b = p.budgets.as_ref().unwrap();
    assert!(b.reserve_measured && b.reserve == 1_600_000_000);
    assert!(kinds(&p).is_empty(), "{:?}", p.warnings);
}

#[test]
fn min_free_ram_auto_and_explicit() {
    assert_eq!(MinFreeRam::Auto.resolve(16_000_000_000), 1_280_000_000);
    assert_eq!(MinFreeRam::Auto.resolve(4_000_000_000), 1_000_000_000);
    assert_eq!(MinFreeRam::Auto.resolve(256_000_000_000), 4_000_000_000);
    assert_eq!("auto".parse::<MinFreeRam>().unwrap(), MinFreeRam::Auto);
    assert_eq!(
        "4GB".parse::<MinFreeRam>().unwrap(),
        MinFreeRam::Bytes(4_000_000_000)
    );
    let m = decoder(10, DType::BF16);
    let mut figures = Figures::injected(3_000_000_000, Some(2_000_000_000));
    figures.memory.total_ram = 16_000_000_000;
    let auto = PlanOptions {
        min_free_ram: MinFreeRam::Auto,
        ..opts()
    };
    let p = plan(&m, &figures, &auto).unwrap();
    let b = p.budgets.as_ref().unwrap();
    assert_eq!(b.min_free_ram, 1_280_000_000);
    assert_eq!(
        b.ram_budget,
        3_000_000_000 - 1_280_000_000 - 3 * 200_024_064 - LOADER_RING_BYTES
    );
    // 0.99 GB: four blocks of 0.2 GB.
    assert_eq!(tiers(&p), "RRRRKKKKKK");
    let explicit = PlanOptions {
        min_free_ram: MinFreeRam::Bytes(2_500_000_000),
        ..opts()
    };
    let p = plan(&m, &figures, &explicit).unwrap();
    assert_eq!(tiers(&p), "KKKKKKKKKK");
    // 3.0 - 2.5 - 0.6 staging leaves nothing: not one block.
    assert_eq!(p.budgets.as_ref().unwrap().ram_budget, 0);
    assert_eq!(
        kinds(&p),
        ["nothing_fits", "spills", "block_too_large", "headroom"]
    );
}

#[test]
fn lookahead_sizes_the_staging() {
    let m = decoder(10, DType::BF16);
    let f = Figures::injected(10_000_000_000, Some(3_500_000_000 + CUDA_CONTEXT_FLOOR));
    let p = plan(
        &m,
        &f,
        &PlanOptions {
            lookahead: 4,
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(
        p.budgets.as_ref().unwrap().device_slot_bytes,
        5 * 200_024_064
    );
    assert_eq!(tiers(&p), "DDDRRRRRRR");
    // Lookahead 0 still needs one buffer for the block that runs.
    let p = plan(
        &m,
        &f,
        &PlanOptions {
            lookahead: 0,
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(p.budgets.as_ref().unwrap().device_slot_bytes, 200_024_064);
    assert_eq!(tiers(&p), "DDDDDDDRRR");
}

#[test]
fn block_larger_than_the_device() {
    let m = decoder(3, DType::BF16);
    let p = plan(
        &m,
        &Figures::injected(10_000_000_000, Some(2_000_000_000)),
        &opts(),
    )
    .unwrap();
    // 2.0 - 1.0 CUDA floor - 1.5 - 0.2 outside leaves nothing; one slot plus the expansion
    // needs 0.4 GB.
    assert_eq!(kinds(&p), ["nothing_fits", "block_too_large", "headroom"]);
    let w = &p.warnings[1];
    assert!(
        matches!(&w.kind, WarningKind::BlockLargerThanDevice { block, needed: 400_040_000, .. }
        if block == "model.layers.0.")
    );
}

#[test]
fn cgroup_limit_from_a_fake_tree() {
    let dir = tempfile::tempdir().unwrap();
    let roots = SysRoots::under(dir.path());
    let write = |p: std::path::PathBuf, t: &str| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, t).unwrap();
    };
    write(
        roots.proc.join("meminfo"),
        "MemTotal: 62500000 kB\nMemAvailable: 50000000 kB\n",
    );
    write(roots.proc.join("self/cgroup"), "0::/job\n");
    write(roots.sys.join("fs/cgroup/cgroup.controllers"), "memory\n");
    write(roots.sys.join("fs/cgroup/job/memory.max"), "2000000000\n");
    write(
        roots.sys.join("fs/cgroup/job/memory.current"),
        "500000000\n",
    );
    let memory = MemoryFigures::probe_at(&roots).unwrap();
    assert_eq!(memory.usable_ram(), 1_500_000_000);
    let figures = Figures {
        memory,
        free_vram: Some(1_000_000_000),
        device: None,
    };
    let p = plan(&decoder(4, DType::BF16), &figures, &opts()).unwrap();
    assert_eq!(
        p.budgets.as_ref().unwrap().ram_budget,
        1_500_000_000 - 3 * 200_024_064 - LOADER_RING_BYTES
    );
    assert!(kinds(&p).contains(&"cgroup"), "{:?}", kinds(&p));
    // 0.77 GB: three blocks of 0.2 GB.
    assert_eq!(tiers(&p), "RRRK");
    // The same limit filled in by hand.
    let mut memory = MemoryFigures::with_ram(64_000_000_000);
    memory.cgroup = Some(CgroupMemory {
        version: 2,
        path: "/x".into(),
        limit: 8_000_000_000,
        usage: None,
    });
    assert_eq!(memory.usable_ram(), 8_000_000_000);
}

#[test]
fn cpu_is_the_device_without_a_gpu() {
    let m = decoder(10, DType::BF16);
    let p = plan(&m, &Figures::injected(2_000_000_000, None), &opts()).unwrap();
    let b = p.budgets.as_ref().unwrap();
    assert!(!b.gpu);
    assert_eq!((b.reserve, b.device_slots, b.device_slot_bytes), (0, 0, 0));
    // Where disk-tier blocks are used in place (Linux), the disk tier stages nothing and holds
    // the mapped window of one block (0.2 GB and a few huge pages): 2.0 GB - 0.2 outside - 0.21
    // window leaves 1.59 GB, seven blocks resident; one more in RAM would stage whole blocks
    // (3 x 0.2 GB), so the rest stays on disk. Elsewhere the disk tier is staged: 2.0 GB - 0.6
    // staging - 0.2 outside = 1.2 GB: five blocks resident, nothing left for the RAM tier.
    let want = if maps_disk_tier(false) {
        "DDDDDDDKKK"
    } else {
        "DDDDDKKKKK"
    };
    assert_eq!(tiers(&p), want);
    assert!(b.device_used <= b.device_budget && b.ram_used <= b.ram_budget);
    assert_eq!(
        b.mapped_window > 0,
        maps_disk_tier(false),
        "a block used in place is counted"
    );
    assert_eq!(kinds(&p), ["spills"], "no VRAM headroom warning on the CPU");
    let capped = PlanOptions {
        resident_blocks: Some(2),
        ..opts()
    };
    let p = plan(&m, &Figures::injected(2_000_000_000, None), &capped).unwrap();
    // Where blocks are used in place, RAM-tier ones too stage nothing: 2.0 GB - 0.2 outside -
    // 0.4 resident - 0.21 window leaves room for five in RAM.
    let want = if maps_disk_tier(false) {
        "DDRRRRRKKK"
    } else {
        "DDRRRKKKKK"
    };
    assert_eq!(tiers(&p), want);
    // Forced past the RAM it has, on the CPU the warning speaks of RAM, not of a GPU.
    let forced = PlanOptions {
        resident_blocks: Some(10),
        ..opts()
    };
    let p = plan(&m, &Figures::injected(1_000_000_000, None), &forced).unwrap();
    let over = p
        .warnings
        .iter()
        .find(|w| matches!(w.kind, WarningKind::DeviceOverBudget { .. }))
        .expect("a forced device tier past its budget warns");
    assert!(
        over.message.contains("of RAM") && !over.message.contains("GPU"),
        "{}",
        over.message
    );
    assert!(p.warnings.iter().all(|w| !w.message.contains("CUDA")));
}

#[test]
fn diffusion_model_with_two_block_lists() {
    let mut ts = vec![
        TensorSizes::new("img_in.weight", DType::BF16, &[3072, 64]),
        TensorSizes::new("txt_in.weight", DType::BF16, &[3072, 4096]),
        TensorSizes::new("time_in.0.weight", DType::BF16, &[3072, 256]),
    ];
    for i in 0..3 {
        ts.push(TensorSizes::new(
            format!("double_blocks.{i}.img_attn.qkv.weight"),
            DType::BF16,
            &[SIDE, SIDE],
        ));
        ts.push(TensorSizes::new(
            format!("double_blocks.{i}.txt_attn.qkv.weight"),
            DType::BF16,
            &[SIDE, SIDE],
        ));
    }
    for i in 0..12 {
        ts.push(TensorSizes::new(
            format!("single_blocks.{i}.linear1.weight"),
            DType::BF16,
            &[SIDE, SIDE],
        ));
    }
    ts.push(TensorSizes::new(
        "final_layer.linear.weight",
        DType::BF16,
        &[64, 3072],
    ));
    let m = ModelBlocks::discover(ts);
    assert_eq!(m.blocks.len(), 15);
    assert_eq!(m.blocks[2].name, "double_blocks.2.");
    assert_eq!(m.blocks[3].name, "single_blocks.0.");
    assert_eq!(m.blocks[14].name, "single_blocks.11.");
    assert_eq!(m.outside.len(), 4, "a lone time_in.0. is not a block list");
    let p = plan(
        &m,
        &Figures::injected(2_000_000_000, Some(4_000_000_000 + CUDA_CONTEXT_FLOOR)),
        &opts(),
    )
    .unwrap();
    // With a double block streamed the slots are 3 x 0.4 GB and only one fits; once all three
    // double blocks are resident only single blocks stream, the slots halve, and three single
    // blocks fit too: 4.0 (beside the floor) - 1.5 - 3 x 0.2 slots - 0.03 outside >= 1.8 GB
    // (bf16 blocks need no expansion).
    assert_eq!(tiers(&p), "DDDDDDRRRRRRKKK");
    let table = p.to_string();
    assert!(
        table.contains("double_blocks.0-2, single_blocks.0-2"),
        "{table}"
    );
    assert!(table.contains("single_blocks.3-8"), "{table}");
    assert!(table.contains("single_blocks.9-11"), "{table}");
}

#[test]
fn adapters_take_their_memory_beside_the_outside_weights() {
    let m = decoder(10, DType::BF16);
    let vram = 3_700_000_000 + CUDA_CONTEXT_FLOOR;
    let figures = Figures::injected(8_000_000_000, Some(vram));
    let bare = plan(&m, &figures, &opts()).unwrap();
    // One block's worth of LoRA matrices on the device: one resident block fewer.
    let adapters = 200_020_000;
    let options = PlanOptions {
        adapter_bytes: adapters,
        ..opts()
    };
    let with = plan(&m, &figures, &options).unwrap();
    let (b, w) = (bare.budgets.clone().unwrap(), with.budgets.clone().unwrap());
    assert_eq!((b.adapters, w.adapters), (0, adapters));
    assert_eq!(w.outside, b.outside);
    assert_eq!(w.device_budget, b.device_budget - adapters);
    assert_eq!(tiers(&bare), "DDDDDDRRRR");
    assert_eq!(tiers(&with), "DDDDDRRRRR");
    let table = with.to_string();
    assert!(
        table.contains("adapters") && table.contains("- adapters 200.02 MB"),
        "{table}"
    );
    // On the CPU the device tier and the RAM tier share the pool: the adapters come out of it.
    let cpu = Figures::injected(3_000_000_000, None);
    let (b, w) = (
        plan(&m, &cpu, &opts()).unwrap().budgets.unwrap(),
        plan(&m, &cpu, &options).unwrap().budgets.unwrap(),
    );
    assert_eq!(
        w.device_budget + w.device_used,
        b.device_budget + b.device_used - adapters
    );
    // A plan written without adapters reads back as it was, and one with them keeps them.
    let again: trash_panda::plan::Plan =
        serde_json::from_str(&serde_json::to_string(&with).unwrap()).unwrap();
    assert_eq!(again.budgets.unwrap().adapters, adapters);
    assert!(!serde_json::to_string(&bare)
        .unwrap()
        .contains("adapter_bytes"));
}

#[test]
fn merged_blocks_are_counted_by_their_images_where_they_live() {
    // f32 blocks (staged on the CPU, not used in place) and bf16 ones (used in place on Linux).
    for (dtype, ram_in_memory) in [
        (DType::F32, false),
        (DType::F32, true),
        (DType::BF16, false),
    ] {
        let m = decoder(6, dtype);
        let merged = PlanOptions {
            merged_modules: vec!["model.layers.1.mlp".into(), "model.layers.4.mlp".into()],
            ram_in_memory,
            ..opts()
        };
        let cpu = Figures::injected(64_000_000_000, None);
        let placed_on = |figures: &Figures, options: &PlanOptions| {
            let mut p = plan(&m, figures, options).unwrap();
            p.assign(Tier::Device, &Selector::Indices(vec![0, 2, 3, 5]))
                .unwrap();
            p.assign(Tier::Ram, &Selector::Indices(vec![1])).unwrap();
            p.assign(Tier::Disk, &Selector::Indices(vec![4])).unwrap();
            p
        };
        let placed = |options: &PlanOptions| placed_on(&cpu, options);
        let p = placed(&merged);
        let flagged: Vec<&str> = p
            .blocks
            .iter()
            .filter(|b| b.merged)
            .map(|b| b.name.as_str())
            .collect();
        assert_eq!(flagged, ["model.layers.1.", "model.layers.4."]);
        let (ram, disk) = (&p.blocks[1], &p.blocks[4]);
        let b = p.budgets.as_ref().unwrap();
        // Tensors laid one after the other are aligned: used in place on Linux, but for a RAM
        // tier held in memory.
        let in_place = ram.ram_in_place;
        assert_eq!(in_place, maps_disk_tier(false) && !ram_in_memory);
        let ram_image = trash_panda::rules::patched_image_bytes(ram.image.ram, !in_place);
        let disk_image = trash_panda::rules::patched_image_bytes(disk.image.disk, false);
        assert!(ram.image.ram >= ram.stored_bytes && ram_image >= ram.image.ram);
        if in_place {
            // Both in files: the RAM-tier one in the page cache in place of its pages.
            assert_eq!(
                (b.merged_memory, b.merged_files),
                (0, ram_image + disk_image)
            );
        } else {
            assert_eq!((b.merged_memory, b.merged_files), (ram_image, disk_image));
        }
        // Beyond the block's own bytes: all of a memory image beside a RAM tier held in memory.
        let beyond = if ram_in_memory {
            ram_image
        } else {
            ram_image - ram.stored_bytes
        };
        assert_eq!(b.merged_beyond, beyond);
        let unmerged = placed(&PlanOptions {
            ram_in_memory,
            ..opts()
        });
        let u = unmerged.budgets.unwrap();
        assert_eq!(b.ram_used, u.ram_used + beyond);
        // Making a merge takes the layer's weight copied and its ΔW, in the compute dtype (bf16),
        // beside the outside weights: out of the one pool on the CPU.
        let work = 2 * (SIDE * SIDE * 2) as u64;
        assert_eq!(
            (p.outside.merge_work, b.merge_work, u.merge_work),
            (work, work, 0)
        );
        assert_eq!(b.ram_budget + work, u.ram_budget);
        assert_eq!(
            (u.merged_memory, u.merged_files, u.merged_beyond),
            (0, 0, 0)
        );
        assert!(p
            .to_string()
            .contains("merged blocks (2, an adapter merged in)"));
        // With a GPU the images are in host memory (staged: nothing runs in place) or a file:
        // the device copies the merged staging.
        let gpu = placed_on(
            &Figures::injected(64_000_000_000, Some(64_000_000_000)),
            &merged,
        );
        let g = gpu.budgets.as_ref().unwrap();
        let (gr, gd) = (&gpu.blocks[1], &gpu.blocks[4]);
        assert!(!gr.ram_in_place);
        assert_eq!(
            (g.merged_memory, g.merged_files),
            (
                trash_panda::rules::patched_image_bytes(gr.image.ram, true),
                trash_panda::rules::patched_image_bytes(gd.image.disk, false)
            )
        );
    }
}
