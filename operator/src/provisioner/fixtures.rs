//! YAML fixtures of the unit tests (`src/provisioner/fixtures/`).
use serde::de::DeserializeOwned;

/// Parses `src/provisioner/fixtures/<relative>`; panics with the path on a broken fixture.
pub fn load<T: DeserializeOwned>(relative: &str) -> T {
    let path = format!(
        "{}/src/provisioner/fixtures/{relative}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading fixture {path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing fixture {path}: {e}"))
}
