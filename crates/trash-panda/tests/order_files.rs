//! Order files: naming, reading every kind of bad file, atomic writes, and the run order built from the names that run first.

use std::fs;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use trash_panda::order::{
    full_order, order_file_path, order_to_write, read_order_file, write_order_file, Ignored,
    OrderError, OrderFile, OrderRead, MAX_ORDER_FILE_BYTES, ORDER_FORMAT,
};

mod order_common;
use order_common::{order_json, read_text, MODEL};

fn ignored(read: &OrderRead) -> &Ignored {
    read.ignored()
        .unwrap_or_else(|| panic!("expected an ignored file, got {read:?}"))
}

fn temporaries(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect()
}

// ---- naming ----

#[test]
fn a_single_file_names_its_order_file_after_its_stem() {
    let p = order_file_path(Path::new("/models/flux/model.safetensors"), None).unwrap();
    assert_eq!(p, Path::new("/models/flux/model_order.json"));
    let p = order_file_path(Path::new("model.v2.safetensors"), None).unwrap();
    assert_eq!(p, Path::new("model.v2_order.json"));
}

#[test]
fn an_index_is_named_without_its_index_suffixes() {
    let p = order_file_path(
        Path::new("/m/diffusion_pytorch_model.safetensors.index.json"),
        None,
    )
    .unwrap();
    assert_eq!(p, Path::new("/m/diffusion_pytorch_model_order.json"));
    let p = order_file_path(Path::new("/m/shards.json"), None).unwrap();
    assert_eq!(p, Path::new("/m/shards_order.json"));
}

#[test]
fn a_folder_keeps_its_order_file_inside_named_after_itself() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("transformer");
    fs::create_dir(&folder).unwrap();
    let p = order_file_path(&folder, None).unwrap();
    assert_eq!(p, folder.join("transformer_order.json"));
    // A trailing slash and `.` name the same folder.
    let mut slashed = folder.clone().into_os_string();
    slashed.push("/");
    assert_eq!(order_file_path(Path::new(&slashed), None).unwrap(), p);
    let dotted = folder.join(".");
    assert_eq!(
        order_file_path(&dotted, None).unwrap().file_name().unwrap(),
        "transformer_order.json"
    );
}

#[test]
fn a_destination_folder_takes_the_same_name() {
    let dest = Path::new("/var/orders");
    let p = order_file_path(Path::new("/m/vae.safetensors"), Some(dest)).unwrap();
    assert_eq!(p, dest.join("vae_order.json"));
    let p = order_file_path(Path::new("/m/unet.safetensors.index.json"), Some(dest)).unwrap();
    assert_eq!(p, dest.join("unet_order.json"));
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("text_encoder");
    fs::create_dir(&folder).unwrap();
    let p = order_file_path(&folder, Some(dest)).unwrap();
    assert_eq!(p, dest.join("text_encoder_order.json"));
}

#[test]
fn a_path_without_a_name_is_an_error_naming_it() {
    let err = order_file_path(Path::new("/m/.json"), None).unwrap_err();
    assert!(matches!(err, OrderError::NoName { .. }), "{err}");
    assert!(err.to_string().contains("/m/.json"), "{err}");
}

// ---- reading ----

#[test]
fn a_good_file_gives_the_order_in_the_models_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let read = read_text(
        dir.path(),
        &order_json(&["single_blocks.1", "double_blocks.0."]),
    );
    let known = read.order().unwrap();
    assert_eq!(known.blocks, ["single_blocks.1.", "double_blocks.0."]);
    assert_eq!(known.indices, [4, 0]);
    assert_eq!(known.full(MODEL.len()), [4, 0, 1, 2, 3]);
    assert_eq!(read.warning(Path::new("x")), None);
}

#[test]
fn model_names_without_dots_match_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m_order.json");
    fs::write(&path, order_json(&["b.1", "b.0"])).unwrap();
    let read = read_order_file(&path, &["b.0", "b.1"]).unwrap();
    assert_eq!(read.order().unwrap().indices, [1, 0]);
}

#[test]
fn an_absent_file_is_ignored_silently() {
    let dir = tempfile::tempdir().unwrap();
    let read = read_order_file(&dir.path().join("nope_order.json"), &MODEL).unwrap();
    assert_eq!(ignored(&read), &Ignored::Absent);
    assert_eq!(read.warning(Path::new("nope_order.json")), None);
}

