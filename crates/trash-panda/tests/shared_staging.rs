//! A pipeline's shared staging pool as the plans count it: each stage's plan counts the pool's
//! figures (not its own), the engine configuration makes exactly that pool's engine options, a
//! stage's release gives none of it back, and the pipeline's free memory has it once.

use trash_panda::engine_config::{EngineConfig, EngineSettings};
use trash_panda::pipeline::{Free, Holds};
use trash_panda::plan::{
    plan, Figures, ModelBlocks, Plan, PlanOptions, SharedStaging, TensorSizes,
};
use trash_panda::DType;

fn model(rows: usize) -> ModelBlocks {
    let mut ts = vec![TensorSizes::new("embed.weight", DType::BF16, &[64, 64])];
    for i in 0..4 {
        ts.push(TensorSizes::new(
            format!("layers.{i}.w.weight"),
            DType::BF16,
            &[rows, 512],
        ));
    }
    ModelBlocks::discover(ts)
}

fn planned(m: &ModelBlocks, pool: Option<SharedStaging>) -> Plan {
    let options = PlanOptions {
        resident_blocks: Some(1),
        staging_pool: pool,
        ..PlanOptions::default()
    };
    plan(m, &Figures::injected(8 << 30, None), &options).unwrap()
}

#[test]
fn a_stage_planned_with_the_pool_counts_the_pool_and_holds_none_of_it() {
    let m = model(256);
    let own = planned(&m, None);
    let ob = own.budgets.clone().unwrap();
    assert!(ob.staging_buffers > 0 && !ob.shared_staging);
    let need = own.shared_staging();
    assert!(need.buffer_bytes >= ob.staging_buffer_bytes);
    assert_eq!(need.buffers, ob.staging_buffers);

    // A pool sized for a larger stage: more buffers, each larger than this stage's blocks.
    let pool = SharedStaging {
        buffers: need.buffers + 1,
        buffer_bytes: need.buffer_bytes * 3,
    };
    let shared = planned(&m, Some(pool));
    let sb = shared.budgets.clone().unwrap();
    assert!(sb.shared_staging);
    assert_eq!(
        (sb.staging_buffers, sb.staging_buffer_bytes, sb.host_staging),
        (pool.buffers, pool.buffer_bytes, pool.bytes())
    );
    let tiers = |p: &Plan| p.blocks.iter().map(|b| b.tier).collect::<Vec<_>>();
    assert_eq!(tiers(&shared), tiers(&own), "the same blocks stream");
    // The plan's JSON keeps what it was made with.
    assert_eq!(Plan::from_json(&shared.to_json()).unwrap(), shared);

    let settings = EngineSettings::resolve(|_| None).unwrap();
    let config = EngineConfig::from_plan(&shared, &settings).unwrap();
    let options = config.engine_options();
    assert_eq!(options.buffers, Some(pool.buffers));
    assert_eq!(options.buffer_len, Some(pool.buffer_bytes as usize));

    // Released, the stage gives back all it holds but the pool; to start it needs the pool's
    // room too, which the pipeline's free memory has back.
    let own_config = EngineConfig::from_plan(&own, &settings).unwrap();
    let held_own = Holds::of("s", &own, &own_config).unwrap();
    let held_shared = Holds::of("s", &shared, &config).unwrap();
    assert_eq!(held_shared.ram + ob.host_staging, held_own.ram);
    let need_own = Holds::needed("s", &own, &own_config).unwrap();
    let need_shared = Holds::needed("s", &shared, &config).unwrap();
    assert_eq!(
        need_shared.ram - held_shared.ram,
        need_own.ram - held_own.ram + pool.bytes()
    );
}

#[test]
fn a_pool_too_small_for_a_block_is_not_counted() {
    let m = model(1024);
    let own = planned(&m, None);
    let need = own.shared_staging();
    let small = SharedStaging {
        buffers: 8,
        buffer_bytes: need.buffer_bytes - 4096,
    };
    let p = planned(&m, Some(small));
    let b = p.budgets.unwrap();
    assert!(!b.shared_staging);
    assert_eq!(Some(b), own.budgets);
}

#[test]
fn a_stage_that_streams_nothing_still_counts_the_pool_but_no_device_slot() {
    let m = model(64);
    let options = PlanOptions {
        staging_pool: Some(SharedStaging {
            buffers: 3,
            buffer_bytes: 1 << 20,
        }),
        ..PlanOptions::default()
    };
    let gpu = Figures::injected(8 << 30, Some(8 << 30));
    let p = plan(&m, &gpu, &options).unwrap();
    let b = p.budgets.unwrap();
    assert_eq!(b.disk_bytes + b.ram_used, 0, "every block resident");
    assert!(b.shared_staging);
    assert_eq!((b.host_staging, b.device_slots), (3 << 20, 0));
}

#[test]
fn the_pipeline_counts_the_pool_once() {
    // Two stages loaded, each planned with the pool; the machine's free RAM lacks the pool
    // once. Free for a third stage's plan: the pool back, less what the stages hold without it.
    let pool = 3 << 20;
    let machine = Free {
        ram: 100 << 20,
        vram: None,
    };
    let held = Holds {
        ram: 10 << 20,
        vram: 0,
    }
    .plus(Holds {
        ram: 20 << 20,
        vram: 0,
    });
    let cap = 64 << 20;
    let free = machine.with_shared_pool(pool).within(Some(cap), None, held);
    // The plan then takes the pool out: what is left for its weights is the cap less the two
    // stages less one pool.
    assert_eq!(free.ram - pool, cap - held.ram - pool);
    let uncapped = machine.with_shared_pool(pool).within(None, None, held);
    assert_eq!(uncapped.ram - pool, machine.ram);
}
