//! OpenClaw device identity: verification of the Ed25519 `device` block of a
//! `connect` request, and the device tokens returned in `hello-ok.auth`.
//!
//! Protocol facts (spec §2.3–§2.6):
//!
//! * `device.publicKey` is the raw 32-byte Ed25519 key in base64url without
//!   padding; padded or standard base64 and a PEM SPKI block are accepted too.
//! * `device.id` is the lowercase hex SHA-256 of the raw 32 key bytes.
//! * `device.signature` is the Ed25519 signature (base64url or standard base64)
//!   of one of these UTF-8 strings; v3 is tried first, then v2:
//!
//!   ```text
//!   v2|<deviceId>|<clientId>|<clientMode>|<role>|<scopes,joined>|<signedAtMs>|<token>|<nonce>
//!   v3|<deviceId>|<clientId>|<clientMode>|<role>|<scopes,joined>|<signedAtMs>|<token>|<nonce>|<platform>|<deviceFamily>
//!   ```
//!
//! The checks run in the order the reference gateway uses: device id, clock
//! skew, nonce present, nonce equal to the challenge, signature. Each failure
//! maps to a fixed message, `details.reason` and `details.code`
//! ([`DeviceAuthError`]).
//!
//! Device tokens ([`DeviceTokens`]) are stateless: the token carries the role,
//! the sorted scopes and the issue time, authenticated with HMAC-SHA256 under a
//! server secret and bound to the device id.

use std::fmt;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use ed25519_dalek::{Signature, VerifyingKey};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Maximum allowed distance between `device.signedAt` and the server clock
/// (`DEVICE_SIGNATURE_SKEW_MS`); a distance of exactly this much still passes.
pub const DEVICE_SIGNATURE_SKEW_MS: i64 = 120_000;

/// DER prefix of an Ed25519 SubjectPublicKeyInfo; the 32 key bytes follow it.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

const PEM_BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
const PEM_END: &str = "-----END PUBLIC KEY-----";

/// Lenient decoder for client-supplied keys and signatures: base64url alphabet
/// (standard base64 is translated to it first), padding stripped beforehand,
/// non-zero trailing bits tolerated as the reference gateway's decoder does.
const LENIENT_B64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// The `connect.params.device` block as sent by the client.
#[derive(Debug, Clone, Copy)]
pub struct DeviceProof<'a> {
    /// `device.id`: claimed lowercase hex SHA-256 of the raw public key.
    pub id: &'a str,
    /// `device.publicKey`: base64url/base64 raw key, or PEM SPKI.
    pub public_key: &'a str,
    /// `device.signature`: base64url/base64 Ed25519 signature.
    pub signature: &'a str,
    /// `device.signedAt` in ms since the epoch.
    pub signed_at_ms: i64,
    /// `device.nonce`: must echo the `connect.challenge` nonce.
    pub nonce: &'a str,
}

/// The other `connect` params that the signature covers.
#[derive(Debug, Clone, Copy)]
pub struct SignedContext<'a> {
    /// `client.id`.
    pub client_id: &'a str,
    /// `client.mode`.
    pub client_mode: &'a str,
    /// The resolved role (`"operator"` when the client sent none).
    pub role: &'a str,
    /// `scopes` exactly as sent, in order (empty when absent).
    pub scopes: &'a [String],
    /// See [`signed_token`]: the first present of `auth.token`,
    /// `auth.deviceToken`, `auth.bootstrapToken`, else `""`.
    pub token: &'a str,
    /// `client.platform` (v3 payload only).
    pub platform: Option<&'a str>,
    /// `client.deviceFamily` (v3 payload only).
    pub device_family: Option<&'a str>,
}

/// The token string that goes into the signed payload: the first of
/// `auth.token`, `auth.deviceToken`, `auth.bootstrapToken` that is present
/// (a present empty string wins, like JavaScript `??`), else `""`.
/// A JSON `null` counts as absent.
pub fn signed_token<'a>(
    token: Option<&'a str>,
    device_token: Option<&'a str>,
    bootstrap_token: Option<&'a str>,
) -> &'a str {
    token.or(device_token).or(bootstrap_token).unwrap_or("")
}

