//! TLS for Redis (`rediss://`) and PostgreSQL (`sslmode`): both clients use
//! rustls, and rustls needs one process-wide crypto provider, installed here
//! before the first connection.

use std::sync::Once;

/// Installs rustls' ring provider as the process default, once. Harmless when
/// another provider was installed first (the embedding program chose it).
pub(crate) fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
