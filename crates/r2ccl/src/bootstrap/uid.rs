//! The unique id: rank 0's rendezvous address plus a 128-bit secret, as a printable string.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// 16 random bytes from the OS (secrets, handshake nonces); no randomness is an error, never a
/// guessable fallback.
pub(crate) fn random16() -> std::io::Result<[u8; 16]> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(format!("the OS gave no randomness: {e}")))?;
    Ok(b)
}

/// The job's 128-bit shared secret. `Debug` does not print it; its bytes are wiped on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 16]);

impl Drop for Secret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why a unique id or secret string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UniqueIdError {
    /// The string does not start with the expected tag.
    #[error("not an r2ccl unique id (expected `r2ccl1:HOST:PORT:SECRET`): {0:?}")]
    Format(String),
    /// The address part is not `ip:port`.
    #[error("bad rendezvous address {0:?} in unique id (expected ip:port)")]
    Address(String),
    /// The secret is not 32 hex digits.
    #[error("bad secret: expected 32 hex digits, got {0} characters")]
    Secret(usize),
    /// No randomness source for a new secret.
    #[error("the OS gave no randomness for a new secret: {0}")]
    Random(String),
}

impl Secret {
    /// A secret from raw bytes.
    pub const fn from_bytes(b: [u8; 16]) -> Self {
        Self(b)
    }

    /// A fresh random secret from the OS.
    pub fn generate() -> Result<Self, UniqueIdError> {
        random16().map(Self).map_err(|e| UniqueIdError::Random(e.to_string()))
    }

    /// Derive a secret from a job identity string (weak: anyone who knows the job id can
    /// compute it; used only when the launcher gives no secret, and logged as a warning).
    pub fn derive(job: &str) -> Self {
        Self(super::mac::derive_public(job))
    }

    /// The raw bytes.
    pub const fn bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parse 32 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, UniqueIdError> {
        let s = s.trim();
        if s.len() != 32 || !s.is_ascii() {
            return Err(UniqueIdError::Secret(s.chars().count()));
        }
        let mut b = [0u8; 16];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| UniqueIdError::Secret(s.len()))?;
        }
        Ok(Self(b))
    }
}

/// What rank 0 hands out of band to every rank (as `ncclGetUniqueId`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueId {
    /// Address of rank 0's rendezvous listener.
    pub root: SocketAddr,
    /// The job secret every connection must prove.
    pub secret: Secret,
}

const TAG: &str = "r2ccl1:";

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TAG}{}:{}", self.root, self.secret.to_hex())
    }
}

/// `s` as a unique id with whatever follows its last `:` (the secret) hidden, for error messages.
pub(crate) fn redacted(s: &str) -> String {
    match s.trim().rsplit_once(':') {
        Some((head, _)) => format!("{head}:(secret hidden)"),
        None => "(hidden: not HOST:PORT:SECRET)".into(),
    }
}

impl FromStr for UniqueId {
    type Err = UniqueIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s.trim().strip_prefix(TAG).ok_or_else(|| UniqueIdError::Format(redacted(s)))?;
        let (addr, secret) = rest.rsplit_once(':').ok_or_else(|| UniqueIdError::Format(redacted(s)))?;
        let root = addr.parse().map_err(|_| UniqueIdError::Address(addr.to_owned()))?;
        Ok(Self { root, secret: Secret::from_hex(secret)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for root in ["127.0.0.1:29500", "[::1]:7000"] {
            let id = UniqueId { root: root.parse().unwrap(), secret: Secret::generate().unwrap() };
            let s = id.to_string();
            assert_eq!(s.parse::<UniqueId>().unwrap(), id, "{s}");
        }
    }

    #[test]
    fn rejects_bad_ids_with_reasons() {
        assert!(matches!("hello".parse::<UniqueId>(), Err(UniqueIdError::Format(_))));
        assert!(matches!("r2ccl1:nohost:00".parse::<UniqueId>(), Err(UniqueIdError::Address(_))));
        assert!(matches!("r2ccl1:127.0.0.1:1:abc".parse::<UniqueId>(), Err(UniqueIdError::Secret(3))));
        assert!(format!("{:?}", Secret::from_bytes([7; 16])) == "Secret(..)");
        assert!(Secret::from_hex("zz000000000000000000000000000000").is_err());
        assert!(Secret::from_hex("é0000000000000000000000000000000").is_err());
    }
}
