//! The SAM template and the README keep up with the configuration: both are
//! checked against the one table of variables, `config::vars::VARIABLES`.

use std::path::PathBuf;

use quota_gate::config::vars::{Applies, VARIABLES, markdown_table};

fn read(path: &str) -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// Every setting the Lambda function reads reaches it through template.yaml
/// (not the local server's own settings, a local CA file path, which a
/// Lambda zip would have to ship, or the log filter).
#[test]
fn template_sets_every_variable() {
    let template = read("template.yaml");
    let lambda: Vec<_> = VARIABLES
        .iter()
        .filter(|v| v.applies == Applies::Everywhere)
        .collect();
    assert!(lambda.len() > 20, "{lambda:?}");
    for var in lambda {
        assert!(
            template.contains(&format!("          {}: ", var.name)),
            "template.yaml does not set {}",
            var.name
        );
    }
}

/// The README's configuration table is the table, row for row. After a
/// change to `VARIABLES`, print it with `cargo test --test template --
/// --nocapture` and paste it.
#[test]
fn readme_table_is_the_variables_table() {
    let readme = read("README.md");
    let table = markdown_table();
    assert!(
        readme.contains(&table),
        "README.md's configuration table differs from config::vars::VARIABLES; it should be:\n\n{table}"
    );
}
