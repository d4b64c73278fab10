//! Plan edits, manual plans, JSON and the printed table, on a decoder-shaped model.

mod common;

use common::plan_model::{decoder, kinds, opts, tiers};
use trash_panda::plan::{plan, Figures, Plan, PlanError, Selector, Tier, CUDA_CONTEXT_FLOOR};
use trash_panda::DType;

#[test]
fn edits_recompute_and_reject_bad_names() {
    let m = decoder(10, DType::BF16);
    let mut p = plan(
        &m,
        &Figures::injected(1_000_000_000, Some(3_700_000_000 + CUDA_CONTEXT_FLOOR)),
        &opts(),
    )
    .unwrap();
    p.assign(Tier::Disk, &Selector::Indices(vec![0, 1]))
        .unwrap();
    assert_eq!(tiers(&p), "KKDDDDRKKK");
    assert_eq!(p.budgets.as_ref().unwrap().disk_bytes, 5 * 200_020_000);
    p.assign(Tier::Ram, &Selector::Prefixes(vec!["model.layers.".into()]))
        .unwrap();
    assert_eq!(tiers(&p), "RRRRRRRRRR");
    assert_eq!(kinds(&p), ["ram_over", "headroom"]);
    p.assign(
        Tier::Device,
        &Selector::Prefixes(vec!["model.layers.1".into()]),
    )
    .unwrap();
    assert_eq!(tiers(&p), "RDRRRRRRRR", "layers.1 does not take layers.10");
    let before = p.clone();
    let err = p
        .assign(Tier::Disk, &Selector::Indices(vec![10]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::IndexOutOfRange {
                index: 10,
                count: 10
            }
        ),
        "{err}"
    );
    let err = p
        .assign(Tier::Disk, &Selector::Indices(vec![3, 3]))
        .unwrap_err();
    assert!(err.to_string().contains("model.layers.3."), "{err}");
    let err = p
        .assign(
            Tier::Disk,
            &Selector::Prefixes(vec!["model.layer.3.".into()]),
        )
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("\"model.layer.3.\"") && msg.contains("model.layers.3."),
        "{msg}"
    );
    let err = p
        .assign(
            Tier::Disk,
            &Selector::Prefixes(vec!["model.layers.".into(), "model.layers.2.".into()]),
        )
        .unwrap_err();
    assert!(matches!(err, PlanError::NamedTwice { .. }), "{err}");
    assert_eq!(p, before, "failed edits change nothing");
}

#[test]
fn manual_plans() {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let p = Plan::manual(
        &names(&["model.layers.0.", "model.layers.1"]),
        &names(&["model.layers.2.", "model.layers.3."]),
        Tier::Ram,
    )
    .unwrap();
    assert!(!p.resolved && p.budgets.is_none());
    assert!(p.to_string().contains("resolve"));
    let m = decoder(4, DType::BF16);
    let f = Figures::injected(10_000_000_000, Some(3_000_000_000));
    let r = p.resolve(&m, &f, &opts()).unwrap();
    assert!(r.manual && r.resolved);
    assert_eq!(tiers(&r), "DDRR");
    assert_eq!(r.budgets.as_ref().unwrap().device_used, 2 * 200_020_000);
    // Whole lists by prefix, streamed to disk.
    let p = Plan::manual(&[], &names(&["model.layers."]), Tier::Disk).unwrap();
    assert_eq!(tiers(&p.resolve(&m, &f, &opts()).unwrap()), "KKKK");
    // Errors name the culprit.
    let err = Plan::manual(&names(&["a.0."]), &names(&["a.0"]), Tier::Ram).unwrap_err();
    assert!(matches!(err, PlanError::NamedTwice { .. }), "{err}");
    let err = Plan::manual(&names(&["a."]), &names(&["a.0."]), Tier::Ram).unwrap_err();
    assert!(
        matches!(err, PlanError::OverlappingPrefixes { .. }),
        "{err}"
    );
    let p = Plan::manual(
        &names(&["model.layers.0.", "model.layers.9."]),
        &names(&["model.layers.1."]),
        Tier::Ram,
    )
    .unwrap();
    let err = p.resolve(&m, &f, &opts()).unwrap_err();
    assert!(err.to_string().contains("model.layers.9."), "{err}");
    let p = Plan::manual(
        &names(&["model.layers.0."]),
        &names(&["model.layers.1."]),
        Tier::Ram,
    )
    .unwrap();
    let err = p.resolve(&m, &f, &opts()).unwrap_err();
    assert!(
        matches!(&err, PlanError::Unassigned { count: 2, names } if names[0] == "model.layers.2."),
        "{err}"
    );
}

