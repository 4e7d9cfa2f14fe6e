//! `quota-gate`: the local server and the operator tools. See `quota-gate --help`.

/// mimalloc: the request path allocates many small, short-lived buffers across worker threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    quota_gate::front::cli::main()
}
