//! The `connect` handshake: closed-schema validation of the params, protocol
//! negotiation, role, shared-secret auth, device identity, effective scopes,
//! and the `hello-ok` payload. Every rejection carries the protocol's
//! message, `details` and close code.

use serde_json::{Map, Value, json};

use super::scopes::KNOWN_SCOPES;
use crate::protocol::frames::ErrorShape;

pub const PROTOCOL_VERSION: u64 = 4;
pub const MIN_PROBE_PROTOCOL: u64 = 3;
pub const MIN_NODE_PROTOCOL: u64 = 3;

const CLIENT_IDS: &[&str] = &[
    "webchat-ui",
    "openclaw-control-ui",
    "openclaw-browser-copilot",
    "webchat",
    "cli",
    "gateway-client",
    "openclaw-macos",
    "openclaw-linux",
    "openclaw-ios",
    "openclaw-android",
    "node-host",
    "test",
    "fingerprint",
    "openclaw-probe",
    "openclaw-tui",
    "openclaw-watchos",
    "openclaw-worker",
];
const CLIENT_MODES: &[&str] = &[
    "webchat", "cli", "ui", "backend", "node", "probe", "test", "worker",
];
const PARAM_KEYS: &[&str] = &[
    "minProtocol",
    "maxProtocol",
    "client",
    "caps",
    "commands",
    "computerUse",
    "workerRuns",
    "modelCatalog",
    "permissions",
    "pathEnv",
    "role",
    "scopes",
    "device",
    "auth",
    "locale",
    "userAgent",
];
const CLIENT_KEYS: &[&str] = &[
    "id",
    "displayName",
    "version",
    "buildId",
    "platform",
    "deviceFamily",
    "modelIdentifier",
    "timeZone",
    "mode",
    "instanceId",
];
/// The two shapes of `modelCatalog` (a session's catalog, or one named by
/// a short id); either is closed.
const MODEL_CATALOG_KEYS: &[&str] = &["agentId", "sessionKey"];
const MODEL_CATALOG_SHORT_ID_KEYS: &[&str] = &["agentId", "shortId", "slugHint"];
const DEVICE_KEYS: &[&str] = &["id", "publicKey", "signature", "signedAt", "nonce"];
const AUTH_KEYS: &[&str] = &[
    "token",
    "bootstrapToken",
    "deviceToken",
    "password",
    "approvalRuntimeToken",
    "agentRuntimeIdentityToken",
];

/// A rejected handshake: the error for the `res`, and the close frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub error: ErrorShape,
    pub close_code: u16,
    pub close_reason: String,
}

impl Rejection {
    /// A 1008 close whose reason is the message (≤ 120 bytes, on a char boundary).
    pub fn policy(error: ErrorShape) -> Self {
        let reason = truncate_utf8(&error.message, 120);
        Self {
            error,
            close_code: 1008,
            close_reason: reason,
        }
    }
}

pub fn truncate_utf8(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[derive(Debug, Clone)]
pub struct DeviceBlock {
    pub id: String,
    pub public_key: String,
    pub signature: String,
    pub signed_at: i64,
    pub nonce: String,
}

/// Validated `connect` params.
#[derive(Debug, Clone)]
pub struct ConnectParams {
    pub min_protocol: u64,
    pub max_protocol: u64,
    pub client_id: String,
    pub client_mode: String,
    pub client_version: String,
    pub platform: String,
    pub device_family: Option<String>,
    pub display_name: Option<String>,
    pub instance_id: Option<String>,
    pub caps: Vec<String>,
    pub role: String,
    pub scopes: Vec<String>,
    pub device: Option<DeviceBlock>,
    pub auth: Map<String, Value>,
}

impl ConnectParams {
    pub fn auth_str(&self, key: &str) -> Option<&str> {
        self.auth.get(key).and_then(Value::as_str)
    }
}

fn invalid_params(reason: impl std::fmt::Display) -> Rejection {
    Rejection::policy(ErrorShape::invalid(format!(
        "invalid connect params: {reason}"
    )))
}

fn closed(object: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), Rejection> {
    match object.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(extra) => Err(invalid_params(format!(
            "{at} must NOT have additional properties ({extra})"
        ))),
        None => Ok(()),
    }
}

fn required<'a>(
    object: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a Value, Rejection> {
    object
        .get(key)
        .ok_or_else(|| invalid_params(format!("{at} must have required property '{key}'")))
}

