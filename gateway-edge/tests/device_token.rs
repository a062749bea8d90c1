//! A device that connected once with the shared token reconnects with the
//! device token the edge issued it, and nothing else.

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use ed25519_dalek::{Signer as _, SigningKey};
use gateway_edge::auth::device::{
    PayloadVersion, SignedContext, device_auth_payload, device_id_for_public_key,
    public_key_base64url,
};
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
    assert_eq!(
        stolen["error"]["details"]["code"], "AUTH_TOKEN_MISSING",
        "{stolen}"
    );
    let (_, forged) = connect_device(&url, &key, json!({ "deviceToken": "bm90LWEtdG9rZW4" })).await;
    assert_eq!(forged["ok"], false);
    system.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_the_secret_accept_each_others_device_tokens() {
    let system = system().await;
    let mut config = system.edge_config();
    config.device_token_secret = Some("shared-secret".into());
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
