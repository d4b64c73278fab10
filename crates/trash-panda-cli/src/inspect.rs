//! `trash-panda inspect`: a checkpoint's tensors grouped by block.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use trash_panda::checkpoint::Checkpoint;
use trash_panda::plan::{ModelBlocks, TensorSizes};
use trash_panda::units::format_bytes;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A .safetensors file, a *.safetensors.index.json, or a folder of shards.
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
    dtypes: BTreeMap<&'static str, usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    list: Vec<TensorRow<'a>>,
}

#[derive(Serialize, Debug)]
struct Report<'a> {
    files: Vec<String>,
    tensors: usize,
    bytes: u64,
    dtypes: BTreeMap<&'static str, usize>,
    blocks: usize,
    groups: Vec<Group<'a>>,
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
        tensors: total.tensors,
        bytes: total.bytes,
        dtypes: total.dtypes,
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
    Ok(())
}
