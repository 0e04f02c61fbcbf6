//! Message authentication under the job secret: HMAC-SHA-256 (RustCrypto's audited `hmac` and
//! `sha2`), truncated to 128 bits, and the keys derived from the secret.
//!
//! Handshakes prove knowledge of the secret against a fresh nonce; [`data_keys`] gives a
//! communicator's chunk-header key and id. Nothing here encrypts.

use super::Secret;
use hmac::{Hmac, Mac};
use r2ccl_transport::HeaderKey;
use sha2::Sha256;

fn keyed(secret: &Secret) -> Hmac<Sha256> {
    // HMAC takes keys of any length: this never fails.
    <Hmac<Sha256> as Mac>::new_from_slice(secret.bytes()).unwrap_or_else(|_| unreachable!("HMAC accepts any key"))
}

/// HMAC-SHA-256 over `parts`, each length-prefixed (so part boundaries matter).
fn full(secret: &Secret, parts: &[&[u8]]) -> [u8; 32] {
    let mut m = keyed(secret);
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// A 128-bit tag over `parts` (length-delimited, so part boundaries matter).
pub(crate) fn tag(secret: &Secret, parts: &[&[u8]]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&full(secret, parts)[..16]);
    out
}

/// Constant-time tag comparison.
pub(crate) fn tags_equal(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A communicator's chunk-header key and its id, from the job secret and the random session
/// nonce rank 0 chose for this communicator (sent in the authenticated rank table): a fresh
/// key and id per communicator, so chunks of another job or communicator never verify.
pub(crate) fn data_keys(secret: &Secret, session: &[u8; 16]) -> (HeaderKey, u64) {
    let key = HeaderKey::from_bytes(full(secret, &[b"r2ccl data-plane key v1", session]));
    let id = full(secret, &[b"r2ccl communicator id v1", session]);
    let mut b = [0u8; 8];
    b.copy_from_slice(&id[..8]);
    (key, u64::from_le_bytes(b))
}

/// The 32-byte key of one direction (`dir`) of an OOB connection between `connector` and
/// `acceptor`, from the secret and both sides' handshake nonces: fresh per connection.
pub(crate) fn oob_key(
    secret: &Secret,
    dir: &[u8],
    nonces: (&[u8; 16], &[u8; 16]),
    connector: u32,
    acceptor: u32,
) -> [u8; 32] {
    full(secret, &[b"r2ccl oob key v1", dir, nonces.0, nonces.1, &connector.to_le_bytes(), &acceptor.to_le_bytes()])
}

/// The secret of a communicator split off one whose secret is `parent`: every member derives it
/// from the leader's random `nonce` and the color, so no secret is sent anywhere.
pub(crate) fn split_secret(parent: &Secret, nonce: &[u8; 16], color: u32) -> Secret {
    Secret::from_bytes(tag(parent, &[b"r2ccl split secret v1", nonce, &color.to_le_bytes()]))
}

/// A secret derived from public inputs (see [`Secret::derive`]): HMAC under a fixed key.
pub(crate) fn derive_public(job: &str) -> [u8; 16] {
    let fixed = Secret::from_bytes(*b"r2ccl-derive-key");
    tag(&fixed, &[job.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test case 2 (key "Jefe"), through the same crate calls `full` makes.
    #[test]
    fn hmac_sha256_reference_vector() {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let out: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(out[..4], [0x5b, 0xdc, 0xc1, 0x46]);
        assert_eq!(out[28..], [0x64, 0xec, 0x38, 0x43]);
    }

    #[test]
    fn tags_depend_on_secret_and_boundaries() {
        let a = Secret::from_bytes([1; 16]);
        let b = Secret::from_bytes([2; 16]);
        assert_ne!(tag(&a, &[b"xy"]), tag(&b, &[b"xy"]));
        assert_ne!(tag(&a, &[b"x", b"y"]), tag(&a, &[b"xy"]));
        assert!(tags_equal(&tag(&a, &[b"n"]), &tag(&a, &[b"n"])));
    }

    #[test]
    fn data_keys_differ_per_session_and_secret() {
        let a = Secret::from_bytes([1; 16]);
        let b = Secret::from_bytes([2; 16]);
        let (k1, id1) = data_keys(&a, &[0; 16]);
        let (k2, id2) = data_keys(&a, &[1; 16]);
        let (k3, _) = data_keys(&b, &[0; 16]);
        assert_ne!(k1, k2);
        assert_ne!(id1, id2);
        assert_ne!(k1, k3);
    }
}
