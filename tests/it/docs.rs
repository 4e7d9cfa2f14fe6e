//! The docs cannot go stale: their examples are run and compared with what the
//! program prints, and the lists they repeat are checked against the one place
//! each is defined (the template, the alert rules, `meter/catalogue.rs`,
//! `tests/it/architecture.rs`'s pure modules, a real Valkey's keys, the lock file).

use quota_gate_testkit as common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use http::HeaderValue;
use quota_gate::front::ops::change;
use quota_gate::front::ops::subject::{self, SubjectArg};
use redis::AsyncCommands;

fn read(path: &str) -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The text between the first `start` in `text` and the next `end` (or the
/// end of `text`).
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let after = text.split(start).nth(1);
    let after = after.unwrap_or_else(|| panic!("no {start:?}"));
    after.split(end).next().unwrap_or_default()
}

/// The text of the fenced blocks after `marker` in `doc`, in order.
fn blocks_after<'a>(doc: &'a str, marker: &str) -> Vec<&'a str> {
    let from = doc.find(marker).unwrap_or_else(|| panic!("{marker:?}"));
    // Split on fences: odd pieces are the blocks (info string on their first line).
    doc[from..]
        .split("```")
        .skip(1)
        .step_by(2)
        .map(|b| b.split_once('\n').map_or("", |(_, text)| text))
        .collect()
}

/// The text of the first fenced block after `marker` in `doc`.
fn block_after<'a>(doc: &'a str, marker: &str) -> &'a str {
    blocks_after(doc, marker)[0]
}

