//! Size limits along the request path, set in this one place (see
//! docs/limits.md). Each is the default of a service's own setting; the
//! relations between them are checked at compile time below, so that a
//! request the outer hop accepts is never refused by a hop further in for
//! its size, only by the limit that is meant for it, with a clear message:
//!
//! ```text
//! WebSocket frame (edge)  ≤ gRPC message (edge → coordinator, → store)
//! message + options + attachments (coordinator)
//!                                 → store entry, store run payload,
//!                                    each ≥ their worst-case JSON encoding
//! store append, run payload        ≤ gRPC message
//! history page (store)             ≤ send buffer (edge) ≤ gRPC message
//! ```

/// One KiB, for readability.
const KIB: usize = 1024;
/// One MiB, for readability.
const MIB: usize = 1024 * KIB;

/// The largest WebSocket frame after the handshake (`EDGE_MAX_PAYLOAD`,
/// advertised as `hello-ok.policy.maxPayload`), as the OpenClaw gateway.
pub const EDGE_MAX_PAYLOAD: usize = 25 * MIB;

/// The largest frame before the handshake (`EDGE_PREAUTH_MAX_BYTES`).
pub const EDGE_PREAUTH_MAX_BYTES: usize = 64 * KIB;

/// The largest gRPC message every clawgate server and client accepts and
/// sends (the servers' `SESSION_STORE_GRPC_MAX_MESSAGE_BYTES` and
/// `COORDINATOR_GRPC_MAX_MESSAGE_BYTES`; the clients use this value). It
/// is a transport ceiling, never the limit a request meets first: it is
/// above anything the limits below let through.
pub const GRPC_MAX_MESSAGE_BYTES: usize = 64 * MIB;

/// The protobuf and JSON around a payload (field tags, ids, keys, the
/// members of a run request besides its message and options).
pub const ENVELOPE_BYTES: usize = 16 * KIB;

/// The largest message of a run, UTF-8 bytes (`COORDINATOR_MAX_MESSAGE_BYTES`).
pub const RUN_MAX_MESSAGE_BYTES: usize = MIB;

/// The most attachment bytes (decoded) one run may carry, all its
/// attachments together (`COORDINATOR_MAX_ATTACHMENT_BYTES`; the edge's
/// `EDGE_ATTACHMENT_MAX_BYTES`, advertised as `policy.attachments`).
pub const RUN_MAX_ATTACHMENT_BYTES: usize = 4 * MIB;

/// The most attachments one run may carry (`COORDINATOR_MAX_ATTACHMENTS`).
pub const RUN_MAX_ATTACHMENTS: usize = 8;

/// The longest MIME type and file name of an attachment, bytes.
pub const ATTACHMENT_MAX_MIME_BYTES: usize = 128;
pub const ATTACHMENT_MAX_NAME_BYTES: usize = 512;

/// What one attachment adds besides its data, at its worst-case JSON
/// encoding: its MIME type and file name, the keys around them.
const ATTACHMENT_ENVELOPE_BYTES: usize =
    JSON_EXPANSION * (ATTACHMENT_MAX_MIME_BYTES + ATTACHMENT_MAX_NAME_BYTES) + 256;

/// Attachments as stored (in a run's request and its user turn): the data
/// as base64, plus each one's envelope.
pub const fn attachments_bytes_needed(max_bytes: usize, max_count: usize) -> usize {
    max_bytes
        .div_ceil(3)
        .saturating_mul(4)
        .saturating_add(max_count.saturating_mul(ATTACHMENT_ENVELOPE_BYTES))
}

/// The largest runtime options object of a run, as JSON
/// (`COORDINATOR_MAX_OPTIONS_BYTES`).
pub const RUN_MAX_OPTIONS_BYTES: usize = 64 * KIB;

/// The longest run label, characters (`COORDINATOR_MAX_LABEL_CHARS`).
pub const RUN_MAX_LABEL_CHARS: usize = 512;

/// The longest requester of a run, characters
/// (`COORDINATOR_MAX_REQUESTER_CHARS`).
pub const RUN_MAX_REQUESTER_CHARS: usize = 256;

/// How much larger a string can get as a JSON string: a control character
/// (one byte) is written `\u00XX` (six).
pub const JSON_EXPANSION: usize = 6;

/// Bytes of UTF-8 per character at most.
const UTF8_MAX: usize = 4;

/// The largest transcript entry (`SESSION_STORE_MAX_ENTRY_BYTES`): a user
/// turn holds the run's message as a JSON string, whatever its characters.
pub const STORE_MAX_ENTRY_BYTES: usize = entry_bytes_needed(
    RUN_MAX_MESSAGE_BYTES,
    RUN_MAX_ATTACHMENT_BYTES,
    RUN_MAX_ATTACHMENTS,
);

/// The largest Append, all entries together (`SESSION_STORE_MAX_APPEND_BYTES`).
pub const STORE_MAX_APPEND_BYTES: usize = 2 * STORE_MAX_ENTRY_BYTES;