#[test]
fn an_absent_destination_folder_reads_as_absent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("m_order.json");
    assert_eq!(
        ignored(&read_order_file(&path, &MODEL).unwrap()),
        &Ignored::Absent
    );
}

#[test]
fn a_torn_file_is_treated_as_absent_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let full = order_json(&["double_blocks.1", "double_blocks.0"]);
    for cut in [0, 1, full.len() / 2, full.len() - 1] {
        let read = read_text(dir.path(), &full[..cut]);
        assert_eq!(ignored(&read).tag(), "torn", "cut at {cut}");
        let warning = read.warning(Path::new("/m/model_order.json")).unwrap();
        assert!(warning.contains("/m/model_order.json"), "{warning}");
        assert!(warning.contains("cut short"), "{warning}");
    }
}

#[test]
fn a_file_that_is_not_json_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    for text in [
        "double_blocks.0\ndouble_blocks.1\n",
        "{]",
        "\u{0}\u{1}garbage",
    ] {
        let read = read_text(dir.path(), text);
        assert_eq!(ignored(&read).tag(), "not-json", "{text:?}");
    }
}

#[test]
fn a_foreign_format_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let read = read_text(
        dir.path(),
        r#"{"format": "plan", "version": 1, "blocks": []}"#,
    );
    assert_eq!(
        ignored(&read),
        &Ignored::WrongFormat {
            found: Some("\"plan\"".into())
        }
    );
    let read = read_text(dir.path(), r#"["double_blocks.0"]"#);
    assert_eq!(ignored(&read).tag(), "wrong-format");
    let read = read_text(dir.path(), r#"{"version": 1, "blocks": []}"#);
    assert_eq!(ignored(&read), &Ignored::WrongFormat { found: None });
}

#[test]
fn another_version_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    for version in ["2", "0", "\"1\"", "1.5", "null"] {
        let text = format!(r#"{{"format": "{ORDER_FORMAT}", "version": {version}, "blocks": []}}"#);
        let read = read_text(dir.path(), &text);
        assert_eq!(
            ignored(&read),
            &Ignored::WrongVersion {
                found: version.to_string()
            }
        );
        let warning = read.warning(Path::new("f")).unwrap();
        assert!(warning.contains("expected version 1"), "{warning}");
    }
}

#[test]
fn missing_or_mistyped_fields_are_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let head = format!(r#""format": "{ORDER_FORMAT}""#);
    for text in [
        format!(r#"{{{head}, "blocks": []}}"#),
        format!(r#"{{{head}, "version": 1}}"#),
        format!(r#"{{{head}, "version": 1, "blocks": "double_blocks.0"}}"#),
        format!(r#"{{{head}, "version": 1, "blocks": ["double_blocks.0", 3]}}"#),
        format!(r#"{{{head}, "version": 1, "checkpoint": 7, "blocks": []}}"#),
    ] {
        assert_eq!(
            ignored(&read_text(dir.path(), &text)).tag(),
            "malformed",
            "{text}"
        );
    }
}

#[test]
fn extra_fields_are_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"{{"format": "{ORDER_FORMAT}", "version": 1, "blocks": ["single_blocks.0"], "written_by": "x"}}"#
    );
    assert_eq!(read_text(dir.path(), &text).order().unwrap().indices, [3]);
}

#[test]
fn a_block_the_model_lacks_is_reported_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let read = read_text(
        dir.path(),
        &order_json(&["double_blocks.0", "txt_blocks.3"]),
    );
    let why = ignored(&read);
    assert_eq!(
        why,
        &Ignored::UnknownBlock {
            name: "txt_blocks.3".into()
        }
    );
    assert_eq!(why.block(), Some("txt_blocks.3"));
    let warning = read.warning(Path::new("/m/model_order.json")).unwrap();
    assert!(warning.contains("txt_blocks.3"), "{warning}");
    assert!(warning.contains("replaced"), "{warning}");
}

#[test]
fn a_block_named_twice_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let read = read_text(
        dir.path(),
        &order_json(&["double_blocks.1", "double_blocks.0", "double_blocks.1."]),
    );
    assert_eq!(
        ignored(&read),
        &Ignored::Duplicate {
            name: "double_blocks.1.".into()
        }
    );
}

#[test]
fn an_oversized_file_is_ignored_without_reading_it_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big_order.json");
    let file = fs::File::create(&path).unwrap();
    file.set_len(MAX_ORDER_FILE_BYTES + 10).unwrap();
    let read = read_order_file(&path, &MODEL).unwrap();
    assert_eq!(ignored(&read).tag(), "too-large");
}

#[test]
fn a_file_that_cannot_be_read_is_an_error() {
    // A folder where the file should be: the one unreadable case that holds for root too.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model_order.json");
    fs::create_dir(&path).unwrap();
    let err = read_order_file(&path, &MODEL).unwrap_err();
    assert!(matches!(err, OrderError::Read { .. }), "{err}");
    assert!(err.to_string().contains("model_order.json"), "{err}");
}

#[test]
fn a_model_list_with_a_block_twice_is_the_callers_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = read_order_file(&dir.path().join("x.json"), &["a.0.", "a.0"]).unwrap_err();
    assert!(
        matches!(err, OrderError::DuplicateModelBlock { .. }),
        "{err}"
    );
}