/// The first column of the markdown table whose header line starts with `header`,
/// backticks removed.
fn first_column(doc: &str, header: &str) -> Vec<String> {
    let from = doc.find(header).unwrap_or_else(|| panic!("{header:?}"));
    doc[from..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').nth(1).unwrap().trim().replace('`', ""))
        .collect()
}

/// Resource names in template.yaml of the given `Type`.
fn template_resources(kind: &str) -> BTreeSet<String> {
    let template = read("template.yaml");
    let lines: Vec<&str> = template.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[1].trim() == format!("Type: {kind}"))
        .filter(|w| w[0].starts_with("  ") && !w[0].starts_with("   "))
        .map(|w| w[0].trim().trim_end_matches(':').to_owned())
        .collect()
}

/// The names of template.yaml's parameters.
fn template_parameters() -> BTreeSet<String> {
    let template = read("template.yaml");
    between(&template, "\nParameters:\n", "\nRules:\n")
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   ") && l.ends_with(':'))
        .map(|l| l.trim().trim_end_matches(':').to_owned())
        .collect()
}

fn number_word(n: usize) -> &'static str {
    [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    ]
    .get(n)
    .copied()
    .unwrap_or("many")
}

/// Every `console` example of docs/operations.md (`--help`, `inspect`,
/// `reset`, `purge`) prints what the doc shows, run by trycmd against a real
/// Valkey holding the scans the doc describes.
#[tokio::test(flavor = "multi_thread")]
async fn operator_examples_print_what_the_doc_shows() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[("QUOTA_DELAY_MODE", "defer")]);
    let scans = (0..35).map(|_| scan_from("203.0.113.7"));
    let others = (0..3).map(|_| scan_from("198.51.100.23"));
    for r in one_at_a_time(&gate, scans.chain(others)).await {
        assert_eq!(r.status(), 202);
    }
    let url = server.url();
    tokio::task::spawn_blocking(move || {
        trycmd::TestCases::new()
            .register_bin(
                "quota-gate",
                PathBuf::from(env!("CARGO_BIN_EXE_quota-gate")),
            )
            .env("VALKEY_URL", url)
            .env("QUOTA_HASH_SECRET", SECRET_TEXT)
            .env("RUST_LOG", "warn")
            .case("docs/operations.md")
            .run();
    })
    .await
    .unwrap();
}

/// Every `quota-gate …` command the "Operate" block of docs/operations.md shows is one of
/// its examples (run above), or `stats` (run by tests/it/ops.rs
/// against moto).
#[test]
fn readme_operator_commands_are_the_runbooks() {
    let runbook = read("docs/operations.md");
    let block = block_after(&runbook, "## Operate");
    let commands: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| l.starts_with("quota-gate "))
        .collect();
    assert!(commands.len() >= 5, "{block}");
    for command in commands {
        let sub = command.split_whitespace().nth(1).unwrap();
        assert!(
            runbook.contains(&format!("$ {command}\n"))
                || runbook.contains(&format!("$ quota-gate {sub} ")),
            "`{command}` has no example in docs/operations.md"
        );
    }
}

/// The README's "Try it" request, sent to `serve` as written, answers with the
/// status, the header names and the JSON keys the README shows, and the values
/// it shows for a first scan.
#[test]
fn try_it_answers_as_shown() {
    let readme = read("README.md");
    let blocks = blocks_after(&readme, "## Try it");
    let command = blocks[0].replace("\\\n", " ");
    let shown = blocks[1];
    let (shown_head, shown_body) = shown.split_once("\n\n").unwrap();

    // The request exactly as the curl line builds it.
    assert!(command.contains("curl -si -X POST http://127.0.0.1:9000/scan"));
    let header = between(&command, "-H '", "'");
    let (name, value) = header.split_once(": ").unwrap();
    let body = between(&command, "-d '", "'");
    let (_serve, addr) = serve::spawn_serve(&[]);
    let request = client::build(
        "POST",
        "/scan",
        &[(name, value), ("Connection", "close")],
        body,
    );
    let (status, text) = client::send(addr, request.as_bytes(), Duration::from_secs(30)).unwrap();
    let (head, answer) = text.split_once("\r\n\r\n").unwrap();

    assert_eq!(
        head.lines().next().unwrap(),
        shown_head.lines().next().unwrap()
    );
    assert_eq!(status, 202);
    let names = |lines: Vec<&str>| -> BTreeSet<String> {
        lines
            .iter()
            .filter_map(|l| l.split_once(':'))
            .map(|(n, _)| n.to_ascii_lowercase())
            .filter(|n| !["content-length", "date", "connection"].contains(&n.as_str()))
            .collect()
    };
    assert_eq!(
        names(head.lines().skip(1).collect()),
        names(shown_head.lines().skip(1).collect()),
        "header names"
    );
    let shown_json: serde_json::Value = serde_json::from_str(shown_body).unwrap();
    let answer_json: serde_json::Value = serde_json::from_str(answer).unwrap();
    assert_eq!(keys(&answer_json), keys(&shown_json), "JSON keys");
    for field in ["status", "delayMs", "sleptMs", "deferredMs"] {
        assert_eq!(answer_json[field], shown_json[field], "{field}");
    }
    for field in ["scope", "limit", "used", "remaining"] {
        assert_eq!(answer_json["quota"][field], shown_json["quota"][field]);
    }
    for line in shown_head.lines().skip(1) {
        let (n, v) = line.split_once(": ").unwrap();
        let got = head
            .lines()
            .find_map(|l| {
                l.split_once(": ")
                    .filter(|(an, _)| an.eq_ignore_ascii_case(n))
            })
            .map(|(_, v)| v)
            .unwrap();
        match n {
            "x-stella-reset" | "ratelimit" => assert_eq!(shape(got), shape(v), "{n}: {got} vs {v}"),
            _ => assert_eq!(got, v, "{n}"),
        }
    }
    // Instants as shown: seconds for the reset, three fraction digits for notBefore.
    let (got, doc) = (&answer_json["notBefore"], &shown_json["notBefore"]);
    assert_eq!(shape(got.as_str().unwrap()), shape(doc.as_str().unwrap()));
    for id in [&answer_json["scanId"], &shown_json["scanId"]] {
        let id = uuid::Uuid::parse_str(id.as_str().unwrap()).unwrap();
        assert_eq!(id.get_version_num(), 7, "{id}");
    }
}

/// `text` with every run of digits as one `0` and every letter a…f as `x`:
/// what two instants or headers of the same form share.
fn shape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let c = match c {
            '0'..='9' => '0',
            'a'..='f' => 'x',
            c => c,
        };
        if !(c == '0' && out.ends_with('0')) {
            out.push(c);
        }
    }
    out
}

/// Every key path of a JSON value (`quota.limit`, …).
fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Some(map) = v.as_object() {
        for (k, child) in map {
            out.insert(k.clone());
            out.extend(keys(child).into_iter().map(|c| format!("{k}.{c}")));
        }
    }
    out
}

/// The alarms docs/aws.md lists, and the count it states, are template.yaml's
/// CloudWatch alarms.
#[test]
fn alarms_are_the_templates() {
    let alarms = template_resources("AWS::CloudWatch::Alarm");
    assert!(alarms.len() >= 5, "{alarms:?}");
    let expand = |names: Vec<String>| -> BTreeSet<String> {
        names
            .iter()
            .flat_map(|n| n.split(", "))
            .flat_map(|n| match n.split_once("{Ip,Tid}") {
                Some((a, b)) => vec![format!("{a}Ip{b}"), format!("{a}Tid{b}")],
                None => vec![n.to_owned()],
            })
            .collect()
    };
    let aws = read("docs/aws.md");
    assert_eq!(
        expand(first_column(&aws, "| alarm (`template.yaml`) |")),
        alarms,
        "docs/aws.md's alarm table"
    );
    assert!(
        aws.contains(&format!("| {} alarms |", alarms.len())),
        "docs/aws.md's resource table should say {} alarms",
        alarms.len()
    );
}

/// The rules docs name are prometheus/alerts.yaml's, and docs/operations.md counts them right.
#[test]
fn alert_rules_are_the_rule_files() {
    let rules: BTreeSet<String> = read("prometheus/alerts.yaml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect();
    assert!(rules.len() >= 4, "{rules:?}");
    let runbook: BTreeSet<String> = read("docs/operations.md")
        .lines()
        .filter_map(|l| l.strip_prefix("### StellaQuota"))
        .map(|n| format!("StellaQuota{n}"))
        .collect();
    assert_eq!(runbook, rules, "docs/operations.md has a section per rule");
    let runbook = read("docs/operations.md");
    let phrase = format!(
        "`prometheus/alerts.yaml` holds {} rules",
        number_word(rules.len())
    );
    assert!(
        runbook.contains(&phrase),
        "docs/operations.md should say: {phrase}"
    );
}

/// docs/aws.md's list of the gate's settings names every template parameter
/// that sets one of the function's variables (`QUOTA_ANON: !Ref QuotaAnon`).
#[test]
fn aws_parameter_list_is_the_templates() {
    let template = read("template.yaml");
    let aws = read("docs/aws.md");
    let list = between(
        &aws,
        "Every setting of the gate is a parameter (",
        "). Outputs:",
    );
    let parameters = template_parameters();
    let setting: Vec<&str> = template
        .lines()
        .filter_map(|l| l.trim_start().split_once(": !Ref "))
        .filter(|(var, _)| var.starts_with("QUOTA_") || var.starts_with("VALKEY_"))
        .map(|(_, p)| p.trim())
        .collect();
    assert!(setting.len() > 20, "{setting:?}");
    for parameter in setting {
        assert!(parameters.contains(parameter), "{parameter}");
        assert!(
            list.contains(&format!("`{parameter}`")),
            "docs/aws.md's parameter list lacks `{parameter}`"
        );
    }
}

/// docs/operations.md's metrics table is `meter/catalogue.rs`'s metrics.
#[test]
fn metrics_table_is_the_meters() {
    use quota_gate::io::meter::{
        ASLEEP, BEDS_FULL, COUNTERS, DELAY_MS, EMF_DROPPED, EVENTS, LEVEL_METRICS, REQUESTS,
        SHADOW_COUNTERS, STORE_METRICS,
    };
    let mut metrics: BTreeSet<String> = COUNTERS
        .iter()
        .chain(&REQUESTS)
        .chain(&SHADOW_COUNTERS)
        .chain(&EVENTS)
        .chain(&LEVEL_METRICS)
        .chain(&STORE_METRICS)
        .map(|s| s.to_string())
        .collect();
    metrics.extend([DELAY_MS, EMF_DROPPED, ASLEEP, BEDS_FULL].map(String::from));
    let table: BTreeSet<String> = first_column(&read("docs/operations.md"), "| metric | type |")
        .into_iter()
        .collect();
    assert_eq!(table, metrics);
}

/// The floors, as (folder, floor), from a table whose rows start
/// `| <floor> | <folder> |` (the folder in backticks or a doc link).
fn floor_rows(text: &str, header: &str) -> BTreeSet<(String, String)> {
    let table = &text[text.find(header).expect("the floors table")..];
    table
        .lines()
        .skip(2)
        .map(|l| l.trim_start_matches("//!").trim())
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let folder = cells[2].trim_matches(|c| "`[]/".contains(c));
            (cells[1].to_owned(), folder.to_owned())
        })
        .collect()
}

