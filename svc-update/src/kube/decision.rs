//! The update decision: a pure function of what the controller has gathered.
//!
//! Sits between the gathering half of a reconcile (workload image, target from the version
//! server, maintenance window from the Secret, pod health) and the acting half (patch the image
//! or leave the resource alone). No I/O and no clock here, so every rule has a unit test.

use std::fmt;

use svc_core::Version;

use super::target::Target;

/// What the controller should do with the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Set the agent container's image to this version, for this reason.
    Update(Version, UpdateReason),
    /// The workload already runs the target, or the channel advertises no version: log
    /// `no new version available` and leave the resource untouched.
    NoNewVersion,
    /// A new version exists but must not be installed now.
    Skip(SkipReason),
}

/// Why an update goes ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateReason {
    /// The version server marks the update critical: applied outside the window too (§1.7).
    Critical,
    /// A maintenance window from the shared-state Secret is open.
    InWindow,
    /// The agent's pods have been unhealthy for a sustained time; a new version may fix them.
    Unhealthy,
}

impl fmt::Display for UpdateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Critical => "critical update",
            Self::InWindow => "inside maintenance window",
            Self::Unhealthy => "agent pods unhealthy",
        })
    }
}

/// Why an available version is not installed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// The target's major differs from the channel's major: refused (§9.5).
    WrongMajor {
        /// The version the server offered.
        target: Version,
        /// The major version the channel is pinned to.
        channel_major: u64,
    },
    /// The target is older than the running version: refused, critical or not (as the Linux
    /// updater refuses an unforced downgrade). An operator who wants the older version sets
    /// the image themselves.
    Downgrade {
        /// The running version.
        current: Version,
        /// The version the server offered.
        target: Version,
    },
    /// The target is more than one major version away from the running one: refused (as the
    /// Linux updater refuses it), whatever the channel says.
    MajorJump {
        /// The running version.
        current: Version,
        /// The version the server offered.
        target: Version,
    },
    /// The target was installed before, its pods did not become ready in time and it was
    /// rolled back: not tried again until a newer version is published or an operator clears
    /// the list (`svc.dev/clear-bad-versions: "true"`).
    MarkedBad {
        /// The version the server offered.
        target: Version,
    },
    /// Non-critical, no open window, agent healthy: wait for the next window.
    OutsideWindow {
        /// The version that will be installed in the next window.
        target: Version,
    },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WrongMajor {
                target,
                channel_major,
            } => write!(
                f,
                "refusing {target}: expected major version {channel_major} as the channel serves, got {}",
                target.major()
            ),
            Self::Downgrade { current, target } => write!(
                f,
                "refusing to downgrade from {current} to {target}: the version server advertises an older version; set the image yourself to install it"
            ),
            Self::MajorJump { current, target } => write!(
                f,
                "refusing to move from {current} to {target}: expected a target at most one major version away from the running one (major {} to {}); update one major version at a time",
                current.major(),
                target.major()
            ),
            Self::MarkedBad { target } => write!(
                f,
                "not installing {target} again: it was rolled back after its pods did not become ready; waiting for a newer version (or the annotation svc.dev/clear-bad-versions: \"true\")"
            ),
            Self::OutsideWindow { target } => write!(
                f,
                "update to {target} is non-critical and we are outside of maintenance window, not attempting"
            ),
        }
    }
}

/// Everything the decision depends on.
#[derive(Debug, Clone, Copy)]
pub struct DecisionInput<'a> {
    /// The version in the agent container's image tag; `None` when the tag is not a version
    /// (`latest`, a digest), which then always differs from the target.
    pub current: Option<&'a Version>,
    /// What the version server answered.
    pub target: &'a Target,
    /// The major version the channel is pinned to, when known.
    pub channel_major: Option<u64>,
    /// Whether a maintenance window from the shared-state Secret is open now.
    pub window_open: bool,
    /// Whether the agent's pods have been unhealthy for a sustained time.
    pub pods_unhealthy: bool,
    /// Versions rolled back earlier and not to be installed again.
    pub bad_versions: &'a [Version],
}

