//! The SAM template and docs/configuration.md keep up with the configuration: both are
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

/// docs/configuration.md's table is the table, row for row. After a
/// change to `VARIABLES`, print it with `cargo test --test template --
/// --nocapture` and paste it.
#[test]
fn readme_table_is_the_variables_table() {
    let doc = read("docs/configuration.md");
    let table = markdown_table();
    assert!(
        doc.contains(&table),
        "docs/configuration.md's table differs from config::vars::VARIABLES; it should be:\n\n{table}"
    );
}

/// Each numeric parameter's description starts with its variable, and its
/// `MinValue`/`MaxValue` lie within that variable's range: a stack cannot be
/// deployed with a value the function would refuse at every cold start.
#[test]
fn numeric_parameters_stay_in_their_variables_range() {
    let template = read("template.yaml");
    let section = template.split("\nParameters:\n").nth(1).unwrap();
    let section = section.split("\nRules:\n").next().unwrap();
    // One block per parameter: its name line (two spaces in), then its fields.
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in section.lines() {
        if line.starts_with("  ") && !line.starts_with("   ") && line.ends_with(':') {
            blocks.push(vec![line.trim().trim_end_matches(':')]);
        } else if let Some(block) = blocks.last_mut() {
            block.push(line.trim());
        }
    }
    let mut checked = 0;
    for block in blocks.iter().filter(|b| b.contains(&"Type: Number")) {
        let name = block[0];
        let field = |key: &str| {
            block
                .iter()
                .find_map(|l| l.strip_prefix(key))
                .map(str::trim)
        };
        // The description may start on the line after `>-`.
        let description = match field("Description:") {
            Some(">-") => block
                .iter()
                .skip_while(|l| !l.starts_with("Description:"))
                .nth(1)
                .copied(),
            other => other,
        };
        let var_name = description.unwrap_or_default().split(',').next().unwrap();
        let Some(var) = VARIABLES.iter().find(|v| v.name == var_name) else {
            continue;
        };
        let (min, max) = var
            .range
            .unwrap_or_else(|| panic!("{var_name} is not a number"));
        let number = |key: &str| -> u64 {
            field(key)
                .unwrap_or_else(|| panic!("{name} has no {key}"))
                .parse()
                .unwrap_or_else(|e| panic!("{name} {key}: {e}"))
        };
        let (t_min, t_max) = (number("MinValue:"), number("MaxValue:"));
        assert!(
            min <= t_min && t_max <= max,
            "{name}: {t_min}..={t_max} is not within {var_name}'s {min}..={max}"
        );
        checked += 1;
    }
    assert!(checked >= 12, "only {checked} numeric parameters found");
}

/// No secret value is in the function's configuration: every secret
/// variable of the table is set in template.yaml as a `secretsmanager:`
/// reference (or, for `VALKEY_URL`, a URL without credentials), no parameter
/// is `NoEcho` (none holds a secret), and the function may read its own
/// secrets only: `secretsmanager:GetSecretValue` on the hash key and the
/// optional Valkey secret, no wildcard.
#[test]
fn template_keeps_secrets_out_of_the_environment() {
    let template = read("template.yaml");
    assert!(!template.contains("NoEcho"), "a parameter holds a secret");
    for var in VARIABLES.iter().filter(|v| v.secret) {
        let at = template
            .find(&format!("          {}: ", var.name))
            .unwrap_or_else(|| panic!("template.yaml does not set {}", var.name));
        let setting: String = template[at..].lines().take(4).collect();
        assert!(
            setting.contains("\"secretsmanager:${"),
            "{} is not set by reference: {setting}",
            var.name
        );
    }
    let grant = template
        .split("Action: secretsmanager:GetSecretValue")
        .nth(1)
        .expect("the function may read its secrets");
    let resources: Vec<&str> = grant
        .lines()
        .skip(2) // the rest of the action's line, `Resource:`
        .take_while(|l| l.trim_start().starts_with('-'))
        .collect();
    assert_eq!(
        resources,
        [
            "                - !If [CreateHashSecret, !Ref HashSecret, !Ref HashSecretArn]",
            "                - !If [HasValkeySecret, !Ref ValkeySecretArn, !Ref AWS::NoValue]",
        ]
    );
    assert_eq!(template.matches("Action: secretsmanager:").count(), 1);
}
