//! On the CPU a budget a little under a model's size keeps as many blocks resident as fit beside
//! the disk tier as it is held (used in place: a mapped window, not staging buffers of whole
//! blocks). The assignment used to count every streamed block in its larger form, the RAM tier's
//! staged block times the staging buffers, and put every block on disk.

mod common;

use common::plan_model::tiers;
use trash_panda::plan::{
    plan, Budgets, Figures, MinFreeRam, ModelBlocks, PlanOptions, TensorSizes,
};
use trash_panda::rules::maps_disk_tier;
use trash_panda::DType;

/// The reported case's model: four blocks of two f32 Linears (1024 -> 4096 -> 1024, with
/// biases), one Linear before and one after them.
fn mlp() -> ModelBlocks {
    let d = 1024;
    let linear = |ts: &mut Vec<TensorSizes>, name: &str, inp: usize, out: usize| {
        ts.push(TensorSizes::new(
            format!("{name}.weight"),
            DType::F32,
            &[out, inp],
        ));
        ts.push(TensorSizes::new(format!("{name}.bias"), DType::F32, &[out]));
    };
    let mut ts = Vec::new();
    linear(&mut ts, "inp", d, d);
    for i in 0..4 {
        linear(&mut ts, &format!("blocks.{i}.a"), d, 4 * d);
        linear(&mut ts, &format!("blocks.{i}.b"), 4 * d, d);
    }
    linear(&mut ts, "out", d, d);
    ModelBlocks::discover(ts)
}

fn cpu_options() -> PlanOptions {
    PlanOptions {
        min_free_ram: MinFreeRam::Bytes(0),
        ..PlanOptions::default()
    }
}

fn fits(b: &Budgets) -> bool {
    b.device_used <= b.device_budget && b.ram_used <= b.ram_budget
}

fn file_bytes(m: &ModelBlocks) -> u64 {
    let blocks = m.blocks.iter().flat_map(|b| &b.tensors);
    blocks.chain(&m.outside).map(|t| t.file_bytes).sum()
}

#[test]
fn two_blocks_stay_resident_beside_the_disk_tier_s_window() {
    let m = mlp();
    let size = file_bytes(&m);
    let block = m.blocks[0]
        .tensors
        .iter()
        .map(|t| t.file_bytes)
        .sum::<u64>();
    assert_eq!((size, block), (142_696_448, 33_574_912));
    for fraction in [0.9, 0.85] {
        let ram = (size as f64 * fraction) as u64;
        let p = plan(&m, &Figures::injected(ram, None), &cpu_options()).unwrap();
        let b = p.budgets.as_ref().unwrap();
        assert!(fits(b), "{p}");
        if maps_disk_tier(false) {
            // Two blocks (67 MB), the outside Linears (8.4 MB) and the window of one block used
            // in place (its 2 MiB pages, 35.7 MB, and one more for each of the 2 blocks read
            // ahead) fit in 121 MB; three would need 150 MB, and a block in RAM would stage
            // whole blocks (3 x 33.6 MB).
            assert_eq!(tiers(&p), "DDKK", "{p}");
            assert_eq!(b.device_used, 2 * block);
            assert_eq!(b.mapped_window, 17 * (2 << 20) + 2 * (2 << 20));
            assert_eq!(
                b.host_staging,
                3 * 4096,
                "blocks used in place stage nothing"
            );
        } else {
            // Staged from disk, the 3 x 33.6 MB staging pool leaves room for no block.
            assert_eq!(tiers(&p), "KKKK", "{p}");
        }
    }
    // With room for the whole model, every block is resident, as before.
    let ram = (size as f64 * 1.05) as u64;
    let p = plan(&m, &Figures::injected(ram, None), &cpu_options()).unwrap();
    assert_eq!(tiers(&p), "DDDD");
}

#[test]
fn a_bf16_transformer_keeps_half_its_blocks_resident() {
    // Four bf16 blocks of 154.5 MB (618 MB) and 45 MB outside them, as SD3's transformer cut
    // to four blocks, with 639 MB free: two resident blocks (309 MB) and two on disk used in
    // place (a window of 158 MB) fit, where every block went to disk with the budget unused.
    let mut ts = vec![TensorSizes::new(
        "pos_embed.proj.weight",
        DType::BF16,
        &[4608, 4864],
    )];
    for i in 0..4 {
        ts.push(TensorSizes::new(
            format!("transformer_blocks.{i}.ff.weight"),
            DType::BF16,
            &[9000, 8583],
        ));
    }
    let m = ModelBlocks::discover(ts);
    let p = plan(&m, &Figures::injected(639_000_000, None), &cpu_options()).unwrap();
    let b = p.budgets.as_ref().unwrap();
    assert!(fits(b), "{p}");
    if maps_disk_tier(false) {
        assert_eq!(tiers(&p), "DDKK", "{p}");
        assert!(b.mapped_window > 154_000_000 && b.mapped_window < 165_000_000);
    }
}

#[test]
fn the_ram_tier_takes_what_fits_once_its_staging_is_counted() {
    // f32 blocks whose second tensor starts 4 bytes past a cache line are staged from disk
    // (3 buffers of a block) wherever they are; with `max_vram` capping the device tier at two
    // blocks, the RAM tier takes blocks first fit while the exact budgets hold them.
    let mut ts = vec![TensorSizes::new("embed.weight", DType::F32, &[1000, 64])];
    for i in 0..10 {
        let w = format!("layers.{i}.w.weight");
        ts.push(TensorSizes::new(w, DType::F32, &[4001, 1001]));
        ts.push(TensorSizes::new(
            format!("layers.{i}.n.weight"),
            DType::F32,
            &[1001],
        ));
    }
    let m = ModelBlocks::discover(ts);
    let block = m.blocks[0]
        .tensors
        .iter()
        .map(|t| t.file_bytes)
        .sum::<u64>();
    let outside = 256_000;
    let roomy = plan(&m, &Figures::injected(1 << 40, None), &cpu_options()).unwrap();
    assert_eq!(roomy.blocks[0].mapped, 0, "not used in place");
    let options = PlanOptions {
        max_vram: Some(outside + 5 * block / 2),
        ..cpu_options()
    };
    // The outside weight, three buffers of a block, two resident blocks and two and a half
    // blocks' room for the RAM tier.
    let ram = outside + 3 * (block + 8192) + 2 * block + 5 * block / 2;
    let p = plan(&m, &Figures::injected(ram, None), &options).unwrap();
    let b = p.budgets.as_ref().unwrap();
    assert!(fits(b), "{p}");
    assert_eq!(tiers(&p), "DDRRKKKKKK", "{p}");
}