/// Decides what to do with the workload.
///
/// Order: no advertised version or an equal version → [`Decision::NoNewVersion`]; a target of
/// another major than the channel's → refused; a target older than the running version, or
/// more than one major away from it → refused, critical or not (the Linux updater's rules); a
/// version marked bad → refused, critical or not; then critical, open window, unhealthy pods → update; else skip until the next window. When
/// the running version is unknown (`latest`, a digest) the target is an update.
pub fn decide(input: DecisionInput<'_>) -> Decision {
    let Some(target) = input.target.version.as_ref() else {
        return Decision::NoNewVersion;
    };
    if input.current == Some(target) {
        return Decision::NoNewVersion;
    }
    if let Some(channel_major) = input.channel_major
        && target.major() != channel_major
    {
        return Decision::Skip(SkipReason::WrongMajor {
            target: target.clone(),
            channel_major,
        });
    }
    if let Some(current) = input.current {
        if target.major().abs_diff(current.major()) > 1 {
            return Decision::Skip(SkipReason::MajorJump {
                current: current.clone(),
                target: target.clone(),
            });
        }
        if target < current {
            return Decision::Skip(SkipReason::Downgrade {
                current: current.clone(),
                target: target.clone(),
            });
        }
    }
    if input.bad_versions.contains(target) {
        return Decision::Skip(SkipReason::MarkedBad {
            target: target.clone(),
        });
    }
    let reason = if input.target.critical {
        UpdateReason::Critical
    } else if input.window_open {
        UpdateReason::InWindow
    } else if input.pods_unhealthy {
        UpdateReason::Unhealthy
    } else {
        return Decision::Skip(SkipReason::OutsideWindow {
            target: target.clone(),
        });
    };
    Decision::Update(target.clone(), reason)
}

