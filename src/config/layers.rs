//! The three sources a setting is looked up in, and picking the winner by the one precedence:
//! flags > environment > config file > defaults. Only the winner is parsed, so a value that is
//! overridden cannot fail the start.

use super::env::{self, EnvLookup};
use super::error::{Origin, Raw};
use super::file::LoadedFile;

/// Environment and (optional) config file, as seen by resolution. Flags come from
/// [`crate::cli`] and are passed to each lookup.
pub(crate) struct Layers<'a> {
    pub env: EnvLookup<'a>,
    pub file: Option<&'a LoadedFile>,
}

impl Layers<'_> {
    /// A flag's value, if given.
    pub fn flag(flag: &'static str, value: Option<&str>) -> Option<Raw> {
        value.map(|text| Raw {
            text: text.to_string(),
            origin: Origin::Flag(flag),
        })
    }

    /// A boolean switch: present means `true`; absent defers to the lower layers.
    pub fn switch(flag: &'static str, given: bool, value_when_given: bool) -> Option<Raw> {
        given.then(|| Raw {
            text: value_when_given.to_string(),
            origin: Origin::Flag(flag),
        })
    }

    /// An environment variable's value, if set and not empty.
    pub fn env(&self, name: &str) -> Option<Raw> {
        env::get(self.env, name).map(|text| Raw {
            text,
            origin: Origin::Env(name.to_string()),
        })
    }

    /// A file value, if there is a file and it sets the key.
    pub fn file(
        &self,
        key: &str,
        value: impl FnOnce(&super::file::FileConfig) -> &super::file::Value,
    ) -> Option<Raw> {
        let file = self.file?;
        file.raw(key, value(&file.config))
    }

    /// The default, named for messages ("default export interval 10s").
    pub fn default(what: &'static str, text: &str) -> Raw {
        Raw {
            text: text.to_string(),
            origin: Origin::Default(what),
        }
    }
}

/// The first value given, in the order listed (callers list them by precedence).
pub(crate) fn first<const N: usize>(candidates: [Option<Raw>; N]) -> Option<Raw> {
    candidates.into_iter().flatten().next()
}
