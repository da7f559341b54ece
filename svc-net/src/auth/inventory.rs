//! The updater's status and the next window in heartbeats and inventory rows, between the
//! svc-core types and the protocol's messages. Both are optional on the wire: older agents do
//! not send them.

use svc_core::auth::{NextWindow, UpdateStatus};

use super::proto;

fn unix(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn secs(unix: i64) -> u64 {
    u64::try_from(unix).unwrap_or(0)
}

pub(super) fn status_to_proto(status: &UpdateStatus) -> proto::UpdateStatus {
    proto::UpdateStatus {
        result: status.result.as_str().to_owned(),
        from: status.from.clone(),
        to: status.to.clone(),
        reason: status.reason.clone(),
        at_unix: unix(status.at),
    }
}

/// The status in `status`; `None` (logged) when its result is not one this version knows, so
/// that a newer agent's heartbeat is still accepted.
pub(super) fn status_from_proto(status: proto::UpdateStatus) -> Option<UpdateStatus> {
    match status.result.parse() {
        Ok(result) => Some(UpdateStatus {
            result,
            from: status.from,
            to: status.to,
            reason: status.reason,
            at: secs(status.at_unix),
        }),
        Err(e) => {
            tracing::warn!(error = %e, "ignoring an update status with an unknown result");
            None
        }
    }
}

pub(super) fn window_to_proto(window: &NextWindow) -> proto::NextWindow {
    proto::NextWindow {
        start_unix: unix(window.start),
        end_unix: unix(window.end),
    }
}

pub(super) fn window_from_proto(window: proto::NextWindow) -> NextWindow {
    NextWindow {
        start: secs(window.start_unix),
        end: secs(window.end_unix),
    }
}

#[cfg(test)]
mod tests {
    use svc_core::auth::UpdateResult;

    use super::*;

    #[test]
    fn statuses_and_windows_round_trip_and_unknown_results_are_dropped() {
        let status = UpdateStatus {
            result: UpdateResult::RolledBack,
            from: "1.3.0".into(),
            to: "1.2.3".into(),
            reason: "no heartbeat with 1.3.0 within 120s".into(),
            at: 1_764_000_000,
        };
        assert_eq!(status_from_proto(status_to_proto(&status)), Some(status));
        let window = NextWindow { start: 10, end: 20 };
        assert_eq!(window_from_proto(window_to_proto(&window)), window);
        let odd = proto::UpdateStatus {
            result: "exploded".into(),
            ..Default::default()
        };
        assert_eq!(status_from_proto(odd), None);
    }
}
