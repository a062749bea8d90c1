//! The top layer: the HTTP listener and its routes (`server`), the caps
//! and timeouts of sockets before the upgrade (`admission`), a socket's
//! life (`connect`: the challenge and the handshake; `socket`: the serving
//! loop; `wire`: framed writes; `park`: an idle socket without the
//! WebSocket library's buffers), the pre-auth I/O guard, write coalescing,
//! client addresses and origins (`peer`), and the Control UI's files.

pub mod admission;
pub mod coalesce;
pub mod connect;
pub mod control_ui;
pub mod park;
pub mod peer;
pub mod preauth_io;
pub mod server;
pub mod socket;
pub mod wire;
