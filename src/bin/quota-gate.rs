//! `quota-gate`: the local server and the operator tools. See `quota-gate --help`.

fn main() -> std::process::ExitCode {
    quota_gate::cli::main()
}
