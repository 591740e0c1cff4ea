//! Weighted rendezvous (highest random weight) hashing.
//!
//! Every (key, server) pair gets a score; the key belongs to the server with the highest
//! score. Adding a server only moves the keys for which the new server scores highest (a
//! share proportional to its weight); removing one only moves its own keys. Written here
//! rather than taken from a crate because it is the product's placement and must stay
//! bit-for-bit stable across versions: the hash below is part of the on-disk contract.

/// SplitMix64 finaliser: a fixed, well-mixed 64-bit permutation.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Score of `key` on server `server_id` with `weight` (> 0). Larger wins.
pub fn score(key: u64, server_id: u32, weight: f64) -> f64 {
    let h = mix64(key ^ mix64(server_id as u64 ^ 0x5348_4F4C_0000_0000));
    // u in (0, 1]; -w / ln(u) is the standard weighted-rendezvous transform.
    let u = ((h >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    if u >= 1.0 {
        return f64::INFINITY;
    }
    -weight / u.ln()
}
