//! The protocol's frames as a client writes and reads them: `req` frames,
//! the `connect` request's params, and the envelope of a received frame.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The protocol version this client speaks (its min and max).
pub const PROTOCOL_VERSION: u32 = 4;

/// The event a gateway opens every connection with.
pub const CHALLENGE_EVENT: &str = "connect.challenge";

/// The request id of the handshake's `connect`: the first request on a
/// connection, so no other id can collide with it.
pub const CONNECT_ID: &str = "connect";

/// A `req` frame.
pub fn request(id: &str, method: &str, params: Value) -> Value {
    request_with(id, method, params, Map::new())
}

/// A `req` frame with `extra` top-level members besides `type`, `id`,
/// `method` and `params` (e.g. `traceparent`); those four win over
/// members of the same name in `extra`.
pub fn request_with(id: &str, method: &str, params: Value, extra: Map<String, Value>) -> Value {
    let mut frame = extra;
    frame.insert("type".into(), json!("req"));
    frame.insert("id".into(), json!(id));
    frame.insert("method".into(), json!(method));
    frame.insert("params".into(), params);
    Value::Object(frame)
}

/// Who connects: `connect`'s `client` member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    pub id: String,
    pub version: String,
    pub platform: String,
    pub mode: String,
    /// `instanceId` (presence lists it), when given.
    pub instance_id: Option<String>,
}

impl ClientInfo {
    /// Client `id` in `mode`, at `version`, on this machine's platform.
    pub fn new(id: &str, mode: &str, version: &str) -> Self {
        Self {
            id: id.to_owned(),
            version: version.to_owned(),
            platform: std::env::consts::OS.to_owned(),
            mode: mode.to_owned(),
            instance_id: None,
        }
    }

    fn to_json(&self) -> Value {
        let mut info = json!({
            "id": self.id,
            "version": self.version,
            "platform": self.platform,
            "mode": self.mode,
        });
        if let Some(instance) = &self.instance_id {
            info["instanceId"] = json!(instance);
        }
        info
    }
}

/// The params of `connect`: the client, its role and scopes, and the
/// shared secret it presents (a token, a password, both or neither).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    pub client: ClientInfo,
    pub role: String,
    pub scopes: Vec<String>,
    pub token: Option<String>,
    pub password: Option<String>,
}

impl ConnectParams {
    /// An operator with `scopes` and no secret yet.
    pub fn operator<S: AsRef<str>>(client: ClientInfo, scopes: &[S]) -> Self {
        Self {
            client,
            role: "operator".to_owned(),
            scopes: scopes.iter().map(|s| s.as_ref().to_owned()).collect(),
            token: None,
            password: None,
        }
    }

    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The params as sent: protocol 4 only, no capabilities, `auth` with
    /// the secrets given (an empty object without).
    pub fn to_json(&self) -> Value {
        let mut auth = Map::new();
        if let Some(token) = &self.token {
            auth.insert("token".into(), json!(token));
        }
        if let Some(password) = &self.password {
            auth.insert("password".into(), json!(password));
        }
        json!({
            "minProtocol": PROTOCOL_VERSION,
            "maxProtocol": PROTOCOL_VERSION,
            "client": self.client.to_json(),
            "caps": [],
            "auth": auth,
            "role": self.role,
            "scopes": self.scopes,
        })
    }
}

/// The envelope of a received frame: what says where it belongs. Read
/// without building the rest (strings borrowed where the text allows): a
/// reader that skips most frames, as under a fan-out of other runs'
/// events, spends little on each.
#[derive(Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Envelope<'a> {
    /// `req`, `res` or `event`.
    #[serde(rename = "type", borrow)]
    pub kind: Cow<'a, str>,
    /// A response's request id.
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    /// An event's name.
    #[serde(borrow, default)]
    pub event: Option<Cow<'a, str>>,
    /// A response's outcome.
    #[serde(default)]
    pub ok: Option<bool>,
}

impl<'a> Envelope<'a> {
    pub fn parse(text: &'a str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Whether this is the response to request `id`.
    pub fn answers(&self, id: &str) -> bool {
        self.kind == "res" && self.id.as_deref() == Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_frame_keeps_its_own_members_over_extra_ones() {
        let mut extra = Map::new();
        extra.insert("traceparent".into(), json!("00-abc-01"));
        extra.insert("id".into(), json!("not this one"));
        let frame = request_with("r1", "health", json!({}), extra);
        assert_eq!(
            frame,
            json!({ "type": "req", "id": "r1", "method": "health", "params": {}, "traceparent": "00-abc-01" })
        );
    }

    #[test]
    fn connect_params_carry_the_client_scopes_and_secrets() {
        let mut client = ClientInfo::new("cli", "cli", "1.0");
        client.platform = "linux".into();
        client.instance_id = Some("i-1".into());
        let params = ConnectParams::operator(client, &["operator.read"])
            .token("t")
            .to_json();
        assert_eq!(
            params,
            json!({
                "minProtocol": 4, "maxProtocol": 4,
                "client": { "id": "cli", "version": "1.0", "platform": "linux", "mode": "cli", "instanceId": "i-1" },
                "caps": [], "auth": { "token": "t" }, "role": "operator", "scopes": ["operator.read"],
            })
        );
        let anonymous = ConnectParams::operator(ClientInfo::new("cli", "cli", "1"), &[] as &[&str]);
        assert_eq!(anonymous.to_json()["auth"], json!({}));
    }

    #[test]
    fn an_envelope_is_read_without_the_payload() {
        let res =
            Envelope::parse(r#"{"type":"res","id":"b1","ok":true,"payload":[1,{"a":2}]}"#).unwrap();
        assert!(res.answers("b1"));
        assert!(!res.answers("b2"));
        assert_eq!(res.ok, Some(true));
        let event = Envelope::parse(r#"{"type":"event","event":"tick","payload":{}}"#).unwrap();
        assert_eq!(event.event.as_deref(), Some("tick"));
        assert!(!event.answers("tick"));
        assert!(Envelope::parse(r#"{"event":"tick"}"#).is_err());
    }
}
