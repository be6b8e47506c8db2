//! The built site (WASM bundle, JS, CSS, the badge widget and assets) served from
//! the binary itself when it was built with the `embedded-site` feature (see
//! `build.rs`), so a release binary runs from any directory. Without the feature
//! the table is empty and Leptos serves the files from `--site-root`.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;

/// One embedded file: its URL path, its bytes and its ETag.
type File = (&'static str, &'static [u8], &'static str);

/// Every embedded file, sorted by URL path.
static FILES: &[File] = include!(concat!(env!("OUT_DIR"), "/site_files.rs"));

/// The Leptos site root of a binary carrying the site: a path under a file
/// (`/dev/null`), so it can never exist and Leptos' file handler finds nothing
/// on disk, whatever the working directory holds.
pub const NO_DISK_ROOT: &str = "/dev/null/holdfast-site-is-embedded";

/// Whether this binary carries the site.
pub fn embedded() -> bool {
    !FILES.is_empty()
}

/// The embedded file at `path` for a GET or HEAD (405 for another method), or
/// `None` to let the pages (and their "not found") answer. Revalidated on every
/// use (`no-cache` with an ETag) because the names carry no hash: a new binary
/// must never leave a browser running an old bundle against a new server.
pub fn serve(method: &Method, path: &str, headers: &HeaderMap) -> Option<Response> {
    let index = FILES.binary_search_by(|(p, _, _)| (*p).cmp(path)).ok()?;
    if method != Method::GET && method != Method::HEAD {
        let refused = Response::builder()
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .header(header::ALLOW, HeaderValue::from_static("GET, HEAD"))
            .body(Body::empty());
        return Some(refused.expect("static headers are valid"));
    }
    let (_, bytes, etag) = FILES[index];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        // Weak comparison (RFC 9110): a proxy that compresses marks tags weak.
        .is_some_and(|tags| {
            tags.split(',')
                .map(|t| t.trim().trim_start_matches("W/"))
                .any(|t| t == etag || t == "*")
        });
    let builder = Response::builder()
        .header(header::ETAG, HeaderValue::from_static(etag))
        .header(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let response = if fresh {
        builder.status(StatusCode::NOT_MODIFIED).body(Body::empty())
    } else {
        builder
            .header(header::CONTENT_TYPE, content_type(path))
            .body(Body::from(bytes))
    };
    Some(response.expect("static headers are valid"))
}

/// The media type for a site file, by its extension.
fn content_type(path: &str) -> HeaderValue {
    let ext = path.rsplit_once('.').map_or("", |(_, ext)| ext);
    HeaderValue::from_static(match ext {
        "wasm" => "application/wasm",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "html" => "text/html; charset=utf-8",
        "svg" => "image/svg+xml",
        "json" => "application/json",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_follow_the_extension() {
        assert_eq!(content_type("/pkg/holdfast.wasm"), "application/wasm");
        assert_eq!(content_type("/widget.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("/pkg/holdfast.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("/favicon.svg"), "image/svg+xml");
        assert_eq!(content_type("/LICENSE"), "application/octet-stream");
    }
}
