//! A coderd as the operator keys what it keeps per coderd.
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use super::SecretString;

/// One coderd and one of its users: the URL without trailing slashes and a hash of the session
/// token. The operator's per-coderd state (reconcile slots, entitlement readings) is keyed by it,
/// so two users of one coderd are kept apart and no key holds a token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CoderdIdentity {
    url: String,
    token_hash: u64,
}

impl CoderdIdentity {
    pub fn new(url: &str, token: &SecretString) -> Self {
        Self {
            url: url.trim_end_matches('/').to_owned(),
            token_hash: BuildHasherDefault::<DefaultHasher>::default().hash_one(token.expose()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_coderd_and_token_whatever_the_trailing_slash() {
        let token = SecretString::new("a-token");
        assert_eq!(
            CoderdIdentity::new("http://coderd/", &token),
            CoderdIdentity::new("http://coderd", &token)
        );
        assert_ne!(
            CoderdIdentity::new("http://coderd", &token),
            CoderdIdentity::new("http://coderd", &SecretString::new("another-token"))
        );
        assert!(!format!("{:?}", CoderdIdentity::new("http://c", &token)).contains("a-token"));
    }
}