// ---- writing ----

#[test]
fn a_written_file_reads_back_and_is_documented_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model_order.json");
    let ran = ["single_blocks.0.", "double_blocks.2.", "double_blocks.0."];
    write_order_file(&path, Path::new("/m/model.safetensors"), &ran).unwrap();
    let value: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        value,
        serde_json::json!({
            "format": "trash-panda-order",
            "version": 1,
            "checkpoint": "model.safetensors",
            "blocks": ["single_blocks.0", "double_blocks.2", "double_blocks.0"],
        })
    );
    let read = read_order_file(&path, &MODEL).unwrap();
    assert_eq!(read.order().unwrap().blocks, ran);
    assert!(temporaries(dir.path()).is_empty());
}

#[test]
fn a_write_replaces_the_old_file_and_leaves_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model_order.json");
    fs::write(&path, "torn {").unwrap();
    write_order_file(&path, Path::new("model.safetensors"), &["double_blocks.1"]).unwrap();
    assert_eq!(
        read_order_file(&path, &MODEL)
            .unwrap()
            .order()
            .unwrap()
            .indices,
        [1]
    );
    assert!(temporaries(dir.path()).is_empty());
}

#[test]
fn a_stale_temporary_of_a_killed_write_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model_order.json");
    write_order_file(&path, Path::new("model.safetensors"), &["double_blocks.2"]).unwrap();
    // What a process killed between writing and renaming leaves behind.
    let stale = dir
        .path()
        .join(format!(".model_order.json.{}.0.tmp", std::process::id()));
    fs::write(&stale, &order_json(&["double_blocks.0"])[..20]).unwrap();
    assert_eq!(
        read_order_file(&path, &MODEL)
            .unwrap()
            .order()
            .unwrap()
            .indices,
        [2]
    );
    write_order_file(&path, Path::new("model.safetensors"), &["double_blocks.1"]).unwrap();
    assert_eq!(
        read_order_file(&path, &MODEL)
            .unwrap()
            .order()
            .unwrap()
            .indices,
        [1]
    );
    assert_eq!(temporaries(dir.path()), [stale]);
}

#[test]
fn a_block_that_ran_twice_keeps_its_first_place() {
    let file = OrderFile::new(Path::new("m.safetensors"), &["a.1.", "a.0", "a.1"]).unwrap();
    assert_eq!(file.blocks, ["a.1", "a.0"]);
    let err = OrderFile::new(Path::new("m.safetensors"), &["a.1", "."]).unwrap_err();
    assert!(
        matches!(err, OrderError::EmptyName { position: 1 }),
        "{err}"
    );
}

#[test]
fn an_unwritable_folder_is_a_typed_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // A missing folder, and a "folder" that is a file: both fail for root as well.
    let missing = dir.path().join("missing").join("model_order.json");
    let not_a_folder = dir.path().join("file");
    fs::write(&not_a_folder, b"x").unwrap();
    let under_file = not_a_folder.join("model_order.json");
    for path in [missing, under_file] {
        let err = write_order_file(&path, Path::new("model.safetensors"), &["a.0"]).unwrap_err();
        match &err {
            OrderError::Write { path: p, step, .. } => {
                assert_eq!(p, &path);
                assert_eq!(*step, "creating a temporary file");
            }
            other => panic!("expected a write error, got {other:?}"),
        }
        assert!(err.to_string().contains("model_order.json"), "{err}");
    }
}

