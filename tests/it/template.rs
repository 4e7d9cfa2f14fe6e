//! The SAM template and docs/configuration.md keep up with the configuration: both are
//! checked against the one table of variables, `config::vars::VARIABLES`.

use std::path::PathBuf;

use quota_gate::config::table::markdown_table;
use quota_gate::config::vars::{Applies, VARIABLES};

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
/// change to `VARIABLES`, print it with `cargo test --test it template:: --
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
/// is `NoEcho` (none holds a secret), and each function may read its own
/// secrets only: `secretsmanager:GetSecretValue` on the hash key and the
/// optional Valkey secret for the gate, on the Valkey secret alone for the
/// consumer (it digests nothing), no wildcard.
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
    let gate = resource(&template, "QuotaGateFunction");
    let grant = gate
        .split("Action: secretsmanager:GetSecretValue")
        .nth(1)
        .expect("the function may read its secrets");
    let resources = listed(grant);
    assert_eq!(
        resources,
        [
            "                - !If [CreateHashSecret, !Ref HashSecret, !Ref HashSecretArn]",
            "                - !If [HasValkeySecret, !Ref ValkeySecretArn, !Ref AWS::NoValue]",
        ]
    );
    let consumer = resource(&template, "QuotaConsumerFunction");
    let grant = consumer
        .split("Action: secretsmanager:GetSecretValue")
        .nth(1)
        .expect("the consumer may read the Valkey secret");
    let resources: Vec<&str> = listed(grant).into_iter().map(str::trim).collect();
    assert_eq!(resources, ["- !Ref ValkeySecretArn"]);
    assert!(
        consumer.contains(
            "              - HasValkeySecret\n              - Sid: ReadTheValkeySecret\n"
        )
    );
    assert_eq!(template.matches("Action: secretsmanager:").count(), 2);
}

/// The items of the list that follows an action's line and its `Resource:`
/// line: the lines as indented as the first, each an item (`- …`).
fn listed(grant: &str) -> Vec<&str> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut lines = grant.lines().skip(2).peekable(); // the action's line, `Resource:`
    let first = lines.peek().map_or(0, |l| indent(l));
    lines
        .take_while(|l| indent(l) == first && l.trim_start().starts_with('-'))
        .collect()
}

/// The block of the top-level key `name` of a section (two spaces in): its
/// lines up to the next such key.
fn resource<'a>(template: &'a str, name: &str) -> &'a str {
    let start = template
        .find(&format!("\n  {name}:\n"))
        .unwrap_or_else(|| panic!("template.yaml has no {name}"))
        + 1;
    let block = &template[start..];
    let mut end = 0;
    for (i, line) in block.split_inclusive('\n').enumerate() {
        let outdented = !line.starts_with("   ") && !line.trim().is_empty();
        if i > 0 && outdented && !line.trim_start().starts_with('#') {
            break;
        }
        end += line.len();
    }
    &block[..end]
}

/// The created cache takes IAM sign-in only: it is attached to a user group
/// of an IAM-enabled gate user and the `default` user every group must hold,
/// switched off; each function may connect as that user to that cache alone,
/// and its environment names the user and the cache, no password.
#[test]
fn created_cache_takes_iam_sign_in_only() {
    let template = read("template.yaml");
    let gate_user = resource(&template, "ValkeyGateUser");
    for line in [
        "Type: AWS::ElastiCache::User",
        "Condition: CreateCache",
        "UserId: !Sub \"${CacheName}-gate\"",
        "UserName: !Sub \"${CacheName}-gate\"",
        "Engine: valkey",
        "Type: iam",
        "AccessString: \"on ~* +@all -@dangerous +info\"",
    ] {
        assert!(
            gate_user.contains(line),
            "ValkeyGateUser lacks {line}:\n{gate_user}"
        );
    }
    let default = resource(&template, "ValkeyDefaultUser");
    for line in [
        "UserName: default",
        "AccessString: \"off -@all\"",
        "Engine: valkey",
    ] {
        assert!(
            default.contains(line),
            "ValkeyDefaultUser lacks {line}:\n{default}"
        );
    }
    let group = resource(&template, "ValkeyUserGroup");
    assert!(
        group.contains("Type: AWS::ElastiCache::UserGroup"),
        "{group}"
    );
    assert!(
        group.contains(
            "UserIds:\n        - !Ref ValkeyDefaultUser\n        - !Ref ValkeyGateUser\n"
        ),
        "{group}"
    );
    let cache = resource(&template, "ValkeyCache");
    assert!(
        cache.contains("UserGroupId: !Ref ValkeyUserGroup"),
        "{cache}"
    );
    // The gate and the consumer sign in as the gate's user, to that cache alone.
    for name in ["QuotaGateFunction", "QuotaConsumerFunction"] {
        let function = resource(&template, name);
        let grant = function
            .split("Action: elasticache:Connect")
            .nth(1)
            .unwrap_or_else(|| panic!("{name} may connect to its cache"));
        let resources: Vec<&str> = listed(grant).into_iter().map(str::trim).collect();
        assert_eq!(
            resources,
            ["- !GetAtt ValkeyCache.ARN", "- !GetAtt ValkeyGateUser.Arn"],
            "{name}"
        );
        assert!(function.contains("              - IamAuth\n"), "{name}");
        assert_no_password(name, function);
    }
    assert_eq!(template.matches("Action: elasticache:").count(), 2);
    assert!(template.contains(
        "  IamAuth: !And [!Condition UseCreatedCache, !Not [!Condition HasValkeySecret]]\n"
    ));
}

/// `name`'s environment names the cache's IAM user and the cache, no
/// password, token or credentials in a URL.
fn assert_no_password(name: &str, function: &str) {
    let environment = function.split("      Environment:\n").nth(1).unwrap();
    let environment = environment.split("      Events:\n").next().unwrap();
    for line in [
        "VALKEY_AUTH: !If [IamAuth, iam, password]",
        "VALKEY_USER: !If [IamAuth, !Ref ValkeyGateUser, \"\"]",
        "VALKEY_CACHE_NAME: !If [IamAuth, !Ref CacheName, \"\"]",
        "VALKEY_CACHE_SERVERLESS: !If [IamAuth, \"true\", \"false\"]",
    ] {
        assert!(
            environment.contains(line),
            "{name}'s environment lacks {line}"
        );
    }
    // Past its comments and the word `password` of VALKEY_AUTH: no password, token or
    // credentials in a URL.
    let settings: String = environment
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.contains("VALKEY_AUTH: "))
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase();
    for word in ["password", "authtoken", "auth_token", "@"] {
        assert!(
            !settings.contains(word),
            "a password in {name}'s environment ({word})"
        );
    }
}
