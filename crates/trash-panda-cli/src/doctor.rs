//! `trash-panda doctor [PATH]`: the machine report to paste into a bug report.

use std::path::PathBuf;

use trash_panda::sys::DoctorReport;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Where checkpoints are read from: its filesystem is reported and its read speed probed.
    #[arg(default_value = ".")]
    pub path: Option<PathBuf>,
    /// Skip the read-speed probe (it writes and reads a 256 MiB file for about 2 s).
    #[arg(long)]
    pub no_probe: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run(
    args: &DoctorArgs,
    out: &mut dyn std::io::Write,
) -> Result<(), Box<dyn std::error::Error>> {
    let path = args.path.clone().unwrap_or_else(|| PathBuf::from("."));
    let report = DoctorReport::collect(&path, !args.no_probe);
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        write!(out, "{report}")?;
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
        args: DoctorArgs,
    }

    #[test]
    fn reports_without_probe() {
        let cli = Cli::try_parse_from(["doctor", "--no-probe"]).unwrap();
        assert_eq!(cli.args.path.as_deref(), Some(std::path::Path::new(".")));
        let mut out = Vec::new();
        run(&cli.args, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("kernel:") && text.contains("ram:") && text.contains("disk:"),
            "{text}"
        );
        let cli = Cli::try_parse_from(["doctor", "--no-probe", "--json"]).unwrap();
        let mut out = Vec::new();
        run(&cli.args, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(v.get("gpus").is_some());
    }
}
