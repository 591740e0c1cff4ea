//! TLS 1.3 on connections (`[security] tls = true`): the rustls configurations of both
//! sides, the name a client checks a server's certificate against, and one-line
//! descriptions of handshake failures (docs/security.md, "TLS").
//!
//! Trust is one cluster CA: servers present a certificate it issued naming every server
//! address of the map; clients (and servers calling their peers) verify it against the CA
//! certificate and the host of the address they dialled. Clients present no certificate —
//! who a client or a server is, is the business of the cluster and host keys in `Hello`;
//! TLS gives privacy and integrity of the bytes and the server's identity.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use shoal_placement::map::Security;
use std::path::Path;
use std::sync::Arc;

/// The first byte of every TLS connection (a handshake record, RFC 8446 §5.1). A Shoal
/// frame starts with its magic, `4C 4F 48 53`, so one byte tells the two apart.
pub const HANDSHAKE_RECORD: u8 = 0x16;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in the {what} {}", path.display()));
    }
    Ok(certs)
}

/// What a client (or a server calling a peer) needs: the cluster CA, TLS 1.3 only.
pub fn client_config(sec: &Security) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(&sec.tls_ca, "TLS CA certificate (tls_ca)")? {
        roots.add(c).map_err(|e| format!("TLS CA certificate {}: {e}", sec.tls_ca.display()))?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// What a server needs: its certificate and key, TLS 1.3 only.
pub fn server_config(sec: &Security) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs = read_certs(&sec.tls_cert, "TLS server certificate (tls_cert)")?;
    let key = PrivateKeyDer::from_pem_file(&sec.tls_key)
        .map_err(|e| format!("cannot read the TLS server key (tls_key) {}: {e}", sec.tls_key.display()))?;
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!("TLS server certificate {} and key {}: {e}", sec.tls_cert.display(), sec.tls_key.display())
        })?;
    Ok(Arc::new(cfg))
}

/// The host part of a `host:port` address (an IPv6 address loses its brackets).
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// The name the server at `addr` must prove: its host, an IP address or a DNS name.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = host_of(addr);
    ServerName::try_from(host.to_string()).map_err(|e| format!("TLS: {host} is not a valid server name: {e}"))
}

/// Whether a failed client handshake is the peer's doing at the TLS level (a certificate
/// it could not prove, an alert) rather than a lost connection.
pub fn is_tls_error(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
}

/// One line saying why a client's TLS handshake failed, with the likely cause.
pub fn describe_handshake_error(e: &std::io::Error, sec: &Security) -> String {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => format!(
            "TLS: the server's certificate is not accepted ({c:?}); is {} the cluster's CA certificate, and does the \
             server certificate name this address? (shoal keygen makes both)",
            sec.tls_ca.display()
        ),
        Some(other) => format!("TLS handshake failed: {other}"),
        None => match e.kind() {
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe => format!(
                "the server closed the connection during the TLS handshake ({e}); does it run without TLS? \
                 (tls = true under [security] in this side's cluster map)"
            ),
            _ => format!("TLS handshake: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_address_is_what_its_certificate_must_name() {
        assert_eq!(host_of("127.0.0.1:7400"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7400"), "::1");
        assert_eq!(host_of("node3.example:7400"), "node3.example");
        assert!(matches!(server_name("127.0.0.1:1").unwrap(), ServerName::IpAddress(_)));
        assert!(matches!(server_name("node3.example:1").unwrap(), ServerName::DnsName(_)));
    }
}
