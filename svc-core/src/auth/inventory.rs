//! What an agent tells the inventory about its updater: the updater's last decision
//! ([`UpdateStatus`]) and the next maintenance window the agent exported ([`NextWindow`]).
//!
//! Both travel in the heartbeat and are stored in the agent's inventory row as they came (the
//! reason shortened to [`MAX_REASON_LEN`] characters); `tctl inventory ls` prints them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest reason kept in the inventory (in characters); longer ones are cut.
pub const MAX_REASON_LEN: usize = 1024;

/// What the updater did on its last run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateResult {
    /// Nothing was installed (outside the window, already current, just enrolled).
    None,
    /// A new version was installed and proven healthy.
    Updated,
    /// A new version was installed, was not healthy in time, and the previous one was
    /// reinstalled.
    RolledBack,
    /// The updater could not install (or could not roll back).
    Failed,
}

impl UpdateResult {
    /// Every result, in declaration order.
    pub const ALL: [UpdateResult; 4] = [
        UpdateResult::None,
        UpdateResult::Updated,
        UpdateResult::RolledBack,
        UpdateResult::Failed,
    ];

    /// The name in the updater's status and on the wire: `none`, `updated`, `rolled_back`,
    /// `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateResult::None => "none",
            UpdateResult::Updated => "updated",
            UpdateResult::RolledBack => "rolled_back",
            UpdateResult::Failed => "failed",
        }
    }
}

impl fmt::Display for UpdateResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `result` that is not one of [`UpdateResult::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown update result {0:?}, expected none, updated, rolled_back or failed")]
pub struct UnknownUpdateResult(pub String);

impl FromStr for UpdateResult {
    type Err = UnknownUpdateResult;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UpdateResult::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownUpdateResult(s.to_owned()))
    }
}

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
    fn results_round_trip_by_name() {
        for r in UpdateResult::ALL {
            assert_eq!(r.as_str().parse::<UpdateResult>(), Ok(r));
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{}\"", r.as_str()));
        }
        let err = "exploded".parse::<UpdateResult>().unwrap_err();
        assert!(err.to_string().contains("\"exploded\""), "{err}");
    }

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
