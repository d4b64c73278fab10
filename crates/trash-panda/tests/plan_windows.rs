//! The planner's Windows figures: the commit headroom caps the RAM plan where it is tighter
//! than the free RAM, and a plan that leaves less free VRAM than the activation reserve warns
//! about the driver's shared-memory fallback for Windows figures (those with a commit charge),
//! whatever platform plans them.

mod common;

use common::plan_model::{decoder, kinds, opts, tiers};
use trash_panda::plan::{plan, Figures, PlanOptions, WarningKind};
use trash_panda::sys::{CommitCharge, MemoryFigures};
use trash_panda::DType;

const GB: u64 = 1_000_000_000;

fn figures(available_ram: u64, commit: Option<CommitCharge>, vram: Option<u64>) -> Figures {
    let mut memory = MemoryFigures::with_ram(available_ram);
    memory.commit = commit;
    Figures {
        memory,
        free_vram: vram,
        device: None,
    }
}

#[test]
fn commit_headroom_caps_the_ram_tier_where_it_is_tighter() {
    let m = decoder(10, DType::BF16);
    let vram = Some(3_600_000_000);
    let free = plan(&m, &figures(16 * GB, None, vram), &opts()).unwrap();
    let tight = CommitCharge {
        limit: 20 * GB,
        available: GB,
    };
    let capped = plan(&m, &figures(16 * GB, Some(tight), vram), &opts()).unwrap();
    let budgets = capped.budgets.as_ref().unwrap();
    assert_eq!(budgets.usable_ram, GB);
    assert!(budgets.ram_budget <= GB, "{budgets:?}");
    let on_disk = |t: &str| t.matches('K').count();
    assert!(
        on_disk(&tiers(&capped)) > on_disk(&tiers(&free)),
        "{} vs {}",
        tiers(&capped),
        tiers(&free)
    );
    // A roomy commit limit changes nothing.
    let roomy = CommitCharge {
        limit: 64 * GB,
        available: 40 * GB,
    };
    let same = plan(&m, &figures(16 * GB, Some(roomy), vram), &opts()).unwrap();
    assert_eq!(tiers(&same), tiers(&free));
    assert_eq!(same.budgets.as_ref().unwrap().usable_ram, 16 * GB);
}

#[test]
fn forcing_blocks_past_the_reserve_warns_about_shared_memory_for_windows_figures() {
    let m = decoder(10, DType::BF16);
    let options = PlanOptions {
        resident_blocks: Some(10),
        ..opts()
    };
    let vram = Some(3_600_000_000);
    let windows = Some(CommitCharge {
        limit: 40 * GB,
        available: 30 * GB,
    });
    let p = plan(&m, &figures(16 * GB, windows, vram), &options).unwrap();
    assert_eq!(kinds(&p), ["device_over", "shared_gpu_memory", "headroom"]);
    let w = &p.warnings[1];
    match w.kind {
        WarningKind::SharedGpuMemory { free, headroom } => {
            assert!(free < headroom && headroom == PlanOptions::DEFAULT_HEADROOM_VRAM)
        }
        ref other => panic!("expected shared_gpu_memory, got {other:?}"),
    }
    assert!(
        w.message.contains("Sysmem Fallback Policy"),
        "{}",
        w.message
    );
    // Figures without a commit charge are not Windows': no such warning.
    let linux = plan(&m, &figures(16 * GB, None, vram), &options).unwrap();
    assert_eq!(kinds(&linux), ["device_over", "headroom"]);
    // The automatic plan keeps the reserve free.
    let auto = plan(&m, &figures(16 * GB, windows, vram), &opts()).unwrap();
    assert!(
        !kinds(&auto).contains(&"shared_gpu_memory"),
        "{:?}",
        kinds(&auto)
    );
    // Without a GPU there is no VRAM to spill from.
    let cpu = plan(&m, &figures(16 * GB, windows, None), &options).unwrap();
    assert!(
        !kinds(&cpu).contains(&"shared_gpu_memory"),
        "{:?}",
        kinds(&cpu)
    );
}
