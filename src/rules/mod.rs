//! The ground floor: the pure rules and the types they speak. Nothing here does I/O or reads a
//! clock, and no module imports one outside this folder (`tests/it/architecture.rs` checks), so
//! every rule runs and is tested without a server or a runtime.

/// Closed sets of words: each enum, its variants in order (`ALL`), each variant's word (`as_str`,
/// `Display`) and the parse of one (`FromStr`, naming the words it expected). Attributes before a
/// name go on its enum.
macro_rules! words {
    ($($(#[$attr:meta])* $name:ident { $($(#[$vattr:meta])* $variant:ident = $word:literal,)+ })+) => {$(
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vattr])* $variant,)+
        }

        impl $name {
            pub const ALL: [Self; [$(Self::$variant),+].len()] = [$(Self::$variant),+];

            /// Its word.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $word,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            fn from_str(word: &str) -> Result<Self, String> {
                match word {
                    $($word => Ok(Self::$variant),)+
                    other => Err(format!(
                        "expected {}, got {other:?}",
                        [$($word),+].join(" or ")
                    )),
                }
            }
        }
    )+};
}
pub(crate) use words;

pub mod breaker;
pub mod count;
pub mod decide;
pub mod delay;
pub mod digest;
pub mod eviction;
pub mod hash_tag;
pub mod job;
pub mod key;
pub mod level;
pub mod modes;
pub mod networks;
pub mod outcome;
pub mod pace;
pub mod record;
pub mod scope;
pub mod settle;
pub mod trace;
pub mod unix;