fn non_empty(value: &Value, at: &str) -> Result<String, Rejection> {
    match value.as_str() {
        Some(s) if !s.is_empty() => Ok(s.to_owned()),
        _ => Err(invalid_params(format!("{at} must be a non-empty string"))),
    }
}

fn optional_string(
    object: &Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<String>, Rejection> {
    object
        .get(key)
        .map(|v| non_empty(v, &format!("{at}/{key}")))
        .transpose()
}

/// An optional string of 1..=`max` characters.
fn bounded_string(
    object: &Map<String, Value>,
    key: &str,
    max: usize,
    at: &str,
) -> Result<(), Rejection> {
    match object.get(key) {
        None => Ok(()),
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= max => Ok(()),
        Some(_) => Err(invalid_params(format!(
            "{at}/{key} must be a string of 1 to {max} characters"
        ))),
    }
}

fn check_model_catalog(catalog: &Value) -> Result<(), Rejection> {
    let Value::Object(c) = catalog else {
        return Err(invalid_params("/modelCatalog must be object"));
    };
    let keys = if c.contains_key("shortId") {
        MODEL_CATALOG_SHORT_ID_KEYS
    } else {
        MODEL_CATALOG_KEYS
    };
    closed(c, keys, "/modelCatalog")?;
    for key in keys {
        optional_string(c, key, "/modelCatalog")?;
    }
    Ok(())
}

fn string_list(object: &Map<String, Value>, key: &str) -> Result<Vec<String>, Rejection> {
    match object.get(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| invalid_params(format!("/{key} must be an array of strings")))
            })
            .collect(),
        Some(_) => Err(invalid_params(format!("/{key} must be array"))),
    }
}

fn protocol_number(object: &Map<String, Value>, key: &str) -> Result<u64, Rejection> {
    match required(object, key, "")?.as_u64() {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(invalid_params(format!("/{key} must be an integer >= 1"))),
    }
}

/// Validates `connect.params` against the closed schema.
pub fn parse_connect(params: &Value) -> Result<ConnectParams, Rejection> {
    let Value::Object(p) = params else {
        return Err(invalid_params("must be object"));
    };
    closed(p, PARAM_KEYS, "")?;
    let min_protocol = protocol_number(p, "minProtocol")?;
    let max_protocol = protocol_number(p, "maxProtocol")?;
    let Value::Object(client) = required(p, "client", "")? else {
        return Err(invalid_params("/client must be object"));
    };
    closed(client, CLIENT_KEYS, "/client")?;
    let client_id = non_empty(required(client, "id", "/client")?, "/client/id")?;
    if !CLIENT_IDS.contains(&client_id.as_str()) {
        return Err(invalid_params(
            "/client/id must be equal to one of the allowed values",
        ));
    }
    let client_mode = non_empty(required(client, "mode", "/client")?, "/client/mode")?;
    if !CLIENT_MODES.contains(&client_mode.as_str()) {
        return Err(invalid_params(
            "/client/mode must be equal to one of the allowed values",
        ));
    }
    let client_version = non_empty(required(client, "version", "/client")?, "/client/version")?;
    let platform = non_empty(required(client, "platform", "/client")?, "/client/platform")?;
    optional_string(client, "modelIdentifier", "/client")?;
    bounded_string(client, "buildId", 96, "/client")?;
    bounded_string(client, "timeZone", 64, "/client")?;
    if p.get("workerRuns").is_some_and(|v| !v.is_object()) {
        return Err(invalid_params("/workerRuns must be object"));
    }
    if let Some(catalog) = p.get("modelCatalog") {
        check_model_catalog(catalog)?;
    }
    if let Some(permissions) = p.get("permissions")
        && !permissions
            .as_object()
            .is_some_and(|m| m.values().all(Value::is_boolean))
    {
        return Err(invalid_params("/permissions must be a record of booleans"));
    }
    for key in ["pathEnv", "locale", "userAgent", "role"] {
        if p.get(key).is_some_and(|v| !v.is_string()) {
            return Err(invalid_params(format!("/{key} must be string")));
        }
    }
    string_list(p, "commands")?;
    let device = match p.get("device") {
        None => None,
        Some(Value::Object(d)) => {
            closed(d, DEVICE_KEYS, "/device")?;
            let signed_at = match required(d, "signedAt", "/device")?.as_i64() {
                Some(t) if t >= 0 => t,
                _ => return Err(invalid_params("/device/signedAt must be an integer >= 0")),
            };
            Some(DeviceBlock {
                id: non_empty(required(d, "id", "/device")?, "/device/id")?,
                public_key: non_empty(required(d, "publicKey", "/device")?, "/device/publicKey")?,
                signature: non_empty(required(d, "signature", "/device")?, "/device/signature")?,
                signed_at,
                nonce: non_empty(required(d, "nonce", "/device")?, "/device/nonce")?,
            })
        }
        Some(_) => return Err(invalid_params("/device must be object")),
    };
    let auth = match p.get("auth") {
        None => Map::new(),
        Some(Value::Object(a)) => {
            closed(a, AUTH_KEYS, "/auth")?;
            if a.values().any(|v| !v.is_string()) {
                return Err(invalid_params("/auth values must be strings"));
            }
            a.clone()
        }
        Some(_) => return Err(invalid_params("/auth must be object")),
    };
    Ok(ConnectParams {
        min_protocol,
        max_protocol,
        client_id,
        client_mode,
        client_version,
        platform,
        device_family: optional_string(client, "deviceFamily", "/client")?,
        display_name: optional_string(client, "displayName", "/client")?,
        instance_id: optional_string(client, "instanceId", "/client")?,
        caps: string_list(p, "caps")?,
        role: p
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("operator")
            .to_owned(),
        scopes: string_list(p, "scopes")?,
        device,
        auth,
    })
}

