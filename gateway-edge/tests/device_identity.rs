//! Device identity verification (spec §2.4 step 11, §2.5) and device tokens (§2.6).

#[path = "common/captures.rs"]
mod captures;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ed25519_dalek::{Signer as _, SigningKey};
use gateway_edge::auth::device::*;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Verifies the device block of real `connect` params the way the handshake
/// will: role defaults to "operator", scopes to [], token per `signed_token`.
fn verify_connect_params(
    params: &Value,
    challenge_nonce: &str,
    now_ms: i64,
) -> Result<VerifiedDevice, DeviceAuthError> {
    let device = &params["device"];
    let client = &params["client"];
    let auth = &params["auth"];
    let scopes: Vec<String> = params["scopes"]
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    let proof = DeviceProof {
        id: device["id"].as_str().unwrap(),
        public_key: device["publicKey"].as_str().unwrap(),
        signature: device["signature"].as_str().unwrap(),
        signed_at_ms: device["signedAt"].as_i64().unwrap(),
        nonce: device["nonce"].as_str().unwrap(),
    };
    let ctx = SignedContext {
        client_id: client["id"].as_str().unwrap(),
        client_mode: client["mode"].as_str().unwrap(),
        role: params["role"].as_str().unwrap_or("operator"),
        scopes: &scopes,
        token: signed_token(
            auth["token"].as_str(),
            auth["deviceToken"].as_str(),
            auth["bootstrapToken"].as_str(),
        ),
        platform: client["platform"].as_str(),
        device_family: client["deviceFamily"].as_str(),
    };
    verify_device(&proof, &ctx, challenge_nonce, now_ms)
}

struct CapturedConnect {
    conn: u64,
    challenge_nonce: String,
    challenge_ts: i64,
    /// Capture clock when the connect frame was recorded.
    frame_t: i64,
    params: Value,
}

fn captured_connects(file: &str) -> Vec<CapturedConnect> {
    let mut challenges = std::collections::HashMap::new();
    let mut out = Vec::new();
    for record in captures::records(file) {
        if record["kind"] != "frame" {
            continue;
        }
        let conn = record["conn"].as_u64().unwrap();
        let frame = &record["json"];
        if record["dir"] == "s2c" && frame["event"] == "connect.challenge" {
            let payload = &frame["payload"];
            challenges.insert(
                conn,
                (
                    payload["nonce"].as_str().unwrap().to_owned(),
                    payload["ts"].as_i64().unwrap(),
                ),
            );
        } else if record["dir"] == "c2s" && frame["method"] == "connect" {
            let (nonce, ts) = challenges.get(&conn).cloned().expect("challenge first");
            out.push(CapturedConnect {
                conn,
                challenge_nonce: nonce,
                challenge_ts: ts,
                frame_t: record["t"].as_i64().unwrap(),
                params: frame["params"].clone(),
            });
        }
    }
    out
}

fn check_capture(file: &str, expected_version: u8) {
    let connects = captured_connects(file);
    assert!(!connects.is_empty(), "{file}: no connect frames");
    for c in &connects {
        assert!(c.params["device"].is_object(), "{file} conn {}", c.conn);
        for now in [c.frame_t, c.challenge_ts] {
            let verified = verify_connect_params(&c.params, &c.challenge_nonce, now)
                .unwrap_or_else(|e| panic!("{file} conn {}: {e}", c.conn));
            assert_eq!(
                verified.payload_version, expected_version,
                "{file} conn {}",
                c.conn
            );
            assert_eq!(
                verified.device_id,
                c.params["device"]["id"].as_str().unwrap()
            );
            assert_eq!(
                verified.public_key,
                c.params["device"]["publicKey"].as_str().unwrap()
            );
        }
        // The same frame against another connection's challenge, or much later.
        assert_eq!(
            verify_connect_params(&c.params, "00000000-0000-4000-8000-000000000000", c.frame_t),
            Err(DeviceAuthError::NonceMismatch)
        );
        assert_eq!(
            verify_connect_params(&c.params, &c.challenge_nonce, c.frame_t + 10 * 60_000),
            Err(DeviceAuthError::SignatureExpired)
        );
    }
}

