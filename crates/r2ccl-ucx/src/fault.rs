//! `R2CCL_FAULT`: software fault injection specs for machines without root (pure parsing, no IO).
//!
//! Grammar (also in the crate docs and `docs/faults.md`):
//!
//! ```text
//! R2CCL_FAULT = spec { ";" spec }            (empty specs between ';' are ignored)
//! spec        = field { "," field }
//! field       = "rank=" (N | "*")            which rank injects (default "*": every rank)
//!             | "nic=" N                     the local NIC (rail index) that fails; required
//!             | "after_bytes=" SIZE          trigger once SIZE bytes were posted on that NIC (sent + received)
//!             | "after_msgs=" N              trigger once N messages were posted on that NIC
//!             | "after_ms=" N                trigger N ms after the peers are connected
//!             | "for_ms=" N                  heal N ms after triggering (a flap); default: never heals
//!             | "kind=" ("down" | "blackhole" | "slow:" F)     required
//! SIZE        = N [ "K" | "M" | "G" | "KiB" | "MiB" | "GiB" ]   binary multiples (64M = 64 * 2^20)
//! ```
//!
//! Without a trigger the fault fires at connect time. Several triggers may be combined: the fault fires
//! when the first of them is reached.

use std::fmt;
use std::time::Duration;

/// What an injected fault does to its NIC.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FaultKind {
    /// The NIC's link goes down: outstanding requests fail at once with a local error, new ones fail at
    /// once, and a link-state-down event is reported (as netlink would).
    Down,
    /// Silent black hole: requests on the NIC never complete, no error, no event (carrier stays up).
    Blackhole,
    /// Slow NIC: every request on it takes `1 / factor` times as long (its completion is held back).
    Slow {
        /// Speed relative to normal, in `(0, 1]`.
        factor: f64,
    },
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Down => f.write_str("down"),
            Self::Blackhole => f.write_str("blackhole"),
            Self::Slow { factor } => write!(f, "slow:{factor}"),
        }
    }
}

/// One parsed fault spec.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultSpec {
    /// The rank that injects it; `None` means every rank.
    pub rank: Option<u32>,
    /// The local NIC (rail index).
    pub nic: u16,
    /// Fire once this many bytes were posted on the NIC.
    pub after_bytes: Option<u64>,
    /// Fire once this many messages were posted on the NIC.
    pub after_msgs: Option<u64>,
    /// Fire this long after the peers are connected.
    pub after: Option<Duration>,
    /// Heal this long after firing; `None`: the fault stays.
    pub duration: Option<Duration>,
    /// What happens.
    pub kind: FaultKind,
}

impl FaultSpec {
    /// Whether the spec applies to `rank`.
    pub fn applies_to(&self, rank: u32) -> bool {
        self.rank.is_none_or(|r| r == rank)
    }

    /// Whether the trigger is reached: `bytes` and `msgs` posted on the NIC, `elapsed` since connect.
    /// A spec without any trigger fires at once.
    pub fn is_due(&self, bytes: u64, msgs: u64, elapsed: Duration) -> bool {
        let none = self.after_bytes.is_none() && self.after_msgs.is_none() && self.after.is_none();
        none || self.after_bytes.is_some_and(|b| bytes >= b)
            || self.after_msgs.is_some_and(|m| msgs >= m)
            || self.after.is_some_and(|t| elapsed >= t)
    }
}

/// A malformed `R2CCL_FAULT` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("R2CCL_FAULT spec {index} `{spec}`: `{part}` {why}")]
pub struct FaultParseError {
    /// 1-based position of the spec among the `;`-separated ones.
    pub index: usize,
    /// The whole spec.
    pub spec: String,
    /// The offending part (a field, or the whole spec for a missing field).
    pub part: String,
    /// What is wrong with it.
    pub why: String,
}

/// Parse an `R2CCL_FAULT` value into its specs (see the module docs for the grammar).
pub fn parse_faults(value: &str) -> Result<Vec<FaultSpec>, FaultParseError> {
    value.split(';').map(str::trim).filter(|s| !s.is_empty()).enumerate().map(|(i, s)| parse_spec(i + 1, s)).collect()
}

