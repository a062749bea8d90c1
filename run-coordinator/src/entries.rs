//! What a run writes to its session's transcript (its user turn, text
//! entries), the attachments as its runtime takes them, and what a store
//! refusal says of the session's writer.

use session_store_api::StoreError;
use session_store_api::model::{EntryMetadata, NewEntry};

/// The run no longer holds its session's writer slot (taken over, reset or
/// deleted): nothing it writes under its fence lands.
pub(crate) fn stale(err: &StoreError) -> bool {
    matches!(
        err,
        StoreError::StaleWriter { .. } | StoreError::SessionReplaced { .. }
    )
}

/// The run that holds the writer slot now, as a store refusal reports it.
pub(crate) fn current_writer(err: &StoreError) -> Option<String> {
    err.current_session()
        .and_then(|s| s.active_writer_run_id.clone())
}

/// A run's user turn: its text, then its attachments (images as `image`
/// parts, other files as `file` parts, each with its data).
pub(crate) fn user_entry(spec: &run_coordinator_api::model::RunSpec) -> NewEntry {
    let mut parts = Vec::new();
    if !spec.message.is_empty() {
        parts.push(serde_json::json!({ "type": "text", "text": spec.message }));
    }
    for attachment in &spec.attachments {
        let mut part = serde_json::json!({
            "type": if attachment.is_image() { "image" } else { "file" },
            "mimeType": attachment.mime_type, "data": attachment.data,
        });
        if !attachment.file_name.is_empty() {
            part["fileName"] = serde_json::json!(attachment.file_name);
        }
        parts.push(part);
    }
    text_entry(
        "user",
        serde_json::Value::Array(parts).to_string(),
        EntryMetadata::default(),
    )
}

/// The attachments of `runs`, decoded for the runtime (admission checked
/// the base64).
pub(crate) fn runtime_attachments<'a>(
    runs: impl Iterator<Item = &'a run_coordinator_api::model::RunSpec>,
) -> Vec<crate::runtime::Attachment> {
    use base64::Engine as _;
    runs.flat_map(|spec| spec.attachments.iter())
        .map(|a| crate::runtime::Attachment {
            mime_type: a.mime_type.clone(),
            file_name: a.file_name.clone(),
            data: base64::engine::general_purpose::STANDARD
                .decode(&a.data)
                .unwrap_or_default(),
        })
        .collect()
}

pub(crate) fn text_entry(role: &str, content_json: String, metadata: EntryMetadata) -> NewEntry {
    NewEntry {
        role: role.into(),
        content_json,
        timestamp_ms: None,
        metadata,
    }
}
