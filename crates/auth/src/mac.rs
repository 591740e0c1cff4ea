//! HMAC-SHA256 tags with domain separation.

use crate::key::Secret;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const TAG_LEN: usize = 32;
pub type Tag = [u8; TAG_LEN];

fn mac_over(secret: &Secret, label: &str, parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.bytes()).expect("HMAC takes keys of any length");
    // Label and parts are each prefixed with their length: ("ab", "c") and ("a", "bc")
    // authenticate different things, and no label is a prefix of another's input.
    for p in std::iter::once(label.as_bytes()).chain(parts.iter().copied()) {
        mac.update(&(p.len() as u64).to_le_bytes());
        mac.update(p);
    }
    mac
}

/// The tag of `parts` under `secret` for the purpose `label` (e.g. "shoal peer hello").
pub fn tag(secret: &Secret, label: &str, parts: &[&[u8]]) -> Tag {
    mac_over(secret, label, parts).finalize().into_bytes().into()
}

/// Whether `candidate` is the tag of `parts` under `secret` for `label`, compared in
/// constant time.
pub fn verify(secret: &Secret, label: &str, parts: &[&[u8]], candidate: &[u8]) -> bool {
    mac_over(secret, label, parts).verify_slice(candidate).is_ok()
}

/// A key for one purpose, derived one-way from `secret` (HMAC as a PRF): knowing the
/// derived key tells nothing of `secret` nor of keys derived for other labels.
pub fn derive(secret: &Secret, label: &str) -> Secret {
    Secret::from_bytes(tag(secret, "shoal derive", &[label.as_bytes()]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_depend_on_key_label_and_the_split_of_parts() {
        let k = Secret::random();
        let t = tag(&k, "a", &[b"xy", b"z"]);
        assert!(verify(&k, "a", &[b"xy", b"z"], &t));
        assert!(!verify(&k, "b", &[b"xy", b"z"], &t));
        assert!(!verify(&k, "a", &[b"x", b"yz"], &t));
        assert!(!verify(&Secret::random(), "a", &[b"xy", b"z"], &t));
        assert!(!verify(&k, "a", &[b"xy", b"z"], &t[..31]));
    }

    #[test]
    fn derived_keys_differ_by_label_and_are_stable() {
        let k = Secret::random();
        assert_eq!(derive(&k, "host").bytes(), derive(&k, "host").bytes());
        assert_ne!(derive(&k, "host").bytes(), derive(&k, "capability").bytes());
        assert_ne!(derive(&k, "host").bytes(), k.bytes());
    }
}
