//! Applying YAML manifests (a folder, or a string) to a cluster with server-side apply.
//!
//! Files are read in name order; `*.yaml`/`*.yml` files may hold several documents;
//! `kustomization.yaml` is skipped (its `resources:` list is just the other files). Each object's
//! resource is found through discovery, so any kind works, including CRs of a CRD applied in the
//! same batch (CRDs and Namespaces are applied first and CRDs are awaited until `Established`).
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use serde_json::Value;

/// Field manager the suite applies with unless told otherwise.
pub const DEFAULT_FIELD_MANAGER: &str = "coder-provisioner-conformance";
/// How long `install_crds` waits for `Established`.
pub const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);
/// Namespace for namespaced objects that name none (as kubectl does).
const DEFAULT_NAMESPACE: &str = "default";
const POLL: Duration = Duration::from_millis(200);

/// Identity of an applied object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ApplyOptions {
    /// Put every namespaced object into this namespace, and point ServiceAccount subjects of
    /// (Cluster)RoleBindings at it (like kustomize's `namespace:`).
    pub namespace: Option<String>,
    /// Server-side dry run: the API server validates and admits, nothing is stored.
    pub dry_run: bool,
    pub field_manager: String,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            dry_run: false,
            field_manager: DEFAULT_FIELD_MANAGER.to_owned(),
        }
    }
}

/// Server-side applies every manifest in `dir` (force, field manager [`DEFAULT_FIELD_MANAGER`]).
pub async fn apply_dir(
    client: &kube::Client,
    dir: &Path,
    namespace_override: Option<&str>,
) -> anyhow::Result<Vec<ObjectRef>> {
    let options = ApplyOptions {
        namespace: namespace_override.map(str::to_owned),
        ..ApplyOptions::default()
    };
    apply_dir_with(client, dir, &options).await
}

pub async fn apply_dir_with(
    client: &kube::Client,
    dir: &Path,
    options: &ApplyOptions,
) -> anyhow::Result<Vec<ObjectRef>> {
    apply_objects(client, read_dir(dir)?, options).await
}

/// Server-side applies the (multi-document) YAML `yaml`.
pub async fn apply_yaml_str(
    client: &kube::Client,
    yaml: &str,
    options: &ApplyOptions,
) -> anyhow::Result<Vec<ObjectRef>> {
    apply_objects(client, parse_documents(yaml)?, options).await
}

/// Applies `objects`: Namespaces and CRDs first (awaiting the CRDs unless dry-run), then the rest
/// in their given order. Stops at the first failure, naming the object.
pub async fn apply_objects(
    client: &kube::Client,
    objects: Vec<DynamicObject>,
    options: &ApplyOptions,
) -> anyhow::Result<Vec<ObjectRef>> {
    let mut resolver = Resolver::new(client);
    let mut applied = Vec::new();
    let (first, rest): (Vec<_>, Vec<_>) = objects.into_iter().partition(apply_early);
    for batch in [first, rest] {
        let mut crds = Vec::new();
        for mut object in batch {
            let (resource, capabilities) = resolver.resolve(&object).await?;
            if let Some(namespace) = &options.namespace {
                retarget_namespace(
                    &mut object,
                    namespace,
                    capabilities.scope == Scope::Namespaced,
                );
            }
            let reference = apply_one(client, &resource, &capabilities, &object, options).await?;
            if reference.kind == "CustomResourceDefinition" {
                crds.push(reference.name.clone());
            }
            applied.push(reference);
        }
        if !options.dry_run && !crds.is_empty() {
            wait_crds_established(client, &crds, CRD_ESTABLISHED_TIMEOUT).await?;
        }
    }
    Ok(applied)
}

/// Applies the CRDs in `dir` and waits until each is `Established`; returns their names.
pub async fn install_crds(client: &kube::Client, dir: &Path) -> anyhow::Result<Vec<String>> {
    let objects = read_dir(dir)?;
    if let Some(other) = objects
        .iter()
        .find(|o| kind_of(o) != "CustomResourceDefinition")
    {
        bail!("{} holds a {} besides CRDs", dir.display(), kind_of(other));
    }
    if objects.is_empty() {
        bail!("{} holds no CustomResourceDefinition", dir.display());
    }
    let applied = apply_objects(client, objects, &ApplyOptions::default()).await?;
    Ok(applied.into_iter().map(|r| r.name).collect())
}

