//! The Content-Security-Policy: this origin's scripts, styles, sockets and
//! images only, WebAssembly allowed, never framed. A page gets a fresh nonce
//! per response, and only inline scripts carrying it run (Leptos puts it on
//! its hydration bootstrap and streamed chunks), so an injected inline script
//! does not. Answers that are not pages get the policy without a nonce.

use leptos::prelude::*;

/// The policy, with `nonce` allowed for inline scripts when given.
pub fn content_security_policy(nonce: Option<&str>) -> String {
    let inline = nonce.map(|n| format!(" 'nonce-{n}'")).unwrap_or_default();
    format!(
        "default-src 'self'; script-src 'self'{inline} 'wasm-unsafe-eval'; \
         style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
         frame-ancestors 'none'; base-uri 'self'; form-action 'self'; object-src 'none'"
    )
}

/// Gives this page render a nonce (if it has none yet) and sends the policy
/// that allows it. Called by the page shell before anything is rendered.
pub fn for_this_page() {
    if use_nonce().is_none() {
        provide_nonce();
    }
    let Some(nonce) = use_nonce() else {
        return;
    };
    if let (Some(res), Ok(value)) = (
        use_context::<leptos_axum::ResponseOptions>(),
        http::HeaderValue::from_str(&content_security_policy(Some(&nonce))),
    ) {
        res.insert_header(http::header::CONTENT_SECURITY_POLICY, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nonce_lets_inline_scripts_run() {
        let page = content_security_policy(Some("abc123"));
        assert!(page.contains("script-src 'self' 'nonce-abc123' 'wasm-unsafe-eval'"));
        assert!(!page.contains("script-src 'self' 'unsafe-inline'"));
        let other = content_security_policy(None);
        assert!(other.contains("script-src 'self' 'wasm-unsafe-eval'"));
        assert!(other.contains("frame-ancestors 'none'"));
    }
}