fn parse_spec(index: usize, spec: &str) -> Result<FaultSpec, FaultParseError> {
    let err = |part: &str, why: String| FaultParseError { index, spec: spec.to_owned(), part: part.to_owned(), why };
    let mut out = FaultSpec {
        rank: None,
        nic: 0,
        after_bytes: None,
        after_msgs: None,
        after: None,
        duration: None,
        kind: FaultKind::Down,
    };
    let (mut have_nic, mut have_kind) = (false, false);
    for field in spec.split(',').map(str::trim) {
        let Some((key, val)) = field.split_once('=') else {
            return Err(err(field, "is not of the form key=value".into()));
        };
        let (key, val) = (key.trim(), val.trim());
        let int = |what: &str| val.parse::<u64>().map_err(|_| err(field, format!("is not a {what}")));
        match key {
            "rank" if val == "*" => out.rank = None,
            "rank" => {
                out.rank = Some(u32::try_from(int("rank number")?).map_err(|_| err(field, "is too large".into()))?)
            }
            "nic" => {
                out.nic = u16::try_from(int("NIC index")?).map_err(|_| err(field, "is too large".into()))?;
                have_nic = true;
            }
            "after_bytes" => {
                out.after_bytes = Some(parse_size(val).ok_or_else(|| err(field, "is not a size like 64M".into()))?)
            }
            "after_msgs" => out.after_msgs = Some(int("message count")?),
            "after_ms" => out.after = Some(Duration::from_millis(int("number of milliseconds")?)),
            "for_ms" => out.duration = Some(Duration::from_millis(int("number of milliseconds")?)),
            "kind" => {
                out.kind = parse_kind(val).ok_or_else(|| {
                    err(field, "is not a fault kind (down, blackhole, slow:F with 0 < F <= 1)".into())
                })?;
                have_kind = true;
            }
            _ => {
                return Err(err(
                    field,
                    "has an unknown key (known: rank, nic, after_bytes, after_msgs, after_ms, for_ms, kind)".into(),
                ))
            }
        }
    }
    if !have_nic {
        return Err(err(spec, "lacks nic=N".into()));
    }
    if !have_kind {
        return Err(err(spec, "lacks kind=down|blackhole|slow:F".into()));
    }
    Ok(out)
}

fn parse_kind(val: &str) -> Option<FaultKind> {
    match val {
        "down" => Some(FaultKind::Down),
        "blackhole" => Some(FaultKind::Blackhole),
        _ => {
            let factor: f64 = val.strip_prefix("slow:")?.parse().ok()?;
            (factor > 0.0 && factor <= 1.0).then_some(FaultKind::Slow { factor })
        }
    }
}

/// `N` with an optional binary suffix (`K`, `M`, `G`, `KiB`, `MiB`, `GiB`; case-insensitive).
fn parse_size(val: &str) -> Option<u64> {
    let digits = val.find(|c: char| !c.is_ascii_digit()).unwrap_or(val.len());
    let (num, suffix) = val.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_examples() {
        let v =
            parse_faults("rank=1,nic=0,after_bytes=64M,kind=down; rank=0,nic=1,after_ms=500,kind=blackhole;;").unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].rank, Some(1));
        assert_eq!(v[0].after_bytes, Some(64 << 20));
        assert_eq!(v[0].kind, FaultKind::Down);
        assert_eq!(v[1].nic, 1);
        assert_eq!(v[1].after, Some(Duration::from_millis(500)));
        assert_eq!(v[1].kind, FaultKind::Blackhole);
        let s = parse_faults("nic=2,kind=slow:0.5,after_msgs=10,for_ms=300").unwrap();
        assert_eq!(s[0].rank, None);
        assert!(s[0].applies_to(7));
        assert_eq!(s[0].kind, FaultKind::Slow { factor: 0.5 });
        assert_eq!(s[0].duration, Some(Duration::from_millis(300)));
        assert_eq!(parse_faults("").unwrap(), vec![]);
        assert_eq!(parse_size("4KiB"), Some(4096));
        assert_eq!(parse_size("1g"), Some(1 << 30));
    }

    #[test]
    fn errors_name_the_bad_part() {
        let e = parse_faults("nic=0,kind=down;rank=1,nic=x,kind=down").unwrap_err();
        assert_eq!((e.index, e.part.as_str()), (2, "nic=x"));
        assert!(e.to_string().contains("`nic=x` is not a NIC index"), "{e}");
        let e = parse_faults("nic=0,kind=slow:2").unwrap_err();
        assert_eq!(e.part, "kind=slow:2");
        let e = parse_faults("nic=0,kind=down,color=red").unwrap_err();
        assert!(e.to_string().contains("unknown key"), "{e}");
        let e = parse_faults("rank=1,kind=down").unwrap_err();
        assert!(e.to_string().contains("lacks nic=N"), "{e}");
        let e = parse_faults("nic=0").unwrap_err();
        assert!(e.why.contains("lacks kind"), "{e}");
        let e = parse_faults("nic=0,kind=down,after_bytes=12Q").unwrap_err();
        assert_eq!(e.part, "after_bytes=12Q");
        assert!(parse_faults("nic=0,down").unwrap_err().why.contains("key=value"));
    }

    #[test]
    fn triggers_fire_on_the_first_reached() {
        let s = parse_faults("nic=0,kind=down,after_bytes=100,after_ms=10").unwrap().remove(0);
        assert!(!s.is_due(99, 0, Duration::from_millis(9)));
        assert!(s.is_due(100, 0, Duration::ZERO));
        assert!(s.is_due(0, 0, Duration::from_millis(10)));
        let now = parse_faults("nic=0,kind=down").unwrap().remove(0);
        assert!(now.is_due(0, 0, Duration::ZERO));
    }
}
