//! A device that connected once with the shared token reconnects with the
//! device token the edge issued it, and nothing else: not another
//! device's, not one older than `EDGE_DEVICE_TOKEN_TTL`, not one issued
//! before the shared secret was rotated.

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clawgate_common::clock::now_ms;
use common::*;
use ed25519_dalek::{Signer as _, SigningKey};
use gateway_edge::auth::device::{
    PayloadVersion, SignedContext, device_auth_payload, device_id_for_public_key,
    public_key_base64url,
};
use gateway_edge::auth::secret::edge_device_tokens;
use gateway_edge::config::AuthMode;
use serde_json::{Value, json};

/// `connect` params for this device, signed over the challenge's nonce.
fn signed_connect(key: &SigningKey, challenge: &Value, auth: Value) -> Value {
    let raw = key.verifying_key().to_bytes();
    let device_id = device_id_for_public_key(&raw);
    let scopes = vec!["operator.write".to_owned()];
    let token = auth["token"]
        .as_str()
        .or(auth["deviceToken"].as_str())
        .unwrap_or("");
    let context = SignedContext {
        client_id: "cli",
        client_mode: "cli",
        role: "operator",
        scopes: &scopes,
        token,
        platform: Some("linux"),
        device_family: None,
    };
    let nonce = challenge["payload"]["nonce"].as_str().unwrap();
    let signed_at = challenge["payload"]["ts"].as_i64().unwrap();
    let payload = device_auth_payload(PayloadVersion::V3, &device_id, &context, signed_at, nonce);
    let signature = URL_SAFE_NO_PAD.encode(key.sign(payload.as_bytes()).to_bytes());
    json!({
        "minProtocol": 4, "maxProtocol": 4,
        "client": { "id": "cli", "version": "test", "platform": "linux", "mode": "cli" },
        "role": "operator", "scopes": scopes, "auth": auth,
        "device": {
            "id": device_id, "publicKey": public_key_base64url(&raw),
            "signature": signature, "signedAt": signed_at, "nonce": nonce,
        },
    })
}

