//! `trash-panda inspect`: a checkpoint's tensors grouped by block.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use trash_panda::checkpoint::gguf::{GgufArray, GgufFile, GgufValue};
use trash_panda::checkpoint::Checkpoint;
use trash_panda::plan::{ModelBlocks, TensorSizes};
use trash_panda::units::format_bytes;
use trash_panda::DType;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A .safetensors file, a *.safetensors.index.json, a folder of shards, or a .gguf file.
    pub checkpoint: PathBuf,
    /// Also list every tensor under its block.
    #[arg(long)]
    pub tensors: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug)]
struct TensorRow<'a> {
    name: &'a str,
    dtype: &'static str,
    shape: &'a [usize],
    bytes: u64,
}

#[derive(Serialize, Debug)]
struct Group<'a> {
    /// The block prefix, or `None` for the weights outside the blocks.
    block: Option<String>,
    tensors: usize,
    bytes: u64,
    bf16_bytes: u64,
    dtypes: BTreeMap<&'static str, usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    list: Vec<TensorRow<'a>>,
}

/// The tensors of one dtype: how much they take as stored and once expanded.
#[derive(Serialize, Debug, Default)]
struct DtypeRow {
    dtype: &'static str,
    tensors: usize,
    elements: u64,
    bytes: u64,
    bf16_bytes: u64,
    /// Stored in a form expanded before its block runs (fp8, GGML blocks).
    #[serde(skip)]
    compact: bool,
}

/// One metadata pair of a GGUF file. Arrays are summed up as their element type and length:
/// a vocabulary is tens of thousands of strings nobody reads in a terminal.
#[derive(Serialize, Debug)]
struct MetaRow {
    key: String,
    #[serde(rename = "type")]
    value_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    element_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    len: Option<usize>,
}

#[derive(Serialize, Debug)]
struct GgufReport {
    version: u32,
    alignment: u64,
    data_start: u64,
    architecture: Option<String>,
    name: Option<String>,
    metadata: Vec<MetaRow>,
}

#[derive(Serialize, Debug)]
struct Report<'a> {
    files: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gguf: Option<GgufReport>,
    tensors: usize,
    bytes: u64,
    /// The bytes once every float and GGML-block tensor is expanded to bf16 (scale tensors
    /// vanish, integer tensors stay as they are): what streaming the stored form saves.
    bf16_bytes: u64,
    dtypes: BTreeMap<&'static str, usize>,
    by_dtype: Vec<DtypeRow>,
    blocks: usize,
    groups: Vec<Group<'a>>,
}

/// The bytes of `t` once expanded to bf16, counted as the planner counts expanded bytes.
fn bf16_bytes(t: &TensorSizes) -> u64 {
    if t.is_scale() {
        0
    } else if t.dtype.is_float() || t.dtype.is_block() {
        t.numel() * DType::BF16.size() as u64
    } else {
        t.file_bytes
    }
}

