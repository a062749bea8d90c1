//! The browser Control UI's built files (`--control-ui-dir`), served at `/`
//! on the edge's own listener, so the page and its WebSocket share one
//! origin (the Origin check then needs no allow-list entry).
//!
//! A path that names a file under the directory is that file, with its MIME
//! type; a path with an `/assets/` segment anywhere is the file under the
//! directory's `assets/` (the app loads its bundles relative to the page it
//! is on); a path without a file extension that names none is the app's
//! `index.html` (a single-page app routes on the client); anything else is
//! 404. The served `index.html` has its `./` references made absolute and
//! its `<html>` tagged with the base path (`/`), so a deep link loads the
//! same bundles as the root does. Paths are percent-decoded, and a path that would leave the
//! directory (`..`, a backslash, a NUL) is refused.
//!
//! Every answer carries a `Content-Security-Policy`: scripts only from this
//! origin and the inline scripts of the served `index.html` (by their
//! SHA-256, computed as it is served), no plugins, no `<base>`, and
//! `frame-ancestors 'none'` (with `X-Frame-Options: DENY` for old
//! browsers), so no other site can frame the UI to trick a click.

use std::path::{Component, Path, PathBuf};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Response, StatusCode};

type Body = Full<Bytes>;

/// A directory of built Control UI files.
#[derive(Debug, Clone)]
pub struct ControlUi {
    root: PathBuf,
}