/// The largest `request_json` / `outcome_json` of a run record
/// (`SESSION_STORE_MAX_RUN_PAYLOAD_BYTES`): a run's request as JSON, its
/// message, label and requester each at their worst-case encoding.
pub const STORE_MAX_RUN_PAYLOAD_BYTES: usize =
    run_payload_bytes_needed(
        RUN_MAX_MESSAGE_BYTES,
        RUN_MAX_OPTIONS_BYTES,
        RUN_MAX_LABEL_CHARS,
        RUN_MAX_REQUESTER_CHARS,
    ) + attachments_bytes_needed(RUN_MAX_ATTACHMENT_BYTES, RUN_MAX_ATTACHMENTS);

/// The most characters of one History page, counted in the entries' stored
/// JSON (`SESSION_STORE_MAX_HISTORY_CHARS`). A page holds at least one entry
/// whatever its size, so a page is at most this many characters plus one
/// entry; it must fit the edge's send buffer as a `chat.history` answer.
pub const STORE_MAX_HISTORY_CHARS: usize = 2_000_000;

/// A connection's send buffer at the edge (`EDGE_MAX_BUFFERED_BYTES`,
/// advertised as `hello-ok.policy.maxBufferedBytes`): the largest answer
/// frame must fit in it.
pub const EDGE_MAX_BUFFERED_BYTES: usize = 32 * MIB;

// The relations the module comment states, for the defaults.
const _: () = {
    assert!(EDGE_PREAUTH_MAX_BYTES <= EDGE_MAX_PAYLOAD);
    assert!(EDGE_MAX_PAYLOAD + ENVELOPE_BYTES <= GRPC_MAX_MESSAGE_BYTES);
    assert!(
        submit_bytes_needed(
            RUN_MAX_MESSAGE_BYTES,
            RUN_MAX_OPTIONS_BYTES,
            RUN_MAX_LABEL_CHARS,
            RUN_MAX_REQUESTER_CHARS
        ) + RUN_MAX_ATTACHMENT_BYTES
            + RUN_MAX_ATTACHMENTS * ENVELOPE_BYTES
            <= GRPC_MAX_MESSAGE_BYTES
    );
    assert!(RUN_MAX_ATTACHMENT_BYTES.div_ceil(3) * 4 + ENVELOPE_BYTES <= EDGE_MAX_PAYLOAD);
    assert!(STORE_MAX_ENTRY_BYTES <= STORE_MAX_APPEND_BYTES);
    assert!(STORE_MAX_APPEND_BYTES + ENVELOPE_BYTES <= GRPC_MAX_MESSAGE_BYTES);
    assert!(STORE_MAX_RUN_PAYLOAD_BYTES + ENVELOPE_BYTES <= GRPC_MAX_MESSAGE_BYTES);
    assert!(
        UTF8_MAX * STORE_MAX_HISTORY_CHARS + STORE_MAX_ENTRY_BYTES + ENVELOPE_BYTES
            <= EDGE_MAX_BUFFERED_BYTES
    );
    assert!(EDGE_MAX_BUFFERED_BYTES <= GRPC_MAX_MESSAGE_BYTES);
};

/// The `request_json` a run's request needs at most, for given limits of
/// the coordinator (the store's `max_run_payload_bytes` must be at least
/// this).
pub const fn run_payload_bytes_needed(
    max_message_bytes: usize,
    max_options_bytes: usize,
    max_label_chars: usize,
    max_requester_chars: usize,
) -> usize {
    JSON_EXPANSION
        .saturating_mul(max_message_bytes.saturating_add(
            UTF8_MAX.saturating_mul(max_label_chars.saturating_add(max_requester_chars)),
        ))
        .saturating_add(max_options_bytes)
        .saturating_add(ENVELOPE_BYTES)
}

/// The gRPC `Submit` a coordinator with these limits accepts at most
/// (protobuf carries strings as they are: no expansion, four bytes a
/// character at most); its gRPC message limit must be at least this.
pub const fn submit_bytes_needed(
    max_message_bytes: usize,
    max_options_bytes: usize,
    max_label_chars: usize,
    max_requester_chars: usize,
) -> usize {
    max_message_bytes
        .saturating_add(max_options_bytes)
        .saturating_add(
            UTF8_MAX.saturating_mul(max_label_chars.saturating_add(max_requester_chars)),
        )
        .saturating_add(ENVELOPE_BYTES)
}

/// The transcript entry a run's user turn needs at most, for given
/// coordinator message and attachment limits (the store's `max_entry_bytes`
/// must be at least this).
pub const fn entry_bytes_needed(
    max_message_bytes: usize,
    max_attachment_bytes: usize,
    max_attachments: usize,
) -> usize {
    JSON_EXPANSION
        .saturating_mul(max_message_bytes)
        .saturating_add(attachments_bytes_needed(
            max_attachment_bytes,
            max_attachments,
        ))
        .saturating_add(ENVELOPE_BYTES)
}
