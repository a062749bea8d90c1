//! The `echo` runtime: deterministic, for demos, tests and benchmarks. It
//! streams the user's message back in `chunks` pieces, one every `paceMs`
//! (an attachment as a line `[name: mime/type, N bytes]`).
//!
//! Per-run options (the run's `options` object) override the defaults:
//! `chunks`, `paceMs`, `toolCall` (true: a tool call before the text),
//! `fail` (a message: fail after the first chunk, with `failKind`, default
//! "unknown"), `ignoreCancel` (true: keep streaming and finish successfully
//! even when cancelled).

use std::collections::VecDeque;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{
    AgentRuntime, ErrorKind, ModelCatalog, ModelInfo, RuntimeError, RuntimeEvent, RuntimeRequest,
    RuntimeStream, Usage,
};

#[derive(Debug, Clone)]
pub struct EchoConfig {
    pub chunks: usize,
    pub pace: Duration,
}

impl Default for EchoConfig {
    fn default() -> Self {
        Self {
            chunks: 4,
            pace: Duration::from_millis(20),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EchoOptions {
    chunks: Option<usize>,
    pace_ms: Option<u64>,
    #[serde(default)]
    tool_call: bool,
    fail: Option<String>,
    fail_kind: Option<ErrorKind>,
    #[serde(default)]
    ignore_cancel: bool,
}

pub struct EchoRuntime {
    config: EchoConfig,
}

impl EchoRuntime {
    pub fn new(config: EchoConfig) -> Self {
        Self { config }
    }
}

/// Splits `text` into at most `chunks` pieces on character boundaries.
fn split_chunks(text: &str, chunks: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let size = chars.len().div_ceil(chunks.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// One step of the plan: wait `pace` first when `paced`, then emit.
struct Step {
    paced: bool,
    item: Item,
}

enum Item {
    Event(Result<RuntimeEvent, RuntimeError>),
    /// The end of a reply: a steered message is taken here, and echoed as
    /// the next reply of the same turn.
    Boundary,
}

fn event(paced: bool, event: Result<RuntimeEvent, RuntimeError>) -> Step {
    Step {
        paced,
        item: Item::Event(event),
    }
}

/// The steps that echo `text` in `chunks` pieces.
fn reply(text: &str, chunks: usize) -> impl Iterator<Item = Step> {
    split_chunks(text, chunks)
        .into_iter()
        .map(|chunk| event(true, Ok(RuntimeEvent::AssistantDelta(chunk))))
}

fn plan(request: &RuntimeRequest, options: &EchoOptions, chunks: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    if options.tool_call {
        let id = format!("echo-tool-{}", request.run_id);
        let args = serde_json::json!({ "text": request.message }).to_string();
        steps.push(event(
            true,
            Ok(RuntimeEvent::ToolStart {
                tool_call_id: id.clone(),
                name: "echo".into(),
                arguments_json: args,
            }),
        ));
        let result = serde_json::json!({ "length": request.message.chars().count() }).to_string();
        steps.push(event(
            true,
            Ok(RuntimeEvent::ToolResult {
                tool_call_id: id,
                result_json: result,
                is_error: false,
            }),
        ));
    }
    // What it was sent: the text, then a line per attachment.
    let mut echoed = request.message.clone();
    for attachment in &request.attachments {
        if !echoed.is_empty() {
            echoed.push('\n');
        }
        let name = if attachment.file_name.is_empty() {
            "attachment"
        } else {
            &attachment.file_name
        };
        echoed.push_str(&format!(
            "[{name}: {}, {} bytes]",
            attachment.mime_type,
            attachment.data.len()
        ));
    }
    for (index, step) in reply(&echoed, chunks).enumerate() {
        steps.push(step);
        if index == 0
            && let Some(message) = &options.fail
        {
            let kind = options.fail_kind.unwrap_or(ErrorKind::Unknown);
            steps.push(event(
                true,
                Err(RuntimeError::new(kind, message.clone(), false)),
            ));
            return steps;
        }
    }
    steps.push(Step {
        paced: false,
        item: Item::Boundary,
    });
    let words = request.message.split_whitespace().count() as u64;
    steps.push(event(
        false,
        Ok(RuntimeEvent::Usage(Usage {
            input_tokens: words,
            output_tokens: words,
            total_tokens: 2 * words,
        })),
    ));
    steps.push(event(
        false,
        Ok(RuntimeEvent::Finished {
            stop_reason: "stop".into(),
        }),
    ));
    steps
}

#[async_trait]
impl AgentRuntime for EchoRuntime {
    fn name(&self) -> &'static str {
        "echo"
    }

    async fn models(&self) -> Result<ModelCatalog, RuntimeError> {
        Ok(ModelCatalog {
            models: vec![ModelInfo {
                id: "echo".into(),
                name: "Echo".into(),
                provider: "clawgate".into(),
                context_window: None,
                reasoning: false,
                input: vec!["text".into()],
            }],
            default_model: Some("echo".into()),
        })
    }

    async fn execute(
        &self,
        request: RuntimeRequest,
        cancel: CancellationToken,
    ) -> Result<RuntimeStream, RuntimeError> {
        let options: EchoOptions =
            serde_json::from_value(request.options.clone()).map_err(|e| {
                RuntimeError::new(
                    ErrorKind::Unknown,
                    format!("invalid echo options: {e}"),
                    false,
                )
            })?;
        let pace = options
            .pace_ms
            .map_or(self.config.pace, Duration::from_millis);
        let chunks = options.chunks.unwrap_or(self.config.chunks).max(1);
        let steps: VecDeque<Step> = plan(&request, &options, chunks).into();
        // Cancellation is honoured unless the run asked to ignore it.
        let cancel = (!options.ignore_cancel).then_some(cancel);
        let inputs = request.inputs.clone();
        let stream = futures::stream::unfold(steps, move |mut steps| {
            let (cancel, inputs) = (cancel.clone(), inputs.clone());
            async move {
                loop {
                    let step = steps.pop_front()?;
                    if step.paced {
                        match &cancel {
                            Some(cancel) => tokio::select! {
                                () = tokio::time::sleep(pace) => {}
                                () = cancel.cancelled() => return None,
                            },
                            None => tokio::time::sleep(pace).await,
                        }
                    }
                    match step.item {
                        Item::Event(item) => return Some((item, steps)),
                        Item::Boundary => {
                            let Some(input) = inputs.try_take() else {
                                continue;
                            };
                            // What the steered message adds is echoed next.
                            let mut next: VecDeque<Step> = reply(&input.message, chunks).collect();
                            next.push_back(Step {
                                paced: false,
                                item: Item::Boundary,
                            });
                            next.extend(steps);
                            let taken = RuntimeEvent::InputTaken { id: input.id };
                            return Some((Ok(taken), next));
                        }
                    }
                }
            }
        });
        Ok(stream.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(message: &str, options: serde_json::Value) -> RuntimeRequest {
        RuntimeRequest {
            run_id: "r1".into(),
            session_key: "agent:main:main".into(),
            session_id: "s".into(),
            message: message.into(),
            history: Vec::new(),
            options,
            deadline_ms: None,
            inputs: Default::default(),
            attachments: Vec::new(),
        }
    }

    #[test]
    fn chunks_cover_the_text() {
        assert_eq!(split_chunks("abcdefg", 3), vec!["abc", "def", "g"]);
        assert_eq!(split_chunks("héllo", 10).concat(), "héllo");
        assert!(split_chunks("", 3).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn streams_the_message_back() {
        let runtime = EchoRuntime::new(EchoConfig::default());
        let stream = runtime
            .execute(
                request("hello world", serde_json::json!({"chunks": 2})),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        let events: Vec<_> = stream.collect().await;
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                Ok(RuntimeEvent::AssistantDelta(d)) => Some(d.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "hello world");
        assert_eq!(
            events.last(),
            Some(&Ok(RuntimeEvent::Finished {
                stop_reason: "stop".into()
            }))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stops_when_cancelled_unless_told_to_ignore() {
        let runtime = EchoRuntime::new(EchoConfig::default());
        let cancel = CancellationToken::new();
        cancel.cancel();
        let stream = runtime
            .execute(request("abc", serde_json::json!({})), cancel.clone())
            .await
            .unwrap();
        assert!(stream.collect::<Vec<_>>().await.is_empty());
        let stream = runtime
            .execute(
                request("abc", serde_json::json!({"ignoreCancel": true})),
                cancel,
            )
            .await
            .unwrap();
        let events: Vec<_> = stream.collect().await;
        assert!(matches!(
            events.last(),
            Some(Ok(RuntimeEvent::Finished { .. }))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn fails_and_calls_tools_on_request() {
        let runtime = EchoRuntime::new(EchoConfig::default());
        let stream = runtime
            .execute(
                request(
                    "abcd",
                    serde_json::json!({"toolCall": true, "fail": "boom", "failKind": "rate_limit"}),
                ),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        let events: Vec<_> = stream.collect().await;
        assert!(matches!(events[0], Ok(RuntimeEvent::ToolStart { .. })));
        assert!(matches!(events[1], Ok(RuntimeEvent::ToolResult { .. })));
        assert!(matches!(events[2], Ok(RuntimeEvent::AssistantDelta(_))));
        let Err(err) = &events[3] else {
            panic!("{events:?}")
        };
        assert_eq!(err.kind, ErrorKind::RateLimit);
        assert_eq!(events.len(), 4);
    }
}