impl ControlUi {
    /// Serves `root`, a directory checked by `EdgeConfig::control_ui_root`.
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The answer to a plain (non-upgrade) request for `path`.
    pub async fn respond(&self, method: &Method, path: &str) -> Response<Body> {
        if method != Method::GET && method != Method::HEAD {
            return status(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        let Some(mut relative) = relative_path(path) else {
            return status(StatusCode::BAD_REQUEST, "bad path\n");
        };
        if let Some(asset) = under_assets(&relative) {
            relative = asset;
        }
        let file = self.root.join(&relative);
        let (file, fallback) = match tokio::fs::metadata(&file).await {
            Ok(meta) if meta.is_file() => (file, false),
            Ok(meta) if meta.is_dir() && file.join("index.html").is_file() => {
                (file.join("index.html"), false)
            }
            _ if relative.extension().is_none() => (self.root.join("index.html"), true),
            _ => return status(StatusCode::NOT_FOUND, "not found\n"),
        };
        // Symlinks inside the directory may point anywhere the operator put
        // them; what is refused is a request path that climbs out.
        let mut bytes = match tokio::fs::read(&file).await {
            Ok(bytes) => bytes,
            Err(_) => return status(StatusCode::NOT_FOUND, "not found\n"),
        };
        let is_index = file.file_name().is_some_and(|n| n == "index.html");
        let mut policy = content_security_policy("");
        if is_index && let Ok(html) = String::from_utf8(bytes.clone()) {
            let html = rooted_index(&html);
            policy = content_security_policy(&html);
            bytes = html.into_bytes();
        }
        let mut response = Response::new(if method == Method::HEAD {
            Full::new(Bytes::new())
        } else {
            Full::new(Bytes::from(bytes))
        });
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(mime_type(&file)));
        headers.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        if let Ok(policy) = HeaderValue::from_str(&policy) {
            headers.insert("content-security-policy", policy);
        }
        headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
        headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
        // Built assets carry a content hash in their name; the app shell and
        // unhashed files must be revalidated so a new build is picked up.
        let cache = if !fallback && relative.starts_with("assets") {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        headers.insert(CACHE_CONTROL, HeaderValue::from_static(cache));
        response
    }
}

fn status(code: StatusCode, body: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = code;
    response
}

/// The policy for a page whose HTML is `html`: its inline scripts are
/// allowed by their SHA-256 and no other.
fn content_security_policy(html: &str) -> String {
    use base64::Engine as _;
    use sha2::{Digest, Sha256};
    let mut scripts = String::from("'self'");
    for inline in inline_scripts(html) {
        let digest = Sha256::digest(inline.as_bytes());
        let digest = base64::engine::general_purpose::STANDARD.encode(digest);
        scripts.push_str(&format!(" 'sha256-{digest}'"));
    }
    format!(
        "default-src 'self'; script-src {scripts}; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data: blob: https:; font-src 'self' data:; \
         connect-src 'self' ws: wss: https:; worker-src 'self' blob:; manifest-src 'self'; \
         object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
}

/// The contents of the `<script>` elements without a `src`.
fn inline_scripts(html: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find("<script") {
        rest = &rest[at..];
        let Some(open_end) = rest.find('>') else {
            break;
        };
        let tag = &rest[..open_end];
        let body = &rest[open_end + 1..];
        let Some(close) = body.find("</script") else {
            break;
        };
        if !tag.contains(" src=") {
            found.push(&body[..close]);
        }
        rest = &body[close..];
    }
    found
}

/// `a/b/assets/x.js` → `assets/x.js`: the bundles live in one folder.
fn under_assets(relative: &Path) -> Option<PathBuf> {
    let parts: Vec<_> = relative.components().collect();
    let at = parts.iter().position(|c| c.as_os_str() == "assets")?;
    (at > 0 && at + 1 < parts.len()).then(|| parts[at..].iter().collect())
}

/// The app's `index.html` for a page at any depth: its `./` references
/// made absolute, and its base path (`/`, as `""`) on the `<html>` tag,
/// where the app reads it.
fn rooted_index(html: &str) -> String {
    let html = html
        .replace("src=\"./", "src=\"/")
        .replace("href=\"./", "href=\"/");
    match html.find("<html") {
        Some(at) => format!(
            "{}<html data-openclaw-control-ui-base-path=\"\"{}",
            &html[..at],
            &html[at + "<html".len()..]
        ),
        None => html,
    }
}

/// The request path as a path under the root (`index.html` for `/`), or
/// `None` if it is malformed or would leave the root.
fn relative_path(path: &str) -> Option<PathBuf> {
    let decoded = percent_decode(path)?;
    if decoded.contains('\0') || decoded.contains('\\') {
        return None;
    }
    let mut relative = PathBuf::new();
    for component in Path::new(decoded.trim_start_matches('/')).components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::CurDir => {}
            _ => return None,
        }
    }
    if relative.as_os_str().is_empty() {
        relative.push("index.html");
    }
    Some(relative)
}

fn percent_decode(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The MIME type browsers need for a built web app's files (module
/// scripts are refused unless served as JavaScript).
fn mime_type(file: &Path) -> &'static str {
    let extension = file
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("js" | "mjs" | "cjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("webmanifest") => "application/manifest+json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("avif") => "image/avif",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        Some("woff") => "font/woff",
        Some("ttf") => "font/ttf",
        Some("otf") => "font/otf",
        Some("wasm") => "application/wasm",
        Some("txt") => "text/plain; charset=utf-8",
        Some("mp3") => "audio/mpeg",
        Some("wav") => "audio/wav",
        Some("mp4") => "video/mp4",
        Some("webm") => "video/webm",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_root() {
        assert_eq!(relative_path("/"), Some(PathBuf::from("index.html")));
        assert_eq!(
            relative_path("/assets/app-1a2b.js"),
            Some(PathBuf::from("assets/app-1a2b.js"))
        );
        assert_eq!(relative_path("/a%20b.png"), Some(PathBuf::from("a b.png")));
        assert_eq!(relative_path("/./x"), Some(PathBuf::from("x")));
        for bad in [
            "/../etc/passwd",
            "/a/../../b",
            "/%2e%2e/x",
            "/a%5c..%5cb",
            "/%00",
            "/%zz",
            "/%e9",
        ] {
            assert_eq!(relative_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn deep_links_load_the_root_bundles() {
        assert_eq!(
            under_assets(Path::new("chat/main/assets/a.js")),
            Some(PathBuf::from("assets/a.js"))
        );
        assert_eq!(under_assets(Path::new("assets/a.js")), None);
        assert_eq!(under_assets(Path::new("chat/assets")), None);
        let html = r#"<!doctype html><html lang="en"><script src="./assets/i.js"></script><link href="./favicon.svg">"#;
        assert_eq!(
            rooted_index(html),
            r#"<!doctype html><html data-openclaw-control-ui-base-path="" lang="en"><script src="/assets/i.js"></script><link href="/favicon.svg">"#
        );
    }

    #[test]
    fn inline_scripts_are_allowed_by_their_hash_and_framing_is_not() {
        let html = r#"<html><script type="module" src="/assets/a.js"></script><script data-x="1">let a = 1;</script></html>"#;
        assert_eq!(inline_scripts(html), ["let a = 1;"]);
        let policy = content_security_policy(html);
        // sha256("let a = 1;"), base64.
        assert!(policy.contains("script-src 'self' 'sha256-"), "{policy}");
        assert_eq!(policy.matches("'sha256-").count(), 1, "{policy}");
        assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
        assert!(!content_security_policy("").contains("sha256"));
    }

    #[test]
    fn module_scripts_are_javascript() {
        assert_eq!(
            mime_type(Path::new("a/b.JS")),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(
            mime_type(Path::new("index.html")),
            "text/html; charset=utf-8"
        );
        assert_eq!(mime_type(Path::new("x.woff2")), "font/woff2");
        assert_eq!(mime_type(Path::new("noext")), "application/octet-stream");
    }
}