fn group<'a>(block: Option<String>, members: &[&'a TensorSizes], list: bool) -> Group<'a> {
    let mut dtypes = BTreeMap::new();
    for t in members {
        *dtypes.entry(t.dtype.safetensors_name()).or_insert(0) += 1;
    }
    Group {
        block,
        tensors: members.len(),
        bytes: members.iter().map(|t| t.file_bytes).sum(),
        bf16_bytes: members.iter().map(|t| bf16_bytes(t)).sum(),
        dtypes,
        list: if list {
            members
                .iter()
                .map(|t| TensorRow {
                    name: &t.name,
                    dtype: t.dtype.safetensors_name(),
                    shape: &t.shape,
                    bytes: t.file_bytes,
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

fn by_dtype(all: &[&TensorSizes]) -> Vec<DtypeRow> {
    let mut rows: BTreeMap<&'static str, DtypeRow> = BTreeMap::new();
    for t in all {
        let name = t.dtype.safetensors_name();
        let row = rows.entry(name).or_insert_with(|| DtypeRow {
            dtype: name,
            compact: t.dtype.is_block() || t.dtype.is_fp8(),
            ..DtypeRow::default()
        });
        row.tensors += 1;
        row.elements += t.numel();
        row.bytes += t.file_bytes;
        row.bf16_bytes += bf16_bytes(t);
    }
    rows.into_values().collect()
}

fn meta_row(key: &str, v: &GgufValue) -> MetaRow {
    use serde_json::Value;
    let value = match v {
        GgufValue::Array(_) => None,
        GgufValue::String(s) => Some(Value::from(s.as_str())),
        GgufValue::Bool(b) => Some(Value::from(*b)),
        GgufValue::F32(x) => Some(Value::from(f64::from(*x))),
        GgufValue::F64(x) => Some(Value::from(*x)),
        other => other
            .as_u64()
            .map(Value::from)
            .or_else(|| other.as_i64().map(Value::from)),
    };
    let array = v.as_array();
    MetaRow {
        key: key.to_owned(),
        value_type: v.value_type().name(),
        value,
        element_type: array.map(|a| a.element_type().name()),
        len: array.map(GgufArray::len),
    }
}

fn gguf_report(g: &GgufFile) -> GgufReport {
    GgufReport {
        version: g.version,
        alignment: g.alignment,
        data_start: g.data_start,
        architecture: g.architecture().map(str::to_owned),
        name: g
            .get("general.name")
            .and_then(GgufValue::as_str)
            .map(str::to_owned),
        metadata: g.metadata.iter().map(|(k, v)| meta_row(k, v)).collect(),
    }
}

fn report<'a>(ckpt: &Checkpoint, found: &'a ModelBlocks, list: bool) -> Report<'a> {
    let mut groups = Vec::new();
    let outside: Vec<&TensorSizes> = found.outside.iter().collect();
    if !outside.is_empty() {
        groups.push(group(None, &outside, list));
    }
    for b in &found.blocks {
        let members: Vec<&TensorSizes> = b.tensors.iter().collect();
        groups.push(group(Some(b.name.clone()), &members, list));
    }
    let all: Vec<&TensorSizes> = found
        .outside
        .iter()
        .chain(found.blocks.iter().flat_map(|b| b.tensors.iter()))
        .collect();
    let total = group(None, &all, false);
    Report {
        files: ckpt
            .files()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        gguf: ckpt.gguf().map(gguf_report),
        tensors: total.tensors,
        bytes: total.bytes,
        bf16_bytes: total.bf16_bytes,
        dtypes: total.dtypes,
        by_dtype: by_dtype(&all),
        blocks: found.blocks.len(),
        groups,
    }
}

fn dtype_list(dtypes: &BTreeMap<&'static str, usize>) -> String {
    dtypes
        .iter()
        .map(|(d, n)| format!("{n} {d}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The longest string value printed whole; chat templates run to kilobytes over many lines.
const SHOWN_CHARS: usize = 60;

/// A metadata value on one line of the table.
fn shown_value(v: &GgufValue) -> String {
    match v {
        GgufValue::Array(a) => format!("[{} x {}]", a.len(), a.element_type().name()),
        GgufValue::String(s) => {
            let first = s.lines().next().unwrap_or("");
            let short: String = first.chars().take(SHOWN_CHARS).collect();
            if short.len() == s.len() {
                format!("{s:?}")
            } else {
                format!("{short:?}... ({} chars)", s.chars().count())
            }
        }
        GgufValue::Bool(b) => b.to_string(),
        GgufValue::F32(x) => x.to_string(),
        GgufValue::F64(x) => x.to_string(),
        other => other
            .as_i64()
            .map(|n| n.to_string())
            .or_else(|| other.as_u64().map(|n| n.to_string()))
            .unwrap_or_default(),
    }
}

fn write_gguf(out: &mut dyn Write, g: &GgufFile) -> std::io::Result<()> {
    let mut head = format!("GGUF v{}", g.version);
    if let Some(arch) = g.architecture() {
        head += &format!(", architecture {arch}");
    }
    if let Some(name) = g.get("general.name").and_then(GgufValue::as_str) {
        head += &format!(", name {name:?}");
    }
    writeln!(
        out,
        "{head}, alignment {}, data from byte {}",
        g.alignment, g.data_start
    )?;
    writeln!(out, "metadata ({} keys)", g.metadata.len())?;
    let width = g.metadata.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in &g.metadata {
        writeln!(out, "  {k:<width$}  {}", shown_value(v))?;
    }
    Ok(())
}

pub fn run(args: &InspectArgs, out: &mut dyn Write) -> Result<(), Box<dyn std::error::Error>> {
    let ckpt = Checkpoint::open(&args.checkpoint)?;
    let found = ModelBlocks::from_tensors(ckpt.tensors());
    let r = report(&ckpt, &found, args.tensors);
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &r)?;
        writeln!(out)?;
        return Ok(());
    }
    for f in &r.files {
        writeln!(out, "{f}")?;
    }
    if let Some(g) = ckpt.gguf() {
        write_gguf(out, g)?;
    }
    let width = r
        .groups
        .iter()
        .map(|g| g.block.as_deref().map_or(16, str::len))
        .max()
        .unwrap_or(16)
        .max(16);
    writeln!(
        out,
        "{:<width$}  {:>7}  {:>10}  dtypes",
        "block", "tensors", "size"
    )?;
    for g in &r.groups {
        let name = g.block.as_deref().unwrap_or("(outside blocks)");
        writeln!(
            out,
            "{name:<width$}  {:>7}  {:>10}  {}",
            g.tensors,
            format_bytes(g.bytes),
            dtype_list(&g.dtypes)
        )?;
        for t in &g.list {
            writeln!(
                out,
                "    {:<w$}  {:>8}  {:>10}  {:?}",
                t.name,
                t.dtype,
                format_bytes(t.bytes),
                t.shape,
                w = width.saturating_sub(4)
            )?;
        }
    }
    writeln!(
        out,
        "{:<width$}  {:>7}  {:>10}  {}",
        format!("total ({} blocks)", r.blocks),
        r.tensors,
        format_bytes(r.bytes),
        dtype_list(&r.dtypes)
    )?;
    writeln!(
        out,
        "{:<8}  {:>7}  {:>10}  {:>10}",
        "dtype", "tensors", "size", "as bf16"
    )?;
    for d in &r.by_dtype {
        writeln!(
            out,
            "{:<8}  {:>7}  {:>10}  {:>10}",
            d.dtype,
            d.tensors,
            format_bytes(d.bytes),
            format_bytes(d.bf16_bytes)
        )?;
    }
    // Only a compact form makes the comparison say something: bf16 weights expand to
    // themselves, and f32 ones would seem to shrink.
    if r.by_dtype.iter().any(|d| d.compact) && r.bytes > 0 {
        writeln!(
            out,
            "stored {} compact, {} expanded to bf16 ({:.2}x)",
            format_bytes(r.bytes),
            format_bytes(r.bf16_bytes),
            r.bf16_bytes as f64 / r.bytes as f64
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fit_on_one_line() {
        let s = |v: &str| shown_value(&GgufValue::String(v.to_owned()));
        assert_eq!(s("llama"), "\"llama\"");
        // Cut on characters, not bytes: a multi-byte character at the cut stays whole.
        let long = "é".repeat(70);
        assert_eq!(s(&long), format!("{:?}... (70 chars)", "é".repeat(60)));
        assert_eq!(s("a\nb"), "\"a\"... (3 chars)");
        assert_eq!(shown_value(&GgufValue::I32(-3)), "-3");
        assert_eq!(shown_value(&GgufValue::U64(u64::MAX)), u64::MAX.to_string());
        assert_eq!(shown_value(&GgufValue::Bool(true)), "true");
        let tokens = GgufArray::String(vec!["a".into(); 5]);
        assert_eq!(shown_value(&GgufValue::Array(tokens)), "[5 x string]");
        let nested = GgufArray::Array(vec![GgufArray::U8(vec![1])]);
        assert_eq!(shown_value(&GgufValue::Array(nested)), "[1 x array]");
    }

    #[test]
    fn json_values_keep_their_numbers() {
        let row = meta_row("k", &GgufValue::I64(-7));
        assert_eq!(row.value, Some(serde_json::json!(-7)));
        let row = meta_row("k", &GgufValue::U64(u64::MAX));
        assert_eq!(row.value, Some(serde_json::json!(u64::MAX)));
        let row = meta_row("k", &GgufValue::Array(GgufArray::F32(vec![0.5; 3])));
        assert_eq!(
            (row.value, row.element_type, row.len),
            (None, Some("f32"), Some(3))
        );
    }
}
