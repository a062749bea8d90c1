//! The span contract of the services' tracing, as checks over received
//! spans. Each check returns `Err` with what is missing or wrong, so a test
//! can wait until it passes and report the last complaint at the deadline.
//!
//! - Every gRPC hop has a CLIENT span in the caller and a SERVER span in the
//!   callee, both named by the fully-qualified method
//!   (`clawgate.run_coordinator.v1.RunCoordinator/Submit`), the server span a
//!   child of the client span, both with `rpc.system.name = "grpc"`,
//!   `rpc.method = <name>` and `rpc.response.status_code = "OK"`.
//! - The edge makes one SERVER span per request frame, named after the
//!   gateway method, with `gateway.method`; `chat.send` adds `run.id` (the
//!   idempotencyKey) and `session.key`. A frame's `traceparent` is its parent.
//! - The coordinator has `run.admit` (`run.id`) and `run.execute` (`run.id`,
//!   `session.key`, `run.status` once ended, an event per state change); a
//!   superseding run links to the `run.execute` of the run it replaced.
//! - The store's SERVER spans carry `run.id` (from W3C baggage).

use crate::receiver::{ExportedSpan, SpanKind, Spans};
use crate::system::Role;

pub const SUBMIT: &str = "clawgate.run_coordinator.v1.RunCoordinator/Submit";
pub const CREATE_RUN: &str = "clawgate.session_store.v1.SessionStore/CreateRun";
pub const START_RUN: &str = "clawgate.session_store.v1.SessionStore/StartRun";
pub const FINISH_RUN: &str = "clawgate.session_store.v1.SessionStore/FinishRun";
/// The store writes of one run: admission, start (running, the writer
/// fence and the user turn) and finish (the answer, the terminal status,
/// the release).
pub const RUN_WRITES: [&str; 3] = [CREATE_RUN, START_RUN, FINISH_RUN];
pub const WAIT: &str = "clawgate.run_coordinator.v1.RunCoordinator/Wait";
pub const CANCEL: &str = "clawgate.run_coordinator.v1.RunCoordinator/Cancel";
pub const SUBSCRIBE: &str = "clawgate.run_coordinator.v1.RunCoordinator/Subscribe";

/// A run sent with `chat.send` through the edge, as its spans must show it.
#[derive(Debug, Clone, Copy)]
pub struct ChatRun<'a> {
    pub run_id: &'a str,
    pub session_key: &'a str,
    /// The run's final status (`ok`, `superseded`, …).
    pub status: &'a str,
}

/// Fails with `why` unless `holds`.
fn ensure(holds: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if holds { Ok(()) } else { Err(why()) }
}

/// The one span of `spans` (`what` names it in the complaint).
fn single<'a>(spans: &'a Spans, what: &str) -> Result<&'a ExportedSpan, String> {
    match &spans[..] {
        [span] => Ok(span),
        other => Err(format!("want exactly one {what}, have {}", other.len())),
    }
}

/// The edge's `chat.send` span of run `run_id`.
fn chat_send_span(spans: &Spans, run_id: &str) -> Result<Spans, String> {
    let send = spans.named("chat.send").with_attribute("run.id", run_id);
    single(&send, &format!("chat.send span with run.id={run_id}"))?;
    Ok(send)
}

