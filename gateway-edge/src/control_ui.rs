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
    /// The directory must hold the app's `index.html`.
    pub fn open(root: &Path) -> anyhow::Result<Self> {
        let root = root
            .canonicalize()
            .map_err(|e| anyhow::anyhow!("control UI directory {}: {e}", root.display()))?;
        anyhow::ensure!(
            root.join("index.html").is_file(),
            "control UI directory {} has no index.html (point it at the dist/control-ui folder of an openclaw package)",
            root.display()
        );
        Ok(Self { root })
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
        if is_index && let Ok(html) = String::from_utf8(bytes.clone()) {
            bytes = rooted_index(&html).into_bytes();
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
