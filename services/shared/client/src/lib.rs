//! The client side of the OpenClaw gateway protocol v4, over WebSocket, in
//! three layers a caller picks from:
//!
//! - [`frame`]: the frames themselves: a `req` frame, the `connect`
//!   params (who connects, with which role, scopes and secret), and a cheap
//!   read of a frame's envelope (type, id, event, ok) that builds nothing
//!   else;
//! - [`socket`]: opening the WebSocket (headers, a source address, buffer
//!   sizes), sending text, reading the next text frame before a deadline,
//!   and the handshake (`connect.challenge` → `connect` → `hello-ok`);
//! - [`Connection`]: an authenticated connection that sends requests and
//!   matches their responses by id, queueing the events that arrive
//!   meanwhile so that a reader of the event stream misses none.
//!
//! Failures are values ([`ClientError`]), never panics: the CLI turns them
//! into exit codes, the load generator into errors, the tests into panics
//! or retries.

pub mod connection;
pub mod error;
pub mod frame;
pub mod socket;

pub use connection::{Connection, Response};
pub use error::{ClientError, Close};
pub use frame::{ClientInfo, ConnectParams, Envelope};
pub use socket::{OpenOptions, WebSocket};
