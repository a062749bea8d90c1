//! The task that runs a turn's completions: attempts, retries and
//! fallback models, and one more completion for each steered message.

use super::*;

/// How one attempt ended.
pub(super) enum Outcome {
    /// The turn finished (successfully or with an error already sent).
    Done,
    /// Cancelled, or the stream was dropped.
    Stopped,
    Failed(Failure),
}

pub(super) struct Failure {
    pub(super) error: RuntimeError,
    /// Whether any event of this attempt reached the caller.
    pub(super) emitted: bool,
    pub(super) retry_after: Option<Duration>,
}

impl Outcome {
    pub(super) fn failed(error: RuntimeError, emitted: bool) -> Self {
        Self::Failed(Failure {
            error,
            emitted,
            retry_after: None,
        })
    }
}

/// The spawned task of one run.
pub(super) struct Driver {
    pub(super) client: reqwest::Client,
    pub(super) config: Arc<OpenAiConfig>,
    pub(super) url: String,
    pub(super) auth: Option<HeaderValue>,
    /// The request body without `model`.
    pub(super) body: Map<String, Value>,
    pub(super) run_id: String,
    pub(super) tx: mpsc::Sender<Result<RuntimeEvent, RuntimeError>>,
    pub(super) stop: CancellationToken,
    /// Messages steered into the run.
    pub(super) inputs: Inputs,
    /// The turn's text so far, and a steered message taken at its end.
    pub(super) steer: std::sync::Mutex<Steer>,
}

#[derive(Default)]
pub(super) struct Steer {
    pub(super) text: String,
    pub(super) taken: Option<SteerInput>,
}

/// How the model chain ended.
pub(super) enum ChainEnd {
    /// Finished, failed or stopped: nothing more to do.
    Over,
    /// A completion ended where a steered message was waiting: it is taken,
    /// and the next completion answers it.
    Steered(SteerInput),
}

impl Driver {
    /// Completions until the turn ends: one, and one more for each message
    /// steered in, taken when a completion finishes with `stop` (the model
    /// boundary; a turn that ends in tool calls hands them to the caller).
    pub(super) async fn run(mut self, models: Vec<String>) {
        while let ChainEnd::Steered(input) = self.run_chain(&models).await {
            if !self
                .send(Ok(RuntimeEvent::InputTaken { id: input.id }))
                .await
            {
                return;
            }
            let answer = std::mem::take(&mut self.steer.lock().unwrap().text);
            if let Some(Value::Array(messages)) = self.body.get_mut("messages") {
                messages.push(json!({ "role": "assistant", "content": answer }));
                messages.push(json!({ "role": "user", "content": input.message }));
            }
        }
    }