async fn connect_device(url: &str, key: &SigningKey, auth: Value) -> (Client, Value) {
    let mut client = Client::open(url).await;
    let challenge = client.next_frame().await.unwrap();
    let res = client
        .request("connect", signed_connect(key, &challenge, auth))
        .await;
    (client, res)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_reconnects_with_its_device_token() {
    let system = system().await;
    let (url, _) = system.edge(system.edge_config()).await;
    let key = SigningKey::from_bytes(&[7; 32]);

    let (_, first) = connect_device(&url, &key, json!({ "token": TOKEN })).await;
    assert_eq!(first["ok"], true, "{first}");
    let device_token = first["payload"]["auth"]["deviceToken"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(first["payload"]["auth"]["method"], "token");

    let (mut again, second) =
        connect_device(&url, &key, json!({ "deviceToken": device_token })).await;
    assert_eq!(second["ok"], true, "{second}");
    assert_eq!(second["payload"]["auth"]["method"], "device-token");
    assert_eq!(
        second["payload"]["auth"]["scopes"],
        json!(["operator.write"])
    );
    let sent = again
        .request(
            "chat.send",
            json!({"sessionKey":"device","message":"hi","idempotencyKey":"d-1"}),
        )
        .await;
    assert_eq!(sent["payload"]["status"], "started");

    // Another device cannot use it, and a forged token is refused.
    let other = SigningKey::from_bytes(&[8; 32]);
    let (_, stolen) = connect_device(&url, &other, json!({ "deviceToken": device_token })).await;
    assert_refused(&stolen, "device_token_mismatch");
    let (_, forged) = connect_device(&url, &key, json!({ "deviceToken": "bm90LWEtdG9rZW4" })).await;
    assert_refused(&forged, "device_token_mismatch");
    system.stop.cancel();
}

/// A refused device token, in the protocol's shape: `INVALID_REQUEST` with
/// `AUTH_DEVICE_TOKEN_MISMATCH` (a client drops its stored token on the
/// message's `device token mismatch`), `reason` in `authReason`.
fn assert_refused(res: &Value, reason: &str) {
    assert_eq!(res["ok"], false, "{res}");
    let error = &res["error"];
    assert_eq!(error["code"], "INVALID_REQUEST", "{res}");
    assert_eq!(
        error["details"]["code"], "AUTH_DEVICE_TOKEN_MISMATCH",
        "{res}"
    );
    assert_eq!(error["details"]["authReason"], reason, "{res}");
    assert_eq!(
        error["details"]["recommendedNextStep"], "update_auth_credentials",
        "{res}"
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("unauthorized: device token mismatch ("),
        "{res}"
    );
}

const DEVICE_SECRET: &str = "device-token-secret-for-the-test";
const DAY_MS: i64 = 86_400_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_token_older_than_the_ttl_is_refused() {
    let system = system().await;
    let mut config = system.edge_config();
    config.device_token_secret = Some(DEVICE_SECRET.into());
    assert_eq!(
        config.device_token_ttl,
        std::time::Duration::from_secs(30 * 86_400),
        "30 days by default"
    );
    // Tokens as this edge issues them, dated in the past.
    let tokens = edge_device_tokens(&config);
    let (url, _) = system.edge(config).await;
    let key = SigningKey::from_bytes(&[10; 32]);
    let device_id = device_id_for_public_key(&key.verifying_key().to_bytes());
    let scopes = ["operator.write".to_owned()];
    let issued_days_ago =
        |days: i64| tokens.issue(&device_id, "operator", &scopes, now_ms() - days * DAY_MS);

    let (_, young) =
        connect_device(&url, &key, json!({ "deviceToken": issued_days_ago(29) })).await;
    assert_eq!(
        young["payload"]["auth"]["method"], "device-token",
        "{young}"
    );

    let (mut client, old) =
        connect_device(&url, &key, json!({ "deviceToken": issued_days_ago(31) })).await;
    assert_refused(&old, "device_token_expired");
    while client.next_frame().await.is_some() {}
    let (code, reason) = client.closed.clone().unwrap();
    assert_eq!(code, 1008, "{reason}");
    assert!(reason.contains("device token mismatch"), "{reason}");

    // Given with the shared token, the expired one is no obstacle: the
    // device is issued a fresh one.
    let (_, renewed) = connect_device(
        &url,
        &key,
        json!({ "token": TOKEN, "deviceToken": issued_days_ago(31) }),
    )
    .await;
    assert_eq!(renewed["payload"]["auth"]["method"], "token", "{renewed}");
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_shared_secret_revokes_the_device_tokens_issued_under_it() {
    let system = system().await;
    for mode in [AuthMode::Token, AuthMode::Password] {
        let edge_with = |secret: &str| {
            let mut config = system.edge_config();
            config.device_token_secret = Some(DEVICE_SECRET.into());
            config.auth_mode = mode;
            config.token = None;
            match mode {
                AuthMode::Password => config.password = Some(secret.into()),
                _ => config.token = Some(secret.into()),
            }
            config
        };
        let secret_given = |secret: &str| match mode {
            AuthMode::Password => json!({ "password": secret }),
            _ => json!({ "token": secret }),
        };
        let key = SigningKey::from_bytes(&[11; 32]);
        let (before, _) = system.edge(edge_with("first-shared-secret")).await;
        let (_, first) = connect_device(&before, &key, secret_given("first-shared-secret")).await;
        let device_token = first["payload"]["auth"]["deviceToken"]
            .as_str()
            .unwrap_or_else(|| panic!("{mode:?}: {first}"))
            .to_owned();

        // The same secrets (a restart, a replica): the token is good.
        let (same, _) = system.edge(edge_with("first-shared-secret")).await;
        let (_, again) = connect_device(&same, &key, json!({ "deviceToken": device_token })).await;
        assert_eq!(
            again["payload"]["auth"]["method"], "device-token",
            "{mode:?}: {again}"
        );

        // The shared secret rotated, the device-token secret kept: revoked.
        let (after, _) = system.edge(edge_with("second-shared-secret")).await;
        let (_, revoked) =
            connect_device(&after, &key, json!({ "deviceToken": device_token })).await;
        assert_refused(&revoked, "device_token_mismatch");
        let (_, renewed) = connect_device(&after, &key, secret_given("second-shared-secret")).await;
        assert_eq!(renewed["ok"], true, "{mode:?}: {renewed}");
    }
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_the_secret_accept_each_others_device_tokens() {
    let system = system().await;
    let mut config = system.edge_config();
    config.device_token_secret = Some(DEVICE_SECRET.into());
    let (url_a, _) = system.edge(config.clone()).await;
    let (url_b, _) = system.edge(config).await;
    let key = SigningKey::from_bytes(&[9; 32]);
    let (_, first) = connect_device(&url_a, &key, json!({ "token": TOKEN })).await;
    let device_token = first["payload"]["auth"]["deviceToken"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, on_b) = connect_device(&url_b, &key, json!({ "deviceToken": device_token })).await;
    assert_eq!(on_b["payload"]["auth"]["method"], "device-token", "{on_b}");
    system.stop.cancel();
}
