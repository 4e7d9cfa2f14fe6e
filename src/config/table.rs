//! docs/configuration.md's table, made from [`super::vars::VARIABLES`] (a test compares the two).

use super::vars::{DefaultValue, MAX_MILLIS, VARIABLES};

/// What the table adds to a secret variable's meaning: the grammar of [`super::secret_ref`].
pub const SECRET_NOTE: &str = "; or a reference, read once at start: `secretsmanager:<secret ARN or \
     name>`, `ssm:<SecureString parameter name or ARN>` or `file:<path>` (a mounted secret file, its \
     trailing newline dropped) ([Secrets](production.md#secrets))";

fn bound(n: u64) -> String {
    if n == MAX_MILLIS {
        format!("{n} (24 h)")
    } else {
        n.to_string()
    }
}

/// docs/configuration.md's table: `| variable | default | meaning |`.
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | default | meaning |\n|---|---|---|\n");
    for v in VARIABLES {
        let default = match v.default {
            DefaultValue::Value(word) if word.parse::<u64>().is_ok() => word.to_owned(),
            DefaultValue::Value(word) => format!("`{word}`"),
            DefaultValue::Unset(words) => words.to_owned(),
        };
        let range = v
            .range
            .map(|(min, max)| format!("; {} … {}", bound(min), bound(max)))
            .unwrap_or_default();
        let secret = if v.secret { SECRET_NOTE } else { "" };
        out.push_str(&format!(
            "| `{}` | {default} | {}{range}{secret} |\n",
            v.name, v.meaning
        ));
    }
    out
}
