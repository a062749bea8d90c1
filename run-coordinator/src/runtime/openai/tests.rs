use super::*;

fn parse_all(chunks: &[&[u8]]) -> Vec<String> {
    let mut parser = SseParser::default();
    let mut out = Vec::new();
    for chunk in chunks {
        parser.feed(chunk, &mut out);
    }
    parser.finish(&mut out);
    out
}

#[test]
fn sse_survives_any_split() {
    let body = ": keep-alive\r\ndata: {\"a\":\"h\u{e9}llo\"}\r\n\r\nevent: x\ndata: one\ndata: two\n\nid: 3\rdata:[DONE]\r\r";
    let expected = vec![
        "{\"a\":\"h\u{e9}llo\"}".to_owned(),
        "one\ntwo".to_owned(),
        "[DONE]".to_owned(),
    ];
    let bytes = body.as_bytes();
    assert_eq!(parse_all(&[bytes]), expected);
    for split in 0..=bytes.len() {
        let (a, b) = bytes.split_at(split);
        assert_eq!(parse_all(&[a, b]), expected, "split at {split}");
    }
    let singles: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(parse_all(&singles), expected);
}

#[test]
fn sse_keeps_a_last_event_without_blank_line() {
    assert_eq!(parse_all(&[b"data: x\n\ndata: y"]), vec!["x", "y"]);
    assert!(parse_all(&[b": only a comment\n\n\n"]).is_empty());
}

fn history(role: &str, content_json: &str) -> HistoryMessage {
    HistoryMessage {
        role: role.into(),
        content_json: content_json.into(),
    }
}

