fn main() {
    let code = trash_panda_cli::run(std::env::args_os());
    std::process::exit(code);
}
