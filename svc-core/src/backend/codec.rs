//! The stored form of an item's expiry and value, shared by the persistent backends (the
//! embedded database puts the revision in front; etcd keeps it as the key's own revision):
//! `[has_expiry u8]`, then — if the item expires — `[seconds since epoch u64 BE][nanoseconds
//! u32 BE]`, then the value bytes. Both formats start with a version byte, [`FORMAT_V1`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{BackendError, Item, Key};

/// The version byte both stored formats start with.
pub(crate) const FORMAT_V1: u8 = 1;

/// A stored value this version cannot read.
#[derive(Debug, thiserror::Error)]
#[error("stored value of key {key} is malformed: {reason}")]
pub(crate) struct MalformedValue {
    pub(crate) key: Key,
    pub(crate) reason: &'static str,
}

/// The storage error for `key`'s malformed value.
pub(crate) fn malformed(key: &Key, reason: &'static str) -> BackendError {
    BackendError::storage(
        "decoding a stored item",
        MalformedValue {
            key: key.clone(),
            reason,
        },
    )
}

/// Appends `item`'s expiry and value.
pub(crate) fn put_expiry_and_value(out: &mut Vec<u8>, item: &Item) {
    match item
        .expires
        .map(|at| at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO))
    {
        Some(since_epoch) => {
            out.push(1);
            out.extend_from_slice(&since_epoch.as_secs().to_be_bytes());
            out.extend_from_slice(&since_epoch.subsec_nanos().to_be_bytes());
        }
        None => out.push(0),
    }
    out.extend_from_slice(&item.value);
}

/// Reads what [`put_expiry_and_value`] wrote: the expiry and the value bytes, or why `rest` is
/// not that.
pub(crate) fn take_expiry_and_value(rest: &[u8]) -> Result<(Option<SystemTime>, &[u8]), &'static str> {
    let (&has_expiry, rest) = rest.split_first().ok_or("truncated expiry flag")?;
    match has_expiry {
        0 => Ok((None, rest)),
        1 => {
            let (secs, rest) = rest.split_first_chunk::<8>().ok_or("truncated expiry")?;
            let (nanos, rest) = rest.split_first_chunk::<4>().ok_or("truncated expiry")?;
            let since_epoch = Duration::new(u64::from_be_bytes(*secs), u32::from_be_bytes(*nanos));
            let at = UNIX_EPOCH.checked_add(since_epoch).ok_or("expiry out of range")?;
            Ok((Some(at), rest))
        }
        _ => Err("bad expiry flag"),
    }
}
