//! Whether `svc-upgrade` installs now: a pure function of the installed version, the version
//! server's answer, the exported maintenance windows, the clock and the state file.
//!
//! Sits between reading ([`config`](super::config), [`state`](super::state), the version
//! server, the schedule file) and acting ([`runner`](super::runner) → [`pkg`](super::pkg)).
//! The rules, in order:
//!
//! 1. The channel advertises no version (`none`): nothing to do.
//! 2. Target equal to the installed version: `no upgrades available (<current> == <target>)`.
//! 3. Safety, whatever the mode: a target more than one major version away from the installed
//!    one is refused ([`Refusal::MajorJump`]). The channel is the authority on the version — the
//!    proxy already caps it at its own major (specification §9.5) — so an agent follows it one
//!    major at a time, the step the compatibility rule allows (§1 rule 4: at most one major
//!    behind), and never jumps from 15 to 17 on one misconfigured answer.
//! 4. A target below the installed version is refused unless forced ([`Refusal::Downgrade`]).
//! 5. `force`: install now.
//! 6. A target in the state's `bad_versions` (installed before, not healthy, rolled back) is not
//!    installed again ([`Decision::BadVersion`]) until a newer version is published or an
//!    operator runs `svc-upgrade force`, which clears the list.
//! 7. Critical: install now — unless an install already happened outside any window within the
//!    last [`WINDOW_LENGTH`] (proxies flipping between two critical versions).
//! 8. Inside a window: install — unless an install already happened in this very window: during
//!    a rolling upgrade proxies answer different versions, and one window gets one install.
//! 9. Outside every window, when the agent has been unhealthy for a sustained time
//!    ([`Inputs::agent_unhealthy`]): install now, at most once an hour as for critical updates —
//!    the specification's "an agent unhealthy for a sustained time may be updated outside the
//!    window".
//! 10. Otherwise: wait for a window.

use std::{fmt, time::SystemTime};

use svc_core::{
    Version,
    maintenance::{WINDOW_LENGTH, Window},
};

use super::state::{InstallRecord, UpgradeState};
use crate::target::Target;

/// What the user asked `svc-upgrade` for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// `run`: install when the rules say so.
    Run,
    /// `dry-run`: decide and report; install nothing, change nothing.
    DryRun,
    /// `force`: install the target now, outside windows and below the installed version.
    Force,
}

/// Why an install happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The version server marked the update critical.
    Critical,
    /// A maintenance window is open.
    Window(Window),
    /// `svc-upgrade force`.
    Forced,
    /// Outside every window, but the agent has been unhealthy for a sustained time.
    Unhealthy,
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The channel advertises no version.
    NoTarget {
        /// The installed version.
        current: Version,
    },
    /// Installed and advertised versions are equal.
    UpToDate {
        /// The installed (and advertised) version.
        current: Version,
    },
    /// Install `target` now.
    Install {
        /// The installed version.
        current: Version,
        /// The version to install.
        target: Version,
        /// Why now.
        reason: Reason,
    },
    /// Non-critical and no window is open.
    Wait {
        /// The installed version.
        current: Version,
        /// The advertised version.
        target: Version,
    },
    /// The target was installed before, did not prove healthy and was rolled back.
    BadVersion {
        /// The installed version.
        current: Version,
        /// The advertised (bad) version.
        target: Version,
    },
    /// An install already happened in this window (or, for critical updates, within the hour).
    AlreadyUpgraded {
        /// The installed version.
        current: Version,
        /// The advertised version.
        target: Version,
        /// The install that already happened.
        last: InstallRecord,
    },
}

/// A target `svc-upgrade` will not install.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// More than one major version between the installed version and the target.
    #[error(
        "refusing to move from {current} to {target}: expected a target at most one major version \
         away from the installed one (major {} to {}); update one major version at a time",
        current.major(), target.major()
    )]
    MajorJump {
        /// The installed version.
        current: Version,
        /// The advertised version.
        target: Version,
    },
    /// A target below the installed version without `force`.
    #[error(
        "refusing to downgrade from {current} to {target}: the version server advertises an older \
         version; run `svc-upgrade force` to install it anyway"
    )]
    Downgrade {
        /// The installed version.
        current: Version,
        /// The advertised version.
        target: Version,
    },
}

