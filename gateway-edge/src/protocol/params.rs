//! Closed-schema checks of method params, with messages in the protocol's
//! words: `invalid chat.send params: must have required property 'message'`.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::frames::ErrorShape;

/// A request's params, checked against its method's schema.
pub struct Params<'a> {
    method: &'a str,
    /// Where these params sit in the request's (`/patch`, `/targets/0`):
    /// empty for the request's own; refusals name it, as a schema
    /// validator's do (`…params: /patch/label must be…`).
    path: Cow<'a, str>,
    /// `None`: params a method ignores that are not an object.
    object: Option<&'a Map<String, Value>>,
}

impl<'a> Params<'a> {
    /// `allowed`: every key the method accepts (the schema is closed).
    pub fn new(method: &'a str, params: &'a Value, allowed: &[&str]) -> Result<Self, ErrorShape> {
        Self::object(method, params)?.closed_to(allowed)
    }

    /// An object inside a request's params, at `path` (`/patch`), held to
    /// its own closed schema: its refusals name the path.
    pub fn nested(
        method: &'a str,
        path: impl Into<Cow<'a, str>>,
        value: &'a Value,
        allowed: &[&str],
    ) -> Result<Self, ErrorShape> {
        Self::object_at(method, path.into(), value)?.closed_to(allowed)
    }

    /// Params that must be an object, whatever its keys (a method that
    /// checks a union of shapes itself).
    pub fn object(method: &'a str, params: &'a Value) -> Result<Self, ErrorShape> {
        Self::object_at(method, Cow::Borrowed(""), params)
    }

    fn object_at(
        method: &'a str,
        path: Cow<'a, str>,
        value: &'a Value,
    ) -> Result<Self, ErrorShape> {
        let Value::Object(object) = value else {
            return Err(Self::error_for(method, &path, "must be object"));
        };
        Ok(Self {
            method,
            path,
            object: Some(object),
        })
    }

    /// The params of a method that takes none and ignores what it gets.
    pub fn ignored(method: &'a str, params: &'a Value) -> Self {
        Self {
            method,
            path: Cow::Borrowed(""),
            object: params.as_object(),
        }
    }

    /// The keys sent.
    pub fn keys(&self) -> impl Iterator<Item = &'a str> {
        self.object
            .into_iter()
            .flat_map(|o| o.keys().map(String::as_str))
    }

    /// The same params held to a narrower closed schema (one shape of a
    /// union).
    pub fn closed_to(&self, allowed: &[&str]) -> Result<Self, ErrorShape> {
        if let Some(extra) = self.keys().find(|k| !allowed.contains(k)) {
            return Err(self.error(&format!("must NOT have additional properties ({extra})")));
        }
        Ok(Self {
            method: self.method,
            path: self.path.clone(),
            object: self.object,
        })
    }

    /// The method these are the params of.
    pub fn method(&self) -> &'a str {
        self.method
    }

    /// The refusal of `reason` at `path`: a reason about a key (`/label …`)
    /// continues the path, one about the object itself follows it.
    fn error_for(method: &str, path: &str, reason: &str) -> ErrorShape {
        let at = match (path, reason.starts_with('/')) {
            ("", _) => String::new(),
            (path, true) => path.to_owned(),
            (path, false) => format!("{path} "),
        };
        ErrorShape::invalid(format!("invalid {method} params: {at}{reason}"))
    }

    pub fn error(&self, reason: &str) -> ErrorShape {
        Self::error_for(self.method, &self.path, reason)
    }

    /// The value of `key` as sent, null included.
    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.object?.get(key)
    }

    /// The value of `key`, unless absent or null.
    pub fn value(&self, key: &str) -> Option<&'a Value> {
        self.raw(key).filter(|v| !v.is_null())
    }

    pub fn string(&self, key: &str) -> Result<Option<&'a str>, ErrorShape> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.error(&format!("/{key} must be string"))),
        }
    }

    pub fn required_string(&self, key: &str) -> Result<&'a str, ErrorShape> {
        self.string(key)?
            .ok_or_else(|| self.error(&format!("must have required property '{key}'")))
    }

    pub fn required_non_empty(&self, key: &str) -> Result<&'a str, ErrorShape> {
        let value = self.required_string(key)?;
        if value.is_empty() {
            return Err(self.error(&format!("/{key} must NOT have fewer than 1 characters")));
        }
        Ok(value)
    }

    pub fn optional_non_empty(&self, key: &str) -> Result<Option<&'a str>, ErrorShape> {
        match self.string(key)? {
            Some("") => Err(self.error(&format!("/{key} must NOT have fewer than 1 characters"))),
            other => Ok(other),
        }
    }

    pub fn integer(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ErrorShape> {
        match self.value(key) {
            None => Ok(None),
            Some(value) => match value.as_u64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(self.error(&format!("/{key} must be an integer in {min}..{max}"))),
            },
        }
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ErrorShape> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.error(&format!("/{key} must be boolean"))),
        }
    }
}

impl Params<'_> {
    /// Like `string`, but the value must be one of `allowed`.
    pub fn one_of(&self, key: &str, allowed: &[&str]) -> Result<Option<&str>, ErrorShape> {
        match self.string(key)? {
            Some(value) if !allowed.contains(&value) => Err(self.error(&format!(
                "/{key} must be equal to one of the allowed values"
            ))),
            other => Ok(other),
        }
    }
}

/// How many keys the lists `parts` hold together.
pub const fn keys_len(parts: &[&[&str]]) -> usize {
    let (mut total, mut part) = (0, 0);
    while part < parts.len() {
        total += parts[part].len();
        part += 1;
    }
    total
}

/// The lists `parts` as one list of `N` keys (`N` = `keys_len(parts)`), so
/// a closed schema made of several named key lists spells each key once.
pub const fn concat_keys<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut keys = [""; N];
    let (mut at, mut part) = (0, 0);
    while part < parts.len() {
        let mut index = 0;
        while index < parts[part].len() {
            keys[at] = parts[part][index];
            at += 1;
            index += 1;
        }
        part += 1;
    }
    assert!(at == N, "N must be keys_len(parts)");
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_inside_a_nested_object_name_its_path() {
        let message = |e: ErrorShape| e.message;
        let patch = serde_json::json!({ "pinned": "yes", "extra": 1 });
        let refused = Params::nested("m", "/patch", &patch, &["pinned"])
            .err()
            .unwrap();
        assert_eq!(
            message(refused),
            "invalid m params: /patch must NOT have additional properties (extra)"
        );
        let one = serde_json::json!({ "pinned": "yes" });
        let nested = Params::nested("m", format!("/targets/{}", 3), &one, &["pinned"]).unwrap();
        assert_eq!(
            message(nested.boolean("pinned").unwrap_err()),
            "invalid m params: /targets/3/pinned must be boolean"
        );
        let not_object = serde_json::json!(1);
        assert_eq!(
            message(
                Params::nested("m", "/patch", &not_object, &[])
                    .err()
                    .unwrap()
            ),
            "invalid m params: /patch must be object"
        );
        // The request's own params: no path.
        let top = Params::new("m", &one, &["pinned"]).unwrap();
        assert_eq!(
            message(top.boolean("pinned").unwrap_err()),
            "invalid m params: /pinned must be boolean"
        );
    }

    #[test]
    fn key_lists_concatenate_in_order() {
        const PARTS: &[&[&str]] = &[&["a", "b"], &[], &["c"]];
        const ALL: [&str; keys_len(PARTS)] = concat_keys::<{ keys_len(PARTS) }>(PARTS);
        assert_eq!(ALL, ["a", "b", "c"]);
    }
}
