//! `trash-panda plan CHECKPOINT`: the automatic plan for this machine (or for injected figures).

use std::path::PathBuf;

use trash_panda::plan::{plan, Figures, MinFreeRam, ModelBlocks, PlanOptions};
use trash_panda::sys::MemoryFigures;
use trash_panda::units::parse_bytes;
use trash_panda::{Checkpoint, DType};

fn bytes(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

fn min_free(s: &str) -> Result<MinFreeRam, String> {
    s.parse()
        .map_err(|e: trash_panda::units::UnitsError| e.to_string())
}

fn dtype(s: &str) -> Result<DType, String> {
    s.parse()
        .map_err(|e: trash_panda::DtypeError| e.to_string())
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// A .safetensors file, a *.safetensors.index.json, a folder of shards, or a .gguf file.
    pub checkpoint: PathBuf,
    /// Cap on the GPU memory the plan uses, e.g. "9GB".
    #[arg(long, value_parser = bytes)]
    pub max_vram: Option<u64>,
    /// RAM left to the rest of the machine: "auto" (8% of RAM, 1..4 GB) or a size.
    #[arg(long, value_parser = min_free, default_value = "auto")]
    pub min_free_ram: MinFreeRam,
    /// GPU memory kept free for activations when --activation-vram is not given [default: the
    /// planner's, 1.5GB].
    #[arg(long, value_parser = bytes)]
    pub headroom_vram: Option<u64>,
    /// Measured peak activation memory; replaces --headroom-vram.
    #[arg(long, value_parser = bytes)]
    pub activation_vram: Option<u64>,
    /// Exactly this many blocks resident on the device.
    #[arg(long)]
    pub resident_blocks: Option<usize>,
    /// f32, f16 or bf16; the dtype most float weights are stored in when absent (bf16 for fp8).
    #[arg(long, value_parser = dtype)]
    pub compute_dtype: Option<DType>,
    /// bf16 or fp8; as stored when absent.
    #[arg(long, value_parser = dtype)]
    pub storage_dtype: Option<DType>,
    /// Streamed blocks staged ahead of the one that runs [default: TRASH_PANDA_LOOKAHEAD, or 2].
    #[arg(long)]
    pub lookahead: Option<usize>,
    /// Free GPU memory to plan for instead of probing, e.g. "24GB" (plans for a GPU even on a
    /// machine without one).
    #[arg(long, value_parser = bytes)]
    pub vram: Option<u64>,
    /// Available RAM to plan for instead of probing (no cgroup limit, no swap).
    #[arg(long, value_parser = bytes)]
    pub ram: Option<u64>,
    /// Print the plan as JSON (docs/plan-format.md).
    #[arg(long)]
    pub json: bool,
}

impl PlanArgs {
    pub fn options(&self) -> Result<PlanOptions, trash_panda::settings::SettingsError> {
        let lookahead = match self.lookahead {
            Some(n) => n,
            None => match trash_panda::settings::get("lookahead", None)? {
                trash_panda::settings::Value::Count(n) => n as usize,
                _ => PlanOptions::DEFAULT_LOOKAHEAD,
            },
        };
        // TRASH_PANDA_PINNED_BUFFERS, as the library's plan() counts it (0: the default).
        let staging_buffers = match trash_panda::settings::get("pinned_buffers", None)? {
            trash_panda::settings::Value::Count(n) => {
                trash_panda::rules::asked_staging_buffers(n as usize)
            }
            _ => None,
        };
        // TRASH_PANDA_MAX_LOOKAHEAD, as the library's plan() counts it (0: the look-ahead).
        let max_lookahead = match trash_panda::settings::get("max_lookahead", None)? {
            trash_panda::settings::Value::Count(n) => {
                trash_panda::rules::asked_max_depth(n as usize)
            }
            _ => None,
        };
        // TRASH_PANDA_RAM_IN_MEMORY: a RAM tier read into memory stages its blocks.
        let ram_in_memory = trash_panda::settings::get("ram_in_memory", None)?
            == trash_panda::settings::Value::Switch(true);
        Ok(PlanOptions {
            resident_blocks: self.resident_blocks,
            max_vram: self.max_vram,
            min_free_ram: self.min_free_ram,
            headroom_vram: self
                .headroom_vram
                .unwrap_or(PlanOptions::DEFAULT_HEADROOM_VRAM),
            activation_vram: self.activation_vram,
            compute_dtype: self.compute_dtype,
            storage_dtype: self.storage_dtype,
            lookahead,
            staging_buffers,
            max_lookahead,
            ram_in_memory,
            // A pipeline's shared pool is the library's; a plan made here stands alone.
            staging_pool: None,
            // Adapters are put on a model in Python; a checkpoint alone has none.
            adapter_bytes: 0,
            merged_modules: Vec::new(),
        })
    }

    /// Injected figures win over probes, so `--ram 32GB --vram 24GB` gives the same plan on
    /// every machine.
    pub fn figures(&self) -> Result<Figures, Box<dyn std::error::Error>> {
        let memory = match self.ram {
            Some(ram) => MemoryFigures::with_ram(ram),
            None => MemoryFigures::probe()?,
        };
        let free_vram = match self.vram {
            Some(v) => Some(v),
            None => trash_panda::sys::nvml::probe().free_vram(0),
        };
        Ok(Figures {
            memory,
            free_vram,
            device: None,
        })
    }
}

pub fn run(
    args: &PlanArgs,
    out: &mut dyn std::io::Write,
) -> Result<(), Box<dyn std::error::Error>> {
    let checkpoint = Checkpoint::open(&args.checkpoint)?;
    let model = ModelBlocks::from_tensors(checkpoint.tensors());
    let p = plan(&model, &args.figures()?, &args.options()?)?;
    if args.json {
        writeln!(out, "{}", p.to_json())?;
    } else {
        write!(out, "{p}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: PlanArgs,
    }

    #[test]
    fn parses_sizes_and_defaults() {
        let cli = Cli::try_parse_from([
            "plan",
            "m.safetensors",
            "--vram",
            "24GB",
            "--ram",
            "64 GiB",
            "--max-vram",
            "9GB",
            "--storage-dtype",
            "fp8",
            "--json",
        ])
        .unwrap();
        let o = cli.args.options().unwrap();
        assert_eq!(o.max_vram, Some(9_000_000_000));
        assert_eq!(o.headroom_vram, 1_500_000_000);
        assert_eq!(o.min_free_ram, MinFreeRam::Auto);
        assert_eq!(o.storage_dtype, Some(DType::F8E4M3));
        assert_eq!(
            o,
            PlanOptions {
                max_vram: o.max_vram,
                storage_dtype: o.storage_dtype,
                ..PlanOptions::default()
            }
        );
        let f = cli.args.figures().unwrap();
        assert_eq!(
            (f.free_vram, f.memory.available_ram),
            (Some(24_000_000_000), 64 << 30)
        );
        let err = Cli::try_parse_from(["plan", "m", "--max-vram", "9 parsecs"]).unwrap_err();
        assert!(err.to_string().contains("parsecs"), "{err}");
    }

    #[test]
    fn reports_checkpoint_errors() {
        let cli = Cli::try_parse_from(["plan", "/no/such.safetensors", "--ram", "1GB"]).unwrap();
        let mut out = Vec::new();
        let err = run(&cli.args, &mut out).unwrap_err();
        assert!(err.to_string().contains("/no/such.safetensors"), "{err}");
    }
}
