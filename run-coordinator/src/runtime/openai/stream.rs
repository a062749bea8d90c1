//! The response read as a stream of chunks (or one whole completion):
//! the SSE parser and the turn it builds up (the mapping in the module's
//! doc).

use super::*;

/// Splits a byte stream into SSE events and returns their `data`.
#[derive(Debug, Default)]
pub(super) struct SseParser {
    pub(super) line: Vec<u8>,
    pub(super) data: String,
    pub(super) has_data: bool,
    /// The last byte was `\r`: a `\n` right after it ends no new line.
    pub(super) after_cr: bool,
}

impl SseParser {
    pub(super) fn feed(&mut self, bytes: &[u8], out: &mut Vec<String>) {
        for &byte in bytes {
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\n' => self.end_line(out),
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(out);
                }
                _ => self.line.push(byte),
            }
        }
    }

    /// The body ended: a last event without its blank line still counts.
    pub(super) fn finish(&mut self, out: &mut Vec<String>) {
        if !self.line.is_empty() {
            self.end_line(out);
        }
        self.dispatch(out);
    }

    pub(super) fn end_line(&mut self, out: &mut Vec<String>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let line = String::from_utf8_lossy(&line);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        if field == "data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
    }

    pub(super) fn dispatch(&mut self, out: &mut Vec<String>) {
        if self.has_data {
            out.push(std::mem::take(&mut self.data));
            self.has_data = false;
        }
    }
}

/// What to do after a payload.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    /// The turn is complete; stop reading.
    Done,
}

#[derive(Debug, Default)]
pub(super) struct ToolCall {
    pub(super) id: Option<String>,
    pub(super) name: Option<String>,
    /// Arguments received before the call was started.
    pub(super) pending_arguments: String,
    pub(super) started: bool,
}

/// One attempt's view of the turn, fed chunk by chunk.
#[derive(Debug)]
pub(super) struct Turn {
    pub(super) model: String,
    pub(super) run_id: String,
    pub(super) tools: BTreeMap<u64, ToolCall>,
    pub(super) finish_reason: Option<String>,
    pub(super) usage: Option<Usage>,
    pub(super) refusal: String,
}

impl Turn {
    pub(super) fn new(model: &str, run_id: &str) -> Self {
        Self {
            model: model.to_owned(),
            run_id: run_id.to_owned(),
            tools: BTreeMap::new(),
            finish_reason: None,
            usage: None,
            refusal: String::new(),
        }
    }

    /// Handles one SSE `data` payload.
    pub(super) fn on_payload(
        &mut self,
        payload: &str,
        out: &mut Vec<RuntimeEvent>,
    ) -> Result<Flow, RuntimeError> {
        let payload = payload.trim();
        if payload.is_empty() {
            return Ok(Flow::Continue);
        }
        if payload == "[DONE]" {
            return Ok(Flow::Done);
        }
        match serde_json::from_str::<Value>(payload) {
            Ok(chunk) => self.on_chunk(&chunk, out),
            Err(_) if payload.contains('\n') => {
                for line in payload.lines() {
                    if self.on_payload(line, out)? == Flow::Done {
                        return Ok(Flow::Done);
                    }
                }
                Ok(Flow::Continue)
            }
            Err(e) => {
                clawgate_telemetry::limited!(
                    warn,
                    run_id = %self.run_id,
                    model = %self.model,
                    error = %e,
                    payload = %truncate(payload, 200),
                    "ignoring an SSE payload that is not JSON"
                );
                Ok(Flow::Continue)
            }
        }
    }

    /// Handles a whole (non-streamed) completion: each choice's `message`
    /// is read as if it were one delta.
    pub(super) fn on_completion(
        &mut self,
        completion: &Value,
        out: &mut Vec<RuntimeEvent>,
    ) -> Result<(), RuntimeError> {
        let mut chunk = completion.clone();
        if let Some(choices) = chunk.get_mut("choices").and_then(Value::as_array_mut) {
            for choice in choices {
                if let Some(choice) = choice.as_object_mut()
                    && let Some(message) = choice.remove("message")
                {
                    choice.insert("delta".into(), message);
                }
            }
        }
        self.on_chunk(&chunk, out).map(drop)
    }

