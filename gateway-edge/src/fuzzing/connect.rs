//! [`check_connect`]: `connect` params through the handshake's checks.

use serde_json::{Map, Value, json};

use super::{UNKNOWN_KEY, check_answer};
use crate::auth::device::{DeviceProof, DeviceTokens, SignedContext, signed_token, verify_device};
use crate::auth::handshake::{self, PROTOCOL_VERSION, Rejection};
use crate::auth::scopes::KNOWN_SCOPES;
use crate::protocol::frames;

/// `connect` params (JSON; other bytes are skipped).
///
/// Oracle: a refusal is the protocol's (`INVALID_REQUEST`, close 1008, or
/// 1002 for a protocol mismatch, the close reason a prefix of the message
/// of at most 120 bytes); accepted params are an object whose fields are
/// carried as sent, and adding an unknown key to it or to its `client`
/// makes it refused (the schema is closed). `negotiate`, `check_role` and
/// `effective_scopes` follow their rules; a device token issued for the
/// connection verifies back to its role and scopes.
pub fn check_connect(data: &[u8]) {
    let Ok(params) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let parsed = match handshake::parse_connect(&params) {
        Ok(parsed) => parsed,
        Err(rejection) => {
            check_rejection(&rejection);
            assert_eq!(rejection.close_code, 1008);
            assert!(
                rejection
                    .error
                    .message
                    .starts_with("invalid connect params: "),
                "{}",
                rejection.error.message
            );
            return;
        }
    };
    let object = params
        .as_object()
        .expect("accepted connect params are an object");
    let client = object["client"].as_object().expect("client is an object");
    let text =
        |o: &Map<String, Value>, key: &str| o.get(key).and_then(Value::as_str).map(str::to_owned);
    assert_eq!(Some(&parsed.client_id), text(client, "id").as_ref());
    assert_eq!(Some(&parsed.client_mode), text(client, "mode").as_ref());
    assert_eq!(
        Some(&parsed.client_version),
        text(client, "version").as_ref()
    );
    assert_eq!(Some(&parsed.platform), text(client, "platform").as_ref());
    assert_eq!(parsed.device_family, text(client, "deviceFamily"));
    assert_eq!(parsed.display_name, text(client, "displayName"));
    assert_eq!(parsed.instance_id, text(client, "instanceId"));
    for field in [
        &parsed.client_id,
        &parsed.client_mode,
        &parsed.client_version,
        &parsed.platform,
    ] {
        assert!(!field.is_empty());
    }
    assert_eq!(
        parsed.role,
        text(object, "role").unwrap_or_else(|| "operator".into())
    );
    assert_eq!(parsed.min_protocol, object["minProtocol"].as_u64().unwrap());
    assert_eq!(parsed.max_protocol, object["maxProtocol"].as_u64().unwrap());
    assert!(parsed.min_protocol >= 1 && parsed.max_protocol >= 1);
    let strings = |key: &str| -> Vec<String> {
        object
            .get(key)
            .and_then(Value::as_array)
            .map_or_else(Vec::new, |items| {
                items
                    .iter()
                    .map(|s| s.as_str().unwrap().to_owned())
                    .collect()
            })
    };
    assert_eq!(parsed.scopes, strings("scopes"));
    assert_eq!(parsed.caps, strings("caps"));
    assert!(parsed.auth.values().all(Value::is_string));
    // The schema is closed at the top and in `client`.
    let mut extra = object.clone();
    extra.insert(UNKNOWN_KEY.into(), json!(true));
    assert!(
        handshake::parse_connect(&Value::Object(extra)).is_err(),
        "an unknown key accepted"
    );
    let mut extra = object.clone();
    extra["client"][UNKNOWN_KEY] = json!("x");
    assert!(
        handshake::parse_connect(&Value::Object(extra)).is_err(),
        "an unknown client key accepted"
    );
    let mut without_client = object.clone();
    without_client.remove("client");
    assert!(handshake::parse_connect(&Value::Object(without_client)).is_err());

    let (min, max) = (parsed.min_protocol, parsed.max_protocol);
    let speaks = min <= PROTOCOL_VERSION && PROTOCOL_VERSION <= max;
    let probe = parsed.client_mode == "probe"
        && max >= handshake::MIN_PROBE_PROTOCOL
        && min <= PROTOCOL_VERSION;
    let node = parsed.role == "node"
        && parsed.client_mode == "node"
        && (min..=max).contains(&handshake::MIN_NODE_PROTOCOL);
    match handshake::negotiate(&parsed) {
        Ok(protocol) => {
            assert_eq!(protocol, PROTOCOL_VERSION);
            assert!(speaks || probe || node, "protocol {min}..{max} accepted");
        }
        Err(rejection) => {
            check_rejection(&rejection);
            assert_eq!(rejection.close_code, 1002);
            assert!(!(speaks || probe || node), "protocol {min}..{max} refused");
            let details = rejection
                .error
                .details
                .as_deref()
                .expect("mismatch details");
            assert_eq!(details["code"], "PROTOCOL_MISMATCH");
        }
    }
    match handshake::check_role(&parsed) {
        Ok(()) => assert_eq!(parsed.role, "operator"),
        Err(rejection) => {
            check_rejection(&rejection);
            assert_eq!(rejection.close_code, 1008);
            assert_ne!(parsed.role, "operator");
        }
    }
    for verified in [false, true] {
        let scopes = handshake::effective_scopes(&parsed, verified);
        let mut expected: Vec<String> = Vec::new();
        if parsed.role == "operator" && (verified || parsed.client_mode != "probe") {
            for scope in &parsed.scopes {
                if KNOWN_SCOPES.contains(&scope.as_str()) && !expected.contains(scope) {
                    expected.push(scope.clone());
                }
            }
        }
        assert_eq!(
            scopes, expected,
            "effective scopes (device verified: {verified})"
        );
    }
    check_device(&parsed);
}

