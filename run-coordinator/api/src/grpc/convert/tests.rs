//! Every conversion crosses the wire and comes back equal.

use super::*;

fn snapshot() -> RunSnapshot {
    RunSnapshot {
        run_id: "r1".into(),
        session_key: "agent:main:s".into(),
        kind: "chat".into(),
        status: RunStatus::Aborted,
        queue_position: 2,
        last_seq: 9,
        created_at_ms: 1,
        started_at_ms: Some(2),
        ended_at_ms: Some(3),
        outcome: Outcome {
            text: "so far".into(),
            stop_reason: Some("rpc".into()),
            error: Some(RunErrorInfo {
                kind: "aborted".into(),
                message: "stopped".into(),
            }),
            superseded_by: Some("r2".into()),
            usage: Some(Usage {
                input_tokens: 1,
                output_tokens: 2,
                total_tokens: 3,
            }),
        },
        session_id: Some("s-id".into()),
        fence_token: Some(7),
        epoch: "e".into(),
        requester: "me".into(),
    }
}

#[test]
fn a_snapshot_crosses_the_wire_and_comes_back_equal() {
    let sent = snapshot();
    assert_eq!(
        snapshot_from_pb(snapshot_to_pb(sent.clone())).unwrap(),
        sent
    );
}

#[test]
fn a_submit_crosses_the_wire_and_comes_back_equal() {
    let sent = SubmitRequest {
        run_id: "r1".into(),
        session_key: SessionKey::parse("s").unwrap(),
        spec: RunSpec {
            kind: "chat".into(),
            message: "hi".into(),
            queue_mode: QueueMode::Collect,
            timeout_ms: Some(5),
            options: serde_json::json!({ "model": "m" }),
            requester: "me".into(),
            label: Some("l".into()),
            attachments: vec![Attachment {
                mime_type: "image/png".into(),
                file_name: "a.png".into(),
                data: "aGk=".into(),
            }],
        },
        expected_settings: Some(42),
        create_session: true,
    };
    let back = submit_from_pb(submit_to_pb(sent.clone()).unwrap()).unwrap();
    assert_eq!(back.run_id, sent.run_id);
    assert_eq!(back.session_key, sent.session_key);
    assert_eq!(back.spec, sent.spec);
    assert_eq!(back.expected_settings, sent.expected_settings);
    assert_eq!(back.create_session, sent.create_session);
}

#[test]
fn events_and_stream_items_cross_the_wire_and_come_back_equal() {
    let bodies = [
        EventBody::Lifecycle {
            phase: LifecyclePhase::Start,
            status: None,
            stop_reason: None,
            error: None,
        },
        EventBody::Lifecycle {
            phase: LifecyclePhase::Error,
            status: Some(RunStatus::Lost),
            stop_reason: Some("x".into()),
            error: Some(RunErrorInfo {
                kind: "lost".into(),
                message: "gone".into(),
            }),
        },
        EventBody::Assistant {
            text: "ab".into(),
            delta: "b".into(),
        },
        EventBody::Tool {
            phase: ToolPhase::Update,
            tool_call_id: "t".into(),
            name: "n".into(),
            data_json: "{}".into(),
            is_error: true,
        },
        EventBody::Status {
            status: RunStatus::Queued,
            queue_position: 3,
        },
    ];
    for body in bodies {
        let event = RunEvent {
            run_id: "r".into(),
            session_key: "k".into(),
            seq: 1,
            stream_seq: 2,
            epoch: "e".into(),
            ts_ms: 3,
            body,
        };
        let item = StreamItem::Event(event);
        let back = stream_item_from_pb(stream_item_to_pb(&item)).unwrap();
        assert_eq!(back, Some(item));
    }
    for item in [
        StreamItem::Subscribed { epoch: "e".into() },
        StreamItem::Reset(StreamReset {
            reason: "behind".into(),
            epoch: "e".into(),
        }),
    ] {
        assert_eq!(
            stream_item_from_pb(stream_item_to_pb(&item)).unwrap(),
            Some(item)
        );
    }
}

#[test]
fn runtime_wait_and_cancel_cross_the_wire_and_come_back_equal() {
    let info = RuntimeInfo {
        name: "echo".into(),
        catalog: ModelCatalog {
            models: vec![ModelInfo {
                id: "m".into(),
                name: "M".into(),
                provider: "p".into(),
                context_window: Some(8),
                reasoning: true,
                input: vec!["text".into()],
            }],
            default_model: Some("p/m".into()),
        },
    };
    assert_eq!(runtime_from_pb(runtime_to_pb(info.clone())), info);
    let lanes = LaneStats {
        max_executing: 8,
        executing: 3,
        waiting: 5,
        draining: true,
        lanes: 4,
        lanes_running: 3,
        lanes_waiting: 2,
    };
    assert_eq!(lanes_from_pb(lanes_to_pb(lanes)), lanes);
    let waited = WaitResult {
        terminal: true,
        unknown: false,
        snapshot: Some(snapshot()),
    };
    let back = wait_from_pb(wait_to_pb(waited.clone())).unwrap();
    assert_eq!(
        (back.terminal, back.unknown, back.snapshot),
        (true, false, waited.snapshot)
    );
    let key = SessionKey::parse("s").unwrap();
    let target = cancel_target_from_pb(Some(cancel_target_to_pb(CancelTarget::Session(
        key.clone(),
    ))));
    assert!(matches!(target, Ok(CancelTarget::Session(k)) if k == key));
}