#[test]
fn messages_from_history() {
    let messages = build_messages(
        Some("be brief"),
        &[
            history(
                "user",
                r#"[{"type":"text","text":"hi "},{"type":"image","url":"x"},{"type":"text","text":"there"}]"#,
            ),
            history("toolResult", r#"[{"type":"text","text":"42"}]"#),
            history("assistant", r#"[{"type":"text","text":"hello"}]"#),
            history("assistant", r#"[{"type":"toolCall","id":"c"}]"#),
            history("system", r#""plain""#),
        ],
        &json!("again"),
    );
    assert_eq!(
        Value::Array(messages),
        json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi there"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": "plain"},
            {"role": "user", "content": "again"},
        ])
    );
}

#[test]
fn models_and_backoff() {
    let config = OpenAiConfig {
        fallback_models: vec!["b".into(), "a".into(), "".into(), "c".into()],
        model: "a".into(),
        ..OpenAiConfig::default()
    };
    assert_eq!(model_chain(None, &config), vec!["a", "b", "c"]);
    assert_eq!(model_chain(Some("z"), &config), vec!["z", "b", "a", "c"]);
    assert_eq!(backoff_delay(&config, 0, None), Duration::from_millis(500));
    assert_eq!(backoff_delay(&config, 2, None), Duration::from_secs(2));
    assert_eq!(backoff_delay(&config, 40, None), Duration::from_secs(8));
    assert_eq!(
        backoff_delay(&config, 0, Some(Duration::from_secs(3))),
        Duration::from_secs(3)
    );
    assert_eq!(
        backoff_delay(&config, 0, Some(Duration::from_secs(300))),
        Duration::from_secs(8)
    );
    let mut headers = HeaderMap::new();
    headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
    assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
    headers.insert("retry-after-ms", HeaderValue::from_static("250"));
    assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
    headers.clear();
    headers.insert(
        RETRY_AFTER,
        HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
    );
    assert_eq!(retry_after(&headers), None);
}

#[test]
fn http_errors_are_classified() {
    let kind = |status: u16, body: &str| {
        let e = classify_http(StatusCode::from_u16(status).unwrap(), body, "m");
        (e.kind, e.retryable)
    };
    assert_eq!(kind(429, "{}"), (ErrorKind::RateLimit, true));
    assert_eq!(
        kind(
            429,
            r#"{"error":{"code":"insufficient_quota","message":"quota"}}"#
        ),
        (ErrorKind::RateLimit, false)
    );
    assert_eq!(
        kind(
            400,
            r#"{"error":{"code":"context_length_exceeded","message":"too long"}}"#
        ),
        (ErrorKind::ContextLength, false)
    );
    assert_eq!(
        kind(400, "This model's maximum context length is 8192 tokens"),
        (ErrorKind::ContextLength, false)
    );
    assert_eq!(
        kind(
            400,
            r#"{"error":{"code":"content_filter","message":"filtered"}}"#
        ),
        (ErrorKind::Refusal, false)
    );
    assert_eq!(
        kind(400, r#"{"error":{"message":"bad"}}"#),
        (ErrorKind::Unknown, false)
    );
    assert_eq!(kind(401, ""), (ErrorKind::Unknown, false));
    assert_eq!(kind(408, ""), (ErrorKind::Timeout, true));
    assert_eq!(kind(504, ""), (ErrorKind::Timeout, true));
    assert_eq!(kind(500, "oops"), (ErrorKind::Unknown, true));
    assert_eq!(kind(503, ""), (ErrorKind::Unknown, true));
    let e = classify_http(
        StatusCode::BAD_REQUEST,
        r#"{"error":{"message":"bad thing","type":"invalid_request_error"}}"#,
        "m",
    );
    assert!(
        e.message.contains("bad thing") && e.message.contains("400"),
        "{}",
        e.message
    );
}

#[test]
fn stream_errors_are_classified() {
    let kind = |error: Value| {
        let e = classify_stream_error(&error, "m");
        (e.kind, e.retryable)
    };
    assert_eq!(
        kind(json!({"message": "Rate limit reached", "type": "requests"})),
        (ErrorKind::RateLimit, true)
    );
    assert_eq!(
        kind(json!({"code": "context_length_exceeded"})),
        (ErrorKind::ContextLength, false)
    );
    assert_eq!(
        kind(json!({"code": "content_filter"})),
        (ErrorKind::Refusal, false)
    );
    assert_eq!(
        kind(json!({"message": "upstream timed out"})),
        (ErrorKind::Timeout, true)
    );
    assert_eq!(
        kind(json!({"message": "boom", "type": "server_error"})),
        (ErrorKind::Unknown, true)
    );
    assert_eq!(
        kind(json!({"message": "bad", "code": 400})),
        (ErrorKind::Unknown, false)
    );
    assert_eq!(kind(json!("plain text")), (ErrorKind::Unknown, true));
}

fn run_turn(payloads: &[Value]) -> (Vec<RuntimeEvent>, Result<(), RuntimeError>) {
    let mut turn = Turn::new("m", "r1");
    let mut out = Vec::new();
    for payload in payloads {
        if let Err(e) = turn.on_payload(&payload.to_string(), &mut out) {
            return (out, Err(e));
        }
    }
    let result = turn.finish(&mut out);
    (out, result)
}

#[test]
fn tool_calls_start_then_update() {
    let (events, result) = run_turn(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\":1}"}},{"index":1,"function":{"name":"g","arguments":"{}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"function_call"}]}),
    ]);
    result.unwrap();
    assert_eq!(
        events,
        vec![
            RuntimeEvent::ToolStart {
                tool_call_id: "c1".into(),
                name: "f".into(),
                arguments_json: "{\"a".into()
            },
            RuntimeEvent::ToolUpdate {
                tool_call_id: "c1".into(),
                partial_json: "\":1}".into()
            },
            RuntimeEvent::ToolStart {
                tool_call_id: "r1-call-1".into(),
                name: "g".into(),
                arguments_json: "{}".into()
            },
            RuntimeEvent::Finished {
                stop_reason: "tool_calls".into()
            },
        ]
    );
}

#[test]
fn usage_comes_before_finished_and_refusals_fail() {
    let (events, result) = run_turn(&[
        json!({"choices":[{"index":0,"delta":{"content":"a","refusal":null}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}),
    ]);
    result.unwrap();
    assert_eq!(
        events,
        vec![
            RuntimeEvent::AssistantDelta("a".into()),
            RuntimeEvent::Usage(Usage {
                input_tokens: 3,
                output_tokens: 1,
                total_tokens: 4
            }),
            RuntimeEvent::Finished {
                stop_reason: "length".into()
            },
        ]
    );
    let (_, result) = run_turn(&[
        json!({"choices":[{"index":0,"delta":{"refusal":"I can't "}}]}),
        json!({"choices":[{"index":0,"delta":{"refusal":"help."},"finish_reason":"stop"}]}),
    ]);
    let error = result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Refusal);
    assert!(error.message.contains("I can't help."), "{}", error.message);
}

#[test]
fn joined_data_lines_fall_back_to_one_value_per_line() {
    let mut turn = Turn::new("m", "r");
    let mut out = Vec::new();
    let payload = format!(
        "{}\n{}\n[DONE]",
        json!({"choices":[{"delta":{"content":"x"}}]}),
        json!({"choices":[{"delta":{"content":"y"}}]})
    );
    assert_eq!(turn.on_payload(&payload, &mut out).unwrap(), Flow::Done);
    assert_eq!(
        out,
        vec![
            RuntimeEvent::AssistantDelta("x".into()),
            RuntimeEvent::AssistantDelta("y".into())
        ]
    );
}

#[test]
fn invalid_options_and_config_are_rejected() {
    assert!(RunOptions::parse(&json!({"temperature": "hot"})).is_err());
    let options = RunOptions::parse(&json!({"maxTokens": 5, "other": 1})).unwrap();
    assert_eq!(options.max_tokens, Some(5));
    assert!(
        OpenAiRuntime::new(OpenAiConfig {
            base_url: "not a url".into(),
            ..OpenAiConfig::default()
        })
        .is_err()
    );
    assert!(
        OpenAiRuntime::new(OpenAiConfig {
            model: " ".into(),
            ..OpenAiConfig::default()
        })
        .is_err()
    );
    assert!(
        OpenAiRuntime::new(OpenAiConfig {
            api_key: Some("a\nb".into()),
            ..OpenAiConfig::default()
        })
        .is_err()
    );
    assert!(OpenAiRuntime::new(OpenAiConfig::default()).is_ok());
    let config = OpenAiConfig {
        api_key: Some("sk-secret".into()),
        ..OpenAiConfig::default()
    };
    assert!(!format!("{config:?}").contains("sk-secret"));
}

#[test]
fn attachments_are_content_parts() {
    let image = Attachment {
        mime_type: "image/png".into(),
        file_name: "a.png".into(),
        data: vec![1, 2, 3],
    };
    let pdf = Attachment {
        mime_type: "application/pdf".into(),
        file_name: "b.pdf".into(),
        data: vec![4],
    };
    assert_eq!(user_content("hi", &[]), json!("hi"));
    assert_eq!(
        user_content("look", &[image.clone(), pdf]),
        json!([
            { "type": "text", "text": "look" },
            { "type": "image_url", "image_url": { "url": "data:image/png;base64,AQID" } },
            { "type": "file", "file": { "filename": "b.pdf", "file_data": "data:application/pdf;base64,BA==" } },
        ])
    );
    assert_eq!(
        user_content("", &[image]),
        json!([{ "type": "image_url", "image_url": { "url": "data:image/png;base64,AQID" } }])
    );
}
