//! Which quota a subject is counted under: its [`Scope`].

use std::fmt;

/// Which quota a subject is counted under; in a job, its lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Anonymous: counted per (normalised) source IP.
    Ip,
    /// Token holder: counted per token id (`tid`).
    Tid,
}

impl Scope {
    /// Both scopes, in [`Scope::index`] order.
    pub const ALL: [Self; 2] = [Self::Ip, Self::Tid];

    /// Its place in [`Scope::ALL`] (and in per-scope arrays).
    pub const fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ip => "ip",
            Self::Tid => "tid",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
