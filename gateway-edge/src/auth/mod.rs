//! Who may connect and what they may call: the `connect` params and their
//! checks (`handshake`), the shared secret and its failure limiter
//! (`secret`), device identity and the tokens issued to devices (`device`,
//! `identity`), roles and scopes (`scopes`) and OpenClaw's method registry
//! (`registry`). Pure decisions over the
//! config and the params: the state that holds an [`secret::Authenticator`]
//! sits above.

pub mod device;
pub mod handshake;
pub mod identity;
pub mod registry;
pub mod scopes;
pub mod secret;