/// The device block's signature check (at the time and nonce it claims,
/// so that a recorded client's signature is checked all the way), and
/// device tokens for the connection.
fn check_device(parsed: &handshake::ConnectParams) {
    let tokens = DeviceTokens::new([0x5a; 32]);
    let device_id = parsed
        .device
        .as_ref()
        .map_or("no-device", |d| d.id.as_str());
    for key in ["token", "deviceToken"] {
        if let Some(token) = parsed.auth_str(key) {
            // Not issued by this secret (the MAC is checked first).
            assert_eq!(tokens.verify(token, device_id), None);
        }
    }
    let scopes = handshake::effective_scopes(parsed, true);
    let token = tokens.issue(device_id, &parsed.role, &scopes, 1_800_000_000_000);
    let issued = tokens
        .verify(&token, device_id)
        .expect("an issued token verifies");
    assert_eq!(issued.role, parsed.role);
    let mut sorted = scopes.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(issued.scopes, sorted);
    assert_eq!(tokens.verify(&token, &format!("{device_id}x")), None);

    let Some(device) = &parsed.device else {
        return;
    };
    let proof = DeviceProof {
        id: &device.id,
        public_key: &device.public_key,
        signature: &device.signature,
        signed_at_ms: device.signed_at,
        nonce: &device.nonce,
    };
    let context = SignedContext {
        client_id: &parsed.client_id,
        client_mode: &parsed.client_mode,
        role: &parsed.role,
        scopes: &parsed.scopes,
        token: signed_token(
            parsed.auth_str("token"),
            parsed.auth_str("deviceToken"),
            parsed.auth_str("bootstrapToken"),
        ),
        platform: Some(&parsed.platform),
        device_family: parsed.device_family.as_deref(),
    };
    for nonce in [device.nonce.trim(), "another-nonce"] {
        match verify_device(&proof, &context, nonce, device.signed_at) {
            Ok(verified) => {
                assert_eq!(verified.device_id, device.id);
                assert!(matches!(verified.payload_version, 2 | 3));
            }
            Err(err) => {
                assert!(!err.message().is_empty() && !err.code().is_empty());
                assert!(!err.reason().is_empty());
            }
        }
    }
    let _ = crate::auth::device::decode_public_key(&device.public_key);
}

/// The shape every handshake refusal has.
fn check_rejection(rejection: &Rejection) {
    assert_eq!(rejection.error.code, "INVALID_REQUEST");
    assert!(!rejection.error.message.is_empty());
    assert!(rejection.close_reason.len() <= 120);
    if rejection.close_code == 1008 {
        assert!(rejection.error.message.starts_with(&rejection.close_reason));
    }
    let frame = frames::error_response("connect-1", &rejection.error, None);
    check_answer(&frame, "connect-1");
}