/// Why a device identity was rejected. Each variant maps to the reference
/// gateway's `INVALID_REQUEST` message (also the 1008 close reason),
/// `details.reason` and `details.code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceAuthError {
    /// `device.id` is not the SHA-256 of the public key (or no key could be
    /// decoded from `device.publicKey` at all).
    IdMismatch,
    /// `device.signedAt` is more than [`DEVICE_SIGNATURE_SKEW_MS`] away from now.
    SignatureExpired,
    /// `device.nonce` is blank.
    NonceRequired,
    /// `device.nonce` is not the nonce of this connection's challenge.
    NonceMismatch,
    /// Neither the v3 nor the v2 payload verifies (or the signature is not
    /// 64 bytes of base64).
    SignatureInvalid,
    /// The key matches `device.id` but is not a usable Ed25519 public key
    /// (wrong length, not a curve point, a small-order point, or a PEM that is
    /// not an Ed25519 SPKI).
    PublicKeyInvalid,
}

impl DeviceAuthError {
    /// The error message (also used as the WebSocket close reason).
    pub fn message(&self) -> &'static str {
        match self {
            Self::IdMismatch => "device identity mismatch",
            Self::SignatureExpired => "device signature expired",
            Self::NonceRequired => "device nonce required",
            Self::NonceMismatch => "device nonce mismatch",
            Self::SignatureInvalid => "device signature invalid",
            Self::PublicKeyInvalid => "device public key invalid",
        }
    }

    /// `error.details.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::IdMismatch => "device-id-mismatch",
            Self::SignatureExpired => "device-signature-stale",
            Self::NonceRequired => "device-nonce-missing",
            Self::NonceMismatch => "device-nonce-mismatch",
            Self::SignatureInvalid => "device-signature",
            Self::PublicKeyInvalid => "device-public-key",
        }
    }

    /// `error.details.code`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::IdMismatch => "DEVICE_AUTH_DEVICE_ID_MISMATCH",
            Self::SignatureExpired => "DEVICE_AUTH_SIGNATURE_EXPIRED",
            Self::NonceRequired => "DEVICE_AUTH_NONCE_REQUIRED",
            Self::NonceMismatch => "DEVICE_AUTH_NONCE_MISMATCH",
            Self::SignatureInvalid => "DEVICE_AUTH_SIGNATURE_INVALID",
            Self::PublicKeyInvalid => "DEVICE_AUTH_PUBLIC_KEY_INVALID",
        }
    }
}

impl fmt::Display for DeviceAuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for DeviceAuthError {}

/// Which signed-payload layout a client used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadVersion {
    /// `v2|…|<nonce>`.
    V2,
    /// `v3|…|<nonce>|<platform>|<deviceFamily>`.
    V3,
}

impl PayloadVersion {
    /// 2 or 3.
    pub fn number(self) -> u8 {
        match self {
            Self::V2 => 2,
            Self::V3 => 3,
        }
    }
}

/// A device identity that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedDevice {
    /// `device.id` (lowercase hex SHA-256 of the raw key).
    pub device_id: String,
    /// The raw key in canonical base64url without padding (what a pairing
    /// store should pin, whatever encoding the client sent).
    pub public_key: String,
    /// 3 or 2: the payload layout whose signature verified.
    pub payload_version: u8,
}

/// Builds the exact string a client signs. `nonce` is the challenge nonce;
/// the v3 `platform`/`deviceFamily` are normalised with
/// [`normalize_device_metadata`].
pub fn device_auth_payload(
    version: PayloadVersion,
    device_id: &str,
    ctx: &SignedContext<'_>,
    signed_at_ms: i64,
    nonce: &str,
) -> String {
    let mut out = String::with_capacity(160);
    out.push_str(match version {
        PayloadVersion::V2 => "v2",
        PayloadVersion::V3 => "v3",
    });
    for field in [device_id, ctx.client_id, ctx.client_mode, ctx.role] {
        out.push('|');
        out.push_str(field);
    }
    out.push('|');
    for (i, scope) in ctx.scopes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(scope);
    }
    out.push('|');
    out.push_str(&signed_at_ms.to_string());
    out.push('|');
    out.push_str(ctx.token);
    out.push('|');
    out.push_str(nonce);
    if version == PayloadVersion::V3 {
        out.push('|');
        out.push_str(&normalize_device_metadata(ctx.platform));
        out.push('|');
        out.push_str(&normalize_device_metadata(ctx.device_family));
    }
    out
}

/// `platform`/`deviceFamily` as they enter the v3 payload: trimmed (with
/// JavaScript's whitespace set) and ASCII-lowercased; `""` when absent.
pub fn normalize_device_metadata(value: Option<&str>) -> String {
    value.map(js_trim).unwrap_or("").to_ascii_lowercase()
}

/// `String.prototype.trim`: Unicode `White_Space` plus U+FEFF, minus U+0085.
fn js_trim(s: &str) -> &str {
    s.trim_matches(|c: char| c == '\u{feff}' || (c.is_whitespace() && c != '\u{85}'))
}