/// What [`decide`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The installed version.
    pub current: &'a Version,
    /// The version server's answer.
    pub target: &'a Target,
    /// The windows from the schedule file (empty when there is none).
    pub windows: &'a [Window],
    /// Now.
    pub now: SystemTime,
    /// The command.
    pub mode: Mode,
    /// The state file.
    pub state: &'a UpgradeState,
    /// Whether the agent has been unhealthy for longer than `unhealthy-after` (its last accepted
    /// heartbeat older than that, and `/readyz` not answering 200).
    pub agent_unhealthy: bool,
}

/// Applies the rules of this module (see its documentation).
pub fn decide(inputs: Inputs<'_>) -> Result<Decision, Refusal> {
    let current = inputs.current.clone();
    let Some(target) = inputs.target.version.clone() else {
        return Ok(Decision::NoTarget { current });
    };
    if target == current {
        return Ok(Decision::UpToDate { current });
    }
    if target.major().abs_diff(current.major()) > 1 {
        return Err(Refusal::MajorJump { current, target });
    }
    if target < current && inputs.mode != Mode::Force {
        return Err(Refusal::Downgrade { current, target });
    }
    let last = inputs.state.last_install.as_ref();
    if inputs.mode == Mode::Force {
        return Ok(Decision::Install {
            current,
            target,
            reason: Reason::Forced,
        });
    }
    if inputs.state.bad_versions.contains(&target) {
        return Ok(Decision::BadVersion { current, target });
    }
    let out_of_window = |reason: Reason| match last {
        Some(last) if last.window.is_none() && last.age(inputs.now) < WINDOW_LENGTH => {
            Decision::AlreadyUpgraded {
                current: current.clone(),
                target: target.clone(),
                last: last.clone(),
            }
        }
        _ => Decision::Install {
            current: current.clone(),
            target: target.clone(),
            reason,
        },
    };
    if inputs.target.critical {
        return Ok(out_of_window(Reason::Critical));
    }
    match inputs.windows.iter().find(|w| w.contains(inputs.now)) {
        Some(window) => Ok(match last {
            Some(last) if last.in_window(window) => Decision::AlreadyUpgraded {
                current,
                target,
                last: last.clone(),
            },
            _ => Decision::Install {
                current,
                target,
                reason: Reason::Window(*window),
            },
        }),
        None if inputs.agent_unhealthy => Ok(out_of_window(Reason::Unhealthy)),
        None => Ok(Decision::Wait { current, target }),
    }
}

impl Decision {
    /// The lines `svc-upgrade` prints for this decision, in order.
    pub fn messages(&self) -> Vec<String> {
        let available =
            |current: &Version, target: &Version| format!("an upgrade is available ({current} -> {target})");
        match self {
            Decision::NoTarget { current } => vec![format!(
                "the version server advertises no version (none); staying at {current}"
            )],
            Decision::UpToDate { current } => {
                vec![format!("no upgrades available ({current} == {current})")]
            }
            Decision::Install {
                current,
                target,
                reason,
            } => vec![
                available(current, target),
                match reason {
                    Reason::Critical => {
                        "upgrade is critical, upgrade will be attempted outside of maintenance window"
                            .to_owned()
                    }
                    Reason::Window(_) => "within maintenance window, upgrade will be attempted".to_owned(),
                    Reason::Forced => "forced upgrade, upgrade will be attempted".to_owned(),
                    Reason::Unhealthy => {
                        "the agent has been unhealthy for a sustained time, upgrade will be \
                                          attempted outside of maintenance window"
                            .to_owned()
                    }
                },
            ],
            Decision::BadVersion { current, target } => vec![
                available(current, target),
                format!(
                    "not installing {target}: it was installed before, did not prove healthy and was rolled \
                     back; waiting for a newer version (run `svc-upgrade force` to clear the list of bad \
                     versions and install it anyway)"
                ),
            ],
            Decision::Wait { current, target } => vec![
                available(current, target),
                "upgrade is non-critical and we are outside of maintenance window, not attempting".to_owned(),
            ],
            Decision::AlreadyUpgraded {
                current,
                target,
                last,
            } => vec![
                available(current, target),
                if last.window.is_some() {
                    format!(
                        "already upgraded to {} in this maintenance window, not attempting another \
                         upgrade until the next window",
                        last.version
                    )
                } else {
                    format!(
                        "already applied an upgrade outside of a maintenance window ({}) within the last \
                         hour, not attempting another one yet",
                        last.version
                    )
                },
            ],
        }
    }