#[test]
fn json_round_trip_and_version() {
    let m = decoder(10, DType::F8E4M3);
    let f = Figures::injected(1_000_000_000, Some(3_000_000_000));
    let p = plan(&m, &f, &opts()).unwrap();
    let text = p.to_json();
    assert!(
        text.starts_with("{\n  \"format\": \"trash-panda-plan\",\n  \"version\": 2,"),
        "{text}"
    );
    assert_eq!(Plan::from_json(&text).unwrap(), p);
    let v3 = text.replace("\"version\": 2,", "\"version\": 3,");
    let err = Plan::from_json(&v3).unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::Version {
                found: 3,
                supported: 2
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("version 2"));
    let other = text.replace("trash-panda-plan", "something-else");
    assert!(Plan::from_json(&other)
        .unwrap_err()
        .to_string()
        .contains("something-else"));
    assert!(matches!(
        Plan::from_json("[1]"),
        Err(PlanError::Json { .. })
    ));
    let manual = Plan::manual(&["a.0.".into()], &[], Tier::Ram).unwrap();
    assert_eq!(Plan::from_json(&manual.to_json()).unwrap(), manual);
}

#[test]
fn same_inputs_same_plan() {
    let m = decoder(10, DType::BF16);
    let f = Figures::injected(1_000_000_000, Some(3_900_000_000));
    let a = plan(&m, &f, &opts()).unwrap().to_json();
    let b = plan(&m, &f, &opts()).unwrap().to_json();
    assert_eq!(a, b);
}

#[test]
fn table_shape() {
    let m = decoder(10, DType::BF16);
    let p = plan(
        &m,
        &Figures::injected(1_000_000_000, Some(3_700_000_000 + CUDA_CONTEXT_FLOOR)),
        &opts(),
    )
    .unwrap();
    let t = p.to_string();
    println!("{t}");
    assert!(t.contains("model.layers.0-5"), "{t}");
    assert!(t.contains("model.layers.7-9"), "{t}");
    assert!(t.contains("staging 600.07 MB (3 x 200.02 MB)"), "{t}");
    assert!(t.contains("headroom_vram 1.50 GB (not measured)"), "{t}");
    assert!(
        t.contains(" = free VRAM 4.70 GB - CUDA floor 1.00 GB - headroom_vram "),
        "{t}"
    );
    assert!(t.contains("warnings:"), "{t}");
}

#[test]
fn the_table_names_the_device_that_computes() {
    let m = decoder(10, DType::BF16);
    let first_line = |f: &Figures| plan(&m, f, &opts()).unwrap().to_string();
    let gpu = Figures::injected(1_000_000_000, Some(3_700_000_000));
    let t = first_line(&gpu);
    assert!(
        t.starts_with("automatic plan: 10 blocks, device gpu, "),
        "{t}"
    );
    assert!(t.contains(" = free VRAM 3.70 GB - "), "{t}");
    let t = first_line(&Figures::injected(8_000_000_000, None));
    assert!(
        t.starts_with("automatic plan: 10 blocks, device cpu (no GPU), "),
        "{t}"
    );
    assert!(t.contains(" = RAM pool "), "{t}");
    // The CPU with a device tier sized as a GPU's (`plan(device="cpu", vram=...)`): the tiers
    // and budgets of a GPU with that much free beside the CUDA floor, which a CPU process has no
    // runtime to take; the CPU computes, and the line says so.
    let simulated = gpu.clone().on_cpu();
    let p = plan(&m, &simulated, &opts()).unwrap();
    let with_floor = Figures::injected(1_000_000_000, Some(3_700_000_000 + CUDA_CONTEXT_FLOOR));
    let on_gpu = plan(&m, &with_floor, &opts()).unwrap();
    let mut want = on_gpu.budgets.clone().unwrap();
    want.device_limit -= CUDA_CONTEXT_FLOOR;
    want.cuda_floor = 0;
    assert_eq!(
        (tiers(&p), p.budgets.clone().unwrap()),
        (tiers(&on_gpu), want)
    );
    let t = p.to_string();
    assert!(
        t.starts_with(
            "automatic plan: 10 blocks, device cpu (device tier planned as a GPU with 3.70 GB), "
        ),
        "{t}"
    );
    assert!(
        t.contains(" = vram 3.70 GB - ") && !t.contains("free VRAM") && !t.contains("CUDA floor"),
        "{t}"
    );
    // JSON: only the simulated device writes the field, and it reads back; a file without it
    // (every plan written before) reads as the device `free_vram` implies.
    let figures = |text: &str| {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        v["figures"].as_object().unwrap().clone()
    };
    let text = p.to_json();
    assert_eq!(figures(&text)["device"], "cpu");
    assert_eq!(Plan::from_json(&text).unwrap(), p);
    let gpu_text = plan(&m, &gpu, &opts()).unwrap().to_json();
    assert!(!figures(&gpu_text).contains_key("device"), "{gpu_text}");
    let older = text.replace(",\n    \"device\": \"cpu\"", "");
    assert!(!figures(&older).contains_key("device"), "{older}");
    assert!(Plan::from_json(&older)
        .unwrap()
        .to_string()
        .contains("device gpu, "));
}