/// Lowercase hex SHA-256 of a raw public key: the device id it must carry.
pub fn device_id_for_public_key(raw: &[u8; 32]) -> String {
    hex_lower(&Sha256::digest(raw))
}

/// Canonical encoding of a raw public key: base64url without padding.
pub fn public_key_base64url(raw: &[u8; 32]) -> String {
    URL_SAFE_NO_PAD.encode(raw)
}

/// Decodes `device.publicKey` (base64url, base64, or PEM SPKI) to a usable
/// 32-byte Ed25519 key; `None` when it is none of these.
pub fn decode_public_key(public_key: &str) -> Option<[u8; 32]> {
    let material = key_material(public_key)?;
    usable_key(&material).map(|key| key.to_bytes())
}

/// Verifies a `connect` request's device identity.
///
/// Checks in the reference gateway's order: the id is the SHA-256 of the key;
/// `|now_ms - signedAt| <= 120 000`; the (trimmed) nonce is non-blank; it
/// equals `challenge_nonce`; the signature verifies over the v3 payload, else
/// over the v2 payload.
///
/// A `publicKey` from which no bytes can be decoded at all fails the first
/// check ([`DeviceAuthError::IdMismatch`]), as in the reference gateway.
/// Bytes that hash to `device.id` but are not a usable Ed25519 key give
/// [`DeviceAuthError::PublicKeyInvalid`] (checked just before the signature,
/// which such a key could never verify).
pub fn verify_device(
    proof: &DeviceProof<'_>,
    ctx: &SignedContext<'_>,
    challenge_nonce: &str,
    now_ms: i64,
) -> Result<VerifiedDevice, DeviceAuthError> {
    let material = key_material(proof.public_key).ok_or(DeviceAuthError::IdMismatch)?;
    if hex_lower(&Sha256::digest(&material)) != proof.id {
        return Err(DeviceAuthError::IdMismatch);
    }

    let skew = (i128::from(now_ms) - i128::from(proof.signed_at_ms)).abs();
    if skew > i128::from(DEVICE_SIGNATURE_SKEW_MS) {
        return Err(DeviceAuthError::SignatureExpired);
    }

    let nonce = js_trim(proof.nonce);
    if nonce.is_empty() {
        return Err(DeviceAuthError::NonceRequired);
    }
    if nonce != challenge_nonce {
        return Err(DeviceAuthError::NonceMismatch);
    }

    let key = usable_key(&material).ok_or(DeviceAuthError::PublicKeyInvalid)?;
    let signature = decode_lenient(proof.signature)
        .and_then(|bytes| <[u8; 64]>::try_from(bytes.as_slice()).ok())
        .map(|bytes| Signature::from_bytes(&bytes))
        .ok_or(DeviceAuthError::SignatureInvalid)?;

    for version in [PayloadVersion::V3, PayloadVersion::V2] {
        let payload = device_auth_payload(version, proof.id, ctx, proof.signed_at_ms, nonce);
        if key.verify_strict(payload.as_bytes(), &signature).is_ok() {
            return Ok(VerifiedDevice {
                device_id: proof.id.to_owned(),
                public_key: public_key_base64url(key.as_bytes()),
                payload_version: version.number(),
            });
        }
    }
    Err(DeviceAuthError::SignatureInvalid)
}

/// The bytes whose SHA-256 is the device id: the raw key for base64 input or
/// an Ed25519 PEM, the whole DER for any other PEM. `None` when nothing can be
/// decoded.
fn key_material(public_key: &str) -> Option<Vec<u8>> {
    if public_key.contains("BEGIN") {
        let der = pem_public_key_der(public_key)?;
        match der.strip_prefix(&ED25519_SPKI_PREFIX[..]) {
            Some(raw) if raw.len() == 32 => Some(raw.to_vec()),
            _ => Some(der),
        }
    } else {
        decode_lenient(public_key)
    }
}

/// The DER body of a `-----BEGIN PUBLIC KEY-----` block.
fn pem_public_key_der(pem: &str) -> Option<Vec<u8>> {
    let start = pem.find(PEM_BEGIN)? + PEM_BEGIN.len();
    let rest = &pem[start..];
    let body = &rest[..rest.find(PEM_END)?];
    let compact: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    decode_lenient(&compact)
}

/// A 32-byte, decompressible, not small-order Ed25519 key.
fn usable_key(material: &[u8]) -> Option<VerifyingKey> {
    let raw = <[u8; 32]>::try_from(material).ok()?;
    VerifyingKey::from_bytes(&raw)
        .ok()
        .filter(|key| !key.is_weak())
}

