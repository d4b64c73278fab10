//! The `trash-panda` command. The native binary and the Python console script both call [`run`].

pub mod doctor;
pub mod plan;

/// Runs the command line and returns the process exit code.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let _ = args.into_iter().count();
    0
}
