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
}

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