/// base64url or standard base64, padded or not; `None` on anything else
/// (including an empty string).
fn decode_lenient(input: &str) -> Option<Vec<u8>> {
    let trimmed = js_trim(input).trim_end_matches('=');
    if trimmed.is_empty() {
        return None;
    }
    let translated: String = trimmed
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            other => other,
        })
        .collect();
    LENIENT_B64.decode(translated).ok()
}

fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

type HmacSha256 = Hmac<Sha256>;

/// Domain separation for the token MAC.
const TOKEN_MAC_DOMAIN: &[u8] = b"clawgate/device-token/v1";
const TOKEN_FORMAT_VERSION: u8 = 1;
const TOKEN_MAC_LEN: usize = 32;

/// What a valid device token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// The role the token was issued for.
    pub role: String,
    /// The scopes it was issued for, sorted and de-duplicated.
    pub scopes: Vec<String>,
    /// When it was issued (ms since the epoch), for `hello-ok.auth.issuedAtMs`.
    pub issued_at_ms: i64,
}

/// Issues and checks stateless device tokens.
///
/// A token is base64url (no padding) of
/// `version(1) ‖ issued_at_ms(i64 BE) ‖ role ‖ scope count ‖ scopes ‖ mac(32)`,
/// strings length-prefixed (u32 BE). The MAC is HMAC-SHA256 under the server
/// secret over a domain tag, the device id (length-prefixed) and everything
/// before the MAC, so a token is only valid for the device it was issued to.
/// Issuing is deterministic: the same inputs give the same token. Rotating
/// the secret revokes every token.
#[derive(Clone)]
pub struct DeviceTokens {
    secret: [u8; 32],
}

impl fmt::Debug for DeviceTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceTokens").finish_non_exhaustive()
    }
}

impl DeviceTokens {
    /// Tokens under a fixed secret (persist it to keep tokens valid across restarts).
    pub fn new(secret: [u8; 32]) -> Self {
        Self { secret }
    }

    /// Tokens under a fresh secret from the OS random source (valid for this
    /// process only).
    ///
    /// # Panics
    /// If the OS random source is unavailable.
    pub fn random() -> Self {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).expect("OS random source unavailable");
        Self { secret }
    }

    /// A token for `device_id` with `role` and `scopes` (sorted and
    /// de-duplicated before signing), issued at `issued_at_ms`.
    pub fn issue(
        &self,
        device_id: &str,
        role: &str,
        scopes: &[String],
        issued_at_ms: i64,
    ) -> String {
        let mut sorted: Vec<&str> = scopes.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        sorted.dedup();

        let mut body = Vec::with_capacity(64 + TOKEN_MAC_LEN);
        body.push(TOKEN_FORMAT_VERSION);
        body.extend_from_slice(&issued_at_ms.to_be_bytes());
        put_str(&mut body, role);
        put_len(&mut body, sorted.len());
        for scope in sorted {
            put_str(&mut body, scope);
        }
        let mac = self.mac(device_id, &body).finalize().into_bytes();
        body.extend_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(body)
    }

    /// What `token` grants, if it was issued by this secret to `device_id`
    /// and has not been altered. The MAC is compared in constant time.
    pub fn verify(&self, token: &str, device_id: &str) -> Option<IssuedToken> {
        let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
        let split = bytes.len().checked_sub(TOKEN_MAC_LEN)?;
        let (body, tag) = bytes.split_at(split);
        self.mac(device_id, body).verify_slice(tag).ok()?;

        let mut reader = Reader(body);
        if reader.take(1)? != [TOKEN_FORMAT_VERSION] {
            return None;
        }
        let issued_at_ms = i64::from_be_bytes(reader.take(8)?.try_into().ok()?);
        let role = reader.string()?;
        let count = reader.len()?;
        let mut scopes = Vec::with_capacity(count.min(body.len()));
        for _ in 0..count {
            scopes.push(reader.string()?);
        }
        if !reader.0.is_empty() {
            return None;
        }
        Some(IssuedToken {
            role,
            scopes,
            issued_at_ms,
        })
    }

    fn mac(&self, device_id: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.secret)
            .expect("HMAC accepts keys of any length");
        mac.update(TOKEN_MAC_DOMAIN);
        mac.update(&(device_id.len() as u64).to_be_bytes());
        mac.update(device_id.as_bytes());
        mac.update(body);
        mac
    }
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    let len = u32::try_from(len).expect("device token field longer than 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn len(&mut self) -> Option<usize> {
        let raw: [u8; 4] = self.take(4)?.try_into().ok()?;
        usize::try_from(u32::from_be_bytes(raw)).ok()
    }

    fn string(&mut self) -> Option<String> {
        let n = self.len()?;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}
