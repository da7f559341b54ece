//! What an agent tells the inventory about its updater: the updater's last decision
//! ([`UpdateStatus`]) and the next maintenance window the agent exported ([`NextWindow`]).
//!
//! Both travel in the heartbeat and are stored in the agent's inventory row as they came (the
//! reason shortened to [`MAX_REASON_LEN`] characters); `tctl inventory ls` prints them.

use serde::{Deserialize, Serialize};

/// The longest reason kept in the inventory (in characters); longer ones are cut.
pub const MAX_REASON_LEN: usize = 1024;

use crate::updater::UpdaterStatus;
pub use crate::updater::{UnknownUpdateResult, UpdateResult};

/// The updater's last decision, as the agent read it from the updater (the Linux `status` file,
/// the Kubernetes shared-state Secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateStatus {
    /// What happened.
    pub result: UpdateResult,
    /// The version before (for `rolled_back`: the bad version).
    #[serde(default)]
    pub from: String,
    /// The version after (for `rolled_back`: the version restored).
    #[serde(default)]
    pub to: String,
    /// Why (the decision message, the failed health check); may be empty.
    #[serde(default)]
    pub reason: String,
    /// When the updater decided (seconds since the Unix epoch).
    #[serde(default)]
    pub at: u64,
}

impl UpdateStatus {
    /// This status with its reason cut to [`MAX_REASON_LEN`] characters.
    pub fn bounded(mut self) -> Self {
        if let Some((cut, _)) = self.reason.char_indices().nth(MAX_REASON_LEN) {
            self.reason.truncate(cut);
        }
        self
    }
}

impl From<&UpdaterStatus> for UpdateStatus {
    /// The decision part of the updater's status, as the heartbeat reports it.
    fn from(status: &UpdaterStatus) -> Self {
        UpdateStatus {
            result: status.result,
            from: status.from.clone(),
            to: status.to.clone(),
            reason: status.reason.clone(),
            at: status.at,
        }
    }
}

/// The next maintenance window the agent exported for its updater (seconds since the Unix
/// epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextWindow {
    /// When the window opens.
    pub start: u64,
    /// When it closes.
    pub end: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_cut_on_a_character_boundary() {
        let status = UpdateStatus {
            result: UpdateResult::Failed,
            from: "1.2.3".into(),
            to: "1.3.0".into(),
            reason: "é".repeat(MAX_REASON_LEN + 10),
            at: 1,
        }
        .bounded();
        assert_eq!(status.reason.chars().count(), MAX_REASON_LEN);
    }
}
