//! What flows to clients without their asking, above the state it reads:
//! the coordinators' event streams (`fanin`), their translation into the
//! protocol's events (`translate`) and delivery to connections (`fanout`),
//! the `session.message` feed (`session_feed`), and presence (`presence`).
//!
//! One run event goes one way: fan-in → translate → fanout → each
//! connection's outbox, and fan-in → session feed → the store → the
//! outboxes of the connections watching its session.

pub mod fanin;
pub mod fanout;
pub mod presence;
pub mod session_feed;
pub mod translate;

/// The event machinery's shared state, beside the edge's: made with it and
/// handed with it to the tasks that follow the coordinators and to the
/// methods that subscribe, resume or await runs.
#[derive(Default)]
pub struct Events {
    pub fanin: fanin::FanIn,
    pub feed: session_feed::SessionFeed,
    pub presence: presence::Presence,
}