/// Protocol 4, or a probe that can speak it (3..4).
pub fn negotiate(params: &ConnectParams) -> Result<u64, Rejection> {
    let (min, max) = (params.min_protocol, params.max_protocol);
    let speaks_current = min <= PROTOCOL_VERSION && PROTOCOL_VERSION <= max;
    let probe =
        params.client_mode == "probe" && max >= MIN_PROBE_PROTOCOL && min <= PROTOCOL_VERSION;
    // Nodes may still speak the previous protocol (v4 changed chat deltas only).
    let node = params.role == "node"
        && params.client_mode == "node"
        && (min..=max).contains(&MIN_NODE_PROTOCOL);
    if speaks_current || probe || node {
        return Ok(PROTOCOL_VERSION);
    }
    let error = ErrorShape::invalid("protocol mismatch").with_details(json!({
        "code": "PROTOCOL_MISMATCH",
        "clientMinProtocol": min,
        "clientMaxProtocol": max,
        "expectedProtocol": PROTOCOL_VERSION,
        "minimumProbeProtocol": MIN_PROBE_PROTOCOL,
    }));
    Err(Rejection {
        error,
        close_code: 1002,
        close_reason: "protocol mismatch".into(),
    })
}

/// Only operators: this edge has no node support (no `node.invoke.*`), so
/// a node host is told so at `connect` instead of connecting to a socket on
/// which every call would fail.
pub fn check_role(params: &ConnectParams) -> Result<(), Rejection> {
    match params.role.as_str() {
        "operator" => Ok(()),
        "node" => Err(Rejection::policy(
            ErrorShape::invalid(
                "role node is not supported by this gateway (no node host support); connect as an operator",
            )
            .with_details(json!({ "code": "NODE_ROLE_UNSUPPORTED", "role": "node" })),
        )),
        _ => Err(Rejection::policy(ErrorShape::invalid("invalid role"))),
    }
}

/// A browser Origin the edge does not allow (`--allowed-origins`).
pub fn origin_refused(origin: &str) -> Rejection {
    let shown: String = origin.chars().take(80).collect();
    Rejection::policy(
        ErrorShape::invalid(format!(
            "origin not allowed (open the Control UI from the gateway host or allow it in EDGE_ALLOWED_ORIGINS): {shown}"
        ))
        .with_details(json!({ "code": "CONTROL_UI_ORIGIN_NOT_ALLOWED" })),
    )
}

/// An auth failure in the protocol's words.
pub fn auth_failure(code: &'static str, reason: &str, message: &str, next_step: &str) -> Rejection {
    Rejection::policy(ErrorShape::invalid(message).with_details(json!({
        "code": code,
        "authReason": reason,
        "canRetryWithDeviceToken": false,
        "recommendedNextStep": next_step,
    })))
}

/// The scopes the connection ends up with: known operator scopes it asked
/// for, except that a device-less probe gets none.
pub fn effective_scopes(params: &ConnectParams, device_verified: bool) -> Vec<String> {
    if params.role != "operator" || (params.client_mode == "probe" && !device_verified) {
        return Vec::new();
    }
    let mut scopes: Vec<String> = Vec::new();
    for scope in &params.scopes {
        if KNOWN_SCOPES.contains(&scope.as_str()) && !scopes.contains(scope) {
            scopes.push(scope.clone());
        }
    }
    scopes
}