/// docs/architecture.md's floors and `src/lib.rs`'s map are
/// `tests/it/architecture.rs`'s `FLOORS`: the folders the house's description
/// puts on each floor are the ones held to it.
#[test]
fn the_floors_are_described_as_checked() {
    let architecture = read("tests/it/architecture.rs");
    let checked: BTreeSet<(String, String)> =
        between(&architecture, "const FLOORS: &[(&str, usize)] = &[", "];")
            .split("(\"")
            .skip(1)
            .map(|row| {
                let (folder, rest) = row.split_once("\", ").unwrap();
                (
                    rest.split(')').next().unwrap().to_owned(),
                    folder.to_owned(),
                )
            })
            .collect();
    assert_eq!(checked.len(), 6);
    let docs = floor_rows(&read("docs/architecture.md"), "| floor | folder |");
    let lib = floor_rows(&read("src/lib.rs"), "| floor | folder |");
    assert_eq!(docs, checked, "docs/architecture.md");
    assert_eq!(lib, checked, "src/lib.rs");
}

/// A subject's keys in a real Valkey (a keyed, paced, over-quota scan and a
/// grant write them all) are the key tables' rows, and `reset` removes every one of them.
#[tokio::test]
async fn key_tables_are_what_valkey_holds() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(
        &server,
        // A store timeout a loaded machine does not reach: the keys read are
        // those of scans counted and paced, not of a timed-out count.
        &[
            ("QUOTA_ANON", "1"),
            ("QUOTA_DELAY_MODE", "defer"),
            ("QUOTA_STORE_TIMEOUT_MS", "2000"),
        ],
    );
    let mut keyed = scan_from("203.0.113.7");
    keyed
        .headers
        .insert("idempotency-key", HeaderValue::from_static("doc-key-1"));
    for r in one_at_a_time(&gate, [scan_from("203.0.113.7"), keyed]).await {
        assert_eq!(r.status(), 202);
    }
    let mut c = server.client().await;
    let config = config(&[("VALKEY_URL", &server.url())]);
    let who = subject::resolve(&config, &SubjectArg::Ip("203.0.113.7".into())).unwrap();
    let store = quota_gate::front::ops::valkey_store(&config).unwrap();
    change::grant(&store, &who, 5, config.policy.reset)
        .await
        .unwrap();
    let found: Vec<String> = c.keys("quota:*").await.unwrap();
    let digest = who
        .key
        .counter
        .trim_start_matches("quota:ip:{")
        .trim_end_matches('}')
        .to_owned();
    // The network levels' keys have digests of their own (a table of
    // their own rows, checked for below).
    let (nets, found): (Vec<String>, Vec<String>) = found
        .into_iter()
        .partition(|k| k.starts_with("quota:net:{"));
    assert!(!nets.is_empty(), "the default level counts the /24");
    assert!(read("docs/guide.md").contains("| `quota:net:{<digest>}` |"));
    let shapes: BTreeSet<String> = found
        .iter()
        .map(|k| {
            let k = k.replace(&digest, "<digest>");
            match k.split_once(":idem:") {
                Some((head, _)) => format!("{head}:idem:"),
                None => k,
            }
        })
        .collect();
    // The key layout is written once, in docs/guide.md.
    let header = "| key | value | expiry |";
    for elsewhere in ["README.md", "docs/operations.md", "src/io/store/mod.rs"] {
        assert!(
            !read(elsewhere).contains(header),
            "a key table in {elsewhere}"
        );
    }
    {
        let doc = "docs/guide.md";
        let rows: BTreeSet<String> = first_column(&read(doc), header)
            .into_iter()
            .filter(|r| r.starts_with("quota:ip:"))
            .map(|r| match r.split_once(":idem:") {
                Some((head, _)) => format!("{head}:idem:"),
                None => r,
            })
            .collect();
        assert_eq!(rows, shapes, "{doc}'s key table");
    }
    let removal = change::reset(&store, &who).await.unwrap();
    assert_eq!(removal.removed as usize, found.len());
    // `reset` removes the subject's keys; its network's stay.
    let left: Vec<String> = c.keys("quota:*").await.unwrap();
    assert_eq!(left, nets, "{left:?}");
}

