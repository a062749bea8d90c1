//! Device identity at connect: the signature check (see `device.rs`) and the
//! device token the edge issues in `hello-ok.auth`. Device tokens are signed
//! statelessly, so any edge replica sharing the secret accepts them.

use clawgate_common::clock::now_ms;
use serde_json::json;

use super::device::{DeviceProof, DeviceTokens, SignedContext, signed_token, verify_device};
use super::handshake::{ConnectParams, Rejection, effective_scopes};
use crate::protocol::frames::ErrorShape;

pub struct VerifiedIdentity {
    pub device_id: String,
    pub token: String,
    pub issued_at_ms: i64,
}

/// Checks the device block's signature and issues the device its token
/// (signed by `tokens`). `None` when the client sent no device block.
pub fn verify(
    tokens: &DeviceTokens,
    params: &ConnectParams,
    nonce: &str,
) -> Result<Option<VerifiedIdentity>, Rejection> {
    let Some(device) = &params.device else {
        return Ok(None);
    };
    let proof = DeviceProof {
        id: &device.id,
        public_key: &device.public_key,
        signature: &device.signature,
        signed_at_ms: device.signed_at,
        nonce: &device.nonce,
    };
    let context = SignedContext {
        client_id: &params.client_id,
        client_mode: &params.client_mode,
        role: &params.role,
        scopes: &params.scopes,
        token: signed_token(
            params.auth_str("token"),
            params.auth_str("deviceToken"),
            params.auth_str("bootstrapToken"),
        ),
        platform: Some(&params.platform),
        device_family: params.device_family.as_deref(),
    };
    let verified = verify_device(&proof, &context, nonce, now_ms()).map_err(|err| {
        Rejection::policy(
            ErrorShape::invalid(err.message())
                .with_details(json!({ "code": err.code(), "reason": err.reason() })),
        )
    })?;
    let issued_at_ms = now_ms();
    let scopes = effective_scopes(params, true);
    let token = tokens.issue(&verified.device_id, &params.role, &scopes, issued_at_ms);
    Ok(Some(VerifiedIdentity {
        device_id: verified.device_id,
        token,
        issued_at_ms,
    }))
}
