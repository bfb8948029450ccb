//! Certificates and keys for a local control plane (pure: no files, no processes).
//!
//! ECDSA P-256 throughout: fast to generate and accepted by kube-apiserver for serving, client
//! authentication and ServiceAccount token signing.
use std::net::{IpAddr, Ipv4Addr};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// The first address of the local control plane's service range (`--service-cluster-ip-range`).
pub const SERVICE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

/// A certificate with its private key, both PEM.
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The certificate authority of one local control plane.
pub struct Authority {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Authority {
    pub fn generate(common_name: &str) -> anyhow::Result<Self> {
        let key = KeyPair::generate().context("generating the CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).context("self-signing the CA")?;
        Ok(Self {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A TLS serving certificate for `hosts` (IP addresses or DNS names).
    pub fn serving_cert(
        &self,
        common_name: &str,
        hosts: &[String],
    ) -> anyhow::Result<CertifiedKey> {
        let mut params = CertificateParams::new(hosts.to_vec()).context("serving cert names")?;
        params.distinguished_name = distinguished_name(common_name, &[]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate: kube-apiserver maps CN to the user name and O to its groups.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> anyhow::Result<CertifiedKey> {
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(user, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, mut params: CertificateParams) -> anyhow::Result<CertifiedKey> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().context("generating a key")?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("signing a certificate")?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The names the API server's serving certificate must carry: loopback for the suite, the
/// in-cluster names and service IP for anything that resolves `kubernetes.default`.
pub fn apiserver_hosts() -> Vec<String> {
    [
        "127.0.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain(std::iter::once(SERVICE_IP.to_string()))
    .collect()
}

/// A key pair for signing ServiceAccount tokens: (private PEM, public PEM).
pub fn service_account_key() -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate().context("generating the ServiceAccount signing key")?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

fn distinguished_name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    for organization in organizations {
        name.push(DnType::OrganizationName, *organization);
    }
    name
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    use super::*;

    fn roots(authority: &Authority) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(authority.ca_pem().as_bytes()).expect("ca pem"))
            .expect("ca accepted as a root");
        Arc::new(roots)
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    #[test]
    fn serving_cert_verifies_for_loopback_and_in_cluster_names() {
        let authority = Authority::generate("test-ca").expect("ca");
        let serving = authority
            .serving_cert("kube-apiserver", &apiserver_hosts())
            .expect("serving cert");
        let leaf = CertificateDer::from_pem_slice(serving.cert_pem.as_bytes()).expect("leaf pem");
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots(&authority),
            provider(),
        )
        .build()
        .expect("verifier");
        for name in [
            "127.0.0.1",
            "localhost",
            "kubernetes.default.svc",
            "10.0.0.1",
        ] {
            let server_name = ServerName::try_from(name).expect("name");
            verifier
                .verify_server_cert(&leaf, &[], &server_name, &[], UnixTime::now())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let other = ServerName::try_from("example.com").expect("name");
        assert!(
            verifier
                .verify_server_cert(&leaf, &[], &other, &[], UnixTime::now())
                .is_err()
        );
    }

    #[test]
    fn client_cert_verifies_and_names_its_group() {
        let authority = Authority::generate("test-ca").expect("ca");
        let client = authority
            .client_cert("conformance-admin", &["system:masters"])
            .expect("client cert");
        let leaf = CertificateDer::from_pem_slice(client.cert_pem.as_bytes()).expect("leaf pem");
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots(&authority),
            provider(),
        )
        .build()
        .expect("verifier");
        verifier
            .verify_client_cert(&leaf, &[], UnixTime::now())
            .expect("client cert verifies against the CA");
        let der: &[u8] = leaf.as_ref();
        assert!(der.windows(14).any(|w| w == b"system:masters"));
    }

    #[test]
    fn a_foreign_ca_does_not_verify_our_certs() {
        let ours = Authority::generate("ours").expect("ca");
        let theirs = Authority::generate("theirs").expect("ca");
        let client = ours.client_cert("u", &[]).expect("client cert");
        let leaf = CertificateDer::from_pem_slice(client.cert_pem.as_bytes()).expect("leaf pem");
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots(&theirs), provider())
                .build()
                .expect("verifier");
        assert!(
            verifier
                .verify_client_cert(&leaf, &[], UnixTime::now())
                .is_err()
        );
    }

    #[test]
    fn service_account_key_is_a_pem_pair() {
        let (private, public) = service_account_key().expect("key");
        assert!(private.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"));
    }
}
