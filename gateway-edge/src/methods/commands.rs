//! Slash commands a client sends as the text of `chat.send`: `/stop`,
//! `/new`, `/reset` and `/queue`, interpreted with the protocol's scope
//! rules (`/new` and `/reset` replace the transcript: admin) unless the send
//! sets `suppressCommandInterpretation`. Any other text, `/`-led or not, is
//! a message for the model. `commands.list` lists these (`catalog.rs`).

use serde_json::{Value, json};
use session_store_api::model::PatchSession;
use session_store_api::{SessionKey, SessionStore};

use super::chat::{Turn, start_turn};
use super::{Answer, Call, fail, store_error};
use crate::auth::scopes::{ADMIN, Access, WRITE, authorize};
use crate::config::QueueMode;
use crate::protocol::frames::ErrorShape;
use crate::protocol::params::Params;

/// A command found in a message.
pub(super) enum Command<'a> {
    Stop,
    /// `/new` or `/reset`, with the text of a first turn after it.
    Reset {
        reason: &'static str,
        then: &'a str,
    },
    /// `/queue <mode>`; `None`: back to the gateway's default.
    Queue(Option<QueueMode>),
}

/// The command `message` is, if it is one.
pub(super) fn parse(message: &str) -> Result<Option<Command<'_>>, ErrorShape> {
    let text = message.trim();
    let Some(rest) = text.strip_prefix('/') else {
        return Ok(None);
    };
    let (name, args) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(n, a)| (n, a.trim()));
    Ok(Some(match name.to_ascii_lowercase().as_str() {
        "stop" | "abort" if args.is_empty() => Command::Stop,
        "new" => Command::Reset {
            reason: "new",
            then: args,
        },
        "reset" => Command::Reset {
            reason: "reset",
            then: args,
        },
        "queue" => match args.to_ascii_lowercase().as_str() {
            "default" | "reset" => Command::Queue(None),
            mode => match <QueueMode as clap::ValueEnum>::from_str(mode, true) {
                Ok(mode) => Command::Queue(Some(mode)),
                Err(_) => {
                    return Err(ErrorShape::invalid(format!(
                        "/queue takes one of: {}, default",
                        QueueMode::NAMES.join(", ")
                    )));
                }
            },
        },
        _ => return Ok(None),
    }))
}

/// Runs `command`, sent to `session` under the idempotency key `run_id`.
pub(super) async fn run(
    call: &Call<'_>,
    session: &SessionKey,
    run_id: &str,
    command: Command<'_>,
) -> Answer {
    let (edge, conn) = (call.edge, call.conn);
    let required = match command {
        Command::Reset { .. } => ADMIN,
        Command::Stop | Command::Queue(_) => WRITE,
    };
    authorize(Access::Operator(required), &conn.role, &conn.scopes).map_err(fail)?;
    match command {
        Command::Stop => {
            let mut aborted = super::chat::abort(edge, conn, session, None).await?;
            aborted["runId"] = json!(run_id);
            aborted["status"] = json!("ok");
            Ok(aborted)
        }
        Command::Queue(mode) => {
            let patch = json!({ "queueMode": mode.map(QueueMode::as_str) });
            edge.backends
                .store
                .patch_session(PatchSession {
                    key: session.clone(),
                    patch_json: patch.to_string(),
                    create: true,
                })
                .await
                .map_err(store_error)?;
            let effective = mode.unwrap_or(edge.config.default_queue_mode);
            Ok(json!({ "runId": run_id, "status": "ok", "queueMode": effective.as_str() }))
        }
        Command::Reset { reason, then } => {
            let reset = super::sessions::reset_session(edge, session, reason).await?;
            super::sessions::changed_after_reply(
                call,
                session,
                Some(reset.session_id.to_string()),
                reason,
            );
            if then.is_empty() {
                return Ok(json!({ "runId": run_id, "status": "ok" }));
            }
            // The text after the command is the new transcript's first turn.
            let turn = Turn {
                session,
                run_id,
                message: then,
                queue_mode: None,
                timeout_ms: 0,
                attachments: Vec::new(),
            };
            start_turn(call, turn).await
        }
    }
}

/// Whether a send's text is to be read as a command.
pub(super) fn interpreted(params: &Params<'_>) -> bool {
    params.raw("suppressCommandInterpretation") != Some(&Value::Bool(true))
}