/// The major version a channel name pins, if it names one: `stable/v17` or `v17` → 17.
///
/// Channels such as `stable/cloud` or `default` follow the cluster and pin nothing.
pub fn channel_major(channel: &str) -> Option<u64> {
    let last = channel.rsplit('/').next()?;
    last.strip_prefix('v')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn target(version: Option<&str>, critical: bool) -> Target {
        Target {
            version: version.map(v),
            critical,
        }
    }

    fn run(current: Option<&str>, t: &Target, major: Option<u64>, window: bool, unhealthy: bool) -> Decision {
        let current = current.map(v);
        decide(DecisionInput {
            current: current.as_ref(),
            target: t,
            channel_major: major,
            window_open: window,
            pods_unhealthy: unhealthy,
            bad_versions: &[],
        })
    }

    #[test]
    fn equal_version_is_no_new_version_whatever_else_holds() {
        let t = target(Some("v17.1.0"), true);
        assert_eq!(
            run(Some("17.1.0"), &t, Some(17), true, true),
            Decision::NoNewVersion
        );
    }

    #[test]
    fn no_advertised_version_is_no_new_version() {
        let t = target(None, true);
        assert_eq!(run(Some("17.1.0"), &t, None, true, true), Decision::NoNewVersion);
    }

    #[test]
    fn critical_updates_outside_the_window() {
        let t = target(Some("v17.2.0"), true);
        assert_eq!(
            run(Some("17.1.0"), &t, None, false, false),
            Decision::Update(v("17.2.0"), UpdateReason::Critical)
        );
    }

    #[test]
    fn non_critical_waits_for_the_window() {
        let t = target(Some("v17.2.0"), false);
        let skip = run(Some("17.1.0"), &t, None, false, false);
        assert_eq!(
            skip,
            Decision::Skip(SkipReason::OutsideWindow { target: v("17.2.0") })
        );
        let Decision::Skip(reason) = skip else {
            unreachable!()
        };
        assert_eq!(
            reason.to_string(),
            "update to v17.2.0 is non-critical and we are outside of maintenance window, not attempting"
        );
        assert_eq!(
            run(Some("17.1.0"), &t, None, true, false),
            Decision::Update(v("17.2.0"), UpdateReason::InWindow)
        );
    }

    #[test]
    fn unhealthy_pods_update_outside_the_window() {
        let t = target(Some("v17.2.0"), false);
        assert_eq!(
            run(Some("17.1.0"), &t, None, false, true),
            Decision::Update(v("17.2.0"), UpdateReason::Unhealthy)
        );
    }

    #[test]
    fn other_major_than_the_channel_is_refused_even_when_critical() {
        let t = target(Some("v18.0.0"), true);
        let d = run(Some("17.1.0"), &t, Some(17), true, true);
        assert_eq!(
            d,
            Decision::Skip(SkipReason::WrongMajor {
                target: v("18.0.0"),
                channel_major: 17
            })
        );
        let Decision::Skip(reason) = d else { unreachable!() };
        assert_eq!(
            reason.to_string(),
            "refusing v18.0.0: expected major version 17 as the channel serves, got 18"
        );
    }

    #[test]
    fn downgrades_and_major_jumps_are_refused_even_when_critical() {
        let t = target(Some("v17.0.5"), true);
        let d = run(Some("17.1.0"), &t, None, true, true);
        let Decision::Skip(reason) = d else {
            panic!("a downgrade was not refused: {d:?}")
        };
        assert_eq!(
            reason.to_string(),
            "refusing to downgrade from v17.1.0 to v17.0.5: the version server advertises an older version; set the image yourself to install it"
        );
        let t = target(Some("v19.0.0"), true);
        let d = run(Some("17.1.0"), &t, None, true, true);
        let Decision::Skip(reason) = d else {
            panic!("a major jump was not refused: {d:?}")
        };
        assert_eq!(
            reason.to_string(),
            "refusing to move from v17.1.0 to v19.0.0: expected a target at most one major version away from the running one (major 17 to 19); update one major version at a time"
        );
        // A major older than the running one is a downgrade, too.
        let t = target(Some("v16.4.0"), true);
        assert!(matches!(
            run(Some("17.1.0"), &t, None, true, true),
            Decision::Skip(SkipReason::Downgrade { .. })
        ));
        // One major ahead is the normal cluster upgrade.
        let t = target(Some("v18.0.0"), true);
        assert_eq!(
            run(Some("17.1.0"), &t, None, false, false),
            Decision::Update(v("18.0.0"), UpdateReason::Critical)
        );
    }

    #[test]
    fn versions_marked_bad_are_not_retried_but_newer_ones_are() {
        let bad = [v("17.1.0")];
        let input = |t: &'static str| {
            let target = target(Some(t), true);
            let current = v("17.0.0");
            decide(DecisionInput {
                current: Some(&current),
                target: &target,
                channel_major: None,
                window_open: true,
                pods_unhealthy: false,
                bad_versions: &bad,
            })
        };
        let d = input("v17.1.0");
        assert_eq!(d, Decision::Skip(SkipReason::MarkedBad { target: v("17.1.0") }));
        let Decision::Skip(reason) = d else { unreachable!() };
        assert!(
            reason.to_string().starts_with("not installing v17.1.0 again"),
            "{reason}"
        );
        assert_eq!(
            input("v17.1.1"),
            Decision::Update(v("17.1.1"), UpdateReason::Critical)
        );
        // A downgrade is refused as a downgrade, bad or not.
        assert!(matches!(
            input("v16.9.0"),
            Decision::Skip(SkipReason::Downgrade { .. })
        ));
    }

    #[test]
    fn unknown_current_is_an_update() {
        let t = target(Some("v17.0.5"), true);
        assert_eq!(
            run(None, &t, None, false, false),
            Decision::Update(v("17.0.5"), UpdateReason::Critical)
        );
    }

    #[test]
    fn pre_release_differs_from_release() {
        let t = target(Some("v17.0.0"), true);
        assert!(matches!(
            run(Some("17.0.0-dev"), &t, None, false, false),
            Decision::Update(..)
        ));
    }

    #[test]
    fn channel_names_pin_majors_only_when_they_say_so() {
        assert_eq!(channel_major("stable/v17"), Some(17));
        assert_eq!(channel_major("v15"), Some(15));
        assert_eq!(channel_major("stable/cloud"), None);
        assert_eq!(channel_major("default"), None);
        assert_eq!(channel_major("stable/vx"), None);
        assert_eq!(channel_major(""), None);
    }
}
