//! `trash-panda inspect` and `plan` on a GGUF file: a tiny Llama in llama.cpp's names and GGML
//! types, written by the test, read by the binary as a user would run it.

use std::path::Path;
use std::process::{Command, Output};

const EXE: &str = env!("CARGO_BIN_EXE_trash-panda");

/// GGML type ids, with the bytes and elements of one block of each.
const F32: (u32, u64, u64) = (0, 4, 1);
const Q8_0: (u32, u64, u64) = (8, 34, 32);
const Q4_K: (u32, u64, u64) = (12, 144, 256);
const Q6_K: (u32, u64, u64) = (14, 210, 256);

const ALIGNMENT: u64 = 32;
const EMBD: u64 = 256;
const FFN: u64 = 512;
const KV: u64 = 64;
const VOCAB: u64 = 64;

/// A GGUF metadata value, as much of the format as the test writes.
enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
    Strings(Vec<String>),
}

struct Tensor {
    name: String,
    ty: (u32, u64, u64),
    /// Innermost first, as GGUF writes dimensions.
    ne: Vec<u64>,
}

impl Tensor {
    fn elements(&self) -> u64 {
        self.ne.iter().product()
    }

    fn bytes(&self) -> u64 {
        let (_, block_bytes, block_elems) = self.ty;
        self.elements() / block_elems * block_bytes
    }
}

fn tensor(name: impl Into<String>, ty: (u32, u64, u64), ne: &[u64]) -> Tensor {
    Tensor {
        name: name.into(),
        ty,
        ne: ne.to_vec(),
    }
}

const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|' + message['role'] + '|>' }}\n\
    {{ message['content'] }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

