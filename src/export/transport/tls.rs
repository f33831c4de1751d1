//! TLS material for the transports: reading the PEM files named by
//! `OTEL_EXPORTER_OTLP_{CERTIFICATE,CLIENT_CERTIFICATE,CLIENT_KEY}` and, for OTLP/HTTP, the rustls
//! client configuration on the ring provider. A configured CA bundle replaces the built-in
//! webpki roots (as the Go and Java SDKs do): a private collector's CA should not widen trust to
//! every public CA, and a public endpoint needs no bundle.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::{Signal, TransportBuildError};
use crate::config::otlp::TlsFiles;

pub(crate) fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TransportBuildError> {
    std::fs::read(path).map_err(|source| TransportBuildError::TlsFile {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The PEM text of a client certificate chain and its private key.
pub(crate) struct IdentityPems {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

/// The client certificate and key PEMs, when both are configured.
pub(crate) fn client_identity_pems(
    tls: &TlsFiles,
) -> Result<Option<IdentityPems>, TransportBuildError> {
    match (&tls.client_certificate, &tls.client_key) {
        (Some(cert), Some(key)) => Ok(Some(IdentityPems {
            cert: read_pem("client certificate", cert)?,
            key: read_pem("client key", key)?,
        })),
        (None, None) => Ok(None),
        _ => Err(TransportBuildError::HalfClientIdentity),
    }
}

fn certificates(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TransportBuildError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TransportBuildError::TlsPem {
            what,
            path: path.to_path_buf(),
            detail: format!("bad PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TransportBuildError::TlsPem {
            what,
            path: path.to_path_buf(),
            detail: "no `BEGIN CERTIFICATE` block found".into(),
        });
    }
    Ok(certs)
}

/// The rustls configuration for OTLP/HTTP over https.
pub(crate) fn rustls_client_config(
    signal: Signal,
    tls: &TlsFiles,
) -> Result<rustls::ClientConfig, TransportBuildError> {
    let refused = |e: rustls::Error| TransportBuildError::Tls {
        signal,
        detail: e.to_string(),
    };
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca_certificate {
        Some(path) => {
            let pem = read_pem("CA certificate", path)?;
            for cert in certificates("CA certificate", path, &pem)? {
                roots.add(cert).map_err(|e| TransportBuildError::TlsPem {
                    what: "CA certificate",
                    path: path.clone(),
                    detail: format!("not a usable CA certificate: {e}"),
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(refused)?
    .with_root_certificates(roots);
    let config = match client_identity_pems(tls)? {
        Some(IdentityPems {
            cert: cert_pem,
            key: key_pem,
        }) => {
            let cert_path = tls.client_certificate.as_deref().unwrap_or(Path::new(""));
            let key_path = tls.client_key.as_deref().unwrap_or(Path::new(""));
            let chain = certificates("client certificate", cert_path, &cert_pem)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                TransportBuildError::TlsPem {
                    what: "client key",
                    path: key_path.to_path_buf(),
                    detail: format!("no PKCS#8, PKCS#1 or SEC1 private key found: {e}"),
                }
            })?;
            builder.with_client_auth_cert(chain, key).map_err(refused)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_missing_ca_file_names_the_file() {
        let tls = TlsFiles {
            ca_certificate: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        };
        let err = rustls_client_config(Signal::Metrics, &tls).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent/ca.pem"), "{text}");
        assert!(text.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{text}");
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(b"not a certificate\n").unwrap();
        let tls = TlsFiles {
            ca_certificate: Some(file.path().to_path_buf()),
            ..TlsFiles::default()
        };
        let err = rustls_client_config(Signal::Logs, &tls).unwrap_err();
        assert!(matches!(err, TransportBuildError::TlsPem { .. }), "{err}");
    }

    #[test]
    fn half_a_client_identity_is_refused() {
        let tls = TlsFiles {
            client_certificate: Some("/tmp/cert.pem".into()),
            ..TlsFiles::default()
        };
        assert!(matches!(
            client_identity_pems(&tls),
            Err(TransportBuildError::HalfClientIdentity)
        ));
    }

    #[test]
    fn without_files_the_webpki_roots_are_used() {
        let config = rustls_client_config(Signal::Metrics, &TlsFiles::default()).unwrap();
        assert!(!config.client_auth_cert_resolver.has_certs());
    }
}