/// The complete trace of `run`, once it holds to the contract: one trace
/// has the edge's `chat.send` span, every span's parent is in it and there
/// is one root, all three services took part, the run's spans carry
/// `run.id`, and every gRPC hop is a CLIENT/SERVER pair.
pub fn chat_run_trace(spans: &Spans, run: ChatRun) -> Result<Spans, String> {
    let send = chat_send_span(spans, run.run_id)?;
    let send = &send[0];
    ensure(send.service == Role::Edge.service_name(), || {
        format!("chat.send comes from {:?}", send.service)
    })?;
    ensure(send.kind() == SpanKind::Server, || {
        format!("chat.send is {:?}, not Server", send.kind())
    })?;
    for (key, want) in [
        ("gateway.method", "chat.send"),
        ("session.key", run.session_key),
    ] {
        ensure(send.has_attribute(key, want), || {
            format!("chat.send lacks {key}={want:?}")
        })?;
    }

    let trace_id = send.trace_id();
    let trace = spans.of_trace(&trace_id);
    let orphans: Vec<&str> = trace
        .iter()
        .filter(|s| {
            s.parent_span_id()
                .is_some_and(|p| trace.by_id(&p).is_none())
        })
        .map(ExportedSpan::name)
        .collect();
    ensure(orphans.is_empty(), || {
        format!("the parents of {orphans:?} are not in trace {trace_id}")
    })?;
    let roots = trace.filter(|s| s.parent_span_id().is_none());
    ensure(roots.len() == 1, || {
        format!("want one root in trace {trace_id}, have {}", roots.len())
    })?;
    for role in Role::ALL {
        ensure(!trace.of_service(role.service_name()).is_empty(), || {
            format!("no span of {} in trace {trace_id}", role.service_name())
        })?;
    }

    single(
        &trace
            .named("run.admit")
            .with_attribute("run.id", run.run_id),
        "run.admit span with run.id in the trace",
    )?;
    let execute = trace
        .named("run.execute")
        .with_attribute("run.id", run.run_id);
    let execute = single(&execute, "run.execute span with run.id in the trace")?;
    for (key, want) in [("session.key", run.session_key), ("run.status", run.status)] {
        ensure(execute.has_attribute(key, want), || {
            format!("run.execute lacks {key}={want:?}")
        })?;
    }
    ensure(!execute.span.events.is_empty(), || {
        "run.execute has no state-change events".to_owned()
    })?;
    let store_servers = trace
        .of_service(Role::Store.service_name())
        .of_kind(SpanKind::Server);
    ensure(
        !store_servers
            .with_attribute("run.id", run.run_id)
            .is_empty(),
        || "no session-store SERVER span carries run.id".to_owned(),
    )?;

    // Every store write of the run is in this one trace, and none is
    // anywhere else.
    let writes_elsewhere: Vec<String> = spans
        .of_service(Role::Store.service_name())
        .of_kind(SpanKind::Server)
        .with_attribute("run.id", run.run_id)
        .iter()
        .filter(|s| s.trace_id() != trace_id)
        .map(|s| s.name().to_owned())
        .collect();
    ensure(writes_elsewhere.is_empty(), || {
        format!("store calls of the run outside its trace: {writes_elsewhere:?}")
    })?;

    grpc_hops(&trace)?;
    let hops = [(SUBMIT, Role::Edge, Role::Coordinator)]
        .into_iter()
        .chain(RUN_WRITES.map(|write| (write, Role::Coordinator, Role::Store)));
    for (method, caller, callee) in hops {
        let hop = trace.named(method);
        for (role, kind) in [(caller, SpanKind::Client), (callee, SpanKind::Server)] {
            ensure(
                !hop.of_service(role.service_name()).of_kind(kind).is_empty(),
                || format!("no {kind:?} span {method} in {}", role.service_name()),
            )?;
        }
    }
    Ok(trace)
}

/// Whether `server` handled the call `client` made.
fn is_hop(client: &ExportedSpan, server: &ExportedSpan) -> bool {
    client.kind() == SpanKind::Client
        && server.kind() == SpanKind::Server
        && client.name() == server.name()
        && client.service != server.service
        && server.parent_span_id() == Some(client.span_id())
}