const FIXED_NOW: i64 = 1_795_973_959_652;
const CHALLENGE: &str = "d16032b9-ddff-4252-86dd-ed111ad6b201";

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn raw_pub(sk: &SigningKey) -> [u8; 32] {
    sk.verifying_key().to_bytes()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn scopes(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// An owned, mutable `connect` device block plus signed context.
#[derive(Clone)]
struct Case {
    id: String,
    public_key: String,
    signature: String,
    signed_at_ms: i64,
    nonce: String,
    client_id: String,
    client_mode: String,
    role: String,
    scopes: Vec<String>,
    token: String,
    platform: Option<String>,
    device_family: Option<String>,
}

impl Case {
    /// A v3-signed CLI-style connect with key `seed`.
    fn new(seed: u8) -> Self {
        let sk = key(seed);
        let raw = raw_pub(&sk);
        let mut case = Case {
            id: device_id_for_public_key(&raw),
            public_key: URL_SAFE_NO_PAD.encode(raw),
            signature: String::new(),
            signed_at_ms: FIXED_NOW,
            nonce: CHALLENGE.to_owned(),
            client_id: "cli".to_owned(),
            client_mode: "cli".to_owned(),
            role: "operator".to_owned(),
            scopes: scopes(&["operator.read", "operator.write"]),
            token: "testtoken".to_owned(),
            platform: Some("linux".to_owned()),
            device_family: Some("Linux".to_owned()),
        };
        case.sign(&sk, PayloadVersion::V3);
        case
    }

    fn ctx(&self) -> SignedContext<'_> {
        SignedContext {
            client_id: &self.client_id,
            client_mode: &self.client_mode,
            role: &self.role,
            scopes: &self.scopes,
            token: &self.token,
            platform: self.platform.as_deref(),
            device_family: self.device_family.as_deref(),
        }
    }

    fn payload(&self, version: PayloadVersion) -> String {
        device_auth_payload(
            version,
            &self.id,
            &self.ctx(),
            self.signed_at_ms,
            self.nonce.trim(),
        )
    }

    fn sign(&mut self, sk: &SigningKey, version: PayloadVersion) {
        let payload = self.payload(version);
        self.signature = URL_SAFE_NO_PAD.encode(sk.sign(payload.as_bytes()).to_bytes());
    }

    fn verify_at(&self, now_ms: i64) -> Result<VerifiedDevice, DeviceAuthError> {
        let proof = DeviceProof {
            id: &self.id,
            public_key: &self.public_key,
            signature: &self.signature,
            signed_at_ms: self.signed_at_ms,
            nonce: &self.nonce,
        };
        verify_device(&proof, &self.ctx(), CHALLENGE, now_ms)
    }

    fn verify(&self) -> Result<VerifiedDevice, DeviceAuthError> {
        self.verify_at(FIXED_NOW)
    }
}

fn pem_for(raw: &[u8; 32], line_ending: &str) -> String {
    let mut der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    der.extend_from_slice(raw);
    pem_from_der(&der, line_ending)
}

fn pem_from_der(der: &[u8], line_ending: &str) -> String {
    let b64 = STANDARD.encode(der);
    let mut pem = format!("-----BEGIN PUBLIC KEY-----{line_ending}");
    for chunk in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(chunk).unwrap());
        pem.push_str(line_ending);
    }
    pem.push_str("-----END PUBLIC KEY-----");
    pem.push_str(line_ending);
    pem
}

// ---------------------------------------------------------------------------
// (1) Golden: real signatures from real clients
// ---------------------------------------------------------------------------

#[test]
fn golden_capture_14_current_cli_signs_v3() {
    check_capture("14-device-identity.jsonl", 3);
}

#[test]
fn golden_capture_13_openclaw_node_signs_v2() {
    check_capture("13-openclaw-node.jsonl", 2);
}

#[test]
fn golden_capture_15_old_cli_signs_v3() {
    check_capture("15-old-cli-2026.4.12-protocol3.jsonl", 3);
}