#[cfg(unix)]
#[test]
fn a_read_only_folder_is_a_typed_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("ro");
    fs::create_dir(&folder).unwrap();
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o555)).unwrap();
    // Root writes anywhere; the check only means something for other users.
    let probe = fs::write(folder.join("probe"), b"x");
    if probe.is_err() {
        let err =
            write_order_file(&folder.join("m_order.json"), Path::new("m"), &["a"]).unwrap_err();
        assert!(matches!(err, OrderError::Write { .. }), "{err}");
    }
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).unwrap();
}

// ---- the run order ----

#[test]
fn named_blocks_run_first_then_the_rest_in_plan_order() {
    assert_eq!(full_order::<&str, _>(&[], &MODEL).unwrap(), [0, 1, 2, 3, 4]);
    assert_eq!(
        full_order(&["single_blocks.0", "single_blocks.1."], &MODEL).unwrap(),
        [3, 4, 0, 1, 2]
    );
    assert_eq!(
        full_order(&["double_blocks.2", "double_blocks.0"], &MODEL).unwrap(),
        [2, 0, 1, 3, 4]
    );
}

#[test]
fn an_unknown_block_in_order_names_it_and_the_blocks() {
    let err = full_order(&["txtfusion.layerwise_blocks.0"], &["a.", "b.", "c."]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "order names txtfusion.layerwise_blocks.0, which is not a block of the model \
         (blocks: a., b., c.)"
    );
    assert!(
        matches!(err, OrderError::UnknownBlock { ref name, .. } if name == "txtfusion.layerwise_blocks.0")
    );
}

#[test]
fn a_block_named_twice_in_order_is_an_error() {
    let err = full_order(&["a", "a."], &["a.", "b."]).unwrap_err();
    assert_eq!(err.to_string(), "order names a. twice");
}

// ---- properties ----

fn block_names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::hash_set("[a-z_]{1,8}(\\.[a-z0-9_]{1,4}){0,3}", 0..24)
        .prop_map(|set| set.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn write_then_read_gives_the_same_order(
        names in block_names(),
        dotted in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m_order.json");
        let model: Vec<String> = names.iter()
            .map(|n| if dotted { format!("{n}.") } else { n.clone() })
            .collect();
        // Some of the blocks, in a shuffled order.
        let mut ran: Vec<String> = model.clone();
        let mut s = seed;
        for i in (1..ran.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ran.swap(i, (s >> 33) as usize % (i + 1));
        }
        ran.truncate((seed % (model.len() as u64 + 1)) as usize);
        write_order_file(&path, Path::new("m.safetensors"), &ran).unwrap();
        let read = read_order_file(&path, &model).unwrap();
        let known = read.order().expect("a written file is usable");
        prop_assert_eq!(&known.blocks, &ran);
        prop_assert_eq!(order_to_write(&read, &ran, &model).unwrap(), None);
        let full = known.full(model.len());
        let mut sorted = full.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..model.len()).collect::<Vec<_>>());
    }

    #[test]
    fn any_bytes_are_judged_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = OrderFile::parse(&bytes);
    }

    #[test]
    fn any_json_shaped_text_is_judged_without_panicking(
        text in r#"\{("(format|version|blocks|checkpoint)": ?("trash-panda-order"|1|2|\[("[a-z.]{0,4}",?){0,3}\]|null|\{\}),? ?){0,5}\}?"#
    ) {
        let _ = OrderFile::parse(text.as_bytes());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m_order.json");
        fs::write(&path, &text).unwrap();
        let _ = read_order_file(&path, &MODEL).unwrap();
    }

    #[test]
    fn a_full_order_is_a_permutation_starting_with_the_named(
        n in 1usize..30, picks in prop::collection::vec(any::<prop::sample::Index>(), 0..10)
    ) {
        let model: Vec<String> = (0..n).map(|i| format!("layers.{i}.")).collect();
        let mut first: Vec<String> = Vec::new();
        for p in picks {
            let name = format!("layers.{}", p.index(n));
            if !first.contains(&name) { first.push(name); }
        }
        let full = full_order(&first, &model).unwrap();
        prop_assert_eq!(full.len(), n);
        for (k, name) in first.iter().enumerate() {
            prop_assert_eq!(&model[full[k]], &format!("{name}."));
        }
        let rest = &full[first.len()..];
        prop_assert!(rest.windows(2).all(|w| w[0] < w[1]));
    }
}
