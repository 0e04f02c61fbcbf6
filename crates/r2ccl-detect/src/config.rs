//! Detection timing and hysteresis settings, with defaults and validation.

use std::time::Duration;

/// Why a [`DetectConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A duration that must be positive is zero.
    #[error("{field} must be greater than zero")]
    Zero {
        /// The field's name.
        field: &'static str,
    },
    /// A count that must be at least one is zero.
    #[error("{field} must be at least 1, got 0")]
    ZeroCount {
        /// The field's name.
        field: &'static str,
    },
    /// Two fields are in the wrong order.
    #[error("{smaller} ({smaller_value:?}) must be less than {larger} ({larger_value:?})")]
    Order {
        /// The field that must be smaller.
        smaller: &'static str,
        /// Its value.
        smaller_value: Duration,
        /// The field that must be larger.
        larger: &'static str,
        /// Its value.
        larger_value: Duration,
    },
}

/// Timing and hysteresis of detection, localization and recovery.
///
/// Signals that need no timer are acted on in the same `handle_*` call: a local link-down
/// event or an immediate local error declares the path failed with a local-NIC verdict
/// before the call returns (0 ms of detector latency; the MECHANISMS target is 10 ms for
/// link-down), and a remote error fails the path at once and localizes it with one probe
/// round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectConfig {
    /// Slack added to a transfer's expected time before a path with outstanding data and
    /// no completion becomes suspect (progress deadline = expected + margin). Default 20 ms.
    pub progress_margin: Duration,
    /// How often an idle path (no outstanding data) gets a heartbeat. Default 25 ms.
    pub heartbeat_interval: Duration,
    /// Heartbeat intervals without any sign of life after which an idle path becomes
    /// suspect. Default 4 (100 ms with the default interval).
    pub heartbeat_misses: u32,
    /// A probe without an answer after this long counts as a timeout. Default 10 ms.
    pub probe_timeout: Duration,
    /// A localization round gives up on missing observations after this long and decides
    /// from what it has. Default 50 ms.
    pub localize_timeout: Duration,
    /// Resend interval of a localization round's probe requests until their report comes
    /// (a lost request or report costs one interval). Default 20 ms.
    pub oob_retry: Duration,
    /// How often a probe request is resent before the detector gives up on the peer and
    /// reports it. Default 50.
    pub oob_max_retries: u32,
    /// Interval between re-probes of a failed path. Default 100 ms.
    pub probe_interval: Duration,
    /// Consecutive good probes before a failed path is declared healthy (hysteresis).
    /// Default 3.
    pub good_probes: u32,
    /// Hold-down after a first failure before re-probing starts; doubled on every flap.
    /// Default 200 ms.
    pub holddown_base: Duration,
    /// Upper bound of the doubled hold-down. Default 5 s.
    pub holddown_max: Duration,
    /// A failure within this time after a recovery counts as a flap (the hold-down
    /// doubles); after a longer healthy stretch the hold-down resets to the base. Default 10 s.
    pub flap_window: Duration,
}

impl Default for DetectConfig {
    fn default() -> Self {
        Self {
            progress_margin: Duration::from_millis(20),
            heartbeat_interval: Duration::from_millis(25),
            heartbeat_misses: 4,
            probe_timeout: Duration::from_millis(10),
            localize_timeout: Duration::from_millis(50),
            oob_retry: Duration::from_millis(20),
            oob_max_retries: 50,
            probe_interval: Duration::from_millis(100),
            good_probes: 3,
            holddown_base: Duration::from_millis(200),
            holddown_max: Duration::from_secs(5),
            flap_window: Duration::from_secs(10),
        }
    }
}

impl DetectConfig {
    /// The suspicion threshold: how long beyond its expected time a path may stay silent
    /// (no completion, no probe answer) without being declared failed. A shorter delay
    /// never produces a failure declaration: the path becomes suspect after
    /// `progress_margin`, and a probe round of `probe_timeout` must fail on top of it.
    pub fn suspicion_threshold(&self) -> Duration {
        self.progress_margin + self.probe_timeout
    }

    /// Silence on an idle path after which it becomes suspect.
    pub fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_interval.saturating_mul(self.heartbeat_misses)
    }

    /// The hold-down after `flaps` consecutive flaps: base * 2^flaps, capped at the max.
    pub fn holddown(&self, flaps: u32) -> Duration {
        let factor = 1u32.checked_shl(flaps.min(31)).unwrap_or(u32::MAX);
        self.holddown_base.saturating_mul(factor).min(self.holddown_max)
    }

    /// Check that every field is usable and the fields fit together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let durations = [
            ("progress_margin", self.progress_margin),
            ("heartbeat_interval", self.heartbeat_interval),
            ("probe_timeout", self.probe_timeout),
            ("localize_timeout", self.localize_timeout),
            ("oob_retry", self.oob_retry),
            ("probe_interval", self.probe_interval),
            ("holddown_base", self.holddown_base),
            ("holddown_max", self.holddown_max),
            ("flap_window", self.flap_window),
        ];
        for (field, value) in durations {
            if value.is_zero() {
                return Err(ConfigError::Zero { field });
            }
        }
        for (field, value) in [
            ("heartbeat_misses", self.heartbeat_misses),
            ("oob_max_retries", self.oob_max_retries),
            ("good_probes", self.good_probes),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroCount { field });
            }
        }
        let order = |smaller: &'static str, s: Duration, larger: &'static str, l: Duration, strict: bool| {
            if s > l || (strict && s == l) {
                Err(ConfigError::Order { smaller, smaller_value: s, larger, larger_value: l })
            } else {
                Ok(())
            }
        };
        order("probe_timeout", self.probe_timeout, "localize_timeout", self.localize_timeout, true)?;
        order("probe_timeout", self.probe_timeout, "probe_interval", self.probe_interval, true)?;
        order("localize_timeout", self.localize_timeout, "holddown_base", self.holddown_base, true)?;
        order("holddown_base", self.holddown_base, "holddown_max", self.holddown_max, false)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_hold_down_doubles_to_the_cap() {
        let c = DetectConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.suspicion_threshold(), Duration::from_millis(30));
        assert_eq!(c.heartbeat_timeout(), Duration::from_millis(100));
        assert_eq!(c.holddown(0), Duration::from_millis(200));
        assert_eq!(c.holddown(3), Duration::from_millis(1600));
        assert_eq!(c.holddown(5), Duration::from_secs(5));
        assert_eq!(c.holddown(200), Duration::from_secs(5));
    }

    #[test]
    fn invalid_configs_are_refused_with_the_field_named() {
        let c = DetectConfig { probe_timeout: Duration::ZERO, ..DetectConfig::default() };
        assert_eq!(c.validate(), Err(ConfigError::Zero { field: "probe_timeout" }));
        let c = DetectConfig { good_probes: 0, ..DetectConfig::default() };
        assert_eq!(c.validate(), Err(ConfigError::ZeroCount { field: "good_probes" }));
        let c = DetectConfig { holddown_max: Duration::from_millis(100), ..DetectConfig::default() };
        assert!(matches!(c.validate(), Err(ConfigError::Order { smaller: "holddown_base", .. })));
        let c = DetectConfig { localize_timeout: Duration::from_millis(5), ..DetectConfig::default() };
        let err = c.validate().unwrap_err();
        assert!(err.to_string().contains("probe_timeout"), "{err}");
    }
}