#[test]
fn golden_v3_payload_string_is_exact() {
    let scopes = scopes(&["operator.read"]);
    let ctx = SignedContext {
        client_id: "cli",
        client_mode: "cli",
        role: "operator",
        scopes: &scopes,
        token: "testtoken",
        platform: Some("linux"),
        device_family: Some("Linux"),
    };
    let id = "4ac9ea2e200e1b797a49948df5c4274617d9b53e7393aa9b4cf24ec1124146a4";
    assert_eq!(
        device_auth_payload(PayloadVersion::V3, id, &ctx, 1795973959652, CHALLENGE),
        format!(
            "v3|{id}|cli|cli|operator|operator.read|1795973959652|testtoken|{CHALLENGE}|linux|linux"
        )
    );
    assert_eq!(
        device_auth_payload(PayloadVersion::V2, id, &ctx, 1795973959652, CHALLENGE),
        format!("v2|{id}|cli|cli|operator|operator.read|1795973959652|testtoken|{CHALLENGE}")
    );
    // Capture 15's client has no deviceFamily: the last field is empty.
    let ctx = SignedContext {
        device_family: None,
        ..ctx
    };
    assert!(device_auth_payload(PayloadVersion::V3, id, &ctx, 1, CHALLENGE).ends_with("|linux|"));
}

#[test]
fn golden_captured_key_decodes_to_its_id() {
    let raw = decode_public_key("Ye2SdtFkg2XkdRK0W4BlYeP3JgRz3NsfHAnoBAUjCZU").unwrap();
    assert_eq!(
        device_id_for_public_key(&raw),
        "4ac9ea2e200e1b797a49948df5c4274617d9b53e7393aa9b4cf24ec1124146a4"
    );
    assert_eq!(
        public_key_base64url(&raw),
        "Ye2SdtFkg2XkdRK0W4BlYeP3JgRz3NsfHAnoBAUjCZU"
    );
}

// ---------------------------------------------------------------------------
// Accepted variants
// ---------------------------------------------------------------------------

#[test]
fn generated_v3_verifies() {
    let case = Case::new(1);
    let verified = case.verify().unwrap();
    assert_eq!(verified.payload_version, 3);
    assert_eq!(verified.device_id, case.id);
    assert_eq!(verified.public_key, case.public_key);
}

#[test]
fn generated_v2_verifies() {
    let mut case = Case::new(2);
    case.sign(&key(2), PayloadVersion::V2);
    assert_eq!(case.verify().unwrap().payload_version, 2);
}

#[test]
fn standard_and_padded_base64_accepted() {
    let mut case = Case::new(3);
    let sk = key(3);
    let raw = raw_pub(&sk);
    let sig = sk
        .sign(case.payload(PayloadVersion::V3).as_bytes())
        .to_bytes();

    case.public_key = STANDARD.encode(raw); // padded, standard alphabet
    case.signature = STANDARD.encode(sig);
    let verified = case.verify().unwrap();
    assert_eq!(verified.public_key, URL_SAFE_NO_PAD.encode(raw));

    case.public_key = format!("{}=", URL_SAFE_NO_PAD.encode(raw)); // padded base64url
    case.signature = format!("{}==", URL_SAFE_NO_PAD.encode(sig));
    case.verify().unwrap();
}

#[test]
fn platform_and_device_family_are_trimmed_and_ascii_lowercased() {
    let sk = key(4);
    let mut case = Case::new(4);
    case.platform = Some("  Darwin\t".to_owned());
    case.device_family = Some("iPad".to_owned());
    case.sign(&sk, PayloadVersion::V3);
    assert!(case.payload(PayloadVersion::V3).ends_with("|darwin|ipad"));
    assert_eq!(case.verify().unwrap().payload_version, 3);

    // The client signs normalised values; the raw ones may be sent in any case.
    case.platform = Some("DARWIN".to_owned());
    case.device_family = Some(" IPAD ".to_owned());
    assert_eq!(case.verify().unwrap().payload_version, 3);

    // Only ASCII is lowercased (JS `normalizeDeviceMetadataForAuth`).
    assert_eq!(normalize_device_metadata(Some(" ÄB\u{feff}")), "Äb");
    assert_eq!(normalize_device_metadata(None), "");
}