/// Polls until every named CRD has condition `Established=True`.
pub async fn wait_crds_established(
    client: &kube::Client,
    names: &[String],
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    for name in names {
        loop {
            let crd = api
                .get_opt(name)
                .await
                .with_context(|| format!("reading CRD {name}"))?;
            if crd.as_ref().is_some_and(is_established) {
                break;
            }
            if Instant::now() >= deadline {
                bail!("CRD {name} not Established within {timeout:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(())
}

/// Deletes every object of `dir` (reverse order; already absent objects are fine).
pub async fn delete_dir(
    client: &kube::Client,
    dir: &Path,
    namespace_override: Option<&str>,
) -> anyhow::Result<()> {
    let mut resolver = Resolver::new(client);
    for mut object in read_dir(dir)?.into_iter().rev() {
        let (resource, capabilities) = match resolver.resolve(&object).await {
            Ok(found) => found,
            // The kind is gone (e.g. its CRD was deleted first): so is the object.
            Err(_) => continue,
        };
        let namespaced = capabilities.scope == Scope::Namespaced;
        if let Some(namespace) = namespace_override {
            retarget_namespace(&mut object, namespace, namespaced);
        }
        let reference = object_ref(&object, namespaced)?;
        let api = dynamic_api(
            client,
            &resource,
            &capabilities,
            reference.namespace.as_deref(),
        );
        match api
            .delete(&reference.name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {reference}")),
        }
    }
    Ok(())
}

/// Reads every manifest file in `dir` (not recursive), in file-name order.
pub fn read_dir(dir: &Path) -> anyhow::Result<Vec<DynamicObject>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading folder {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| is_manifest_file(path))
        .collect();
    files.sort();
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        objects.extend(parse_documents(&text).with_context(|| format!("in {}", file.display()))?);
    }
    Ok(objects)
}

/// `*.yaml` / `*.yml`, except kustomize's own file.
fn is_manifest_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    (name.ends_with(".yaml") || name.ends_with(".yml"))
        && !name.starts_with("kustomization.")
        && path.is_file()
}

/// Splits multi-document YAML into objects; empty documents are skipped, and each object must
/// name its `apiVersion`, `kind` and `metadata.name`.
pub fn parse_documents(yaml: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(yaml).context("parsing YAML documents")?;
    documents
        .into_iter()
        .enumerate()
        .filter(|(_, document)| !document.is_null())
        .map(|(index, document)| {
            let object: DynamicObject = serde_json::from_value(document)
                .with_context(|| format!("document {} is not a Kubernetes object", index + 1))?;
            let types = object.types.as_ref();
            if types.is_none_or(|t| t.api_version.is_empty() || t.kind.is_empty()) {
                bail!("document {} lacks apiVersion or kind", index + 1);
            }
            if object.metadata.name.as_deref().is_none_or(str::is_empty) {
                bail!(
                    "document {} ({}) has no metadata.name",
                    index + 1,
                    kind_of(&object)
                );
            }
            Ok(object)
        })
        .collect()
}

/// Moves a namespaced object into `namespace`; ServiceAccount subjects of role bindings follow.
pub fn retarget_namespace(object: &mut DynamicObject, namespace: &str, namespaced: bool) {
    if namespaced {
        object.metadata.namespace = Some(namespace.to_owned());
    }
    if matches!(kind_of(object), "RoleBinding" | "ClusterRoleBinding")
        && let Some(subjects) = object
            .data
            .get_mut("subjects")
            .and_then(Value::as_array_mut)
    {
        for subject in subjects {
            if subject.get("kind").and_then(Value::as_str) == Some("ServiceAccount") {
                subject["namespace"] = Value::String(namespace.to_owned());
            }
        }
    }
}

fn apply_early(object: &DynamicObject) -> bool {
    matches!(kind_of(object), "Namespace" | "CustomResourceDefinition")
}

/// The objects of `kind` among parsed documents.
pub fn of_kind<'a>(objects: &'a [DynamicObject], kind: &str) -> Vec<&'a DynamicObject> {
    objects.iter().filter(|o| kind_of(o) == kind).collect()
}

/// The one object of `kind` among parsed documents; an error when there is none or several.
pub fn only_of_kind<'a>(
    objects: &'a [DynamicObject],
    kind: &str,
) -> anyhow::Result<&'a DynamicObject> {
    match of_kind(objects, kind).as_slice() {
        [only] => Ok(only),
        found => anyhow::bail!("exactly one {kind} expected, found {}", found.len()),
    }
}

/// The kind of a parsed document (empty when it names none).
pub fn kind_of(object: &DynamicObject) -> &str {
    object
        .types
        .as_ref()
        .map(|t| t.kind.as_str())
        .unwrap_or_default()
}

fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

fn object_ref(object: &DynamicObject, namespaced: bool) -> anyhow::Result<ObjectRef> {
    let types = object.types.clone().unwrap_or_default();
    let name = object
        .metadata
        .name
        .clone()
        .context("object without metadata.name")?;
    let namespace = namespaced.then(|| {
        object
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())
    });
    Ok(ObjectRef {
        api_version: types.api_version,
        kind: types.kind,
        namespace,
        name,
    })
}

fn dynamic_api(
    client: &kube::Client,
    resource: &ApiResource,
    capabilities: &ApiCapabilities,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match (capabilities.scope == Scope::Namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, resource),
        _ => Api::all_with(client.clone(), resource),
    }
}