/// Cargo.toml's `rust-version` is the newest one the locked dependencies
/// declare (for every platform): neither a promise they break nor stricter
/// than they need.
#[test]
fn rust_version_is_the_locked_dependencies() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let version = |v: &str| -> (u32, u32) {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap_or(0))
    };
    let packages = metadata["packages"].as_array().unwrap();
    let newest = packages
        .iter()
        .filter(|p| !p["source"].is_null())
        .filter_map(|p| {
            Some((
                version(p["rust_version"].as_str()?),
                p["name"].as_str()?.to_owned(),
            ))
        })
        .max()
        .unwrap();
    let ours = packages
        .iter()
        .find(|p| p["name"] == "quota-gate")
        .and_then(|p| p["rust_version"].as_str())
        .map(version)
        .unwrap();
    assert_eq!(
        ours, newest.0,
        "rust-version should be {:?}, what {} needs",
        newest.0, newest.1
    );
    let readme = read("README.md");
    assert!(readme.contains(&format!("Rust ({}.{} or later)", ours.0, ours.1)));
}

/// The hash secret's minimums the docs state are the ones enforced: 16 bytes
/// by the code (README), and the key the template generates is at least 32
/// characters, as long as docs/aws.md says.
#[test]
fn hash_secret_minimum_is_the_codes() {
    let secret = |s: &str| {
        quota_gate::Config::from_lookup(|k| (k == "QUOTA_HASH_SECRET").then(|| s.to_owned()))
    };
    assert!(secret(&"x".repeat(15)).is_err());
    assert!(secret(&"x".repeat(16)).is_ok());
    assert!(read("docs/configuration.md").contains("≥ 16 bytes"));
    let template = read("template.yaml");
    let length: usize = template
        .split("\n  HashSecret:\n")
        .nth(1)
        .and_then(|p| {
            p.lines()
                .find_map(|l| l.trim().strip_prefix("PasswordLength: "))
        })
        .unwrap()
        .parse()
        .unwrap();
    assert!(length >= 32, "a generated key of {length} characters");
    let aws = read("docs/aws.md");
    assert!(aws.contains(&format!("({length} characters")));
    assert!(aws.contains("under 16 bytes"));
}

/// The README's first screen gives exactly two commands, the local gate and the whole
/// test suite, and CI (`.ci/run`) runs that same test command.
#[test]
fn first_screen_has_the_two_commands() {
    let readme = read("README.md");
    let block = between(&readme, "```sh\n", "```");
    let commands: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands, ["cargo run -- serve", "scripts/test"]);
    assert!(read(".ci/run").contains("scripts/test"));
}

/// Every relative link of README.md and the docs (`[…](guide.md#delays)`,
/// `[…](#stopping)`) names a file that exists, and an anchor one of its
/// headings makes, by GitHub's rules.
#[test]
fn relative_links_land() {
    use common::markdown::{anchors, relative_links};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
    }
    assert!(docs.len() > 5, "{docs:?}");
    let mut broken = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for link in relative_links(&text) {
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            let name = doc.strip_prefix(&root).unwrap().display();
            if !target.exists() {
                broken.push(format!("{name}: {link}: no such file"));
            } else if !anchor.is_empty() {
                let heads = anchors(&std::fs::read_to_string(&target).unwrap_or_default());
                if !heads.contains(anchor) {
                    broken.push(format!("{name}: {link}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
