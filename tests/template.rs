//! The SAM template and the README keep up with the configuration: every
//! variable in `src/config.rs`'s table is set by `template.yaml` and listed in
//! the README's configuration table.

use std::path::PathBuf;

fn read(path: &str) -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// The variables named in the first column of `src/config.rs`'s table.
fn config_variables() -> Vec<String> {
    read("src/config.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//! | `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// Every setting reaches the function through template.yaml (but the local
/// server's address and connection cap, which Lambda does not use, and a CA
/// file path, which a Lambda zip would have to ship).
#[test]
fn template_sets_every_variable() {
    let template = read("template.yaml");
    let vars = config_variables();
    assert!(vars.len() > 20, "{vars:?}");
    for var in vars.iter().filter(|v| {
        !["QUOTA_LISTEN", "QUOTA_MAX_CONNECTIONS", "VALKEY_TLS_CA"].contains(&v.as_str())
    }) {
        assert!(
            template.contains(&format!("          {var}: ")),
            "template.yaml does not set {var}"
        );
    }
}

/// Every setting is documented in the README's configuration table.
#[test]
fn readme_lists_every_variable() {
    let readme = read("README.md");
    for var in config_variables() {
        assert!(
            readme.contains(&format!("| `{var}` |")),
            "README.md does not list {var}"
        );
    }
}