    pub(super) async fn run_chain(&self, models: &[String]) -> ChainEnd {
        let mut last_error = None;
        let mut attempts = 0u32;
        for model in models {
            let mut retry = 0u32;
            loop {
                attempts += 1;
                let failure = match self.attempt(model).await {
                    Outcome::Done => {
                        return match self.steer.lock().unwrap().taken.take() {
                            Some(input) => ChainEnd::Steered(input),
                            None => ChainEnd::Over,
                        };
                    }
                    Outcome::Stopped => return ChainEnd::Over,
                    Outcome::Failed(failure) => failure,
                };
                if failure.emitted || !failure.error.retryable {
                    self.send(Err(failure.error)).await;
                    return ChainEnd::Over;
                }
                if retry >= self.config.max_retries {
                    clawgate_telemetry::limited!(
                        warn,
                        run_id = %self.run_id,
                        model = %model,
                        error = %failure.error,
                        "giving up on the model"
                    );
                    last_error = Some(failure.error);
                    break;
                }
                let delay = backoff_delay(&self.config, retry, failure.retry_after);
                clawgate_telemetry::limited!(
                        warn,
                    run_id = %self.run_id,
                    model = %model,
                    retry = retry + 1,
                    delay_ms = delay.as_millis() as u64,
                    error = %failure.error,
                    "retrying"
                );
                retry += 1;
                tokio::select! {
                    biased;
                    () = self.stop.cancelled() => return ChainEnd::Over,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
        if let Some(mut error) = last_error {
            let _ = write!(
                error.message,
                " (gave up after {attempts} attempts with {} model{})",
                models.len(),
                if models.len() == 1 { "" } else { "s" }
            );
            self.send(Err(error)).await;
        }
        ChainEnd::Over
    }

    /// Sends one item; false when the caller is gone or cancelled.
    pub(super) async fn send(&self, item: Result<RuntimeEvent, RuntimeError>) -> bool {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => false,
            sent = self.tx.send(item) => sent.is_ok(),
        }
    }

    pub(super) async fn attempt(&self, model: &str) -> Outcome {
        let mut body = self.body.clone();
        body.insert("model".into(), Value::String(model.to_owned()));
        let mut request = self
            .client
            .post(&self.url)
            .header(ACCEPT, "text/event-stream")
            .json(&body);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        let timeout = self.config.request_timeout;
        let response = tokio::select! {
            biased;
            () = self.stop.cancelled() => return Outcome::Stopped,
            response = tokio::time::timeout(timeout, request.send()) => response,
        };
        let response = match response {
            Err(_) => {
                let message = format!("{model}: no response within {timeout:?}");
                return Outcome::failed(
                    RuntimeError::new(ErrorKind::Timeout, message, true),
                    false,
                );
            }
            Ok(Err(e)) => {
                let kind = if e.is_timeout() {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Unknown
                };
                let message = format!("{model}: request failed: {}", error_chain(&e));
                return Outcome::failed(RuntimeError::new(kind, message, true), false);
            }
            Ok(Ok(response)) => response,
        };

        let status = response.status();
        if !status.is_success() {
            let retry_after = retry_after(response.headers());
            let Some((body, _)) = self.read_body(response, ERROR_BODY_LIMIT).await else {
                return Outcome::Stopped;
            };
            let body = String::from_utf8_lossy(&body);
            return Outcome::Failed(Failure {
                error: classify_http(status, &body, model),
                emitted: false,
                retry_after,
            });
        }

        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        if is_json {
            self.read_whole(model, response).await
        } else {
            self.read_stream(model, response).await
        }
    }

    /// Reads an SSE body, sending events as they come.
    pub(super) async fn read_stream(
        &self,
        model: &str,
        mut response: reqwest::Response,
    ) -> Outcome {
        let idle = self.config.idle_timeout;
        let mut parser = SseParser::default();
        let mut turn = Turn::new(model, &self.run_id);
        let mut payloads = Vec::new();
        let mut events = Vec::new();
        let mut emitted = false;
        loop {
            let read = tokio::select! {
                biased;
                () = self.stop.cancelled() => return Outcome::Stopped,
                read = tokio::time::timeout(idle, response.chunk()) => read,
            };
            let mut ended = false;
            match read {
                Ok(Ok(Some(bytes))) => parser.feed(&bytes, &mut payloads),
                Ok(Ok(None)) => {
                    parser.finish(&mut payloads);
                    ended = true;
                }
                // After the finish reason the turn is complete; a server
                // that then stalls or drops the connection changes nothing.
                _ if turn.finish_reason.is_some() => ended = true,
                Err(_) => {
                    let message = format!("{model}: the stream was idle for {idle:?}");
                    let error = RuntimeError::new(ErrorKind::Timeout, message, true);
                    return Outcome::failed(error, emitted);
                }
                Ok(Err(e)) => {
                    let message = format!("{model}: the stream broke: {}", error_chain(&e));
                    let error = RuntimeError::new(ErrorKind::Unknown, message, true);
                    return Outcome::failed(error, emitted);
                }
            }

            let mut done = false;
            let mut failure = None;
            for payload in payloads.drain(..) {
                match turn.on_payload(&payload, &mut events) {
                    Ok(Flow::Continue) => {}
                    Ok(Flow::Done) => {
                        done = true;
                        break;
                    }
                    Err(error) => {
                        failure = Some(error);
                        break;
                    }
                }
            }
            if failure.is_none() && (done || ended) {
                if done || turn.finish_reason.is_some() || !turn.refusal.is_empty() {
                    failure = turn.finish(&mut events).err();
                } else {
                    failure = Some(RuntimeError::new(
                        ErrorKind::Unknown,
                        format!("{model}: the stream ended before the turn finished"),
                        true,
                    ));
                }
            }
            if !self.deliver(&mut events, &mut emitted).await {
                return Outcome::Stopped;
            }
            if let Some(error) = failure {
                return Outcome::failed(error, emitted);
            }
            if done || ended {
                return Outcome::Done;
            }
        }
    }

    /// Reads a plain JSON completion, from a server that ignored `stream`.
    pub(super) async fn read_whole(&self, model: &str, response: reqwest::Response) -> Outcome {
        let Some((body, problem)) = self.read_body(response, WHOLE_BODY_LIMIT).await else {
            return Outcome::Stopped;
        };
        let completion = match serde_json::from_slice::<Value>(&body) {
            Ok(completion) => completion,
            Err(e) => {
                let why = problem.unwrap_or_else(|| e.to_string());
                let message = format!("{model}: unreadable JSON response: {why}");
                let error = RuntimeError::new(ErrorKind::Unknown, message, true);
                return Outcome::failed(error, false);
            }
        };
        let mut turn = Turn::new(model, &self.run_id);
        let mut events = Vec::new();
        let result = turn
            .on_completion(&completion, &mut events)
            .and_then(|()| turn.finish(&mut events));
        let mut emitted = false;
        if !self.deliver(&mut events, &mut emitted).await {
            return Outcome::Stopped;
        }
        match result {
            Ok(()) => Outcome::Done,
            Err(error) => Outcome::failed(error, emitted),
        }
    }

    /// Sends `events` in order; false when stopped.
    pub(super) async fn deliver(&self, events: &mut Vec<RuntimeEvent>, emitted: &mut bool) -> bool {
        for event in events.drain(..) {
            match &event {
                // The model boundary: a steered message waiting there is
                // answered by one more completion instead of the turn ending.
                RuntimeEvent::Finished { stop_reason } if stop_reason == "stop" => {
                    if let Some(input) = self.inputs.try_take() {
                        self.steer.lock().unwrap().taken = Some(input);
                        continue;
                    }
                }
                RuntimeEvent::AssistantDelta(text) => {
                    self.steer.lock().unwrap().text.push_str(text);
                }
                _ => {}
            }
            if !self.send(Ok(event)).await {
                return false;
            }
            *emitted = true;
        }
        true
    }

    /// Reads up to `limit` bytes of a body, within the request timeout, and
    /// says what stopped the read early, if anything; `None` when stopped.
    pub(super) async fn read_body(
        &self,
        mut response: reqwest::Response,
        limit: usize,
    ) -> Option<(Vec<u8>, Option<String>)> {
        let mut body = Vec::new();
        let mut problem = None;
        let read = async {
            while body.len() < limit {
                match response.chunk().await {
                    Ok(Some(bytes)) => body.extend_from_slice(&bytes),
                    Ok(None) => return,
                    Err(e) => {
                        problem = Some(error_chain(&e));
                        return;
                    }
                }
            }
            problem = Some(format!("the body is larger than {limit} bytes"));
        };
        let timeout = self.config.request_timeout;
        tokio::select! {
            biased;
            () = self.stop.cancelled() => return None,
            read = tokio::time::timeout(timeout, read) => {
                if read.is_err() {
                    problem = Some(format!("the body took longer than {timeout:?}"));
                }
            }
        }
        body.truncate(limit);
        Some((body, problem))
    }
}
