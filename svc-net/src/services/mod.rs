//! Resource access from the client side.

pub mod client;

pub(crate) use crate::agent::services::{MAX_LINE, RESOURCE_OK, ResourceRequest};