/// Every gRPC span of `trace` (named `package.Service/Method`) has the rpc
/// attributes, and the spans pair up: a SERVER span is the child of a
/// CLIENT span of the same method in another service, and a CLIENT span has
/// such a SERVER child.
pub fn grpc_hops(trace: &Spans) -> Result<(), String> {
    let grpc = trace.filter(|s| s.name().starts_with("clawgate.") && s.name().contains('/'));
    for span in &grpc {
        let name = span.name();
        let whose = || format!("{name} ({:?} in {})", span.kind(), span.service);
        for (key, want) in [
            ("rpc.system.name", "grpc"),
            ("rpc.method", name),
            ("rpc.response.status_code", "OK"),
        ] {
            ensure(span.has_attribute(key, want), || {
                format!("{} lacks {key}={want:?}", whose())
            })?;
        }
        let paired = match span.kind() {
            SpanKind::Server => grpc.iter().any(|client| is_hop(client, span)),
            SpanKind::Client => grpc.iter().any(|server| is_hop(span, server)),
            _ => false,
        };
        ensure(paired, || {
            format!("{} has no CLIENT/SERVER counterpart", whose())
        })?;
    }
    Ok(())
}

/// The run `new_run` superseded `old_run`: the old `run.execute` ended
/// `superseded`, and the new run's `run.admit` or `run.execute` links to it.
pub fn supersede_link(spans: &Spans, old_run: &str, new_run: &str) -> Result<(), String> {
    let old = spans.named("run.execute").with_attribute("run.id", old_run);
    let old = single(&old, "run.execute span of the superseded run")?;
    ensure(old.has_attribute("run.status", "superseded"), || {
        "the superseded run's run.execute lacks run.status=\"superseded\"".to_owned()
    })?;
    let linked = spans
        .filter(|s| matches!(s.name(), "run.admit" | "run.execute"))
        .with_attribute("run.id", new_run)
        .iter()
        .any(|s| s.links_to(old));
    ensure(linked, || {
        "neither run.admit nor run.execute of the new run links to the old run.execute".to_owned()
    })
}

/// The coordinator's SERVER span of `method` (a fully-qualified gRPC method
/// that acts on a run, like Cancel or Wait) links to `run_id`'s
/// `run.execute` span.
pub fn links_to_run(spans: &Spans, method: &str, run_id: &str) -> Result<(), String> {
    let execute = spans.named("run.execute").with_attribute("run.id", run_id);
    let execute = single(&execute, "run.execute span of the run")?;
    let calls = spans
        .named(method)
        .of_service(Role::Coordinator.service_name())
        .of_kind(SpanKind::Server);
    ensure(!calls.is_empty(), || format!("no {method} SERVER span"))?;
    ensure(calls.iter().any(|call| call.links_to(execute)), || {
        format!("no {method} SERVER span links to the run's run.execute")
    })
}

