//! Making the TLS files a cluster needs (`shoal keygen`, `shoal cluster up --tls`, the
//! test harnesses): a cluster CA, and one server certificate it issues naming the host of
//! every server in the map. Written where the map's `[security]` table says: the CA
//! certificate public (0644, every client needs it), the CA key and the server key
//! readable by their owner only (0600: root on the servers).

use crate::tls::host_of;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use shoal_placement::ClusterMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The CA's subject: this, and a fingerprint of its key, so that the CA can be rebuilt from
/// its key alone (below) and two clusters' CAs have different names (a certificate from
/// the wrong CA is then reported as from an unknown issuer, not as a bad signature).
const CA_NAME: &str = "Shoal cluster CA";
/// Certificates are valid for about this many years from the day they are made.
const VALID_YEARS: i32 = 10;

/// What [`make_certs`] did.
#[derive(Clone, Debug)]
pub struct CertReport {
    /// A new CA was made (else the existing CA key signed the new server certificate).
    pub new_ca: bool,
    /// The names the server certificate carries.
    pub names: Vec<String>,
}

/// Write `path` whole (through a temporary file and a rename) with `mode`.
fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let r = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|_| f.sync_all()))
        .and_then(|_| std::fs::rename(&tmp, path));
    r.map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Valid until the first of January [`VALID_YEARS`] years from now (from rcgen's default
/// start, so that a host whose clock is behind still accepts them).
fn validity(p: &mut CertificateParams) {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    // Mean Gregorian year: exact enough for an expiry date.
    let year = 1970 + (secs / 31_556_952) as i32;
    p.not_after = rcgen::date_time_ymd(year + VALID_YEARS, 1, 1);
}

fn ca_params(key: &KeyPair) -> Result<CertificateParams, String> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| format!("TLS CA: {e}"))?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // The public key's first bytes after its format byte: distinct per key, stable.
    let fp: String = key.public_key_raw().iter().skip(1).take(8).map(|b| format!("{b:02x}")).collect();
    p.distinguished_name.push(DnType::CommonName, format!("{CA_NAME} {fp}"));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut p);
    Ok(p)
}

/// Make the cluster's TLS files. The CA is kept if its key exists (unless `new_ca`), so
/// that clients holding its certificate keep trusting the servers; the server certificate
/// and key are made anew every time, naming the hosts of the map's servers as they are now
/// (run again after adding a server on a new host, and copy the files to the servers).
pub fn make_certs(map: &ClusterMap, new_ca: bool) -> Result<CertReport, String> {
    let sec = &map.security;
    let existing = if !new_ca && sec.tls_ca_key.exists() {
        let pem = std::fs::read_to_string(&sec.tls_ca_key)
            .map_err(|e| format!("cannot read the TLS CA key {}: {e}", sec.tls_ca_key.display()))?;
        Some(KeyPair::from_pem(&pem).map_err(|e| format!("TLS CA key {}: {e}", sec.tls_ca_key.display()))?)
    } else {
        None
    };
    let made = existing.is_none();
    let ca_key = match existing {
        Some(k) => k,
        None => KeyPair::generate().map_err(|e| format!("TLS CA key: {e}"))?,
    };
    // Signing needs the issuer as a certificate; rebuilt from the key and the fixed subject,
    // it has the name and key identifier of the one clients hold (what verification checks).
    let ca = ca_params(&ca_key)?.self_signed(&ca_key).map_err(|e| format!("TLS CA: {e}"))?;
    if made || !sec.tls_ca.exists() {
        write_file(&sec.tls_ca_key, &ca_key.serialize_pem(), 0o600)?;
        write_file(&sec.tls_ca, &ca.pem(), 0o644)?;
    }

    let mut names: Vec<String> = Vec::new();
    for s in &map.servers {
        let h = host_of(&s.addr).to_string();
        if !names.contains(&h) {
            names.push(h);
        }
    }
    let mut p = CertificateParams::new(names.clone()).map_err(|e| format!("TLS server certificate: {e}"))?;
    p.distinguished_name.push(DnType::CommonName, "shoald");
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut p);
    let key = KeyPair::generate().map_err(|e| format!("TLS server key: {e}"))?;
    let cert = p.signed_by(&key, &ca, &ca_key).map_err(|e| format!("TLS server certificate: {e}"))?;
    write_file(&sec.tls_key, &key.serialize_pem(), 0o600)?;
    write_file(&sec.tls_cert, &cert.pem(), 0o644)?;
    Ok(CertReport { new_ca: made, names })
}
