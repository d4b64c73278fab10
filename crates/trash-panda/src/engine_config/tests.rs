use super::*;
use crate::dtype::{classify_scale, DtypeError, ScaleLayout};
use crate::plan::{plan, Figures, MinFreeRam, ModelBlocks, PlanOptions};
use crate::rules::{expansion_layout, infer_compute_dtype, ExpansionInput, TensorSizes, Tier};

fn model() -> ModelBlocks {
    let mut ts = vec![TensorSizes::new("embed.weight", DType::BF16, &[64, 64])];
    for i in 0..4 {
        ts.push(TensorSizes::new(
            format!("layers.{i}.w.weight"),
            DType::F8E4M3,
            &[256, 512],
        ));
        ts.push(TensorSizes::new(
            format!("layers.{i}.w.weight_scale"),
            DType::F32,
            &[256],
        ));
        ts.push(TensorSizes::new(
            format!("layers.{i}.norm.weight"),
            DType::BF16,
            &[512],
        ));
    }
    ModelBlocks::discover(ts)
}

#[test]
fn compute_dtype_is_the_dominant_float_dtype() {
    let t = |d, n| TensorSizes::new("x", d, &[n]);
    assert_eq!(
        infer_compute_dtype(&[t(DType::F32, 10), t(DType::BF16, 9)]),
        DType::F32
    );
    assert_eq!(
        infer_compute_dtype(&[t(DType::F16, 10), t(DType::F32, 9)]),
        DType::F16
    );
    assert_eq!(
        infer_compute_dtype(&[t(DType::F64, 10), t(DType::BF16, 9)]),
        DType::F32
    );
    assert_eq!(
        infer_compute_dtype(&[t(DType::F8E4M3, 100), t(DType::I64, 9)]),
        DType::BF16
    );
    assert_eq!(
        infer_compute_dtype(&[t(DType::F16, 5), t(DType::BF16, 5)]),
        DType::BF16
    );
    // A plan made without a compute dtype holds the one it inferred.
    let m = ModelBlocks::discover(vec![
        TensorSizes::new("l.0.w", DType::F32, &[8, 8]),
        TensorSizes::new("l.1.w", DType::F32, &[8, 8]),
    ]);
    let p = plan(
        &m,
        &Figures::injected(1 << 30, None),
        &PlanOptions::default(),
    )
    .unwrap();
    assert_eq!(p.options.compute_dtype, Some(DType::F32));
}

#[test]
fn scale_layouts_are_classified_once() {
    let c = |name, w: &[usize], s: &[usize]| classify_scale(name, w, s, 128);
    assert_eq!(
        c("a.weight_scale", &[256, 512], &[1]).unwrap(),
        ScaleLayout::Tensor
    );
    assert_eq!(
        c("a.weight_scale", &[256, 512], &[]).unwrap(),
        ScaleLayout::Tensor
    );
    assert_eq!(
        c("a.weight_scale", &[256, 512], &[256]).unwrap(),
        ScaleLayout::Row
    );
    assert_eq!(
        c("a.weight_scale", &[256, 512], &[256, 1]).unwrap(),
        ScaleLayout::Row
    );
    assert_eq!(
        c("a.weight_scale_inv", &[256, 512], &[2, 4]).unwrap(),
        ScaleLayout::Block
    );
    // A narrow weight's block grid looks like one scale per row: the name decides.
    assert_eq!(
        c("a.weight_scale_inv", &[256, 100], &[2, 1]).unwrap(),
        ScaleLayout::Block
    );
    assert_eq!(
        c("a.weight_scale", &[2, 100], &[2, 1]).unwrap(),
        ScaleLayout::Row
    );
    let e = c("a.weight_scale", &[256, 512], &[3, 3]).unwrap_err();
    assert!(matches!(e, DtypeError::ScaleShape { .. }));
    assert!(
        e.to_string().contains("a.weight_scale") && e.to_string().contains("[3, 3]"),
        "{e}"
    );
}