/// The edge's `chat.send` span of `run_id` continues the caller's trace
/// context (`trace_id`, `parent_id`, hex), and the trace goes on into the
/// coordinator.
pub fn continues_caller_trace(
    spans: &Spans,
    run_id: &str,
    trace_id: &str,
    parent_id: &str,
) -> Result<(), String> {
    let send = chat_send_span(spans, run_id)?;
    let send = &send[0];
    ensure(send.trace_id() == trace_id, || {
        format!("chat.send is in trace {}, not {trace_id}", send.trace_id())
    })?;
    ensure(send.parent_span_id().as_deref() == Some(parent_id), || {
        format!(
            "chat.send's parent is {:?}, not {parent_id}",
            send.parent_span_id()
        )
    })?;
    let submit = spans
        .of_trace(trace_id)
        .named(SUBMIT)
        .of_service(Role::Coordinator.service_name())
        .of_kind(SpanKind::Server);
    ensure(!submit.is_empty(), || {
        format!("the coordinator's {SUBMIT} SERVER span is not in trace {trace_id}")
    })
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
    use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};

    use super::*;
    use crate::receiver::fake;

    const RUN: &str = "run-1";
    const KEY: &str = "agent:main:contract";

    /// Span `id` (parent `parent`) of `role`, with string attributes.
    fn span(
        role: Role,
        name: &str,
        kind: SpanKind,
        (id, parent): (u8, Option<u8>),
        attributes: &[(&str, &str)],
    ) -> ExportedSpan {
        let mut span = fake::span(name, id, parent, kind);
        span.attributes = attributes
            .iter()
            .map(|(k, v)| fake::attribute(k, AnyValue::StringValue((*v).into())))
            .collect();
        ExportedSpan {
            service: role.service_name().into(),
            resource: Vec::new(),
            scope: "test".into(),
            span,
        }
    }

    fn rpc(
        method: &'static str,
        extra: &[(&'static str, &'static str)],
    ) -> Vec<(&'static str, &'static str)> {
        let mut attributes = vec![
            ("rpc.system.name", "grpc"),
            ("rpc.method", method),
            ("rpc.response.status_code", "OK"),
        ];
        attributes.extend_from_slice(extra);
        attributes
    }

    /// A chat run's trace as the contract wants it: chat.send → Submit →
    /// run.admit → CreateRun, and run.execute under run.admit with the
    /// run's StartRun and FinishRun.
    fn conforming() -> Vec<ExportedSpan> {
        use Role::{Coordinator, Edge, Store};
        use SpanKind::{Client, Internal, Server};
        let mut execute = span(
            Coordinator,
            "run.execute",
            Internal,
            (7, Some(4)),
            &[("run.id", RUN), ("session.key", KEY), ("run.status", "ok")],
        );
        execute.span.events.push(Event {
            name: "run.running".into(),
            ..Event::default()
        });
        vec![
            span(
                Edge,
                "chat.send",
                Server,
                (1, None),
                &[
                    ("gateway.method", "chat.send"),
                    ("run.id", RUN),
                    ("session.key", KEY),
                ],
            ),
            span(Edge, SUBMIT, Client, (2, Some(1)), &rpc(SUBMIT, &[])),
            span(Coordinator, SUBMIT, Server, (3, Some(2)), &rpc(SUBMIT, &[])),
            span(
                Coordinator,
                "run.admit",
                Internal,
                (4, Some(3)),
                &[("run.id", RUN)],
            ),
            span(
                Coordinator,
                CREATE_RUN,
                Client,
                (5, Some(4)),
                &rpc(CREATE_RUN, &[]),
            ),
            span(
                Store,
                CREATE_RUN,
                Server,
                (6, Some(5)),
                &rpc(CREATE_RUN, &[("run.id", RUN)]),
            ),
            execute,
            span(
                Coordinator,
                START_RUN,
                Client,
                (9, Some(7)),
                &rpc(START_RUN, &[]),
            ),
            span(
                Store,
                START_RUN,
                Server,
                (10, Some(9)),
                &rpc(START_RUN, &[("run.id", RUN)]),
            ),
            span(
                Coordinator,
                FINISH_RUN,
                Client,
                (11, Some(7)),
                &rpc(FINISH_RUN, &[]),
            ),
            span(
                Store,
                FINISH_RUN,
                Server,
                (12, Some(11)),
                &rpc(FINISH_RUN, &[("run.id", RUN)]),
            ),
        ]
    }

    const RUN_OK: ChatRun = ChatRun {
        run_id: RUN,
        session_key: KEY,
        status: "ok",
    };

    fn with_id(spans: &mut [ExportedSpan], id: u8) -> &mut ExportedSpan {
        spans
            .iter_mut()
            .find(|s| s.span.span_id == vec![id; 8])
            .expect("span id")
    }

    /// Replaces (or with `None` removes) string attribute `key` of span `id`.
    fn set(spans: &mut [ExportedSpan], id: u8, key: &str, value: Option<&str>) {
        let attributes = &mut with_id(spans, id).span.attributes;
        attributes.retain(|kv| kv.key != key);
        if let Some(value) = value {
            attributes.push(fake::attribute(key, AnyValue::StringValue(value.into())));
        }
    }

    #[test]
    fn a_conforming_trace_passes() {
        let spans: Spans = conforming().into_iter().collect();
        let trace =
            chat_run_trace(&spans, RUN_OK).unwrap_or_else(|why| panic!("{why}\n{}", spans.dump()));
        assert_eq!(trace.len(), 11);
    }

    #[test]
    fn each_breach_is_named() {
        type Breach = fn(&mut Vec<ExportedSpan>);
        let breaches: [(Breach, &str); 10] = [
            (
                |s| s.retain(|s| ![vec![11; 8], vec![12; 8]].contains(&s.span.span_id)),
                "no Client span clawgate.session_store.v1.SessionStore/FinishRun",
            ),
            (
                |s| {
                    // The finish written under another trace.
                    let finish = with_id(s, 12);
                    finish.span.trace_id = vec![0xcd; 16];
                    finish.span.parent_span_id.clear();
                },
                "store calls of the run outside its trace",
            ),
            (
                |s| s.retain(|s| s.span.span_id != vec![2; 8]),
                "the parents of",
            ),
            (
                |s| with_id(s, 4).span.parent_span_id.clear(),
                "want one root",
            ),
            (
                |s| set(s, 6, "rpc.response.status_code", Some("INTERNAL")),
                "rpc.response.status_code",
            ),
            (
                |s| {
                    for id in [6, 10, 12] {
                        set(s, id, "run.id", None);
                    }
                },
                "no session-store SERVER span carries run.id",
            ),
            (
                |s| with_id(s, 6).span.parent_span_id = vec![4; 8],
                "no CLIENT/SERVER counterpart",
            ),
            (
                |s| with_id(s, 7).span.events.clear(),
                "no state-change events",
            ),
            (|s| set(s, 7, "run.status", Some("error")), "run.status"),
            (
                |s| set(s, 1, "session.key", Some("agent:main:other")),
                "session.key",
            ),
        ];
        for (breach, complaint) in breaches {
            let mut spans = conforming();
            breach(&mut spans);
            let spans: Spans = spans.into_iter().collect();
            match chat_run_trace(&spans, RUN_OK) {
                Ok(_) => panic!("passed despite the breach ({complaint}):\n{}", spans.dump()),
                Err(why) => assert!(
                    why.contains(complaint),
                    "{why:?} does not say {complaint:?}"
                ),
            }
        }
    }

    #[test]
    fn a_superseding_run_must_link_to_the_old_execution() {
        let old = span(
            Role::Coordinator,
            "run.execute",
            SpanKind::Internal,
            (8, None),
            &[("run.id", "old"), ("run.status", "superseded")],
        );
        let mut spans = conforming();
        spans.push(old.clone());
        let unlinked: Spans = spans.iter().cloned().collect();
        let err = supersede_link(&unlinked, "old", RUN).unwrap_err();
        assert!(err.contains("links to the old"), "{err}");

        with_id(&mut spans, 7).span.links.push(Link {
            trace_id: old.span.trace_id.clone(),
            span_id: old.span.span_id.clone(),
            ..Link::default()
        });
        let linked: Spans = spans.into_iter().collect();
        assert_eq!(supersede_link(&linked, "old", RUN), Ok(()));
    }

    #[test]
    fn the_edge_span_must_continue_the_callers_trace() {
        let mut spans = conforming();
        with_id(&mut spans, 1).span.parent_span_id = vec![0x42; 8];
        let spans: Spans = spans.into_iter().collect();
        let trace_id = "ab".repeat(16);
        let parent = "42".repeat(8);
        assert_eq!(
            continues_caller_trace(&spans, RUN, &trace_id, &parent),
            Ok(())
        );
        let err = continues_caller_trace(&spans, RUN, &trace_id, &"43".repeat(8)).unwrap_err();
        assert!(err.contains("parent"), "{err}");
        let err = continues_caller_trace(&spans, RUN, &"cd".repeat(16), &parent).unwrap_err();
        assert!(
            err.contains("not in trace") || err.contains(", not"),
            "{err}"
        );
    }
}
