//! `trash-panda.exe` (built for x86_64-pc-windows-gnu, run under Wine) prints exactly what the
//! Linux binary prints for `inspect` and `plan --json` on the same checkpoint.
//!
//! Ignored in a plain `cargo test` (it needs the Windows build and Wine); `scripts/cross.sh`,
//! part of `make test`, builds the exe and runs this test with `--ignored`, so wherever Wine is
//! available it runs and a missing exe or a failing Wine is a failure, not a skip. It runs on the
//! Linux host only (Wine runs the other side).
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;

use safetensors::tensor::{Dtype, TensorView};

const LINUX_EXE: &str = env!("CARGO_BIN_EXE_trash-panda");

fn windows_exe() -> PathBuf {
    match std::env::var_os("TRASH_PANDA_WINDOWS_EXE") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/x86_64-pc-windows-gnu/debug/trash-panda.exe"),
    }
}

fn wine() -> String {
    std::env::var("TRASH_PANDA_WINE").unwrap_or_else(|_| "wine".into())
}

type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn tensor(name: String, dtype: Dtype, shape: &[usize], fill: u8) -> Tensor {
    let elems: usize = shape.iter().product();
    (
        name,
        dtype,
        shape.to_vec(),
        vec![fill; elems * dtype.bitsize() / 8],
    )
}

/// A small model in two shards with an index: bf16 blocks, fp8 blocks with per-tensor scales,
/// and weights outside the blocks, so inspect and plan have every kind of row to print.
fn write_checkpoint(dir: &Path) {
    let mut shards: Vec<Vec<Tensor>> = vec![Vec::new(), Vec::new()];
    shards[0].push(tensor(
        "model.embed_tokens.weight".into(),
        Dtype::BF16,
        &[128, 64],
        1,
    ));
    for i in 0..6 {
        let shard = &mut shards[i / 3];
        let p = format!("model.layers.{i}");
        if i % 2 == 0 {
            shard.push(tensor(
                format!("{p}.mlp.up.weight"),
                Dtype::BF16,
                &[256, 64],
                2,
            ));
            shard.push(tensor(format!("{p}.norm.weight"), Dtype::F32, &[64], 0));
        } else {
            shard.push(tensor(
                format!("{p}.mlp.up.weight"),
                Dtype::F8_E4M3,
                &[256, 128],
                3,
            ));
            let mut scale = tensor(format!("{p}.mlp.up.weight_scale"), Dtype::F32, &[], 0);
            scale.3 = 0.5f32.to_le_bytes().to_vec();
            shard.push(scale);
        }
    }
    shards[1].push(tensor("lm_head.weight".into(), Dtype::BF16, &[128, 64], 4));
    let mut weight_map = serde_json::Map::new();
    for (n, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", n + 1);
        let views: Vec<(String, TensorView<'_>)> = shard
            .iter()
            .map(|(name, dtype, shape, data)| {
                let view = TensorView::new(*dtype, shape.clone(), data).expect("a valid tensor");
                (name.clone(), view)
            })
            .collect();
        for (name, _) in &views {
            weight_map.insert(name.clone(), file.clone().into());
        }
        let bytes = safetensors::serialize(views, None).expect("serializable");
        std::fs::write(dir.join(&file), bytes).expect("a writable temp dir");
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string())
        .expect("a writable temp dir");
}

/// Runs the command in `dir` and returns its stdout, failing on a non-zero exit.
fn stdout_of(mut cmd: Command, dir: &Path, what: &str) -> String {
    let out = cmd
        .current_dir(dir)
        .env("WINEDEBUG", "-all")
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("{what}: stdout is not UTF-8: {e}"))
}

#[test]
#[ignore = "needs trash-panda.exe and Wine: scripts/cross.sh (make test) builds it and runs this"]
fn windows_exe_under_wine_prints_what_linux_prints() {
    let exe = windows_exe();
    assert!(
        exe.is_file(),
        "{} is missing: build it with cargo build --target x86_64-pc-windows-gnu -p trash-panda-cli",
        exe.display()
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    write_checkpoint(dir.path());
    let index = "model.safetensors.index.json";
    let cases: Vec<Vec<&str>> = vec![
        vec!["inspect", index],
        vec!["inspect", "--tensors", "--json", index],
        vec!["inspect", "model-00002-of-00002.safetensors"],
        vec![
            "plan",
            "--json",
            "--ram",
            "150kB",
            "--min-free-ram",
            "0",
            "--vram",
            "250kB",
            "--headroom-vram",
            "50kB",
            index,
        ],
        vec!["plan", "--ram", "8GB", index],
        vec![
            "plan",
            "--json",
            "--ram",
            "8GB",
            "--vram",
            "6GB",
            "--storage-dtype",
            "bf16",
            index,
        ],
    ];
    for args in &cases {
        let what = args.join(" ");
        let mut linux = Command::new(LINUX_EXE);
        linux.args(args);
        let mut windows = Command::new(wine());
        windows.arg(&exe).args(args);
        let want = stdout_of(linux, dir.path(), &format!("linux: {what}"));
        let got = stdout_of(windows, dir.path(), &format!("wine: {what}"));
        assert!(!want.trim().is_empty(), "{what}: no output");
        assert_eq!(
            got, want,
            "trash-panda.exe {what} differs from the Linux binary"
        );
    }
}
