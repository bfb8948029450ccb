//! The committed CRD manifests in `config/crd/` must equal what the Rust types generate.
//!
//! Regenerate after changing `operator/src/api/`:
//! `UPDATE_CRDS=1 cargo test -p operator --test crd_drift`
use std::path::PathBuf;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/crd")
}

#[test]
fn committed_crds_match_the_rust_types() {
    let update = std::env::var_os("UPDATE_CRDS").is_some();
    let mut drifted = Vec::new();
    for (file, generated) in operator::api::crd_files() {
        let path = crd_dir().join(file);
        if update {
            std::fs::write(&path, &generated)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != generated {
            drifted.push(path.display().to_string());
        }
    }
    assert!(
        drifted.is_empty(),
        "CRD manifests out of date: {drifted:?}\nregenerate them with: UPDATE_CRDS=1 cargo test -p operator --test crd_drift"
    );
}

#[test]
fn crds_yaml_is_both_crds_and_deterministic() {
    let yaml = operator::api::crds_yaml();
    assert_eq!(yaml, operator::api::crds_yaml());
    assert_eq!(
        yaml.matches("\nkind: CustomResourceDefinition\n").count(),
        2
    );
    assert!(yaml.contains("name: coderprovisioners.coder.com"));
    assert!(yaml.contains("name: codercontrolplanes.coder.com"));
}