#[test]
fn expansion_skips_what_is_used_in_place() {
    let i = |held, elements, scaled| ExpansionInput {
        held,
        elements,
        scaled,
        reordered: false,
    };
    let (offsets, total) = expansion_layout(
        &[
            i(DType::F8E4M3, 10, true),
            i(DType::BF16, 100, false),
            i(DType::BF16, 3, true),
            i(DType::I64, 4, false),
            i(DType::F32, 5, false),
        ],
        DType::BF16,
        64,
    );
    assert_eq!(offsets, [Some(0), None, Some(64), None, Some(128)]);
    assert_eq!(total, 192);
}

#[test]
fn the_config_reads_the_plans_figures() {
    let m = model();
    let options = PlanOptions {
        min_free_ram: MinFreeRam::Bytes(0),
        resident_blocks: Some(1),
        ..PlanOptions::default()
    };
    let p = plan(&m, &Figures::injected(1 << 30, Some(1 << 30)), &options).unwrap();
    let settings = EngineSettings::resolve(|_| None).unwrap();
    let c = EngineConfig::from_plan(&p, &settings).unwrap();
    let b = p.budgets.as_ref().unwrap();
    assert_eq!((c.gpu, c.align, c.compute_dtype), (true, 512, DType::BF16));
    assert_eq!(c.held, b.held());
    assert_eq!(c.held.staging_buffers, 3);
    assert_eq!(c.held.device_slots, 3);
    // One fp8 weight of 256 x 512 expanded to bf16; the bf16 norm is used in place.
    assert_eq!(c.held.expansion_bytes, 256 * 512 * 2);
    let o = c.engine_options();
    assert_eq!(
        (o.align, o.buffer_len, o.lookahead),
        (512, Some(b.staging_buffer_bytes as usize), 2)
    );
    let manual = Plan::manual(&["layers.".into()], &[], Tier::Ram).unwrap();
    assert!(matches!(
        EngineConfig::from_plan(&manual, &settings),
        Err(EngineConfigError::Unresolved)
    ));
}

#[test]
fn disk_mode_follows_the_page_cache_room() {
    let m = model();
    let options = PlanOptions {
        min_free_ram: MinFreeRam::Bytes(0),
        resident_blocks: Some(0),
        ..PlanOptions::default()
    };
    let mut p = plan(&m, &Figures::injected(1 << 30, Some(1 << 30)), &options).unwrap();
    p.assign(Tier::Disk, &crate::plan::Selector::Indices(vec![3]))
        .unwrap();
    let b = p.budgets.clone().unwrap();
    let (mode, why) = disk_mode(DiskModeChoice::Auto, &b);
    assert_eq!(mode, ReadMode::Buffered, "{why}");
    assert!(why.contains("fit in the page cache"), "{why}");
    let tight = Budgets {
        ram_budget: b.ram_used + b.disk_bytes - 1,
        ..b.clone()
    };
    let (mode, why) = disk_mode(DiskModeChoice::Auto, &tight);
    assert_eq!(mode, ReadMode::Direct, "{why}");
    let (mode, why) = disk_mode(DiskModeChoice::Buffered, &tight);
    assert_eq!(mode, ReadMode::Buffered);
    assert!(why.contains("TRASH_PANDA_DISK_MODE"), "{why}");
    let none = Budgets { disk_bytes: 0, ..b };
    assert_eq!(
        disk_mode(DiskModeChoice::Auto, &none),
        (ReadMode::Direct, String::new())
    );
    let env = |v: &'static str| move |k: &str| (k == "TRASH_PANDA_DISK_MODE").then(|| v.to_owned());
    assert_eq!(
        EngineSettings::resolve(env("buffered")).unwrap().disk_mode,
        DiskModeChoice::Buffered
    );
    assert!(EngineSettings::resolve(env("fast")).is_err());
}