async fn apply_one(
    client: &kube::Client,
    resource: &ApiResource,
    capabilities: &ApiCapabilities,
    object: &DynamicObject,
    options: &ApplyOptions,
) -> anyhow::Result<ObjectRef> {
    let namespaced = capabilities.scope == Scope::Namespaced;
    let reference = object_ref(object, namespaced)?;
    let mut object = object.clone();
    object.metadata.namespace = reference.namespace.clone();
    let api = dynamic_api(
        client,
        resource,
        capabilities,
        reference.namespace.as_deref(),
    );
    let mut params = PatchParams::apply(&options.field_manager).force();
    params.dry_run = options.dry_run;
    api.patch(&reference.name, &params, &Patch::Apply(&object))
        .await
        .with_context(|| {
            let mode = if options.dry_run {
                " (server-side dry run)"
            } else {
                ""
            };
            format!("applying {reference}{mode}")
        })?;
    Ok(reference)
}

/// Discovery with a per-batch cache (one lookup per kind).
struct Resolver<'a> {
    client: &'a kube::Client,
    cache: HashMap<GroupVersionKind, (ApiResource, ApiCapabilities)>,
}

impl<'a> Resolver<'a> {
    fn new(client: &'a kube::Client) -> Self {
        Self {
            client,
            cache: HashMap::new(),
        }
    }

    async fn resolve(
        &mut self,
        object: &DynamicObject,
    ) -> anyhow::Result<(ApiResource, ApiCapabilities)> {
        let types = object
            .types
            .as_ref()
            .context("object without apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(types)
            .with_context(|| format!("bad apiVersion {:?}", types.api_version))?;
        if let Some(found) = self.cache.get(&gvk) {
            return Ok(found.clone());
        }
        let found = kube::discovery::pinned_kind(self.client, &gvk)
            .await
            .with_context(|| {
                format!(
                    "the API server does not serve {} {}",
                    types.api_version, types.kind
                )
            })?;
        self.cache.insert(gvk, found.clone());
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RBAC: &str = r#"
# leading comment and an empty document
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: op
  namespace: coder-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: op
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: op}
subjects:
  - {kind: ServiceAccount, name: op, namespace: coder-system}
  - {kind: User, name: alice}
---
"#;

    #[test]
    fn multi_document_yaml_skips_empty_documents() {
        let objects = parse_documents(RBAC).expect("parse");
        let kinds: Vec<&str> = objects.iter().map(kind_of).collect();
        assert_eq!(kinds, ["ServiceAccount", "ClusterRoleBinding"]);
        assert_eq!(
            objects[0].metadata.namespace.as_deref(),
            Some("coder-system")
        );
    }

    #[test]
    fn objects_without_identity_are_refused() {
        let no_kind = parse_documents("apiVersion: v1\nmetadata: {name: x}\n");
        assert!(no_kind.is_err());
        let no_name = parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n")
            .expect_err("no name")
            .to_string();
        assert!(no_name.contains("metadata.name"), "{no_name}");
        assert!(parse_documents("a: [unclosed\n").is_err());
    }

    #[test]
    fn namespace_override_moves_objects_and_service_account_subjects() {
        let mut objects = parse_documents(RBAC).expect("parse");
        retarget_namespace(&mut objects[0], "elsewhere", true);
        assert_eq!(objects[0].metadata.namespace.as_deref(), Some("elsewhere"));
        retarget_namespace(&mut objects[1], "elsewhere", false);
        assert_eq!(
            objects[1].metadata.namespace, None,
            "cluster-scoped stays so"
        );
        let subjects = objects[1].data["subjects"].as_array().expect("subjects");
        assert_eq!(subjects[0]["namespace"], "elsewhere");
        assert!(
            subjects[1].get("namespace").is_none(),
            "users have no namespace"
        );
    }

    #[test]
    fn namespaces_and_crds_go_first() {
        let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n\
                    apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n";
        let objects = parse_documents(yaml).expect("parse");
        assert!(!apply_early(&objects[0]));
        assert!(apply_early(&objects[1]));
    }

    #[test]
    fn unnamespaced_objects_land_in_default() {
        let objects = parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
            .expect("parse");
        let reference = object_ref(&objects[0], true).expect("ref");
        assert_eq!(reference.namespace.as_deref(), Some("default"));
        assert_eq!(reference.to_string(), "ConfigMap default/a");
    }

    #[test]
    fn kustomization_and_non_yaml_files_are_not_manifests() {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in ["kustomization.yaml", "README.md", "b.yml", "a.yaml"] {
            std::fs::write(
                dir.path().join(name),
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            )
            .expect("write");
        }
        let objects = read_dir(dir.path()).expect("read");
        assert_eq!(objects.len(), 2);
    }
}