#[test]
fn absent_platform_signs_empty_fields() {
    let sk = key(5);
    let mut case = Case::new(5);
    case.platform = None;
    case.device_family = None;
    case.sign(&sk, PayloadVersion::V3);
    assert!(
        case.payload(PayloadVersion::V3)
            .ends_with(&format!("|{CHALLENGE}||"))
    );
    case.verify().unwrap();
    // Signed with no platform, presented with one: the v3 payload differs.
    case.platform = Some("linux".to_owned());
    assert_eq!(case.verify(), Err(DeviceAuthError::SignatureInvalid));
}

#[test]
fn empty_scopes_and_token() {
    let sk = key(6);
    let mut case = Case::new(6);
    case.scopes.clear();
    case.token.clear();
    case.sign(&sk, PayloadVersion::V3);
    assert!(
        case.payload(PayloadVersion::V3)
            .contains(&format!("|operator||{FIXED_NOW}||{CHALLENGE}|"))
    );
    case.verify().unwrap();
}

#[test]
fn token_selection_follows_nullish_coalescing() {
    assert_eq!(signed_token(Some("t"), Some("d"), Some("b")), "t");
    assert_eq!(signed_token(None, Some("d"), Some("b")), "d");
    assert_eq!(signed_token(None, None, Some("b")), "b");
    assert_eq!(signed_token(None, None, None), "");
    // A present empty string wins, like `??`.
    assert_eq!(signed_token(Some(""), Some("d"), Some("b")), "");
}

#[test]
fn nonce_is_trimmed_before_comparison() {
    let mut case = Case::new(7);
    case.nonce = format!("  {CHALLENGE}\n");
    assert_eq!(case.verify().unwrap().payload_version, 3);
}

#[test]
fn skew_boundary_is_inclusive() {
    let case = Case::new(8);
    case.verify_at(FIXED_NOW + DEVICE_SIGNATURE_SKEW_MS)
        .unwrap();
    case.verify_at(FIXED_NOW - DEVICE_SIGNATURE_SKEW_MS)
        .unwrap();
}

// ---------------------------------------------------------------------------
// (2) Every failure of the table, with message / reason / code
// ---------------------------------------------------------------------------

#[test]
fn error_strings_match_the_spec_table() {
    let table = [
        (
            DeviceAuthError::IdMismatch,
            "device identity mismatch",
            "device-id-mismatch",
            "DEVICE_AUTH_DEVICE_ID_MISMATCH",
        ),
        (
            DeviceAuthError::SignatureExpired,
            "device signature expired",
            "device-signature-stale",
            "DEVICE_AUTH_SIGNATURE_EXPIRED",
        ),
        (
            DeviceAuthError::NonceRequired,
            "device nonce required",
            "device-nonce-missing",
            "DEVICE_AUTH_NONCE_REQUIRED",
        ),
        (
            DeviceAuthError::NonceMismatch,
            "device nonce mismatch",
            "device-nonce-mismatch",
            "DEVICE_AUTH_NONCE_MISMATCH",
        ),
        (
            DeviceAuthError::SignatureInvalid,
            "device signature invalid",
            "device-signature",
            "DEVICE_AUTH_SIGNATURE_INVALID",
        ),
        (
            DeviceAuthError::PublicKeyInvalid,
            "device public key invalid",
            "device-public-key",
            "DEVICE_AUTH_PUBLIC_KEY_INVALID",
        ),
    ];
    for (err, message, reason, code) in table {
        assert_eq!(err.message(), message);
        assert_eq!(err.to_string(), message);
        assert_eq!(err.reason(), reason);
        assert_eq!(err.code(), code);
    }
}

#[test]
fn id_mismatch() {
    let base = Case::new(10);

    let mut other_id = base.clone();
    other_id.id = device_id_for_public_key(&raw_pub(&key(11)));
    assert_eq!(other_id.verify(), Err(DeviceAuthError::IdMismatch));

    let mut upper = base.clone();
    upper.id = base.id.to_uppercase();
    assert_eq!(upper.verify(), Err(DeviceAuthError::IdMismatch));

    let mut other_key = base.clone();
    other_key.public_key = URL_SAFE_NO_PAD.encode(raw_pub(&key(11)));
    assert_eq!(other_key.verify(), Err(DeviceAuthError::IdMismatch));

    for undecodable in ["", "   ", "not base64!", "-----BEGIN PUBLIC KEY-----\nAAAA"] {
        let mut bad = base.clone();
        bad.public_key = undecodable.to_owned();
        assert_eq!(
            bad.verify(),
            Err(DeviceAuthError::IdMismatch),
            "{undecodable:?}"
        );
    }
}

