//! The `trash-panda` command. The native binary and the Python console script both call [`run`].

use std::io::Write;

use clap::{Parser, Subcommand};

pub mod doctor;
pub mod inspect;
pub mod plan;

/// Stream model weights across GPU memory, host RAM and disk.
#[derive(Parser, Debug)]
#[command(name = "trash-panda", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List a checkpoint's tensors grouped by block, with dtypes and sizes.
    Inspect(inspect::InspectArgs),
    /// Plan which blocks of a checkpoint go to the GPU, RAM and disk.
    Plan(plan::PlanArgs),
    /// Print a hardware report for bug reports.
    Doctor(doctor::DoctorArgs),
    /// Generate text with a transformers causal LM streamed from its folder (needs the Python
    /// package: `pip install dumpsterpanda` gives a `trash-panda` command that runs it).
    Generate(GenerateArgs),
}

/// `generate` runs the model with PyTorch, so only the Python package's command can run it.
#[derive(clap::Args, Debug)]
struct GenerateArgs {
    /// FOLDER --prompt TEXT [--max-new-tokens N] [--max-vram SIZE] [--plan FILE] ...
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

const GENERATE_NEEDS_PYTHON: &str = "`generate` runs the model with PyTorch: use the `trash-panda` command \
    that the Python package installs (pip install dumpsterpanda), or `python -m trash_panda.cli generate ...`";

/// Runs the command line (argv[0] included) and returns the process exit code.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match &cli.command {
        Command::Inspect(a) => inspect::run(a, &mut out),
        Command::Plan(a) => plan::run(a, &mut out),
        Command::Doctor(a) => doctor::run(a, &mut out),
        Command::Generate(_) => Err(GENERATE_NEEDS_PYTHON.into()),
    };
    let _ = out.flush();
    match result {
        Ok(()) => 0,
        // `trash-panda inspect x | head` closes the pipe early: that is not a failure.
        Err(e) if is_broken_pipe(e.as_ref()) => 0,
        Err(e) => {
            eprintln!("trash-panda: error: {e}");
            1
        }
    }
}

fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

#[cfg(test)]
mod tests {
    #[test]
    fn generate_points_to_the_python_command() {
        // Parsed (its arguments pass through as they are), then refused with exit code 1.
        assert_eq!(
            super::run(["trash-panda", "generate", "folder", "--prompt", "hi"]),
            1
        );
    }
}
