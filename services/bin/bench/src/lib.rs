//! Load scenarios against an OpenClaw-protocol gateway, with latency
//! percentiles and rates, and the floor each figure is to be read against.
//!
//! # Scenarios
//!
//! The looping scenarios run at every `--connections` count, each
//! connection on a task of its own, opened 16 handshakes at a time (a
//! gateway limits the sockets one address may have mid-handshake):
//!
//! - `connect`: socket open → `hello-ok`, one sample per connection;
//! - `health`: `health` round trips, each connection in a loop of
//!   `--requests`;
//! - `ack`: `chat.send` → its ACK, each connection on its own session, runs
//!   executing meanwhile (each send a followup turn of the connection's
//!   session); the sends queue runs faster than they execute, so each
//!   connection's last send also waits, uncounted, for its run's end: the
//!   row's backlog has drained before the next row starts;
//! - `run`: `chat.send` → the run's `chat` final (a complete run), each
//!   connection's next send after its last run ended; its ACKs are a row
//!   of their own, `chat.send ack, runs executing`: the sync phase while
//!   up to one run per connection executes and fans out (the load of a
//!   user who waits for the reply, where `ack`'s sends queue runs faster
//!   than they can execute).
//!
//! The others run once:
//!
//! - `fanout`: `--watchers` connections with `operator.read` only, and one
//!   sender with read and write, which sends `--requests` runs one after
//!   the other. Every connection (the sender too) notes when each of those
//!   runs' `chat` `delta` events arrives, keyed by runId and seq (the
//!   `agent` assistant event that accompanies each is not counted again).
//!   A delivery's latency is its arrival minus the earliest arrival of the
//!   same event at any of the connections: the spread the fan-out adds from
//!   the first socket to the last, not the time from the coordinator (no
//!   clock in the protocol is finer than a millisecond). The earliest
//!   arrival itself is not a sample, so `count` is watchers × deltas when
//!   nothing was dropped (a shortfall is noted).
//! - `idle`: `--idle` authenticated connections (`operator.read`) that only
//!   read; the gateway process's `VmRSS` (`/proc/<pid>/status`, the pid from
//!   `--edge-pid` or the suite) before opening them and once the burst is
//!   over (each has seen the presence list that names the last one opened,
//!   or no presence list came for a second: a gateway may send none on a
//!   connect), divided by the connections: the marginal resident memory per
//!   idle connection, including what the allocator kept from the burst. To
//!   a loopback gateway the sockets come from 127.0.0.2–127.0.0.9 in turn,
//!   so ephemeral ports do not run out; a socket limit (`RLIMIT_NOFILE`, in
//!   the bench or in the gateway) that stops it is an error row that says
//!   how far it got.
//! - `half-open`: `--idle` TCP sockets that send half a request head and
//!   nothing more (what a client without a token can hold); the gateway's
//!   `VmRSS` before opening them and once it holds them all (its
//!   `clawgate_edge_sockets_open` gauge says so, where it serves `/metrics`
//!   on its port), divided by the sockets. The bench's own gateways raise
//!   the head timeout and the per-address socket cap so that the sockets
//!   stay for the measurement; from the same loopback aliases as `idle`.
//! - `startup`: the all-in-one `clawgate` started on a fresh store (a temp
//!   dir, or a fresh PostgreSQL database) with every listener on port 0;
//!   spawn → the address line → its `/readyz` answers 200 (polled every
//!   2 ms), `--startup-runs` times.
//!
//! # Floors
//!
//! Measured in the same run, in process on a tokio runtime of their own
//! (two workers, like a service on this machine), with the same client and
//! the same crates as the real path (tokio, tokio-tungstenite, tonic, the
//! generated `clawgate-proto` messages, redb as the embedded store uses it):
//!
//! - (a) `ws echo`: a bare WebSocket server speaking the same frames: the
//!   challenge, `hello-ok`, a `res` for every `req`, and for `chat.send` the
//!   run played back to every connection, as the edge broadcasts: lifecycle,
//!   the echo's chunks (`--echo-chunks`, one every `--echo-pace`) as
//!   `agent` assistant + `chat` delta pairs, coalesced to one pair per
//!   150 ms as the coordinator does by default (so a run has as many events
//!   as on the real path), then the end and the `chat` final; what is
//!   queued for a socket goes out in one flush, as the edge writes. The
//!   floor of `connect`, `health` and `fanout`. (The edge's
//!   `health` also reads the store; the floor does not.)
//! - (b) `ws+2 gRPC`: (a) whose `chat.send` first calls service A's
//!   `RunCoordinator/Submit` over loopback, whose handler calls service B's
//!   `SessionStore/CreateRun` over loopback, with the messages the edge and
//!   the coordinator send (an owner token, the run spec as JSON) and
//!   handlers that only answer (every other method is UNIMPLEMENTED). Its
//!   runs are played to their sender only: it is the request path's floor,
//!   not the broadcast's.
//! - (c) `ws+2 gRPC+commit`: (b) where B commits the run record durably
//!   before answering, as admission does: in a redb file, fsync'd, grouped
//!   as the embedded store's writer groups its commits (`floor::commit`;
//!   the bench links no store backend). Its backend column says
//!   `embedded`: the embedded store's engine and commit. The floor of
//!   `chat.send ack` and of `complete run` (whose floor is thus admission
//!   plus the echo's pacing, with none of execution's commits and no
//!   broadcast). The all-in-one's coordinator calls its store in process,
//!   so its admission makes one gRPC hop fewer than (c): a ratio below 1
//!   there is that hop.
//! - (d) `(c)+broadcast`: (c) whose runs are played to every connection, as
//!   (a) and the edge do (every `operator.read` connection receives every
//!   run's events). Measured for `run` only, beside (c): at N connections a
//!   run is N times its events on the wire, which (c) does not pay, so
//!   complete runs per second cannot go above (d)'s.
//!
//! `idle` and `startup` have no floor.
//!
//! # The report
//!
//! One Markdown table on stdout: its header at once, the floors' rows
//! first (they are measured before anything else), then each row the moment
//! its scenario ends, beside its floor (`--out FILE` appends every line to a
//! file too, flushed as it goes). Each scenario (a looping one at one
//! connection count, `idle`, `fanout`, `startup`) has `--scenario-timeout`
//! (120 s): one still going then is cut off, its connections closed, and its
//! row has the figures of the samples taken until then and says how far it
//! got (`incomplete: the 120s deadline came: 412 of 1280 requests
//! answered`); the exit status is then 1, as for a row that failed.
//!
//! # Modes
//!
//! `--url`/`--token` point the scenarios at any gateway that speaks the
//! protocol (nothing there knows clawgate). `suite` starts the real
//! topologies itself (see [`suite`]) and prints one table with the floors.
//! `scale` starts one store and 1, 2, 3, … coordinators sharing its
//! partitions (balanced placement) and reports complete runs per second
//! for each count, with the scaling factor (see [`scale`]).

pub mod client;
pub mod floor;
pub mod grpc_tls;
pub mod http;
pub mod plan;
pub mod procs;
pub mod progress;
pub mod report;
pub mod scale;
pub mod scenarios;
pub mod stats;
pub mod stores;
pub mod suite;
pub mod table;

pub use plan::{CONNECT_CONCURRENCY, Echo, Plan, Scenario, parse_scenarios};
pub use scenarios::run;
pub use stats::Stats;
pub use table::{Outcome, Row, table};