#[test]
fn signature_expired() {
    let case = Case::new(12);
    assert_eq!(
        case.verify_at(FIXED_NOW + DEVICE_SIGNATURE_SKEW_MS + 1),
        Err(DeviceAuthError::SignatureExpired)
    );
    assert_eq!(
        case.verify_at(FIXED_NOW - DEVICE_SIGNATURE_SKEW_MS - 1),
        Err(DeviceAuthError::SignatureExpired)
    );
    let mut extreme = case.clone();
    extreme.signed_at_ms = i64::MIN;
    assert_eq!(
        extreme.verify_at(i64::MAX),
        Err(DeviceAuthError::SignatureExpired)
    );
}

#[test]
fn nonce_required() {
    for blank in ["", "  ", "\t\n"] {
        let mut case = Case::new(13);
        case.nonce = blank.to_owned();
        assert_eq!(
            case.verify(),
            Err(DeviceAuthError::NonceRequired),
            "{blank:?}"
        );
    }
}

#[test]
fn nonce_mismatch() {
    let mut case = Case::new(14);
    case.nonce = "d81ad57c-8deb-4c5e-87b0-b8dbdeee151e".to_owned();
    // Even correctly signed over the wrong nonce.
    case.sign(&key(14), PayloadVersion::V3);
    assert_eq!(case.verify(), Err(DeviceAuthError::NonceMismatch));

    let mut case = Case::new(14);
    case.nonce = CHALLENGE.to_uppercase();
    assert_eq!(case.verify(), Err(DeviceAuthError::NonceMismatch));
}

#[test]
fn signature_invalid() {
    let base = Case::new(15);

    // Signed by another key.
    let mut wrong_signer = base.clone();
    wrong_signer.sign(&key(16), PayloadVersion::V3);
    assert_eq!(
        wrong_signer.verify(),
        Err(DeviceAuthError::SignatureInvalid)
    );

    // Any signed field changed after signing.
    let mutations: [fn(&mut Case); 8] = [
        |c| c.client_id = "gateway-client".to_owned(),
        |c| c.client_mode = "backend".to_owned(),
        |c| c.role = "node".to_owned(),
        |c| c.scopes.push("operator.admin".to_owned()),
        |c| c.scopes.reverse(),
        |c| c.token = "othertoken".to_owned(),
        |c| c.signed_at_ms += 1,
        |c| c.device_family = Some("macOS".to_owned()),
    ];
    for (i, mutate) in mutations.iter().enumerate() {
        let mut case = base.clone();
        mutate(&mut case);
        assert_eq!(
            case.verify(),
            Err(DeviceAuthError::SignatureInvalid),
            "mutation {i}"
        );
    }

    // A flipped bit in the signature.
    let mut sig = URL_SAFE_NO_PAD.decode(&base.signature).unwrap();
    sig[10] ^= 0x01;
    let mut flipped = base.clone();
    flipped.signature = URL_SAFE_NO_PAD.encode(&sig);
    assert_eq!(flipped.verify(), Err(DeviceAuthError::SignatureInvalid));

    // Not 64 bytes, not base64, empty.
    for bad in [
        URL_SAFE_NO_PAD.encode(&sig[..63]),
        URL_SAFE_NO_PAD.encode([sig.as_slice(), &[0]].concat()),
        "not a signature!".to_owned(),
        String::new(),
    ] {
        let mut case = base.clone();
        case.signature = bad.clone();
        assert_eq!(
            case.verify(),
            Err(DeviceAuthError::SignatureInvalid),
            "{bad:?}"
        );
    }

    // A pre-challenge (v1-style, no nonce) signature is not accepted.
    let mut v1 = base.clone();
    let v1_payload = format!(
        "v1|{}|cli|cli|operator|operator.read,operator.write|{FIXED_NOW}|testtoken",
        base.id
    );
    v1.signature = URL_SAFE_NO_PAD.encode(key(15).sign(v1_payload.as_bytes()).to_bytes());
    assert_eq!(v1.verify(), Err(DeviceAuthError::SignatureInvalid));
}

