//! The wire contract, below everything else: request, response and event
//! frames, closed params with the protocol's messages, the JSON depth bound,
//! and transcript entries as the protocol's messages. Nothing here knows the
//! edge's state.

pub mod frames;
pub mod json_depth;
pub mod params;
pub mod transcript;
