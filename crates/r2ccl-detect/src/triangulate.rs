//! Localization by three-point triangulation (MECHANISMS.md section 2.3): from the probe
//! observations of both ends and of an auxiliary node, name the failed NIC or link.

use r2ccl_core::NicId;
use std::fmt;

/// What one probe saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Observation {
    /// The probe was answered.
    Ok,
    /// No answer within the probe timeout.
    Timeout,
    /// The probing NIC failed at once (link down, error completion).
    LocalError,
    /// No observation (the report was lost, or the prober's own NIC was broken).
    Unknown,
}

/// The observations of one localization round for the path local NIC `a` <-> remote NIC `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Observations {
    /// a probes b.
    pub ab: Observation,
    /// b probes a (run by the peer on our request).
    pub ba: Observation,
    /// The auxiliary node's probes of a and of b; `None` with only two nodes.
    pub aux: Option<(Observation, Observation)>,
}

/// Which component failed, from the localizing rank's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// This rank's NIC failed (or is unreachable from everywhere).
    LocalNic(NicId),
    /// The peer's NIC failed (or is unreachable from everywhere).
    RemoteNic(NicId),
    /// The link, cable or switch port between the two NICs (also the two-node fallback,
    /// which cannot tell the NICs apart: the pair is failed, not either NIC).
    Link {
        /// This rank's NIC.
        local: NicId,
        /// The peer's NIC.
        remote: NicId,
    },
    /// Both directions answer: a transient problem; stay and keep watching.
    Transient,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::LocalNic(n) => write!(f, "local NIC {n}"),
            Verdict::RemoteNic(n) => write!(f, "remote NIC {n}"),
            Verdict::Link { local, remote } => write!(f, "link {local}<->{remote}"),
            Verdict::Transient => f.write_str("transient"),
        }
    }
}

/// How a verdict was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// An immediate local error at one end names that end's NIC.
    LocalEvidence,
    /// The auxiliary node's probes separated NIC from link.
    Triangulated,
    /// Both end-to-end probes answered.
    BothDirectionsOk,
    /// No usable auxiliary observation: treated as the link (two-node fallback).
    TwoNodeFallback,
}

/// Decide the verdict for path `local` <-> `remote` from `obs`.
///
/// | a->b | b->a | aux->a | aux->b | verdict |
/// |---|---|---|---|---|
/// | local error | any | any | any | local NIC |
/// | any | local error | any | any | remote NIC |
/// | ok | ok | any | any | transient |
/// | other | other | timeout | ok | local NIC (unreachable) |
/// | other | other | ok | timeout | remote NIC (unreachable) |
/// | other | other | ok | ok | link |
/// | other | other | anything else or no aux | | link (two-node fallback) |
pub fn localize(local: NicId, remote: NicId, obs: &Observations) -> (Verdict, Method) {
    use Observation as O;
    if obs.ab == O::LocalError {
        return (Verdict::LocalNic(local), Method::LocalEvidence);
    }
    if obs.ba == O::LocalError {
        return (Verdict::RemoteNic(remote), Method::LocalEvidence);
    }
    if obs.ab == O::Ok && obs.ba == O::Ok {
        return (Verdict::Transient, Method::BothDirectionsOk);
    }
    match obs.aux {
        Some((O::Timeout, O::Ok)) => (Verdict::LocalNic(local), Method::Triangulated),
        Some((O::Ok, O::Timeout)) => (Verdict::RemoteNic(remote), Method::Triangulated),
        Some((O::Ok, O::Ok)) => (Verdict::Link { local, remote }, Method::Triangulated),
        _ => (Verdict::Link { local, remote }, Method::TwoNodeFallback),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Observation as O;

    fn v(ab: O, ba: O, aux: Option<(O, O)>) -> Verdict {
        localize(NicId::new(0, 1), NicId::new(1, 1), &Observations { ab, ba, aux }).0
    }

    #[test]
    fn the_spec_table_rows() {
        let (a, b) = (NicId::new(0, 1), NicId::new(1, 1));
        assert_eq!(v(O::LocalError, O::Timeout, Some((O::Timeout, O::Ok))), Verdict::LocalNic(a));
        assert_eq!(v(O::Timeout, O::LocalError, Some((O::Ok, O::Timeout))), Verdict::RemoteNic(b));
        assert_eq!(v(O::Timeout, O::Timeout, Some((O::Ok, O::Ok))), Verdict::Link { local: a, remote: b });
        assert_eq!(v(O::Timeout, O::Timeout, Some((O::Timeout, O::Ok))), Verdict::LocalNic(a));
        assert_eq!(v(O::Timeout, O::Timeout, Some((O::Ok, O::Timeout))), Verdict::RemoteNic(b));
        assert_eq!(v(O::Ok, O::Ok, Some((O::Ok, O::Ok))), Verdict::Transient);
    }

    #[test]
    fn two_nodes_and_missing_reports_fall_back_to_link() {
        let (a, b) = (NicId::new(0, 1), NicId::new(1, 1));
        assert_eq!(v(O::Timeout, O::Timeout, None), Verdict::Link { local: a, remote: b });
        assert_eq!(v(O::Timeout, O::Unknown, Some((O::Unknown, O::Ok))), Verdict::Link { local: a, remote: b });
        assert_eq!(v(O::LocalError, O::Unknown, None), Verdict::LocalNic(a));
    }
}
