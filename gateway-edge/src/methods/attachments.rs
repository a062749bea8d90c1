//! The `attachments` of `chat.send`, `agent` and `sessions.create`: files
//! sent with a message, as the Control UI sends them (`{type, mimeType,
//! fileName, content}` with the bytes in base64, or as a `data:` URL), for
//! the run's runtime (`policy.attachments` advertises the limit). They are
//! decoded here to check them and count their bytes.

use base64::Engine as _;
use run_coordinator_api::model::Attachment;
use serde_json::Value;

use super::fail;
use crate::protocol::frames::ErrorShape;
use crate::protocol::params::Params;
use crate::state::Edge;

type Refusal = (ErrorShape, Option<Value>);

fn invalid(method: &str, index: usize, why: &str) -> Refusal {
    fail(ErrorShape::invalid(format!(
        "invalid {method} params: /attachments/{index} {why}"
    )))
}

/// The attachments in `params` (none when absent), decoded and within
/// `--attachment-max-bytes` together.
pub(super) fn parse(edge: &Edge, p: &Params<'_>) -> Result<Vec<Attachment>, Refusal> {
    let method = p.method();
    let items = match p.raw("attachments") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(fail(ErrorShape::invalid(format!(
                "invalid {method} params: /attachments must be array"
            ))));
        }
    };
    let mut attachments = Vec::with_capacity(items.len());
    let mut total = 0usize;
    for (index, item) in items.iter().enumerate() {
        let Value::Object(item) = item else {
            return Err(invalid(method, index, "must be object"));
        };
        let text = |key: &str| item.get(key).and_then(Value::as_str);
        let content = text("content")
            .or(text("data"))
            .ok_or_else(|| invalid(method, index, "must have its bytes in 'content' (base64)"))?;
        // A `data:<mime>;base64,` URL carries its own MIME type.
        let (url_mime, encoded) = match content
            .strip_prefix("data:")
            .and_then(|rest| rest.split_once(";base64,"))
        {
            Some((mime, data)) => (Some(mime), data),
            None => (None, content),
        };
        let mime_type = text("mimeType")
            .or(url_mime)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| invalid(method, index, "must have a mimeType"))?;
        let data = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|e| invalid(method, index, &format!("content is not base64: {e}")))?;
        total = total.saturating_add(data.len());
        if total > edge.config.attachment_max_bytes {
            return Err(fail(
                ErrorShape::invalid(format!(
                    "attachments are larger than {} bytes together (EDGE_ATTACHMENT_MAX_BYTES)",
                    edge.config.attachment_max_bytes
                ))
                .with_details(serde_json::json!({ "code": "ATTACHMENTS_TOO_LARGE" })),
            ));
        }
        attachments.push(Attachment {
            mime_type: mime_type.to_owned(),
            file_name: text("fileName").unwrap_or_default().to_owned(),
            // In the standard alphabet, padded, whichever the client sent.
            data: base64::engine::general_purpose::STANDARD.encode(data),
        });
    }
    Ok(attachments)
}