#[test]
fn public_key_invalid() {
    let base = Case::new(17);

    // 31 bytes whose hash is claimed as the id.
    let short = [9u8; 31];
    let mut case = base.clone();
    case.public_key = URL_SAFE_NO_PAD.encode(short);
    case.id = sha256_hex(&short);
    assert_eq!(case.verify(), Err(DeviceAuthError::PublicKeyInvalid));

    // 32 bytes that are not a point on the curve (y = 2 has no x).
    let mut not_a_point = [0u8; 32];
    not_a_point[0] = 2;
    let mut case = base.clone();
    case.public_key = URL_SAFE_NO_PAD.encode(not_a_point);
    case.id = sha256_hex(&not_a_point);
    assert_eq!(case.verify(), Err(DeviceAuthError::PublicKeyInvalid));
    assert_eq!(decode_public_key(&case.public_key), None);

    // A small-order point (the identity): every signature would "verify".
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let mut case = base.clone();
    case.public_key = URL_SAFE_NO_PAD.encode(identity);
    case.id = sha256_hex(&identity);
    assert_eq!(case.verify(), Err(DeviceAuthError::PublicKeyInvalid));

    // A PEM that is not an Ed25519 SPKI (X25519 OID), id = hash of its DER.
    let mut x25519_der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00,
    ];
    x25519_der.extend_from_slice(&raw_pub(&key(17)));
    let mut case = base.clone();
    case.public_key = pem_from_der(&x25519_der, "\n");
    case.id = sha256_hex(&x25519_der);
    assert_eq!(case.verify(), Err(DeviceAuthError::PublicKeyInvalid));
}

#[test]
fn checks_run_in_the_spec_order() {
    // id mismatch beats a stale timestamp, a blank nonce and a bad signature.
    let mut case = Case::new(18);
    case.id = "00".repeat(32);
    case.signed_at_ms = 0;
    case.nonce.clear();
    case.signature = "x".to_owned();
    assert_eq!(case.verify(), Err(DeviceAuthError::IdMismatch));

    // stale beats a blank nonce.
    let mut case = Case::new(18);
    case.signed_at_ms = 0;
    case.nonce.clear();
    assert_eq!(case.verify(), Err(DeviceAuthError::SignatureExpired));

    // stale beats a wrong nonce.
    let mut case = Case::new(18);
    case.signed_at_ms = 0;
    case.nonce = "other".to_owned();
    assert_eq!(case.verify(), Err(DeviceAuthError::SignatureExpired));

    // a blank nonce beats a bad signature.
    let mut case = Case::new(18);
    case.nonce.clear();
    case.signature = "x".to_owned();
    assert_eq!(case.verify(), Err(DeviceAuthError::NonceRequired));

    // a wrong nonce beats an unusable key and a bad signature.
    let short = [9u8; 31];
    let mut case = Case::new(18);
    case.public_key = URL_SAFE_NO_PAD.encode(short);
    case.id = sha256_hex(&short);
    case.nonce = "other".to_owned();
    case.signature = "x".to_owned();
    assert_eq!(case.verify(), Err(DeviceAuthError::NonceMismatch));
}

// ---------------------------------------------------------------------------
// (3) PEM keys
// ---------------------------------------------------------------------------

#[test]
fn pem_public_key_accepted() {
    for line_ending in ["\n", "\r\n"] {
        let sk = key(20);
        let raw = raw_pub(&sk);
        let mut case = Case::new(20);
        case.public_key = pem_for(&raw, line_ending);
        // The id is still the hash of the raw 32 bytes, not of the DER.
        assert_eq!(case.id, device_id_for_public_key(&raw));
        let verified = case.verify().unwrap();
        assert_eq!(verified.payload_version, 3);
        assert_eq!(verified.public_key, URL_SAFE_NO_PAD.encode(raw));
        assert_eq!(decode_public_key(&case.public_key), Some(raw));
    }
}

#[test]
fn pem_id_must_be_hash_of_raw_key() {
    let sk = key(21);
    let raw = raw_pub(&sk);
    let mut der = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    der.extend_from_slice(&raw);
    let mut case = Case::new(21);
    case.public_key = pem_for(&raw, "\n");
    case.id = sha256_hex(&der);
    assert_eq!(case.verify(), Err(DeviceAuthError::IdMismatch));
}