    pub(super) fn on_chunk(
        &mut self,
        chunk: &Value,
        out: &mut Vec<RuntimeEvent>,
    ) -> Result<Flow, RuntimeError> {
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(classify_stream_error(error, &self.model));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(parse_usage(usage));
        }
        let choice = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|choices| {
                choices
                    .iter()
                    .find(|c| c.get("index").and_then(Value::as_u64) == Some(0))
                    .or_else(|| choices.first())
            });
        if let Some(choice) = choice {
            if let Some(delta) = choice.get("delta").filter(|d| d.is_object()) {
                if let Some(text) = delta.get("content").and_then(Value::as_str)
                    && !text.is_empty()
                {
                    out.push(RuntimeEvent::AssistantDelta(text.to_owned()));
                }
                if let Some(refusal) = delta.get("refusal").and_then(Value::as_str) {
                    self.refusal.push_str(refusal);
                }
                if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                    for (position, call) in calls.iter().enumerate() {
                        self.on_tool_call(position, call, out);
                    }
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str)
                && !reason.is_empty()
            {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        if self.finish_reason.is_some() && self.usage.is_some() {
            return Ok(Flow::Done);
        }
        Ok(Flow::Continue)
    }

    /// One entry of `delta.tool_calls`; `position` stands in for a
    /// missing `index`.
    pub(super) fn on_tool_call(
        &mut self,
        position: usize,
        call: &Value,
        out: &mut Vec<RuntimeEvent>,
    ) {
        fn text(v: Option<&Value>) -> Option<&str> {
            v.and_then(Value::as_str).filter(|s| !s.is_empty())
        }
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position as u64);
        let function = call.get("function");
        let tool = self.tools.entry(index).or_default();
        if tool.id.is_none() {
            tool.id = text(call.get("id")).map(str::to_owned);
        }
        if tool.name.is_none() {
            tool.name = text(function.and_then(|f| f.get("name"))).map(str::to_owned);
        }
        let fragment = text(function.and_then(|f| f.get("arguments")));
        if tool.started {
            if let (Some(fragment), Some(id)) = (fragment, &tool.id) {
                out.push(RuntimeEvent::ToolUpdate {
                    tool_call_id: id.clone(),
                    partial_json: fragment.to_owned(),
                });
            }
            return;
        }
        if let Some(fragment) = fragment {
            tool.pending_arguments.push_str(fragment);
        }
        if let (Some(id), Some(name)) = (&tool.id, &tool.name) {
            tool.started = true;
            out.push(RuntimeEvent::ToolStart {
                tool_call_id: id.clone(),
                name: name.clone(),
                arguments_json: std::mem::take(&mut tool.pending_arguments),
            });
        }
    }

    /// The turn is over: the closing events, or why it failed.
    pub(super) fn finish(&mut self, out: &mut Vec<RuntimeEvent>) -> Result<(), RuntimeError> {
        if !self.refusal.is_empty() {
            return Err(RuntimeError::new(
                ErrorKind::Refusal,
                format!(
                    "{}: the model refused: {}",
                    self.model,
                    truncate(&self.refusal, ERROR_MESSAGE_LIMIT)
                ),
                false,
            ));
        }
        if self.finish_reason.as_deref() == Some("content_filter") {
            return Err(RuntimeError::new(
                ErrorKind::Refusal,
                format!(
                    "{}: the response was stopped by the content filter",
                    self.model
                ),
                false,
            ));
        }
        for (index, tool) in &mut self.tools {
            if tool.started {
                continue;
            }
            let Some(name) = tool.name.clone() else {
                clawgate_telemetry::limited!(warn, run_id = %self.run_id, index, "dropping a tool call that has no name");
                continue;
            };
            let id = tool
                .id
                .clone()
                .unwrap_or_else(|| format!("{}-call-{index}", self.run_id));
            tool.started = true;
            out.push(RuntimeEvent::ToolStart {
                tool_call_id: id,
                name,
                arguments_json: std::mem::take(&mut tool.pending_arguments),
            });
        }
        if let Some(usage) = self.usage.take() {
            out.push(RuntimeEvent::Usage(usage));
        }
        let stop_reason = match self.finish_reason.as_deref() {
            None => "stop",
            Some("function_call") => "tool_calls",
            Some(other) => other,
        };
        out.push(RuntimeEvent::Finished {
            stop_reason: stop_reason.to_owned(),
        });
        Ok(())
    }
}

pub(super) fn parse_usage(usage: &Value) -> Usage {
    let count = |key: &str| usage.get(key).and_then(Value::as_u64);
    let input_tokens = count("prompt_tokens")
        .or_else(|| count("input_tokens"))
        .unwrap_or(0);
    let output_tokens = count("completion_tokens")
        .or_else(|| count("output_tokens"))
        .unwrap_or(0);
    let total_tokens = count("total_tokens").unwrap_or(input_tokens + output_tokens);
    Usage {
        input_tokens,
        output_tokens,
        total_tokens,
    }
}
