//! Which quota a subject is counted under: its [`Scope`].

words! {
    /// Which quota a subject is counted under; in a job, its lowercase name.
    #[derive(Hash, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    Scope {
        /// Anonymous: counted per (normalised) source IP.
        Ip = "ip",
        /// Token holder: counted per token id (`tid`).
        Tid = "tid",
    }
}

impl Scope {
    /// Its place in [`Scope::ALL`] (and in per-scope arrays).
    pub const fn index(self) -> usize {
        self as usize
    }
}
