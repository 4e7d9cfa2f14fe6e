//! A secret given by reference instead of by value: a secret variable (`QUOTA_HASH_SECRET`,
//! `VALKEY_URL`) holds its value, or `secretsmanager:<secret ARN or name>`, `ssm:<SecureString
//! parameter name or ARN>` or `file:<path>` (its trailing newline dropped). A prefix rather than a
//! `_ARN` variable keeps one variable per setting. The front ends read references at start; the
//! parser refuses one left unread, so it never becomes a hash key.

use super::error::ConfigError;
use super::vars::VARIABLES;

/// The prefix of a Secrets Manager reference.
pub const SECRETS_MANAGER: &str = "secretsmanager:";
/// The prefix of a Parameter Store reference.
pub const PARAMETER: &str = "ssm:";
/// The prefix of a reference to a local file (a mounted secret).
pub const FILE: &str = "file:";

/// A secret's place in a secret store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    SecretsManager(String),
    Parameter(String),
    File(String),
}

impl SecretRef {
    /// `Ok(None)` for a plain value; an error for an empty reference or a bare ARN (not a secret).
    pub fn parse(value: &str) -> Result<Option<Self>, String> {
        let value = value.trim();
        let kinds = [
            (SECRETS_MANAGER, Self::SecretsManager as fn(String) -> Self),
            (PARAMETER, Self::Parameter),
            (FILE, Self::File),
        ];
        for (prefix, make) in kinds {
            match value.strip_prefix(prefix) {
                Some("") => return Err("names no secret after its prefix".to_owned()),
                Some(id) => return Ok(Some(make(id.to_owned()))),
                None => {}
            }
        }
        if value.starts_with("arn:") {
            return Err(format!(
                "an ARN is not a value: write {SECRETS_MANAGER}<ARN> or {PARAMETER}<ARN>"
            ));
        }
        Ok(None)
    }

    /// Whether it is read through the AWS SDK (a file is not).
    pub fn in_aws(&self) -> bool {
        !matches!(self, Self::File(_))
    }
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SecretsManager(id) => write!(f, "{SECRETS_MANAGER}{id}"),
            Self::Parameter(name) => write!(f, "{PARAMETER}{name}"),
            Self::File(path) => write!(f, "{FILE}{path}"),
        }
    }
}

/// The secret variables `lookup` gives as references; a malformed one is an error naming it.
pub fn references(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(&'static str, SecretRef)>, ConfigError> {
    let mut found = Vec::new();
    for var in VARIABLES.iter().filter(|v| v.secret) {
        let Some(value) = lookup(var.name) else {
            continue;
        };
        match SecretRef::parse(&value) {
            Ok(Some(reference)) => found.push((var.name, reference)),
            Ok(None) => {}
            Err(problem) => return Err(ConfigError::new(var.name, problem)),
        }
    }
    Ok(found)
}

/// Refuses a reference left unread: as a value it would be a hash key readable in the settings.
pub(super) fn refuse_unresolved(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    match references(lookup)?.first() {
        None => Ok(()),
        Some((var, reference)) => {
            let problem = "is a reference that was not read (the front ends read them at start)";
            Err(ConfigError::new(var, format!("{reference} {problem}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two prefixes name a store; a plain value, a URL and a word are
    /// values; a bare ARN or an empty reference is refused.
    #[test]
    fn grammar() {
        let arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:quota-hash-AbCdEf";
        assert_eq!(
            SecretRef::parse(&format!("secretsmanager:{arn}")),
            Ok(Some(SecretRef::SecretsManager(arn.to_owned())))
        );
        assert_eq!(
            SecretRef::parse(" ssm:/quota/valkey-url "),
            Ok(Some(SecretRef::Parameter("/quota/valkey-url".to_owned())))
        );
        for plain in [
            "rediss://user:pw@host:6379",
            "0123456789abcdef0123",
            "ssmx:y",
            "files:/x",
        ] {
            assert_eq!(SecretRef::parse(plain), Ok(None), "{plain}");
        }
        assert_eq!(
            SecretRef::parse("file:/run/secrets/quota hash"),
            Ok(Some(SecretRef::File("/run/secrets/quota hash".to_owned())))
        );
        assert!(SecretRef::parse("file:").is_err());
        assert!(SecretRef::parse("ssm:").is_err());
        assert!(SecretRef::parse("secretsmanager:  ").is_err());
        assert!(
            SecretRef::parse(arn)
                .unwrap_err()
                .contains("secretsmanager:<ARN>")
        );
        for prefix in [SECRETS_MANAGER, PARAMETER, FILE] {
            assert!(super::super::table::SECRET_NOTE.contains(&format!("`{prefix}<")));
        }
        for r in [
            SecretRef::Parameter("/a".into()),
            SecretRef::File("b".into()),
        ] {
            assert_eq!(SecretRef::parse(&r.to_string()), Ok(Some(r)));
        }
    }

    /// Only the rows marked secret are read as references, and a reference
    /// left unread stops the parse naming its variable.
    #[test]
    fn only_secret_rows() {
        let secret = VARIABLES.iter().filter(|v| v.secret);
        let names: Vec<_> = secret.map(|v| v.name).collect();
        assert_eq!(names, ["QUOTA_HASH_SECRET", "VALKEY_URL"]);
        let lookup = |k: &str| match k {
            "VALKEY_URL" => Some("ssm:/quota/valkey".to_owned()),
            "QUOTA_JWT_ISSUER" => Some("ssm:/not-a-secret".to_owned()),
            _ => None,
        };
        let found = references(&lookup).unwrap();
        assert_eq!(found.len(), 1);
        let e = crate::config::Config::from_lookup(lookup).unwrap_err();
        assert_eq!(e.var, "VALKEY_URL");
        assert!(e.problem.contains("ssm:/quota/valkey"), "{e}");
    }
}