// ---------------------------------------------------------------------------
// (4) Device tokens
// ---------------------------------------------------------------------------

const DEVICE_A: &str = "4ac9ea2e200e1b797a49948df5c4274617d9b53e7393aa9b4cf24ec1124146a4";
const DEVICE_B: &str = "707fea8fbe0348dcbd33146f142767fbe4dd23dce5e4c1784169d732b72d7418";

#[test]
fn device_token_round_trip() {
    let tokens = DeviceTokens::new([42; 32]);
    let token = tokens.issue(
        DEVICE_A,
        "operator",
        &scopes(&["operator.write", "operator.read", "operator.write"]),
        1_795_973_959_708,
    );
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{token}"
    );
    let issued = tokens.verify(&token, DEVICE_A).unwrap();
    assert_eq!(
        issued,
        IssuedToken {
            role: "operator".to_owned(),
            scopes: scopes(&["operator.read", "operator.write"]),
            issued_at_ms: 1_795_973_959_708,
        }
    );
    // Deterministic, and scope order does not matter.
    assert_eq!(
        token,
        tokens.issue(
            DEVICE_A,
            "operator",
            &scopes(&["operator.read", "operator.write"]),
            1_795_973_959_708
        )
    );
    // Empty scopes and node role.
    let node = tokens.issue(DEVICE_A, "node", &[], 0);
    let issued = tokens.verify(&node, DEVICE_A).unwrap();
    assert_eq!(issued.role, "node");
    assert!(issued.scopes.is_empty());
    assert_eq!(issued.issued_at_ms, 0);
}

#[test]
fn device_token_rejected_for_another_device() {
    let tokens = DeviceTokens::new([42; 32]);
    let token = tokens.issue(DEVICE_A, "operator", &scopes(&["operator.read"]), 1);
    assert_eq!(tokens.verify(&token, DEVICE_B), None);
    assert_eq!(tokens.verify(&token, ""), None);
}

#[test]
fn device_token_rejected_when_tampered() {
    let tokens = DeviceTokens::new([42; 32]);
    let token = tokens.issue(DEVICE_A, "operator", &scopes(&["operator.read"]), 1);

    // Every single-character substitution is rejected.
    for i in 0..token.len() {
        let mut bytes = token.clone().into_bytes();
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(bytes).unwrap();
        assert_eq!(tokens.verify(&tampered, DEVICE_A), None, "position {i}");
    }

    // Upgraded scope with the original MAC.
    let mut raw = URL_SAFE_NO_PAD.decode(&token).unwrap();
    let pos = raw
        .windows(4)
        .position(|w| w == b"read")
        .expect("scope in body");
    raw[pos..pos + 4].copy_from_slice(b"admn");
    assert_eq!(tokens.verify(&URL_SAFE_NO_PAD.encode(&raw), DEVICE_A), None);

    // Truncated, extended, padded, garbage, empty.
    for bad in [
        token[..token.len() - 1].to_owned(),
        token[..10].to_owned(),
        format!("{token}A"),
        format!("{token}="),
        "not a token".to_owned(),
        String::new(),
    ] {
        assert_eq!(tokens.verify(&bad, DEVICE_A), None, "{bad:?}");
    }
}

#[test]
fn device_token_rejected_under_another_secret() {
    let token = DeviceTokens::new([42; 32]).issue(DEVICE_A, "operator", &[], 1);
    assert_eq!(DeviceTokens::new([43; 32]).verify(&token, DEVICE_A), None);
    assert_eq!(DeviceTokens::random().verify(&token, DEVICE_A), None);
}

#[test]
fn random_device_tokens_use_fresh_secrets() {
    let a = DeviceTokens::random();
    let b = DeviceTokens::random();
    let token = a.issue(DEVICE_A, "operator", &[], 1);
    assert!(a.verify(&token, DEVICE_A).is_some());
    assert_eq!(b.verify(&token, DEVICE_A), None);
    // The secret never shows in debug output.
    assert_eq!(
        format!("{:?}", DeviceTokens::new([42; 32])),
        "DeviceTokens { .. }"
    );
}