    /// The version to install, when the decision is to install.
    pub fn install_target(&self) -> Option<(&Version, Reason)> {
        match self {
            Decision::Install { target, reason, .. } => Some((target, *reason)),
            _ => None,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Run => "run",
            Mode::DryRun => "dry-run",
            Mode::Force => "force",
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    const NOW: u64 = 1_700_000_000;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(NOW)
    }

    fn around_now() -> Window {
        Window {
            start: now() - Duration::from_secs(600),
            end: now() + Duration::from_secs(3000),
        }
    }

    fn far_away() -> Window {
        Window {
            start: now() + Duration::from_secs(86_400),
            end: now() + Duration::from_secs(86_400 + 3600),
        }
    }

    fn decide_with(
        current: &str,
        target: Option<&str>,
        critical: bool,
        windows: &[Window],
        mode: Mode,
        state: &UpgradeState,
    ) -> Result<Decision, Refusal> {
        decide(Inputs {
            current: &v(current),
            target: &Target {
                version: target.map(v),
                critical,
            },
            windows,
            now: now(),
            mode,
            state,
            agent_unhealthy: false,
        })
    }

    #[test]
    fn equal_none_and_the_messages() {
        let none = UpgradeState::default();
        let d = decide_with("17.0.0", Some("v17.0.0"), true, &[], Mode::Run, &none).unwrap();
        assert_eq!(d.messages(), ["no upgrades available (v17.0.0 == v17.0.0)"]);
        let d = decide_with("17.0.0", None, true, &[around_now()], Mode::Run, &none).unwrap();
        assert!(matches!(d, Decision::NoTarget { .. }));
        assert_eq!(d.install_target(), None);
    }

    #[test]
    fn window_critical_and_waiting() {
        let none = UpgradeState::default();
        let d = decide_with(
            "17.0.0-dev",
            Some("17.0.0"),
            false,
            &[far_away(), around_now()],
            Mode::Run,
            &none,
        )
        .unwrap();
        assert_eq!(
            d.messages(),
            [
                "an upgrade is available (v17.0.0-dev -> v17.0.0)",
                "within maintenance window, upgrade will be attempted"
            ]
        );
        assert_eq!(
            d.install_target(),
            Some((&v("17.0.0"), Reason::Window(around_now())))
        );

        let d = decide_with(
            "17.0.0-dev",
            Some("17.0.0"),
            false,
            &[far_away()],
            Mode::Run,
            &none,
        )
        .unwrap();
        assert_eq!(
            d.messages(),
            [
                "an upgrade is available (v17.0.0-dev -> v17.0.0)",
                "upgrade is non-critical and we are outside of maintenance window, not attempting"
            ]
        );
        // No schedule at all is the same as being outside every window.
        let d = decide_with("17.0.0-dev", Some("17.0.0"), false, &[], Mode::DryRun, &none).unwrap();
        assert!(matches!(d, Decision::Wait { .. }));

        let d = decide_with("17.0.0", Some("17.0.1"), true, &[far_away()], Mode::Run, &none).unwrap();
        assert_eq!(d.install_target(), Some((&v("17.0.1"), Reason::Critical)));
        let d = decide_with("17.0.0", Some("17.0.1"), false, &[], Mode::Force, &none).unwrap();
        assert_eq!(d.install_target(), Some((&v("17.0.1"), Reason::Forced)));
    }

    #[test]
    fn a_window_boundary_is_outside() {
        let none = UpgradeState::default();
        let starting_now = Window {
            start: now(),
            end: now() + Duration::from_secs(3600),
        };
        let d = decide_with("17.0.0", Some("17.0.1"), false, &[starting_now], Mode::Run, &none).unwrap();
        assert!(matches!(d, Decision::Wait { .. }));
    }

    #[test]
    fn major_jumps_are_refused_even_when_forced() {
        let none = UpgradeState::default();
        for (current, target) in [("15.4.0", "17.0.0"), ("17.0.0", "15.9.9"), ("17.0.0", "v19.0.0")] {
            for mode in [Mode::Run, Mode::Force, Mode::DryRun] {
                let err = decide_with(current, Some(target), true, &[around_now()], mode, &none).unwrap_err();
                assert!(
                    matches!(err, Refusal::MajorJump { .. }),
                    "{current} -> {target} {mode}"
                );
            }
        }
        let err = decide_with("15.4.0", Some("17.0.0"), false, &[], Mode::Run, &none).unwrap_err();
        assert_eq!(
            err.to_string(),
            "refusing to move from v15.4.0 to v17.0.0: expected a target at most one major version away \
             from the installed one (major 15 to 17); update one major version at a time"
        );
        // One major ahead is the normal cluster upgrade.
        let d = decide_with("16.4.0", Some("17.0.0"), false, &[around_now()], Mode::Run, &none).unwrap();
        assert!(d.install_target().is_some());
    }

    #[test]
    fn downgrades_only_when_forced() {
        let none = UpgradeState::default();
        let err = decide_with("17.0.1", Some("17.0.0"), true, &[around_now()], Mode::Run, &none).unwrap_err();
        assert_eq!(
            err.to_string(),
            "refusing to downgrade from v17.0.1 to v17.0.0: the version server advertises an older version; \
             run `svc-upgrade force` to install it anyway"
        );
        let d = decide_with("17.0.1", Some("17.0.0"), false, &[], Mode::Force, &none).unwrap();
        assert_eq!(d.install_target(), Some((&v("17.0.0"), Reason::Forced)));
    }

    #[test]
    fn one_install_per_window_when_proxies_flip() {
        let window = around_now();
        let state = UpgradeState {
            last_install: Some(InstallRecord::new(
                v("17.0.0"),
                now() - Duration::from_secs(300),
                Some(window),
            )),
            in_progress: None,
            bad_versions: Vec::new(),
        };
        // The other proxy answers 17.0.1 in the same window: no second install.
        let d = decide_with("17.0.0", Some("17.0.1"), false, &[window], Mode::Run, &state).unwrap();
        assert!(matches!(d, Decision::AlreadyUpgraded { .. }), "{d:?}");
        assert!(
            d.messages()[1].starts_with("already upgraded to v17.0.0 in this maintenance window"),
            "{:?}",
            d.messages()
        );
        // Next window: allowed.
        let next = Window {
            start: window.start + Duration::from_secs(86_400),
            end: window.end + Duration::from_secs(86_400),
        };
        let later = decide(Inputs {
            current: &v("17.0.0"),
            target: &Target {
                version: Some(v("17.0.1")),
                critical: false,
            },
            windows: &[next],
            now: now() + Duration::from_secs(86_400),
            mode: Mode::Run,
            state: &state,
            agent_unhealthy: false,
        })
        .unwrap();
        assert!(later.install_target().is_some());
        // A critical update is not held back by a window install...
        let d = decide_with("17.0.0", Some("17.0.1"), true, &[], Mode::Run, &state).unwrap();
        assert_eq!(d.install_target(), Some((&v("17.0.1"), Reason::Critical)));
        // ...but two critical installs within the hour are one too many.
        let critical = UpgradeState {
            last_install: Some(InstallRecord::new(
                v("17.0.1"),
                now() - Duration::from_secs(60),
                None,
            )),
            in_progress: None,
            bad_versions: Vec::new(),
        };
        let d = decide_with("17.0.1", Some("17.0.2"), true, &[], Mode::Run, &critical).unwrap();
        assert!(matches!(d, Decision::AlreadyUpgraded { .. }));
        let d = decide_with("17.0.1", Some("17.0.2"), true, &[], Mode::Force, &critical).unwrap();
        assert_eq!(d.install_target(), Some((&v("17.0.2"), Reason::Forced)));
    }

    #[test]
    fn bad_versions_are_not_installed_again_until_newer_or_forced() {
        let state = UpgradeState {
            bad_versions: vec![v("17.0.2")],
            ..UpgradeState::default()
        };
        for critical in [false, true] {
            let d = decide_with(
                "17.0.1",
                Some("17.0.2"),
                critical,
                &[around_now()],
                Mode::Run,
                &state,
            )
            .unwrap();
            assert!(matches!(d, Decision::BadVersion { .. }), "{d:?}");
            assert_eq!(d.install_target(), None);
            assert_eq!(
                d.messages(),
                [
                    "an upgrade is available (v17.0.1 -> v17.0.2)",
                    "not installing v17.0.2: it was installed before, did not prove healthy and was rolled back; \
                     waiting for a newer version (run `svc-upgrade force` to clear the list of bad versions and \
                     install it anyway)"
                ]
            );
        }
        // A dry run says the same.
        let d = decide_with(
            "17.0.1",
            Some("17.0.2"),
            false,
            &[around_now()],
            Mode::DryRun,
            &state,
        )
        .unwrap();
        assert!(matches!(d, Decision::BadVersion { .. }));
        // A newer version is installed as usual.
        let d = decide_with(
            "17.0.1",
            Some("17.0.3"),
            false,
            &[around_now()],
            Mode::Run,
            &state,
        )
        .unwrap();
        assert!(
            matches!(d.install_target(), Some((_, Reason::Window(_)))),
            "{d:?}"
        );
        // force installs it (the runner clears the list first).
        let d = decide_with("17.0.1", Some("17.0.2"), false, &[], Mode::Force, &state).unwrap();
        assert_eq!(d.install_target(), Some((&v("17.0.2"), Reason::Forced)));
    }

    #[test]
    fn an_unhealthy_agent_is_updated_outside_the_window_once_an_hour() {
        let unhealthy = |state: &UpgradeState, windows: &[Window], critical: bool, current: &str| {
            decide(Inputs {
                current: &v(current),
                target: &Target {
                    version: Some(v("17.0.2")),
                    critical,
                },
                windows,
                now: now(),
                mode: Mode::Run,
                state,
                agent_unhealthy: true,
            })
        };
        let none = UpgradeState::default();
        let d = unhealthy(&none, &[far_away()], false, "17.0.1").unwrap();
        assert_eq!(d.install_target(), Some((&v("17.0.2"), Reason::Unhealthy)));
        assert_eq!(
            d.messages()[1],
            "the agent has been unhealthy for a sustained time, upgrade will be attempted outside of maintenance window"
        );
        // Inside a window it is the window's install; critical stays critical.
        let d = unhealthy(&none, &[around_now()], false, "17.0.1").unwrap();
        assert!(matches!(d.install_target(), Some((_, Reason::Window(_)))));
        let d = unhealthy(&none, &[], true, "17.0.1").unwrap();
        assert_eq!(d.install_target(), Some((&v("17.0.2"), Reason::Critical)));
        // One out-of-window install an hour.
        let recent = UpgradeState {
            last_install: Some(InstallRecord::new(
                v("17.0.1"),
                now() - Duration::from_secs(600),
                None,
            )),
            ..UpgradeState::default()
        };
        let d = unhealthy(&recent, &[], false, "17.0.1").unwrap();
        assert!(matches!(d, Decision::AlreadyUpgraded { .. }), "{d:?}");
        assert!(
            d.messages()[1]
                .starts_with("already applied an upgrade outside of a maintenance window (v17.0.1)"),
            "{:?}",
            d.messages()
        );
        // A bad version stays bad, unhealthy agent or not; downgrades stay refused.
        let bad = UpgradeState {
            bad_versions: vec![v("17.0.2")],
            ..UpgradeState::default()
        };
        assert!(matches!(
            unhealthy(&bad, &[], false, "17.0.1").unwrap(),
            Decision::BadVersion { .. }
        ));
        assert!(matches!(
            unhealthy(&none, &[], false, "17.0.3"),
            Err(Refusal::Downgrade { .. })
        ));
        // A healthy agent outside the window waits.
        let d = decide_with("17.0.1", Some("17.0.2"), false, &[far_away()], Mode::Run, &none).unwrap();
        assert!(matches!(d, Decision::Wait { .. }));
    }
}