fn metadata() -> Vec<(&'static str, Meta)> {
    vec![
        ("general.architecture", Meta::Str("llama")),
        ("general.name", Meta::Str("tiny-llama")),
        // MOSTLY_Q4_K_M.
        ("general.file_type", Meta::U32(15)),
        ("llama.block_count", Meta::U32(2)),
        ("llama.context_length", Meta::U32(2048)),
        ("llama.embedding_length", Meta::U32(EMBD as u32)),
        ("llama.feed_forward_length", Meta::U32(FFN as u32)),
        ("llama.attention.head_count", Meta::U32(4)),
        ("llama.attention.head_count_kv", Meta::U32(1)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("tokenizer.ggml.model", Meta::Str("llama")),
        (
            "tokenizer.ggml.tokens",
            Meta::Strings((0..VOCAB).map(|i| format!("tok{i:03}")).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Meta::U32(1)),
        ("tokenizer.chat_template", Meta::Str(CHAT_TEMPLATE)),
    ]
}

/// llama.cpp's layout of a Q4_K_M Llama: Q4_K projections, Q8_0 for the value and down
/// projections and the embedding, Q6_K output, f32 norms.
fn tensors() -> Vec<Tensor> {
    let mut t = vec![tensor("token_embd.weight", Q8_0, &[EMBD, VOCAB])];
    for b in 0..2 {
        let p = format!("blk.{b}.");
        t.push(tensor(format!("{p}attn_norm.weight"), F32, &[EMBD]));
        t.push(tensor(format!("{p}attn_q.weight"), Q4_K, &[EMBD, EMBD]));
        t.push(tensor(format!("{p}attn_k.weight"), Q4_K, &[EMBD, KV]));
        t.push(tensor(format!("{p}attn_v.weight"), Q8_0, &[EMBD, KV]));
        t.push(tensor(
            format!("{p}attn_output.weight"),
            Q4_K,
            &[EMBD, EMBD],
        ));
        t.push(tensor(format!("{p}ffn_norm.weight"), F32, &[EMBD]));
        t.push(tensor(format!("{p}ffn_gate.weight"), Q4_K, &[EMBD, FFN]));
        t.push(tensor(format!("{p}ffn_up.weight"), Q4_K, &[EMBD, FFN]));
        t.push(tensor(format!("{p}ffn_down.weight"), Q8_0, &[FFN, EMBD]));
    }
    t.push(tensor("output_norm.weight", F32, &[EMBD]));
    t.push(tensor("output.weight", Q6_K, &[EMBD, VOCAB]));
    t
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The whole file: header, metadata, tensor infos, padding, then every tensor's data aligned.
fn gguf_bytes(meta: &[(&str, Meta)], tensors: &[Tensor]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (key, value) in meta {
        put_str(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend_from_slice(&4u32.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend_from_slice(&6u32.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
            Meta::Str(s) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            Meta::Strings(v) => {
                out.extend_from_slice(&9u32.to_le_bytes());
                out.extend_from_slice(&8u32.to_le_bytes());
                out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                for s in v {
                    put_str(&mut out, s);
                }
            }
        }
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
        for d in &t.ne {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.0.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.bytes()).next_multiple_of(ALIGNMENT);
    }
    let data_start = (out.len() as u64).next_multiple_of(ALIGNMENT);
    let last = tensors
        .last()
        .map_or(0, |t| offsets[offsets.len() - 1] + t.bytes());
    // Zeros decode as zero in every GGML type: the data's values do not matter here.
    out.resize((data_start + last) as usize, 0);
    out
}

fn write_model(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tiny-llama.Q4_K_M.gguf");
    std::fs::write(&path, gguf_bytes(&metadata(), &tensors())).unwrap();
    path
}

fn trash_panda(args: &[&str]) -> Output {
    Command::new(EXE).args(args).output().unwrap()
}

fn stdout_of(args: &[&str]) -> String {
    let out = trash_panda(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

fn json_of(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&stdout_of(args)).unwrap()
}

fn sum(tensors: &[Tensor], f: impl Fn(&Tensor) -> u64) -> u64 {
    tensors.iter().map(f).sum()
}

#[test]
fn inspect_shows_the_header_the_ggml_types_and_what_compact_saves() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path());
    let file = path.to_str().unwrap();
    let text = stdout_of(&["inspect", file]);
    println!("{text}");

    assert!(
        text.contains("GGUF v3, architecture llama, name \"tiny-llama\", alignment 32"),
        "{text}"
    );
    let line = |key: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no line for {key}:\n{text}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(line("llama.block_count"), "2");
    assert_eq!(line("llama.context_length"), "2048");
    assert_eq!(line("llama.embedding_length"), "256");
    assert_eq!(line("general.file_type"), "15");
    assert_eq!(line("llama.attention.layer_norm_rms_epsilon"), "0.00001");
    // The vocabulary as its type and length, never its tokens; a long template on one line.
    assert_eq!(line("tokenizer.ggml.tokens"), "[64 x string]");
    assert!(!text.contains("tok001"), "{text}");
    assert!(line("tokenizer.chat_template")
        .ends_with(&format!("... ({} chars)", CHAT_TEMPLATE.chars().count())));
    assert!(!text.contains("add_generation_prompt"), "{text}");

    assert!(text.contains("(outside blocks)        3"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("blk.0.  ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("blk.1.  ")), "{text}");
    let total = text
        .lines()
        .find(|l| l.starts_with("total (2 blocks)"))
        .unwrap();
    assert!(total.ends_with("5 F32, 10 Q4_K, 1 Q6_K, 5 Q8_0"), "{total}");
    assert!(text.contains("\nQ4_K           10"), "{text}");
    assert!(text.contains("expanded to bf16"), "{text}");

    let all = tensors();
    let stored = sum(&all, Tensor::bytes);
    let bf16 = sum(&all, |t| t.elements() * 2);
    let r = json_of(&["inspect", "--json", "--tensors", file]);
    assert_eq!(r["tensors"], all.len());
    assert_eq!(r["bytes"], stored);
    assert_eq!(r["bf16_bytes"], bf16);
    assert_eq!(r["blocks"], 2);
    assert_eq!(
        r["dtypes"],
        serde_json::json!({"F32": 5, "Q4_K": 10, "Q6_K": 1, "Q8_0": 5})
    );
    let q4k = r["by_dtype"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dtype"] == "Q4_K")
        .unwrap();
    let q4k_tensors: Vec<&Tensor> = all.iter().filter(|t| t.ty == Q4_K).collect();
    assert_eq!(
        q4k["bytes"],
        q4k_tensors.iter().map(|t| t.bytes()).sum::<u64>()
    );
    assert_eq!(
        q4k["bf16_bytes"],
        q4k_tensors.iter().map(|t| t.elements() * 2).sum::<u64>()
    );

    let g = &r["gguf"];
    assert_eq!(g["version"], 3);
    assert_eq!(g["alignment"], ALIGNMENT);
    assert_eq!(g["architecture"], "llama");
    assert_eq!(g["name"], "tiny-llama");
    let meta = |key: &str| {
        g["metadata"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["key"] == key)
            .unwrap()
            .clone()
    };
    assert_eq!(meta("llama.block_count")["value"], 2);
    assert_eq!(
        meta("tokenizer.ggml.tokens"),
        serde_json::json!({"key": "tokenizer.ggml.tokens", "type": "array",
            "element_type": "string", "len": 64})
    );

    // Shapes outermost first, as torch gives them; GGUF writes them innermost first.
    let block0 = r["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["block"] == "blk.0.")
        .unwrap();
    let down = block0["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "blk.0.ffn_down.weight")
        .unwrap();
    assert_eq!(down["shape"], serde_json::json!([EMBD, FFN]));
    assert_eq!(down["dtype"], "Q8_0");
}

#[test]
fn plan_finds_the_blk_blocks_and_counts_stored_and_expanded_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path());
    let file = path.to_str().unwrap();
    let figures = ["--vram", "24GB", "--ram", "8GB"];
    let mut args = vec!["plan", file, "--compute-dtype", "bf16"];
    args.extend(figures);
    println!("{}", stdout_of(&args));

    args.push("--json");
    let p = json_of(&args);
    assert_eq!(p["format"], "trash-panda-plan");
    let blocks = p["blocks"].as_array().unwrap();
    let names: Vec<&str> = blocks.iter().map(|b| b["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["blk.0.", "blk.1."]);
    let all = tensors();
    for b in blocks {
        let name = b["name"].as_str().unwrap();
        let mine: Vec<&Tensor> = all.iter().filter(|t| t.name.starts_with(name)).collect();
        assert_eq!(b["tensors"], mine.len());
        // The stored form is the file's GGML blocks; expanded is every element in bf16.
        let file_bytes: u64 = mine.iter().map(|t| t.bytes()).sum();
        assert_eq!(b["file_bytes"], file_bytes, "{name}");
        assert_eq!(b["stored_bytes"], file_bytes, "{name}");
        let expanded: u64 = mine.iter().map(|t| t.elements() * 2).sum();
        assert_eq!(b["expanded_bytes"], expanded, "{name}");
        assert!(
            file_bytes * 2 < expanded,
            "{name}: {file_bytes} vs {expanded}"
        );
    }
    assert_eq!(p["outside"]["tensors"], 3);
}

#[test]
fn a_cut_off_gguf_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = gguf_bytes(&metadata(), &tensors());
    let infos = bytes
        .windows(b"blk.1.ffn_up.weight".len())
        .position(|w| w == b"blk.1.ffn_up.weight")
        .unwrap();
    // In the metadata (the vocabulary), in the tensor infos, and in the tensors' data.
    for (what, len) in [
        ("metadata", 400),
        ("infos", infos + 5),
        ("data", bytes.len() / 2),
        ("end", bytes.len() - 1),
    ] {
        let path = dir.path().join(format!("cut-{what}.gguf"));
        std::fs::write(&path, &bytes[..len]).unwrap();
        let file = path.to_str().unwrap();
        for args in [vec!["inspect", file], vec!["plan", file, "--ram", "8GB"]] {
            let out = trash_panda(&args);
            let command = args[0];
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command} {what}: {stderr}");
            assert!(out.stdout.is_empty(), "{command} {what}");
            assert!(stderr.starts_with("trash-panda: error: "), "{stderr}");
            assert!(stderr.contains(file), "{command} {what}: {stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
        }
    }
}
